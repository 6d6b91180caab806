// The `hybrid` program: shared declarations of cli/ (options, exit codes, the one-shot run and the chat REPL).
// The program uses only engine.h (the public C API) to reach the library.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/stdout_check.h"
#include "engine.h"

namespace hy::cli {

// Exit codes (documented in --help).
enum Exit : int {
    exit_ok = 0,
    exit_usage = 1,         // bad flag or value, missing -m, no or empty prompt
    exit_model = 2,         // the model could not be loaded (missing folder, malformed files, backend)
    exit_context = 3,       // the prompt or the conversation does not fit the context (-c)
    exit_snapshot = 4,      // a snapshot could not be loaded (not a snapshot, another model)
    exit_io = 5,            // a file could not be read or written (-f FILE, /save FILE, stdout)
    exit_runtime = 6,       // generation failed (backend error)
    exit_interrupted = 130  // Ctrl-C stopped a one-shot generation
};

// A failure that ends the program: a one-line message and an exit code.
struct Failure : std::runtime_error {
    Failure(int code_, const std::string& msg) : std::runtime_error(msg), code(code_) {}
    int code;
};

struct Options {
    std::string model_dir;  // -m
    std::string prompt;     // -p (escapes processed unless --no-escape) or the contents of -f
    bool has_prompt = false;
    std::vector<int32_t> prompt_ids;  // --prompt-ids
    bool has_prompt_ids = false;
    int n_predict = -1;                      // -n: -1 until EOS or context full
    int n_ctx = 4096;                        // -c
    int n_threads = 0;                       // -t: 0 all cores
    bool cuda_graphs = true;                 // --no-cuda-graphs turns them off
    hy_device device = HY_DEVICE_AUTO;       // --device
    hy_quant quant = HY_QUANT_NONE;          // --quant
    int quant_group = 0;                     // --quant int8:G / int4:G (0: the default)
    bool quant_lm_head = false;              // --quant-lm-head (with --quant int8/int4)
    hy_sampler_params sampling{};            // --temp, --top-k, ... and -s
    int sampling_given = 0;                  // hy_sampler_field mask of the sampling options given on the command line
    bool random_seed = true;                 // -s -1 (the default): sampling.seed was drawn at random
    std::vector<std::string> stop;           // --stop (repeatable)
    bool ignore_eos = false;                 // --ignore-eos
    bool no_think = false;                   // --no-think
    std::string system;                      // --system
    bool chat = false;                       // --chat
    bool interactive = false;                // -i / -cnv
    bool verbose = false;                    // --verbose
    bool escape = true;                      // off with --no-escape
    std::vector<std::string> batch_prompts;  // --batch-file lines (escapes processed unless --no-escape)
    std::vector<int> batch_lines;            // the line number (from 1) in the file of each batch prompt
    bool has_batch = false;
    int parallel = 8;  // --parallel / -np: sequence slots for --batch-file
};

// Parses argv. Returns false when the program should exit now with *exit_code (help, version); throws Failure
// (exit_usage) for a bad flag or value; reading -f may throw Failure(exit_io).
bool parse_options(int argc, char** argv, Options& opts, int* exit_code);

// Replaces \n, \t, \r, \\, \", \', \0 and \xNN (two hex digits: that byte) by the characters; any other backslash
// sequence stays as written.
std::string process_escapes(const std::string& s);

// ---- files (cli/files.cpp); every failure throws Failure(exit_io) worded as the library's reader (read_regular_file):
// "cannot open 'PATH': reason" or "cannot read 'PATH': reason" (write_file_atomic: "PATH: reason") ----
constexpr size_t kMaxInputFile = size_t(256) << 20;  // -f and --batch-file: 256 MiB

// Reads a whole input file of at most `cap` bytes: a regular file, or a pipe/terminal/device such as /dev/stdin
// (read until end of file, at most cap bytes). Refuses a directory ("cannot read 'PATH': a directory") and a larger
// file ("cannot read 'PATH': larger than 256 MiB, the most this reader takes").
std::string read_input_file(const std::string& path, size_t cap = kMaxInputFile);

// Opens a regular file (anything else is refused without opening it) and reads its first n bytes (fewer if it
// is shorter). *size receives the file size and *fd the open descriptor, which read_rest() reads and closes.
std::string read_regular_file_head(const std::string& path, size_t n, uint64_t* size, int* fd);
std::string read_rest(int fd, size_t n, const std::string& path);

// Writes data to path through a uniquely named temporary file in the same folder (fsync, then link or rename:
// hy::write_file_atomic of model/file_io.h), so no other file is touched and a failure leaves no half-written path.
// Refuses an existing path that is not a
// regular file (symbolic link, device, directory, FIFO), even with overwrite; without overwrite an existing path
// is refused with "PATH: " + exists_msg.
void write_file_atomic(const std::string& path, const std::string& data, bool overwrite, const std::string& exists_msg);

// ---- stdout (cli/stdout_check.h, shared with the tools and the server): write errors (a full disk, a closed pipe or
// descriptor) end the program with exit_io and "cannot write to stdout: <reason>" ----
using hy::tools::stdout_lost;   // true once a write to stdout was lost
using hy::tools::stdout_ok;     // flushes stdout; false when this or an earlier write failed
using hy::tools::write_stdout;  // writes and flushes; false on a write error (the caller stops producing output)
// Standard input was closed at start (`<&-`; main puts /dev/null there): reading "-" is an error, not an empty text.
extern bool g_stdin_closed;
// Throws Failure(exit_io) when a write to stdout failed.
void check_stdout();

// "1 token", "2 tokens": n and the noun, plural unless n == 1.
std::string count_of(size_t n, const char* noun);

// "" when a prompt of `bytes` bytes may fit a context of n_ctx; else the reason it cannot, found without tokenizing
// it (hy_model_max_token_bytes): "has B bytes, so at least N tokens, but the context holds C (-c): no room to
// generate".
std::string prompt_bytes_error(hy_model* m, size_t bytes, int n_ctx);

// Set by the SIGINT handler; token callbacks read it to stop the current answer.
extern std::atomic<bool> g_interrupted;
// hy_generate_params.should_abort for the CLI: 1 once Ctrl-C was pressed (g_interrupted), so a long prefill stops.
int interrupted_abort(void*);
void install_sigint_handler();

// Thinking mode chosen by the options (--no-think: disabled, else enabled).
int thinking_mode(const Options& o);

// Turns a failed engine call into a Failure with `code` and "what: message".
[[noreturn]] void engine_fail(int code, const std::string& what);

// Text of a chat rendering (hy_chat_render / hy_chat_continue); throws Failure(exit_usage).
std::string chat_render(hy_model* m, const std::vector<hy_chat_message>& msgs, bool add_generation_prompt, int thinking,
                        bool continuation);

// Tokenizes text (special tokens parsed); warns on stderr, naming `what`, when the text is not valid UTF-8 (each
// invalid sequence becomes U+FFFD). Throws Failure(exit_runtime) on error.
std::vector<int32_t> tokenize(hy_model* m, const std::string& text, const std::string& what);
// The ids that end a chat answer besides the model's end-of-sequence ids: the template's end-of-turn token and,
// when the vocabulary has them as single special tokens, <|endoftext|> (a new document) and <|im_start|> (a new
// turn the model would write for the user), as llama.cpp's end-of-generation tokens. Plain completion (-p without
// --chat) stops only at the model's own end-of-sequence ids, as Hugging Face generate does.
std::vector<int32_t> chat_stop_ids(hy_model* m);
// Throws Failure(exit_usage) naming `what` when a chat message's text holds a NUL byte (the chat format takes
// NUL-terminated messages: the text would be cut there silently) or, unless blank_ok, is only whitespace.
void check_chat_text(const std::string& text, const std::string& what, bool blank_ok = false);
// The text of a conversation's first turn: the --system message (when given) and the user message, rendered with
// the generation prompt and the thinking mode of the options; `what` names the user message in errors (both are
// checked with check_chat_text).
std::string chat_first_turn(hy_model* m, const Options& o, const std::string& user, const std::string& what);
// The same with another system message than --system ("" for none).
std::string chat_first_turn(hy_model* m, const Options& o, const std::string& system, const std::string& user,
                            const std::string& what);

// Prints the timing summary on stderr: load time (omitted when load_ms < 0), prompt and generation tokens, times
// and rates, then (when stop_line) the stop reason of the last generation; a callback stop reads "interrupted
// (Ctrl-C)" when `interrupted` or the Ctrl-C flag is set. The chat's session totals leave the stop out.
void print_summary(double load_ms, const hy_generate_result& r, bool interrupted = false, bool stop_line = true);

// --batch-file: generates for every prompt together (continuous batching) and writes JSONL to stdout. The model
// must have been loaded with at least one free slot. Returns the exit code.
int run_batch(const Options& o, hy_model* m, double load_ms);

// The chat REPL (-i). Returns the exit code.
int run_repl(const Options& o, hy_model* m, hy_context* c, hy_sampler* s, double load_ms);

}  // namespace hy::cli
