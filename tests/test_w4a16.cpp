// compressed-tensors W4A16 checkpoints (quant_method "compressed-tensors", format "pack-quantized") loaded as Q4 on
// the CPU, on tests/data/models/tiny-w4a16 (models/tiny packed by the compressed-tensors library itself;
// tools/make_w4a16_fixture.py): every packed tensor dequantizes bit for bit to compressed-tensors' own F32
// dequantization, the logits are those of Hugging Face transformers on the decompressed model (within the rounding
// of the CPU integer matmul's int8 activations), and each unsupported or damaged input is refused with one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "model/fnv.h"
#include "model/model.h"
#include "model/quantize.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

std::string w4a16_dir() { return source_dir() + "/tests/data/models/tiny-w4a16"; }

ModelParams cpu_params(WeightQuant quant = WeightQuant::none) {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 64;
    p.max_batch_tokens = 32;
    p.max_logits = 32;
    p.n_threads = 2;
    p.quant = quant;
    return p;
}

nlohmann::json golden() { return nlohmann::json::parse(read_text(w4a16_dir() + "/golden_w4a16.json")); }

// The loaded matrix of module `name` ("model.layers.I.linear_attn.in_proj_qkv", ...); nullptr when unknown.
const Matrix* module_matrix(const Weights& w, const std::string& name) {
    const std::string p = "model.layers.";
    if (!name.starts_with(p)) return nullptr;
    const size_t dot = name.find('.', p.size());
    const LayerWeights& L = w.layers.at(size_t(std::stoi(name.substr(p.size(), dot - p.size()))));
    const std::string rest = name.substr(dot + 1);
    const std::map<std::string, const Matrix*> m = {
        {"linear_attn.in_proj_qkv", &L.gdn.in_proj_qkv},
        {"linear_attn.in_proj_z", &L.gdn.in_proj_z},
        {"linear_attn.in_proj_b", &L.gdn.in_proj_b},
        {"linear_attn.in_proj_a", &L.gdn.in_proj_a},
        {"linear_attn.out_proj", &L.gdn.out_proj},
        {"self_attn.q_proj", &L.attn.q_proj},
        {"self_attn.k_proj", &L.attn.k_proj},
        {"self_attn.v_proj", &L.attn.v_proj},
        {"self_attn.o_proj", &L.attn.o_proj},
        {"mlp.gate_proj", &L.mlp.gate_proj},
        {"mlp.up_proj", &L.mlp.up_proj},
        {"mlp.down_proj", &L.mlp.down_proj},
    };
    auto it = m.find(rest);
    return it == m.end() ? nullptr : it->second;
}

std::vector<float> dequantized(const Matrix& m) {
    std::vector<float> d(size_t(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; r++) dequantize_int_row(m, r, d.data() + r * m.cols);
    return d;
}

std::string hex(uint64_t h) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
    return b;
}

std::vector<float> prefill_logits(const std::string& dir, const std::vector<int32_t>& ids) {
    auto m = Model::load(dir, cpu_params());
    auto l = m->prefill(0, ids, true);
    return {l.begin(), l.end()};
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    float d = 0.0f;
    for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

std::vector<float> to_f32(const RawTensor& t) {
    REQUIRE(t.dtype == "BF16");
    std::vector<float> out(t.bytes.size() / 2);
    for (size_t i = 0; i < out.size(); i++) {
        uint16_t h;
        std::memcpy(&h, t.bytes.data() + 2 * i, 2);
        out[i] = bf16_to_f32(h);
    }
    return out;
}

// `t` (BF16 [rows, cols]) packed into `out` in the compressed-tensors pack-quantized layout of the fixture (symmetric
// int4, groups of G: scale bf16(amax / 7.5), code = w / scale rounded and clamped to [-8, 7] and stored + 8 at bit
// 4 * (c % 8) of int32 c / 8), as "<module>.weight_packed/_scale/_shape"; *deq gets the F32 code * scale.
void ct_pack(const std::string& module, const RawTensor& t, int64_t G, TensorMap& out, RawTensor* deq) {
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const std::vector<float> w = to_f32(t);
    std::vector<int32_t> packed(size_t(rows * cols / 8), 0);
    std::vector<uint16_t> scales(size_t(rows * cols / G));
    std::vector<float> d(w.size());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < cols / G; g++) {
            float amax = 0.0f;
            for (int64_t c = g * G; c < (g + 1) * G; c++) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
            const uint16_t sb = f32_to_bf16(amax > 0.0f ? amax / 7.5f : 1.0f);
            const float sc = bf16_to_f32(sb);
            scales[size_t(r * (cols / G) + g)] = sb;
            for (int64_t c = g * G; c < (g + 1) * G; c++) {
                const int q = std::clamp(int(std::lrint(w[size_t(r * cols + c)] / sc)), -8, 7);
                packed[size_t(r * cols / 8 + c / 8)] |= int32_t(uint32_t(q + 8) << (4 * (c % 8)));
                d[size_t(r * cols + c)] = float(q) * sc;
            }
        }
    auto bytes = [](const auto& v) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
        return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
    };
    out.erase(module + ".weight");
    out[module + ".weight_packed"] = {"I32", {rows, cols / 8}, bytes(packed)};
    out[module + ".weight_scale"] = {"BF16", {rows, cols / G}, bytes(scales)};
    out[module + ".weight_shape"] = {"I64", {2}, bytes(std::vector<int64_t>{rows, cols})};
    *deq = {"F32", {rows, cols}, bytes(d)};
}

// A compressed-tensors W4A16 quantization_config with groups of G (the fixture's, as compressed-tensors writes it).
nlohmann::json ct_config(const std::string& dir, int64_t G) {
    nlohmann::json c = nlohmann::json::parse(read_text(dir + "/config.json"));
    nlohmann::json q = nlohmann::json::parse(read_text(w4a16_dir() + "/config.json"))["quantization_config"];
    q["config_groups"]["group_0"]["weights"]["group_size"] = G;
    c["quantization_config"] = q;
    return c;
}

// Q4 matrix x dequantized equals F32 matrix y (the same rows in the same order), bit for bit.
void check_same(const Matrix& x, const Matrix& y) {
    REQUIRE(x.dtype == DType::Q4);
    REQUIRE(y.dtype == DType::F32);
    REQUIRE(x.rows == y.rows);
    REQUIRE(x.cols == y.cols);
    const std::vector<float> d = dequantized(x);
    CHECK(std::memcmp(d.data(), y.data, d.size() * 4) == 0);
}

}  // namespace

TEST_CASE("w4a16: config.json's compressed-tensors quantization_config is read", "[w4a16][loader]") {
    const ModelConfig c = load_model_config(w4a16_dir());
    CHECK(c.int4_packed_weights);
    CHECK_FALSE(c.fp8_weights);
    CHECK(c.int4_packed_group == 128);
    CHECK(std::find(c.modules_not_quantized.begin(), c.modules_not_quantized.end(), "lm_head") !=
          c.modules_not_quantized.end());
}

TEST_CASE("w4a16: every packed tensor becomes a Q4 matrix that dequantizes to compressed-tensors' code * scale",
          "[w4a16][loader]") {
    const nlohmann::json g = golden();
    auto m = Model::load(w4a16_dir(), cpu_params());
    const Weights& w = m->weights();
    CHECK(m->load_warning().empty());  // (weight_packed, weight_scale and weight_shape are all used)
    int n_q4 = 0;
    for (const LayerWeights& L : w.layers)
        for (const Matrix* x :
             {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj, &L.attn.q_proj,
              &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.mlp.gate_proj, &L.mlp.up_proj, &L.mlp.down_proj})
            n_q4 += x->dtype == DType::Q4;
    CHECK(n_q4 == int(g["dequant_fnv1a64"].size()));
    for (const auto& [name, want] : g["dequant_fnv1a64"].items()) {
        INFO(name);
        const Matrix* x = module_matrix(w, name);
        REQUIRE(x);
        REQUIRE(x->dtype == DType::Q4);
        CHECK(x->group == 128);
        const std::vector<float> d = dequantized(*x);
        for (size_t i = 0; i < 8; i++) CHECK(d[i] == g["dequant_head"][name][i].get<float>());
        Fnv1a f;
        f.add(d.data(), d.size() * 4);
        CHECK(hex(f.h) == want.get<std::string>());
    }
    // the ignored and unquantized matrices load as before
    CHECK(w.layers[0].gdn.in_proj_a.dtype == DType::BF16);  // (in the ignore list)
    CHECK(w.layers[0].gdn.in_proj_b.dtype == DType::Q4);
    CHECK(w.embed.dtype == DType::BF16);
    CHECK(w.output.data == w.embed.data);  // (tied lm_head, ignored)
    // Q4 bytes in the arena: 4 bits + an F32 scale per 128 weights, against 16 bits in models/tiny
    auto m16 = Model::load(tiny_dir(), cpu_params());
    CHECK(double(m->weight_bytes()) < 0.45 * double(m16->weight_bytes()));
}

TEST_CASE("w4a16: the CPU logits are Hugging Face's on the decompressed checkpoint", "[w4a16][model]") {
    const nlohmann::json g = golden();
    const std::vector<int32_t> ids = g["input_ids"].get<std::vector<int32_t>>();
    const TensorMap gl = read_safetensors(w4a16_dir() + "/golden_w4a16_logits.safetensors");
    const RawTensor& t = gl.at("logits");
    std::vector<float> hf(t.bytes.size() / 4);
    std::memcpy(hf.data(), t.bytes.data(), t.bytes.size());
    REQUIRE(t.shape == std::vector<int64_t>{int64_t(ids.size()), 4096});

    // An F32 twin of the loaded model (every Q4 matrix written out dequantized) runs without the int8 activations
    // of the integer matmul: it gives transformers' logits up to fp32 rounding, which shows the repacked weights
    // and the HF golden describe one model.
    const std::vector<float> q4 = prefill_logits(w4a16_dir(), ids);
    TempDir d;
    {
        auto m = Model::load(w4a16_dir(), cpu_params());
        TensorMap twin = read_safetensors(w4a16_dir() + "/model.safetensors");
        for (const auto& [name, h] : g["dequant_fnv1a64"].items()) {
            const std::vector<float> w = dequantized(*module_matrix(m->weights(), name));
            const Matrix& x = *module_matrix(m->weights(), name);
            for (const char* s : {".weight_packed", ".weight_scale", ".weight_shape"}) twin.erase(name + s);
            RawTensor r{"F32", {x.rows, x.cols}, {}};
            r.bytes.resize(w.size() * 4);
            std::memcpy(r.bytes.data(), w.data(), r.bytes.size());
            twin[name + ".weight"] = std::move(r);
        }
        nlohmann::json config = nlohmann::json::parse(read_text(w4a16_dir() + "/config.json"));
        config.erase("quantization_config");
        write_model_dir(d.path, twin, config.dump());
    }
    const std::vector<float> f32 = prefill_logits(d.path, ids);
    CHECK(max_abs_diff(f32, hf) < 2e-4f);  // (measured: 2e-5)
    // The Q4 matmul rounds each activation row to int8 (a scale of amax / 127 per row and group): up to half a step,
    // 1/254 of the group's largest magnitude, per activation, compounded through 8 layers; measured: max 0.39 and
    // mean 0.05 over logits in [-14, 12] (mean magnitude 3). The bounds leave about 2x; the argmax may differ only
    // on a near tie.
    const float diff = max_abs_diff(q4, hf);
    double mean = 0.0;
    for (size_t i = 0; i < q4.size(); i++) mean += std::fabs(double(q4[i]) - double(hf[i])) / double(q4.size());
    INFO("max |hybrid Q4 - HF| = " << diff << ", mean " << mean);
    CHECK(diff > 0.0f);
    CHECK(diff < 0.75f);
    CHECK(mean < 0.1);
    int same_argmax = 0;
    const size_t V = 4096;
    for (size_t r = 0; r < ids.size(); r++) {
        auto at = [&](const std::vector<float>& l) {
            return std::max_element(l.begin() + ptrdiff_t(r * V), l.begin() + ptrdiff_t((r + 1) * V)) - l.begin();
        };
        same_argmax += at(q4) == at(hf);
    }
    CHECK(same_argmax >= int(ids.size()) - 1);
}

// The same checkpoint on CUDA (the Q4 GEMVs for one to eight rows, the dequantized weights in the bf16 GEMM for the
// prompt; bf16 activations): prompt logits near transformers' on the decompressed model, as the --quant int4 model's
// are near the CPU's (test_cuda_kernels.cpp), and one decode step.
TEST_CASE("w4a16: the CUDA logits are near Hugging Face's", "[gpu][w4a16]") {
    if (!cuda_available()) return;  // (the [gpu] entry is skipped without a GPU)
    const nlohmann::json g = golden();
    const std::vector<int32_t> ids = g["input_ids"].get<std::vector<int32_t>>();
    const TensorMap gl = read_safetensors(w4a16_dir() + "/golden_w4a16_logits.safetensors");
    const RawTensor& t = gl.at("logits");
    std::vector<float> hf(t.bytes.size() / 4);
    std::memcpy(hf.data(), t.bytes.data(), t.bytes.size());
    ModelParams p = cpu_params();
    p.device = Device::cuda;
    auto m = Model::load(w4a16_dir(), p);
    CHECK(m->weights().layers[0].mlp.down_proj.dtype == DType::Q4);
    auto l = m->prefill(0, ids, true);
    // ||got - want|| / ||want||, every value of got finite
    auto rel_err = [](const std::vector<float>& got, const std::vector<float>& want) {
        REQUIRE(got.size() == want.size());
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i < got.size(); i++) {
            REQUIRE(std::isfinite(got[i]));
            num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
            den += double(want[i]) * want[i];
        }
        return std::sqrt(num / den);
    };
    const double e = rel_err(std::vector<float>(l.begin(), l.end()), hf);
    INFO("prompt logits rel err " << e);
    CHECK(e <= 5e-2);
    // one decode step (the GEMV path) after the prompt against the CPU's Q4 model at the same place
    auto cpu = Model::load(w4a16_dir(), cpu_params());
    cpu->prefill(0, ids, true);
    const std::vector<int32_t> next = {ids[0]};
    auto lc = cpu->prefill(0, next);
    const std::vector<float> want(lc.begin(), lc.end());
    auto lg = m->prefill(0, next);
    const double e_step = rel_err(std::vector<float>(lg.begin(), lg.end()), want);
    INFO("decode step rel err against the CPU " << e_step);
    CHECK(e_step <= 5e-2);
}

TEST_CASE("w4a16: unsupported or damaged compressed-tensors checkpoints are refused with one clear line",
          "[w4a16][loader]") {
    const TensorMap good = read_safetensors(w4a16_dir() + "/model.safetensors");
    const nlohmann::json config = nlohmann::json::parse(read_text(w4a16_dir() + "/config.json"));
    const std::string mod = "model.layers.0.linear_attn.in_proj_qkv";  // [512, 256]
    const std::string cfg = w4a16_dir() + "/config.json";
    TempDir d;
    auto load = [&](const nlohmann::json& c, const TensorMap& t, WeightQuant quant = WeightQuant::none) {
        write_model_dir(d.path, t, c.dump(1));
        return Model::load(d.path, cpu_params(quant));
    };
    SECTION("quantization_config fields we cannot hold exactly") {
        const std::string w = "/quantization_config/config_groups/group_0/weights/";
        const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
            {w + "num_bits", 8, "weights.num_bits' is 8, not 4"},
            {w + "symmetric", false, "weights.symmetric' is false: asymmetric weights (zero points)"},
            {w + "type", "float", "weights.type' is \"float\", not int"},
            {w + "strategy", "channel", "weights.strategy' is \"channel\", not group"},
            {w + "actorder", "group", "weights.actorder' is \"group\": reordered groups (g_idx)"},
            {w + "group_size", 48, "weights.group_size' is 48: the Q4 layout holds groups of 32 or a multiple of 64"},
            {w + "dynamic", true, "weights.dynamic' is true"},
            {"/quantization_config/format", "naive-quantized",
             "field 'quantization_config.format' is \"naive-quantized\""},
            {"/quantization_config/config_groups/group_0/input_activations",
             {{"num_bits", 8}, {"type", "int"}, {"strategy", "token"}, {"dynamic", true}},
             "input_activations' is {"},
            {"/quantization_config/kv_cache_scheme", {{"num_bits", 8}}, "kv_cache_scheme' is {"},
        };
        for (const auto& [ptr, value, needle] : cases) {
            INFO(ptr);
            nlohmann::json c = config;
            c[nlohmann::json::json_pointer(ptr)] = value;
            require_error([&] { load(c, good); }, Status::unsupported, needle);
            require_error([&] { parse_model_config(c.dump(), cfg); }, Status::unsupported, cfg + ": field ");
        }
    }
    SECTION("format mixed-precision: every group's own format must be pack-quantized") {
        nlohmann::json c = config;
        c["quantization_config"]["format"] = "mixed-precision";
        CHECK(load(c, good)->weights().layers[0].mlp.down_proj.dtype == DType::Q4);
        c["quantization_config"]["config_groups"]["group_0"].erase("format");
        require_error([&] { load(c, good); }, Status::unsupported, "group_0.format' is null");
        c["quantization_config"]["config_groups"]["group_0"]["format"] = "float-quantized";
        require_error([&] { load(c, good); }, Status::unsupported, "group_0.format' is \"float-quantized\"");
    }
    SECTION("a group size that Q4 holds but the columns do not divide") {
        nlohmann::json c = config;
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 512;
        require_error([&] { load(c, good); }, Status::unsupported,
                      "tensor '" + mod +
                          ".weight_packed': groups of 512 weights (config.json's group_size) do not "
                          "fit its 256 input features");
    }
    SECTION("a weight_packed whose shape disagrees with weight_shape, or with the model") {
        TensorMap t = good;
        const int64_t wrong[2] = {512, 512};
        std::memcpy(t[mod + ".weight_shape"].bytes.data(), wrong, 16);
        require_error([&] { load(config, t); }, Status::model_mismatch,
                      "tensor '" + mod + ".weight_shape' holds [512, 512], expected [512, 256]");
        t = good;
        t[mod + ".weight_packed"].shape = {512, 16};
        t[mod + ".weight_packed"].bytes.resize(512 * 16 * 4);
        require_error([&] { load(config, t); }, Status::model_mismatch,
                      "tensor '" + mod + ".weight_packed' is I32 [512, 16], expected I32 [512, 32]");
        t = good;
        t[mod + ".weight_packed"].dtype = "F32";
        require_error([&] { load(config, t); }, Status::model_mismatch, "is F32 [512, 32], expected I32 [512, 32]");
    }
    SECTION("a missing or mis-shaped weight_scale, a scale that is not finite") {
        TensorMap t = good;
        t.erase(mod + ".weight_scale");
        require_error([&] { load(config, t); }, Status::model_mismatch,
                      "missing tensor '" + mod + ".weight_scale' (expected BF16, F16 or F32 [512, 2])");
        t = good;
        t[mod + ".weight_scale"].shape = {256, 4};
        require_error([&] { load(config, t); }, Status::model_mismatch,
                      "tensor '" + mod + ".weight_scale' is BF16 [256, 4], expected BF16, F16 or F32 [512, 2]");
        t = good;
        const uint16_t nan = 0x7fc0;  // (BF16 NaN)
        std::memcpy(t[mod + ".weight_scale"].bytes.data() + 2 * 5, &nan, 2);
        require_error([&] { load(config, t); }, Status::format,
                      "tensor '" + mod + ".weight_scale': the scale of row 2, group 1 is nan");
    }
    SECTION("zero points, a g_idx, a module stored twice") {
        TensorMap t = good;
        t[mod + ".weight_zero_point"] = RawTensor{"I32", {64, 2}, std::vector<uint8_t>(64 * 2 * 4)};
        require_error([&] { load(config, t); }, Status::unsupported,
                      "tensor '" + mod + ".weight_zero_point': asymmetric int4 weights (zero points)");
        t = good;
        t[mod + ".weight_g_idx"] = RawTensor{"I32", {256}, std::vector<uint8_t>(256 * 4)};
        require_error([&] { load(config, t); }, Status::unsupported,
                      "tensor '" + mod + ".weight_g_idx': reordered groups (actorder group)");
        t = good;
        t[mod + ".weight"] = RawTensor{"BF16", {512, 256}, std::vector<uint8_t>(512 * 256 * 2)};
        require_error([&] { load(config, t); }, Status::model_mismatch, "holds '" + mod + ".weight' twice");
    }
    SECTION("an integer tensor where a float one belongs") {
        TensorMap t = good;
        for (const char* name : {"model.norm.weight", "model.layers.0.linear_attn.in_proj_a.weight"}) {
            t[name].dtype = "I32";  // (BF16 -> 4 bytes an element, all zero)
            t[name].bytes.assign(t[name].bytes.size() * 2, 0);
        }
        require_error([&] { load(config, t); }, Status::unsupported, "tensor 'model.norm.weight' is I32");
        t["model.norm.weight"].dtype = "F32";
        require_error([&] { load(config, t); }, Status::unsupported,
                      "tensor 'model.layers.0.linear_attn.in_proj_a.weight' is I32");
    }
    SECTION("packed tensors under a config.json that does not say compressed-tensors") {
        nlohmann::json c = config;
        c.erase("quantization_config");
        require_error([&] { load(c, good); }, Status::unsupported,
                      "tensor '" + mod + ".weight_packed' is a compressed-tensors packed int4 weight, but config.json");
    }
    SECTION("--quant on an int4 checkpoint") {
        for (const WeightQuant q : {WeightQuant::fp8, WeightQuant::int8, WeightQuant::int4})
            require_error([&] { load(config, good, q); }, Status::invalid_argument,
                          std::string("weight quantization ") + weight_quant_name(q) + " was asked for, but " + d.path +
                              " is already an int4 checkpoint");
    }
}

TEST_CASE("w4a16: dummy weights from a compressed-tensors config.json are Q4 with its group size", "[w4a16][model]") {
    ModelParams p = cpu_params();
    p.dummy_weights = true;
    auto m = Model::load(w4a16_dir(), p);
    CHECK(m->weights().layers[0].mlp.down_proj.dtype == DType::Q4);
    CHECK(m->weights().layers[0].mlp.down_proj.group == 128);
}

TEST_CASE("w4a16: packed rows reordered at load (Qwen3-Next's fused in_proj_qkvz / in_proj_ba) stay exact",
          "[w4a16][moe]") {
    const std::string dir = source_dir() + "/tests/data/models/next";
    const TensorMap src = read_safetensors(dir + "/model.safetensors");
    TensorMap packed = src, twin = src;
    int n = 0;
    for (const auto& [name, t] : src)
        if (name.ends_with("in_proj_qkvz.weight") || name.ends_with("in_proj_ba.weight") ||
            name.ends_with("shared_expert.gate_proj.weight")) {
            ct_pack(name.substr(0, name.size() - 7), t, 64, packed, &twin[name]);
            n++;
        }
    REQUIRE(n == 3 * 2 + 3);  // (3 Gated DeltaNet layers; 3 sparse layers, layer 2 is dense: mlp_only_layers)
    TempDir d;
    write_model_dir(d / "packed", packed, ct_config(dir, 64).dump());
    write_model_dir(d / "twin", twin, read_text(dir + "/config.json"));
    auto m = Model::load(d / "packed", cpu_params());
    auto f = Model::load(d / "twin", cpu_params());
    for (int i = 0; i < 3; i++) {
        INFO("layer " << i);
        const GatedDeltaNetWeights &a = m->weights().layers[size_t(i)].gdn, &b = f->weights().layers[size_t(i)].gdn;
        check_same(a.in_proj_qkv, b.in_proj_qkv);
        check_same(a.in_proj_z, b.in_proj_z);
        check_same(a.in_proj_b, b.in_proj_b);
        check_same(a.in_proj_a, b.in_proj_a);
    }
    check_same(m->weights().layers[0].moe_block.shared.gate_proj, f->weights().layers[0].moe_block.shared.gate_proj);
    // It runs. (The logits are not compared: this randomly initialised fixture is too sensitive for the int8
    // activations' rounding, as measured: a relative noise of 1/254 on in_proj_qkvz's F32 weights alone moves its
    // logits, at most about 3.5 in magnitude, by 0.94; the matrices above are the exact check.)
    const std::vector<int32_t> ids = random_prompt(12, 3);
    int not_finite = 0;
    for (float x : m->prefill(0, ids, true)) not_finite += !std::isfinite(x);
    CHECK(not_finite == 0);
}

TEST_CASE("w4a16: MoE experts stored one packed tensor per expert become a Q4 stack that stays exact", "[w4a16][moe]") {
    const std::string dir = source_dir() + "/tests/data/models/moe";
    const TensorMap src = read_safetensors(dir + "/model.safetensors");
    // the fused 3-D experts as one 2-D tensor per expert, gate and up packed (down [H, I = 32] has too few columns
    // for Q4 and stays BF16: modules may be left out, as by an ignore list)
    TensorMap packed, twin;
    for (const auto& [name, t] : src) {
        const size_t at = name.find("mlp.experts.");
        if (at == std::string::npos) {
            packed[name] = twin[name] = t;
            continue;
        }
        const std::string pre = name.substr(0, at) + "mlp.experts.";
        const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2];
        const size_t mat = size_t(R * C) * 2;
        for (int64_t e = 0; e < E; e++) {
            const uint8_t* base = t.bytes.data() + size_t(e) * mat;
            const std::string ep = pre + std::to_string(e) + ".";
            if (name.ends_with("down_proj")) {
                packed[ep + "down_proj.weight"] = twin[ep + "down_proj.weight"] = {"BF16", {R, C}, {base, base + mat}};
                continue;
            }
            const RawTensor gate{"BF16", {R / 2, C}, {base, base + mat / 2}},
                up{"BF16", {R / 2, C}, {base + mat / 2, base + mat}};
            ct_pack(ep + "gate_proj", gate, 64, packed, &twin[ep + "gate_proj.weight"]);
            ct_pack(ep + "up_proj", up, 64, packed, &twin[ep + "up_proj.weight"]);
        }
    }
    TempDir d;
    write_model_dir(d / "packed", packed, ct_config(dir, 64).dump());
    write_model_dir(d / "twin", twin, read_text(dir + "/config.json"));
    auto m = Model::load(d / "packed", cpu_params());
    auto f = Model::load(d / "twin", cpu_params());
    const MoeExperts &a = m->weights().layers[0].moe_block.experts, &b = f->weights().layers[0].moe_block.experts;
    check_same(a.gate_up, b.gate_up);
    CHECK(a.down.dtype == DType::BF16);
    const std::vector<int32_t> ids = random_prompt(12, 3);
    auto la = m->prefill(0, ids, true);
    auto lb = f->prefill(0, ids, true);
    CHECK(max_abs_diff({la.begin(), la.end()}, {lb.begin(), lb.end()}) < 0.5f);  // (int8 activations)
}
