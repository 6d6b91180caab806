#include "model/sequence.h"

#include <algorithm>
#include <span>
#include <string>

namespace hy {

void Sequence::feed(const int32_t* ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_logits)
            throw Error(Status::invalid_argument,
                        "token id " + std::to_string(ids[i]) + " is outside [0, " + std::to_string(n_logits) + ")");
    const int len = model->seq_len(slot);
    const int total = n_pending + n;
    if (total == 0) return;
    if (int64_t(len) + total > model->n_ctx())
        throw Error(Status::context_full,
                    "the sequence would hold " + std::to_string(int64_t(len) + total) +
                        " tokens; the context length is " + std::to_string(model->n_ctx()) +
                        (n_pending > 0 ? " (counting the last generated id, which is not yet fed: " +
                                             std::to_string(len) + " tokens are in the context)"
                                       : std::string()));
    std::span<const int32_t> run;
    if (n_pending == 0) {
        run = std::span<const int32_t>(ids, size_t(n));
    } else {
        feed_ids.assign(history.end() - n_pending, history.end());
        feed_ids.insert(feed_ids.end(), ids, ids + n);
        run = feed_ids;
    }
    has_logits = false;
    std::span<const float> row;
    try {
        row = model->prefill(slot, run, false);
    } catch (...) {
        // the slot may hold part of the run: drop the whole sequence so history and state agree
        model->reset(slot);
        history.clear();
        n_pending = 0;
        throw;
    }
    history.insert(history.end(), ids, ids + n);
    n_pending = 0;
    std::copy(row.end() - n_logits, row.end(), logits.begin());
    has_logits = true;
}

TokenPick Sequence::feed_pick(int n_valid) {
    if (n_pending != 1) throw Error(Status::internal, "feed_pick: expected one pending id");
    int32_t id = history.back();
    SeqRun run{slot, model->seq_len(slot), 0, 1};
    const BatchDesc b{1, &id, &run, 1};
    const int32_t row = 0;
    has_logits = false;
    TokenPick pick;
    try {
        pick = model->step_greedy(b, std::span<const int32_t>(&row, 1), n_valid)[0];
    } catch (...) {
        model->reset(slot);
        history.clear();
        n_pending = 0;
        throw;
    }
    n_pending = 0;
    return pick;
}

void Sequence::fetch_logits() {
    auto l = model->last_logits();
    std::copy(l.end() - n_logits, l.end(), logits.begin());
    has_logits = true;
}

void Sequence::clear() {
    model->reset(slot);
    history.clear();
    n_pending = 0;
    has_logits = false;
}

void decode_batch(std::span<Sequence* const> seqs, const int32_t* ids) {
    if (seqs.empty()) return;
    Model& model = *seqs[0]->model;
    const int n = int(seqs.size());
    std::vector<SeqRun> runs(seqs.size());
    std::vector<int32_t> rows(seqs.size());
    for (int i = 0; i < n; i++) {
        const int slot = seqs[size_t(i)]->slot;
        runs[size_t(i)] = SeqRun{int32_t(slot), int32_t(model.seq_len(slot)), int32_t(i), 1};
        rows[size_t(i)] = i;
    }
    BatchDesc b;
    b.n_tokens = n;
    b.token_ids = ids;
    b.runs = runs.data();
    b.n_runs = n;
    std::span<const float> out = model.step(b, rows);
    for (int i = 0; i < n; i++) {
        Sequence& s = *seqs[size_t(i)];
        s.history.push_back(ids[i]);
        const auto row = out.begin() + ptrdiff_t(i) * s.n_logits;
        std::copy(row, row + s.n_logits, s.logits.begin());
        s.has_logits = true;
    }
}

}  // namespace hy
