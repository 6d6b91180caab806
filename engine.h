/* engine.h: the public C API of hybrid, an inference engine for Qwen3.5 hybrid models (Gated DeltaNet + gated
 * full attention) that loads Hugging Face checkpoint folders directly.
 *
 * Valid C (C99 and later) and C++. Link with the hybrid_core library (a C++ library: link with a C++ linker).
 *
 * Objects (all opaque, created and freed only through these functions):
 *   hy_model    weights, tokenizer, and the per-sequence state of n_slots sequences (KV cache, conv state and
 *               recurrent state), allocated once at load.
 *   hy_context  one sequence: it owns one of the model's slots, its token history and its last logits row.
 *   hy_sampler  sampling settings, penalty history and an RNG (see model/sampler.h for the exact pipeline).
 *
 * Errors: every function that can fail returns an hy_status (HY_OK = 0) and sets a one-line, thread-local
 * message readable with hy_last_error(). The library never prints and never exits; C++ exceptions never cross
 * this API. Output pointers are written only on success unless stated otherwise.
 *
 * Threads: the functions of one hy_model and of every context/sampler made from it must not run concurrently
 * (the model has one compute backend and one arena). Different models are independent.
 *
 * A typical generation:
 *     hy_model* m; hy_context* c; hy_sampler* s;
 *     hy_model_params mp = hy_model_default_params();
 *     if (hy_model_load("models/tiny", &mp, &m) != HY_OK) { puts(hy_last_error()); return 1; }
 *     hy_context_new(m, NULL, &c);
 *     hy_sampler_params sp = hy_sampler_default_params();
 *     hy_sampler_new(m, &sp, &s);
 *     int32_t ids[256]; int n;
 *     hy_tokenize(m, "def f(x):", -1, 1, ids, 256, &n);
 *     hy_generate_params gp = hy_generate_default_params();
 *     gp.max_tokens = 64; gp.on_token = my_print_callback;
 *     hy_generate(c, s, ids, n, &gp, NULL);
 *     hy_sampler_free(s); hy_context_free(c); hy_model_free(m);
 */
#ifndef HY_ENGINE_H
#define HY_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes (the numeric values of hy::Status in model/common.h) ---------------------------------------- */
typedef enum hy_status {
    HY_OK = 0,
    HY_ERR_INVALID_ARGUMENT = 1, /* a bad parameter (NULL pointer, id out of range, buffer too small, ...) */
    HY_ERR_IO = 2,               /* a file or folder could not be read or written (or exists: see save_file) */
    HY_ERR_FORMAT = 3,           /* a file is malformed (config.json, safetensors, tokenizer.json, snapshot) */
    HY_ERR_UNSUPPORTED = 4,      /* valid input this build does not support (model_type, dtype, device) */
    HY_ERR_MODEL_MISMATCH = 5,   /* missing or mis-shaped tensor; a snapshot saved from another model */
    HY_ERR_OUT_OF_MEMORY = 6,    /* the arena could not be allocated */
    HY_ERR_CONTEXT_FULL = 7,     /* a sequence would grow past n_ctx; no free sequence slot */
    HY_ERR_BACKEND = 8,          /* the compute backend failed (no GPU, CUDA error, ...) */
    HY_ERR_INTERNAL = 9          /* a bug: please report with the message */
} hy_status;

/* The message of the last failed call on this thread ("" when none). Valid until the next failing call on this
 * thread. */
const char* hy_last_error(void);

/* A constant description of a status code ("ok", "invalid argument", "i/o error", ...; "unknown" for other
 * values). */
const char* hy_status_name(int status);

/* The library version, e.g. "0.1.0". */
const char* hy_version(void);

/* ---- model ------------------------------------------------------------------------------------------------------ */
typedef struct hy_model hy_model;
typedef struct hy_context hy_context;
typedef struct hy_sampler hy_sampler;

typedef enum hy_device {
    HY_DEVICE_AUTO = 0, /* CUDA when this build has it and a GPU is present, else the CPU */
    HY_DEVICE_CPU = 1,  /* the fp32 reference backend */
    HY_DEVICE_CUDA = 2  /* fails with HY_ERR_BACKEND / HY_ERR_UNSUPPORTED when not available */
} hy_device;

/* How the weights are stored (hy_model_params.quant). */
typedef enum hy_quant {
    HY_QUANT_NONE = 0, /* as the checkpoint holds them (16-bit, or FP8 for an FP8 checkpoint) */
    HY_QUANT_FP8 = 1,  /* quantize a 16-bit checkpoint at load: linear weights to FP8 e4m3 with 128 x 128 block
                          scales (the format of Qwen's FP8 releases; embeddings, lm_head, norms, in_proj_a/b, the MoE
                          router and shared_expert_gate stay 16-bit). An FP8 checkpoint with it:
                          HY_ERR_INVALID_ARGUMENT. Both backends run FP8 matrices and MoE experts */
    HY_QUANT_INT8 = 2, /* quantize a 16-bit checkpoint at load: the same linear weights to int8, group-wise symmetric
                          (an F32 scale per quant_group weights of a row, default 64; codes in [-127, 127]); the CPU
                          runs them with int8 activations (per row and group), CUDA with bf16 ones (MoE experts
                          included). About 0.53x the 16-bit bytes */
    HY_QUANT_INT4 = 3  /* the same to int4 (default group 32; codes in [-8, 7], two per byte): about 0.31x the 16-bit
                          bytes. Both: HY_ERR_INVALID_ARGUMENT on an FP8 checkpoint, for a quantized matrix whose input
                          features are not a multiple of 64, or for a group that does not divide them */
} hy_quant;

typedef struct hy_model_params {
    hy_device device;     /* default HY_DEVICE_AUTO */
    int n_threads;        /* CPU threads; <= 0: all cores (default 0); at most 1024 */
    int n_ctx;            /* positions per sequence, prompt plus generated tokens (default 4096; 0: the context
                             the model was trained for, config.json max_position_embeddings) */
    int n_slots;          /* sequences that can exist at once = the most live hy_contexts (default 1) */
    int max_batch_tokens; /* tokens per forward step during prefill (default 512) */
    int cuda_graphs;      /* CUDA: 1 (default) replays small and decode steps as CUDA graphs; 0 launches every kernel
                             one by one (the same kernels and results, slower: for profilers and debugging) */
    int dummy_weights;    /* 1: read config.json (and the tokenizer) alone and fill the weights with deterministic
                             random values, for benchmarks of a shape without its checkpoint; output is meaningless
                             (default 0) */
    int quant;            /* a hy_quant: HY_QUANT_NONE (default), HY_QUANT_FP8, HY_QUANT_INT8 or HY_QUANT_INT4 */
    int quant_group;      /* HY_QUANT_INT8/INT4: weights per scale, 32 or a multiple of 64 up to 1024; 0 (default): the
                             mode's default (README "Weight quantization") */
    int quant_lm_head;    /* HY_QUANT_INT8/INT4: 1 quantizes lm_head too (a tied lm_head gets a quantized copy of the
                             embeddings); 0 (default) keeps it 16-bit. 1 with another quant: HY_ERR_INVALID_ARGUMENT */
    /* May be NULL (default). Called on the loading thread as the weights are read, converted or quantized and put in
       place, with the fraction done by weight count: 0 < fraction <= 1, non-decreasing, 1 exactly once (all the
       weights are in place; the load may still fail after it). Quantizing a large model at load takes minutes. */
    void (*progress)(float fraction, void* user_data);
    void* progress_user_data; /* passed to progress */
} hy_model_params;

hy_model_params hy_model_default_params(void);

/* Parses a --quant value: "none", "fp8", "int8", "int4", or "int8:G" / "int4:G" with a group size G (32 or a multiple
 * of 64 up to 1024), into *quant (a hy_quant) and *group (0 when none is given: the default). HY_OK, or
 * HY_ERR_INVALID_ARGUMENT (NULL argument or any other value; hy_last_error() names it and the choices). */
int hy_quant_parse(const char* value, int* quant, int* group);

/* Loads a Hugging Face folder: config.json, model.safetensors (or shards with model.safetensors.index.json),
 * tokenizer.json, optionally tokenizer_config.json and generation_config.json. On success *out owns the model.
 * Errors: HY_ERR_INVALID_ARGUMENT (NULL argument, n_ctx < 0 or 0 without max_position_embeddings,
 * max_batch_tokens <= 0, n_slots outside [1, 4096], n_threads > 1024, an unknown quant, a quant other than NONE on an
 * FP8 checkpoint, a quant_group that is not 0 or does not fit: not 32 or a multiple of 64 up to 1024, given without
 * INT8/INT4, or not dividing a quantized matrix's input features; quant_lm_head other than 0 or 1, or 1 without
 * INT8/INT4), HY_ERR_IO (missing folder or file, a folder without config.json), HY_ERR_FORMAT, HY_ERR_UNSUPPORTED,
 * HY_ERR_MODEL_MISMATCH (tensor missing or of the wrong shape), HY_ERR_OUT_OF_MEMORY (also before anything is allocated
 * when the arena is larger than the machine's memory: the message gives the sizes and the largest context that fits),
 * HY_ERR_BACKEND. On the CPU the state's pages become resident only as the sequences grow. */
int hy_model_load(const char* dir, const hy_model_params* params, hy_model** out);

/* Frees the model: at once when no context, sampler or batch made from it is left, else when the last of them is
 * freed (they stay usable until then). NULL is allowed. */
void hy_model_free(hy_model* model);

/* Ids [0, n_vocab) can be tokens (the tokenizer's size); samplers never pick ids >= n_vocab, nor ids below it that
 * the tokenizer leaves unassigned. */
int hy_model_n_vocab(const hy_model* model);
/* Length of a logits row (the embedding's rows; may exceed n_vocab). */
int hy_model_n_logits(const hy_model* model);
/* Positions per sequence (the n_ctx it was loaded with; the trained context for n_ctx 0). */
int hy_model_n_ctx(const hy_model* model);
/* Positions the model was trained for (config.json max_position_embeddings); 0 when the config does not say. */
int hy_model_n_ctx_train(const hy_model* model);
/* "cpu" or "cuda": the backend in use. */
const char* hy_model_backend(const hy_model* model);
/* The device in a few words: "CPU, 8 threads" or "NVIDIA H200 (compute capability 9.0)"; "" for NULL. Valid while
 * the model lives. */
const char* hy_model_device(const hy_model* model);
/* The loaded weight matrices' formats (the embeddings, lm_head and every linear layer's weights) with their shares
 * of the weights, most first: "BF16", or "Q4 93%, BF16 7%" for --quant int4 or a compressed-tensors int4
 * checkpoint, "F8_E4M3 96%, BF16 4%" for FP8. Valid while the model lives; "" for NULL. */
const char* hy_model_weights(const hy_model* model);
/* The most bytes of text one token stands for (its string in tokenizer.json, at least 1): a text of n bytes has at
 * least n / (3 * this) tokens (3: Unicode normalization may shrink the text, at most threefold), so a program can
 * refuse a prompt far too long for the context without tokenizing it. 0 for NULL. */
int hy_model_max_token_bytes(const hy_model* model);
/* Bytes held by the model's arena (weights + state + activations). */
size_t hy_model_arena_bytes(const hy_model* model);
/* A 64-bit fingerprint of the checkpoint (64-bit FNV-1a of config.json, tokenizer.json and samples of the weight
 * files), mixed with the weight quantization chosen at load (quant, its group and quant_lm_head; none leaves the
 * folder's value); snapshots carry it and are refused by a model with another fingerprint, so a state saved with
 * --quant int4 does not load into the 16-bit model. Builds before snapshot version 3 computed other values for the
 * same folder. */
uint64_t hy_model_fingerprint(const hy_model* model);
/* "" or one line of what the load skipped: the checkpoint's tensors that config.json does not use, as transformers
 * reports unexpected keys (a multi-token-prediction head mtp.* and a vision tower model.visual.* are not counted; a
 * layer past num_hidden_layers fails hy_model_load instead), and the fields of generation_config.json whose value
 * was ignored (the wrong type or out of range: hy_model_sampler_defaults leaves them out), separated by "; ".
 * Valid while the model lives; "" for NULL. */
const char* hy_model_load_warning(const hy_model* model);

/* The end-of-sequence set: the union of config.json eos_token_id, generation_config.json eos_token_id and the
 * tokenizer's eos_token. Writes up to cap ids to out (out may be NULL when cap is 0) and returns the set's size. */
int hy_model_eos_ids(const hy_model* model, int32_t* out, int cap);
/* 1 when id is in the end-of-sequence set, else 0. */
int hy_model_is_eos(const hy_model* model, int32_t id);

/* ---- tokenizer -------------------------------------------------------------------------------------------------- */
/* UTF-8 text (len bytes; len < 0: NUL-terminated) -> token ids. Invalid UTF-8 is replaced by U+FFFD, not an
 * error. parse_special != 0: special tokens written in the text (e.g. "<|im_start|>") become their ids; 0: they
 * are encoded as plain text. No BOS is added. *n_out receives the number of ids even when cap is too small; then
 * nothing is written and HY_ERR_INVALID_ARGUMENT is returned (call again with a buffer of *n_out ids). */
int hy_tokenize(const hy_model* model, const char* text, ptrdiff_t len, int parse_special, int32_t* out, int cap,
                int* n_out);

/* Token ids -> UTF-8 text (invalid UTF-8 from partial characters becomes U+FFFD). skip_special != 0 drops special
 * tokens. Writes the text and a terminating NUL to buf when cap > its length; *n_out receives the length without
 * the NUL in every case; returns HY_ERR_INVALID_ARGUMENT when buf is too small (nothing written) or an id is not a
 * token. */
int hy_detokenize(const hy_model* model, const int32_t* ids, int n_ids, int skip_special, char* buf, size_t cap,
                  size_t* n_out);

/* ---- chat format (ChatML, as model/chat.h: Qwen2/Qwen3/Qwen3.5 instruct models) ------------------------------ */
typedef enum hy_thinking {
    HY_THINK_DISABLED = 0,     /* generation prompt ends with an empty "<think>\n\n</think>\n\n" block */
    HY_THINK_ENABLED = 1,      /* generation prompt ends with "<think>\n" (the model reasons first) */
    HY_THINK_MODEL_DECIDES = 2 /* plain ChatML generation prompt */
} hy_thinking;

typedef struct hy_chat_message {
    const char* role;    /* "system", "user" or "assistant" */
    const char* content; /* UTF-8, inserted verbatim */
} hy_chat_message;

/* Renders a whole conversation: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then (when
 * add_generation_prompt) "<|im_start|>assistant\n" and the think prefix of `thinking` (hy_thinking). Output as
 * hy_detokenize: NUL-terminated text in buf when cap > its length, *n_out = its length; HY_ERR_INVALID_ARGUMENT
 * when buf is too small or a role is unknown; HY_ERR_UNSUPPORTED when the tokenizer has no ChatML tokens. */
int hy_chat_render(const hy_model* model, const hy_chat_message* messages, int n_messages, int add_generation_prompt,
                   int thinking, char* buf, size_t cap, size_t* n_out);

/* The text to prefill after an answer made by hy_generate (which never keeps the end-of-turn id in the context):
 * "<|im_end|>\n" then the messages and the generation prompt. The sequence then equals the rendering of the whole
 * conversation with the answer as an assistant message whose content is the think prefix plus the answer text.
 * Output as hy_chat_render. */
int hy_chat_continue(const hy_model* model, const hy_chat_message* messages, int n_messages, int thinking, char* buf,
                     size_t cap, size_t* n_out);

/* The end-of-turn id (<|im_end|>), or -1 when the tokenizer has no chat format. */
int32_t hy_chat_end_of_turn_id(const hy_model* model);

/* ---- contexts (sequences) --------------------------------------------------------------------------------------- */
typedef struct hy_context_params {
    int slot; /* sequence slot to use, or -1 (default): the first free one */
} hy_context_params;

hy_context_params hy_context_default_params(void);

/* Creates a context on a free sequence slot (params may be NULL: defaults). The sequence starts empty.
 * Errors: HY_ERR_CONTEXT_FULL (every slot is taken, or the requested one is), HY_ERR_INVALID_ARGUMENT. */
int hy_context_new(hy_model* model, const hy_context_params* params, hy_context** out);

/* Frees the context and returns its slot to the model. NULL is allowed. */
void hy_context_free(hy_context* ctx);

/* Empties the sequence: no tokens, state zeroed, no logits. */
int hy_context_reset(hy_context* ctx);

/* Tokens in the sequence's history: every prefilled id plus every generated id that was kept (see hy_generate).
 * The ids not yet run through the model (at most one, the last generated id) are fed by the next
 * hy_prefill/hy_decode/hy_generate. */
int hy_context_n_tokens(const hy_context* ctx);

/* Copies up to cap ids of the history to out; returns the history length. */
int hy_context_tokens(const hy_context* ctx, int32_t* out, int cap);

/* Appends n ids to the sequence and runs them through the model (prefill, in steps of max_batch_tokens); then the
 * last token's logits are available (hy_context_logits). n may be 0 (only pending ids are fed).
 * Errors: HY_ERR_INVALID_ARGUMENT (an id outside [0, n_logits); nothing is appended), HY_ERR_CONTEXT_FULL (the
 * sequence would pass n_ctx; nothing is appended), HY_ERR_BACKEND (the sequence is reset: its state would be
 * partial). */
int hy_prefill(hy_context* ctx, const int32_t* ids, int n);

/* Appends one id and runs one decode step: hy_prefill(ctx, &id, 1). */
int hy_decode(hy_context* ctx, int32_t id);

/* One decode step for n contexts of the same model at once (one token each, batched into a single forward;
 * n <= the model's n_slots, each context at most once). Same errors as hy_prefill; on error no context changes. */
int hy_decode_batch(hy_context* const* ctxs, const int32_t* ids, int n);

/* The logits row of the last token run through the model: F32 [n_logits] (raw, before any sampling step), or NULL
 * when there is none (empty sequence, after reset, or after a generated id was appended but not yet fed).
 * *n_logits (may be NULL) receives the row length. Valid until the next call that changes this context. */
const float* hy_context_logits(const hy_context* ctx, int* n_logits);

/* ---- snapshots: the whole sequence (history, KV cache, conv and recurrent state, last logits) ----------------- */
/* Serializes the context. With buf == NULL or cap too small, only *n_out (the size needed) is set and
 * HY_OK / HY_ERR_INVALID_ARGUMENT returned respectively. The format (model/snapshot.h) carries a version, the model
 * fingerprint and a checksum of its contents. This build writes and reads version 3 only: snapshots of builds
 * before it (versions 1 and 2, whose fingerprint was computed with a wrong FNV-1a offset basis) are refused with
 * HY_ERR_FORMAT, "snapshot version 2, this build reads version 3 (...)". */
int hy_state_save(const hy_context* ctx, void* buf, size_t cap, size_t* n_out);

/* Restores a snapshot made by hy_state_save / hy_state_save_file into ctx (any slot). Errors: HY_ERR_INVALID_ARGUMENT
 * (NULL ctx or buf; the context is unchanged), HY_ERR_FORMAT (not a snapshot, truncated, damaged: the checksum does
 * not match, another version: see hy_state_save), HY_ERR_MODEL_MISMATCH (saved from another model: fingerprint or
 * shapes differ), HY_ERR_CONTEXT_FULL (more tokens than n_ctx). On those three the context is left empty (reset). */
int hy_state_load(hy_context* ctx, const void* buf, size_t n);

/* hy_state_save to a file. overwrite == 0 refuses an existing path (HY_ERR_IO, message "... exists"). An existing
 * path that is not a regular file (symbolic link, device, directory, FIFO) is refused even with overwrite. The
 * snapshot is written to a new, uniquely named file PATH.XXXXXX in the same folder (no other file is touched),
 * synced, then linked or renamed onto PATH, so a failure never leaves a half-written PATH. */
int hy_state_save_file(const hy_context* ctx, const char* path, int overwrite);

/* hy_state_load from a file. HY_ERR_INVALID_ARGUMENT for a NULL or empty path, HY_ERR_IO when it cannot be read or
 * is not a regular file; the fixed header is checked before the rest is read, and a file larger than
 * hy_state_size_max() is refused (HY_ERR_FORMAT, or HY_ERR_MODEL_MISMATCH for another model's). In those cases the
 * context is left unchanged; else as hy_state_load. */
int hy_state_load_file(hy_context* ctx, const char* path);

/* An upper bound of the size of any snapshot of a context of this model (a full context); 0 for NULL. */
size_t hy_state_size_max(const hy_context* ctx);

/* ---- sampling (formulas and order: model/sampler.h) ------------------------------------------------------------ */
typedef struct hy_sampler_params {
    float temperature;       /* <= 0: greedy (default 0.8) */
    int top_k;               /* <= 0: off (default 40) */
    float top_p;             /* >= 1: off (default 0.95) */
    float min_p;             /* <= 0: off (default 0.05) */
    float repeat_penalty;    /* 1: off (default 1.0); > 0 */
    int repeat_last_n;       /* penalty window in tokens; 0: none, -1: the whole context (default 64) */
    float presence_penalty;  /* default 0 */
    float frequency_penalty; /* default 0 */
    uint64_t seed;           /* RNG seed (default 0xC0FFEE) */
} hy_sampler_params;

hy_sampler_params hy_sampler_default_params(void);

/* The fields of hy_sampler_params that hy_model_sampler_defaults can take from a model folder. */
typedef enum hy_sampler_field {
    HY_SAMPLER_TEMPERATURE = 1,
    HY_SAMPLER_TOP_K = 2,
    HY_SAMPLER_TOP_P = 4,
    HY_SAMPLER_MIN_P = 8,
    HY_SAMPLER_REPEAT_PENALTY = 16,
    HY_SAMPLER_REPEAT_LAST_N = 32
} hy_sampler_field;

/* The sampling the model folder recommends: hy_sampler_default_params() with what its generation_config.json gives
 * applied, as vLLM applies it by default: "do_sample": false makes it greedy (temperature 0); "temperature",
 * "top_k", "top_p", "min_p" and "repetition_penalty" are taken as given (top_k 0 and top_p 1 are off, as here); a
 * repetition_penalty also sets repeat_last_n to -1 (the whole context, as transformers and vLLM apply it). Fields
 * the file leaves out keep hy_sampler_default_params()'s values (transformers would sample only with "do_sample":
 * true, and has its own defaults for the rest). Returns a mask of the hy_sampler_field values taken (0 without a
 * generation_config.json or sampling fields in it), or -1 when model or out is NULL. The file is read (and checked)
 * by hy_model_load; a field with a bad value is left out and named by hy_model_load_warning. */
int hy_model_sampler_defaults(const hy_model* model, hy_sampler_params* out);

/* Creates a sampler for the model's vocabulary (params may be NULL: defaults). Errors: HY_ERR_INVALID_ARGUMENT for
 * an out-of-range parameter (repeat_penalty <= 0, repeat_last_n < -1, a negative top_p, min_p above 1, a
 * temperature or penalty that is NaN or infinite). */
int hy_sampler_new(const hy_model* model, const hy_sampler_params* params, hy_sampler** out);
void hy_sampler_free(hy_sampler* sampler);

/* Samples one id from the context's current logits (HY_ERR_INVALID_ARGUMENT when it has none, and while its last id
 * is pending, as after hy_generate: feed it first; HY_ERR_BACKEND when no id that may be sampled has a finite
 * logit: NaN or inf weights or activations). *logprob (may be NULL) receives log p(id) under the log-softmax of
 * the raw logits over ids [0, n_vocab), natural log. Does not append the id to the context nor to the penalty
 * history (see hy_sampler_accept). */
int hy_sampler_sample(hy_sampler* sampler, const hy_context* ctx, int32_t* id, float* logprob);

/* Records an id in the penalty history (an id outside [0, hy_model_n_vocab) is ignored). */
void hy_sampler_accept(hy_sampler* sampler, int32_t id);

/* Clears the penalty history and restarts the RNG from the seed (the same draws again). */
void hy_sampler_reset(hy_sampler* sampler);

/* Clears the penalty history only; the RNG goes on from where it is (a new conversation gets new draws). */
void hy_sampler_clear_history(hy_sampler* sampler);

/* Changes the seed and restarts the RNG. */
void hy_sampler_set_seed(hy_sampler* sampler, uint64_t seed);

/* ---- generation ------------------------------------------------------------------------------------------------- */
typedef enum hy_stop_reason {
    HY_STOP_NONE = 0,         /* not stopped (an error happened) */
    HY_STOP_EOS = 1,          /* an id of the end-of-sequence set (or of stop_ids) was sampled */
    HY_STOP_STRING = 2,       /* the decoded text reached a stop string */
    HY_STOP_MAX_TOKENS = 3,   /* max_tokens ids were generated */
    HY_STOP_CONTEXT_FULL = 4, /* the sequence reached n_ctx */
    HY_STOP_CALLBACK = 5,     /* the token callback returned non-zero */
    HY_STOP_CANCELLED = 6     /* a batch request was cancelled (hy_batch_cancel) */
} hy_stop_reason;

/* A short constant name: "eos", "stop string", "max tokens", "context full", "callback", "cancelled", "none". */
const char* hy_stop_reason_name(int reason);

/* One generated token as given to the callback. */
typedef struct hy_token_info {
    int32_t id;       /* the id; -1 for the final call that only delivers held-back text */
    float logprob;    /* log p(id): log-softmax of the raw logits over [0, n_vocab), natural log; 0 when id < 0 */
    const char* text; /* the text that became final with this token (UTF-8, NUL-terminated, may be empty) */
    size_t text_len;  /* its length in bytes */
    int index;        /* 0 for the first generated token */
} hy_token_info;

/* Called once per generated id (not for an end-of-sequence id and not for the id that completes a stop string)
 * and, when text was held back, once more at the end with id -1. Text is held back while it could still be the
 * start of a stop string or an incomplete UTF-8 character, so the concatenated texts are exactly the output (the
 * stop string and what follows it excluded). Return non-zero to stop generation (HY_STOP_CALLBACK; the id just
 * given is kept in the history). The info pointer is valid only during the call. This callback and should_abort
 * must not change the generating context: hy_prefill, hy_decode, hy_decode_batch, hy_generate, hy_context_reset
 * and hy_state_load(_file) on it return HY_ERR_INVALID_ARGUMENT there, and it must not be freed. */
typedef int (*hy_token_callback)(const hy_token_info* token, void* user_data);

typedef struct hy_generate_params {
    int max_tokens;          /* ids to generate at most; < 0: until EOS or the context is full (default -1) */
    const char* const* stop; /* n_stop stop strings (UTF-8, non-empty), matched on the decoded text */
    int n_stop;
    int skip_special;        /* decode special tokens as empty text (default 1) */
    int ignore_eos;          /* do not stop on the end-of-sequence set (default 0) */
    const int32_t* stop_ids; /* n_stop_ids more ids that end generation like the end-of-sequence set (each in [0,
                                the model's vocab_size), else HY_ERR_INVALID_ARGUMENT) */
    int n_stop_ids;
    hy_token_callback on_token;           /* may be NULL */
    void* user_data;                      /* passed to on_token and should_abort */
    int (*should_abort)(void* user_data); /* may be NULL; polled between the prompt's prefill steps (of
                                      max_batch_tokens ids): non-zero stops the prefill, resets the sequence (its
                                      history and state are cleared: they would hold part of the prompt) and ends
                                      the call with HY_OK, HY_STOP_CALLBACK, n_prompt 0 and nothing generated */
} hy_generate_params;

hy_generate_params hy_generate_default_params(void);

typedef struct hy_generate_result {
    int stop_reason;    /* hy_stop_reason */
    int n_prompt;       /* ids run through prefill by this call (the given ids plus any pending id) */
    int n_generated;    /* ids sampled and given to the callback (EOS / stop-completing id not counted) */
    double prompt_ms;   /* wall time of the prefill, milliseconds */
    double generate_ms; /* wall time of the sampling/decode loop, milliseconds */
    int n_decoded;      /* decode steps in that loop (generated ids fed back; the first id comes from the prompt's
                           logits): the decode rate is n_decoded / generate_ms, as llama.cpp counts "runs" */
} hy_generate_result;

/* Prefills `prompt` (n_prompt ids, may be 0 to continue from the current logits), then samples and decodes until
 * a stop condition. The sampler's penalty history receives every generated id that is kept (below; not the
 * prompt: call hy_sampler_accept yourself for that). History rules: a generated id given to the callback is kept (the
 * last one is pending: fed by the next call); an end-of-sequence id and the id completing a stop string are dropped, so
 * a chat can append its own end-of-turn text. Reaching n_ctx is a stop (HY_STOP_CONTEXT_FULL), not an error; a
 * prompt that does not fit returns HY_ERR_CONTEXT_FULL before anything runs. result may be NULL (written on
 * success only). After it returns the last generated id is pending: hy_context_logits gives NULL and
 * hy_sampler_sample refuses until it is fed (hy_prefill(ctx, NULL, 0), or the next hy_generate).
 * Errors: as hy_prefill; HY_ERR_INVALID_ARGUMENT (n_prompt == 0 with no logits, empty stop string);
 * HY_ERR_BACKEND when a logits row has no finite value to sample from (NaN or inf weights or activations). */
int hy_generate(hy_context* ctx, hy_sampler* sampler, const int32_t* prompt, int n_prompt,
                const hy_generate_params* params, hy_generate_result* result);

/* ---- batched generation (continuous batching) ---------------------------------------------------------------------
 * Many sequences generated together, e.g. reinforcement-learning rollouts or parallel requests. Requests wait in a
 * queue until one of the batch's sequence slots is free; each hy_batch_step() runs ONE forward over every active
 * sequence (a decode row for each generating sequence plus prompt chunks of newly admitted ones, at most the
 * model's max_batch_tokens rows) and samples one token for each sequence whose logits came out. Finished
 * sequences give their slot back at once; new requests may be submitted between steps. A reused slot is reset,
 * so each request is computed exactly as if it ran alone (bitwise on the CPU backend). */
typedef struct hy_batch hy_batch;

typedef struct hy_request_params {
    int max_tokens;             /* ids to generate at most, >= 0 (0: prefill only; default 128); more than the
                                   context can hold ends with HY_STOP_CONTEXT_FULL */
    hy_sampler_params sampling; /* this request's sampling, seed included (default: hy_sampler_default_params) */
    int ignore_eos;             /* do not stop at the end-of-sequence set (default 0) */
    int accept_prompt;          /* the prompt ids enter the penalty history, as the hybrid CLI does (default 1) */
    const int32_t* stop_ids;    /* n_stop_ids more ids that end the request like the end-of-sequence set (copied
                                   by hy_batch_submit; each in [0, the model's vocab_size), else
                                   HY_ERR_INVALID_ARGUMENT; default none) */
    int n_stop_ids;
} hy_request_params;

hy_request_params hy_request_default_params(void);

/* Creates a batch generator over n_slots free sequence slots of the model (n_slots <= 0: every free slot). The
 * slots stay taken (hy_context_new cannot use them) until hy_batch_free.
 * Errors: HY_ERR_CONTEXT_FULL (fewer free slots than asked, or none), HY_ERR_INVALID_ARGUMENT. */
int hy_batch_new(hy_model* model, int n_slots, hy_batch** out);

/* Frees the generator and gives its slots back. NULL is allowed. */
void hy_batch_free(hy_batch* batch);

/* Queues a prompt (n_prompt >= 1 ids; params may be NULL: defaults); *id receives the request id (0, 1, 2, ... in
 * submission order). Errors: HY_ERR_INVALID_ARGUMENT (empty prompt, id outside [0, n_logits), bad sampling
 * values, max_tokens < 0), HY_ERR_CONTEXT_FULL (the prompt leaves no room in n_ctx). */
int hy_batch_submit(hy_batch* batch, const int32_t* prompt, int n_prompt, const hy_request_params* params, int* id);

/* One step (see above). *n_running (may be NULL) receives the number of requests still queued or generating;
 * 0 means every request is done (then the step did nothing). Errors: HY_ERR_BACKEND and other model errors. */
int hy_batch_step(hy_batch* batch, int* n_running);

/* Stops request id: a queued one never runs, a running one ends after the current step (HY_STOP_CANCELLED). */
int hy_batch_cancel(hy_batch* batch, int id);

/* The output of request id so far. *tokens and *logprobs (each may be NULL) point to its n generated ids and
 * their log-probabilities (log-softmax of the raw logits over [0, n_vocab), natural log), valid until the next
 * hy_batch_step/hy_batch_free; when it stopped on the end-of-sequence set the last id is that EOS id.
 * *stop_reason: an hy_stop_reason (HY_STOP_NONE while running); *done: 1 when finished. Any out pointer may be
 * NULL. Errors: HY_ERR_INVALID_ARGUMENT (no such request). */
int hy_batch_result(const hy_batch* batch, int id, const int32_t** tokens, const float** logprobs, int* n,
                    int* stop_reason, int* done);

#ifdef __cplusplus
}
#endif

#endif /* HY_ENGINE_H */
