#include "model/batch.h"

#include <algorithm>
#include <cmath>

#include "base/softmax.h"

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
    by_length_.resize(size_t(model.n_slots()));
    chunk_.resize(size_t(model.n_slots()));
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
    if (r.top_logprobs < 0 || r.top_logprobs > 20)
        throw Error(Status::invalid_argument, "top_logprobs must be in [0, 20]");
    if (r.state && (r.n_cached <= 0 || size_t(r.n_cached) >= r.prompt.size()))
        throw Error(Status::invalid_argument, "n_cached must be in [1, prompt size) with a state");
    if (r.save_at < 0 || size_t(r.save_at) > r.prompt.size())
        throw Error(Status::invalid_argument, "save_at must be in [0, prompt size]");
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

void BatchGenerator::forget(int id) {
    if (id < 0 || id >= int(requests_.size()) || !results_[size_t(id)].done)
        throw Error(Status::invalid_argument, "no finished request " + std::to_string(id));
    requests_[size_t(id)] = GenerationRequest{};
    results_[size_t(id)] = GenerationResult{};
    results_[size_t(id)].done = true;
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

std::shared_ptr<StoredState> BatchGenerator::take_state(int id, bool final) {
    if (id < 0 || id >= int(results_.size())) throw Error(Status::invalid_argument, "no request " + std::to_string(id));
    GenerationResult& r = results_[size_t(id)];
    return std::move(final ? r.final_state : r.saved_state);
}

std::shared_ptr<StoredState> BatchGenerator::save(int slot) {
    const size_t bytes = model_.state_bytes(slot);
    std::shared_ptr<StoredState> st = allocate_state_ ? allocate_state_(bytes) : std::make_shared<StoredState>(bytes);
    if (st) model_.save_state(slot, st->ranges());
    return st;
}

void BatchGenerator::finish(int slot, FinishReason reason) {
    Sequence& s = slots_[size_t(slot)];
    if (requests_[size_t(s.id)].save_final && reason != FinishReason::cancelled)
        results_[size_t(s.id)].final_state = save(slot);
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
        s.prompt_done = 0;
        model_.reset(slot);
        if (r.state) {  // a state that does not load (or holds another length) only costs the full prefill
            try {
                model_.load_state(slot, r.state->ranges());
                if (model_.seq_len(slot) == r.n_cached) s.prompt_done = size_t(r.n_cached);
            } catch (const Error&) {}
            if (s.prompt_done == 0) model_.reset(slot);
            results_[size_t(id)].n_cached = int(s.prompt_done);
        }
        s.id = id;
        s.save_at = r.save_at > r.n_cached ? r.save_at : 0;
        s.waited = 0;
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

    // Build the batch: one decode row for every generating sequence, oldest request first, then prompt chunks in
    // the rows left. Prompt rows go first to the sequences that waited max_prompt_wait steps without any (a fair
    // share each, oldest first), then to the shortest remaining prompt first (ties: oldest first), so a short
    // prompt that arrives with or just after a long one gets its first token without waiting out the long
    // prefill. (Each row is computed on its own, so how a prompt is cut into chunks never changes its results.)
    int n_order = 0;
    for (int slot = 0; slot < int(slots_.size()); slot++)
        if (slots_[size_t(slot)].id >= 0) order_[size_t(n_order++)] = slot;
    std::sort(order_.begin(), order_.begin() + n_order,
              [&](int a, int b) { return slots_[size_t(a)].id < slots_[size_t(b)].id; });
    const int budget = model_.max_batch_tokens();
    int n_rows = 0, n_runs = 0, n_out = 0, n_prefilled = 0;
    // the prompt ids a sequence may take this step (up to save_at, where its state is saved after exactly those)
    auto wanted = [&](const Sequence& s) {
        const size_t end = s.save_at > 0 ? size_t(s.save_at) : requests_[size_t(s.id)].prompt.size();
        return int(end - s.prompt_done);
    };
    int n_prompts = 0;
    for (int k = 0; k < n_order; k++) {
        const int slot = order_[size_t(k)];
        const Sequence& s = slots_[size_t(slot)];
        chunk_[size_t(slot)] = 0;
        if (s.prompt_done == requests_[size_t(s.id)].prompt.size()) {
            n_rows++;  // a decode row
        } else if (wanted(s) > 0) {
            by_length_[size_t(n_prompts++)] = slot;
        }
    }
    int left = std::max(budget - n_rows, 0);
    if (n_prompts > 0) {
        const int share = std::max(left / n_prompts, 1);
        for (int k = 0; k < n_order && left > 0; k++) {  // the sequences that waited too long, oldest first
            const int slot = order_[size_t(k)];
            const Sequence& s = slots_[size_t(slot)];
            if (s.prompt_done == requests_[size_t(s.id)].prompt.size() || s.waited < max_prompt_wait || wanted(s) <= 0)
                continue;
            chunk_[size_t(slot)] = std::min({wanted(s), share, left});
            left -= chunk_[size_t(slot)];
        }
        auto remaining = [&](int slot) {
            const Sequence& s = slots_[size_t(slot)];
            return requests_[size_t(s.id)].prompt.size() - s.prompt_done;
        };
        std::sort(by_length_.begin(), by_length_.begin() + n_prompts, [&](int a, int b) {
            const size_t ra = remaining(a), rb = remaining(b);
            return ra != rb ? ra < rb : slots_[size_t(a)].id < slots_[size_t(b)].id;
        });
        for (int k = 0; k < n_prompts && left > 0; k++) {  // then the shortest remaining prompt first
            const int slot = by_length_[size_t(k)];
            const int more = std::min(wanted(slots_[size_t(slot)]) - chunk_[size_t(slot)], left);
            chunk_[size_t(slot)] += more;
            left -= more;
        }
    }
    n_rows = 0;
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
                n = chunk_[size_t(slot)];
                s.waited = n > 0 ? 0 : s.waited + 1;
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
    bool any_greedy = false, any_top = false;
    for (int i = 0; i < n_out; i++) {
        const Sequence& s = slots_[size_t(out_slot_[size_t(i)])];
        any_greedy = any_greedy || s.sampler->plain_greedy();
        any_top = any_top || requests_[size_t(s.id)].top_logprobs > 0;
    }
    if (any_top) any_greedy = false;  // the rows are needed on the host anyway
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
        TokenPick next;
        if (r.top_logprobs > 0) {  // (any_top: no greedy picks) one log-sum-exp pass for the id and the top ids
            if (logits.empty()) logits = model_.last_logits();
            const std::span<const float> row = logits.subspan(size_t(i) * V, V);
            const LogSoftmaxNorm norm = log_softmax_norm(row, n_valid_);
            next.id = s.sampler->sample(row);
            next.logprob = float(log_softmax_at(row, n_valid_, next.id, norm));
            res.top.push_back(top_logprobs(row, n_valid_, r.top_logprobs, norm));
        } else {
            next = pick_or_sample(*s.sampler, any_greedy ? &picks[size_t(i)] : nullptr, n_valid_, [&] {
                if (logits.empty()) logits = model_.last_logits();
                return logits.subspan(size_t(i) * V, V);
            });
        }
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
    // States to save: the slots whose prefill just reached save_at (before any finish below reuses a slot).
    for (int k = 0; k < n_order; k++) {
        Sequence& s = slots_[size_t(order_[size_t(k)])];
        if (s.id < 0 || s.save_at <= 0 || s.prompt_done != size_t(s.save_at)) continue;
        results_[size_t(s.id)].saved_state = save(order_[size_t(k)]);
        s.save_at = 0;
    }
    for (int i = 0; i < n_prefilled; i++) finish(prefilled_[size_t(i)], FinishReason::max_tokens);
    for (int slot = 0; slot < int(slots_.size()); slot++)
        if (slots_[size_t(slot)].id >= 0 && slots_[size_t(slot)].cancel) finish(slot, FinishReason::cancelled);
    return true;
}

std::vector<TokenPick> top_logprobs(std::span<const float> row, int n_valid, int k, const LogSoftmaxNorm& norm) {
    n_valid = std::clamp(n_valid, 1, int(row.size()));
    k = std::clamp(k, 0, n_valid);
    // the normalizer of log_softmax_at (base/softmax.h), so that the sampled id's log-probability and its entry
    // here are the same number
    const float mx = norm.mx;
    const double log_sum = norm.log_sum;
    std::vector<TokenPick> best;
    best.reserve(size_t(k) + 1);
    for (int i = 0; i < n_valid; i++) {
        const float x = row[size_t(i)];
        if (!std::isfinite(x)) continue;
        if (int(best.size()) == k && x <= best.back().logprob) continue;
        auto at = std::find_if(best.begin(), best.end(), [&](const TokenPick& p) { return x > p.logprob; });
        best.insert(at, TokenPick{i, x});
        if (int(best.size()) > k) best.pop_back();
    }
    for (TokenPick& p : best) p.logprob = float(double(p.logprob) - double(mx) - log_sum);
    return best;
}

void BatchGenerator::run() {
    while (step()) {}
}

}  // namespace hy
