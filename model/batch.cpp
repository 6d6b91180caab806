#include "model/batch.h"

#include <algorithm>

namespace hy {

BatchGenerator::BatchGenerator(Model& model, int n_valid, std::vector<int> slots, std::vector<int32_t> banned)
    : model_(model), usable_(std::move(slots)), banned_(std::move(banned)) {
    const int V = model.config().vocab_size;
    n_valid_ = n_valid > 0 ? std::min(n_valid, V) : V;
    slots_.resize(size_t(model.n_slots()));
    if (usable_.empty())
        for (int s = 0; s < model.n_slots(); s++) usable_.push_back(s);
    for (int s : usable_)
        if (s < 0 || s >= model.n_slots() || std::count(usable_.begin(), usable_.end(), s) != 1)
            throw Error(Status::invalid_argument,
                        "batch generator: slot " + std::to_string(s) + " is invalid or listed twice");
    tokens_.resize(size_t(model.max_batch_tokens()));
    out_rows_.resize(size_t(model.n_slots()));
    out_slot_.resize(size_t(model.n_slots()));
    prefilled_.resize(size_t(model.n_slots()));
    order_.resize(size_t(model.n_slots()));
    runs_.resize(size_t(model.n_slots()));
}

int BatchGenerator::submit(GenerationRequest r) {
    if (r.prompt.empty()) throw Error(Status::invalid_argument, "empty prompt");
    if (r.max_new_tokens < 0) throw Error(Status::invalid_argument, "max_new_tokens must be >= 0");
    for (int32_t t : r.prompt)
        if (t < 0 || t >= model_.config().vocab_size)
            throw Error(Status::invalid_argument, "token id " + std::to_string(t) + " out of range [0, " +
                                                      std::to_string(model_.config().vocab_size) + ")");
    if (int64_t(r.prompt.size()) >= model_.n_ctx())
        throw Error(Status::context_full, "prompt of " + std::to_string(r.prompt.size()) +
                                              " tokens does not fit a context of " + std::to_string(model_.n_ctx()));
    // Validate the sampling parameters now rather than at admission.
    Sampler probe(r.sampling, model_.config().vocab_size, n_valid_, 1);
    requests_.push_back(std::move(r));
    results_.emplace_back();
    const int id = int(requests_.size()) - 1;
    queue_.push_back(id);
    return id;
}

void BatchGenerator::cancel(int id) {
    if (id < 0 || id >= int(requests_.size()))
        throw Error(Status::invalid_argument, "no request " + std::to_string(id));
    if (results_[size_t(id)].done) return;
    auto it = std::find(queue_.begin(), queue_.end(), id);
    if (it != queue_.end()) {
        queue_.erase(it);
        results_[size_t(id)].reason = FinishReason::cancelled;
        results_[size_t(id)].done = true;
        return;
    }
    for (Sequence& s : slots_)
        if (s.id == id) s.cancel = true;
}

const GenerationResult& BatchGenerator::result(int id) const {
    if (id < 0 || id >= int(results_.size())) throw Error(Status::invalid_argument, "no request " + std::to_string(id));
    return results_[size_t(id)];
}

int BatchGenerator::n_active() const {
    int n = 0;
    for (const Sequence& s : slots_) n += s.id >= 0;
    return n;
}

void BatchGenerator::finish(int slot, FinishReason reason) {
    Sequence& s = slots_[size_t(slot)];
    results_[size_t(s.id)].reason = reason;
    results_[size_t(s.id)].done = true;
    s.id = -1;
    s.sampler.reset();
}

bool BatchGenerator::step() {
    // Admit queued requests into free slots.
    for (size_t u = 0; u < usable_.size() && !queue_.empty(); u++) {
        const int slot = usable_[u];
        Sequence& s = slots_[size_t(slot)];
        if (s.id >= 0) continue;
        const int id = queue_.front();
        queue_.pop_front();
        const GenerationRequest& r = requests_[size_t(id)];
        model_.reset(slot);
        s.id = id;
        s.prompt_done = 0;
        s.cancel = false;
        s.sampler = std::make_unique<Sampler>(r.sampling, model_.config().vocab_size, n_valid_, model_.n_ctx());
        if (!banned_.empty()) s.sampler->set_banned(banned_);
        if (r.accept_prompt)
            for (int32_t t : r.prompt) s.sampler->accept(t);
        // (at most n_ctx ids fit: a request may ask for more and end with context_full)
        const size_t cap = size_t(std::min(r.max_new_tokens, model_.n_ctx()));
        results_[size_t(id)].tokens.reserve(cap);
        results_[size_t(id)].logprobs.reserve(cap);
    }

    // Build the batch: decode rows first (one per generating sequence), then prompt chunks in the space left; both
    // oldest request first (in slot order a prompt admitted into a high slot could wait while newer prompts in lower
    // slots took every step's rows, and with results read in submission order nothing would come out until the
    // queue ran dry).
    int n_order = 0;
    for (int slot = 0; slot < int(slots_.size()); slot++)
        if (slots_[size_t(slot)].id >= 0) order_[size_t(n_order++)] = slot;
    std::sort(order_.begin(), order_.begin() + n_order,
              [&](int a, int b) { return slots_[size_t(a)].id < slots_[size_t(b)].id; });
    const int budget = model_.max_batch_tokens();
    int n_rows = 0, n_runs = 0, n_out = 0, n_prefilled = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < n_order; k++) {
            const int slot = order_[size_t(k)];
            Sequence& s = slots_[size_t(slot)];
            const GenerationRequest& r = requests_[size_t(s.id)];
            const bool generating = s.prompt_done == r.prompt.size();
            if ((pass == 0) != generating) continue;
            int n;
            if (generating) {
                n = 1;
                tokens_[size_t(n_rows)] = results_[size_t(s.id)].tokens.back();
            } else {
                n = int(std::min(r.prompt.size() - s.prompt_done, size_t(budget - n_rows)));
                if (n <= 0) continue;
                std::copy_n(r.prompt.begin() + std::ptrdiff_t(s.prompt_done), n, tokens_.begin() + n_rows);
                s.prompt_done += size_t(n);
            }
            runs_[size_t(n_runs++)] = SeqRun{slot, model_.seq_len(slot), n_rows, n};
            n_rows += n;
            if (s.prompt_done == r.prompt.size() && r.max_new_tokens == 0) {  // prefilled: done after the step
                prefilled_[size_t(n_prefilled++)] = slot;
            } else if (s.prompt_done == r.prompt.size()) {  // the last row's logits give the next token
                out_rows_[size_t(n_out)] = n_rows - 1;
                out_slot_[size_t(n_out++)] = slot;
            }
        }
    }
    if (n_rows == 0) return false;

    // The backend picks each row's arg max (and its log-probability) itself; a sequence that samples greedily
    // without penalties takes that pick (so its result never depends on what else shares the batch), unless it is
    // a banned id; the logits rows reach the host only when some sequence needs the full sampler. (When no
    // sequence samples greedily, the step brings the logits and picks nothing.)
    BatchDesc batch{n_rows, tokens_.data(), runs_.data(), n_runs};
    const std::span<const int32_t> out_rows(out_rows_.data(), size_t(n_out));
    bool any_greedy = false;
    for (int i = 0; i < n_out && !any_greedy; i++)
        any_greedy = slots_[size_t(out_slot_[size_t(i)])].sampler->plain_greedy();
    std::span<const float> logits;
    std::span<const TokenPick> picks;
    if (any_greedy)
        picks = model_.step_greedy(batch, out_rows, n_valid_);
    else
        logits = model_.step(batch, out_rows);
    const size_t V = size_t(model_.config().vocab_size);
    for (int i = 0; i < n_out; i++) {
        const int slot = out_slot_[size_t(i)];
        Sequence& s = slots_[size_t(slot)];
        const GenerationRequest& r = requests_[size_t(s.id)];
        GenerationResult& res = results_[size_t(s.id)];
        const TokenPick next = pick_or_sample(*s.sampler, any_greedy ? &picks[size_t(i)] : nullptr, n_valid_, [&] {
            if (logits.empty()) logits = model_.last_logits();
            return logits.subspan(size_t(i) * V, V);
        });
        const int32_t tok = next.id;
        s.sampler->accept(tok);
        res.tokens.push_back(tok);
        res.logprobs.push_back(next.logprob);
        if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end())
            finish(slot, FinishReason::eos);
        else if (int(res.tokens.size()) >= r.max_new_tokens)
            finish(slot, FinishReason::max_tokens);
        else if (model_.seq_len(slot) >= model_.n_ctx())
            finish(slot, FinishReason::context_full);
    }
    for (int i = 0; i < n_prefilled; i++) finish(prefilled_[size_t(i)], FinishReason::max_tokens);
    for (int slot = 0; slot < int(slots_.size()); slot++)
        if (slots_[size_t(slot)].id >= 0 && slots_[size_t(slot)].cancel) finish(slot, FinishReason::cancelled);
    return true;
}

void BatchGenerator::run() {
    while (step()) {}
}

}  // namespace hy
