// The CPU kernels: fp32 arithmetic, the reference every other backend is tested against. All activations are F32.
// Each function is deterministic and independent of the thread count and of how rows are batched: row r of an
// output depends only on row r of the inputs (and the sequence state), computed in a fixed order.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace hy::cpu {

// Per batch row: its sequence slot and position (filled from the batch runs).
struct RowMap {
    int64_t n_rows = 0;
    const int32_t* slot = nullptr;  // [n_rows]
    const int32_t* pos = nullptr;   // [n_rows]
};

// y[rows, w.rows] = x[rows, w.cols] @ w^T; w is F32, F16 or BF16 (widened exactly to F32), or FP8 with block scales
// (each weight fp8 value * its block's scale, exactly as an F32 matrix of those values gives); fp32 accumulation.
// Q8/Q4 weights go to matmul_int with int_isa_best().
void matmul(const float* x, int64_t rows, const Matrix& w, float* y, ThreadPool& pool);

// The instruction sets of the integer matmul (kernels/cpu/matmul_int.cpp), all giving the same bits.
enum class IntIsa : uint8_t { scalar, avx2, avx512_vnni };
const char* int_isa_name(IntIsa isa);  // "scalar", "avx2", "avx512-vnni"
bool int_isa_supported(IntIsa isa);    // this CPU runs it (scalar: always)
IntIsa int_isa_best();                 // the fastest this CPU runs (checked once)

// y[rows, w.rows] F32 = x[rows, w.cols] F32 @ w^T for Q8/Q4 w (kernels/backend.h) with int8 activations: per row t
// and weight group g, xs[t, g] = amax / 127 over the group and xq = x * (127 / amax) rounded to nearest even (a group
// with a NaN or infinity: xs NaN; all zeros: xs 0); then y[t, n] = the fma chain over g in increasing order of
// float(sum of w codes * xq codes over the group) * (ws[n, g] * xs[t, g]), from 0. So |y - x @ dequantized(w)^T| <=
// sum over g of (xs[t, g] / 2) * sum |dequantized w| over the group, plus fp32 rounding. The same bits for every isa,
// thread count and batch. Throws Error(unsupported) for an isa this CPU lacks, Error(internal) for a bad matrix.
void matmul_int(const float* x, int64_t rows, const Matrix& w, float* y, ThreadPool& pool, IntIsa isa);

// y[rows, dim] = x * rsqrt(mean(x^2) + eps) * (zero_centred ? 1 + w : w). y may alias x.
void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, float* y,
              ThreadPool& pool);

// y[n] = silu(gate[n]) * up[n], silu(v) = v / (1 + exp(-v)) with exp_f32 (kernels/cpu/vec.h); y may be gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool);

// The MoE router's last step for one row (Backend::moe_route): p = softmax(logits[0, E)) in fp32; ids[0, k) the k
// largest p, largest first, ties to the lower id; weights[j] = p[ids[j]], divided by their sum when normalize.
void softmax_top_k(const float* logits, int E, int k, bool normalize, float* weights, int32_t* ids);

// Backend::moe_experts: y[rows, H] = the routed experts' weighted sum, expert by expert in increasing id (each
// expert's rows gathered and run as one matmul). scratch: [rows * (2H + 3I + 1)] floats.
void moe_experts(const float* x, int64_t rows, const MoeExperts& experts, const float* weights, const int32_t* ids,
                 int k, float* y, float* scratch, ThreadPool& pool);

// Gated attention core (see AttentionArgs), F32 act. q_scratch: [T, Hq, D]; scores: [pool.size(), n_ctx].
void attention(const AttentionArgs& args, const RowMap& rows, float* q_scratch, float* scores, ThreadPool& pool);

// Gated DeltaNet core (see GatedDeltaNetArgs), F32 act. mixed_scratch: [T, C].
void gated_delta_net(const GatedDeltaNetArgs& args, const BatchDesc& batch, float* mixed_scratch, ThreadPool& pool);

}  // namespace hy::cpu
