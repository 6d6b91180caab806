// Helpers of the model/ layer on top of base/common.h (status codes, hy::Error, dtypes, bf16): JSON parsing and
// reading the files of a model folder.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "base/common.h"

namespace hy {

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
// A model folder's path as messages name it: `dir` without trailing slashes ("m/" is "m", so a file in it reads
// "m/config.json", not "m//config.json"); "/" stays "/", and "" stays "".
std::string folder_path(const std::string& dir);
// Limit for the JSON files of a model folder (config.json, tokenizer.json, tokenizer_config.json, the safetensors
// index): the real ones are a few MB (Qwen3's tokenizer.json: 11 MB).
constexpr size_t kMaxJsonFileBytes = size_t(256) << 20;

}  // namespace hy
