// CPU gated full attention (QWEN35.md "Gated attention layer"), fp32.
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"
#include "kernels/rope.h"

namespace hy::cpu {

namespace {

constexpr int kMaxRotaryHalf = 256;

// q . k over D in 16 lanes (a fixed order, vectorized: a plain float loop is a serial dependency chain).
inline float dot(const float* a, const float* b, int D) {
    v16f acc{};
    int i = 0;
    for (; i + 16 <= D; i += 16) {
        acc += load_f32(a + i) * load_f32(b + i);
    }
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc[l];
    for (; i < D; i++) s += a[i] * b[i];
    return s;
}

// In place: r[l][k] <- r[k][l] (an 8 x 8 transpose in three rounds of two-input shuffles, which x86 compilers turn
// into unpack, shuffle and 128-bit lane permutes).
inline void transpose8(v8f (&r)[8]) {
    v8f t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[2 * i + 1] = __builtin_shufflevector(r[2 * i], r[2 * i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {  // t[4i + h], t[4i + 2 + h] -> u[4i + 2h], u[4i + 2h + 1]
            u[4 * i + 2 * h] = __builtin_shufflevector(t[4 * i + h], t[4 * i + 2 + h], 0, 1, 8, 9, 4, 5, 12, 13);
            u[4 * i + 2 * h + 1] = __builtin_shufflevector(t[4 * i + h], t[4 * i + 2 + h], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int l = 0; l < 4; l++) {
        r[l] = __builtin_shufflevector(u[l], u[4 + l], 0, 1, 2, 3, 8, 9, 10, 11);
        r[4 + l] = __builtin_shufflevector(u[l], u[4 + l], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

// out[j] = dot(q, k + j * stride, D) for 8 keys, bit for bit (D % 16 == 0): each key's 16 lane sums are formed as
// dot forms them (lanes 0-7 in one pass over D, lanes 8-15 in a second, 8 accumulators each), then transposed so
// that the lanes of the 8 keys are added in dot's order (lane 0 first) with 8 keys per vector operation.
inline void dot8(const float* q, const float* k, int64_t stride, int D, float* out) {
    v8f s{};
    for (int half = 0; half < 2; half++) {
        v8f acc[8];
        for (int j = 0; j < 8; j++) acc[j] = v8f{};
        for (int i = 8 * half; i < D; i += 16) {
            const v8f qv = load_f32<v8f>(q + i);
            for (int j = 0; j < 8; j++) acc[j] += qv * load_f32<v8f>(k + j * stride + i);
        }
        transpose8(acc);
        for (int l = 0; l < 8; l++) s += acc[l];
    }
    std::memcpy(out, &s, sizeof s);
}

// RMSNorm1p over one head vector in place.
void norm1p(float* v, const float* w, int D, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < D; i++) ss += v[i] * v[i];
    const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
    for (int i = 0; i < D; i++) v[i] = v[i] * inv * (1.0f + w[i]);
}

// cos/sin of angle = pos * inv_freq[i] (kernels/rope.h: 1 / theta^(2i/R), or YaRN's), i < R/2, times the YaRN
// attention factor (1 without YaRN); fp32, as HF computes them.
void rope_table(const AttentionArgs& p, int pos, float* cos_out, float* sin_out) {
    const int R = p.rotary_dim;
    for (int i = 0; i < R / 2; i++) {
        const float inv_freq =
            rope_inv_freq(i, R, p.rope_theta, p.rope_yarn_factor, p.rope_yarn_low, p.rope_yarn_range);
        const float angle = float(pos) * inv_freq;
        cos_out[i] = std::cos(angle) * p.rope_attention_factor;
        sin_out[i] = std::sin(angle) * p.rope_attention_factor;
    }
}

// rotate_half RoPE on the first R dims: pairs (i, i + R/2).
void rope(float* v, int R, const float* c, const float* s) {
    const int half = R / 2;
    for (int i = 0; i < half; i++) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c[i] - x1 * s[i];
        v[i + half] = x1 * c[i] + x0 * s[i];
    }
}

}  // namespace

void attention(const AttentionArgs& p, const RowMap& rows, float* q_all, float* scores, ThreadPool& pool) {
    const int Hq = p.n_heads, Hkv = p.n_kv_heads, D = p.head_dim, R = p.rotary_dim;
    const int64_t T = rows.n_rows;
    const float* qg = static_cast<const float*>(p.qg);
    const float* k_in = static_cast<const float*>(p.k);
    const float* v_in = static_cast<const float*>(p.v);
    float* k_cache = static_cast<float*>(p.k_cache);
    float* v_cache = static_cast<float*>(p.v_cache);
    float* out = static_cast<float*>(p.out);
    const int64_t kv_row = int64_t(Hkv) * D;
    const int64_t slot_stride = int64_t(p.n_ctx) * kv_row;

    const int32_t* row_slot = rows.slot;
    const int32_t* row_pos = rows.pos;
    if (R > 2 * kMaxRotaryHalf) throw Error(Status::unsupported, "CPU attention: rotary dims above 512");

    // 1. q: norm + RoPE into q_all [T, Hq, D]; k: norm + RoPE, k and v into the cache.
    pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; t++) {
            const int pos = row_pos[t];
            float cs[kMaxRotaryHalf], sn[kMaxRotaryHalf];
            rope_table(p, pos, cs, sn);
            for (int h = 0; h < Hq; h++) {
                float* q = q_all + (t * Hq + h) * D;
                const float* src = qg + (t * Hq + h) * 2 * D;
                for (int i = 0; i < D; i++) q[i] = src[i];
                norm1p(q, p.q_norm, D, p.eps);
                rope(q, R, cs, sn);
            }
            float* kc = k_cache + row_slot[t] * slot_stride + int64_t(pos) * kv_row;
            float* vc = v_cache + row_slot[t] * slot_stride + int64_t(pos) * kv_row;
            for (int h = 0; h < Hkv; h++) {
                float* k = kc + h * D;
                for (int i = 0; i < D; i++) k[i] = k_in[t * kv_row + h * D + i];
                norm1p(k, p.k_norm, D, p.eps);
                rope(k, R, cs, sn);
                for (int i = 0; i < D; i++) vc[h * D + i] = v_in[t * kv_row + h * D + i];
            }
        }
    });

    // 2. softmax(q k^T / sqrt(D)) v over positions [0, pos], then the sigmoid gate.
    const float scale = 1.0f / std::sqrt(float(D));
    const int group = Hq / Hkv;
    // Items (row, head) are dealt round-robin: causal rows grow longer, so contiguous chunks would be unbalanced.
    const int64_t n_items = T * Hq;
    const int n_workers = pool.size();
    pool.parallel_for(n_workers, 1, [&](int64_t w0, int64_t w1, int) {
        for (int64_t w = w0; w < w1; w++) {
            for (int64_t item = w; item < n_items; item += n_workers) {
                const int64_t t = item / Hq;
                const int h = int(item % Hq);
                float* s = scores + w * p.n_ctx;
                const int pos = row_pos[t];
                const int kvh = h / group;
                const float* q = q_all + (t * Hq + h) * D;
                const float* kc = k_cache + row_slot[t] * slot_stride + kvh * D;
                const float* vc = v_cache + row_slot[t] * slot_stride + kvh * D;
                float mx = -INFINITY;
                int j = 0;
                if (D % 16 == 0)
                    for (; j + 8 <= pos + 1; j += 8) dot8(q, kc + int64_t(j) * kv_row, kv_row, D, s + j);
                for (; j <= pos; j++) s[j] = dot(q, kc + int64_t(j) * kv_row, D);
                for (j = 0; j <= pos; j++) {
                    s[j] *= scale;
                    mx = std::max(mx, s[j]);
                }
                map_f32(s, s, pos + 1, [mx](v8f v) { return exp_f32(v - mx); });
                float sum = 0.0f;
                for (int j = 0; j <= pos; j++) sum += s[j];
                const float inv = 1.0f / sum;
                for (int j = 0; j <= pos; j++) s[j] *= inv;  // p_j, once (not per block of o)
                float* o = out + (t * Hq + h) * D;
                // o = sum over j in order of p_j v_j; 64 values of o at a time in registers
                int i0 = 0;
                for (; i0 + 64 <= D; i0 += 64) {
                    v8f acc[8];
                    for (int c = 0; c < 8; c++) acc[c] = v8f{};
                    for (int j = 0; j <= pos; j++) {
                        const float* v = vc + int64_t(j) * kv_row + i0;
                        for (int c = 0; c < 8; c++) acc[c] += s[j] * load_f32<v8f>(v + 8 * c);
                    }
                    std::memcpy(o + i0, acc, sizeof acc);
                }
                for (int i = i0; i < D; i++) o[i] = 0.0f;
                for (int j = 0; j <= pos && i0 < D; j++) {
                    const float* v = vc + int64_t(j) * kv_row;
                    for (int i = i0; i < D; i++) o[i] += s[j] * v[i];
                }
                const float* gate = qg + (t * Hq + h) * 2 * D + D;
                for (int i = 0; i < D; i += 8) {
                    const int n = std::min(8, D - i);
                    v8f sg;
                    if (n == 8) {  // (whole vectors loaded directly: a copy of variable length compiles to rep movs)
                        sg = sigmoid_f32(load_f32<v8f>(gate + i));
                    } else {
                        float g8[8] = {};
                        std::memcpy(g8, gate + i, size_t(n) * sizeof(float));
                        sg = sigmoid_f32(load_f32<v8f>(g8));
                    }
                    for (int c = 0; c < n; c++) o[i + c] *= sg[c];
                }
            }
        }
    });
}

}  // namespace hy::cpu
