// The bottom of the hybrid engine, below kernels/ and model/: status codes, the error type used inside the library,
// dtypes and the bf16/f16 <-> f32 conversions. Nothing here includes another hybrid header or a JSON library (CUDA
// translation units include it through kernels/backend.h).
//
// Inside the library, failures are thrown as hy::Error (a status code plus a one-line message naming the file,
// tensor or field and what was expected); engine.cpp catches them at the C API boundary and turns them into
// hy_status codes + hy_last_error(). Library code never prints and never exits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hy {

// Status codes; the numeric values are the public HY_* codes of engine.h.
enum class Status : int {
    ok = 0,
    invalid_argument = 1,  // a bad parameter value (flag, id out of range, ...)
    io = 2,                // a file or folder could not be read or written
    format = 3,            // a file is malformed (safetensors header, JSON, tokenizer.json, ...)
    unsupported = 4,       // valid input that this build does not support (model_type, dtype, chat template, ...)
    model_mismatch = 5,    // a tensor is missing or has the wrong shape; a snapshot from another model
    out_of_memory = 6,     // the arena could not be allocated
    context_full = 7,      // a sequence would grow past the context length
    backend = 8,           // the compute backend failed (no GPU, CUDA error, ...)
    internal = 9,
};

const char* status_name(Status s);

// The machine's physical memory in bytes (sysconf), 0 when unknown.
size_t host_memory_bytes();

// The exception thrown by library internals. what() is a single line.
class Error : public std::runtime_error {
public:
    Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
    Status status() const { return status_; }

private:
    Status status_;
};

// Element types of tensors in checkpoints and in the arena. F8_E4M3 is the OCP "e4m3fn" format (bias 7, no
// infinities, 0x7f/0xff NaN, largest finite 448), F8_E5M2 the IEEE-like one (bias 15, with inf and NaN); an FP8 weight
// matrix always comes with F32 block scales (Matrix::scales, base/fp8.h). Q8 and Q4 are the group-wise symmetric
// integer weights of `--quant int8` / `--quant int4` (model/quantize.h): int8 codes, or int4 codes packed two per
// byte, always with F32 per-group scales (Matrix::scales, Matrix::group).
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3, F8_E4M3 = 4, F8_E5M2 = 5, Q8 = 6, Q4 = 7 };

// Bytes of one element; 0 for Q4 (half a byte: use row_bytes). (Inline: the CPU kernels call it per tile.)
constexpr size_t dtype_size(DType t) {
    switch (t) {
        case DType::F32:
        case DType::I32: return 4;
        case DType::F16:
        case DType::BF16: return 2;
        case DType::F8_E4M3:
        case DType::F8_E5M2:
        case DType::Q8: return 1;
        case DType::Q4: return 0;
    }
    return 0;
}
// Bytes of n consecutive elements of one row: n * dtype_size(t), or n / 2 for Q4 (n even).
constexpr size_t row_bytes(DType t, int64_t n) { return t == DType::Q4 ? size_t(n) / 2 : size_t(n) * dtype_size(t); }
const char* dtype_name(DType t);

// bfloat16: the top 16 bits of an IEEE binary32. Conversion to f32 is exact.
inline float bf16_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as torch's float -> bfloat16 cast; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// The 16-bit value at p, which need not be aligned.
inline uint16_t load_u16(const void* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
}

// IEEE binary16 -> binary32 (exact, handles subnormals, inf and NaN).
float f16_to_f32(uint16_t h);

// Converts n elements of type `src_type` at src to f32 at dst; src needs no alignment (a checkpoint's data area may
// start at an odd offset). FP8 values are converted as stored, without any block scale.
void convert_to_f32(const void* src, DType src_type, float* dst, size_t n);

}  // namespace hy
