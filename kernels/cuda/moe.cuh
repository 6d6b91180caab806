// The mixture-of-experts block on bf16 activations (see Backend::moe_route, moe_experts, add_sigmoid_gated;
// docs/QWEN35.md "Mixture-of-experts members"), with the roundings of transformers' bf16 forward: router logits,
// routing weights, each expert's gate, up, activation and down outputs, its weighted output and the running sum
// (experts added in increasing id) are rounded to bf16; dot products accumulate in fp32. Routing is decided on the
// device (no host round trip), so a decode step stays one graph.
//
// First version (correct, not yet tuned): one warp per output row, reading only the k chosen experts' weights once
// per (row, choice). That is the decode case's whole traffic; prefill re-reads an expert for every row that chose
// it (a grouped GEMM over the tokens of each expert is the next step).
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// The router's second half (the logits come from the projection x @ router^T, bf16 [rows, E], as transformers'
// bf16 linear): softmax in fp32, top-k (ties to the lower id), renormalised when `normalize`; weights F32
// [rows, k] (bf16-rounded values), ids I32 [rows, k].
void moe_top_k(const bf16* router_logits, int64_t rows, int E, int k, bool normalize, float* weights, int32_t* ids,
               const LaunchContext& ctx);
// Throws unsupported unless 1 <= k <= 32, k <= E and E <= 4096.
void check_moe_route(int E, int k);

// y bf16 [rows, H] = the routed experts' weighted sum; act_scratch bf16 [rows * k, I] (workspace).
void moe_experts(const bf16* x, int64_t rows, const MoeExperts& experts, int H, const float* weights,
                 const int32_t* ids, int k, bf16* act_scratch, bf16* y, const LaunchContext& ctx);

// y[t] = bf16(y[t] + bf16(bf16(sigmoid(bf16(x_t . gate))) * s[t])); gate bf16 [H].
void add_sigmoid_gated(bf16* y, const bf16* s, const bf16* x, const bf16* gate, int64_t rows, int H,
                       const LaunchContext& ctx);

}  // namespace hy::cuda
