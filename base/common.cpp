#include "base/common.h"

#include <unistd.h>

#include "base/fp8.h"

namespace hy {

const char* status_name(Status s) {
    switch (s) {
        case Status::ok: return "ok";
        case Status::invalid_argument: return "invalid argument";
        case Status::io: return "i/o error";
        case Status::format: return "malformed file";
        case Status::unsupported: return "unsupported";
        case Status::model_mismatch: return "model mismatch";
        case Status::out_of_memory: return "out of memory";
        case Status::context_full: return "context full";
        case Status::backend: return "backend error";
        case Status::internal: return "internal error";
    }
    return "unknown status";
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::F16: return "F16";
        case DType::BF16: return "BF16";
        case DType::I32: return "I32";
        case DType::F8_E4M3: return "F8_E4M3";
        case DType::F8_E5M2: return "F8_E5M2";
        case DType::Q8: return "Q8";
        case DType::Q4: return "Q4";
    }
    return "?";
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: normalize
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

void convert_to_f32(const void* src, DType src_type, float* dst, size_t n) {
    switch (src_type) {
        case DType::F32: std::memcpy(dst, src, n * 4); return;
        // src may be odd-aligned (a safetensors data area may start at any offset): each 16-bit value is read
        // with memcpy, not through a uint16_t pointer.
        case DType::BF16: {
            const char* s = static_cast<const char*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
            return;
        }
        case DType::F16: {
            const char* s = static_cast<const char*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(load_u16(s + 2 * i));
            return;
        }
        case DType::F8_E4M3:
        case DType::F8_E5M2: {
            const float* table = fp8_table(src_type);
            const uint8_t* s = static_cast<const uint8_t*>(src);
            for (size_t i = 0; i < n; i++) dst[i] = table[s[i]];
            return;
        }
        case DType::I32:
        case DType::Q8:
        case DType::Q4: break;
    }
    throw Error(Status::internal, std::string("convert_to_f32: unsupported source dtype ") + dtype_name(src_type));
}

size_t host_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

}  // namespace hy
