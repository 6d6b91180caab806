// hybrid-server end to end: the server runs models/tiny on a free loopback port and is talked to over HTTP
// (cpp-httplib's client, and raw sockets for disconnects). Greedy output equals the hybrid CLI's, streamed chunks
// concatenate to the non-streamed answer, concurrent requests equal their solo runs, a second chat turn continues
// from the first turn's state, a disconnect frees the slot, bad requests get 4xx JSON errors without disturbing
// the others; idle and slow clients do not hold the others (deadlines, 408), a burst of connects queues (backlog),
// shutdown answers what is in flight and a second signal exits at once; HTTP details (411, 405, 413, 414,
// /v1/models/{id}). Plus the output parser's tool calls and reasoning (server/chat.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "model/tokenizer.h"
#include "server/chat.h"

namespace {

using ojson = nlohmann::ordered_json;
using hy::test::cli_util::kBin;
using hy::test::cli_util::kSrc;
using hy::test::cli_util::run_prog;

// A hybrid-server process on a free port (--port 0: it prints the one it took), stopped with SIGTERM.
class ServerProcess {
public:
    explicit ServerProcess(std::vector<std::string> extra) {
        // the defaults, each unless `extra` gives it (the server refuses an option given twice)
        std::vector<std::string> args = {kBin + "/hybrid-server"};
        for (const auto& [flag, value] : {std::pair<const char*, const char*>{"-m", "models/tiny"},
                                          {"--port", "0"},
                                          {"--device", "cpu"},
                                          {"-c", "512"}})
            if (std::find(extra.begin(), extra.end(), flag) == extra.end()) args.insert(args.end(), {flag, value});
        args.insert(args.end(), extra.begin(), extra.end());
        int fds[2];
        REQUIRE(pipe(fds) == 0);
        pid_ = fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            dup2(fds[1], 2);
            close(fds[0]);
            close(fds[1]);
            if (chdir(kSrc.c_str()) != 0) _exit(127);
            std::vector<char*> argv;
            for (std::string& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(fds[1]);
        err_fd_ = fds[0];
        std::string log;
        char buf[512];
        const std::string mark = "listening on http://127.0.0.1:";
        while (log.find(mark) == std::string::npos || log.find('\n', log.find(mark)) == std::string::npos) {
            const ssize_t n = read(err_fd_, buf, sizeof buf);
            if (n <= 0) break;
            log.append(buf, size_t(n));
        }
        INFO(log);
        startup_log_ = log;
        const size_t at = log.find(mark);
        REQUIRE(at != std::string::npos);
        port_ = std::stoi(log.substr(at + mark.size()));
        // keep reading stderr so the server never blocks on a full pipe
        reader_ = std::thread([fd = err_fd_] {
            char b[4096];
            while (read(fd, b, sizeof b) > 0) {}
        });
    }
    ~ServerProcess() { stop(SIGTERM); }
    int port() const { return port_; }
    // What the server wrote on stderr up to its "listening on" line.
    const std::string& startup_log() const { return startup_log_; }
    // Sends `sig` to this server's process (the child this test started; nothing else).
    void signal(int sig) const {
        if (pid_ > 0) kill(pid_, sig);
    }
    // Waits up to `seconds` for the process to exit: its exit status (-1: killed by a signal), or -2 when it still
    // runs.
    int wait_exit(double seconds) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (pid_ > 0) {
            int st = 0;
            const pid_t r = waitpid(pid_, &st, WNOHANG);
            if (r == pid_) {
                status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                pid_ = -1;
                reader_.join();
                close(err_fd_);
                break;
            }
            if (std::chrono::steady_clock::now() >= end) return -2;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return status_;
    }
    // Sends `sig` and waits for the exit; returns the exit status (-1: killed by a signal), the first one again later.
    int stop(int sig) {
        if (pid_ > 0) {
            kill(pid_, sig);
            int st = 0;
            waitpid(pid_, &st, 0);
            status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            pid_ = -1;
            reader_.join();
            close(err_fd_);
        }
        return status_;
    }

private:
    pid_t pid_ = -1;
    int err_fd_ = -1;
    int port_ = 0;
    int status_ = -1;
    std::string startup_log_;
    std::thread reader_;
};

bool have_server_binary() { return std::filesystem::exists(kBin + "/hybrid-server"); }

// The server most tests share: 4 slots, so 16 concurrent requests queue.
ServerProcess& shared_server() {
    static ServerProcess s({"-np", "4", "--cache-mb", "64"});
    return s;
}

struct Reply {
    int status = 0;
    std::string body;
    ojson json() const { return ojson::parse(body); }
};

Reply post(int port, const std::string& path, const std::string& body,
           const httplib::Headers& headers = httplib::Headers{}) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(300, 0);
    auto r = cli.Post(path.c_str(), headers, body, "application/json");
    INFO(path << ": " << httplib::to_string(r.error()));
    REQUIRE(r);
    return {r->status, r->body};
}

Reply post(int port, const std::string& path, const ojson& body) { return post(port, path, body.dump()); }

// post() for other threads: no Catch2 macros (they are not thread-safe; the test thread checks the reply), a failed
// connection as status -1 with the error in body.
Reply post_from_thread(int port, const std::string& path, const ojson& body) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(300, 0);
    auto r = cli.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {-1, httplib::to_string(r.error())};
    return {r->status, r->body};
}

Reply get(int port, const std::string& path) {
    httplib::Client cli("127.0.0.1", port);
    auto r = cli.Get(path.c_str());
    REQUIRE(r);
    return {r->status, r->body};
}

// The data: events of a server-sent-event stream, as JSON ("[DONE]" must come last).
std::vector<ojson> events(const std::string& body) {
    std::vector<ojson> out;
    size_t p = 0;
    bool done = false;
    while (p < body.size()) {
        size_t e = body.find("\n\n", p);
        if (e == std::string::npos) e = body.size();
        const std::string ev = body.substr(p, e - p);
        p = e + 2;
        if (ev.empty()) continue;
        REQUIRE(ev.rfind("data: ", 0) == 0);
        REQUIRE_FALSE(done);
        if (ev == "data: [DONE]") {
            done = true;
            continue;
        }
        out.push_back(ojson::parse(ev.substr(6)));
    }
    CHECK(done);
    return out;
}

// A value of the Prometheus text at `name` (with its labels), -1 when absent.
double metric(int port, const std::string& name) {
    const std::string text = get(port, "/metrics").body;
    size_t p = 0;
    while ((p = text.find(name + " ", p)) != std::string::npos) {
        if (p == 0 || text[p - 1] == '\n') return std::stod(text.substr(p + name.size() + 1));
        p++;
    }
    return -1;
}

// Connects and sends `request`; the socket (the caller closes it).
int raw_send(int port, const std::string& request) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(write(fd, request.data(), request.size()) == ssize_t(request.size()));
    return fd;
}

// Connects, sends `request` and reads until `until` appears in what comes back (or the server closes).
int raw_request(int port, const std::string& request, const std::string& until) {
    const int fd = raw_send(port, request);
    std::string got;
    char buf[1024];
    while (!until.empty() && got.find(until) == std::string::npos) {
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, size_t(n));
    }
    return fd;
}

std::string http_post_text(const std::string& path, const std::string& body) {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Reads from `fd` into *got until `until` appears (empty: until the peer closes) or `seconds` pass.
bool raw_read(int fd, std::string* got, const std::string& until, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    while (until.empty() || got->find(until) == std::string::npos) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, int(left.count())) <= 0) continue;
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) return until.empty();
        got->append(buf, size_t(n));
    }
    return true;
}

// The status and body of a raw HTTP/1.1 response (a chunked body is joined).
Reply parse_raw_response(const std::string& raw) {
    Reply r;
    const size_t head_end = raw.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    REQUIRE(raw.rfind("HTTP/1.1 ", 0) == 0);
    r.status = std::stoi(raw.substr(9, 3));
    const std::string head = raw.substr(0, head_end);
    std::string body = raw.substr(head_end + 4);
    std::string lower = head;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("transfer-encoding: chunked") == std::string::npos) {
        r.body = body;
        return r;
    }
    size_t p = 0;
    while (p < body.size()) {
        const size_t eol = body.find("\r\n", p);
        REQUIRE(eol != std::string::npos);
        const size_t n = std::stoul(body.substr(p, eol - p), nullptr, 16);
        if (n == 0) break;
        r.body += body.substr(eol + 2, n);
        p = eol + 2 + n + 2;
    }
    return r;
}

template <class Pred>
bool wait_for(Pred pred, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pred();
}

const char* kCode = "def fibonacci(n):\n    ";

}  // namespace

TEST_CASE("server: greedy completions equal the hybrid CLI and the Hugging Face goldens", "[server]") {
    if (!have_server_binary()) {
        WARN("hybrid-server not built (HY_TESTS_ONLY): skipped");
        return;
    }
    const int port = shared_server().port();
    CHECK(get(port, "/health").json()["status"] == "ok");
    const ojson models = get(port, "/v1/models").json();
    CHECK(models["data"][0]["id"] == "tiny");

    const Reply r = post(port, "/v1/completions", ojson{{"prompt", kCode}, {"max_tokens", 40}, {"temperature", 0}});
    REQUIRE(r.status == 200);
    const ojson j = r.json();
    const auto cli = run_prog(kBin + "/hybrid", {"-m", "models/tiny", "-p", "def fibonacci(n):\\n    ", "-n", "40",
                                                 "--temp", "0", "--device", "cpu"});
    REQUIRE(cli.rc == 0);
    CHECK(j["choices"][0]["text"].get<std::string>() == cli.out);
    CHECK(j["object"] == "text_completion");
    CHECK(j["usage"]["completion_tokens"].get<int>() <= 40);

    // the prompt's other forms: [text], token ids and [[token ids]] (OpenAI's list of one prompt) give the same text
    const std::vector<int32_t> ids = hy::Tokenizer::from_folder(kSrc + "/models/tiny").encode(kCode);
    for (const ojson& form : {ojson::array({kCode}), ojson(ids), ojson::array({ojson(ids)})}) {
        INFO(form.dump());
        const Reply f = post(port, "/v1/completions", ojson{{"prompt", form}, {"max_tokens", 40}, {"temperature", 0}});
        REQUIRE(f.status == 200);
        CHECK(f.json()["choices"][0]["text"] == j["choices"][0]["text"]);
    }
    CHECK(post(port, "/v1/completions", ojson{{"prompt", ojson::array({kCode, kCode})}}).status == 400);

    // stop strings end the text where the CLI's --stop ends it
    const ojson stopped =
        post(port, "/v1/completions",
             ojson{{"prompt", kCode}, {"max_tokens", 40}, {"temperature", 0}, {"stop", ojson::array({"fully", "xyz"})}})
            .json();
    const auto cli_stop =
        run_prog(kBin + "/hybrid", {"-m", "models/tiny", "-p", "def fibonacci(n):\\n    ", "-n", "40", "--temp", "0",
                                    "--device", "cpu", "--stop", "fully", "--stop", "xyz"});
    REQUIRE(cli_stop.rc == 0);
    CHECK(stopped["choices"][0]["text"].get<std::string>() == cli_stop.out);
    CHECK(stopped["choices"][0]["finish_reason"] == "stop");
    {  // logprobs cover the ids whose text is returned, no more (they listed the ids past the stop)
        const ojson lp = post(port, "/v1/completions",
                              ojson{{"prompt", kCode},
                                    {"max_tokens", 40},
                                    {"temperature", 0},
                                    {"stop", ojson::array({"fully", "xyz"})},
                                    {"logprobs", 1}})
                             .json();
        std::string joined;
        for (const ojson& t : lp["choices"][0]["logprobs"]["tokens"]) joined += t.get<std::string>();
        const std::string text = lp["choices"][0]["text"].get<std::string>();
        INFO(joined << " | " << text);
        CHECK(joined.compare(0, text.size(), text) == 0);  // the text is their prefix
        CHECK(joined.find("fully") == std::string::npos);  // and they stop within the stop string's token
        CHECK(lp["usage"]["completion_tokens"].get<size_t>() >= lp["choices"][0]["logprobs"]["tokens"].size());
        // completion_tokens: the ids up to the one that completes the stop string, every time (ids made before the
        // cancel reached the engine were counted: 4-8 for one answer)
        const ojson all = post(port, "/v1/completions",
                               ojson{{"prompt", kCode}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 1}})
                              .json();
        std::string prefix;
        size_t needed = 0;
        for (const ojson& t : all["choices"][0]["logprobs"]["tokens"]) {
            if (prefix.find("fully") != std::string::npos || prefix.find("xyz") != std::string::npos) break;
            prefix += t.get<std::string>();
            needed++;
        }
        REQUIRE(prefix.find("fully") != std::string::npos);
        for (int rep = 0; rep < 4; rep++)
            CHECK(post(port, "/v1/completions",
                       ojson{{"prompt", kCode},
                             {"max_tokens", 40},
                             {"temperature", 0},
                             {"stop", ojson::array({"fully", "xyz"})}})
                      .json()["usage"]["completion_tokens"]
                      .get<size_t>() == needed);
    }

    // token-id prompts: the goldens' greedy ids (HF generate does not stop at EOS: ignore_eos)
    const ojson golden = ojson::parse(hy::test::cli_util::slurp(kSrc + "/models/tiny/golden.json"));
    for (const ojson& c : golden["cases"]) {
        if (c["name"] != "short" && c["name"] != "unicode") continue;
        const ojson req{{"prompt", c["input_ids"]},
                        {"max_tokens", c["max_new_tokens"]},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"logprobs", 2}};
        const ojson out = post(port, "/v1/completions", req).json();
        const auto ids = c["greedy_fp32_cpu"].get<std::vector<int32_t>>();
        const std::string cmd_ids = [&] {
            std::string s;
            for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
            return s;
        }();
        const auto decoded = run_prog(kBin + "/hybrid-tokenize", {"--tokenizer", "models/tiny", "--decode", cmd_ids});
        INFO("case " << c["name"]);
        CHECK(out["choices"][0]["text"].get<std::string>() + "\n" == decoded.out);
        CHECK(out["choices"][0]["logprobs"]["tokens"].size() == ids.size());
        CHECK(out["choices"][0]["logprobs"]["top_logprobs"][0].size() == 2);
    }
}

TEST_CASE("server: streamed chunks concatenate to the non-streamed answer", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    for (const bool chat : {false, true}) {
        ojson req{{"max_tokens", 48}, {"temperature", 0.7}, {"seed", 11}, {"cache_prompt", false}};
        if (chat)
            req["messages"] = ojson::array({ojson{{"role", "system"}, {"content", "You write Python."}},
                                            ojson{{"role", "user"}, {"content", "Sort a list."}}});
        else
            req["prompt"] = kCode;
        const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
        const ojson whole = post(port, path, req).json();
        req["stream"] = true;
        req["stream_options"] = ojson{{"include_usage", true}};
        const Reply r = post(port, path, req);
        REQUIRE(r.status == 200);
        std::string text, finish;
        ojson usage;
        int usage_chunks = 0;
        for (const ojson& ev : events(r.body)) {
            // usage in a last chunk of its own, with no choices (OpenAI's and vLLM's form; completions put it on
            // the finish chunk: the fresh-user test of the twenty-ninth session)
            if (ev.contains("usage") && !ev["usage"].is_null()) {
                usage = ev["usage"];
                usage_chunks++;
                CHECK(ev["choices"].empty());
            }
            if (ev["choices"].empty()) continue;
            CHECK(usage_chunks == 0);
            const ojson& c = ev["choices"][0];
            if (chat && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
            if (!chat) text += c["text"].get<std::string>();
            if (!c["finish_reason"].is_null()) finish = c["finish_reason"].get<std::string>();
            CHECK(ev["object"] == (chat ? "chat.completion.chunk" : "text_completion"));
        }
        INFO("chat " << chat);
        const ojson& choice = whole["choices"][0];
        CHECK(text == (chat ? choice["message"]["content"] : choice["text"]).get<std::string>());
        CHECK(finish == choice["finish_reason"].get<std::string>());
        CHECK(usage == whole["usage"]);
        CHECK(usage_chunks == 1);
    }
}

// /v1/completions logprobs: text_offset counts characters (code points) of text, as OpenAI's and vLLM's do, not
// UTF-8 bytes (the fresh-user test of the thirty-first session: a 4-byte emoji token gave offsets 0, 4, 8), in the
// answer and in the stream.
TEST_CASE("server: completion text offsets count characters", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    ojson req{{"prompt", "x"}, {"max_tokens", 3},      {"temperature", 0}, {"logit_bias", ojson{{"402", 100}}},
              {"logprobs", 1}, {"cache_prompt", false}};
    const ojson whole = post(port, "/v1/completions", req).json();
    const ojson& lp = whole["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == 3);
    std::string prefix;
    bool multibyte = false;
    for (size_t i = 0; i < lp["tokens"].size(); i++) {
        INFO("token " << i << " after '" << prefix << "'");
        CHECK(lp["text_offset"][i].get<size_t>() == hy::utf8_length(prefix));
        prefix += lp["tokens"][i].get<std::string>();
        multibyte = multibyte || hy::utf8_length(prefix) != prefix.size();
    }
    CHECK(multibyte);  // (token 402 of models/tiny is a 4-byte character: the case tells bytes from characters)
    CHECK(prefix == whole["choices"][0]["text"].get<std::string>());
    req["stream"] = true;
    ojson streamed = ojson::array();
    for (const ojson& ev : events(post(port, "/v1/completions", req).body)) {
        if (!ev.contains("choices") || ev["choices"].empty()) continue;
        const ojson& c = ev["choices"][0];
        if (c["logprobs"].is_object())
            for (const ojson& o : c["logprobs"]["text_offset"]) streamed.push_back(o);
    }
    CHECK(streamed == lp["text_offset"]);
}

// Streamed chat with logprobs: a token's logprobs come with the chunk that shows its text, the reasoning's too
// (they came in a separate chunk with empty content, at times before the text; the fresh-user test of the
// twenty-third session), and the stream lists the same logprobs as the answer that is not streamed.
TEST_CASE("server: streamed chat logprobs travel with their text", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    for (const bool think : {true, false}) {
        ojson req{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "Sort a list."}}})},
                  {"max_tokens", 24},
                  {"temperature", 0},
                  {"logprobs", true},
                  {"top_logprobs", 1},
                  {"cache_prompt", false}};
        if (!think) req["chat_template_kwargs"] = ojson{{"enable_thinking", false}};
        const ojson whole = post(port, "/v1/chat/completions", req).json();
        req["stream"] = true;
        ojson listed = ojson::array();
        int with_text = 0;
        for (const ojson& ev : events(post(port, "/v1/chat/completions", req).body)) {
            if (ev["choices"].empty()) continue;
            const ojson& c = ev["choices"][0];
            const ojson& d = c["delta"];
            const bool text = (d.contains("content") && !d["content"].get<std::string>().empty()) ||
                              (d.contains("reasoning_content") && !d["reasoning_content"].get<std::string>().empty());
            INFO("think " << think << ": " << ev.dump());
            if (text && !d.contains("role")) {
                with_text++;
                CHECK(c["logprobs"].is_object());  // (the reasoning's chunks had null)
            }
            if (c["logprobs"].is_object())
                for (const ojson& e : c["logprobs"]["content"]) listed.push_back(e);
        }
        CHECK(with_text > 0);
        CHECK(listed == whole["choices"][0]["logprobs"]["content"]);
    }
}

TEST_CASE("server: 16 concurrent requests each equal their solo run", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    std::vector<ojson> reqs;
    for (int i = 0; i < 16; i++) {
        ojson r{{"max_tokens", 12 + i % 5}, {"cache_prompt", false}};
        if (i % 2)
            r["prompt"] = std::string(kCode) + "return " + std::to_string(i);
        else
            r["messages"] = ojson::array({ojson{{"role", "user"}, {"content", "Task " + std::to_string(i)}}});
        if (i % 3 == 0) {
            r["temperature"] = 0;
        } else {
            r["temperature"] = 0.9;
            r["seed"] = 100 + i;
            r["top_k"] = 20;
        }
        reqs.push_back(r);
    }
    auto path = [](const ojson& r) { return r.contains("prompt") ? "/v1/completions" : "/v1/chat/completions"; };
    auto text = [](const ojson& j) {
        const ojson& c = j["choices"][0];
        return (c.contains("text") ? c["text"] : c["message"]["content"]).get<std::string>();
    };
    std::vector<std::string> solo;
    std::vector<Reply> together(16);
    for (const ojson& r : reqs) solo.push_back(text(post(port, path(r), r).json()));
    std::vector<std::thread> threads;
    for (int i = 0; i < 16; i++)
        threads.emplace_back(
            [&, i] { together[size_t(i)] = post_from_thread(port, path(reqs[size_t(i)]), reqs[size_t(i)]); });
    for (auto& t : threads) t.join();
    for (int i = 0; i < 16; i++) {
        INFO("request " << i << ": " << together[size_t(i)].body);
        REQUIRE(together[size_t(i)].status == 200);
        CHECK(text(together[size_t(i)].json()) == solo[size_t(i)]);
    }
}

TEST_CASE("server: a second chat turn continues from the first turn's state", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    ojson msgs = ojson::array({ojson{{"role", "user"}, {"content", "Write a class for a stack."}}});
    const ojson no_think{{"enable_thinking", false}};  // (answers as content, the history as the model saw it)
    const ojson t1 =
        post(port, "/v1/chat/completions",
             ojson{{"messages", msgs}, {"max_tokens", 24}, {"temperature", 0}, {"chat_template_kwargs", no_think}})
            .json();
    const int p1 = t1["usage"]["prompt_tokens"].get<int>(), c1 = t1["usage"]["completion_tokens"].get<int>();
    msgs.push_back(ojson{{"role", "assistant"}, {"content", t1["choices"][0]["message"]["content"]}});
    msgs.push_back(ojson{{"role", "user"}, {"content", "Now a queue."}});
    ojson req{{"messages", msgs}, {"max_tokens", 16}, {"temperature", 0}, {"chat_template_kwargs", no_think}};
    const ojson t2 = post(port, "/v1/chat/completions", req).json();
    // the first turn's prompt and answer (all but its last id, which was never fed) come from the cache
    CHECK(t2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() == p1 + c1 - 1);
    CHECK(t2["usage"]["prompt_tokens"].get<int>() > p1 + c1);
    // and the answer is the one computed from scratch
    req["cache_prompt"] = false;
    const ojson fresh = post(port, "/v1/chat/completions", req).json();
    CHECK(fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    CHECK(fresh["choices"][0]["message"]["content"] == t2["choices"][0]["message"]["content"]);
    CHECK(metric(port, "hybrid_state_cache_hits_total") >= 1);
    // the cache's gauge counts its store's bytes, which --cache-mb bounds
    CHECK(metric(port, "hybrid_state_cache_bytes") > 0);
    CHECK(metric(port, "hybrid_state_cache_bytes") <= metric(port, "hybrid_state_cache_capacity_bytes"));
}

TEST_CASE("server: a client that disconnects frees its slot", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    const double cancelled = metric(port, "hybrid_requests_cancelled_total");
    const ojson long_req{{"prompt", kCode},  {"max_tokens", 480}, {"ignore_eos", true},
                         {"temperature", 0}, {"stream", true},    {"cache_prompt", false}};
    // streaming: close after the first event
    int fd = raw_request(port, http_post_text("/v1/completions", long_req.dump()), "data: ");
    close(fd);
    CHECK(wait_for([&] { return metric(port, "hybrid_requests_cancelled_total") >= cancelled + 1; }, 20));
    // not streaming: close while it generates
    ojson plain = long_req;
    plain["stream"] = false;
    fd = raw_request(port, http_post_text("/v1/completions", plain.dump()), "");
    CHECK(wait_for([&] { return metric(port, "hybrid_slots_busy") == 1; }, 20));
    close(fd);
    CHECK(wait_for([&] { return metric(port, "hybrid_requests_cancelled_total") >= cancelled + 2; }, 20));
    CHECK(wait_for([&] { return metric(port, "hybrid_slots_busy") == 0; }, 20));
    CHECK(metric(port, "hybrid_requests_waiting") == 0);
}

TEST_CASE("server: bad requests get 4xx OpenAI errors without disturbing the others", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    const ojson good{{"prompt", kCode}, {"max_tokens", 64}, {"temperature", 0}, {"cache_prompt", false}};
    const std::string expected = post(port, "/v1/completions", good).json()["choices"][0]["text"];
    Reply during;
    std::thread t([&] { during = post_from_thread(port, "/v1/completions", good); });
    struct JoinOnExit {  // (a failed REQUIRE below leaves by an exception: the thread must be joined first)
        std::thread& t;
        ~JoinOnExit() {
            if (t.joinable()) t.join();
        }
    } join_on_exit{t};
    struct Bad {
        const char* path;
        std::string body;
        int status;
        const char* param;
    };
    const std::string long_prompt(3000, 'x');
    const std::vector<Bad> bad = {
        {"/v1/chat/completions", "{\"messages\": [", 400, nullptr},
        {"/v1/chat/completions", "[1, 2]", 400, nullptr},
        {"/v1/chat/completions", "{}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\": []}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "messages"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"king\", \"content\": \"x\"}]}", 400, "messages[0].role"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": -1}", 400,
         "temperature"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 2}", 400,
         "top_p"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": \"9\"}",
         400, "max_tokens"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 2}", 400, "n"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 3}", 400,
         "stop"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}", 400,
         "top_logprobs"},
        {"/v1/completions", "{\"prompt\": 7}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\": [1, 99999]}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\": \"" + long_prompt + "\"}", 400, "prompt"},
        // streamed, the prompt that does not fit is refused before the stream starts (400, not an error event)
        {"/v1/completions", "{\"stream\": true, \"prompt\": \"" + long_prompt + "\"}", 400, "prompt"},
        {"/v1/chat/completions",
         "{\"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"" + long_prompt + "\"}]}", 400,
         "messages"},
        {"/v1/completions", "{\"prompt\": \"x\", \"min_p\": 1.5}", 400, "min_p"},
        // tool_choice: "auto" or "none" (a forced call needs constrained decoding: refused, it was ignored); a tool
        // needs a named function
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"bogus\"}", 400, "tool_choice"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", 400,
         "tool_choice"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}}",
         400, "tool_choice"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", 400,
         "tools"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"  \"}}]}",
         400, "tools"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\", \"parameters\": \"bad\"}}]}",
         400, "tools"},
        // models/tiny has no template: tools are refused by name (the error had no param)
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}]}",
         400, "tools"},
        {"/v1/completions", "{\"prompt\": [[1], [2]]}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\": []}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\": [18446744073709551615]}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\": \"x\", \"seed\": \"abc\"}", 400, "seed"},
        {"/v1/completions", "{\"prompt\": \"x\", \"best_of\": 3}", 400, "best_of"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 0}", 400, "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 2.0}", 400, "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"n\": 1.5}", 400, "n"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": [1]}", 400, "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}", 400, "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"99999\": 1}}", 400, "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias"},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", 400, "logit_bias"},
        // a message needs content (a NUL byte is refused), but an assistant message with tool_calls
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": null}]}", 400,
         "messages[0].content"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null}]}",
         400, "messages[1].content"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": null}]}", 400,
         "messages[1].content"},
        // models/tiny has no chat template: the built-in ChatML cannot show a tool message
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": \"42\"}]}", 400,
         "messages[1].role"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"a\\u0000b\"}]}",
         400, "messages[1].content"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}", 400,
         "messages[0].content"},
        // two names of one setting that disagree (max_completion_tokens was taken, silently)
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 3, \"max_completion_tokens\": 5}",
         400, "max_completion_tokens"},
        {"/v1/completions", "{\"prompt\": \"x\", \"repeat_penalty\": 1.1, \"repetition_penalty\": 1.3}", 400,
         "repetition_penalty"},
        // a chat field on /v1/completions (it was ignored, and the default of 16 tokens applied)
        {"/v1/completions", "{\"prompt\": \"x\", \"max_completion_tokens\": 40}", 400, "max_completion_tokens"},
        // a chat field on /v1/completions (it was ignored, and no logprobs came back: a fresh-user pass)
        {"/v1/completions", "{\"prompt\": \"x\", \"top_logprobs\": 3}", 400, "top_logprobs"},
        // seeds below -1 (the CLI refuses them; -1 draws a random seed)
        {"/v1/completions", "{\"prompt\": \"x\", \"seed\": -2}", 400, "seed"},
        // stream_options without streaming (as OpenAI's API)
        {"/v1/completions", "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", 400,
         "stream_options"},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": false, \"stream_options\": {}}", 400,
         "stream_options"},
        {"/v1/nothing", "{}", 404, nullptr},
    };
    for (const Bad& b : bad) {
        INFO(b.path << " " << b.body.substr(0, 120));
        const Reply r = post(port, b.path, b.body);
        CHECK(r.status == b.status);
        const ojson j = ojson::parse(r.body, nullptr, false);
        REQUIRE(j.is_object());
        REQUIRE(j.contains("error"));
        CHECK(!j["error"]["message"].get<std::string>().empty());
        CHECK(j["error"]["message"].get<std::string>().find('\n') == std::string::npos);
        if (b.param) CHECK(j["error"]["param"] == b.param);
    }
    {  // a whole number too large for an integer field is out of range, not "not an integer" (a fresh-user pass)
        const Reply r = post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": 1e20}"));
        CHECK(r.status == 400);
        INFO(r.body);
        CHECK(r.body.find("max_tokens must be <= 2147483647, got 1e+20") != std::string::npos);
        // the same for every integer field (they said "must be an integer"), and a whole float up to 2^64 is taken
        for (const auto& [body, message] :
             {std::pair<std::string, std::string>{"\"seed\": 1e20",
                                                  "seed must be in [-1, 18446744073709551615], got 1e+20"},
              {"\"top_k\": 1e20", "top_k must be in [-1, 1073741824], got 1e+20"},
              {"\"top_k\": -1e19", "top_k must be in [-1, 1073741824], got -1e+19"},
              {"\"n\": 1e30", "n = 1e+30 is not supported: one choice per request (n = 1)"},
              {"\"n\": -1e30", "n must be 1, got -1e+30"},
              {"\"stream\": 1", "stream must be a boolean, got 1"},
              {"\"top_k\": 2.5", "top_k must be an integer, got 2.5"}}) {
            const Reply e = post(port, "/v1/completions", "{\"prompt\": \"x\", " + body + "}");
            INFO(e.body);
            CHECK(e.status == 400);
            CHECK(e.body.find(message) != std::string::npos);
        }
        CHECK(post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": 1, \"seed\": 1e16}"))
                  .status == 200);
    }
    // a body nested 100,000 levels deep (200 KB) is a 400 before it is parsed (the parser's recursion took the server
    // down: a fresh-user pass); 64 levels are the most a body may nest
    {
        const int d = 100000;
        const std::string deep = "{\"x\": " + std::string(d, '[') + std::string(d, ']') + ", \"prompt\": \"a\"}";
        const Reply r = post(port, "/v1/completions", deep);
        CHECK(r.status == 400);
        CHECK(r.body.find("nests more than 64 levels") != std::string::npos);
        const std::string ok63 =
            "{\"x\": " + std::string(62, '[') + std::string(62, ']') + ", \"prompt\": \"a\", \"max_tokens\": 1}";
        CHECK(post(port, "/v1/completions", ok63).status == 200);
        // brackets inside strings do not count
        const std::string in_string =
            "{\"prompt\": \"" + std::string(100, '[') + "\\\"" + std::string(100, '{') + "\", \"max_tokens\": 1}";
        CHECK(post(port, "/v1/completions", in_string).status == 200);
    }
    // whole-number floats in integer fields are those integers (vLLM takes them); other floats are refused
    {
        const Reply r = post(
            port, "/v1/completions",
            std::string("{\"prompt\": \"x\", \"max_tokens\": 2.0, \"seed\": 5.0, \"top_k\": 3.0, \"temperature\": 0}"));
        CHECK(r.status == 200);
        CHECK(r.json()["usage"]["completion_tokens"].get<int>() <= 2);
        CHECK(post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": 2.5}")).status == 400);
        CHECK(post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"seed\": 1e300}")).status == 400);
    }
    // top_p 0 is taken, as the CLI's --top-p 0 (the most likely token alone; it was a 400 here)
    CHECK(post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": 1, \"top_p\": 0}")).status ==
          200);
    const Reply too_long = post(port, "/v1/completions", "{\"prompt\": \"" + long_prompt + "\"}");
    CHECK(too_long.json()["error"]["code"] == "context_length_exceeded");
    // the prompt's errors say what was wrong (a batch; an id past int64 was shown wrapped, as -1)
    for (const auto& [body, needle] : std::vector<std::pair<std::string, std::string>>{
             {"{\"prompt\": [[1], [2]]}", "a batch of 2 prompts is not supported"},
             {"{\"prompt\": [18446744073709551615]}", "token id 18446744073709551615 is not in the vocabulary"},
             {"{\"prompt\": [[]]}", "the prompt is empty"}}) {
        const Reply e = post(port, "/v1/completions", body);
        INFO(body << ": " << e.body);
        CHECK(e.status == 400);
        CHECK(e.json()["error"]["message"].get<std::string>().find(needle) != std::string::npos);
    }
    t.join();
    INFO("the request during the bad ones: " << during.body);
    REQUIRE(during.status == 200);
    CHECK(during.json()["choices"][0]["text"] == expected);
    CHECK(get(port, "/health").status == 200);
}

// A bad -m reads as in hybrid and the tools (before the tokenizer is looked for): one line, exit 2.
TEST_CASE("server and hybrid-perplexity: a bad -m is named as in hybrid; a repeated option", "[server]") {
    if (!have_server_binary()) return;
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"models/nope", "models/nope: no such model folder"},
        {"", "the model folder path is empty"},
        {"models/tiny/config.json", "models/tiny/config.json: not a folder"},
        {"models", "models: not a model folder (no config.json)"},
    };
    for (const auto& [dir, msg] : cases)
        for (const auto& [prog, line] :
             {std::pair<std::string, std::string>{"hybrid-server", "hybrid-server: " + msg + "\n"},
              {"hybrid-perplexity", "hybrid-perplexity: " + msg + "\n"}}) {
            std::vector<std::string> args = {"-m", dir};
            if (prog == "hybrid-perplexity") args.insert(args.end(), {"-f", "README.md"});
            const hy::test::cli_util::Run r = run_prog(kBin + "/" + prog, args);
            INFO(prog << " -m " << dir << ": " << r.err);
            CHECK(r.rc == 2);
            CHECK(r.err == line);
        }
    // a repeated option is refused, as by hybrid and the tools (the server kept the last value)
    const hy::test::cli_util::Run twice =
        run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "--port", "0", "-np", "1", "-np", "2"});
    CHECK(twice.rc == 1);
    CHECK(twice.err.find("hybrid-server: --parallel was given more than once (give it once)") == 0);
    // a value out of range names what was given, and points to --help as hybrid and the tools do (it said
    // "(see hybrid-server -h)" and left the value out)
    for (const auto& [opt, value, msg] :
         {std::tuple<const char*, const char*, const char*>{"-np", "0", "-np must be in [1, 4096], got 0 (see --help)"},
          {"-c", "1", "-c must be 0 (the model's trained context) or at least 2, got 1 (see --help)"},
          {"-b", "0", "-b must be at least 1, got 0 (see --help)"},
          {"--cache-mb", "-3", "--cache-mb must be >= 0, got -3 (see --help)"}}) {
        const hy::test::cli_util::Run r = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", opt, value});
        INFO(r.err);
        CHECK(r.rc == 1);
        CHECK(r.err == std::string("hybrid-server: ") + msg + "\n");
    }
    // -np is llama.cpp's --parallel only where it stands as an option (`-a -np` named the model "--parallel");
    // words cxxopts would misread are refused as hybrid refuses them
    {
        const hy::test::cli_util::Run eq = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "-np=4"});
        CHECK(eq.rc == 1);
        CHECK(eq.err.find("-np takes its value as the next word: -np 4, or --parallel=4") != std::string::npos);
        const hy::test::cli_util::Run ngl = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "-ngl", "99"});
        CHECK(ngl.rc == 1);
        CHECK(ngl.err.find("unknown option -ngl") != std::string::npos);
        const hy::test::cli_util::Run teq = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "-t=4"});
        CHECK(teq.rc == 1);
        CHECK(teq.err.find("-t takes its value as the next word: -t 4") != std::string::npos);
        const hy::test::cli_util::Run gap = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "-c", "-t", "4"});
        CHECK(gap.rc == 1);
        CHECK(gap.err.find("-c needs a value (the next word, -t, is an option)") != std::string::npos);
        // (-t -1 is all cores, as in hybrid and the tools; it was refused)
        ServerProcess alias({"-np", "1", "-t", "-1", "-a", "-np"});
        CHECK(get(alias.port(), "/v1/models").json()["data"][0]["id"] == "-np");
    }
    // numbers are decimal, as in hybrid and the tools (--port 0x10 listened on port 16; --idle-timeout 0x5 was read
    // as 0 and named as out of range)
    for (const auto& [opt, value] : {std::pair<const char*, const char*>{"--port", "0x10"},
                                     {"-c", "0x100"},
                                     {"--cache-mb", "0x10"},
                                     {"-np", "0x2"},
                                     {"--idle-timeout", "0x5"},
                                     {"--request-timeout", "1,5"}}) {
        const hy::test::cli_util::Run r = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", opt, value});
        INFO(opt << " " << value << ": " << r.err);
        CHECK(r.rc == 1);
        CHECK(r.err.find(std::string("invalid value '") + value + "' for --") != std::string::npos);
    }
    // a timeout out of range names the value given, as the other range errors
    for (const char* opt : {"--idle-timeout", "--request-timeout"}) {
        const hy::test::cli_util::Run r = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", opt, "0"});
        CHECK(r.rc == 1);
        CHECK(r.err.find(std::string(opt) + " must be in (0, 86400] seconds, got 0 (see --help)") != std::string::npos);
    }
    // a state cache larger than the machine's memory is refused at start, naming --cache-mb (it started, and Linux
    // would have killed it as the cache filled: a fresh-user pass), as is a context too large for memory
    {
        const hy::test::cli_util::Run big =
            run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "--port", "0", "--cache-mb", "100000000"});
        INFO(big.err);
        CHECK(big.rc == 2);
        CHECK(big.err.find("the conversation-state cache (--cache-mb 100000000) needs 100000000 MiB of host memory "
                           "beside the model's") != std::string::npos);
        CHECK(big.err.find("give a smaller --cache-mb (0: off)") != std::string::npos);
        CHECK(big.err.find("-np") == std::string::npos);  // (the advice for the model's arena)
        const hy::test::cli_util::Run ctx =
            run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "--port", "0", "-c", "2000000000", "-np", "2"});
        INFO(ctx.err);
        CHECK(ctx.rc == 2);
        CHECK(ctx.err.find("positions would fit, leaving a tenth of it free (so would more with fewer sequences)") !=
              std::string::npos);
    }
    // empty --api-key and --alias values are refused alike (-a '' was silently ignored)
    for (const char* opt : {"--api-key", "-a", "--chat-template-file", "--host"}) {
        const hy::test::cli_util::Run empty = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", opt, ""});
        INFO(opt << ": " << empty.err);
        CHECK(empty.rc == 1);
        CHECK(empty.err.find("must not be empty") != std::string::npos);
    }
    // a tokenizer token the model cannot embed is refused at load, as by hybrid (the server answered a prompt that
    // used it with a 500; hybrid-perplexity failed at the first such token of the text, exit 1)
    {
        hy::test::cli_util::TempDir tmp("server_vocab");
        const std::string dir = tmp.path.string();
        for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
            std::filesystem::copy_file(std::string(kSrc) + "/models/tiny/" + f, dir + "/" + f);
        nlohmann::json tok = nlohmann::json::parse(std::ifstream(std::string(kSrc) + "/models/tiny/tokenizer.json"));
        tok["added_tokens"].push_back({{"id", 5000}, {"content", "<zzqq>"}, {"special", true}});
        std::ofstream(dir + "/tokenizer.json") << tok.dump();
        const std::string msg = "tokenizer.json: token '<zzqq>' has id 4096 (the file gives it id 5000";
        const hy::test::cli_util::Run srv = run_prog(kBin + "/hybrid-server", {"-m", dir, "--port", "0"});
        INFO(srv.err);
        CHECK(srv.rc == 2);
        CHECK(srv.err.find(msg) != std::string::npos);
        const hy::test::cli_util::Run ppl =
            run_prog(kBin + "/hybrid-perplexity",
                     {"-m", dir, "-f", "tests/data/text/heldout.py", "--ctx", "256", "--device", "cpu"});
        INFO(ppl.err);
        CHECK(ppl.rc == 2);
        CHECK(ppl.err.find(msg) != std::string::npos);
    }
}

TEST_CASE("server: --api-key guards /v1", "[server]") {
    if (!have_server_binary()) return;
    ServerProcess s({"-np", "1", "--api-key", "sekret", "--cache-mb", "0"});
    const std::string body = ojson{{"prompt", "x"}, {"max_tokens", 2}}.dump();
    const Reply no = post(s.port(), "/v1/completions", body);
    CHECK(no.status == 401);
    CHECK(no.json()["error"]["type"] == "authentication_error");
    CHECK(post(s.port(), "/v1/completions", body, {{"Authorization", "Bearer sekret"}}).status == 200);
    CHECK(get(s.port(), "/health").status == 200);
    // hybrid-server-bench: without the key it names the 401 and the option (not "no n_vocab"); with it, it runs
    const std::string bench = kBin + "/hybrid-server-bench", port = std::to_string(s.port());
    const hy::test::cli_util::Run no_key = run_prog(bench, {"--port", port, "-c", "1", "-p", "4", "-n", "2"});
    CHECK(no_key.rc == 6);
    CHECK(no_key.err.find("GET /v1/models at 127.0.0.1:" + port + " answered HTTP 401") != std::string::npos);
    CHECK(no_key.err.find("(give the server's key with --api-key)") != std::string::npos);
    const hy::test::cli_util::Run with_key =
        run_prog(bench, {"--port", port, "-c", "1", "-p", "4", "-n", "2", "--api-key", "sekret"});
    INFO(with_key.out << with_key.err);
    CHECK(with_key.rc == 0);
    CHECK(with_key.out.find("| 1 | 1 | 0 | 4 | 2 |") != std::string::npos);
}

TEST_CASE("server: tool calls and reasoning are parsed from the output", "[server]") {
    using hy::server::OutputParser;
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                          "opts": {"type": "object"}}}}}])");
    struct Case {
        std::string text;
        bool in_think;
        std::string reasoning, content;
        std::vector<std::pair<std::string, std::string>> calls;
    };
    const std::vector<Case> cases = {
        {"Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Paris\"}}\n</tool_call>",
         false,
         "",
         "Let me check.",
         {{"get_weather", "{\"city\":\"Paris\"}"}}},
        {"<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n<parameter=opts>\n{\"metric\": true}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
         "<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>",
         false,
         "",
         "",
         {{"get_weather", "{\"city\":\"New York\",\"days\":3,\"opts\":{\"metric\":true}}"},
          {"get_weather", "{\"city\":\"42\"}"}}},
        {"I should look.\n</think>\n\nThe answer.", true, "I should look.", "The answer.", {}},
        {"<think>\nHmm.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
         false,
         "Hmm.",
         "",
         {{"get_weather", "{}"}}},
        {"No tools here, <tool_call> unclosed", false, "", "No tools here, <tool_call> unclosed", {}},
        {"Thinking that never ends", true, "Thinking that never ends", "", {}},
        {"<think>\nHmm.", true, "Hmm.", "", {}},  // the model repeats the prompt's opening tag: dropped
        {"<think><think><think>", true, "<think><think>", "", {}},  // (once: the others are text)
        // an opening tag of the model's own, then more of them: reasoning text (the answer came back empty)
        {"<think><think><think><think>", false, "<think><think><think>", "", {}},
    };
    for (const Case& c : cases) {
        INFO(c.text);
        for (size_t step : {size_t(1), size_t(3), c.text.size()}) {  // fed in pieces of `step` bytes
            OutputParser p(c.in_think, true, tools);
            std::string reasoning, content;
            for (size_t k = 0; k < c.text.size(); k += step) {
                const OutputParser::Delta d = p.feed(c.text.substr(k, step));
                reasoning += d.reasoning;
                content += d.content;
            }
            const OutputParser::Delta d = p.finish();
            reasoning += d.reasoning;
            content += d.content;
            CHECK(reasoning == c.reasoning);
            CHECK(content == c.content);
            REQUIRE(p.tool_calls().size() == c.calls.size());
            for (size_t k = 0; k < c.calls.size(); k++) {
                CHECK(p.tool_calls()[k].name == c.calls[k].first);
                CHECK(p.tool_calls()[k].arguments == c.calls[k].second);
            }
        }
    }
}

// models/tiny's tokenizer marks <think> and </think> special (as a Qwen3.5 checkpoint may mark the <tool_call>
// markers): decoded with skip_special they vanished, so no reasoning_content or tool_calls could be parsed out
// (from the fresh-user test). The chat output keeps the marker ids and still drops other specials.
TEST_CASE("server: <think> and <tool_call> markers survive decoding when the tokenizer marks them special",
          "[server]") {
    using hy::server::ChatFormat;
    using hy::server::OutputParser;
    const hy::Tokenizer tiny = hy::Tokenizer::from_folder(kSrc + "/models/tiny");
    const int32_t open = tiny.token_id("<think>"), close = tiny.token_id("</think>"), end = tiny.token_id("<|im_end|>");
    REQUIRE(tiny.is_special(open));
    REQUIRE(tiny.is_special(close));
    REQUIRE(tiny.is_special(end));
    const ChatFormat chat = ChatFormat::load(kSrc + "/models/tiny", tiny);
    CHECK(chat.marker_ids() == std::vector<int32_t>{open, close});
    auto decode = [](const hy::Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<int32_t>& keep) {
        hy::StreamDecoder dec(tok, true, keep);
        std::string text;
        for (int32_t id : ids) text += dec.push(id);
        return text + dec.flush();
    };
    auto ids_of = [](const hy::Tokenizer& tok, const std::vector<std::string>& parts) {
        std::vector<int32_t> ids;
        for (const std::string& p : parts) {
            const std::vector<int32_t> e = tok.encode(p);
            ids.insert(ids.end(), e.begin(), e.end());
        }
        return ids;
    };
    const std::vector<int32_t> answer =
        ids_of(tiny, {"<think>", "\nLet me see.\n", "</think>", "\n\nHello.", "<|im_end|>"});
    REQUIRE(std::count(answer.begin(), answer.end(), close) == 1);
    CHECK(decode(tiny, answer, {}) == "\nLet me see.\n\n\nHello.");  // the bug: the markers are gone
    const std::string text = decode(tiny, answer, chat.marker_ids());
    CHECK(text == "<think>\nLet me see.\n</think>\n\nHello.");  // markers kept, <|im_end|> still dropped
    OutputParser think(false, chat.has_think(), nullptr);
    OutputParser::Delta d = think.feed(text), rest = think.finish();
    CHECK(d.reasoning + rest.reasoning == "Let me see.");
    CHECK(d.content + rest.content == "Hello.");

    // A tokenizer with <tool_call> and </tool_call> as special added tokens (models/tiny's, extended).
    hy::test::cli_util::TempDir dir("special_markers");
    ojson tj = ojson::parse(hy::test::cli_util::slurp(kSrc + "/models/tiny/tokenizer.json"));
    const int32_t n = tiny.n_vocab();
    for (const int k : {0, 1})
        tj["added_tokens"].push_back(ojson{{"id", n + k},
                                           {"content", k == 0 ? "<tool_call>" : "</tool_call>"},
                                           {"single_word", false},
                                           {"lstrip", false},
                                           {"rstrip", false},
                                           {"normalized", false},
                                           {"special", true}});
    std::ofstream(dir.path / "tokenizer.json") << tj.dump();
    std::filesystem::copy_file(kSrc + "/models/tiny/tokenizer_config.json", dir.path / "tokenizer_config.json");
    const hy::Tokenizer tok = hy::Tokenizer::from_folder(dir.path.string());
    const int32_t call_open = tok.token_id("<tool_call>"), call_close = tok.token_id("</tool_call>");
    REQUIRE(call_open == n);
    REQUIRE(call_close == n + 1);
    REQUIRE(tok.is_special(call_open));
    const ChatFormat with_tools = ChatFormat::load(dir.path.string(), tok);
    CHECK(with_tools.marker_ids() == std::vector<int32_t>{open, close, call_open, call_close});
    const std::vector<int32_t> call =
        ids_of(tok, {"Checking.\n", "<tool_call>", "\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n", "</tool_call>",
                     "<|im_end|>"});
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
    OutputParser p(false, true, tools);
    d = p.feed(decode(tok, call, with_tools.marker_ids()));
    rest = p.finish();
    CHECK(d.content + rest.content == "Checking.");
    REQUIRE(p.tool_calls().size() == 1);
    CHECK(p.tool_calls()[0].name == "f");
    CHECK(p.tool_calls()[0].arguments == "{\"x\":1}");

    // End to end: generation inside the opened think block, </think> forced by logit_bias. Its text closes the
    // (empty) reasoning and the second one is content, streamed or not; before, the text was empty.
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    ojson req{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "Hi"}}})},
              {"max_tokens", 2},
              {"temperature", 0},
              {"chat_template_kwargs", {{"enable_thinking", true}}},
              {"logit_bias", {{std::to_string(close), 100}}}};
    const Reply r = post(port, "/v1/chat/completions", req);
    REQUIRE(r.status == 200);
    const ojson msg = r.json()["choices"][0]["message"];
    INFO(msg.dump());
    CHECK(msg["content"] == "</think>");
    CHECK_FALSE(msg.contains("reasoning_content"));
    req["stream"] = true;
    std::string streamed;
    for (const ojson& ev : events(post(port, "/v1/chat/completions", req).body))
        if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content"))
            streamed += ev["choices"][0]["delta"]["content"].get<std::string>();
    CHECK(streamed == "</think>");
}

TEST_CASE("server: a model folder's Jinja chat template renders the prompt; tools and enable_thinking", "[server]") {
    if (!have_server_binary()) return;
    // models/tiny with Qwen3's chat template in its tokenizer_config.json
    hy::test::cli_util::TempDir dir("server_jinja");
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
        std::filesystem::create_symlink(kSrc + "/models/tiny/" + f, dir.path / f);
    ojson config = ojson::parse(hy::test::cli_util::slurp(kSrc + "/models/tiny/tokenizer_config.json"));
    const ojson qwen3 =
        ojson::parse(hy::test::cli_util::slurp(kSrc + "/tests/data/tokenizers/qwen3/tokenizer_config.json"));
    config["chat_template"] = qwen3["chat_template"];
    std::ofstream(dir.path / "tokenizer_config.json") << config.dump();
    ServerProcess s({"-m", dir.path.string(), "-np", "2"});  // (in place of the default -m)
    const hy::Tokenizer tok = hy::Tokenizer::from_folder(dir.path.string());
    const hy::server::ChatFormat chat = hy::server::ChatFormat::load(dir.path.string(), tok);
    CHECK(chat.description() == "jinja (tokenizer_config.json)");
    const ojson models = get(s.port(), "/v1/models").json();
    CHECK(models["data"][0]["meta"]["chat_template"] == "jinja (tokenizer_config.json)");
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
    const ojson msgs =
        ojson::array({ojson{{"role", "system"}, {"content", "Be brief."}}, ojson{{"role", "user"}, {"content", "Hi"}}});
    for (const bool think : {true, false}) {
        for (const bool with_tools : {false, true}) {
            ojson req{{"messages", msgs}, {"max_tokens", 4}, {"temperature", 0}};
            if (!think) req["chat_template_kwargs"] = ojson{{"enable_thinking", false}};
            if (with_tools) req["tools"] = tools;
            const Reply r = post(s.port(), "/v1/chat/completions", req);
            REQUIRE(r.status == 200);
            const std::string text = chat.render(msgs, with_tools ? tools : ojson(nullptr), true,
                                                 think ? ojson::object() : req["chat_template_kwargs"]);
            INFO("think " << think << " tools " << with_tools << ": " << text);
            CHECK(text.find(with_tools ? "# Tools" : "<|im_start|>system\nBe brief.<|im_end|>") != std::string::npos);
            CHECK((text.find("<think>\n\n</think>") != std::string::npos) == !think);
            CHECK(r.json()["usage"]["prompt_tokens"].get<size_t>() == tok.encode(text).size());
        }
    }
    // an assistant message that carries tool calls may leave its content out or null, and the calls are shown
    for (const char* content : {"", R"("content": null, )"}) {
        const std::string body = std::string(R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"},
            {"role": "assistant", )") +
                                 content + R"("tool_calls": [{"id": "c0", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]}, {"role": "user", "content": "y"}]})";
        INFO(body);
        const Reply r = post(s.port(), "/v1/chat/completions", body);
        CHECK(r.status == 200);
        ojson msgs2 = ojson::parse(body)["messages"];
        msgs2[1]["content"] = "";
        msgs2[1]["tool_calls"][0]["function"]["arguments"] = ojson::object();
        const std::string text = chat.render(msgs2, ojson::array(), true, ojson::object());
        CHECK(text.find("<tool_call>") != std::string::npos);
        CHECK(r.json()["usage"]["prompt_tokens"].get<size_t>() == tok.encode(text).size());
    }
}

TEST_CASE("server: message content: required but with tool calls, no NUL bytes; n and best_of of 1", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    auto error = [&](const std::string& body) {
        const Reply r = post(port, "/v1/chat/completions", body);
        CHECK(r.status == 400);
        return r.json()["error"]["message"].get<std::string>();
    };
    CHECK(error(R"({"messages": [{"role": "system", "content": "x"}, {"role": "user"}]})") ==
          "messages[1].content is missing (only an assistant message with tool_calls may leave it out)");
    CHECK(error(R"({"messages": [{"role": "user", "content": null}]})").find("messages[0].content is null") == 0);
    // tool_calls that are not a list are named as such (it was "content is missing")
    CHECK(error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "bad"}]})") ==
          "messages[1].tool_calls must be a list");
    CHECK(error(R"({"messages": [{"role": "user", "content": "a\u0000b"}]})") ==
          "messages[0].content contains a NUL byte");
    // enable_thinking is a boolean: a string such as "no" was taken as true
    CHECK(
        error(
            R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}})") ==
        "chat_template_kwargs.enable_thinking must be true or false, not string");
    // OpenAI's deprecated function-calling fields are refused by name (they were ignored: no function reached the
    // prompt)
    CHECK(error(R"({"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]})") ==
          "functions is the deprecated form of tools: send that instead");
    CHECK(error(R"({"messages": [{"role": "user", "content": "x"}], "function_call": "auto"})") ==
          "function_call is the deprecated form of tool_choice: send that instead");
    CHECK(error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
        "function_call": {"name": "f", "arguments": "{}"}}]})") ==
          "messages[1].function_call is the deprecated form of tool_calls: send that instead");
    // tool calls need the model's chat template (models/tiny has none: the built-in ChatML dropped them silently;
    // with a template they are taken: the Jinja test case below)
    CHECK(error(R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}, {"role": "assistant",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "y"}]})") ==
          "messages[1].tool_calls need the model's chat template (the built-in ChatML cannot show tool calls; "
          "--chat-template-file)");
    // n = 1 and best_of = 1 are accepted; more choices are refused as unsupported
    CHECK(post(port, "/v1/completions", ojson{{"prompt", "x"}, {"max_tokens", 2}, {"n", 1}, {"best_of", 1}}).status ==
          200);
    const Reply two = post(port, "/v1/chat/completions",
                           ojson{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "x"}}})}, {"n", 2}});
    CHECK(two.status == 400);
    CHECK(two.json()["error"]["message"].get<std::string>().find("not supported") != std::string::npos);
}

TEST_CASE("server: logit_bias moves greedy and sampled picks", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    const hy::Tokenizer tok = hy::Tokenizer::from_folder(kSrc + "/models/tiny");
    const std::vector<int32_t> ret = tok.encode("return");
    REQUIRE(ret.size() == 1);
    const std::string piece = tok.token_piece(ret[0]);
    const ojson golden = ojson::parse(hy::test::cli_util::slurp(kSrc + "/models/tiny/golden.json"));
    ojson c;
    for (const ojson& g : golden["cases"])
        if (g["name"] == "short") c = g;
    REQUIRE(c.is_object());
    const auto greedy = c["greedy_fp32_cpu"].get<std::vector<int32_t>>();
    auto tokens = [&](const ojson& extra) {
        ojson req{{"prompt", c["input_ids"]}, {"max_tokens", 4}, {"ignore_eos", true}, {"logprobs", 0}};
        req.update(extra);
        const Reply r = post(port, "/v1/completions", req);
        REQUIRE(r.status == 200);
        return r.json()["choices"][0]["logprobs"]["tokens"].get<std::vector<std::string>>();
    };
    const std::string first = tok.token_piece(greedy[0]);
    REQUIRE(first != piece);
    CHECK(tokens(ojson{{"temperature", 0}})[0] == first);
    // -100 on the greedy id: another comes first; +100 on "return": it comes every time, greedy or sampled
    CHECK(tokens(ojson{{"temperature", 0}, {"logit_bias", {{std::to_string(greedy[0]), -100}}}})[0] != first);
    for (const ojson& sampling : {ojson{{"temperature", 0}}, ojson{{"temperature", 1.0}, {"seed", 3}, {"top_k", 0}}}) {
        ojson extra = sampling;
        extra["logit_bias"] = {{std::to_string(ret[0]), 100}};
        INFO(extra.dump());
        CHECK(tokens(extra) == std::vector<std::string>(4, piece));
    }
    // and through the chat endpoint, streamed
    const ojson chat{{"messages", ojson::array({ojson{{"role", "user"}, {"content", "Hi"}}})},
                     {"max_tokens", 3},
                     {"temperature", 0},
                     {"stream", true},
                     {"chat_template_kwargs", {{"enable_thinking", false}}},  // (content, not reasoning)
                     {"logit_bias", {{std::to_string(ret[0]), 100}}}};
    std::string text;
    for (const ojson& ev : events(post(port, "/v1/chat/completions", chat).body))
        if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content"))
            text += ev["choices"][0]["delta"]["content"].get<std::string>();
    CHECK(text == piece + piece + piece);
    // a chat answer ends where the model starts a new turn (<|im_start|>), as the CLI's --chat; a plain completion
    // does not
    const int32_t im_start = tok.token_id("<|im_start|>");
    REQUIRE(im_start >= 0);
    ojson forced = chat;
    forced["stream"] = false;
    forced["max_tokens"] = 4;
    forced["logit_bias"] = {{std::to_string(im_start), 100}};
    const Reply r = post(port, "/v1/chat/completions", forced);
    REQUIRE(r.status == 200);
    CHECK(r.json()["choices"][0]["finish_reason"] == "stop");
    CHECK(r.json()["choices"][0]["message"]["content"] == "");
    CHECK(r.json()["usage"]["completion_tokens"] == 1);
    const Reply rc = post(
        port, "/v1/completions",
        ojson{
            {"prompt", "x"}, {"max_tokens", 3}, {"temperature", 0}, {"logit_bias", {{std::to_string(im_start), 100}}}});
    REQUIRE(rc.status == 200);
    CHECK(rc.json()["choices"][0]["finish_reason"] == "length");
    CHECK(rc.json()["usage"]["completion_tokens"] == 3);
}

TEST_CASE("server: a POST body is JSON whatever its content type, up to 64 MiB", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    // 100 KB of JSON (a long "user" field) as a form, as plain text and without a content type
    const ojson req{{"prompt", kCode}, {"max_tokens", 6}, {"temperature", 0}, {"user", std::string(100000, 'u')}};
    const std::string body = req.dump();
    const Reply as_json = post(port, "/v1/completions", body);
    REQUIRE(as_json.status == 200);
    const std::string want = as_json.json()["choices"][0]["text"];
    for (const char* type : {"application/x-www-form-urlencoded", "text/plain"}) {
        httplib::Client cli("127.0.0.1", port);
        cli.set_read_timeout(300, 0);
        auto r = cli.Post("/v1/completions", body, type);
        REQUIRE(r);
        INFO(type << ": " << r->body.substr(0, 200));
        CHECK(r->status == 200);
        CHECK(ojson::parse(r->body)["choices"][0]["text"] == want);
    }
    const std::string no_type =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = raw_send(port, no_type);
    std::string raw;
    CHECK(raw_read(fd, &raw, "", 120));
    close(fd);
    const Reply untyped = parse_raw_response(raw);
    CHECK(untyped.status == 200);
    CHECK(untyped.json()["choices"][0]["text"] == want);
    // past 64 MiB: 413 with OpenAI's error JSON
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(300, 0);
    auto big = cli.Post("/v1/completions", std::string((size_t(64) << 20) + 1, ' '), "application/json");
    REQUIRE(big);
    CHECK(big->status == 413);
    const ojson e = ojson::parse(big->body, nullptr, false);
    REQUIRE(e.is_object());
    CHECK(e["error"]["code"] == "request_too_large");
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("server: CORS preflight and headers", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    httplib::Client cli("127.0.0.1", port);
    auto pre = cli.Options("/v1/chat/completions", {{"Origin", "http://localhost:3000"},
                                                    {"Access-Control-Request-Method", "POST"},
                                                    {"Access-Control-Request-Headers", "authorization, content-type"}});
    REQUIRE(pre);
    CHECK(pre->status == 204);
    CHECK(pre->get_header_value("Access-Control-Allow-Origin") == "*");
    CHECK(pre->get_header_value("Access-Control-Allow-Methods") == "POST, OPTIONS");  // (GET there is a 405)
    CHECK(pre->get_header_value("Access-Control-Allow-Headers") == "authorization, content-type");
    auto plain = cli.Options("/v1/models", {{"Origin", "http://localhost:3000"}});
    REQUIRE(plain);
    CHECK(plain->status == 204);
    CHECK(plain->get_header_value("Access-Control-Allow-Headers") == "Authorization, Content-Type");
    CHECK(plain->get_header_value("Access-Control-Allow-Methods") == "GET, HEAD, OPTIONS");
    auto nowhere = cli.Options("/v1/embeddings", {{"Origin", "http://localhost:3000"}});
    REQUIRE(nowhere);
    CHECK(nowhere->status == 404);
    // the answers themselves allow any origin too, errors included
    auto models = cli.Get("/v1/models", {{"Origin", "http://localhost:3000"}});
    REQUIRE(models);
    CHECK(models->get_header_value("Access-Control-Allow-Origin") == "*");
    auto bad = cli.Post("/v1/completions", {{"Origin", "http://localhost:3000"}}, "{}", "application/json");
    REQUIRE(bad);
    CHECK(bad->status == 400);
    CHECK(bad->get_header_value("Access-Control-Allow-Origin") == "*");
}

TEST_CASE("server: a second server on a port in use fails with exit code 6", "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    // (timeout: a server that did bind would serve until killed)
    const auto r = run_prog("/usr/bin/timeout", {"60", kBin + "/hybrid-server", "-m", "models/tiny", "--device", "cpu",
                                                 "-c", "64", "-np", "1", "--port", std::to_string(port)});
    INFO(r.err);
    CHECK(r.rc == 6);
    CHECK(r.err.rfind("hybrid-server: cannot listen on 127.0.0.1:" + std::to_string(port) + ": ", 0) == 0);
    CHECK(r.err.find("already in use") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(get(port, "/health").status == 200);
}

TEST_CASE("server: a bad --chat-template-file fails at start; -c 0 is the trained context", "[server]") {
    if (!have_server_binary()) return;
    hy::test::cli_util::TempDir dir("server_template");
    const std::string unparsable = (dir.path / "bad.jinja").string(), failing = (dir.path / "raise.jinja").string();
    std::ofstream(unparsable) << "{% for m in messages %}{{ m.content }}";
    std::ofstream(failing) << "{{ raise_exception('this template refuses every conversation') }}";
    // an empty file and text that is no template rendered every request as empty or constant text (the fresh-user
    // test of the twenty-third session: the server started, then answered each chat request with a 400)
    const std::string empty = (dir.path / "empty.jinja").string(), constant = (dir.path / "constant.jinja").string();
    std::ofstream(empty) << "\n";
    std::ofstream(constant) << "Hello {% for m in messages %}{% endfor %}\n";  // (the check looked for "Hello")
    struct Case {
        std::string file, needle;
    };
    for (const Case& c :
         {Case{(dir.path / "missing.jinja").string(), "missing.jinja"}, Case{unparsable, "bad.jinja"},
          Case{failing, "refuses every conversation"}, Case{empty, "renders a one-message conversation as empty text"},
          Case{constant, "leaves the message out of a one-message conversation"}}) {
        const auto r = run_prog("/usr/bin/timeout", {"60", kBin + "/hybrid-server", "-m", "models/tiny", "--device",
                                                     "cpu", "--port", "0", "--chat-template-file", c.file});
        INFO(r.err);
        CHECK(r.rc == 2);
        CHECK(r.err.rfind("hybrid-server: ", 0) == 0);
        CHECK(r.err.find(c.needle) != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
    const auto one = run_prog(kBin + "/hybrid-server", {"-m", "models/tiny", "-c", "1"});
    CHECK(one.rc == 1);
    CHECK(one.err.find("-c must be 0") != std::string::npos);
    const auto help = run_prog(kBin + "/hybrid-server", {"-h"});
    CHECK(help.rc == 0);
    CHECK(help.out.find("Exit codes:\n  0    stopped by SIGTERM\n") != std::string::npos);
    CHECK(help.out.find("  130  stopped by SIGINT (Ctrl-C)\n") != std::string::npos);
    // --help and --version on a full stdout: exit 5 and the reason (they exited 0 with nothing on stderr)
    if (std::filesystem::exists("/dev/full"))
        for (const char* flag : {"--help", "--version"}) {
            INFO(flag);
            const std::string err = (std::filesystem::temp_directory_path() / "hy_server_full.err").string();
            const std::string cmd = hy::test::cli_util::quote(kBin + "/hybrid-server") + " " + flag + " >/dev/full 2>" +
                                    hy::test::cli_util::quote(err);
            const int st = std::system(cmd.c_str());
            CHECK((WIFEXITED(st) ? WEXITSTATUS(st) : -1) == 5);
            std::ifstream f(err);
            const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            CHECK(text == "hybrid-server: cannot write to stdout: No space left on device\n");
            std::filesystem::remove(err);
        }
    // -c 0: config.json's max_position_embeddings
    ServerProcess s({"-c", "0", "-np", "1", "--cache-mb", "0"});
    const ojson models = get(s.port(), "/v1/models").json();
    CHECK(models["data"][0]["meta"]["n_ctx"] == 32768);
}

// --no-cuda-graphs on the CPU: a note at startup that it is ignored, as hybrid-bench and hybrid-compare print (it was
// silent); the server still starts.
TEST_CASE("server: --no-cuda-graphs on the CPU is noted as ignored", "[server]") {
    if (!have_server_binary()) return;
    const std::string note = "hybrid-server: note: --no-cuda-graphs only changes the CUDA backend; ignored on cpu\n";
    ServerProcess with({"--no-cuda-graphs", "-np", "1", "--cache-mb", "0"});
    INFO(with.startup_log());
    CHECK(with.startup_log().find(note) != std::string::npos);
    CHECK(with.stop(SIGTERM) == 0);
    ServerProcess without({"-np", "1", "--cache-mb", "0"});
    CHECK(without.startup_log().find("note:") == std::string::npos);
    CHECK(without.stop(SIGTERM) == 0);
}

TEST_CASE("server: a stream cut by a shutdown ends with a finish_reason and [DONE]", "[server]") {
    if (!have_server_binary()) return;
    // (models/tiny makes thousands of ids a second on a CPU: the context is its longest)
    ServerProcess s({"-np", "2", "-c", "32768", "--cache-mb", "0"});
    // two long streams (completion and chat) and a request that is not streamed
    const int max_tokens = 32000;
    const ojson comp{{"prompt", kCode},  {"max_tokens", max_tokens}, {"ignore_eos", true},
                     {"temperature", 0}, {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    ojson chat = comp;
    chat.erase("prompt");
    chat["messages"] = ojson::array({ojson{{"role", "user"}, {"content", "Write a long program."}}});
    auto request = [](const std::string& path, const ojson& body) {
        return "POST " + path +
               " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n" +
               "Content-Length: " + std::to_string(body.dump().size()) + "\r\n\r\n" + body.dump();
    };
    const int fd_comp = raw_send(s.port(), request("/v1/completions", comp));
    const int fd_chat = raw_send(s.port(), request("/v1/chat/completions", chat));
    std::string raw_comp, raw_chat;
    REQUIRE(raw_read(fd_comp, &raw_comp, "\"text\"", 60));  // (a generated piece has come)
    REQUIRE(raw_read(fd_chat, &raw_chat, "data: ", 60));
    ojson plain = comp;
    plain["stream"] = false;
    plain.erase("stream_options");  // (a 400 without streaming)
    const int fd_plain = raw_send(s.port(), request("/v1/completions", plain));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(s.stop(SIGTERM) == 0);
    std::string raw_plain;
    const std::vector<std::pair<int, std::string*>> reads = {
        {fd_comp, &raw_comp}, {fd_chat, &raw_chat}, {fd_plain, &raw_plain}};
    for (const auto& [fd, raw] : reads) {
        CHECK(raw_read(fd, raw, "", 30));
        close(fd);
    }
    for (const std::string* raw : {&raw_comp, &raw_chat}) {
        const Reply r = parse_raw_response(*raw);
        CHECK(r.status == 200);
        const std::vector<ojson> evs = events(r.body);  // (checks that [DONE] comes last)
        INFO(r.body.substr(r.body.size() > 400 ? r.body.size() - 400 : 0));
        ojson last, usage;
        for (const ojson& ev : evs) {
            if (!ev["choices"].empty()) last = ev;
            if (ev.contains("usage")) usage = ev["usage"];
        }
        REQUIRE(last.is_object());
        CHECK(last["choices"][0]["finish_reason"] == "length");
        REQUIRE(usage.is_object());  // (and the generation was cut, not finished)
        CHECK(usage["completion_tokens"].get<int>() < max_tokens);
    }
    const Reply r = parse_raw_response(raw_plain);
    CHECK(r.status == 503);
    CHECK(r.json()["error"]["message"].get<std::string>().find("shutting down") != std::string::npos);
}

// hybrid-server-bench (from the fresh-user test): usage errors exit 1 with one line, numbers are read strictly, a
// server that is not there is named, failed requests are counted in the table and make the exit code 6, the prompt
// ids come from the server's n_vocab (the tiny model's 4096 ids: the old fixed 150000 failed every request), turns
// are numbered from 1 and a run stops at its first failed turn.
TEST_CASE("hybrid-server-bench: arguments, an absent server, failed requests, multi-turn", "[server]") {
    const std::string bench = kBin + "/hybrid-server-bench";
    if (!std::filesystem::exists(bench)) return;
    auto one_line = [](const hy::test::cli_util::Run& r, int code, const std::string& needle) {
        INFO(r.err);
        CHECK(r.rc == code);
        CHECK(r.err.rfind("hybrid-server-bench: ", 0) == 0);
        CHECK(r.err.find(needle) != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    };
    const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
        {{"-p", "12abc"}, "invalid value '12abc' for --prompt"},
        {{"-n", "-3"}, "for --new"},
        {{"-n", "0"}, "for --new"},
        {{"-r", "0"}, "for --rounds (an integer in [1, 1024])"},
        {{"-r", "1025"}, "for --rounds"},
        {{"-c", "1,0"}, "invalid value '0' in --clients"},
        {{"-c", "1025"}, "invalid value '1025' in --clients"},
        {{"-c", "4x"}, "invalid value '4x' in --clients"},
        {{"-c", ""}, "in --clients"},
        {{"--vocab", "-1"}, "for --vocab"},
        {{"--vocab", "1"}, "for --vocab"},
        {{"--port", "70000"}, "for --port"},
        {{"--turns", "2.5"}, "for --turns"},
        {{"--turn-text", "0"}, "for --turn-text"},
        {{"--frobnicate"}, "unknown option --frobnicate"},
        {{"stray"}, "unexpected argument 'stray'"},
        {{"-p", "4", "-p", "5"}, "more than once"},
    };
    for (const auto& [args, needle] : bad) {
        INFO(args[0]);
        one_line(run_prog(bench, args), 1, needle);
    }
    // a port nobody listens on (taken and given back)
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    const std::string free_port = std::to_string(ntohs(a.sin_port));
    close(fd);
    one_line(run_prog(bench, {"--port", free_port, "-c", "1", "-p", "4", "-n", "2"}), 6,
             "cannot connect to 127.0.0.1:" + free_port);

    if (!have_server_binary()) return;
    const std::string port = std::to_string(shared_server().port());
    // the server reports its n_vocab, which the bench takes by default
    const ojson meta = get(shared_server().port(), "/v1/models").json()["data"][0]["meta"];
    CHECK(meta["n_vocab"] == 4096);
    CHECK(meta["quant"] == "none");  // (and the weights as loaded: models/tiny is BF16)
    CHECK(meta["quant_lm_head"] == false);
    CHECK(meta["quant_group"] == 0);
    CHECK(meta["weights"].get<std::string>().find("BF16") != std::string::npos);
    const hy::test::cli_util::Run ok = run_prog(bench, {"--port", port, "-c", "1,2", "-p", "8", "-n", "2"});
    INFO(ok.out << ok.err);
    CHECK(ok.rc == 0);
    CHECK(ok.out.find("| clients | requests | failed | prompt |") != std::string::npos);
    CHECK(ok.out.find("| 1 | 1 | 0 | 8 | 2 |") != std::string::npos);
    CHECK(ok.out.find("| 2 | 2 | 0 | 8 | 2 |") != std::string::npos);
    // ids past the model's vocabulary: every request fails (400), counted, exit 6, one line per wave
    const hy::test::cli_util::Run fails =
        run_prog(bench, {"--port", port, "-c", "2", "-r", "2", "-p", "8", "-n", "2", "--vocab", "100000"});
    INFO(fails.out << fails.err);
    CHECK(fails.rc == 6);
    CHECK(fails.out.find("| 2 | 4 | 4 | 8 | 2 |") != std::string::npos);
    CHECK(fails.err.find("2 clients: 4 of 4 requests failed; the first: HTTP 400") != std::string::npos);
    CHECK(std::count(fails.err.begin(), fails.err.end(), '\n') == 1);
    // multi-turn: turns from 1; with long messages the second turn outgrows the context (-c 512) in both runs,
    // which stop there (no turn 3)
    const hy::test::cli_util::Run turns =
        run_prog(bench, {"--port", port, "--turns", "2", "-n", "2", "--turn-text", "4"});
    INFO(turns.out << turns.err);
    CHECK(turns.rc == 0);
    CHECK(turns.out.find("| turn | failed |") != std::string::npos);
    CHECK(turns.out.find("\n| 1 | 0 | ") != std::string::npos);
    CHECK(turns.out.find("\n| 2 | 0 | ") != std::string::npos);
    CHECK(turns.out.find("\n| 0 |") == std::string::npos);
    const hy::test::cli_util::Run cut =
        run_prog(bench, {"--port", port, "--turns", "4", "-n", "2", "--turn-text", "120"});
    INFO(cut.out << cut.err);
    CHECK(cut.rc == 6);
    CHECK(cut.out.find("\n| 1 | 0 | ") != std::string::npos);
    CHECK(cut.out.find("\n| 2 | 2 | - | - | - | - | - | - |") != std::string::npos);
    CHECK(cut.out.find("\n| 3 |") == std::string::npos);
    CHECK(cut.err.find("turn 2 (cache off):") != std::string::npos);
    CHECK(cut.err.find("turn 2 (cache on):") != std::string::npos);
    CHECK(cut.err.find("turn 3") == std::string::npos);
}

TEST_CASE("server: idle and slow clients do not hold the others; a request that comes too slowly gets 408",
          "[server]") {
    if (!have_server_binary()) return;
    // short deadlines, so that the test sees them pass; the clients below outnumber the fixed pool of 32 workers
    // that the HTTP library had (each held one until its client sent a whole request or went away)
    ServerProcess s({"-np", "1", "--cache-mb", "0", "--idle-timeout", "3", "--request-timeout", "3"});
    const int port = s.port();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int> idle, slow;
    for (int i = 0; i < 40; i++) idle.push_back(raw_send(port, ""));
    for (int i = 0; i < 40; i++) slow.push_back(raw_send(port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
    // a body that stops short of its Content-Length, a request line that never ends, and headers sent a byte every
    // 100 ms (each byte comes in time; the whole request does not)
    const int short_body =
        raw_send(port, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"prompt\"");
    const int no_line = raw_send(port, "POST /v1/compl");
    const int trickle = raw_send(port, "POST /v1/completions HTTP/1.1\r\nX-Pad: ");
    std::atomic<bool> trickling{true};
    std::thread trickler([&] {
        for (int i = 0; i < 100 && trickling; i++) {
            if (send(trickle, "a", 1, MSG_NOSIGNAL) != 1) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    struct JoinOnExit {
        std::atomic<bool>& flag;
        std::thread& t;
        ~JoinOnExit() {
            flag = false;
            if (t.joinable()) t.join();
        }
    } join_on_exit{trickling, trickler};
    // every one of them is served at once (the metrics request is one more), and a request still gets its answer
    // at once
    CHECK(wait_for([&] { return metric(port, "hybrid_http_connections") >= 84; }, 2));
    const Reply r = post(port, "/v1/completions", ojson{{"prompt", kCode}, {"max_tokens", 4}, {"temperature", 0}});
    CHECK(r.status == 200);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took < 2.0);  // (before any deadline closed a connection)
    // each request that did not come whole in 3 s: 408 with OpenAI's error JSON, and the connection closed
    std::vector<int> late = slow;
    late.insert(late.end(), {short_body, no_line, trickle});
    int n_408 = 0;
    for (int fd : late) {
        std::string raw;
        CHECK(raw_read(fd, &raw, "", 10));  // (until the server closes)
        INFO(raw);
        const Reply e = parse_raw_response(raw);
        n_408 += e.status == 408;
        CHECK(raw.find("Connection: close\r\n") != std::string::npos);
        const ojson j = ojson::parse(e.body, nullptr, false);
        REQUIRE(j.is_object());
        CHECK(j["error"]["message"].get<std::string>().find("did not arrive in time") != std::string::npos);
    }
    CHECK(n_408 == int(late.size()));
    const double closed_at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(closed_at > 2.9);
    CHECK(closed_at < 8);
    // the idle ones are closed without an answer
    for (int fd : idle) {
        std::string raw;
        CHECK(raw_read(fd, &raw, "", 5));
        CHECK(raw.empty());
    }
    trickling = false;
    trickler.join();
    for (int fd : late) close(fd);
    for (int fd : idle) close(fd);
    // (a connection closed after a 408 waits a moment for its client to close too)
    CHECK(wait_for([&] { return metric(port, "hybrid_http_connections") == 1; }, 5));
}

TEST_CASE("server: a burst of connects is queued, not dropped (listen backlog)", "[server]") {
    if (!have_server_binary()) return;
    ServerProcess s({"-np", "1", "--cache-mb", "0"});
    // While the server is stopped (SIGSTOP), the kernel alone completes handshakes, into the listen queue: with the
    // library's backlog of 5, the connects past the 6th would wait for a SYN retransmission (1 s, then 3 s, ...).
    s.signal(SIGSTOP);
    struct ContinueOnExit {
        ServerProcess& s;
        ~ContinueOnExit() { s.signal(SIGCONT); }
    } cont{s};
    const int n = 64;
    std::vector<int> fds;
    for (int i = 0; i < n; i++) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        REQUIRE(fd >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(s.port()));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const int r = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
        REQUIRE((r == 0 || errno == EINPROGRESS));
        fds.push_back(fd);
    }
    int established = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(700);
    std::vector<bool> done(n, false);
    while (established < n && std::chrono::steady_clock::now() < end) {
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            pollfd p{fds[i], POLLOUT, 0};
            if (poll(&p, 1, 0) == 1) {
                int err = -1;
                socklen_t len = sizeof err;
                getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len);
                CHECK(err == 0);
                done[i] = true;
                established++;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    s.signal(SIGCONT);
    CHECK(established == n);
    // and each is served once the server runs again
    int ok = 0;
    for (int fd : fds) {
        fcntl(fd, F_SETFL, 0);
        const std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        REQUIRE(write(fd, req.data(), req.size()) == ssize_t(req.size()));
    }
    for (int fd : fds) {
        std::string raw;
        if (raw_read(fd, &raw, "", 20) && parse_raw_response(raw).status == 200) ok++;
        close(fd);
    }
    CHECK(ok == n);
}

TEST_CASE("server: SIGTERM answers the requests in flight at once; a second signal exits at once", "[server]") {
    if (!have_server_binary()) return;
    auto request = [](const std::string& path, const ojson& body) {
        return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
               "Content-Length: " + std::to_string(body.dump().size()) + "\r\n\r\n" + body.dump();
    };
    {
        ServerProcess s({"-np", "2", "-c", "32768", "--cache-mb", "0"});
        const int port = s.port();
        // a long stream and a long request that is not streamed
        const ojson plain_req{{"prompt", kCode}, {"max_tokens", 32000}, {"ignore_eos", true}, {"temperature", 0}};
        ojson stream_req = plain_req;
        stream_req["stream"] = true;
        const int streamed = raw_send(port, request("/v1/completions", stream_req));
        const int plain = raw_send(port, request("/v1/completions", plain_req));
        std::string raw_stream, raw_plain;
        REQUIRE(raw_read(streamed, &raw_stream, "\"text\"", 60));
        CHECK(wait_for([&] { return metric(port, "hybrid_slots_busy") == 2; }, 20));
        const auto t0 = std::chrono::steady_clock::now();
        s.signal(SIGTERM);
        CHECK(raw_read(plain, &raw_plain, "", 5));
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(took < 1.0);
        const Reply r = parse_raw_response(raw_plain);
        CHECK(r.status == 503);
        CHECK(r.json()["error"]["type"] == "server_error");
        CHECK(raw_read(streamed, &raw_stream, "data: [DONE]", 5));
        CHECK(s.wait_exit(5) == 0);
        const double exited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(exited < 2.0);
        close(plain);
        close(streamed);
    }
    {
        // A forward step cannot be cut: one that prefills 16000 ids (-b 32768) takes seconds, and the first signal's
        // drain waits for it. A second signal ends the process at once (130 for SIGINT).
        ServerProcess s({"-np", "1", "-c", "32768", "-b", "32768", "--cache-mb", "0"});
        ojson ids = ojson::array();
        for (int i = 0; i < 16000; i++) ids.push_back(100 + i % 50);
        const int fd = raw_send(s.port(), request("/v1/completions", ojson{{"prompt", ids}, {"max_tokens", 1}}));
        CHECK(wait_for([&] { return metric(s.port(), "hybrid_requests_waiting") == 1; }, 20));
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (the step has started)
        s.signal(SIGTERM);
        CHECK(s.wait_exit(0.5) == -2);
        const auto t0 = std::chrono::steady_clock::now();
        s.signal(SIGINT);
        CHECK(s.wait_exit(2) == 130);
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(took < 1.0);
        close(fd);
    }
}

TEST_CASE("server: HTTP details: 411, 405 with Allow, /v1/models/{id}, the library's errors as JSON, max_tokens",
          "[server]") {
    if (!have_server_binary()) return;
    const int port = shared_server().port();
    auto raw_reply = [&](const std::string& request, std::string* raw_out = nullptr) {
        const int fd = raw_send(port, request);
        std::string raw;
        CHECK(raw_read(fd, &raw, "", 10));  // (the server closes the connection: each of these has Connection: close)
        close(fd);
        if (raw_out) *raw_out = raw;
        INFO(raw);
        return parse_raw_response(raw);
    };
    auto error_of = [](const Reply& r) {
        const ojson j = ojson::parse(r.body, nullptr, false);
        REQUIRE(j.is_object());
        REQUIRE(j["error"].is_object());
        CHECK(!j["error"]["message"].get<std::string>().empty());
        return j["error"];
    };
    // a POST without a length
    std::string raw;
    Reply r = raw_reply("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", &raw);
    CHECK(r.status == 411);
    CHECK(error_of(r)["code"] == "length_required");
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    // a body too long is refused before it is sent
    // (however many digits: a length past 2^64 was "malformed", 400)
    for (const char* length : {"100000000000", "123456789012345678901234567890"}) {
        r = raw_reply(
            std::string("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ") + length + "\r\n\r\n{",
            &raw);
        CHECK(r.status == 413);
        CHECK(error_of(r)["code"] == "request_too_large");
        CHECK(raw.find("Connection: close\r\n") != std::string::npos);
        CHECK(raw.find("Keep-Alive:") == std::string::npos);
    }
    // a Content-Length that is not a decimal byte count: 400 at once (the library read "-5" as huge, "abc" as 0)
    for (const char* length : {"-5", "abc", "12x"}) {
        r = raw_reply(
            std::string("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: ") + length + "\r\n\r\n{}",
            &raw);
        CHECK(r.status == 400);
        CHECK(error_of(r)["message"] ==
              std::string("malformed Content-Length header '") + length + "' (expected a decimal byte count)");
        CHECK(raw.find("Connection: close\r\n") != std::string::npos);
        CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    }
    // two Content-Lengths that differ, or one with chunked encoding: 400 at once (they were served, or waited for)
    r = raw_reply(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 29\r\nContent-Length: "
        "5\r\n\r\n{\"prompt\": \"a\", \"max_tokens\": 1}",
        &raw);
    CHECK(r.status == 400);
    CHECK(error_of(r)["message"] == "Content-Length headers that disagree");
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    r = raw_reply(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        "Content-Length: 5\r\n\r\n0\r\n\r\n",
        &raw);
    CHECK(r.status == 400);
    CHECK(error_of(r)["message"] == "a request with both Transfer-Encoding: chunked and Content-Length");
    // Transfer-Encoding names are case-insensitive: "Chunked" is chunked (it got 411)
    {
        const std::string body = "{\"prompt\": \"a\", \"max_tokens\": 1}";
        char len[16];
        std::snprintf(len, sizeof len, "%zx", body.size());
        r = raw_reply(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: "
            "Chunked\r\n\r\n" +
                std::string(len) + "\r\n" + body + "\r\n0\r\n\r\n",
            &raw);
        CHECK(r.status == 200);
    }
    // a malformed chunk size: 400, and the connection closes, with one Connection header (it carried two)
    r = raw_reply("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
                  &raw);
    CHECK(r.status == 400);
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    CHECK(raw.find("Connection: close\r\n") == raw.rfind("Connection: close\r\n"));
    // any other transfer coding, alone, in a list or beside a Content-Length: 501 at once (a list waited 10 s for the
    // client to close, then parsed the chunk framing as JSON; gzip with a length was served as if it were not there)
    for (const char* te : {"gzip, chunked", "chunked, gzip", "gzip"}) {
        r = raw_reply(std::string("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: ") + te +
                          "\r\n" +
                          (std::string(te) == "gzip" ? "Content-Length: 2\r\n\r\n{}" : "\r\n2\r\n{}\r\n0\r\n\r\n"),
                      &raw);
        CHECK(r.status == 501);
        CHECK(error_of(r)["message"] ==
              std::string("unsupported Transfer-Encoding '") + te + "' (only chunked is taken)");
        CHECK(raw.find("Connection: close\r\n") != std::string::npos);
        CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    }
    // a request hidden behind a body the handler does not read (GET with a body; a chunk longer than its size line,
    // which the library's reader takes): answered, then the connection closes, so the hidden one never runs (it
    // got a 404 as the next request on the connection)
    {
        const std::string hidden = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
        r = raw_reply("GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(hidden.size()) +
                          "\r\n\r\n" + hidden,
                      &raw);
        CHECK(r.status == 200);
        CHECK(raw.find("404") == std::string::npos);
        const std::string body = "{\"prompt\": \"a\", \"max_tokens\": 1}";
        char len[16];
        std::snprintf(len, sizeof len, "%zx", body.size());
        r = raw_reply("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                          std::string(len) + "\r\n" + body + "junk\r\n" + hidden,
                      &raw);
        CHECK(raw.find("/smuggled") == std::string::npos);
        CHECK(raw.find("HTTP/1.1 404") == std::string::npos);
    }
    // OPTIONS takes the header checks too (it got 204)
    r = raw_reply("OPTIONS /v1/completions HTTP/1.1\r\nHost : x\r\n\r\n", &raw);
    CHECK(r.status == 400);
    r = raw_reply("OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", &raw);
    CHECK(r.status == 501);
    // white space in a header name ("Host : x", RFC 9112 5.1): 400 (it was served)
    r = raw_reply("GET /health HTTP/1.1\r\nHost : 127.0.0.1\r\n\r\n", &raw);
    CHECK(r.status == 400);
    CHECK(error_of(r)["message"] == "malformed header name 'Host ' (white space in a field name)");
    // a request line the library cannot parse, and one too long: OpenAI's error JSON, and the connection closes
    r = raw_reply("GARBAGE\r\n\r\n", &raw);
    CHECK(r.status == 400);
    error_of(r);
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    CHECK(raw.find("Access-Control-Allow-Origin: *\r\n") != std::string::npos);
    r = raw_reply("GET /" + std::string(9000, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", &raw);
    CHECK(r.status == 414);
    error_of(r);
    CHECK(raw.find("Connection: close\r\n") != std::string::npos);
    CHECK(raw.find("Keep-Alive:") == std::string::npos);  // (not beside "close")
    // wrong methods on known paths: 405 with Allow
    httplib::Client cli("127.0.0.1", port);
    auto g = cli.Get("/v1/chat/completions");
    REQUIRE(g);
    CHECK(g->status == 405);
    CHECK(g->get_header_value("Allow") == "POST, OPTIONS");
    CHECK(error_of({g->status, g->body})["code"] == "method_not_allowed");
    auto p = cli.Post("/v1/models", "{}", "application/json");
    REQUIRE(p);
    CHECK(p->status == 405);
    CHECK(p->get_header_value("Allow") == "GET, HEAD, OPTIONS");
    auto d = cli.Delete("/health");
    REQUIRE(d);
    CHECK(d->status == 405);
    auto u = cli.Get("/v1/nothing");
    REQUIRE(u);
    CHECK(u->status == 404);
    error_of({u->status, u->body});
    httplib::Client keep("127.0.0.1", port);
    keep.set_keep_alive(true);
    auto k = keep.Get("/v1/nothing");
    REQUIRE(k);
    CHECK(k->status == 404);
    CHECK(k->get_header_value("Connection") != "close");  // (no body was left unread: the connection stays)
    // one model
    const Reply m = get(port, "/v1/models/tiny");
    CHECK(m.status == 200);
    CHECK(m.json()["id"] == "tiny");
    CHECK(m.json()["object"] == "model");
    const Reply none = get(port, "/v1/models/gpt-4");
    CHECK(none.status == 404);
    CHECK(error_of(none)["code"] == "model_not_found");
    // max_tokens: a range error that says what the range is; /v1/completions generates 16 without it (OpenAI's)
    for (const char* v : {"-1", "2.5", "10000000000"}) {
        const Reply e = post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": ") + v + "}");
        CHECK(e.status == 400);
        const ojson err = error_of(e);
        CHECK(err["param"] == "max_tokens");
        INFO(err["message"].get<std::string>());
        CHECK(err["message"].get<std::string>().find(v) != std::string::npos);
    }
    const Reply neg = post(port, "/v1/completions", std::string("{\"prompt\": \"x\", \"max_tokens\": -1}"));
    CHECK(error_of(neg)["message"].get<std::string>().find(">= 0") != std::string::npos);
    const Reply dflt =
        post(port, "/v1/completions", ojson{{"prompt", kCode}, {"ignore_eos", true}, {"cache_prompt", false}});
    REQUIRE(dflt.status == 200);
    CHECK(dflt.json()["usage"]["completion_tokens"] == 16);
    CHECK(dflt.json()["choices"][0]["finish_reason"] == "length");
    CHECK(get(port, "/health").status == 200);
}

// The load warnings (here an ignored generation_config.json field, and -t past the cores) are printed at startup, as
// hybrid prints them (the server printed nothing); the server still starts.
TEST_CASE("server: load warnings are printed at startup", "[server]") {
    if (!have_server_binary()) return;
    hy::test::cli_util::TempDir tmp("server_warning");
    const std::string dir = tmp.path.string();
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
        std::filesystem::copy_file(std::string(kSrc) + "/models/tiny/" + f, dir + "/" + f);
    std::ofstream(dir + "/generation_config.json") << R"({"temperature": "hot"})";
    ServerProcess s({"-m", dir, "-np", "1", "--cache-mb", "0"});
    INFO(s.startup_log());
    CHECK(s.startup_log().find("hybrid-server: warning: " + dir +
                               "/generation_config.json: field 'temperature' must be a number, found \"hot\": "
                               "ignored\n") != std::string::npos);
    CHECK(s.stop(SIGTERM) == 0);
    // more CPU threads than cores: warned, as by hybrid and the tools (the server said nothing)
    ServerProcess t({"-np", "1", "--cache-mb", "0", "--device", "cpu", "-t", "1024"});
    INFO(t.startup_log());
    CHECK(t.startup_log().find("hybrid-server: warning: -t 1024 is more than the ") != std::string::npos);
}
