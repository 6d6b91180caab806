// The floats one vector register holds for the instruction set this file is compiled with (AVX-512: 16, AVX: 8,
// else SSE2's 4): the width of GCC vector types meant to stay in one register. A wider vector's comparisons and
// selects are lowered lane by lane where the registers are narrower (the int4 scale search ran 2x slower with 8
// lanes on SSE2).
#pragma once

namespace hy {
namespace {  // (internal linkage: files compiled for different instruction sets each keep their own value)

#if defined(__AVX512F__)
constexpr int kRegisterFloats = 16;
#elif defined(__AVX__)
constexpr int kRegisterFloats = 8;
#else
constexpr int kRegisterFloats = 4;
#endif

}  // namespace
}  // namespace hy
