// The Qwen3.5 hybrid model: configuration, weights, per-sequence state and activations, all in one arena that
// the backend allocates once at load; and the forward (model/forward.cpp).
//
// Arena layout (offsets fixed at load, nothing allocated afterwards):
//   weights       matrices in the backend's matrix dtype (the checkpoint dtype on the CPU: bf16 stays bf16 and is
//                 widened to fp32 inside the matmul; FP8 stays FP8, followed by its F32 block scales, and is
//                 dequantized inside the matmul; a compressed-tensors int4 checkpoint's packed weights become Q4
//                 with F32 group scales), small vectors (norms, A_log, dt_bias, conv taps) in F32
//   state         per attention layer: K and V cache [n_slots, n_ctx, Hkv, D] (act dtype)
//                 per Gated DeltaNet layer: conv state [n_slots, K-1, C] (act dtype), recurrent state
//                 [n_slots, Hv, Dk, Dv] (F32)
//   activations   for max_batch_tokens rows; logits [max_logits, vocab] F32
//   workspace     the backend's private scratch
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/quantize.h"

namespace hy {

struct AttentionWeights {
    Matrix q_proj;                  // [Hq * 2D, H]: per head the query then the output gate
    Matrix k_proj;                  // [Hkv * D, H]
    Matrix v_proj;                  // [Hkv * D, H]
    Matrix o_proj;                  // [H, Hq * D]
    const float* q_norm = nullptr;  // [D]
    const float* k_norm = nullptr;  // [D]
};

struct GatedDeltaNetWeights {
    Matrix in_proj_qkv;              // [C, H]
    Matrix in_proj_z;                // [Hv * Dv, H]
    Matrix in_proj_b;                // [Hv, H]
    Matrix in_proj_a;                // [Hv, H]
    Matrix out_proj;                 // [H, Hv * Dv]
    const float* conv1d = nullptr;   // [C, K]
    const float* A_log = nullptr;    // [Hv]
    const float* dt_bias = nullptr;  // [Hv]
    const float* norm = nullptr;     // [Dv]
};

struct MlpWeights {
    Matrix gate_proj;  // [F, H]
    Matrix up_proj;    // [F, H]
    Matrix down_proj;  // [H, F]
};

// A sparse MoE block (docs/QWEN35.md "Mixture-of-experts members").
struct MoeWeights {
    Matrix router;        // [E, H] (mlp.gate)
    MoeExperts experts;   // stacked [E * 2I, H] and [E * H, I]
    SharedExpert shared;  // gate/up [Is, H], down [H, Is], gate [1, H]; gate_proj.rows == 0: none
};

struct LayerWeights {
    LayerKind kind = LayerKind::gated_delta_net;
    bool moe = false;                   // a sparse MoE block instead of the dense MLP
    int state_index = 0;                // index among the layers of its kind (KV cache or GDN state)
    const float* input_norm = nullptr;  // [H]
    const float* post_norm = nullptr;   // [H]
    AttentionWeights attn;              // when kind == full_attention
    GatedDeltaNetWeights gdn;           // when kind == gated_delta_net
    MlpWeights mlp;                     // when !moe
    MoeWeights moe_block;               // when moe
};

struct Weights {
    Matrix embed;                       // [vocab, H]
    Matrix output;                      // [vocab, H]: lm_head, or embed when tied
    const float* final_norm = nullptr;  // [H]
    std::vector<LayerWeights> layers;   // [L]
};

// The dtypes of the loaded weight matrices (the embeddings, lm_head and every layer's linear weights), each with its
// number of weights, most first: what the load made of the checkpoint (FP8 for an FP8 checkpoint or `--quant fp8`,
// Q8 / Q4 for `--quant int8` / `int4`, Q4 for a compressed-tensors int4 checkpoint, else the checkpoint's 16-bit
// type), whatever config.json says.
std::vector<std::pair<DType, int64_t>> weight_dtypes(const Weights& w);
// weight_dtypes as text: "BF16", or "F8_E4M3 96%, BF16 4%" (the shares of the weights, rounded).
std::string weight_dtypes_text(const Weights& w);
// Whether any loaded weight matrix is FP8 (F8_E4M3 or F8_E5M2).
bool has_fp8_weights(const Weights& w);

// Per-layer views of the sequence state.
struct LayerState {
    void* k_cache = nullptr;     // act [n_slots, n_ctx, Hkv, D]
    void* v_cache = nullptr;     // act [n_slots, n_ctx, Hkv, D]
    void* conv_state = nullptr;  // act [n_slots, K-1, C]
    float* ssm_state = nullptr;  // F32 [n_slots, Hv, Dk, Dv]
};

// Activation buffers for up to max_batch_tokens rows (T).
struct Activations {
    void* x = nullptr;               // [T, H] residual stream
    void* xn = nullptr;              // [T, H] normed input of a sub-layer
    void* y = nullptr;               // [T, H] sub-layer output
    void* mix_in = nullptr;          // [T, max(Hq*2D, C)] q_proj output or GDN qkv
    void* k = nullptr;               // [T, Hkv*D]
    void* v = nullptr;               // [T, Hkv*D]
    void* z = nullptr;               // [T, Hv*Dv]
    void* b = nullptr;               // [T, Hv]
    void* a = nullptr;               // [T, Hv]
    void* mix_out = nullptr;         // [T, max(Hq*D, Hv*Dv)]
    void* gate = nullptr;            // [T, F] (dense MLP layers)
    void* up = nullptr;              // [T, F]
    float* route_weights = nullptr;  // [T, k] F32 routing weights (MoE models)
    int32_t* route_ids = nullptr;    // [T, k] I32 chosen experts (MoE models)
    void* last = nullptr;            // [max_logits, H] rows whose logits are wanted
    float* logits = nullptr;         // [max_logits, vocab] F32
    TokenPick* picks = nullptr;      // [max_logits] greedy picks of the logits rows
};

enum class Device { auto_select, cpu, cuda };

struct ModelParams {
    Device device = Device::auto_select;
    int n_threads = 0;           // CPU threads; <= 0: all cores; at most 1024
    int n_ctx = 4096;            // positions per sequence slot
    int n_slots = 1;             // sequence slots
    int max_batch_tokens = 512;  // rows per forward step (prefill chunk)
    int max_logits = 0;          // logits rows per step; <= 0: max(n_slots, 1)
    CudaOptions cuda;            // how the CUDA backend runs (ignored on the CPU)
    // Read config.json alone and fill the weights with deterministic random values made by the backend (uniform,
    // about the scale of a trained model's), for benchmarks of any shape without a checkpoint (vLLM's
    // --load-format dummy). The output is meaningless.
    bool dummy_weights = false;
    // WeightQuant::fp8 (`--quant fp8`): quantize a 16-bit checkpoint's linear weights at load to FP8 e4m3 with
    // 128 x 128 block scales, in the arena (model/quantize.h), the tensors Qwen's FP8 releases keep in BF16 kept
    // 16-bit. An FP8 checkpoint loads as it is with none; with fp8 it is refused (invalid_argument).
    // WeightQuant::int8 / int4 (`--quant int8`, `--quant int4`): quantize the same linear weights at load to Q8 / Q4
    // (group-wise symmetric, an F32 scale per quant_group weights of a row; model/quantize.h). A group that does not
    // divide a quantized matrix's input features, or an FP8 checkpoint: invalid_argument. A compressed-tensors W4A16
    // checkpoint (ModelConfig::int4_packed_weights) loads its packed weights as Q4 with none; any other mode is
    // refused (invalid_argument).
    WeightQuant quant = WeightQuant::none;
    int quant_group = 0;         // int8/int4: weights per scale (int_quant_group_ok); 0: the mode's default
    bool quant_lm_head = false;  // int8/int4: quantize lm_head too (a tied one gets a quantized copy)
    // Called as the weights are read, converted or quantized and uploaded, with the fraction done by weight count
    // (0 < f <= 1, non-decreasing; 1 exactly once, when they are all in the arena); may be empty. Quantizing a large
    // model on the host takes minutes (README "Weight quantization"): programs show it.
    std::function<void(float)> progress;
};

// Throws hy::Error(io) unless dir is a model folder: "the model folder path is empty", "DIR: no such model folder",
// "DIR: not a folder" or "DIR: not a model folder (no config.json)" (a symbolic link loop or a broken link is named
// with its target). The programs call it before they read anything else of the folder (the tokenizer), so a bad -m
// reads the same everywhere.
void require_model_folder(const std::string& dir);

class Model {
public:
    // Loads a Hugging Face folder (config.json, model.safetensors or shards with model.safetensors.index.json).
    // Throws hy::Error: io (missing folder/file), format (malformed file or config), unsupported, model_mismatch
    // (missing or mis-shaped tensor, naming it with expected and found shapes), out_of_memory, backend.
    static std::unique_ptr<Model> load(const std::string& dir, const ModelParams& params);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    const ModelConfig& config() const { return config_; }
    const ModelParams& params() const { return params_; }
    Backend& backend() { return *backend_; }
    const std::string& dir() const { return dir_; }
    size_t arena_bytes() const { return arena_bytes_; }
    size_t weight_bytes() const { return weight_bytes_; }
    size_t state_bytes() const { return state_bytes_; }
    // Empty, or one line naming the checkpoint tensors this config does not use (for the caller to show).
    const std::string& load_warning() const { return load_warning_; }
    int n_slots() const { return params_.n_slots; }
    int n_ctx() const { return params_.n_ctx; }
    int max_batch_tokens() const { return params_.max_batch_tokens; }
    int max_logits() const { return params_.max_logits; }

    // ---- sequences ----
    int seq_len(int slot) const;  // tokens already in the slot's state
    void reset(int slot);         // empties the slot: length 0, conv and recurrent state zeroed

    // Appends `tokens` to sequence `slot` (prefill; a later call continues the same sequence) in steps of at most
    // max_batch_tokens rows. Logits: when all_logits, one row per token ([n, vocab]) else the last token's only.
    // Returns a host view valid until the next call. Throws invalid_argument (bad slot, token id >= vocab),
    // context_full (would pass n_ctx).
    std::span<const float> prefill(int slot, std::span<const int32_t> tokens, bool all_logits = false);
    // Thrown by prefill when the abort hook returns true (checked before every step after the first); the slot then
    // holds part of the tokens: the caller resets it.
    struct Aborted {};
    // While set (fn non-null), prefill polls fn(data) between its steps and stops when it returns non-zero (a long
    // prompt can be interrupted; the signature of hy_generate_params.should_abort).
    void set_prefill_abort(int (*fn)(void*), void* data) {
        abort_fn_ = fn;
        abort_data_ = data;
    }

    // One forward step over an explicit batch (several sequences at once). out_rows lists the batch rows whose
    // logits are wanted (at most max_logits); returns them [n_out, vocab] on the host. Updates sequence lengths.
    std::span<const float> step(const BatchDesc& batch, std::span<const int32_t> out_rows);

    // As step(), but the logits stay on the backend: returns the greedy pick of each out row over ids
    // [0, n_valid) (Backend::argmax_rows; n_valid is clamped to [1, vocab]), so a greedy step moves 8 bytes per
    // row to the host. last_logits() then downloads the rows if the caller needs them after all.
    std::span<const TokenPick> step_greedy(const BatchDesc& batch, std::span<const int32_t> out_rows, int n_valid);
    // The logits rows of the last step() / step_greedy() ([n_out, vocab], host view valid until the next call).
    std::span<const float> last_logits();

    // ---- snapshots: the full state of one slot (length, KV cache up to length, conv and recurrent state) ----
    // The snapshot's size in bytes: a header, then per layer KV rows [0, length) (attention) or conv and recurrent
    // state (Gated DeltaNet). Throws invalid_argument for a slot out of range.
    size_t state_bytes(int slot) const;
    std::vector<uint8_t> save_state(int slot) const;
    // The same bytes written over host ranges in order (their sizes must sum to state_bytes(slot), else
    // invalid_argument): one copy per piece of each range, waited for once; Backend::alloc_host memory (a
    // StateStore) makes them run at the bus's speed.
    void save_state(int slot, std::span<const std::span<uint8_t>> dst) const;
    // Throws format for a truncated or foreign snapshot, model_mismatch when it was made by a model of another
    // shape or dtype, context_full when it holds more tokens than the context; the slot is untouched then.
    void load_state(int slot, std::span<const uint8_t> snapshot);
    // The same from host ranges holding the snapshot's bytes in order (only read).
    void load_state(int slot, std::span<const std::span<uint8_t>> snapshot);

    const Weights& weights() const { return weights_; }

private:
    std::vector<std::pair<char*, size_t>> state_pieces(int slot, size_t len) const;
    int (*abort_fn_)(void*) = nullptr;  // set_prefill_abort
    void* abort_data_ = nullptr;
    Model() = default;
    void forward(const BatchDesc& batch, std::span<const int32_t> out_rows);
    void check_batch(const BatchDesc& batch, std::span<const int32_t> out_rows) const;
    // check_batch, forward (then, with n_valid > 0, the greedy picks of the out rows into act_.picks), then the
    // sequence lengths and the count of logits rows left on the backend. A step of the same shape as the last one
    // (same rows per run, out rows and n_valid) asks the backend to repeat it instead (Backend::repeat_step).
    void advance(const BatchDesc& batch, std::span<const int32_t> out_rows, int n_valid = 0);

    std::string dir_;
    std::string load_warning_;
    ModelConfig config_;
    ModelParams params_;
    std::unique_ptr<Backend> backend_;
    void* arena_ = nullptr;
    size_t arena_bytes_ = 0, weight_bytes_ = 0, state_bytes_ = 0;
    Weights weights_;
    std::vector<LayerState> state_;  // [L]
    Activations act_;
    std::vector<int32_t> seq_len_;       // [n_slots]
    std::vector<float> logits_host_;     // [max_logits, vocab]
    std::vector<TokenPick> picks_host_;  // [max_logits]
    int last_n_out_ = 0;                 // logits rows of the last step, still in act_.logits
    std::vector<float> all_logits_;      // prefill(all_logits = true) output [n, vocab]
    // host-side batch scratch (sized at load; the decode loop allocates nothing)
    std::vector<SeqRun> runs_scratch_;
    std::vector<int32_t> rows_scratch_;
    // advance(): the shape of the last step [n_tokens, n_runs, rows per run..., n_out, out rows..., n_valid] (empty:
    // none that may be repeated) and the current one (capacity reserved at load)
    std::vector<int32_t> last_step_key_, step_key_;
    mutable std::vector<uint8_t> slot_seen_;  // [n_slots] check_batch's "slot twice" marks (all 0 between calls)

    friend struct ModelLoader;
};

}  // namespace hy
