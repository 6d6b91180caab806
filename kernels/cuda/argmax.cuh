// Greedy picks on the device: per logits row the arg max and its log-softmax value, so that a greedy decode
// step downloads 8 bytes per sequence instead of the whole row (see hy::Backend::argmax_rows).
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace hy::cuda {

// Floats of scratch argmax_rows() needs for `max_rows` rows.
size_t argmax_scratch_floats(int max_rows);
// picks[i] = pick of row i of logits (F32 [n, row_len]) over ids [0, n_valid); scratch: argmax_scratch_floats(n).
void argmax_rows(const float* logits, int n, int row_len, int n_valid, TokenPick* picks, float* scratch,
                 const LaunchContext& ctx);

}  // namespace hy::cuda
