#include <catch2/catch.hpp>

#include <cmath>

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
