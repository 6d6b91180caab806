#include "base/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace hy {

namespace {

// value = (-1)^s * (exp == 0 ? m / 2^M * 2^(1 - bias) : (1 + m / 2^M) * 2^(exp - bias)); ldexp is exact here.
struct Fp8Tables {
    float e4m3[256];
    float e5m2[256];
    Fp8Tables() {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (int b = 0; b < 256; b++) {
            const float sign = (b & 0x80) ? -1.0f : 1.0f;
            {
                const int e = (b >> 3) & 0xf, m = b & 0x7;
                if ((b & 0x7f) == 0x7f)
                    e4m3[b] = nan;
                else
                    e4m3[b] = sign * (e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10));
            }
            {
                const int e = (b >> 2) & 0x1f, m = b & 0x3;
                if (e == 31)
                    e5m2[b] = m == 0 ? sign * std::numeric_limits<float>::infinity() : nan;
                else
                    e5m2[b] = sign * (e == 0 ? std::ldexp(float(m), -16) : std::ldexp(float(4 + m), e - 17));
            }
        }
    }
};

const Fp8Tables& tables() {
    static const Fp8Tables t;
    return t;
}

}  // namespace

const float* fp8_table(DType t) {
    if (t == DType::F8_E4M3) return tables().e4m3;
    if (t == DType::F8_E5M2) return tables().e5m2;
    throw Error(Status::internal, std::string("fp8_table: ") + dtype_name(t) + " is not an FP8 dtype");
}

uint8_t f32_to_f8_e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    const float a = std::fabs(f);
    if (a >= kF8E4M3Max) return sign | 0x7e;  // (448 and above, inf included: saturate)
    if (a < 0x1p-6f)                          // subnormal range: codes 0..8 are a * 2^9 (8 is the smallest normal)
        return uint8_t(sign | int(std::nearbyint(a * 512.0f)));  // (exact product; ties to even)
    // Normal: keep the top 3 mantissa bits, round the other 20 to nearest even; a carry moves into the exponent,
    // which is the next code. a < 448 never rounds past 0x7e (448).
    uint32_t u;
    std::memcpy(&u, &a, 4);
    const int e = int(u >> 23) - 127;  // in [-6, 8]
    uint32_t code = uint32_t(e + 7) << 3 | ((u >> 20) & 7u);
    const uint32_t rest = u & 0xfffffu;
    if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) code++;
    return uint8_t(sign | code);
}

}  // namespace hy
