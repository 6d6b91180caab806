// Element-wise ops on bf16 activations: the residual add and the MLP activation.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// y[n] = bf16(y[n] + x[n]).
void add(bf16* y, const bf16* x, int64_t n, const LaunchContext& ctx);
// dst[n] (F32 when f32, else bf16) = uniform values in [lo, hi) from random_unit(seed, i) (kernels/backend.h).
void fill_random(void* dst, int64_t n, bool f32, float lo, float hi, uint64_t seed, const LaunchContext& ctx);
// y[n] = bf16(bf16(silu(gate[n])) * up[n]) (as a bf16 PyTorch MLP rounds); y may alias gate or up.
void silu_mul(const bf16* gate, const bf16* up, int64_t n, bf16* y, const LaunchContext& ctx);

}  // namespace hy::cuda
