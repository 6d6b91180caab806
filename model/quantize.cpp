#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "base/fp8.h"

namespace hy {

WeightQuant parse_weight_quant(const std::string& name, int* group) {
    if (group) *group = 0;
    const size_t colon = name.find(':');
    const std::string mode = name.substr(0, colon);
    auto bad = [&] {
        return Error(Status::invalid_argument, "unknown weight quantization '" + name +
                                                   "' (supported: none, fp8, int8, int4, int8:G, int4:G with a group "
                                                   "size G of 32 or a multiple of 64 up to 1024)");
    };
    WeightQuant q;
    if (mode == "none")
        q = WeightQuant::none;
    else if (mode == "fp8")
        q = WeightQuant::fp8;
    else if (mode == "int8")
        q = WeightQuant::int8;
    else if (mode == "int4")
        q = WeightQuant::int4;
    else
        throw bad();
    if (colon == std::string::npos) return q;
    const std::string g = name.substr(colon + 1);
    if (q == WeightQuant::none || q == WeightQuant::fp8 || g.empty() || g.size() > 4 ||
        g.find_first_not_of("0123456789") != std::string::npos)
        throw bad();
    const int v = std::stoi(g);
    if (!int_quant_group_ok(v)) throw bad();
    if (group) *group = v;
    return q;
}

const char* weight_quant_name(WeightQuant q) {
    switch (q) {
        case WeightQuant::fp8: return "fp8";
        case WeightQuant::int8: return "int8";
        case WeightQuant::int4: return "int4";
        case WeightQuant::none: break;
    }
    return "none";
}

int weight_quant_group(WeightQuant q, int group) {
    if (q == WeightQuant::int8) return group > 0 ? group : kInt8DefaultGroup;
    if (q == WeightQuant::int4) return group > 0 ? group : kInt4DefaultGroup;
    return 0;
}

DType int_quant_dtype(WeightQuant q) {
    if (q == WeightQuant::int8) return DType::Q8;
    if (q == WeightQuant::int4) return DType::Q4;
    throw Error(Status::internal, std::string("int_quant_dtype: ") + weight_quant_name(q) + " is not an integer mode");
}

int int_quant_max(DType type) {
    if (type == DType::Q8) return 127;
    if (type == DType::Q4) return 7;
    throw Error(Status::internal, std::string("int_quant_max: ") + dtype_name(type) + " is not Q8 or Q4");
}

namespace {

// codes[i] = x[i] / scale rounded to nearest even, clamped to [lo, hi].
void round_codes(const float* x, int64_t n, float scale, int lo, int hi, int8_t* codes) {
    for (int64_t i = 0; i < n; i++) codes[i] = int8_t(std::clamp(std::nearbyint(x[i] / scale), float(lo), float(hi)));
}

// The Q4 scale of one group (amax > 0, every x finite) and its codes in [-8, 7]: from each of 21 starting scales
// amax / d, d = 6, 6.15, .., 9 (d >= 8 lets the largest magnitude take the code -8), two rounds of: codes =
// round_codes(x / s), s = their least-squares scale (sum x q / sum q^2). The pair of least squared error
// sum (x - q s)^2 wins, the first on ties. Sets codes to the winner's.
float search_q4_scale(const float* x, int64_t n, float amax, int8_t* codes) {
    thread_local std::vector<int8_t> trial;
    trial.resize(size_t(n));
    float best_scale = 0.0f;
    double best_err = INFINITY;
    for (int step = 0; step <= 20; step++) {
        float s = amax / (6.0f + 0.15f * float(step));
        for (int round = 0; round < 2 && s > 0.0f; round++) {
            round_codes(x, n, s, -8, 7, trial.data());
            double xq = 0.0, qq = 0.0;
            for (int64_t i = 0; i < n; i++) {
                xq += double(x[i]) * trial[size_t(i)];
                qq += double(trial[size_t(i)]) * trial[size_t(i)];
            }
            s = qq > 0.0 ? float(xq / qq) : 0.0f;
        }
        if (!(s > 0.0f)) continue;
        double err = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double e = double(x[i]) - double(trial[size_t(i)]) * s;
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = s;
            std::copy(trial.begin(), trial.end(), codes);
        }
    }
    return best_scale;
}

}  // namespace

void quantize_int_groups(const float* w, int64_t rows, int64_t cols, int64_t group, DType type, void* q,
                         float* scales) {
    const int qmax = int_quant_max(type);
    if (!int_quant_shape_ok(cols, group))
        throw Error(Status::internal, "quantize_int_groups: group " + std::to_string(group) + " for " +
                                          std::to_string(cols) + " columns");
    const int64_t n_groups = cols / group;
    std::vector<int8_t> row_codes(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < n_groups; g++) {
            const float* x = w + r * cols + g * group;
            const std::span<int8_t> codes(row_codes.data() + g * group, size_t(group));
            float amax = 0.0f;
            bool finite = true;
            for (int64_t i = 0; i < group; i++) {
                finite = finite && std::isfinite(x[i]);
                amax = std::max(amax, std::fabs(x[i]));
            }
            float scale = 0.0f;
            if (!finite) {
                scale = std::numeric_limits<float>::quiet_NaN();
                std::fill(codes.begin(), codes.end(), int8_t(0));
            } else if (amax == 0.0f) {
                std::fill(codes.begin(), codes.end(), int8_t(0));
            } else if (type == DType::Q8) {
                scale = amax / float(qmax);
                round_codes(x, group, scale, -qmax, qmax, codes.data());
            } else {
                scale = search_q4_scale(x, group, amax, codes.data());
            }
            scales[r * n_groups + g] = scale;
        }
        if (type == DType::Q8) {
            std::memcpy(static_cast<int8_t*>(q) + r * cols, row_codes.data(), size_t(cols));
            continue;
        }
        uint8_t* row = static_cast<uint8_t*>(q) + r * (cols / 2);
        for (int64_t c0 = 0; c0 < cols; c0 += kQuantChunk)
            for (int64_t i = 0; i < kQuantChunk / 2; i++)
                row[c0 / 2 + i] =
                    uint8_t((row_codes[size_t(c0 + i)] + 8) | (row_codes[size_t(c0 + i + kQuantChunk / 2)] + 8) << 4);
    }
}

void dequantize_int_row(const Matrix& m, int64_t r, float* out) {
    const int64_t n_groups = m.cols / m.group;
    const float* s = m.scales + r * n_groups;
    if (m.dtype == DType::Q8) {
        const int8_t* q = static_cast<const int8_t*>(m.data) + r * m.cols;
        for (int64_t c = 0; c < m.cols; c++) out[c] = float(q[c]) * s[c / m.group];
        return;
    }
    const uint8_t* row = static_cast<const uint8_t*>(m.data) + r * (m.cols / 2);
    for (int64_t c = 0; c < m.cols; c++) out[c] = float(q4_code(row, c)) * s[c / m.group];
}

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
