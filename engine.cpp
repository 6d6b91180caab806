// engine.cpp: engine.h (the C API) over model/: argument checks, the C structs converted to and from model/'s
// types, and calls (the generation loop is model/generate, snapshots model/snapshot, files model/file_io). Every
// entry point catches hy::Error and std::exception and turns them into an hy_status plus the thread-local
// hy_last_error() message.
#include "engine.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/chat.h"
#include "model/common.h"
#include "model/file_io.h"
#include "model/fnv.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/sampler.h"
#include "model/sequence.h"
#include "model/snapshot.h"
#include "model/tokenizer.h"

using hy::Error;
using hy::Status;

struct hy_model {
    std::unique_ptr<hy::Model> model;
    std::unique_ptr<hy::Tokenizer> tok;
    std::vector<int32_t> eos;        // the end-of-sequence set, sorted, unique
    std::vector<int32_t> holes;      // ids in [0, n_vocab) the tokenizer does not assign (never sampled)
    std::vector<uint8_t> slot_used;  // [n_slots]
    int n_vocab = 0;                 // sampleable ids
    int n_logits = 0;                // logits row length
    uint64_t fingerprint = 0;
    hy::GenerationDefaults generation;       // generation_config.json's sampling fields
    std::string load_warning;                // hy_model_load_warning
    std::string device;                      // hy_model_device
    std::string weights;                     // hy_model_weights
    int max_token_bytes = 1;                 // hy_model_max_token_bytes
    std::unique_ptr<hy::ChatTemplate> chat;  // made on first use (throws unsupported without ChatML tokens)
    const hy::ChatTemplate& chat_template() {
        if (!chat) chat = std::make_unique<hy::ChatTemplate>(hy::ChatTemplate::for_tokenizer(*tok));
        return *chat;
    }
    // The contexts, samplers and batches made from it and not yet freed, and whether hy_model_free was called: the
    // model is deleted when both say it is no longer used (a batch freed after its model read freed memory).
    // (mutable: a sampler is made from a const model)
    mutable std::mutex owners_mutex;
    mutable int n_owned = 0;
    bool free_called = false;
};

namespace {

// A context, sampler or batch of m was made (adopt) or freed (release: deletes m after hy_model_free when it was
// the last).
void adopt(const hy_model* m) {
    std::lock_guard<std::mutex> lk(m->owners_mutex);
    m->n_owned++;
}
void release(const hy_model* m) {
    bool last = false;
    {
        std::lock_guard<std::mutex> lk(m->owners_mutex);
        last = --m->n_owned == 0 && m->free_called;
    }
    if (last) delete m;
}

}  // namespace

// A sequence (slot, history, pending ids, last logits: model/sequence.h) of model m.
struct hy_context : hy::Sequence {
    hy_model* m = nullptr;
    bool generating = false;  // inside hy_generate (its callbacks may not change this context)
};

struct hy_sampler {
    const hy_model* m = nullptr;
    std::unique_ptr<hy::Sampler> s;
};

namespace {

thread_local std::string g_last_error;

int fail(Status s, const std::string& msg) {
    g_last_error = msg;
    return int(s);
}

// Runs f() and converts exceptions to status codes.
template <class F>
int guard(F&& f) {
    try {
        return f();
    } catch (const Error& e) {
        return fail(e.status(), e.what());
    } catch (const std::bad_alloc&) {
        return fail(Status::out_of_memory, "out of host memory");
    } catch (const std::exception& e) {
        return fail(Status::internal, std::string("internal error: ") + e.what());
    } catch (...) {
        return fail(Status::internal, "internal error: unknown exception");
    }
}

#define HY_CHECK_ARG(cond, msg)                                  \
    do {                                                         \
        if (!(cond)) return fail(Status::invalid_argument, msg); \
    } while (0)

// "stop_ids[i] = id is out of range [0, n_logits)" for the first such id, else "".
std::string stop_id_error(const int32_t* ids, int n, int n_logits) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_logits)
            return "stop_ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is out of range [0, " +
                   std::to_string(n_logits) + ")";
    return "";
}

hy::SamplerParams to_core(const hy_sampler_params& p) {
    hy::SamplerParams s;
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.repeat_penalty = p.repeat_penalty;
    s.repeat_last_n = p.repeat_last_n;
    s.presence_penalty = p.presence_penalty;
    s.frequency_penalty = p.frequency_penalty;
    s.seed = p.seed;
    return s;
}

int stop_reason(hy::FinishReason r) {
    switch (r) {
        case hy::FinishReason::none: return HY_STOP_NONE;
        case hy::FinishReason::eos: return HY_STOP_EOS;
        case hy::FinishReason::max_tokens: return HY_STOP_MAX_TOKENS;
        case hy::FinishReason::context_full: return HY_STOP_CONTEXT_FULL;
        case hy::FinishReason::cancelled: return HY_STOP_CANCELLED;
        case hy::FinishReason::stop_string: return HY_STOP_STRING;
        case hy::FinishReason::callback: return HY_STOP_CALLBACK;
    }
    return HY_STOP_NONE;
}

}  // namespace

extern "C" {

const char* hy_last_error(void) { return g_last_error.c_str(); }

const char* hy_status_name(int status) {
    if (status < 0 || status > int(Status::internal)) return "unknown";
    return hy::status_name(Status(status));
}

const char* hy_version(void) {
#ifdef HY_VERSION
    return HY_VERSION;
#else
    return "0.0.0";
#endif
}

// ---- model ----
hy_model_params hy_model_default_params(void) {
    hy_model_params p;
    p.device = HY_DEVICE_AUTO;
    p.n_threads = 0;
    p.n_ctx = 4096;
    p.n_slots = 1;
    p.max_batch_tokens = 512;
    p.cuda_graphs = 1;
    p.dummy_weights = 0;
    p.quant = HY_QUANT_NONE;
    p.quant_group = 0;
    p.quant_lm_head = 0;
    p.progress = nullptr;
    p.progress_user_data = nullptr;
    return p;
}

int hy_quant_parse(const char* value, int* quant, int* group) {
    return guard([&] {
        HY_CHECK_ARG(value && quant && group, "hy_quant_parse: value, quant and group must not be NULL");
        const hy::WeightQuant q = hy::parse_weight_quant(value, group);
        *quant = q == hy::WeightQuant::fp8    ? HY_QUANT_FP8
                 : q == hy::WeightQuant::int8 ? HY_QUANT_INT8
                 : q == hy::WeightQuant::int4 ? HY_QUANT_INT4
                                              : HY_QUANT_NONE;
        return int(HY_OK);
    });
}

int hy_model_load(const char* dir, const hy_model_params* params, hy_model** out) {
    return guard([&] {
        HY_CHECK_ARG(dir && out, "hy_model_load: dir and out must not be NULL");
        const hy_model_params p = params ? *params : hy_model_default_params();
        HY_CHECK_ARG(p.n_ctx >= 0, "n_ctx must be >= 0 (0: the trained context), got " + std::to_string(p.n_ctx));
        HY_CHECK_ARG(p.n_slots > 0, "n_slots must be > 0, got " + std::to_string(p.n_slots));
        HY_CHECK_ARG(p.max_batch_tokens > 0, "max_batch_tokens must be > 0, got " + std::to_string(p.max_batch_tokens));
        // (read as the int a C caller stored: an enum object holding another value is undefined behaviour in C++)
        int device = 0;
        static_assert(sizeof device == sizeof p.device, "hy_device is an int");
        std::memcpy(&device, &p.device, sizeof device);
        HY_CHECK_ARG(device == HY_DEVICE_AUTO || device == HY_DEVICE_CPU || device == HY_DEVICE_CUDA,
                     "unknown device " + std::to_string(device));
        HY_CHECK_ARG(p.quant >= HY_QUANT_NONE && p.quant <= HY_QUANT_INT4,
                     "unknown weight quantization " + std::to_string(int(p.quant)) +
                         " (HY_QUANT_NONE 0, HY_QUANT_FP8 1, HY_QUANT_INT8 2, HY_QUANT_INT4 3)");
        HY_CHECK_ARG(p.quant_group == 0 || ((p.quant == HY_QUANT_INT8 || p.quant == HY_QUANT_INT4) &&
                                            hy::int_quant_group_ok(p.quant_group)),
                     "quant_group must be 0 or, with HY_QUANT_INT8/INT4, 32 or a multiple of 64 up to 1024, got " +
                         std::to_string(p.quant_group));
        HY_CHECK_ARG(
            p.quant_lm_head == 0 || (p.quant_lm_head == 1 && (p.quant == HY_QUANT_INT8 || p.quant == HY_QUANT_INT4)),
            "quant_lm_head must be 0 or, with HY_QUANT_INT8/INT4, 1, got " + std::to_string(p.quant_lm_head));
        if (!*dir) return fail(Status::io, "the model folder path is empty");
        hy::require_model_folder(dir);  // (before the tokenizer is read: a folder without config.json is named)
        hy::load_model_config(dir);     // (config.json's errors before the tokenizer's; Model::load reads it again)
        hy::ModelParams mp;
        mp.device = p.device == HY_DEVICE_CPU    ? hy::Device::cpu
                    : p.device == HY_DEVICE_CUDA ? hy::Device::cuda
                                                 : hy::Device::auto_select;
        mp.n_threads = p.n_threads;
        mp.n_ctx = p.n_ctx;
        mp.n_slots = p.n_slots;
        mp.max_batch_tokens = p.max_batch_tokens;
        mp.cuda.graphs = p.cuda_graphs != 0;
        mp.dummy_weights = p.dummy_weights != 0;
        mp.quant = p.quant == HY_QUANT_FP8    ? hy::WeightQuant::fp8
                   : p.quant == HY_QUANT_INT8 ? hy::WeightQuant::int8
                   : p.quant == HY_QUANT_INT4 ? hy::WeightQuant::int4
                                              : hy::WeightQuant::none;
        mp.quant_group = p.quant_group;
        mp.quant_lm_head = p.quant_lm_head != 0;
        if (p.progress) mp.progress = [f = p.progress, u = p.progress_user_data](float x) { f(x, u); };
        auto m = std::make_unique<hy_model>();
        m->tok = std::make_unique<hy::Tokenizer>(hy::Tokenizer::from_folder(dir));
        m->generation = hy::load_generation_defaults(dir);
        m->model = hy::Model::load(dir, mp);
        m->n_logits = m->model->config().vocab_size;
        m->tok->require_fits(m->n_logits, dir);  // (a token the model cannot embed: refused now)
        m->n_vocab = std::min(m->tok->n_vocab(), m->n_logits);
        for (int32_t id = 0; id < m->n_vocab; id++) {
            if (!m->tok->is_valid(id)) {
                m->holes.push_back(id);
                continue;
            }
            // the token string (byte-level alphabet: one or two UTF-8 bytes per byte) is at least as long as the
            // bytes the token stands for
            m->max_token_bytes = std::max(m->max_token_bytes, int(m->tok->token_string(id).size()));
        }
        for (int id : m->model->config().eos_token_ids) m->eos.push_back(id);
        for (int32_t id : m->tok->eos_ids()) m->eos.push_back(id);
        std::sort(m->eos.begin(), m->eos.end());
        m->eos.erase(std::unique(m->eos.begin(), m->eos.end()), m->eos.end());
        m->slot_used.assign(size_t(p.n_slots), 0);
        m->fingerprint = hy::fingerprint_folder(dir);
        if (mp.quant != hy::WeightQuant::none) {  // quantized at load: another model as far as its states go
            hy::Fnv1a f;
            f.add_u64(m->fingerprint);
            const std::string q = std::string(hy::weight_quant_name(mp.quant)) + ":" +
                                  std::to_string(hy::weight_quant_group(mp.quant, mp.quant_group)) +
                                  (mp.quant_lm_head ? ":lm_head" : "");
            f.add(q.data(), q.size());
            m->fingerprint = f.h;
        }
        m->device = m->model->backend().device_name();
        m->weights = hy::weight_dtypes_text(m->model->weights());
        m->load_warning = m->model->load_warning();
        if (!m->generation.warning.empty())
            m->load_warning += (m->load_warning.empty() ? "" : "; ") + m->generation.warning;
        *out = m.release();
        return int(Status::ok);
    });
}

void hy_model_free(hy_model* model) {
    if (!model) return;
    bool unused = false;
    {
        std::lock_guard<std::mutex> lk(model->owners_mutex);
        model->free_called = true;
        unused = model->n_owned == 0;
    }
    if (unused) delete model;
}

int hy_model_n_vocab(const hy_model* m) { return m ? m->n_vocab : 0; }
int hy_model_n_logits(const hy_model* m) { return m ? m->n_logits : 0; }
int hy_model_n_ctx(const hy_model* m) { return m ? m->model->n_ctx() : 0; }
int hy_model_n_ctx_train(const hy_model* m) { return m ? m->model->config().max_position_embeddings : 0; }
const char* hy_model_backend(const hy_model* m) { return m ? m->model->backend().name() : ""; }
const char* hy_model_device(const hy_model* m) { return m ? m->device.c_str() : ""; }
const char* hy_model_weights(const hy_model* m) { return m ? m->weights.c_str() : ""; }
int hy_model_max_token_bytes(const hy_model* m) { return m ? m->max_token_bytes : 0; }
size_t hy_model_arena_bytes(const hy_model* m) { return m ? m->model->arena_bytes() : 0; }
uint64_t hy_model_fingerprint(const hy_model* m) { return m ? m->fingerprint : 0; }
const char* hy_model_load_warning(const hy_model* m) { return m ? m->load_warning.c_str() : ""; }

int hy_model_eos_ids(const hy_model* m, int32_t* out, int cap) {
    if (!m) return 0;
    for (int i = 0; i < cap && i < int(m->eos.size()) && out; i++) out[i] = m->eos[size_t(i)];
    return int(m->eos.size());
}

int hy_model_is_eos(const hy_model* m, int32_t id) {
    return m && std::binary_search(m->eos.begin(), m->eos.end(), id) ? 1 : 0;
}

// ---- tokenizer ----
int hy_tokenize(const hy_model* m, const char* text, ptrdiff_t len, int parse_special, int32_t* out, int cap,
                int* n_out) {
    return guard([&] {
        HY_CHECK_ARG(m && n_out && (text || len == 0), "hy_tokenize: model, text and n_out must not be NULL");
        const size_t n = len < 0 ? std::strlen(text) : size_t(len);
        std::vector<int32_t> ids = m->tok->encode(std::string_view(text ? text : "", n), parse_special != 0);
        *n_out = int(ids.size());
        if (int(ids.size()) > cap || (!out && !ids.empty()))
            return fail(
                Status::invalid_argument,
                "hy_tokenize: the text has " + std::to_string(ids.size()) + " tokens, " +
                    (out ? "the buffer holds " + std::to_string(std::max(cap, 0)) : std::string("out is NULL")));
        std::copy(ids.begin(), ids.end(), out);
        return int(Status::ok);
    });
}

int hy_detokenize(const hy_model* m, const int32_t* ids, int n_ids, int skip_special, char* buf, size_t cap,
                  size_t* n_out) {
    return guard([&] {
        HY_CHECK_ARG(m && n_out, "hy_detokenize: the model and n_out must not be NULL");
        HY_CHECK_ARG(n_ids >= 0 && (ids || n_ids == 0),
                     "hy_detokenize: ids is NULL or n_ids negative (n_ids = " + std::to_string(n_ids) + ")");
        const std::string s = m->tok->decode(std::span<const int32_t>(ids, size_t(n_ids)), skip_special != 0);
        *n_out = s.size();
        if (!buf || cap <= s.size())
            return fail(Status::invalid_argument,
                        "hy_detokenize: the text needs " + std::to_string(s.size() + 1) + " bytes, " +
                            (buf ? "the buffer holds " + std::to_string(cap) : "buf is NULL"));
        std::memcpy(buf, s.data(), s.size());
        buf[s.size()] = '\0';
        return int(Status::ok);
    });
}

// ---- chat ----
namespace {

int chat_text(const hy_model* cm, const hy_chat_message* msgs, int n, int add_gen, int thinking, bool continuation,
              char* buf, size_t cap, size_t* n_out) {
    return guard([&] {
        const std::string fn = continuation ? "hy_chat_continue" : "hy_chat_render";
        HY_CHECK_ARG(cm && n_out, fn + ": the model and n_out must not be NULL");
        HY_CHECK_ARG(n >= 0 && (msgs || n == 0), fn + ": msgs is NULL or n negative (n = " + std::to_string(n) + ")");
        HY_CHECK_ARG(thinking >= HY_THINK_DISABLED && thinking <= HY_THINK_MODEL_DECIDES,
                     "unknown thinking mode " + std::to_string(thinking));
        hy_model* m = const_cast<hy_model*>(cm);  // the template is built lazily
        std::vector<hy::ChatMessage> v(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) {
            HY_CHECK_ARG(msgs[i].role && msgs[i].content,
                         "chat message " + std::to_string(i) + ": NULL role or content");
            v[size_t(i)].role = msgs[i].role;
            v[size_t(i)].content = msgs[i].content;
        }
        hy::ChatOptions o;
        o.add_generation_prompt = add_gen != 0;
        o.thinking = thinking == HY_THINK_ENABLED    ? hy::Thinking::enabled
                     : thinking == HY_THINK_DISABLED ? hy::Thinking::disabled
                                                     : hy::Thinking::model_decides;
        const hy::ChatTemplate& t = m->chat_template();
        const std::string s = continuation ? t.render_continuation(v, false, o) : t.render(v, o);
        *n_out = s.size();
        if (!buf || cap <= s.size())
            return fail(Status::invalid_argument,
                        fn + ": the text needs " + std::to_string(s.size() + 1) + " bytes, " +
                            (buf ? "the buffer holds " + std::to_string(cap) : "buf is NULL"));
        std::memcpy(buf, s.data(), s.size() + 1);
        return int(Status::ok);
    });
}

}  // namespace

int hy_chat_render(const hy_model* m, const hy_chat_message* msgs, int n, int add_generation_prompt, int thinking,
                   char* buf, size_t cap, size_t* n_out) {
    return chat_text(m, msgs, n, add_generation_prompt, thinking, false, buf, cap, n_out);
}

int hy_chat_continue(const hy_model* m, const hy_chat_message* msgs, int n, int thinking, char* buf, size_t cap,
                     size_t* n_out) {
    return chat_text(m, msgs, n, 1, thinking, true, buf, cap, n_out);
}

int32_t hy_chat_end_of_turn_id(const hy_model* cm) {
    if (!cm) return -1;
    try {
        return const_cast<hy_model*>(cm)->chat_template().end_of_turn_id();
    } catch (...) {
        return -1;
    }
}

// ---- contexts ----
hy_context_params hy_context_default_params(void) {
    hy_context_params p;
    p.slot = -1;
    return p;
}

int hy_context_new(hy_model* m, const hy_context_params* params, hy_context** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_context_new: model and out must not be NULL");
        const hy_context_params p = params ? *params : hy_context_default_params();
        const int n_slots = int(m->slot_used.size());
        HY_CHECK_ARG(p.slot >= -1, "hy_context_new: slot " + std::to_string(p.slot) + " (-1: the first free one)");
        int slot = -1;
        if (p.slot >= 0) {
            HY_CHECK_ARG(p.slot < n_slots, "hy_context_new: slot " + std::to_string(p.slot) + " is outside [0, " +
                                               std::to_string(n_slots) + ")");
            if (m->slot_used[size_t(p.slot)])
                return fail(Status::context_full, "sequence slot " + std::to_string(p.slot) + " is in use");
            slot = p.slot;
        } else {
            for (int i = 0; i < n_slots && slot < 0; i++)
                if (!m->slot_used[size_t(i)]) slot = i;
            if (slot < 0)
                return fail(Status::context_full, "all " + std::to_string(n_slots) +
                                                      " sequence slots are in use (load the model with more n_slots)");
        }
        auto c = std::make_unique<hy_context>();
        c->m = m;
        c->model = m->model.get();
        c->n_logits = m->n_logits;
        c->slot = slot;
        c->logits.assign(size_t(m->n_logits), 0.0f);
        c->history.reserve(size_t(m->model->n_ctx()) + 1);
        m->model->reset(slot);
        m->slot_used[size_t(slot)] = 1;
        adopt(m);
        *out = c.release();
        return int(Status::ok);
    });
}

void hy_context_free(hy_context* c) {
    if (!c) return;
    c->m->slot_used[size_t(c->slot)] = 0;
    hy_model* m = c->m;
    delete c;
    release(m);
}

// A call that changes context c from inside hy_generate's on_token or should_abort callback on that context is
// refused (it left the generation's own state inconsistent: a fresh-user test).
#define HY_CHECK_NOT_GENERATING(c, fn) \
    HY_CHECK_ARG(!(c)->generating, fn ": called from a callback of hy_generate on the same context")

int hy_context_reset(hy_context* c) {
    return guard([&] {
        HY_CHECK_ARG(c, "hy_context_reset: ctx is NULL");
        HY_CHECK_NOT_GENERATING(c, "hy_context_reset");
        c->clear();
        return int(Status::ok);
    });
}

int hy_context_n_tokens(const hy_context* c) { return c ? int(c->history.size()) : 0; }

int hy_context_tokens(const hy_context* c, int32_t* out, int cap) {
    if (!c) return 0;
    for (int i = 0; i < cap && i < int(c->history.size()) && out; i++) out[i] = c->history[size_t(i)];
    return int(c->history.size());
}

int hy_prefill(hy_context* c, const int32_t* ids, int n) {
    return guard([&] {
        HY_CHECK_ARG(c, "hy_prefill: ctx is NULL");
        HY_CHECK_ARG(n >= 0, "hy_prefill: n = " + std::to_string(n) + " is negative");
        HY_CHECK_ARG(ids || n == 0, "hy_prefill: ids is NULL with n = " + std::to_string(n));
        HY_CHECK_NOT_GENERATING(c, "hy_prefill");
        c->feed(ids, n);
        return int(Status::ok);
    });
}

int hy_decode(hy_context* c, int32_t id) {
    if (!c) return fail(Status::invalid_argument, "hy_decode: ctx is NULL");
    return hy_prefill(c, &id, 1);
}

int hy_decode_batch(hy_context* const* ctxs, const int32_t* ids, int n) {
    return guard([&] {
        HY_CHECK_ARG(ctxs && ids, "hy_decode_batch: ctxs and ids must not be NULL");
        HY_CHECK_ARG(n > 0, "hy_decode_batch: n = " + std::to_string(n) + " (1 context or more)");
        hy_model* m = ctxs[0] ? ctxs[0]->m : nullptr;
        HY_CHECK_ARG(m, "hy_decode_batch: NULL context");
        hy::Model& model = *m->model;
        HY_CHECK_ARG(n <= model.n_slots() && n <= std::max(model.max_logits(), 1),
                     "hy_decode_batch: " + std::to_string(n) + " contexts, at most " + std::to_string(model.n_slots()) +
                         " per step");
        std::vector<hy::Sequence*> seqs(static_cast<size_t>(n));
        for (int i = 0; i < n; i++) {
            hy_context* c = ctxs[i];
            HY_CHECK_ARG(c && c->m == m, "hy_decode_batch: contexts must be non-NULL and of one model");
            HY_CHECK_NOT_GENERATING(c, "hy_decode_batch");
            HY_CHECK_ARG(c->n_pending == 0, "hy_decode_batch: a context has a pending id (use hy_decode)");
            HY_CHECK_ARG(ids[i] >= 0 && ids[i] < m->n_logits,
                         "token id " + std::to_string(ids[i]) + " is out of range");
            for (int j = 0; j < i; j++) HY_CHECK_ARG(ctxs[j] != c, "hy_decode_batch: a context appears twice");
            const int len = model.seq_len(c->slot);
            if (len + 1 > model.n_ctx())
                return fail(Status::context_full, "a sequence is full (" + std::to_string(len) + " tokens)");
            seqs[size_t(i)] = c;
        }
        hy::decode_batch(seqs, ids);
        return int(Status::ok);
    });
}

const float* hy_context_logits(const hy_context* c, int* n_logits) {
    if (n_logits) *n_logits = c ? c->m->n_logits : 0;
    // (an id appended but not fed: the row is the one before it, which sampling would repeat)
    return c && c->has_logits && c->n_pending == 0 ? c->logits.data() : nullptr;
}

// ---- snapshots ----
int hy_state_save(const hy_context* c, void* buf, size_t cap, size_t* n_out) {
    return guard([&] {
        HY_CHECK_ARG(c && n_out, "hy_state_save: ctx and n_out must not be NULL");
        const std::vector<uint8_t> s = hy::serialize_snapshot(*c, c->m->fingerprint);
        *n_out = s.size();
        if (!buf) return int(Status::ok);
        if (cap < s.size())
            return fail(Status::invalid_argument, "hy_state_save: the snapshot needs " + std::to_string(s.size()) +
                                                      " bytes, the buffer holds " + std::to_string(cap));
        std::memcpy(buf, s.data(), s.size());
        return int(Status::ok);
    });
}

int hy_state_load(hy_context* c, const void* buf, size_t n) {
    return guard([&] {
        HY_CHECK_ARG(c && buf, "hy_state_load: ctx and buf must not be NULL");
        HY_CHECK_NOT_GENERATING(c, "hy_state_load");
        try {
            hy::deserialize_snapshot(*c, c->m->fingerprint, static_cast<const uint8_t*>(buf), n);
        } catch (...) {
            c->clear();
            throw;
        }
        return int(Status::ok);
    });
}

int hy_state_save_file(const hy_context* c, const char* path, int overwrite) {
    return guard([&] {
        HY_CHECK_ARG(c && path && *path, "hy_state_save_file: ctx and path must be given");
        const std::vector<uint8_t> s = hy::serialize_snapshot(*c, c->m->fingerprint);
        hy::write_file_atomic(path, s.data(), s.size(), overwrite != 0);
        return int(Status::ok);
    });
}

int hy_state_load_file(hy_context* c, const char* path) {
    return guard([&] {
        HY_CHECK_ARG(c && path, "hy_state_load_file: ctx and path must not be NULL");
        HY_CHECK_ARG(*path, "hy_state_load_file: the path is empty");
        HY_CHECK_NOT_GENERATING(c, "hy_state_load_file");
        std::vector<uint8_t> data;
        bool restoring = false;
        try {
            data = hy::read_snapshot_file(*c, c->m->fingerprint, path);
            restoring = true;
            hy::deserialize_snapshot(*c, c->m->fingerprint, data.data(), data.size());
        } catch (const Error& e) {
            // a file refused before it is read whole (unreadable, its fixed header or its size): the context is left
            // as it was; after that, as hy_state_load
            if (restoring) c->clear();
            const std::string msg = e.what();
            throw Error(e.status(), msg.rfind(std::string(path) + ": ", 0) == 0 ? msg : std::string(path) + ": " + msg);
        }
        return int(Status::ok);
    });
}

size_t hy_state_size_max(const hy_context* c) { return c ? hy::max_snapshot_bytes(*c) : 0; }

// ---- sampling ----
hy_sampler_params hy_sampler_default_params(void) {
    hy_sampler_params p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0xC0FFEE;
    return p;
}

int hy_model_sampler_defaults(const hy_model* m, hy_sampler_params* out) {
    if (!m || !out) return -1;
    *out = hy_sampler_default_params();
    const hy::GenerationDefaults& g = m->generation;
    int took = 0;
    if (g.do_sample == false) {
        out->temperature = 0.0f;
        took |= HY_SAMPLER_TEMPERATURE;
    } else if (g.temperature) {
        out->temperature = *g.temperature;
        took |= HY_SAMPLER_TEMPERATURE;
    }
    auto take = [&](const auto& value, auto& field, int bit) {
        if (!value) return;
        field = *value;
        took |= bit;
    };
    take(g.top_k, out->top_k, HY_SAMPLER_TOP_K);
    take(g.top_p, out->top_p, HY_SAMPLER_TOP_P);
    take(g.min_p, out->min_p, HY_SAMPLER_MIN_P);
    if (g.repetition_penalty) {
        out->repeat_penalty = *g.repetition_penalty;
        out->repeat_last_n = -1;
        took |= HY_SAMPLER_REPEAT_PENALTY | HY_SAMPLER_REPEAT_LAST_N;
    }
    return took;
}

int hy_sampler_new(const hy_model* m, const hy_sampler_params* params, hy_sampler** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_sampler_new: model and out must not be NULL");
        const hy_sampler_params p = params ? *params : hy_sampler_default_params();
        auto s = std::make_unique<hy_sampler>();
        s->m = m;
        s->s = std::make_unique<hy::Sampler>(to_core(p), m->n_logits, m->n_vocab, m->model->n_ctx());
        s->s->set_banned(m->holes);
        adopt(m);
        *out = s.release();
        return int(Status::ok);
    });
}

void hy_sampler_free(hy_sampler* s) {
    if (!s) return;
    const hy_model* m = s->m;
    delete s;
    release(m);
}

int hy_sampler_sample(hy_sampler* s, const hy_context* c, int32_t* id, float* logprob) {
    return guard([&] {
        HY_CHECK_ARG(s && c && id, "hy_sampler_sample: sampler, ctx and id must not be NULL");
        HY_CHECK_ARG(c->m == s->m, "hy_sampler_sample: the sampler belongs to another model");
        HY_CHECK_ARG(c->has_logits, "hy_sampler_sample: the context has no logits (prefill first)");
        HY_CHECK_ARG(c->n_pending == 0,
                     "hy_sampler_sample: the context's last id is not fed yet (its logits are "
                     "the id's before; hy_prefill(ctx, NULL, 0) feeds it)");
        const int32_t t = s->s->sample(c->logits);
        if (logprob) *logprob = float(hy::log_softmax_at(c->logits, s->m->n_vocab, t));
        *id = t;
        return int(Status::ok);
    });
}

void hy_sampler_accept(hy_sampler* s, int32_t id) {
    if (s) s->s->accept(id);
}

void hy_sampler_reset(hy_sampler* s) {
    if (s) s->s->reset(true);
}

void hy_sampler_clear_history(hy_sampler* s) {
    if (s) s->s->reset(false);
}

void hy_sampler_set_seed(hy_sampler* s, uint64_t seed) {
    if (s) s->s->set_seed(seed);
}

// ---- generation ----
const char* hy_stop_reason_name(int r) {
    switch (r) {
        case HY_STOP_EOS: return "eos";
        case HY_STOP_CANCELLED: return "cancelled";
        case HY_STOP_STRING: return "stop string";
        case HY_STOP_MAX_TOKENS: return "max tokens";
        case HY_STOP_CONTEXT_FULL: return "context full";
        case HY_STOP_CALLBACK: return "callback";
        default: return "none";
    }
}

hy_generate_params hy_generate_default_params(void) {
    hy_generate_params p;
    p.max_tokens = -1;
    p.stop = nullptr;
    p.n_stop = 0;
    p.skip_special = 1;
    p.ignore_eos = 0;
    p.stop_ids = nullptr;
    p.n_stop_ids = 0;
    p.on_token = nullptr;
    p.user_data = nullptr;
    p.should_abort = nullptr;
    return p;
}

int hy_generate(hy_context* c, hy_sampler* s, const int32_t* prompt, int n_prompt, const hy_generate_params* params,
                hy_generate_result* result) {
    hy::GenerateResult res;
    const int rc = guard([&] {
        HY_CHECK_ARG(c && s, "hy_generate: ctx and sampler must not be NULL");
        HY_CHECK_ARG(n_prompt >= 0, "hy_generate: n_prompt = " + std::to_string(n_prompt) + " is negative");
        HY_CHECK_ARG(prompt || n_prompt == 0,
                     "hy_generate: prompt is NULL with n_prompt = " + std::to_string(n_prompt));
        HY_CHECK_NOT_GENERATING(c, "hy_generate");
        HY_CHECK_ARG(c->m == s->m, "hy_generate: the sampler belongs to another model");
        const hy_generate_params gp = params ? *params : hy_generate_default_params();
        HY_CHECK_ARG(gp.n_stop >= 0 && (gp.n_stop == 0 || gp.stop), "hy_generate: stop is NULL or n_stop negative");
        HY_CHECK_ARG(gp.n_stop_ids >= 0 && (gp.n_stop_ids == 0 || gp.stop_ids),
                     "hy_generate: stop_ids is NULL or n_stop_ids negative");
        if (const std::string e = stop_id_error(gp.stop_ids, gp.n_stop_ids, c->m->n_logits); !e.empty())
            return fail(Status::invalid_argument, "hy_generate: " + e);
        hy::GenerateOptions o;
        for (int i = 0; i < gp.n_stop; i++) {
            HY_CHECK_ARG(gp.stop && gp.stop[i] && gp.stop[i][0], "hy_generate: stop strings must be non-empty");
            o.stop.emplace_back(gp.stop[i]);
        }
        HY_CHECK_ARG(n_prompt > 0 || c->n_pending > 0 || c->has_logits,
                     "hy_generate: nothing to generate from (empty prompt and no logits)");
        o.max_tokens = gp.max_tokens;
        o.eos = c->m->eos;
        if (gp.stop_ids) o.stop_ids = std::span<const int32_t>(gp.stop_ids, size_t(gp.n_stop_ids));
        o.ignore_eos = gp.ignore_eos != 0;
        o.skip_special = gp.skip_special != 0;
        o.n_valid = c->m->n_vocab;
        if (gp.on_token)
            o.on_token = [&gp](int32_t id, float logprob, const std::string& text, int index) {
                hy_token_info info{};
                info.id = id;
                info.logprob = logprob;
                info.text = text.c_str();
                info.text_len = text.size();
                info.index = index;
                return gp.on_token(&info, gp.user_data) != 0;
            };
        o.should_abort = gp.should_abort;
        o.abort_data = gp.user_data;
        c->generating = true;
        struct Done {
            hy_context* c;
            ~Done() { c->generating = false; }
        } done{c};
        hy::generate(*c, *s->s, *c->m->tok, std::span<const int32_t>(prompt, size_t(n_prompt)), o, res);
        return int(Status::ok);
    });
    if (result && rc == int(Status::ok)) {  // (output pointers: written on success only)
        *result = hy_generate_result{};
        result->n_prompt = res.n_prompt;
        result->n_generated = res.n_generated;
        result->n_decoded = res.n_decoded;
        result->prompt_ms = res.prompt_ms;
        result->generate_ms = res.generate_ms;
        result->stop_reason = stop_reason(res.reason);
    }
    return rc;
}

}  // extern "C"

// ---- batched generation ----
struct hy_batch {
    hy_model* m = nullptr;
    std::vector<int> slots;
    std::unique_ptr<hy::BatchGenerator> gen;
    std::vector<uint8_t> accept_prompt;  // per request
};

hy_request_params hy_request_default_params(void) {
    hy_request_params p;
    p.max_tokens = 128;
    p.sampling = hy_sampler_default_params();
    p.ignore_eos = 0;
    p.accept_prompt = 1;
    p.stop_ids = nullptr;
    p.n_stop_ids = 0;
    return p;
}

int hy_batch_new(hy_model* m, int n_slots, hy_batch** out) {
    return guard([&] {
        HY_CHECK_ARG(m && out, "hy_batch_new: model and out must not be NULL");
        std::vector<int> free_slots;
        for (int i = 0; i < int(m->slot_used.size()); i++)
            if (!m->slot_used[size_t(i)]) free_slots.push_back(i);
        if (n_slots > 0 && int(free_slots.size()) < n_slots)
            return fail(Status::context_full, "hy_batch_new: asked for " + std::to_string(n_slots) +
                                                  " sequence slots, " + std::to_string(free_slots.size()) +
                                                  " are free (load the model with more n_slots)");
        if (free_slots.empty()) return fail(Status::context_full, "hy_batch_new: every sequence slot is in use");
        if (n_slots > 0) free_slots.resize(size_t(n_slots));
        auto b = std::make_unique<hy_batch>();
        b->m = m;
        b->slots = free_slots;
        b->gen = std::make_unique<hy::BatchGenerator>(*m->model, m->n_vocab, free_slots, m->holes);
        for (int s : free_slots) m->slot_used[size_t(s)] = 1;
        adopt(m);
        *out = b.release();
        return int(Status::ok);
    });
}

void hy_batch_free(hy_batch* b) {
    if (!b) return;
    for (int s : b->slots) {
        b->m->slot_used[size_t(s)] = 0;
        b->m->model->reset(s);
    }
    hy_model* m = b->m;
    delete b;
    release(m);
}

int hy_batch_submit(hy_batch* b, const int32_t* prompt, int n_prompt, const hy_request_params* params, int* id) {
    return guard([&] {
        HY_CHECK_ARG(b && id, "hy_batch_submit: batch and id must not be NULL");
        HY_CHECK_ARG(prompt && n_prompt > 0, "hy_batch_submit: the prompt is empty");
        const hy_request_params p = params ? *params : hy_request_default_params();
        hy::GenerationRequest r;
        r.prompt.assign(prompt, prompt + n_prompt);
        HY_CHECK_ARG(p.max_tokens >= 0, "hy_batch_submit: params.max_tokens must be >= 0 (0: prefill only), got " +
                                            std::to_string(p.max_tokens));
        r.max_new_tokens = p.max_tokens;
        r.sampling = to_core(p.sampling);
        r.accept_prompt = p.accept_prompt != 0;
        HY_CHECK_ARG(p.n_stop_ids >= 0 && (p.n_stop_ids == 0 || p.stop_ids),
                     "hy_batch_submit: stop_ids is NULL or n_stop_ids negative");
        if (const std::string e = stop_id_error(p.stop_ids, p.n_stop_ids, b->m->n_logits); !e.empty())
            return fail(Status::invalid_argument, "hy_batch_submit: " + e);
        if (!p.ignore_eos) r.stop_ids = b->m->eos;
        r.stop_ids.insert(r.stop_ids.end(), p.stop_ids, p.stop_ids + p.n_stop_ids);
        *id = b->gen->submit(std::move(r));
        return int(Status::ok);
    });
}

int hy_batch_step(hy_batch* b, int* n_running) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_step: batch must not be NULL");
        b->gen->step();
        if (n_running) *n_running = b->gen->n_active() + b->gen->n_queued();
        return int(Status::ok);
    });
}

int hy_batch_cancel(hy_batch* b, int id) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_cancel: batch must not be NULL");
        b->gen->cancel(id);
        return int(Status::ok);
    });
}

int hy_batch_result(const hy_batch* b, int id, const int32_t** tokens, const float** logprobs, int* n, int* stop_reason,
                    int* done) {
    return guard([&] {
        HY_CHECK_ARG(b, "hy_batch_result: batch must not be NULL");
        const hy::GenerationResult& r = b->gen->result(id);
        if (tokens) *tokens = r.tokens.data();
        if (logprobs) *logprobs = r.logprobs.data();
        if (n) *n = int(r.tokens.size());
        if (done) *done = r.done ? 1 : 0;
        if (stop_reason) *stop_reason = ::stop_reason(r.reason);
        return int(Status::ok);
    });
}
