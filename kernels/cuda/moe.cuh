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
    bf16* act = nullptr;           // [rows * k, I]: the experts' SiLU products
    bf16* y_slot = nullptr;        // [rows * k, H]: grouped path: each choice's weighted output (sorted positions)
    int32_t* index = nullptr;      // [moe_index_ints(rows, E, k)]: grouped path: the sort by expert and its tiles
    bf16* shared_act = nullptr;    // [rows, Is]: fused shared expert: its SiLU product
    float* shared_gate = nullptr;  // [rows]: fused shared expert: bf16(sigmoid(bf16(x . gate)))
};

// A matrix of the experts' kernels: bf16 [N, K], or codes with scales (Matrix's data, scales, scale_segment_rows
// and group; for MoeExperts' stacked gate_up [E 2I, H] and down [E H, I] the segments are each expert's rows).
struct ExpertMatrix {
    const void* w = nullptr;        // [N, K]: bf16, fp8 codes or Q8/Q4 codes
    const float* scales = nullptr;  // FP8: F32 [fp8_scale_rows(N, segment_rows), ceil(K / 128)]; Q8/Q4: [N, K / group]
    int64_t segment_rows = 0;       // FP8: rows of one independently blocked segment (0: one segment)
    int group = 0;                  // Q8/Q4: weights of a row per scale
};

// The shared expert's weights for moe_experts' fused path (Is and H multiples of 8): bf16, or (quantized) of the
// routed experts' type with their own scales.
struct MoeShared {
    ExpertMatrix gate_proj;      // [Is, H]
    ExpertMatrix up_proj;        // [Is, H]
    ExpertMatrix down_proj;      // [H, Is]
    const bf16* gate = nullptr;  // [H] (always bf16)
    int Is = 0;
    bool quantized = false;  // the three projections hold the routed experts' weight type, else bf16
};
// Sizes of the grouped path's index and of its tile list.
size_t moe_index_ints(int64_t rows, int E, int k);
int64_t moe_max_tiles(int64_t rows, int E, int k);
// Whether moe_experts takes the grouped path for these rows (at least ctx.moe_grouped_min_rows rows, for FP8 experts
// ctx.moe_grouped_min_rows_fp8, and H and I multiples of 8, of 16 for FP8 experts); else one warp per output reads
// the chosen experts' rows for every row.
bool moe_grouped(int64_t rows, int H, int I, const LaunchContext& ctx, DType weights = DType::BF16);
// Whether moe_experts runs a shared expert of width Is inside its kernels for these rows: the per-row path (not
// moe_grouped), at most kMoeFusedSharedMaxRows rows (tuning.cuh), H and Is multiples of 8.
bool moe_fuses_shared(int64_t rows, int H, int I, int Is, const LaunchContext& ctx, DType weights = DType::BF16);
// Whether moe_experts takes experts of these types: both BF16, both one FP8 type (F8_E4M3, F8_E5M2) with 128 x 128
// block scales (Matrix::scales, scale_segment_rows), or both Q8 or both Q4 with valid groups (int_quant_shape_ok).
bool moe_experts_take(const Matrix& gate_up, const Matrix& down);

// y bf16 [rows, H] = the routed experts' weighted sum, experts added in increasing id. Few rows: a gate/up kernel
// and a down kernel, one warp per output (1-2 rows: the gate/up on the decode GEMV's loop for bf16
// and FP8 experts, and for bf16 a prefetching down kernel). FP8 experts (moe_experts_take): the weights are fp8 codes
// times their block's scale, each block's products summed in fp32 before the scale (W8A16, as the FP8 GEMVs); the
// grouped path converts the codes to bf16 (exact) in shared memory for the tensor cores. Q8/Q4 experts: the per-row
// kernels sum each group's products of codes and x in fp32, then times the group's scale (weights never rounded, as the
// integer GEMV); the grouped path converts the codes to bf16(q * scale) in shared memory (the dense path's dequantized
// weights). Many rows (moe_grouped): the choices sorted by expert on the device, two grouped tensor-core GEMMs over the
// tiles of each expert's rows, and a combine kernel. shared (only where moe_fuses_shared; else nullptr): the gate/up
// kernel also computes the shared expert's activation and gate (its projections bf16 or of the routed experts' type, as
// the per-row kernels read those), the down kernel adds bf16(gate * bf16(down_s . act_s)) after the routed sum: the
// values of add_sigmoid_gated over the shared expert's gate_up_silu and matmul.
void moe_experts(const bf16* x, int64_t rows, const MoeExperts& experts, int H, const float* weights,
                 const int32_t* ids, int k, const MoeShared* shared, const MoeScratch& scratch, bf16* y,
                 const LaunchContext& ctx);

// y[t] = bf16(y[t] + bf16(bf16(sigmoid(bf16(x_t . gate))) * s[t])); gate bf16 [H].
void add_sigmoid_gated(bf16* y, const bf16* s, const bf16* x, const bf16* gate, int64_t rows, int H,
                       const LaunchContext& ctx);

}  // namespace hy::cuda
