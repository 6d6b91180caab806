#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"
#include "model/common.h"

TEST_CASE("bf16 and f16 conversions", "[loader]") {
    using namespace hy;
    REQUIRE(bf16_to_f32(0x3f80) == 1.0f);
    REQUIRE(bf16_to_f32(0xc000) == -2.0f);
    REQUIRE(f32_to_bf16(1.0f) == 0x3f80);
    // round to nearest even: 1 + 2^-8 lies exactly between two bf16 values -> even (1.0)
    REQUIRE(f32_to_bf16(1.00390625f) == 0x3f80);
    REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
    REQUIRE(f16_to_f32(0x3c00) == 1.0f);
    REQUIRE(f16_to_f32(0xc000) == -2.0f);
    REQUIRE(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
    REQUIRE(std::isinf(f16_to_f32(0x7c00)));
    REQUIRE(f16_to_f32(0x7bff) == 65504.0f);
}

TEST_CASE("CPU matmul over F16 weights converts every binary16 value exactly", "[loader]") {
    using namespace hy;
    // All 65,536 bit patterns as a [1024, 64] F16 matrix; x = the 64 one-hot rows, so y[t, n] = W[n, t] exactly when
    // row n is finite (0 * w adds +-0), and NaN when the row holds an infinity or a NaN (0 * inf).
    constexpr int K = 64, N = 65536 / K;
    std::vector<uint16_t> w(65536);
    for (int i = 0; i < 65536; i++) w[size_t(i)] = uint16_t(i);
    std::vector<float> x(size_t(K) * K, 0.0f), y(size_t(K) * N, -1.0f);
    for (int t = 0; t < K; t++) x[size_t(t) * K + t] = 1.0f;
    const Matrix m{w.data(), DType::F16, N, K};
    cpu::ThreadPool pool(2);
    cpu::matmul(x.data(), K, m, y.data(), pool);
    int checked = 0;
    for (int n = 0; n < N; n++) {
        bool finite_row = true;
        for (int k = 0; k < K; k++) finite_row = finite_row && std::isfinite(f16_to_f32(w[size_t(n) * K + k]));
        for (int t = 0; t < K; t++) {
            const float got = y[size_t(t) * N + n];
            if (finite_row) {
                REQUIRE(got == f16_to_f32(w[size_t(n) * K + t]));
                checked++;
            } else {
                REQUIRE(std::isnan(got));
            }
        }
    }
    REQUIRE(checked == 65536 - 2 * 1024);  // the rows of exponent 31 (0x7c00.. and 0xfc00..) are NaN
}

TEST_CASE("CPU vector exp: within 2 ulp of e^x, NaN and the range ends; SiLU by position alike", "[loader]") {
    using namespace hy::cpu;
    // exp_f32 as compiled here: every 2^-10 step over [-87.3, 88.3] and values near 0, against e^x in double
    double worst = 0.0;
    auto check = [&](float x) {
        const double want = std::exp(double(x));
        const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
        worst = std::max(worst, std::fabs(double(exp_f32(x)) - want) / ulp);
    };
    for (float x = -87.3f; x < 88.3f; x += 1.0f / 1024) check(x);
    for (float x = 1e-30f; x < 1e-3f; x *= 1.01f) {
        check(x);
        check(-x);
    }
    INFO("worst error " << worst << " ulp");
    CHECK(worst <= 2.0);
    CHECK(exp_f32(0.0f) == 1.0f);
    CHECK(std::isnan(exp_f32(NAN)));
    CHECK(exp_f32(INFINITY) == INFINITY);
    CHECK(exp_f32(89.0f) == INFINITY);
    CHECK(exp_f32(-INFINITY) == 0.0f);
    CHECK(exp_f32(-90.0f) == 0.0f);
    // the library's SiLU (silu_mul with up = 1, compiled with the kernels' flags): near x / (1 + e^-x) in double,
    // NaN stays NaN, and a value's result does not depend on where it falls in the array (vectors and the tail)
    std::vector<float> x, ones;
    for (float v = -100.0f; v <= 100.0f; v += 0.01f) x.push_back(v);
    x.push_back(NAN);
    ones.assign(x.size(), 1.0f);
    std::vector<float> y(x.size());
    ThreadPool pool(2);
    silu_mul(x.data(), ones.data(), int64_t(x.size()), y.data(), pool);
    double worst_rel = 0.0;
    for (size_t i = 0; i + 1 < x.size(); i++) {
        const double want = double(x[i]) / (1.0 + std::exp(-double(x[i])));
        if (std::fabs(want) > 1e-30) worst_rel = std::max(worst_rel, std::fabs(double(y[i]) - want) / std::fabs(want));
    }
    INFO("SiLU worst relative error " << worst_rel);
    CHECK(worst_rel < 4e-7);
    CHECK(std::isnan(y.back()));
    for (size_t i = 0; i < 40; i++) {
        float one = 0.0f;
        silu_mul(&x[i * 97], ones.data(), 1, &one, pool);
        CHECK(one == y[i * 97]);
    }
    // in place: y may be gate or up
    std::vector<float> in_gate = x, in_up(x.size(), 1.0f);
    silu_mul(in_gate.data(), ones.data(), int64_t(x.size()), in_gate.data(), pool);
    silu_mul(x.data(), in_up.data(), int64_t(x.size()), in_up.data(), pool);
    for (size_t i = 0; i + 1 < x.size(); i++) {
        CHECK(in_gate[i] == y[i]);
        CHECK(in_up[i] == y[i]);
    }
}
