// Integer weights through the programs (issue 21): --quant int8/int4 in hybrid and the tools, the bad values, and
// hybrid-perplexity's quality check of both against the 16-bit model of models/tiny on the held-out Python text
// (tests/data/text/heldout.py; README "Weight quantization" and BENCHMARKS.md record the numbers).
#include "cli_util.h"
#include "test_util.h"

using namespace hy::test::cli_util;

TEST_CASE("--quant: int8 and int4 run models/tiny; bad groups are one clear line", "[cli][int]") {
    if (!have_programs()) return;
    for (const char* q : {"int8", "int4", "int4:128"}) {
        const Run ok = hybrid({"-m", "models/tiny", "-p", "def main():", "-n", "4", "--temp", "0", "--quant", q});
        INFO(q << ": " << ok.err);
        CHECK(ok.rc == 0);
        CHECK(!ok.out.empty());
    }
    // hidden 256 and intermediate 768: groups of 512 divide neither
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--quant", "int4:512"}), 2,
                         "weight quantization int4 with groups of 512 weights does not fit");
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--quant", "int8:48"}), 1,
                         "--quant must be none, fp8, int8, int4, int8:G or int4:G (G 32 or a multiple of 64 up to "
                         "1024), got 'int8:48'");
    const Run b = run_prog(kBin + "/hybrid-bench", {"-m", "models/tiny", "--quant", "int4:0"});
    CHECK(b.rc == 1);
    CHECK(b.err.find("got 'int4:0'") != std::string::npos);
    const Run p = run_prog(kBin + "/hybrid-perplexity", {"-m", "models/tiny", "-f", "README.md", "--quant-lm-head"});
    CHECK(p.rc == 1);
    CHECK(p.err.find("--quant-lm-head needs --quant int8 or int4") != std::string::npos);
    // --quant-lm-head: the same rule and words in hybrid and hybrid-bench; with int4 it runs
    check_one_line_error(hybrid({"-m", "models/tiny", "-p", "x", "--quant", "fp8", "--quant-lm-head"}), 1,
                         "--quant-lm-head needs --quant int8 or int4");
    const Run bl = run_prog(kBin + "/hybrid-bench", {"-m", "models/tiny", "--quant-lm-head"});
    CHECK(bl.rc == 1);
    CHECK(bl.err.find("--quant-lm-head needs --quant int8 or int4") != std::string::npos);
    const Run lm = hybrid({"-m", "models/tiny", "-p", "def main():", "-n", "4", "--temp", "0", "--quant", "int4",
                           "--quant-lm-head", "--verbose"});
    INFO(lm.err);
    CHECK(lm.rc == 0);
    CHECK(!lm.out.empty());
    // --verbose names the loaded weights' formats and the quantization on its "loaded on" line
    CHECK(lm.err.find(", vocab 4096, weights Q4 ") != std::string::npos);
    CHECK(lm.err.find("% (quantized to int4 at load in groups of 32, lm_head too)\n") != std::string::npos);
    const Run v8 = hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "--quant", "int8", "--verbose"});
    CHECK(v8.err.find(", vocab 4096, weights Q8 ") != std::string::npos);
    CHECK(v8.err.find("% (quantized to int8 at load in groups of 64)\n") != std::string::npos);
    // a compressed-tensors int4 checkpoint: Q4 without --quant; the 16-bit model: its own type
    const Run w4 = hybrid({"-m", "tests/data/models/tiny-w4a16", "-p", "x", "-n", "1", "--verbose"});
    CHECK(w4.rc == 0);
    CHECK(w4.err.find(", vocab 4096, weights Q4 ") != std::string::npos);
    const Run bf = hybrid({"-m", "models/tiny", "-p", "x", "-n", "1", "--verbose"});
    CHECK(bf.err.find(", vocab 4096, weights BF16\n") != std::string::npos);
}

TEST_CASE("hybrid-perplexity: --quant int8 within 1% of 16-bit and top-1 >= 97%, int4 within 6% and >= 88%",
          "[cli][int]") {
    if (!have_programs()) return;
    const std::string ppl = kBin + "/hybrid-perplexity", text = "tests/data/text/heldout.py";
    TempDir d("int_perplexity");
    const std::string base = (d.path / "base.kl").string();
    const Run b = run_prog(
        ppl, {"-m", "models/tiny", "-f", text, "--ctx", "256", "--device", "cpu", "-t", "2", "--save-logits", base});
    INFO(b.out << b.err);
    REQUIRE(b.rc == 0);
    // The thresholds, checked by hybrid-perplexity itself (exit 7 when missed).
    const std::vector<std::tuple<std::string, std::string, std::string, std::string>> cases = {
        {"int8", "1.01", "0.97", "weights: --quant int8, groups of 64, lm_head 16-bit"},
        {"int4", "1.06", "0.88", "weights: --quant int4, groups of 32, lm_head 16-bit"},
    };
    for (const auto& [quant, ratio, top1, line] : cases) {
        const Run q =
            run_prog(ppl, {"-m", "models/tiny", "-f", text, "--ctx", "256", "--device", "cpu", "-t", "2", "--quant",
                           quant, "--kl-base", base, "--max-ppl-ratio", ratio, "--min-top1", top1});
        INFO(quant << ": " << q.out << q.err);
        CHECK(q.rc == 0);
        CHECK(q.out.find(line) != std::string::npos);
    }
    // A run that misses a threshold fails (exit 7): int4 against a ratio bound only int8 could meet.
    const Run strict = run_prog(ppl, {"-m", "models/tiny", "-f", text, "--ctx", "256", "--device", "cpu", "-t", "2",
                                      "--quant", "int4", "--kl-base", base, "--max-ppl-ratio", "1.001"});
    CHECK(strict.rc == 7);
}
