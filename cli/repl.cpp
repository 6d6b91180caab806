// The interactive chat of `hybrid -i`: one line per user turn, answers streamed to stdout. The conversation's
// state stays in the context between turns, so each turn prefills only its new tokens: the first turn the
// rendered system/user messages and the generation prompt, later turns "<|im_end|>\n" (closing the previous
// answer, whose end-of-turn id hy_generate does not keep) plus the new user message and the generation prompt
// (hy_chat_continue). The context then holds exactly the rendering of the whole conversation, with one exception:
// an answer ended by a --stop string keeps that string's tokens in the context, while the answer text (and the
// saved messages) end before it, as the text the user saw does.
//
// Conversation files (/save, /load): "HYCHAT01", u32 length of a JSON header, the JSON header
// ({"version": 1, "messages": [{"role", "content"}, ...], "no_think": bool, "checksum": "16 hex digits"}), then the
// engine snapshot (hy_state_save: token history, KV cache, conv and recurrent state, last logits; it carries the
// model fingerprint and a checksum of its own). The header's checksum is the 64-bit FNV-1a of the header's JSON
// without it (as nlohmann::json dumps it), so a changed byte of a message is refused as damage; files without one
// (saved before it was added) are still read.
// /load rebuilds the penalties' history from the restored tokens, so greedy continuations (penalties or not) equal
// the unsaved session's; the sampler's random state is not in the file (the RNG goes on from where the session's
// is), so sampled continuations differ. /reset clears the penalties' history but not the RNG: a new conversation
// gets new draws. Ctrl-C during a long message's prefill stops it between prefill steps and drops the
// message: the conversation is restored from a snapshot taken before the prefill (the engine resets a sequence
// whose prefill was stopped).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/line_reader.h"
#include "model/fnv.h"

#ifdef HY_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

namespace hy::cli {

namespace {

constexpr char kChatMagic[8] = {'H', 'Y', 'C', 'H', 'A', 'T', '0', '1'};

// The conversation header's checksum: FNV-1a (64 bits) of its JSON without the "checksum" field, in hex.
std::string header_checksum(nlohmann::json j) {
    j.erase("checksum");
    const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hy::fnv1a(text)));
    return hex;
}

#ifdef HY_HAVE_READLINE
// Called by readline while it waits for input (after its own handler has passed SIGINT on to ours): Ctrl-C at the
// input line discards what was typed and shows a fresh prompt, as a shell does.
int on_readline_signal() {
    if (g_interrupted.exchange(false)) {
        rl_free_line_state();
        rl_replace_line("", 0);
        std::fputs("\n", rl_outstream ? rl_outstream : stdout);
        rl_on_new_line();
        rl_redisplay();
    }
    return 0;
}
#endif

struct Message {
    std::string role, content;
};

struct Repl {
    Repl(const Options& o_, hy_model* m_, hy_context* c_, hy_sampler* s_)
        : o(o_), m(m_), c(c_), s(s_), chat_stops(chat_stop_ids(m_)), system(o_.system) {}
    const Options& o;
    hy_model* m;
    hy_context* c;
    hy_sampler* s;
    const std::vector<int32_t> chat_stops;  // ids that end an answer (chat_stop_ids)
    bool tty_in = false;
    FILE* prompt_out = stdout;      // where the "> " prompt (and readline's echo) goes
    bool confirm = false;           // confirm /save, /load and /reset on stderr (stdin a terminal, or --verbose)
    bool last_interrupted = false;  // Ctrl-C stopped the last answer (or its message's prefill)
    // messages of at least this many ids can be stopped during their prefill (see turn())
    static constexpr size_t kAbortablePrefill = 256;
    std::vector<Message> messages;
    // the system message of the conversation's first turn while the context is empty: --system, or the one of a
    // loaded conversation that had no turn yet (/reset goes back to --system)
    std::string system;
    std::string answer;          // the answer being generated
    hy_generate_result total{};  // summed over the turns (stop_reason: the last turn's)

    // ---- input ----
    bool read_line(std::string& line) {
#ifdef HY_HAVE_READLINE
        if (tty_in) {
            // the signal hook runs when Ctrl-C interrupts readline's wait for input; the event hook (every 0.1 s
            // while it waits) catches a Ctrl-C that came while readline was busy (e.g. echoing a key)
            rl_signal_event_hook = on_readline_signal;
            rl_event_hook = on_readline_signal;
            char* l = readline("> ");
            if (!l) return false;
            line = l;
            if (*l) add_history(l);
            std::free(l);
            return true;
        }
#endif
        for (;;) {
            if (tty_in) {
                std::fputs("> ", prompt_out);
                std::fflush(prompt_out);
            }
            errno = 0;
            const LineRead r = getline_bounded(std::cin, line, kMaxInputFile);
            if (r == LineRead::too_long)
                throw Failure(exit_io, "cannot read the chat input (stdin): a line longer than " +
                                           std::to_string(kMaxInputFile >> 20) + " MiB");
            const bool got = r == LineRead::line;
            const int err = errno;
            if (g_interrupted.load()) {
                // Ctrl-C at the input line: what was read of the line is discarded, and a new prompt. (The
                // interrupted read of a pipe or a file looks like its end to std::cin, which reads through stdio's
                // stdin: its flags are cleared and reading goes on.)
                g_interrupted.store(false);
                std::cin.clear();
                std::clearerr(stdin);
                if (tty_in) std::fputs("\n", prompt_out);  // (after the "> " prompt)
                continue;
            }
            if (got) return true;
            if (std::ferror(stdin) && err != 0 && err != EINTR)  // a read error, not the end of the input
                throw Failure(exit_io, std::string("cannot read the chat input (stdin): ") + std::strerror(err));
            return false;
        }
    }

    // ---- turns ----
    static int on_token(const hy_token_info* t, void* ud) {
        auto* r = static_cast<Repl*>(ud);
        if (t->text_len > 0) {
            r->answer.append(t->text, t->text_len);
            if (!write_stdout(t->text, t->text_len)) return 1;  // stop early: the output is lost
        }
        return g_interrupted.load() ? 1 : 0;
    }

    void turn(const std::string& user) {
        std::string text;
        if (hy_context_n_tokens(c) == 0) {
            text = chat_first_turn(m, o, system, user, "the message");
            messages.clear();
            if (!system.empty()) messages.push_back({"system", system});
        } else {
            check_chat_text(user, "the message");
            std::vector<hy_chat_message> msgs = {{"user", user.c_str()}};
            text = chat_render(m, msgs, true, thinking_mode(o), true);
        }
        const std::vector<int32_t> ids = tokenize(m, text, "the message");
        const int have = hy_context_n_tokens(c), n_ctx = hy_model_n_ctx(m);
        if (have + int(ids.size()) >= n_ctx)
            throw Failure(exit_context, "the conversation would hold " + std::to_string(have + int(ids.size())) +
                                            " tokens, leaving no room for an answer in a context of " +
                                            std::to_string(n_ctx) + " (-c): " +
                                            (have == 0 ? "give a larger -c"
                                             : tty_in  ? "/reset or /save it"
                                                       : "give a larger -c or /reset before it"));
        std::vector<const char*> stops;
        for (const auto& st : o.stop) stops.push_back(st.c_str());
        hy_generate_params gp = hy_generate_default_params();
        gp.max_tokens = o.n_predict;
        gp.stop = stops.data();
        gp.n_stop = int(stops.size());
        gp.skip_special = 0;  // show <think>/</think>: the answer text then re-encodes to what the context holds
        gp.stop_ids = chat_stops.empty() ? nullptr : chat_stops.data();
        gp.n_stop_ids = int(chat_stops.size());
        gp.on_token = on_token;
        gp.user_data = this;
        answer.clear();
        // Ctrl-C during a long message's prefill stops it between prefill steps (should_abort). The engine then
        // resets the sequence, so the conversation before the message is restored from a snapshot taken here; an
        // empty context needs none. (A short message prefills in one step, which cannot be stopped anyway.)
        std::vector<char> before;
        if (have > 0 && ids.size() >= kAbortablePrefill) before = snapshot();
        if (have == 0 || !before.empty()) gp.should_abort = interrupted_abort;
        g_interrupted.store(false);
        hy_generate_result res{};
        for (int32_t id : ids) hy_sampler_accept(s, id);  // penalties look at the whole conversation
        const int rc = hy_generate(c, s, ids.data(), int(ids.size()), &gp, &res);
        if (rc == HY_OK && res.n_prompt == 0) {  // the prefill was stopped: nothing of this message stays
            if (!before.empty() && hy_state_load(c, before.data(), before.size()) != HY_OK)
                engine_fail(exit_runtime, "restoring the conversation");
            refill_penalty_history();
            g_interrupted.store(false);
            last_interrupted = true;
            if (tty_in)
                std::fprintf(stderr, "[stopped before the answer: the message was dropped]\n");
            else if (o.verbose)
                std::fputs("hybrid: stop: interrupted (Ctrl-C) during the prefill; the message was dropped\n", stderr);
            return;
        }
        if (rc == HY_OK || !answer.empty()) write_stdout("\n", 1);  // (ends the answer; no empty line before an error)
        if (rc != HY_OK) engine_fail(rc == HY_ERR_CONTEXT_FULL ? exit_context : exit_runtime, "generation failed");
        check_stdout();
        messages.push_back({"user", user});
        messages.push_back({"assistant", answer});
        total.n_prompt += res.n_prompt;
        total.n_generated += res.n_generated;
        total.prompt_ms += res.prompt_ms;
        total.generate_ms += res.generate_ms;
        total.n_decoded += res.n_decoded;
        total.stop_reason = res.stop_reason;
        last_interrupted = g_interrupted.exchange(false);  // Ctrl-C stopped this answer
        if (o.verbose) print_summary(-1.0, res, last_interrupted);
        if (last_interrupted && tty_in) std::fprintf(stderr, "[stopped]\n");
        if (res.stop_reason == HY_STOP_CONTEXT_FULL)  // (the answer above is not complete: say so)
            std::fprintf(stderr,
                         "hybrid: the answer was cut off: the context (-c %d) is full; /reset starts a new "
                         "conversation (/save FILE keeps this one)\n",
                         hy_model_n_ctx(m));
    }

    // "~" and "~/..." as the shell reads them (the user's home folder, $HOME); other names as typed.
    static std::string expand_home(const std::string& path) {
        if (path != "~" && path.rfind("~/", 0) != 0) return path;
        const char* home = std::getenv("HOME");
        if (!home || !*home) throw Failure(exit_usage, path + ": cannot expand '~' ($HOME is not set)");
        return std::string(home) + path.substr(1);
    }

    // The context as an engine snapshot (hy_state_save); empty when it cannot be made (hy_last_error says why).
    std::vector<char> snapshot() const {
        size_t n = 0;
        std::vector<char> out;
        if (hy_state_save(c, nullptr, 0, &n) != HY_OK) return out;
        out.resize(n);
        if (hy_state_save(c, out.data(), n, &n) != HY_OK) out.clear();
        return out;
    }

    // The penalties' history := the context's sequence (after /load, or a stopped prefill); the RNG goes on.
    void refill_penalty_history() {
        hy_sampler_clear_history(s);
        std::vector<int32_t> history(size_t(hy_context_n_tokens(c)));
        hy_context_tokens(c, history.data(), int(history.size()));
        for (int32_t id : history) hy_sampler_accept(s, id);
    }

    // ---- commands ----
    void save(const std::string& arg, bool overwrite) {
        if (arg.empty()) throw Failure(exit_usage, std::string(overwrite ? "/save!" : "/save") + " needs a file name");
        const std::string path = expand_home(arg);
        const std::vector<char> snap = snapshot();
        if (snap.empty()) engine_fail(exit_runtime, "save");
        nlohmann::json j;
        j["version"] = 1;
        j["no_think"] = o.no_think;
        j["messages"] = nlohmann::json::array();
        for (const auto& msg : messages) j["messages"].push_back({{"role", msg.role}, {"content", msg.content}});
        if (hy_context_n_tokens(c) == 0 && !system.empty())  // no turn yet: the system message of the first one
            j["messages"] = nlohmann::json::array({{{"role", "system"}, {"content", system}}});
        j["checksum"] = header_checksum(j);
        const std::string header = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        std::string data;
        data.reserve(12 + header.size() + snap.size());
        const uint32_t hl = uint32_t(header.size());
        data.append(kChatMagic, 8);
        data.append(reinterpret_cast<const char*>(&hl), 4);
        data += header;
        data.append(snap.data(), snap.size());
        write_file_atomic(path, data, overwrite, "exists (use /save! FILE to overwrite)");
        if (confirm) std::fprintf(stderr, "hybrid: saved %d tokens to %s\n", hy_context_n_tokens(c), path.c_str());
    }

    void load(const std::string& arg) {
        if (arg.empty()) throw Failure(exit_usage, "/load needs a file name");
        const std::string path = expand_home(arg);
        // A regular file only (a FIFO would block, /dev/zero never ends); the fixed header is checked before
        // anything else is read, and the size is bounded by the JSON header's length plus the largest snapshot.
        uint64_t size = 0;
        int fd = -1;
        const std::string head = read_regular_file_head(path, 12, &size, &fd);
        const uint32_t max_header = 64u << 20;  // the messages of a conversation that fits the context
        uint32_t hl = 0;
        if (head.size() >= 12) std::memcpy(&hl, head.data() + 8, 4);
        if (!head.empty() && head.size() < 12 &&
            std::memcmp(head.data(), kChatMagic, std::min<size_t>(head.size(), 8)) == 0) {
            read_rest(fd, 0, path);  // closes fd
            throw Failure(exit_snapshot, path + ": truncated conversation file");
        }
        if (head.size() < 12 || std::memcmp(head.data(), kChatMagic, 8) != 0) {
            read_rest(fd, 0, path);  // closes fd
            throw Failure(exit_snapshot, path + ": not a hybrid conversation file");
        }
        if (hl > max_header) {  // (the magic is right: a damaged file, not another kind)
            read_rest(fd, 0, path);
            throw Failure(exit_snapshot, path + ": conversation file is damaged (its header length field says " +
                                             std::to_string(hl) + " bytes, more than the " +
                                             std::to_string(max_header >> 20) + " MiB any header takes)");
        }
        const uint64_t max_size = 12 + uint64_t(hl) + hy_state_size_max(c);
        if (size > max_size) {
            // The snapshot's own header (model/snapshot.h: magic, ..., u32 n_history at 24, u32 n_pending at 28)
            // tells a conversation longer than this -c (exit 3, as hy_state_load says it) from a damaged file.
            char sh[32];
            const bool got = ::pread(fd, sh, sizeof sh, off_t(12 + uint64_t(hl))) == ssize_t(sizeof sh) &&
                             std::memcmp(sh, "HYCTX01", 8) == 0;
            read_rest(fd, 0, path);
            uint32_t n_hist = 0, n_pending = 0;
            if (got) {
                std::memcpy(&n_hist, sh + 24, 4);
                std::memcpy(&n_pending, sh + 28, 4);
            }
            if (got && n_pending <= n_hist && int64_t(n_hist) - int64_t(n_pending) > hy_model_n_ctx(m))
                throw Failure(exit_context, path + ": snapshot holds " + std::to_string(n_hist) +
                                                " tokens; the context length is " + std::to_string(hy_model_n_ctx(m)) +
                                                " (-c " + std::to_string(hy_model_n_ctx(m)) +
                                                "): a larger -c may hold it");
            // (exit 4: from the size alone, a conversation longer than this -c and a damaged file look alike)
            throw Failure(exit_snapshot, path + ": " + std::to_string(size) +
                                             " bytes, larger than any conversation file of this model with this "
                                             "context (-c " +
                                             std::to_string(hy_model_n_ctx(m)) + "): a larger -c may hold it");
        }
        const std::string rest = read_rest(fd, size_t(size - 12), path);
        if (rest.size() < hl) throw Failure(exit_snapshot, path + ": truncated conversation file");
        std::vector<Message> msgs;
        const nlohmann::json j = nlohmann::json::parse(rest.begin(), rest.begin() + hl, nullptr, false);
        auto bad = [&](const std::string& why) {
            return Failure(exit_snapshot, path + ": bad conversation header: " + why);
        };
        if (j.is_discarded()) throw bad("not valid JSON");
        if (!j.is_object() || !j.contains("version")) throw bad("no 'version'");
        if (j["version"] != 1)
            throw Failure(exit_snapshot, path + ": conversation file version " + j["version"].dump() +
                                             " (this hybrid reads version 1)");
        if (!j.contains("messages") || !j["messages"].is_array()) throw bad("no 'messages' list");
        for (const auto& e : j["messages"]) {
            if (!e.is_object() || !e.contains("role") || !e["role"].is_string() || !e.contains("content") ||
                !e["content"].is_string())
                throw bad("message " + std::to_string(msgs.size()) + " is not {\"role\": text, \"content\": text}");
            msgs.push_back({e["role"].get<std::string>(), e["content"].get<std::string>()});
            if (msgs.back().role != "system" && msgs.back().role != "user" && msgs.back().role != "assistant")
                throw bad("message " + std::to_string(msgs.size() - 1) + " has role '" + msgs.back().role +
                          "' (system, user or assistant)");
        }
        // the fields /save writes, no others (a renamed "checksum" would turn the check off)
        for (const auto& [key, value] : j.items())
            if (key != "version" && key != "messages" && key != "no_think" && key != "checksum")
                throw bad("unknown field '" + key.substr(0, 40) + "'");
        if (j.contains("checksum") && (!j["checksum"].is_string() || j["checksum"] != header_checksum(j)))
            throw Failure(exit_snapshot, path +
                                             ": conversation file is damaged (its header checksum does not match "
                                             "its messages)");
        // keep the current conversation if the snapshot is refused
        const std::vector<char> backup = snapshot();
        const int rc = hy_state_load(c, rest.data() + hl, rest.size() - hl);
        if (rc != HY_OK) {
            std::string msg = path + ": " + hy_last_error();
            if (rc == HY_ERR_CONTEXT_FULL)
                msg += " (-c " + std::to_string(hy_model_n_ctx(m)) + "): a larger -c may hold it";
            if (!backup.empty()) hy_state_load(c, backup.data(), backup.size());
            throw Failure(rc == HY_ERR_CONTEXT_FULL ? exit_context : exit_snapshot, msg);
        }
        messages = std::move(msgs);
        const std::string loaded_system =
            !messages.empty() && messages[0].role == "system" ? messages[0].content : std::string();
        if (hy_context_n_tokens(c) == 0) system = loaded_system;  // (a conversation saved before its first turn)
        // the penalties look at the whole conversation: the history is the restored sequence, as it was when saved
        refill_penalty_history();
        if (confirm)
            std::fprintf(stderr, "hybrid: loaded %s, %s from %s\n", count_of(messages.size(), "message").c_str(),
                         count_of(size_t(hy_context_n_tokens(c)), "token").c_str(), path.c_str());
        // the new turns follow this session's --no-think, which may differ from the saved turns'
        if (j.contains("no_think") && j["no_think"].is_boolean() && j["no_think"].get<bool>() != o.no_think)
            std::fprintf(stderr, "hybrid: warning: %s was saved %s --no-think; new turns follow this session (%s it)\n",
                         path.c_str(), o.no_think ? "without" : "with", o.no_think ? "with" : "without");
        // the loaded conversation keeps its own system message; --system applies again after /reset
        if (!o.system.empty() && loaded_system != o.system)
            std::fprintf(stderr, "hybrid: warning: %s has %s; --system applies after /reset\n", path.c_str(),
                         loaded_system.empty() ? "no system message, and keeps none"
                                               : "another system message than --system, and keeps its own");
    }

    // Returns false to leave the REPL.
    bool command(const std::string& line) {
        const size_t sp = line.find_first_of(" \t");
        const std::string cmd = line.substr(0, sp);
        std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
        while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t' || arg.back() == '\r')) arg.pop_back();
        while (!arg.empty() && (arg.front() == ' ' || arg.front() == '\t')) arg.erase(arg.begin());
        // a file name in quotes, as a shell would take it ("my chat.json", 'x'): the quotes are not part of it
        if (!arg.empty() && (arg.front() == '"' || arg.front() == '\'')) {
            const char q = arg.front();
            const size_t close = arg.find(q, 1);
            if (std::count(arg.begin(), arg.end(), q) % 2 != 0)  // ("a" "b" pairs up: two names, said below)
                throw Failure(exit_usage, cmd + ": unbalanced quotes in " + arg +
                                              " (put the whole file name in one pair of quotes)");
            if (close != arg.size() - 1)
                throw Failure(exit_usage, cmd + " takes one file name; after " + arg.substr(0, close + 1) + " comes '" +
                                              arg.substr(close + 1) + "'");
            arg = arg.substr(1, arg.size() - 2);
        }
        if (arg.find('\0') != std::string::npos)
            throw Failure(exit_usage, cmd + ": the argument holds a NUL byte, which a file name cannot carry");
        if (!arg.empty() && (cmd == "/exit" || cmd == "/quit" || cmd == "/reset" || cmd == "/help"))
            throw Failure(exit_usage, cmd + " takes no argument (got '" + arg + "')");
        if (cmd == "/exit" || cmd == "/quit") return false;
        if (cmd == "/reset") {
            if (hy_context_reset(c) != HY_OK) engine_fail(exit_runtime, "reset");
            hy_sampler_clear_history(s);  // (not reseeded: asking again gives another answer)
            messages.clear();
            system = o.system;
            if (confirm) std::fprintf(stderr, "hybrid: conversation cleared\n");
        } else if (cmd == "/save" || cmd == "/save!") {
            save(arg, cmd == "/save!");
        } else if (cmd == "/load") {
            load(arg);
        } else if (cmd == "/help") {
            std::fprintf(stderr,
                         "/reset        start a new conversation\n"
                         "/save FILE    save the conversation (refuses to overwrite; /save! FILE overwrites;\n"
                         "              FILE may be in quotes)\n"
                         "/load FILE    continue a saved conversation\n"
                         "/exit, /quit  leave (also Ctrl-D); Ctrl-C stops an answer or discards the typed line\n"
                         "/help         this list\n"
                         "(a message that begins with '/': type a space first)\n");
        } else {
            throw Failure(exit_usage, "unknown command " + cmd + " (/help lists them)");
        }
        return true;
    }
};

}  // namespace

int run_repl(const Options& o, hy_model* m, hy_context* c, hy_sampler* s, double load_ms) {
    Repl r(o, m, c, s);
    r.tty_in = isatty(STDIN_FILENO) != 0;
    // typed at a terminal with stdout redirected (hybrid -i > answers.txt): the prompt and the echo of the typed
    // line go to stderr, so that the file gets only the answers and the user still sees what they type
    r.prompt_out = r.tty_in && !isatty(STDOUT_FILENO) ? stderr : stdout;
#ifdef HY_HAVE_READLINE
    rl_outstream = r.prompt_out;
#endif
    r.confirm = r.tty_in || o.verbose;
    if (hy_chat_end_of_turn_id(m) < 0) {
        std::vector<hy_chat_message> none;
        chat_render(m, none, true, thinking_mode(o), false);  // throws with the engine's message
    }
    if (r.tty_in)
        std::fprintf(stderr,
                     "hybrid chat (%s, loaded in %.0f ms). /help for commands, Ctrl-C stops an answer, "
                     "Ctrl-D exits.\n",
                     hy_model_backend(m), load_ms);
    auto guarded = [&](auto&& fn) -> int {
        try {
            fn();
        } catch (const Failure& f) {
            std::fflush(stdout);
            std::fprintf(stderr, "hybrid: error: %s\n", f.what());
            if (!r.tty_in || stdout_lost()) return f.code;  // scripted, or stdout is lost: the session ends
        }
        return -1;
    };
    if (o.has_prompt) {  // the first turn, as if typed (a blank one is refused, as one-shot mode refuses it)
        if (o.prompt.find_first_not_of(" \t\n\v\f\r") == std::string::npos)
            throw Failure(exit_usage, "the first turn (-p or -f) is empty");
        const int rc = guarded([&] { r.turn(o.prompt); });
        if (rc >= 0) return rc;
    }
    std::string line;
    while (r.read_line(line)) {
        while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
        if (line.find_first_not_of(" \t\n\v\f\r") == std::string::npos) continue;
        bool go_on = true;
        const int rc = guarded([&] {
            if (line[0] == '/')
                go_on = r.command(line);
            else
                r.turn(line);
        });
        if (rc >= 0) return rc;
        if (!go_on) break;
    }
    if (r.tty_in) std::fputs("\n", r.prompt_out);  // (after the last prompt)
    if (isatty(STDERR_FILENO) || o.verbose) {
        std::fprintf(stderr, "hybrid: session totals:\n");
        print_summary(load_ms, r.total, r.last_interrupted, false);  // (each turn printed its stop)
    }
    return exit_ok;
}

}  // namespace hy::cli
