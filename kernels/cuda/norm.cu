#include "kernels/cuda/norm.cuh"

namespace hy::cuda {

namespace {

// One block of kNormThreads per row. Each thread reads its elements twice (sum of squares, then the scaled
// output): the second read hits L1/L2, and in-place use is safe because a thread only rewrites its own elements.
template <bool kVec>
__global__ void rms_norm_kernel(const bf16* x, const float* __restrict__ w, int dim, float eps, bool zero_centred,
                                bf16* y) {
    __shared__ float scratch[32];
    const int64_t row = blockIdx.x;
    const bf16* xr = x + row * dim;
    bf16* yr = y + row * dim;
    float ss = 0.0f;
    if constexpr (kVec) {
        const uint4* x4 = reinterpret_cast<const uint4*>(xr);
        for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) {
            float v[8];
            unpack8(x4[i], v);
#pragma unroll
            for (int j = 0; j < 8; j++) ss += v[j] * v[j];
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            const float v = to_f32(xr[i]);
            ss += v * v;
        }
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / float(dim) + eps);
    const float one = zero_centred ? 1.0f : 0.0f;
    if constexpr (kVec) {
        const uint4* x4 = reinterpret_cast<const uint4*>(xr);
        uint4* y4 = reinterpret_cast<uint4*>(yr);
        for (int i = threadIdx.x; i < dim / 8; i += blockDim.x) {
            float v[8];
            unpack8(x4[i], v);
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = v[j] * inv * (one + w[8 * i + j]);
            y4[i] = pack8(v);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = to_bf16(to_f32(xr[i]) * inv * (one + w[i]));
    }
}

}  // namespace

void rms_norm(const bf16* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, bf16* y,
              cudaStream_t stream) {
    if (rows <= 0) return;
    const bool vec = dim % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                     (reinterpret_cast<uintptr_t>(y) & 15u) == 0;
    if (vec)
        rms_norm_kernel<true><<<unsigned(rows), kNormThreads, 0, stream>>>(x, w, dim, eps, zero_centred, y);
    else
        rms_norm_kernel<false><<<unsigned(rows), kNormThreads, 0, stream>>>(x, w, dim, eps, zero_centred, y);
    check_launch("rms_norm kernel");
}

}  // namespace hy::cuda
