#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
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
