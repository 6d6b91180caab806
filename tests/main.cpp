// The Catch2 test program. Tests are tagged by area ([loader], [model], [tokenizer], [sampler], [engine], [cli],
// [gpu]); CMake registers one ctest entry per tag. GPU tests skip themselves when no GPU is present.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
