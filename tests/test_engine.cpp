// engine.h tests on the bundled models/tiny: golden greedy ids through the C API, log-probabilities, stop
// conditions, snapshots (memory and file, another model refused), batched decode, error codes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "engine.h"
#include "model/fnv.h"
#include "model/snapshot.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kTiny = std::string(HY_SOURCE_DIR) + "/models/tiny";

nlohmann::json golden_case(const std::string& name) {
    std::ifstream in(kTiny + "/golden.json");
    nlohmann::json g = nlohmann::json::parse(in);
    for (const auto& c : g["cases"])
        if (c["name"] == name) return c;
    FAIL("no golden case " << name);
    return {};
}

struct Collect {
    std::vector<int32_t> ids;
    std::vector<float> logprobs;
    std::string text;
    int stop_after = -1;  // stop when this many ids were seen
};

int collect(const hy_token_info* t, void* ud) {
    auto* c = static_cast<Collect*>(ud);
    c->text.append(t->text, t->text_len);
    if (t->id < 0) return 0;
    c->ids.push_back(t->id);
    c->logprobs.push_back(t->logprob);
    return c->stop_after >= 0 && int(c->ids.size()) >= c->stop_after ? 1 : 0;
}

struct Tiny {
    hy_model* m = nullptr;
    hy_context* c = nullptr;
    hy_sampler* s = nullptr;
    explicit Tiny(int n_ctx = 512, int n_slots = 1, const std::string& dir = kTiny) {
        hy_model_params mp = hy_model_default_params();
        mp.device = HY_DEVICE_CPU;
        mp.n_threads = 1;  // a busy machine slows OpenMP teams down a lot; the tiny model needs no more
        mp.n_ctx = n_ctx;
        mp.n_slots = n_slots;
        REQUIRE(hy_model_load(dir.c_str(), &mp, &m) == HY_OK);
        REQUIRE(hy_context_new(m, nullptr, &c) == HY_OK);
        hy_sampler_params sp = hy_sampler_default_params();
        sp.temperature = 0.0f;
        REQUIRE(hy_sampler_new(m, &sp, &s) == HY_OK);
    }
    ~Tiny() {
        hy_sampler_free(s);
        hy_context_free(c);
        hy_model_free(m);
    }
    std::vector<int32_t> tokenize(const std::string& text) {
        int n = 0;
        hy_tokenize(m, text.data(), ptrdiff_t(text.size()), 1, nullptr, 0, &n);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        REQUIRE(hy_tokenize(m, text.data(), ptrdiff_t(text.size()), 1, ids.data(), n, &n) == HY_OK);
        return ids;
    }
    hy_generate_result generate(const std::vector<int32_t>& prompt, int max_tokens, Collect& out,
                                const std::vector<const char*>& stops = {}) {
        hy_generate_params gp = hy_generate_default_params();
        gp.max_tokens = max_tokens;
        gp.on_token = collect;
        gp.user_data = &out;
        gp.stop = stops.data();
        gp.n_stop = int(stops.size());
        hy_generate_result r;
        REQUIRE(hy_generate(c, s, prompt.data(), int(prompt.size()), &gp, &r) == HY_OK);
        return r;
    }
};

}  // namespace

TEST_CASE("engine: status codes and defaults", "[engine]") {
    CHECK(HY_ERR_MODEL_MISMATCH == 5);
    CHECK(std::string(hy_status_name(HY_ERR_CONTEXT_FULL)) == "context full");
    CHECK(std::string(hy_stop_reason_name(HY_STOP_EOS)) == "eos");
    hy_sampler_params sp = hy_sampler_default_params();
    CHECK(sp.temperature == Approx(0.8f));
    CHECK(sp.top_k == 40);
    CHECK(hy_model_default_params().n_ctx == 4096);
    CHECK(hy_model_default_params().quant == HY_QUANT_NONE);
}

TEST_CASE("engine: hy_model_params.quant = HY_QUANT_FP8 quantizes at load; an unknown value is refused", "[engine]") {
    hy_model_params p = hy_model_default_params();
    p.device = HY_DEVICE_CPU;
    p.n_ctx = 64;
    hy_model* m16 = nullptr;
    hy_model* m8 = nullptr;
    REQUIRE(hy_model_load(kTiny.c_str(), &p, &m16) == HY_OK);
    p.quant = HY_QUANT_FP8;
    REQUIRE(hy_model_load(kTiny.c_str(), &p, &m8) == HY_OK);
    CHECK(hy_model_arena_bytes(m8) < hy_model_arena_bytes(m16));  // (weights 8.6 MiB instead of 15.0 MiB)
    hy_model_free(m8);
    hy_model_free(m16);
    p.quant = 7;
    hy_model* bad = nullptr;
    CHECK(hy_model_load(kTiny.c_str(), &p, &bad) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).find("unknown weight quantization 7") != std::string::npos);
    CHECK(bad == nullptr);
}

// hy_model_params.progress: fractions in (0, 1], non-decreasing, 1 exactly once and last, several calls on the way
// (16-bit and int4-quantized loads, the MoE test model's stacked experts too).
TEST_CASE("engine: the load reports its progress", "[engine]") {
    struct Seen {
        std::vector<float> f;
    };
    for (const auto& [dir, quant] :
         {std::pair{kTiny, int(HY_QUANT_NONE)}, std::pair{kTiny, int(HY_QUANT_INT4)},
          std::pair{std::string(HY_SOURCE_DIR) + "/tests/data/models/moe", int(HY_QUANT_FP8)}}) {
        INFO(dir << " quant " << quant);
        hy_model_params p = hy_model_default_params();
        p.device = HY_DEVICE_CPU;
        p.n_ctx = 64;
        p.quant = quant;
        Seen seen;
        p.progress_user_data = &seen;
        p.progress = [](float f, void* u) { static_cast<Seen*>(u)->f.push_back(f); };
        hy_model* m = nullptr;
        REQUIRE(hy_model_load(dir.c_str(), &p, &m) == HY_OK);
        REQUIRE(seen.f.size() >= 3);
        CHECK(seen.f.back() == 1.0f);
        CHECK(std::count(seen.f.begin(), seen.f.end(), 1.0f) == 1);
        CHECK(seen.f.front() > 0.0f);
        CHECK(std::is_sorted(seen.f.begin(), seen.f.end()));
        hy_model_free(m);
    }
}

TEST_CASE("engine: without a generation_config.json the model's sampler defaults are the engine's", "[engine]") {
    Tiny t;
    hy_sampler_params p;
    CHECK(hy_model_sampler_defaults(t.m, &p) == 0);
    const hy_sampler_params d = hy_sampler_default_params();
    CHECK(p.temperature == d.temperature);
    CHECK(p.top_k == d.top_k);
    CHECK(p.top_p == d.top_p);
    CHECK(p.min_p == d.min_p);
    CHECK(p.repeat_penalty == d.repeat_penalty);
    CHECK(hy_model_sampler_defaults(nullptr, &p) == -1);
    CHECK(hy_model_sampler_defaults(t.m, nullptr) == -1);
}

TEST_CASE("engine: tokenize, generate the golden greedy ids and text", "[engine]") {
    const auto g = golden_case("short");
    Tiny t;
    const std::vector<int32_t> ids = t.tokenize(g["prompt"].get<std::string>());
    CHECK(ids == g["input_ids"].get<std::vector<int32_t>>());
    Collect out;
    const hy_generate_result r = t.generate(ids, 48, out);
    CHECK(r.stop_reason == HY_STOP_MAX_TOKENS);
    CHECK(r.n_prompt == 4);
    CHECK(r.n_generated == 48);
    CHECK(r.n_decoded == 47);  // the first id comes from the prompt's logits, the last is not fed
    CHECK(out.ids == g["greedy_fp32_cpu"].get<std::vector<int32_t>>());
    CHECK(out.text == g["greedy_fp32_text"].get<std::string>());
    CHECK(hy_context_n_tokens(t.c) == 4 + 48);

    size_t n = 0;
    REQUIRE(hy_detokenize(t.m, out.ids.data(), int(out.ids.size()), 1, nullptr, 0, &n) == HY_ERR_INVALID_ARGUMENT);
    std::vector<char> buf(n + 1);
    REQUIRE(hy_detokenize(t.m, out.ids.data(), int(out.ids.size()), 1, buf.data(), buf.size(), &n) == HY_OK);
    CHECK(std::string(buf.data()) == out.text);
}

TEST_CASE("engine: log-probabilities are the log-softmax of the raw logits", "[engine]") {
    Tiny t;
    const std::vector<int32_t> ids = t.tokenize("def main():\n    ");
    REQUIRE(hy_prefill(t.c, ids.data(), int(ids.size())) == HY_OK);
    int nl = 0;
    const float* row = hy_context_logits(t.c, &nl);
    REQUIRE(row);
    REQUIRE(nl == hy_model_n_logits(t.m));
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < hy_model_n_vocab(t.m); i++) mx = std::max(mx, double(row[i]));
    for (int i = 0; i < hy_model_n_vocab(t.m); i++) z += std::exp(double(row[i]) - mx);
    int32_t id = -1;
    float lp = 0.0f;
    REQUIRE(hy_sampler_sample(t.s, t.c, &id, &lp) == HY_OK);
    CHECK(lp == Approx(double(row[id]) - mx - std::log(z)).margin(1e-5));
    Collect out;
    t.generate({}, 1, out);  // continue from the current logits
    REQUIRE(out.ids.size() == 1);
    CHECK(out.ids[0] == id);
    CHECK(out.logprobs[0] == Approx(lp));
    CHECK(out.logprobs[0] <= 0.0f);
}

TEST_CASE("engine: stop strings, callback stop, context full", "[engine]") {
    const auto g = golden_case("short");
    const std::string golden_text = g["greedy_fp32_text"].get<std::string>();
    const std::vector<int32_t> prompt = g["input_ids"].get<std::vector<int32_t>>();
    {
        Tiny t;
        Collect out;
        const hy_generate_result r = t.generate(prompt, 48, out, {"isinstance(origin"});
        CHECK(r.stop_reason == HY_STOP_STRING);
        CHECK(out.text == golden_text.substr(0, golden_text.find("isinstance(origin")));
    }
    {
        Tiny t;
        Collect out;
        out.stop_after = 5;
        const hy_generate_result r = t.generate(prompt, 48, out);
        CHECK(r.stop_reason == HY_STOP_CALLBACK);
        CHECK(r.n_generated == 5);
        CHECK(r.n_decoded == 4);
        CHECK(hy_context_n_tokens(t.c) == 4 + 5);
        // the kept ids continue exactly: the next call feeds the pending id first
        Collect more;
        t.generate({}, 10, more);
        std::vector<int32_t> all = out.ids;
        all.insert(all.end(), more.ids.begin(), more.ids.end());
        const auto want = g["greedy_fp32_cpu"].get<std::vector<int32_t>>();
        CHECK(all == std::vector<int32_t>(want.begin(), want.begin() + 15));
    }
    {
        Tiny t(16);
        Collect out;
        const hy_generate_result r = t.generate(prompt, -1, out);
        CHECK(r.stop_reason == HY_STOP_CONTEXT_FULL);
        CHECK(r.n_generated == 16 - 4 + 1);  // the last sampled id cannot be fed
        CHECK(r.n_decoded == 16 - 4);
        std::vector<int32_t> long_prompt(17, 300);
        hy_generate_params gp = hy_generate_default_params();
        CHECK(hy_generate(t.c, t.s, long_prompt.data(), 17, &gp, nullptr) == HY_ERR_CONTEXT_FULL);
        CHECK(std::string(hy_last_error()).find("context length is 16") != std::string::npos);
        // feeding only the pending id: the message says that it is what does not fit
        CHECK(hy_prefill(t.c, nullptr, 0) == HY_ERR_CONTEXT_FULL);
        CHECK(std::string(hy_last_error())
                  .find("would hold 17 tokens; the context length is 16 (counting the last "
                        "generated id, which is not yet fed: 16 tokens are in the context)") != std::string::npos);
    }
}

TEST_CASE("engine: snapshots restore the sequence exactly", "[engine]") {
    const auto g = golden_case("sentence");
    const std::vector<int32_t> prompt = g["input_ids"].get<std::vector<int32_t>>();
    Tiny t;
    REQUIRE(hy_prefill(t.c, prompt.data(), int(prompt.size())) == HY_OK);
    size_t n = 0;
    REQUIRE(hy_state_save(t.c, nullptr, 0, &n) == HY_OK);
    std::vector<uint8_t> snap(n);
    REQUIRE(hy_state_save(t.c, snap.data(), snap.size(), &n) == HY_OK);

    Collect first;
    t.generate({}, 20, first);
    // retry from the snapshot: same ids without recomputing the prompt
    REQUIRE(hy_state_load(t.c, snap.data(), snap.size()) == HY_OK);
    CHECK(hy_context_n_tokens(t.c) == int(prompt.size()));
    Collect again;
    t.generate({}, 20, again);
    CHECK(again.ids == first.ids);
    const auto want = g["greedy_fp32_cpu"].get<std::vector<int32_t>>();
    CHECK(first.ids == std::vector<int32_t>(want.begin(), want.begin() + 20));

    // a snapshot taken mid-generation (with a pending id) continues identically after a file round trip
    const fs::path dir = fs::temp_directory_path() / ("hy_engine_test_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string path = (dir / "chat.snap").string();
    REQUIRE(hy_state_save_file(t.c, path.c_str(), 0) == HY_OK);
    CHECK(hy_state_save_file(t.c, path.c_str(), 0) == HY_ERR_IO);  // never overwritten unless asked
    CHECK(std::string(hy_last_error()).find("exists") != std::string::npos);
    CHECK(hy_state_save_file(t.c, path.c_str(), 1) == HY_OK);
    Collect cont1;
    t.generate({}, 10, cont1);
    REQUIRE(hy_context_reset(t.c) == HY_OK);
    CHECK(hy_context_n_tokens(t.c) == 0);
    CHECK(hy_context_logits(t.c, nullptr) == nullptr);
    REQUIRE(hy_state_load_file(t.c, path.c_str()) == HY_OK);
    Collect cont2;
    t.generate({}, 10, cont2);
    CHECK(cont2.ids == cont1.ids);

    // bad input
    std::vector<uint8_t> junk = {1, 2, 3};
    CHECK(hy_state_load(t.c, junk.data(), junk.size()) == HY_ERR_FORMAT);
    std::vector<uint8_t> cut(snap.begin(), snap.begin() + ptrdiff_t(snap.size() / 2));
    CHECK(hy_state_load(t.c, cut.data(), cut.size()) == HY_ERR_FORMAT);
    CHECK(hy_state_load_file(t.c, (dir / "missing.snap").string().c_str()) == HY_ERR_IO);
    // one changed byte anywhere (the history, the logits, the KV cache and states, the checksum itself) is refused by
    // the checksum, before anything is restored (it used to load, and the next step could sample from NaN); a changed
    // byte of the model fingerprint (bytes 16-23) is damage too, not "another model"
    for (size_t at : {size_t(17), size_t(40), snap.size() / 3, snap.size() / 2, snap.size() - 100, snap.size() - 1}) {
        INFO("byte " << at << " of " << snap.size());
        std::vector<uint8_t> bad = snap;
        bad[at] ^= 0x40;
        CHECK(hy_state_load(t.c, bad.data(), bad.size()) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error()).find("damaged") != std::string::npos);
        CHECK(hy_context_n_tokens(t.c) == 0);
    }
    // cut short: "truncated", not "damaged" (nor "bad magic" when the cut falls inside the magic)
    for (size_t keep :
         {size_t(3), size_t(8), size_t(10), size_t(20), size_t(1000), snap.size() - 100, snap.size() - 1}) {
        INFO("first " << keep << " of " << snap.size() << " bytes");
        CHECK(hy_state_load(t.c, snap.data(), keep) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error()).find("truncated") != std::string::npos);
    }
    {  // a history length field made larger reads as a cut: the message says either (it said "truncated" alone)
        std::vector<uint8_t> bad = snap;
        bad[27] ^= 0x40;  // (the top byte of n_hist, bytes 24-27)
        CHECK(hy_state_load(t.c, bad.data(), bad.size()) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error())
                  .rfind("snapshot is truncated or damaged (its layout runs past the snapshot's ", 0) == 0);
    }
    REQUIRE(hy_state_load(t.c, snap.data(), snap.size()) == HY_OK);  // the intact one still loads
    {  // snapshots of older builds (version 1: no checksum; version 2: a fingerprint of a wrong FNV-1a offset basis)
        // are refused by their version, in one line that says which version this build reads
        std::vector<uint8_t> v2 = snap;
        const uint32_t two = 2, one = 1;
        std::memcpy(v2.data() + 8, &two, 4);
        CHECK(hy_state_load(t.c, v2.data(), v2.size()) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error()).rfind("snapshot version 2, this build reads version 3 (", 0) == 0);
        CHECK(std::string(hy_last_error()).find('\n') == std::string::npos);
        CHECK(hy_context_n_tokens(t.c) == 0);
        for (uint32_t wild : {0u, 252u, 0xffffffffu}) {  // a flipped byte there is damage, not a newer build
            std::vector<uint8_t> bad = snap;
            std::memcpy(bad.data() + 8, &wild, 4);
            CHECK(hy_state_load(t.c, bad.data(), bad.size()) == HY_ERR_FORMAT);
            CHECK(std::string(hy_last_error()).rfind("snapshot is damaged (its version field reads ", 0) == 0);
        }
        std::vector<uint8_t> v1(snap.begin(), snap.end() - 8);
        std::memcpy(v1.data() + 8, &one, 4);
        CHECK(hy_state_load(t.c, v1.data(), v1.size()) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error()).rfind("snapshot version 1, this build reads version 3 (", 0) == 0);
        uint32_t version = 0;
        std::memcpy(&version, snap.data() + 8, 4);
        CHECK(version == 3);
        REQUIRE(hy_state_load(t.c, snap.data(), snap.size()) == HY_OK);
    }

    // another model (same shapes, another config.json) refuses the snapshot
    const fs::path other = dir / "other";
    fs::create_directories(other);
    for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
        fs::copy_file(fs::path(kTiny) / f, other / f, fs::copy_options::overwrite_existing);
    {
        std::ifstream in(kTiny + "/config.json");
        nlohmann::json cfg = nlohmann::json::parse(in);
        cfg["rms_norm_eps"] = 1e-5;
        std::ofstream(other / "config.json") << cfg.dump(2);
    }
    {
        Tiny o(512, 1, other.string());
        CHECK(hy_model_fingerprint(o.m) != hy_model_fingerprint(t.m));
        CHECK(hy_state_load_file(o.c, path.c_str()) == HY_ERR_MODEL_MISMATCH);
        CHECK(std::string(hy_last_error()).find("another model") != std::string::npos);
        CHECK(hy_context_n_tokens(o.c) == 0);
    }
    // the same model with a context too short for the snapshot's tokens: the message says so (not "damaged")
    {
        Tiny s(16);
        CHECK(hy_state_load_file(s.c, path.c_str()) == HY_ERR_CONTEXT_FULL);
        CHECK(std::string(hy_last_error()).find("tokens; the context length is 16") != std::string::npos);
        CHECK(hy_context_n_tokens(s.c) == 0);
    }
    fs::remove_all(dir);
}

TEST_CASE("engine: FNV-1a is the standard 64-bit one; the model fingerprint uses it", "[engine]") {
    // the published FNV-1a 64 test vectors (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
    CHECK(hy::fnv1a("") == 0xcbf29ce484222325ull);
    CHECK(hy::fnv1a("a") == 0xaf63dc4c8601ec8cull);
    CHECK(hy::fnv1a("foobar") == 0x85944171f73967e8ull);
    hy::Fnv1a f;  // byte-wise add() in pieces is the same hash
    f.add("foo", 3);
    f.add("bar", 3);
    CHECK(f.h == hy::fnv1a("foobar"));
    hy::Fnv1a w;  // add_words: the byte-wise hash for fewer than 8 bytes
    w.add_words("abc", 3);
    CHECK(w.h == hy::fnv1a("abc"));
    // a folder without any of the fingerprinted files hashes only the names of config.json and tokenizer.json
    hy::test::TempDir tmp;
    CHECK(hy::fingerprint_folder(tmp.path) == hy::fnv1a("config.jsontokenizer.json"));
}

TEST_CASE("engine: batched decode equals one sequence at a time", "[engine]") {
    Tiny t(256, 2);
    hy_context* c2 = nullptr;
    REQUIRE(hy_context_new(t.m, nullptr, &c2) == HY_OK);
    hy_context* c3 = nullptr;
    CHECK(hy_context_new(t.m, nullptr, &c3) == HY_ERR_CONTEXT_FULL);
    const std::vector<int32_t> a = t.tokenize("def main():\n    "), b = t.tokenize("The");
    REQUIRE(hy_prefill(t.c, a.data(), int(a.size())) == HY_OK);
    REQUIRE(hy_prefill(c2, b.data(), int(b.size())) == HY_OK);
    std::vector<int32_t> ga, gb;
    for (int i = 0; i < 8; i++) {
        int32_t ia, ib;
        REQUIRE(hy_sampler_sample(t.s, t.c, &ia, nullptr) == HY_OK);
        REQUIRE(hy_sampler_sample(t.s, c2, &ib, nullptr) == HY_OK);
        ga.push_back(ia);
        gb.push_back(ib);
        hy_context* both[2] = {t.c, c2};
        const int32_t ids[2] = {ia, ib};
        REQUIRE(hy_decode_batch(both, ids, 2) == HY_OK);
    }
    const auto gs = golden_case("short")["greedy_fp32_cpu"].get<std::vector<int32_t>>();
    const auto go = golden_case("one_token")["greedy_fp32_cpu"].get<std::vector<int32_t>>();
    CHECK(ga == std::vector<int32_t>(gs.begin(), gs.begin() + 8));
    CHECK(gb == std::vector<int32_t>(go.begin(), go.begin() + 8));
    hy_context_free(c2);
    REQUIRE(hy_context_new(t.m, nullptr, &c3) == HY_OK);  // the slot is free again
    hy_context_free(c3);
}

TEST_CASE("engine: errors are status codes with a message", "[engine]") {
    hy_model* m = nullptr;
    hy_model_params mp = hy_model_default_params();
    mp.device = HY_DEVICE_CPU;
    CHECK(hy_model_load("/nonexistent/model", &mp, &m) == HY_ERR_IO);
    CHECK(std::string(hy_last_error()).find("/nonexistent/model") != std::string::npos);
    CHECK(m == nullptr);
    mp.n_ctx = -1;
    CHECK(hy_model_load(kTiny.c_str(), &mp, &m) == HY_ERR_INVALID_ARGUMENT);
    CHECK(hy_model_load(nullptr, &mp, &m) == HY_ERR_INVALID_ARGUMENT);
    mp.n_ctx = 0;  // the trained context (config.json max_position_embeddings), as llama.cpp's -c 0
    REQUIRE(hy_model_load(kTiny.c_str(), &mp, &m) == HY_OK);
    CHECK(hy_model_n_ctx(m) == 32768);
    CHECK(std::string(hy_model_device(m)).rfind("CPU, ", 0) == 0);
    CHECK(std::string(hy_model_weights(m)) == "BF16");  // (models/tiny is bf16; --quant int4 makes it Q4: [cli][int])
    CHECK(std::string(hy_model_weights(nullptr)).empty());
    hy_model_free(m);
    m = nullptr;
    mp.n_ctx = 64;
    CHECK(hy_model_load("", &mp, &m) == HY_ERR_IO);
    CHECK(std::string(hy_last_error()).find("path is empty") != std::string::npos);
    {  // a tokenizer with a token the model cannot embed is refused at load, naming the token and its id
        hy::test::TempDir tmp;
        const std::string dir = tmp.path;
        for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
            std::filesystem::copy_file(kTiny + "/" + f, dir + "/" + f);
        nlohmann::json tok = nlohmann::json::parse(std::ifstream(kTiny + "/tokenizer.json"));
        tok["model"]["vocab"]["zzqq"] = 99999;
        std::ofstream(dir + "/tokenizer.json") << tok.dump();
        CHECK(hy_model_load(dir.c_str(), &mp, &m) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error()).find("token 'zzqq' has id 99999") != std::string::npos);
        CHECK(m == nullptr);
        // an added token whose file id is past the vocabulary takes the next free id, as in Hugging Face: the
        // message names both (it named only the assigned one)
        tok = nlohmann::json::parse(std::ifstream(kTiny + "/tokenizer.json"));
        tok["added_tokens"].push_back({{"id", 5000}, {"content", "<zzqq>"}, {"special", true}});
        std::ofstream(dir + "/tokenizer.json") << tok.dump();
        // (models/tiny: 4,096 vocab entries, its added tokens inside them: the new one gets 4096)
        CHECK(hy_model_load(dir.c_str(), &mp, &m) == HY_ERR_FORMAT);
        CHECK(std::string(hy_last_error())
                  .find("token '<zzqq>' has id 4096 (the file gives it id 5000; added tokens take the next free id, as "
                        "in Hugging Face)") != std::string::npos);
        CHECK(m == nullptr);
    }

    Tiny t;
    hy_sampler_params sp = hy_sampler_default_params();
    sp.repeat_penalty = 0.0f;
    hy_sampler* s = nullptr;
    CHECK(hy_sampler_new(t.m, &sp, &s) == HY_ERR_INVALID_ARGUMENT);
    int32_t id;
    CHECK(hy_sampler_sample(t.s, t.c, &id, nullptr) == HY_ERR_INVALID_ARGUMENT);  // no logits yet
    const int32_t bad = 1 << 30;
    CHECK(hy_decode(t.c, bad) == HY_ERR_INVALID_ARGUMENT);
    hy_generate_params gp = hy_generate_default_params();
    CHECK(hy_generate(t.c, t.s, nullptr, 0, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    const char* empty_stop[1] = {""};
    gp.stop = empty_stop;
    gp.n_stop = 1;
    const int32_t one = 300;
    CHECK(hy_generate(t.c, t.s, &one, 1, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    // stop lists that hy_batch_submit refuses are refused here too (they used to be dropped without a word)
    gp = hy_generate_default_params();
    gp.n_stop = -3;
    CHECK(hy_generate(t.c, t.s, &one, 1, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    gp = hy_generate_default_params();
    gp.n_stop_ids = 5;  // with stop_ids NULL
    CHECK(hy_generate(t.c, t.s, &one, 1, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).find("stop_ids") != std::string::npos);
    gp.stop_ids = &one;
    gp.n_stop_ids = -5;
    CHECK(hy_generate(t.c, t.s, &one, 1, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    const int32_t outside[2] = {300, 1 << 20};  // (an id no logit has: it could never stop anything)
    gp.stop_ids = outside;
    gp.n_stop_ids = 2;
    CHECK(hy_generate(t.c, t.s, &one, 1, &gp, nullptr) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).starts_with("hy_generate: stop_ids[1] = 1048576 is out of range [0, "));
    CHECK(hy_state_load_file(t.c, "") == HY_ERR_INVALID_ARGUMENT);  // (it was an IO error naming "")
    hy_context_params cp = hy_context_default_params();
    cp.slot = -2;  // (it was taken as -1)
    hy_context* c2 = nullptr;
    CHECK(hy_context_new(t.m, &cp, &c2) == HY_ERR_INVALID_ARGUMENT);
    hy_sampler_params sp2 = hy_sampler_default_params();
    hy_sampler* s2 = nullptr;
    sp2.min_p = 2.0f;
    CHECK(hy_sampler_new(t.m, &sp2, &s2) == HY_ERR_INVALID_ARGUMENT);
    sp2 = hy_sampler_default_params();
    sp2.temperature = INFINITY;
    CHECK(hy_sampler_new(t.m, &sp2, &s2) == HY_ERR_INVALID_ARGUMENT);
    sp2 = hy_sampler_default_params();
    sp2.presence_penalty = -INFINITY;
    CHECK(hy_sampler_new(t.m, &sp2, &s2) == HY_ERR_INVALID_ARGUMENT);
    hy_model_params mp2 = hy_model_default_params();
    mp2.n_threads = 50000;  // (it started 32,000 threads before the OS refused one)
    hy_model* m2 = nullptr;
    CHECK(hy_model_load(kTiny.c_str(), &mp2, &m2) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).find("at most 1024") != std::string::npos);
    // messages name the function and the argument (hy_chat_continue's said "hy_chat_render: bad arguments", a NULL
    // buffer was "the buffer holds 64")
    size_t len = 0;
    CHECK(hy_chat_continue(t.m, nullptr, -1, HY_THINK_DISABLED, nullptr, 0, &len) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).find("hy_chat_continue: msgs is NULL or n negative") != std::string::npos);
    int n_ids = 0;
    CHECK(hy_tokenize(t.m, "abc def", -1, 1, nullptr, 64, &n_ids) == HY_ERR_INVALID_ARGUMENT);
    CHECK(std::string(hy_last_error()).find("out is NULL") != std::string::npos);
    // invalid UTF-8 is not an error
    int n = 0;
    const char bytes[] = "\xff\xfe abc \xc3";
    std::vector<int32_t> ids(64);
    CHECK(hy_tokenize(t.m, bytes, -1, 1, ids.data(), 64, &n) == HY_OK);
    CHECK(n > 0);
    CHECK(hy_tokenize(t.m, bytes, -1, 1, ids.data(), 1, &n) == HY_ERR_INVALID_ARGUMENT);
}

TEST_CASE("engine: hy_batch reproduces the golden left-padded batch and each solo run", "[engine]") {
    std::ifstream in(kTiny + "/golden.json");
    const nlohmann::json g = nlohmann::json::parse(in);
    const auto names = g["batch"]["names"].get<std::vector<std::string>>();
    hy_model_params mp = hy_model_default_params();
    mp.device = HY_DEVICE_CPU;
    mp.n_threads = 1;
    mp.n_ctx = 256;
    mp.n_slots = 3;  // 4 prompts on 3 slots: the last waits for a free slot
    mp.max_batch_tokens = 32;
    hy_model* m = nullptr;
    REQUIRE(hy_model_load(kTiny.c_str(), &mp, &m) == HY_OK);
    hy_context* c = nullptr;
    REQUIRE(hy_context_new(m, nullptr, &c) == HY_OK);  // takes one slot
    hy_batch* b = nullptr;
    REQUIRE(hy_batch_new(m, 3, &b) == HY_ERR_CONTEXT_FULL);  // only 2 free
    REQUIRE(std::string(hy_last_error()).find("2 are free") != std::string::npos);
    hy_context_free(c);
    REQUIRE(hy_batch_new(m, 0, &b) == HY_OK);
    hy_context* c2 = nullptr;
    REQUIRE(hy_context_new(m, nullptr, &c2) == HY_ERR_CONTEXT_FULL);  // the batch holds every slot

    hy_request_params rp = hy_request_default_params();
    rp.sampling.temperature = 0.0f;
    rp.max_tokens = 48;
    rp.ignore_eos = 1;
    std::vector<int> ids;
    for (const auto& n : names) {
        const auto prompt = golden_case(n)["input_ids"].get<std::vector<int32_t>>();
        int id = -1;
        REQUIRE(hy_batch_submit(b, prompt.data(), int(prompt.size()), &rp, &id) == HY_OK);
        ids.push_back(id);
    }
    int running = 1, steps = 0;
    while (running > 0) {
        REQUIRE(hy_batch_step(b, &running) == HY_OK);
        steps++;
    }
    for (size_t i = 0; i < ids.size(); i++) {
        const int32_t* toks = nullptr;
        const float* lps = nullptr;
        int n = 0, reason = -1, done = 0;
        REQUIRE(hy_batch_result(b, ids[i], &toks, &lps, &n, &reason, &done) == HY_OK);
        INFO("row " << i << " " << names[i]);
        REQUIRE(done == 1);
        REQUIRE(reason == HY_STOP_MAX_TOKENS);
        REQUIRE(std::vector<int32_t>(toks, toks + n) ==
                g["batch"]["greedy_fp32_left_padded"][i].get<std::vector<int32_t>>());
        for (int k = 0; k < n; k++) REQUIRE(lps[k] <= 0.0f);
    }
    REQUIRE(hy_batch_result(b, 99, nullptr, nullptr, nullptr, nullptr, nullptr) == HY_ERR_INVALID_ARGUMENT);
    REQUIRE(hy_batch_submit(b, nullptr, 0, &rp, &running) == HY_ERR_INVALID_ARGUMENT);
    {  // a negative max_tokens is named by its field (it said "max_new_tokens", an internal name)
        hy_request_params neg = rp;
        neg.max_tokens = -1;
        const int32_t one = 5;
        REQUIRE(hy_batch_submit(b, &one, 1, &neg, &running) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()).find("params.max_tokens must be >= 0") != std::string::npos);
    }
    {  // stop_ids: the request ends at the first of them (kept as its last id), with the end-of-sequence reason
        const auto prompt = golden_case(names[0])["input_ids"].get<std::vector<int32_t>>();
        const auto want = g["batch"]["greedy_fp32_left_padded"][0].get<std::vector<int32_t>>();
        const int32_t stop = want[5];
        const int first = int(std::find(want.begin(), want.end(), stop) - want.begin());
        hy_request_params sp = rp;
        sp.stop_ids = &stop;
        sp.n_stop_ids = 1;
        int id = -1;
        REQUIRE(hy_batch_submit(b, prompt.data(), int(prompt.size()), &sp, &id) == HY_OK);
        do REQUIRE(hy_batch_step(b, &running) == HY_OK);
        while (running > 0);
        const int32_t* toks = nullptr;
        int n = 0, reason = -1, done = 0;
        REQUIRE(hy_batch_result(b, id, &toks, nullptr, &n, &reason, &done) == HY_OK);
        CHECK(done == 1);
        CHECK(reason == HY_STOP_EOS);
        CHECK(std::vector<int32_t>(toks, toks + n) == std::vector<int32_t>(want.begin(), want.begin() + first + 1));
        sp.stop_ids = nullptr;
        REQUIRE(hy_batch_submit(b, prompt.data(), int(prompt.size()), &sp, &id) == HY_ERR_INVALID_ARGUMENT);
        const int32_t negative = -1;
        sp.stop_ids = &negative;
        REQUIRE(hy_batch_submit(b, prompt.data(), int(prompt.size()), &sp, &id) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()) ==
              "hy_batch_submit: stop_ids[0] = -1 is out of range [0, " + std::to_string(hy_model_n_logits(m)) + ")");
    }
    hy_batch_free(b);
    REQUIRE(hy_context_new(m, nullptr, &c2) == HY_OK);  // slots are back
    hy_context_free(c2);
    hy_model_free(m);
}

// should_abort stops a long prompt's prefill between its steps: HY_OK with HY_STOP_CALLBACK, nothing generated, the
// sequence reset (it would hold part of the prompt), and the context usable afterwards.
TEST_CASE("engine: should_abort stops the prefill and resets the sequence", "[engine]") {
    Tiny t(2048);
    std::vector<int32_t> prompt = hy::test::random_prompt(1500, 7);  // several prefill steps of max_batch_tokens
    struct Poll {
        int calls = 0;
        int stop_at = 1;
    } poll;
    hy_generate_params gp = hy_generate_default_params();
    gp.max_tokens = 4;
    gp.user_data = &poll;
    gp.should_abort = [](void* ud) {
        auto* p = static_cast<Poll*>(ud);
        return ++p->calls >= p->stop_at ? 1 : 0;
    };
    hy_generate_result r{};
    REQUIRE(hy_generate(t.c, t.s, prompt.data(), int(prompt.size()), &gp, &r) == HY_OK);
    CHECK(r.stop_reason == HY_STOP_CALLBACK);
    CHECK(r.n_generated == 0);
    CHECK(r.n_decoded == 0);
    CHECK(poll.calls == 1);
    CHECK(hy_context_n_tokens(t.c) == 0);
    // never aborting: the same prompt runs to the end
    poll = Poll{0, 1 << 30};
    REQUIRE(hy_generate(t.c, t.s, prompt.data(), int(prompt.size()), &gp, &r) == HY_OK);
    CHECK(r.stop_reason == HY_STOP_MAX_TOKENS);
    CHECK(poll.calls >= 2);
    CHECK(hy_context_n_tokens(t.c) == int(prompt.size()) + 4);
}

TEST_CASE("engine: snapshot files: no PATH.tmp, no symlink/device/folder replaced, bounded reads", "[engine]") {
    Tiny t;
    const std::vector<int32_t> prompt = t.tokenize("def main():\n    ");
    REQUIRE(hy_prefill(t.c, prompt.data(), int(prompt.size())) == HY_OK);
    const fs::path dir = fs::temp_directory_path() / ("hy_engine_files_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto slurp = [](const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    };
    const std::string path = (dir / "s.snap").string();
    std::ofstream(path + ".tmp") << "not mine to touch";
    REQUIRE(hy_state_save_file(t.c, path.c_str(), 0) == HY_OK);
    REQUIRE(hy_state_save_file(t.c, path.c_str(), 1) == HY_OK);
    CHECK(slurp(path + ".tmp") == "not mine to touch");
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 2);  // no temporary left
    // an overwritten file keeps its permissions
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
    REQUIRE(hy_state_save_file(t.c, path.c_str(), 1) == HY_OK);
    CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));

    // refused even with overwrite; nothing replaced
    std::ofstream(dir / "target") << "target";
    fs::create_symlink(dir / "target", dir / "link");
    fs::create_directories(dir / "folder");
    REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
    for (const std::string& p :
         {(dir / "link").string(), std::string("/dev/null"), (dir / "folder").string(), (dir / "fifo").string()}) {
        for (int overwrite : {0, 1}) {
            INFO(p << " overwrite " << overwrite);
            CHECK(hy_state_save_file(t.c, p.c_str(), overwrite) == HY_ERR_IO);
            CHECK(std::string(hy_last_error()).find("not a regular file") != std::string::npos);
        }
    }
    CHECK(fs::is_symlink(dir / "link"));
    CHECK(slurp(dir / "target") == "target");
    CHECK(fs::is_character_file("/dev/null"));
    CHECK(hy_state_save_file(t.c, (dir / "no" / "such" / "folder").string().c_str(), 1) == HY_ERR_IO);

    // loads: a FIFO and a device are refused without reading (no blocking, no endless read); the context stays
    const int n_before = hy_context_n_tokens(t.c);
    CHECK(hy_state_load_file(t.c, (dir / "fifo").string().c_str()) == HY_ERR_IO);
    CHECK(hy_state_load_file(t.c, "/dev/zero") == HY_ERR_IO);
    CHECK(hy_state_load_file(t.c, (dir / "folder").string().c_str()) == HY_ERR_IO);
    CHECK(hy_context_n_tokens(t.c) == n_before);
    // a good header followed by more bytes than any snapshot of this model
    const std::string good = slurp(path);
    CHECK(good.size() <= hy_state_size_max(t.c));
    const fs::path big = dir / "big.snap";
    std::ofstream(big, std::ios::binary) << good;
    fs::resize_file(big, hy_state_size_max(t.c) + 1);
    CHECK(hy_state_load_file(t.c, big.string().c_str()) == HY_ERR_FORMAT);
    CHECK(std::string(hy_last_error()).find("more than any snapshot") != std::string::npos);
    // a bad header is refused from the header alone
    std::ofstream(dir / "junk", std::ios::binary) << "JUNKJUNKJUNKJUNK";
    fs::resize_file(dir / "junk", size_t(1) << 30);  // sparse: never read
    CHECK(hy_state_load_file(t.c, (dir / "junk").string().c_str()) == HY_ERR_FORMAT);
    CHECK(hy_context_n_tokens(t.c) == n_before);  // (refused from its header: the sequence stays, it was reset)
    // a file of another kind with a text magic (hybrid -i's conversation file) is named by its magic (the library
    // does not know that format)
    std::ofstream(dir / "chat", std::ios::binary) << "HYCHAT01" << std::string(64, '\0');
    CHECK(hy_state_load_file(t.c, (dir / "chat").string().c_str()) == HY_ERR_FORMAT);
    CHECK(std::string(hy_last_error()).find("not a hybrid snapshot (bad magic \"HYCHAT01\")") != std::string::npos);
    CHECK(hy_context_n_tokens(t.c) == n_before);
    CHECK(hy_state_load_file(t.c, path.c_str()) == HY_OK);
    CHECK(hy_context_n_tokens(t.c) == int(prompt.size()));
    CHECK(hy_state_size_max(nullptr) == 0);
    fs::remove_all(dir);
}

// From the thirty-second session's fresh-user test of the C API.
TEST_CASE(
    "engine: a pending id hides the logits; callbacks cannot change their context; the model outlives its "
    "objects",
    "[engine]") {
    SECTION("after hy_generate the last id is pending: no logits to sample until it is fed") {
        Tiny t;
        Collect out;
        t.generate(t.tokenize("def f(x):"), 3, out);
        REQUIRE(out.ids.size() == 3);
        CHECK(hy_context_logits(t.c, nullptr) == nullptr);  // (it returned the row that gave the pending id)
        int32_t id = -1;
        CHECK(hy_sampler_sample(t.s, t.c, &id, nullptr) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()).find("not fed yet") != std::string::npos);
        REQUIRE(hy_prefill(t.c, nullptr, 0) == HY_OK);  // feeds the pending id
        CHECK(hy_context_logits(t.c, nullptr) != nullptr);
        REQUIRE(hy_sampler_sample(t.s, t.c, &id, nullptr) == HY_OK);
        // the next greedy id is the one a fresh run gives after the same ids
        Tiny u;
        Collect again;
        u.generate(u.tokenize("def f(x):"), 4, again);
        REQUIRE(again.ids.size() == 4);
        CHECK(id == again.ids[3]);
    }
    SECTION("calls that change the generating context from its callback are refused") {
        Tiny t;
        struct Probe {
            hy_context* c;
            hy_sampler* s;
            int rc_prefill = 0, rc_reset = 0, rc_generate = 0;
            std::string message, generate_message;
        } probe{t.c, t.s, 0, 0, 0, "", ""};
        hy_generate_params gp = hy_generate_default_params();
        gp.max_tokens = 3;
        gp.user_data = &probe;
        gp.on_token = [](const hy_token_info* info, void* user) {
            Probe& p = *static_cast<Probe*>(user);
            if (info->index == 1) {
                const int32_t x = 5;
                p.rc_prefill = hy_prefill(p.c, &x, 1);
                p.message = hy_last_error();
                p.rc_reset = hy_context_reset(p.c);
                p.rc_generate = hy_generate(p.c, p.s, &x, 1, nullptr, nullptr);
                p.generate_message = hy_last_error();
            }
            return 0;
        };
        const std::vector<int32_t> prompt = t.tokenize("def f(x):");
        hy_generate_result r{};
        REQUIRE(hy_generate(t.c, t.s, prompt.data(), int(prompt.size()), &gp, &r) == HY_OK);
        CHECK(probe.rc_prefill == HY_ERR_INVALID_ARGUMENT);
        CHECK(probe.message == "hy_prefill: called from a callback of hy_generate on the same context");
        CHECK(probe.rc_reset == HY_ERR_INVALID_ARGUMENT);
        CHECK(probe.rc_generate == HY_ERR_INVALID_ARGUMENT);
        CHECK(probe.generate_message == "hy_generate: called from a callback of hy_generate on the same context");
        CHECK(r.n_generated == 3);
        CHECK(hy_context_n_tokens(t.c) == int(prompt.size()) + 3);
        const int32_t x = 5;
        CHECK(hy_prefill(t.c, &x, 1) == HY_OK);  // outside the callback again
    }
    SECTION("hy_generate leaves its result alone on failure") {
        Tiny t(8);
        const std::vector<int32_t> prompt(12, 5);  // longer than the context
        hy_generate_result r{};
        r.n_prompt = 77;
        CHECK(hy_generate(t.c, t.s, prompt.data(), int(prompt.size()), nullptr, &r) == HY_ERR_CONTEXT_FULL);
        CHECK(r.n_prompt == 77);
    }
    SECTION("the model freed before its batch, context and sampler: released with the last of them") {
        hy_model_params mp = hy_model_default_params();
        mp.device = HY_DEVICE_CPU;
        mp.n_threads = 1;
        mp.n_ctx = 64;
        mp.n_slots = 2;
        hy_model* m = nullptr;
        REQUIRE(hy_model_load(kTiny.c_str(), &mp, &m) == HY_OK);
        hy_context* c = nullptr;
        hy_sampler* s = nullptr;
        hy_batch* b = nullptr;
        REQUIRE(hy_context_new(m, nullptr, &c) == HY_OK);
        REQUIRE(hy_sampler_new(m, nullptr, &s) == HY_OK);
        REQUIRE(hy_batch_new(m, 1, &b) == HY_OK);
        const int32_t p[3] = {5, 6, 7};
        int id = 0;
        REQUIRE(hy_batch_submit(b, p, 3, nullptr, &id) == HY_OK);
        hy_model_free(m);                       // (under AddressSanitizer: the frees below read freed memory before)
        REQUIRE(hy_prefill(c, p, 3) == HY_OK);  // still usable
        hy_batch_free(b);
        hy_context_free(c);
        hy_sampler_free(s);
    }
    SECTION("a device value outside the enum is refused, read as the int it is") {
        hy_model_params mp = hy_model_default_params();
        const int nine = 9;
        std::memcpy(&mp.device, &nine, sizeof nine);
        hy_model* m = nullptr;
        CHECK(hy_model_load(kTiny.c_str(), &mp, &m) == HY_ERR_INVALID_ARGUMENT);
        CHECK(std::string(hy_last_error()) == "unknown device 9");
        CHECK(m == nullptr);
    }
}
