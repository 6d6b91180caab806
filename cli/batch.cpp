// hybrid --batch-file: every prompt of a file generated together through the engine's continuous batching
// (hy_batch_*), one JSON object per prompt on stdout.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/cli.h"

namespace hy::cli {

namespace {

std::string detokenize(hy_model* m, const int32_t* ids, int n, int skip_special) {
    std::string out(64, '\0');
    size_t need = 0;
    int rc = hy_detokenize(m, ids, n, skip_special, out.data(), out.size(), &need);
    if (rc == HY_ERR_INVALID_ARGUMENT && need + 1 > out.size()) {
        out.assign(need + 1, '\0');
        rc = hy_detokenize(m, ids, n, skip_special, out.data(), out.size(), &need);
    }
    if (rc != HY_OK) engine_fail(exit_runtime, "detokenize");
    out.resize(need);
    return out;
}

// "batch prompt 2 (line 4)": the index as the JSON "index" (from 0) and the line of the file (from 1).
std::string prompt_name(const Options& o, size_t i) {
    std::string s = "batch prompt " + std::to_string(i);
    if (i < o.batch_lines.size()) s += " (line " + std::to_string(o.batch_lines[i]) + ")";
    return s;
}

}  // namespace

int run_batch(const Options& o, hy_model* m, double load_ms) {
    const bool show_summary = o.verbose || isatty(STDERR_FILENO);
    hy_batch* b = nullptr;
    if (hy_batch_new(m, 0, &b) != HY_OK) engine_fail(exit_runtime, "cannot start the batch");
    struct Free {
        hy_batch* b;
        ~Free() { hy_batch_free(b); }
    } guard{b};

    // Tokenize every prompt first. A bad prompt fails alone (as a request does in vLLM): one longer than the
    // context, a --chat message that is blank or holds a NUL byte, one without tokens. Its line carries "error"
    // instead of a result, the error is also printed on stderr, the others run, and the exit code is then the first
    // failed prompt's (exit_context for a prompt too long, exit_usage for the others).
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> errors(o.batch_prompts.size());
    int n_failed = 0, failed_code = exit_ok;
    auto fail_row = [&](size_t i, int code, const std::string& msg) {
        errors[i] = msg;
        std::fprintf(stderr, "hybrid: error: %s: %s\n", prompt_name(o, i).c_str(), msg.c_str());
        if (n_failed++ == 0) failed_code = code;
    };
    if (o.chat) check_chat_text(o.system, "--system", true);  // (a bad --system fails every prompt: the whole batch)
    for (size_t i = 0; i < o.batch_prompts.size(); i++) {
        const std::string& line = o.batch_prompts[i];
        std::vector<int32_t> ids;
        if (const std::string e = prompt_bytes_error(m, line.size(), o.n_ctx); !e.empty()) {
            fail_row(i, exit_context, "the prompt " + e);  // (not tokenized: far too long)
            prompts.emplace_back();
            continue;
        }
        try {
            ids = tokenize(m, o.chat ? chat_first_turn(m, o, line, "the message") : line, prompt_name(o, i));
        } catch (const Failure& f) {
            if (f.code != exit_usage) throw;  // (an engine failure stops the batch)
            fail_row(i, f.code, f.what());
            prompts.emplace_back();
            continue;
        }
        if (ids.empty())
            fail_row(i, exit_usage, "the prompt is empty (no tokens)");
        else if (int(ids.size()) >= o.n_ctx)
            fail_row(i, exit_context,
                     "the prompt has " + count_of(ids.size(), "token") + " but the context holds " +
                         std::to_string(o.n_ctx) + " (-c): no room to generate");
        prompts.push_back(std::move(ids));
    }
    std::vector<int> ids(prompts.size(), -1);
    int n_prompt_tokens = 0;
    const std::vector<int32_t> chat_stops = o.chat && !o.ignore_eos ? chat_stop_ids(m) : std::vector<int32_t>{};
    for (size_t i = 0; i < prompts.size(); i++) {
        if (!errors[i].empty()) continue;
        hy_request_params rp = hy_request_default_params();
        rp.stop_ids = chat_stops.data();
        rp.n_stop_ids = int(chat_stops.size());
        rp.sampling = o.sampling;
        rp.ignore_eos = o.ignore_eos;
        rp.sampling.seed = o.sampling.seed + uint64_t(i);
        // -n -1: until EOS or the context is full (at most n_ctx ids can follow a prompt), as in one-shot mode
        rp.max_tokens = o.n_predict < 0 ? o.n_ctx + 1 : o.n_predict;
        if (hy_batch_submit(b, prompts[i].data(), int(prompts[i].size()), &rp, &ids[i]) != HY_OK)
            engine_fail(exit_usage, prompt_name(o, i));
        n_prompt_tokens += int(prompts[i].size());
    }

    // Step until done, printing each result as soon as it and every earlier one are finished (input order).
    install_sigint_handler();
    const auto t0 = std::chrono::steady_clock::now();
    size_t next_out = 0;
    int n_generated = 0, running = n_failed < int(prompts.size()) ? 1 : 0, steps = 0;
    while (next_out < prompts.size()) {
        if (g_interrupted.load()) {
            for (int id : ids)
                if (id >= 0) hy_batch_cancel(b, id);
        }
        if (running > 0) {
            if (hy_batch_step(b, &running) != HY_OK) engine_fail(exit_runtime, "generation failed");
            steps++;
        }
        for (; next_out < prompts.size(); next_out++) {
            if (!errors[next_out].empty()) {
                nlohmann::ordered_json j = {{"index", next_out},
                                            {"prompt", o.batch_prompts[next_out]},
                                            {"n_prompt", prompts[next_out].size()},
                                            {"error", errors[next_out]}};
                const std::string line =
                    j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
                if (!write_stdout(line.data(), line.size())) check_stdout();
                continue;
            }
            const int32_t* toks = nullptr;
            const float* lps = nullptr;
            int n = 0, reason = 0, done = 0;
            hy_batch_result(b, ids[next_out], &toks, &lps, &n, &reason, &done);
            if (!done) break;
            n_generated += n;
            // the text as one-shot mode prints it: without the id that ended the request, and with --chat special
            // tokens (<think>) shown, as the REPL and --chat -p show them
            const int n_text = reason == HY_STOP_EOS && n > 0 ? n - 1 : n;
            nlohmann::ordered_json j = {{"index", next_out},
                                        {"prompt", o.batch_prompts[next_out]},
                                        {"text", detokenize(m, toks, n_text, o.chat ? 0 : 1)},
                                        {"ids", std::vector<int32_t>(toks, toks + n)},
                                        {"logprobs", std::vector<float>(lps, lps + n)},
                                        {"n_prompt", prompts[next_out].size()},
                                        {"stop_reason", hy_stop_reason_name(reason)}};
            const std::string line = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
            if (!write_stdout(line.data(), line.size())) check_stdout();  // stops the batch: the output is lost
        }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (show_summary) {
        std::fprintf(stderr, "hybrid: load       %10.1f ms\n", load_ms);
        // throughput over the whole batch (prefill included), as vLLM reports output tokens per second
        char rate[32] = "-";
        if (n_generated > 0 && ms > 0) std::snprintf(rate, sizeof rate, "%.1f", 1000.0 * n_generated / ms);
        std::fprintf(stderr, "hybrid: batch      %10.1f ms  %s (%s), %d generated in %s, %s output tok/s\n", ms,
                     count_of(prompts.size() - size_t(n_failed), "prompt").c_str(),
                     count_of(size_t(n_prompt_tokens), "token").c_str(), n_generated,
                     count_of(size_t(steps), "step").c_str(), rate);
        if (n_failed > 0)
            std::fprintf(stderr, "hybrid: %s failed (see \"error\")\n", count_of(size_t(n_failed), "prompt").c_str());
    }
    if (g_interrupted.load()) {
        std::fputs("hybrid: interrupted (Ctrl-C): the unfinished prompts end with stop_reason \"cancelled\"\n", stderr);
        return exit_interrupted;
    }
    return failed_code;
}

}  // namespace hy::cli
