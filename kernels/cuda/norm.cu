#include "kernels/cuda/norm.cuh"

namespace hy::cuda {

namespace {

// One block of kNormThreads per row. Each thread passes over its elements twice (sum of squares, then the scaled
// output); its first kPre 16-byte words stay in registers between the passes (a decode row of up to
// kPre * 8 * kNormThreads values is read once: the second read would be another L2 round trip on the step's
// critical path), longer rows read the rest again. In-place use is safe because a thread only rewrites its own
// elements. With kAdd, the first pass also adds d to x and stores the rounded sum back into x (each thread its own
// elements, which it alone reads again below).
template <bool kVec, bool kAdd>
__global__ void rms_norm_kernel(bf16* x, const bf16* __restrict__ d, const float* __restrict__ w, int dim, float eps,
                                bool zero_centred, bf16* y) {
    __shared__ float scratch[32];
    pdl_trigger();
    // The norm weights of this thread's first kPre 16-byte words, loaded before the wait (weights are never
    // written by a kernel); rows longer than kPre * 8 * blockDim.x values read the rest in the loop.
    constexpr int kPre = 2;  // (the loops below name wpre[0], wpre[1], xkeep[0] and xkeep[1])
    float wpre[kPre][8];
    uint4 xkeep[kPre] = {};  // this thread's first kPre words of x (after the add), kept for the second pass
    if constexpr (kVec) {
#pragma unroll
        for (int q = 0; q < kPre; q++) {
            const int i = threadIdx.x + q * int(blockDim.x);
#pragma unroll
            for (int j = 0; j < 8; j++) wpre[q][j] = i < dim / 8 ? w[8 * i + j] : 0.0f;
        }
    }
    pdl_wait();
    const int64_t row = blockIdx.x;
    bf16* xr = x + row * dim;
    bf16* yr = y + row * dim;
    float ss = 0.0f;
    if constexpr (kVec) {
        uint4* x4 = reinterpret_cast<uint4*>(xr);
        const uint4* d4 = kAdd ? reinterpret_cast<const uint4*>(d + row * dim) : nullptr;
        // the first kPre words of x and d are all loaded before any is used or stored (one memory wait, not one per
        // word: the compiler may not move a load of x past the store of an earlier word)
        uint4 dkeep[kPre] = {};
#pragma unroll
        for (int q = 0; q < kPre; q++) {
            const int i = threadIdx.x + q * int(blockDim.x);
            if (i < dim / 8) {
                xkeep[q] = x4[i];
                if constexpr (kAdd) dkeep[q] = d4[i];
            }
        }
        for (int i = threadIdx.x, q = 0; i < dim / 8; i += blockDim.x, q++) {
            uint4 word = q == 0 ? xkeep[0] : q == 1 ? xkeep[1] : x4[i];
            float v[8];
            unpack8(word, v);
            if constexpr (kAdd) {
                float a[8];
                unpack8(q == 0 ? dkeep[0] : q == 1 ? dkeep[1] : d4[i], a);
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] += a[j];
                word = pack8(v);
                x4[i] = word;
                unpack8(word, v);  // the rounded sum, as rms_norm would read it
            }
            if (q == 0) xkeep[0] = word;
            if (q == 1) xkeep[1] = word;
#pragma unroll
            for (int j = 0; j < 8; j++) ss = fmaf(v[j], v[j], ss);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = to_f32(xr[i]);
            if constexpr (kAdd) {
                v = round_bf16(v + to_f32(d[row * dim + i]));
                xr[i] = to_bf16(v);
            }
            ss = fmaf(v, v, ss);
        }
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / float(dim) + eps);
    const float one = zero_centred ? 1.0f : 0.0f;
    if constexpr (kVec) {
        const uint4* x4 = reinterpret_cast<const uint4*>(xr);
        uint4* y4 = reinterpret_cast<uint4*>(yr);  // may alias x4: each thread rewrites only what it read
        for (int i = threadIdx.x, q = 0; i < dim / 8; i += blockDim.x, q++) {
            float v[8];
            unpack8(q == 0 ? xkeep[0] : q == 1 ? xkeep[1] : x4[i], v);
            if (q < kPre) {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = v[j] * inv * (one + (q == 0 ? wpre[0][j] : wpre[1][j]));
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = v[j] * inv * (one + w[8 * i + j]);
            }
            y4[i] = pack8(v);
        }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = to_bf16(to_f32(xr[i]) * inv * (one + w[i]));
    }
}

bool vectorizable(const void* x, const void* y, int dim) {
    return dim % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(y) & 15u) == 0;
}

}  // namespace

void rms_norm(const bf16* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, bf16* y,
              const LaunchContext& ctx) {
    if (rows <= 0) return;
    bf16* xm = const_cast<bf16*>(x);  // not written without kAdd
    const bf16* none = nullptr;
    launch(vectorizable(x, y, dim) ? rms_norm_kernel<true, false> : rms_norm_kernel<false, false>, unsigned(rows),
           kNormThreads, 0, ctx, "rms_norm kernel", xm, none, w, dim, eps, zero_centred, y);
}

void add_rms_norm(bf16* x, const bf16* d, const float* w, int64_t rows, int dim, float eps, bool zero_centred, bf16* y,
                  const LaunchContext& ctx) {
    if (rows <= 0) return;
    const bool vec = vectorizable(x, y, dim) && (reinterpret_cast<uintptr_t>(d) & 15u) == 0;
    launch(vec ? rms_norm_kernel<true, true> : rms_norm_kernel<false, true>, unsigned(rows), kNormThreads, 0, ctx,
           "add + rms_norm kernel", x, d, w, dim, eps, zero_centred, y);
}

HY_CUDA_TRACE_BINDER(norm)

}  // namespace hy::cuda
