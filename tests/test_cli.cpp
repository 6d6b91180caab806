// Tests of the real `hybrid` binary on models/tiny in its one-shot modes (-p, -f, --prompt-ids, --chat, --batch-file):
// golden text and ids, flags, exit codes and messages, Ctrl-C. The chat REPL (-i) is tested in test_repl.cpp, the
// tools and tools/embed_example (the C program) in test_tools.cpp.
// The programs run on the CPU backend (the goldens are fp32 CPU outputs) with -t 1, so that a busy machine does not
// slow the OpenMP threads down. The helpers are in cli_util.h.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/line_reader.h"
#include "cli_util.h"
#include "engine.h"
#include "test_util.h"

using namespace hy::test::cli_util;

TEST_CASE("cli: one-shot greedy prints the golden continuation", "[cli]") {
    if (!have_programs()) return;
    const auto g = golden_case("short");
    REQUIRE(g["prompt"] == "def main():\n    ");
    const Run r = hybrid({"-m", "models/tiny", "-p", "def main():\\n    ", "-n", "48", "--temp", "0"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.out == g["greedy_fp32_text"].get<std::string>());
    CHECK(r.err.empty());  // stderr is not a terminal and --verbose is off: nothing

    // --no-escape keeps the backslash: another prompt, another output
    const Run raw = hybrid({"-m", "models/tiny", "-p", "def main():\\n    ", "--no-escape", "-n", "8", "--temp", "0"});
    CHECK(raw.rc == 0);
    CHECK(raw.out != r.out.substr(0, raw.out.size()));
}

TEST_CASE("cli: --prompt-ids prints the golden ids; --verbose prints the summary", "[cli]") {
    if (!have_programs()) return;
    for (const char* name : {"short", "sentence"}) {
        const auto g = golden_case(name);
        const Run r = hybrid({"-m", "models/tiny", "--prompt-ids", join_ids(g["input_ids"].get<std::vector<int32_t>>()),
                              "-n", "48", "--temp", "0", "--verbose"});
        INFO(r.err);
        CHECK(r.rc == 0);
        CHECK(r.out == join_ids(g["greedy_fp32_cpu"].get<std::vector<int32_t>>()) + "\n");
        CHECK(r.err.find("tok/s") != std::string::npos);
        CHECK(r.err.find("stop: max tokens") != std::string::npos);
        CHECK(r.err.find("load") != std::string::npos);
    }
    // one token: no decode step ran, so there is no generation rate (not a rate of one token in no time)
    const Run one = hybrid({"-m", "models/tiny", "--prompt-ids", "1,2,3", "-n", "1", "--temp", "0", "--verbose"});
    INFO(one.err);
    CHECK(one.rc == 0);
    CHECK(one.err.find("     1 token           - tok/s") != std::string::npos);
    CHECK(one.err.find("3 tokens          - tok/s") == std::string::npos);  // (the prompt has its rate)
}

TEST_CASE("cli: sampling with a seed is reproducible; stop strings are not printed", "[cli]") {
    if (!have_programs()) return;
    const std::vector<std::string> a = {"-m", "models/tiny", "-p", "def fibonacci(n):\\n    ", "-n", "32", "-s", "7"};
    const Run r1 = hybrid(a), r2 = hybrid(a);
    CHECK(r1.rc == 0);
    CHECK(r1.out == r2.out);
    CHECK(!r1.out.empty());

    const auto g = golden_case("short");
    const std::string text = g["greedy_fp32_text"].get<std::string>();
    const Run s = hybrid({"-m", "models/tiny", "-p", "def main():\\n    ", "-n", "48", "--temp", "0", "--stop",
                          "isinstance", "--verbose"});
    CHECK(s.rc == 0);
    CHECK(s.out == text.substr(0, text.find("isinstance")));
    CHECK(s.err.find("stop: stop string") != std::string::npos);

    // the word after an option that takes a value is its value, even when it starts with '-' (as getopt does)
    const Run dash = hybrid({"-m", "models/tiny", "-p", "--stop", "-n", "3", "--temp", "0", "--verbose"});
    INFO(dash.err);
    CHECK(dash.rc == 0);
    CHECK(dash.err.find("generation") != std::string::npos);
    CHECK(dash.err.find("3 tokens") != std::string::npos);  // -n 3 is honoured, not taken as the stop string
    CHECK(hybrid({"-m", "models/tiny", "-p", "-np", "-n", "2"}).rc == 0);  // the prompt "-np", not --parallel
}

TEST_CASE("cli: -f reads the prompt as is; --system and -p in the REPL", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("file");
    const fs::path prompt = tmp.path / "prompt.txt";
    std::ofstream(prompt, std::ios::binary) << "def main():\n    ";
    const Run f = hybrid({"-m", "models/tiny", "-f", prompt.string(), "-n", "48", "--temp", "0"});
    CHECK(f.rc == 0);
    CHECK(f.out == golden_case("short")["greedy_fp32_text"].get<std::string>());

    const std::vector<std::string> base = {"-m", "models/tiny", "--temp", "0", "-n", "16", "--no-think"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    const Run plain = hybrid(with({"--chat", "-p", "Say hi."}));
    const Run sys = hybrid(with({"--chat", "-p", "Say hi.", "--system", "You are a pirate."}));
    CHECK(plain.rc == 0);
    CHECK(sys.rc == 0);
    // -p in the REPL is the first turn, as if typed; --system applies there too
    const Run repl_p = hybrid(with({"-i", "-p", "Say hi.", "--system", "You are a pirate."}), "");
    CHECK(repl_p.out == sys.out + "\n");
    const Run repl_in = hybrid(with({"-i", "--system", "You are a pirate."}), "Say hi.\n");
    CHECK(repl_in.out == sys.out + "\n");
    CHECK(hybrid({"-m", "models/tiny", "-p", "x", "--system", "s"}).rc == 1);  // --system needs --chat or -i
}

TEST_CASE("cli: errors have one-line messages and documented exit codes", "[cli]") {
    if (!have_programs()) return;
    const Run help = hybrid({"--help"});
    CHECK(help.rc == 0);
    CHECK(help.out.find("Exit codes:") != std::string::npos);
    CHECK(hybrid({"--version"}).out.find("hybrid ") == 0);

    auto check_error = [](const Run& r, int code, const std::string& needle) {
        INFO(r.err);
        CHECK(r.rc == code);
        CHECK(r.err.rfind("hybrid: error: ", 0) == 0);
        CHECK(r.err.find(needle) != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    };
    check_error(hybrid({"-m", "models/nope", "-p", "x"}), 2, "models/nope");
    check_error(hybrid({"-p", "x"}), 1, "-m");
    check_error(hybrid({"-m", "models/tiny"}), 1, "no prompt");
    // stdin is a file here, not a terminal: the error says how to read it
    check_error(hybrid({"-m", "models/tiny", "--chat"}, "Hello"), 1, "(-f - reads the prompt from standard input)");
    // an empty -m is the loader's error, exit 2, as in the tools and the server
    check_error(hybrid({"-m", "", "-p", "x"}), 2, "the model folder path is empty");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--bogus"}), 1,
                "unknown option --bogus (-h lists the options)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-v"}), 1, "unknown option -v (--verbose prints");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-q"}), 1, "unknown option -q (-h lists the options)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-r", "User:"}), 1, "unknown option -r (--stop STR ends");
    // each says what the value should have been (a fresh-user pass: text got no reason, hex did)
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "abc"}), 1, "invalid value 'abc' for -n (not a number)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "2.5"}), 1,
                "invalid value '2.5' for -n (a decimal integer)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--temp=hot"}), 1,
                "invalid value 'hot' for --temp (a decimal number) (see --help)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--temp", "1e300"}), 1,
                "invalid value '1e300' for --temp (out of range)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--temp", "1e400"}), 1,  // (past double, and below it)
                "invalid value '1e400' for --temp (out of range)");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--min-p", "1e-400"}), 1,
                "invalid value '1e-400' for --min-p (out of range)");
    // a double that rounds to 0 as a float (it sampled greedily without a word)
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--temp", "1e-300"}), 1,
                "invalid value '1e-300' for --temp (too small: it rounds to 0 as a float; give 0 for 0) (see --help)");
    // ... where 0 itself is refused, it does not offer 0
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--repeat-penalty", "1e-300"}), 1,
                "invalid value '1e-300' for --repeat-penalty (too small: it rounds to 0 as a float) (see --help)");
    CHECK(hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "--temp", "1e-30"}).rc == 0);  // (a float: taken)
    for (const char* junk : {"0.5abc", "1,5", "0x10", "nan", ""})  // real numbers are parsed strictly too
        check_error(hybrid({"-m", "models/tiny", "-p", "x", "--top-p", junk}), 1,
                    std::string("invalid value '") + junk + "' for --top-p");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--ctx-size", "1e3"}), 1, "for --ctx-size");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--device", "tpu"}), 1, "--device");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--top-p", "2"}), 1, "--top-p");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "--repeat-penalty", "0"}), 1, "--repeat-penalty");
    check_error(hybrid({"-m", "models/tiny", "-p", "x", "-c", "-5"}), 1, "-c must be >= 0");
    check_error(run_prog(kBin + "/hybrid", {"-m", "models/tiny", "-p", "x", "-t", "100000"}), 1, "-t");
    check_error(hybrid({"-m", "models/tiny", "-p", ""}), 1, "empty");
    check_error(hybrid({"-m", "models/tiny", "--prompt-ids", "1,x"}), 1, "prompt-ids");
    check_error(hybrid({"-m", "models/tiny", "--prompt-ids", "999999"}), 1, "999999");
    check_error(hybrid({"-m", "models/tiny", "-f", "/nonexistent/prompt.txt"}), 5, "prompt.txt");
    // an option clash is named before a file is read (a fresh-user pass: the missing file came first, exit 5)
    check_error(hybrid({"-m", "models/tiny", "-i", "--batch-file", "/nonexistent/prompts.txt"}), 1,
                "-i does not take --batch-file");
    std::string long_prompt;
    for (int i = 0; i < 100; i++) long_prompt += "word ";
    check_error(hybrid({"-m", "models/tiny", "-p", long_prompt, "-c", "32"}), 3, "context");
}

TEST_CASE("cli: odd input does not crash", "[cli]") {
    if (!have_programs()) return;
    // bad UTF-8 in the prompt, a huge -n with a small context (stops when the context is full)
    const Run r = hybrid({"-m", "models/tiny", "-p", "\xff\xfe caf\xc3", "-n", "1000000", "-c", "40", "--verbose"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("stop: context full") != std::string::npos);
    CHECK(r.err.find("warning: the prompt is not valid UTF-8") != std::string::npos);
    const Run ok = hybrid({"-m", "models/tiny", "-p", "caf\xc3\xa9", "-n", "1"});
    CHECK(ok.err.find("UTF-8") == std::string::npos);
    // end of input right away in the REPL; empty lines are skipped
    CHECK(hybrid({"-m", "models/tiny", "-i"}, "").rc == 0);
    CHECK(hybrid({"-m", "models/tiny", "-i"}, "\n   \n/exit\n").rc == 0);
    const Run bad = hybrid({"-m", "models/tiny", "-i"}, "/frobnicate\n");
    CHECK(bad.rc == 1);
    CHECK(bad.err.find("unknown command") != std::string::npos);
}

TEST_CASE("cli: --batch-file writes one JSON line per prompt, each equal to its one-shot run", "[cli]") {
    if (!have_programs()) return;
    TempDir dir("batch");
    const std::string file = (dir.path / "prompts.txt").string();
    std::ofstream(file) << "def main():\\n    \n\nclass Foo:\nimport os\n";
    const Run r = hybrid({"-m", "models/tiny", "--batch-file", file, "-n", "12", "--temp", "0", "-np", "2"});
    REQUIRE(r.rc == 0);
    std::istringstream lines(r.out);
    std::string line;
    std::vector<nlohmann::json> objs;
    while (std::getline(lines, line)) objs.push_back(nlohmann::json::parse(line));
    REQUIRE(objs.size() == 3);  // the empty line is skipped
    const std::vector<std::string> prompts = {"def main():\\n    ", "class Foo:", "import os"};
    for (size_t i = 0; i < objs.size(); i++) {
        INFO("prompt " << i);
        REQUIRE(objs[i]["index"] == i);
        REQUIRE(objs[i]["stop_reason"] == "max tokens");
        REQUIRE(objs[i]["ids"].size() == 12);
        REQUIRE(objs[i]["logprobs"].size() == 12);
        const Run one = hybrid({"-m", "models/tiny", "-p", prompts[i], "-n", "12", "--temp", "0"});
        REQUIRE(one.rc == 0);
        REQUIRE(objs[i]["text"].get<std::string>() == one.out);
    }
    // a UTF-8 byte order mark before the first line is not part of its prompt
    const std::string bom = (dir.path / "bom.txt").string();
    std::ofstream(bom) << "\xEF\xBB\xBF"
                       << "class Foo:\n";
    const Run b = hybrid({"-m", "models/tiny", "--batch-file", bom, "-n", "12", "--temp", "0"});
    REQUIRE(b.rc == 0);
    CHECK(nlohmann::json::parse(b.out)["prompt"] == "class Foo:");
    CHECK(nlohmann::json::parse(b.out)["text"] == objs[1]["text"]);
    // Errors: a missing file, an empty file, a bad --parallel.
    REQUIRE(hybrid({"-m", "models/tiny", "--batch-file", (dir.path / "nope.txt").string()}).rc == 5);
    std::ofstream((dir.path / "empty.txt").string()) << "\n\n";
    const Run e = hybrid({"-m", "models/tiny", "--batch-file", (dir.path / "empty.txt").string()});
    REQUIRE(e.rc == 1);
    REQUIRE(e.err.find("holds no prompt") != std::string::npos);
    REQUIRE(hybrid({"-m", "models/tiny", "--batch-file", file, "-np", "0"}).rc == 1);
    // A prompt longer than the context fails alone: its line has "error", the others run as before; exit 3.
    const std::string mixed = (dir.path / "mixed.txt").string();
    std::string long_line;
    for (int i = 0; i < 40; i++) long_line += "x = x + 1; ";
    std::ofstream(mixed) << "class Foo:\n" << long_line << "\nimport os\n";
    const Run m = hybrid({"-m", "models/tiny", "--batch-file", mixed, "-n", "12", "--temp", "0", "-c", "64"});
    INFO(m.err);
    CHECK(m.rc == 3);
    CHECK(m.err.find("hybrid: error: batch prompt 1 (line 2): the prompt has ") != std::string::npos);
    std::istringstream mlines(m.out);
    std::vector<nlohmann::json> mobjs;
    while (std::getline(mlines, line)) mobjs.push_back(nlohmann::json::parse(line));
    REQUIRE(mobjs.size() == 3);
    CHECK(mobjs[0]["text"] == objs[1]["text"]);
    CHECK(mobjs[1]["index"] == 1);
    CHECK(mobjs[1]["error"].get<std::string>().find("but the context holds 64 (-c)") != std::string::npos);
    CHECK(!mobjs[1].contains("text"));
    CHECK(mobjs[2]["text"] == objs[2]["text"]);
    // With --chat a blank line or one with a NUL byte is a bad prompt too: it fails alone, with its error in its
    // line (it failed the whole batch, with no output); exit 1, or the first failed prompt's code.
    const std::string chat_rows = (dir.path / "chat_rows.txt").string();
    std::ofstream(chat_rows, std::ios::binary) << "Say hi.\n   \n" << std::string("a\0b\n", 4) << "a\\0b\nBye.\n";
    const Run c = hybrid({"-m", "models/tiny", "--batch-file", chat_rows, "--chat", "-n", "4", "--temp", "0"});
    INFO(c.err);
    CHECK(c.rc == 1);
    std::istringstream clines(c.out);
    std::vector<nlohmann::json> cobjs;
    while (std::getline(clines, line)) cobjs.push_back(nlohmann::json::parse(line));
    REQUIRE(cobjs.size() == 5);
    CHECK(cobjs[0].contains("text"));
    CHECK(cobjs[1]["error"].get<std::string>().find("the message is empty") != std::string::npos);
    CHECK(cobjs[2]["error"].get<std::string>().find("holds a NUL byte") != std::string::npos);
    CHECK(cobjs[3]["error"].get<std::string>().find("holds a NUL byte") != std::string::npos);
    CHECK(cobjs[4].contains("text"));
    CHECK(c.err.find("hybrid: error: batch prompt 1 (line 2): the message is empty") != std::string::npos);
    CHECK(c.err.find("batch prompt 3 (line 4)") != std::string::npos);
    // a prompt too long first: exit 3
    std::ofstream(chat_rows, std::ios::binary) << long_line << "\n \n";
    CHECK(hybrid({"-m", "models/tiny", "--batch-file", chat_rows, "--chat", "-n", "1", "-c", "64"}).rc == 3);
}

TEST_CASE("cli: flags without effect and repeated flags are usage errors", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("flags");
    const std::string file = (tmp.path / "prompts.txt").string();
    std::ofstream(file) << "a\nb\n";
    check_one_line_error(hybrid({"-m", "models/tiny", "--batch-file", file, "--stop", "x"}), 1,
                         "--stop is not supported with --batch-file");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-np", "2"}), 1, "--batch-file");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--parallel", "2"}), 1, "--batch-file");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--no-think"}), 1, "--no-think");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-p", "y"}), 1, "more than once");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "-n", "2"}), 1, "more than once");
    // still fine: --no-think with --chat, -np with --batch-file
    CHECK(hybrid({"-m", "models/tiny", "--chat", "-p", "x", "--no-think", "-n", "1"}).rc == 0);
    CHECK(hybrid({"-m", "models/tiny", "--batch-file", file, "-np", "2", "-n", "1"}).rc == 0);
    // a switch given as --switch=false is off (it was on: from the fresh-user test)
    const std::vector<std::string> say = {"-m", "models/tiny", "-p", "Say hi.", "--temp", "0", "-n", "8"};
    auto with = [&](const std::string& extra) {
        std::vector<std::string> a = say;
        a.push_back(extra);
        return hybrid(a);
    };
    const Run plain = hybrid(say), chat = with("--chat");
    REQUIRE(plain.out != chat.out);
    CHECK(with("--chat=false").out == plain.out);
    CHECK(with("--chat=0").out == plain.out);
    CHECK(with("--chat=true").out == chat.out);
    check_one_line_error(with("--chat=maybe"), 1, "--chat");
    // a NUL byte in a chat message is refused (the chat format would cut the text there)
    check_one_line_error(hybrid({"-m", "models/tiny", "--chat", "-p", "hello\\0world"}), 1, "the prompt holds a NUL");
    check_one_line_error(hybrid({"-m", "models/tiny", "--chat", "-p", "hi", "--system", "a\\0b"}), 1, "--system");
    check_one_line_error(hybrid({"-m", "models/tiny", "-i"}, std::string("a\0b\n", 4)), 1, "the message holds a NUL");
    std::ofstream(file, std::ios::binary) << std::string("a\0b\n", 4);
    const Run nul_row = hybrid({"-m", "models/tiny", "--batch-file", file, "--chat", "-n", "1"});
    check_one_line_error(nul_row, 1, "batch prompt 0 (line 1): the message holds a NUL");
    CHECK(nlohmann::json::parse(nul_row.out)["error"].get<std::string>().find("NUL") != std::string::npos);
    check_one_line_error(hybrid({"-m", "models/tiny", "-i"}, "/save!\n"), 1, "/save! needs a file name");
    check_one_line_error(hybrid({"-m", "models/tiny", "-i", "-p", " "}), 1, "the first turn (-p or -f) is empty");
    // (from the second fresh-user test) a blank chat message, a NUL in --stop or in a REPL file name
    check_one_line_error(hybrid({"-m", "models/tiny", "--chat", "-p", " "}), 1, "the prompt is empty");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--stop", "a\\0b"}), 1, "--stop holds a NUL");
    check_one_line_error(hybrid({"-m", "models/tiny", "-i"}, std::string("/save /tmp/a\0b\n", 15)), 1,
                         "/save: the argument holds a NUL byte");
    check_one_line_error(hybrid({"--help=false"}), 1, "-m DIR is required");
    // int options strictly: cxxopts wrapped 5000000000 to 705032704 and took hexadecimal
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-c", "5000000000"}), 1, "invalid value '5000000000'");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--top-k", "9999999999"}), 1, "--top-k");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "0x10"}), 1,
                         "invalid value '0x10' for --n-predict (a decimal integer) (see --help)");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "99999999999999999999"}), 1,
                         "invalid value '99999999999999999999' for -n (out of range)");
    CHECK(hybrid({"-m", "models/tiny", "-p", "x", "-n", "-1", "-c", "20"}).rc == 0);
    {  // a chat input that cannot be read is an error (exit 5), not a silent end of the conversation
        const std::string err = (tmp.path / "err.txt").string();
        const std::string cmd = "cd " + quote(kSrc) + " && " + quote(kBin + "/hybrid") +
                                " -t 1 --device cpu -m models/tiny -i < " + quote(tmp.path.string()) + " 2>" +
                                quote(err);
        const int st = std::system(cmd.c_str());
        CHECK(WIFEXITED(st));
        CHECK(WEXITSTATUS(st) == 5);
        CHECK(slurp(err).find("hybrid: error: cannot read the chat input (stdin)") != std::string::npos);
    }
    {  // -f - and --batch-file - with standard input closed: an error (exit 5), not an empty prompt (exit 1)
        const std::string err = (tmp.path / "closed.txt").string();
        for (const char* opt : {"-f", "--batch-file"}) {
            const std::string cmd = "cd " + quote(kSrc) + " && " + quote(kBin + "/hybrid") +
                                    " -t 1 --device cpu -m models/tiny -n 2 " + opt + " - <&- 2>" + quote(err);
            const int st = std::system(cmd.c_str());
            CHECK(WIFEXITED(st));
            CHECK(WEXITSTATUS(st) == 5);
            CHECK(slurp(err) == "hybrid: error: cannot read '-': standard input is closed\n");
        }
        // -i reads the chat from it: exit 5 too (it ended at once, exit 0, with nothing said)
        const std::string cmd = "cd " + quote(kSrc) + " && " + quote(kBin + "/hybrid") +
                                " -t 1 --device cpu -m models/tiny -n 2 -i <&- 2>" + quote(err);
        const int st = std::system(cmd.c_str());
        CHECK(WIFEXITED(st));
        CHECK(WEXITSTATUS(st) == 5);
        CHECK(slurp(err) == "hybrid: error: -i: cannot read standard input: it is closed (the chat is read from it)\n");
    }
    CHECK(hybrid({"-m", "models/tiny", "-p", "hello\\0world", "-n", "1"}).rc == 0);  // plain text keeps it
}

// \xNN in -p is that byte, as llama.cpp reads it (it stayed as four characters: the fresh-user test of the
// twenty-ninth session); with fewer than two hex digits it stays as written.
TEST_CASE("cli: -p takes \\xNN escapes", "[cli]") {
    if (!have_programs()) return;
    auto run = [](const std::string& p) {
        const Run r = hybrid({"-m", "models/tiny", "-p", p, "-n", "6", "--temp", "0", "--verbose"});
        REQUIRE(r.rc == 0);
        return r.out;
    };
    const std::string ab = run("def AB(x):");
    CHECK(run("def \\x41\\x42(x):") == ab);
    CHECK(run("def \\x41\\x42(x):") != run("def \\\\x41\\\\x42(x):"));  // (\\x41: a backslash, then x41)
    CHECK(run("def \\x4(x):") == run("def \\\\x4(x):"));                // one digit: kept as written
}

TEST_CASE("cli: -s accepts every uint64 seed and -1", "[cli]") {
    if (!have_programs()) return;
    const std::vector<std::string> base = {"-m", "models/tiny", "-p", "def f(x):", "-n", "8", "--verbose"};
    auto with_seed = [&](const std::string& s) {
        std::vector<std::string> a = base;
        a.push_back("-s");
        a.push_back(s);
        return hybrid(a);
    };
    const Run big = with_seed("10639773750631520454");
    INFO(big.err);
    CHECK(big.rc == 0);
    CHECK(big.err.find("seed 10639773750631520454") != std::string::npos);
    CHECK(with_seed("10639773750631520454").out == big.out);
    const Run max = with_seed("18446744073709551615");
    CHECK(max.rc == 0);
    CHECK(max.err.find("seed 18446744073709551615") != std::string::npos);
    CHECK(with_seed("0").rc == 0);
    CHECK(with_seed("-1").rc == 0);
    // the seed --verbose prints reproduces the run
    const Run rnd = with_seed("-1");
    const size_t at = rnd.err.find("seed ");
    REQUIRE(at != std::string::npos);
    const std::string printed = rnd.err.substr(at + 5, rnd.err.find(',', at) - at - 5);
    CHECK(with_seed(printed).out == rnd.out);
    for (const char* bad : {"18446744073709551616", "-2", "+5", " 5", "5x", "", "0x10", "-0"})
        check_one_line_error(with_seed(bad), 1, "-s");
}

TEST_CASE("cli: a write error on stdout is exit code 5", "[cli]") {
    if (!have_programs()) return;
    if (!fs::exists("/dev/full")) {
        WARN("no /dev/full: write error test skipped");
        return;
    }
    TempDir tmp("full");
    const std::string file = (tmp.path / "prompts.txt").string();
    std::ofstream(file) << "a\nb\n";
    const std::string msg = "cannot write to stdout: ";
    // the reason is the failed write's (ENOSPC on /dev/full), as in the tools (cli/stdout_check.h)
    check_one_line_error(hybrid_redirected({"-m", "models/tiny", "-p", "def f", "-n", "4"}, "/dev/full"), 5,
                         msg + std::strerror(ENOSPC));
    check_one_line_error(hybrid_redirected({"-m", "models/tiny", "--prompt-ids", "5", "-n", "4"}, "/dev/full"), 5, msg);
    check_one_line_error(hybrid_redirected({"-m", "models/tiny", "--batch-file", file, "-n", "2"}, "/dev/full"), 5,
                         msg);
    check_one_line_error(hybrid_redirected({"-m", "models/tiny", "-i", "-n", "2"}, "/dev/full", "Hi.\n"), 5, msg);
    check_one_line_error(hybrid_redirected({"--help"}, "/dev/full"), 5, msg);
    // a closed stdout
    check_one_line_error(hybrid_redirected({"-m", "models/tiny", "-p", "def f", "-n", "4"}, "&-"), 5, msg);
    // a successful run still exits 0
    CHECK(hybrid_redirected({"-m", "models/tiny", "-p", "def f", "-n", "4"}, "/dev/null").rc == 0);
}

TEST_CASE("cli: -f and --batch-file refuse a directory and a huge file; -f reads a pipe", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("inputs");
    // (worded as the library's and the tools' readers: it was "X: is a directory", "X: cannot read: ...")
    check_one_line_error(hybrid({"-m", "models/tiny", "-f", tmp.path.string()}), 5,
                         "hybrid: error: cannot read '" + tmp.path.string() + "': a directory");
    check_one_line_error(hybrid({"-m", "models/tiny", "--batch-file", tmp.path.string()}), 5,
                         "cannot read '" + tmp.path.string() + "': a directory");
    const std::string missing = (tmp.path / "missing.txt").string();
    check_one_line_error(hybrid({"-m", "models/tiny", "-f", missing}), 5,
                         "hybrid: error: cannot open '" + missing + "': No such file or directory");
    // an empty name is a usage error naming the option (was "hybrid: error: : cannot read: ...", exit 5)
    check_one_line_error(hybrid({"-m", "models/tiny", "-f", ""}), 1, "-f needs a file name");
    check_one_line_error(hybrid({"-m", "models/tiny", "--batch-file", ""}), 1, "--batch-file needs a file name");
    const fs::path big = tmp.path / "big.txt";
    std::ofstream(big) << "x";
    fs::resize_file(big, (size_t(256) << 20) + 1);  // sparse
    check_one_line_error(hybrid({"-m", "models/tiny", "-f", big.string()}), 5,
                         "cannot read '" + big.string() + "': larger than 256 MiB, the most this reader takes");
    check_one_line_error(hybrid({"-m", "models/tiny", "--batch-file", big.string()}), 5, "larger than 256 MiB");
    // the prompt from stdin
    const Run in = hybrid({"-m", "models/tiny", "-f", "/dev/stdin", "-n", "48", "--temp", "0"}, "def main():\n    ");
    INFO(in.err);
    CHECK(in.rc == 0);
    CHECK(in.out == golden_case("short")["greedy_fp32_text"].get<std::string>());
    // "-" is standard input too (the last fresh-user test of session 7: "-: cannot read")
    const Run dash = hybrid({"-m", "models/tiny", "-f", "-", "-n", "48", "--temp", "0"}, "def main():\n    ");
    CHECK(dash.rc == 0);
    CHECK(dash.out == in.out);
}

TEST_CASE("cli: a model with NaN weights is a generation error, not silent output", "[cli]") {
    if (!have_programs()) return;
    hy::test::TempDir tmp;
    hy::test::TensorMap t = hy::test::read_safetensors(hy::test::tiny_dir() + "/model.safetensors");
    auto& norm = t.at("model.norm.weight");
    REQUIRE(norm.dtype == "BF16");
    for (size_t i = 0; i + 1 < norm.bytes.size(); i += 2) {
        norm.bytes[i] = 0xC0;  // bf16 NaN 0x7FC0
        norm.bytes[i + 1] = 0x7F;
    }
    const std::string dir = tmp / "nan";
    hy::test::write_model_dir(dir, t, hy::test::read_text(hy::test::tiny_dir() + "/config.json"));
    const Run ids = hybrid({"-m", dir, "--prompt-ids", "5", "-n", "4"});
    check_one_line_error(ids, 6, "no finite logits");
    CHECK(ids.out.empty());
    check_one_line_error(hybrid({"-m", dir, "-p", "x", "-n", "4", "--temp", "0"}), 6, "no finite logits");
    const std::string file = tmp / "prompts.txt";
    hy::test::write_text(file, "a\nb\n");
    check_one_line_error(hybrid({"-m", dir, "--batch-file", file, "-n", "2"}), 6, "no finite logits");
    // the REPL: the error, and no empty answer line before it (the seventh session's fresh-user test)
    const Run chat = hybrid({"-m", dir, "-i", "-n", "2"}, "hi\n");
    check_one_line_error(chat, 6, "no finite logits");
    CHECK(chat.out.empty());
}

// A model.safetensors header with a bad tensor entry: exit 2 with one line naming the file, the tensor, the field and
// what was found (it was "header JSON: expected '{'" / "header JSON: expected a non-negative integer").
TEST_CASE("cli: a bad tensor entry in model.safetensors names the tensor and the field", "[cli]") {
    if (!have_programs()) return;
    hy::test::TempDir tmp;
    const std::string dir = tmp / "badheader";
    hy::test::TensorMap t = hy::test::read_safetensors(hy::test::tiny_dir() + "/model.safetensors");
    t.at("model.norm.weight").shape = {-256};
    hy::test::write_model_dir(dir, t, hy::test::read_text(hy::test::tiny_dir() + "/config.json"));
    check_one_line_error(hybrid({"-m", dir, "-p", "hi", "-n", "2"}), 2,
                         "model.safetensors: tensor 'model.norm.weight': shape: expected a non-negative integer, "
                         "found -256");
    const std::string header = R"({"model.norm.weight":[256]})";
    std::string image(8, '\0');
    for (int i = 0; i < 8; i++) image[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
    hy::test::write_text(dir + "/model.safetensors", image + header);
    check_one_line_error(hybrid({"-m", dir, "-p", "hi", "-n", "2"}), 2,
                         "model.safetensors: tensor 'model.norm.weight': expected an object (dtype, shape, "
                         "data_offsets), found an array");
}

// A required config.json field given as null: exit 2, named as null of the wrong type (it read "is missing").
TEST_CASE("cli: a required config.json field of null is named as null", "[cli]") {
    if (!have_programs()) return;
    hy::test::TempDir tmp;
    const std::string dir = tmp / "nullfield";
    nlohmann::json config = nlohmann::json::parse(hy::test::read_text(hy::test::tiny_dir() + "/config.json"));
    config["hidden_size"] = nullptr;
    hy::test::write_model_dir(dir, hy::test::read_safetensors(hy::test::tiny_dir() + "/model.safetensors"),
                              config.dump());
    check_one_line_error(hybrid({"-m", dir, "-p", "hi", "-n", "2"}), 2,
                         "config.json: field 'hidden_size' must be an integer, found null");
}

// A tokenizer without the ChatML tokens: the chat modes refuse the model with exit 2 (an unsupported model file, as
// the help says; it was exit 1), plain completion still runs.
TEST_CASE("cli: a model whose tokenizer has no ChatML tokens is exit 2 in the chat modes", "[cli]") {
    if (!have_programs()) return;
    hy::test::TempDir tmp;
    const std::string dir = tmp / "nochat";
    hy::test::write_model_dir(dir, hy::test::read_safetensors(hy::test::tiny_dir() + "/model.safetensors"),
                              hy::test::read_text(hy::test::tiny_dir() + "/config.json"));
    std::string tok = hy::test::read_text(dir + "/tokenizer.json");
    for (size_t at = tok.find("<|im_start|>"); at != std::string::npos; at = tok.find("<|im_start|>", at))
        tok.replace(at, 12, "<|im_begin|>");
    hy::test::write_text(dir + "/tokenizer.json", tok);
    check_one_line_error(hybrid({"-m", dir, "--chat", "-p", "hi", "-n", "2"}), 2, "unsupported chat template");
    check_one_line_error(hybrid({"-m", dir, "-i"}, "hi\n"), 2, "unsupported chat template");
    CHECK(hybrid({"-m", dir, "-p", "hi", "-n", "2"}).rc == 0);
}

TEST_CASE("cli: endless or blocking inputs are one-line errors: stdin of /dev/zero, a FIFO config.json", "[cli]") {
    if (!have_programs()) return;
    hy::test::TempDir tmp;
    // a REPL line with no end (stdin from /dev/zero) stops at the bound instead of growing without end
    const std::string err_file = tmp / "zero.err";
    const std::string cmd = "cd " + quote(kSrc) + " && " + quote(kBin + "/hybrid") +
                            " -t 1 --device cpu -m models/tiny -i < /dev/zero > /dev/null 2> " + quote(err_file);
    const int st = std::system(cmd.c_str());
    check_one_line_error(Run{WIFEXITED(st) ? WEXITSTATUS(st) : -1, "", slurp(err_file)}, 5,
                         "a line longer than 256 MiB");
    // a copy of the tiny model folder (tmp/name) whose file `file` is a FIFO
    auto with_fifo = [&](const std::string& name, const std::string& file) {
        const std::string dir = tmp / name;
        hy::test::write_model_dir(dir, hy::test::read_safetensors(hy::test::tiny_dir() + "/model.safetensors"),
                                  hy::test::read_text(hy::test::tiny_dir() + "/config.json"));
        fs::remove(dir + "/" + file);
        REQUIRE(::mkfifo((dir + "/" + file).c_str(), 0600) == 0);
        return dir;
    };
    // a model folder whose config.json is a FIFO: exit 2 at once (opening it would wait for a writer)
    const std::string dir = with_fifo("fifo", "config.json");
    check_one_line_error(hybrid({"-m", dir, "-p", "hi", "-n", "2"}), 2, "a FIFO, expected a regular file");
    // model.safetensors a FIFO: named as what it is (it was "no model.safetensors or model.safetensors.index.json")
    const std::string dir2 = with_fifo("fifo_weights", "model.safetensors");
    check_one_line_error(hybrid({"-m", dir2, "-p", "hi", "-n", "2"}), 2, "model.safetensors: not a regular file");
    // hybrid-compare --logits and hybrid-bench --json given a FIFO with no one at the other end: errors, not hangs
    const std::string fifo = tmp / "ff";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    if (fs::exists(kBin + "/hybrid-compare")) {
        const Run c =
            run_prog(kBin + "/hybrid-compare", {"-m", "models/tiny", "-t", "1", "--logits", fifo, "--case", "short"});
        CHECK(c.rc == 5);
        CHECK(c.err.find(fifo + ": not a regular file") != std::string::npos);
    }
    if (fs::exists(kBin + "/hybrid-bench")) {
        const Run b = run_prog(kBin + "/hybrid-bench", {"-m", "models/tiny", "-t", "1", "-p", "4", "-n", "2", "-r", "1",
                                                        "--device", "cpu", "--json", fifo});
        CHECK(b.rc == 5);
        CHECK(b.err.find("a FIFO with no reader") != std::string::npos);
    }
    // the tools' input files: a directory or a device is named as such (it was "invalid JSON", or read as empty)
    for (const char* p : {"hybrid-compare", "hybrid-tokenize"})
        if (!fs::exists(kBin + "/" + p)) return;
    for (const auto& [file, kind] :
         std::vector<std::pair<std::string, std::string>>{{tmp.path, "a directory"}, {"/dev/zero", "a device"}}) {
        const Run c = run_prog(kBin + "/hybrid-compare", {"-m", "models/tiny", "--golden", file});
        INFO(c.err);
        CHECK(c.rc == 5);  // (a file that cannot be read: 5, as in hybrid)
        CHECK(c.err == "hybrid-compare: cannot read '" + file + "': " + kind + ", expected a regular file\n");
        const Run t = run_prog(kBin + "/hybrid-tokenize", {"--tokenizer", "models/tiny", "--bench", file});
        INFO(t.err);
        CHECK(t.rc == 5);
        CHECK(t.err == "hybrid-tokenize: cannot read '" + file + "': " + kind + ", expected a regular file\n");
    }
}

// llama.cpp's single-dash spellings (-ngl, -sys, -no-cnv) were read by cxxopts as a short option with a value:
// "invalid value 'gl' for -n". They are unknown options, named as given (from the final fresh-user test), with
// what to use instead: llama.cpp options hybrid has no use for say why, a single-dash long option names its
// two-dash spelling (the seventh session's fresh-user test: "--ngl" was suggested, which does not exist either).
TEST_CASE("cli: single-dash words are unknown options, not -n or -s with a value", "[cli]") {
    if (!have_programs()) return;
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"-ngl", "99"}, "unknown option -ngl (hybrid has no per-layer offload: --device cuda"},
        {{"--n-gpu-layers", "99"}, "unknown option --n-gpu-layers (hybrid has no per-layer offload"},
        {{"--n-gpu-layers=99"}, "unknown option --n-gpu-layers=99 (hybrid has no per-layer offload"},
        {{"-sys", "hi"}, "unknown option -sys (the system message is --system)"},
        {{"-no-cnv"}, "unknown option -no-cnv (one-shot generation is the default; -i starts the chat)"},
        {{"-fa"}, "unknown option -fa (attention always runs as fused kernels)"},
        {{"-temp", "0"}, "unknown option -temp (did you mean --temp? long options take two dashes)"},
        {{"-verbose"}, "unknown option -verbose (did you mean --verbose?"},
        {{"-xyz"}, "unknown option -xyz (-h lists the options)"},
        // with a value attached (the eighth session's fresh-user test: "invalid value 'emp=0.5' for -t")
        {{"-temp=0.5"}, "unknown option -temp=0.5 (did you mean --temp? long options take two dashes)"},
        {{"-ngl99"}, "unknown option -ngl99 (hybrid has no per-layer offload"},
        {{"-ngl=99"}, "unknown option -ngl=99 (hybrid has no per-layer offload"},
        {{"--", "-n", "3"}, "unexpected argument '-n'"},  // operands after --, as given (it said '--n-predict')
        {{"-p"}, "-p needs a value"}};
    for (const auto& [extra, msg] : cases) {
        std::vector<std::string> args = {"-m", "models/tiny", "-p", "x", "-n", "1"};
        args.insert(args.end(), extra.begin(), extra.end());
        check_one_line_error(hybrid(args), 1, msg);
    }
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--top-p", "1.5"}), 1,
                         "--top-p must be in [0, 1], got 1.5");
    // the value as typed (float(1.0000001) > 1, but "%g" showed it as "got 1")
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--min-p", "1.0000001"}), 1,
                         "--min-p must be in [0, 1], got 1.0000001 (see --help)");
    // ... and checked before float rounding (1.00000001 is 1 as a float: it was taken)
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--top-p", "1.00000001"}), 1,
                         "--top-p must be in [0, 1], got 1.00000001 (see --help)");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--repeat-penalty", "-0"}), 1,
                         "--repeat-penalty must be > 0, got -0");
    CHECK(hybrid({"-m", "models/tiny", "-n", "1", "-cnv"}, "hi\n").rc == 0);  // llama.cpp's -cnv is taken
    CHECK(hybrid({"-m", "models/tiny", "-p", "-ngl", "-n", "1"}).rc == 0);    // a value that looks like one is fine
    // ... also over several lines (a Markdown list as the prompt: cxxopts refused it as --prompt=VALUE)
    CHECK(hybrid({"-m", "models/tiny", "-p", "- a\n- b", "-n", "1"}).rc == 0);
    CHECK(hybrid({"-m", "models/tiny", "--prompt=a\nb", "-n", "1"}).rc == 0);    // (cxxopts refused it as one word)
    CHECK(hybrid({"-m", "models/tiny", "-p", "x", "-n-1", "-c", "8"}).rc == 0);  // -n "-1", not a word -n-1
    // unknown options are named once (the eighth session's last fresh-user test: "unknown option --unknown option")
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--bogus"}), 1,
                         "hybrid: error: unknown option --bogus (-h lists the options)");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-x"}), 1, "hybrid: error: unknown option -x (");
    // -p=hi was the prompt "=hi": the two spellings that work are named
    check_one_line_error(hybrid({"-m", "models/tiny", "-p=hi"}), 1,
                         "-p takes its value as the next word: -p hi, or --prompt=hi");
    check_one_line_error(hybrid({"-m", "models/tiny", "-np=4"}), 1, "-np takes its value as the next word");
    // a forgotten value: `-m -p hi` made "-p" the model folder ("unexpected argument 'hi'"); prompts stay free text
    check_one_line_error(hybrid({"-m", "-p", "hi", "-n", "3"}), 1,
                         "hybrid: error: -m needs a value (the next word, -p, is an option)");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-c", "--temp", "0"}), 1,
                         "-c needs a value (the next word, --temp, is an option)");
    CHECK(hybrid({"-m", "models/tiny", "-p", "-n", "-n", "1"}).rc == 0);  // the prompt "-n"
    // ... and when that leaves a word over, the error says which option took the flag (it named only '5')
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "-n", "5"}), 1,
                         "unexpected argument '5' (--prompt took '-n' as its value: is a value missing?)");
    check_one_line_error(hybrid({"-m", "models/tiny", "--stop", "-n", "3", "-p", "x"}), 1,
                         "unexpected argument '3' (--stop took '-n' as its value: is a value missing?)");
    check_one_line_error(hybrid({"-m", "-cnv"}), 1, "-m needs a value (the next word, -cnv, is an option)");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-n", "--temp=0"}), 1,
                         "-n needs a value (the next word, --temp=0, is an option)");
    // -i=true was "unknown option -="
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "-i=true"}), 1, "-i takes no value: write -i alone");
}

// --no-cuda-graphs on the CPU: a note that it is ignored, as hybrid-bench and hybrid-compare print (it was silent);
// the output is the same.
TEST_CASE("cli: --no-cuda-graphs on the CPU is noted as ignored", "[cli]") {
    if (!have_programs()) return;
    const std::vector<std::string> args = {"-m", "models/tiny", "-p", "def main():", "-n", "4", "--temp", "0"};
    std::vector<std::string> no_graphs = args;
    no_graphs.push_back("--no-cuda-graphs");
    const Run with = hybrid(no_graphs);
    const Run without = hybrid(args);
    INFO(with.err);
    CHECK(with.rc == 0);
    CHECK(with.err == "hybrid: note: --no-cuda-graphs only changes the CUDA backend; ignored on cpu\n");
    CHECK(with.out == without.out);
    CHECK(without.rc == 0);
    CHECK(without.err.find("note:") == std::string::npos);
}

// --no-think with a tokenizer that has no <think>/</think> added tokens renders like thinking on: a warning says the
// option does nothing (the seventh session's fresh-user test: it was silent).
TEST_CASE("cli: --no-think without think tokens is a warning", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("nothink");
    const fs::path dir = tmp.path / "model";
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"})
        fs::copy_file(fs::path(kSrc) / "models/tiny" / f, dir / f);
    std::ifstream in(fs::path(kSrc) / "models/tiny/tokenizer.json");
    nlohmann::json tok = nlohmann::json::parse(in);
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& a : tok["added_tokens"])
        if (a["content"] != "<think>" && a["content"] != "</think>") kept.push_back(a);
    REQUIRE(kept.size() + 2 == tok["added_tokens"].size());
    tok["added_tokens"] = kept;
    std::ofstream(dir / "tokenizer.json") << tok.dump();
    const Run r = hybrid({"-m", dir.string(), "--chat", "--no-think", "-p", "hi", "-n", "1"});
    INFO(r.err);
    CHECK(r.rc == 0);
    CHECK(r.err.find("warning: --no-think has no effect: the tokenizer has no <think> and </think> tokens") !=
          std::string::npos);
    const Run plain = hybrid({"-m", "models/tiny", "--chat", "--no-think", "-p", "hi", "-n", "1"});
    CHECK(plain.rc == 0);
    CHECK(plain.err.find("warning") == std::string::npos);
}

// A copy of models/tiny's checkpoint and tokenizer files in `dir` (no generation_config.json: the test writes its
// own), and hybrid run on a model folder with `base` and then `extra` after -m.
static void copy_tiny_model(const fs::path& dir) {
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
        fs::copy_file(fs::path(kSrc) / "models/tiny" / f, dir / f);
}
static Run hybrid_on(const std::string& model, const std::vector<std::string>& base, std::vector<std::string> extra) {
    std::vector<std::string> args = {"-m", model};
    args.insert(args.end(), base.begin(), base.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return hybrid(args);
}

// Sampling options not given take the model folder's generation_config.json values (as transformers and vLLM);
// given ones win; a bad value is a warning naming the file and field, and the field is ignored.
TEST_CASE("cli: generation_config.json gives the sampling defaults", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("genconfig");
    const fs::path dir = tmp.path / "model";
    copy_tiny_model(dir);
    const std::vector<std::string> base = {"-p", "def main():", "-n", "16", "-s", "7"};
    auto run_with = [&](const std::string& model, std::vector<std::string> extra) {
        return hybrid_on(model, base, std::move(extra));
    };
    const Run greedy = run_with("models/tiny", {"--temp", "0"});
    const Run sampled = run_with("models/tiny", {});
    REQUIRE(greedy.rc == 0);
    REQUIRE(sampled.rc == 0);
    REQUIRE(greedy.out != sampled.out);  // (seed 7 samples something else than the arg max here)
    // "do_sample": false: greedy unless --temp says otherwise
    std::ofstream(dir / "generation_config.json") << R"({"do_sample": false, "eos_token_id": 1})";
    const Run g = run_with(dir.string(), {"--verbose"});
    INFO(g.err);
    CHECK(g.rc == 0);
    CHECK(g.out == greedy.out);
    CHECK(g.err.find("temp 0 (greedy), ") != std::string::npos);
    CHECK(g.err.find("top-k") == std::string::npos);  // (greedy: the truncation samplers are not listed)
    CHECK(g.err.find("seed ") == std::string::npos);  // (nor the seed, which greedy does not use)
    CHECK(g.err.find("(temp from generation_config.json)") != std::string::npos);
    CHECK(run_with(dir.string(), {"--temp", "0.8"}).out == sampled.out);
    // the recommended values, as if given on the command line
    std::ofstream(dir / "generation_config.json", std::ios::trunc)
        << R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "repetition_penalty": null})";
    const Run rec = run_with(dir.string(), {"--verbose"});
    INFO(rec.err);
    CHECK(rec.rc == 0);
    CHECK(rec.out == run_with("models/tiny", {"--temp", "0.6", "--top-k", "20", "--top-p", "0.9"}).out);
    CHECK(rec.err.find("(temp, top-k, top-p from generation_config.json)") != std::string::npos);
    CHECK(run_with(dir.string(), {"--temp", "0.6", "--top-k", "40", "--top-p", "0.9"}).out ==
          run_with("models/tiny", {"--temp", "0.6", "--top-p", "0.9"}).out);  // a given option wins
    // a bad value: a one-line warning naming the file and field, which is ignored (the file is optional; it made
    // the model unloadable even when the option was given)
    std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"temperature": "hot", "top_k": 20})";
    const Run hot = run_with(dir.string(), {"--temp", "0"});
    INFO(hot.err);
    CHECK(hot.rc == 0);
    CHECK(hot.out == greedy.out);
    CHECK(hot.err == "hybrid: warning: " + (dir / "generation_config.json").string() +
                         ": field 'temperature' must be a number, found \"hot\": ignored\n");
    CHECK(run_with(dir.string(), {"--temp", "0.8"}).out == run_with("models/tiny", {"--top-k", "20"}).out);
    std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"top_p": 1.5, "top_k": 2.5})";
    const Run two = run_with(dir.string(), {});
    CHECK(two.rc == 0);
    CHECK(two.err.find("field 'top_p' must be in [0, 1], found 1.5: ignored; field 'top_k' must be an integer, "
                       "found 2.5: ignored\n") != std::string::npos);
    CHECK(std::count(two.err.begin(), two.err.end(), '\n') == 1);
    // a repetition_penalty applies to the whole context, as transformers and vLLM apply it
    std::ofstream(dir / "generation_config.json", std::ios::trunc) << R"({"repetition_penalty": 1.3})";
    const Run pen = run_with(dir.string(), {"--verbose"});
    CHECK(pen.err.find("repeat-penalty 1.3 (the whole context)") != std::string::npos);
    CHECK(pen.err.find("(repeat-penalty, repeat-last-n from generation_config.json)") != std::string::npos);
    CHECK(pen.out == run_with("models/tiny", {"--repeat-penalty", "1.3", "--repeat-last-n", "-1"}).out);
    // ... but a --repeat-penalty given keeps the default window (the final fresh-user test: it took the file's)
    const Run own = run_with(dir.string(), {"--verbose", "--repeat-penalty", "1.2"});
    INFO(own.err);
    CHECK(own.err.find("repeat-penalty 1.2 (last 64)") != std::string::npos);
    CHECK(own.err.find("from generation_config.json") == std::string::npos);
}

// Ctrl-C during the prefill of a long prompt ends the program within a prefill step (it waited for the whole prompt:
// about 20 s for this one on the CPU; from the fresh-user test).
TEST_CASE("cli: Ctrl-C during a long prompt's prefill exits 130 promptly", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("prefill_int");
    const std::string file = (tmp.path / "long.txt").string();
    {
        std::ofstream f(file);
        for (int i = 0; i < 5000; i++) f << (i ? " w" : "w") << i;  // about 24,000 tokens
    }
    Spawned h = spawn_hybrid({"-m", "models/tiny", "-f", file, "-c", "32768", "-n", "4"});
    wait_loaded(h);
    INFO(h.err);
    ::usleep(500000);  // well inside the prefill
    const auto t_int = std::chrono::steady_clock::now();
    ::kill(h.pid, SIGINT);
    int st = 0;
    pid_t r = 0;
    while ((r = ::waitpid(h.pid, &st, WNOHANG)) == 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_int).count() < 10.0)
        ::usleep(10000);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_int).count();
    if (r == 0) {
        ::kill(h.pid, SIGKILL);
        ::waitpid(h.pid, &st, 0);
    }
    for (int fd : {h.in, h.out, h.err_fd}) ::close(fd);
    CHECK(r == h.pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 130);
    CHECK(waited < 5.0);
}

// Ctrl-C during --batch-file: every unfinished prompt still gets its JSON line, with stop_reason "cancelled", the
// exit code is 130, and stderr says so (the seventh session's fresh-user test: no word on stderr).
TEST_CASE("cli: Ctrl-C during --batch-file cancels the unfinished prompts and says so", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("batch_int");
    const std::string file = (tmp.path / "prompts.txt").string();
    std::ofstream(file) << "def main():\nclass Foo:\n";
    Spawned h = spawn_hybrid({"-m", "models/tiny", "--batch-file", file, "-n", "-1", "-c", "8192", "--temp", "0"});
    wait_loaded(h);
    ::usleep(500000);  // well inside the generation (8,000 tokens each)
    ::kill(h.pid, SIGINT);
    ::close(h.in);
    std::string out;
    char buf[4096];
    for (ssize_t k; (k = ::read(h.out, buf, sizeof buf)) > 0;) out.append(buf, size_t(k));
    for (ssize_t k; (k = ::read(h.err_fd, buf, sizeof buf)) > 0;) h.err.append(buf, size_t(k));
    int st = 0;
    ::waitpid(h.pid, &st, 0);
    ::close(h.out);
    ::close(h.err_fd);
    INFO(h.err);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 130);
    CHECK(h.err.find("hybrid: interrupted (Ctrl-C): the unfinished prompts end with stop_reason \"cancelled\"") !=
          std::string::npos);
    std::istringstream lines(out);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) {
        const auto j = nlohmann::json::parse(line);
        CHECK(j["stop_reason"] == "cancelled");
        n++;
    }
    CHECK(n == 2);
}

TEST_CASE("cli: small messages: thread count, plurals, batch prompt numbering, embed_example arguments", "[cli]") {
    if (!have_programs()) return;
    // --verbose prints the thread count in use, never "threads 0"
    const Run all =
        run_prog(kBin + "/hybrid", {"-m", "models/tiny", "--device", "cpu", "-p", "x", "-n", "1", "--verbose"});
    CHECK(all.rc == 0);
    CHECK(all.err.find("threads 0") == std::string::npos);
    CHECK(all.err.find("(all cores)") != std::string::npos);
    CHECK(hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "--verbose"}).err.find("threads 1,") != std::string::npos);
    // "1 token"
    check_one_line_error(hybrid({"-m", "models/tiny", "--prompt-ids", "5", "-c", "1"}), 3, "has 1 token but");
    // batch prompts: numbered from 0 as the JSON "index", with the file's line
    TempDir tmp("small");
    const std::string file = (tmp.path / "prompts.txt").string();
    std::ofstream(file) << "a\n\n\nhello world this is a longer prompt\n";
    check_one_line_error(hybrid({"-m", "models/tiny", "--batch-file", file, "-c", "3"}), 3, "batch prompt 1 (line 4)");
    // the help lists \0 among the escapes
    CHECK(hybrid({"--help"}).out.find("\\0") != std::string::npos);
    // embed_example: counts must be whole numbers in range
    const std::string ex = kBin + "/embed_example";
    for (const std::vector<std::string>& a :
         std::vector<std::vector<std::string>>{{"models/tiny", "x", "-5"},
                                               {"models/tiny", "x", "abc"},
                                               {"models/tiny", "x", "4x"},
                                               {"models/tiny", "x", "99999999999999999999"},
                                               {"models/tiny", "x", "4", "-1"},
                                               {"models/tiny", "x", "4", "two"},
                                               {"models/tiny", ""}}) {
        const Run r = run_prog(ex, a);
        INFO(r.err);
        CHECK(r.rc == 1);
        CHECK(r.err.find("embed_example: error: ") == 0);
    }
}

// From the new-user pass of issue 24: -m on a link loop or on a folder that is not a model, -t, llama.cpp's flags.
TEST_CASE("cli: model folder messages, -t -1 and -t past the cores, llama.cpp flag hints", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("folders");
    fs::create_symlink(tmp.path / "loop", tmp.path / "loop");
    check_one_line_error(hybrid({"-m", (tmp.path / "loop").string(), "-p", "x"}), 2, "loop: symbolic link loop");
    // the parent of a model folder: named as not a model, not a complaint about tokenizer.json
    check_one_line_error(hybrid({"-m", "models", "-p", "x"}), 2, "models: not a model folder (no config.json)");
    check_one_line_error(hybrid({"-m", tmp.path.string(), "-p", "x"}), 2, "not a model folder (no config.json)");
    // a broken config.json in a folder without tokenizer.json: the config is named first (fresh-user pass)
    fs::create_directories(tmp.path / "garbage");
    std::ofstream(tmp.path / "garbage" / "config.json") << "{\"model_type\": ";
    const Run garbage = hybrid({"-m", (tmp.path / "garbage").string(), "-p", "x"});
    INFO(garbage.err);
    CHECK(garbage.rc != 0);
    CHECK(garbage.err.find("config.json") != std::string::npos);
    CHECK(garbage.err.find("tokenizer.json") == std::string::npos);
    // -t -1: all cores (llama.cpp's spelling); more threads than cores: a warning
    auto with_t = [](const std::string& t, const std::vector<std::string>& more = {}) {
        std::vector<std::string> a = {"--device", "cpu", "-m", "models/tiny", "-p", "x", "-n", "1", "-t", t};
        a.insert(a.end(), more.begin(), more.end());
        return run_prog(kBin + "/hybrid", a);
    };
    const Run all = with_t("-1", {"--verbose"});
    CHECK(all.rc == 0);
    CHECK(all.err.find("(all cores)") != std::string::npos);
    const Run many = with_t("1000");
    CHECK(many.rc == 0);
    CHECK(many.err.find("hybrid: warning: -t 1000 is more than the ") != std::string::npos);
    CHECK(with_t("1").err.find("warning") == std::string::npos);
    check_one_line_error(with_t("-2"), 1, "-t must be -1 or in [0, 1024] (0 or -1: all cores), got -2");
    // llama.cpp's flags that hybrid does without get a hint, as -ngl does
    for (const auto& [flag, hint] : std::vector<std::pair<std::string, std::string>>{
             {"-e", "escapes in -p are processed by default"},
             {"--escape", "escapes in -p are processed by default"},
             {"--color", "hybrid writes plain text"},
             {"--mlock", "the weights are copied into the model's arena"},
             {"--no-mmap", "the weights are copied into the model's arena"}})
        check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", flag}), 1, "unknown option " + flag + " (" + hint);
}

// -c 0 is the trained context (llama.cpp's meaning); a context whose state cannot fit the machine's memory is refused
// before anything is allocated, with the sizes; state pages no sequence reaches are not touched (-c 10000000 on
// models/tiny zeroed a 9.9 GB arena for 27 s); a prompt far too long is refused before it is tokenized.
TEST_CASE("cli: -c 0, a context too large for the memory, a prompt far too long", "[cli]") {
    if (!have_programs()) return;
    const Run trained = hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "-c", "0", "--verbose"});
    INFO(trained.err);
    CHECK(trained.rc == 0);
    CHECK(trained.err.find("ctx 32768,") != std::string::npos);
    CHECK(trained.err.find("warning") == std::string::npos);
    // 1 KiB of KV cache per position: 2e9 positions are 1.9 TiB
    const Run huge = hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "-c", "2000000000"});
    check_one_line_error(huge, 2, "GiB of host memory; a context of up to ");
    CHECK(huge.err.find("KV cache and states 1907.35 GiB for a context of 2000000000 positions") != std::string::npos);
    // 4 GB of context for a 30 MB model: loads without making the state resident
    struct rusage before {};
    ::getrusage(RUSAGE_CHILDREN, &before);
    const Run big = hybrid({"-m", "models/tiny", "-p", "x", "-n", "2", "-c", "4000000", "--temp", "0"});
    struct rusage after {};
    ::getrusage(RUSAGE_CHILDREN, &after);
    INFO(big.err);
    if (big.rc == 2 && big.err.find("of host memory") != std::string::npos) {
        WARN("a machine with less than 4 GB of memory: the large context was refused");
    } else {
        CHECK(big.rc == 0);
        CHECK(after.ru_maxrss < 1024 * 1024);  // KiB: well below the 3.8 GiB arena
    }
    // a prompt whose bytes alone cannot fit: refused before it is tokenized
    const std::string many(4 << 20, 'x');
    TempDir tmp("bigprompt");
    const std::string file = (tmp.path / "p.txt").string();
    std::ofstream(file) << many;
    const auto t0 = std::chrono::steady_clock::now();
    check_one_line_error(hybrid({"-m", "models/tiny", "-f", file, "-c", "64"}), 3,
                         "the prompt has 4194304 bytes, so at least ");
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 20.0);
    // a long prompt's prefill shows its progress on a terminal (erased before the output)
    std::string code;
    for (int i = 0; i < 700; i++) code += "x = x + " + std::to_string(i) + "\n";
    std::ofstream(file, std::ios::trunc) << code;
    std::string out;
    CHECK(run_on_pty({"-m", "models/tiny", "-f", file, "-n", "2", "--temp", "0", "-c", "8192"}, {}, &out) == 0);
    INFO(out);
    CHECK(out.find("hybrid: prefill 512/") != std::string::npos);
    CHECK(out.find("tokens (") != std::string::npos);
    CHECK(hybrid({"-m", "models/tiny", "-f", file, "-n", "2", "--temp", "0", "-c", "8192"}).err.find("prefill") ==
          std::string::npos);  // (not a terminal: nothing)
}

TEST_CASE("cli: a context beyond the trained positions is allowed with a warning", "[cli]") {
    if (!have_programs()) return;
    const Run r = hybrid({"-m", "models/tiny", "-p", "x", "-n", "2", "--temp", "0", "-c", "40000"});
    REQUIRE(r.rc == 0);
    REQUIRE(r.err.find("warning: -c 40000 is larger than the 32768 positions") != std::string::npos);
    const Run ok = hybrid({"-m", "models/tiny", "-p", "x", "-n", "2", "--temp", "0", "-c", "512"});
    REQUIRE(ok.err.find("warning") == std::string::npos);
}

// --ignore-eos (llama.cpp's flag; the server's ignore_eos): generation goes on past an end-of-sequence id until -n.
// models/tiny never picks its EOS, so a copy names id 7 (its greedy first pick after the ids 0,0,0,0) as EOS.
TEST_CASE("cli: --ignore-eos generates past the end-of-sequence id", "[cli]") {
    if (!have_programs()) return;
    TempDir tmp("ignore_eos");
    const fs::path dir = tmp.path / "model";
    copy_tiny_model(dir);
    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 7})";
    const std::vector<std::string> base = {"--prompt-ids", "0,0,0,0", "-n", "5", "--temp", "0"};
    auto run_with = [&](const std::string& model, std::vector<std::string> extra) {
        return hybrid_on(model, base, std::move(extra));
    };
    const Run plain = run_with("models/tiny", {});
    REQUIRE(plain.rc == 0);
    REQUIRE(plain.out.rfind("7,", 0) == 0);  // (the greedy pick the copy's EOS is chosen from)
    const Run stopped = run_with(dir.string(), {});
    const Run ignored = run_with(dir.string(), {"--ignore-eos"});
    INFO(stopped.out << "|" << ignored.out << "|" << ignored.err);
    CHECK(stopped.rc == 0);
    CHECK(stopped.out.find('7') == std::string::npos);  // stopped at once: no id printed
    CHECK(ignored.rc == 0);
    CHECK(ignored.out == plain.out);  // the same 5 ids as the model without the EOS
    check_one_line_error(hybrid({"-m", "models/tiny", "-i", "--ignore-eos"}), 1, "--ignore-eos is not for -i");
}
