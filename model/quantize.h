// The weight quantizers of `--quant` (ModelParams::quant): the FP8 block quantizer of `--quant fp8`, also used by the
// tests that write pre-quantized checkpoints in the layout of Qwen's official FP8 releases, and the group-wise
// symmetric integer quantizer of `--quant int8` / `--quant int4` (Matrix dtype Q8 / Q4, kernels/backend.h).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace hy {

// How the loader stores weight matrices (ModelParams::quant).
enum class WeightQuant : uint8_t {
    none,  // as the checkpoint holds them (16-bit, or FP8 for an FP8 checkpoint)
    fp8,   // 16-bit linear weights quantized at load to e4m3fn with 128 x 128 block scales (quantize_fp8_blocks)
    int8,  // 16-bit linear weights quantized at load to Q8: int8 codes, an F32 scale per group (quantize_int_groups)
    int4,  // the same to Q4: int4 codes packed two per byte, an F32 scale per group
};

// The default weights per scale of `--quant int8` and `--quant int4` (ModelParams::quant_group 0), chosen by
// hybrid-perplexity on models/tiny (README "Weight quantization", docs/perf-notes.md).
constexpr int kInt8DefaultGroup = 64;
constexpr int kInt4DefaultGroup = 32;

// "none", "fp8", "int8", "int4", or "int8:G" / "int4:G" with a group size G (32, or a multiple of 64 up to 1024); sets
// *group to G, or to 0 when none is given (the mode's default). Anything else throws Error(invalid_argument) naming
// the value and the choices.
WeightQuant parse_weight_quant(const std::string& name, int* group = nullptr);
const char* weight_quant_name(WeightQuant q);  // "none", "fp8", "int8", "int4"
// The group size a load uses: `group` when > 0, else the mode's default (0 for none and fp8).
int weight_quant_group(WeightQuant q, int group);
// The matrix dtype of an integer mode: Q8 for int8, Q4 for int4 (Error(internal) for the others).
DType int_quant_dtype(WeightQuant q);

// Quantizes w F32 [rows, cols], a matrix of segments of segment_rows rows (0: one segment; see Matrix) blocked
// independently, to e4m3fn in 128 x 128 blocks: per block amax = max |w|, scale = amax / 448 (1 when amax is 0),
// q = w / scale rounded to nearest even and saturated to +-448 (f32_to_f8_e4m3). The real weight is then q * scale.
//   q       [rows, cols] e4m3fn codes
//   scales  F32 [fp8_scale_rows(rows, segment_rows), fp8_scale_cols(cols)] row-major
// rows must be a multiple of segment_rows when that is > 0. A NaN weight gives the NaN code; an infinite one makes
// its block's scale infinite (no such weights in a usable checkpoint).
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t segment_rows, uint8_t* q, float* scales);

// The largest code of an integer dtype: 127 for Q8 (codes in [-127, 127]), 7 for Q4 (codes in [-8, 7]).
int int_quant_max(DType type);

// Quantizes w F32 [rows, cols] group-wise symmetrically to `type` (Q8 or Q4): per row and group of `group`
// consecutive columns (int_quant_shape_ok(cols, group)), with amax = max |w| (scale 0, codes 0 when
// amax is 0). Q8: scale = amax / 127, q = w / scale rounded to nearest even. Q4: codes in [-8, 7] and the scale of
// least squared error found by a search in f32 (21 starting scales -+amax / d, d in [6, 9], signed to put the largest
// magnitude on the code -8, so negative scales occur; each refined by two rounds of rounding and least squares; see
// quantize.cpp). The real weight is q * scale.
//   q       Q8: int8 [rows, cols]; Q4: [rows, cols / 2] bytes in the chunked nibble layout of Matrix
//   scales  F32 [rows, cols / group] row-major
// A group holding a NaN or infinite weight gets a NaN scale and zero codes (its products are NaN, never a number).
void quantize_int_groups(const float* w, int64_t rows, int64_t cols, int64_t group, DType type, void* q, float* scales);

// Row r of a host Q8/Q4 matrix (data and scales in host memory) dequantized to out F32 [m.cols]: q * scale.
void dequantize_int_row(const Matrix& m, int64_t r, float* out);

}  // namespace hy
