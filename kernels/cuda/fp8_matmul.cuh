// Projections with FP8 weights: y[T, N] = x[T, K] @ W[N, K]^T where W is F8_E4M3 (or F8_E5M2) with F32 scales per
// 128 x 128 block (kernels/backend.h Matrix: the weight of element (r, c) is fp8(W[r, c]) * scales[fp8_scale_row(r,
// segment rows), c / 128]), x bf16, y bf16.
//
// - Up to kGemvMaxTokens rows (decode): W8A16 GEMVs that read W once, convert fp8 -> f32 exactly in registers and
//   accumulate in fp32, each 16-value word's dot product times its block scale: 1 row through the streaming kernel
//   (x in shared memory as f32, the next row's weights prefetched) or the CUDA-core kernel with several rows per
//   warp, 2 rows on CUDA cores or tensor cores by K, 3-8 rows on tensor cores (mma m16n8k16 bf16: fp8 -> bf16 is
//   exact; a block's products are summed in fp32, then scaled). fp8_gemv_config says which.
// - More rows (prefill, large batches): Fp8GemmMode::block_scaled (the default) quantizes x per row and 128-wide
//   group to e4m3 (scale = amax / 448, as the checkpoints' "activation_scheme: dynamic") and runs cuBLASLt's FP8 GEMM
//   with 128 x 128 weight scales and 128-element activation scales (W8A8 on Hopper's FP8 tensor cores, fp32
//   accumulation). Shapes it cannot take (K % 128 != 0, N % 16 != 0, segments not a multiple of 128 rows, or no
//   cuBLASLt algorithm) dequantize. Fp8GemmMode::dequantize writes W as bf16 into scratch and runs the bf16 GEMM
//   (W8A16, as the GEMVs and the CPU backend).
#pragma once

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/matmul.cuh"

namespace hy::cuda {

// Up to kMax FP8 matrices of one dtype that share x and K, computed by one GEMV launch (as GemvGroup).
struct Fp8Group {
    static constexpr int kMax = 4;
    const uint8_t* w[kMax] = {};
    const float* scales[kMax] = {};
    void* y[kMax] = {};
    int n[kMax] = {};
    int segment_rows[kMax] = {};  // Matrix::scale_segment_rows (0: one segment)
    int block_end[kMax] = {};     // cumulative blocks up to and including matrix s (set by the launcher)
    int count = 0;
    int evict_first = 0;  // weight loads marked L2 evict-first (set by the launcher from ctx.evict_first)
    void add(const Matrix& m, void* ym) {
        w[count] = static_cast<const uint8_t*>(m.data);
        scales[count] = m.scales;
        y[count] = ym;
        n[count] = int(m.rows);
        segment_rows[count] = int(m.scale_segment_rows);
        count++;
    }
};

// True when the FP8 GEMV takes w with T rows of x: 1 <= T <= kGemvMaxTokens, K % 16 == 0 (K % 64 == 0 for 3 or more
// rows), 16-byte aligned x and w, scale segments of a multiple of 16 rows.
bool fp8_gemv_fits(const bf16* x, int64_t T, const Matrix& w);
// y_s = x @ W_s^T for each member (T <= kGemvMaxTokens; every member fp8_gemv_fits, one dtype, K columns).
void gemv_fp8_group(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, const LaunchContext& ctx);
// The launch shape of an FP8 GEMV: the tensor-core kernel (per: chunks of 64 values in flight per warp, 2 or 4; any
// 1-8 rows, K % 64 == 0) or the CUDA-core kernel (1-2 rows; split warps per row, per 16-byte words per lane and
// round, rows per warp; (split, per, rows) in {(1,8,1), (2,4,1), (2,8,1), (4,4,1), (4,8,1), (8,4,1), (8,8,1),
// (1,4,2), (1,8,2), (2,4,2), (4,4,2), (1,4,4), (2,4,4)}) or the streaming kernel (1 row; split in {1, 2, 4}, rows in
// {2, 4}). Chosen from K and T alone, so that a matrix gives the same bits alone or in a group.
struct Fp8GemvConfig {
    bool tensor_cores = false;
    int split = 2;
    int per = 4;
    // tensor cores, e4m3: convert by moving bits (scaled by 2^-120, undone in fp32; NaN codes still give NaN) rather
    // than with conversion instructions (cvt e4m3x2 -> f16x2 -> f32 -> bf16x2)
    bool bits = false;
    int rows = 1;  // CUDA cores: consecutive rows per group of `split` warps (x unpacked once for them)
    // 1 row of x: the streaming kernel (x as f32 in shared memory, `rows` rows per group of `split` warps, the next
    // row's weights loaded while the current one is summed; `per` is set by K); K * 4 <= kFp8StreamMaxSmem
    bool stream = false;
};
constexpr int64_t kFp8StreamMaxSmem = 48 * 1024;
// The streaming kernel's words per lane and row for K and `split` warps per row (4, 6 or 8; 0: more than 8).
int fp8_stream_words(int64_t K, int split);
Fp8GemvConfig fp8_gemv_config(int64_t K, int64_t T);
Fp8GemvConfig fp8_gate_up_config(int64_t K, int64_t T);  // (gemv_fp8_gate_up's)
// gemv_fp8_group with an explicit launch shape (benchmarks); a shape not built throws Error(internal).
void gemv_fp8_group_with(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, Fp8GemvConfig c,
                         const LaunchContext& ctx);
// gate_out = bf16(x Wg^T), up_out = bf16(x Wu^T), act_out = bf16(bf16(silu(gate)) * up) (act_out may be gate_out),
// as gemv_gate_up, in one kernel: T <= kGemvMaxTokens, wg and wu of the same shape, dtype and segments, both
// fp8_gemv_fits. _with: an explicit launch shape (the CUDA-core one: split from K, 4 words per lane).
void gemv_fp8_gate_up(const bf16* x, int64_t T, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out,
                      bf16* act_out, const LaunchContext& ctx);
void gemv_fp8_gate_up_with(const bf16* x, int64_t T, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out,
                           bf16* act_out, Fp8GemvConfig c, const LaunchContext& ctx);

// The MoE per-row gate/up/SiLU with FP8 experts (ExpertGateUpArgs with gate_up and the shared expert's gate_proj
// and up_proj as fp8 codes of one type, their block scales; the shared gate bf16): gemv_expert_gate_up's values
// with each 16-code word's products summed, then times its block's scale, on the FP8 GEMV's loop. _fits: H % 16 ==
// 0, 16-byte aligned x and rows, scales given, a grid that fits.
bool gemv_fp8_expert_gate_up_fits(const ExpertGateUpArgs& a);
void gemv_fp8_expert_gate_up(ExpertGateUpArgs a, bool e5m2, const LaunchContext& ctx);

// How FP8 matrices are multiplied when there are more rows than the GEMVs take (CudaOptions::fp8_gemm).
enum class Fp8GemmMode { block_scaled, dequantize };

// Workspace of matmul_fp8 (pieces of the arena): the quantized activations and their scales, and the bf16 copy of
// a weight matrix for Fp8GemmMode::dequantize.
struct Fp8Scratch {
    uint8_t* act = nullptr;       // [act_bytes]: e4m3 x [T, K]
    float* act_scales = nullptr;  // [act_bytes / 128]: [K / 128, T]
    size_t act_bytes = 0;
    bf16* weight = nullptr;  // [weight_elems]
    size_t weight_elems = 0;
};

// y = x @ w^T for an FP8 w (bf16 y; f32 y when out_f32, through the dequantize path): the GEMV when it fits, else
// `mode` (see above). Throws Error(internal) when the scratch is too small for the shape.
void matmul_fp8(Gemm& gemm, const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, Fp8GemmMode mode,
                const Fp8Scratch& scratch, const LaunchContext& ctx);

// out[N, K] = the bf16 value of every weight of w (fp8 value * block scale, rounded to bf16).
void dequantize_fp8(const Matrix& w, bf16* out, const LaunchContext& ctx);
// q[T, K] = e4m3(x * (1 / s)) for s = amax of the row's 128-value group / 448 (1 for a group of zeros), rounded
// to nearest even and saturated; s stored group-major: s[g * T + t] for row t, group g (the layout cuBLASLt's
// VEC128 scales have, as PyTorch's 1x128 blockwise scales: shape [T, K / 128], strides [1, T]). K % 128 == 0.
void quantize_rows_fp8(const bf16* x, int64_t T, int64_t K, uint8_t* q, float* s, const LaunchContext& ctx);

}  // namespace hy::cuda
