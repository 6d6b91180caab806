// 8-bit and 4-bit integer weights (issue 21) on the CPU: the group-wise quantizer and its Q4 packing, the integer
// matmul of every instruction set this CPU runs against an fp64 reference over the dequantized weights (within the
// documented rounding of the int8 activations), NaN and poisoned outputs, batch rows equal to solo rows, `--quant
// int8/int4` on models/tiny and the MoE fixture, and the bad requests refused with one clear line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/option_table.h"
#include "engine.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/snapshot.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Deterministic values in [-a, a) (an LCG; a few larger outliers every 97th value, as trained weights have).
std::vector<float> random_values(size_t n, uint32_t seed, float a) {
    std::vector<float> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (float(x >> 8) / 16777216.0f * 2.0f - 1.0f) * a * (i % 97 == 5 ? 4.0f : 1.0f);
    }
    return v;
}

// A quantized matrix with its storage.
struct QMatrix {
    std::vector<uint8_t> q;
    std::vector<float> scales;
    Matrix m;
};

// A [rows, cols] matrix of `type` whose codes are all `code_byte` and scales all `scale`.
QMatrix filled(int64_t rows, int64_t cols, int64_t group, DType type, uint8_t code_byte, float scale) {
    QMatrix r;
    r.q.assign(size_t(rows) * row_bytes(type, cols), code_byte);
    r.scales.assign(size_t(rows * (cols / group)), scale);
    r.m.data = r.q.data();
    r.m.dtype = type;
    r.m.rows = rows;
    r.m.cols = cols;
    r.m.scales = r.scales.data();
    r.m.group = group;
    return r;
}

QMatrix quantize(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t group, DType type) {
    QMatrix r = filled(rows, cols, group, type, 0, 0.0f);
    quantize_int_groups(w.data(), rows, cols, group, type, r.q.data(), r.scales.data());
    return r;
}

std::vector<float> dequantized(const Matrix& m) {
    std::vector<float> d(size_t(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; r++) dequantize_int_row(m, r, d.data() + r * m.cols);
    return d;
}

std::vector<cpu::IntIsa> supported_isas() {
    std::vector<cpu::IntIsa> v;
    for (cpu::IntIsa isa : {cpu::IntIsa::scalar, cpu::IntIsa::avx2, cpu::IntIsa::avx512_vnni})
        if (cpu::int_isa_supported(isa)) v.push_back(isa);
    return v;
}

std::vector<float> run_matmul(const std::vector<float>& x, int64_t T, const Matrix& m, cpu::IntIsa isa,
                              cpu::ThreadPool& pool) {
    std::vector<float> y(size_t(T * m.rows), std::numeric_limits<float>::quiet_NaN());  // (poisoned)
    cpu::matmul_int(x.data(), T, m, y.data(), pool, isa);
    return y;
}

ModelParams cpu_params(WeightQuant quant = WeightQuant::none, int group = 0) {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 128;
    p.max_batch_tokens = 64;
    p.max_logits = 64;
    p.n_threads = 2;
    p.quant = quant;
    p.quant_group = group;
    return p;
}

std::vector<float> logits_of(const std::string& dir, const ModelParams& p) {
    auto m = Model::load(dir, p);
    const std::vector<int32_t> ids = random_prompt(40, 5);
    auto l = m->prefill(0, ids, true);
    return {l.begin(), l.end()};
}

}  // namespace

TEST_CASE("int quant: Q8 codes are w / (amax / 127) rounded to nearest even, per row and group", "[loader][int]") {
    const int64_t rows = 5, cols = 192, group = 64;
    std::vector<float> w = random_values(size_t(rows * cols), 1, 0.05f);
    for (int64_t c = 64; c < 128; c++) w[size_t(2 * cols + c)] = 0.0f;   // row 2, group 1: all zero
    w[size_t(3 * cols + 10)] = std::numeric_limits<float>::quiet_NaN();  // row 3, group 0: a NaN
    w[size_t(4 * cols + 150)] = INFINITY;                                // row 4, group 2: an infinity
    const QMatrix q = quantize(w, rows, cols, group, DType::Q8);
    const int8_t* codes = reinterpret_cast<const int8_t*>(q.q.data());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < 3; g++) {
            INFO("row " << r << " group " << g);
            float amax = 0.0f;
            bool finite = true;
            for (int64_t c = g * group; c < (g + 1) * group; c++) {
                amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
                finite = finite && std::isfinite(w[size_t(r * cols + c)]);
            }
            const float s = q.scales[size_t(r * 3 + g)];
            if (!finite) {
                CHECK(std::isnan(s));
                for (int64_t c = g * group; c < (g + 1) * group; c++) CHECK(codes[r * cols + c] == 0);
                continue;
            }
            CHECK(s == amax / 127.0f);
            for (int64_t c = g * group; c < (g + 1) * group; c++) {
                const float v = w[size_t(r * cols + c)];
                const int want = amax == 0.0f ? 0 : int(std::nearbyint(v / s));
                CHECK(int(codes[r * cols + c]) == want);
                CHECK(std::abs(want) <= 127);
                if (amax > 0.0f) CHECK(std::fabs(float(want) * s - v) <= s * 0.5f * (1.0f + 1e-6f));
            }
        }
    CHECK(q.scales[2 * 3 + 1] == 0.0f);
    // dequantize_int_row: code * scale
    std::vector<float> d(static_cast<size_t>(cols));
    dequantize_int_row(q.m, 1, d.data());
    for (int64_t c = 0; c < cols; c++) CHECK(d[size_t(c)] == float(codes[cols + c]) * q.scales[size_t(3 + c / 64)]);
    CHECK(row_bytes(DType::Q8, cols) == size_t(cols));
    CHECK(std::string(dtype_name(DType::Q8)) == "Q8");
}

TEST_CASE(
    "int quant: Q4 packs codes in [-8, 7] by 64-column chunks and beats plain amax / 7 rounding; the largest "
    "magnitude takes the code -8 side",
    "[loader][int]") {
    const int64_t rows = 7, cols = 256;
    for (const int64_t group : {int64_t(32), int64_t(64), int64_t(128)}) {
        INFO("group " << group);
        const std::vector<float> w = random_values(size_t(rows * cols), 2, 0.04f);
        const QMatrix q = quantize(w, rows, cols, group, DType::Q4);
        CHECK(q.q.size() == size_t(rows * cols / 2));
        const int64_t G = cols / group;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t* row = q.q.data() + r * cols / 2;
            // The layout spelled out: byte i of chunk j holds column 64j + i (low nibble) and 64j + 32 + i (high).
            for (int64_t c = 0; c < cols; c++) {
                const uint8_t b = row[c / 64 * 32 + c % 32];
                const int nib = c % 64 < 32 ? b & 15 : b >> 4;
                CHECK(q4_code(row, c) == nib - 8);
            }
            for (int64_t g = 0; g < G; g++) {
                const float s = q.scales[size_t(r * G + g)];
                REQUIRE(s != 0.0f);
                REQUIRE(std::isfinite(s));
                double err = 0.0, naive = 0.0;
                float amax = 0.0f;
                for (int64_t c = g * group; c < (g + 1) * group; c++) amax = std::max(amax, std::fabs(w[r * cols + c]));
                for (int64_t c = g * group; c < (g + 1) * group; c++) {
                    const double v = w[size_t(r * cols + c)];
                    err += std::pow(v - double(q4_code(row, c)) * s, 2);
                    naive += std::pow(v - std::nearbyint(v / (amax / 7.0f)) * (amax / 7.0f), 2);
                }
                INFO("row " << r << " group " << g);
                CHECK(err <= naive);
                int64_t top = g * group;  // (the first weight of largest magnitude: a negative code)
                for (int64_t c = g * group; c < (g + 1) * group; c++)
                    if (std::fabs(w[size_t(r * cols + c)]) > std::fabs(w[size_t(r * cols + top)])) top = c;
                CHECK(q4_code(row, top) < 0);
            }
        }
        // The scale search runs several groups side by side (vector lanes): a group's scale and codes are the same
        // quantized alone (each row by itself) and with a group of NaN before it (every later group in another lane)
        std::vector<float> shifted = w;
        shifted[0] = std::numeric_limits<float>::quiet_NaN();
        const QMatrix qs = quantize(shifted, rows, cols, group, DType::Q4);
        for (int64_t r = 0; r < rows; r++) {
            const std::vector<float> one(w.begin() + r * cols, w.begin() + (r + 1) * cols);
            const QMatrix q1 = quantize(one, 1, cols, group, DType::Q4);
            INFO("row " << r);
            CHECK(std::memcmp(q1.q.data(), q.q.data() + r * cols / 2, size_t(cols / 2)) == 0);
            CHECK(std::memcmp(q1.scales.data(), q.scales.data() + r * G, size_t(G) * 4) == 0);
            const int64_t from = r == 0 ? 1 : 0;  // (row 0's first group is the NaN one)
            CHECK(std::memcmp(qs.scales.data() + r * G + from, q.scales.data() + r * G + from, size_t(G - from) * 4) ==
                  0);
            int64_t differ = 0;
            for (int64_t c = from * group; c < cols; c++)
                differ += q4_code(qs.q.data() + r * cols / 2, c) != q4_code(q.q.data() + r * cols / 2, c);
            CHECK(differ == 0);
        }
    }
    const std::vector<float> nan_row = {std::numeric_limits<float>::quiet_NaN()};
    std::vector<float> w(64, 0.01f);
    w[7] = std::numeric_limits<float>::quiet_NaN();
    const QMatrix q = quantize(w, 1, 64, 64, DType::Q4);
    CHECK(std::isnan(q.scales[0]));
    for (int64_t c = 0; c < 64; c++) CHECK(q4_code(q.q.data(), c) == 0);
    CHECK(row_bytes(DType::Q4, 256) == 128);
}

TEST_CASE("int quant: the integer matmul of every instruction set against the dequantized fp64 reference",
          "[loader][int]") {
    cpu::ThreadPool pool(2), pool1(1);
    const std::vector<cpu::IntIsa> isas = supported_isas();
    INFO("best: " << cpu::int_isa_name(cpu::int_isa_best()) << ", " << isas.size() << " instruction sets");
    REQUIRE(isas.front() == cpu::IntIsa::scalar);
    struct Shape {
        int64_t N, K, group;
    };
    for (const DType type : {DType::Q8, DType::Q4})
        for (const Shape s : {Shape{37, 192, 64}, Shape{16, 256, 128}, Shape{5, 64, 64}, Shape{70, 384, 128},
                              Shape{21, 128, 32}, Shape{33, 64, 32}}) {
            INFO(dtype_name(type) << " N " << s.N << " K " << s.K << " group " << s.group);
            const QMatrix q = quantize(random_values(size_t(s.N * s.K), 3, 0.05f), s.N, s.K, s.group, type);
            const std::vector<float> wd = dequantized(q.m);
            const int64_t T = 13;
            const std::vector<float> x = random_values(size_t(T * s.K), 4, 1.5f);
            const std::vector<float> ref_y = run_matmul(x, T, q.m, cpu::IntIsa::scalar, pool);
            // The documented bound: sum over groups of (xs / 2) * sum |w|, xs = amax / 127 of x's group, plus fp32
            // rounding (relative 1e-5 of sum |x w|).
            for (int64_t t = 0; t < T; t++)
                for (int64_t n = 0; n < s.N; n++) {
                    double ref = 0.0, bound = 0.0, mag = 0.0;
                    for (int64_t g = 0; g < s.K / s.group; g++) {
                        double amax = 0.0, wsum = 0.0;
                        for (int64_t c = g * s.group; c < (g + 1) * s.group; c++) {
                            const double xv = x[size_t(t * s.K + c)], wv = wd[size_t(n * s.K + c)];
                            ref += xv * wv;
                            mag += std::fabs(xv * wv);
                            amax = std::max(amax, std::fabs(xv));
                            wsum += std::fabs(wv);
                        }
                        bound += amax / 127.0 / 2.0 * wsum * (1.0 + 1e-5);
                    }
                    const float got = ref_y[size_t(t * s.N + n)];
                    INFO("t " << t << " n " << n << " ref " << ref << " got " << got << " bound " << bound);
                    CHECK(std::isfinite(got));
                    CHECK(std::fabs(double(got) - ref) <= bound + 1e-5 * mag);
                }
            // Every instruction set gives the scalar path's bits, on 1 thread or 2; batch rows equal solo rows.
            for (const cpu::IntIsa isa : isas) {
                INFO(cpu::int_isa_name(isa));
                const std::vector<float> y = run_matmul(x, T, q.m, isa, pool);
                for (size_t i = 0; i < y.size(); i++) CHECK(bits_of(y[i]) == bits_of(ref_y[i]));
                const std::vector<float> y1 = run_matmul(x, T, q.m, isa, pool1);
                for (size_t i = 0; i < y1.size(); i++) CHECK(bits_of(y1[i]) == bits_of(ref_y[i]));
                for (const int64_t sub : {int64_t(1), int64_t(2), int64_t(3), int64_t(5)})
                    for (int64_t t0 = 0; t0 + sub <= T; t0 += 4) {
                        const std::vector<float> xs(x.begin() + t0 * s.K, x.begin() + (t0 + sub) * s.K);
                        const std::vector<float> ys = run_matmul(xs, sub, q.m, isa, pool);
                        for (int64_t i = 0; i < sub * s.N; i++)
                            CHECK(bits_of(ys[size_t(i)]) == bits_of(ref_y[size_t(t0 * s.N + i)]));
                    }
            }
        }
}

TEST_CASE("int quant: the largest Q4 and Q8 products (every code at its extreme) on every instruction set",
          "[loader][int]") {
    // Every weight code 7 (Q4 nibble 15) or 127 (Q8), scale 1; activations all +1 or all -1 (codes +-127): the
    // integer sums reach 64 * 7 * 127 and 64 * 127 * 127 a group of 64, past int16 if a kernel kept them there.
    cpu::ThreadPool pool(2);
    for (const DType type : {DType::Q4, DType::Q8})
        for (const int64_t group : {int64_t(32), int64_t(64)}) {
            const int64_t N = 9, K = 128, T = 3;
            const QMatrix q = filled(N, K, group, type, type == DType::Q4 ? uint8_t(0xff) : uint8_t(127), 1.0f);
            std::vector<float> x(size_t(T * K), 1.0f);
            for (int64_t c = 0; c < K; c++) x[size_t(K + c)] = -1.0f;  // row 1: all -1; row 2: mixed signs
            for (int64_t c = 0; c < K; c++) x[size_t(2 * K + c)] = c % 3 == 0 ? -1.0f : 1.0f;
            const float code = type == DType::Q4 ? 7.0f : 127.0f;
            double mixed = 0.0;
            for (int64_t c = 0; c < K; c++) mixed += x[size_t(2 * K + c)];
            for (const cpu::IntIsa isa : supported_isas()) {
                INFO(dtype_name(type) << " group " << group << " " << cpu::int_isa_name(isa));
                const std::vector<float> y = run_matmul(x, T, q.m, isa, pool);
                for (int64_t n = 0; n < N; n++) {
                    CHECK(y[size_t(n)] == Approx(code * K).epsilon(1e-6));
                    CHECK(y[size_t(N + n)] == Approx(-code * K).epsilon(1e-6));
                    CHECK(y[size_t(2 * N + n)] == Approx(code * mixed).epsilon(1e-6));
                }
            }
        }
}

TEST_CASE("int quant: NaN in weights or activations is never a number, on every instruction set", "[loader][int]") {
    cpu::ThreadPool pool(2);
    const int64_t N = 20, K = 128;
    for (const DType type : {DType::Q8, DType::Q4}) {
        std::vector<float> w = random_values(size_t(N * K), 5, 0.05f);
        w[size_t(3 * K + 70)] = std::numeric_limits<float>::quiet_NaN();  // weight row 3, group 1
        const QMatrix q = quantize(w, N, K, type == DType::Q8 ? 64 : 32, type);
        std::vector<float> x = random_values(size_t(4 * K), 6, 1.0f);
        x[size_t(2 * K + 5)] = std::numeric_limits<float>::quiet_NaN();  // activation row 2
        x[size_t(3 * K + 100)] = INFINITY;                               // activation row 3
        for (const cpu::IntIsa isa : supported_isas()) {
            INFO(dtype_name(type) << " " << cpu::int_isa_name(isa));
            for (const int64_t T : {int64_t(1), int64_t(2), int64_t(4)}) {
                const std::vector<float> y = run_matmul(x, T, q.m, isa, pool);
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = 0; n < N; n++) {
                        const bool poisoned = n == 3 || t >= 2;
                        INFO("t " << t << " n " << n);
                        CHECK(std::isnan(y[size_t(t * N + n)]) == poisoned);
                    }
            }
        }
    }
}

TEST_CASE("int quant: --quant int8 / int4 on models/tiny", "[model][int]") {
    const std::vector<float> ref = logits_of(tiny_dir(), cpu_params());
    auto m16 = Model::load(tiny_dir(), cpu_params());
    for (const WeightQuant quant : {WeightQuant::int8, WeightQuant::int4}) {
        INFO(weight_quant_name(quant));
        auto m = Model::load(tiny_dir(), cpu_params(quant));
        const DType type = quant == WeightQuant::int8 ? DType::Q8 : DType::Q4;
        const Weights& w = m->weights();
        CHECK(w.layers[0].mlp.down_proj.dtype == type);
        CHECK(w.layers[0].mlp.down_proj.group == (quant == WeightQuant::int8 ? 64 : 32));
        CHECK(w.layers[0].gdn.in_proj_a.dtype == DType::BF16);
        CHECK(w.embed.dtype == DType::BF16);
        CHECK(w.output.data == w.embed.data);  // (tied lm_head stays 16-bit by default)
        // The arena shrinks: 16 bits -> 8.5 (int8, group 64) or 5 (int4, group 32) per quantized weight; the
        // embeddings (2 of the 15 MiB) stay 16-bit.
        const double ratio = double(m->weight_bytes()) / double(m16->weight_bytes());
        CHECK(ratio < (quant == WeightQuant::int8 ? 0.62 : 0.43));
        const std::vector<int32_t> ids = random_prompt(40, 5);
        auto l = m->prefill(0, ids, true);
        const std::vector<float> a(l.begin(), l.end());
        double max_diff = 0.0;
        for (size_t i = 0; i < a.size(); i++) max_diff = std::max(max_diff, double(std::fabs(a[i] - ref[i])));
        CHECK(max_diff > 0.0);
        CHECK(max_diff < (quant == WeightQuant::int8 ? 0.5 : 5.0));  // (the perplexity test measures the quality)
        // batched prefill and one token at a time agree bitwise
        m->reset(0);
        std::vector<float> last;
        for (int32_t id : ids) {
            auto one = m->prefill(0, std::span<const int32_t>(&id, 1));
            last.assign(one.begin(), one.end());
        }
        CHECK(std::vector<float>(a.end() - std::ptrdiff_t(last.size()), a.end()) == last);
    }
    SECTION("a quantized lm_head is a quantized copy of the tied embeddings") {
        ModelParams p = cpu_params(WeightQuant::int8);
        p.quant_lm_head = true;
        auto m = Model::load(tiny_dir(), p);
        CHECK(m->weights().output.dtype == DType::Q8);
        CHECK(m->weights().embed.dtype == DType::BF16);
        CHECK(m->weights().output.data != m->weights().embed.data);
    }
}

TEST_CASE("int quant: MoE experts (stacked per-expert rows) with dummy weights of the MoE fixture's shape",
          "[moe][int]") {
    // The fixture's routed experts have I = 32 input features for down_proj: not a multiple of the 64-column chunk,
    // refused with one line; its architecture with I = 64 and dummy weights (--quant quantizes exactly the values
    // the 16-bit dummy model holds) runs the stacked experts through the integer kernels.
    const std::string fixture = source_dir() + "/tests/data/models/moe";
    require_error([&] { Model::load(fixture, cpu_params(WeightQuant::int8)); }, Status::invalid_argument,
                  "does not fit model.layers.0.mlp.experts.down_proj: its 32 input features are not a multiple of 64 "
                  "(the integer layouts' chunk, so no group size fits; --quant fp8 takes any shape)");
    TempDir d;
    nlohmann::json c = nlohmann::json::parse(read_text(fixture + "/config.json"));
    c["moe_intermediate_size"] = 64;
    write_text(d / "config.json", c.dump());
    auto dummy = [](WeightQuant q) {
        ModelParams p = cpu_params(q);
        p.dummy_weights = true;
        return p;
    };
    const std::vector<float> ref = logits_of(d.path, dummy(WeightQuant::none));
    double diff[2] = {};
    for (const WeightQuant quant : {WeightQuant::int8, WeightQuant::int4}) {
        INFO(weight_quant_name(quant));
        auto m = Model::load(d.path, dummy(quant));
        const MoeWeights& moe = m->weights().layers[0].moe_block;
        CHECK(moe.experts.gate_up.dtype == (quant == WeightQuant::int8 ? DType::Q8 : DType::Q4));
        CHECK(moe.experts.down.dtype == moe.experts.gate_up.dtype);
        CHECK(moe.router.dtype == DType::BF16);
        const std::vector<int32_t> ids = random_prompt(40, 5);
        auto l = m->prefill(0, ids, true);
        const std::vector<float> a(l.begin(), l.end());
        double& max_diff = diff[quant == WeightQuant::int8 ? 0 : 1];
        for (size_t i = 0; i < a.size(); i++) max_diff = std::max(max_diff, double(std::fabs(a[i] - ref[i])));
        m->reset(0);
        std::vector<float> last;
        for (int32_t id : ids) {
            auto one = m->prefill(0, std::span<const int32_t>(&id, 1));
            last.assign(one.begin(), one.end());
        }
        CHECK(std::vector<float>(a.end() - std::ptrdiff_t(last.size()), a.end()) == last);
    }
    INFO("max |logit - 16-bit logit|: int8 " << diff[0] << ", int4 " << diff[1]);
    CHECK(diff[0] > 0.0);
    CHECK(diff[0] < diff[1]);  // (8 bits are closer than 4)
    CHECK(diff[1] < 0.1);      // (dummy logits are about +-0.5)
}

TEST_CASE("int quant: bad requests are refused with one clear line", "[loader][int]") {
    SECTION("--quant values") {
        int group = -1;
        CHECK(parse_weight_quant("int8", &group) == WeightQuant::int8);
        CHECK(group == 0);
        CHECK(parse_weight_quant("int4:128", &group) == WeightQuant::int4);
        CHECK(group == 128);
        for (const char* bad : {"int3", "int4:48", "int4:96", "int4:0", "int8:2048", "fp8:64", "none:64",
                                "int4:", "int4:64x", "INT8", "int8:+64"})
            require_error([&] { parse_weight_quant(bad, &group); }, Status::invalid_argument,
                          std::string("unknown weight quantization '") + bad +
                              "' (supported: none, fp8, int8, int4, int8:G, int4:G");
        int q = -1;
        CHECK(hy_quant_parse("int4:256", &q, &group) == HY_OK);
        CHECK(q == HY_QUANT_INT4);
        CHECK(group == 256);
        CHECK(hy_quant_parse("q4", &q, &group) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()).find("unknown weight quantization 'q4'") != std::string::npos);
        // --help says what the parser takes: groups up to 1024 (int_quant_group_ok)
        CHECK(parse_weight_quant("int8:1024", &group) == WeightQuant::int8);
        CHECK(!int_quant_group_ok(1024 + 64));
        bool found = false;
        for (const SharedOption& o : kSharedOptions)
            if (std::string(o.names) == "quant") {
                found = true;
                CHECK(std::string(o.help).find("int8:G / int4:G for another group size G, 32 or a multiple of 64 "
                                               "up to 1024;") != std::string::npos);
            }
        CHECK(found);
    }
    SECTION("a group that does not divide a matrix's input features") {
        // models/tiny: hidden 256, intermediate 768: groups of 512 divide neither
        require_error([] { Model::load(tiny_dir(), cpu_params(WeightQuant::int4, 512)); }, Status::invalid_argument,
                      "weight quantization int4 with groups of 512 weights does not fit");
        hy_model_params p = hy_model_default_params();
        p.device = HY_DEVICE_CPU;
        p.quant = HY_QUANT_INT8;
        p.quant_group = 512;
        hy_model* m = nullptr;
        CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()).find("are not a multiple of 512") != std::string::npos);
        p.quant_group = 96;  // neither 32 nor a multiple of 64
        CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()).find("quant_group must be 0 or") != std::string::npos);
        p.quant = HY_QUANT_FP8;
        p.quant_group = 64;
        CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
        p.quant = 4;
        p.quant_group = 0;
        CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
        CHECK(m == nullptr);
    }
    SECTION("hy_model_params.quant_lm_head: with INT8/INT4 only, 0 or 1") {
        hy_model_params p = hy_model_default_params();
        CHECK(p.quant_lm_head == 0);
        p.device = HY_DEVICE_CPU;
        hy_model* m = nullptr;
        for (const int q : {int(HY_QUANT_NONE), int(HY_QUANT_FP8)}) {
            p.quant = q;
            p.quant_lm_head = 1;
            CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
            CHECK(std::string(hy_last_error()).find("quant_lm_head must be 0 or, with HY_QUANT_INT8/INT4, 1, got 1") !=
                  std::string::npos);
        }
        p.quant = HY_QUANT_INT4;
        p.quant_lm_head = 2;
        CHECK(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_ERR_INVALID_ARGUMENT);
        CHECK(m == nullptr);
        // on: the logits are those of Model::load with ModelParams::quant_lm_head (a Q4 copy of the tied embeddings)
        p.quant_lm_head = 1;
        p.n_threads = 2;
        p.n_slots = 2;
        REQUIRE(hy_model_load(tiny_dir().c_str(), &p, &m) == HY_OK);
        hy_context* c = nullptr;
        REQUIRE(hy_context_new(m, nullptr, &c) == HY_OK);
        const std::vector<int32_t> ids = random_prompt(8, 3);
        REQUIRE(hy_prefill(c, ids.data(), int(ids.size())) == HY_OK);
        int n_logits = 0;
        const float* logits = hy_context_logits(c, &n_logits);
        REQUIRE(logits != nullptr);
        ModelParams mp = cpu_params(WeightQuant::int4);
        mp.quant_lm_head = true;
        auto ref = Model::load(tiny_dir(), mp);
        CHECK(ref->weights().output.dtype == DType::Q4);
        auto l = ref->prefill(0, ids);
        const std::vector<float> want(l.begin(), l.end());
        REQUIRE(int64_t(n_logits) <= int64_t(want.size()));
        for (int i = 0; i < n_logits; i++) REQUIRE(logits[i] == want[size_t(i)]);
        // the weight format is part of the fingerprint: a state saved here does not load into the 16-bit model
        // (nor into int4 without the quantized lm_head); the 16-bit model keeps the folder's own fingerprint
        size_t n = 0;
        std::vector<uint8_t> snap(size_t(64) << 20);
        REQUIRE(hy_state_save(c, snap.data(), snap.size(), &n) == HY_OK);
        for (const int lm : {0, 1}) {
            hy_model_params q = hy_model_default_params();
            q.device = HY_DEVICE_CPU;
            q.n_threads = 2;
            q.quant = lm ? HY_QUANT_INT4 : HY_QUANT_NONE;
            hy_model* other = nullptr;
            REQUIRE(hy_model_load(tiny_dir().c_str(), &q, &other) == HY_OK);
            if (!lm) CHECK(hy_model_fingerprint(other) == fingerprint_folder(tiny_dir()));
            CHECK(hy_model_fingerprint(other) != hy_model_fingerprint(m));
            hy_context* oc = nullptr;
            REQUIRE(hy_context_new(other, nullptr, &oc) == HY_OK);
            CHECK(hy_state_load(oc, snap.data(), n) == HY_ERR_MODEL_MISMATCH);
            CHECK(std::string(hy_last_error()).find("snapshot was saved from another model") != std::string::npos);
            hy_context_free(oc);
            hy_model_free(other);
        }
        hy_context* same = nullptr;  // the same load options: it loads
        REQUIRE(hy_context_new(m, nullptr, &same) == HY_OK);
        CHECK(hy_state_load(same, snap.data(), n) == HY_OK);
        hy_context_free(same);
        hy_context_free(c);
        hy_model_free(m);
    }
    SECTION("int8 / int4 on a checkpoint that is already FP8") {
        // (the FP8 checkpoint written by the project's FP8 quantizer, as test_fp8 does)
        TempDir d;
        TensorMap t = read_safetensors(tiny_dir() + "/model.safetensors");
        const std::string name = "model.layers.0.mlp.down_proj.weight";
        const RawTensor& src = t.at(name);
        std::vector<float> w(size_t(src.shape[0] * src.shape[1]));
        convert_to_f32(src.bytes.data(), DType::BF16, w.data(), w.size());
        std::vector<uint8_t> q(w.size());
        std::vector<float> s(size_t(fp8_scale_rows(src.shape[0], 0) * fp8_scale_cols(src.shape[1])));
        quantize_fp8_blocks(w.data(), src.shape[0], src.shape[1], 0, q.data(), s.data());
        const std::vector<int64_t> shape = src.shape;
        t[name] = {"F8_E4M3", shape, q};
        const uint8_t* sb = reinterpret_cast<const uint8_t*>(s.data());
        t[name + "_scale_inv"] = {
            "F32", {fp8_scale_rows(shape[0], 0), fp8_scale_cols(shape[1])}, {sb, sb + s.size() * 4}};
        nlohmann::json c = nlohmann::json::parse(read_text(tiny_dir() + "/config.json"));
        std::filesystem::create_directories(d.path);
        for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
            std::filesystem::copy_file(tiny_dir() + "/" + f, d / f);
        write_text(d / "config.json", c.dump());
        write_safetensors(d / "model.safetensors", t);
        for (const WeightQuant quant : {WeightQuant::int8, WeightQuant::int4})
            require_error([&] { Model::load(d.path, cpu_params(quant)); }, Status::invalid_argument,
                          std::string("weight quantization ") + weight_quant_name(quant) +
                              " was asked for, but the checkpoint is already FP8 (tensor '" + name + "'");
        c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
        write_text(d / "config.json", c.dump());
        require_error([&] { Model::load(d.path, cpu_params(WeightQuant::int4)); }, Status::invalid_argument,
                      "is already an FP8 checkpoint");
    }
    SECTION("a malformed matrix reaching the kernel is an internal error, not garbage") {
        cpu::ThreadPool pool(1);
        std::vector<uint8_t> q(64, 0);
        float scale = 1.0f, x[64] = {}, y = 0.0f;
        Matrix m{q.data(), DType::Q8, 1, 64, &scale, 0, 48};
        require_error([&] { cpu::matmul_int(x, 1, m, &y, pool, cpu::IntIsa::scalar); }, Status::internal,
                      "CPU matmul: Q8 weights [1, 64] with group 48");
    }
}

// int8 / int4 MoE experts on CUDA (weight-only, bf16 activations) against the CPU's integer path (which also rounds
// the activations to int8 per row): the MoE test model's shape with experts of 64 features (its 32 are no multiple
// of the integer chunk), dummy weights (the same values on both backends), a 40-token prompt (the experts grouped by
// expert on CUDA) and 3 decode steps (the per-row kernels). As the bf16 MoE check (test_cuda_kernels.cpp): the median
// of the rows' relative errors, since a routing choice at a near-tie may part.
TEST_CASE("int quant: int8 / int4 MoE experts on CUDA give the CPU's logits", "[gpu][int]") {
    if (!cuda_available()) return;  // (the [gpu] entry is skipped without a GPU)
    TempDir d;
    nlohmann::json c = nlohmann::json::parse(read_text(source_dir() + "/tests/data/models/moe/config.json"));
    c["moe_intermediate_size"] = 64;
    write_text(d / "config.json", c.dump());
    for (const WeightQuant quant : {WeightQuant::int8, WeightQuant::int4}) {
        INFO(weight_quant_name(quant));
        ModelParams p = cpu_params(quant);
        p.dummy_weights = true;
        auto cpu = Model::load(d.path, p);
        p.device = Device::cuda;
        auto gpu = Model::load(d.path, p);
        CHECK(gpu->weights().layers[0].moe_block.experts.gate_up.dtype ==
              (quant == WeightQuant::int8 ? DType::Q8 : DType::Q4));
        const int V = cpu->config().vocab_size;
        const std::vector<int32_t> ids = random_prompt(43, 7);
        std::vector<double> err;
        auto rows = [&](std::span<const float> a, std::span<const float> b) {
            REQUIRE(a.size() == b.size());
            for (size_t r = 0; r * size_t(V) < a.size(); r++) {
                double num = 0.0, den = 0.0;
                for (size_t i = r * size_t(V); i < (r + 1) * size_t(V); i++) {
                    REQUIRE(std::isfinite(a[i]));
                    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
                    den += double(b[i]) * double(b[i]);
                }
                err.push_back(std::sqrt(num / den));
            }
        };
        const std::span<const int32_t> prompt(ids.data(), 40);
        auto lc = cpu->prefill(0, prompt, true);
        const std::vector<float> want(lc.begin(), lc.end());
        auto lg = gpu->prefill(0, prompt, true);
        rows(std::vector<float>(lg.begin(), lg.end()), want);
        for (int i = 40; i < 43; i++) {
            auto a = cpu->prefill(0, std::span<const int32_t>(ids.data() + i, 1));
            const std::vector<float> wa(a.begin(), a.end());
            auto g = gpu->prefill(0, std::span<const int32_t>(ids.data() + i, 1));
            rows(std::vector<float>(g.begin(), g.end()), wa);
        }
        std::vector<double> sorted = err;
        std::sort(sorted.begin(), sorted.end());
        std::printf("CUDA MoE %s experts: rows' logits rel err median %.4f max %.4f (decode steps %.4f %.4f %.4f)\n",
                    weight_quant_name(quant), sorted[sorted.size() / 2], sorted.back(), err[40], err[41], err[42]);
        CHECK(sorted[sorted.size() / 2] <= 0.15);
    }
}
