// GCC vector types of the CPU kernels (kernels/cpu/*.cpp) and their unaligned load. The compiler maps them to the
// widest registers -march allows (a 64-byte vector is two registers without AVX-512).
#pragma once

#include <cstdint>
#include <cstring>

namespace hy::cpu {

// Internal linkage (an unnamed namespace): files compiled with different instruction sets (the kernels with
// -march=native, the tests without) each keep their own copies. Shared inline instantiations would be merged by the
// linker although they disagree on how a 32-byte vector is returned (in a register with AVX, through memory
// without): an unoptimized build crashed so.
namespace {

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

// A vector of floats (v16f, v8f) loaded from p (no alignment needed).
template <class VF = v16f>
inline VF load_f32(const float* p) {
    VF v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// e^x in each lane of a float vector, within 2 ulp of the exact value for x in [-87.33, 88.37] (the method of Cephes'
// expf: x = n ln2 + r with n = floor(x log2(e) + 1/2) and ln2 in two parts, so |r| <= ln2 / 2 nearly exactly; e^r =
// 1 + r + r^2 (1/2 + r/6 + ... ), a degree-7 polynomial with Cephes' coefficients; 2^n written into the exponent
// bits). Past that range: +inf above 88.37 and 0 below -87.33 (std::exp gives finite values up to 88.72 and
// subnormals down to -103.97: the kernels use e^x in 1 / (1 + e^x) and in a softmax's e^(s - max) <= 1, where the
// difference is below float's resolution). NaN gives NaN. Lane-wise: a value gets the same result in any lane and
// in a vector of any width.
template <class VF>
inline VF exp_f32(VF x) {
    typedef int32_t VI __attribute__((vector_size(sizeof(VF))));
    constexpr float kHi = 88.3762626647949f, kLo = -87.3365478515625f;
    VF xc = x > kHi ? VF{} + kHi : x;
    xc = xc < kLo ? VF{} + kLo : xc;
    xc = x != x ? VF{} : xc;  // (NaN: any finite value; the result is set below)
    // n = floor(x log2(e) + 1/2): the truncation toward zero, one less where it rounded a negative value up
    const VF t = xc * 1.44269504088896341f + 0.5f;
    VF n = __builtin_convertvector(__builtin_convertvector(t, VI), VF);
    n = n > t ? n - 1.0f : n;
    const VF r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    VF p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;  // 2^n, n in [-126, 127]
    VF y;
    std::memcpy(&y, &bits, sizeof y);
    y *= p;
    y = x > kHi ? VF{} + __builtin_inff() : y;
    y = x < kLo ? VF{} : y;
    return x != x ? x : y;
}

// e^x of one float, as exp_f32 computes it in a vector lane.
inline float exp_f32(float x) {
    v8f v = v8f{} + x;
    return exp_f32(v)[0];
}

// The logistic sigmoid 1 / (1 + e^-x) and x * sigmoid(x) (SiLU) lane-wise, with exp_f32.
template <class VF>
inline VF sigmoid_f32(VF x) {
    return 1.0f / (1.0f + exp_f32(-x));
}
template <class VF>
inline VF silu_f32(VF x) {
    return x / (1.0f + exp_f32(-x));
}

// y[i] = f(x[i]) for i < n, f a lane-wise vector function: 8 at a time, the last n % 8 through a padded vector, so
// that an element gets the same arithmetic wherever it falls (batched and single-row calls agree bitwise). x and y
// may be the same array.
template <class F>
inline void map_f32(const float* x, float* y, int64_t n, F f) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f v = f(load_f32<v8f>(x + i));
        std::memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        float tail[8] = {};
        std::memcpy(tail, x + i, size_t(n - i) * sizeof(float));
        const v8f v = f(load_f32<v8f>(tail));
        std::memcpy(y + i, &v, size_t(n - i) * sizeof(float));
    }
}

}  // namespace

}  // namespace hy::cpu
