// Shared by the hybrid-* tools: argument parsing boilerplate and the --device value.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/arg_error.h"
#include "cli/option_table.h"
#include "model/model.h"

namespace hy::tools {

// A bad command-line value, found after parsing: the tools exit 2 for it, as for a parse error (1 for every other
// failure).
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// False when something written to stdout (C stdio or std::cout) was lost (e.g. a full disk).
inline bool stdout_ok() {
    std::cout.flush();
    return std::fflush(stdout) == 0 && !std::ferror(stdout) && std::cout.good();
}

// rc, or 1 with "NAME: cannot write to stdout" on stderr when stdout_ok() is false and rc is 0.
inline int finish(const char* name, int rc) {
    if (!stdout_ok() && rc == 0) {
        std::fprintf(stderr, "%s: cannot write to stdout\n", name);
        return 1;
    }
    return rc;
}

// Parses argv with `opts` (which must define -m/--model and -h/--help). Returns true when the tool should run;
// otherwise *exit_code is 0 after --help, 2 after a parse error or a missing -m (message on stderr).
inline bool parse_args(cxxopts::Options& opts, int argc, char** argv, const char* name, cxxopts::ParseResult& out,
                       int* exit_code) {
    if (const std::string e = first_single_dash_word_error(opts, argc, argv); !e.empty()) {
        std::fprintf(stderr, "%s: %s\n", name, e.c_str());  // (-ngl 99 would be -n "gl")
        *exit_code = 2;
        return false;
    }
    try {
        out = parse_split(opts, argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s (see --help)\n", name, parse_error_message(e.what(), argc, argv).c_str());
        *exit_code = 2;
        return false;
    }
    if (out.count("help")) {
        std::fputs(opts.help().c_str(), stdout);
        std::fprintf(stdout, "\nExit status: 0 success; 1 failure (an error%s); 2 bad arguments.\n",
                     std::strcmp(name, "hybrid-compare") == 0 ? ", or a case that does not match" : "");
        *exit_code = finish(name, 0);
        return false;
    }
    if (!out.count("model")) {
        std::fprintf(stderr, "%s: -m DIR (the model folder) is required (see --help)\n", name);
        *exit_code = 2;
        return false;
    }
    return true;
}

// The int options `names` (long names) as given, strictly (bad_int_arg); a bad one is a UsageError naming it.
inline void check_int_args(const cxxopts::ParseResult& r, std::initializer_list<const char*> names) {
    if (const std::string bad = bad_int_arg(r, names); !bad.empty()) throw UsageError(bad);
}

// A UsageError naming the first option given more than once: each takes one value, and a second one used to
// replace the first without a word (hybrid refuses repeated flags the same way).
inline void check_given_once(const cxxopts::ParseResult& r) {
    std::vector<std::string> seen;
    for (const cxxopts::KeyValue& kv : r.arguments()) {
        if (std::find(seen.begin(), seen.end(), kv.key()) != seen.end())
            throw UsageError("--" + kv.key() + " was given more than once (give it once)");
        seen.push_back(kv.key());
    }
}

// "cpu", "cuda" or "auto"; anything else is a UsageError.
inline Device parse_device(const std::string& s) {
    if (s == "cpu") return Device::cpu;
    if (s == "cuda") return Device::cuda;
    if (s == "auto") return Device::auto_select;
    throw UsageError("--device must be cpu, cuda or auto, got '" + s + "'");
}

}  // namespace hy::tools
