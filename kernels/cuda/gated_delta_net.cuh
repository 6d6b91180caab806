// Gated DeltaNet core on bf16 activations (see hy::GatedDeltaNetArgs, QWEN35.md "Gated DeltaNet layer"):
//   1. causal depthwise conv over each run (the conv state supplies the K-1 inputs before it) + SiLU -> mixed
//   2. conv state <- the last K-1 pre-conv inputs of [state, run] (inside 1. when every run is one token)
//   3. the delta-rule recurrence per (run, value head), token by token, fp32 state updated in place: gates
//      beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); l2norm of q and k; o = S^T q  (o rounded to bf16),
//      then the gated RMSNorm: y = norm_w * RMSNorm(o) * silu(z)
// Decode (every run one token) runs the recurrence and the norm in one kernel per (value head, run), and in steps of
// up to 8 runs on compute capability 9.0 the conv too (clusters of the value heads sharing a key head); otherwise the
// recurrence runs per (32 value columns, value head, run), writes o to out, and a second kernel applies the norm in
// place. Both paths give bitwise the same outputs and state for a token, however tokens are grouped into runs and
// steps. Every kernel is launched with programmatic dependent launch (cuda::launch) where enabled.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// mixed_scratch: bf16 [T, C] (workspace, 16-byte aligned). Key dims 32, 64 and 128 are built; value dims must be
// multiples of 32 up to 256; others throw unsupported. args.out must not alias args.qkv, args.z or the scratch.
// Decode steps do the conv inside the recurrence kernel where they can when ctx.gdn_fused_conv (clusters of value
// heads need ctx.clusters).
void gated_delta_net(const GatedDeltaNetArgs& args, const RowMap& rows, bf16* mixed_scratch, const LaunchContext& ctx);

}  // namespace hy::cuda
