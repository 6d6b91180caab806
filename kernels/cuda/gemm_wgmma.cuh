// A bf16 GEMM for batched decode (9 to kWgmmaGemmMaxRows rows of x) on Hopper's warpgroup tensor-core instructions
// (wgmma, sm_90a): y[T, N] = x[T, K] @ w[N, K]^T with fp32 accumulation, y in bf16 or F32.
//
// A block is one warpgroup (128 threads) and owns 128 output features (two m64 wgmma tiles, the weights as the A
// operand) and all T rows (the B operand, n = T rounded up to 8, 16, 32, 64 or 128) over one part of K; up to
// GemvGroup::kMax matrices that share x run as one launch, and the MLP's gate/up/SiLU as one launch. Weights and x
// stream through a 4-stage ring of shared memory in 64-value chunks (one 128-byte row per feature or token, in the
// 128-byte swizzled K-major layout of the PTX ISA's "Shared Memory Matrix Layout"), copied with cp.async; the first
// stages' weights are requested before the PDL wait (weights no kernel writes: never dequantized scratch). K is
// split into `parts` contiguous ranges whose blocks form one thread-block cluster; their fp32 sums are added over
// distributed shared memory in part order, so a row's result depends on N, K and parts only: not on T or on the other
// rows (batch invariance within this kernel's rows). parts comes from wgmma_gemm_parts (N, K and the SM count).
// With LaunchContext::wgmma_stream_k_quant (CudaOptions::wgmma_stream_k_quant, on by default) the quantized GEMM's
// launches of 9-64 rows whose split is not given take a stream-K split instead: two blocks an SM share the tiles x
// chunks evenly, a tile's pieces added through fp32 partials in the workspace in a fixed block order (gemm_wgmma.cu,
// WgStreamK), so a row's bits depend on N, K and the SM count only. The bf16 GEMM has it too
// (CudaOptions::wgmma_stream_k), off by default: slower there (backend.h has the figures).
//
// Measured (H100, twenty-ninth session; docs/perf-notes.md): correct at every split; 2.0-2.6 TB/s at 16-64 rows
// against cuBLASLt's 1.6-2.5, behind it at 128 rows. CudaOptions::wgmma_gemm: on by default, by shape (tuning.cuh).
#pragma once

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/matmul.cuh"

namespace hy::cuda {

// Rows this GEMM takes at most (n-tiles of 8 to 128), and the least the backend sends it (fewer go to the GEMVs;
// wgmma_gemm itself takes 1 row and more, for benchmarks).
constexpr int kWgmmaGemmMaxRows = 128;
constexpr int kWgmmaGemmMinRows = 9;

// True when this build carries sm_90a code for the current device (wgmma exists only there): read once per device
// from a device variable that only the sm_90a compilation sets.
bool wgmma_available();

// The stream-K split (CudaOptions::wgmma_stream_k and wgmma_stream_k_quant, LaunchContext::stream_k_*):
// kWgmmaStreamKBlocksPerSm blocks an SM, each with a partial of kWgmmaStreamKPartialFloats fp32 sums (128 features x 64
// rows) and an int flag in the workspace.
constexpr int kWgmmaStreamKBlocksPerSm = 2;
constexpr int kWgmmaStreamKPartialFloats = 128 * 64;

// The K split (cluster size: 1, 2, 4 or 8) for an N x K matrix on a device of `sms` SMs: the fewest parts that give
// every SM a block, with at least 4 chunks of 64 values per part.
int wgmma_gemm_parts(int64_t N, int64_t K, int sms);

// True when ctx sends T rows to this GEMM: ctx.wgmma and ctx.clusters, kWgmmaGemmMinRows <= T <=
// ctx.wgmma_gemm_max_rows, and no GEMV takes them (gemv_wide_rows; the register tensor-core GEMV's rows under
// ctx.tc_gemv_all or ctx.tc_group_max_rows). wgmma_gemm_fits adds the shape and pointers: K % 8 == 0, K < 2^30, x
// and w 16-byte aligned.
bool wgmma_gemm_rows(int64_t T, const LaunchContext& ctx);
bool wgmma_gemm_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, const LaunchContext& ctx);

// y[T, N] = x[T, K] @ w[N, K]^T; out_f32 selects an F32 y (else bf16, rounded once from the fp32 sum). parts <= 0:
// ctx.wgmma_gemm_parts, or when that is 0 wgmma_gemm_parts(N, K, ctx.sm_count). Throws Error(internal) for a shape
// wgmma_gemm_fits refuses or T > kWgmmaGemmMaxRows, and Error(backend) without sm_90a code or clusters.
void wgmma_gemm(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
                const LaunchContext& ctx, int parts = 0);
// The matrices of g (which share x and K; block_end and evict_first are set here) in one launch; parts (when <= 0)
// from the group's tiles together, so a matrix's bits are those of its group, in any batch.
void wgmma_gemm_group(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, const LaunchContext& ctx,
                      int parts = 0);
// gemv_gate_up's contract on the wgmma GEMM: gate_out = bf16(x Wg^T), up_out = bf16(x Wu^T), act_out =
// bf16(bf16(silu(gate)) * up) (act_out may be gate_out), all [T, N]; a block takes 64 features of both matrices, so
// the activation is computed where the sums are. Same errors as wgmma_gemm.
void wgmma_gate_up(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                   bf16* up_out, bf16* act_out, const LaunchContext& ctx, int parts = 0);

// ---- Quantized weights (Q8, Q4, FP8 e4m3) on the same GEMM: W8A16 / W4A16 ----
// The same tiles, K split, ring and epilogue as the bf16 kernel; each stage holds a 64-value chunk of the weights'
// codes and scales, which every thread turns into bf16(code * scale) in registers, as wgmma's A operand (so the
// weights are rounded exactly as the dequantize-then-GEMM path rounds them, without writing them to memory), and x
// goes to shared memory in the order those register fragments take K. y is bf16. Without it, Q8/Q4 matrices of
// more rows than the integer GEMV takes were dequantized to bf16 scratch for cuBLASLt every step (reading the codes,
// writing and reading back twice their bytes), and FP8 ones went to the FP8 tensor-core GEMM (W8A8) or the same
// dequantization (CudaOptions::fp8_block_scaled_gemm).

// Rows this GEMM takes at most (n-tiles of 16, 32 or 64).
constexpr int kWgmmaQuantMaxRows = 64;

// True when ctx sends T rows of quantized weights to this GEMM: ctx.wgmma and ctx.clusters and kWgmmaGemmMinRows
// <= T <= min(ctx.wgmma_quant_max_rows, kWgmmaQuantMaxRows). wgmma_quant_fits adds the matrix: Q8/Q4 with a valid
// group and no scale segments, or F8_E4M3 (any segments) when ctx.wgmma_quant_fp8, K % 64 == 0, N and K < 2^30, x and w
// 16-byte aligned.
bool wgmma_quant_rows(int64_t T, const LaunchContext& ctx);
bool wgmma_quant_fits(const bf16* x, int64_t T, const Matrix& w, const LaunchContext& ctx);
// y_s = x @ W_s^T (bf16) for the 1 to Fp8Group::kMax members of g (one dtype, K and, for Q8/Q4, group qgroup; each
// wgmma_quant_fits) in one launch; parts as wgmma_gemm_group. Throws Error(internal) for a member it does not take
// and Error(backend) without sm_90a code or clusters.
void wgmma_gemm_quant_group(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, int64_t qgroup,
                            const LaunchContext& ctx, int parts = 0);
// wgmma_gate_up's contract for quantized w_gate and w_up (one dtype, shape, group and scale segments; both
// wgmma_quant_fits).
void wgmma_gate_up_quant(const bf16* x, int64_t T, const Matrix& w_gate, const Matrix& w_up, bf16* gate_out,
                         bf16* up_out, bf16* act_out, const LaunchContext& ctx, int parts = 0);

}  // namespace hy::cuda
