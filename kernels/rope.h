// RoPE's inverse frequencies, the one definition for the CPU and CUDA attention kernels: plain (theta^(-2f/R)) or
// YaRN-scaled (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", as
// transformers' _compute_yarn_parameters computes them: the formula is restated in rope_inv_freq's comment).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define HY_HOST_DEVICE __host__ __device__
#else
#define HY_HOST_DEVICE
#endif

namespace hy {

// The inverse frequency of RoPE pair f (0 <= f < R/2, R the rotary dims), in f32:
//   p = theta^(2f / R); extrapolation = 1 / p (plain RoPE, returned when yarn_factor is 0);
//   YaRN: interpolation = 1 / (factor p), ramp = clamp((f - low) / range, 0, 1), keep = 1 - ramp,
//   inv_freq = interpolation (1 - keep) + extrapolation keep.
// low and range (= high - low, or 0.001 where they meet) come from ModelConfig (rope_yarn_low, rope_yarn_range): the
// first pairs (fast rotations, below low) keep their frequency, the pairs past high are divided by the factor.
HY_HOST_DEVICE inline float rope_inv_freq(int f, int R, float theta, float yarn_factor, float yarn_low,
                                          float yarn_range) {
    const float p = powf(theta, float(2 * f) / float(R));
    const float extrapolation = 1.0f / p;
    if (!(yarn_factor > 0.0f)) return extrapolation;
    const float interpolation = 1.0f / (yarn_factor * p);
    const float ramp = fminf(fmaxf((float(f) - yarn_low) / yarn_range, 0.0f), 1.0f);
    const float keep = 1.0f - ramp;
    return interpolation * (1.0f - keep) + extrapolation * keep;
}

}  // namespace hy
