// Log-softmax pieces shared by the sampler (model/sampler.cpp) and the CPU backend's greedy picks.
#include "base/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace hy {

namespace {

float clean(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

}  // namespace

// sum_i exp(x_i - mx) over x (NaN and -inf add ~0), accumulated in 16 float lanes per block of 1024 values and
// in double across blocks.
double exp_sum(std::span<const float> x, float mx) {
    double total = 0.0;
    const size_t n = x.size();
    for (size_t b = 0; b < n; b += 1024) {
        const size_t e = std::min(n, b + 1024);
        float lanes[16] = {};
        size_t i = b;
        for (; i + 16 <= e; i += 16)
            for (size_t l = 0; l < 16; l++) lanes[l] += fast_exp(x[i + l] - mx);
        for (; i < e; i++) lanes[0] += fast_exp(x[i] - mx);
        for (float v : lanes) total += double(v);
    }
    return total;
}

int32_t argmax(std::span<const float> logits, int n_valid) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    int32_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < n; i++) {
        const float v = logits[i];
        if (v > best_v) {  // false for NaN
            best_v = v;
            best = int32_t(i);
        }
    }
    return best;
}

LogSoftmaxNorm log_softmax_norm(std::span<const float> logits, int n_valid) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    LogSoftmaxNorm norm;
    if (n == 0) return norm;
    norm.mx = logits[size_t(argmax(logits, int(n)))];
    if (std::isfinite(norm.mx)) norm.log_sum = std::log(exp_sum(logits.first(n), norm.mx));
    return norm;
}

double log_softmax_at(std::span<const float> logits, int n_valid, int32_t id, const LogSoftmaxNorm& norm) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    if (id < 0 || size_t(id) >= n) return -std::numeric_limits<double>::infinity();
    const float x = clean(logits[size_t(id)]);
    if (std::isinf(x) && x < 0) return -std::numeric_limits<double>::infinity();
    const float mx = norm.mx;
    if (std::isinf(mx)) return x == mx ? 0.0 : -std::numeric_limits<double>::infinity();  // +inf present
    return double(x) - double(mx) - norm.log_sum;
}

double log_softmax_at(std::span<const float> logits, int n_valid, int32_t id) {
    const size_t n = std::min(logits.size(), size_t(std::max(n_valid, 0)));
    if (id < 0 || size_t(id) >= n) return -std::numeric_limits<double>::infinity();  // (before the O(n) pass)
    return log_softmax_at(logits, n_valid, id, log_softmax_norm(logits, n_valid));
}

}  // namespace hy
