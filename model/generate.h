// Generation over one sequence (hy_generate): prefill the prompt, then pick or sample one id at a time until a
// stop (an end-of-sequence or stop id, a stop string in the decoded text, max tokens, a full context, the token
// callback), streaming the decoded text. The pick-or-sample step is shared with continuous batching
// (model/batch.h).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"
#include "model/sequence.h"

namespace hy {

class Tokenizer;

// Why a generation ended (engine.cpp maps each to its hy_stop_reason).
enum class FinishReason : int { none = 0, eos, max_tokens, context_full, cancelled, stop_string, callback };
const char* finish_reason_name(FinishReason r);

// One step's id and its log-probability (log-softmax of the raw logits over ids [0, n_valid), natural log): the
// backend's greedy pick of the row when there is one (pick non-null, from Model::step_greedy) and the sampler takes
// it (Sampler::pick_stands: greedy without penalties, an id that may be sampled); else sampler.sample() of the
// logits row, which row() returns (F32 [vocab_size]; called only then, so the row can stay on the backend until a
// sampler needs it). Does not accept() the id.
template <class Row>
TokenPick pick_or_sample(Sampler& sampler, const TokenPick* pick, int n_valid, Row&& row) {
    if (pick && sampler.pick_stands(pick->id)) return *pick;
    const std::span<const float> r = row();
    const int32_t id = sampler.sample(r);
    return TokenPick{id, float(log_softmax_at(r, n_valid, id))};
}

struct GenerateOptions {
    int max_tokens = -1;                // ids to generate at most; < 0: no limit
    std::vector<std::string> stop;      // stop strings, each non-empty
    std::span<const int32_t> eos;       // the end-of-sequence set, sorted (ignored with ignore_eos)
    std::span<const int32_t> stop_ids;  // more ids that end generation like an end-of-sequence id
    bool ignore_eos = false;
    bool skip_special = true;  // the streamed text leaves out special tokens
    int n_valid = 0;           // ids [0, n_valid) may be sampled (log-probabilities are over them)
    // Called for each kept id with its log-probability, the text that became final (decoded; text that could be
    // the start of a stop string is held back) and its index (0, 1, ...); a last call with id -1 delivers text
    // still held at the end. Returning true stops generation (FinishReason::callback; the id is kept).
    std::function<bool(int32_t id, float logprob, const std::string& text, int index)> on_token;
    int (*should_abort)(void*) = nullptr;  // polled between prefill steps (Model::set_prefill_abort)
    void* abort_data = nullptr;
};

struct GenerateResult {
    int n_prompt = 0;     // ids prefilled (the prompt plus a pending id); 0 when the prefill was stopped
    int n_generated = 0;  // ids generated (kept in the sequence)
    int n_decoded = 0;    // ids run through the model after the prompt
    double prompt_ms = 0, generate_ms = 0;
    FinishReason reason = FinishReason::none;
};

// Generates from seq after feeding prompt (may be empty when seq has a pending id or logits). Each kept id is
// accept()ed by the sampler and appended to the sequence as its pending id (the sequence keeps the logits of its
// last fed id, as after Sequence::feed). A stopped prefill (should_abort) resets the sequence and ends with
// reason callback and n_prompt 0. Throws what Sequence::feed and the tokenizer throw; `res` is filled as it goes,
// so after a throw it holds what was done.
void generate(Sequence& seq, Sampler& sampler, const Tokenizer& tok, std::span<const int32_t> prompt,
              const GenerateOptions& o, GenerateResult& res);

}  // namespace hy
