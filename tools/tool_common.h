// Shared by the hybrid-* tools: argument parsing boilerplate and the --device value.
#pragma once

#include <cstdio>
#include <cxxopts.hpp>
#include <string>

#include "cli/arg_error.h"
#include "model/model.h"

namespace hy::tools {

// Parses argv with `opts` (which must define -m/--model and -h/--help). Returns true when the tool should run;
// otherwise *exit_code is 0 after --help, 2 after a parse error or a missing -m (message on stderr).
inline bool parse_args(cxxopts::Options& opts, int argc, char** argv, const char* name, cxxopts::ParseResult& out,
                       int* exit_code) {
    try {
        out = opts.parse(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s (see --help)\n", name, parse_error_message(e.what(), argc, argv).c_str());
        *exit_code = 2;
        return false;
    }
    if (out.count("help")) {
        std::fputs(opts.help().c_str(), stdout);
        std::fputs("\nExit status: 0 success; 1 failure (an error, or for hybrid-compare a case that does not match);"
                   "\n2 bad arguments.\n", stdout);
        *exit_code = 0;
        return false;
    }
    if (!out.count("model")) {
        std::fprintf(stderr, "%s: -m DIR (the model folder) is required (see --help)\n", name);
        *exit_code = 2;
        return false;
    }
    return true;
}

// "cpu", "cuda" or "auto"; anything else is an invalid_argument error.
inline Device parse_device(const std::string& s) {
    if (s == "cpu") return Device::cpu;
    if (s == "cuda") return Device::cuda;
    if (s == "auto") return Device::auto_select;
    throw Error(Status::invalid_argument, "--device must be cpu, cuda or auto, got '" + s + "'");
}

}  // namespace hy::tools
