// Continuous batching: many sequences generated together over the model's sequence slots.
//
// Requests wait in a queue until a slot is free. Each step() builds one forward batch out of (a) one decode row
// for every sequence that is generating and (b) prompt rows of admitted sequences that are still prefilling (a
// long prompt is prefilled over several steps, in chunks that fill the step's row budget), then samples one token
// for each sequence whose logits came out. Prompt rows go to the shortest remaining prompt first, so a short
// prompt is not held behind a long one; a prompt that got no rows for max_prompt_wait steps in a row first takes
// a fair share of the next step's prompt rows (the budget left by the decode rows over the prefilling sequences),
// so a long prompt is never starved by a stream of shorter ones. A sequence that stops (EOS, max tokens, context full,
// cancel) gives its slot back at the end of the step; the slot is reset before its next use, so a reused slot behaves
// bitwise like a fresh one. New requests can be submitted between steps.
//
// On the CPU backend every row is computed independently of the others, so each sequence's tokens and logits are
// bitwise those of the same sequence run alone.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/state_store.h"

namespace hy {

struct GenerationRequest {
    std::vector<int32_t> prompt;    // token ids, at least one
    int max_new_tokens = 128;       // >= 0 (0: the prompt is prefilled, nothing is generated)
    SamplerParams sampling;         // temperature <= 0 is greedy
    std::vector<int32_t> stop_ids;  // generation stops after producing one of these (it is kept in `tokens`)
    bool accept_prompt = true;      // the prompt ids enter the sampler's penalty history
    int top_logprobs = 0;           // also report the this many most likely ids of each step (0..20; the logits
                                    // rows then reach the host)
    // Conversation-state reuse: `state` (Model::save_state of a slot) holds the first n_cached prompt ids, so the
    // request starts from it and prefills only prompt[n_cached:] (0 < n_cached < prompt size; null: start empty).
    std::shared_ptr<const StoredState> state;
    int n_cached = 0;
    // Save the slot's state once save_at prompt ids are in it (into GenerationResult::saved_state; 0: never; at most
    // the prompt's size; at or below n_cached: never). The prefill stops a chunk there so the state holds exactly them.
    int save_at = 0;
    bool save_final = false;  // save the slot's state when the request finishes (not when cancelled)
};

struct GenerationResult {
    std::vector<int32_t> tokens;               // generated ids
    std::vector<float> logprobs;               // log-softmax of the raw logits at each generated id
    FinishReason reason = FinishReason::none;  // none, eos, max_tokens, context_full or cancelled
    bool done = false;
    std::vector<std::vector<TokenPick>> top;  // [tokens][top_logprobs] the most likely ids of each step, best first
    // The slot's state after save_at prompt ids (see GenerationRequest); null until then, or when the state
    // allocator had no room.
    std::shared_ptr<StoredState> saved_state;
    // The slot's state at the end (save_final): the prompt and every generated id but the last (never fed).
    std::shared_ptr<StoredState> final_state;
    int n_cached = 0;  // prompt ids taken from the request's state (0 when it had none or it could not be loaded)
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
    // Frees the prompt and the result of a finished request (a long-running server forgets what it has answered);
    // result(id) is then empty. Throws invalid_argument for an unknown or unfinished request.
    void forget(int id);
    // One forward step (see above). Returns false, doing nothing, when no request is queued or active.
    bool step();
    // Steps until every submitted request is done.
    void run();

    const GenerationResult& result(int id) const;
    // Moves the saved state (final: final_state, else saved_state) out of request id's result.
    std::shared_ptr<StoredState> take_state(int id, bool final);
    // Where saved states go: allocate(bytes) returns a state of that size, or null to skip the save (a full
    // cache). By default each state is a plain allocation of its own.
    using StateAllocator = std::function<std::shared_ptr<StoredState>(size_t bytes)>;
    void set_state_allocator(StateAllocator allocate) { allocate_state_ = std::move(allocate); }
    int n_active() const;
    int n_queued() const { return int(queue_.size()); }

    // A prefilling sequence that got no prompt rows for this many steps in a row takes a fair share of the next one.
    static constexpr int max_prompt_wait = 4;

private:
    struct Sequence {
        int id = -1;  // request id; -1 when the slot is free
        size_t prompt_done = 0;
        int save_at = 0;  // the request's save_at, 0 once saved
        int waited = 0;   // steps in a row this prefilling sequence got no prompt rows
        bool cancel = false;
        std::unique_ptr<Sampler> sampler;
    };
    void finish(int slot, FinishReason reason);
    std::shared_ptr<StoredState> save(int slot);

    Model& model_;
    int n_valid_;
    std::vector<GenerationRequest> requests_;
    std::vector<GenerationResult> results_;
    std::deque<int> queue_;
    std::vector<Sequence> slots_;  // [n_slots]; only those listed in usable_ are used
    std::vector<int> usable_;
    std::vector<int32_t> banned_;
    StateAllocator allocate_state_;
    std::vector<int> prefilled_;  // [n_slots] slots whose prompt (max_new_tokens 0) completed in this step
    std::vector<int> order_;      // [n_slots] the active slots of a step, oldest request first (see step())
    std::vector<int> by_length_;  // [n_slots] the prefilling slots of a step, shortest remaining prompt first
    std::vector<int> chunk_;      // [n_slots] the prompt rows each slot takes in a step
    // per-step scratch, sized once
    std::vector<int32_t> tokens_, out_rows_, out_slot_;
    std::vector<SeqRun> runs_;
};

// The k most likely ids of a logits row (F32 [vocab]) over ids [0, n_valid), best first (lowest id on ties), with
// their log-softmax over those ids (natural log; norm: the row's log_softmax_norm, base/softmax.h); non-finite
// logits are skipped.
std::vector<TokenPick> top_logprobs(std::span<const float> row, int n_valid, int k, const LogSoftmaxNorm& norm);

}  // namespace hy
