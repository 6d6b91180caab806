// Row gathers: the token embedding lookup and the selection of the rows whose logits are wanted.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// x[t, :] = table[token_ids[t], :] for t < n (table bf16 [vocab, dim]; token_ids on the device).
void embed(const bf16* table, int64_t dim, const int32_t* token_ids, int n, bf16* x, const LaunchContext& ctx);
// y[i, :] = x[rows[i], :] for i < n (rows on the device). y must not overlap x.
void gather_rows(const bf16* x, int64_t dim, const int32_t* rows, int n, bf16* y, const LaunchContext& ctx);

}  // namespace hy::cuda
