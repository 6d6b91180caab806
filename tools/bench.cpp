// hybrid-bench: prefill and decode speed of a model folder, with the bytes each decode step must move and the
// share of the memory-bandwidth roofline that the achieved rate represents.
//
// Roofline: a decode step of b sequences reads every weight once (the embedding table only through the logits
// when tied; of a mixture-of-experts layer's routed experts only those its rows chose, see weights_read_at), reads and
// writes each sequence's recurrent and conv state, and reads each sequence's KV cache up to its length. bytes_per_step
// / copy_bandwidth is the fastest possible step; the copy bandwidth is measured here, on the same device, by a large
// copy (bytes read + bytes written).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <random>

#include "model/model.h"
#include "tools/tool_common.h"

using namespace hy;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// "1,2,8" -> {1, 2, 8}: each item an integer in [1, 4096]; throws invalid_argument naming -b and the item.
std::vector<int> parse_list(const std::string& s) {
    std::vector<int32_t> v;
    std::string bad;
    if (!parse_int_list(s, 1, 4096, v, &bad))
        throw tools::UsageError("-b: '" + bad +
                                "' is not a batch size in [1, 4096] (expected a list like 1,2,8), "
                                "in '" +
                                s + "'");
    return std::vector<int>(v.begin(), v.end());
}

// The process's peak resident set so far (Linux VmHWM; getrusage's ru_maxrss elsewhere), in bytes.
size_t peak_rss_bytes() {
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        size_t kib = 0;
        bool found = false;
        while (std::fgets(line, sizeof line, f))
            if (std::sscanf(line, "VmHWM: %zu kB", &kib) == 1) {
                found = true;
                break;
            }
        std::fclose(f);
        if (found) return kib * 1024;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return size_t(ru.ru_maxrss) * 1024;
}

// Resets the peak resident set to the current one (Linux 4.0+: "5" to /proc/self/clear_refs); best effort.
void reset_peak_rss() {
    if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
        std::fputs("5", f);
        std::fclose(f);
    }
}

int32_t argmax(const float* v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

// The --json output: prepare() checks the path before the run and opens a FIFO or a device there, write() writes
// the text at the end (through that descriptor, or into a file it creates). Errors are Error(io) naming the path.
class JsonOut {
public:
    JsonOut() = default;
    JsonOut(const JsonOut&) = delete;
    JsonOut& operator=(const JsonOut&) = delete;
    ~JsonOut() {
        if (fd_ >= 0) ::close(fd_);
    }

    void prepare(const std::string& path) {
        path_ = path;
        if (path.empty()) throw tools::UsageError("--json needs a file name (or - for standard output)");
        if (path == "-") {  // standard output (the table goes to standard error then)
            fd_ = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
            if (fd_ < 0) throw Error(Status::io, "--json -: standard output is closed");
            path_ = "standard output";
            to_stdout_ = true;
            return;
        }
        path_present(path);  // (a broken symbolic link or a loop: named with its target, not created through)
        struct stat st;
        if (::stat(path.c_str(), &st) == 0) {
            if (S_ISDIR(st.st_mode)) throw Error(Status::io, path + ": is a directory");
            // (nothing the user has is replaced: a model's config.json, an earlier run; a link is followed to see
            // what it names, so /dev/stdout works when stdout is a pipe or a terminal)
            if (S_ISREG(st.st_mode)) {
                struct stat out;  // /dev/stdout with standard output sent to a file (`> out.json`): that file
                if (::fstat(1, &out) == 0 && out.st_dev == st.st_dev && out.st_ino == st.st_ino) {
                    fd_ = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
                    if (fd_ < 0) throw Error(Status::io, path + ": cannot write: " + std::strerror(errno));
                    to_stdout_ = true;
                    return;
                }
                struct stat lst;
                if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
                    char* target = ::realpath(path.c_str(), nullptr);
                    const std::string to = target ? target : "?";
                    std::free(target);
                    throw Error(Status::io, path + ": is a symbolic link to an existing file (" + to +
                                                "); not replaced (--json writes a new file)");
                }
                throw Error(Status::io, path + ": exists (--json writes a new file; remove it first)");
            }
            // a FIFO, a terminal or another device: opened now and kept (non-blocking: a FIFO without a reader
            // fails with ENXIO instead of blocking the open; blocking again for the write)
            fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK);
            if (fd_ < 0) {
                const std::string why =
                    errno == ENXIO && S_ISFIFO(st.st_mode) ? "a FIFO with no reader" : std::strerror(errno);
                throw Error(Status::io, path + ": cannot write: " + why);
            }
            const int flags = ::fcntl(fd_, F_GETFL);
            if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0)
                throw Error(Status::io, path + ": cannot write: " + std::strerror(errno));
            struct stat out;  // /dev/stdout, or the terminal or pipe standard output is
            to_stdout_ = ::fstat(1, &out) == 0 && out.st_dev == st.st_dev && out.st_ino == st.st_ino;
            return;
        }
        const size_t slash = path.rfind('/');
        const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
        struct stat fs;
        if (::stat(folder.c_str(), &fs) != 0 || !S_ISDIR(fs.st_mode))
            throw Error(Status::io, path + ": cannot write: no folder " + folder);
        if (::access(folder.c_str(), W_OK | X_OK) != 0)
            throw Error(Status::io, path + ": cannot write: " + std::strerror(errno));
    }

    // Whether the JSON goes where standard output goes (the table is then printed to standard error, so that the
    // output is the JSON alone).
    bool to_stdout() const { return to_stdout_; }

    void write(const std::string& text) {
        bool created = false;
        if (fd_ < 0) {
            fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd_ < 0 && errno == EEXIST)
                throw Error(Status::io, path_ + ": appeared during the run; not replaced (--json writes a new file)");
            if (fd_ < 0) throw Error(Status::io, path_ + ": cannot write: " + std::strerror(errno));
            created = true;
        }
        // (a reader that went away: EPIPE and a message, not a silent death by SIGPIPE)
        void (*saved)(int) = std::signal(SIGPIPE, SIG_IGN);
        size_t done = 0;
        int err = 0;
        while (done < text.size()) {
            const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                err = n < 0 ? errno : EIO;
                break;
            }
            done += size_t(n);
        }
        if (::close(fd_) != 0 && err == 0) err = errno;
        fd_ = -1;
        std::signal(SIGPIPE, saved);
        if (err != 0) {
            if (created) ::unlink(path_.c_str());  // (this run's file: no truncated JSON left)
            throw Error(Status::io, to_stdout_ ? std::string("cannot write to stdout: ") + std::strerror(err)
                                               : path_ + ": write failed: " + std::strerror(err));
        }
    }

private:
    std::string path_;
    int fd_ = -1;
    bool to_stdout_ = false;
};

}  // namespace

int main(int argc, char** argv) {
    // each finished line reaches a redirected stdout at once (a Ctrl-C lost every finished row and case)
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const auto t_start = Clock::now();
    cxxopts::Options opts("hybrid-bench",
                          "Prefill and decode speed, bytes moved per token, share of the bandwidth roofline");
    // clang-format off
    // (-m, --device, -t and -h are declared in cli/option_table.h, shared with hybrid and the other tools)
    add_shared_option(opts, "", "model");
    opts.add_options()
        ("p,prompt", "prompt tokens (random ids)", cxxopts::value<int>()->default_value("512"))
        ("n,gen", "decode steps per sequence (each feeds one token after the prompt; llama-bench's -n)",
         cxxopts::value<int>()->default_value("128"))
        ("b,batch", "batch sizes (sequences decoded together), comma-separated",
         cxxopts::value<std::string>()->default_value("1"))
        ("d,depth", "context tokens (random ids) each sequence holds before the timed prompt and decode: speeds at "
         "that depth of the KV cache (llama-bench's -d); they are prefilled untimed", cxxopts::value<int>()->default_value("0"))
        ("r,reps", "repetitions (medians are reported)", cxxopts::value<int>()->default_value("3"));
    add_shared_option(opts, "", "device");
    add_shared_option(opts, "", "quant");
    add_shared_option(opts, "", "quant-lm-head");
    add_shared_option(opts, "", "threads");
    add_shared_option(opts, "", "no-cuda-graphs");
    add_shared_option(opts, "", "no-pdl");
    add_shared_option(opts, "", "moe-grouped-rows");
    opts.add_options()
        ("ubatch", "prefill chunk (rows per forward step)", cxxopts::value<int>()->default_value("512"))
        ("json", "also write the results to this JSON file (a new file, created at the end: an existing file is "
         "refused; a FIFO or a device is opened at the start and written at the end); - or /dev/stdout: standard "
         "output, with the table on standard error",
         cxxopts::value<std::string>())
        ("dummy-weights", "read config.json alone and fill the weights with random values on the device (any shape "
         "without a checkpoint; vLLM's --load-format dummy)")
        ("cuda-trace", "CUDA builds with -DHY_CUDA_TRACE=ON: write every kernel's start and ready times to this file "
         "(tools/gpu/trace_summary.py)", cxxopts::value<std::string>())
        ("attn-heads-per-block", "CUDA, decode attention: q heads of one kv head per block, 1, 2 or 4 (0: the "
         "built-in default; the results are the same)", cxxopts::value<int>()->default_value("0"))
        ("attn-prefill-heads", "CUDA, prefill attention: q heads of one kv head per flash block, 1, 2 or 4 (0: the "
         "built-in default; the results are the same)", cxxopts::value<int>()->default_value("0"))
        ("attn-splits", "CUDA, decode attention: most position splits per row and head, 1 to 128 (0: the built-in "
         "default)", cxxopts::value<int>()->default_value("0"))
        ("int-split-k", "CUDA, --quant int8/int4 decode GEMVs: split K in two halves: always, never or auto (by shape, "
         "the default)", cxxopts::value<std::string>()->default_value("auto"))
        ("int-gemv-staged", "CUDA, --quant int8/int4 decode GEMVs: copy the codes into shared memory in cp.async stages "
         "instead of registers (the same results): always, never or auto (2 to 4 rows, the default)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("small-batch-gemv", "CUDA, bf16 matrices with 3 to 16 rows (batched decode): all (every matrix of 3-16 rows on the "
         "tensor-core GEMV), groups (only groups of 3 or 4 matrices of 3-8 rows there, the others on cuBLASLt), mixed "
         "(all up to 8 rows, then groups of 3 or 4 up to 16 rows there and the others on cuBLASLt) or auto (the "
         "default: all up to 8 rows, then --wide-gemv)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("wide-gemv", "CUDA, bf16 matrices with 9 to 64 rows that --small-batch-gemv leaves to cuBLASLt: on (all on "
         "the tensor-core GEMV in thread-block clusters, sm_90), off (all on cuBLASLt) or auto (the default: 9-16 "
         "rows in clusters)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("wgmma-gemm", "CUDA, bf16 matrices with 9 to 128 rows: auto (the default: the wgmma GEMM, sm_90a, by shape: "
         "9-64 rows of groups sharing x, 9-32 of other matrices, cuBLASLt beyond), uniform (every matrix of 17-64 "
         "rows, 9-16 on the cluster GEMV), on (every matrix up to 128 rows) or off (cuBLASLt)",
         cxxopts::value<std::string>()->default_value("auto"))
        ("gdn-decode-stream", "CUDA, decode steps of more than 8 sequences: stream the Gated DeltaNet states through "
         "one block an SM (on) or a block per head and sequence (off, the default)",
         cxxopts::value<std::string>()->default_value("off"))
        ("gdn-decode-blocks", "CUDA, decode steps of more than 8 sequences: the Gated DeltaNet decode kernel with "
         "three blocks an SM (3; value heads up to 128, 80 registers a thread) or two (2, the default)",
         cxxopts::value<int>()->default_value("2"))
        ("gdn-conv-rows", "CUDA, prefill: the most rows a Gated DeltaNet conv thread takes, 1 to 16; 0: 16 (the "
         "default)", cxxopts::value<int>()->default_value("0"))
        ("wgmma-parts", "CUDA, the wgmma GEMM (--wgmma-gemm): split K over 1, 2, 4 or 8 blocks of a cluster; 0: by shape (the "
         "default)", cxxopts::value<int>()->default_value("0"))
        ("wgmma-quant", "CUDA, int8/int4 weights (fp8 with --fp8-gemm dequantize) with 9 to 64 rows: on (the "
         "default: the wgmma GEMM reading their codes, sm_90a) or off (int8/int4 dequantized for cuBLASLt, fp8 "
         "dequantized for the bf16 GEMM)", cxxopts::value<std::string>()->default_value("on"))
        ("wgmma-quant-warpgroups", "CUDA, that GEMM's consumer warpgroups a block: 1 or 2 (the default)",
         cxxopts::value<int>()->default_value("2"))
        ("wgmma-stream-k", "CUDA, the bf16 wgmma GEMM (9 to 64 rows) splits its tiles and K evenly over two "
         "blocks an SM (stream-K): on or off (the default: K split over a cluster)",
         cxxopts::value<std::string>()->default_value("off"))
        ("wgmma-stream-k-quant", "CUDA, the same for the int8/int4/fp8 wgmma GEMM: on or off",
         cxxopts::value<std::string>()->default_value("on"));
    add_shared_option(opts, "", "fp8-gemm");
    add_shared_option(opts, "", "version");
    add_shared_option(opts, "", "help");
    // clang-format on
    cxxopts::ParseResult args;
    int exit_code = 0;
    if (!tools::parse_args(opts, argc, argv, "hybrid-bench", args, &exit_code)) return exit_code;
    if (!args.unmatched().empty()) {
        std::fprintf(stderr, "hybrid-bench: unexpected argument '%s' (see --help)\n", args.unmatched()[0].c_str());
        return tools::exit_usage;
    }
    try {
        tools::check_int_args(
            args, {"prompt", "gen", "reps", "threads", "ubatch", "depth", "attn-heads-per-block", "attn-prefill-heads",
                   "attn-splits", "moe-grouped-rows", "wgmma-parts", "gdn-conv-rows", "gdn-decode-blocks"});
        tools::check_given_once(args);
        const std::string dir = args["model"].as<std::string>();
        const int n_prompt = args["prompt"].as<int>(), n_gen = args["gen"].as<int>(), reps = args["reps"].as<int>();
        const int depth = args["depth"].as<int>();
        if (depth < 0) throw tools::UsageError("--depth must be >= 0, got " + std::to_string(depth));
        std::vector<int> batches = parse_list(args["batch"].as<std::string>());
        for (const auto& [flag, v] : {std::pair<const char*, int>{"-p", n_prompt}, {"-n", n_gen}, {"-r", reps}})
            if (v < 1) throw tools::UsageError(std::string(flag) + " must be >= 1, got " + std::to_string(v));
        if (reps > 10000) throw tools::UsageError("-r must be at most 10000, got " + std::to_string(reps));
        const int max_b = *std::max_element(batches.begin(), batches.end());  // parse_list: not empty, all >= 1
        const int ubatch = args["ubatch"].as<int>(), threads = tools::parse_threads(args["threads"].as<int>());
        if (ubatch < 1) throw tools::UsageError("--ubatch must be >= 1, got " + std::to_string(ubatch));
        // the --json target must be writable before the run (a bad path fails now, not after it). A FIFO or a
        // device (a terminal, /dev/stdout on a pipe) is opened now, once, and the JSON goes through that descriptor
        // at the end (opening it twice ended a reader such as cat at the first close). A new file is created at the
        // end (an interrupted run leaves no empty file), exclusively: nothing the user has is replaced.
        JsonOut json_out;
        if (args.count("json")) json_out.prepare(args["json"].as<std::string>());
        const std::string dev = args["device"].as<std::string>();
        ModelParams mp;
        mp.device = tools::parse_device(dev);
        tools::parse_quant(args["quant"].as<std::string>(), mp);
        tools::parse_quant_lm_head(args["quant-lm-head"].as<bool>(), mp);
        mp.n_threads = threads;
        mp.cuda.graphs = !args["no-cuda-graphs"].as<bool>();
        mp.cuda.pdl = !args["no-pdl"].as<bool>();
        mp.dummy_weights = args["dummy-weights"].as<bool>();
        mp.cuda.moe_grouped_min_rows = tools::parse_moe_grouped_rows(args["moe-grouped-rows"].as<int>());
        mp.cuda.attn_heads_per_block = args["attn-heads-per-block"].as<int>();
        if (mp.cuda.attn_heads_per_block != 0 && mp.cuda.attn_heads_per_block != 1 &&
            mp.cuda.attn_heads_per_block != 2 && mp.cuda.attn_heads_per_block != 4)
            throw tools::UsageError("--attn-heads-per-block must be 0, 1, 2 or 4, got " +
                                    std::to_string(mp.cuda.attn_heads_per_block));
        mp.cuda.attn_prefill_heads_per_block = args["attn-prefill-heads"].as<int>();
        if (mp.cuda.attn_prefill_heads_per_block != 0 && mp.cuda.attn_prefill_heads_per_block != 1 &&
            mp.cuda.attn_prefill_heads_per_block != 2 && mp.cuda.attn_prefill_heads_per_block != 4)
            throw tools::UsageError("--attn-prefill-heads must be 0, 1, 2 or 4, got " +
                                    std::to_string(mp.cuda.attn_prefill_heads_per_block));
        // an auto|always|never switch's value as 0 / 1 / -1 (anything else is a usage error naming the flag)
        auto auto_always_never = [&](const char* name) {
            const std::string v = args[name].as<std::string>();
            if (v != "auto" && v != "always" && v != "never")
                throw tools::UsageError(std::string("--") + name + " must be auto, always or never, got '" + v + "'");
            return v == "always" ? 1 : v == "never" ? -1 : 0;
        };
        mp.cuda.int_gemv_split_k = auto_always_never("int-split-k");
        mp.cuda.int_gemv_staged = auto_always_never("int-gemv-staged");
        {
            const std::string v = args["small-batch-gemv"].as<std::string>();
            if (v != "auto" && v != "all" && v != "groups" && v != "mixed")
                throw tools::UsageError("--small-batch-gemv must be auto, all, groups or mixed, got '" + v + "'");
            mp.cuda.small_batch_gemv = v == "all" ? 1 : v == "groups" ? -1 : v == "mixed" ? 2 : 0;
        }
        {
            const std::string v = args["wide-gemv"].as<std::string>();
            if (v != "auto" && v != "on" && v != "off")
                throw tools::UsageError("--wide-gemv must be auto, on or off, got '" + v + "'");
            mp.cuda.wide_gemv = v == "on" ? 1 : v == "off" ? -1 : 0;
        }
        {
            const std::string v = args["wgmma-gemm"].as<std::string>();
            if (v != "auto" && v != "on" && v != "off" && v != "uniform")
                throw tools::UsageError("--wgmma-gemm must be auto, on, off or uniform, got '" + v + "'");
            mp.cuda.wgmma_gemm = v == "on" ? 1 : v == "off" ? -1 : v == "uniform" ? 2 : 0;
            const int parts = args["wgmma-parts"].as<int>();
            if (parts != 0 && parts != 1 && parts != 2 && parts != 4 && parts != 8)
                throw tools::UsageError("--wgmma-parts must be 0, 1, 2, 4 or 8, got " + std::to_string(parts));
            if (parts != 0 && mp.cuda.wgmma_gemm < 0)
                throw tools::UsageError("--wgmma-parts needs --wgmma-gemm auto or on (it sets that GEMM's K split)");
            mp.cuda.wgmma_gemm_parts = parts;
        }
        // an on|off switch's value (anything else is a usage error naming the flag)
        auto on_off = [&](const char* name) {
            const std::string v = args[name].as<std::string>();
            if (v != "on" && v != "off")
                throw tools::UsageError(std::string("--") + name + " must be on or off, got '" + v + "'");
            return v == "on";
        };
        {
            mp.cuda.wgmma_quant = on_off("wgmma-quant");
            const int wg = args["wgmma-quant-warpgroups"].as<int>();
            if (wg != 1 && wg != 2)
                throw tools::UsageError("--wgmma-quant-warpgroups must be 1 or 2, got " + std::to_string(wg));
            mp.cuda.wgmma_quant_warpgroups = wg;
            mp.cuda.wgmma_stream_k = on_off("wgmma-stream-k");
            mp.cuda.wgmma_stream_k_quant = on_off("wgmma-stream-k-quant");
        }
        mp.cuda.gdn_decode_stream = on_off("gdn-decode-stream");
        {
            const int blocks = args["gdn-decode-blocks"].as<int>();
            if (blocks != 2 && blocks != 3)
                throw tools::UsageError("--gdn-decode-blocks must be 2 or 3, got " + std::to_string(blocks));
            mp.cuda.gdn_decode_three_blocks = blocks == 3;
        }
        mp.cuda.gdn_conv_rows = args["gdn-conv-rows"].as<int>();
        if (mp.cuda.gdn_conv_rows < 0 || mp.cuda.gdn_conv_rows > 16)
            throw tools::UsageError("--gdn-conv-rows must be 0 to 16, got " + std::to_string(mp.cuda.gdn_conv_rows));
        mp.cuda.attn_max_splits = args["attn-splits"].as<int>();
        if (mp.cuda.attn_max_splits < 0 || mp.cuda.attn_max_splits > 128)
            throw tools::UsageError("--attn-splits must be 0 to 128, got " + std::to_string(mp.cuda.attn_max_splits));
        mp.cuda.fp8_block_scaled_gemm = tools::parse_fp8_gemm(args["fp8-gemm"].as<std::string>());
        if (args.count("cuda-trace")) {
            mp.cuda.trace_file = args["cuda-trace"].as<std::string>();
            if (mp.cuda.trace_file.empty()) throw tools::UsageError("--cuda-trace needs a file name");
        }
        const int64_t positions = int64_t(depth) + n_prompt + n_gen;
        if (positions + 1 > (int64_t(1) << 30))  // (the sum overflowed int: "context length -1")
            throw tools::UsageError("--depth + -p + -n must be at most 2^30 - 1 positions, got " +
                                    std::to_string(positions));
        mp.n_ctx = int(positions + 1);
        mp.n_slots = max_b;
        // (a chunk past the longer of the prompt and the depth is never used)
        mp.max_batch_tokens = std::max(std::min(ubatch, std::max(n_prompt, depth)), max_b);
        mp.max_logits = max_b;
        mp.progress = tools::load_progress("hybrid-bench");
        auto model = tools::loading([&] {
            try {
                return Model::load(dir, mp);
            } catch (const Error& e) {  // a folder with config.json alone: its shape can still be measured
                if (mp.dummy_weights || std::strstr(e.what(), "safetensors") == nullptr ||
                    !path_present(dir + "/config.json") || path_present(dir + "/model.safetensors") ||
                    path_present(dir + "/model.safetensors.index.json"))
                    throw;
                throw Error(e.status(), std::string(e.what()) +
                                            " (--dummy-weights measures the shape of config.json with random weights)");
            }
        });
        if (!model->load_warning().empty())
            std::fprintf(stderr, "%s: warning: %s\n", "hybrid-bench", model->load_warning().c_str());
        tools::warn_oversubscribed("hybrid-bench", threads, *model);
        const double t_ready = seconds_since(t_start);
        const ModelConfig& c = model->config();
        if (c.max_position_embeddings > 0 && mp.n_ctx - 1 > c.max_position_embeddings)  // (n_ctx: positions + 1)
            std::fprintf(stderr,
                         "hybrid-bench: warning: --depth + -p + -n = %d positions pass the %d the model was trained "
                         "for (max_position_embeddings)\n",
                         mp.n_ctx - 1, c.max_position_embeddings);
        Backend& be = model->backend();
        for (const char* flag : {"fp8-gemm",
                                 "attn-heads-per-block",
                                 "attn-prefill-heads",
                                 "attn-splits",
                                 "int-split-k",
                                 "int-gemv-staged",
                                 "moe-grouped-rows",
                                 "small-batch-gemv",
                                 "wide-gemv",
                                 "wgmma-gemm",
                                 "wgmma-parts",
                                 "wgmma-quant",
                                 "wgmma-quant-warpgroups",
                                 "wgmma-stream-k",
                                 "wgmma-stream-k-quant",
                                 "gdn-decode-stream",
                                 "gdn-conv-rows",
                                 "gdn-decode-blocks",
                                 "no-cuda-graphs",
                                 "no-pdl"})
            if (args.count(flag) && std::string(be.name()) != "cuda")
                std::fprintf(stderr, "hybrid-bench: note: --%s only changes the CUDA backend; ignored on %s\n", flag,
                             be.name());
        if (!mp.cuda.trace_file.empty() && std::string(be.name()) != "cuda")
            throw tools::UsageError("--cuda-trace needs the CUDA backend; the model runs on " + std::string(be.name()));
        // the table: on standard error when the JSON goes to standard output
        std::FILE* const table = json_out.to_stdout() ? stderr : stdout;
        if (mp.dummy_weights)
            std::fprintf(table, "dummy weights: random values from config.json's shapes (no checkpoint)\n");
        // The copy probe allocates temporary buffers (512 MiB of host memory on the CPU): the reported peak RSS
        // is the peak before it or after it, not during it.
        const size_t rss_before_probe = peak_rss_bytes();
        const double copy_gbs = be.copy_bandwidth_gbs();
        reset_peak_rss();

        // Bytes a decode step must move, per sequence and shared.
        const Weights& w = model->weights();
        const size_t as = dtype_size(be.act_dtype());
        size_t weights_read = model->weight_bytes();
        // the embedding table is read only through the logits, and only when lm_head is that table (tied, not given
        // a quantized copy by --quant-lm-head); otherwise a step reads one row of it
        if (w.output.data != w.embed.data) weights_read -= matrix_bytes(w.embed);
        const size_t ssm = size_t(c.gdn_v_heads) * size_t(c.gdn_k_dim) * size_t(c.gdn_v_dim) * 4;
        const size_t conv = size_t(c.conv_kernel - 1) * size_t(c.gdn_conv_channels()) * as;
        const size_t state_rw = size_t(c.n_gdn_layers()) * 2 * (ssm + conv);  // read + write
        // MoE layers: a step reads every router and shared expert but only the routed experts its rows chose: k of
        // the E at batch 1, and at batch b the expected number of distinct experts under uniform routing,
        // E (1 - (1 - k/E)^b) (an estimate: real routers are not uniform).
        double expert_bytes = 0.0, one_expert = 0.0;  // all routed experts' bytes; one expert's, in one layer
        int n_moe_layers = 0;
        for (const LayerWeights& L : w.layers) {
            if (!L.moe) continue;
            const MoeExperts& ex = L.moe_block.experts;
            const double bytes = double(matrix_bytes(ex.gate_up) + matrix_bytes(ex.down));  // (FP8: with the scales)
            expert_bytes += bytes;
            one_expert = bytes / ex.n_experts;
            n_moe_layers++;
        }
        auto weights_read_at = [&](int b) {
            if (n_moe_layers == 0) return double(weights_read);
            const double E = c.n_experts, k = c.n_experts_per_tok;
            const double distinct = b == 1 ? k : E * (1.0 - std::pow(1.0 - k / E, double(b)));
            return double(weights_read) - expert_bytes + n_moe_layers * distinct * one_expert;
        };
        const size_t kv_per_pos = size_t(c.n_attention_layers()) * 2 * size_t(c.n_kv_heads) * size_t(c.head_dim) * as;

        std::mt19937 rng(1234);
        std::uniform_int_distribution<int32_t> pick(0, std::min(c.vocab_size, 4096) - 1);
        std::fprintf(
            table,
            "model %s: %d layers (%d attention), hidden %d, vocab %d; backend %s; arena %.1f MiB (weights %.1f MiB)\n",
            dir.c_str(), c.n_layers, c.n_attention_layers(), c.hidden_size, c.vocab_size, be.name(),
            double(model->arena_bytes()) / 1048576.0, double(model->weight_bytes()) / 1048576.0);
        // the weights as loaded (an FP8 or int4 checkpoint's, or 16-bit ones quantized at load) and the --quant that
        // was asked for: a speed means little without them
        const WeightQuant quant = mp.quant;  // (as given: a pre-quantized checkpoint shows in the weights' formats)
        const int quant_group = weight_quant_group(quant, mp.quant_group);
        const std::string weight_types = weight_dtypes_text(w);
        const bool fp8 = has_fp8_weights(w) && std::string(be.name()) == "cuda";  // (the CPU has one FP8 matmul)
        // (JSON null where no FP8 GEMM runs)
        const char* fp8_gemm = mp.cuda.fp8_block_scaled_gemm ? "block-scaled" : "dequantize";
        std::fprintf(table, "weights %s; --quant %s%s%s%s\n", weight_types.c_str(), weight_quant_name(quant),
                     quant_group > 0 ? (", groups of " + std::to_string(quant_group)).c_str() : "",
                     mp.quant_lm_head ? ", lm_head quantized" : "",
                     fp8 ? (std::string("; --fp8-gemm ") + fp8_gemm).c_str() : "");
        if (!be.settings().empty()) std::fprintf(table, "backend settings: %s\n", be.settings().c_str());
        std::fprintf(table, "ready after %.2f s; copy bandwidth %s\n", t_ready,
                     copy_gbs > 0 ? (std::to_string(int(copy_gbs)) + " GB/s").c_str() : "not measured");
        std::fprintf(
            table,
            "\n| batch | depth | prompt | gen | prefill tok/s | decode tok/s | MB/step | GB/s | %% roofline |\n");
        std::fprintf(table,
                     "|------:|------:|-------:|----:|--------------:|-------------:|--------:|-----:|-----------:|\n");

        nlohmann::json out = {{"model", dir},
                              {"backend", be.name()},
                              {"backend_settings", be.settings()},
                              {"dummy_weights", mp.dummy_weights},
                              {"ready_s", t_ready},
                              {"copy_gbs", copy_gbs},
                              {"arena_bytes", model->arena_bytes()},
                              {"weight_bytes", model->weight_bytes()},
                              {"state_bytes", model->state_bytes()},
                              {"settings",
                               {{"prompt", n_prompt},
                                {"depth", depth},
                                {"gen", n_gen},
                                {"batch", batches},
                                {"reps", reps},
                                {"threads", threads},
                                {"ubatch", ubatch},
                                {"device", dev},
                                {"quant", weight_quant_name(quant)},
                                {"quant_group", quant_group},
                                {"quant_lm_head", model->params().quant_lm_head},
                                {"fp8_gemm", fp8 ? nlohmann::json(fp8_gemm) : nlohmann::json()}}},
                              {"weight_dtypes", nlohmann::json::object()},
                              {"runs", nlohmann::json::array()}};
        for (const auto& [type, n] : weight_dtypes(w)) out["weight_dtypes"][dtype_name(type)] = n;  // weights each
        std::vector<int32_t> prompt(static_cast<size_t>(n_prompt)), context(static_cast<size_t>(depth)),
            toks(static_cast<size_t>(max_b)), rows(static_cast<size_t>(max_b));
        std::vector<SeqRun> runs(static_cast<size_t>(max_b));
        if (depth > 0)  // (untimed, but long on a CPU: say what the wait is)
            std::fprintf(stderr,
                         "hybrid-bench: each of the %d runs of a batch size (a warm-up, then -r %d) prefills %d "
                         "context tokens a sequence first (untimed)\n",
                         reps + 1, reps, depth);
        for (int b : batches) {
            std::vector<double> pre_tps, dec_tps;
            for (int rep = 0; rep < reps + 1; rep++) {  // the first repetition warms up
                for (int s = 0; s < b; s++) model->reset(s);
                double t_pre = 0.0;
                for (int s = 0; s < b; s++) {
                    if (depth > 0) {  // the context before the measured prompt (untimed)
                        for (auto& t : context) t = pick(rng);
                        model->prefill(s, context);
                    }
                    for (auto& t : prompt) t = pick(rng);
                    be.synchronize();
                    auto t0 = Clock::now();
                    auto l = model->prefill(s, prompt);
                    toks[size_t(s)] = argmax(l.data(), c.vocab_size);
                    t_pre += seconds_since(t0);
                }
                auto t0 = Clock::now();
                for (int i = 0; i < n_gen; i++) {
                    for (int s = 0; s < b; s++) {
                        runs[size_t(s)] = SeqRun{s, model->seq_len(s), s, 1};
                        rows[size_t(s)] = s;
                    }
                    BatchDesc bd{b, toks.data(), runs.data(), b};
                    // greedy picks on the backend: 8 bytes per sequence reach the host
                    auto picks = model->step_greedy(bd, std::span<const int32_t>(rows.data(), size_t(b)), c.vocab_size);
                    for (int s = 0; s < b; s++) toks[size_t(s)] = std::max(picks[size_t(s)].id, 0);
                }
                be.synchronize();
                const double t_dec = seconds_since(t0);
                if (rep == 0) continue;
                pre_tps.push_back(double(b) * n_prompt / t_pre);
                dec_tps.push_back(double(b) * n_gen / t_dec);
            }
            const double pre = median(pre_tps), dec = median(dec_tps);
            // Average KV length over the decode steps: depth + n_prompt + (n_gen - 1) / 2.
            const double kv_bytes = double(kv_per_pos) * (double(depth) + n_prompt + (n_gen - 1) / 2.0) * b;
            const double step_bytes = weights_read_at(b) + double(state_rw) * b + kv_bytes;
            const double steps_per_s = dec / b;
            const double gbs = step_bytes * steps_per_s / 1e9;
            const double roof = copy_gbs > 0 ? 100.0 * gbs / copy_gbs : NAN;
            std::fprintf(table, "| %5d | %5d | %6d | %3d | %13.1f | %12.1f | %7.1f | %4.1f | %10.1f |\n", b, depth,
                         n_prompt, n_gen, pre, dec, step_bytes / 1e6, gbs, roof);
            out["runs"].push_back({{"batch", b},
                                   {"depth", depth},
                                   {"prompt", n_prompt},
                                   {"gen", n_gen},
                                   {"prefill_tok_s", pre},
                                   {"decode_tok_s", dec},
                                   {"bytes_per_step", int64_t(step_bytes)},
                                   {"gbs", gbs},
                                   {"roofline_pct", roof}});
        }
        if (std::string(be.name()) == "cpu")
            std::fprintf(table,
                         "\n(CPU: the copy-bandwidth ceiling is DRAM's; weights that fit in the caches can pass it, "
                         "so %% roofline over 100 means the model is cache-resident)\n");
        const size_t peak_rss = std::max(rss_before_probe, peak_rss_bytes());
        std::fprintf(table, "\npeak host memory (RSS, the copy probe's buffers excluded) %.1f MiB\n",
                     double(peak_rss) / 1048576.0);
        // Device memory: the arena (weights, KV cache and recurrent state for the configured context and slots,
        // activations, backend workspace) against what the device reports in use (adds the CUDA context).
        const size_t dev_used = be.device_memory_used();
        if (dev_used) {
            const double mib = 1048576.0;
            const size_t rest = model->arena_bytes() - model->weight_bytes() - model->state_bytes();
            std::fprintf(table,
                         "device memory in use %.1f MiB: arena %.1f MiB (weights %.1f, KV cache + states %.1f, "
                         "activations + workspace %.1f), %.1f%% above the arena\n",
                         double(dev_used) / mib, double(model->arena_bytes()) / mib,
                         double(model->weight_bytes()) / mib, double(model->state_bytes()) / mib, double(rest) / mib,
                         100.0 * (double(dev_used) / double(model->arena_bytes()) - 1.0));
            out["device_memory_used_bytes"] = dev_used;
        }
        out["peak_rss_bytes"] = int64_t(peak_rss);
        if (be.host_threads() > 0) out["cpu_threads"] = be.host_threads();  // what -t 0 ("all cores") became
        if (!tools::stdout_ok()) throw Error(Status::io, tools::stdout_error());
        if (args.count("json")) json_out.write(out.dump(1) + "\n");
        return tools::exit_ok;
    } catch (const tools::UsageError& e) {
        std::fprintf(stderr, "hybrid-bench: %s (see --help)\n", e.what());
        return tools::exit_usage;
    } catch (const tools::Failure& e) {
        std::fprintf(stderr, "hybrid-bench: %s\n", e.what());
        return e.code;
    } catch (const Error& e) {
        std::fprintf(stderr, "hybrid-bench: %s\n", e.what());
        return tools::exit_code_of(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-bench: %s\n", e.what());
        return tools::exit_runtime;
    }
}
