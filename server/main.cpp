// hybrid-server: the OpenAI-compatible HTTP server (server/server.h), with llama-server's flag names.
//
// Exit status (hybrid's convention, README): 0 after SIGTERM, 130 after SIGINT (Ctrl-C), 1 on a usage error, 2 when
// the model, its tokenizer or the chat template cannot be loaded or the state cache not allocated, 6 when the address
// cannot be listened on.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/arg_error.h"
#include "cli/option_table.h"
#include "cli/stdout_check.h"
#include "engine.h"
#include "server/server.h"

namespace {

int usage_error(const std::string& msg) {
    std::fprintf(stderr, "hybrid-server: %s (see --help)\n", msg.c_str());  // (as hybrid and the tools)
    return 1;
}

// 0 after --help or --version, or 5 with "hybrid-server: cannot write to stdout: <reason>" when that text was lost.
int printed() {
    if (hy::tools::stdout_ok()) return 0;
    std::fprintf(stderr, "hybrid-server: %s\n", hy::tools::stdout_error().c_str());
    return 5;
}

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options opts("hybrid-server", "An OpenAI-compatible HTTP server for Qwen3.5 hybrid models.");
    opts.custom_help("-m DIR [options]");
    hy::add_shared_option(opts, "", "model");
    // clang-format off
    opts.add_options()
        ("host", "address to listen on", cxxopts::value<std::string>()->default_value("127.0.0.1"))
        ("port", "port to listen on (0: any free port, printed at start)", cxxopts::value<int>()->default_value("8080"))
        ("parallel", "sequence slots: requests generated at once (continuous batching); also -np",
         cxxopts::value<int>()->default_value("4"))
        ("c,ctx-size", "context length in tokens, per request (prompt plus answer); 0: the context the model was "
         "trained for (config.json max_position_embeddings)", cxxopts::value<int>()->default_value("4096"))
        ("b,batch-size", "tokens per forward step while prefilling", cxxopts::value<int>()->default_value("512"))
        ("a,alias", "the model's id in the API (default: the folder's name)", cxxopts::value<std::string>())
        ("api-key", "require \"Authorization: Bearer KEY\" on /v1/*", cxxopts::value<std::string>())
        ("chat-template-file", "a Jinja chat template to use instead of the model folder's",
         cxxopts::value<std::string>())
        ("cache-mb", "host memory for the conversation-state cache in MiB (0: off)",
         cxxopts::value<int>()->default_value("1024"))
        ("threads-http", "HTTP connections served at once, a thread each (0: 4 per slot + 8, at least 512)",
         cxxopts::value<int>()->default_value("0"))
        ("idle-timeout", "seconds a connection may stay without sending a request before it is closed",
         cxxopts::value<double>()->default_value("5"))
        ("request-timeout", "seconds a client has to send a request from its first byte, plus 1 s per 64 KiB of "
         "body (408 past it)", cxxopts::value<double>()->default_value("10"))
        ("dummy-weights", "read config.json alone and fill the weights with random values (load benchmarks of a "
         "shape without its checkpoint; the output is meaningless)")
        ("v,verbose", "log every request on stderr");
    // clang-format on
    hy::add_shared_option(opts, "", "threads");
    hy::add_shared_option(opts, "", "device");
    hy::add_shared_option(opts, "", "quant");
    hy::add_shared_option(opts, "", "quant-lm-head");
    hy::add_shared_option(opts, "", "no-cuda-graphs");
    hy::add_shared_option(opts, "", "version");
    hy::add_shared_option(opts, "", "help");

    // llama.cpp's -np is not a cxxopts option: spelled --parallel where it stands as an option (not as the value of
    // the option before it: `-a -np` names the model "-np"). Then the words cxxopts would misread (-ngl as -n "gl",
    // -t=4, an option where a value belongs) are refused as hybrid and the tools refuse them.
    std::vector<std::string> words(argv, argv + argc);
    for (size_t i = 1; i < words.size(); i++) {
        if (words[i] == "--") break;
        if (words[i] == "-np") {
            words[i] = "--parallel";
        } else if (words[i].rfind("-np=", 0) == 0) {
            return usage_error("-np takes its value as the next word: -np " + words[i].substr(4) +
                               ", or --parallel=" + words[i].substr(4));
        } else if (hy::option_takes_value(opts, words[i])) {
            i++;  // (its value, as given)
        }
    }
    std::vector<char*> args;
    for (std::string& w : words) args.push_back(w.data());
    const int n_args = int(args.size());
    if (const std::string e = hy::first_single_dash_word_error(opts, n_args, args.data()); !e.empty())
        return usage_error(e);

    hy::server::ServerParams p;
    try {
        auto r = opts.parse(n_args, args.data());
        if (r.count("version")) {
            std::printf("hybrid-server %s\n", hy_version());
            return printed();
        }
        if (r.count("help")) {
            std::printf("%s\n", opts.help().c_str());
            std::printf(
                "Exit codes:\n"
                "  0    stopped by SIGTERM\n"
                "  1    usage: unknown flag, bad value, missing -m\n"
                "  2    the model or --chat-template-file could not be loaded (missing folder, malformed or\n"
                "       unsupported files, no GPU, not enough memory), or the --cache-mb cache not allocated\n"
                "  5    --help or --version could not be written to stdout\n"
                "  6    the address could not be bound or listened on (port in use, unknown host)\n"
                "  130  stopped by SIGINT (Ctrl-C)\n");
            return printed();
        }
        if (!r.unmatched().empty()) return usage_error("unexpected argument '" + r.unmatched()[0] + "'");
        if (const std::string bad = hy::repeated_option(r); !bad.empty()) return usage_error(bad);
        // (cxxopts takes "0x10" for 16 and wraps some values past 2^32: the numbers as given, strictly)
        if (const std::string bad = hy::bad_int_arg(
                r, {"port", "parallel", "ctx-size", "batch-size", "threads", "cache-mb", "threads-http"});
            !bad.empty())
            return usage_error(bad);
        if (const std::string bad = hy::bad_real_arg(r, {"idle-timeout", "request-timeout"}); !bad.empty())
            return usage_error(bad);
        if (!r.count("model")) return usage_error("-m DIR is required");
        if (r.count("api-key") && r["api-key"].as<std::string>().empty())
            return usage_error("--api-key must not be empty (leave it out to serve without a key)");
        if (r.count("chat-template-file") && r["chat-template-file"].as<std::string>().empty())
            return usage_error("--chat-template-file must not be empty (leave it out for the model folder's template)");
        if (r["host"].as<std::string>().empty())
            return usage_error("--host must not be empty (an address such as 127.0.0.1 or 0.0.0.0, or a host name)");
        if (r.count("alias") && r["alias"].as<std::string>().empty())
            return usage_error("-a/--alias must not be empty (leave it out for the folder's name)");
        p.model_dir = r["model"].as<std::string>();
        p.host = r["host"].as<std::string>();
        p.port = r["port"].as<int>();
        p.n_slots = r["parallel"].as<int>();
        p.n_ctx = r["ctx-size"].as<int>();
        p.max_batch_tokens = r["batch-size"].as<int>();
        p.n_threads = r["threads"].as<int>();
        const int cache_mb = r["cache-mb"].as<int>();
        p.http_threads = r["threads-http"].as<int>();
        const double idle_s = r["idle-timeout"].as<double>(), request_s = r["request-timeout"].as<double>();
        auto shown = [](double v) {  // (the value, as the other range errors say it)
            char b[32];
            std::snprintf(b, sizeof b, "%g", v);
            return std::string(b);
        };
        if (!(idle_s > 0 && idle_s <= 86400))
            return usage_error("--idle-timeout must be in (0, 86400] seconds, got " + shown(idle_s));
        if (!(request_s > 0 && request_s <= 86400))
            return usage_error("--request-timeout must be in (0, 86400] seconds, got " + shown(request_s));
        p.idle_timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(idle_s * 1000)));
        p.request_timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(request_s * 1000)));
        if (r.count("alias")) p.alias = r["alias"].as<std::string>();
        if (r.count("api-key")) p.api_key = r["api-key"].as<std::string>();
        if (r.count("chat-template-file")) p.chat_template_file = r["chat-template-file"].as<std::string>();
        p.cuda_graphs = !r.count("no-cuda-graphs");
        p.verbose = r.count("verbose") > 0;
        p.dummy_weights = r.count("dummy-weights") > 0;
        try {
            p.quant = hy::parse_weight_quant(r["quant"].as<std::string>(), &p.quant_group);
        } catch (const hy::Error&) {
            return usage_error(
                "--quant must be none, fp8, int8, int4, int8:G or int4:G (G 32 or a multiple of 64 up "
                "to 1024), got '" +
                r["quant"].as<std::string>() + "'");
        }
        p.quant_lm_head = r.count("quant-lm-head") > 0;
        if (p.quant_lm_head && p.quant != hy::WeightQuant::int8 && p.quant != hy::WeightQuant::int4)
            return usage_error("--quant-lm-head needs --quant int8 or int4");
        const std::string device = r["device"].as<std::string>();
        if (device == "cpu")
            p.device = hy::Device::cpu;
        else if (device == "cuda")
            p.device = hy::Device::cuda;
        else if (device == "auto")
            p.device = hy::Device::auto_select;
        else
            return usage_error("--device must be auto, cpu or cuda, got '" + device + "'");
        if (p.port < 0 || p.port > 65535)
            return usage_error("--port must be in [0, 65535], got " + std::to_string(p.port));
        if (p.n_slots < 1 || p.n_slots > 4096)
            return usage_error("-np must be in [1, 4096], got " + std::to_string(p.n_slots));
        if (p.n_ctx < 0 || p.n_ctx == 1)
            return usage_error("-c must be 0 (the model's trained context) or at least 2, got " +
                               std::to_string(p.n_ctx));
        if (p.max_batch_tokens < 1)
            return usage_error("-b must be at least 1, got " + std::to_string(p.max_batch_tokens));
        if (p.n_threads == -1) p.n_threads = 0;  // (llama.cpp's spelling of all cores, as hybrid and the tools take it)
        if (p.n_threads < 0 || p.n_threads > 1024)
            return usage_error("-t must be in [0, 1024] (0 or -1: all cores), got " + std::to_string(p.n_threads));
        if (cache_mb < 0) return usage_error("--cache-mb must be >= 0, got " + std::to_string(cache_mb));
        if (p.http_threads < 0)
            return usage_error("--threads-http must be >= 0, got " + std::to_string(p.http_threads));
        p.cache_mb = size_t(cache_mb);
    } catch (const cxxopts::exceptions::exception& e) {
        return usage_error(hy::parse_error_message(e.what(), argc, argv));
    }

    // SIGINT/SIGTERM stop the server from a thread that waits for them (blocked in every other thread); a closed
    // client socket must not kill the process.
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGUSR1);  // (wakes the waiter when listening fails)
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    std::unique_ptr<hy::server::Server> server;
    try {
        server = std::make_unique<hy::server::Server>(p);
    } catch (const hy::Error& e) {
        // (as hybrid's: the load's own check names the context that would fit; an arena allocation that failed
        // later says what grows with -c and -np; the state cache's message names --cache-mb)
        std::string hint;
        if (e.status() == hy::Status::out_of_memory && std::strstr(e.what(), "model arena"))
            hint = " (the KV cache and states grow with -c " + std::to_string(p.n_ctx) + " and -np " +
                   std::to_string(p.n_slots) + ": a smaller -c or -np may fit)";
        std::fprintf(stderr, "hybrid-server: %s%s\n", e.what(), hint.c_str());
        return 2;
    }
    try {
        const int port = server->bind();
        std::fprintf(stderr, "hybrid-server: %s\n", server->summary().c_str());
        // (an IPv6 address goes in brackets in a URL, RFC 3986)
        const std::string host = p.host.find(':') != std::string::npos ? "[" + p.host + "]" : p.host;
        std::fprintf(stderr, "hybrid-server: listening on http://%s:%d\n", host.c_str(), port);
        std::fflush(stderr);
        // Serving runs in its own thread and this one waits for the stop signals: after a stop the library's
        // serve() returns only when every connection's worker is done, and a client that is slow to send its
        // request (or idle on a kept-alive connection) would hold the shutdown for as long as it likes.
        std::atomic<bool> listen_failed{false};
        const pthread_t main_thread = pthread_self();
        std::thread serving([&] {
            if (!server->serve()) {
                listen_failed = true;
                pthread_kill(main_thread, SIGUSR1);
            }
        });
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (listen_failed) {
            serving.join();
            std::fprintf(stderr, "hybrid-server: listening failed\n");
            return 6;
        }
        std::fprintf(stderr, "hybrid-server: stopping (requests in flight are cancelled; a second signal exits now)\n");
        std::fflush(stderr);
        // A second SIGINT or SIGTERM ends the process at once, without waiting for the answers to be sent.
        std::thread([&stop_signals] {
            int again = 0;
            sigwait(&stop_signals, &again);
            if (again == SIGUSR1) return;
            std::fprintf(stderr, "hybrid-server: second signal: exiting now\n");
            std::fflush(stderr);
            std::_Exit(again == SIGINT ? 130 : 0);
        }).detach();
        server->stop();
        // The answers cut by the stop are sent; then the process ends without waiting for the other connections.
        const bool drained = server->drain(std::chrono::seconds(10));
        std::fprintf(stderr, "hybrid-server: stopped%s\n",
                     drained ? "" : " (streams still open after 10 s were dropped)");
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(sig == SIGINT ? 130 : 0);
    } catch (const hy::Error& e) {
        std::fprintf(stderr, "hybrid-server: %s\n", e.what());
        return 6;
    }
}
