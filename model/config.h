// The Qwen3.5 hybrid model configuration, read from a Hugging Face config.json.
//
// Both layouts of docs/QWEN35.md ("Checkpoint") are accepted:
//   text-only:   flat fields, model_type "qwen3_5_text", architectures ["Qwen3_5ForCausalLM"], tensors under "model."
//   multimodal:  model_type "qwen3_5", the text fields under "text_config" (tie_word_embeddings may sit at the top
//                level), tensors under "model.language_model."
// and the mixture-of-experts members (docs/QWEN35.md "Mixture-of-experts members"):
//   Qwen3.5-MoE: model_type "qwen3_5_moe_text" (tensors under "model.") or "qwen3_5_moe" (text_config,
//                "model.language_model."): a sparse MoE block in every layer
//   Qwen3-Next:  model_type "qwen3_next" ("model."): sparse layers chosen by decoder_sparse_step and mlp_only_layers,
//                top-k weights renormalised only with norm_topk_prob, Gated DeltaNet input projections stored fused
//                (in_proj_qkvz, in_proj_ba; the loader reorders them into the separate matrices)
// Layer kinds come from layer_types, or, when absent, layer i is full attention iff (i+1) % full_attention_interval
// == 0 (default 4). RoPE fields come from rope_parameters or, in older files, the top level.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/common.h"

namespace hy {

enum class LayerKind : uint8_t { gated_delta_net, full_attention };

struct ModelConfig {
    std::string model_type;     // "qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe" or "qwen3_next"
    std::string tensor_prefix;  // "model." or "model.language_model."

    int vocab_size = 0;         // rows of embed_tokens (may exceed the tokenizer's ids)
    int hidden_size = 0;        // H
    int intermediate_size = 0;  // dense MLP width F (0 when every layer is sparse)
    int n_layers = 0;           // L
    float rms_norm_eps = 1e-6f;
    bool tie_word_embeddings = false;
    std::vector<LayerKind> layer_kinds;  // [L]

    // gated full attention
    int n_heads = 0;     // Hq
    int n_kv_heads = 0;  // Hkv (GQA: q head j reads kv head j / (Hq / Hkv))
    int head_dim = 0;    // D
    int rotary_dim = 0;  // R = int(D * partial_rotary_factor), even
    float rope_theta = 10000.0f;
    float partial_rotary_factor = 1.0f;
    // YaRN RoPE scaling (rope_type "yarn" in rope_parameters or rope_scaling; kernels/rope.h has the formula):
    // rope_yarn_factor 0 is plain RoPE; else the context factor, the correction range's low end and length in RoPE
    // pairs, and the factor cos and sin are multiplied by (attention_factor, or 0.1 ln(factor) + 1).
    float rope_yarn_factor = 0.0f;
    float rope_yarn_low = 0.0f, rope_yarn_range = 1.0f;
    float rope_attention_factor = 1.0f;

    // Gated DeltaNet (linear attention)
    int gdn_k_heads = 0;             // Hk
    int gdn_v_heads = 0;             // Hv (a multiple of Hk)
    int gdn_k_dim = 0;               // Dk
    int gdn_v_dim = 0;               // Dv
    int conv_kernel = 0;             // K
    bool gdn_fused_in_proj = false;  // Qwen3-Next: in_proj_qkvz and in_proj_ba, interleaved per key-head group

    // Mixture of experts (n_experts == 0: a dense model)
    int n_experts = 0;                        // E
    int n_experts_per_tok = 0;                // k (1 <= k <= E)
    int moe_intermediate_size = 0;            // I, each routed expert's SwiGLU width
    int shared_expert_intermediate_size = 0;  // the shared expert's width (0: none)
    bool norm_topk_prob = true;               // renormalise the k routing weights to sum 1
    std::vector<uint8_t> layer_is_moe;        // [L] 1: sparse MoE block, 0: dense MLP

    // config.json quantization_config (transformers' FineGrainedFP8Config, as Qwen's FP8 releases write it):
    // quant_method "fp8", fmt "e4m3" or "e5m2" (absent: e4m3), activation_scheme "dynamic" (absent: dynamic),
    // weight_block_size [128, 128] (absent: [128, 128], transformers' default; vLLM reads its absence as per-tensor
    // scales, "<name>_scale", which the loader refuses naming the field), modules_to_not_convert (optional). The
    // loader goes by each tensor's dtype: an F8 tensor must be of fmt's type and needs its F32 "<name>_scale_inv"
    // [ceil(rows/128), ceil(cols/128)] (the shape that proves the 128 x 128 blocks when weight_block_size is
    // absent); a 16-bit one is loaded as it is.
    bool fp8_weights = false;                        // quantization_config with quant_method "fp8"
    DType fp8_fmt = DType::F8_E4M3;                  // fmt: F8_E4M3 ("e4m3" or absent) or F8_E5M2 ("e5m2")
    bool fp8_fmt_given = false;                      // fmt is given
    bool fp8_block_size_given = false;               // weight_block_size is given ([128, 128])
    std::vector<std::string> modules_not_converted;  // modules_to_not_convert (informative)

    // config.json quantization_config of a compressed-tensors W4A16 checkpoint (the format vLLM reads; e.g. the
    // "W4A16" releases made with llm-compressor): quant_method "compressed-tensors", format "pack-quantized" (or
    // "mixed-precision" with every group's format "pack-quantized"), and
    // config_groups whose every scheme has weights {num_bits 4, type "int", symmetric true, strategy "group",
    // group_size G (one G for all groups), dynamic false, actorder null, "weight" or "static"} and no
    // input_activations / output_activations; kv_cache_scheme null; ignore (the modules left 16-bit, e.g. lm_head)
    // informative. The loader goes by each module's tensors: "<name>.weight_packed" (I32) with "<name>.weight_scale"
    // and "<name>.weight_shape" is an int4 matrix loaded as Q4 (ModelLoader::packed_int4_matrix); "<name>.weight"
    // is loaded as it is.
    bool int4_packed_weights = false;                // quant_method "compressed-tensors", format "pack-quantized"
    int int4_packed_group = 0;                       // G: weights of a row per scale (int_quant_group_ok)
    std::vector<std::string> modules_not_quantized;  // ignore (informative)

    std::vector<int> eos_token_ids;   // from config.json (int or list); may be empty
    int max_position_embeddings = 0;  // positions the model was trained for (0 when the config does not say)
    // What the config says that loads but deserves a note (fields that disagree); empty when nothing. The model
    // passes it on in Model::load_warning().
    std::string warning;

    int gdn_conv_channels() const { return 2 * gdn_k_heads * gdn_k_dim + gdn_v_heads * gdn_v_dim; }  // C
    bool has_moe() const { return n_experts > 0; }
    bool has_dense_mlp() const;  // some layer has a dense MLP
    int n_attention_layers() const;
    int n_gdn_layers() const;
};

// Reads and validates `dir`/config.json. Throws hy::Error naming the file and field on a missing or invalid field,
// an unsupported model_type, or inconsistent sizes (Hv % Hk, Hq % Hkv, rotary dims even and <= head_dim, ...);
// Error(unsupported) for a quantization_config other than block-wise FP8 (an unknown quant_method, a fmt other than
// e4m3 or e5m2, a static activation scheme, a weight_block_size other than [128, 128]) or compressed-tensors W4A16
// (a format other than pack-quantized, num_bits other than 4, a type other than int, asymmetric weights (zero
// points), a strategy other than group, a group size Q4 cannot hold (int_quant_group_ok), groups of different
// sizes, actorder "group" (g_idx), quantized activations or KV cache).
ModelConfig load_model_config(const std::string& dir);

// Parses config.json text (`source` names it in messages). Same checks as load_model_config.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// The sampling fields of a model folder's generation_config.json (Hugging Face GenerationConfig: the settings the
// model's authors recommend, which transformers' generate and vLLM use by default). A field that is absent or null
// stays unset; so does a field with a bad value, which `warning` names.
struct GenerationDefaults {
    std::optional<bool> do_sample;
    std::optional<float> temperature, top_p, min_p, repetition_penalty;
    std::optional<int> top_k;
    // "" or one line naming the file and each field whose value was ignored: the wrong type, or out of the range
    // hybrid's options accept (a number that is not finite as a float, top_p or min_p outside [0, 1],
    // repetition_penalty <= 0, top_k beyond 2^30), e.g. "DIR/generation_config.json: field 'temperature' must be a
    // number, found \"hot\": ignored".
    std::string warning;
};

// Reads `dir`/generation_config.json when it exists (otherwise every field is unset). Throws Error(format) naming
// the file for malformed JSON or a top level that is not an object; Error(io) when it cannot be read. A bad field
// value is not an error: see GenerationDefaults::warning.
GenerationDefaults load_generation_defaults(const std::string& dir);

// Parses generation_config.json text (`source` names it in messages). Same checks as load_generation_defaults.
GenerationDefaults parse_generation_defaults(const std::string& json_text, const std::string& source);

}  // namespace hy
