// Helpers for tests: temporary folders, reading a safetensors file into memory, writing one back.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "base/common.h"
#include "model/safetensors.h"

namespace hy::test {

// Runs f, which must throw hy::Error with `status` and a one-line message containing `needle`.
template <class F>
void require_error(F&& f, Status status, const std::string& needle) {
    try {
        f();
    } catch (const Error& e) {
        INFO("message: " << e.what());
        CHECK(e.status() == status);
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
        CHECK(std::string(e.what()).find('\n') == std::string::npos);  // one line
        return;
    }
    FAIL("no hy::Error thrown (expected: " << needle << ")");
}

inline std::string source_dir() { return HY_SOURCE_DIR; }
inline std::string tiny_dir() { return source_dir() + "/models/tiny"; }

// A temporary folder removed at scope exit.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/hybrid-test-XXXXXX";
        char* p = mkdtemp(tmpl);
        path = p ? p : "/tmp/hybrid-test-fallback";
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

struct RawTensor {
    std::string dtype;  // "BF16", "F32", ...
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

using TensorMap = std::map<std::string, RawTensor>;

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

inline TensorMap read_safetensors(const std::string& path) {
    auto f = std::make_unique<hyst_file>();
    if (hyst_open(f.get(), path.c_str()) != HYST_OK) throw std::runtime_error(f->error);
    TensorMap m;
    for (int i = 0; i < f->n_tensors; i++) {
        const hyst_tensor& t = f->tensors[i];
        RawTensor r;
        r.dtype = hyst_dtype_name(t.dtype);
        r.shape.assign(t.shape, t.shape + t.n_dims);
        const uint8_t* p = static_cast<const uint8_t*>(t.data);
        r.bytes.assign(p, p + (t.end - t.begin));
        m[t.name] = std::move(r);
    }
    hyst_close(f.get());
    return m;
}

// Serializes tensors (in name order, packed) into a safetensors image.
inline std::string safetensors_image(const TensorMap& m) {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (const auto& [name, t] : m) {
        h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    h["__metadata__"] = {{"format", "pt"}};
    std::string header = h.dump();
    while (header.size() % 8) header += ' ';
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
    out += header;
    for (const auto& [name, t] : m) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    return out;
}

// n pseudo-random token ids in [2, 4002) (a fixed LCG, so tests are reproducible).
inline std::vector<int32_t> random_prompt(int n, uint32_t seed) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    uint32_t x = seed;
    for (auto& t : ids) {
        x = x * 1664525u + 1013904223u;
        t = int32_t(2 + (x >> 8) % 4000);
    }
    return ids;
}

inline void write_safetensors(const std::string& path, const TensorMap& m) { write_text(path, safetensors_image(m)); }

// Copies the tiny model's config.json and tokenizer files into dir, and writes `tensors` as model.safetensors.
inline void write_model_dir(const std::string& dir, const TensorMap& tensors, const std::string& config_json) {
    std::filesystem::create_directories(dir);
    write_text(dir + "/config.json", config_json);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        std::filesystem::copy_file(tiny_dir() + "/" + f, dir + "/" + f,
                                   std::filesystem::copy_options::overwrite_existing);
    write_safetensors(dir + "/model.safetensors", tensors);
}

}  // namespace hy::test
