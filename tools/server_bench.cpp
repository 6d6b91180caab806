// hybrid-server-bench: load figures of a running hybrid-server (or any OpenAI-compatible server).
//
//   hybrid-server-bench [--port 8080] [--host H] [-c 1,4,8,16,64] [-p 512] [-n 128] [-r 1] [--vocab 0] [--turns T]
//                       [--turn-text N]
//
// Load: for each client count C, C clients each send -r streamed /v1/completions requests one after another: a
// prompt of -p random token ids (a new draw per request, cache_prompt off), -n new tokens (ignore_eos, greedy).
// The ids are drawn from [min(1000, V / 2), V), V the --vocab given, or by default (--vocab 0) the n_vocab that the
// server reports in GET /v1/models (data[0].meta.n_vocab). Printed per C: the requests, how many failed,
// aggregate tok/s (every generated token over the wall time of the whole wave), tok/s per client, and the time to
// first token (the request's start to its first streamed text) mean, p50 and p90.
// Multi-turn (--turns T > 0): one chat of T turns (a user message of about --turn-text words, an answer of -n
// tokens, streamed), run twice: with the conversation-state cache off (cache_prompt false) and on; a run stops at
// its first failed turn. Printed per turn (numbered from 1): how many of the two runs failed it, the prompt tokens,
// the cached tokens, the time to first token and the turn's latency in each run ("-" where it did not complete).
// Before any of that the server must answer GET /v1/models ("cannot connect to HOST:PORT" when nothing answers).
// Exit status (as hybrid's): 0; 1 bad arguments (a one-line message); 6 the server cannot be reached or a request
// failed (the figures are still printed, with the failed counts).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <httplib.h>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/arg_error.h"
#include "cli/stdout_check.h"

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// --api-key: sent as "Authorization: Bearer KEY" with every request (empty: none).
std::string g_api_key;

httplib::Client client(const std::string& host, int port) {
    httplib::Client cli(host, port);
    if (!g_api_key.empty()) cli.set_bearer_token_auth(g_api_key);
    return cli;
}

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

struct Outcome {
    bool ok = false;
    std::string error;
    double ttft_ms = 0, total_ms = 0;
    int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
    std::string text;
};

// One streamed request: the body's "stream" is set; text comes from choices[0].text or .delta.content.
Outcome stream_request(const std::string& host, int port, const std::string& path, ojson body) {
    body["stream"] = true;
    body["stream_options"] = ojson{{"include_usage", true}};
    Outcome o;
    httplib::Client cli = client(host, port);
    cli.set_read_timeout(600, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string buf;
    const auto t0 = Clock::now();
    bool first = true;
    std::string head;  // (the first bytes as received: an error response is JSON, not events)
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (head.size() < 1024) head.append(data, std::min(n, 1024 - head.size()));
        buf.append(data, n);
        size_t e;
        while ((e = buf.find("\n\n")) != std::string::npos) {
            const std::string ev = buf.substr(0, e);
            buf.erase(0, e + 2);
            if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
            const ojson j = ojson::parse(ev.substr(6), nullptr, false);
            if (j.is_discarded()) continue;
            if (j.contains("error")) {
                o.error = j["error"].value("message", "error");
                continue;
            }
            if (j.contains("usage") && j["usage"].is_object()) {
                o.prompt_tokens = j["usage"].value("prompt_tokens", 0);
                o.completion_tokens = j["usage"].value("completion_tokens", 0);
                if (j["usage"].contains("prompt_tokens_details"))
                    o.cached_tokens = j["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
            }
            if (!j.contains("choices") || j["choices"].empty()) continue;
            const ojson& c = j["choices"][0];
            std::string piece;
            if (c.contains("text") && c["text"].is_string()) piece = c["text"].get<std::string>();
            if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
                piece = c["delta"]["content"].get<std::string>();
            if (!piece.empty() && first) {
                o.ttft_ms = ms(t0, Clock::now());
                first = false;
            }
            o.text += piece;
        }
        return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    o.total_ms = ms(t0, Clock::now());
    if (!sent) {
        o.error = "request failed: " + httplib::to_string(err);
    } else if (res.status != 200) {
        const std::string& text = res.body.empty() ? head : res.body;
        const ojson j = ojson::parse(text, nullptr, false);
        o.error =
            "HTTP " + std::to_string(res.status) + ": " +
            (!j.is_discarded() && j.contains("error") && j["error"].is_object() ? j["error"].value("message", text)
                                                                                : text);
    } else if (o.error.empty()) {
        o.ok = true;
    }
    if (first) o.ttft_ms = o.total_ms;
    return o;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

// A bad command-line value: exit 1 with the message.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The int option `name` (long name) of r, strictly (a whole decimal number, "12abc" refused) in [lo, hi].
int int_option(const cxxopts::ParseResult& r, const char* name, int lo, int hi) {
    const std::string text = r[name].as<std::string>();
    int v = 0;
    if (!hy::parse_int(text, &v) || v < lo || v > hi)
        throw UsageError("invalid value '" + text + "' for --" + name + " (an integer in [" + std::to_string(lo) +
                         ", " + std::to_string(hi) + "])");
    return v;
}

// GET /v1/models: throws std::runtime_error "cannot connect to HOST:PORT (...)" when nothing answers, and one line
// with the HTTP status (and the error's message, when the body is OpenAI's error JSON) when it is not 200; returns
// the server's n_vocab (data[0].meta.n_vocab), 0 when it does not say.
int server_vocab(const std::string& host, int port) {
    httplib::Client cli = client(host, port);
    cli.set_connection_timeout(10, 0);
    cli.set_read_timeout(60, 0);
    auto res = cli.Get("/v1/models");
    if (!res) {
        const httplib::Error e = res.error();
        const std::string why = e == httplib::Error::Connection ? "connection refused, or the host is unreachable"
                                : e == httplib::Error::ConnectionTimeout ? "no answer within 10 s"
                                : e == httplib::Error::Read              ? "the connection closed without an answer"
                                                                         : httplib::to_string(e);
        throw std::runtime_error("cannot connect to " + host + ":" + std::to_string(port) + " (" + why +
                                 "; is hybrid-server running there?)");
    }
    const ojson j = ojson::parse(res->body, nullptr, false);
    if (res->status != 200) {
        std::string why;
        if (!j.is_discarded() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
            j["error"]["message"].is_string())
            why = ": " + j["error"]["message"].get<std::string>();
        throw std::runtime_error("GET /v1/models at " + host + ":" + std::to_string(port) + " answered HTTP " +
                                 std::to_string(res->status) + why +
                                 (res->status == 401 ? " (give the server's key with --api-key)" : ""));
    }
    if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return 0;
    const ojson& m = j["data"][0];
    if (!m.is_object() || !m.contains("meta") || !m["meta"].is_object()) return 0;
    const ojson& v = m["meta"].contains("n_vocab") ? m["meta"]["n_vocab"] : ojson();
    return v.is_number_integer() && v.get<int64_t>() > 1 && v.get<int64_t>() <= INT32_MAX ? v.get<int>() : 0;
}

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options opts("hybrid-server-bench", "Load figures of a running hybrid-server.");
    // clang-format off
    opts.add_options()
        ("host", "server address", cxxopts::value<std::string>()->default_value("127.0.0.1"))
        ("port", "server port", cxxopts::value<std::string>()->default_value("8080"))
        ("c,clients", "client counts, comma-separated, each in [1, 1024]",
         cxxopts::value<std::string>()->default_value("1,4,8,16,64"))
        ("p,prompt", "prompt tokens (random ids)", cxxopts::value<std::string>()->default_value("512"))
        ("n,new", "new tokens per request", cxxopts::value<std::string>()->default_value("128"))
        ("r,rounds", "requests per client, in [1, 1024]", cxxopts::value<std::string>()->default_value("1"))
        ("vocab", "prompt ids are drawn from [min(1000, V / 2), V) for this V (0: the server's n_vocab)",
         cxxopts::value<std::string>()->default_value("0"))
        ("turns", "multi-turn chat: turns (0: none)", cxxopts::value<std::string>()->default_value("0"))
        ("turn-text", "multi-turn chat: words per user message", cxxopts::value<std::string>()->default_value("64"))
        ("api-key", "the server's --api-key (sent as Authorization: Bearer KEY)", cxxopts::value<std::string>())
        ("h,help", "print this help");
    // clang-format on
    std::string host;
    int port = 0, prompt_len = 0, n_new = 0, rounds = 0, vocab = 0, turns = 0, turn_text = 0;
    std::vector<int32_t> clients;
    try {
        if (const std::string e = hy::first_single_dash_word_error(opts, argc, argv); !e.empty()) throw UsageError(e);
        auto r = hy::parse_split(opts, argc, argv);
        if (r.count("help")) {
            std::printf(
                "%s\nExit codes (as hybrid's): 0 success; 1 bad arguments; 5 stdout could not be written; 6 the "
                "server cannot be reached or a request failed.\n",
                opts.help().c_str());
            if (hy::tools::stdout_ok()) return 0;
            std::fprintf(stderr, "hybrid-server-bench: %s\n", hy::tools::stdout_error().c_str());
            return 5;
        }
        if (!r.unmatched().empty()) throw UsageError("unexpected argument '" + r.unmatched()[0] + "' (see --help)");
        if (const std::string bad = hy::repeated_option(r); !bad.empty()) throw UsageError(bad);
        host = r["host"].as<std::string>();
        if (r.count("api-key")) {
            g_api_key = r["api-key"].as<std::string>();
            if (g_api_key.empty()) throw UsageError("--api-key must not be empty");
        }
        if (host.empty()) throw UsageError("--host must not be empty");
        port = int_option(r, "port", 1, 65535);
        prompt_len = int_option(r, "prompt", 1, 1 << 20);
        n_new = int_option(r, "new", 1, 1 << 20);
        rounds = int_option(r, "rounds", 1, 1024);
        vocab = int_option(r, "vocab", 0, INT32_MAX);
        if (vocab == 1) throw UsageError("invalid value '1' for --vocab (0: the server's, else at least 2)");
        turns = int_option(r, "turns", 0, 1024);
        turn_text = int_option(r, "turn-text", 1, 1 << 16);
        std::string bad;
        const std::string list = r["clients"].as<std::string>();
        if (!hy::parse_int_list(list, 1, 1024, clients, &bad))
            throw UsageError("invalid value '" + bad + "' in --clients '" + list +
                             "' (client counts in [1, 1024], comma-separated)");
    } catch (const UsageError& e) {
        std::fprintf(stderr, "hybrid-server-bench: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {  // cxxopts
        std::fprintf(stderr, "hybrid-server-bench: %s (see --help)\n",
                     hy::parse_error_message(e.what(), argc, argv).c_str());
        return 1;
    }
    constexpr int kFailed = 6;
    try {
        const int reported = server_vocab(host, port);
        if (vocab == 0 && turns == 0) {
            if (reported == 0)
                throw std::runtime_error("the server at " + host + ":" + std::to_string(port) +
                                         " does not report n_vocab in GET /v1/models: give --vocab");
            vocab = reported;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-server-bench: %s\n", e.what());
        return kFailed;
    }
    const int lo = std::min(1000, vocab / 2);
    bool failed = false;
    std::atomic<uint64_t> draw{1};
    if (turns == 0) {
        std::printf(
            "| clients | requests | failed | prompt | new | aggregate tok/s | tok/s per client | TTFT mean ms | "
            "TTFT p50 ms | TTFT p90 ms |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    }
    for (int c : turns == 0 ? clients : std::vector<int32_t>{}) {
        std::vector<Outcome> out(size_t(c) * size_t(rounds));
        std::vector<std::thread> threads;
        const auto t0 = Clock::now();
        for (int k = 0; k < c; k++)
            threads.emplace_back([&, k] {
                for (int i = 0; i < rounds; i++) {
                    std::mt19937_64 rng(draw++);
                    ojson ids = ojson::array();
                    for (int t = 0; t < prompt_len; t++) ids.push_back(lo + int(rng() % uint64_t(vocab - lo)));
                    const ojson body{{"prompt", ids},
                                     {"max_tokens", n_new},
                                     {"temperature", 0},
                                     {"ignore_eos", true},
                                     {"cache_prompt", false}};
                    out[size_t(k) * size_t(rounds) + size_t(i)] = stream_request(host, port, "/v1/completions", body);
                }
            });
        for (auto& t : threads) t.join();
        const double wall = ms(t0, Clock::now());
        std::vector<double> ttft;
        uint64_t tokens = 0;
        size_t n_failed = 0;
        const Outcome* first_failure = nullptr;
        for (const Outcome& o : out) {
            if (!o.ok) {
                n_failed++;
                if (!first_failure) first_failure = &o;
                continue;
            }
            ttft.push_back(o.ttft_ms);
            tokens += uint64_t(o.completion_tokens);
        }
        if (first_failure) {
            std::fprintf(stderr, "hybrid-server-bench: %d clients: %zu of %zu requests failed; the first: %s\n", c,
                         n_failed, out.size(), first_failure->error.c_str());
            failed = true;
        }
        double mean = 0;
        for (double x : ttft) mean += x / double(ttft.size());
        const double agg = double(tokens) / (wall / 1e3);
        std::printf("| %d | %zu | %zu | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", c, out.size(), n_failed,
                    prompt_len, n_new, agg, agg / c, mean, percentile(ttft, 0.5), percentile(ttft, 0.9));
        std::fflush(stdout);
    }
    if (turns > 0) {
        struct Turn {
            Outcome o[2];
            bool ran[2] = {false, false};
        };
        std::vector<Turn> turn_log(static_cast<size_t>(turns));
        int n_shown = 0;  // the turns that either run reached
        for (int run = 0; run < 2; run++) {
            ojson messages = ojson::array();
            for (int t = 1; t <= turns; t++) {
                std::string text = "Turn " + std::to_string(t) + " of run " + std::to_string(run + 1) + ":";
                for (int w = 0; w < turn_text; w++) text += " word" + std::to_string((t * 31 + w * 7) % 97);
                messages.push_back(ojson{{"role", "user"}, {"content", text}});
                const ojson body{{"messages", messages},
                                 {"max_tokens", n_new},
                                 {"temperature", 0},
                                 {"ignore_eos", true},
                                 {"cache_prompt", run == 1}};
                Turn& log = turn_log[size_t(t - 1)];
                log.o[run] = stream_request(host, port, "/v1/chat/completions", body);
                log.ran[run] = true;
                n_shown = std::max(n_shown, t);
                if (!log.o[run].ok) {  // the next turns would build on an answer that is not there
                    std::fprintf(stderr, "hybrid-server-bench: turn %d (cache %s): %s; the run stops there\n", t,
                                 run == 1 ? "on" : "off", log.o[run].error.c_str());
                    failed = true;
                    break;
                }
                messages.push_back(ojson{{"role", "assistant"}, {"content", log.o[run].text}});
            }
        }
        std::printf(
            "| turn | failed | prompt tokens | cached (cache on) | TTFT off ms | TTFT on ms | latency off ms | "
            "latency on ms |\n|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        auto cell = [](const Turn& log, int run, double v) {
            char b[32];
            if (!log.ran[run] || !log.o[run].ok) return std::string("-");
            std::snprintf(b, sizeof b, "%.1f", v);
            return std::string(b);
        };
        for (int t = 1; t <= n_shown; t++) {
            const Turn& log = turn_log[size_t(t - 1)];
            const Outcome &off = log.o[0], &on = log.o[1];
            const int n_failed = int(log.ran[0] && !off.ok) + int(log.ran[1] && !on.ok);
            const bool on_ok = log.ran[1] && on.ok;
            std::printf("| %d | %d | %s | %s | %s | %s | %s | %s |\n", t, n_failed,
                        on_ok ? std::to_string(on.prompt_tokens).c_str() : "-",
                        on_ok ? std::to_string(on.cached_tokens).c_str() : "-", cell(log, 0, off.ttft_ms).c_str(),
                        cell(log, 1, on.ttft_ms).c_str(), cell(log, 0, off.total_ms).c_str(),
                        cell(log, 1, on.total_ms).c_str());
        }
    }
    if (!hy::tools::stdout_ok()) {
        std::fprintf(stderr, "hybrid-server-bench: %s\n", hy::tools::stdout_error().c_str());
        return 5;
    }
    return failed ? kFailed : 0;
}
