// Model tests on the CPU reference: checkpoint layouts, sequence continuation, batching, snapshots.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <cmath>
#include <fstream>

#include "kernels/cpu/thread_pool.h"
#include "model/model.h"
#include "model/state_store.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

ModelParams cpu_params(int n_slots = 1, int max_batch = 512) {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 256;
    p.n_slots = n_slots;
    p.max_batch_tokens = max_batch;
    p.max_logits = max_batch;
    return p;
}

std::vector<int32_t> prompt(int n, uint32_t seed) { return random_prompt(n, seed); }

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        double d = std::fabs(double(a[i]) - double(b[i]));
        if (!(d == d)) return INFINITY;
        m = std::max(m, d);
    }
    return m;
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("multimodal checkpoint layout gives identical output", "[model]") {
    // Rewrite the tiny model as Qwen3_5ForConditionalGeneration: model.language_model.* names, text_config,
    // extra mtp.* and model.visual.* tensors, A_log kept F32.
    TensorMap t = read_safetensors(tiny_dir() + "/model.safetensors");
    TensorMap mm;
    for (auto& [name, tensor] : t) mm["model.language_model." + name.substr(6)] = tensor;
    mm["mtp.fc.weight"] = {"BF16", {256, 512}, std::vector<uint8_t>(256 * 512 * 2, 0)};
    mm["mtp.norm.weight"] = {"BF16", {256}, std::vector<uint8_t>(512, 0)};
    mm["model.visual.patch_embed.proj.weight"] = {
        "BF16", {16, 3, 2, 4, 4}, std::vector<uint8_t>(16 * 3 * 2 * 4 * 4 * 2, 0)};
    REQUIRE(mm.at("model.language_model.layers.0.linear_attn.A_log").dtype == "F32");
    nlohmann::json text = nlohmann::json::parse(read_text(tiny_dir() + "/config.json"));
    text.erase("tie_word_embeddings");
    nlohmann::json cfg = {{"model_type", "qwen3_5"},
                          {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                          {"tie_word_embeddings", true},
                          {"text_config", text}};
    cfg["text_config"]["model_type"] = "qwen3_5_text";
    TempDir d;
    write_model_dir(d.path, mm, cfg.dump(1));

    auto a = Model::load(tiny_dir(), cpu_params());
    auto b = Model::load(d.path, cpu_params());
    REQUIRE(b->config().tensor_prefix == "model.language_model.");
    const auto ids = prompt(70, 3);
    auto la = copy(a->prefill(0, ids, true));
    auto lb = copy(b->prefill(0, ids, true));
    REQUIRE(max_abs_diff(la, lb) == 0.0);
    for (int i = 0; i < 8; i++) {
        int32_t t1 = int32_t(std::max_element(la.end() - 4096, la.end()) - (la.end() - 4096));
        la = copy(a->prefill(0, std::span<const int32_t>(&t1, 1)));
        lb = copy(b->prefill(0, std::span<const int32_t>(&t1, 1)));
        REQUIRE(max_abs_diff(la, lb) == 0.0);
    }
}

TEST_CASE("untied lm_head is used when present", "[model]") {
    TensorMap t = read_safetensors(tiny_dir() + "/model.safetensors");
    // lm_head = embed with one row changed: only that token's logit may differ from the tied model.
    RawTensor head = t.at("model.embed_tokens.weight");
    for (size_t i = 0; i < 256 * 2; i++) head.bytes[size_t(7) * 512 + i] = 0;  // row 7 -> zeros
    t["lm_head.weight"] = head;
    nlohmann::json cfg = nlohmann::json::parse(read_text(tiny_dir() + "/config.json"));
    cfg["tie_word_embeddings"] = false;
    TempDir d;
    write_model_dir(d.path, t, cfg.dump());
    auto a = Model::load(tiny_dir(), cpu_params());
    auto b = Model::load(d.path, cpu_params());
    const auto ids = prompt(5, 9);
    auto la = copy(a->prefill(0, ids));
    auto lb = copy(b->prefill(0, ids));
    for (int v = 0; v < 4096; v++) {
        if (v == 7)
            REQUIRE(lb[7] == 0.0f);
        else
            REQUIRE(la[size_t(v)] == lb[size_t(v)]);
    }
}

TEST_CASE("prefilling A then B equals prefilling A+B", "[model]") {
    const auto ids = prompt(100, 11);
    for (int split : {1, 30, 60, 64, 65, 99}) {
        for (int chunk : {512, 16}) {
            auto m = Model::load(tiny_dir(), cpu_params(1, chunk));
            auto whole = copy(m->prefill(0, ids, true));
            m->reset(0);
            auto a = copy(m->prefill(0, std::span<const int32_t>(ids.data(), size_t(split)), true));
            auto b =
                copy(m->prefill(0, std::span<const int32_t>(ids.data() + split, ids.size() - size_t(split)), true));
            a.insert(a.end(), b.begin(), b.end());
            INFO("split " << split << ", chunk " << chunk);
            REQUIRE(max_abs_diff(a, whole) <= 1e-4);
            REQUIRE(m->seq_len(0) == 100);
        }
    }
}

TEST_CASE("a batch of sequences equals each sequence run alone", "[model]") {
    // Three sequences of different lengths (one crossing the 64-token chunk) decoded together for 10 steps,
    // against each sequence alone: on the CPU every row is computed identically, so the logits agree bitwise.
    const std::vector<std::vector<int32_t>> prompts = {prompt(5, 1), prompt(70, 2), prompt(33, 3)};
    const int steps = 10;
    std::vector<std::vector<std::vector<float>>> solo(prompts.size());
    {
        auto m = Model::load(tiny_dir(), cpu_params(1));
        for (size_t s = 0; s < prompts.size(); s++) {
            m->reset(0);
            auto l = copy(m->prefill(0, prompts[s]));
            solo[s].push_back(l);
            for (int i = 0; i < steps; i++) {
                int32_t t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
                l = copy(m->prefill(0, std::span<const int32_t>(&t, 1)));
                solo[s].push_back(l);
            }
        }
    }
    auto m = Model::load(tiny_dir(), cpu_params(3));
    // Batched prefill: all three prompts in one step, as three runs.
    std::vector<int32_t> tokens;
    std::vector<SeqRun> runs;
    std::vector<int32_t> rows;
    for (size_t s = 0; s < prompts.size(); s++) {
        runs.push_back({int32_t(s), 0, int32_t(tokens.size()), int32_t(prompts[s].size())});
        tokens.insert(tokens.end(), prompts[s].begin(), prompts[s].end());
        rows.push_back(int32_t(tokens.size()) - 1);
    }
    BatchDesc pb{int32_t(tokens.size()), tokens.data(), runs.data(), int32_t(runs.size())};
    auto l = copy(m->step(pb, rows));
    for (int i = 0; i <= steps; i++) {
        std::vector<int32_t> next;
        for (size_t s = 0; s < prompts.size(); s++) {
            std::span<const float> row(l.data() + s * 4096, 4096);
            INFO("sequence " << s << " step " << i);
            REQUIRE(max_abs_diff(row, solo[s][size_t(i)]) == 0.0);
            next.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
        }
        if (i == steps) break;
        std::vector<SeqRun> dr;
        for (size_t s = 0; s < prompts.size(); s++) dr.push_back({int32_t(s), m->seq_len(int(s)), int32_t(s), 1});
        std::vector<int32_t> out = {0, 1, 2};
        BatchDesc db{3, next.data(), dr.data(), 3};
        l = copy(m->step(db, out));
    }
}

TEST_CASE("slot reuse and snapshots", "[model]") {
    auto m = Model::load(tiny_dir(), cpu_params(2));
    const auto a = prompt(40, 5), b = prompt(20, 6);
    // B on a fresh slot.
    auto fresh = copy(m->prefill(1, b));
    // A in slot 0, reset, then B in the same slot: bitwise like fresh.
    m->prefill(0, a);
    m->reset(0);
    REQUIRE(copy(m->prefill(0, b)) == fresh);

    // Snapshot after A, continue with B; restore into the other slot and continue with B again.
    m->reset(0);
    m->prefill(0, a);
    std::vector<uint8_t> snap = m->save_state(0);
    auto cont = copy(m->prefill(0, b));
    m->reset(1);
    m->load_state(1, snap);
    REQUIRE(m->seq_len(1) == 40);
    REQUIRE(copy(m->prefill(1, b)) == cont);

    // Corrupt or foreign snapshots are rejected.
    std::vector<uint8_t> bad = snap;
    bad.resize(bad.size() - 1);
    REQUIRE_THROWS_AS(m->load_state(1, bad), Error);
    bad = snap;
    bad[0] = 'X';
    REQUIRE_THROWS_AS(m->load_state(1, bad), Error);
    bad = snap;
    bad[8] ^= 1;  // n_layers
    try {
        m->load_state(1, bad);
        FAIL("accepted a snapshot of another model");
    } catch (const Error& e) {
        REQUIRE(e.status() == Status::model_mismatch);
    }
}

TEST_CASE("state store: a state in blocks saves and loads like one vector", "[model]") {
    auto m = Model::load(tiny_dir(), cpu_params(2));
    const auto a = prompt(40, 5), b = prompt(20, 6);
    m->prefill(0, a);
    const std::vector<uint8_t> whole = m->save_state(0);
    REQUIRE(whole.size() == m->state_bytes(0));
    const size_t block = 4096, k = (whole.size() + block - 1) / block;
    StateStore store(m->backend(), (k + 3) * block, block);
    REQUIRE(store.capacity() == (k + 3) * block);
    CHECK(store.fits(store.capacity()));
    CHECK_FALSE(store.fits(store.capacity() + 1));
    // Blocks 0 | 1..k | k+1 taken, then the middle and the first freed: a state of k blocks then takes block 0 and
    // blocks 2..k plus one more, so it lies in two ranges split at a block boundary.
    auto x1 = store.allocate(1), x2 = store.allocate(whole.size()), x3 = store.allocate(block);
    REQUIRE((x1 && x2 && x3));
    CHECK(store.used() == (k + 2) * block);
    CHECK_FALSE(store.allocate(2 * block));  // one block is left
    x2.reset();
    x1.reset();
    std::shared_ptr<StoredState> st = store.allocate(whole.size());
    REQUIRE(st);
    CHECK(st->size() == whole.size());
    CHECK(st->footprint() == k * block);
    REQUIRE(st->ranges().size() >= 2);
    CHECK(st->ranges()[0].size() == block);
    m->save_state(0, st->ranges());
    CHECK(st->to_vector() == whole);
    CHECK_THROWS_AS(m->save_state(1, st->ranges()), Error);  // slot 1 is empty: another size

    auto cont = copy(m->prefill(0, b));
    m->reset(1);
    m->load_state(1, st->ranges());
    REQUIRE(m->seq_len(1) == 40);
    REQUIRE(copy(m->prefill(1, b)) == cont);
    // A state outlives its store; its blocks go back when it goes.
    st.reset();
    x3.reset();
    CHECK(store.used() == 0);
    // A state made without a store: one range.
    StoredState own(whole.size());
    REQUIRE(own.ranges().size() == 1);
    m->reset(1);
    m->prefill(1, a);
    m->save_state(1, own.ranges());
    CHECK(own.to_vector() == whole);
}

TEST_CASE("sharded checkpoint through model.safetensors.index.json", "[model]") {
    TensorMap all = read_safetensors(tiny_dir() + "/model.safetensors");
    TensorMap a, b;
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    int i = 0;
    for (auto& [name, t] : all) {
        const bool first = i++ % 2 == 0;
        (first ? a : b)[name] = t;
        index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    TempDir d;
    write_model_dir(d.path, a, read_text(tiny_dir() + "/config.json"));
    std::filesystem::rename(d / "model.safetensors", d / "model-00001-of-00002.safetensors");
    write_safetensors(d / "model-00002-of-00002.safetensors", b);
    write_text(d / "model.safetensors.index.json", index.dump());

    auto ref = Model::load(tiny_dir(), cpu_params());
    auto sharded = Model::load(d.path, cpu_params());
    const auto ids = prompt(20, 4);
    REQUIRE(copy(ref->prefill(0, ids, true)) == copy(sharded->prefill(0, ids, true)));

    // A shard that is missing, and an index that names a tensor its shard lacks.
    std::filesystem::rename(d / "model-00002-of-00002.safetensors", d / "moved.safetensors");
    REQUIRE_THROWS_AS(Model::load(d.path, cpu_params()), Error);
    std::filesystem::rename(d / "moved.safetensors", d / "model-00002-of-00002.safetensors");
    index["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors";
    write_text(d / "model.safetensors.index.json", index.dump());
    try {
        Model::load(d.path, cpu_params());
        FAIL("accepted an index naming a tensor that is not in its shard");
    } catch (const Error& e) {
        REQUIRE(std::string(e.what()).find("model.extra.weight") != std::string::npos);
    }
    // weight_map of the wrong type (it read "is missing"), and none at all
    index["weight_map"] = nlohmann::json::array();
    write_text(d / "model.safetensors.index.json", index.dump());
    try {
        Model::load(d.path, cpu_params());
        FAIL("accepted a weight_map that is an array");
    } catch (const Error& e) {
        REQUIRE(std::string(e.what()).find("field 'weight_map' must be an object (tensor name -> file), found array") !=
                std::string::npos);
    }
    // an index that is not an object (it read "field 'weight_map' is missing")
    write_text(d / "model.safetensors.index.json", "[1, 2]");
    try {
        Model::load(d.path, cpu_params());
        FAIL("accepted an index that is an array");
    } catch (const Error& e) {
        REQUIRE(std::string(e.what()).find("must be a JSON object with a 'weight_map', found array") !=
                std::string::npos);
    }
    index.erase("weight_map");
    write_text(d / "model.safetensors.index.json", index.dump());
    try {
        Model::load(d.path, cpu_params());
        FAIL("accepted an index without weight_map");
    } catch (const Error& e) {
        REQUIRE(std::string(e.what()).find("field 'weight_map' is missing") != std::string::npos);
    }
}

TEST_CASE("CPU thread pool: threads the OS refuses are an error, not an abort", "[model]") {
#if defined(__SANITIZE_ADDRESS__)
    WARN("skipped under AddressSanitizer (its shadow memory defeats an address-space limit)");
    return;
#else
    // An address-space limit just above what the process maps leaves no room for 64 thread stacks (8 MiB each by
    // default), so the pool's thread creation fails part way (the constructor used to let std::system_error escape
    // with threads running: std::terminate).
    size_t vm_kib = 0;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
    REQUIRE(vm_kib > 0);
    struct rlimit old {};
    REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
    struct rlimit lim = old;
    lim.rlim_cur = rlim_t(vm_kib) * 1024 + (rlim_t(16) << 20);
    if (old.rlim_cur != RLIM_INFINITY && lim.rlim_cur > old.rlim_cur) {
        WARN("skipped: the address-space limit is already low");
        return;
    }
    REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
    bool threw = false;
    Status st = Status::ok;
    std::string msg;
    try {
        cpu::ThreadPool pool(64);
    } catch (const Error& e) {
        threw = true;
        st = e.status();
        msg = e.what();
    }
    REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
    CHECK(threw);
    CHECK(st == Status::backend);
    CHECK(msg.find("cannot start 64 CPU threads") != std::string::npos);
    cpu::ThreadPool fine(4);  // (and the limit is gone again)
    CHECK(fine.size() == 4);
#endif
}
