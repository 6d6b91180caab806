// Projections with integer weights: y[T, N] = x[T, K] @ W[N, K]^T where W is Q8 or Q4 (`--quant int8` / `int4`;
// kernels/backend.h Matrix: codes q(r, c) with an F32 scale per row and group of `group` columns, the weight being
// q(r, c) * scales[r, c / group]), x bf16, y bf16 (F32 for logits).
//
// - Up to kGemvMaxTokens rows (decode): a W-only GEMV on tensor cores (W8A16 / W4A16), over one matrix or a group
//   of matrices that share x. A block of 8 warps owns 16 output features; warp w takes the 64-column chunks w,
//   w + 8, ... (weights streamed into registers, or with CudaOptions::int_gemv_staged copied into shared memory in
//   cp.async stages, the same sums; the block's scales and x staged in shared memory, which bounds T * K:
//   int_gemv_fits). Matrices with fewer 16-row tiles than 2 per SM split K in two halves (8 features a
//   block, twice the blocks; CudaOptions::int_gemv_split_k), the halves' sums added at the end; the choice depends
//   on the shapes alone, so a row's result does not depend on the batch. Each lane turns its codes into
//   bf16 exactly (integers of at most 8 bits are bf16 values) and runs mma m16n8k16 with x's bf16 values; the f32
//   sums of a group's products are multiplied by the group's scale (per row) and added up in f32. So the only
//   roundings are the tensor cores' f32 accumulation and the final bf16 of y: the weights are never rounded.
// - More rows (prefill, large batches): W dequantized to bf16 (bf16(q * scale)) into workspace scratch, then the bf16
//   cuBLASLt GEMM, as FP8's dequantize mode.
#pragma once

#include "kernels/backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/matmul.cuh"

namespace hy::cuda {

// True when the integer GEMV takes w with T rows of x: 1 <= T <= kGemvMaxTokens, w Q8 or Q4 with scales and a valid
// group (int_quant_shape_ok), 16-byte aligned x and w, and T rows of x plus a 16-row tile's scales within a block's
// shared memory (about 200 KB on Hopper: T * K up to about 90,000 values with group 32).
bool int_gemv_fits(const bf16* x, int64_t T, const Matrix& w);

// The rows of x for which the GEMV copies its codes into shared memory by default (LaunchContext::int_gemv_staged
// 0; CudaOptions::int_gemv_staged has the measurements): the same sums either way.
constexpr int kIntStagedMinRows = 2;
constexpr int kIntStagedMaxRows = 4;
// y = x @ w^T by the integer GEMV (int_gemv_fits; y bf16, or f32 when out_f32).
void gemv_int(const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, const LaunchContext& ctx);
// The same for 1 to Fp8Group::kMax matrices of one dtype (Q8 or Q4), K and group that share x, in one launch
// (g.w, scales, y, n as Fp8Group::add sets them; segment_rows 0); y bf16. Throws Error(internal) when a member is
// not taken by int_gemv_fits.
void gemv_int_group(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, int64_t group,
                    const LaunchContext& ctx);
// The MLP's gate/up/SiLU in one launch (the SwiGLU mode): gate = bf16(x @ w_gate^T), up = bf16(x @ w_up^T), act =
// bf16(bf16(silu(gate)) * up), all [T, N] (act may alias gate: then gate is not written separately). gate and up
// are bitwise those of gemv_int_group over {w_gate, w_up} run over whole rows (never K halves), act that of
// silu_mul on them. w_gate and w_up: one Q8/Q4 dtype, shape and group, both taken by int_gemv_fits; else
// Error(internal).
void gemv_int_gate_up(const bf16* x, int64_t T, const Matrix& w_gate, const Matrix& w_up, bf16* gate, bf16* up,
                      bf16* act, const LaunchContext& ctx);
// out[N, K] = bf16(q * scale) for every weight of a Q8/Q4 w.
void dequantize_int(const Matrix& w, bf16* out, const LaunchContext& ctx);
// y = x @ w^T for a Q8/Q4 w: the GEMV when it fits, else dequantize_int into scratch.weight and the bf16 GEMM.
// Throws Error(internal) when the scratch is too small for the shape.
void matmul_int(Gemm& gemm, const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, const Fp8Scratch& scratch,
                const LaunchContext& ctx);

}  // namespace hy::cuda
