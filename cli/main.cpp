// hybrid: the command-line program. One-shot generation from -p / -f / --prompt-ids (only the continuation is
// printed, on stdout), or the interactive chat REPL (-i, cli/repl.cpp). Options and exit codes: cli/args.cpp
// (--help). Everything goes through engine.h.
#include <fcntl.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "cli/cli.h"
#include "model/quantize.h"
#include "model/tokenizer.h"

namespace hy::cli {

std::atomic<bool> g_interrupted{false};
bool g_stdin_closed = false;

namespace {

void on_sigint(int) { g_interrupted.store(true); }

bool stderr_tty() { return isatty(STDERR_FILENO) != 0; }

// True when stdout and stderr reach the same file, pipe or terminal (e.g. `2>&1`).
bool same_target() {
    struct stat a, b;
    if (fstat(STDOUT_FILENO, &a) != 0 || fstat(STDERR_FILENO, &b) != 0) return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// The progress of a long prompt's prefill on a terminal ("hybrid: prefill 2048/42000 tokens (4%)", rewritten in
// place, erased at the first token), as llama.cpp shows it. hy_generate polls should_abort between prefill steps
// of max_batch_tokens ids: each poll is one step done.
struct PrefillProgress {
    int n_prompt = 0, step = 512;
    int polls = 0;
    bool shown = false;
    static int poll(void* ud);
    void clear() {
        if (shown) std::fputs("\r\033[K", stderr);
        shown = false;
    }
};

// Per-token output of the one-shot run.
struct OneShot {
    bool print_text = true;
    std::vector<int32_t> ids;
    bool ends_with_newline = false;
    PrefillProgress* progress = nullptr;  // a long prompt's prefill progress (erased at the first token)
};

int PrefillProgress::poll(void* ud) {
    PrefillProgress* p = static_cast<OneShot*>(ud)->progress;
    const int done = std::min(++p->polls * p->step, p->n_prompt);
    std::fprintf(stderr, "\rhybrid: prefill %d/%d tokens (%d%%)", done, p->n_prompt,
                 int(100.0 * done / std::max(p->n_prompt, 1)));
    p->shown = true;
    return interrupted_abort(nullptr);
}

int on_token(const hy_token_info* t, void* ud) {
    auto* s = static_cast<OneShot*>(ud);
    if (s->progress) s->progress->clear();
    if (t->id >= 0) s->ids.push_back(t->id);
    if (s->print_text && t->text_len > 0) {
        if (!write_stdout(t->text, t->text_len)) return 1;  // stop early: the output is lost
        s->ends_with_newline = t->text[t->text_len - 1] == '\n';
    }
    return g_interrupted.load() ? 1 : 0;
}

// The cores available to the process (its affinity mask): what -t 0 uses.
int available_cores() {
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
    return n;
}

// -t as the CPU backend applies it: 0 means one thread per core available to the process.
std::string threads_text(int n_threads) {
    if (n_threads > 0) return std::to_string(n_threads);
    return std::to_string(available_cores()) + " (all cores)";
}

// "31.2 MiB", "9.87 GiB"
std::string mib(size_t bytes) {
    char buf[32];
    const double m = double(bytes) / (1024.0 * 1024.0);
    if (m >= 1024.0)
        std::snprintf(buf, sizeof buf, "%.2f GiB", m / 1024.0);
    else
        std::snprintf(buf, sizeof buf, "%.1f MiB", m);
    return buf;
}

int status_exit_code(int status) {
    switch (status) {
        case HY_ERR_CONTEXT_FULL: return exit_context;
        case HY_ERR_IO: return exit_io;
        case HY_ERR_FORMAT:
        case HY_ERR_MODEL_MISMATCH: return exit_snapshot;
        default: return exit_runtime;
    }
}

}  // namespace

void check_stdout() {
    if (!stdout_ok()) throw Failure(exit_io, hy::tools::stdout_error());
}

int interrupted_abort(void*) { return g_interrupted.load() ? 1 : 0; }

std::string count_of(size_t n, const char* noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

std::string prompt_bytes_error(hy_model* m, size_t bytes, int n_ctx) {
    const size_t at_least = bytes / (3 * size_t(std::max(hy_model_max_token_bytes(m), 1)));
    if (at_least < size_t(n_ctx)) return "";
    return "has " + std::to_string(bytes) + " bytes, so at least " + count_of(at_least, "token") +
           ", but the context holds " + std::to_string(n_ctx) + " (-c): no room to generate";
}

void install_sigint_handler() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocking read returns EINTR
    sigaction(SIGINT, &sa, nullptr);
}

int thinking_mode(const Options& o) { return o.no_think ? HY_THINK_DISABLED : HY_THINK_ENABLED; }

void engine_fail(int code, const std::string& what) {
    throw Failure(code, what.empty() ? std::string(hy_last_error()) : what + ": " + hy_last_error());
}

void check_chat_text(const std::string& text, const std::string& what, bool blank_ok) {
    if (!blank_ok && text.find_first_not_of(" \t\n\v\f\r") == std::string::npos)
        throw Failure(exit_usage, what + " is empty (a chat message needs some text)");
    if (text.find('\0') != std::string::npos)
        throw Failure(exit_usage, what + " holds a NUL byte (\\0 or a zero byte), which a chat message cannot carry");
}

std::string chat_first_turn(hy_model* m, const Options& o, const std::string& user, const std::string& what) {
    return chat_first_turn(m, o, o.system, user, what);
}

std::string chat_first_turn(hy_model* m, const Options& o, const std::string& system, const std::string& user,
                            const std::string& what) {
    check_chat_text(user, what);
    check_chat_text(system, "--system", true);
    std::vector<hy_chat_message> msgs;
    if (!system.empty()) msgs.push_back({"system", system.c_str()});
    msgs.push_back({"user", user.c_str()});
    return chat_render(m, msgs, true, thinking_mode(o), false);
}

std::vector<int32_t> chat_stop_ids(hy_model* m) {
    std::vector<int32_t> ids;
    if (const int32_t eot = hy_chat_end_of_turn_id(m); eot >= 0 && eot < hy_model_n_logits(m)) ids.push_back(eot);
    for (const char* special : {"<|endoftext|>", "<|im_start|>"}) {
        int32_t id = -1;
        int n = 0;
        // (an id past the model's logits, from a tokenizer larger than the model, could never be sampled)
        if (hy_tokenize(m, special, -1, 1, &id, 1, &n) == HY_OK && n == 1 && id < hy_model_n_logits(m) &&
            std::find(ids.begin(), ids.end(), id) == ids.end())
            ids.push_back(id);
    }
    return ids;
}

std::string chat_render(hy_model* m, const std::vector<hy_chat_message>& msgs, bool add_generation_prompt, int thinking,
                        bool continuation) {
    size_t n = 0;
    auto call = [&](char* buf, size_t cap) {
        return continuation ? hy_chat_continue(m, msgs.data(), int(msgs.size()), thinking, buf, cap, &n)
                            : hy_chat_render(m, msgs.data(), int(msgs.size()), add_generation_prompt ? 1 : 0, thinking,
                                             buf, cap, &n);
    };
    int rc = call(nullptr, 0);
    // the model's own files (a tokenizer without the ChatML tokens) are exit 2, as any unsupported model file
    if (rc == HY_ERR_UNSUPPORTED || rc == HY_ERR_FORMAT) engine_fail(exit_model, "chat format");
    if (rc != HY_OK && rc != HY_ERR_INVALID_ARGUMENT) engine_fail(exit_usage, "chat format");
    std::string out(n + 1, '\0');
    if (call(out.data(), out.size()) != HY_OK) engine_fail(exit_usage, "chat format");
    out.resize(n);
    return out;
}

std::vector<int32_t> tokenize(hy_model* m, const std::string& text, const std::string& what) {
    if (!hy::utf8_is_valid(text))  // the tokenizer reads each invalid sequence as U+FFFD, as Hugging Face does
        std::fprintf(stderr, "hybrid: warning: %s is not valid UTF-8; its invalid bytes are read as U+FFFD\n",
                     what.c_str());
    int n = 0;
    hy_tokenize(m, text.data(), ptrdiff_t(text.size()), 1, nullptr, 0, &n);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    if (hy_tokenize(m, text.data(), ptrdiff_t(text.size()), 1, ids.data(), n, &n) != HY_OK)
        engine_fail(exit_runtime, "tokenize");
    return ids;
}

void print_summary(double load_ms, const hy_generate_result& r, bool interrupted, bool stop_line) {
    auto rate = [](int n, double ms) { return ms > 0.0 ? 1000.0 * n / ms : 0.0; };
    if (load_ms >= 0.0) std::fprintf(stderr, "hybrid: load       %10.1f ms\n", load_ms);
    auto tokens = [](int n) { return n == 1 ? "token " : "tokens"; };
    if (r.n_prompt > 0)
        std::fprintf(stderr, "hybrid: prompt     %10.1f ms  %6d %s  %9.1f tok/s\n", r.prompt_ms, r.n_prompt,
                     tokens(r.n_prompt), rate(r.n_prompt, r.prompt_ms));
    else if (r.stop_reason == HY_STOP_CALLBACK)  // (a prefill stopped before its end keeps nothing of the prompt)
        std::fprintf(stderr, "hybrid: prompt     %10.1f ms  stopped before its end (nothing kept)\n", r.prompt_ms);
    else
        std::fprintf(stderr, "hybrid: prompt     %10.1f ms  %6d tokens          - tok/s\n", r.prompt_ms, r.n_prompt);
    // the rate counts decode steps: the first generated id comes from the prompt's logits (llama.cpp's "runs")
    if (r.n_decoded > 0)
        std::fprintf(stderr, "hybrid: generation %10.1f ms  %6d %s  %9.1f tok/s\n", r.generate_ms, r.n_generated,
                     tokens(r.n_generated), rate(r.n_decoded, r.generate_ms));
    else
        std::fprintf(stderr, "hybrid: generation %10.1f ms  %6d %s          - tok/s\n", r.generate_ms, r.n_generated,
                     tokens(r.n_generated));
    if (!stop_line) return;
    const bool ctrl_c = r.stop_reason == HY_STOP_CALLBACK && (interrupted || g_interrupted.load());
    std::fprintf(stderr, "hybrid: stop: %s\n", ctrl_c ? "interrupted (Ctrl-C)" : hy_stop_reason_name(r.stop_reason));
}

namespace {

struct Handles {
    hy_model* m = nullptr;
    hy_context* c = nullptr;
    hy_sampler* s = nullptr;
    ~Handles() {
        hy_sampler_free(s);
        hy_context_free(c);
        hy_model_free(m);
    }
};

int run(int argc, char** argv) {
    Options o;
    int code = exit_ok;
    if (!parse_options(argc, argv, o, &code)) return code;
    // (-i reads the conversation from standard input: a closed one ended the session at once, exit 0, as -f - said)
    if (o.interactive && g_stdin_closed)
        throw Failure(exit_io, "-i: cannot read standard input: it is closed (the chat is read from it)");
    const bool show_summary = o.verbose || stderr_tty();

    // load
    Handles h;
    hy_model_params mp = hy_model_default_params();
    mp.device = o.device;
    mp.quant = o.quant;
    mp.quant_group = o.quant_group;
    mp.quant_lm_head = o.quant_lm_head ? 1 : 0;
    mp.n_threads = o.n_threads;
    mp.cuda_graphs = o.cuda_graphs ? 1 : 0;
    mp.n_ctx = o.n_ctx;
    if (o.has_batch) mp.n_slots = std::min<int>(o.parallel, int(o.batch_prompts.size()));
    if (stderr_tty()) {  // "hybrid: loading DIR ... NN%", cleared when the load returns
        std::fprintf(stderr, "hybrid: loading %s ...", o.model_dir.c_str());
        mp.progress_user_data = const_cast<char*>(o.model_dir.c_str());
        mp.progress = [](float f, void* dir) {
            static int shown = -1;
            const int pct = int(f * 100.0f);
            if (pct == shown || pct >= 100) return;
            shown = pct;
            std::fprintf(stderr, "\r\033[Khybrid: loading %s ... %d%%", static_cast<const char*>(dir), pct);
            std::fflush(stderr);
        };
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = hy_model_load(o.model_dir.c_str(), &mp, &h.m);
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (stderr_tty()) std::fprintf(stderr, "\r\033[K");
    if (rc == HY_ERR_OUT_OF_MEMORY) {  // most often the KV cache of a large -c (times the sequences of -np)
        const std::string np = mp.n_slots > 1 ? " and the " + std::to_string(mp.n_slots) + " sequences of -np" : "";
        // (the load's own check before the allocation gives the sizes and the context that would fit)
        if (std::strstr(hy_last_error(), "would fit"))
            throw Failure(exit_model, std::string("cannot load the model: ") + hy_last_error() + " (asked for -c " +
                                          std::to_string(o.n_ctx) + np + ")");
        throw Failure(exit_model, std::string("cannot load the model: ") + hy_last_error() +
                                      " (the KV cache and states grow with -c " + std::to_string(o.n_ctx) + np +
                                      ": a smaller -c may fit)");
    }
    if (rc != HY_OK) engine_fail(exit_model, "cannot load the model");
    o.n_ctx = hy_model_n_ctx(h.m);  // (-c 0: the trained context)
    if (*hy_model_load_warning(h.m)) std::fprintf(stderr, "hybrid: warning: %s\n", hy_model_load_warning(h.m));
    // (as hybrid-bench and hybrid-compare note the CUDA switches they ignore)
    if (!o.cuda_graphs && std::strcmp(hy_model_backend(h.m), "cuda") != 0)
        std::fprintf(stderr, "hybrid: note: --no-cuda-graphs only changes the CUDA backend; ignored on %s\n",
                     hy_model_backend(h.m));
    // the backend, the device and the memory the model holds: on a terminal (with the summary) or with --verbose
    if (show_summary) {
        const bool cpu = std::strcmp(hy_model_backend(h.m), "cpu") == 0;
        // the loaded weights' formats, and the quantization chosen at load (--quant) with its group and lm_head
        std::string quant = std::string(", weights ") + hy_model_weights(h.m);
        if (o.quant == HY_QUANT_FP8) quant += " (quantized to FP8 at load, --quant fp8)";
        if (o.quant == HY_QUANT_INT8 || o.quant == HY_QUANT_INT4) {
            const hy::WeightQuant q = o.quant == HY_QUANT_INT8 ? hy::WeightQuant::int8 : hy::WeightQuant::int4;
            quant += std::string(" (quantized to ") + hy::weight_quant_name(q) + " at load in groups of " +
                     std::to_string(hy::weight_quant_group(q, o.quant_group)) +
                     (o.quant_lm_head ? ", lm_head too" : "") + ")";
        }
        std::fprintf(stderr, "hybrid: loaded on %s (%s): %s of %s memory (weights and state for -c %d), vocab %d%s\n",
                     hy_model_backend(h.m), hy_model_device(h.m), mib(hy_model_arena_bytes(h.m)).c_str(),
                     cpu ? "host" : "GPU", o.n_ctx, hy_model_n_vocab(h.m), quant.c_str());
    }
    if (std::strcmp(hy_model_backend(h.m), "cpu") == 0 && o.n_threads > available_cores())
        std::fprintf(stderr,
                     "hybrid: warning: -t %d is more than the %d cores available: every step waits for threads "
                     "that take turns on a core (slower; -t 0 uses all cores)\n",
                     o.n_threads, available_cores());
    // sampling options not given on the command line take the model folder's generation_config.json values, as
    // vLLM takes them
    hy_sampler_params recommended;
    int from_file = std::max(hy_model_sampler_defaults(h.m, &recommended), 0) & ~o.sampling_given;
    // the file's whole-context window goes with its own penalty: a --repeat-penalty keeps --repeat-last-n's default
    if (o.sampling_given & HY_SAMPLER_REPEAT_PENALTY) from_file &= ~HY_SAMPLER_REPEAT_LAST_N;
    if (from_file & HY_SAMPLER_TEMPERATURE) o.sampling.temperature = recommended.temperature;
    if (from_file & HY_SAMPLER_TOP_K) o.sampling.top_k = recommended.top_k;
    if (from_file & HY_SAMPLER_TOP_P) o.sampling.top_p = recommended.top_p;
    if (from_file & HY_SAMPLER_MIN_P) o.sampling.min_p = recommended.min_p;
    if (from_file & HY_SAMPLER_REPEAT_PENALTY) o.sampling.repeat_penalty = recommended.repeat_penalty;
    if (from_file & HY_SAMPLER_REPEAT_LAST_N) o.sampling.repeat_last_n = recommended.repeat_last_n;
    if (o.verbose) {
        std::string taken;
        for (const auto& [bit, name] : {std::pair<int, const char*>{HY_SAMPLER_TEMPERATURE, "temp"},
                                        {HY_SAMPLER_TOP_K, "top-k"},
                                        {HY_SAMPLER_TOP_P, "top-p"},
                                        {HY_SAMPLER_MIN_P, "min-p"},
                                        {HY_SAMPLER_REPEAT_PENALTY, "repeat-penalty"},
                                        {HY_SAMPLER_REPEAT_LAST_N, "repeat-last-n"}})
            if (from_file & bit) taken += std::string(taken.empty() ? "" : ", ") + name;
        const std::string window = o.sampling.repeat_last_n < 0 ? std::string("the whole context")
                                                                : "last " + std::to_string(o.sampling.repeat_last_n);
        // temperature 0 picks the arg max: the truncation samplers do not apply (the penalties still do)
        // (and the seed is not used: it is not printed)
        char sampling[200];
        if (o.sampling.temperature <= 0.0f)
            std::snprintf(sampling, sizeof sampling, "temp 0 (greedy)");
        else
            std::snprintf(sampling, sizeof sampling, "seed %llu, temp %.3g, top-k %s, top-p %.3g, min-p %.3g",
                          (unsigned long long)o.sampling.seed, o.sampling.temperature,
                          o.sampling.top_k > 0 ? std::to_string(o.sampling.top_k).c_str() : "off", o.sampling.top_p,
                          o.sampling.min_p);
        std::fprintf(stderr,
                     "hybrid: model %s, ctx %d, threads %s, %s, repeat-penalty %.3g (%s), presence %.3g, "
                     "frequency %.3g%s%s%s\n",
                     o.model_dir.c_str(), o.n_ctx, threads_text(o.n_threads).c_str(), sampling,
                     o.sampling.repeat_penalty, window.c_str(), o.sampling.presence_penalty,
                     o.sampling.frequency_penalty, taken.empty() ? "" : " (", taken.c_str(),
                     taken.empty() ? "" : " from generation_config.json)");
    }
    if (const int trained = hy_model_n_ctx_train(h.m); trained > 0 && o.n_ctx > trained)
        std::fprintf(stderr,
                     "hybrid: warning: -c %d is larger than the %d positions the model was trained for "
                     "(max_position_embeddings): output past them may degrade\n",
                     o.n_ctx, trained);
    if (o.no_think) {  // a tokenizer without <think>/</think> renders both modes alike: the option does nothing
        char on[256], off[256];
        size_t n_on = 0, n_off = 0;
        if (hy_chat_render(h.m, nullptr, 0, 1, HY_THINK_ENABLED, on, sizeof on, &n_on) == HY_OK &&
            hy_chat_render(h.m, nullptr, 0, 1, HY_THINK_DISABLED, off, sizeof off, &n_off) == HY_OK && n_on == n_off &&
            std::memcmp(on, off, n_on) == 0)
            std::fprintf(stderr,
                         "hybrid: warning: --no-think has no effect: the tokenizer has no <think> and "
                         "</think> tokens\n");
    }
    if (o.has_batch) return run_batch(o, h.m, load_ms);
    if (hy_context_new(h.m, nullptr, &h.c) != HY_OK) engine_fail(exit_runtime, "");
    if (hy_sampler_new(h.m, &o.sampling, &h.s) != HY_OK) engine_fail(exit_usage, "");
    install_sigint_handler();

    if (o.interactive) return run_repl(o, h.m, h.c, h.s, load_ms);

    // prompt
    std::vector<int32_t> ids;
    if (o.has_prompt_ids) {
        ids = o.prompt_ids;
        for (int32_t id : ids)
            if (id >= hy_model_n_vocab(h.m))
                throw Failure(exit_usage, "--prompt-ids: id " + std::to_string(id) + " is not in the vocabulary (" +
                                              std::to_string(hy_model_n_vocab(h.m)) + " ids)");
    } else {
        if (const std::string e = prompt_bytes_error(h.m, o.prompt.size(), o.n_ctx); !e.empty())
            throw Failure(exit_context, "the prompt " + e);  // (before tokenizing 20 MB for nothing)
        ids = tokenize(h.m, o.chat ? chat_first_turn(h.m, o, o.prompt, "the prompt") : o.prompt, "the prompt");
    }
    if (ids.empty()) throw Failure(exit_usage, "the prompt is empty (no tokens)");
    if (int(ids.size()) >= o.n_ctx)
        throw Failure(exit_context, "the prompt has " + count_of(ids.size(), "token") + " but the context holds " +
                                        std::to_string(o.n_ctx) + " (-c): no room to generate");

    // generate
    OneShot st;
    st.print_text = !o.has_prompt_ids;
    std::vector<const char*> stops;
    for (const auto& s : o.stop) stops.push_back(s.c_str());
    hy_generate_params gp = hy_generate_default_params();
    gp.max_tokens = o.n_predict;
    gp.stop = stops.data();
    gp.n_stop = int(stops.size());
    gp.on_token = on_token;
    gp.user_data = &st;
    gp.should_abort = interrupted_abort;  // Ctrl-C during a long prompt's prefill
    PrefillProgress progress{int(ids.size()), mp.max_batch_tokens};
    if (stderr_tty() && int(ids.size()) >= 4 * mp.max_batch_tokens) {  // a long prompt: its progress on stderr
        st.progress = &progress;
        gp.should_abort = PrefillProgress::poll;
    }
    gp.skip_special = o.chat ? 0 : 1;  // a chat answer shows <think>/</think>, as the REPL does
    const std::vector<int32_t> chat_stops = o.chat && !o.ignore_eos ? chat_stop_ids(h.m) : std::vector<int32_t>{};
    gp.ignore_eos = o.ignore_eos;
    gp.stop_ids = chat_stops.empty() ? nullptr : chat_stops.data();
    gp.n_stop_ids = int(chat_stops.size());
    hy_generate_result res{};
    for (int32_t id : ids) hy_sampler_accept(h.s, id);  // penalties look at the prompt too (as llama.cpp)
    const int g = hy_generate(h.c, h.s, ids.data(), int(ids.size()), &gp, &res);
    progress.clear();  // (a stopped prefill or an error: no token came)
    if (g != HY_OK) engine_fail(status_exit_code(g), "generation failed");
    check_stdout();
    if (o.has_prompt_ids) {
        for (size_t i = 0; i < st.ids.size(); i++) std::printf("%s%d", i ? "," : "", st.ids[i]);
        std::printf("\n");
    } else if (!st.ends_with_newline && (isatty(STDOUT_FILENO) || (show_summary && same_target()))) {
        std::printf("\n");  // the shell prompt or the summary starts on a new line
    }
    check_stdout();
    if (show_summary) print_summary(load_ms, res);
    return res.stop_reason == HY_STOP_CALLBACK && g_interrupted.load() ? exit_interrupted : exit_ok;
}

}  // namespace
}  // namespace hy::cli

// A closed standard descriptor (e.g. `>&-`) would be reused by the next open() (a model file could become
// "stdout"): put /dev/null there, read-only, so that writes still fail (EBADF) and are reported.
static void guard_std_fds() {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        if (fd == 0) hy::cli::g_stdin_closed = true;
        const int n = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

int main(int argc, char** argv) {
    guard_std_fds();
    try {
        int code = hy::cli::run(argc, argv);
        // a write error not reported yet (an error exit has printed its message already)
        if (!hy::cli::stdout_ok() && (code == hy::cli::exit_ok || code == hy::cli::exit_interrupted)) {
            std::fprintf(stderr, "hybrid: error: %s\n", hy::tools::stdout_error().c_str());
            code = hy::cli::exit_io;
        }
        return code;
    } catch (const hy::cli::Failure& f) {
        std::fflush(stdout);
        std::fprintf(stderr, "hybrid: error: %s\n", f.what());
        return f.code;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "hybrid: error: %s\n", e.what());
        return hy::cli::exit_runtime;
    }
}
