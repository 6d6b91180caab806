#include "model/config.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/backend.h"

namespace hy {

using json = nlohmann::json;

int ModelConfig::n_attention_layers() const {
    int n = 0;
    for (LayerKind k : layer_kinds) n += k == LayerKind::full_attention;
    return n;
}

int ModelConfig::n_gdn_layers() const { return n_layers - n_attention_layers(); }

bool ModelConfig::has_dense_mlp() const {
    for (uint8_t m : layer_is_moe)
        if (!m) return true;
    return false;
}

namespace {

struct Reader {
    const json& j;
    const std::string& source;
    const char* scope;  // "" or "text_config."

    [[noreturn]] void fail(const std::string& field, const std::string& what) const {
        throw Error(Status::format, source + ": field '" + scope + field + "' " + what);
    }
    bool has(const char* field) const { return j.contains(field) && !j.at(field).is_null(); }
    // A required integer: absent is "is missing"; null is of the wrong type ("must be an integer, found null"). A
    // whole number written as a float (8.0) is taken, as Python's json writes what some tools saved as floats.
    int get_int(const char* field, int min_value) const {
        if (!j.contains(field)) fail(field, "is missing");
        const json& v = j.at(field);
        const bool whole = v.is_number_float() && std::isfinite(v.get<double>()) &&
                           v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e18;
        if (!v.is_number_integer() && !whole) fail(field, "must be an integer, found " + v.dump());
        const long long x = whole ? static_cast<long long>(v.get<double>()) : v.get<long long>();
        if (x < min_value || x > (1ll << 30))
            fail(field, "has invalid value " + v.dump() + " (expected " + std::to_string(min_value) + " to 2^30)");
        return int(x);
    }
    int get_int_or(const char* field, int fallback, int min_value) const {
        return has(field) ? get_int(field, min_value) : fallback;
    }
    float get_float(const json& obj, const char* field, const std::string& scope_name) const {
        const json& v = obj.at(field);
        if (!v.is_number())
            throw Error(Status::format,
                        source + ": field '" + scope_name + field + "' must be a number, found " + v.dump());
        if (!std::isfinite(v.get<float>()))  // (1e300 becomes inf as a float)
            throw Error(Status::format, source + ": field '" + scope_name + field +
                                            "' must be a finite number (an f32: at most about 3.4e38), found " +
                                            v.dump());
        return v.get<float>();
    }
};

std::vector<int> read_id_list(const json& v, const std::string& source, const std::string& field) {
    std::vector<int> out;
    if (v.is_null()) return out;
    auto id = [&](const json& x) {  // (a value past int would wrap into a valid-looking id; 2.0 is taken as 2)
        const bool whole = x.is_number_float() && x.get<double>() >= 0.0 && x.get<double>() <= double(INT32_MAX) &&
                           x.get<double>() == std::floor(x.get<double>());
        if (whole) return int(x.get<double>());
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
            throw Error(Status::format, source + ": field '" + field + "' must hold token ids, found " + x.dump());
        return int(x.get<int64_t>());
    };
    if (v.is_number()) {
        out.push_back(id(v));
    } else if (v.is_array()) {
        for (const json& x : v) out.push_back(id(x));
    } else {
        throw Error(Status::format, source + ": field '" + field + "' must be an integer or a list, found " + v.dump());
    }
    return out;
}

// A compressed-tensors quantization_config (ModelConfig::int4_packed_weights; the fields of compressed-tensors'
// QuantizationConfig and QuantizationArgs): what our Q4 matrices hold exactly is accepted, the rest refused naming
// the field, its value and what is supported.
void read_compressed_tensors_config(const json& q, const std::string& scope, const std::string& source,
                                    ModelConfig& c) {
    auto refuse = [&](const std::string& field, const std::string& what) {
        throw Error(Status::unsupported, source + ": field '" + scope + field + "' " + what +
                                             " (supported: compressed-tensors W4A16, format pack-quantized, "
                                             "symmetric int4 weights in groups)");
    };
    auto bad = [&](const std::string& field, const std::string& what) {
        throw Error(Status::format, source + ": field '" + scope + field + "' " + what);
    };
    auto given = [](const json& o, const char* f) { return o.contains(f) && !o.at(f).is_null(); };
    if (!given(q, "format") || !q.at("format").is_string())
        bad("format", "must be a string (compressed-tensors' format, e.g. \"pack-quantized\")");
    // ("mixed-precision": each group names its own format, which must then be pack-quantized)
    const std::string format = q.at("format").get<std::string>();
    if (format != "pack-quantized" && format != "mixed-precision") refuse("format", "is \"" + format + "\"");
    if (given(q, "kv_cache_scheme")) refuse("kv_cache_scheme", "is " + q.at("kv_cache_scheme").dump());
    if (!given(q, "config_groups") || !q.at("config_groups").is_object() || q.at("config_groups").empty())
        bad("config_groups", "must be an object of quantization schemes");
    for (const auto& [name, g] : q.at("config_groups").items()) {
        const std::string gs = "config_groups." + name + ".";
        if (!g.is_object()) bad("config_groups." + name, "must be an object, found " + g.dump());
        if ((given(g, "format") || format == "mixed-precision") && g.value("format", json()) != "pack-quantized")
            refuse(gs + "format", "is " + g.value("format", json()).dump());
        for (const char* a : {"input_activations", "output_activations"})
            if (given(g, a)) refuse(gs + a, "is " + g.at(a).dump() + ": only weights may be quantized (W4A16)");
        if (!given(g, "weights") || !g.at("weights").is_object()) bad(gs + "weights", "must be an object");
        const json& w = g.at("weights");
        const std::string ws = gs + "weights.";
        // (compressed-tensors' defaults where a field is absent: num_bits 8, type int, symmetric true)
        const json bits = given(w, "num_bits") ? w.at("num_bits") : json(8);
        if (bits != 4) refuse(ws + "num_bits", "is " + bits.dump() + ", not 4");
        if (given(w, "type") && w.at("type") != "int") refuse(ws + "type", "is " + w.at("type").dump() + ", not int");
        if (given(w, "symmetric") && w.at("symmetric") != true)
            refuse(ws + "symmetric", "is " + w.at("symmetric").dump() + ": asymmetric weights (zero points)");
        if (!given(w, "strategy") || w.at("strategy") != "group")
            refuse(ws + "strategy",
                   std::string("is ") + (given(w, "strategy") ? w.at("strategy").dump() : "absent") + ", not group");
        if (given(w, "dynamic") && w.at("dynamic") != false)
            refuse(ws + "dynamic", "is " + w.at("dynamic").dump() + ": weights must be static");
        // (actorder "weight" / "static" only orders the calibration; "group" / "dynamic" / true stores a column
        // permutation, weight_g_idx)
        if (given(w, "actorder") && w.at("actorder") != false && w.at("actorder") != "weight" &&
            w.at("actorder") != "static")
            refuse(ws + "actorder", "is " + w.at("actorder").dump() + ": reordered groups (g_idx)");
        if (!given(w, "group_size") || !w.at("group_size").is_number_integer())
            bad(ws + "group_size", "must be an integer");
        const long long group = w.at("group_size").get<long long>();
        if (!int_quant_group_ok(group))
            refuse(ws + "group_size",
                   "is " + std::to_string(group) + ": the Q4 layout holds groups of 32 or a multiple of 64 up to 1024");
        if (c.int4_packed_group != 0 && group != c.int4_packed_group)
            refuse(ws + "group_size", "is " + std::to_string(group) + ", unlike another group's " +
                                          std::to_string(c.int4_packed_group) + ": one group size for all");
        c.int4_packed_group = int(group);
    }
    if (given(q, "ignore")) {
        const json& ig = q.at("ignore");
        if (!ig.is_array()) bad("ignore", "must be a list of module names");
        for (const json& x : ig) {
            if (!x.is_string()) bad("ignore", "must be a list of module names, found " + x.dump());
            c.modules_not_quantized.push_back(x.get<std::string>());
        }
    }
    c.int4_packed_weights = true;
}

// config.json's quantization_config (top level; text_config's is read when the top level has none).
void read_quantization_config(const json& root, const std::string& source, ModelConfig& c) {
    const json* q = nullptr;
    std::string scope = "quantization_config.";
    if (root.contains("quantization_config") && !root["quantization_config"].is_null()) {
        q = &root["quantization_config"];
    } else if (root.contains("text_config") && root["text_config"].is_object() &&
               root["text_config"].contains("quantization_config") &&
               !root["text_config"]["quantization_config"].is_null()) {
        q = &root["text_config"]["quantization_config"];
        scope = "text_config." + scope;
    }
    if (!q) return;
    auto fail = [&](Status st, const std::string& what) { throw Error(st, source + ": " + what); };
    if (!q->is_object()) fail(Status::format, "field 'quantization_config' must be an object, found " + q->dump());
    auto str = [&](const char* field) -> std::string {  // "" when absent or null
        if (!q->contains(field) || q->at(field).is_null()) return "";
        if (!q->at(field).is_string())
            fail(Status::format, "field '" + scope + field + "' must be a string, found " + q->at(field).dump());
        return q->at(field).get<std::string>();
    };
    const std::string method = str("quant_method");
    if (method == "compressed-tensors") return read_compressed_tensors_config(*q, scope, source, c);
    if (method != "fp8")
        fail(Status::unsupported, "quantization_config: unknown quant_method '" + method +
                                      "' (supported: fp8, Qwen's block-wise FP8 releases; compressed-tensors, "
                                      "W4A16 pack-quantized)");
    if (const std::string fmt = str("fmt"); !fmt.empty()) {
        if (fmt != "e4m3" && fmt != "e5m2")
            fail(Status::unsupported, "quantization_config: unknown fmt '" + fmt + "' (supported: e4m3, e5m2)");
        c.fp8_fmt = fmt == "e5m2" ? DType::F8_E5M2 : DType::F8_E4M3;
        c.fp8_fmt_given = true;
    }
    if (const std::string a = str("activation_scheme"); !a.empty() && a != "dynamic")
        fail(Status::unsupported,
             "quantization_config: activation_scheme '" + a + "' is not supported (supported: dynamic)");
    if (q->contains("weight_block_size") && !q->at("weight_block_size").is_null()) {
        const json& b = q->at("weight_block_size");
        if (b != json::array({128, 128}))
            fail(Status::unsupported,
                 "quantization_config: weight_block_size " + b.dump() + " is not supported (supported: [128, 128])");
        c.fp8_block_size_given = true;
    }
    if (q->contains("modules_to_not_convert") && !q->at("modules_to_not_convert").is_null()) {
        const json& m = q->at("modules_to_not_convert");
        if (!m.is_array()) fail(Status::format, "field '" + scope + "modules_to_not_convert' must be a list of names");
        for (const json& x : m) {
            if (!x.is_string())
                fail(Status::format,
                     "field '" + scope + "modules_to_not_convert' must be a list of names, found " + x.dump());
            c.modules_not_converted.push_back(x.get<std::string>());
        }
    }
    c.fp8_weights = true;
}

}  // namespace

static ModelConfig parse_model_config_impl(const std::string& text, const std::string& source) {
    const json root = parse_json(text, source);
    if (!root.is_object()) throw Error(Status::format, source + ": expected a JSON object");

    ModelConfig c;
    if (!root.contains("model_type")) throw Error(Status::format, source + ": field 'model_type' is missing");
    if (!root["model_type"].is_string()) throw Error(Status::format, source + ": field 'model_type' must be a string");
    c.model_type = root["model_type"].get<std::string>();
    const json* tj = &root;
    const char* scope = "";
    const std::string& mt = c.model_type;
    const bool moe = mt == "qwen3_5_moe" || mt == "qwen3_5_moe_text" || mt == "qwen3_next";
    if (mt == "qwen3_5" || mt == "qwen3_5_moe") {
        if (!root.contains("text_config") || !root["text_config"].is_object())
            throw Error(Status::format, source + ": model_type " + mt + " needs an object field 'text_config'");
        tj = &root["text_config"];
        scope = "text_config.";
        c.tensor_prefix = "model.language_model.";
    } else if (mt == "qwen3_5_text" || mt == "qwen3_5_moe_text" || mt == "qwen3_next") {
        c.tensor_prefix = "model.";
    } else {
        throw Error(Status::unsupported, source + ": unsupported model_type '" + mt +
                                             "' (supported: qwen3_5_text, qwen3_5, qwen3_5_moe_text, qwen3_5_moe, "
                                             "qwen3_next)");
    }
    Reader r{*tj, source, scope};

    c.vocab_size = r.get_int("vocab_size", 1);
    c.hidden_size = r.get_int("hidden_size", 1);
    c.n_layers = r.get_int("num_hidden_layers", 1);
    c.layer_is_moe.assign(size_t(c.n_layers), 0);
    if (moe) {
        c.n_experts = r.get_int("num_experts", 1);
        c.n_experts_per_tok = r.get_int("num_experts_per_tok", 1);
        if (c.n_experts_per_tok > c.n_experts)
            r.fail("num_experts_per_tok", "is " + std::to_string(c.n_experts_per_tok) + ", more than num_experts " +
                                              std::to_string(c.n_experts));
        c.moe_intermediate_size = r.get_int("moe_intermediate_size", 1);
        // (transformers' default for both families is 512; 0 means no shared expert)
        c.shared_expert_intermediate_size = r.get_int_or("shared_expert_intermediate_size", 512, 0);
        c.layer_is_moe.assign(size_t(c.n_layers), 1);
        if (mt == "qwen3_next") {  // (Qwen3-Next's own fields, with its defaults)
            c.gdn_fused_in_proj = true;
            if (r.has("norm_topk_prob")) {
                if (!tj->at("norm_topk_prob").is_boolean()) r.fail("norm_topk_prob", "must be true or false");
                c.norm_topk_prob = tj->at("norm_topk_prob").get<bool>();
            }
            const int step = r.get_int_or("decoder_sparse_step", 1, 1);
            std::vector<uint8_t> dense_only(size_t(c.n_layers), 0);
            if (r.has("mlp_only_layers")) {
                const json& ml = tj->at("mlp_only_layers");
                if (!ml.is_array()) r.fail("mlp_only_layers", "must be a list of layer indices");
                for (const json& v : ml) {
                    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= c.n_layers)
                        r.fail("mlp_only_layers",
                               "holds " + v.dump() + ", not a layer index in [0, " + std::to_string(c.n_layers) + ")");
                    dense_only[size_t(v.get<long long>())] = 1;
                }
            }
            for (int i = 0; i < c.n_layers; i++)
                c.layer_is_moe[size_t(i)] = !dense_only[size_t(i)] && (i + 1) % step == 0;
        }
    }
    // the dense MLP's width: needed by dense models and by the dense layers of a Qwen3-Next model
    if (!moe || c.has_dense_mlp()) c.intermediate_size = r.get_int("intermediate_size", 1);
    c.n_heads = r.get_int("num_attention_heads", 1);
    c.n_kv_heads = r.get_int_or("num_key_value_heads", c.n_heads, 1);
    c.head_dim = r.get_int_or("head_dim", c.hidden_size / c.n_heads, 1);
    c.gdn_k_heads = r.get_int("linear_num_key_heads", 1);
    c.gdn_v_heads = r.get_int("linear_num_value_heads", 1);
    c.gdn_k_dim = r.get_int("linear_key_head_dim", 1);
    c.gdn_v_dim = r.get_int("linear_value_head_dim", 1);
    c.conv_kernel = r.get_int("linear_conv_kernel_dim", -(1 << 30));  // (its range is checked below: [2, 16])
    if (r.has("rms_norm_eps")) c.rms_norm_eps = r.get_float(*tj, "rms_norm_eps", scope);
    if (!(c.rms_norm_eps > 0.0f)) r.fail("rms_norm_eps", "must be positive");

    // tie_word_embeddings: text_config first, then the top level, default false.
    if (r.has("tie_word_embeddings")) {
        if (!tj->at("tie_word_embeddings").is_boolean()) r.fail("tie_word_embeddings", "must be true or false");
        c.tie_word_embeddings = tj->at("tie_word_embeddings").get<bool>();
    } else if (root.contains("tie_word_embeddings") && !root["tie_word_embeddings"].is_null()) {
        if (!root["tie_word_embeddings"].is_boolean())
            throw Error(Status::format, source + ": field 'tie_word_embeddings' must be true or false");
        c.tie_word_embeddings = root["tie_word_embeddings"].get<bool>();
    }

    // RoPE: rope_parameters (or legacy rope_scaling-free top-level fields).
    // Defaults as transformers' Qwen3.5, Qwen3.5-MoE and Qwen3-Next configs: partial_rotary_factor 0.25 ("assign
    // default for BC" in their __post_init__), rope_theta 10000 (PreTrainedConfig's default).
    float theta = 10000.0f, partial = 0.25f;
    const json* rp = nullptr;
    if (r.has("rope_parameters")) {
        if (!tj->at("rope_parameters").is_object()) r.fail("rope_parameters", "must be an object");
        rp = &tj->at("rope_parameters");
    }
    std::string rp_scope = std::string(scope) + "rope_parameters.";
    // (null counts as absent in rope_parameters too, as at the top level)
    auto rp_has = [&](const char* f) { return rp && rp->contains(f) && !rp->at(f).is_null(); };
    // A RoPE type field of obj (null counts as absent): "default" is taken (and "mrope" where mrope_ok), "yarn" too
    // (its object and the field names' prefix kept for below); another type is refused as unsupported, named as
    // `shown`: running without its scaling would change every position's rotation.
    const json* yarn = nullptr;
    std::string yarn_prefix;
    auto check_rope_type = [&](const json& obj, const char* f, const std::string& field, const std::string& shown,
                               bool mrope_ok) {
        if (!obj.contains(f) || obj.at(f).is_null()) return;
        if (!obj.at(f).is_string()) r.fail(field, "must be a string");
        const std::string type = obj.at(f).get<std::string>();
        if (type == "default" || (mrope_ok && type == "mrope")) return;
        if (type == "yarn") {
            // (both rope_parameters and rope_scaling with YaRN values that differ: one of them ran without a word)
            auto yarn_value = [](const json& o, const char* k) { return o.contains(k) ? o.at(k) : json(); };
            bool differ = false;
            for (const char* k : {"factor", "original_max_position_embeddings", "attention_factor", "mscale",
                                  "mscale_all_dim", "beta_fast", "beta_slow", "truncate"})
                differ = differ || (yarn && yarn_value(*yarn, k) != yarn_value(obj, k));
            if (yarn && yarn != &obj && differ)
                throw Error(Status::format, source + ": " + yarn_prefix + "rope_type and " + shown +
                                                " both say 'yarn', with other values (give them in one place)");
            if (!yarn) {
                yarn = &obj;
                yarn_prefix = field.substr(0, field.rfind('.') + 1);
            }
            return;
        }
        throw Error(Status::unsupported, source + ": unsupported " + shown + " '" + type +
                                             "' (supported: default, yarn; hybrid has no other RoPE scaling)");
    };
    if (rp) check_rope_type(*rp, "rope_type", "rope_parameters.rope_type", rp_scope + "rope_type", false);
    // The legacy rope_scaling (the Qwen model cards' recipe for long contexts adds {"rope_type": "yarn", "factor": 4,
    // ...} there): null (Qwen3-Next's checkpoints), {} and type "default" are taken, and "mrope" (Qwen2-VL's name for
    // the multimodal sections, which transformers maps to the default rotation: text positions are the same in every
    // section).
    if (r.has("rope_scaling")) {
        const json& rs = tj->at("rope_scaling");
        if (!rs.is_object()) r.fail("rope_scaling", "must be an object or null");
        // rope_type, else the legacy type (as transformers reads them: a rope_type wins over a type beside it)
        const char* f = rs.contains("rope_type") && !rs.at("rope_type").is_null() ? "rope_type" : "type";
        check_rope_type(rs, f, std::string("rope_scaling.") + f, std::string("rope_scaling ") + f, true);
        // a scale factor with no type names no rotation (transformers refuses it too): not dropped in silence
        const auto has = [&](const char* f) { return rs.contains(f) && !rs.at(f).is_null(); };
        if (has("factor") && !has("rope_type") && !has("type"))
            throw Error(Status::unsupported, source + ": rope_scaling has a factor (" + rs.at("factor").dump() +
                                                 ") but no rope_type (a factor alone names no scaling)");
    }
    // Each of rope_theta and partial_rotary_factor: rope_parameters' value, else the top level's, else the default.
    // null counts as absent in either place, but a null with no value anywhere is refused: the default would be a
    // silent guess (models/tiny was trained with rope_theta 1e7, the default is 1e4).
    auto rope_field = [&](const char* f, float fallback) {
        if (rp_has(f)) return r.get_float(*rp, f, rp_scope);
        if (r.has(f)) return r.get_float(*tj, f, scope);
        if (rp && rp->contains(f)) r.fail(std::string("rope_parameters.") + f, "must be a number, found null");
        if (tj->contains(f)) r.fail(f, "must be a number, found null");
        return fallback;
    };
    theta = rope_field("rope_theta", theta);
    partial = rope_field("partial_rotary_factor", partial);
    if (rp_has("rope_theta") && r.has("rope_theta")) {
        const float top = r.get_float(*tj, "rope_theta", scope);
        if (top != theta)
            c.warning = source + ": field '" + scope + "rope_theta' (" + tj->at("rope_theta").dump() +
                        ") differs from '" + rp_scope + "rope_theta' (" + rp->at("rope_theta").dump() +
                        "); using the latter";
    }
    c.rope_theta = theta;
    c.partial_rotary_factor = partial;
    c.rotary_dim = int(float(c.head_dim) * partial);  // as HF: int(head_dim * partial_rotary_factor)
    // (named where the value came from)
    auto rope_name = [&](const char* f) { return rp_has(f) ? std::string("rope_parameters.") + f : std::string(f); };
    if (!(theta > 0.0f)) r.fail(rope_name("rope_theta"), "must be positive");
    if (!(partial > 0.0f) || partial > 1.0f) r.fail(rope_name("partial_rotary_factor"), "must lie in (0, 1]");
    if (c.rotary_dim % 2 != 0 || c.rotary_dim <= 0 || c.rotary_dim > c.head_dim)
        throw Error(Status::format, source + ": rotary dims " + std::to_string(c.rotary_dim) +
                                        " (head_dim x partial_rotary_factor) must be even, positive and <= head_dim " +
                                        std::to_string(c.head_dim));

    // Layer kinds.
    if (r.has("layer_types")) {
        const json& lt = tj->at("layer_types");
        if (!lt.is_array()) r.fail("layer_types", "must be a list");
        if (int(lt.size()) != c.n_layers)
            r.fail("layer_types", "has " + std::to_string(lt.size()) +
                                      " entries, expected num_hidden_layers = " + std::to_string(c.n_layers));
        for (size_t i = 0; i < lt.size(); i++) {
            std::string s = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
            if (s == "linear_attention")
                c.layer_kinds.push_back(LayerKind::gated_delta_net);
            else if (s == "full_attention")
                c.layer_kinds.push_back(LayerKind::full_attention);
            else
                throw Error(Status::unsupported, source + ": layer_types[" + std::to_string(i) + "] is '" + s +
                                                     "' (supported: linear_attention, full_attention)");
        }
    } else {
        int interval = r.get_int_or("full_attention_interval", 4, 1);
        for (int i = 0; i < c.n_layers; i++)
            c.layer_kinds.push_back((i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::gated_delta_net);
    }

    if (c.n_heads % c.n_kv_heads != 0)
        throw Error(Status::format, source + ": num_attention_heads " + std::to_string(c.n_heads) +
                                        " is not a multiple of num_key_value_heads " + std::to_string(c.n_kv_heads));
    if (c.gdn_v_heads % c.gdn_k_heads != 0)
        throw Error(Status::format, source + ": linear_num_value_heads " + std::to_string(c.gdn_v_heads) +
                                        " is not a multiple of linear_num_key_heads " + std::to_string(c.gdn_k_heads));
    if (c.conv_kernel < 2 || c.conv_kernel > 16)
        r.fail("linear_conv_kernel_dim", "must lie in [2, 16], found " + std::to_string(c.conv_kernel));
    if (r.has("attention_bias") && !tj->at("attention_bias").is_boolean())
        r.fail("attention_bias", "must be true or false");
    if (r.has("attention_bias") && tj->at("attention_bias").get<bool>())
        throw Error(Status::unsupported, source + ": attention_bias = true is not supported");
    // the gate on the attention output (QWEN35.md) is always applied: a config that turns it off is another model
    if (r.has("attn_output_gate") && !tj->at("attn_output_gate").is_boolean())
        r.fail("attn_output_gate", "must be true or false");
    if (r.has("attn_output_gate") && !tj->at("attn_output_gate").get<bool>())
        throw Error(Status::unsupported, source +
                                             ": attn_output_gate = false is not supported (Qwen3.5's attention "
                                             "output is always gated)");
    if (r.has("hidden_act") && tj->at("hidden_act") != "silu")
        throw Error(Status::unsupported, source + ": hidden_act " + tj->at("hidden_act").dump() + " (supported: silu)");

    c.max_position_embeddings = r.get_int_or("max_position_embeddings", 0, 1);  // 0: not given

    // YaRN, as transformers' _compute_yarn_parameters (kernels/rope.h has the per-pair formula): the factor (or
    // max_position_embeddings / original_max_position_embeddings), the attention factor (given, or from the factor and
    // mscale / mscale_all_dim: 0.1 m ln(factor) + 1), and the correction range [low, high] in RoPE pairs where
    // beta_fast (32) and beta_slow (1) rotations fit in original_max_position_embeddings (floored and ceiled unless
    // truncate is false; clamped to [0, R - 1]).
    if (yarn) {
        auto number = [&](const char* f) -> double {  // NaN: absent or null
            if (!yarn->contains(f) || yarn->at(f).is_null()) return NAN;
            if (!yarn->at(f).is_number() || !std::isfinite(yarn->at(f).get<double>()))
                r.fail(yarn_prefix + f, "must be a number, found " + yarn->at(f).dump());
            return yarn->at(f).get<double>();
        };
        // (the top level's original_max_position_embeddings first, as transformers' standardize_rope_params; a
        // whole number >= 1 in either place)
        // (both given: they must agree)
        double original = number("original_max_position_embeddings");
        if (!std::isnan(original) && !(original >= 1.0 && original == std::floor(original) && original <= 1e15))
            r.fail(yarn_prefix + "original_max_position_embeddings",
                   "must be a whole number >= 1, found " + yarn->at("original_max_position_embeddings").dump());
        if (r.has("original_max_position_embeddings")) {
            const double top = double(r.get_int("original_max_position_embeddings", 1));
            if (!std::isnan(original) && original != top)
                r.fail(yarn_prefix + "original_max_position_embeddings",
                       "is " + yarn->at("original_max_position_embeddings").dump() +
                           ", but the top level's original_max_position_embeddings is " + std::to_string(int64_t(top)) +
                           " (give one value)");
            original = top;
        }
        // (neither a factor nor the original length: the implied factor would be 1, YaRN doing nothing)
        if (std::isnan(original) && std::isnan(number("factor")))
            r.fail(yarn_prefix + "factor",
                   "is needed by rope_type 'yarn' (or original_max_position_embeddings, for max_position_embeddings / "
                   "original_max_position_embeddings)");
        if (std::isnan(original)) original = double(c.max_position_embeddings);
        if (!(original >= 1.0))
            r.fail(yarn_prefix + "original_max_position_embeddings",
                   "is needed by rope_type 'yarn' (nor is max_position_embeddings given)");
        double factor = number("factor");
        const bool implied = std::isnan(factor) && c.max_position_embeddings > 0;
        if (implied) factor = c.max_position_embeddings / original;
        if (!(factor >= 1.0)) {
            if (std::isnan(factor)) r.fail(yarn_prefix + "factor", "is needed by rope_type 'yarn'");
            char v[32];
            std::snprintf(v, sizeof v, "%g", factor);
            r.fail(
                yarn_prefix + "factor",
                std::string("must be >= 1, found ") + (implied ? v : yarn->at("factor").dump()) +
                    (implied ? " (max_position_embeddings / original_max_position_embeddings: no factor given)" : ""));
        }
        auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
        double attention = number("attention_factor");
        const double ms = number("mscale"), ms_all = number("mscale_all_dim");
        if (std::isnan(attention))
            attention = !std::isnan(ms) && ms != 0.0 && !std::isnan(ms_all) && ms_all != 0.0
                            ? mscale(factor, ms) / mscale(factor, ms_all)
                            : mscale(factor, 1.0);
        if (!(attention > 0.0)) r.fail(yarn_prefix + "attention_factor", "must be positive");
        // (kept as f32: a value past its range became inf, and the logits NaN only at generation)
        if (!std::isfinite(float(factor))) r.fail(yarn_prefix + "factor", "is too large (past the f32 range)");
        if (!std::isfinite(float(attention)))
            r.fail(yarn_prefix + (std::isnan(number("attention_factor")) ? "mscale" : "attention_factor"),
                   "gives an attention factor past the f32 range");
        double beta_fast = number("beta_fast"), beta_slow = number("beta_slow");
        if (std::isnan(beta_fast) || beta_fast == 0.0) beta_fast = 32.0;  // (transformers: `or 32`)
        if (std::isnan(beta_slow) || beta_slow == 0.0) beta_slow = 1.0;
        // (a rotation count below 0 has no logarithm: the correction range was NaN, which ran without a word)
        for (const auto& [name, v] : {std::pair<const char*, double>{"beta_fast", beta_fast}, {"beta_slow", beta_slow}})
            if (!(v > 0.0)) r.fail(yarn_prefix + name, "must be positive, found " + yarn->at(name).dump());
        bool truncate = true;
        if (yarn->contains("truncate") && !yarn->at("truncate").is_null()) {
            if (!yarn->at("truncate").is_boolean()) r.fail(yarn_prefix + "truncate", "must be true or false");
            truncate = yarn->at("truncate").get<bool>();
        }
        const double R = c.rotary_dim, base = c.rope_theta, kPi = 3.14159265358979323846;
        auto correction_pair = [&](double rotations) {
            return R * std::log(original / (rotations * 2.0 * kPi)) / (2.0 * std::log(base));
        };
        double low = correction_pair(beta_fast), high = correction_pair(beta_slow);
        if (truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, R - 1.0);
        if (low == high) high += 0.001;  // (transformers: "prevent singularity")
        c.rope_yarn_factor = float(factor);
        c.rope_yarn_low = float(low);
        c.rope_yarn_range = float(high - low);
        c.rope_attention_factor = float(attention);
    }

    read_quantization_config(root, source, c);

    // eos ids: text_config, then top level.
    if (r.has("eos_token_id"))
        c.eos_token_ids = read_id_list(tj->at("eos_token_id"), source, std::string(scope) + "eos_token_id");
    else if (root.contains("eos_token_id"))
        c.eos_token_ids = read_id_list(root["eos_token_id"], source, "eos_token_id");
    for (int id : c.eos_token_ids)
        if (id < 0 || id >= c.vocab_size)
            throw Error(Status::format, source + ": eos_token_id " + std::to_string(id) +
                                            " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    return c;
}

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
    try {
        return parse_model_config_impl(text, source);
    } catch (const json::exception& e) {  // a field of the wrong JSON type
        throw Error(Status::format, source + ": a field has the wrong type: " + json_error_text(e.what()));
    }
}

GenerationDefaults parse_generation_defaults(const std::string& text, const std::string& source) {
    const json j = parse_json(text, source);
    if (!j.is_object()) throw Error(Status::format, source + ": the top level must be a JSON object");
    GenerationDefaults g;
    auto given = [&](const char* f) { return j.contains(f) && !j.at(f).is_null(); };
    // A field with a bad value is left unset and named in g.warning (the file is optional, and an option given on
    // the command line may replace the value anyway): the model still loads.
    auto bad = [&](const char* f, const std::string& what) {
        g.warning += std::string(g.warning.empty() ? source + ": " : "; ") + "field '" + f + "' " + what + ", found " +
                     j.at(f).dump() + ": ignored";
    };
    // transformers' ranges (a negative temperature or top_k is an error there), with what hybrid's options make of
    // the edges: temperature 0 is greedy, top_k 0 and top_p 1 are off
    auto real = [&](const char* f, bool unit, bool positive) -> std::optional<float> {
        if (!given(f)) return std::nullopt;
        const double v = j.at(f).is_number() ? j.at(f).get<double>() : 0.0;
        const char* err = !j.at(f).is_number()             ? "must be a number"
                          : !std::isfinite(float(v))       ? "must be a finite number"
                          : unit && (v < 0.0 || v > 1.0)   ? "must be in [0, 1]"
                          : positive && !(float(v) > 0.0f) ? "must be > 0"  // (as the float it becomes: 1e-300 is 0)
                          : v < 0.0                        ? "must be >= 0"
                                                           : nullptr;
        if (!err) return float(v);
        bad(f, err);
        return std::nullopt;
    };
    if (given("do_sample")) {
        if (!j.at("do_sample").is_boolean())
            bad("do_sample", "must be true or false");
        else
            g.do_sample = j.at("do_sample").get<bool>();
    }
    g.temperature = real("temperature", false, false);
    g.top_p = real("top_p", true, false);
    g.min_p = real("min_p", true, false);
    g.repetition_penalty = real("repetition_penalty", false, true);
    if (given("top_k")) {
        const json& k = j.at("top_k");
        if (!k.is_number_integer())
            bad("top_k", "must be an integer");
        else if (k.get<long long>() < 0 || k.get<long long>() > (1ll << 30) ||
                 (k.is_number_unsigned() && k.get<uint64_t>() > (1ull << 30)))  // (past 2^63 it would wrap)
            bad("top_k", "must be in [0, 2^30]");
        else
            g.top_k = int(k.get<long long>());
    }
    return g;
}

GenerationDefaults load_generation_defaults(const std::string& dir) {
    const std::string path = folder_path(dir) + "/generation_config.json";
    if (!path_present(path)) return {};
    return parse_generation_defaults(read_regular_file(path, kMaxJsonFileBytes), path);
}

ModelConfig load_model_config(const std::string& dir_in) {
    const std::string dir = folder_path(dir_in);
    std::string path = dir + "/config.json";
    if (!path_present(path))
        throw Error(Status::io, path + ": cannot open (is '" + dir + "' a Hugging Face model folder?)");
    return parse_model_config(read_regular_file(path, kMaxJsonFileBytes), path);
}

}  // namespace hy
