// Helpers of the tests that run the built programs (test_cli.cpp, test_repl.cpp, test_tools.cpp): running a program
// with arguments and stdin (also with stdout redirected, on a pseudo-terminal, or on pipes for the tests that signal
// it), the golden cases of models/tiny and the check of a one-line error.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace hy::test::cli_util {

inline const std::string kSrc = HY_SOURCE_DIR;
inline const std::string kBin = HY_BINARY_DIR;

struct Run {
    int rc = -1;
    std::string out, err;
};

inline std::string quote(const std::string& s) {
    std::string q = "'";
    for (char ch : s) {
        if (ch == '\'')
            q += "'\\''";
        else
            q += ch;
    }
    return q + "'";
}

inline std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& tag) {
        path = fs::temp_directory_path() / ("hy_cli_test_" + tag + "_" + std::to_string(::getpid()));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// Runs `program args...` from the repository root with `input` on stdin.
inline Run run_prog(const std::string& program, const std::vector<std::string>& args, const std::string& input = "") {
    static TempDir tmp("runs");
    static int counter = 0;
    const std::string base = (tmp.path / ("run" + std::to_string(counter++))).string();
    std::ofstream(base + ".in", std::ios::binary) << input;
    std::string cmd = "cd " + quote(kSrc) + " && " + quote(program);
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " < " + quote(base + ".in") + " > " + quote(base + ".out") + " 2> " + quote(base + ".err");
    const int st = std::system(cmd.c_str());
    Run r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(base + ".out");
    r.err = slurp(base + ".err");
    return r;
}

// In a build without the programs (HY_TESTS_ONLY) the [cli] tests have nothing to run.
inline bool have_programs() {
    if (fs::exists(kBin + "/hybrid") && fs::exists(kBin + "/embed_example")) return true;
    WARN("hybrid or embed_example is not built in " << kBin << " (HY_TESTS_ONLY?): [cli] test skipped");
    return false;
}

inline Run hybrid(std::vector<std::string> args, const std::string& input = "") {
    args.insert(args.begin(), {"-t", "1", "--device", "cpu"});  // the goldens are the fp32 CPU ones
    return run_prog(kBin + "/hybrid", args, input);
}

inline nlohmann::json golden_case(const std::string& name) {
    std::ifstream in(kSrc + "/models/tiny/golden.json");
    const nlohmann::json g = nlohmann::json::parse(in);
    for (const auto& c : g["cases"])
        if (c["name"] == name) return c;
    return {};
}

inline std::string join_ids(const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
    return s;
}

// Runs `hybrid -t 1 --device cpu args... <stdin_redirect >stdout_redirect 2>ERR` through the shell; returns the
// exit code and stderr (stdout goes where the redirection says, e.g. "/dev/full" or "&-").
inline Run hybrid_redirected(const std::vector<std::string>& args, const std::string& out_redirect,
                             const std::string& input = "") {
    static TempDir tmp("redir");
    static int counter = 0;
    const std::string base = (tmp.path / ("run" + std::to_string(counter++))).string();
    std::ofstream(base + ".in", std::ios::binary) << input;
    std::string cmd = "cd " + quote(kSrc) + " && " + quote(kBin + "/hybrid") + " -t 1 --device cpu";
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " < " + quote(base + ".in") + " >" + out_redirect + " 2> " + quote(base + ".err");
    const int st = std::system(cmd.c_str());
    Run r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.err = slurp(base + ".err");
    return r;
}

inline void check_one_line_error(const Run& r, int code, const std::string& needle) {
    INFO(r.err);
    CHECK(r.rc == code);
    CHECK(r.err.rfind("hybrid: error: ", 0) == 0);
    CHECK(r.err.find(needle) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

// Drives `hybrid args...` on a pseudo-terminal: for each step, waits until the output (since the last step) holds
// `wait_for`, then writes `send`. Returns the exit code (-1 on a timeout) and the whole output in *out.
inline int run_on_pty(const std::vector<std::string>& args,
                      const std::vector<std::pair<std::string, std::string>>& steps, std::string* out,
                      const std::string& stdout_file = "") {
    const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return -1;
    const std::string slave_name = ::ptsname(master);
    std::vector<std::string> argv_s = {kBin + "/hybrid", "-t", "1", "--device", "cpu"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setsid();
        const int slave = ::open(slave_name.c_str(), O_RDWR);
        if (slave < 0) ::_exit(127);
        ::ioctl(slave, TIOCSCTTY, 0);
        ::dup2(slave, 0);
        const int out_fd =
            stdout_file.empty() ? slave : ::open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (out_fd < 0) ::_exit(127);
        ::dup2(out_fd, 1);
        ::dup2(slave, 2);
        ::close(master);
        if (::chdir(kSrc.c_str()) != 0) ::_exit(127);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    auto read_until = [&](const std::string& needle, size_t from, double seconds) {
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
            if (!needle.empty() && out->find(needle, from) != std::string::npos) return true;
            pollfd p{master, POLLIN, 0};
            if (::poll(&p, 1, 50) > 0) {
                char buf[4096];
                const ssize_t n = ::read(master, buf, sizeof buf);
                if (n <= 0) return needle.empty();
                out->append(buf, size_t(n));
            }
        }
        return needle.empty();
    };
    bool ok = true;
    size_t from = 0;
    for (const auto& [wait_for, send] : steps) {
        if (!read_until(wait_for, from, 20.0)) {
            ok = false;
            break;
        }
        from = out->size();
        if (::write(master, send.data(), send.size()) != ssize_t(send.size())) ok = false;
    }
    read_until("", 0, ok ? 2.0 : 0.1);
    int st = 0;
    // Up to 30 s for the exit (a loaded machine: freeing the model can take a while). read_until returns at once
    // once the terminal is closed, so the loop also sleeps; the child is reaped by the waitpid that sees it exit.
    bool reaped = false;
    const auto t_exit = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t_exit).count() < 30.0) {
        const pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            reaped = true;
            break;
        }
        if (r < 0 && errno != EINTR) break;
        read_until("", 0, 0.05);
        ::usleep(10000);
    }
    if (!reaped) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &st, 0);
        ok = false;
    }
    ::close(master);
    return ok && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// hybrid (-t 1 --device cpu --verbose, then args) with stdin, stdout and stderr on pipes, for the tests that signal
// it while it runs; wait_loaded() reads stderr until the model is loaded (the SIGINT handler is installed next).
struct Spawned {
    pid_t pid = -1;
    int in = -1, out = -1, err_fd = -1;  // our ends: stdin (write), stdout and stderr (read)
    std::string err;                     // stderr read so far
};

inline Spawned spawn_hybrid(const std::vector<std::string>& args) {
    int in_pipe[2], out_pipe[2], err_pipe[2];
    REQUIRE(::pipe(in_pipe) == 0);
    REQUIRE(::pipe(out_pipe) == 0);
    REQUIRE(::pipe(err_pipe) == 0);
    std::vector<std::string> argv_s = {kBin + "/hybrid", "-t", "1", "--device", "cpu", "--verbose"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    Spawned s;
    s.pid = ::fork();
    if (s.pid == 0) {
        ::dup2(in_pipe[0], 0);
        ::dup2(out_pipe[1], 1);
        ::dup2(err_pipe[1], 2);
        for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
        if (::chdir(kSrc.c_str()) != 0) ::_exit(127);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    s.in = in_pipe[1];
    s.out = out_pipe[0];
    s.err_fd = err_pipe[0];
    return s;
}

inline void wait_loaded(Spawned& s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (s.err.find("loaded on") == std::string::npos &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 30.0) {
        pollfd p{s.err_fd, POLLIN, 0};
        if (::poll(&p, 1, 50) > 0) {
            char buf[1024];
            const ssize_t n = ::read(s.err_fd, buf, sizeof buf);
            if (n <= 0) break;
            s.err.append(buf, size_t(n));
        }
    }
}

// Reads the rest of s's stdout into out (until the program closes it), then waits for its exit and closes the pipes;
// returns the wait status.
inline int collect_exit(Spawned& s, std::string& out) {
    char buf[4096];
    for (ssize_t n; (n = ::read(s.out, buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
    int st = 0;
    ::waitpid(s.pid, &st, 0);
    ::close(s.out);
    ::close(s.err_fd);
    return st;
}

}  // namespace hy::test::cli_util
