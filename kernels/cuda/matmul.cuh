// Projections y[T, N] = x[T, K] @ W[N, K]^T with bf16 x and W and fp32 accumulation, y in bf16 (activations) or
// F32 (logits). Few rows (decode) go to a GEMV that streams W once with 16-byte loads; more rows go to cuBLASLt.
#pragma once

#include <cublasLt.h>

#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// cuBLASLt state of one backend: the handle, the workspace (a piece of the arena) and a small cache of chosen
// algorithms per shape, so that prefill does not query the heuristic for every call.
class Gemm {
public:
    Gemm();
    ~Gemm();
    Gemm(const Gemm&) = delete;
    Gemm& operator=(const Gemm&) = delete;

    // Workspace bytes handed to cuBLASLt.
    static constexpr size_t kWorkspaceBytes = size_t(32) << 20;
    void set_workspace(void* ws) { workspace_ = ws; }

    // y[T, N] = x[T, K] @ w[N, K]^T; out_f32 selects an F32 y (else bf16).
    void run(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
             const LaunchContext& ctx);
    // y[T, N] (bf16) = X[T, K] @ W[N, K]^T on FP8 tensor cores with block scales (W8A8): X = e4m3 xq times F32
    // scales xs, one per row t and 128-value group g at xs[g * T + t] (cuBLASLt's VEC128), W = e4m3 w times F32 scales
    // ws [N / 128, K / 128] row-major (one per 128 x 128 block: BLK128x128). K % 128 == 0, N % 16 == 0. Returns false,
    // running nothing, when cuBLASLt has no algorithm for the shape (the answer is cached).
    bool run_fp8(const uint8_t* xq, const float* xs, int64_t T, const uint8_t* w, const float* ws, int64_t N, int64_t K,
                 bf16* y, const LaunchContext& ctx);
    // Benchmarks (hybrid-kernel-bench): plans made from now on take the heuristic's rank-th algorithm (0: its first
    // choice, the default) or its last when it offers fewer; heuristic_rank_used() says which the newest plan took.
    void set_heuristic_rank(int rank) { heuristic_rank_ = rank < 0 ? 0 : rank; }
    int heuristic_rank_used() const { return last_rank_; }
    // Shapes run_fp8 was asked for and cuBLASLt had no algorithm for (the caller dequantized instead).
    int fp8_shapes_without_algorithm() const {
        int n = 0;
        for (const Plan& p : plans_) n += p.fp8 && !p.found;
        return n;
    }

private:
    struct Plan {
        int64_t T = 0, N = 0, K = 0;
        bool out_f32 = false;
        bool fp8 = false;     // run_fp8's block-scaled FP8 GEMM
        bool found = false;   // cuBLASLt has an algorithm (always true for bf16: plan() throws otherwise)
        bool x_as_a = false;  // FP8: x is cuBLASLt's A (VEC128 scales), w its B (BLK128x128), D in row order
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    Plan& plan(int64_t T, int64_t N, int64_t K, bool out_f32, bool fp8);
    void destroy(Plan& p);

    cublasLtHandle_t handle_ = nullptr;
    cublasLtMatmulDesc_t op_ = nullptr;
    cublasLtMatmulDesc_t op_fp8_ = nullptr;     // TN, FP8: A = w (BLK128x128), B = x (VEC128); scale pointers per call
    cublasLtMatmulDesc_t op_fp8_xa_ = nullptr;  // TN, FP8: A = x (VEC128), B = w (BLK128x128)
    void* workspace_ = nullptr;
    std::vector<Plan> plans_;  // at most kMaxPlans; the oldest is replaced when full
    size_t next_victim_ = 0;
    int heuristic_rank_ = 0;
    int last_rank_ = -1;  // the rank of the newest plan
    static constexpr size_t kMaxPlans = 256;
};

// Up to kMax weight matrices that share x and K, computed by one GEMV launch (e.g. the q, k, v projections).
struct GemvGroup {
    static constexpr int kMax = 4;
    const bf16* w[kMax] = {};
    void* y[kMax] = {};
    int n[kMax] = {};
    int block_end[kMax] = {};  // cumulative GEMV blocks up to and including matrix s (set by gemv_group)
    int count = 0;
    int evict_first = 0;  // weight loads marked L2 evict-first (set by gemv_group from ctx.evict_first)
    void add(const bf16* wm, void* ym, int64_t rows) {
        w[count] = wm;
        y[count] = ym;
        n[count] = int(rows);
        count++;
    }
};
// The matrix of a group that block blockIdx.x works on (matrix s owns blocks [block_end[s-1], block_end[s])),
// selected with constant indices: a dynamically indexed kernel parameter would be copied to local memory.
struct GroupMember {
    const bf16* w;
    void* y;
    int n;            // rows of the matrix
    int first_block;  // its first block
};

__device__ __forceinline__ GroupMember group_member(const GemvGroup& g, int block = -1) {
    if (block < 0) block = int(blockIdx.x);
    GroupMember m{g.w[0], g.y[0], g.n[0], 0};
#pragma unroll
    for (int j = 1; j < GemvGroup::kMax; j++)
        if (j < g.count && block >= g.block_end[j - 1]) m = GroupMember{g.w[j], g.y[j], g.n[j], g.block_end[j - 1]};
    return m;
}

void gemv_group(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, const LaunchContext& ctx);
// The decode GEMVs load weights with an L2 evict-first policy when ctx.evict_first (each weight byte is read once
// per step, so it should not push out what is read again: the recurrent state, the KV cache, activations; decode
// b=1 on 4B shapes: 354 against 349 tok/s, docs/perf-notes.md).
// Launch shape of a decode GEMV: `split` warps share a row, each lane holds `per` 16-byte weight words per round.
// gemv_config chooses it from K alone (so a matrix gives the same bits alone or in a group).
struct GemvConfig {
    int split = 2;
    int per = 8;
};
GemvConfig gemv_config(int64_t K);

// The MoE decode gate/up/SiLU (moe.cu's per-row path, fewer rows than moe_grouped takes) on this GEMV's loop: split
// warps share a feature's gate and up rows (gemv_config(H)), every lane's words of both loaded at once, and a block
// takes kGemvWarps / split features of one choice. Blocks y < rows (only when Is > 0) take the shared expert of row
// t = y, its weights loaded before the PDL wait (they do not depend on the routing): shared_act[t, i] =
// bf16(bf16(silu(bf16(x_t . Wg_s[i]))) * bf16(x_t . Wu_s[i])), and feature Is the shared gate, shared_gate_out[t] =
// bf16(sigmoid(bf16(x_t . shared_gate))). The other blocks take the routed choice n = t k + j (y minus those rows):
// act[n, i] likewise with expert e = ids[n]'s rows (0 for e outside [0, E)), loaded after the wait.
struct ExpertGateUpArgs {
    const bf16* x = nullptr;        // [rows, H]
    const void* gate_up = nullptr;  // [E * 2I, H]: expert e's gate rows [2eI, 2eI + I), up rows [2eI + I, 2(e+1)I)
    const float* gate_up_scales = nullptr;  // FP8 (gemv_fp8_expert_gate_up): the block scales of gate_up
    int64_t segment_rows = 0;               // FP8: gate_up's scale segment (kernels/backend.h Matrix)
    const int32_t* ids = nullptr;           // [rows * k]
    int E = 0, H = 0, I = 0, k = 0;
    int64_t rows = 0;
    const void* shared_gate_proj = nullptr;     // [Is, H] (bf16, or FP8 as gate_up for gemv_fp8_expert_gate_up)
    const void* shared_up_proj = nullptr;       // [Is, H]
    const float* shared_gate_scales = nullptr;  // FP8: the block scales of shared_gate_proj (one segment)
    const float* shared_up_scales = nullptr;    // FP8: those of shared_up_proj
    const bf16* shared_gate = nullptr;          // [H] (bf16 in every case)
    int Is = 0;                                 // 0: no shared expert
    bf16* act = nullptr;                        // [rows * k, I]
    bf16* shared_act = nullptr;                 // [rows, Is]
    float* shared_gate_out = nullptr;           // [rows]
    bool evict_first = false;                   // (set from the launch context)
};
// Whether gemv_expert_gate_up takes a: H % 8 == 0, 16-byte aligned x, gate_up and shared rows, and a grid that fits.
bool gemv_expert_gate_up_fits(const ExpertGateUpArgs& a);
void gemv_expert_gate_up(ExpertGateUpArgs a, const LaunchContext& ctx);
// gemv_group with an explicit launch shape (benchmarks). Shapes built: (split, per) in {(2,8), (4,8), (8,8)};
// others throw internal.
void gemv_group_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, GemvConfig c,
                     const LaunchContext& ctx);
// Launch shape of the tensor-core GEMV (3 to 16 rows of x): `parts` warps share a 16-feature tile (each takes every
// parts-th 32-value chunk of K), each holds `unroll` chunks per round. gemv_mma_config chooses it from K alone.
struct MmaGemvConfig {
    int parts = 8;
    int unroll = 4;
};
MmaGemvConfig gemv_mma_config(int64_t K);
// gemv_group on 3 to 16 rows with an explicit launch shape (benchmarks). Shapes built: (parts, unroll) in {(4,4),
// (8,2), (8,4), (16,2), (16,4)}; others throw internal.
void gemv_mma_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, MmaGemvConfig c,
                   const LaunchContext& ctx);
// The tensor-core GEMV for 9 to kWideGemvMaxTokens rows (thread-block clusters, sm_90): x is shared by 8 tiles of
// 16 features through shared memory and the parts of a tile's K run in the blocks of a cluster, summed in the same
// order as gemv_mma_with's warps, so a row's result is bitwise the same as on the 3-16-row kernel of the same
// launch shape (gemv_mma_config(K)), in any batch of 3 to 64 rows. gemv_wide_rows: whether T rows go there under
// ctx (more than 8, not taken by the 3-16-row kernel under ctx.tc_gemv_all, at most ctx.wide_gemv_max_rows, and
// ctx.clusters); gemv_wide_fits adds K % 32 == 0 and 16-byte aligned x and w. gemv_group, gemv_gate_up and matmul
// send such rows there.
bool gemv_wide_rows(int64_t T, const LaunchContext& ctx);
bool gemv_wide_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, const LaunchContext& ctx);
// gemv_group on 3 to 64 rows (K % 32 == 0, ctx.clusters) with an explicit launch shape (benchmarks, tests):
// parts 8 or 16 (the unroll does not matter here); others throw internal.
void gemv_wide_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, MmaGemvConfig c,
                    const LaunchContext& ctx);
// gate_out = bf16(x Wg^T), up_out = bf16(x Wu^T), act_out = bf16(bf16(silu(gate)) * up) (act_out may be gate_out);
// T <= kGemvBlockMaxTokens, or 3 to kTcGemvMaxTokens rows with K % 32 == 0 (tensor cores, gemv_mma_config's shape),
// or the cluster GEMV's rows (gemv_wide_rows), or the wgmma GEMM's (wgmma_gemm_rows, gemm_wgmma.cuh).
void gemv_gate_up(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                  bf16* up_out, bf16* act_out, const LaunchContext& ctx);

// The GEMV path alone (T <= kGemvBlockMaxTokens, K % 8 == 0, 16-byte aligned x and w rows); gemv_group also takes
// 3 to 16 rows with K % 32 == 0 (tensor cores).
void gemv(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
          const LaunchContext& ctx);
// True when gemv() can take this shape and these pointers (T <= kGemvBlockMaxTokens).
bool gemv_fits(const bf16* x, int64_t T, const bf16* w, int64_t K);
// True when a group of `count` such matrices over x may go to gemv_group (count 1: a member that could join a
// group; 3 to group_max_rows rows: K % 32 == 0, and count 3 or 4 unless tc_all, LaunchContext::tc_gemv_all; more
// rows, up to 16: only with tc_all).
bool gemv_group_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, int count, bool tc_all,
                     int group_max_rows = kGemvMaxTokens);

// y = x @ w^T through the GEMV when it fits (1-2 rows; 3 to 16 with ctx.tc_gemv_all; 9 to 64 in clusters where
// gemv_wide_fits), else the wgmma GEMM where wgmma_gemm_fits within the row bounds of ctx (gemm_wgmma.cuh, tuning.cuh),
// else cuBLASLt. w must not be written by the kernel just before (the GEMVs load weights before their PDL wait): for
// such weights, matmul_written_weights.
void matmul(Gemm& gemm, const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
            const LaunchContext& ctx);

// y = x @ w^T where the kernel before wrote w (a dequantized scratch): cuBLASLt, or the scalar kernel for odd shapes,
// never a GEMV (they load their first weights before the PDL wait, which only holds for weights no kernel writes).
void matmul_written_weights(Gemm& gemm, const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y,
                            bool out_f32, const LaunchContext& ctx);

}  // namespace hy::cuda
