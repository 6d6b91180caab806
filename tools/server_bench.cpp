// hybrid-server-bench: load figures of a running hybrid-server (or any OpenAI-compatible server).
//
//   hybrid-server-bench --port P [--host H] [-c 1,4,8,16,64] [-p 512] [-n 128] [-r 1] [--turns T] [--turn-text N]
//
// Load: for each client count C, C clients each send -r streamed /v1/completions requests one after another: a
// prompt of -p random token ids (a new draw per request, cache_prompt off), -n new tokens (ignore_eos, greedy).
// Printed per C: aggregate tok/s (every generated token over the wall time of the whole wave), tok/s per client,
// and the time to first token (the request's start to its first streamed text) mean, p50 and p90.
// Multi-turn (--turns T > 0): one chat of T turns (a user message of about --turn-text words, an answer of -n
// tokens, streamed), run twice: with the conversation-state cache off (cache_prompt false) and on. Printed per
// turn: the prompt tokens, the cached tokens, the time to first token and the turn's latency in each run.
// Exit status: 0, 1 when a request fails, 2 on bad arguments.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <httplib.h>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

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
    httplib::Client cli(host, port);
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

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options opts("hybrid-server-bench", "Load figures of a running hybrid-server.");
    // clang-format off
    opts.add_options()
        ("host", "server address", cxxopts::value<std::string>()->default_value("127.0.0.1"))
        ("port", "server port", cxxopts::value<int>()->default_value("8080"))
        ("c,clients", "client counts, comma-separated", cxxopts::value<std::string>()->default_value("1,4,8,16,64"))
        ("p,prompt", "prompt tokens (random ids)", cxxopts::value<int>()->default_value("512"))
        ("n,new", "new tokens per request", cxxopts::value<int>()->default_value("128"))
        ("r,rounds", "requests per client", cxxopts::value<int>()->default_value("1"))
        ("vocab", "prompt ids are drawn from [1000, vocab)", cxxopts::value<int>()->default_value("150000"))
        ("turns", "multi-turn chat: turns (0: none)", cxxopts::value<int>()->default_value("0"))
        ("turn-text", "multi-turn chat: words per user message", cxxopts::value<int>()->default_value("64"))
        ("h,help", "print this help");
    // clang-format on
    std::string host;
    int port, prompt_len, n_new, rounds, vocab, turns, turn_text;
    std::vector<int> clients;
    try {
        auto r = opts.parse(argc, argv);
        if (r.count("help")) {
            std::printf("%s\n", opts.help().c_str());
            return 0;
        }
        host = r["host"].as<std::string>();
        port = r["port"].as<int>();
        prompt_len = r["prompt"].as<int>();
        n_new = r["new"].as<int>();
        rounds = r["rounds"].as<int>();
        vocab = r["vocab"].as<int>();
        turns = r["turns"].as<int>();
        turn_text = r["turn-text"].as<int>();
        const std::string list = r["clients"].as<std::string>();
        for (size_t p = 0; p <= list.size();) {
            size_t q = list.find(',', p);
            if (q == std::string::npos) q = list.size();
            if (q > p) clients.push_back(std::stoi(list.substr(p, q - p)));
            p = q + 1;
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-server-bench: %s\n", e.what());
        return 2;
    }
    if (prompt_len < 1 || n_new < 1 || rounds < 1 || vocab <= 1000 || turns < 0 || turn_text < 1) {
        std::fprintf(stderr, "hybrid-server-bench: -p, -n, -r and --turn-text must be >= 1, --vocab > 1000\n");
        return 2;
    }
    bool failed = false;
    std::atomic<uint64_t> draw{1};
    if (!clients.empty() && turns == 0) {
        std::printf(
            "| clients | requests | prompt | new | aggregate tok/s | tok/s per client | TTFT mean ms | "
            "TTFT p50 ms | TTFT p90 ms |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    }
    for (int c : turns == 0 ? clients : std::vector<int>{}) {
        std::vector<Outcome> out(size_t(c) * size_t(rounds));
        std::vector<std::thread> threads;
        const auto t0 = Clock::now();
        for (int k = 0; k < c; k++)
            threads.emplace_back([&, k] {
                for (int i = 0; i < rounds; i++) {
                    std::mt19937_64 rng(draw++);
                    ojson ids = ojson::array();
                    for (int t = 0; t < prompt_len; t++) ids.push_back(1000 + int(rng() % uint64_t(vocab - 1000)));
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
        for (const Outcome& o : out) {
            if (!o.ok) {
                std::fprintf(stderr, "hybrid-server-bench: %s\n", o.error.c_str());
                failed = true;
            }
            ttft.push_back(o.ttft_ms);
            tokens += uint64_t(o.completion_tokens);
        }
        double mean = 0;
        for (double x : ttft) mean += x / double(ttft.size());
        const double agg = double(tokens) / (wall / 1e3);
        std::printf("| %d | %zu | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", c, out.size(), prompt_len, n_new,
                    agg, agg / c, mean, percentile(ttft, 0.5), percentile(ttft, 0.9));
        std::fflush(stdout);
    }
    if (turns > 0) {
        struct Turn {
            Outcome o[2];
        };
        std::vector<Turn> turn_log(static_cast<size_t>(turns));
        for (int run = 0; run < 2; run++) {
            ojson messages = ojson::array();
            for (int t = 0; t < turns; t++) {
                std::string text = "Turn " + std::to_string(t) + " of run " + std::to_string(run) + ":";
                for (int w = 0; w < turn_text; w++) text += " word" + std::to_string((t * 31 + w * 7) % 97);
                messages.push_back(ojson{{"role", "user"}, {"content", text}});
                const ojson body{{"messages", messages},
                                 {"max_tokens", n_new},
                                 {"temperature", 0},
                                 {"ignore_eos", true},
                                 {"cache_prompt", run == 1}};
                Outcome o = stream_request(host, port, "/v1/chat/completions", body);
                if (!o.ok) {
                    std::fprintf(stderr, "hybrid-server-bench: turn %d: %s\n", t, o.error.c_str());
                    failed = true;
                }
                messages.push_back(ojson{{"role", "assistant"}, {"content", o.text}});
                turn_log[size_t(t)].o[run] = std::move(o);
            }
        }
        std::printf(
            "| turn | prompt tokens | cached (cache on) | TTFT off ms | TTFT on ms | latency off ms | "
            "latency on ms |\n|--:|--:|--:|--:|--:|--:|--:|\n");
        for (int t = 0; t < turns; t++) {
            const Outcome& off = turn_log[size_t(t)].o[0];
            const Outcome& on = turn_log[size_t(t)].o[1];
            std::printf("| %d | %d | %d | %.1f | %.1f | %.1f | %.1f |\n", t + 1, on.prompt_tokens, on.cached_tokens,
                        off.ttft_ms, on.ttft_ms, off.total_ms, on.total_ms);
        }
    }
    return failed ? 1 : 0;
}
