// Common types of the hybrid engine: status codes, the error type used inside the library, dtypes and the
// bf16/f16 <-> f32 conversions.
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

#include <nlohmann/json_fwd.hpp>

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

// The exception thrown by library internals. what() is a single line.
class Error : public std::runtime_error {
public:
    Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
    Status status() const { return status_; }

private:
    Status status_;
};

// A JSON library exception's text without its "[json.exception.parse_error.101] " tag: "parse error at line 1,
// column 2: syntax error ...".
inline std::string json_error_text(const char* what) {
    const std::string w = what;
    const size_t close = w.rfind("[json.exception.", 0) == 0 ? w.find("] ") : std::string::npos;
    return close == std::string::npos ? w : w.substr(close + 2);
}

// The JSON value of `text`; throws Error(format) "SOURCE: invalid JSON: parse error at line L, column C: ..." (the
// parser's words without its tag) when it is not JSON.
nlohmann::json parse_json(const std::string& text, const std::string& source);

// The whole of a regular file of at most max_bytes (the JSON files of a model folder, goldens, texts). Throws
// Error(Status::io) naming the path when it cannot be opened or read, is a directory, a FIFO, a device or a socket
// (reading those could block or never end), or is larger than max_bytes.
std::string read_regular_file(const std::string& path, size_t max_bytes);
// Whether anything is at `path` (for a model folder's optional files and the checks before a read): false when
// nothing is; a symbolic link whose target is missing, or a link loop, throws Error(io) naming the link and its
// target (stat alone reads it as "no such file"); any other state (an unreadable or odd file) is true, and the
// read that follows names it.
bool path_present(const std::string& path);
// Limit for the JSON files of a model folder (config.json, tokenizer.json, tokenizer_config.json, the safetensors
// index): the real ones are a few MB (Qwen3's tokenizer.json: 11 MB).
constexpr size_t kMaxJsonFileBytes = size_t(256) << 20;

// Element types of tensors in checkpoints and in the arena.
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, I32 = 3 };

size_t dtype_size(DType t);
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

// IEEE binary16 -> binary32 (exact, handles subnormals, inf and NaN).
float f16_to_f32(uint16_t h);

// Converts n elements of type `src_type` at src to f32 at dst.
void convert_to_f32(const void* src, DType src_type, float* dst, size_t n);

}  // namespace hy
