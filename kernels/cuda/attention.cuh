// Gated full attention core on bf16 activations (see hy::AttentionArgs, QWEN35.md "Gated attention layer"):
// q/k RMSNorm1p per head, partial RoPE (rotate_half), K/V written to the cache, causal softmax attention over the
// cache with GQA, the sigmoid output gate. A prep kernel (norm, RoPE, cache write) runs first; then steps of more
// than kAttnSplitMaxRows rows (prefill) use a tensor-core flash-attention kernel (query tiles of 64 rows of one
// run), smaller steps (decode) a per-row kernel, split over positions for long contexts. Decode steps of one-token
// runs split over positions need no prep kernel: the per-row kernel normalizes and rotates q and the new key itself.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// Floats of split scratch attention() needs (decode steps split over positions).
size_t attention_split_floats(int max_heads, int max_head_dim);
// q_scratch: bf16 [T, Hq, D]; split_scratch: attention_split_floats() floats (workspace). Head dims 64, 128 and
// 256 are built; others throw unsupported. Every kernel is launched with cuda::launch (PDL when enabled); no
// synchronization. The prefill kernel's shared memory (up to 99 KB at D = 256) is opted into on first use.
void attention(const AttentionArgs& args, const RowMap& rows, bf16* q_scratch, float* split_scratch,
               const LaunchContext& ctx);

}  // namespace hy::cuda
