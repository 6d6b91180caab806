// The mixture-of-experts block on bf16 activations (see Backend::moe_route, moe_experts, add_sigmoid_gated;
// docs/QWEN35.md "Mixture-of-experts members"), with the roundings of transformers' bf16 forward: router logits,
// routing weights, each expert's gate, up, activation and down outputs, its weighted output and the running sum
// (experts added in increasing id) are rounded to bf16; dot products accumulate in fp32. Routing is decided on the
// device (no host round trip), so a decode step stays one graph.
//
// Decode reads only the k chosen experts' weights once per (row, choice); prefill and large batches group the rows
// by expert so that each expert's weights are read once per tile of up to 64 rows (moe.cu).
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

// Workspace of moe_experts (device memory of the backend's workspace).
struct MoeScratch {
    bf16* act = nullptr;       // [rows * k, I]: the experts' SiLU products
    bf16* y_slot = nullptr;    // [rows * k, H]: grouped path: each choice's weighted output (sorted positions)
    int32_t* index = nullptr;  // [moe_index_ints(rows, E, k)]: grouped path: the sort by expert and its tiles
};
// Sizes of the grouped path's index and of its tile list.
size_t moe_index_ints(int64_t rows, int E, int k);
int64_t moe_max_tiles(int64_t rows, int E, int k);
// Whether moe_experts takes the grouped path for these rows (at least ctx.moe_grouped_min_rows rows and H and I
// multiples of 32); else one warp per output reads the chosen experts' rows for every row.
bool moe_grouped(int64_t rows, int H, int I, const LaunchContext& ctx);

// y bf16 [rows, H] = the routed experts' weighted sum, experts added in increasing id. Few rows: a gate/up kernel
// and a down kernel, one warp per output. Many rows (moe_grouped): the choices sorted by expert on the device, two
// grouped tensor-core GEMMs over the tiles of each expert's rows, and a combine kernel.
void moe_experts(const bf16* x, int64_t rows, const MoeExperts& experts, int H, const float* weights,
                 const int32_t* ids, int k, const MoeScratch& scratch, bf16* y, const LaunchContext& ctx);

// y[t] = bf16(y[t] + bf16(bf16(sigmoid(bf16(x_t . gate))) * s[t])); gate bf16 [H].
void add_sigmoid_gated(bf16* y, const bf16* s, const bf16* x, const bf16* gate, int64_t rows, int H,
                       const LaunchContext& ctx);

}  // namespace hy::cuda
