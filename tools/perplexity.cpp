// hybrid-perplexity: the perplexity of a model over a text, and (as llama.cpp's perplexity --kl-divergence) how far
// this run's token distributions are from a saved run of another load of the model (e.g. bf16 vs --quant fp8).
//
// Windows: the text is tokenized once (no special tokens added; the text of one, such as <|im_end|>, is read as that
// token, as hybrid -f, hybrid-tokenize and Hugging Face's tokenizer read it) and cut into consecutive,
// non-overlapping windows of --ctx tokens (the tail shorter than a window is left out). Each window is a fresh
// sequence; as in llama.cpp's perplexity, only its second half is scored: the logits at positions j in
// [ctx/2, ctx - 1) predict token j + 1, so every scored token has at least ctx/2 tokens of context.
// perplexity = exp(mean negative log-likelihood).
//
// --save-logits FILE keeps, per scored position, the next token's log-probability and the K most probable tokens'
// log-probabilities (--top-k, default 64): compact for any vocabulary (248,320 for Qwen3.5, where the full
// distribution in fp16 would be 485 KiB a position; this is 8 + 8K bytes). --kl-base FILE compares this run with
// such a file, position by position:
//   KL(base || this) over K + 1 outcomes: the base's top K tokens and "all other tokens" (the rest of the mass),
//     sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest). Merging outcomes never increases a KL
//     divergence, so this is a lower bound of the full-vocabulary KL, equal to it when the base's top K hold all
//     but a negligible mass (as in llama.cpp, which stores the full distributions, the mean is over positions).
//   top-1 agreement: the base's most probable token is this run's most probable token.
//   the perplexity ratio: this run's perplexity over the base's (from the saved next-token log-probabilities).
//
// File format (little-endian): a 48-byte header {char magic[8] = "HYKLTOP1"; uint32 vocab, top_k, ctx, windows;
// uint64 positions; uint64 tokens_hash (FNV-1a of the scored windows' token ids); uint64 reserved = 0}, then per
// scored position, in order: int32 next token id, float its log-probability, then top_k pairs {int32 id, float
// log-probability} most probable first. Log-probabilities are natural logs of a softmax computed in double.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <numeric>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "model/fnv.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tools/tool_common.h"

using namespace hy;

namespace {

// The --save-logits file being written, removed by SIGINT/SIGTERM/SIGHUP (an interrupted run leaves no truncated
// file to be taken for a base later); null when there is none.
const char* volatile g_partial_path = nullptr;
extern "C" void remove_partial_and_stop(int sig) {
    if (const char* p = g_partial_path) ::unlink(p);  // (async-signal-safe)
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

constexpr char kMagic[8] = {'H', 'Y', 'K', 'L', 'T', 'O', 'P', '1'};

struct Header {
    char magic[8];
    uint32_t vocab, top_k, ctx, windows;
    uint64_t positions, tokens_hash, reserved;
};
static_assert(sizeof(Header) == 48);

struct Entry {
    int32_t id;
    float logprob;
};

// The log-softmax of one logits row, computed in double: log-sum-exp and the argmax.
struct RowStats {
    double lse = 0.0;
    int32_t argmax = 0;
};
RowStats row_stats(std::span<const float> l) {
    RowStats s;
    for (size_t i = 1; i < l.size(); i++)
        if (l[i] > l[size_t(s.argmax)]) s.argmax = int32_t(i);
    const double mx = l[size_t(s.argmax)];
    double sum = 0.0;
    for (float v : l) sum += std::exp(double(v) - mx);
    s.lse = mx + std::log(sum);
    return s;
}

// KL(base || this) over the base's top K tokens and the rest (see the file comment); q_logits: this run's row.
double kl_top_k(const std::vector<Entry>& base, std::span<const float> q_logits, double q_lse) {
    double kl = 0.0, p_sum = 0.0, q_sum = 0.0;
    for (const Entry& e : base) {
        const double lp = e.logprob, lq = double(q_logits[size_t(e.id)]) - q_lse, p = std::exp(lp);
        kl += p * (lp - lq);
        p_sum += p;
        q_sum += std::exp(lq);
    }
    const double p_rest = 1.0 - p_sum, q_rest = std::max(1.0 - q_sum, 1e-30);
    if (p_rest > 1e-12) kl += p_rest * (std::log(p_rest) - std::log(q_rest));
    return std::max(kl, 0.0);  // (rounding can leave a tiny negative where the distributions agree)
}

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
    if (std::fwrite(p, 1, n, f) != n)  // (the reason: "No space left on device", as hybrid-bench and /save say)
        throw Error(Status::io, path + ": cannot write: " + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
    // each finished line reaches a redirected stdout at once (a Ctrl-C lost every finished row and case)
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    cxxopts::Options opts("hybrid-perplexity",
                          "Perplexity over a text in windows, and the KL divergence and top-1 agreement of this run's "
                          "token distributions against a saved run (--save-logits, --kl-base)");
    // clang-format off
    add_shared_option(opts, "", "model");
    opts.add_options()
        ("f,file", "the text (UTF-8; at most 256 MiB; - or a pipe such as /dev/stdin is read to its end)",
         cxxopts::value<std::string>())
        ("ctx", "tokens per window; its second half is scored (ctx - 1 - ctx/2 predictions: the last token predicts nothing)", cxxopts::value<int>()->default_value("512"))
        ("chunks", "score at most this many windows (0: every whole window of the text)",
         cxxopts::value<int>()->default_value("0"))
        ("save-logits", "write this run's top-K log-probabilities per scored position to FILE (for --kl-base)",
         cxxopts::value<std::string>())
        ("top-k", "--save-logits: tokens kept per position", cxxopts::value<int>()->default_value("64"))
        ("kl-base", "compare with the run saved in FILE (same text, --ctx and vocabulary): mean and 99th percentile "
         "KL divergence, top-1 agreement, perplexity ratio", cxxopts::value<std::string>())
        ("max-ppl-ratio", "--kl-base: exit 7 when perplexity / base perplexity exceeds this",
         cxxopts::value<std::string>())
        ("min-top1", "--kl-base: exit 7 when the top-1 agreement (a fraction) is below this",
         cxxopts::value<std::string>());
    add_shared_option(opts, "", "device");
    add_shared_option(opts, "", "quant");
    add_shared_option(opts, "", "quant-lm-head");
    add_shared_option(opts, "", "fp8-gemm");
    add_shared_option(opts, "", "threads");
    add_shared_option(opts, "", "version");
    add_shared_option(opts, "", "help");
    // clang-format on
    cxxopts::ParseResult args;
    int exit_code = 0;
    if (!tools::parse_args(opts, argc, argv, "hybrid-perplexity", args, &exit_code)) return exit_code;
    if (!args.unmatched().empty()) {
        std::fprintf(stderr, "hybrid-perplexity: unexpected argument '%s' (see --help)\n", args.unmatched()[0].c_str());
        return tools::exit_usage;
    }
    try {
        tools::check_int_args(args, {"ctx", "chunks", "top-k", "threads"});
        tools::check_given_once(args);
        if (!args.count("file")) throw tools::UsageError("-f FILE (the text) is required");
        if (args["file"].as<std::string>().empty())
            throw tools::UsageError("-f needs a file name (or - for standard input)");
        const int ctx = args["ctx"].as<int>(), chunks = args["chunks"].as<int>(), top_k = args["top-k"].as<int>();
        if (ctx < 4 || ctx > (1 << 20))
            throw tools::UsageError("--ctx must be in [4, 2^20], got " + std::to_string(ctx));
        if (chunks < 0) throw tools::UsageError("--chunks must be >= 0, got " + std::to_string(chunks));
        auto real = [&](const char* name) {
            const std::string text = args[name].as<std::string>();
            double v = 0.0;
            if (!parse_real(text, &v)) throw tools::UsageError(invalid_real_message(text, name));
            return v;
        };
        const double max_ratio = args.count("max-ppl-ratio") ? real("max-ppl-ratio") : -1.0;
        if (args.count("max-ppl-ratio") && !(max_ratio > 0.0))  // (0 could never pass)
            throw tools::UsageError("invalid value '" + args["max-ppl-ratio"].as<std::string>() +
                                    "' for --max-ppl-ratio (a ratio > 0)");
        const double min_top1 = args.count("min-top1") ? real("min-top1") : -1.0;
        if (args.count("min-top1") && !(min_top1 >= 0.0 && min_top1 <= 1.0))  // (-1 said "a number >= 0")
            throw tools::UsageError("--min-top1 is a fraction in [0, 1] (0.97 for 97%), got " +
                                    args["min-top1"].as<std::string>());
        if ((max_ratio >= 0.0 || min_top1 >= 0.0) && !args.count("kl-base"))
            throw tools::UsageError("--max-ppl-ratio and --min-top1 need --kl-base");
        if (args.count("top-k") && !args.count("save-logits"))
            throw tools::UsageError("--top-k needs --save-logits (it sets the tokens saved per position)");
        const std::string dir = args["model"].as<std::string>(), path = args["file"].as<std::string>();
        ModelParams mp;
        mp.device = tools::parse_device(args["device"].as<std::string>());
        tools::parse_quant(args["quant"].as<std::string>(), mp);
        mp.cuda.fp8_block_scaled_gemm = tools::parse_fp8_gemm(args["fp8-gemm"].as<std::string>());
        tools::parse_quant_lm_head(args["quant-lm-head"].as<bool>(), mp);
        mp.n_threads = tools::parse_threads(args["threads"].as<int>());
        mp.n_ctx = ctx;
        mp.max_batch_tokens = std::min(ctx, 512);
        mp.max_logits = mp.max_batch_tokens;
        // (- is standard input; a pipe or FIFO is read to its end, as hybrid's -f)
        const std::string text = tools::read_text_input(path, size_t(256) << 20);
        const std::string text_name = path == "-" ? "standard input" : path;
        const Tokenizer tok = tools::loading([&] {
            require_model_folder(dir);
            return Tokenizer::from_folder(dir);
        });
        if (!utf8_is_valid(text))  // (as hybrid warns: each invalid sequence is encoded as U+FFFD)
            std::fprintf(stderr,
                         "hybrid-perplexity: warning: %s is not valid UTF-8; its invalid bytes are read as U+FFFD\n",
                         text_name.c_str());
        const std::vector<int32_t> ids = tok.encode(text);
        int windows = int(ids.size() / size_t(ctx));
        if (chunks > 0) windows = std::min(windows, chunks);
        if (windows == 0)
            throw tools::Failure(tools::exit_usage, text_name + ": " + std::to_string(ids.size()) +
                                                        " tokens, fewer than one window of --ctx " +
                                                        std::to_string(ctx));
        mp.progress = tools::load_progress("hybrid-perplexity");
        auto model = tools::loading([&] {
            auto m = Model::load(dir, mp);
            tok.require_fits(m->config().vocab_size, dir);  // (it failed at the first such token of the text)
            return m;
        });
        tools::warn_oversubscribed("hybrid-perplexity", mp.n_threads, *model);
        if (args.count("fp8-gemm") && std::string(model->backend().name()) != "cuda")
            std::fprintf(stderr, "hybrid-perplexity: note: --fp8-gemm only changes the CUDA backend; ignored on %s\n",
                         model->backend().name());
        if (!model->load_warning().empty())
            std::fprintf(stderr, "hybrid-perplexity: warning: %s\n", model->load_warning().c_str());
        if (const int trained = model->config().max_position_embeddings; trained > 0 && ctx > trained)
            std::fprintf(stderr,
                         "hybrid-perplexity: warning: --ctx %d is larger than the %d positions the model was trained "
                         "for (max_position_embeddings): the perplexity past them measures extrapolation\n",
                         ctx, trained);
        const int V = model->config().vocab_size, first = ctx / 2;
        const uint64_t per_window = uint64_t(ctx - 1 - first), positions = per_window * uint64_t(windows);
        Fnv1a hash;
        hash.add(ids.data(), size_t(windows) * size_t(ctx) * sizeof(int32_t));

        // The base run, read whole (positions x (2 + K) x 4 bytes).
        std::vector<Entry> base;  // [positions, 1 + K]: the next token, then the top K
        uint32_t base_k = 0;
        const std::string base_path = args.count("kl-base") ? args["kl-base"].as<std::string>() : "";
        if (args.count("kl-base") && base_path.empty()) throw tools::UsageError("--kl-base needs a file name");
        if (args.count("save-logits") && args["save-logits"].as<std::string>().empty())
            throw tools::UsageError("--save-logits needs a file name");
        if (!base_path.empty()) {
            // (a regular file only: a FIFO or a directory is named and refused, not waited on)
            const std::string bytes = read_regular_file(base_path, size_t(1) << 36);
            size_t at = 0;
            auto read_all = [&](void* p, size_t n, const std::string& name) {
                if (bytes.size() - at < n)
                    throw Error(Status::format, name + ": truncated (not a --save-logits file?)");
                std::memcpy(p, bytes.data() + at, n);
                at += n;
            };
            {
                Header h;
                read_all(&h, sizeof h, base_path);
                if (std::memcmp(h.magic, kMagic, 8) != 0)
                    throw Error(Status::format, base_path + ": not a hybrid-perplexity --save-logits file");
                // the header against the file's own size first (a damaged top_k or positions field read as "saved
                // from another text" with the same numbers on both sides; bytes past the end were accepted)
                const unsigned __int128 want = (unsigned __int128)sizeof(Header) + (unsigned __int128)h.positions *
                                                                                       (1u + uint64_t(h.top_k)) *
                                                                                       sizeof(Entry);
                // (its fields against each other: a window of C tokens scores C - 1 - C / 2 positions; a damaged
                // ctx or windows field read as "saved from another --ctx", a usage error)
                const uint64_t per = h.ctx >= 4 ? uint64_t(h.ctx - 1 - h.ctx / 2) : 0;
                if (h.vocab == 0 || per == 0 || h.windows == 0 || per * h.windows != h.positions)
                    throw Error(Status::format, base_path + ": damaged (its header says " + std::to_string(h.windows) +
                                                    " windows of " + std::to_string(h.ctx) + " tokens, " +
                                                    std::to_string(h.positions) + " positions, vocabulary " +
                                                    std::to_string(h.vocab) + ", which disagree)");
                if (h.reserved != 0)
                    throw Error(Status::format, base_path + ": damaged (its header's reserved field is " +
                                                    std::to_string(h.reserved) + ", written as 0)");
                if (h.top_k == 0 || h.top_k > h.vocab || want != bytes.size())
                    throw Error(Status::format, base_path + ": damaged (its header says " +
                                                    std::to_string(h.positions) + " positions of 1 + " +
                                                    std::to_string(h.top_k) + " entries, vocabulary " +
                                                    std::to_string(h.vocab) + ", which does not match its " +
                                                    std::to_string(bytes.size()) + " bytes)");
                const bool same_shape = h.vocab == uint32_t(V) && h.ctx == uint32_t(ctx) &&
                                        h.windows == uint32_t(windows) && h.positions == positions;
                if (same_shape && h.tokens_hash != hash.h)
                    throw Error(Status::invalid_argument, base_path + ": saved from another text (the same " +
                                                              tools::count_of(size_t(windows), "window") + " of " +
                                                              std::to_string(ctx) +
                                                              " tokens and vocabulary, other token ids)");
                if (!same_shape || h.top_k == 0 || h.top_k > uint32_t(V))
                    throw Error(Status::invalid_argument,
                                base_path + ": saved from another text, --ctx, --chunks or vocabulary (it has " +
                                    std::to_string(h.windows) + " windows of " + std::to_string(h.ctx) +
                                    " tokens, vocabulary " + std::to_string(h.vocab) + "; this run " +
                                    std::to_string(windows) + " of " + std::to_string(ctx) + ", " + std::to_string(V) +
                                    ")");
                base_k = h.top_k;
                base.resize(size_t(positions) * (1 + base_k));
                read_all(base.data(), base.size() * sizeof(Entry), base_path);
                for (size_t i = 0; i < base.size(); i++) {
                    const Entry& e = base[i];
                    const std::string where =
                        "position " + std::to_string(i / (1 + base_k)) + ", entry " + std::to_string(i % (1 + base_k));
                    if (e.id < 0 || e.id >= V)
                        throw Error(Status::format, base_path + ": damaged (" + where + ": token id " +
                                                        std::to_string(e.id) + " is not in [0, " + std::to_string(V) +
                                                        "))");
                    if (!std::isfinite(e.logprob) || e.logprob > 0.0f)
                        throw Error(Status::format, base_path + ": damaged (" + where + ": the log-probability " +
                                                        std::to_string(e.logprob) + " is not a finite value <= 0)");
                }
                // each position's top-k as written: distinct ids, in decreasing probability, probabilities summing to
                // at most 1 (a damaged one gave a KL of hundreds, exit 0)
                std::vector<int32_t> ids_seen(base_k);
                for (uint64_t pos = 0; pos < positions; pos++) {
                    const Entry* t = base.data() + pos * (1 + base_k) + 1;
                    double mass = 0.0;
                    for (uint32_t i = 0; i < base_k; i++) {
                        mass += std::exp(double(t[i].logprob));
                        ids_seen[i] = t[i].id;
                        if (i > 0 && t[i].logprob > t[i - 1].logprob)
                            throw Error(Status::format, base_path + ": damaged (position " + std::to_string(pos) +
                                                            ": its top-" + std::to_string(base_k) +
                                                            " is not in decreasing order)");
                    }
                    // (the most likely of V tokens has a probability of at least 1 / V: log-probabilities all
                    // -1e30 passed as a base perplexity of inf and a ratio of 0, exit 0)
                    if (double(t[0].logprob) < -std::log(double(V)) - 1e-3) {
                        char msg[160];
                        std::snprintf(msg, sizeof msg,
                                      "its most likely token's log-probability %g is below -ln(vocabulary) = %g",
                                      double(t[0].logprob), -std::log(double(V)));
                        throw Error(Status::format,
                                    base_path + ": damaged (position " + std::to_string(pos) + ": " + msg + ")");
                    }
                    std::sort(ids_seen.begin(), ids_seen.end());
                    if (std::adjacent_find(ids_seen.begin(), ids_seen.end()) != ids_seen.end() || mass > 1.0 + 1e-3)
                        throw Error(Status::format,
                                    base_path + ": damaged (position " + std::to_string(pos) + ": its top-" +
                                        std::to_string(base_k) +
                                        (mass > 1.0 + 1e-3 ? " probabilities sum to " + std::to_string(mass)
                                                           : std::string(" repeats a token id")) +
                                        ")");
                    // and the next token's entry agrees with them: its top-k entry's value (the same float, written
                    // from the same sum), or at most the k-th's when it is not among them (an edited value moved the
                    // base perplexity, exit 0)
                    const Entry& next = t[-1];
                    const Entry* in_top = std::find_if(t, t + base_k, [&](const Entry& e) { return e.id == next.id; });
                    if (in_top != t + base_k ? in_top->logprob != next.logprob : next.logprob > t[base_k - 1].logprob)
                        throw Error(Status::format, base_path + ": damaged (position " + std::to_string(pos) +
                                                        ": the next token's log-probability disagrees with its top-" +
                                                        std::to_string(base_k) + ")");
                }
            }
        }
        std::FILE* out = nullptr;
        const std::string save_path = args.count("save-logits") ? args["save-logits"].as<std::string>() : "";
        // A run that fails after creating the --save-logits file removes it (the file is this run's: "wbx" made it),
        // so that no truncated file is left to be taken for a base later.
        struct PartialFile {
            std::FILE*& f;
            const std::string& path;
            bool complete = false;
            ~PartialFile() {
                g_partial_path = nullptr;
                if (f && !complete) {
                    std::fclose(f);
                    std::remove(path.c_str());
                }
            }
        } partial{out, save_path};
        if (!save_path.empty()) {
            if (top_k < 1 || top_k > V)
                throw tools::UsageError("--top-k must be in [1, vocabulary " + std::to_string(V) + "], got " +
                                        std::to_string(top_k));
            // (nothing the user has is replaced: an existing file, e.g. the text, the base run or a model file, is
            // refused; "x": exclusive creation)
            if (struct stat st; ::stat(save_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
                throw Error(Status::io, save_path +
                                            (S_ISDIR(st.st_mode) ? ": is a directory" : ": not a regular file") +
                                            " (--save-logits writes a new file)");
            out = std::fopen(save_path.c_str(), "wbx");
            if (!out && errno == EEXIST)
                throw Error(Status::io, save_path + ": exists (--save-logits writes a new file; remove it first)");
            if (!out) throw Error(Status::io, save_path + ": cannot write: " + std::strerror(errno));
            g_partial_path = save_path.c_str();
            for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, remove_partial_and_stop);
            Header h{};
            std::memcpy(h.magic, kMagic, 8);
            h.vocab = uint32_t(V);
            h.top_k = uint32_t(top_k);
            h.ctx = uint32_t(ctx);
            h.windows = uint32_t(windows);
            h.positions = positions;
            h.tokens_hash = hash.h;
            write_all(out, &h, sizeof h, save_path);
        }

        double nll = 0.0, base_nll = 0.0;
        std::vector<double> kls;
        uint64_t agree = 0, pos = 0, clear = 0, clear_agree = 0;  // clear: the base's top-1 leads by > 0.05
        std::vector<int32_t> order(static_cast<size_t>(V));
        std::vector<Entry> row_out(size_t(1 + std::max(top_k, 1)));
        const bool progress = ::isatty(2);
        for (int w = 0; w < windows; w++) {
            model->reset(0);
            const std::span<const int32_t> window(ids.data() + size_t(w) * size_t(ctx), size_t(ctx));
            const std::span<const float> logits = model->prefill(0, window, true);
            for (int j = first; j < ctx - 1; j++, pos++) {
                const std::span<const float> l = logits.subspan(size_t(j) * size_t(V), size_t(V));
                const RowStats s = row_stats(l);
                const int32_t next = window[size_t(j + 1)];
                const double lp = double(l[size_t(next)]) - s.lse;
                if (!std::isfinite(s.lse) || !std::isfinite(lp))
                    throw Error(Status::backend, "the model produced non-finite logits at window " +
                                                     std::to_string(w + 1) + ", position " + std::to_string(j) +
                                                     " (NaN or inf weights or scales?)");
                // (summed as the float --save-logits writes, as the base's sum: a run against its own saved file
                // has the ratio 1 exactly, which --max-ppl-ratio 1 accepts)
                nll -= double(float(lp));
                if (out) {
                    std::iota(order.begin(), order.end(), 0);
                    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
                        return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
                    });
                    row_out[0] = {next, float(lp)};
                    for (int i = 0; i < top_k; i++)
                        row_out[size_t(1 + i)] = {order[size_t(i)], float(double(l[size_t(order[size_t(i)])]) - s.lse)};
                    write_all(out, row_out.data(), size_t(1 + top_k) * sizeof(Entry), save_path);
                }
                if (!base.empty()) {
                    const Entry* b = base.data() + size_t(pos) * (1 + base_k);
                    if (b[0].id != next)  // (the header's hash of the token ids matched: not another text)
                        throw Error(Status::format, base_path + ": damaged (position " + std::to_string(pos) +
                                                        ": next token " + std::to_string(b[0].id) + ", this text's " +
                                                        std::to_string(next) +
                                                        ", though the header's hash of the token ids matches)");
                    base_nll -= b[0].logprob;
                    const std::vector<Entry> top(b + 1, b + 1 + base_k);
                    kls.push_back(kl_top_k(top, l, s.lse));
                    agree += top[0].id == s.argmax;
                    if (base_k < 2 || std::exp(top[0].logprob) - std::exp(top[1].logprob) > 0.05) {
                        clear++;
                        clear_agree += top[0].id == s.argmax;
                    }
                }
            }
            if (progress)
                std::fprintf(stderr, "\rhybrid-perplexity: window %d/%d, perplexity so far %.4f", w + 1, windows,
                             std::exp(nll / double(pos)));
        }
        if (progress) std::fputc('\n', stderr);
        if (out) {
            const int closed = std::fclose(out);
            const int err = errno;
            out = nullptr;
            g_partial_path = nullptr;
            if (closed != 0) {
                std::remove(save_path.c_str());
                throw Error(Status::io, save_path + ": cannot write: " + std::strerror(err));
            }
            partial.complete = true;
        }
        const double ppl = std::exp(nll / double(positions));
        std::printf("text: %s, %zu tokens; %s of %d, the last %s of each scored (%s)\n", text_name.c_str(), ids.size(),
                    tools::count_of(size_t(windows), "window").c_str(), ctx,
                    tools::count_of(size_t(per_window), "position").c_str(),
                    tools::count_of(size_t(positions), "token").c_str());
        // (the label goes by the matrices loaded: a folder whose config.json says FP8 but holds 16-bit tensors loads
        // 16-bit)
        const std::string quant =
            mp.quant == WeightQuant::none
                ? std::string("as stored") + (has_fp8_weights(model->weights()) ? ", an FP8 checkpoint" : "") + " (" +
                      weight_dtypes_text(model->weights()) + ")"
            : mp.quant == WeightQuant::fp8 ? "--quant fp8, blocks of 128 x 128, lm_head 16-bit"
                                           : std::string("--quant ") + weight_quant_name(mp.quant) + ", groups of " +
                                                 std::to_string(weight_quant_group(mp.quant, mp.quant_group)) +
                                                 (mp.quant_lm_head ? ", lm_head quantized" : ", lm_head 16-bit");
        std::printf("weights: %s, %.2f MiB\n", quant.c_str(), double(model->weight_bytes()) / 1048576.0);
        std::printf("perplexity: %.4f\n", ppl);
        if (!save_path.empty()) std::printf("saved: %s (top %d per position)\n", save_path.c_str(), top_k);
        int rc = tools::exit_ok;
        if (!base.empty()) {
            const double base_ppl = std::exp(base_nll / double(positions)), ratio = ppl / base_ppl;
            std::vector<double> sorted = kls;
            std::sort(sorted.begin(), sorted.end());
            const double mean = std::accumulate(kls.begin(), kls.end(), 0.0) / double(kls.size());
            const double p99 = sorted[std::min(sorted.size() - 1, size_t(std::ceil(0.99 * double(sorted.size()))) - 1)];
            const double top1 = double(agree) / double(positions);
            std::printf("base perplexity: %.4f (%s)\n", base_ppl, base_path.c_str());
            std::printf("perplexity ratio: %.5f (%+.3f%%)\n", ratio, (ratio - 1.0) * 100.0);
            std::printf("KL divergence: mean %.6f, 99th percentile %.6f, max %.6f (over the base's top %u + rest)\n",
                        mean, p99, sorted.back(), base_k);
            char clear_pct[32] = "n/a";  // (three decimals, as the overall figure)
            if (clear)
                std::snprintf(clear_pct, sizeof clear_pct, "%.3f%%", 100.0 * double(clear_agree) / double(clear));
            std::printf(
                "top-1 agreement: %.3f%% (%llu of %llu); where the base's top-1 leads its second by more "
                "than 0.05 in probability: %s (%llu of %llu)\n",
                top1 * 100.0, (unsigned long long)agree, (unsigned long long)positions, clear_pct,
                (unsigned long long)clear_agree, (unsigned long long)clear);
            // (NaN fails every check: a comparison with NaN is false, so each test is written as "not within")
            if (max_ratio >= 0.0 && !(ratio <= max_ratio)) {
                std::printf("CHECK FAILED: perplexity ratio %.5f > %.5f\n", ratio, max_ratio);
                rc = tools::exit_check;
            }
            if (min_top1 >= 0.0 && !(top1 >= min_top1)) {
                std::printf("CHECK FAILED: top-1 agreement %.3f%% < %.3f%% (--min-top1 %g)\n", top1 * 100.0,
                            min_top1 * 100.0, min_top1);
                rc = tools::exit_check;
            }
        }
        return tools::finish("hybrid-perplexity", rc);
    } catch (const tools::UsageError& e) {
        std::fprintf(stderr, "hybrid-perplexity: %s (see --help)\n", e.what());
        return tools::exit_usage;
    } catch (const tools::Failure& e) {
        std::fprintf(stderr, "hybrid-perplexity: %s\n", e.what());
        return e.code;
    } catch (const Error& e) {
        std::fprintf(stderr, "hybrid-perplexity: %s\n", e.what());
        return tools::exit_code_of(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-perplexity: %s\n", e.what());
        return tools::exit_runtime;
    }
}
