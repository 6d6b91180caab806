// FP8 weights (issue 20) on the CPU reference: the fp8 tables and the e4m3 rounding against bit-by-bit references,
// the block quantizer, an FP8 checkpoint in the layout of Qwen's official releases (written here with the
// project's own quantizer) against the F32 checkpoint of its dequantized values, `--quant fp8` against that
// checkpoint, the MoE per-expert layout, and every bad input refused with one clear line.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/fp8.h"
#include "model/model.h"
#include "model/quantize.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// The f32 bits of an fp8 code with `mbits` mantissa bits and exponent `bias`, assembled field by field (subnormals
// normalised by shifting); NaN codes return 0x7fc00000.
uint32_t reference_bits(uint8_t b, int mbits, int bias, bool e4m3fn) {
    const uint32_t sign = uint32_t(b >> 7) << 31;
    const int ebits = 7 - mbits;
    const int e = (b >> mbits) & ((1 << ebits) - 1);
    uint32_t m = b & ((1u << mbits) - 1);
    if (e4m3fn && (b & 0x7f) == 0x7f) return 0x7fc00000u;
    if (!e4m3fn && e == (1 << ebits) - 1) return m == 0 ? sign | 0x7f800000u : 0x7fc00000u;
    if (e == 0) {
        if (m == 0) return sign;
        int shift = 0;
        while (!(m & (1u << mbits))) {
            m <<= 1;
            shift++;
        }
        return sign | uint32_t(1 - bias - shift + 127) << 23 | (m & ((1u << mbits) - 1)) << (23 - mbits);
    }
    return sign | uint32_t(e - bias + 127) << 23 | m << (23 - mbits);
}

// The e4m3fn code nearest to f by exhaustive search over the finite codes (ties to the even code), saturating.
uint8_t reference_round(float f) {
    if (std::isnan(f)) return 0x7f;
    const float a = std::fabs(f);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = std::fabs(double(f8_e4m3_to_f32(uint8_t(c))) - a);
        const double db = std::fabs(double(f8_e4m3_to_f32(uint8_t(best))) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return uint8_t((std::signbit(f) ? 0x80 : 0) | best);
}

bool fp8_weight(const std::string& name, const RawTensor& t) {
    if (t.shape.size() != 2 || !name.ends_with(".weight")) return false;
    for (const char* keep : {"embed_tokens", "lm_head", "in_proj_a.", "in_proj_b.", "mlp.gate.", "shared_expert_gate"})
        if (name.find(keep) != std::string::npos) return false;
    return true;
}

std::vector<float> to_f32(const RawTensor& t) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= size_t(d);
    std::vector<float> out(n);
    convert_to_f32(t.bytes.data(),
                   t.dtype == "F32"   ? DType::F32
                   : t.dtype == "F16" ? DType::F16
                                      : DType::BF16,
                   out.data(), n);
    return out;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    return {p, p + v.size() * sizeof(T)};
}

// The fused 3-D experts of `t` rewritten as one 2-D tensor per expert (the layout of the official FP8 releases).
TensorMap per_expert(const TensorMap& t) {
    TensorMap out;
    for (const auto& [name, tensor] : t) {
        const size_t at = name.find("mlp.experts.");
        if (at == std::string::npos || tensor.shape.size() != 3) {
            out[name] = tensor;
            continue;
        }
        const std::string pre = name.substr(0, at) + "mlp.experts.";
        const int64_t E = tensor.shape[0], R = tensor.shape[1], C = tensor.shape[2];
        const size_t es = tensor.bytes.size() / size_t(E * R * C), mat = size_t(R * C) * es;
        for (int64_t e = 0; e < E; e++) {
            const uint8_t* base = tensor.bytes.data() + size_t(e) * mat;
            const std::string ep = pre + std::to_string(e) + ".";
            if (name.ends_with("gate_up_proj")) {
                out[ep + "gate_proj.weight"] = {tensor.dtype, {R / 2, C}, {base, base + mat / 2}};
                out[ep + "up_proj.weight"] = {tensor.dtype, {R / 2, C}, {base + mat / 2, base + mat}};
            } else {
                out[ep + "down_proj.weight"] = {tensor.dtype, {R, C}, {base, base + mat}};
            }
        }
    }
    return out;
}

// A checkpoint in the official FP8 layout made from `src` (per-expert tensors first): each FP8 weight as F8_E4M3
// with its F32 "<name>_scale_inv"; *dequantized gets the same model with those weights as F32 (fp8 value * scale)
// and every other tensor as it was.
TensorMap fp8_checkpoint(const TensorMap& src, TensorMap* dequantized) {
    TensorMap out;
    for (const auto& [name, t] : per_expert(src)) {
        if (!fp8_weight(name, t)) {
            out[name] = t;
            if (dequantized) (*dequantized)[name] = t;
            continue;
        }
        const int64_t rows = t.shape[0], cols = t.shape[1];
        const std::vector<float> w = to_f32(t);
        std::vector<uint8_t> q(w.size());
        std::vector<float> s(size_t(fp8_scale_rows(rows, 0) * fp8_scale_cols(cols)));
        quantize_fp8_blocks(w.data(), rows, cols, 0, q.data(), s.data());
        out[name] = {"F8_E4M3", t.shape, q};
        out[name + "_scale_inv"] = {"F32", {fp8_scale_rows(rows, 0), fp8_scale_cols(cols)}, bytes_of(s)};
        if (dequantized) {
            std::vector<float> d(w.size());
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                    d[size_t(r * cols + c)] = f8_e4m3_to_f32(q[size_t(r * cols + c)]) *
                                              s[size_t(fp8_scale_row(r, 0) * fp8_scale_cols(cols) + c / 128)];
            (*dequantized)[name] = {"F32", t.shape, bytes_of(d)};
        }
    }
    return out;
}

// The FP8 tensors of `fp8` (F8_E4M3, from fp8_checkpoint) as F8_E5M2: each code the E5M2 code nearest to its value
// (exhaustive search over the finite codes), the scales kept; *dequantized (when given) gets the F32 twin of the
// result (E5M2 value * scale) and the other tensors as they are.
TensorMap to_e5m2(const TensorMap& fp8, TensorMap* dequantized) {
    uint8_t nearest[256];
    for (int b = 0; b < 256; b++) {
        const float v = f8_e4m3_to_f32(uint8_t(b));
        int best = 0;
        for (int c = 0; c < 256; c++) {
            const float e = f8_e5m2_to_f32(uint8_t(c));
            if (!std::isfinite(e)) continue;
            if (std::isnan(v) || std::fabs(e - v) < std::fabs(f8_e5m2_to_f32(uint8_t(best)) - v)) best = c;
        }
        nearest[b] = uint8_t(best);
    }
    TensorMap out;
    for (const auto& [name, t] : fp8) {
        if (dequantized && !name.ends_with("_scale_inv") && t.dtype != "F8_E4M3") (*dequantized)[name] = t;
        if (t.dtype != "F8_E4M3") {
            out[name] = t;
            continue;
        }
        RawTensor e = t;
        e.dtype = "F8_E5M2";
        for (uint8_t& b : e.bytes) b = nearest[b];
        out[name] = e;
        if (dequantized) {
            const int64_t rows = t.shape[0], cols = t.shape[1];
            const RawTensor& st = fp8.at(name + "_scale_inv");
            std::vector<float> sc(st.bytes.size() / 4), d(size_t(rows * cols));
            std::memcpy(sc.data(), st.bytes.data(), st.bytes.size());
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                    d[size_t(r * cols + c)] = f8_e5m2_to_f32(e.bytes[size_t(r * cols + c)]) *
                                              sc[size_t(fp8_scale_row(r, 0) * fp8_scale_cols(cols) + c / 128)];
            (*dequantized)[name] = {"F32", t.shape, bytes_of(d)};
        }
    }
    return out;
}

nlohmann::json fp8_config(const std::string& dir) {
    nlohmann::json j = nlohmann::json::parse(read_text(dir + "/config.json"));
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}},
                                {"modules_to_not_convert", {"lm_head"}}};
    return j;
}

void write_dir(const std::string& dir, const std::string& from, const std::string& config, const TensorMap& t) {
    std::filesystem::create_directories(dir);
    write_text(dir + "/config.json", config);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        std::filesystem::copy_file(from + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
    write_safetensors(dir + "/model.safetensors", t);
}

ModelParams cpu_params(WeightQuant quant = WeightQuant::none) {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 128;
    p.max_batch_tokens = 64;
    p.max_logits = 64;
    p.n_threads = 2;
    p.quant = quant;
    return p;
}

std::vector<float> logits_of(const std::string& dir, WeightQuant quant = WeightQuant::none) {
    auto m = Model::load(dir, cpu_params(quant));
    const std::vector<int32_t> ids = random_prompt(40, 5);
    auto l = m->prefill(0, ids, true);
    return {l.begin(), l.end()};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (std::isnan(d)) return INFINITY;
        m = std::max(m, d);
    }
    return m;
}

// The model folder `dir` as an FP8 checkpoint in the official layout (d / "fp8") and as its dequantized twin
// (d / "deq", the original config); returns the FP8 tensors.
TensorMap write_fp8_twins(const std::string& dir, const TempDir& d) {
    TensorMap deq;
    TensorMap fp8 = fp8_checkpoint(read_safetensors(dir + "/model.safetensors"), &deq);
    write_dir(d / "fp8", dir, fp8_config(dir).dump(1), fp8);
    write_dir(d / "deq", dir, read_text(dir + "/config.json"), deq);
    return fp8;
}

}  // namespace

TEST_CASE("fp8: the 256-entry tables equal the formats assembled bit by bit", "[loader][fp8]") {
    for (int b = 0; b < 256; b++) {
        INFO("code " << b);
        const uint32_t e4 = reference_bits(uint8_t(b), 3, 7, true), e5 = reference_bits(uint8_t(b), 2, 15, false);
        const float v4 = f8_e4m3_to_f32(uint8_t(b)), v5 = f8_e5m2_to_f32(uint8_t(b));
        if (e4 == 0x7fc00000u)
            CHECK(std::isnan(v4));
        else
            CHECK(bits_of(v4) == e4);
        if (e5 == 0x7fc00000u)
            CHECK(std::isnan(v5));
        else
            CHECK(bits_of(v5) == e5);
        float converted;
        const uint8_t byte = uint8_t(b);
        convert_to_f32(&byte, DType::F8_E4M3, &converted, 1);  // (the loader's path: the same table)
        CHECK((bits_of(converted) == bits_of(v4) || std::isnan(v4)));
    }
    CHECK(f8_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(f8_e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
    CHECK(f8_e5m2_to_f32(0x7b) == 57344.0f);
    CHECK(std::isinf(f8_e5m2_to_f32(0x7c)));
    CHECK(dtype_size(DType::F8_E4M3) == 1);
    CHECK(std::string(dtype_name(DType::F8_E5M2)) == "F8_E5M2");
}

TEST_CASE("fp8: f32 -> e4m3fn rounds to nearest even and saturates, as an exhaustive search", "[loader][fp8]") {
    std::vector<float> values = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 1e9f, INFINITY, -INFINITY, 1e-30f, -1e-12f};
    for (int c = 0; c < 0x7e; c++) {  // every code, the midpoints to the next and points just beside them
        const float lo = f8_e4m3_to_f32(uint8_t(c)), hi = f8_e4m3_to_f32(uint8_t(c + 1)), mid = (lo + hi) / 2;
        for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), (3 * lo + hi) / 4})
            for (float s : {1.0f, -1.0f}) values.push_back(s * v);
    }
    uint32_t x = 1;
    for (int i = 0; i < 2000; i++) {  // random magnitudes across the range
        x = x * 1664525u + 1013904223u;
        values.push_back(std::ldexp(float(x >> 8) / 16777216.0f - 0.5f, int(x % 22) - 12));
    }
    for (float v : values) {
        INFO("value " << v);
        CHECK(int(f32_to_f8_e4m3(v)) == int(reference_round(v)));
    }
    // the vector form (the quantizer's loop) gives the same bits, over these values and a sweep of every exponent
    // with NaN and the infinities, divided by 1 and by a scale (and with a tail shorter than a vector)
    for (uint32_t b = 0; b < 0x100000u; b++) {
        const uint32_t bits = b * 4099u;  // (odd: every exponent, sign and mantissa pattern in the sweep's range)
        float v;
        std::memcpy(&v, &bits, 4);
        values.push_back(v);
    }
    values.push_back(NAN);
    values.push_back(-NAN);
    for (const float divisor : {1.0f, 0.0123f}) {
        std::vector<uint8_t> got(values.size() - 3);
        f32_to_f8_e4m3_divided(values.data(), divisor, got.size(), got.data());
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); i++) differ += got[i] != f32_to_f8_e4m3(values[i] / divisor);
        CHECK(differ == 0);
    }
    CHECK(f32_to_f8_e4m3(NAN) == 0x7f);
    CHECK(f32_to_f8_e4m3(-1e9f) == 0xfe);
}

TEST_CASE("fp8: the block quantizer: scales amax / 448 per 128 x 128 block of each segment", "[loader][fp8]") {
    // 2 segments of 130 rows (2 block rows each: 128 + 2), 200 columns (2 block columns: 128 + 72).
    const int64_t seg = 130, rows = 2 * seg, cols = 200;
    CHECK(fp8_scale_rows(rows, seg) == 4);
    CHECK(fp8_scale_rows(rows, 0) == 3);
    CHECK(fp8_scale_cols(cols) == 2);
    CHECK(fp8_scale_row(129, seg) == 1);
    CHECK(fp8_scale_row(130, seg) == 2);
    CHECK(fp8_scale_row(259, seg) == 3);
    std::vector<float> w(size_t(rows * cols));
    for (size_t i = 0; i < w.size(); i++) w[i] = float(int(i * 7919 % 2001) - 1000) * 1e-3f;
    for (int64_t c = 128; c < cols; c++) w[size_t(131 * cols + c)] = 0.0f;  // (one block row all zero: scale 1)
    for (int64_t c = 128; c < cols; c++) w[size_t(130 * cols + c)] = 0.0f;
    for (int64_t r = 132; r < 258; r++)
        for (int64_t c = 128; c < cols; c++) w[size_t(r * cols + c)] = 0.0f;
    std::vector<uint8_t> q(w.size());
    std::vector<float> s(8);
    quantize_fp8_blocks(w.data(), rows, cols, seg, q.data(), s.data());
    for (int64_t b = 0; b < 8; b++) {
        const int64_t sr = b / 2, sc = b % 2;
        float amax = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                if (fp8_scale_row(r, seg) == sr && c / 128 == sc)
                    amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
        INFO("block " << b);
        CHECK(s[size_t(b)] == (amax == 0.0f ? 1.0f : amax / 448.0f));
    }
    CHECK(s[5] == 1.0f);  // rows 130..257 (block row 2) of columns 128.. are all zero
    for (size_t i = 0; i < w.size(); i++) {
        const int64_t r = int64_t(i) / cols, c = int64_t(i) % cols;
        const float scale = s[size_t(fp8_scale_row(r, seg) * 2 + c / 128)];
        CHECK(q[i] == f32_to_f8_e4m3(w[i] / scale));
        CHECK(std::fabs(f8_e4m3_to_f32(q[i]) * scale - w[i]) <= std::fabs(w[i]) / 16 + scale * 0x1p-10f);
    }
}

// --dummy-weights reads config.json alone: for an FP8 checkpoint's config the linear weights are made FP8 (as the
// release holds them), not 16-bit: the arena of --quant fp8 on the same shapes, and FP8 matrices.
TEST_CASE("fp8: dummy weights from an FP8 config.json are FP8", "[model][fp8]") {
    TempDir d;
    const std::string dir = d / "cfg";
    std::filesystem::create_directories(dir);
    write_text(dir + "/config.json", fp8_config(tiny_dir()).dump());
    ModelParams p = cpu_params();
    p.dummy_weights = true;
    auto fp8 = Model::load(dir, p);
    p.quant = WeightQuant::fp8;
    auto quantized = Model::load(tiny_dir(), [&] {
        ModelParams q = p;
        q.dummy_weights = true;
        return q;
    }());
    p.quant = WeightQuant::none;
    auto bf16 = Model::load(tiny_dir(), p);
    CHECK(fp8->weight_bytes() == quantized->weight_bytes());
    CHECK(fp8->weight_bytes() < bf16->weight_bytes() * 2 / 3);
    CHECK(fp8->weights().layers[0].mlp.down_proj.dtype == DType::F8_E4M3);
}

TEST_CASE("fp8: an FP8 checkpoint gives on the CPU the logits of its dequantized F32 twin", "[model][fp8]") {
    TempDir d;
    const TensorMap fp8 = write_fp8_twins(tiny_dir(), d);
    REQUIRE(fp8.at("model.layers.0.mlp.down_proj.weight").dtype == "F8_E4M3");
    REQUIRE(fp8.at("model.layers.0.mlp.down_proj.weight_scale_inv").shape == std::vector<int64_t>{2, 6});
    REQUIRE(fp8.at("model.layers.0.linear_attn.in_proj_a.weight").dtype == "BF16");
    REQUIRE(fp8.at("model.embed_tokens.weight").dtype == "BF16");
    const std::vector<float> a = logits_of(d / "fp8"), b = logits_of(d / "deq");
    CHECK(max_abs_diff(a, b) <= 1e-5);
    CHECK(a == b);  // (the CPU matmul dequantizes into f32 panels: bitwise the F32 matrix's result)
    {  // the dtypes loaded, as the tools name them (FP8 matrices first: most of the weights; the BF16 ones kept)
        auto m = Model::load(d / "fp8", cpu_params());
        CHECK(has_fp8_weights(m->weights()));
        const auto types = weight_dtypes(m->weights());
        REQUIRE(types.size() == 2);
        CHECK(types[0].first == DType::F8_E4M3);
        CHECK(types[1].first == DType::BF16);
        CHECK(weight_dtypes_text(m->weights()).rfind("F8_E4M3 ", 0) == 0);
        auto deq = Model::load(d / "deq", cpu_params());
        CHECK(!has_fp8_weights(deq->weights()));
        CHECK(weight_dtypes_text(deq->weights()).rfind("F32 ", 0) == 0);  // (then the BF16 ones kept)
    }
    // and it is a close approximation of the bf16 model
    const std::vector<float> ref = logits_of(tiny_dir());
    CHECK(max_abs_diff(a, ref) < 1.0);
    CHECK(max_abs_diff(a, ref) > 0.0);

    SECTION("--quant fp8 on the 16-bit checkpoint equals the pre-quantized checkpoint") {
        CHECK(logits_of(tiny_dir(), WeightQuant::fp8) == a);
        auto m = Model::load(tiny_dir(), cpu_params(WeightQuant::fp8));
        CHECK(m->weights().layers[0].mlp.down_proj.dtype == DType::F8_E4M3);
        CHECK(m->weights().layers[0].gdn.in_proj_a.dtype == DType::BF16);
        CHECK(m->weights().embed.dtype == DType::BF16);
        auto m16 = Model::load(tiny_dir(), cpu_params());
        CHECK(m->weight_bytes() < m16->weight_bytes() * 3 / 4);
    }
    SECTION("batched prefill and one token at a time agree bitwise") {
        auto m = Model::load(d / "fp8", cpu_params());
        const std::vector<int32_t> ids = random_prompt(40, 5);
        std::vector<float> last;
        for (int32_t id : ids) {
            auto l = m->prefill(0, std::span<const int32_t>(&id, 1));
            last.assign(l.begin(), l.end());
        }
        const size_t V = last.size();
        CHECK(std::vector<float>(a.end() - std::ptrdiff_t(V), a.end()) == last);
    }
}

TEST_CASE("fp8: an E5M2 checkpoint with fmt e5m2 gives the logits of its dequantized F32 twin", "[model][fp8]") {
    TempDir d;
    TensorMap deq;
    const TensorMap e5 = to_e5m2(fp8_checkpoint(read_safetensors(tiny_dir() + "/model.safetensors"), nullptr), &deq);
    REQUIRE(e5.at("model.layers.0.mlp.down_proj.weight").dtype == "F8_E5M2");
    nlohmann::json c = fp8_config(tiny_dir());
    c["quantization_config"]["fmt"] = "e5m2";
    write_dir(d / "e5", tiny_dir(), c.dump(), e5);
    write_dir(d / "deq", tiny_dir(), read_text(tiny_dir() + "/config.json"), deq);
    CHECK(Model::load(d / "e5", cpu_params())->weights().layers[0].mlp.down_proj.dtype == DType::F8_E5M2);
    const std::vector<float> a = logits_of(d / "e5"), b = logits_of(d / "deq");
    CHECK(max_abs_diff(a, b) <= 1e-5);
}

TEST_CASE("fp8: MoE experts one FP8 tensor per expert equal their dequantized twin", "[moe][fp8]") {
    const std::string dir = source_dir() + "/tests/data/models/moe";
    TempDir d;
    const TensorMap fp8 = write_fp8_twins(dir, d);
    REQUIRE(fp8.at("model.layers.0.mlp.experts.7.down_proj.weight").dtype == "F8_E4M3");
    REQUIRE(fp8.at("model.layers.0.mlp.experts.7.down_proj.weight_scale_inv").shape == std::vector<int64_t>{1, 1});
    REQUIRE(fp8.at("model.layers.0.mlp.shared_expert.up_proj.weight").dtype == "F8_E4M3");
    REQUIRE(fp8.at("model.layers.0.mlp.gate.weight").dtype == "BF16");
    REQUIRE(fp8.at("model.layers.0.mlp.shared_expert_gate.weight").dtype == "BF16");
    const std::vector<float> a = logits_of(d / "fp8");
    CHECK(max_abs_diff(a, logits_of(d / "deq")) <= 1e-5);
    {
        auto m = Model::load(d / "fp8", cpu_params());
        const MoeExperts& ex = m->weights().layers[0].moe_block.experts;
        CHECK(ex.gate_up.dtype == DType::F8_E4M3);
        CHECK(ex.gate_up.scale_segment_rows == 32);  // I: gate and up of each expert blocked on their own
        CHECK(ex.down.scale_segment_rows == 64);     // H
    }
    // --quant fp8 on the fused 3-D layout blocks each expert's gate, up and down alike
    CHECK(logits_of(dir, WeightQuant::fp8) == a);
}

TEST_CASE("fp8: bad FP8 checkpoints and quantization requests are refused with one clear line", "[loader][fp8]") {
    const TensorMap fp8 = fp8_checkpoint(read_safetensors(tiny_dir() + "/model.safetensors"), nullptr);
    const nlohmann::json config = fp8_config(tiny_dir());
    const std::string w = "model.layers.0.mlp.down_proj.weight";
    TempDir d;
    SECTION("an F8 tensor without its weight_scale_inv") {
        TensorMap t = fp8;
        t.erase(w + "_scale_inv");
        write_dir(d.path, tiny_dir(), config.dump(), t);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::model_mismatch,
                      "tensor '" + w + "' is F8_E4M3 but its block scales '" + w + "_scale_inv' are missing");
    }
    SECTION("a scale of the wrong shape") {
        TensorMap t = fp8;
        t[w + "_scale_inv"].shape = {6, 2};
        write_dir(d.path, tiny_dir(), config.dump(), t);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::model_mismatch,
                      "tensor '" + w + "_scale_inv' has shape [6, 2], expected [2, 6]");
    }
    SECTION("a block scale that is NaN, infinite, zero or negative") {
        const char* shown[] = {"nan", "inf", "0", "-0.5"};  // (printed as short as the value allows)
        int which = 0;
        for (const float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, 0.0f, -0.5f}) {
            TensorMap t = fp8;
            RawTensor& s = t[w + "_scale_inv"];
            REQUIRE(s.dtype == "F32");
            std::memcpy(s.bytes.data() + 4, &bad, 4);  // (block 1)
            write_dir(d.path, tiny_dir(), config.dump(), t);
            require_error([&] { Model::load(d.path, cpu_params()); }, Status::format,
                          "tensor '" + w + "_scale_inv': block scale 1 is " + shown[which++] +
                              " (FP8 block scales must be finite and > 0)");
        }
    }
    SECTION("quantization_config: unknown quant_method, fmt, activation scheme, block size") {
        const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
            {"quant_method", "gptq", "unknown quant_method 'gptq'"},
            {"fmt", "e5m3", "unknown fmt 'e5m3' (supported: e4m3, e5m2)"},
            {"activation_scheme", "static", "activation_scheme 'static' is not supported"},
            {"weight_block_size", {64, 64}, "weight_block_size [64,64] is not supported (supported: [128, 128])"},
            {"weight_block_size", {128, 64}, "weight_block_size [128,64] is not supported"},
        };
        for (const auto& [field, value, needle] : cases) {
            nlohmann::json c = config;
            c["quantization_config"][field] = value;
            write_dir(d.path, tiny_dir(), c.dump(), fp8);
            require_error([&] { Model::load(d.path, cpu_params()); }, Status::unsupported, needle);
        }
    }
    SECTION("fmt absent means e4m3") {
        nlohmann::json c = config;
        c["quantization_config"].erase("fmt");
        write_dir(d.path, tiny_dir(), c.dump(), fp8);
        CHECK(Model::load(d.path, cpu_params())->config().fp8_weights);
    }
    SECTION("fmt and the tensors' FP8 type must agree, the tensor named") {
        nlohmann::json c = config;
        c["quantization_config"]["fmt"] = "e5m2";
        write_dir(d.path, tiny_dir(), c.dump(), fp8);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::model_mismatch,
                      "': expected F8_E5M2 (config.json's quantization_config fmt e5m2), found F8_E4M3");
        const TensorMap e5 = to_e5m2(fp8, nullptr);
        write_dir(d.path, tiny_dir(), config.dump(), e5);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::model_mismatch,
                      "': expected F8_E4M3 (config.json's quantization_config fmt e4m3), found F8_E5M2");
        c["quantization_config"].erase("fmt");
        write_dir(d.path, tiny_dir(), c.dump(), e5);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::model_mismatch,
                      "': expected F8_E4M3 (config.json's quantization_config gives no fmt: e4m3), found F8_E5M2");
    }
    SECTION("per-tensor scales (no weight_block_size: vLLM's per-tensor FP8) are refused naming the field") {
        nlohmann::json c = config;
        c["quantization_config"].erase("weight_block_size");
        TensorMap t = fp8;
        const float one = 0.01f;
        for (auto& [name, x] : fp8)
            if (name.ends_with("_scale_inv")) {
                t.erase(name);
                t[name.substr(0, name.size() - 4)] = {"F32", {}, bytes_of(std::vector<float>{one})};
            }
        write_dir(d.path, tiny_dir(), c.dump(), t);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::unsupported,
                      "' has a single per-tensor scale '");
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::unsupported,
                      "(config.json's quantization_config has no weight_block_size): only block-wise FP8 is supported "
                      "(weight_block_size [128, 128], block scales '");
        // a single value under the block scales' name is refused the same way
        TensorMap u = fp8;
        u[w + "_scale_inv"] = {"F32", {1}, bytes_of(std::vector<float>{one})};
        write_dir(d.path, tiny_dir(), c.dump(), u);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::unsupported,
                      "tensor '" + w + "' has a single per-tensor scale '" + w + "_scale_inv'");
    }
    SECTION("weight_block_size absent: the block scales' shape shows 128 x 128 blocks (transformers' default)") {
        nlohmann::json c = config;
        c["quantization_config"].erase("weight_block_size");
        write_dir(d.path, tiny_dir(), c.dump(), fp8);
        CHECK(Model::load(d.path, cpu_params())->weights().layers[0].mlp.down_proj.dtype == DType::F8_E4M3);
    }
    SECTION("a config.json that says FP8 over 16-bit matrices: loaded as stored, with a warning (it was silent)") {
        write_dir(d.path, tiny_dir(), config.dump(), read_safetensors(tiny_dir() + "/model.safetensors"));
        const auto m = Model::load(d.path, cpu_params());
        CHECK(m->weights().layers[0].mlp.down_proj.dtype == DType::BF16);
        CHECK(m->load_warning().find("config.json: quantization_config says quant_method fp8, but no matrix is FP8: "
                                     "the weights are used as stored (16-bit)") != std::string::npos);
        CHECK(Model::load(tiny_dir(), cpu_params())->load_warning().find("FP8") == std::string::npos);
        // --quant on it quantizes the 16-bit matrices (it was refused as "already an FP8 checkpoint")
        for (const WeightQuant q : {WeightQuant::fp8, WeightQuant::int8}) {
            const auto mq = Model::load(d.path, cpu_params(q));
            CHECK(mq->weights().layers[0].mlp.down_proj.dtype == (q == WeightQuant::fp8 ? DType::F8_E4M3 : DType::Q8));
            CHECK(mq->load_warning().find(std::string("no matrix is FP8: the weights are 16-bit, quantized at load as "
                                                      "asked (--quant ") +
                                          weight_quant_name(q) + ")") != std::string::npos);
        }
    }
    SECTION("--quant fp8 on a checkpoint that is already FP8") {
        write_dir(d.path, tiny_dir(), config.dump(), fp8);
        require_error([&] { Model::load(d.path, cpu_params(WeightQuant::fp8)); }, Status::invalid_argument,
                      "is already an FP8 checkpoint");
        nlohmann::json c = config;  // (without quantization_config: found by the tensors' dtype)
        c.erase("quantization_config");
        write_dir(d.path, tiny_dir(), c.dump(), fp8);
        require_error([&] { Model::load(d.path, cpu_params(WeightQuant::fp8)); }, Status::invalid_argument,
                      "the checkpoint is already FP8 (tensor '");
    }
    SECTION("an unknown --quant mode") {
        require_error([] { parse_weight_quant("int5"); }, Status::invalid_argument,
                      "unknown weight quantization 'int5' (supported: none, fp8, int8, int4, int8:G, int4:G");
        CHECK(parse_weight_quant("fp8") == WeightQuant::fp8);
    }
    SECTION("an FP8 norm or embedding") {
        TensorMap t = fp8;
        t["model.norm.weight"] = {"F8_E4M3", {256}, std::vector<uint8_t>(256, 0x38)};
        write_dir(d.path, tiny_dir(), config.dump(), t);
        require_error([&] { Model::load(d.path, cpu_params()); }, Status::unsupported,
                      "tensor 'model.norm.weight' is F8_E4M3: only linear weights may be FP8");
    }
}

TEST_CASE("fp8: the CPU matmul dequantizes every code exactly, with its block's scale", "[loader][fp8]") {
    // W [2 segments of 3 rows, 160 columns]: every finite code in some row and column (in the vector part and the
    // scalar tail of a block), scales per block; x one-hot rows pick single weights, so y is exactly the dequantized
    // weight. (A NaN code would make its whole row NaN: checked apart below.)
    const int64_t seg = 3, rows = 6, cols = 160;
    std::vector<uint8_t> q(size_t(rows * cols));
    for (size_t i = 0; i < q.size(); i++) q[i] = (i * 37 % 256) % 128 == 0x7f ? 0 : uint8_t(i * 37 % 256);
    std::vector<float> scales = {0.5f, 3.0f, 0.125f, 1e-3f};  // [2 segments x 1 block row, 2 block columns]
    Matrix m;
    m.data = q.data();
    m.dtype = DType::F8_E4M3;
    m.rows = rows;
    m.cols = cols;
    m.scales = scales.data();
    m.scale_segment_rows = seg;
    auto backend = make_cpu_backend(2);
    std::vector<float> x(size_t(cols * cols), 0.0f), y(size_t(cols * rows));
    for (int64_t c = 0; c < cols; c++) x[size_t(c * cols + c)] = 1.0f;
    backend->matmul(x.data(), cols, m, y.data());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const float want = f8_e4m3_to_f32(q[size_t(r * cols + c)]) * scales[size_t(r / seg * 2 + c / 128)];
            const float got = y[size_t(c * rows + r)];
            INFO("row " << r << " col " << c << " code " << int(q[size_t(r * cols + c)]));
            CHECK(got == want);  // (exact; -0 weights sum to +0)
        }
    for (uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
        std::vector<uint8_t> one(16, 0x38);
        one[5] = nan;
        const float scale = 1.0f;
        const Matrix n{one.data(), DType::F8_E4M3, 1, 16, &scale, 0};
        float out = 0.0f;
        backend->matmul(x.data(), 1, n, &out);  // (x row 0 is one-hot at column 0: 0 * NaN is NaN)
        CHECK(std::isnan(out));
    }
}
