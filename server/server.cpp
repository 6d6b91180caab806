// hybrid-server (see server.h): the engine thread, the conversation-state cache, request parsing and the endpoints.
#include "server/server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <httplib.h>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "kernels/cpu/thread_pool.h"
#include "model/batch.h"
#include "model/common.h"
#include "model/config.h"
#include "model/quantize.h"
#include "model/state_store.h"
#include "model/tokenizer.h"
#include "server/chat.h"
#include "server/http.h"

namespace hy::server {

namespace {

using Clock = std::chrono::steady_clock;

// The largest request body read (a 413 past it). Any content type is read as JSON.
constexpr size_t kMaxBodyBytes = size_t(64) << 20;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// ---- one request between its HTTP thread and the engine thread -----------------------------------------------------

struct Job {
    GenerationRequest req;
    std::mutex m;
    std::condition_variable cv;
    // written by the engine thread under m
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<TokenPick>> top;
    FinishReason reason = FinishReason::none;
    bool done = false;
    int n_cached = 0;
    std::string error;
    std::shared_ptr<StoredState> saved_state, final_state;
    // set by the HTTP thread
    std::atomic<bool> cancel{false};
    // the engine thread's own
    bool cancel_sent = false;
};

// ---- the conversation-state cache -----------------------------------------------------------------------------------

class StateCache {
public:
    // max_bytes of host memory (Backend::alloc_host: page-locked on CUDA), allocated now; 0: off. model_host_bytes:
    // the host memory the model already holds (its arena on the CPU backend). More than the machine's memory in
    // all is refused now (Linux would grant it and kill the server when the cache fills).
    StateCache(Backend& backend, size_t max_bytes, size_t model_host_bytes) {
        if (max_bytes == 0) return;
        const size_t host = host_memory_bytes();
        if (host > 0 && (max_bytes > host || model_host_bytes > host - max_bytes))
            throw Error(Status::out_of_memory,
                        "the conversation-state cache (--cache-mb " + std::to_string(max_bytes >> 20) + ") needs " +
                            std::to_string(max_bytes >> 20) + " MiB of host memory" +
                            (model_host_bytes ? " beside the model's " + std::to_string(model_host_bytes >> 20) + " MiB"
                                              : std::string()) +
                            ", more than the " + std::to_string(host >> 20) +
                            " MiB there is: give a smaller --cache-mb (0: off)");
        try {
            store_ = std::make_unique<StateStore>(backend, max_bytes);
        } catch (const Error& e) {
            throw Error(e.status(), "the conversation-state cache (--cache-mb " + std::to_string(max_bytes >> 20) +
                                        "): " + e.what());
        }
    }
    bool enabled() const { return store_ != nullptr; }

    struct Hit {
        std::shared_ptr<const StoredState> state;
        int n_tokens = 0;
    };
    // The longest cached sequence whose ids are a proper prefix of `prompt` (one id at least is left to prefill).
    Hit find(const std::vector<int32_t>& prompt) {
        std::lock_guard<std::mutex> lk(m_);
        Hit best;
        Entry* found = nullptr;
        for (Entry& e : entries_) {
            if (e.tokens.size() >= prompt.size() || int(e.tokens.size()) <= best.n_tokens) continue;
            if (!std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) continue;
            best = {e.state, int(e.tokens.size())};
            found = &e;
        }
        if (found) {
            found->last_use = ++clock_;
            hits_++;
        } else {
            misses_++;
        }
        return best;
    }
    // Room for a state of `bytes` bytes (the engine thread saves into it): the least recently used entries go
    // until it fits; null when it cannot (larger than the store, or the rest is held by requests in flight).
    std::shared_ptr<StoredState> allocate(size_t bytes) {
        if (!store_ || !store_->fits(bytes)) return nullptr;
        while (true) {
            if (std::shared_ptr<StoredState> st = store_->allocate(bytes)) return st;
            std::lock_guard<std::mutex> lk(m_);
            if (entries_.empty()) return nullptr;
            auto lru = std::min_element(entries_.begin(), entries_.end(),
                                        [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
            bytes_ -= lru->bytes;
            entries_.erase(lru);
            evictions_++;
        }
    }
    void put(std::vector<int32_t> tokens, std::shared_ptr<const StoredState> state) {
        if (!enabled() || tokens.empty() || !state) return;
        const size_t bytes = state->footprint();  // (the store's blocks: what --cache-mb bounds; ids not counted)
        std::lock_guard<std::mutex> lk(m_);
        for (auto it = entries_.begin(); it != entries_.end(); ++it)
            if (it->tokens == tokens) {  // the same sequence again: keep the newer state
                bytes_ -= it->bytes;
                entries_.erase(it);
                break;
            }
        entries_.push_back({std::move(tokens), std::move(state), bytes, ++clock_});
        bytes_ += bytes;
    }
    struct Stats {
        size_t entries, bytes, max_bytes;
        uint64_t hits, misses, evictions;
    };
    Stats stats() {
        std::lock_guard<std::mutex> lk(m_);
        return {entries_.size(), bytes_, store_ ? store_->capacity() : 0, hits_, misses_, evictions_};
    }

private:
    struct Entry {
        std::vector<int32_t> tokens;
        std::shared_ptr<const StoredState> state;
        size_t bytes;  // its blocks in the store
        uint64_t last_use;
    };
    std::unique_ptr<StateStore> store_;
    std::mutex m_;
    std::list<Entry> entries_;
    size_t bytes_ = 0;
    uint64_t clock_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0;
};

// ---- the engine thread ----------------------------------------------------------------------------------------------

class Engine {
public:
    Engine(Model& model, int n_valid, std::vector<int32_t> banned, BatchGenerator::StateAllocator allocate_state)
        : model_(model), n_valid_(n_valid), banned_(std::move(banned)), allocate_state_(std::move(allocate_state)) {
        new_generator();
        thread_ = std::thread([this] { loop(); });
    }
    ~Engine() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void submit(const std::shared_ptr<Job>& job) {
        {
            std::lock_guard<std::mutex> lk(m_);
            pending_.push_back(job);
        }
        cv_.notify_all();
    }
    void wake() { cv_.notify_all(); }
    int queued() const { return n_queued_.load(); }
    int busy() const { return n_busy_.load(); }

private:
    void new_generator() {
        gen_ = std::make_unique<BatchGenerator>(model_, n_valid_, std::vector<int>{}, banned_);
        gen_->set_state_allocator(allocate_state_);
    }
    void fail_job(const std::shared_ptr<Job>& job, const std::string& msg) {
        std::lock_guard<std::mutex> lk(job->m);
        job->error = msg;
        job->done = true;
        job->cv.notify_all();
    }
    void loop() {
        while (true) {
            std::vector<std::shared_ptr<Job>> incoming;
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait_for(lk, std::chrono::milliseconds(200),
                             [&] { return stop_ || !pending_.empty() || !active_.empty(); });
                if (stop_) break;
                incoming.assign(pending_.begin(), pending_.end());
                pending_.clear();
            }
            // A generator keeps a small record of every request it was given: start a new one now and then when
            // nothing runs (every slot is reset before use, so nothing else changes).
            if (active_.empty() && submitted_ > 100000) {
                new_generator();
                submitted_ = 0;
            }
            for (const auto& job : incoming) {
                try {
                    submitted_++;
                    active_[gen_->submit(job->req)] = job;
                } catch (const std::exception& e) {
                    fail_job(job, e.what());
                }
                job->req.state.reset();
                job->req.prompt.shrink_to_fit();
            }
            for (auto& [id, job] : active_)
                if (job->cancel.load() && !job->cancel_sent) {
                    gen_->cancel(id);
                    job->cancel_sent = true;
                }
            try {
                gen_->step();
            } catch (const std::exception& e) {  // a backend failure: every running request fails with it
                for (auto& [id, job] : active_) fail_job(job, std::string("generation failed: ") + e.what());
                active_.clear();
                new_generator();
                continue;
            }
            n_queued_ = gen_->n_queued();
            n_busy_ = gen_->n_active();
            for (auto it = active_.begin(); it != active_.end();) {
                const int id = it->first;
                Job& job = *it->second;
                const GenerationResult& r = gen_->result(id);
                bool notify = false;
                {
                    std::lock_guard<std::mutex> lk(job.m);
                    for (size_t k = job.tokens.size(); k < r.tokens.size(); k++) {
                        job.tokens.push_back(r.tokens[k]);
                        job.logprobs.push_back(r.logprobs[k]);
                        if (k < r.top.size()) job.top.push_back(r.top[k]);
                        notify = true;
                    }
                    if (r.saved_state) job.saved_state = gen_->take_state(id, false);
                    if (r.done) {
                        job.n_cached = r.n_cached;
                        job.final_state = gen_->take_state(id, true);
                        job.reason = r.reason;
                        job.done = true;
                        notify = true;
                    }
                }
                if (notify) job.cv.notify_all();
                if (r.done) {
                    gen_->forget(id);
                    it = active_.erase(it);
                } else {
                    ++it;
                }
            }
        }
        for (auto& [id, job] : active_) fail_job(job, "the server is shutting down");
        for (auto& job : pending_) fail_job(job, "the server is shutting down");
    }

    Model& model_;
    int n_valid_;
    std::vector<int32_t> banned_;
    BatchGenerator::StateAllocator allocate_state_;
    std::unique_ptr<BatchGenerator> gen_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> pending_;
    std::map<int, std::shared_ptr<Job>> active_;
    bool stop_ = false;
    uint64_t submitted_ = 0;  // requests given to gen_
    std::atomic<int> n_queued_{0}, n_busy_{0};
    std::thread thread_;
};

// ---- errors ---------------------------------------------------------------------------------------------------------

// A request error: HTTP status, OpenAI error type, the parameter at fault and a one-line message.
struct ApiError {
    int status = 400;
    std::string message, param, type = "invalid_request_error", code;
};

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
    throw ApiError{400, message, param, "invalid_request_error", code};
}

ojson error_json(const ApiError& e) {
    ojson err = ojson::object();
    err["message"] = e.message;
    err["type"] = e.type;
    err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
    err["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
    return ojson{{"error", err}};
}

// ---- request fields -------------------------------------------------------------------------------------------------

const ojson* field(const ojson& body, const char* name) {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_field(const ojson& body, const char* name, double def, double lo, double hi, bool lo_open = false) {
    const ojson* v = field(body, name);
    if (!v) return def;
    if (!v->is_number()) bad(name, std::string(name) + " must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
        bad(name, std::string(name) + " must be in " + (lo_open ? "(" : "[") + ojson(lo).dump() + ", " +
                      ojson(hi).dump() + "], got " + v->dump());
    return x;
}

// The error for a value of integer field `name` that JSON did not give as an integer: a whole number left a float by
// whole_floats_to_ints (beyond every integer field's range) is out of `range`; anything else is not an integer.
[[noreturn]] void bad_integer(const char* name, const ojson& v, const std::string& range) {
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isfinite(d) && std::floor(d) == d)
            bad(name, std::string(name) + " must be in " + range + ", got " + v.dump());
    }
    bad(name, std::string(name) + " must be an integer, got " + v.dump());
}

int64_t int_field(const ojson& body, const char* name, int64_t def, int64_t lo, int64_t hi) {
    const ojson* v = field(body, name);
    if (!v) return def;
    const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v->is_number_integer()) bad_integer(name, *v, range);
    const int64_t x =
        v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
    if (x < lo || x > hi) bad(name, std::string(name) + " must be in " + range + ", got " + v->dump());
    return x;
}

// A whole-number float in an integer field (max_tokens 2.0, from a client that computes it) becomes that integer,
// as vLLM's and OpenAI's Python servers take it: exactly, in [-2^63, 2^64) (a seed may use all 64 bits); 2.5 stays
// a float, for parse_settings to refuse, and so does a whole number beyond that range, which parse_settings calls
// out of range (bad_integer).
void whole_floats_to_ints(ojson& body, bool chat) {
    for (const char* k : {"max_tokens", "max_completion_tokens", "seed", "top_k", "top_logprobs", "repeat_last_n", "n",
                          "best_of", "logprobs"}) {
        if (chat && std::strcmp(k, "logprobs") == 0) continue;  // (a boolean there; an int in /v1/completions)
        if (!body.contains(k) || !body[k].is_number_float()) continue;
        const double d = body[k].get<double>();
        if (!std::isfinite(d) || std::floor(d) != d) continue;
        if (d >= 0 && d < 18446744073709551616.0)  // 2^64
            body[k] = uint64_t(d);
        else if (d < 0 && d >= -9223372036854775808.0)  // -2^63
            body[k] = int64_t(d);
    }
}

bool bool_field(const ojson& body, const char* name, bool def) {
    const ojson* v = field(body, name);
    if (!v) return def;
    if (!v->is_boolean()) bad(name, std::string(name) + " must be a boolean, got " + v->dump());
    return v->get<bool>();
}

// The sampling and stopping settings common to both endpoints.
struct Settings {
    SamplerParams sampling;
    int max_tokens = -1;  // -1: until the context is full
    std::vector<std::string> stop;
    bool stream = false, include_usage = false;
    int top_logprobs = 0;
    bool logprobs = false;
    bool ignore_eos = false;
    bool cache_prompt = true;       // use and fill the conversation-state cache (llama-server's cache_prompt)
    std::vector<int32_t> keep_ids;  // special ids kept in the text (a chat request's <think>/<tool_call> markers)
    bool chat = false;              // a chat answer: it also ends where the model starts a new turn (chat_eos)
};

// OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}; each id in [0, n_valid) and assigned by the
// tokenizer.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const ojson& body, const Tokenizer& tok, int n_valid) {
    std::vector<std::pair<int32_t, float>> out;
    const ojson* lb = field(body, "logit_bias");
    if (!lb) return out;
    if (!lb->is_object()) bad("logit_bias", "logit_bias must be an object of token ids (as strings) to biases");
    if (lb->size() > 1024) bad("logit_bias", "logit_bias has " + std::to_string(lb->size()) + " ids; at most 1024");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
        const std::string& key = it.key();
        int64_t id = -1;
        if (!key.empty() && key.size() <= 9 &&
            std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
            id = std::stoll(key);
        if (id < 0) bad("logit_bias", "logit_bias keys must be token ids (decimal strings), got '" + key + "'");
        if (id >= n_valid || !tok.is_valid(int32_t(id)))
            bad("logit_bias", "logit_bias: token id " + key + " is not in the vocabulary");
        const ojson& v = it.value();
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
            bad("logit_bias",
                "logit_bias: the bias of token id " + key + " must be a number in [-100, 100], got " + v.dump());
        out.push_back({int32_t(id), v.get<float>()});
    }
    return out;
}

Settings parse_settings(const ojson& body, const SamplerParams& defaults, bool chat, uint64_t random_seed,
                        const Tokenizer& tok, int n_valid) {
    Settings s;
    s.sampling = defaults;
    s.sampling.seed = random_seed;
    // two names of one setting with different values: refused, not one of them silently taken
    auto same_or_refuse = [&](const char* a, const char* b) {
        const ojson* va = field(body, a);
        const ojson* vb = field(body, b);
        if (va && vb && *va != *vb)
            bad(b, std::string(a) + " (" + va->dump() + ") and " + b + " (" + vb->dump() + ") disagree: give one");
    };
    if (chat) same_or_refuse("max_tokens", "max_completion_tokens");
    // (a chat field: taken without a word here, the default of 16 applied and the answer looked cut short)
    if (!chat && field(body, "max_completion_tokens"))
        bad("max_completion_tokens",
            "max_completion_tokens is a chat completions field; /v1/completions takes max_tokens");
    // (likewise: ignored here, an answer came back without the logprobs asked for)
    if (!chat && field(body, "top_logprobs"))
        bad("top_logprobs",
            "top_logprobs is a chat completions field; /v1/completions takes logprobs: N (0 to 5 alternatives)");
    same_or_refuse("repeat_penalty", "repetition_penalty");
    const char* max_name = chat && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    // (not given: 16 for /v1/completions, as OpenAI's; until the context is full for chat, as OpenAI's and
    // llama-server's)
    if (const ojson* mt = field(body, max_name)) {
        const std::string name = max_name;
        if (!mt->is_number_integer()) {
            // (a whole number in range became an integer in whole_floats_to_ints: this one is out of range)
            const double d = mt->is_number_float() ? mt->get<double>() : 0.5;
            if (std::isfinite(d) && std::floor(d) == d)
                bad(name, name +
                              (d < 0 ? " must be >= 0 (the most tokens to generate), got "
                                     : " must be <= " + std::to_string(INT32_MAX) + ", got ") +
                              mt->dump());
            bad(name, name + " must be an integer, got " + mt->dump());
        }
        if (!mt->is_number_unsigned() && mt->get<int64_t>() < 0)
            bad(name, name + " must be >= 0 (the most tokens to generate), got " + mt->dump());
        if (mt->get<uint64_t>() > uint64_t(INT32_MAX))
            bad(name, name + " must be <= " + std::to_string(INT32_MAX) + ", got " + mt->dump());
        s.max_tokens = int(mt->get<int64_t>());
    } else {
        s.max_tokens = chat ? -1 : 16;
    }
    s.sampling.temperature = float(number_field(body, "temperature", defaults.temperature, 0, 2));
    // [0, 1] as the CLI's --top-p (0 keeps the most likely token alone; it was refused here and taken there)
    s.sampling.top_p = float(number_field(body, "top_p", defaults.top_p, 0, 1));
    s.sampling.top_k = int(int_field(body, "top_k", defaults.top_k, -1, 1 << 30));
    s.sampling.min_p = float(number_field(body, "min_p", defaults.min_p, 0, 1));
    s.sampling.presence_penalty = float(number_field(body, "presence_penalty", 0, -2, 2));
    s.sampling.frequency_penalty = float(number_field(body, "frequency_penalty", 0, -2, 2));
    const char* rp = field(body, "repetition_penalty") ? "repetition_penalty" : "repeat_penalty";
    s.sampling.repeat_penalty = float(number_field(body, rp, defaults.repeat_penalty, 0, 100, true));
    s.sampling.repeat_last_n = int(int_field(body, "repeat_last_n", defaults.repeat_last_n, -1, 1 << 30));
    if (const ojson* seed = field(body, "seed")) {
        if (!seed->is_number_integer()) bad_integer("seed", *seed, "[-1, " + std::to_string(UINT64_MAX) + "]");
        if (!seed->is_number_unsigned() && seed->get<int64_t>() < -1)
            bad("seed", "seed must be >= -1 (-1: a random seed), got " + seed->dump());
        // (-1: a random seed, as llama-server; the one drawn for the request stays)
        if (!(seed->is_number_integer() && !seed->is_number_unsigned() && seed->get<int64_t>() == -1))
            s.sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
    }
    // several choices per request are not supported (n, and best_of of /v1/completions): refused, not ignored
    for (const char* name : {"n", "best_of"})
        if (const ojson* n = field(body, name)) {
            // (1.0 came here as 1: whole_floats_to_ints)
            const bool whole = n->is_number_float() && std::isfinite(n->get<double>()) &&
                               std::floor(n->get<double>()) == n->get<double>();  // (beyond 2^64)
            if (!n->is_number_integer() && !whole)
                bad(name, std::string(name) + " must be an integer, got " + n->dump());
            if (whole ? n->get<double>() > 1 : n->is_number_unsigned() ? n->get<uint64_t>() > 1 : n->get<int64_t>() > 1)
                bad(name, std::string(name) + " = " + n->dump() + " is not supported: one choice per request (" + name +
                              " = 1)");
            if (whole || n->get<int64_t>() < 1) bad(name, std::string(name) + " must be 1, got " + n->dump());
        }
    s.sampling.logit_bias = parse_logit_bias(body, tok, n_valid);
    if (const ojson* stop = field(body, "stop")) {
        if (stop->is_string()) {
            s.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            for (const ojson& e : *stop) {
                if (!e.is_string()) bad("stop", "stop must be a string or a list of strings");
                s.stop.push_back(e.get<std::string>());
            }
        } else {
            bad("stop", "stop must be a string or a list of strings");
        }
        if (s.stop.size() > 16) bad("stop", "at most 16 stop strings");
        for (const std::string& x : s.stop)
            if (x.empty()) bad("stop", "stop strings must not be empty");
    }
    s.stream = bool_field(body, "stream", false);
    if (const ojson* so = field(body, "stream_options")) {
        if (!so->is_object()) bad("stream_options", "stream_options must be an object");
        s.include_usage = bool_field(*so, "include_usage", false);
        // (as OpenAI's API: the options of a stream, refused on a request that does not stream)
        if (!s.stream) bad("stream_options", "stream_options is only allowed with \"stream\": true");
    }
    s.ignore_eos = bool_field(body, "ignore_eos", false);
    s.cache_prompt = bool_field(body, "cache_prompt", true);
    if (chat) {
        s.logprobs = bool_field(body, "logprobs", false);
        s.top_logprobs = int(int_field(body, "top_logprobs", 0, 0, 20));
        if (s.top_logprobs > 0 && !s.logprobs) bad("top_logprobs", "top_logprobs needs logprobs: true");
    } else if (const ojson* lp = field(body, "logprobs")) {
        if (lp->is_boolean()) {
            s.logprobs = lp->get<bool>();
        } else {
            s.top_logprobs = int(int_field(body, "logprobs", 0, 0, 5));
            s.logprobs = true;
        }
    }
    if (const ojson* rf = field(body, "response_format")) {
        if (!rf->is_object() || rf->value("type", "") != "text")
            bad("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    return s;
}

// Whether `j` nests deeper than `limit` arrays and objects (the chat template renders request JSON recursively).
bool too_deep(const ojson& j, int limit) {
    if (!j.is_structured()) return false;
    if (limit == 0) return true;
    for (const ojson& e : j)
        if (too_deep(e, limit - 1)) return true;
    return false;
}

// Chat messages as the template takes them: content parts joined into text, tool call arguments given as JSON text
// parsed into objects (templates iterate over them or print them with tojson). Content is required (a string or
// text parts, without NUL bytes), except in an assistant message that carries tool_calls, whose missing or null
// content becomes "".
ojson normalize_messages(const ojson& body) {
    const ojson* msgs = field(body, "messages");
    if (!msgs) bad("messages", "messages is required");
    if (!msgs->is_array()) bad("messages", "messages must be a list");
    if (msgs->empty()) bad("messages", "messages must not be empty");
    ojson out = ojson::array();
    for (size_t i = 0; i < msgs->size(); i++) {
        const ojson& m = (*msgs)[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) bad(where, where + " must be an object");
        if (!m.contains("role") || !m["role"].is_string()) bad(where + ".role", where + ".role must be a string");
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
            bad(where + ".role", where + ".role '" + role + "' is not system, user, assistant, tool or developer");
        ojson n = m;
        if (role == "developer") n["role"] = "system";
        if (field(m, "function_call"))  // (OpenAI's deprecated form: ignored, the call never reached the prompt)
            bad(where + ".function_call", where +
                                              ".function_call is the deprecated form of tool_calls: send that "
                                              "instead");
        const ojson* content = field(m, "content");
        const ojson* calls = field(m, "tool_calls");
        if (calls && !calls->is_array()) bad(where + ".tool_calls", where + ".tool_calls must be a list");
        if (!content) {
            if (role != "assistant" || !calls || !calls->is_array() || calls->empty())
                bad(where + ".content", where + ".content is " + (m.contains("content") ? "null" : "missing") +
                                            " (only an assistant message with tool_calls may leave it out)");
            n["content"] = "";
        } else if (content->is_array()) {
            std::string text;
            for (const ojson& part : *content) {
                if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
                    !part["text"].is_string())
                    bad(where + ".content", where +
                                                ".content: only text parts ({\"type\": \"text\", \"text\": ...}) "
                                                "are supported");
                text += part["text"].get<std::string>();
            }
            n["content"] = text;
        } else if (!content->is_string()) {
            bad(where + ".content", where + ".content must be a string or a list of text parts");
        }
        if (n["content"].get_ref<const std::string&>().find('\0') != std::string::npos)
            bad(where + ".content", where + ".content contains a NUL byte");
        if (calls) {
            if (!calls->is_array()) bad(where + ".tool_calls", where + ".tool_calls must be a list");
            for (ojson& c : n["tool_calls"]) {
                if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
                    bad(where + ".tool_calls", where + ".tool_calls entries need a function object");
                ojson& f = c["function"];
                if (!f.contains("name") || !f["name"].is_string())
                    bad(where + ".tool_calls", where + ".tool_calls: a function needs a name");
                if (f.contains("arguments") && f["arguments"].is_string() &&
                    !json_nests_deeper(f["arguments"].get<std::string>(), kMaxJsonNesting)) {
                    ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
                    if (!args.is_discarded() && args.is_object()) f["arguments"] = args;
                }
            }
        }
        out.push_back(std::move(n));
    }
    return out;
}

std::string base_name(const std::string& dir) {
    std::filesystem::path p(dir);
    if (p.filename().empty()) p = p.parent_path();
    return p.filename().string();
}

// Whether the peer of this request closed its connection (its socket is polled for a hang-up). Made on the
// request's connection thread (HttpServer::current_socket).
class PeerWatch {
public:
    PeerWatch() : fd_(HttpServer::current_socket()) {}
    bool closed() const {
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLIN | POLLRDHUP, 0};
        if (poll(&p, 1, 0) <= 0) return false;
        return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }

private:
    int fd_ = -1;
};

}  // namespace

// ---- the server -----------------------------------------------------------------------------------------------------

struct Server::Impl {
    ServerParams p;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
    ChatFormat chat;
    std::vector<int32_t> eos;       // sorted
    std::vector<int32_t> chat_eos;  // sorted: eos, <|im_start|> and <|endoftext|> (as the CLI's chat_stop_ids)
    int n_valid = 0;
    SamplerParams defaults;
    std::unique_ptr<StateCache> cache;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<HttpServer> http;
    std::string model_id;
    std::time_t created = std::time(nullptr);
    std::mt19937_64 seed_rng{std::random_device{}()};
    std::mutex seed_m;
    // A response id: prefix + 24 random hex digits (unique across requests and restarts, as OpenAI's and vLLM's
    // ids are; a counter started again at 1 after every restart).
    std::string new_id(const char* prefix) {
        uint64_t a, b;
        {
            std::lock_guard<std::mutex> lock(seed_m);
            a = seed_rng();
            b = seed_rng();
        }
        char hex[32];
        std::snprintf(hex, sizeof hex, "%016llx%08llx", (unsigned long long)a, (unsigned long long)(b >> 32));
        return prefix + std::string(hex);
    }
    // metrics
    std::atomic<uint64_t> n_chat{0}, n_completions{0}, n_errors{0}, n_prompt{0}, n_cached{0}, n_generated{0},
        n_cancelled{0};
    std::atomic<int> n_waiting{0};      // submitted and not finished
    std::atomic<int> n_streams{0};      // event streams not yet ended
    std::atomic<bool> stopping{false};  // Server::stop(): requests in flight end as cancelled
    // The jobs that HTTP threads wait for (Server::stop() wakes them at once).
    std::mutex live_m;
    std::set<Job*> live;
    struct LiveJob {
        Impl& s;
        Job* job;
        LiveJob(Impl& s_, Job* j) : s(s_), job(j) {
            std::lock_guard<std::mutex> lk(s.live_m);
            s.live.insert(job);
        }
        ~LiveJob() {
            std::lock_guard<std::mutex> lk(s.live_m);
            s.live.erase(job);
        }
        LiveJob(const LiveJob&) = delete;
        LiveJob& operator=(const LiveJob&) = delete;
    };
    void wake_waiting() {
        std::lock_guard<std::mutex> lk(live_m);
        for (Job* job : live) {
            { std::lock_guard<std::mutex> jl(job->m); }  // (a waiter checks `stopping` under it: no lost wake-up)
            job->cv.notify_all();
        }
    }

    // A prompt that leaves no room in the context is refused before a stream starts (400, not an error event).
    void check_fits(const std::vector<int32_t>& prompt, const char* param) const {
        if (int64_t(prompt.size()) >= model->n_ctx())
            throw ApiError{400,
                           "the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                               std::to_string(model->n_ctx()) + " per request (-c)",
                           param, "invalid_request_error", "context_length_exceeded"};
    }

    // A request that was not streamed and was cut by a shutdown (its client still waits): 503.
    static ApiError shutting_down() {
        return ApiError{503, "the server is shutting down: the request was cancelled", "", "server_error", ""};
    }

    uint64_t random_seed() {
        std::lock_guard<std::mutex> lk(seed_m);
        return seed_rng();
    }

    // ---- one generation, shared by both endpoints ----

    struct Output {
        std::string text;  // after stop strings
        std::vector<int32_t> ids;
        std::vector<float> logprobs;
        std::vector<std::vector<TokenPick>> top;
        std::string finish = "stop";  // "stop", "length", or "cancelled" (the client went away, or a shutdown)
        bool shutdown = false;        // cancelled by Server::stop(), the client still connected
        int n_prompt = 0, n_cached = 0;
        // ids whose text is in `text` (a stop string cuts the rest): what logprobs report, streamed or not
        size_t n_text_ids = 0;
    };

    // What a stream cut by a shutdown ends with: OpenAI's "length", the one finish_reason that every client knows
    // and that says the answer was cut short (not "stop": it did not end; vLLM's "abort" is unknown to typed
    // clients).
    static constexpr const char* kShutdownFinish = "length";

    // Runs the prompt; on_text(text, sofar, a, b) receives each piece of final text (stop strings held back), the
    // output so far and the range [a, b) of its ids that the piece came from; it returns false when the client went
    // away (the request is then cancelled, and the output's finish is "cancelled").
    Output generate(const std::vector<int32_t>& prompt, const Settings& s, int save_at, const PeerWatch& peer,
                    const std::function<bool(const std::string&, const Output&, size_t, size_t)>& on_text) {
        check_fits(prompt, "messages");
        auto job = std::make_shared<Job>();
        GenerationRequest& r = job->req;
        r.prompt = prompt;
        const int room = model->n_ctx() - int(prompt.size());
        r.max_new_tokens = s.max_tokens < 0 ? room : std::min(s.max_tokens, room);
        r.sampling = s.sampling;
        if (r.sampling.top_k < 0) r.sampling.top_k = 0;
        const std::vector<int32_t>& stops = s.chat ? chat_eos : eos;
        if (!s.ignore_eos) r.stop_ids = stops;
        r.top_logprobs = s.top_logprobs;
        const bool use_cache = cache->enabled() && s.cache_prompt;
        if (use_cache) {
            const StateCache::Hit hit = cache->find(prompt);
            if (hit.state) {
                r.state = hit.state;
                r.n_cached = hit.n_tokens;
            }
            r.save_at = save_at > r.n_cached && save_at < int(prompt.size()) ? save_at : 0;
            r.save_final = true;
        }
        Output out;
        out.n_prompt = int(prompt.size());
        if (r.max_new_tokens == 0) {
            out.finish = "length";
            return out;
        }
        n_waiting++;
        LiveJob live_job(*this, job.get());
        engine->submit(job);
        StreamDecoder dec(*tok, true, s.keep_ids);
        std::string held;
        size_t held_from = 0;  // the first id whose text is in `held`
        size_t seen = 0;
        bool stopped = false, gone = false;
        while (true) {
            std::vector<int32_t> fresh;
            bool done;
            {
                std::unique_lock<std::mutex> lk(job->m);
                job->cv.wait_for(lk, std::chrono::milliseconds(100),
                                 [&] { return job->done || job->tokens.size() > seen || stopping.load(); });
                fresh.assign(job->tokens.begin() + std::ptrdiff_t(seen), job->tokens.end());
                for (size_t k = seen; k < job->tokens.size(); k++) {
                    out.logprobs.push_back(job->logprobs[k]);
                    if (k < job->top.size()) out.top.push_back(job->top[k]);
                }
                done = job->done;
                if (done && !job->error.empty()) {
                    n_waiting--;
                    throw ApiError{500, job->error, "", "server_error", ""};
                }
            }
            for (int32_t id : fresh) {
                const size_t k = seen++;
                // ids made after a stop string ended the answer (before the cancel reached the engine) are not
                // part of it: not counted in usage, not kept (the count was 4-8 for one answer, run to run)
                if (stopped) continue;
                out.ids.push_back(id);
                if (std::binary_search(stops.begin(), stops.end(), id) && !s.ignore_eos) continue;
                held += dec.push(id);
                // stop strings: the earliest match ends the text
                size_t cut = std::string::npos;
                for (const std::string& st : s.stop) cut = std::min(cut, held.find(st));
                if (cut != std::string::npos) {
                    held.resize(cut);
                    stopped = true;
                    job->cancel = true;
                    engine->wake();
                }
                size_t keep = 0;
                if (!stopped)
                    for (const std::string& st : s.stop)
                        for (size_t n = std::min(st.size() - 1, held.size()); n > keep; n--)
                            if (held.compare(held.size() - n, n, st, 0, n) == 0) keep = n;
                if (held.size() > keep) {
                    const std::string piece = held.substr(0, held.size() - keep);
                    held.erase(0, held.size() - keep);
                    out.text += piece;
                    if (!on_text(piece, out, held_from, k + 1)) gone = true;
                    held_from = k + 1;
                }
            }
            if (!gone && !done && (peer.closed() || stopping.load())) gone = true;
            if (gone) {
                job->cancel = true;
                engine->wake();
                n_cancelled++;
                std::unique_lock<std::mutex> lk(job->m);
                job->cv.wait(lk, [&] { return job->done; });
                n_waiting--;
                out.finish = "cancelled";
                out.shutdown = stopping.load() && !peer.closed();
                out.n_text_ids = held_from;
                return out;
            }
            if (done) break;
        }
        n_waiting--;
        out.logprobs.resize(std::min(out.logprobs.size(), out.ids.size()));
        out.top.resize(std::min(out.top.size(), out.ids.size()));
        if (!stopped) {
            held += dec.flush();
            if (!held.empty()) {
                out.text += held;
                on_text(held, out, held_from, out.ids.size());
            }
        }
        out.n_cached = job->n_cached;
        out.finish = stopped || job->reason == FinishReason::eos ? "stop" : "length";
        // Keep the states for the next turn: after the messages, and after the answer (every id but the last).
        if (job->saved_state && save_at > 0)
            cache->put(std::vector<int32_t>(prompt.begin(), prompt.begin() + save_at), std::move(job->saved_state));
        if (job->final_state && !stopped) {
            std::vector<int32_t> seq = prompt;
            if (!out.ids.empty()) seq.insert(seq.end(), out.ids.begin(), out.ids.end() - 1);
            cache->put(std::move(seq), std::move(job->final_state));
        }
        out.n_text_ids = stopped ? held_from : out.ids.size();
        n_prompt += uint64_t(out.n_prompt);
        n_cached += uint64_t(out.n_cached);
        n_generated += uint64_t(out.ids.size());
        return out;
    }

    // ---- responses ----

    ojson usage(const Output& o) const {
        ojson u = ojson::object();
        u["prompt_tokens"] = o.n_prompt;
        u["completion_tokens"] = int(o.ids.size());
        u["total_tokens"] = o.n_prompt + int(o.ids.size());
        u["prompt_tokens_details"] = ojson{{"cached_tokens", o.n_cached}};
        return u;
    }

    ojson token_logprob(int32_t id, float lp) const {
        const std::string piece = tok->token_piece(id);
        ojson bytes = ojson::array();
        for (unsigned char c : piece) bytes.push_back(int(c));
        return ojson{{"token", utf8_sanitize(piece)}, {"logprob", lp}, {"bytes", bytes}};
    }

    // The chat logprobs of ids [a, b) of o.
    ojson chat_logprobs(const Output& o, size_t a, size_t b) const {
        ojson content = ojson::array();
        for (size_t k = a; k < b && k < o.ids.size(); k++) {
            if (std::binary_search(chat_eos.begin(), chat_eos.end(), o.ids[k])) continue;
            ojson e = token_logprob(o.ids[k], o.logprobs[k]);
            ojson top = ojson::array();
            if (k < o.top.size())
                for (const TokenPick& t : o.top[k]) top.push_back(token_logprob(t.id, t.logprob));
            e["top_logprobs"] = top;
            content.push_back(e);
        }
        return ojson{{"content", content}};
    }

    // Ids [a, b) of o; their text_offset counts the characters of the pieces before them, from `offset` (advanced
    // past them: a stream's chunks continue it, so its offsets are the answer's, whatever text is held back).
    ojson completion_logprobs(const Output& o, size_t a, size_t b, size_t& offset) const {
        ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
        for (size_t k = a; k < b && k < o.ids.size(); k++) {
            const std::string piece = utf8_sanitize(tok->token_piece(o.ids[k]));
            tokens.push_back(piece);
            lps.push_back(o.logprobs[k]);
            ojson top = ojson::object();
            if (k < o.top.size())
                for (const TokenPick& t : o.top[k]) top[utf8_sanitize(tok->token_piece(t.id))] = t.logprob;
            tops.push_back(top);
            offs.push_back(offset);
            offset += utf8_length(piece);  // (characters, as OpenAI's offsets into text; not bytes)
        }
        return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
    }

    std::vector<int32_t> encode(const std::string& text) const { return tok->encode(text, true); }

    // ---- endpoints ----

    void handle(const httplib::Request& req, httplib::Response& res, bool chat, const std::string& text) {
        (chat ? n_chat : n_completions)++;
        try {
            if (!authorized(req)) throw ApiError{401, "invalid API key", "", "authentication_error", "invalid_api_key"};
            if (json_nests_deeper(text, kMaxJsonNesting))
                bad("", "the request body nests more than " + std::to_string(kMaxJsonNesting) +
                            " levels of lists and objects");
            ojson body = ojson::parse(text, nullptr, false);
            if (body.is_discarded()) {
                std::string why;
                try {
                    const ojson again = ojson::parse(text);
                    why = again.type_name();
                } catch (const std::exception& e) {
                    why = json_error_text(e.what());
                }
                bad("", "invalid JSON in the request body: " + why);
            }
            if (!body.is_object()) bad("", "the request body must be a JSON object");
            if (too_deep(body, kMaxJsonNesting))  // (as the text check above: a second guard for the renderer)
                bad("", "the request body nests more than " + std::to_string(kMaxJsonNesting) +
                            " levels of lists and objects");
            if (const ojson* m = field(body, "model"))
                if (!m->is_string()) bad("model", "model must be a string");
            whole_floats_to_ints(body, chat);
            const Settings s = parse_settings(body, defaults, chat, random_seed(), *tok, n_valid);
            if (chat)
                chat_completion(req, res, body, s);
            else
                completion(req, res, body, s);
        } catch (const ApiError& e) {
            n_errors++;
            res.status = e.status;
            res.set_content(dump(error_json(e)), "application/json");
        } catch (const Error& e) {
            n_errors++;
            const bool client = e.status() == Status::invalid_argument || e.status() == Status::unsupported ||
                                e.status() == Status::context_full;
            const ApiError a{client ? 400 : 500, e.what(), "", client ? "invalid_request_error" : "server_error", ""};
            res.status = a.status;
            res.set_content(dump(error_json(a)), "application/json");
        }
        if (p.verbose)  // (a response that is not an error has no status yet: httplib sends 200)
            std::fprintf(stderr, "hybrid-server: %s %s %d\n", req.method.c_str(), req.path.c_str(),
                         res.status < 0 ? 200 : res.status);
    }

    bool authorized(const httplib::Request& req) const {
        if (p.api_key.empty()) return true;
        // the scheme is case-insensitive (RFC 9110 11.1), the key is not
        const std::string h = req.get_header_value("Authorization");
        if (h.size() != 7 + p.api_key.size() || h[6] != ' ') return false;
        for (size_t i = 0; i < 6; i++)
            if (std::tolower(static_cast<unsigned char>(h[i])) != "bearer"[i]) return false;
        return h.compare(7, std::string::npos, p.api_key) == 0;
    }

    // Sends `chunks` as server-sent events from the worker thread: the provider runs the generation itself.
    template <class Run>
    void stream(httplib::Response& res, Run run) {
        res.set_header("Cache-Control", "no-cache");
        n_streams++;  // until the response is gone (the releaser runs when it is destroyed, sent or not)
        res.set_chunked_content_provider(
            "text/event-stream",
            [run](size_t, httplib::DataSink& sink) {
                auto send = [&](const ojson& j) {
                    const std::string line = "data: " + dump(j) + "\n\n";
                    return sink.write(line.data(), line.size());
                };
                // what fails once the stream has started is reported in it, as an error event
                try {
                    run(send);
                } catch (const ApiError& e) {
                    send(error_json(e));
                } catch (const std::exception& e) {
                    send(error_json(ApiError{500, e.what(), "", "server_error", ""}));
                }
                const std::string done = "data: [DONE]\n\n";
                sink.write(done.data(), done.size());
                sink.done();
                return true;
            },
            [this](bool) { n_streams--; });
    }

    void completion(const httplib::Request& req, httplib::Response& res, const ojson& body, const Settings& s) {
        const ojson* prompt_j = field(body, "prompt");
        if (!prompt_j) bad("prompt", "prompt is required");
        std::vector<int32_t> prompt;
        const ojson* pj = prompt_j;
        // a batch of one prompt (OpenAI's list form: [string] or [[ids]]) is that prompt
        if (pj->is_array() && pj->size() == 1 && ((*pj)[0].is_string() || (*pj)[0].is_array())) pj = &(*pj)[0];
        if (pj->is_array() && pj->size() > 1 && ((*pj)[0].is_string() || (*pj)[0].is_array()))
            bad("prompt", "a batch of " + std::to_string(pj->size()) +
                              " prompts is not supported (one prompt per request; send them concurrently)");
        if (pj->is_string()) {
            prompt = encode(pj->get<std::string>());
        } else if (pj->is_array()) {  // (empty: "the prompt is empty" below)
            for (const ojson& e : *pj) {
                if (!e.is_number_integer())
                    bad("prompt", "prompt must be a string, token ids, or a list of one of them");
                // (named as given: a value past int64 would wrap)
                const bool in_range = e.is_number_unsigned() ? e.get<uint64_t>() < uint64_t(n_valid)
                                                             : e.get<int64_t>() >= 0 && e.get<int64_t>() < n_valid;
                if (!in_range || !tok->is_valid(int32_t(e.get<int64_t>())))
                    bad("prompt", "token id " + e.dump() + " is not in the vocabulary");
                prompt.push_back(int32_t(e.get<int64_t>()));
            }
        } else {
            bad("prompt", "prompt must be a string, token ids, or a list of one of them");
        }
        if (prompt.empty()) bad("prompt", "the prompt is empty");
        bool echo = bool_field(body, "echo", false);
        if (echo) bad("echo", "echo is not supported");
        if (const ojson* sfx = field(body, "suffix"))
            if (!sfx->is_string() || !sfx->get<std::string>().empty()) bad("suffix", "suffix is not supported");
        check_fits(prompt, "prompt");
        const std::string id = new_id("cmpl-");
        const std::time_t now = std::time(nullptr);
        auto base = [this, id, now]() {
            return ojson{{"id", id}, {"object", "text_completion"}, {"created", now}, {"model", model_id}};
        };
        if (s.stream) {
            // (the request is checked and its prompt encoded: what can still fail is reported in the stream, by
            // stream())
            auto peer = std::make_shared<PeerWatch>();
            stream(res, [this, prompt, s, base, peer](const std::function<bool(const ojson&)>& send) {
                size_t offset = 0;
                const Output o = generate(
                    prompt, s, 0, *peer, [&](const std::string& text, const Output& sofar, size_t a, size_t b) {
                        ojson c = base();
                        ojson choice{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
                        if (s.logprobs) choice["logprobs"] = completion_logprobs(sofar, a, b, offset);
                        c["choices"] = ojson::array({choice});
                        return send(c);
                    });
                if (o.finish == "cancelled" && !o.shutdown) return;
                ojson c = base();
                c["choices"] = ojson::array({ojson{{"text", ""},
                                                   {"index", 0},
                                                   {"logprobs", nullptr},
                                                   {"finish_reason", o.shutdown ? kShutdownFinish : o.finish}}});
                send(c);
                if (s.include_usage) {  // (a chunk of its own with no choices, as OpenAI and vLLM send it)
                    ojson u = base();
                    u["choices"] = ojson::array();
                    u["usage"] = usage(o);
                    send(u);
                }
            });
            return;
        }
        PeerWatch peer;
        Output o = generate(prompt, s, 0, peer, [](const std::string&, const Output&, size_t, size_t) { return true; });
        if (o.shutdown) throw shutting_down();
        if (o.finish == "cancelled") return;
        ojson c = base();
        ojson choice{{"text", o.text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", o.finish}};
        size_t offset = 0;
        if (s.logprobs) choice["logprobs"] = completion_logprobs(o, 0, o.n_text_ids, offset);
        c["choices"] = ojson::array({choice});
        c["usage"] = usage(o);
        res.set_content(dump(c), "application/json");
    }

    void chat_completion(const httplib::Request& req, httplib::Response& res, const ojson& body,
                         const Settings& settings) {
        Settings s = settings;
        s.keep_ids = chat.marker_ids();  // the output parser needs them even when the tokenizer marks them special
        s.chat = true;
        // OpenAI's deprecated function-calling fields: refused by name (they were ignored, so a function never
        // reached the prompt)
        for (const auto& [legacy, now] :
             {std::pair<const char*, const char*>{"functions", "tools"}, {"function_call", "tool_choice"}})
            if (field(body, legacy))
                bad(legacy, std::string(legacy) + " is the deprecated form of " + now + ": send that instead");
        const ojson messages = normalize_messages(body);
        ojson tools = nullptr;
        if (const ojson* t = field(body, "tools")) {
            if (!t->is_array()) bad("tools", "tools must be a list");
            for (const ojson& e : *t) {
                if (!e.is_object()) bad("tools", "tools entries must be objects");
                // as OpenAI's: {"type": "function", "function": {"name": ..., "description", "parameters"}}
                const auto fn = e.find("function");
                if (fn == e.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string() ||
                    (*fn)["name"].get<std::string>().find_first_not_of(" \t\r\n") == std::string::npos)
                    bad("tools", "each tools entry needs a \"function\" object with a non-empty \"name\"");
                if (fn->contains("parameters") && !(*fn)["parameters"].is_object() && !(*fn)["parameters"].is_null())
                    bad("tools", "a function's \"parameters\" must be a JSON Schema object");
                if (e.contains("type") && e["type"] != "function")
                    bad("tools", "tools entries must have \"type\": \"function\"");
            }
            tools = *t;
        }
        if (const ojson* tc = field(body, "tool_choice")) {
            // "none" drops the tools, "auto" lets the model choose; forcing a call ("required", a named function)
            // would need constrained decoding, which this server does not have: refused rather than ignored
            const std::string choice = tc->is_string() ? tc->get<std::string>() : std::string();
            if (choice == "none")
                tools = nullptr;
            else if (tc->is_object() || choice == "required")
                bad("tool_choice", "tool_choice " + (tc->is_object() ? std::string("as an object") : choice) +
                                       " is not supported (\"auto\" or \"none\": the model decides whether to "
                                       "call a tool)");
            else if (choice != "auto")
                bad("tool_choice", "tool_choice must be \"auto\" or \"none\", got " + tc->dump());
        }
        if (tools.is_array() && !tools.empty() && chat.builtin_chatml())
            bad("tools", "tools need a chat template (the built-in ChatML has none; --chat-template-file)");
        ojson kwargs = ojson::object();
        if (const ojson* k = field(body, "chat_template_kwargs")) {
            if (!k->is_object()) bad("chat_template_kwargs", "chat_template_kwargs must be an object");
            if (k->contains("enable_thinking") && !(*k)["enable_thinking"].is_boolean() &&
                !(*k)["enable_thinking"].is_null())
                bad("chat_template_kwargs.enable_thinking",
                    "chat_template_kwargs.enable_thinking must be true or false, not " +
                        std::string((*k)["enable_thinking"].type_name()));
            kwargs = *k;
        }
        const bool add_gen = bool_field(body, "add_generation_prompt", true);
        if (chat.builtin_chatml())  // (tool messages and calls need the model's template: it knows how to show them)
            for (size_t i = 0; i < messages.size(); i++) {
                const std::string where = "messages[" + std::to_string(i) + "]";
                if (messages[i]["role"] == "tool")
                    bad(where + ".role", where +
                                             ".role 'tool' needs the model's chat template (the built-in ChatML takes "
                                             "system (developer too), user and assistant)");
                const ojson* calls = field(messages[i], "tool_calls");
                if (calls && !calls->empty())  // (they were dropped from the prompt without a word)
                    bad(where + ".tool_calls", where +
                                                   ".tool_calls need the model's chat template (the built-in ChatML "
                                                   "cannot show tool calls; --chat-template-file)");
            }
        const std::string text = chat.render(messages, tools, add_gen, kwargs);
        const std::vector<int32_t> prompt = encode(text);
        if (prompt.empty()) bad("messages", "the rendered prompt is empty");
        check_fits(prompt, "messages");
        // The cache point: the prompt without its generation prompt, when its ids are a prefix of the prompt's.
        int save_at = 0;
        if (cache->enabled() && s.cache_prompt && add_gen) {
            const std::vector<int32_t> head = encode(chat.render(messages, tools, false, kwargs));
            if (head.size() < prompt.size() && std::equal(head.begin(), head.end(), prompt.begin()))
                save_at = int(head.size());
        }
        // Generation starts inside a <think> block when the prompt opened one.
        const std::string think_open = "<think>";
        std::string tail = text;
        while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
        const bool in_think = chat.has_think() && tail.size() >= think_open.size() &&
                              tail.compare(tail.size() - think_open.size(), think_open.size(), think_open) == 0;
        const std::string id = new_id("chatcmpl-");
        const std::time_t now = std::time(nullptr);
        // (copied into the stream's provider, which runs after this function returned: it captures nothing by
        // reference)
        const std::string object = s.stream ? "chat.completion.chunk" : "chat.completion";
        auto base = [this, id, now, object]() {
            return ojson{{"id", id}, {"object", object}, {"created", now}, {"model", model_id}};
        };
        const bool think = chat.has_think();
        auto calls_json = [id](const std::vector<OutputParser::ToolCall>& calls, bool with_index) {
            ojson arr = ojson::array();
            for (size_t k = 0; k < calls.size(); k++) {
                ojson c{{"id", "call_" + id.substr(9) + "_" + std::to_string(k)},
                        {"type", "function"},
                        {"function", ojson{{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
                if (with_index) c["index"] = int(k);
                arr.push_back(c);
            }
            return arr;
        };
        if (s.stream) {
            auto peer = std::make_shared<PeerWatch>();
            stream(res, [this, prompt, s, save_at, base, peer, in_think, think, tools,
                         calls_json](const std::function<bool(const ojson&)>& send) {
                OutputParser parser(in_think, think, tools);
                auto delta_chunk = [&](const ojson& delta, const ojson& logprobs, const ojson& finish) {
                    ojson c = base();
                    c["choices"] = ojson::array(
                        {ojson{{"index", 0}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", finish}}});
                    return send(c);
                };
                // A token's logprobs go out with the chunk that shows its text: the parser may hold text back
                // (the start of a tag), and then the logprobs wait for it; a delta with reasoning and content is
                // one chunk with both fields. (They went out with an empty content chunk, apart from the
                // reasoning text, sometimes before it.)
                ojson pending = ojson::array();
                auto send_delta = [&](const OutputParser::Delta& d, const ojson& logprobs, bool last) {
                    if (!logprobs.is_null())
                        for (const ojson& e : logprobs["content"]) pending.push_back(e);
                    ojson delta = ojson::object();
                    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
                    if (!d.content.empty()) delta["content"] = d.content;
                    if (delta.empty() && !(last && !pending.empty())) return true;
                    if (delta.empty()) delta["content"] = "";
                    const bool with_lp = s.logprobs;
                    const ojson lp = with_lp ? ojson{{"content", pending}} : ojson(nullptr);
                    pending = ojson::array();
                    return delta_chunk(delta, lp, nullptr);
                };
                if (!delta_chunk(ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) return;
                const Output o = generate(prompt, s, save_at, *peer,
                                          [&](const std::string& text, const Output& sofar, size_t a, size_t b) {
                                              const ojson lp = s.logprobs ? chat_logprobs(sofar, a, b) : ojson(nullptr);
                                              return send_delta(parser.feed(text), lp, false);
                                          });
                if (o.finish == "cancelled" && !o.shutdown) return;
                send_delta(parser.finish(), nullptr, true);
                std::string finish = o.finish;
                if (!parser.tool_calls().empty()) {
                    delta_chunk(ojson{{"tool_calls", calls_json(parser.tool_calls(), true)}}, nullptr, nullptr);
                    finish = "tool_calls";
                }
                if (o.shutdown) finish = kShutdownFinish;
                ojson last = base();
                last["choices"] = ojson::array({ojson{
                    {"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", finish}}});
                send(last);
                if (s.include_usage) {
                    ojson u = base();
                    u["choices"] = ojson::array();
                    u["usage"] = usage(o);
                    send(u);
                }
            });
            return;
        }
        PeerWatch peer;
        OutputParser parser(in_think, think, tools);
        std::string reasoning, content;
        Output o = generate(prompt, s, save_at, peer, [&](const std::string& piece, const Output&, size_t, size_t) {
            const OutputParser::Delta d = parser.feed(piece);
            reasoning += d.reasoning;
            content += d.content;
            return true;
        });
        if (o.shutdown) throw shutting_down();
        if (o.finish == "cancelled") return;
        const OutputParser::Delta d = parser.finish();
        reasoning += d.reasoning;
        content += d.content;
        ojson msg{{"role", "assistant"}, {"content", content}};
        if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        std::string finish = o.finish;
        if (!parser.tool_calls().empty()) {
            msg["tool_calls"] = calls_json(parser.tool_calls(), false);
            if (content.empty()) msg["content"] = nullptr;
            finish = "tool_calls";
        }
        ojson c = base();
        c["choices"] =
            ojson::array({ojson{{"index", 0},
                                {"message", msg},
                                {"logprobs", s.logprobs ? chat_logprobs(o, 0, o.n_text_ids) : ojson(nullptr)},
                                {"finish_reason", finish}}});
        c["usage"] = usage(o);
        res.set_content(dump(c), "application/json");
    }

    std::string metrics() {
        const StateCache::Stats cs = cache->stats();
        std::string out;
        auto metric = [&](const char* name, const char* type, const char* help, const std::string& value,
                          const std::string& labels = "") {
            out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + labels +
                   " " + value + "\n";
        };
        out += "# HELP hybrid_requests_total Requests received, by endpoint.\n# TYPE hybrid_requests_total counter\n";
        out += "hybrid_requests_total{endpoint=\"chat\"} " + std::to_string(n_chat.load()) + "\n";
        out += "hybrid_requests_total{endpoint=\"completions\"} " + std::to_string(n_completions.load()) + "\n";
        metric("hybrid_request_errors_total", "counter",
               "Error answers (4xx, 5xx) to any request: unknown paths and refused methods too, so not a share of "
               "hybrid_requests_total.",
               std::to_string(n_errors.load()));
        metric("hybrid_requests_cancelled_total", "counter", "Requests cancelled because the client went away.",
               std::to_string(n_cancelled.load()));
        metric("hybrid_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               std::to_string(n_prompt.load()));
        metric("hybrid_prompt_tokens_cached_total", "counter",
               "Prompt tokens taken from the conversation-state cache instead of prefilled.",
               std::to_string(n_cached.load()));
        metric("hybrid_completion_tokens_total", "counter", "Generated tokens of finished requests.",
               std::to_string(n_generated.load()));
        metric("hybrid_requests_waiting", "gauge", "Requests submitted and not finished.",
               std::to_string(n_waiting.load()));
        metric("hybrid_queue_depth", "gauge", "Requests waiting for a free sequence slot.",
               std::to_string(engine->queued()));
        metric("hybrid_slots_busy", "gauge", "Sequence slots in use.", std::to_string(engine->busy()));
        metric("hybrid_slots_total", "gauge", "Sequence slots (-np).", std::to_string(model->n_slots()));
        metric("hybrid_http_connections", "gauge", "HTTP connections being served (--threads-http at most).",
               std::to_string(http->open_connections()));
        metric("hybrid_state_cache_entries", "gauge", "Sequence states in the conversation-state cache.",
               std::to_string(cs.entries));
        metric("hybrid_state_cache_bytes", "gauge",
               "Bytes of the conversation-state cache's store holding cached states (at most its capacity).",
               std::to_string(cs.bytes));
        metric("hybrid_state_cache_capacity_bytes", "gauge", "The cache's limit (--cache-mb).",
               std::to_string(cs.max_bytes));
        metric("hybrid_state_cache_hits_total", "counter", "Requests that continued from a cached state.",
               std::to_string(cs.hits));
        metric("hybrid_state_cache_misses_total", "counter", "Requests that found no cached state.",
               std::to_string(cs.misses));
        metric("hybrid_state_cache_evictions_total", "counter", "States dropped to stay within --cache-mb.",
               std::to_string(cs.evictions));
        return out;
    }

    // POST `path`: the body is read here, whatever its Content-Type says, and parsed as JSON (llama-server and vLLM
    // do the same for clients that leave out "Content-Type: application/json": the library would parse a form body
    // as a form and refuse one over 8 KB), up to kMaxBodyBytes (413 past it). A body that does not arrive in time
    // is a 408 (server/http.h).
    void post_json(const char* path, bool chat) {
        http->Post(path, [this, chat](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
            std::string body;
            bool too_big = false, ok;
            if (req.is_multipart_form_data()) {  // (read and dropped: the library has no plain reader for it)
                // (a malformed multipart body gets the same answer: the content type is what is refused)
                ok = reader([](const httplib::MultipartFormData&) { return true; },
                            [](const char*, size_t) { return true; });
                if (!ok) HttpServer::close_after_response(req, res);
                if (!ok && HttpServer::request_timed_out())
                    reply_error(req, res, {408, http->timeout_message(), "", "invalid_request_error", ""});
                else
                    reply_error(req, res,
                                {415, "multipart/form-data bodies are not supported: send the request as JSON", "",
                                 "invalid_request_error", ""});
                return;
            } else {
                ok = reader([&](const char* data, size_t n) {
                    if (body.size() + n > kMaxBodyBytes) {
                        too_big = true;
                        return false;
                    }
                    body.append(data, n);
                    return true;
                });
            }
            if (!ok) {
                HttpServer::close_after_response(req, res);  // (what is left of the body is not read)
                if (HttpServer::request_timed_out())
                    reply_error(req, res, {408, http->timeout_message(), "", "invalid_request_error", ""});
                else if (too_big || res.status == 413)
                    reply_error(req, res,
                                {413, "the request body is larger than " + std::to_string(kMaxBodyBytes >> 20) + " MiB",
                                 "", "invalid_request_error", "request_too_large"});
                else
                    reply_error(req, res, {400, "the request body could not be read", "", "invalid_request_error", ""});
                return;
            }
            handle(req, res, chat, body);
        });
    }

    void reply_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
        n_errors++;
        res.status = e.status;
        res.set_content(dump(error_json(e)), "application/json");
        if (p.verbose)
            std::fprintf(stderr, "hybrid-server: %s %s %d\n", req.method.c_str(), req.path.c_str(), e.status);
    }

    // The methods a path takes ("" for an unknown path); OPTIONS (CORS preflights) goes with every path.
    static std::string allowed_methods(const std::string& path) {
        if (path == "/v1/chat/completions" || path == "/v1/completions") return "POST, OPTIONS";
        if (path == "/v1/models" || path == "/health" || path == "/metrics") return "GET, HEAD, OPTIONS";
        if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return "GET, HEAD, OPTIONS";
        return "";
    }

    ojson model_object() const {
        return ojson{
            {"id", model_id},
            {"object", "model"},
            {"created", created},
            {"owned_by", "hybrid"},
            {"meta", ojson{{"n_ctx", model->n_ctx()},
                           {"n_slots", model->n_slots()},
                           {"n_vocab", n_valid},
                           {"backend", model->backend().name()},
                           {"weights", weight_dtypes_text(model->weights())},
                           {"quant", weight_quant_name(model->params().quant)},
                           {"quant_group", hy::weight_quant_group(model->params().quant, model->params().quant_group)},
                           {"quant_lm_head", model->params().quant_lm_head},
                           {"chat_template", chat.description()}}}};
    }

    bool check_key(const httplib::Request& req, httplib::Response& res) {
        if (authorized(req)) return true;
        reply_error(req, res, {401, "invalid API key", "", "authentication_error", "invalid_api_key"});
        return false;
    }

    void routes() {
        // Before any body is read: unknown paths (404) and methods a path does not take (405, with Allow), and a
        // POST whose body has no length (411: neither Content-Length nor chunked; the library would read it until
        // the client closes), a body longer than kMaxBodyBytes (413). Their bodies are left unread: the connection
        // closes after the answer.
        http->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            const bool options = req.method == "OPTIONS";  // (its own handler: only the header checks here)
            const std::string allow = allowed_methods(req.path);
            const bool post = allow.rfind("POST", 0) == 0;
            // Transfer-Encoding: only "chunked" (case-insensitive, as the HTTP library reads it); any other coding or
            // list ("gzip, chunked") would be read as a body without a length (until the client closes): 501 at once
            const bool has_te = req.has_header("Transfer-Encoding");
            std::string te;
            for (size_t i = 0; i < req.get_header_value_count("Transfer-Encoding"); i++)
                te += (i ? ", " : "") + req.get_header_value("Transfer-Encoding", i);
            std::string te_lower = te;
            for (char& ch : te_lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
            const size_t te_b = te_lower.find_first_not_of(" \t"), te_e = te_lower.find_last_not_of(" \t");
            const bool chunked =
                has_te && te_b != std::string::npos && te_lower.substr(te_b, te_e - te_b + 1) == "chunked";
            // a header name with white space in it or around it ("Host : x", a folded line): RFC 9112 5.1, 5.2
            std::string bad_name;
            for (const auto& h : req.headers)
                if (h.first.empty() || h.first.find_first_of(" \t") != std::string::npos) bad_name = h.first;
            const bool has_length = req.has_header("Content-Length");
            const std::string length = req.get_header_value("Content-Length");
            const bool bad_length =
                has_length && (length.empty() || length.find_first_not_of("0123456789") != std::string::npos);
            // a well-formed length past the limit, however many digits it has (leading zeros aside)
            const std::string digits =
                bad_length ? "" : length.substr(std::min(length.find_first_not_of('0'), length.size()));
            const bool too_long = has_length && !bad_length &&
                                  (digits.size() > 19 || (!digits.empty() && std::stoull(digits) > kMaxBodyBytes));
            // two lengths that differ, or a length with chunked encoding: the body's end is ambiguous (a proxy
            // in front may have read it the other way: request smuggling, RFC 9112 6.3), so refused
            bool conflicting = chunked && has_length;
            for (size_t i = 1; i < req.get_header_value_count("Content-Length"); i++)
                conflicting = conflicting || req.get_header_value("Content-Length", i) != length;
            // Served, but the connection closes after the answer where a request could hide behind the body: a
            // chunked body (the library's chunk reader takes a chunk longer than its size line and goes on after it)
            // and a body on GET, HEAD or OPTIONS, which no handler reads (it was run as the next request)
            auto serve = [&] {
                if (has_te || (req.method != "POST" && has_length && length != "0"))
                    HttpServer::close_after_response(req, res);
                return httplib::Server::HandlerResponse::Unhandled;
            };
            if (!bad_name.empty()) {
                reply_error(
                    req, res,
                    {400, "malformed header name '" + bad_name.substr(0, 40) + "' (white space in a field name)", "",
                     "invalid_request_error", ""});
            } else if (has_te && !chunked) {
                reply_error(req, res,
                            {501, "unsupported Transfer-Encoding '" + te.substr(0, 60) + "' (only chunked is taken)",
                             "", "invalid_request_error", "unsupported_transfer_encoding"});
            } else if (options) {
                return serve();
            } else if (bad_length) {  // (the library reads "-5" as huge and "abc" as 0)
                reply_error(
                    req, res,
                    {400,
                     "malformed Content-Length header '" + length.substr(0, 40) + "' (expected a decimal byte count)",
                     "", "invalid_request_error", ""});
            } else if (conflicting) {
                reply_error(req, res,
                            {400,
                             chunked ? "a request with both Transfer-Encoding: chunked and Content-Length"
                                     : "Content-Length headers that disagree",
                             "", "invalid_request_error", ""});
            } else if (allow.empty()) {
                reply_error(req, res,
                            {404, "no such endpoint: " + req.method + " " + req.path, "", "invalid_request_error",
                             "not_found"});
            } else if (post ? req.method != "POST" : req.method != "GET" && req.method != "HEAD") {
                res.set_header("Allow", allow);
                reply_error(req, res,
                            {405, req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")", "",
                             "invalid_request_error", "method_not_allowed"});
            } else if (post && !has_length && !chunked) {
                reply_error(req, res,
                            {411, "a POST needs a Content-Length header (or Transfer-Encoding: chunked)", "",
                             "invalid_request_error", "length_required"});
            } else if (too_long) {
                // (at once: the library would read the whole body to skip it)
                reply_error(req, res,
                            {413, "the request body is larger than " + std::to_string(kMaxBodyBytes >> 20) + " MiB", "",
                             "invalid_request_error", "request_too_large"});
            } else {
                return serve();
            }
            // (a POST without a length may have sent a body all the same)
            if (!bad_name.empty() || has_te || (has_length && length != "0") || (post && !has_length))
                HttpServer::close_after_response(req, res);
            return httplib::Server::HandlerResponse::Handled;
        });
        post_json("/v1/chat/completions", true);
        post_json("/v1/completions", false);
        // CORS, as llama-server: any origin may call the API from a browser (the API key, when set, still guards
        // it); a preflight (OPTIONS) gets the methods and the request headers it asks for (Authorization and
        // Content-Type when it names none) and the methods of that path (an unknown path: 404)
        http->set_default_headers({{"Access-Control-Allow-Origin", "*"}});
        http->Options(R"(/.*)", [this](const httplib::Request& req, httplib::Response& res) {
            const std::string allow = allowed_methods(req.path);
            if (allow.empty()) {
                reply_error(req, res,
                            {404, "no such endpoint: " + req.method + " " + req.path, "", "invalid_request_error",
                             "not_found"});
                return;
            }
            const std::string asked = req.get_header_value("Access-Control-Request-Headers");
            res.status = 204;
            res.set_header("Allow", allow);
            res.set_header("Access-Control-Allow-Methods", allow);
            res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
            res.set_header("Access-Control-Max-Age", "86400");
        });
        http->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
            if (!check_key(req, res)) return;
            res.set_content(dump(ojson{{"object", "list"}, {"data", ojson::array({model_object()})}}),
                            "application/json");
        });
        // (a model id may hold a slash: "org/name")
        http->Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
            if (!check_key(req, res)) return;
            const std::string id = req.matches[1].str();
            if (id != model_id) {
                reply_error(req, res,
                            {404, "the model '" + id + "' does not exist (this server has '" + model_id + "')", "model",
                             "invalid_request_error", "model_not_found"});
                return;
            }
            res.set_content(dump(model_object()), "application/json");
        });
        http->Get("/health", [](const httplib::Request&, httplib::Response& res) {
            res.set_content("{\"status\":\"ok\"}", "application/json");
        });
        http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics(), "text/plain; version=0.0.4");
        });
        // The errors that the library answers itself (an empty body): a malformed request line or headers (400),
        // a request that did not arrive in time (408: the library saw a failed read), a URI too long (414), a
        // body too large (413). OpenAI's error JSON, and the connection closes (what follows on it cannot be
        // trusted to start a request).
        http->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            if (HttpServer::request_timed_out()) res.status = 408;
            ApiError e{res.status, "", "", "invalid_request_error", ""};
            switch (res.status) {
                case 400: e.message = "malformed HTTP request (request line or headers)"; break;
                case 404: e.message = "no such endpoint: " + req.method + " " + req.path; break;
                case 408: e.message = http->timeout_message(); break;
                case 413:
                    e.message = "the request body is larger than " + std::to_string(kMaxBodyBytes >> 20) + " MiB";
                    e.code = "request_too_large";
                    break;
                case 414: e.message = "the request line is too long"; break;
                default: e.message = "HTTP error " + std::to_string(res.status);
            }
            if (res.status >= 500) e.type = "server_error";
            n_errors++;
            if (res.status != 404) HttpServer::close_after_response(req, res);
            res.set_content(dump(error_json(e)), "application/json");
        });
        http->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "internal error";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {}
            res.status = 500;
            res.set_content(dump(error_json({500, what, "", "server_error", ""})), "application/json");
        });
    }
};

Server::Server(const ServerParams& params) : impl_(std::make_unique<Impl>()) {
    Impl& s = *impl_;
    s.p = params;
    if (params.n_slots < 1 || params.n_slots > 4096) throw Error(Status::invalid_argument, "-np must be in [1, 4096]");
    if (params.n_ctx < 0 || params.n_ctx == 1)
        throw Error(Status::invalid_argument, "-c must be 0 (the model's trained context) or at least 2");
    require_model_folder(params.model_dir);
    s.tok = std::make_unique<Tokenizer>(Tokenizer::from_folder(params.model_dir));
    // The chat template before the model (a bad one fails at once). A --chat-template-file must also render a
    // conversation of one user message: a template that only fails when used is reported now, not at the first
    // request.
    if (params.chat_template_file.empty()) {
        s.chat = ChatFormat::load(params.model_dir, *s.tok);
    } else {
        const std::string flag = "--chat-template-file: ";
        try {
            s.chat = ChatFormat::load(params.model_dir, *s.tok, params.chat_template_file);
        } catch (const Error& e) {
            throw Error(e.status(), flag + e.what());
        }
        const std::string kProbe = "Hello (hybrid-server start-up check 7f3a)";  // (text no template holds)
        std::string probe;
        try {
            probe = s.chat.render(ojson::array({ojson{{"role", "user"}, {"content", kProbe}}}), nullptr, true,
                                  ojson::object());
        } catch (const Error& e) {
            throw Error(Status::format, flag + params.chat_template_file +
                                            ": the template fails on a one-message conversation: " + e.what());
        }
        // (an empty file, or one that is not a template: every chat request would fail, or ignore its messages)
        if (probe.find_first_not_of(" \t\r\n") == std::string::npos)
            throw Error(Status::format, flag + params.chat_template_file +
                                            ": the template renders a one-message conversation as empty text");
        if (probe.find(kProbe) == std::string::npos)
            throw Error(Status::format, flag + params.chat_template_file +
                                            ": the template leaves the message out of a one-message conversation "
                                            "(its rendering does not contain the message '" +
                                            kProbe + "')");
    }
    const GenerationDefaults g = load_generation_defaults(params.model_dir);
    ModelParams mp;
    mp.device = params.device;
    mp.n_threads = params.n_threads;
    mp.n_ctx = params.n_ctx;
    mp.n_slots = params.n_slots;
    mp.max_batch_tokens = params.max_batch_tokens;
    mp.cuda.graphs = params.cuda_graphs;
    mp.dummy_weights = params.dummy_weights;
    mp.quant = params.quant;
    mp.quant_group = params.quant_group;
    mp.quant_lm_head = params.quant_lm_head;
    s.model = Model::load(params.model_dir, mp);
    if (const int trained = s.model->config().max_position_embeddings; trained > 0 && mp.n_ctx > trained)
        std::fprintf(stderr,
                     "hybrid-server: warning: -c %d is larger than the %d positions the model was trained for "
                     "(max_position_embeddings): output past them may degrade\n",
                     mp.n_ctx, trained);
    // what loads but deserves a note (unused tensors, disagreeing config fields, ignored generation_config.json
    // fields), as hybrid prints it (it printed nothing)
    std::string warning = s.model->load_warning();
    if (!g.warning.empty()) warning += (warning.empty() ? "" : "; ") + g.warning;
    if (!warning.empty()) std::fprintf(stderr, "hybrid-server: warning: %s\n", warning.c_str());
    // more CPU threads than cores: every step waits for threads that take turns (as hybrid and the tools warn)
    if (const int cores = cpu::ThreadPool::default_threads();
        std::string(s.model->backend().name()) == "cpu" && params.n_threads > cores)
        std::fprintf(stderr,
                     "hybrid-server: warning: -t %d is more than the %d cores available: every step waits for threads "
                     "that take turns on a core (slower; -t 0 uses all cores)\n",
                     params.n_threads, cores);
    // (as hybrid-bench and hybrid-compare note the CUDA switches they ignore)
    if (!mp.cuda.graphs && std::string(s.model->backend().name()) != "cuda")
        std::fprintf(stderr, "hybrid-server: note: --no-cuda-graphs only changes the CUDA backend; ignored on %s\n",
                     s.model->backend().name());
    const int V = s.model->config().vocab_size;
    s.tok->require_fits(V, params.model_dir);  // (it answered such a token with a 500 at the first request)
    s.n_valid = std::min(s.tok->n_vocab(), V);
    std::vector<int32_t> banned;
    for (int32_t id = 0; id < s.n_valid; id++)
        if (!s.tok->is_valid(id)) banned.push_back(id);
    for (int id : s.model->config().eos_token_ids) s.eos.push_back(id);
    for (int32_t id : s.tok->eos_ids()) s.eos.push_back(id);
    // A chat answer ends at the end-of-turn token too.
    const int32_t im_end = s.tok->token_id("<|im_end|>");
    if (im_end >= 0) s.eos.push_back(im_end);
    std::sort(s.eos.begin(), s.eos.end());
    s.eos.erase(std::unique(s.eos.begin(), s.eos.end()), s.eos.end());
    // A chat answer also ends where the model starts a new turn or document (the CLI's --chat stops there too).
    s.chat_eos = s.eos;
    for (const char* special : {"<|im_start|>", "<|endoftext|>"})
        if (const int32_t id = s.tok->token_id(special); id >= 0) s.chat_eos.push_back(id);
    std::sort(s.chat_eos.begin(), s.chat_eos.end());
    s.chat_eos.erase(std::unique(s.chat_eos.begin(), s.chat_eos.end()), s.chat_eos.end());
    // Sampling defaults: generation_config.json, else llama.cpp's (as the hybrid CLI).
    SamplerParams d;
    if (g.do_sample && !*g.do_sample) d.temperature = 0;
    if (g.temperature) d.temperature = *g.temperature;
    if (g.top_k) d.top_k = *g.top_k;
    if (g.top_p) d.top_p = *g.top_p;
    if (g.min_p) d.min_p = *g.min_p;
    if (g.repetition_penalty) {
        d.repeat_penalty = *g.repetition_penalty;
        d.repeat_last_n = -1;
    }
    s.defaults = d;
    s.cache = std::make_unique<StateCache>(
        s.model->backend(), params.cache_mb << 20,
        std::string(s.model->backend().name()) == "cpu" ? s.model->arena_bytes() : size_t(0));
    s.model_id = params.alias.empty() ? base_name(params.model_dir) : params.alias;
    s.engine = std::make_unique<Engine>(*s.model, s.n_valid, banned,
                                        [cache = s.cache.get()](size_t bytes) { return cache->allocate(bytes); });
    ConnectionLimits limits;
    limits.max_connections = params.http_threads > 0 ? params.http_threads : std::max(512, 4 * params.n_slots + 8);
    limits.idle_timeout = params.idle_timeout;
    limits.request_timeout = params.request_timeout;
    limits.max_body_bytes = kMaxBodyBytes;
    s.http = std::make_unique<HttpServer>(limits);
    s.http->error_body = [](int status, const std::string& message) {
        return dump(error_json({status, message, "", "invalid_request_error", ""}));
    };
    s.http->error_headers = {{"Access-Control-Allow-Origin", "*"}};
    s.http->set_payload_max_length(kMaxBodyBytes);
    // SO_REUSEADDR alone: cpp-httplib's default also sets SO_REUSEPORT, which lets a second server bind a port that
    // one already listens on (the kernel would then share the connections between them)
    s.http->set_socket_options([](socket_t fd) {
        const int yes = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    s.routes();
}

Server::~Server() {
    impl_->http->stop();
    impl_->engine.reset();
}

int Server::bind() {
    Impl& s = *impl_;
    int port = s.p.port;
    errno = 0;
    if (port == 0) {
        port = s.http->bind_to_any_port(s.p.host);
    } else if (!s.http->bind_to_port(s.p.host, port)) {
        port = -1;
    }
    if (port < 0) {
        // (the library keeps the failed bind's errno; it does not say otherwise)
        const int bind_errno = errno;
        addrinfo hints{}, *found = nullptr;
        hints.ai_socktype = SOCK_STREAM;
        const int gai = getaddrinfo(s.p.host.c_str(), nullptr, &hints, &found);
        if (found) freeaddrinfo(found);
        const std::string why =
            gai != 0 ? "'" + s.p.host + "' is not a known host name or address (" + std::string(gai_strerror(gai)) + ")"
            : bind_errno == EADDRINUSE ? "the address is already in use (another server?)"
            : bind_errno != 0          ? std::string(std::strerror(bind_errno))
                                       : "in use, or not an address of this machine";
        throw Error(Status::io, "cannot listen on " + s.p.host + ":" + std::to_string(s.p.port) + ": " + why);
    }
    s.http->raise_backlog();
    return port;
}

bool Server::serve() { return impl_->http->listen_after_bind(); }

void Server::stop() {
    impl_->stopping = true;  // the requests in flight end (as cancelled), so the HTTP workers can finish
    impl_->wake_waiting();   // (their threads cancel their jobs now, not at their next 100 ms check)
    impl_->engine->wake();
    impl_->http->stop();
}

bool Server::drain(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (impl_->n_waiting.load() > 0 || impl_->n_streams.load() > 0) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

std::string Server::summary() const {
    const Impl& s = *impl_;
    const hy::ModelParams& mp = s.model->params();
    std::string quant = std::string(", weights ") + weight_dtypes_text(s.model->weights());
    const int group = hy::weight_quant_group(mp.quant, mp.quant_group);
    if (mp.quant != hy::WeightQuant::none)
        quant += std::string(" (--quant ") + weight_quant_name(mp.quant) +
                 (group > 0 ? ", groups of " + std::to_string(group) : std::string()) +
                 (mp.quant_lm_head ? ", lm_head too" : "") + ")";
    return "model " + s.model_id + " (" + s.p.model_dir + "), backend " + s.model->backend().name() + quant + ", " +
           std::to_string(s.model->n_slots()) + (s.model->n_slots() == 1 ? " slot of " : " slots of ") +
           std::to_string(s.model->n_ctx()) + " tokens, chat template: " + s.chat.description() + ", state cache " +
           std::to_string(s.p.cache_mb) + " MiB";
}

}  // namespace hy::server
