// Token sampling: penalties, filters (top-k, top-p, min-p), temperature and a seeded draw; plus the log-softmax
// used to report per-token log-probabilities.
//
// The pipeline applied by Sampler::sample() to one row of logits (F32 [n_logits]), in this order:
//   1. mask:      ids >= n_valid (the embedding may have more rows than the tokenizer has ids; QWEN35.md) and
//                 the banned ids (set_banned) are never candidates; NaN logits count as -inf. A row with no
//                 finite logit left is an error (hy::Error backend), not a draw.
//   2. bias:      logit += bias for each (id, bias) of logit_bias (OpenAI's logit_bias; llama.cpp applies it first
//                 too); ids outside [0, n_valid) are ignored, a banned id stays -inf. Reported log-probabilities
//                 (log_softmax_at, top_logprobs) stay those of the raw logits.
//   3. penalties over the last `repeat_last_n` accepted ids (the window; -1 = every accepted id, 0 = none):
//                 repetition (CTRL paper, Keskar et al. 2019, as llama.cpp): each distinct id in the window once:
//                 logit > 0 ? logit / repeat_penalty : logit * repeat_penalty;
//                 presence / frequency (OpenAI API, as llama.cpp): logit -= presence * (count > 0) +
//                 frequency * count, count = occurrences of the id in the window.
//   4. greedy:    temperature <= 0 or top_k == 1 returns the arg max of the biased, penalized logits (lowest id on
//                 ties).
//   5. top-k:     keep the k largest logits (k <= 0: off).
//   6. top-p:     keep the smallest prefix of the sorted candidates whose softmax mass (temperature 1) reaches
//                 top_p (>= 1: off); at least one candidate is kept.
//   7. min-p:     keep candidates whose probability is >= min_p * p(max) (temperature 1; <= 0: off).
//   8. temperature: p_i = softmax(logit_i / temperature) over the kept candidates, then one draw from the
//                 sampler's own std::mt19937_64 (53-bit uniform in [0, 1), so a seed gives the same ids on every
//                 platform with the same logits).
// Filters 5-7 see the distribution at temperature 1 and temperature is applied last, as llama.cpp's default
// chain does. Without top-k, min-p is applied first as the equivalent logit threshold x >= x_max + log(min_p) and
// only the survivors are sorted, as far as top-p needs. Exponentials use a float polynomial (relative error
// < 2e-7); sums over the vocabulary are accumulated in float lanes per block of 1024 and in double across blocks.
//
// Memory: every buffer is sized in the constructor; sample() and accept() allocate nothing.
// Thread safety: a Sampler is single-threaded state (history and RNG); use one per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "base/softmax.h"

namespace hy {

struct SamplerParams {
    float temperature = 0.8f;        // <= 0: greedy
    int top_k = 40;                  // <= 0: off
    float top_p = 0.95f;             // >= 1: off
    float min_p = 0.05f;             // <= 0: off
    float repeat_penalty = 1.0f;     // 1: off; must be > 0
    int repeat_last_n = 64;          // penalty window in accepted ids; -1: all of them (up to history_capacity)
    float presence_penalty = 0.0f;   // 0: off
    float frequency_penalty = 0.0f;  // 0: off
    uint64_t seed = 0;               // the RNG seed
    // (id, bias) pairs added to the logits before the penalties (step 2); each bias finite. Empty: off.
    std::vector<std::pair<int32_t, float>> logit_bias;
};

class Sampler {
public:
    // n_logits: the length of a logits row (the model's vocab_size); n_valid: ids [0, n_valid) may be sampled
    // (the tokenizer's n_vocab, clamped to n_logits); history_capacity: the most ids the penalty window holds (for
    // repeat_last_n -1 or larger than it; typically the context length). Throws hy::Error(invalid_argument) for
    // n_logits <= 0, n_valid <= 0, a negative or NaN top_p, a min_p above 1 or NaN, a temperature, penalty or logit
    // bias that is not finite, repeat_penalty <= 0, or repeat_last_n < -1.
    Sampler(const SamplerParams& params, int n_logits, int n_valid, int history_capacity = 4096);

    const SamplerParams& params() const { return params_; }
    int n_logits() const { return n_logits_; }
    int n_valid() const { return n_valid_; }

    // Picks one id in [0, n_valid) from `logits` (F32 [n_logits]) by the pipeline above. Does not record it: call
    // accept() with the id that was actually used. Throws invalid_argument when logits.size() != n_logits, and
    // backend ("the model produced no finite logits ...") when no id that may be sampled has a finite logit.
    int32_t sample(std::span<const float> logits);

    // Records an id in the penalty history (prompt ids may be accepted too, as llama.cpp does). Ids outside
    // [0, n_logits) are ignored.
    void accept(int32_t id);

    // Clears the penalty history; with reseed, also restarts the RNG from params().seed.
    void reset(bool reseed = true);

    // Changes the seed and restarts the RNG.
    void set_seed(uint64_t seed);

    // Ids in [0, n_valid) that must never be sampled either (e.g. ids the tokenizer leaves unassigned); they are
    // treated as -inf logits, before the penalties. Ids outside [0, n_logits) are ignored. Replaces the previous set.
    void set_banned(std::span<const int32_t> ids);

    // True when sample() is the plain arg max of the raw logits over the ids that may be sampled: greedy
    // (temperature <= 0 or top_k == 1) with every penalty off and no logit bias.
    bool plain_greedy() const;
    // Whether the backend's greedy pick `id` of a row (Model::step_greedy; -1: none) is what sample() would return
    // for it: plain_greedy(), and an id that may be sampled (not banned, below n_valid). Else call sample().
    bool pick_stands(int32_t id) const;
    // Whether set_banned() listed `id`. O(log n).
    bool is_banned(int32_t id) const;

    // Applies step 3 (penalties) in place to `logits` (F32 [n_logits]); exposed for tests.
    void apply_penalties(std::span<float> logits) const;

    // Number of ids in the penalty window now.
    int window_size() const;

private:
    struct Candidate {
        int32_t id;
        float logit;
        float p;
    };
    double uniform01();

    SamplerParams params_;
    int n_logits_ = 0, n_valid_ = 0;
    std::mt19937_64 rng_;
    std::vector<int32_t> ring_;  // [window capacity] accepted ids, a ring buffer
    size_t ring_head_ = 0, ring_count_ = 0;
    std::vector<int32_t> counts_;        // [n_logits] occurrences of each id in the window
    mutable std::vector<uint8_t> seen_;  // [n_logits] scratch for "each distinct id once"
    std::vector<float> work_;            // [n_logits] penalized logits
    std::vector<Candidate> cand_;        // [n_valid] candidates
    std::vector<int32_t> banned_;        // ids forced to -inf, sorted
};

}  // namespace hy
