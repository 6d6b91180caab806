// Element-wise ops: 16-byte vectors when n is a multiple of 8 and the pointers are aligned, else scalars.
#include "kernels/cuda/elementwise.cuh"

#include <algorithm>

namespace hy::cuda {

namespace {

__global__ void add_vec_kernel(uint4* y, const uint4* x, int64_t n8) {
    pdl_trigger();
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
        float a[8], b[8];
        unpack8(y[i], a);
        unpack8(x[i], b);
#pragma unroll
        for (int j = 0; j < 8; j++) a[j] += b[j];
        y[i] = pack8(a);
    }
}

__global__ void add_kernel(bf16* y, const bf16* x, int64_t n) {
    pdl_trigger();
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = to_bf16(to_f32(y[i]) + to_f32(x[i]));
}

__device__ __forceinline__ float silu_mul1(float g, float u) { return round_bf16(siluf_(g)) * u; }

__global__ void silu_mul_vec_kernel(const uint4* gate, const uint4* up, int64_t n8, uint4* y) {
    pdl_trigger();
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
        float g[8], u[8];
        unpack8(gate[i], g);
        unpack8(up[i], u);
#pragma unroll
        for (int j = 0; j < 8; j++) g[j] = silu_mul1(g[j], u[j]);
        y[i] = pack8(g);
    }
}

__global__ void silu_mul_kernel(const bf16* gate, const bf16* up, int64_t n, bf16* y) {
    pdl_trigger();
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = to_bf16(silu_mul1(to_f32(gate[i]), to_f32(up[i])));
}

unsigned grid_for(int64_t n) {
    const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
    return unsigned(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

__global__ void fill_random_kernel(void* dst, int64_t n, bool f32, float lo, float hi, uint64_t seed) {
    pdl_trigger();
    pdl_wait();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = lo + (hi - lo) * random_unit(seed, uint64_t(i));
        if (f32)
            static_cast<float*>(dst)[i] = v;
        else
            static_cast<bf16*>(dst)[i] = to_bf16(v);
    }
}

void fill_random(void* dst, int64_t n, bool f32, float lo, float hi, uint64_t seed, const LaunchContext& ctx) {
    if (n <= 0) return;
    launch(fill_random_kernel, unsigned(std::min<int64_t>(ceil_div(n, kElementwiseThreads), 65536)),
           kElementwiseThreads, 0, ctx, "fill_random kernel", dst, n, f32, lo, hi, seed);
}

void add(bf16* y, const bf16* x, int64_t n, const LaunchContext& ctx) {
    if (n <= 0) return;
    if (n % 8 == 0 && aligned16(y) && aligned16(x)) {
        launch(add_vec_kernel, grid_for(n / 8), kElementwiseThreads, 0, ctx, "add kernel", reinterpret_cast<uint4*>(y),
               reinterpret_cast<const uint4*>(x), n / 8);
    } else {
        launch(add_kernel, grid_for(n), kElementwiseThreads, 0, ctx, "add kernel", y, x, n);
    }
}

void silu_mul(const bf16* gate, const bf16* up, int64_t n, bf16* y, const LaunchContext& ctx) {
    if (n <= 0) return;
    if (n % 8 == 0 && aligned16(gate) && aligned16(up) && aligned16(y)) {
        launch(silu_mul_vec_kernel, grid_for(n / 8), kElementwiseThreads, 0, ctx, "silu_mul kernel",
               reinterpret_cast<const uint4*>(gate), reinterpret_cast<const uint4*>(up), n / 8,
               reinterpret_cast<uint4*>(y));
    } else {
        launch(silu_mul_kernel, grid_for(n), kElementwiseThreads, 0, ctx, "silu_mul kernel", gate, up, n, y);
    }
}

HY_CUDA_TRACE_BINDER(elementwise)

}  // namespace hy::cuda
