// The FP8 block quantizer of `--quant fp8` (ModelParams::quant), also used by the tests that write pre-quantized
// checkpoints in the layout of Qwen's official FP8 releases.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace hy {

// How the loader stores weight matrices (ModelParams::quant).
enum class WeightQuant : uint8_t {
    none,  // as the checkpoint holds them (16-bit, or FP8 for an FP8 checkpoint)
    fp8,   // 16-bit linear weights quantized at load to e4m3fn with 128 x 128 block scales (quantize_fp8_blocks)
};

// "none" or "fp8" -> WeightQuant; anything else throws Error(invalid_argument) naming the value and the choices.
WeightQuant parse_weight_quant(const std::string& name);
const char* weight_quant_name(WeightQuant q);  // "none", "fp8"

// Quantizes w F32 [rows, cols], a matrix of segments of segment_rows rows (0: one segment; see Matrix) blocked
// independently, to e4m3fn in 128 x 128 blocks: per block amax = max |w|, scale = amax / 448 (1 when amax is 0),
// q = w / scale rounded to nearest even and saturated to +-448 (f32_to_f8_e4m3). The real weight is then q * scale.
//   q       [rows, cols] e4m3fn codes
//   scales  F32 [fp8_scale_rows(rows, segment_rows), fp8_scale_cols(cols)] row-major
// rows must be a multiple of segment_rows when that is > 0. A NaN weight gives the NaN code; an infinite one makes
// its block's scale infinite (no such weights in a usable checkpoint).
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t segment_rows, uint8_t* q, float* scales);

}  // namespace hy
