// One sequence of a Model as the C API's contexts hold it: its slot, every id of it (the last n_pending not yet
// run through the model) and the logits row of its last fed id. engine.cpp's hy_context is a Sequence; the
// snapshot format (model/snapshot.h) and the generation loop (model/generate.h) work on it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace hy {

struct Sequence {
    Model* model = nullptr;
    int slot = 0;                  // the model's sequence slot
    int n_logits = 0;              // logits row length (the model's vocab_size)
    std::vector<int32_t> history;  // every id of the sequence; the last n_pending are not yet fed
    int n_pending = 0;
    std::vector<float> logits;  // [n_logits] the last fed token's row
    bool has_logits = false;
    std::vector<int32_t> feed_ids;  // scratch for pending + new ids

    // Feeds the pending ids plus ids[0, n) to the model; on success the sequence has logits. Throws
    // Error(invalid_argument) for an id outside [0, n_logits) and Error(context_full) when the sequence would pass
    // n_ctx (both before anything runs); when the model fails (or a prefill abort stops it, Model::Aborted) the
    // whole sequence is dropped (reset), so history and state agree.
    void feed(const int32_t* ids, int n);
    // Feeds the one pending id and returns the backend's greedy pick of the next id over ids [0, n_valid)
    // (Model::step_greedy): the logits stay on the backend until fetch_logits(). Throws like feed().
    TokenPick feed_pick(int n_valid);
    // Copies the last step's logits row from the backend into `logits`.
    void fetch_logits();
    // Empties the sequence (and resets its slot).
    void clear();
};

// One decode step for seqs.size() sequences of one model at once: ids[i] is appended to seqs[i] and run through the
// model in a single batch (Model::step), and each sequence gets its logits row. The caller has checked them: each
// sequence at most once, none with a pending id, each with room for one more id, every id in [0, n_logits), at most
// the model's n_slots (and max_logits) of them. Throws what Model::step throws (the sequences are then unchanged).
void decode_batch(std::span<Sequence* const> seqs, const int32_t* ids);

}  // namespace hy
