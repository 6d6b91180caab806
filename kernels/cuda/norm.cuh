// RMSNorm over rows of bf16 activations (QWEN35.md "RMSNorm1p"): fp32 math from the bf16 input, one rounding at
// the end.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// y[rows, dim] = bf16(x * rsqrt(mean(x^2) + eps) * (zero_centred ? 1 + w : w)); y may alias x.
void rms_norm(const bf16* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, bf16* y,
              const LaunchContext& ctx);

// The residual add and the next RMSNorm in one pass: x = bf16(x + d), then y = rms_norm(x) as above (y may alias
// x; d must not). The same memory as add() followed by rms_norm().
void add_rms_norm(bf16* x, const bf16* d, const float* w, int64_t rows, int dim, float eps, bool zero_centred, bf16* y,
                  const LaunchContext& ctx);

}  // namespace hy::cuda
