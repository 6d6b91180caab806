// Mixture-of-experts models on the CPU reference (tests/data/models/moe: Qwen3.5-MoE, next: Qwen3-Next; made by
// tools/make_moe_test_models.py with Hugging Face goldens, which the compare_moe_cpu / compare_next_cpu ctest
// entries check): the other checkpoint layouts give bitwise the same logits, the router's ops against a direct
// computation, and bad checkpoints are refused with one clear line.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

std::string moe_dir() { return source_dir() + "/tests/data/models/moe"; }
std::string next_dir() { return source_dir() + "/tests/data/models/next"; }

ModelParams cpu_params() {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 128;
    p.max_batch_tokens = 64;
    p.max_logits = 64;
    return p;
}

// All-position logits of a fixed prompt.
std::vector<float> logits_of(const std::string& dir) {
    auto m = Model::load(dir, cpu_params());
    const std::vector<int32_t> ids = random_prompt(40, 11);
    auto l = m->prefill(0, ids, true);
    return {l.begin(), l.end()};
}

// Copies a test model's folder with another config and tensors.
void write_variant(const std::string& dir, const std::string& from, const nlohmann::json& config,
                   const TensorMap& tensors) {
    std::filesystem::create_directories(dir);
    write_text(dir + "/config.json", config.dump(1));
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
        std::filesystem::copy_file(from + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
    write_safetensors(dir + "/model.safetensors", tensors);
}

// The fused experts of `t` rewritten as one tensor per expert (the official FP8 releases' layout).
TensorMap per_expert(const TensorMap& t, int E, int I, int H) {
    TensorMap out;
    for (const auto& [name, tensor] : t) {
        const size_t at = name.find("mlp.experts.");
        if (at == std::string::npos) {
            out[name] = tensor;
            continue;
        }
        const std::string pre = name.substr(0, at) + "mlp.experts.";
        const size_t es = tensor.dtype == "F32" ? 4 : 2;
        if (name.ends_with("gate_up_proj")) {
            for (int e = 0; e < E; e++) {
                const uint8_t* base = tensor.bytes.data() + size_t(e) * 2 * I * H * es;
                const size_t half = size_t(I) * H * es;
                out[pre + std::to_string(e) + ".gate_proj.weight"] = {tensor.dtype, {I, H}, {base, base + half}};
                out[pre + std::to_string(e) + ".up_proj.weight"] = {
                    tensor.dtype, {I, H}, {base + half, base + 2 * half}};
            }
        } else if (name.ends_with("down_proj")) {
            for (int e = 0; e < E; e++) {
                const uint8_t* base = tensor.bytes.data() + size_t(e) * H * I * es;
                out[pre + std::to_string(e) + ".down_proj.weight"] = {
                    tensor.dtype, {H, I}, {base, base + size_t(H) * I * es}};
            }
        }
    }
    return out;
}

}  // namespace

TEST_CASE("MoE: per-expert tensors and the multimodal layout give the fused layout's logits bitwise", "[moe]") {
    for (const std::string& dir : {moe_dir(), next_dir()}) {
        INFO(dir);
        const nlohmann::json cfg = nlohmann::json::parse(read_text(dir + "/config.json"));
        const int E = cfg["num_experts"], I = cfg["moe_intermediate_size"], H = cfg["hidden_size"];
        const TensorMap fused = read_safetensors(dir + "/model.safetensors");
        const std::vector<float> want = logits_of(dir);
        TempDir tmp;
        SECTION("one tensor per expert") {
            const TensorMap split = per_expert(fused, E, I, H);
            REQUIRE(split.count("model.layers.0.mlp.experts.7.down_proj.weight") == 1);
            write_variant(tmp.path, dir, cfg, split);
            CHECK(logits_of(tmp.path) == want);
        }
        if (cfg["model_type"] == "qwen3_5_moe_text") {
            SECTION("Qwen3_5MoeForConditionalGeneration: text_config, model.language_model.*, per-expert tensors") {
                TensorMap mm;
                for (const auto& [name, tensor] : per_expert(fused, E, I, H))
                    mm[name.starts_with("model.") ? "model.language_model." + name.substr(6) : name] = tensor;
                nlohmann::json text = cfg;
                text["model_type"] = "qwen3_5_moe_text";
                const nlohmann::json top = {{"model_type", "qwen3_5_moe"},
                                            {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
                                            {"text_config", text}};
                write_variant(tmp.path, dir, top, mm);
                CHECK(logits_of(tmp.path) == want);
            }
        }
    }
}

TEST_CASE("MoE router: softmax, top-k with ties to the lower id, renormalisation", "[moe]") {
    const float logits[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -INFINITY};
    float w[3];
    int32_t ids[3];
    cpu::softmax_top_k(logits, 6, 3, false, w, ids);
    CHECK(ids[0] == 1);  // the tie between 1 and 3 goes to the lower id first
    CHECK(ids[1] == 3);
    CHECK(ids[2] == 4);
    double z = 0.0;
    for (float v : logits) z += std::exp(double(v) - 2.0);
    CHECK(w[0] == Approx(1.0 / z).epsilon(1e-6));
    CHECK(w[2] == Approx(std::exp(-1.0) / z).epsilon(1e-6));
    cpu::softmax_top_k(logits, 6, 3, true, w, ids);
    CHECK(w[0] + w[1] + w[2] == Approx(1.0f).epsilon(1e-6));
    CHECK(w[0] == w[1]);
}

TEST_CASE("MoE: mismatched checkpoints and configs are refused with one clear line", "[moe]") {
    const nlohmann::json cfg = nlohmann::json::parse(read_text(moe_dir() + "/config.json"));
    const TensorMap fused = read_safetensors(moe_dir() + "/model.safetensors");
    const ModelParams p = cpu_params();
    TempDir tmp;
    auto require_error = [&](Status status, const std::string& needle, const ModelParams& params) {
        try {
            Model::load(tmp.path, params);
        } catch (const Error& e) {
            INFO("message: " << e.what());
            CHECK(e.status() == status);
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
            CHECK(std::string(e.what()).find('\n') == std::string::npos);
            return;
        }
        FAIL("no hy::Error thrown (expected: " << needle << ")");
    };
    SECTION("a missing expert names the layer and the expert") {
        TensorMap t = per_expert(fused, 8, 32, 64);
        t.erase("model.layers.2.mlp.experts.5.up_proj.weight");
        write_variant(tmp.path, moe_dir(), cfg, t);
        require_error(Status::model_mismatch, "layer 2: expert 5 of 8 is missing", p);
    }
    SECTION("a router of the wrong number of experts, k > E, E = 0") {
        struct Case {
            const char* field;
            int value;
            Status status;
            const char* needle;
        };
        for (const Case& k :
             {Case{"num_experts", 6, Status::model_mismatch, "mlp.gate.weight' has shape [8, 64], expected [6, 64]"},
              Case{"num_experts_per_tok", 9, Status::format, "num_experts_per_tok' is 9, more than num_experts 8"},
              Case{"num_experts", 0, Status::format, "num_experts' has invalid value 0"}}) {
            nlohmann::json c = cfg;
            c[k.field] = k.value;
            write_variant(tmp.path, moe_dir(), c, fused);
            require_error(k.status, k.needle, p);
        }
    }
    SECTION("a config with fewer layers than the checkpoint") {
        nlohmann::json c = cfg;
        c["num_hidden_layers"] = 3;
        c["layer_types"] = {"linear_attention", "linear_attention", "linear_attention"};
        write_variant(tmp.path, moe_dir(), c, fused);
        require_error(Status::model_mismatch, "belongs to layer 3, but config.json's num_hidden_layers is 3", p);
    }
    SECTION("the experts in both layouts at once") {
        TensorMap t = per_expert(fused, 8, 32, 64);
        t["model.layers.1.mlp.experts.gate_up_proj"] = fused.at("model.layers.1.mlp.experts.gate_up_proj");
        write_variant(tmp.path, moe_dir(), cfg, t);
        require_error(Status::model_mismatch, "layer 1: the checkpoint holds the experts twice", p);
    }
    SECTION("a shared expert the config says is absent") {
        nlohmann::json c = cfg;
        c["shared_expert_intermediate_size"] = 0;
        write_variant(tmp.path, moe_dir(), c, fused);
        require_error(Status::model_mismatch, "layer 0: the checkpoint holds a shared expert", p);
    }
    SECTION("a MoE config over a dense checkpoint") {
        nlohmann::json c = nlohmann::json::parse(read_text(tiny_dir() + "/config.json"));
        c["model_type"] = "qwen3_5_moe_text";
        c["num_experts"] = 8;
        c["num_experts_per_tok"] = 2;
        c["moe_intermediate_size"] = 64;
        write_variant(tmp.path, tiny_dir(), c, read_safetensors(tiny_dir() + "/model.safetensors"));
        require_error(Status::model_mismatch, "layer 0: config.json describes a mixture-of-experts block", p);
    }
    SECTION("a dense config over a MoE checkpoint") {
        nlohmann::json c = cfg;
        c["model_type"] = "qwen3_5_text";
        c["intermediate_size"] = 32;
        write_variant(tmp.path, moe_dir(), c, fused);
        require_error(Status::model_mismatch, "layer 0: the checkpoint holds a mixture-of-experts block", p);
    }
}

TEST_CASE("dummy weights: config.json alone gives a deterministic model of that shape", "[moe]") {
    for (const std::string& dir : {moe_dir(), next_dir()}) {
        INFO(dir);
        TempDir tmp;
        write_text(tmp / "config.json", read_text(dir + "/config.json"));  // no model.safetensors
        ModelParams p = cpu_params();
        p.dummy_weights = true;
        auto a = Model::load(tmp.path, p);
        auto b = Model::load(tmp.path, p);
        CHECK(a->weight_bytes() == Model::load(dir, cpu_params())->weight_bytes());
        const std::vector<int32_t> ids = random_prompt(20, 3);
        auto la = a->prefill(0, ids, true);
        const std::vector<float> first(la.begin(), la.end());
        auto lb = b->prefill(0, ids, true);
        CHECK(std::vector<float>(lb.begin(), lb.end()) == first);
        bool finite = true, varied = false;
        for (float v : first) {
            finite = finite && std::isfinite(v);
            varied = varied || v != first[0];
        }
        CHECK(finite);
        CHECK(varied);
        p.dummy_weights = false;
        REQUIRE_THROWS_AS(Model::load(tmp.path, p), Error);  // without the option the weights are needed
    }
}

TEST_CASE("checkpoint tensors the config does not use are named in a warning", "[moe]") {
    const nlohmann::json cfg = nlohmann::json::parse(read_text(moe_dir() + "/config.json"));
    TensorMap t = read_safetensors(moe_dir() + "/model.safetensors");
    CHECK(Model::load(moe_dir(), cpu_params())->load_warning().empty());
    t["model.layers.0.mlp.extra_bias"] = {"F32", {64}, std::vector<uint8_t>(256, 0)};
    t["mtp.fc.weight"] = {"BF16", {4}, std::vector<uint8_t>(8, 0)};      // skipped without a word
    t["model.visual.proj"] = {"BF16", {4}, std::vector<uint8_t>(8, 0)};  // skipped without a word
    TempDir tmp;
    write_variant(tmp.path, moe_dir(), cfg, t);
    const std::string w = Model::load(tmp.path, cpu_params())->load_warning();
    CHECK(w == "1 checkpoint tensor is not used by this config: model.layers.0.mlp.extra_bias");
}
