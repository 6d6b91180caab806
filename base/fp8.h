// FP8 weights: exact fp8 -> f32 conversion by 256-entry tables, and the round-to-nearest-even f32 -> e4m3fn
// conversion the block quantizer (model/quantize.h) uses.
//
// Formats (OCP 8-bit floating point, as torch.float8_e4m3fn and torch.float8_e5m2):
//   F8_E4M3 (e4m3fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m/8 * 2^-6); no
//                     infinities: 0x7f and 0xff are NaN, every other code is finite, the largest 448 (0x7e).
//   F8_E5M2:          sign, 5 exponent bits (bias 15), 2 mantissa bits; as IEEE binary16 cut to its top byte
//                     (subnormals m/4 * 2^-14, exponent 31: inf when m == 0, else NaN).
#pragma once

#include <cstdint>

#include "base/common.h"

namespace hy {

// table[b] = the f32 value of the fp8 code b, exactly (NaN codes give a quiet NaN). 256 entries, static storage.
const float* fp8_table(DType t);  // t: F8_E4M3 or F8_E5M2; throws Error(internal) for any other dtype

inline float f8_e4m3_to_f32(uint8_t b) { return fp8_table(DType::F8_E4M3)[b]; }
inline float f8_e5m2_to_f32(uint8_t b) { return fp8_table(DType::F8_E5M2)[b]; }

// The largest finite e4m3fn value.
constexpr float kF8E4M3Max = 448.0f;

// f32 -> e4m3fn, rounded to nearest even and saturated to +-448 (values beyond 448, and +-inf, give +-448, as
// torch's saturating cast in the FP8 quantizers does); NaN gives 0x7f. -0.0 gives 0x80.
uint8_t f32_to_f8_e4m3(float f);

// out[i] = f32_to_f8_e4m3(x[i] / divisor) for i < n, the same bits, a vector of values at a time (the FP8 quantizer's
// inner loop: one call a row of a 128-column block).
void f32_to_f8_e4m3_divided(const float* x, float divisor, size_t n, uint8_t* out);

}  // namespace hy
