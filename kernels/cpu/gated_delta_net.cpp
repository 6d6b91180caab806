// CPU Gated DeltaNet core (QWEN35.md "Gated DeltaNet layer"), fp32, token by token: the exact recurrence.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"

namespace hy::cpu {

namespace {

constexpr int kMaxDim = 512;

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x * rsqrt(sum(x^2) + 1e-6), as HF's l2norm (FLA convention).
inline void l2norm(float* x, int n) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

}  // namespace

void gated_delta_net(const GatedDeltaNetArgs& p, const BatchDesc& batch, float* mixed, ThreadPool& pool) {
    const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dk = p.k_dim, Dv = p.v_dim, K = p.conv_kernel;
    const int64_t C = 2 * int64_t(Hk) * Dk + int64_t(Hv) * Dv;
    const float* qkv = static_cast<const float*>(p.qkv);
    const float* z = static_cast<const float*>(p.z);
    const float* b = static_cast<const float*>(p.b);
    const float* a = static_cast<const float*>(p.a);
    float* conv_state = static_cast<float*>(p.conv_state);
    float* out = static_cast<float*>(p.out);
    const int64_t conv_slot = int64_t(K - 1) * C;
    const int64_t ssm_slot = int64_t(Hv) * Dk * Dv;

    // 1. Causal depthwise conv + SiLU per run and channel; the conv state keeps the last K-1 inputs. Token by token
    // over blocks of channels (the rows of qkv are contiguous in channels), each output summed over the taps in order.
    if (K > 16) throw Error(Status::unsupported, "CPU Gated DeltaNet: conv kernel above 16");
    constexpr int64_t kBlock = 64;
    for (int r = 0; r < batch.n_runs; r++) {
        const SeqRun& run = batch.runs[r];
        float* st = conv_state + run.slot * conv_slot;  // [K-1, C], oldest first
        pool.parallel_for(
            (C + kBlock - 1) / kBlock, std::max<int64_t>(1, 128 / run.n_tokens), [&](int64_t b0, int64_t b1, int) {
                for (int64_t b = b0; b < b1; b++) {
                    const int64_t c0 = b * kBlock, n = std::min(kBlock, C - c0);
                    float wt[16][kBlock];  // the block's conv weights, tap-major
                    for (int64_t c = 0; c < n; c++)
                        for (int j = 0; j < K; j++) wt[j][c] = p.conv_w[(c0 + c) * K + j];
                    for (int i = 0; i < run.n_tokens; i++) {
                        float acc[kBlock] = {};
                        for (int j = 0; j < K; j++) {
                            const int src = i - (K - 1) + j;  // index into the run; < 0: the state
                            const float* in =
                                src >= 0 ? qkv + (run.row + src) * C + c0 : st + int64_t(K - 1 + src) * C + c0;
                            for (int64_t c = 0; c < n; c++) acc[c] += wt[j][c] * in[c];
                        }
                        map_f32(acc, mixed + (run.row + i) * C + c0, n, [](v8f v) { return silu_f32(v); });
                    }
                    // New state: the last K-1 inputs of [state, run].
                    float last[16][kBlock];
                    for (int j = 0; j < K - 1; j++) {
                        const int src = run.n_tokens - (K - 1) + j;
                        std::memcpy(last[j],
                                    src >= 0 ? qkv + (run.row + src) * C + c0 : st + int64_t(K - 1 + src) * C + c0,
                                    size_t(n) * sizeof(float));
                    }
                    for (int j = 0; j < K - 1; j++)
                        std::memcpy(st + int64_t(j) * C + c0, last[j], size_t(n) * sizeof(float));
                }
            });
    }

    // 2. The delta rule per (run, value head), token by token; then the gated RMSNorm.
    const int ratio = Hv / Hk;
    const float sqrt_dk = float(std::sqrt(double(Dk)));
    if (Dk > kMaxDim || Dv > kMaxDim) throw Error(Status::unsupported, "CPU Gated DeltaNet: head dims above 512");
    // Items (run, value head) are dealt round-robin: runs differ in length.
    const int64_t n_items = int64_t(batch.n_runs) * Hv;
    const int n_workers = pool.size();
    pool.parallel_for(n_workers, 1, [&](int64_t w0, int64_t w1, int) {
        for (int64_t w = w0; w < w1; w++) {
            for (int64_t item = w; item < n_items; item += n_workers) {
                const SeqRun& run = batch.runs[item / Hv];
                const int h = int(item % Hv);
                float* S = p.ssm_state + run.slot * ssm_slot + int64_t(h) * Dk * Dv;  // [Dk, Dv]
                const int kh = h / ratio;
                const float A = std::exp(p.A_log[h]);
                float q[kMaxDim], k[kMaxDim], u[kMaxDim], o[kMaxDim];
                for (int i = 0; i < run.n_tokens; i++) {
                    const int64_t row = run.row + i;
                    const float* m = mixed + row * C;
                    for (int d = 0; d < Dk; d++) {
                        q[d] = m[kh * Dk + d];
                        k[d] = m[int64_t(Hk) * Dk + kh * Dk + d];
                    }
                    l2norm(q, Dk);
                    l2norm(k, Dk);
                    for (int d = 0; d < Dk; d++) q[d] = q[d] / sqrt_dk;
                    const float* v = m + 2 * int64_t(Hk) * Dk + int64_t(h) * Dv;
                    const float beta = sigmoid(b[row * Hv + h]);
                    const float g = -A * softplus(a[row * Hv + h] + p.dt_bias[h]);
                    const float decay = std::exp(g);
                    // S = decay * S; kv_mem = S^T k
                    for (int e = 0; e < Dv; e++) u[e] = 0.0f;
                    for (int d = 0; d < Dk; d++) {
                        float* Sd = S + int64_t(d) * Dv;
                        const float kd = k[d];
                        for (int e = 0; e < Dv; e++) {
                            Sd[e] *= decay;
                            u[e] += Sd[e] * kd;
                        }
                    }
                    for (int e = 0; e < Dv; e++) u[e] = (v[e] - u[e]) * beta;
                    // S += k u^T; o = S^T q
                    for (int e = 0; e < Dv; e++) o[e] = 0.0f;
                    for (int d = 0; d < Dk; d++) {
                        float* Sd = S + int64_t(d) * Dv;
                        const float kd = k[d], qd = q[d];
                        for (int e = 0; e < Dv; e++) {
                            Sd[e] += kd * u[e];
                            o[e] += Sd[e] * qd;
                        }
                    }
                    // y = norm_w * RMSNorm(o) * silu(z)
                    float ss = 0.0f;
                    for (int e = 0; e < Dv; e++) ss += o[e] * o[e];
                    const float inv = 1.0f / std::sqrt(ss / float(Dv) + p.eps);
                    const float* zr = z + row * int64_t(Hv) * Dv + int64_t(h) * Dv;
                    float* y = out + row * int64_t(Hv) * Dv + int64_t(h) * Dv;
                    float sz[kMaxDim];
                    map_f32(zr, sz, Dv, [](v8f v) { return silu_f32(v); });
                    for (int e = 0; e < Dv; e++) y[e] = p.norm_w[e] * (o[e] * inv) * sz[e];
                }
            }
        }
    });
}

}  // namespace hy::cpu
