// hybrid-tokenize: encode/decode with a tokenizer.json, check golden encodings, measure speed.
//
//   hybrid-tokenize --tokenizer FILE|DIR --text T          ids of T, comma-separated on one line
//   hybrid-tokenize --tokenizer FILE|DIR --decode 1,2,3    text of the ids
//   hybrid-tokenize --tokenizer FILE|DIR --golden G.json   check {"cases":[{"text","ids","decoded"}]};
//                                                          prints each mismatch, then SUMMARY: k/n cases match
//   hybrid-tokenize --tokenizer FILE|DIR --bench TEXTFILE  load time and encode throughput (MB/s)
// Exit codes (hybrid's convention, tools/tool_common.h): 0 success (every golden case matches), 1 bad arguments,
// 2 the tokenizer could not be loaded, 5 a file could not be read (--golden, --bench) or stdout written, 7 a golden
// case does not match. Without arguments: the usage line.
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <cxxopts.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "cli/arg_error.h"
#include "model/common.h"
#include "model/tokenizer.h"
#include "tools/tool_common.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// CPU time of this thread in ms (robust to other load on the machine, unlike wall time).
double cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// A --golden or --bench file: a regular file, a pipe such as /dev/stdin, or - for standard input (as hybrid -f and
// hybrid-perplexity -f), of at most 256 MiB as theirs; a directory or a device is refused by name
std::string read_all(const std::string& path) {
    struct stat st;
    if (path == "-" || (::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)))
        return hy::tools::read_text_input(path, size_t(256) << 20);
    return hy::read_regular_file(path, size_t(256) << 20);
}

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); i++) {
        if (i) s += ',';
        s += std::to_string(ids[i]);
    }
    return s;
}

// A string as a JSON literal, so mismatches with control characters stay on one line.
std::string json_quote(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

hy::Tokenizer load(const std::string& path) {
    return hy::tools::loading([&] {
        if (std::filesystem::is_directory(path)) return hy::Tokenizer::from_folder(path);
        return hy::Tokenizer::from_file(path);
    });
}

int run_golden(const hy::Tokenizer& tok, const std::string& path, bool parse_special) {
    const json g = hy::parse_json(read_all(path), path);
    if (!g.is_object() || !g.contains("cases") || !g["cases"].is_array())
        throw hy::Error(hy::Status::format, path + ": expected an object with a 'cases' array");
    if (g["cases"].empty()) throw hy::Error(hy::Status::format, path + ": the 'cases' array is empty");
    size_t n = 0, ok = 0;
    for (const json& c : g["cases"]) {
        if (!c.is_object() || !c.contains("text") || !c.contains("ids"))
            throw hy::Error(hy::Status::format, path + ": case " + std::to_string(n) +
                                                    " lacks 'text' or 'ids' (a tokenizer golden file, not a model's)");
        if (!c["text"].is_string() || !c["ids"].is_array())
            throw hy::Error(hy::Status::format, path + ": case " + std::to_string(n) +
                                                    ": 'text' must be a string and 'ids' a list of integers");
        std::string text = c["text"].get<std::string>();
        std::vector<int32_t> want;
        for (const json& v : c["ids"]) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
                throw hy::Error(hy::Status::format, path + ": case " + std::to_string(n) +
                                                        ": ids must be integers in [0, 2^31), found " + v.dump());
            want.push_back(v.get<int32_t>());
        }
        n++;
        std::vector<int32_t> got = tok.encode(text, parse_special);
        bool match = got == want;
        if (!match)
            std::printf("MISMATCH ids  case %zu %s\n  want %s\n  got  %s\n", n - 1, json_quote(text).c_str(),
                        join_ids(want).c_str(), join_ids(got).c_str());
        if (c.contains("decoded") && c["decoded"].is_string()) {
            std::string want_text = c["decoded"].get<std::string>();
            std::string got_text;
            try {  // a golden file of another tokenizer may hold ids this one lacks: a mismatch, not an abort
                got_text = tok.decode(want);
            } catch (const hy::Error& e) {
                got_text = std::string("(cannot decode: ") + e.what() + ")";
            }
            if (got_text != want_text) {
                match = false;
                std::printf("MISMATCH text case %zu %s\n  want %s\n  got  %s\n", n - 1, json_quote(text).c_str(),
                            json_quote(want_text).c_str(), json_quote(got_text).c_str());
            }
        }
        ok += match;
    }
    std::printf("SUMMARY: %zu/%zu cases match\n", ok, n);
    return ok == n ? hy::tools::exit_ok : hy::tools::exit_check;
}

int run_bench(const std::string& tok_path, const std::string& text_path, int repeat) {
    // (the text first: an unusable file fails before the loads are timed; an empty one times nothing, which printed
    // "0.0 MB/s")
    const std::string text = read_all(text_path);
    const std::string shown = text_path == "-" ? std::string("standard input") : text_path;
    if (text.empty())  // (exit 1, as hybrid -f and hybrid-perplexity -f with an empty text)
        throw hy::Error(hy::Status::invalid_argument, "--bench " + shown + " is empty: there is no text to time");
    if (!hy::utf8_is_valid(text))  // as for --text
        std::fprintf(stderr,
                     "hybrid-tokenize: warning: --bench %s is not valid UTF-8; its invalid bytes are read as U+FFFD\n",
                     shown.c_str());
    // Wall time and thread CPU time of each step; the best of several runs.
    const int loads = 5;
    double load_wall = 1e30, load_cpu = 1e30;
    for (int i = 0; i < loads; i++) {
        auto t0 = Clock::now();
        double c0 = cpu_ms();
        hy::Tokenizer t = load(tok_path);
        load_cpu = std::min(load_cpu, cpu_ms() - c0);
        load_wall = std::min(load_wall, ms_since(t0));
    }
    hy::Tokenizer tok = load(tok_path);
    auto t0 = Clock::now();
    double c0 = cpu_ms();
    size_t n_tokens = tok.encode(text).size();  // first pass: empty word cache
    double cold_cpu = cpu_ms() - c0, cold_wall = ms_since(t0);
    double wall = 1e30, cpu = 1e30;
    for (int r = 0; r < repeat; r++) {
        t0 = Clock::now();
        c0 = cpu_ms();
        size_t n = tok.encode(text).size();
        cpu = std::min(cpu, cpu_ms() - c0);
        wall = std::min(wall, ms_since(t0));
        if (n != n_tokens) throw hy::Error(hy::Status::internal, "encode is not deterministic");
    }
    std::vector<int32_t> ids = tok.encode(text);
    double dec_wall = 1e30, dec_cpu = 1e30;
    for (int r = 0; r < repeat; r++) {
        t0 = Clock::now();
        c0 = cpu_ms();
        std::string back = tok.decode(ids);
        dec_cpu = std::min(dec_cpu, cpu_ms() - c0);
        dec_wall = std::min(dec_wall, ms_since(t0));
    }
    double mb = double(text.size()) / 1e6;
    std::printf("load: %.1f ms wall, %.1f ms cpu (best of %d)\n", load_wall, load_cpu, loads);
    std::printf("encode, first pass: %zu bytes, %zu tokens, %.1f MB/s wall, %.1f MB/s cpu\n", text.size(), n_tokens,
                mb / (cold_wall / 1e3), mb / (cold_cpu / 1e3));
    std::printf("encode, warm cache: %.1f MB/s wall, %.1f MB/s cpu (best of %d)\n", mb / (wall / 1e3), mb / (cpu / 1e3),
                repeat);
    std::printf("decode: %.1f MB/s wall, %.1f MB/s cpu (best of %d)\n", mb / (dec_wall / 1e3), mb / (dec_cpu / 1e3),
                repeat);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    cxxopts::Options opts("hybrid-tokenize", "Encode/decode text with a Hugging Face tokenizer.json");
    opts.add_options()("tokenizer", "tokenizer.json file or checkpoint folder", cxxopts::value<std::string>())(
        "text", "text to encode", cxxopts::value<std::string>())("decode", "comma-separated ids to decode",
                                                                 cxxopts::value<std::string>())(
        "golden",
        "tokenizer golden file to check: {\"cases\": [{\"text\", \"ids\", \"decoded\" (optional)}]}, e.g. "
        "tests/data/tokenizers/qwen3/golden.json (a model folder's golden.json is hybrid-compare's); - reads standard "
        "input",
        cxxopts::value<std::string>())(
        "bench", "text file to time encoding on (at most 256 MiB; - reads standard input)",
        cxxopts::value<std::string>())("repeat", "bench repetitions", cxxopts::value<int>()->default_value("5"))(
        "no-special",
        "--text: encode special tokens' text as plain text; --decode: leave special tokens out (as transformers' "
        "skip_special_tokens)");
    hy::add_shared_option(opts, "", "version");
    hy::add_shared_option(opts, "", "help");  // (declared in cli/option_table.h, shared with hybrid and the tools)
    if (argc < 2) {                           // (it said only "--tokenizer is required")
        std::fprintf(stderr,
                     "usage: hybrid-tokenize --tokenizer FILE|DIR (--text T | --decode 1,2,3 | --golden G.json | "
                     "--bench FILE) [options] (--help lists them)\n");
        return hy::tools::exit_usage;
    }
    try {
        if (const std::string e = hy::first_single_dash_word_error(opts, argc, argv); !e.empty())
            throw hy::Error(hy::Status::invalid_argument, e);
        auto a = hy::parse_split(opts, argc, argv);
        if (a.count("version")) {
            std::cout << "hybrid-tokenize " << hy_version() << "\n";
            return hy::tools::finish("hybrid-tokenize", 0);
        }
        if (a.count("help")) {
            std::cout << opts.help() << hy::tools::exit_codes_help("a --golden case does not match");
            return hy::tools::finish("hybrid-tokenize", 0);
        }
        if (!a.unmatched().empty())
            throw hy::Error(hy::Status::invalid_argument,
                            "unexpected argument '" + a.unmatched()[0] + "' (see --help)");
        hy::tools::check_int_args(a, {"repeat"});
        hy::tools::check_given_once(a);
        if (!a.count("tokenizer")) throw hy::Error(hy::Status::invalid_argument, "--tokenizer is required");
        if (a.count("repeat") && !a.count("bench"))
            throw hy::Error(hy::Status::invalid_argument, "--repeat applies to --bench only");
        int modes = int(a.count("text") + a.count("golden") + a.count("bench") + a.count("decode"));
        if (modes != 1)
            throw hy::Error(hy::Status::invalid_argument, "give exactly one of --text, --decode, --golden, --bench");
        std::string tok_path = a["tokenizer"].as<std::string>();
        // empty names are usage errors naming the option, as hybrid -f '' (they were "cannot open ''", exit 2 and 5)
        if (tok_path.empty())
            throw hy::Error(hy::Status::invalid_argument,
                            "--tokenizer needs a file or folder name (a tokenizer.json or a model folder)");
        for (const char* opt : {"golden", "bench"})
            if (a.count(opt) && a[opt].as<std::string>().empty())
                throw hy::Error(hy::Status::invalid_argument, std::string("--") + opt + " needs a file name");
        bool parse_special = !a.count("no-special");
        if (a.count("bench")) {
            const int repeat = a["repeat"].as<int>();
            if (repeat < 1)
                throw hy::Error(hy::Status::invalid_argument, "--repeat must be >= 1, got " + std::to_string(repeat));
            return hy::tools::finish("hybrid-tokenize", run_bench(tok_path, a["bench"].as<std::string>(), repeat));
        }
        hy::Tokenizer tok = load(tok_path);
        if (a.count("golden"))
            return hy::tools::finish("hybrid-tokenize", run_golden(tok, a["golden"].as<std::string>(), parse_special));
        if (a.count("decode")) {
            std::vector<int32_t> ids;
            std::string bad;
            const std::string list = a["decode"].as<std::string>();
            // (an empty list is a usage error, as hybrid --prompt-ids ''; it printed an empty line)
            if (list.find_first_not_of(' ') == std::string::npos)
                throw hy::Error(hy::Status::invalid_argument,
                                "--decode needs at least one token id (a list like 1,2,3)");
            if (!hy::parse_id_list(list, ids, &bad))
                throw hy::Error(hy::Status::invalid_argument,
                                "--decode: '" + bad + "' is not a token id (expected a list like 1,2,3)");
            std::cout << tok.decode(ids, !parse_special) << "\n";
            return hy::tools::finish("hybrid-tokenize", 0);
        }
        const std::string text = a["text"].as<std::string>();
        if (!hy::utf8_is_valid(text))  // as hybrid warns: each invalid sequence is encoded as U+FFFD
            std::fprintf(stderr,
                         "hybrid-tokenize: warning: --text is not valid UTF-8; its invalid bytes are read as "
                         "U+FFFD\n");
        std::cout << join_ids(tok.encode(text, parse_special)) << "\n";
        return hy::tools::finish("hybrid-tokenize", 0);
    } catch (const hy::tools::Failure& e) {
        std::fprintf(stderr, "hybrid-tokenize: %s\n", e.what());
        return e.code;
    } catch (const hy::Error& e) {
        std::fprintf(stderr, "hybrid-tokenize: %s\n", e.what());
        return hy::tools::exit_code_of(e);
    } catch (const cxxopts::exceptions::exception& e) {
        std::fprintf(stderr, "hybrid-tokenize: %s (see --help)\n",
                     hy::parse_error_message(e.what(), argc, argv).c_str());
        return hy::tools::exit_usage;
    } catch (const hy::tools::UsageError& e) {
        std::fprintf(stderr, "hybrid-tokenize: %s\n", e.what());
        return hy::tools::exit_usage;
    } catch (const std::exception& e) {  // bad_alloc
        std::fprintf(stderr, "hybrid-tokenize: %s\n", e.what());
        return hy::tools::exit_runtime;
    }
}
