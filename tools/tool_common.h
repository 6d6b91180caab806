// Shared by the hybrid-* tools: argument parsing boilerplate and the --device value.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/arg_error.h"
#include "cli/option_table.h"
#include "cli/stdout_check.h"
#include "engine.h"
#include "kernels/cpu/thread_pool.h"
#include "model/common.h"
#include "model/model.h"

namespace hy::tools {

// Exit codes: one convention for hybrid and the tools (hybrid's, cli/cli.h; README.md "Exit codes").
enum Exit : int {
    exit_ok = 0,
    exit_usage = 1,    // bad flag or value, missing argument
    exit_model = 2,    // the model or tokenizer could not be loaded
    exit_io = 5,       // a file could not be read or written (a golden file, --json, --bench, stdout)
    exit_runtime = 6,  // a failure while running (backend error)
    exit_check = 7,    // a check failed: hybrid-compare, a case does not match; hybrid-tokenize --golden, likewise
};

// A bad command-line value, found after parsing: exit_usage, as for a parse error.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A failure that ends the tool with its exit code.
struct Failure : std::runtime_error {
    Failure(int code_, const std::string& msg) : std::runtime_error(msg), code(code_) {}
    int code;
};

// f() (a model or tokenizer load): a hy::Error it throws becomes Failure(exit_model) with the same message.
template <class F>
auto loading(F&& f) {
    try {
        return f();
    } catch (const Error& e) {
        throw Failure(exit_model, e.what());
    }
}

// A ModelParams::progress that shows "<tool>: loading weights NN%" on stderr when it is a terminal (rewritten in
// place, cleared at 100%), and nothing otherwise (logs and pipes stay clean).
inline std::function<void(float)> load_progress(const char* tool) {
    if (!isatty(STDERR_FILENO)) return {};
    return [tool, shown = -1](float f) mutable {
        const int pct = int(f * 100.0f);
        if (pct == shown) return;
        shown = pct;
        if (pct >= 100)
            std::fprintf(stderr, "\r\033[K");
        else
            std::fprintf(stderr, "\r%s: loading weights %d%%", tool, pct);
        std::fflush(stderr);
    };
}

// "1 window", "2 windows".
inline std::string count_of(size_t n, const char* noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

// The exit code of a hy::Error thrown after the load: exit_usage for a bad argument, exit_io for a file that cannot
// be read or is malformed (a golden file), exit_runtime otherwise.
inline int exit_code_of(const Error& e) {
    switch (e.status()) {
        case Status::invalid_argument: return exit_usage;
        case Status::io:
        case Status::format: return exit_io;
        default: return exit_runtime;
    }
}

// rc, or exit_io with "NAME: " + stdout_error() on stderr when stdout_ok() is false and rc is 0.
inline int finish(const char* name, int rc) {
    if (!stdout_ok() && rc == 0) {
        std::fprintf(stderr, "%s: %s\n", name, stdout_error().c_str());
        return exit_io;
    }
    return rc;
}

// The "Exit codes" paragraph of a tool's --help; `check` says what exit_check means for it ("" for none).
inline std::string exit_codes_help(const std::string& check) {
    return "\nExit codes (as hybrid's): 0 success; 1 bad arguments; 2 the model or tokenizer could not be loaded; "
           "5 a file could not be read or written; 6 a failure while running" +
           (check.empty() ? std::string() : "; 7 " + check) + ".\n";
}

// Parses argv with `opts` (which must define -m/--model and -h/--help). Returns true when the tool should run;
// otherwise *exit_code is 0 after --help, exit_usage after a parse error or a missing -m (message on stderr).
inline bool parse_args(cxxopts::Options& opts, int argc, char** argv, const char* name, cxxopts::ParseResult& out,
                       int* exit_code) {
    if (const std::string e = first_single_dash_word_error(opts, argc, argv); !e.empty()) {
        std::fprintf(stderr, "%s: %s\n", name, e.c_str());  // (-ngl 99 would be -n "gl")
        *exit_code = exit_usage;
        return false;
    }
    try {
        out = parse_split(opts, argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s (see --help)\n", name, parse_error_message(e.what(), argc, argv).c_str());
        *exit_code = exit_usage;
        return false;
    }
    if (out.count("version")) {
        std::printf("%s %s\n", name, hy_version());
        *exit_code = finish(name, 0);
        return false;
    }
    if (out.count("help")) {
        std::fputs(opts.help().c_str(), stdout);
        const char* check = std::strcmp(name, "hybrid-compare") == 0 ? "a case does not match its goldens"
                            : std::strcmp(name, "hybrid-perplexity") == 0
                                ? "a --max-ppl-ratio or --min-top1 check failed"
                                : "";
        std::fputs(exit_codes_help(check).c_str(), stdout);
        *exit_code = finish(name, 0);
        return false;
    }
    if (!out.count("model")) {
        std::fprintf(stderr, "%s: -m DIR (the model folder) is required (see --help)\n", name);
        *exit_code = exit_usage;
        return false;
    }
    return true;
}

// The int options `names` (long names) as given, strictly (bad_int_arg); a bad one is a UsageError naming it.
inline void check_int_args(const cxxopts::ParseResult& r, std::initializer_list<const char*> names) {
    if (const std::string bad = bad_int_arg(r, names); !bad.empty()) throw UsageError(bad);
}

// A UsageError naming the first option given more than once (repeated_option).
inline void check_given_once(const cxxopts::ParseResult& r) {
    if (const std::string bad = repeated_option(r); !bad.empty()) throw UsageError(bad);
}

// -t as given: 0 or -1 (llama.cpp's spelling) is all cores, returned as 0; outside [-1, 1024] a UsageError.
inline int parse_threads(int t) {
    if (t == -1) return 0;
    if (t < 0 || t > 1024)
        throw UsageError("-t must be -1 or in [0, 1024] (0 or -1: all cores), got " + std::to_string(t));
    return t;
}

// On the CPU backend, more threads than the cores this process may use: a warning from `prog` on stderr, as hybrid
// prints (allowed, but slower, and timings mean little).
inline void warn_oversubscribed(const char* prog, int threads, Model& model) {
    const int cores = cpu::ThreadPool::default_threads();
    if (std::string(model.backend().name()) == "cpu" && threads > cores)
        std::fprintf(stderr,
                     "%s: warning: -t %d is more than the %d cores available: every step waits for threads that take "
                     "turns on a core (slower; -t 0 uses all cores)\n",
                     prog, threads, cores);
}

// --moe-grouped-rows as given (CudaOptions::moe_grouped_min_rows): 0 or more, else a UsageError.
inline int parse_moe_grouped_rows(int rows) {
    if (rows < 0) throw UsageError("--moe-grouped-rows must be 0 or more, got " + std::to_string(rows));
    return rows;
}

// "cpu", "cuda" or "auto"; anything else is a UsageError.
inline Device parse_device(const std::string& s) {
    if (s == "cpu") return Device::cpu;
    if (s == "cuda") return Device::cuda;
    if (s == "auto") return Device::auto_select;
    throw UsageError("--device must be cpu, cuda or auto, got '" + s + "'");
}

// --fp8-gemm: true for block-scaled, false for dequantize (CudaOptions::fp8_block_scaled_gemm).
inline bool parse_fp8_gemm(const std::string& s) {
    if (s == "block-scaled") return true;
    if (s == "dequantize") return false;
    throw UsageError("--fp8-gemm must be block-scaled or dequantize, got '" + s + "'");
}

// The whole text at `path` of at most max_bytes, as hybrid's -f reads it: "-" is standard input, and a pipe, FIFO or
// device (/dev/stdin) is read to its end; a regular file through read_regular_file. Throws Error(io) naming the path
// (a directory, a read error, more than max_bytes).
inline std::string read_text_input(const std::string& path, size_t max_bytes) {
    const bool std_in = path == "-";
    const std::string name = std_in ? "standard input" : path;
    struct stat st;
    if (!std_in && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return read_regular_file(path, max_bytes);
    int fd = 0;
    if (!std_in) {
        if (::stat(path.c_str(), &st) != 0) {
            const int e = errno;
            path_present(path);  // (a broken link or a loop: named with its target)
            throw Error(Status::io, "cannot open '" + path + "': " + std::strerror(e));
        }
        if (S_ISDIR(st.st_mode)) throw Error(Status::io, "cannot read '" + path + "': a directory");
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw Error(Status::io, "cannot open '" + path + "': " + std::strerror(errno));
    } else if (::fstat(0, &st) != 0) {  // (EBADF: started with `<&-`)
        throw Error(Status::io, std::string("cannot read standard input: ") +
                                    (errno == EBADF ? "it is closed" : std::strerror(errno)));
    } else if (S_ISDIR(st.st_mode)) {
        throw Error(Status::io, "cannot read standard input: a directory");
    }
    std::string out;
    int err = 0;
    for (;;) {
        if (out.size() > max_bytes) break;
        const size_t at = out.size(), want = std::min<size_t>(size_t(1) << 16, max_bytes + 1 - at);
        out.resize(at + want);
        const ssize_t r = ::read(fd, out.data() + at, want);
        out.resize(at + (r > 0 ? size_t(r) : 0));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) err = errno;
        if (r <= 0) break;
    }
    if (!std_in) ::close(fd);
    if (err != 0) throw Error(Status::io, "cannot read '" + name + "': " + std::strerror(err));
    if (out.size() > max_bytes)
        throw Error(Status::io, "cannot read '" + name + "': larger than " + std::to_string(max_bytes >> 20) +
                                    " MiB, the most this reader takes");
    return out;
}

// --quant into mp.quant and mp.quant_group: "none", "fp8", "int8", "int4", "int8:G" or "int4:G" (G 32 or a multiple of
// 64 up to 1024); anything else is a UsageError.
inline void parse_quant(const std::string& s, ModelParams& mp) {
    try {
        mp.quant = parse_weight_quant(s, &mp.quant_group);
    } catch (const Error&) {
        throw UsageError(
            "--quant must be none, fp8, int8, int4, int8:G or int4:G (G 32 or a multiple of 64 up to 1024), "
            "got '" +
            s + "'");
    }
}

// --quant-lm-head into mp.quant_lm_head (after parse_quant): a UsageError unless mp.quant is int8 or int4.
inline void parse_quant_lm_head(bool on, ModelParams& mp) {
    if (on && mp.quant != WeightQuant::int8 && mp.quant != WeightQuant::int4)
        throw UsageError("--quant-lm-head needs --quant int8 or int4");
    mp.quant_lm_head = on;
}

}  // namespace hy::tools
