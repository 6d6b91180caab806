// The Catch2 test program. Tests are tagged by area ([loader], [model], [tokenizer], [sampler], [engine], [cli],
// [gpu]); CMake registers one ctest entry per tag. GPU tests skip themselves when no GPU is present; ctest runs the
// [gpu] entry as `hybrid-tests --skip-without-gpu "[gpu]"`, which then exits with kSkipped (its SKIP_RETURN_CODE),
// so that ctest reports the entry as skipped, not as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "kernels/backend.h"

namespace {
constexpr int kSkipped = 77;
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--skip-without-gpu") == 0) {
        if (!hy::cuda_available()) {
            std::printf("no usable CUDA GPU (or no CUDA in this build): the tests are skipped\n");
            return kSkipped;
        }
        argv[1] = argv[0];  // the rest of the arguments go to Catch2
        argv++;
        argc--;
    }
    return Catch::Session().run(argc, argv);
}
