#include "kernels/cuda/embed.cuh"

namespace hy::cuda {

namespace {

// One block per output row; copies dim bf16 values (16-byte words when dim % 8 == 0).
__global__ void gather_kernel(const bf16* __restrict__ src, int64_t dim, const int32_t* __restrict__ index,
                              bf16* __restrict__ dst) {
    pdl_trigger();
    pdl_wait();
    const int64_t r = blockIdx.x;
    const bf16* s = src + int64_t(index[r]) * dim;
    bf16* d = dst + r * dim;
    if (dim % 8 == 0) {
        const uint4* s4 = reinterpret_cast<const uint4*>(s);
        uint4* d4 = reinterpret_cast<uint4*>(d);
        for (int64_t i = threadIdx.x; i < dim / 8; i += blockDim.x) d4[i] = s4[i];
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
    }
}

void gather(const bf16* src, int64_t dim, const int32_t* index, int n, bf16* dst, const LaunchContext& ctx,
            const char* what) {
    if (n <= 0) return;
    launch(gather_kernel, unsigned(n), 128, 0, ctx, what, src, dim, index, dst);
}

}  // namespace

void embed(const bf16* table, int64_t dim, const int32_t* token_ids, int n, bf16* x, const LaunchContext& ctx) {
    gather(table, dim, token_ids, n, x, ctx, "embedding gather kernel");
}

void gather_rows(const bf16* x, int64_t dim, const int32_t* rows, int n, bf16* y, const LaunchContext& ctx) {
    gather(x, dim, rows, n, y, ctx, "gather_rows kernel");
}

HY_CUDA_TRACE_BINDER(embed)

}  // namespace hy::cuda
