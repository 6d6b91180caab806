// GCC vector types of the CPU kernels (kernels/cpu/*.cpp) and their unaligned load. The compiler maps them to the
// widest registers -march allows (a 64-byte vector is two registers without AVX-512).
#pragma once

#include <cstring>

namespace hy::cpu {

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

// A vector of floats (v16f, v8f) loaded from p (no alignment needed).
template <class VF = v16f>
inline VF load_f32(const float* p) {
    VF v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

}  // namespace hy::cpu
