// Two passes: each of kChunks blocks of a row reduces a fixed slice of ids [0, n_valid) to (max, lowest id of the
// max, sum of exp(logit - max)); one warp per row then merges the slices in id order. The slices depend only on
// n_valid, so a row's result does not depend on the number of rows (batch invariant) and is deterministic.
#include <algorithm>

#include "kernels/cuda/argmax.cuh"

namespace hy::cuda {

namespace {

constexpr int kChunks = 32;          // slices per row
constexpr int kArgmaxThreads = 256;  // threads per slice
constexpr int kArgmaxBatch = 8;      // values a thread loads before using them

// A partial reduction: max m (-inf when empty), the lowest id holding it, and sum exp(x - m) over the finite x.
struct Partial {
    float m;
    int32_t id;
    float s;
};

__device__ __forceinline__ Partial merge(Partial a, Partial b) {
    Partial r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == -INFINITY) return Partial{-INFINITY, -1, 0.0f};
    r.s = (a.s > 0.0f ? a.s * expf(a.m - r.m) : 0.0f) + (b.s > 0.0f ? b.s * expf(b.m - r.m) : 0.0f);
    if (a.m == b.m)
        r.id = min(a.id, b.id);
    else
        r.id = a.m > b.m ? a.id : b.id;
    return r;
}

__device__ __forceinline__ Partial shfl_xor(Partial p, int o) {
    return Partial{__shfl_xor_sync(0xffffffffu, p.m, o), __shfl_xor_sync(0xffffffffu, p.id, o),
                   __shfl_xor_sync(0xffffffffu, p.s, o)};
}

__device__ __forceinline__ Partial warp_merge(Partial p) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) p = merge(p, shfl_xor(p, o));
    return p;
}

// grid (kChunks, n): block (c, r) reduces ids [c * len, min((c + 1) * len, n_valid)) of row r.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(const float* __restrict__ logits, int row_len, int n_valid, Partial* __restrict__ out) {
    __shared__ Partial warp_part[kArgmaxThreads / 32];
    pdl_trigger();
    pdl_wait();
    const int c = blockIdx.x, r = blockIdx.y;
    const int len = (n_valid + kChunks - 1) / kChunks;
    const int begin = c * len, end = min(n_valid, begin + len);
    const float* v = logits + int64_t(r) * row_len;
    Partial p{-INFINITY, -1, 0.0f};
    // The thread's ids begin + threadIdx.x, + kArgmaxThreads, ... in increasing order; kArgmaxBatch of them loaded
    // at once (a 248k-entry vocabulary gives a thread about 30: one memory wait per batch, not per value).
    for (int i0 = begin + int(threadIdx.x); i0 < end; i0 += kArgmaxThreads * kArgmaxBatch) {
        float xs[kArgmaxBatch];
#pragma unroll
        for (int u = 0; u < kArgmaxBatch; u++) {
            const int i = i0 + u * kArgmaxThreads;
            xs[u] = i < end ? v[i] : -INFINITY;
        }
#pragma unroll
        for (int u = 0; u < kArgmaxBatch; u++) {
            const float x = xs[u];
            if (!(x > -INFINITY)) continue;  // NaN and -inf are never picked and add nothing
            if (x > p.m) {
                p.s = p.s * expf(p.m - x) + 1.0f;  // p.s is 0 while p.m is -inf
                p.m = x;
                p.id = i0 + u * kArgmaxThreads;
            } else {
                p.s += expf(x - p.m);  // x == p.m keeps the lower id seen first
            }
        }
    }
    p = warp_merge(p);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) warp_part[warp] = p;
    __syncthreads();
    if (warp != 0) return;
    p = lane < kArgmaxThreads / 32 ? warp_part[lane] : Partial{-INFINITY, -1, 0.0f};
    p = warp_merge(p);
    if (lane == 0) out[int64_t(r) * kChunks + c] = p;
}

// One warp per row: lane l < kChunks holds slice l; the merge tree is fixed.
__global__ void argmax_merge_kernel(const Partial* __restrict__ part, int n, TokenPick* __restrict__ picks) {
    pdl_trigger();
    pdl_wait();
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n) return;
    static_assert(kChunks == 32, "one slice per lane");
    Partial p = warp_merge(part[int64_t(r) * kChunks + lane]);
    if (lane == 0) {
        TokenPick t;
        if (p.m > -INFINITY) {
            t.id = p.id;
            t.logprob = -logf(p.s);
        }
        picks[r] = t;
    }
}

}  // namespace

size_t argmax_scratch_floats(int max_rows) {
    static_assert(sizeof(Partial) == 12, "three 4-byte fields");
    return size_t(std::max(max_rows, 1)) * kChunks * 3;
}

void argmax_rows(const float* logits, int n, int row_len, int n_valid, TokenPick* picks, float* scratch,
                 const LaunchContext& ctx) {
    if (n <= 0) return;
    if (n_valid <= 0 || n_valid > row_len)
        throw Error(Status::internal, "argmax_rows: n_valid " + std::to_string(n_valid) + " outside [1, " +
                                          std::to_string(row_len) + "]");
    Partial* part = reinterpret_cast<Partial*>(scratch);
    launch(argmax_partial_kernel, dim3(kChunks, unsigned(n)), kArgmaxThreads, 0, ctx, "argmax partial kernel", logits,
           row_len, n_valid, part);
    launch(argmax_merge_kernel, ceil_div(n, 4), 128, 0, ctx, "argmax merge kernel", static_cast<const Partial*>(part),
           n, picks);
}

HY_CUDA_TRACE_BINDER(argmax)

}  // namespace hy::cuda
