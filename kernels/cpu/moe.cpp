// CPU mixture-of-experts pieces (docs/QWEN35.md "Mixture-of-experts members"), fp32: the router's softmax and
// top-k, and the routed experts' weighted sum.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"

namespace hy::cpu {

void softmax_top_k(const float* logits, int E, int k, bool normalize, float* weights, int32_t* ids) {
    // p = softmax(logits) in fp32, max-subtracted (as torch.softmax(dtype=float))
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = std::max(mx, logits[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += std::exp(logits[e] - mx);
    // top-k by repeated selection: the largest p not yet taken, the lower id on ties; p is monotonic in the logit,
    // so the logits are compared (NaN never wins)
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken = taken || ids[i] == e;
            if (taken) continue;
            if (best < 0 || logits[e] > logits[best]) best = e;
        }
        ids[j] = best;
        weights[j] = std::exp(logits[best] - mx) / sum;
    }
    if (normalize) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += weights[j];
        for (int j = 0; j < k; j++) weights[j] /= s;
    }
}

void moe_experts(const float* x, int64_t rows, const MoeExperts& ex, const float* weights, const int32_t* ids, int k,
                 float* y, float* scratch, ThreadPool& pool) {
    const int64_t H = ex.down.rows / std::max(ex.n_experts, 1), I = ex.intermediate, E = ex.n_experts;
    float* xs = scratch;                                           // [rows, H] the expert's rows of x
    float* gu = xs + rows * H;                                     // [rows, 2I] gate | up
    float* act = gu + rows * 2 * I;                                // [rows, I]
    float* out = act + rows * I;                                   // [rows, H]
    int32_t* picked = reinterpret_cast<int32_t*>(out + rows * H);  // [rows] t * k + j of the expert's rows
    std::memset(y, 0, size_t(rows * H) * 4);
    for (int64_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t t = 0; t < rows; t++)
            for (int j = 0; j < k; j++)
                if (ids[t * k + j] == e) picked[n++] = int32_t(t * k + j);  // (the ids of a row are distinct)
        if (n == 0) continue;
        for (int64_t r = 0; r < n; r++) std::memcpy(xs + r * H, x + (picked[r] / k) * H, size_t(H) * 4);
        const Matrix gate_up = matrix_rows(ex.gate_up, e * 2 * I, 2 * I);  // (FP8: with the expert's scales)
        const Matrix down = matrix_rows(ex.down, e * H, H);
        matmul(xs, n, gate_up, gu, pool);
        for (int64_t r = 0; r < n; r++) {
            const float* g = gu + r * 2 * I;
            map_f32(g, act + r * I, I, [](v8f v) { return silu_f32(v); });
            for (int64_t i = 0; i < I; i++) act[r * I + i] *= g[I + i];
        }
        matmul(act, n, down, out, pool);
        for (int64_t r = 0; r < n; r++) {
            const int64_t tj = picked[r], t = tj / k;
            const float w = weights[tj];
            for (int64_t i = 0; i < H; i++) y[t * H + i] += out[r * H + i] * w;
        }
    }
}

}  // namespace hy::cpu
