#include "base/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "base/simd_width.h"

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

namespace {

constexpr int kLanes = kRegisterFloats;
typedef float VF __attribute__((vector_size(kLanes * 4)));
typedef int32_t VI __attribute__((vector_size(kLanes * 4)));

// f32_to_f8_e4m3 in each lane, branch-free: the same cases on the bits (NaN, saturation, subnormal, normal with
// round to nearest even).
inline VI to_e4m3(VF f) {
    VI bits;
    std::memcpy(&bits, &f, sizeof bits);
    const VI u = bits & 0x7fffffff, sign = (bits >> 24) & 0x80;
    // subnormal range (|f| < 2^-6): a * 2^9 rounded to nearest even (exact product; adding and taking away
    // 1.5 * 2^23 rounds a value below 8 to an integer, ties to even)
    VF a;
    std::memcpy(&a, &u, sizeof a);
    const VF sub_f = (a * 512.0f + 12582912.0f) - 12582912.0f;
    const VI sub = __builtin_convertvector(sub_f, VI);
    // normal: the exponent moved to bias 7, the top 3 mantissa bits, the other 20 rounded to nearest even
    const VI code = (((u >> 23) - 120) << 3) | ((u >> 20) & 7);
    const VI rest = u & 0xfffff;
    const VI up = (rest > 0x80000) | ((rest == 0x80000) & ((code & 1) != 0));
    const VI normal = code - up;                  // (a true comparison is -1)
    VI r = u < 0x3c800000 ? sub : normal;         // 2^-6
    r = u >= 0x43e00000 ? VI{} + 0x7e : r;        // 448 and above, inf included
    r = u > 0x7f800000 ? VI{} + 0x7f : r | sign;  // NaN: 0x7f whatever its sign
    return r;
}

}  // namespace

void f32_to_f8_e4m3_divided(const float* x, float divisor, size_t n, uint8_t* out) {
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        VF v;
        std::memcpy(&v, x + i, sizeof v);
        const VI r = to_e4m3(v / divisor);
        for (int l = 0; l < kLanes; l++) out[i + size_t(l)] = uint8_t(r[l]);
    }
    for (; i < n; i++) out[i] = f32_to_f8_e4m3(x[i] / divisor);
}

}  // namespace hy
