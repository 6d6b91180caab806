#include "model/generate.h"

#include <algorithm>
#include <chrono>

#include "model/tokenizer.h"

namespace hy {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::none: return "none";
        case FinishReason::eos: return "eos";
        case FinishReason::max_tokens: return "max_tokens";
        case FinishReason::context_full: return "context_full";
        case FinishReason::cancelled: return "cancelled";
        case FinishReason::stop_string: return "stop_string";
        case FinishReason::callback: return "callback";
    }
    return "?";
}

void generate(Sequence& seq, Sampler& sampler, const Tokenizer& tok, std::span<const int32_t> prompt,
              const GenerateOptions& o, GenerateResult& res) {
    using clock = std::chrono::steady_clock;
    Model& model = *seq.model;

    // prefill
    const auto t0 = clock::now();
    res.n_prompt = int(prompt.size()) + seq.n_pending;
    struct AbortHook {  // set for this prefill only
        Model& m;
        ~AbortHook() { m.set_prefill_abort(nullptr, nullptr); }
    };
    try {
        const AbortHook hook{model};
        model.set_prefill_abort(o.should_abort, o.abort_data);
        seq.feed(prompt.data(), int(prompt.size()));  // (resets the sequence when it throws)
    } catch (const Model::Aborted&) {
        res.n_prompt = 0;  // (the sequence was reset: none of it was kept)
        res.prompt_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        res.reason = FinishReason::callback;
        return;
    }
    const auto t1 = clock::now();
    res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

    StreamDecoder dec(tok, o.skip_special);
    std::string held;  // decoded text not yet given to the callback
    held.reserve(256);
    auto emit = [&](int32_t id, float lp, const std::string& text) -> bool {
        return o.on_token ? o.on_token(id, lp, text, res.n_generated) : false;
    };
    std::string out_text;
    out_text.reserve(256);
    FinishReason reason = FinishReason::none;
    // Greedy without penalties: after the prompt, each step's arg max (and its log-probability) is picked on the
    // backend, and only a pick of a banned id (or a failure to pick) brings the logits row to the host.
    const bool pick_on_backend = sampler.plain_greedy();
    TokenPick pick;
    bool have_pick = false, logits_on_backend = false;
    auto host_row = [&]() -> std::span<const float> {
        if (logits_on_backend) {
            seq.fetch_logits();
            logits_on_backend = false;
        }
        return seq.logits;
    };
    for (;;) {
        if (o.max_tokens >= 0 && res.n_generated >= o.max_tokens) {
            reason = FinishReason::max_tokens;
            break;
        }
        const TokenPick next = pick_or_sample(sampler, have_pick ? &pick : nullptr, o.n_valid, host_row);
        have_pick = false;
        const int32_t id = next.id;
        if ((!o.ignore_eos && std::binary_search(o.eos.begin(), o.eos.end(), id)) ||
            std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
            reason = FinishReason::eos;
            break;
        }
        held += dec.push(id);
        // stop strings: find the earliest match in the held text
        size_t cut = std::string::npos;
        for (const auto& st : o.stop) {
            const size_t at = held.find(st);
            if (at != std::string::npos) cut = std::min(cut, at);
        }
        if (cut != std::string::npos) {
            held.resize(cut);
            dec.reset();
            reason = FinishReason::stop_string;
            break;
        }
        // hold back the longest suffix that is a prefix of a stop string
        size_t keep = 0;
        for (const auto& st : o.stop)
            for (size_t k = std::min(st.size() - 1, held.size()); k > keep; k--)
                if (held.compare(held.size() - k, k, st, 0, k) == 0) {
                    keep = k;
                    break;
                }
        out_text.assign(held, 0, held.size() - keep);
        held.erase(0, held.size() - keep);
        sampler.accept(id);  // (kept ids only: the penalty history stays the sequence's, as /load rebuilds it)
        seq.history.push_back(id);
        seq.n_pending = 1;
        seq.has_logits = false;
        const bool stop = emit(id, next.logprob, out_text);
        res.n_generated++;
        if (stop) {
            reason = FinishReason::callback;
            break;
        }
        if (o.max_tokens >= 0 && res.n_generated >= o.max_tokens) {
            reason = FinishReason::max_tokens;
            break;
        }
        if (model.seq_len(seq.slot) + 1 > model.n_ctx()) {
            reason = FinishReason::context_full;
            break;
        }
        res.n_decoded++;
        if (pick_on_backend) {  // runs the pending id
            pick = seq.feed_pick(o.n_valid);
            logits_on_backend = true;
            have_pick = true;
        } else {
            seq.feed(nullptr, 0);
        }
    }
    // the sequence keeps the logits of its last fed token, as after feed()
    if (logits_on_backend) seq.fetch_logits();
    if (reason != FinishReason::stop_string) held += dec.flush();
    if (!held.empty()) {
        out_text = held;
        emit(-1, 0.0f, out_text);
    }
    res.reason = reason;
    res.generate_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
}

}  // namespace hy
