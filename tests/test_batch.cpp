// Continuous batching on the CPU: every sequence equals its solo run, whatever else shares the batch.
#include <catch2/catch.hpp>

#include <algorithm>

#include "model/batch.h"
#include "test_util.h"

using namespace hy;
using namespace hy::test;

namespace {

ModelParams params(int n_slots, int max_batch) {
    ModelParams p;
    p.device = Device::cpu;
    p.n_ctx = 256;
    p.n_slots = n_slots;
    p.max_batch_tokens = max_batch;
    return p;
}

std::vector<int32_t> prompt(int n, uint32_t seed) { return random_prompt(n, seed); }

GenerationResult solo(const GenerationRequest& r) {
    auto m = Model::load(tiny_dir(), params(1, 512));
    BatchGenerator g(*m);
    int id = g.submit(r);
    g.run();
    return g.result(id);
}

}  // namespace

// A step never holds more tokens than the slots' positions together: a larger batch size is cut to that at load (-c 10
// -b 100000000 asked for about 2 TB of activations and failed as out of memory).
TEST_CASE("batch: the batch size is cut to the slots' positions at load", "[model][batch]") {
    ModelParams p = params(2, 100000000);
    p.n_ctx = 10;
    auto m = Model::load(tiny_dir(), p);
    CHECK(m->params().max_batch_tokens == 20);
    auto one = Model::load(tiny_dir(), params(3, 64));  // (smaller ones stay as given)
    CHECK(one->params().max_batch_tokens == 64);
}

TEST_CASE("batch API reproduces the golden left-padded batch", "[model][batch]") {
    nlohmann::json golden = nlohmann::json::parse(read_text(tiny_dir() + "/golden.json"));
    auto names = golden["batch"]["names"].get<std::vector<std::string>>();
    auto rows = golden["batch"]["greedy_fp32_left_padded"];
    auto m = Model::load(tiny_dir(), params(int(names.size()), 512));
    BatchGenerator g(*m);
    std::vector<int> ids;
    for (const auto& n : names) {
        for (const auto& c : golden["cases"]) {
            if (c["name"] != n) continue;
            GenerationRequest r;
            r.prompt = c["input_ids"].get<std::vector<int32_t>>();
            r.max_new_tokens = c["max_new_tokens"].get<int>();
            r.sampling.temperature = 0.0f;
            ids.push_back(g.submit(r));
        }
    }
    REQUIRE(ids.size() == names.size());
    g.run();
    for (size_t i = 0; i < ids.size(); i++) {
        INFO("row " << i << " (" << names[i] << ")");
        REQUIRE(g.result(ids[i]).tokens == rows[i].get<std::vector<int32_t>>());
        REQUIRE(g.result(ids[i]).reason == FinishReason::max_tokens);
    }
}

TEST_CASE("continuous batching: more requests than slots, chunked prefills, mixed lengths", "[model][batch]") {
    // 7 requests on 3 slots with a 24-row step budget: prompts are prefilled in chunks alongside other sequences'
    // decode rows, sequences finish at different times and new ones take their slots.
    std::vector<GenerationRequest> reqs;
    const int lens[] = {5, 70, 33, 64, 65, 1, 130};
    const int news[] = {12, 5, 20, 9, 3, 15, 7};
    for (int i = 0; i < 7; i++) {
        GenerationRequest r;
        r.prompt = prompt(lens[i], uint32_t(100 + i));
        r.max_new_tokens = news[i];
        if (i % 2 == 0) {
            r.sampling.temperature = 0.0f;
        } else {  // seeded sampling: the same draws alone and in the batch
            r.sampling.temperature = 0.9f;
            r.sampling.seed = uint64_t(i);
        }
        reqs.push_back(r);
    }
    auto m = Model::load(tiny_dir(), params(3, 24));
    BatchGenerator g(*m);
    std::vector<int> ids;
    for (auto& r : reqs) ids.push_back(g.submit(r));
    int steps = 0;
    while (g.step()) {
        REQUIRE(g.n_active() <= 3);
        steps++;
    }
    CHECK(steps > 20);
    for (size_t i = 0; i < reqs.size(); i++) {
        GenerationResult alone = solo(reqs[i]);
        INFO("request " << i);
        REQUIRE(g.result(ids[i]).tokens == alone.tokens);
        REQUIRE(g.result(ids[i]).logprobs == alone.logprobs);
        REQUIRE(int(alone.tokens.size()) == news[i]);
    }
}

TEST_CASE("batch: stop ids, cancel and bad requests", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(2, 64));
    BatchGenerator g(*m);
    GenerationRequest r;
    r.prompt = prompt(10, 1);
    r.max_new_tokens = 30;
    r.sampling.temperature = 0.0f;
    GenerationResult ref = solo(r);
    r.stop_ids = {ref.tokens[4]};
    int a = g.submit(r);
    GenerationRequest r2 = r;
    r2.stop_ids.clear();
    int b = g.submit(r2);
    int c = g.submit(r2);  // waits in the queue
    g.cancel(c);
    g.step();
    g.cancel(b);
    g.run();
    REQUIRE(g.result(a).reason == FinishReason::eos);
    REQUIRE(g.result(a).tokens.size() <= 5);
    REQUIRE(g.result(a).tokens.back() == ref.tokens[4]);
    REQUIRE(g.result(b).reason == FinishReason::cancelled);
    REQUIRE(g.result(c).reason == FinishReason::cancelled);
    REQUIRE(g.result(c).tokens.empty());
    GenerationRequest bad;
    REQUIRE_THROWS_AS(g.submit(bad), Error);
    bad.prompt = {4096};
    REQUIRE_THROWS_AS(g.submit(bad), Error);
    bad.prompt = prompt(300, 2);
    REQUIRE_THROWS_AS(g.submit(bad), Error);
}

TEST_CASE("batch: a greedy pick of a banned id falls back to the full sampler", "[model][batch]") {
    // The backend's arg max cannot know the banned ids: when it picks one, the generator must take the logits and
    // sample the best id that is not banned.
    GenerationRequest r;
    r.prompt = prompt(9, 77);
    r.max_new_tokens = 6;
    r.sampling.temperature = 0.0f;
    auto m = Model::load(tiny_dir(), params(1, 64));
    BatchGenerator free_gen(*m);
    const int a = free_gen.submit(r);
    free_gen.run();
    const std::vector<int32_t> want = free_gen.result(a).tokens;
    REQUIRE(want.size() == 6);
    // ban the first and third greedy ids: the sequence must avoid them and match a host-side greedy run
    const std::vector<int32_t> banned = {want[0], want[2]};
    BatchGenerator g(*m, 0, {}, banned);
    const int b = g.submit(r);
    g.run();
    const auto& got = g.result(b).tokens;
    REQUIRE(got.size() == 6);
    for (int32_t t : got) CHECK(std::find(banned.begin(), banned.end(), t) == banned.end());
    // the same choice by hand: logits of the prompt, greedy over ids that are not banned
    m->reset(0);
    auto row = m->prefill(0, r.prompt);
    Sampler s(r.sampling, m->config().vocab_size, m->config().vocab_size);
    s.set_banned(banned);
    CHECK(got[0] == s.sample(row));
    CHECK(got[0] != want[0]);
}

TEST_CASE("step: a slot twice in one batch is refused, and the next batch is unaffected", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(2, 16));
    const int32_t toks[3] = {5, 6, 7};
    const SeqRun twice[2] = {{0, 0, 0, 1}, {0, 0, 1, 1}};
    const BatchDesc bad{2, toks, twice, 2};
    try {
        m->step(bad, {});
        FAIL("a slot twice was accepted");
    } catch (const Error& e) {
        CHECK(e.status() == Status::invalid_argument);
        CHECK(std::string(e.what()).find("slot 0 appears twice") != std::string::npos);
    }
    CHECK(m->seq_len(0) == 0);
    const SeqRun ok[2] = {{0, 0, 0, 1}, {1, 0, 1, 2}};
    const int32_t row = 2;
    auto picks = m->step_greedy(BatchDesc{3, toks, ok, 2}, std::span<const int32_t>(&row, 1), 0);
    REQUIRE(picks.size() == 1);
    CHECK(picks[0].id >= 0);
    CHECK(m->seq_len(0) == 1);
    CHECK(m->seq_len(1) == 2);
}

TEST_CASE("batch: max_new_tokens 0 only prefills; more than the context ends with context_full", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(2, 16));
    BatchGenerator g(*m);
    GenerationRequest none, all, two;
    none.prompt = prompt(20, 3);  // longer than a step: prefilled over two steps
    none.max_new_tokens = 0;
    all.prompt = prompt(5, 4);
    all.max_new_tokens = 1000;  // more than n_ctx (256) - 5 + 1 ids can follow
    all.sampling.temperature = 0.0f;
    two.prompt = prompt(5, 4);
    two.max_new_tokens = 2;
    two.sampling.temperature = 0.0f;
    const int a = g.submit(none), b = g.submit(all), c = g.submit(two);
    g.run();
    CHECK(g.result(a).tokens.empty());
    CHECK(g.result(a).reason == FinishReason::max_tokens);
    CHECK(g.result(b).reason == FinishReason::context_full);
    CHECK(int(g.result(b).tokens.size()) == m->n_ctx() - 5 + 1);
    REQUIRE(g.result(c).tokens.size() == 2);
    CHECK(std::vector<int32_t>(g.result(b).tokens.begin(), g.result(b).tokens.begin() + 2) == g.result(c).tokens);
    GenerationRequest bad = two;
    bad.max_new_tokens = -1;
    CHECK_THROWS_AS(g.submit(bad), Error);
}

// Prompts as long as a step's row budget: prompt chunks of prompts of equal length go to the oldest request first
// (the tie of shortest-remaining-first), so requests finish in the order they were submitted. In slot order, each
// request admitted into slot 0 took the whole budget of the next step and the requests in slots 1 and 2 waited until
// the queue ran dry (from the fresh-user test: --batch-file output stalled behind them).
TEST_CASE("batch: prompt chunks go to the oldest request first", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(3, 32));
    BatchGenerator g(*m);
    std::vector<GenerationRequest> reqs(8);
    std::vector<int> ids;
    for (size_t i = 0; i < reqs.size(); i++) {
        reqs[i].prompt = prompt(32, 100 + uint32_t(i));
        reqs[i].max_new_tokens = 1;
        reqs[i].sampling.temperature = 0.0f;
        ids.push_back(g.submit(reqs[i]));
    }
    std::vector<int> finished;
    while (g.step())
        for (int id : ids)
            if (g.result(id).done && std::find(finished.begin(), finished.end(), id) == finished.end())
                finished.push_back(id);
    CHECK(finished == ids);
    for (size_t i = 0; i < reqs.size(); i++) CHECK(g.result(ids[i]).tokens == solo(reqs[i]).tokens);
}

// A short prompt submitted with a long one: in oldest-first order the long prompt took every step's rows and the
// short one's first token came only after the whole long prefill (from the fresh-user test). Shortest remaining
// prompt first, the short one answers in the first step and the long one still takes the rows left.
TEST_CASE("batch: a short prompt is not held behind a long prompt's prefill", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(2, 32));
    BatchGenerator g(*m);
    GenerationRequest long_r, short_r;
    long_r.prompt = prompt(200, 11);
    long_r.max_new_tokens = 3;
    long_r.sampling.temperature = 0.0f;
    short_r.prompt = prompt(5, 12);
    short_r.max_new_tokens = 4;
    short_r.sampling.temperature = 0.9f;
    short_r.sampling.seed = 5;
    const int a = g.submit(long_r), b = g.submit(short_r);
    int steps = 0, short_first = 0, long_first = 0;
    int64_t long_len = 0;
    while (g.step()) {
        steps++;
        if (short_first == 0 && !g.result(b).tokens.empty()) short_first = steps;
        if (long_first == 0 && !g.result(a).tokens.empty()) long_first = steps;
        if (long_first == 0) {  // the long prompt takes rows every step (slot 0: it was admitted first)
            INFO("step " << steps);
            CHECK(m->seq_len(0) > long_len);
            long_len = m->seq_len(0);
        }
    }
    CHECK(short_first == 1);
    CHECK(long_first == 7);  // 27 rows, 3 x 31 beside the short one's decode rows, then 32, 32 and the last 16
    CHECK(g.result(a).tokens == solo(long_r).tokens);
    CHECK(g.result(a).logprobs == solo(long_r).logprobs);
    CHECK(g.result(b).tokens == solo(short_r).tokens);
    CHECK(g.result(b).logprobs == solo(short_r).logprobs);
}

// Shortest first alone would starve a long prompt behind a stream of short ones that fill every step: after
// max_prompt_wait steps without rows it takes a fair share of a step.
TEST_CASE("batch: a long prompt behind a stream of short ones still progresses within the wait bound",
          "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(3, 16));
    BatchGenerator g(*m);
    std::vector<GenerationRequest> reqs(13);
    std::vector<int> ids;
    for (size_t i = 0; i < reqs.size(); i++) {
        reqs[i].prompt = prompt(i == 0 ? 60 : 16, 200 + uint32_t(i));
        reqs[i].max_new_tokens = 1;
        reqs[i].sampling.temperature = 0.0f;
        ids.push_back(g.submit(reqs[i]));
    }
    int steps = 0, waited = 0, max_waited = 0, n_waits = 0;
    int64_t long_len = 0;
    while (g.step()) {
        steps++;
        if (g.result(ids[0]).done) continue;
        if (m->seq_len(0) == long_len) {
            waited++;
            n_waits++;
        } else {
            waited = 0;
        }
        max_waited = std::max(max_waited, waited);
        long_len = m->seq_len(0);
    }
    CHECK(n_waits > 0);                                    // the short prompts went first...
    CHECK(max_waited == BatchGenerator::max_prompt_wait);  // ...but never longer than the bound
    for (size_t i = 0; i < reqs.size(); i++) {
        INFO("request " << i);
        CHECK(g.result(ids[i]).tokens == solo(reqs[i]).tokens);
    }
}

TEST_CASE("continuous batching: saved states continue a sequence; top log-probabilities; forget", "[model][batch]") {
    auto m = Model::load(tiny_dir(), params(2, 16));
    BatchGenerator g(*m);
    // A request saves its state after 20 of its 40 prompt ids and at its end.
    GenerationRequest r;
    r.prompt = prompt(40, 7);
    r.max_new_tokens = 6;
    r.sampling.temperature = 0.0f;
    r.save_at = 20;
    r.save_final = true;
    r.top_logprobs = 3;
    const int a = g.submit(r);
    g.run();
    const GenerationResult full = g.result(a);
    REQUIRE(full.tokens.size() == 6);
    REQUIRE(full.top.size() == 6);
    for (size_t k = 0; k < full.top.size(); k++) {  // the greedy pick is the best of the top ids, same log-prob
        REQUIRE(full.top[k].size() == 3);
        CHECK(full.top[k][0].id == full.tokens[k]);
        CHECK(full.top[k][0].logprob == full.logprobs[k]);  // (the same log-sum-exp: the same number)
        CHECK(full.top[k][0].logprob >= full.top[k][1].logprob);
        CHECK(full.top[k][1].logprob >= full.top[k][2].logprob);
    }
    std::shared_ptr<const StoredState> head = g.take_state(a, false), tail = g.take_state(a, true);
    REQUIRE(head);
    REQUIRE(tail);
    CHECK(head->size() > 0);
    g.forget(a);
    CHECK(g.result(a).tokens.empty());
    CHECK_THROWS_AS(g.forget(99), Error);

    // From the state after 20 ids: the same continuation, with 20 ids taken from the state.
    GenerationRequest from_head = r;
    from_head.save_at = 0;
    from_head.save_final = false;
    from_head.top_logprobs = 0;
    from_head.state = head;
    from_head.n_cached = 20;
    const int b = g.submit(from_head);
    // From the final state (prompt + 5 generated ids): the prompt is extended by the answer, 1 more id generated.
    GenerationRequest from_tail = from_head;
    from_tail.prompt.insert(from_tail.prompt.end(), full.tokens.begin(), full.tokens.end());
    from_tail.state = tail;
    from_tail.n_cached = 45;
    from_tail.max_new_tokens = 3;
    const int c = g.submit(from_tail);
    // A state that does not hold n_cached ids is not used: the whole prompt is prefilled.
    GenerationRequest wrong = from_head;
    wrong.n_cached = 21;
    const int d = g.submit(wrong);
    g.run();
    CHECK(g.result(b).n_cached == 20);
    CHECK(g.result(b).tokens == full.tokens);
    CHECK(g.result(c).n_cached == 45);
    CHECK(g.result(d).n_cached == 0);
    CHECK(g.result(d).tokens == full.tokens);
    // the continuation of the answer equals a run of the whole sequence alone
    GenerationRequest whole = from_tail;
    whole.state.reset();
    whole.n_cached = 0;
    CHECK(g.result(c).tokens == solo(whole).tokens);
}
