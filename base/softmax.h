// Log-softmax and arg max over logits rows, shared by the sampler (model/sampler.cpp) and the CPU backend's greedy
// picks (Backend::argmax_rows), so that a greedy pick's log-probability equals a host-sampled token's.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace hy {

// exp(x) for x <= 0 in float, vectorizable: 2^n * 2^f with n = round(x log2 e), |f| <= 1/2, 2^f by its Taylor
// series to degree 7 (relative error < 2e-7). Arguments below -87 (and NaN) give exp(-87) ~ 1.6e-38, which is
// negligible in every sum the sampler makes; -inf logits are never candidates.
inline float fast_exp(float x) {
    x = x > -87.0f ? x : -87.0f;
    const float t = x * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
    const float f = (t - n) * 0.693147180559945309f;  // f * ln 2, in [-0.347, 0.347]
    float q = 1.0f / 5040.0f;
    q = q * f + 1.0f / 720.0f;
    q = q * f + 1.0f / 120.0f;
    q = q * f + 1.0f / 24.0f;
    q = q * f + 1.0f / 6.0f;
    q = q * f + 0.5f;
    q = q * f + 1.0f;
    q = q * f + 1.0f;
    const int32_t e = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &e, 4);
    return q * scale;
}

// sum_i exp(x_i - mx) over x (NaN and -inf add about 0), accumulated in 16 float lanes per block of 1024 values
// and in double across blocks.
double exp_sum(std::span<const float> x, float mx);

// log p(id) = logits[id] - log(sum_{j < n_valid} exp(logits[j])): the log-softmax of the raw logits (before
// penalties, filters and temperature) over the sampleable ids, natural log, max-subtracted (absolute error about
// 1e-6). NaN logits count as -inf. Returns -inf for an id outside [0, n_valid) or a -inf/NaN logit; n_valid is
// clamped to logits.size(). O(n_valid), no allocation.
double log_softmax_at(std::span<const float> logits, int n_valid, int32_t id);

// The normalizer of log_softmax_at, to score several ids of one row with one pass over it: mx, the largest logit
// of [0, n_valid) (the arg max's value), and log_sum = log(sum_j exp(logits[j] - mx)) (0 when mx is not finite).
struct LogSoftmaxNorm {
    float mx = 0.0f;
    double log_sum = 0.0;
};
LogSoftmaxNorm log_softmax_norm(std::span<const float> logits, int n_valid);

// log_softmax_at with the row's normalizer from log_softmax_norm (the same number, without the O(n_valid) pass).
double log_softmax_at(std::span<const float> logits, int n_valid, int32_t id, const LogSoftmaxNorm& norm);

// The arg max of logits[0, n_valid) (lowest id on ties, NaN ignored); 0 when every value is NaN or -inf.
int32_t argmax(std::span<const float> logits, int n_valid);

}  // namespace hy
