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

// Sums of n = a multiple of 8 terms in 8 fixed partial sums (lane j takes the terms j, j + 8, ..), then
// ((0+4) + (2+6)) + ((1+5) + (3+7)): an order the compiler keeps and can vectorize.
inline float sum8(const float* partial) {
    return ((partial[0] + partial[4]) + (partial[2] + partial[6])) +
           ((partial[1] + partial[5]) + (partial[3] + partial[7]));
}

// The Q4 scale of one group (amax > 0, every x finite, n a multiple of 32) and its codes in [-8, 7]: from each of 21
// starting scales -+amax / d, d = 6, 6.15, .., 9, signed so that the weight of largest magnitude is on the side of
// the code -8 (the finer side of the asymmetric range; a scale can be negative), two rounds of:
// codes = x * (1 / s) rounded to nearest even and clamped, s = their least-squares scale (sum x q / sum q^2). The
// pair of least squared error sum (x - q s)^2 wins, the first on ties. Sets codes to the winner's. In f32 with the
// sums of sum8.
float search_q4_scale(const float* __restrict x, int64_t n, float amax, int8_t* codes) {
    // The 21 starts are independent until the pick: they run in batches of 7 side by side (the rounds of one start
    // are a chain of dependent sums and a division; the batch gives the CPU independent work), each start with the
    // same operations in the same order as alone, then the pick goes through them in order.
    constexpr int kStarts = 21, kBatch = 7;
    thread_local std::vector<float> trial, best;
    trial.resize(size_t(kBatch * n));
    best.resize(size_t(n));
    // The scale's sign puts the weight of largest magnitude (the first) on the side of the code -8.
    int64_t top = 0;
    for (int64_t i = 1; i < n; i++)
        if (std::fabs(x[i]) > std::fabs(x[top])) top = i;
    const float sign = x[top] > 0.0f ? -1.0f : 1.0f;
    float best_scale = 0.0f, best_err = INFINITY;
    for (int step0 = 0; step0 < kStarts; step0 += kBatch) {
        float s[kBatch], err[kBatch];
        for (int b = 0; b < kBatch; b++) s[b] = sign * amax / (6.0f + 0.15f * float(step0 + b));
        for (int round = 0; round < 2; round++)
            for (int b = 0; b < kBatch; b++) {
                if (s[b] == 0.0f) continue;
                float* __restrict q = trial.data() + b * n;
                const float inv = 1.0f / s[b];
                for (int64_t i = 0; i < n; i++) {  // (|x * inv| <= 9: adding and taking away 1.5 * 2^23 rounds to even)
                    const float v = (x[i] * inv + 12582912.0f) - 12582912.0f;
                    q[i] = std::min(std::max(v, -8.0f), 7.0f);
                }
                float xq[8] = {}, qq[8] = {};
                for (int64_t i = 0; i < n; i += 8)
                    for (int j = 0; j < 8; j++) {
                        xq[j] += x[i + j] * q[i + j];
                        qq[j] += q[i + j] * q[i + j];
                    }
                const float sq = sum8(qq);
                s[b] = sq > 0.0f ? sum8(xq) / sq : 0.0f;
            }
        for (int b = 0; b < kBatch; b++) {
            if (s[b] == 0.0f) continue;
            const float* __restrict q = trial.data() + b * n;
            float e2[8] = {};
            for (int64_t i = 0; i < n; i += 8)
                for (int j = 0; j < 8; j++) {
                    const float e = x[i + j] - q[i + j] * s[b];
                    e2[j] += e * e;
                }
            err[b] = sum8(e2);
        }
        for (int b = 0; b < kBatch; b++)
            if (s[b] != 0.0f && err[b] < best_err) {
                best_err = err[b];
                best_scale = s[b];
                std::copy(trial.begin() + b * n, trial.begin() + (b + 1) * n, best.begin());
            }
    }
    for (int64_t i = 0; i < n; i++) codes[i] = int8_t(best[size_t(i)]);
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
