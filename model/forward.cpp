// The Qwen3.5 hybrid forward, one explicit pass over the layers (QWEN35.md "Decoder layer"):
//   h = h + Mixer(RMSNorm1p(h; input_layernorm));  h = h + MLP(RMSNorm1p(h; post_attention_layernorm))
//   logits = RMSNorm1p(h; norm) @ W_out^T
// where Mixer is a gated full-attention layer or a Gated DeltaNet layer. Every op goes through the Backend, and
// every op called here is a kernel launch (or a few) of the CUDA backend, named as what it fuses: add_rms_norm
// (the residual add and the next norm), matmul_group (projections of one input), gate_up_silu (the MLP's gate and
// up projections and SiLU). A layer's MLP residual is added by the next layer's add_rms_norm.
#include <algorithm>

#include "model/model.h"

namespace hy {

void Model::forward(const BatchDesc& batch, std::span<const int32_t> out_rows) {
    const ModelConfig& c = config_;
    Backend& be = *backend_;
    Activations& a = act_;
    const int64_t T = batch.n_tokens;
    const int H = c.hidden_size;
    const float eps = c.rms_norm_eps;

    be.begin_batch(batch);
    be.embed(weights_.embed, a.x);  // [T, H]
    for (int i = 0; i < c.n_layers; i++) {
        const LayerWeights& L = weights_.layers[size_t(i)];
        const LayerState& S = state_[size_t(i)];
        if (i == 0)
            be.rms_norm(a.x, L.input_norm, T, H, eps, true, a.xn);  // [T, H]
        else  // the previous layer's MLP residual, then this layer's input norm
            be.add_rms_norm(a.x, a.y, L.input_norm, T, H, eps, true, a.xn);
        if (L.kind == LayerKind::full_attention) {
            const AttentionWeights& w = L.attn;
            const Projection qkv[] = {
                {w.q_proj, a.mix_in},  // [T, Hq, 2D]
                {w.k_proj, a.k},       // [T, Hkv, D]
                {w.v_proj, a.v},       // [T, Hkv, D]
            };
            be.matmul_group(a.xn, T, qkv, 3);
            AttentionArgs args;
            args.qg = a.mix_in;
            args.k = a.k;
            args.v = a.v;
            args.q_norm = w.q_norm;
            args.k_norm = w.k_norm;
            args.k_cache = S.k_cache;
            args.v_cache = S.v_cache;
            args.out = a.mix_out;  // [T, Hq * D]
            args.n_heads = c.n_heads;
            args.n_kv_heads = c.n_kv_heads;
            args.head_dim = c.head_dim;
            args.rotary_dim = c.rotary_dim;
            args.n_ctx = params_.n_ctx;
            args.rope_theta = c.rope_theta;
            args.rope_yarn_factor = c.rope_yarn_factor;
            args.rope_yarn_low = c.rope_yarn_low;
            args.rope_yarn_range = c.rope_yarn_range;
            args.rope_attention_factor = c.rope_attention_factor;
            args.eps = eps;
            be.attention(args);
            be.matmul(a.mix_out, T, w.o_proj, a.y);  // [T, H]
        } else {
            const GatedDeltaNetWeights& w = L.gdn;
            const Projection in_proj[] = {
                {w.in_proj_qkv, a.mix_in},  // [T, C]
                {w.in_proj_z, a.z},         // [T, Hv * Dv]
                {w.in_proj_b, a.b},         // [T, Hv]
                {w.in_proj_a, a.a},         // [T, Hv]
            };
            be.matmul_group(a.xn, T, in_proj, 4);
            GatedDeltaNetArgs args;
            args.qkv = a.mix_in;
            args.z = a.z;
            args.b = a.b;
            args.a = a.a;
            args.conv_w = w.conv1d;
            args.A_log = w.A_log;
            args.dt_bias = w.dt_bias;
            args.norm_w = w.norm;
            args.conv_state = S.conv_state;
            args.ssm_state = S.ssm_state;
            args.out = a.mix_out;  // [T, Hv * Dv]
            args.n_k_heads = c.gdn_k_heads;
            args.n_v_heads = c.gdn_v_heads;
            args.k_dim = c.gdn_k_dim;
            args.v_dim = c.gdn_v_dim;
            args.conv_kernel = c.conv_kernel;
            args.eps = eps;
            be.gated_delta_net(args);
            be.matmul(a.mix_out, T, w.out_proj, a.y);  // [T, H]
        }
        be.add_rms_norm(a.x, a.y, L.post_norm, T, H, eps, true, a.xn);  // x += mixer; [T, H]
        if (L.moe) {                                                    // docs/QWEN35.md "Mixture-of-experts members"
            const MoeWeights& m = L.moe_block;
            const int k = c.n_experts_per_tok;
            be.moe_route(a.xn, T, m.router, k, c.norm_topk_prob, a.route_weights, a.route_ids);  // [T, k]
            // routed experts + sigmoid(xn . g) * shared expert, one fused op
            be.moe_experts(a.xn, T, m.experts, m.shared, a.route_weights, a.route_ids, k, a.y);  // [T, H]
        } else {
            be.gate_up_silu(a.xn, T, L.mlp.gate_proj, L.mlp.up_proj, a.gate, a.up, a.gate);  // [T, F]
            be.matmul(a.gate, T, L.mlp.down_proj, a.y);                                      // [T, H]
        }
    }
    if (c.n_layers > 0) be.add(a.x, a.y, T * H);  // the last layer's MLP residual
    const int n_out = int(out_rows.size());
    if (n_out == 0) return;
    be.gather_rows(a.x, H, out_rows.data(), n_out, a.last);  // [n_out, H]
    be.rms_norm(a.last, weights_.final_norm, n_out, H, eps, true, a.last);
    be.logits(a.last, n_out, weights_.output, a.logits);  // [n_out, vocab]
}

void Model::check_batch(const BatchDesc& batch, std::span<const int32_t> out_rows) const {
    const ModelConfig& c = config_;
    if (batch.n_tokens <= 0 || batch.n_tokens > params_.max_batch_tokens)
        throw Error(Status::invalid_argument, "batch of " + std::to_string(batch.n_tokens) + " tokens (limit " +
                                                  std::to_string(params_.max_batch_tokens) + ")");
    if (int(out_rows.size()) > params_.max_logits)
        throw Error(Status::invalid_argument, "asked for " + std::to_string(out_rows.size()) + " logits rows (limit " +
                                                  std::to_string(params_.max_logits) + ")");
    for (int32_t r : out_rows)
        if (r < 0 || r >= batch.n_tokens)
            throw Error(Status::invalid_argument, "logits row " + std::to_string(r) + " outside the batch");
    for (int i = 0; i < batch.n_tokens; i++) {
        int32_t t = batch.token_ids[i];
        if (t < 0 || t >= c.vocab_size)
            throw Error(Status::invalid_argument,
                        "token id " + std::to_string(t) + " out of range [0, " + std::to_string(c.vocab_size) + ")");
    }
    int32_t expect_row = 0;
    for (int r = 0; r < batch.n_runs; r++) {
        const SeqRun& run = batch.runs[r];
        int len = seq_len(run.slot);
        if (run.row != expect_row || run.n_tokens <= 0)
            throw Error(Status::invalid_argument, "batch runs must cover the rows in order without gaps");
        if (run.pos != len)
            throw Error(Status::invalid_argument, "run for slot " + std::to_string(run.slot) + " starts at position " +
                                                      std::to_string(run.pos) + " but the sequence holds " +
                                                      std::to_string(len) + " tokens");
        if (len + run.n_tokens > params_.n_ctx)
            throw Error(Status::context_full, "sequence " + std::to_string(run.slot) + " would hold " +
                                                  std::to_string(len + run.n_tokens) + " tokens, context is " +
                                                  std::to_string(params_.n_ctx));
        expect_row += run.n_tokens;
    }
    if (expect_row != batch.n_tokens) throw Error(Status::invalid_argument, "batch runs do not cover every row");
    // Each slot at most once (slots are valid here: seq_len checked them); the marks are cleared before returning.
    int dup = -1;
    for (int r = 0; r < batch.n_runs && dup < 0; r++) {
        uint8_t& seen = slot_seen_[size_t(batch.runs[r].slot)];
        if (seen) dup = batch.runs[r].slot;
        seen = 1;
    }
    for (int r = 0; r < batch.n_runs; r++) slot_seen_[size_t(batch.runs[r].slot)] = 0;
    if (dup >= 0) throw Error(Status::invalid_argument, "slot " + std::to_string(dup) + " appears twice in one batch");
}

void Model::advance(const BatchDesc& batch, std::span<const int32_t> out_rows, int n_valid) {
    check_batch(batch, out_rows);
    last_n_out_ = 0;
    const int n_out = int(out_rows.size());
    std::vector<int32_t>& key = step_key_;
    key.clear();
    key.push_back(batch.n_tokens);
    key.push_back(batch.n_runs);
    for (int r = 0; r < batch.n_runs; r++) key.push_back(batch.runs[r].n_tokens);
    key.push_back(n_out);
    key.insert(key.end(), out_rows.begin(), out_rows.end());
    key.push_back(n_out > 0 ? n_valid : 0);
    if (!(key == last_step_key_ && backend_->repeat_step(batch))) {
        last_step_key_.clear();  // (stays empty if the step throws)
        forward(batch, out_rows);
        if (n_valid > 0 && n_out > 0)
            backend_->argmax_rows(act_.logits, n_out, config_.vocab_size, n_valid, act_.picks);
        last_step_key_.assign(key.begin(), key.end());
    }
    for (int r = 0; r < batch.n_runs; r++) seq_len_[size_t(batch.runs[r].slot)] += batch.runs[r].n_tokens;
    last_n_out_ = n_out;
}

std::span<const float> Model::step(const BatchDesc& batch, std::span<const int32_t> out_rows) {
    advance(batch, out_rows);
    return last_logits();
}

std::span<const TokenPick> Model::step_greedy(const BatchDesc& batch, std::span<const int32_t> out_rows, int n_valid) {
    advance(batch, out_rows, std::clamp(n_valid, 1, config_.vocab_size));
    const int n = last_n_out_;
    if (n == 0) return {};
    backend_->download(picks_host_.data(), act_.picks, size_t(n) * sizeof(TokenPick));
    return {picks_host_.data(), size_t(n)};
}

std::span<const float> Model::last_logits() {
    const size_t n = size_t(last_n_out_) * size_t(config_.vocab_size);
    if (n) backend_->download(logits_host_.data(), act_.logits, n * 4);
    return {logits_host_.data(), n};
}

std::span<const float> Model::prefill(int slot, std::span<const int32_t> tokens, bool all_logits) {
    const size_t V = size_t(config_.vocab_size);
    const int len0 = seq_len(slot);
    if (tokens.empty()) throw Error(Status::invalid_argument, "empty prompt");
    if (len0 + int64_t(tokens.size()) > params_.n_ctx)
        throw Error(Status::context_full, "prompt of " + std::to_string(tokens.size()) +
                                              " tokens does not fit: sequence holds " + std::to_string(len0) + " of " +
                                              std::to_string(params_.n_ctx) + " positions");
    for (int32_t t : tokens)
        if (t < 0 || t >= config_.vocab_size)
            throw Error(Status::invalid_argument, "token id " + std::to_string(t) + " out of range [0, " +
                                                      std::to_string(config_.vocab_size) + ")");
    // All-logits output may exceed the per-step logits buffer: then use smaller steps.
    const int chunk = all_logits ? std::min(params_.max_batch_tokens, params_.max_logits) : params_.max_batch_tokens;
    if (all_logits) all_logits_.resize(tokens.size() * V);
    std::span<const float> last;
    for (size_t done = 0; done < tokens.size();) {
        if (done > 0 && abort_fn_ && abort_fn_(abort_data_) != 0) throw Aborted{};
        const int n = int(std::min(tokens.size() - done, size_t(chunk)));
        SeqRun run{slot, seq_len_[size_t(slot)], 0, n};
        BatchDesc b{n, tokens.data() + done, &run, 1};
        const bool is_last = done + size_t(n) == tokens.size();
        if (all_logits) {
            for (int r = 0; r < n; r++) rows_scratch_[size_t(r)] = r;
            auto l = step(b, std::span<const int32_t>(rows_scratch_.data(), size_t(n)));
            std::copy(l.begin(), l.end(), all_logits_.begin() + std::ptrdiff_t(done * V));
        } else {
            rows_scratch_[0] = n - 1;
            auto l = step(b, is_last ? std::span<const int32_t>(rows_scratch_.data(), 1) : std::span<const int32_t>());
            if (is_last) last = l;
        }
        done += size_t(n);
    }
    if (all_logits) return {all_logits_.data(), all_logits_.size()};
    return last;
}

}  // namespace hy
