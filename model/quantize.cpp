#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "base/fp8.h"
#include "base/simd_width.h"

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

// The Q4 scale of one group (amax > 0, every x finite, n a multiple of 32) and its codes in [-8, 7]: from each of 21
// starting scales -+amax / d, d = 6, 6.15, .., 9, signed so that the weight of largest magnitude is on the side of
// the code -8 (the finer side of the asymmetric range; a scale can be negative), two rounds of:
// codes = x * (1 / s) rounded to nearest even and clamped, s = their least-squares scale (sum x q / sum q^2). The
// pair of least squared error sum (x - q s)^2 wins, the first on ties. In f32; a sum of n terms (n a multiple of 8)
// goes into 8 partial sums (partial j takes the terms j, j + 8, ..), added as ((0+4) + (2+6)) + ((1+5) + (3+7)).
//
// It runs on kQ4Lanes groups at once, one a vector lane (xt: n x kQ4Lanes, value i of lane l at xt[i * kQ4Lanes +
// l]): each lane does its group's operations in the order above, so a group's scale and codes do not depend on the
// lanes beside it. Scales go to scales[l], codes to codes[l * n + i]. (One group at a time, 21 x 2 dependent sums of
// 32 terms each, it quantized 26 M weights/s a core; 4B's 3.8 G weights took about 2.5 core-minutes.)
constexpr int kQ4Lanes = kRegisterFloats;  // (base/simd_width.h: wider vectors made SSE2 2x slower)
typedef float Q4Lanes __attribute__((vector_size(kQ4Lanes * 4)));

void search_q4_scales(const float* __restrict xt, int64_t n, float* scales, int8_t* codes) {
    typedef Q4Lanes V;
    thread_local std::vector<V> trial, best;
    trial.resize(size_t(n));
    best.resize(size_t(n));
    auto at = [&](int64_t i) {
        V v;
        std::memcpy(&v, xt + i * kQ4Lanes, sizeof v);
        return v;
    };
    auto sum8 = [](const V* p) { return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7])); };
    // amax and the sign that puts the weight of largest magnitude (the first) on the side of the code -8
    V amax = at(0), top = at(0);
    amax = amax < 0.0f ? -amax : amax;
    for (int64_t i = 1; i < n; i++) {
        const V v = at(i), a = v < 0.0f ? -v : v;
        const auto more = a > amax;
        top = more ? v : top;
        amax = more ? a : amax;
    }
    const V sign = top > 0.0f ? V{} - 1.0f : V{} + 1.0f;
    const V zero = V{};
    V best_scale = zero, best_err = zero + INFINITY;
    for (int k = 0; k < 21; k++) {
        V sc = sign * amax / (6.0f + 0.15f * float(k));
        for (int round = 0; round < 2; round++) {
            const auto live = sc != 0.0f;
            const V inv = live ? 1.0f / sc : zero;
            V xq[8] = {}, qq[8] = {};
            for (int64_t i = 0; i < n; i += 8)
                for (int j = 0; j < 8; j++) {
                    const V x = at(i + j);
                    const V v = (x * inv + 12582912.0f) - 12582912.0f;
                    const V m = v < -8.0f ? zero - 8.0f : v;
                    const V q = 7.0f < m ? zero + 7.0f : m;
                    trial[size_t(i + j)] = q;
                    xq[j] += x * q;
                    qq[j] += q * q;
                }
            const V sq = sum8(qq);
            const V next = sq > 0.0f ? sum8(xq) / sq : zero;
            sc = live ? next : sc;
        }
        V e2[8] = {};
        for (int64_t i = 0; i < n; i += 8)
            for (int j = 0; j < 8; j++) {
                const V e = at(i + j) - trial[size_t(i + j)] * sc;
                e2[j] += e * e;
            }
        const V err = sum8(e2);
        const auto win = (sc != 0.0f) & (err < best_err);
        best_err = win ? err : best_err;
        best_scale = win ? sc : best_scale;
        for (int64_t i = 0; i < n; i++) best[size_t(i)] = win ? trial[size_t(i)] : best[size_t(i)];
    }
    for (int l = 0; l < kQ4Lanes; l++) {
        scales[l] = best_scale[l];
        for (int64_t i = 0; i < n; i++) codes[l * n + i] = int8_t(best[size_t(i)][l]);
    }
}

}  // namespace

void quantize_int_groups(const float* w, int64_t rows, int64_t cols, int64_t group, DType type, void* q,
                         float* scales) {
    const int qmax = int_quant_max(type);
    if (!int_quant_shape_ok(cols, group))
        throw Error(Status::internal, "quantize_int_groups: group " + std::to_string(group) + " for " +
                                          std::to_string(cols) + " columns");
    const int64_t n_groups = cols / group;
    // the codes: Q8's straight into q, Q4's here first (packed two a byte at the end)
    std::vector<int8_t> q4_codes(type == DType::Q4 ? static_cast<size_t>(rows * cols) : 0);
    int8_t* const all_codes = type == DType::Q4 ? q4_codes.data() : static_cast<int8_t*>(q);
    // Q4: the groups that need the scale search, kQ4Lanes at a time (the last batch padded with its first group)
    std::vector<int64_t> batch;
    std::vector<float> xt, lane_scales(kQ4Lanes);
    std::vector<int8_t> lane_codes;
    auto flush = [&] {
        if (batch.empty()) return;
        xt.resize(size_t(group * kQ4Lanes));
        lane_codes.resize(size_t(group * kQ4Lanes));
        for (int l = 0; l < kQ4Lanes; l++) {
            const float* x = w + batch[size_t(l < int(batch.size()) ? l : 0)] * group;
            for (int64_t i = 0; i < group; i++) xt[size_t(i * kQ4Lanes + l)] = x[i];
        }
        search_q4_scales(xt.data(), group, lane_scales.data(), lane_codes.data());
        for (size_t l = 0; l < batch.size(); l++) {
            scales[batch[l]] = lane_scales[l];
            std::memcpy(all_codes + batch[l] * group, lane_codes.data() + l * size_t(group), size_t(group));
        }
        batch.clear();
    };
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < n_groups; g++) {
            const int64_t index = r * n_groups + g;  // (the group's weights: w + index * group)
            const float* x = w + index * group;
            int8_t* codes = all_codes + index * group;
            float amax = 0.0f;
            bool finite = true;
            for (int64_t i = 0; i < group; i++) {
                finite = finite && std::isfinite(x[i]);
                amax = std::max(amax, std::fabs(x[i]));
            }
            float scale = 0.0f;
            if (!finite || amax == 0.0f) {
                scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
                std::fill(codes, codes + group, int8_t(0));
            } else if (type == DType::Q8) {
                scale = amax / float(qmax);
                round_codes(x, group, scale, -qmax, qmax, codes);
            } else {
                batch.push_back(index);
                if (int(batch.size()) == kQ4Lanes) flush();
                continue;
            }
            scales[index] = scale;
        }
    flush();
    if (type == DType::Q8) return;
    for (int64_t r = 0; r < rows; r++) {
        const int8_t* row_codes = all_codes + r * cols;
        uint8_t* row = static_cast<uint8_t*>(q) + r * (cols / 2);
        for (int64_t c0 = 0; c0 < cols; c0 += kQuantChunk)
            for (int64_t i = 0; i < kQuantChunk / 2; i++)
                row[c0 / 2 + i] = uint8_t((row_codes[c0 + i] + 8) | (row_codes[c0 + i + kQuantChunk / 2] + 8) << 4);
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
        for (int64_t c = 0; c < cols; c += kFp8Block)
            f32_to_f8_e4m3_divided(w + r * cols + c, s[c / kFp8Block], size_t(std::min(kFp8Block, cols - c)),
                                   q + r * cols + c);
    }
}

}  // namespace hy
