// CPU RMSNorm and the MLP activation.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"

namespace hy::cpu {

// HF Qwen3_5RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), all fp32; the gated GDN norm uses w directly.
void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, float* y,
              ThreadPool& pool) {
    pool.parallel_for(rows, std::max<int64_t>(1, 16384 / std::max(dim, 1)), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; r++) {
            const float* xr = x + r * dim;
            float* yr = y + r * dim;
            float ss = 0.0f;
            for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
            const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
            for (int i = 0; i < dim; i++) yr[i] = xr[i] * inv * (zero_centred ? 1.0f + w[i] : w[i]);
        }
    });
}

void silu_mul(const float* gate, const float* up, int64_t n, float* y, ThreadPool& pool) {
    // 8 at a time, the last (e - b) % 8 through a padded vector (an element's result does not depend on where it
    // falls); each vector is read before it is written, so y may be gate or up. (The whole vectors are loaded and
    // stored directly: copying every vector through a buffer of variable length compiled to rep movs, a third of
    // the time.)
    pool.parallel_for(n, 16384, [&](int64_t b, int64_t e, int) {
        int64_t i = b;
        for (; i + 8 <= e; i += 8) {
            const v8f v = silu_f32(load_f32<v8f>(gate + i)) * load_f32<v8f>(up + i);
            std::memcpy(y + i, &v, sizeof v);
        }
        if (i < e) {
            const size_t bytes = size_t(e - i) * sizeof(float);
            float g8[8] = {}, u8[8] = {};
            std::memcpy(g8, gate + i, bytes);
            std::memcpy(u8, up + i, bytes);
            const v8f v = silu_f32(load_f32<v8f>(g8)) * load_f32<v8f>(u8);
            std::memcpy(y + i, &v, bytes);
        }
    });
}

}  // namespace hy::cpu
