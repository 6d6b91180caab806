// Command-line options of `hybrid` (cxxopts), their validation and the help text with the exit codes.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <random>
#include <sstream>
#include <unistd.h>

#include "cli/arg_error.h"
#include "cli/cli.h"
#include "cli/option_table.h"

namespace hy::cli {

namespace {

const char* kExitCodes =
    "Sampling: options not given take the model folder's generation_config.json values when it has them\n"
    "  (temperature, top_k, top_p, min_p, repetition_penalty over the whole context; \"do_sample\": false is\n"
    "  greedy), as vLLM does; a field the file does not set takes the default shown above (llama.cpp's, where\n"
    "  vLLM would leave that sampler off). --verbose names the values taken from the file.\n"
    "\n"
    "Output:\n"
    "  Only the generated continuation goes to stdout (the prompt is not echoed), streamed token by token, with\n"
    "  no newline added unless stdout is a terminal (or shares its target with a summary on stderr);\n"
    "  with --prompt-ids the generated ids, comma-separated, one line. A timing summary (load time, prompt and\n"
    "  generation tokens and tok/s, stop reason) goes to stderr when it is a terminal, or always with --verbose;\n"
    "  the generation rate counts decode steps (the first token comes from the prompt's logits, so there is\n"
    "  usually one step fewer than tokens).\n"
    "\n"
    "Interactive chat (-i, -cnv): one line per user turn (stdin may be a pipe); -p TEXT is the first turn. Each\n"
    "  turn prefills only its new tokens; an answer ends at the end-of-turn token (also at <|endoftext|> or\n"
    "  <|im_start|>, as with --chat) or after -n tokens. Commands:\n"
    "  /reset, /save FILE (refuses to overwrite; /save! FILE overwrites; never a symbolic link, device or\n"
    "  directory), /load FILE, /help, /exit (or /quit).\n"
    "  Ctrl-C stops the current answer (at the input line: discards the line), Ctrl-D (end of input) exits.\n"
    "  When stdin is not a terminal, a failing command ends the program with its exit code. Answers go to\n"
    "  stdout, each followed by a newline; /save, /load and /reset are confirmed on stderr when stdin is a\n"
    "  terminal or with --verbose.\n"
    "\n"
    "Batch (--batch-file FILE): every non-empty line of FILE is a prompt (escapes processed unless --no-escape;\n"
    "  with --chat each is a user message). Up to --parallel of them are generated together (continuous\n"
    "  batching); prompt i samples with seed -s + i. stdout gets one JSON object per prompt, in input order:\n"
    "  {\"index\", \"prompt\", \"text\", \"ids\", \"logprobs\", \"n_prompt\", \"stop_reason\"}; -n applies to each.\n"
    "  A bad prompt fails alone: one that does not fit -c (as long as -c or longer), or with --chat a blank one or\n"
    "  one with a NUL byte, gets {\"index\", \"prompt\", \"n_prompt\", \"error\"} instead (the error is also\n"
    "  printed on stderr); the others still run, and the exit code is then the first failed prompt's: 3 for a\n"
    "  prompt too long, 1 for the others.\n"
    "\n"
    "Exit codes:\n"
    "  0    success\n"
    "  1    usage: unknown flag, bad value, missing -m, no or empty prompt\n"
    "  2    the model could not be loaded (missing folder, malformed or unsupported files, no GPU)\n"
    "  3    the prompt or the conversation does not fit the context (-c)\n"
    "  4    a snapshot could not be loaded (not a snapshot, truncated, saved from another model)\n"
    "  5    a file could not be read or written (-f FILE, /save FILE exists or is not writable), or stdout\n"
    "       (a full disk, an I/O error; a reader that closes the pipe, as head does, ends hybrid by SIGPIPE,\n"
    "       as it does other Unix tools: status 141 in the shell)\n"
    "  6    generation failed (backend error; the model produced NaN or inf logits)\n"
    "  130  interrupted by Ctrl-C (one-shot mode)\n"
    "  143  ended by SIGTERM (the default action: no summary, as other Unix tools)\n";

[[noreturn]] void usage(const std::string& msg) { throw Failure(exit_usage, msg); }

std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    std::string bad;
    if (s.find_first_not_of(' ') == std::string::npos)  // (it read "--prompt-ids: '' is not a token id")
        usage("--prompt-ids needs at least one token id (a list like 1,2,3)");
    if (!parse_id_list(s, ids, &bad))
        usage("--prompt-ids: '" + bad + "' is not a token id (expected a list like 1,2,3)");
    return ids;
}

}  // namespace

std::string process_escapes(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        const char c = s[i + 1];
        switch (c) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '"': out += '"'; break;
            case '\'': out += '\''; break;
            case '0': out += '\0'; break;
            case 'x':  // \xNN: the byte of two hex digits, as llama.cpp reads it (fewer digits: kept as written)
                if (i + 3 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 2])) &&
                    std::isxdigit(static_cast<unsigned char>(s[i + 3]))) {
                    out += char(std::stoi(s.substr(i + 2, 2), nullptr, 16));
                    i += 2;
                } else {
                    out += "\\x";
                }
                break;
            default:
                out += '\\';
                out += c;
                break;
        }
        i++;
    }
    return out;
}

namespace {

// What to say about a llama.cpp option that hybrid does not have ("" for any other word).
std::string llama_cpp_hint(const std::string& a) {
    static const char* const kHints[][2] = {
        {"-ngl",
         "hybrid has no per-layer offload: --device cuda, or auto (the default) when a GPU is present, puts "
         "the whole model on the GPU"},
        {"--n-gpu-layers", ""},
        {"--gpu-layers", ""},
        {"-sys", "the system message is --system"},
        {"-no-cnv", "one-shot generation is the default; -i starts the chat"},
        {"--no-conversation", ""},
        {"-fa", "attention always runs as fused kernels"},
        {"--flash-attn", ""},
        {"-r", "--stop STR ends the output at a string; --chat and -i end at the end of the turn"},
        {"--reverse-prompt", ""},
        {"--jinja", "the chat format is built in: --chat, or -i for a chat"},
        {"--chat-template", ""},
        {"-b", "hybrid sizes its prefill steps itself"},
        {"--batch-size", ""},
        {"-ub", ""},
        {"--ubatch-size", ""},
        {"-v", "--verbose prints the settings and the timing summary"},
        {"-e", "escapes in -p are processed by default (--no-escape turns that off)"},
        {"--escape", ""},
        {"--color", "hybrid writes plain text: only the generated continuation goes to stdout"},
        {"--mlock", "the weights are copied into the model's arena at load, not mapped from the files"},
        {"--no-mmap", ""}};
    std::string key = a.substr(0, a.find('='));  // --flash-attn=on, -ngl=99, -ngl99: the option's name
    if (key.size() > 1 && key[1] != '-')
        while (key.size() > 2 && std::isdigit(static_cast<unsigned char>(key.back()))) key.pop_back();
    const char* last = "";
    for (const auto& h : kHints) {
        if (*h[1]) last = h[1];  // an empty hint: the one of the entry before (another spelling)
        if (key == h[0]) return last;
    }
    return "";
}

}  // namespace

bool parse_options(int argc, char** argv, Options& o, int* exit_code) {
    cxxopts::Options opts("hybrid",
                          "hybrid: run Qwen3.5 hybrid models (Gated DeltaNet + attention) from a Hugging "
                          "Face folder.\nGenerates a continuation of a prompt, or chats (-i).");
    opts.custom_help("-m DIR [-p TEXT | -f FILE | --prompt-ids 1,2,3 | --batch-file FILE | -i] [options]");
    opts.set_width(110);
    // clang-format off
    // (-m, -t, --device and -h are declared in option_table.h, shared with the tools)
    add_shared_option(opts, "Model", "model");
    opts.add_options("Model")
        ("c,ctx-size", "context length in tokens, per sequence (each of the -np sequences of --batch-file has its "
                       "own; llama.cpp divides -c among them): the positions the model holds (prompt + output; the "
                       "last output token is never fed back, so it needs none; the prompt must be shorter than this); "
                       "0: the context the model was trained for (config.json max_position_embeddings)",
         cxxopts::value<int>()->default_value("4096"));
    add_shared_option(opts, "Model", "threads");
    add_shared_option(opts, "Model", "device");
    add_shared_option(opts, "Model", "quant");
    add_shared_option(opts, "Model", "quant-lm-head");
    add_shared_option(opts, "Model", "no-cuda-graphs");
    opts.add_options("Prompt")
        ("p,prompt", "prompt text (escapes \\n \\t \\r \\0 \\xNN \\\\ \\\" \\' processed)", cxxopts::value<std::string>())
        ("f,file", "read the prompt from FILE (as is; at most 256 MiB; - or a pipe such as /dev/stdin is read to "
                   "its end)", cxxopts::value<std::string>())
        ("prompt-ids", "prompt as token ids, e.g. 1,2,3; prints the generated ids", cxxopts::value<std::string>())
        ("no-escape", "do not process escapes in -p, --system, --stop and --batch-file lines")
        ("chat", "apply the chat format to the prompt (a user message); the answer ends at the end-of-turn token, "
                 "<|endoftext|> or <|im_start|>")
        ("system", "system message for --chat and -i", cxxopts::value<std::string>())
        ("no-think", "chat: disable thinking (empty <think></think> block)")
        ("i,interactive", "interactive chat (REPL; lines are taken as typed, escapes not processed); also -cnv")
        ("batch-file", "generate for every line of FILE (one prompt per line, escapes processed; at most "
                       "256 MiB) together; writes JSONL to stdout", cxxopts::value<std::string>())
        ("parallel", "--batch-file: sequences generated at once (sequence slots); also -np",
         cxxopts::value<int>()->default_value("8"));
    opts.add_options("Generation")
        ("n,n-predict", "tokens to generate (-1: until end of sequence or a full context)",
         cxxopts::value<int>()->default_value("-1"))
        ("ignore-eos", "do not stop at end-of-sequence (or, with --chat, end-of-turn) tokens: generate until -n or a "
                       "full context (not with -i)")
        ("stop", "stop when the output contains STR (repeatable; not printed; matched on the printed text, "
                 "which leaves out special tokens such as <|endoftext|> (--chat prints them); not with "
                 "--batch-file; with "
                 "--prompt-ids the ids end before the one that completes STR)",
         cxxopts::value<std::string>())
        ("s,seed", "RNG seed in [0, 2^64-1]; -1: random", cxxopts::value<std::string>()->default_value("-1"))
        ("temp", "temperature; <= 0: greedy", cxxopts::value<std::string>()->default_value("0.8"))
        ("top-k", "top-k sampling; <= 0: off", cxxopts::value<int>()->default_value("40"))
        ("top-p", "top-p (nucleus) sampling; 1: off", cxxopts::value<std::string>()->default_value("0.95"))
        ("min-p", "min-p sampling; 0: off", cxxopts::value<std::string>()->default_value("0.05"))
        ("repeat-penalty", "repetition penalty; 1: off", cxxopts::value<std::string>()->default_value("1.0"))
        ("repeat-last-n", "tokens (prompt included) the penalties look back; 0: off, -1: context size",
         cxxopts::value<int>()->default_value("64"))
        ("presence-penalty", "presence penalty; 0: off", cxxopts::value<std::string>()->default_value("0"))
        ("frequency-penalty", "frequency penalty; 0: off", cxxopts::value<std::string>()->default_value("0"));
    opts.add_options("Other")
        ("verbose", "print settings and the timing summary to stderr");
    add_shared_option(opts, "Other", "version");
    add_shared_option(opts, "Other", "help");
    // clang-format on

    // -cnv (llama.cpp's spelling) and --stop (its values may hold commas, which cxxopts would split) are taken
    // out before cxxopts sees the arguments. The word after an option that takes a value is that value, even when
    // it starts with '-' (as getopt does: `-p --stop` is the prompt "--stop", `-n -1` is -1): it is passed on as
    // the word after --name, which cxxopts takes as the value whatever it starts with (a --name=VALUE form would
    // not take a value of several lines).
    static const char* const kValued[][2] = {{"-m", "--model"},
                                             {"-c", "--ctx-size"},
                                             {"-t", "--threads"},
                                             {"-p", "--prompt"},
                                             {"-f", "--file"},
                                             {"-n", "--n-predict"},
                                             {"-s", "--seed"},
                                             {"", "--device"},
                                             {"", "--quant"},
                                             {"", "--prompt-ids"},
                                             {"", "--system"},
                                             {"", "--batch-file"},
                                             {"", "--parallel"},
                                             {"-np", "--parallel"},
                                             {"", "--temp"},
                                             {"", "--top-k"},
                                             {"", "--top-p"},
                                             {"", "--min-p"},
                                             {"", "--repeat-penalty"},
                                             {"", "--repeat-last-n"},
                                             {"", "--presence-penalty"},
                                             {"", "--frequency-penalty"}};
    auto valued = [](const std::string& a) -> const char* {
        for (const auto& v : kValued)
            if ((v[0][0] && a == v[0]) || a == v[1]) return v[1];
        return nullptr;
    };
    std::vector<std::string> args;
    std::vector<std::string> stops;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--") {  // the rest are operands, as given (hybrid takes none: cxxopts names the first)
            for (; i < argc; i++) args.push_back(argv[i]);
            break;
        }
        if (const char* name = valued(a)) {
            if (i + 1 >= argc) usage(a + " needs a value");
            // an option word where a value belongs is a forgotten value (`-m -p hi` made "-p" the model folder);
            // text values (the prompt, the system message) are taken as given
            if (const std::string e = missing_value_error(opts, name, argv[i + 1]); !e.empty())
                usage(a + e.substr(std::strlen(name)));
            // (-np and -cnv, llama.cpp's spellings, are not cxxopts options)
            if (!text_option(opts, name) && (valued(argv[i + 1]) || std::strcmp(argv[i + 1], "-cnv") == 0))
                usage(a + " needs a value (the next word, " + argv[i + 1] + ", is an option)");
            args.push_back(name);
            args.push_back(argv[++i]);
        } else if (const size_t eq = a.find('=');
                   a.rfind("--", 0) == 0 && eq != std::string::npos && valued(a.substr(0, eq))) {
            args.push_back(valued(a.substr(0, eq)));  // --prompt=VALUE as two words (VALUE may span lines)
            args.push_back(a.substr(eq + 1));
        } else if (const size_t eq1 = a.find('=');
                   a.size() > 1 && a[1] != '-' && eq1 != std::string::npos && valued(a.substr(0, eq1))) {
            // -p=hi would be the prompt "=hi" (getopt's reading), -np=4 an unknown option: neither is meant
            usage(a.substr(0, eq1) + " takes its value as the next word: " + a.substr(0, eq1) + " " +
                  a.substr(eq1 + 1) + ", or " + valued(a.substr(0, eq1)) + "=" + a.substr(eq1 + 1));
        } else if (const std::string e = short_assignment_error(opts, a); !e.empty()) {
            usage(e);  // -i=true: cxxopts would report "unknown option -="
        } else if (a == "-cnv") {
            args.push_back("--interactive");
        } else if (a == "-np") {  // llama.cpp's short spelling of --parallel
            args.push_back("--parallel");
        } else if (a == "--stop") {
            if (i + 1 >= argc) usage("--stop needs a value");
            stops.push_back(argv[++i]);
        } else if (a.rfind("--stop=", 0) == 0) {
            stops.push_back(a.substr(7));
        } else if (const std::string hint = llama_cpp_hint(a); !hint.empty()) {
            usage("unknown option " + a + " (" + hint + ")");
        } else if (const std::string e = single_dash_word_error(opts, a); !e.empty()) {
            usage(e);  // -temp, -sys: cxxopts would read them as -t "emp", -s "ys"
        } else {
            args.push_back(a);
        }
    }
    std::vector<char*> av;
    av.push_back(argv[0]);
    for (auto& a : args) av.push_back(a.data());

    cxxopts::ParseResult r;
    try {
        r = opts.parse(int(av.size()), av.data());
    } catch (const cxxopts::exceptions::no_such_option& e) {
        // "Option 'xyz' does not exist": "unknown option --xyz", as the unknown options found above are worded
        usage(parse_error_message(e.what(), argc, argv) + " (-h lists the options)");
    } catch (const cxxopts::exceptions::exception& e) {
        usage(parse_error_message(e.what(), argc, argv) + " (see --help)");  // the option as the user spelled it
    }
    // a switch is on when given, unless given as --switch=false (or =0, =f), which cxxopts parses as false
    auto flag = [&](const char* name) { return r.count(name) > 0 && r[name].as<bool>(); };
    if (flag("help")) {
        const std::string text = opts.help() + "\n" + kExitCodes;
        write_stdout(text.data(), text.size());  // a write error is reported by main()
        *exit_code = exit_ok;
        return false;
    }
    if (flag("version")) {
        const std::string text = std::string("hybrid ") + hy_version() + "\n";
        write_stdout(text.data(), text.size());
        *exit_code = exit_ok;
        return false;
    }
    if (!r.unmatched().empty()) {
        // an option that took the next flag as its value (-p -n 5: the prompt is "-n", and 5 is left over)
        std::string hint;
        auto flag_like = [](const std::string& v) {
            return v.size() >= 2 && v[0] == '-' && v.size() <= 24 && v.find(' ') == std::string::npos &&
                   !std::isdigit(static_cast<unsigned char>(v[1])) && v[1] != '.';
        };
        for (const auto& kv : r.arguments())
            if (hint.empty() && flag_like(kv.value()))
                hint = " (--" + kv.key() + " took '" + kv.value() + "' as its value: is a value missing?)";
        for (const std::string& v : stops)  // (taken before cxxopts)
            if (hint.empty() && flag_like(v)) hint = " (--stop took '" + v + "' as its value: is a value missing?)";
        usage("unexpected argument '" + r.unmatched()[0] + "'" + (hint.empty() ? " (see --help)" : hint));
    }
    if (const std::string bad =
            bad_int_arg(r, {"ctx-size", "threads", "parallel", "n-predict", "top-k", "repeat-last-n"});
        !bad.empty())
        usage(bad + " (see --help)");  // (as the values cxxopts refuses)
    if (!r.count("model")) usage("-m DIR is required (see --help)");

    o.model_dir = r["model"].as<std::string>();
    o.escape = !flag("no-escape");
    o.n_ctx = r["ctx-size"].as<int>();
    if (o.n_ctx < 0)
        usage("-c must be >= 0 (0: the model's trained context), got " + std::to_string(o.n_ctx) + " (see --help)");
    o.cuda_graphs = !flag("no-cuda-graphs");
    o.n_threads = r["threads"].as<int>();
    if (o.n_threads == -1) o.n_threads = 0;  // llama.cpp's spelling of "all cores"
    if (o.n_threads < 0 || o.n_threads > 1024)
        usage("-t must be -1 or in [0, 1024] (0 or -1: all cores), got " + std::to_string(o.n_threads));
    const std::string dev = r["device"].as<std::string>();
    if (dev == "auto")
        o.device = HY_DEVICE_AUTO;
    else if (dev == "cpu")
        o.device = HY_DEVICE_CPU;
    else if (dev == "cuda")
        o.device = HY_DEVICE_CUDA;
    else
        usage("--device must be auto, cpu or cuda, got '" + dev + "'");
    const std::string quant = r["quant"].as<std::string>();
    int quant_mode = HY_QUANT_NONE;
    if (hy_quant_parse(quant.c_str(), &quant_mode, &o.quant_group) != HY_OK)
        usage("--quant must be none, fp8, int8, int4, int8:G or int4:G (G 32 or a multiple of 64 up to 1024), got '" +
              quant + "'");
    o.quant = hy_quant(quant_mode);
    o.quant_lm_head = r["quant-lm-head"].as<bool>();
    if (o.quant_lm_head && o.quant != HY_QUANT_INT8 && o.quant != HY_QUANT_INT4)
        usage("--quant-lm-head needs --quant int8 or int4");

    // cxxopts keeps the last of repeated values: a repeated single-valued option is an error, not a silent choice
    for (const char* name : {"model",
                             "prompt",
                             "file",
                             "prompt-ids",
                             "batch-file",
                             "system",
                             "ctx-size",
                             "threads",
                             "device",
                             "quant",
                             "parallel",
                             "n-predict",
                             "seed",
                             "temp",
                             "top-k",
                             "top-p",
                             "min-p",
                             "repeat-penalty",
                             "repeat-last-n",
                             "presence-penalty",
                             "frequency-penalty"})
        if (r.count(name) > 1) {
            const std::string n = name;
            const char* short_name = n == "model"       ? "-m/"
                                     : n == "prompt"    ? "-p/"
                                     : n == "file"      ? "-f/"
                                     : n == "ctx-size"  ? "-c/"
                                     : n == "threads"   ? "-t/"
                                     : n == "n-predict" ? "-n/"
                                     : n == "seed"      ? "-s/"
                                     : n == "parallel"  ? "-np/"
                                                        : "";
            usage(std::string(short_name) + "--" + n + " was given more than once (give it once)");
        }
    const int n_sources = int(r.count("prompt") > 0) + int(r.count("file") > 0) + int(r.count("prompt-ids") > 0) +
                          int(r.count("batch-file") > 0);
    if (n_sources > 1) usage("give only one of -p, -f, --prompt-ids and --batch-file");
    // (option clashes before any file is read: a missing batch file is not the first thing to fix)
    if (flag("interactive") && r.count("batch-file")) usage("-i does not take --batch-file");
    if (r.count("batch-file")) {
        const std::string path = r["batch-file"].as<std::string>();
        if (path.empty()) usage("--batch-file needs a file name (or - for standard input)");
        std::istringstream in(read_input_file(path));
        std::string line;
        int line_no = 0;
        while (std::getline(in, line)) {
            line_no++;
            if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 byte order mark
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty()) continue;
            o.batch_prompts.push_back(o.escape ? process_escapes(line) : line);
            o.batch_lines.push_back(line_no);
        }
        if (o.batch_prompts.empty()) usage(path + ": the batch file holds no prompt");
        o.has_batch = true;
    }
    o.parallel = r["parallel"].as<int>();
    if (o.parallel < 1 || o.parallel > 256) usage("--parallel must be in [1, 256], got " + std::to_string(o.parallel));
    if (r.count("prompt")) {
        o.prompt = o.escape ? process_escapes(r["prompt"].as<std::string>()) : r["prompt"].as<std::string>();
        o.has_prompt = true;
    }
    if (r.count("file")) {
        if (r["file"].as<std::string>().empty()) usage("-f needs a file name (or - for standard input)");
        o.prompt = read_input_file(r["file"].as<std::string>());
        o.has_prompt = true;
    }
    if (r.count("prompt-ids")) {
        o.prompt_ids = parse_ids(r["prompt-ids"].as<std::string>());
        o.has_prompt_ids = true;
    }
    o.chat = flag("chat");
    o.interactive = flag("interactive");
    o.no_think = flag("no-think");
    o.verbose = flag("verbose");
    o.ignore_eos = flag("ignore-eos");
    if (o.ignore_eos && o.interactive) usage("--ignore-eos is not for -i (an answer would not end before -n)");
    if (r.count("system"))
        o.system = o.escape ? process_escapes(r["system"].as<std::string>()) : r["system"].as<std::string>();
    if (r.count("system") && !o.chat && !o.interactive) usage("--system needs --chat or -i");
    if (o.chat && o.has_prompt_ids) usage("--chat needs a text prompt (-p or -f), not --prompt-ids");
    if (o.interactive && o.has_prompt_ids) usage("-i does not take --prompt-ids");
    if (o.has_batch && !stops.empty()) usage("--stop is not supported with --batch-file");
    if (r.count("parallel") && !o.has_batch) usage("--parallel (-np) needs --batch-file");
    if (o.no_think && !o.chat && !o.interactive) usage("--no-think needs --chat or -i");
    if (!o.interactive && !o.has_prompt && !o.has_prompt_ids && !o.has_batch)
        usage(std::string("no prompt: give -p TEXT, -f FILE, --prompt-ids, --batch-file or -i") +
              (!g_stdin_closed && !isatty(STDIN_FILENO) ? " (-f - reads the prompt from standard input)" : ""));

    o.n_predict = r["n-predict"].as<int>();
    if (o.n_predict < -1) usage("-n must be >= -1, got " + std::to_string(o.n_predict) + " (see --help)");
    for (const auto& s : stops) {
        std::string v = o.escape ? process_escapes(s) : s;
        if (v.empty()) usage("--stop needs a non-empty string");
        if (v.find('\0') != std::string::npos) usage("--stop holds a NUL byte (\\0), which a stop string cannot carry");
        o.stop.push_back(v);
    }

    hy_sampler_params& sp = o.sampling;
    sp = hy_sampler_default_params();
    auto real = [&](const char* name) {  // the strict parse of a real-number option (arg_error.h)
        const std::string text = r[name].as<std::string>();
        double v = 0.0;
        if (!parse_real(text, &v) || !std::isfinite(v)) usage(invalid_real_message(text, name) + " (see --help)");
        if (!std::isfinite(float(v)))  // (a number, but past float's range)
            usage("invalid value '" + text + "' for --" + name + " (out of range) (see --help)");
        if (v > 0.0 && float(v) == 0.0f)  // (it would silently be 0: --temp 1e-300 was greedy without a word)
            usage("invalid value '" + text + "' for --" + name + " (too small: it rounds to 0 as a float" +
                  (std::string(name) == "repeat-penalty" ? ")" : "; give 0 for 0)") + " (see --help)");
        return float(v);
    };
    // the value as parsed, before float rounding (--top-p 1.00000001 is 1 as a float, but not in [0, 1])
    auto exact = [&](const char* name) {
        double v = 0.0;
        parse_real(r[name].as<std::string>(), &v);
        return v;
    };
    // (options not given take the model folder's generation_config.json values when it has them: main.cpp)
    if (r.count("temp")) o.sampling_given |= HY_SAMPLER_TEMPERATURE;
    if (r.count("top-k")) o.sampling_given |= HY_SAMPLER_TOP_K;
    if (r.count("top-p")) o.sampling_given |= HY_SAMPLER_TOP_P;
    if (r.count("min-p")) o.sampling_given |= HY_SAMPLER_MIN_P;
    if (r.count("repeat-penalty")) o.sampling_given |= HY_SAMPLER_REPEAT_PENALTY;
    if (r.count("repeat-last-n")) o.sampling_given |= HY_SAMPLER_REPEAT_LAST_N;
    sp.temperature = real("temp");
    sp.top_k = r["top-k"].as<int>();
    sp.top_p = real("top-p");
    sp.min_p = real("min-p");
    sp.repeat_penalty = real("repeat-penalty");
    sp.repeat_last_n = r["repeat-last-n"].as<int>();
    sp.presence_penalty = real("presence-penalty");
    sp.frequency_penalty = real("frequency-penalty");
    auto given = [&](const char* name) { return r[name].as<std::string>(); };  // (as typed: 1.0000001 is not "1")
    for (const char* name : {"top-p", "min-p"})
        if (!(exact(name) >= 0.0 && exact(name) <= 1.0))
            usage(std::string("--") + name + " must be in [0, 1], got " + given(name) + " (see --help)");
    if (sp.repeat_penalty <= 0.0f)
        usage("--repeat-penalty must be > 0, got " + given("repeat-penalty") + " (see --help)");
    if (sp.repeat_last_n < -1)
        usage("--repeat-last-n must be >= -1, got " + std::to_string(sp.repeat_last_n) + " (see --help)");
    const std::string seed = r["seed"].as<std::string>();
    o.random_seed = seed == "-1";
    if (o.random_seed) {
        sp.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    } else {
        // every uint64 (--verbose prints random seeds in that range); digits only, no sign, no overflow
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = std::strtoull(seed.c_str(), &end, 10);
        if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos || *end != '\0' ||
            errno == ERANGE)
            usage("-s must be -1 or an integer in [0, 18446744073709551615], got '" + seed + "' (see --help)");
        sp.seed = uint64_t(v);
    }
    return true;
}

}  // namespace hy::cli
