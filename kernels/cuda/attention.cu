// The attention kernels. Rounding follows a bf16 PyTorch model (eager attention) where that is free: normed q/k
// are rounded to bf16, each RoPE product and sum is rounded, scores are rounded to bf16 before scaling, the
// sigmoid gate and its product are rounded. Softmax and the value sum run in fp32 (online softmax).
#include "kernels/cuda/attention.cuh"

#include <algorithm>

namespace hy::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

// One warp per head vector: blockIdx.x = row, warp w of the block handles head w (q heads first, then k heads).
// Lane l holds elements l, l + 32, ... (D / 32 of them).
template <int D>
__global__ void attn_prep_kernel(AttentionArgs p, RowMap rows, bf16* __restrict__ q_out) {
    constexpr int kPer = D / 32;
    __shared__ float buf[kAttnWarps][D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x;
    const int head = blockIdx.y * kAttnWarps + warp;
    const int Hq = p.n_heads, Hkv = p.n_kv_heads, R = p.rotary_dim, half = R / 2;
    if (head >= Hq + Hkv) return;
    const bool is_q = head < Hq;
    const int h = is_q ? head : head - Hq;
    const bf16* src = is_q ? static_cast<const bf16*>(p.qg) + (int64_t(t) * Hq + h) * 2 * D
                           : static_cast<const bf16*>(p.k) + (int64_t(t) * Hkv + h) * D;
    const float* nw = is_q ? p.q_norm : p.k_norm;
    float v[kPer];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        v[j] = to_f32(src[lane + 32 * j]);
        ss += v[j] * v[j];
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / float(D) + p.eps);
    float* b = buf[warp];
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = lane + 32 * j;
        v[j] = round_bf16(v[j] * inv * (1.0f + nw[i]));
        b[i] = v[j];
    }
    __syncwarp();
    const int pos = rows.pos[t];
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = lane + 32 * j;
        if (i < R) {
            const int f = i < half ? i : i - half;
            const float inv_freq = 1.0f / powf(p.rope_theta, float(2 * f) / float(R));
            const float angle = float(pos) * inv_freq;
            const float c = round_bf16(cosf(angle)), s = round_bf16(sinf(angle));
            const float rot = i < half ? -b[i + half] : b[i - half];
            v[j] = round_bf16(round_bf16(v[j] * c) + round_bf16(rot * s));
        }
    }
    bf16* dst;
    if (is_q) {
        dst = q_out + (int64_t(t) * Hq + h) * D;
    } else {
        const int64_t kv_row = int64_t(Hkv) * D;
        const int64_t off = int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(pos) * kv_row + int64_t(h) * D;
        dst = static_cast<bf16*>(p.k_cache) + off;
        const bf16* vs = static_cast<const bf16*>(p.v) + (int64_t(t) * Hkv + h) * D;
        bf16* vd = static_cast<bf16*>(p.v_cache) + off;
#pragma unroll
        for (int j = 0; j < kPer; j++) vd[lane + 32 * j] = vs[lane + 32 * j];
    }
#pragma unroll
    for (int j = 0; j < kPer; j++) dst[lane + 32 * j] = to_bf16(v[j]);
}

// Loads kPer consecutive bf16 values (kPer = 2, 4 or 8: 4, 8 or 16 bytes) as floats.
template <int kPer>
__device__ __forceinline__ void load_vec(const bf16* p, float* f) {
    if constexpr (kPer == 8) {
        unpack8(*reinterpret_cast<const uint4*>(p), f);
    } else if constexpr (kPer == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
    } else {
        static_assert(kPer == 2, "2, 4 or 8 values per lane");
        float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
        f[0] = a.x; f[1] = a.y;
    }
}

__device__ __forceinline__ void write_gated(const AttentionArgs& p, int t, int h, int D, int i, float o) {
    const bf16* gate = static_cast<const bf16*>(p.qg) + (int64_t(t) * p.n_heads + h) * 2 * D + D;
    bf16* out = static_cast<bf16*>(p.out) + (int64_t(t) * p.n_heads + h) * D;
    out[i] = to_bf16(round_bf16(o) * round_bf16(sigmoidf_(to_f32(gate[i]))));
}

// One block of kAttnWarps warps per (row t, q head h, position split z); warp w visits keys w, w + kAttnWarps, ...
// of the split's positions (all of [0, pos] without a split) with its own online softmax; lane l owns the kPer
// consecutive dims [l * kPer, (l + 1) * kPer). The warps' results are merged in shared memory; then either the
// gate is applied (no split) or the block's (o unnormalized, max, sum) go to `part` for attn_merge_kernel.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kAttnWarps * 32)
    attn_core_kernel(AttentionArgs p, RowMap rows, const bf16* __restrict__ q_in, float* __restrict__ part,
                     int split_len) {
    constexpr int kPer = D / 32;
    __shared__ float part_o[kAttnWarps][D];
    __shared__ float part_m[kAttnWarps], part_l[kAttnWarps];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.x, t = blockIdx.y;
    const int Hq = p.n_heads, Hkv = p.n_kv_heads;
    const int kvh = h / (Hq / Hkv);
    const int pos = rows.pos[t];
    const int64_t kv_row = int64_t(Hkv) * D;
    const bf16* kc = static_cast<const bf16*>(p.k_cache) + int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(kvh) * D;
    const bf16* vc = static_cast<const bf16*>(p.v_cache) + int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(kvh) * D;
    const float scale = rsqrtf(float(D));

    float q[kPer], o[kPer];
    load_vec<kPer>(q_in + (int64_t(t) * Hq + h) * D + lane * kPer, q);
#pragma unroll
    for (int j = 0; j < kPer; j++) o[j] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int key_begin = kSplit ? int(blockIdx.z) * split_len : 0;
    const int key_end = kSplit ? min(pos + 1, key_begin + split_len) : pos + 1;
    for (int key = key_begin + warp; key < key_end; key += kAttnWarps) {
        float kf[kPer], vf[kPer];
        load_vec<kPer>(kc + int64_t(key) * kv_row + lane * kPer, kf);
        load_vec<kPer>(vc + int64_t(key) * kv_row + lane * kPer, vf);
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; j++) dot = fmaf(q[j], kf[j], dot);
        dot = warp_sum(dot);
        const float s = round_bf16(round_bf16(dot) * scale);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
        const float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < kPer; j++) o[j] = fmaf(e, vf[j], o[j] * corr);
        m = m_new;
    }
#pragma unroll
    for (int j = 0; j < kPer; j++) part_o[warp][lane * kPer + j] = o[j];
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; w++) M = fmaxf(M, part_m[w]);
    float L = 0.0f, f[kAttnWarps];
#pragma unroll
    for (int w = 0; w < kAttnWarps; w++) {
        f[w] = part_l[w] > 0.0f ? expf(part_m[w] - M) : 0.0f;  // a warp that saw no key contributes nothing
        L += part_l[w] * f[w];
    }
    if constexpr (kSplit) {
        float* dst = part + ((int64_t(t) * Hq + h) * gridDim.z + blockIdx.z) * (D + 2);
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < kAttnWarps; w++) acc += part_o[w][i] * f[w];
            dst[i] = acc;
        }
        if (threadIdx.x == 0) {
            dst[D] = M;
            dst[D + 1] = L;  // 0 when the split holds no position <= pos
        }
        return;
    }
    const float inv_l = 1.0f / L;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < kAttnWarps; w++) acc += part_o[w][i] * f[w];
        write_gated(p, t, h, D, i, acc * inv_l);
    }
}

// Merges the position splits of (row t = blockIdx.y, head h = blockIdx.x) and applies the gate.
template <int D>
__global__ void attn_merge_kernel(AttentionArgs p, const float* __restrict__ part, int n_splits) {
    const int h = blockIdx.x, t = blockIdx.y;
    const float* src = part + (int64_t(t) * p.n_heads + h) * n_splits * (D + 2);
    float M = -INFINITY;
    for (int z = 0; z < n_splits; z++)
        if (src[z * (D + 2) + D + 1] > 0.0f) M = fmaxf(M, src[z * (D + 2) + D]);
    float L = 0.0f;
    for (int z = 0; z < n_splits; z++) {
        const float lz = src[z * (D + 2) + D + 1];
        if (lz > 0.0f) L += lz * expf(src[z * (D + 2) + D] - M);
    }
    const float inv_l = 1.0f / L;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < n_splits; z++) {
            const float lz = src[z * (D + 2) + D + 1];
            if (lz > 0.0f) acc += src[z * (D + 2) + i] * expf(src[z * (D + 2) + D] - M);
        }
        write_gated(p, t, h, D, i, acc * inv_l);
    }
}

int n_splits(int n_ctx) { return std::min(kAttnMaxSplits, std::max(1, (n_ctx + kAttnSplitKeys - 1) / kAttnSplitKeys)); }

template <int D>
void launch(const AttentionArgs& a, const RowMap& rows, bf16* q_scratch, float* split_scratch, cudaStream_t stream) {
    const int T = rows.n_rows;
    dim3 prep_grid(unsigned(T), ceil_div(a.n_heads + a.n_kv_heads, kAttnWarps));
    attn_prep_kernel<D><<<prep_grid, kAttnWarps * 32, 0, stream>>>(a, rows, q_scratch);
    check_launch("attention prep kernel (q/k norm, RoPE, KV cache write)");
    const int S = T <= kAttnSplitMaxRows ? n_splits(a.n_ctx) : 1;
    if (S > 1) {
        const int split_len = (a.n_ctx + S - 1) / S;
        dim3 core_grid(unsigned(a.n_heads), unsigned(T), unsigned(S));
        attn_core_kernel<D, true><<<core_grid, kAttnWarps * 32, 0, stream>>>(a, rows, q_scratch, split_scratch, split_len);
        check_launch("attention core kernel (split over positions)");
        attn_merge_kernel<D><<<dim3(unsigned(a.n_heads), unsigned(T)), 128, 0, stream>>>(a, split_scratch, S);
        check_launch("attention split merge kernel");
    } else {
        dim3 core_grid(unsigned(a.n_heads), unsigned(T));
        attn_core_kernel<D, false><<<core_grid, kAttnWarps * 32, 0, stream>>>(a, rows, q_scratch, nullptr, 0);
        check_launch("attention core kernel");
    }
}

}  // namespace

size_t attention_split_floats(int max_heads, int max_head_dim) {
    return size_t(kAttnSplitMaxRows) * size_t(max_heads) * size_t(kAttnMaxSplits) * size_t(max_head_dim + 2);
}

void attention(const AttentionArgs& a, const RowMap& rows, bf16* q_scratch, float* split_scratch, cudaStream_t stream) {
    if (rows.n_rows <= 0) return;
    if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
        throw Error(Status::unsupported, "CUDA attention: " + std::to_string(a.n_heads) + " q heads are not a multiple of " +
                                             std::to_string(a.n_kv_heads) + " kv heads");
    if (a.rotary_dim < 0 || a.rotary_dim > a.head_dim || a.rotary_dim % 2 != 0)
        throw Error(Status::unsupported, "CUDA attention: rotary dims " + std::to_string(a.rotary_dim) +
                                             " must be even and at most the head dim");
    switch (a.head_dim) {
        case 64: return launch<64>(a, rows, q_scratch, split_scratch, stream);
        case 128: return launch<128>(a, rows, q_scratch, split_scratch, stream);
        case 256: return launch<256>(a, rows, q_scratch, split_scratch, stream);
        default: break;
    }
    static_assert(kMaxHeadDim == 256, "largest instantiated head dim");
    throw Error(Status::unsupported, "CUDA attention: head dim " + std::to_string(a.head_dim) +
                                         " is not built (64, 128 and 256 are)");
}

}  // namespace hy::cuda
