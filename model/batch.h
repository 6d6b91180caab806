// Continuous batching: many sequences generated together over the model's sequence slots.
//
// Requests wait in a queue until a slot is free. Each step() builds one forward batch out of (a) one decode row
// for every sequence that is generating and (b) prompt rows of admitted sequences that are still prefilling (a
// long prompt is prefilled over several steps, in chunks that fill the step's row budget), then samples one token
// for each sequence whose logits came out. A sequence that stops (EOS, max tokens, context full, cancel) gives its
// slot back at the end of the step; the slot is reset before its next use, so a reused slot behaves bitwise like a
// fresh one. New requests can be submitted between steps.
//
// On the CPU backend every row is computed independently of the others, so each sequence's tokens and logits are
// bitwise those of the same sequence run alone.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"

namespace hy {

struct GenerationRequest {
    std::vector<int32_t> prompt;    // token ids, at least one
    int max_new_tokens = 128;       // >= 0 (0: the prompt is prefilled, nothing is generated)
    SamplerParams sampling;         // temperature <= 0 is greedy
    std::vector<int32_t> stop_ids;  // generation stops after producing one of these (it is kept in `tokens`)
    bool accept_prompt = true;      // the prompt ids enter the sampler's penalty history
};

struct GenerationResult {
    std::vector<int32_t> tokens;               // generated ids
    std::vector<float> logprobs;               // log-softmax of the raw logits at each generated id
    FinishReason reason = FinishReason::none;  // none, eos, max_tokens, context_full or cancelled
    bool done = false;
};

class BatchGenerator {
public:
    // n_valid: ids [0, n_valid) may be sampled (the tokenizer's vocabulary; the model's vocab_size when <= 0).
    // slots: the model's sequence slots this generator may use (empty: all of them); it resets a slot before each
    // use and leaves the others alone. banned: ids in [0, n_valid) never sampled (ids the tokenizer leaves
    // unassigned).
    BatchGenerator(Model& model, int n_valid = 0, std::vector<int> slots = {}, std::vector<int32_t> banned = {});

    // Queues a request; returns its id (0, 1, 2, ... in submission order). Throws invalid_argument for an empty
    // prompt, an id out of range, max_new_tokens < 0, or a prompt that cannot fit the context.
    int submit(GenerationRequest request);
    // Stops a request: a queued one never runs; an active one finishes at the end of the next step.
    void cancel(int id);
    // One forward step (see above). Returns false, doing nothing, when no request is queued or active.
    bool step();
    // Steps until every submitted request is done.
    void run();

    const GenerationResult& result(int id) const;
    int n_active() const;
    int n_queued() const { return int(queue_.size()); }

private:
    struct Sequence {
        int id = -1;  // request id; -1 when the slot is free
        size_t prompt_done = 0;
        bool cancel = false;
        std::unique_ptr<Sampler> sampler;
    };
    void finish(int slot, FinishReason reason);

    Model& model_;
    int n_valid_;
    std::vector<GenerationRequest> requests_;
    std::vector<GenerationResult> results_;
    std::deque<int> queue_;
    std::vector<Sequence> slots_;  // [n_slots]; only those listed in usable_ are used
    std::vector<int> usable_;
    std::vector<int32_t> banned_;
    std::vector<int> prefilled_;  // [n_slots] slots whose prompt (max_new_tokens 0) completed in this step
    std::vector<int> order_;      // [n_slots] the slots of a step in the order they take rows (see step())
    // per-step scratch, sized once
    std::vector<int32_t> tokens_, out_rows_, out_slot_;
    std::vector<SeqRun> runs_;
};

}  // namespace hy
