#include "model/quantize.h"

#include <algorithm>
#include <cmath>

#include "base/fp8.h"

namespace hy {

WeightQuant parse_weight_quant(const std::string& name) {
    if (name == "none") return WeightQuant::none;
    if (name == "fp8") return WeightQuant::fp8;
    throw Error(Status::invalid_argument, "unknown weight quantization '" + name + "' (supported: fp8, none)");
}

const char* weight_quant_name(WeightQuant q) { return q == WeightQuant::fp8 ? "fp8" : "none"; }

void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int64_t segment_rows, uint8_t* q, float* scales) {
    const int64_t sr = fp8_scale_rows(rows, segment_rows), sc = fp8_scale_cols(cols);
    std::fill(scales, scales + sr * sc, 0.0f);  // amax first
    for (int64_t r = 0; r < rows; r++) {
        float* amax = scales + fp8_scale_row(r, segment_rows) * sc;
        for (int64_t c = 0; c < cols; c++)
            amax[c / kFp8Block] = std::max(amax[c / kFp8Block], std::fabs(w[r * cols + c]));
    }
    for (int64_t i = 0; i < sr * sc; i++) scales[i] = scales[i] == 0.0f ? 1.0f : scales[i] / kF8E4M3Max;
    for (int64_t r = 0; r < rows; r++) {
        const float* s = scales + fp8_scale_row(r, segment_rows) * sc;
        for (int64_t c = 0; c < cols; c++) q[r * cols + c] = f32_to_f8_e4m3(w[r * cols + c] / s[c / kFp8Block]);
    }
}

}  // namespace hy
