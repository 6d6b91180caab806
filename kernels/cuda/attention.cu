// The attention kernels. Rounding follows a bf16 PyTorch model (eager attention) where that is free: normed q/k
// are rounded to bf16, each RoPE product and sum is rounded, scores are rounded to bf16 before scaling, the
// sigmoid gate and its product are rounded. Softmax and the value sum run in fp32 (online softmax); the prefill
// kernel rounds the softmax weights to bf16 for its tensor-core P V product.
#include "kernels/cuda/attention.cuh"
#include "kernels/rope.h"

#include <algorithm>
#include <atomic>

namespace hy::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

// The RoPE factors of lane l's elements i = l + 32 j (j < D/32) at position pos: c[j] = bf16(cos(pos f_i) a),
// s[j] = bf16(sin(pos f_i) a), f_i = rope_inv_freq(i mod R/2) (kernels/rope.h: theta^(-2 (i mod R/2) / R), or
// YaRN's), a the YaRN attention factor (1 without YaRN) (rotate_half pairing; dims i >= R are not rotated and get c
// 1, s 0, unused). They depend only on the position, so kernels compute them before their PDL wait.
template <int D>
__device__ __forceinline__ void rope_factors(const AttentionArgs& p, int pos, float (&c)[D / 32], float (&s)[D / 32]) {
    const int lane = threadIdx.x & 31, R = p.rotary_dim, half = R / 2;
#pragma unroll
    for (int j = 0; j < D / 32; j++) {
        const int i = lane + 32 * j;
        c[j] = 1.0f;
        s[j] = 0.0f;
        if (i < R) {
            const int f = i < half ? i : i - half;
            const float inv_freq =
                rope_inv_freq(f, R, p.rope_theta, p.rope_yarn_factor, p.rope_yarn_low, p.rope_yarn_range);
            const float angle = float(pos) * inv_freq;
            c[j] = round_bf16(cosf(angle) * p.rope_attention_factor);
            s[j] = round_bf16(sinf(angle) * p.rope_attention_factor);
        }
    }
}

// One warp turns a q or k head vector src [D] into what attention uses: RMSNorm over D with weight 1 + nw, then
// RoPE on the first R dims with the factors rc, rs of rope_factors; lane l returns elements l + 32 j in v[j]
// (bf16-rounded values). buf: D floats of shared memory for the warp (the rotate_half partner). The single
// definition of this rounding, for the prep kernel and the decode core kernel that does it itself.
template <int D>
__device__ __forceinline__ void norm_rope(const AttentionArgs& p, const bf16* src, const float* nw,
                                          const float (&rc)[D / 32], const float (&rs)[D / 32], float* buf,
                                          float (&v)[D / 32]) {
    constexpr int kPer = D / 32;
    const int lane = threadIdx.x & 31, R = p.rotary_dim, half = R / 2;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        v[j] = to_f32(src[lane + 32 * j]);
        ss = __fmaf_rn(v[j], v[j], ss);
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / float(D) + p.eps);
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = lane + 32 * j;
        v[j] = round_bf16(v[j] * inv * (1.0f + nw[i]));
        buf[i] = v[j];
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = lane + 32 * j;
        if (i < R) {
            const float rot = i < half ? -buf[i + half] : buf[i - half];
            v[j] = round_bf16(round_bf16(v[j] * rc[j]) + round_bf16(rot * rs[j]));
        }
    }
}

// Row t's k head h (normed, RoPE'd) and v head h into the KV cache at the row's position; lane l writes elements
// l + 32 j of k (kv[j]).
template <int D>
__device__ __forceinline__ void write_kv(const AttentionArgs& p, const RowMap& rows, int t, int h, const float* kv) {
    const int lane = threadIdx.x & 31, Hkv = p.n_kv_heads;
    const int64_t kv_row = int64_t(Hkv) * D;
    const int64_t off = int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(rows.pos[t]) * kv_row + int64_t(h) * D;
    bf16* kd = static_cast<bf16*>(p.k_cache) + off;
    bf16* vd = static_cast<bf16*>(p.v_cache) + off;
    const bf16* vs = static_cast<const bf16*>(p.v) + (int64_t(t) * Hkv + h) * D;
#pragma unroll
    for (int j = 0; j < D / 32; j++) {
        kd[lane + 32 * j] = to_bf16(kv[j]);
        vd[lane + 32 * j] = vs[lane + 32 * j];
    }
}

// One warp per head vector: blockIdx.x = row, warp w of the block handles head w (q heads first, then k heads).
template <int D>
__global__ void attn_prep_kernel(AttentionArgs p, RowMap rows, bf16* __restrict__ q_out) {
    constexpr int kPer = D / 32;
    __shared__ float buf[kAttnWarps][D];
    pdl_trigger();
    const int t = blockIdx.x;
    float rc[kPer], rs[kPer];
    rope_factors<D>(p, rows.pos[t], rc, rs);  // (the row map is copied in before the step's first kernel)
    pdl_wait();  // activations come from the projections; the cache may still be read by earlier kernels
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y * kAttnWarps + warp;
    const int Hq = p.n_heads, Hkv = p.n_kv_heads;
    if (head >= Hq + Hkv) return;
    const bool is_q = head < Hq;
    const int h = is_q ? head : head - Hq;
    const bf16* src = is_q ? static_cast<const bf16*>(p.qg) + (int64_t(t) * Hq + h) * 2 * D
                           : static_cast<const bf16*>(p.k) + (int64_t(t) * Hkv + h) * D;
    float v[kPer];
    norm_rope<D>(p, src, is_q ? p.q_norm : p.k_norm, rc, rs, buf[warp], v);
    if (is_q) {
        bf16* dst = q_out + (int64_t(t) * Hq + h) * D;
#pragma unroll
        for (int j = 0; j < kPer; j++) dst[lane + 32 * j] = to_bf16(v[j]);
    } else {
        write_kv<D>(p, rows, t, h, v);
    }
}

// kPer consecutive bf16 values (kPer = 2, 4 or 8) as one 4-, 8- or 16-byte word: loaded raw (a load whose value
// is not used yet does not hold the warp), converted to floats where they are used.
template <int kPer>
struct RawVec;
template <>
struct RawVec<8> {
    using T = uint4;
};
template <>
struct RawVec<4> {
    using T = uint2;
};
template <>
struct RawVec<2> {
    using T = uint32_t;
};
template <int kPer>
__device__ __forceinline__ typename RawVec<kPer>::T load_raw(const bf16* p) {
    return *reinterpret_cast<const typename RawVec<kPer>::T*>(p);
}
template <int kPer>
__device__ __forceinline__ void unpack_vec(const typename RawVec<kPer>::T& r, float* f) {
    if constexpr (kPer == 8) {
        unpack8(r, f);
    } else if constexpr (kPer == 4) {
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        f[0] = a.x;
        f[1] = a.y;
        f[2] = b.x;
        f[3] = b.y;
    } else {
        static_assert(kPer == 2, "2, 4 or 8 values per lane");
        float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
        f[0] = a.x;
        f[1] = a.y;
    }
}
// Loads kPer consecutive bf16 values as floats.
template <int kPer>
__device__ __forceinline__ void load_vec(const bf16* p, float* f) {
    unpack_vec<kPer>(load_raw<kPer>(p), f);
}

__device__ __forceinline__ void write_gated(const AttentionArgs& p, int t, int h, int D, int i, float o) {
    const bf16* gate = static_cast<const bf16*>(p.qg) + (int64_t(t) * p.n_heads + h) * 2 * D + D;
    bf16* out = static_cast<bf16*>(p.out) + (int64_t(t) * p.n_heads + h) * D;
    out[i] = to_bf16(round_bf16(o) * round_bf16(sigmoidf_(to_f32(gate[i]))));
}

// One block of kAttnWarps warps per (row t, q head h, position split z). The row's keys [0, pos] are cut into
// gridDim.z equal ranges (ceil((pos + 1) / gridDim.z) keys each, from the row's position, read on the device, so a
// graph captured once serves every depth); without a split the block takes all of them. Warp w takes rounds of
// kAttnKeysInFlight consecutive keys (keys k0 + kAttnKeysInFlight w .. of each round of kAttnWarps
// kAttnKeysInFlight): the K and V loads of a round are all issued before any is used, so a warp waits for memory
// once per round, not once per key (decode is latency-bound: a few dozen keys per warp). Lane l owns the kPer
// consecutive dims [l * kPer, (l + 1) * kPer). Each warp keeps an fp32 online softmax, updated once per round
// (one max and one rescale for the round's keys, summed in key order); the warps' results are merged in shared
// memory; then either the gate is applied (no split) or the block's (o unnormalized, max, sum) go to `part` for
// attn_merge_kernel.
//
// kPrep (decode steps, every run one token): no prep kernel before; warp 0 of the block normalizes and rotates its
// q head itself (norm_rope), and a block whose keys include the row's own position has warp 1 do the same for the
// new key and take it and the new value from shared memory instead of the cache; of those blocks, the one of the
// kv head's first q head also writes them to the cache (no other block of the kernel reads that position). The
// keys before the row's position were written by earlier steps and the row map by the step's first copy, all
// complete before any kernel of the step starts: so each warp issues the loads of its first round of keys, and
// warps 0 and 1 compute their RoPE factors, before the PDL wait, overlapping the q/k/v projection's tail.
constexpr int kAttnKeysInFlight = 4;

// kHeads (1, 2 or 4, dividing the group size Hq / Hkv): the block takes q heads h0 = blockIdx.x * kHeads .. h0 +
// kHeads - 1, all of one kv head, and every key and value it loads serves all of them (GQA: a kv head's keys are
// read once per kHeads q heads, not once per q head; at 16k positions the reads of the one-head blocks were a
// third L2 hits). Each q head's arithmetic (scores, online softmax, the warps' merge) is that of the one-head
// kernel in the same order, so the results are bitwise the same for any kHeads.
template <int D, bool kSplit, bool kPrep = false, int kHeads = 1>
__global__ void __launch_bounds__(kAttnWarps * 32)
    attn_core_kernel(AttentionArgs p, RowMap rows, const bf16* __restrict__ q_in, float* __restrict__ part) {
    constexpr int kPer = D / 32, U = kAttnKeysInFlight;
    static_assert(kHeads == 1 || kHeads == 2 || kHeads == 4, "1, 2 or 4 q heads per block");
    __shared__ float part_o[kAttnWarps][kHeads][D];
    __shared__ float part_m[kAttnWarps][kHeads], part_l[kAttnWarps][kHeads];
    __shared__ float s_new[kPrep ? kHeads + 2 : 1][kPrep ? D : 1];  // kPrep: the q heads, the new k and v
    __shared__ float s_buf[kPrep ? kAttnWarps : 1][kPrep ? D : 1];  // kPrep: each warp's norm_rope scratch
    pdl_trigger();
    if constexpr (!kPrep) pdl_wait();  // row map, q_scratch and the cache come from earlier kernels
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h0 = blockIdx.x * kHeads, t = blockIdx.y;
    const int Hq = p.n_heads, Hkv = p.n_kv_heads, G = Hq / Hkv;
    const int kvh = h0 / G;
    const int pos = rows.pos[t];
    const int64_t kv_row = int64_t(Hkv) * D;
    const bf16* kc = static_cast<const bf16*>(p.k_cache) + int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(kvh) * D;
    const bf16* vc = static_cast<const bf16*>(p.v_cache) + int64_t(rows.slot[t]) * p.n_ctx * kv_row + int64_t(kvh) * D;
    const float scale = rsqrtf(float(D));

    int key_begin = 0, key_end = pos + 1;
    if constexpr (kSplit) {
        const int len = (pos + int(gridDim.z)) / int(gridDim.z);  // ceil((pos + 1) / splits)
        key_begin = min(pos + 1, int(blockIdx.z) * len);
        key_end = min(pos + 1, key_begin + len);
    }
    // The raw K and V of a round of keys k0 .. k0 + U - 1 (kPrep: not the row's own key, which is in s_new) into
    // kd, vd: the round being computed (kr, vr) and the next one, whose loads are issued before it (kn, vn).
    using Raw = typename RawVec<kPer>::T;
    Raw kr[U] = {}, vr[U] = {}, kn[U] = {}, vn[U] = {};
    auto issue = [&](int k0, Raw* kd, Raw* vd) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + u < key_end && !(kPrep && k0 + u == pos)) {
                kd[u] = load_raw<kPer>(kc + int64_t(k0 + u) * kv_row + lane * kPer);
                vd[u] = load_raw<kPer>(vc + int64_t(k0 + u) * kv_row + lane * kPer);
            }
    };
    const int k_first = key_begin + U * warp;
    float q[kHeads][kPer], o[kHeads][kPer];
    if constexpr (kPrep) {
        const bool has_new = key_begin <= pos && pos < key_end;
        issue(k_first, kr, vr);  // keys before pos only: written by earlier steps
        float rc[kPer], rs[kPer];
        if (warp <= kHeads) rope_factors<D>(p, pos, rc, rs);
        pdl_wait();  // q, k and v come from the projection just before
        // items 0 .. kHeads - 1: the block's q heads; item kHeads: the new key (and value) when in range
        for (int it = warp; it <= kHeads; it += kAttnWarps) {
            float v[kPer];
            if (it < kHeads) {
                norm_rope<D>(p, static_cast<const bf16*>(p.qg) + (int64_t(t) * Hq + h0 + it) * 2 * D, p.q_norm, rc, rs,
                             s_buf[warp], v);
#pragma unroll
                for (int j = 0; j < kPer; j++) s_new[it][lane + 32 * j] = v[j];
            } else if (has_new) {
                norm_rope<D>(p, static_cast<const bf16*>(p.k) + (int64_t(t) * Hkv + kvh) * D, p.k_norm, rc, rs,
                             s_buf[warp], v);
                const bf16* vs = static_cast<const bf16*>(p.v) + (int64_t(t) * Hkv + kvh) * D;
#pragma unroll
                for (int j = 0; j < kPer; j++) {
                    s_new[kHeads][lane + 32 * j] = v[j];
                    s_new[kHeads + 1][lane + 32 * j] = to_f32(vs[lane + 32 * j]);
                }
                if (h0 % G == 0) write_kv<D>(p, rows, t, kvh, v);
            }
            __syncwarp();  // (s_buf is reused by the warp's next item)
        }
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < kHeads; hh++)
#pragma unroll
            for (int j = 0; j < kPer; j++) q[hh][j] = s_new[hh][lane * kPer + j];
    } else {
        issue(k_first, kr, vr);
#pragma unroll
        for (int hh = 0; hh < kHeads; hh++) load_vec<kPer>(q_in + (int64_t(t) * Hq + h0 + hh) * D + lane * kPer, q[hh]);
    }
    float m[kHeads], l[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; hh++) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; j++) o[hh][j] = 0.0f;
    }
    // Key (or value) u of the round as floats: the row's own from shared memory (kPrep), zeros past the range.
    auto key_vec = [&](int k0, int u, const Raw* raw, int which, float(&f)[kPer]) {
        if (kPrep && k0 + u == pos && pos < key_end) {  // the row's own key, in this range: not in the cache yet
#pragma unroll
            for (int j = 0; j < kPer; j++) f[j] = s_new[kHeads + which][lane * kPer + j];
        } else if (k0 + u < key_end) {
            unpack_vec<kPer>(raw[u], f);
        } else {
#pragma unroll
            for (int j = 0; j < kPer; j++) f[j] = 0.0f;
        }
    };
    constexpr int kRound = U * kAttnWarps;  // keys of a round of the block
    for (int k0 = k_first; k0 < key_end; k0 += kRound) {
        if (k0 + kRound < key_end) issue(k0 + kRound, kn, vn);  // the warp's next round, in flight meanwhile
        // scores of the round's keys for each head, then per head one max and one rescale for the round (summed in
        // key order), then the values
        float s[kHeads][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[kPer];
            key_vec(k0, u, kr, 0, kf);
#pragma unroll
            for (int hh = 0; hh < kHeads; hh++) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < kPer; j++) dot = fmaf(q[hh][j], kf[j], dot);
                dot = warp_sum(dot);
                s[hh][u] = k0 + u < key_end ? round_bf16(round_bf16(dot) * scale) : -INFINITY;
            }
        }
        float e[kHeads][U];
#pragma unroll
        for (int hh = 0; hh < kHeads; hh++) {
            float m_new = m[hh];
#pragma unroll
            for (int u = 0; u < U; u++) m_new = fmaxf(m_new, s[hh][u]);
            const float corr = expf(m[hh] - m_new);  // 0 on the first round (m = -inf; key k0 is valid)
            float e_sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                e[hh][u] = expf(s[hh][u] - m_new);  // 0 for keys past the range
                e_sum += e[hh][u];
            }
            l[hh] = l[hh] * corr + e_sum;
#pragma unroll
            for (int j = 0; j < kPer; j++) o[hh][j] *= corr;
            m[hh] = m_new;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float vf[kPer];
            key_vec(k0, u, vr, 1, vf);
#pragma unroll
            for (int hh = 0; hh < kHeads; hh++)
#pragma unroll
                for (int j = 0; j < kPer; j++) o[hh][j] = fmaf(e[hh][u], vf[j], o[hh][j]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            kr[u] = kn[u];
            vr[u] = vn[u];
        }
    }
#pragma unroll
    for (int hh = 0; hh < kHeads; hh++) {
#pragma unroll
        for (int j = 0; j < kPer; j++) part_o[warp][hh][lane * kPer + j] = o[hh][j];
        if (lane == 0) {
            part_m[warp][hh] = m[hh];
            part_l[warp][hh] = l[hh];
        }
    }
    __syncthreads();
    for (int hh = 0; hh < kHeads; hh++) {
        const int h = h0 + hh;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kAttnWarps; w++) M = fmaxf(M, part_m[w][hh]);
        float L = 0.0f, f[kAttnWarps];
#pragma unroll
        for (int w = 0; w < kAttnWarps; w++) {
            f[w] = part_l[w][hh] > 0.0f ? expf(part_m[w][hh] - M) : 0.0f;  // a warp that saw no key: nothing
            L += part_l[w][hh] * f[w];
        }
        if constexpr (kSplit) {
            float* dst = part + ((int64_t(t) * Hq + h) * gridDim.z + blockIdx.z) * (D + 2);
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                float acc = 0.0f;
#pragma unroll
                for (int w = 0; w < kAttnWarps; w++) acc += part_o[w][hh][i] * f[w];
                dst[i] = acc;
            }
            if (threadIdx.x == 0) {
                dst[D] = M;
                dst[D + 1] = L;  // 0 when the split holds no position <= pos
            }
        } else {
            const float inv_l = 1.0f / L;
            for (int i = threadIdx.x; i < D; i += blockDim.x) {
                float acc = 0.0f;
#pragma unroll
                for (int w = 0; w < kAttnWarps; w++) acc += part_o[w][hh][i] * f[w];
                write_gated(p, t, h, D, i, acc * inv_l);
            }
        }
    }
}

// Merges the n_splits <= kAttnMaxSplits position splits of (row t = blockIdx.y, head h = blockIdx.x) and applies
// the gate. Warp 0 turns the splits' (max, sum) into weights exp(max_z - max) in shared memory (lane l: splits l,
// l + 32, ...); then thread i sums dim i over the splits, their loads 16 at a time. A split that saw no key has sum 0
// and weight 0 (its partial o is 0).
template <int D>
__global__ void __launch_bounds__(D) attn_merge_kernel(AttentionArgs p, const float* __restrict__ part, int n_splits) {
    constexpr int kPerLane = (kAttnMaxSplits + 31) / 32;
    __shared__ float weight[kAttnMaxSplits];
    __shared__ float inv_sum;
    pdl_trigger();
    pdl_wait();  // the partials come from attn_core_kernel
    const int h = blockIdx.x, t = blockIdx.y;
    const float* src = part + (int64_t(t) * p.n_heads + h) * n_splits * (D + 2);
    if (threadIdx.x < 32) {
        float ls[kPerLane], ms[kPerLane];
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < kPerLane; i++) {
            const int z = int(threadIdx.x) + 32 * i;
            ls[i] = z < n_splits ? src[z * (D + 2) + D + 1] : 0.0f;
            ms[i] = ls[i] > 0.0f ? src[z * (D + 2) + D] : -INFINITY;
            M = fmaxf(M, ms[i]);
        }
        M = warp_max(M);  // finite: split 0 holds key 0
        float L = 0.0f;
#pragma unroll
        for (int i = 0; i < kPerLane; i++) {
            const float w = ls[i] > 0.0f ? expf(ms[i] - M) : 0.0f;
            L += ls[i] * w;
            weight[int(threadIdx.x) + 32 * i] = w;
        }
        L = warp_sum(L);
        if (threadIdx.x == 0) inv_sum = 1.0f / L;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 16
        for (int z = 0; z < n_splits; z++) acc = fmaf(src[z * (D + 2) + i], weight[z], acc);
        write_gated(p, t, h, D, i, acc * inv_sum);
    }
}

// ---- Prefill: tensor-core flash attention ---------------------------------------------------------------------
//
// Used for steps of more than kAttnSplitMaxRows rows. One block of kFlashWarps warps per (query tile, group of HB
// q heads of one kv head), HB = 1, 2 or 4: a query tile is up to P = kFlashRows / HB consecutive positions of ONE
// run (tile i of a run holds its rows [P i, P i + P)), pos0 .. pos0 + n_pos - 1 of one slot, and every row of the
// tile attends to a prefix of the keys [0, kv_end), kv_end = pos0 + n_pos. The block walks the key tiles
// [64 kt, 64 kt + 64) for kt = ceil(kv_end / 64) - 1 down to 0 (the diagonal, partly masked tiles first),
// staging K and V in shared memory, and keeps an online softmax per row. Warp w owns 16 query rows: positions
// [16 (w / HB), + 16) of the tile for q head h0 + w % HB (rows [16 w, 16 w + 16) of the Q tile in shared memory);
// S = Q K^T (16 x 64 per warp) and O += P V (16 x D per warp) run on mma.sync.m16n8k16 bf16 with fp32
// accumulation. HB > 1: the HB heads share each K and V tile a block loads, so a prefill reads K and V from L2 HB
// times less often (at 16k positions and D = 256 one head a block moves about 34 GB a layer from L2 to the SMs).
// Measured (H100, the last 4096-row chunk of a 16384-token prompt): 5.50 ms a layer at HB = 4 against 5.72 at 1;
// L2 was not what bound it (45% busy either way; the stalls are ldmatrix results awaited by the mma, two warps a
// scheduler). A warp's work does not depend on HB (the same rows, key tiles in the same order, the same
// operations), so neither do its bits.
//
// Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 that this code relies on
// (lane = 4 g + t, g = lane >> 2 in [0, 8), t = lane & 3; a register holds 2 bf16, the lower column/k index in
// the low half):
//   A (16 x 16, rows m, cols k):  a[0] = (m g,     k 2t..2t+1)   a[1] = (m g + 8, k 2t..2t+1)
//                                 a[2] = (m g,     k 2t+8..2t+9) a[3] = (m g + 8, k 2t+8..2t+9)
//   B (16 x 8,  rows k, cols n):  b[0] = (k 2t..2t+1, n g)       b[1] = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32):             c[0], c[1] = (m g, n 2t, 2t+1) c[2], c[3] = (m g + 8, n 2t, 2t+1)
// ldmatrix.x4 loads four 8 x 8 b16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i, and
// register i of lane (g, t) receives matrix i's (row g, cols 2t, 2t+1) (.trans: (rows 2t, 2t+1, col g)).
//   Q (smem [64][D], row-major) as A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
//     (rows 8-15, k 8-15) -> a[0..3]; lane l addresses row (l & 7) + 8 ((l >> 3) & 1), col 8 (l >> 4).
//   K (smem [64 keys][D]) as B of S = Q K^T (B[k = d][n = key] = K[key][d]: each key row is a column of B, so
//     plain ldmatrix gives b[0] = (d 2t..2t+1, key g)): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15),
//     (keys 8-15, d 0-7), (keys 8-15, d 8-15) -> b[0], b[1] of key block n0, b[0], b[1] of key block n0 + 8;
//     lane l addresses key (l & 7) + 8 (l >> 4), d 8 ((l >> 3) & 1).
//   V (smem [64 keys][D]) as B of O = P V (B[k = key][n = d] = V[key][d], so .trans): matrices
//     (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15) -> b[0], b[1] of d block
//     n0, b[0], b[1] of d block n0 + 8; lane l addresses key (l & 7) + 8 ((l >> 3) & 1), d 8 (l >> 4).
//   P as A of O = P V comes straight from the S accumulators: for keys [16 j, 16 j + 16), a[0] = S block 2j
//     c[0..1], a[1] = S block 2j c[2..3], a[2] = S block 2j+1 c[0..1], a[3] = S block 2j+1 c[2..3].
//
// Shared memory: Q, K, V tiles of [64][D + 8] bf16. The 8-element pad makes the row stride 2D + 16 bytes, so
// the 8 row addresses of an ldmatrix phase start 16 bytes (4 banks) apart: conflict-free for every D that is a
// multiple of 64. Sizes: D = 64: 27 KB, 128: 51 KB, 256: 99 KB (2 blocks per SM on sm_90, 1 on sm_80).
// Pipeline (cp.async, one buffer each): V of tile kt loads while S of tile kt is computed, K of tile kt - 1
// while P V of tile kt is computed.
//
// Numerics as in attn_core_kernel: s = bf16(bf16(q.k) * 1/sqrt(D)); fp32 online softmax (in base 2); P is
// rounded to bf16 for the tensor-core product and the row sum adds the same rounded values; o = bf16(O / l);
// out = bf16(o * bf16(sigmoid(gate))).
//
// Keys at or past kv_end and query rows past the run's end are zero-filled (never read from memory: the cache
// there may hold anything, NaN included, and 0 * NaN would poison the P V product). Keys past a row's position
// get s = -inf, so they contribute exactly 0; a warp skips key tiles that lie wholly past its last row.

constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kFlashRows = 16 * kFlashWarps;  // query rows per block (16 per warp: the mma's m)
constexpr int kFlashKeys = 64;                // keys per K/V tile
constexpr int kFlashPad = 8;                  // bf16 elements of padding per shared-memory row

template <int D>
__host__ __device__ constexpr int flash_stride() {
    return D + kFlashPad;
}
template <int D>
__host__ __device__ constexpr size_t flash_smem_bytes() {
    return size_t(kFlashRows + 2 * kFlashKeys) * size_t(flash_stride<D>()) * sizeof(bf16);
}
// Blocks per SM the register budget is sized for (ptxas caps registers at 64K / (128 * n)).
template <int D>
__host__ __device__ constexpr int flash_min_blocks() {
    return D >= 256 ? 2 : (D >= 128 ? 3 : 4);
}

// c (16 x 8 fp32) += a (16 x 16 bf16, fragment a[0..3]) * b (16 x 8 bf16).
__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    hy::cuda::mma_bf16_16816(c, a[0], a[1], a[2], a[3], b0, b1);
}

// Two floats as a bf16 pair (lo in the low half: the lower column index).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Copies `n_rows` rows of D bf16 into a [64][D + pad] shared tile; row r comes from src + r * row_elems (rows
// >= n_valid are zero-filled instead).
template <int D>
__device__ __forceinline__ void flash_load_tile(uint32_t dst, const bf16* src, int64_t row_elems, int n_valid) {
    constexpr int kChunks = D / 8;  // 16-byte chunks per row
    constexpr int kPerThread = kFlashKeys * kChunks / kFlashThreads;
    static_assert(kFlashKeys == kFlashRows, "Q, K and V tiles share the loader");
    static_assert(kFlashKeys * kChunks % kFlashThreads == 0, "whole chunks per thread");
#pragma unroll
    for (int j = 0; j < kPerThread; j++) {
        const int c = int(threadIdx.x) + j * kFlashThreads;
        const int r = c / kChunks, col = (c % kChunks) * 8;
        const bool valid = r < n_valid;
        const bf16* g = src + (valid ? int64_t(r) * row_elems : 0) + col;
        cp_async16(dst + uint32_t((r * flash_stride<D>() + col) * sizeof(bf16)), g, valid);
    }
}

// Copies the Q tile of a block with HB heads: shared row r (warp w = r / 16) holds position 16 (w / HB) + r % 16
// of the tile for head h0 + w % HB, from q_in [rows, Hq, D] at batch row row0 + that position; positions >= n_pos
// are zero-filled.
template <int D, int HB>
__device__ __forceinline__ void flash_load_q(uint32_t dst, const bf16* q_in, int row0, int h0, int Hq, int n_pos) {
    constexpr int kChunks = D / 8;  // 16-byte chunks per row
    constexpr int kPerThread = kFlashRows * kChunks / kFlashThreads;
#pragma unroll
    for (int j = 0; j < kPerThread; j++) {
        const int c = int(threadIdx.x) + j * kFlashThreads;
        const int r = c / kChunks, col = (c % kChunks) * 8;
        const int w = r >> 4, pi = 16 * (w / HB) + (r & 15);
        const bool valid = pi < n_pos;
        const bf16* g = q_in + (valid ? (int64_t(row0 + pi) * Hq + h0 + w % HB) * D : 0) + col;
        cp_async16(dst + uint32_t((r * flash_stride<D>() + col) * sizeof(bf16)), g, valid);
    }
}

// grid (Hq / HB, tile slots): blockIdx.x = group of HB q heads (fastest, so the heads of one query tile, which
// share K/V through L2, run together), blockIdx.y = tile slot. Slots are numbered run by run, ceil(n_tokens / P)
// per run, the last (most expensive) tile of a run first; slots past the batch's tiles exit at once.
template <int D, int HB>
__global__ void __launch_bounds__(kFlashThreads, flash_min_blocks<D>())
    attn_flash_kernel(AttentionArgs p, RowMap rows, const bf16* __restrict__ q_in) {
    static_assert(HB == 1 || HB == 2 || HB == 4, "1, 2 or 4 heads a block");
    constexpr int P = kFlashRows / HB;  // positions per query tile
    static_assert(D % 64 == 0, "head dim a multiple of 64 (ldmatrix tiles, bank-conflict-free padding)");
    constexpr int kStride = flash_stride<D>();
    constexpr int kRowBytes = kStride * int(sizeof(bf16));
    constexpr int kNB = kFlashKeys / 8;  // 8-key column blocks of S per warp
    constexpr int kDB = D / 8;           // 8-dim column blocks of O per warp
    extern __shared__ __align__(16) unsigned char flash_smem[];
    bf16* sQ = reinterpret_cast<bf16*>(flash_smem);
    const uint32_t q_base = smem_addr(sQ);
    const uint32_t k_base = q_base + uint32_t(kFlashRows * kRowBytes);
    const uint32_t v_base = k_base + uint32_t(kFlashKeys * kRowBytes);

    pdl_trigger();
    pdl_wait();  // the run table, q_scratch and the cache are written by earlier work on the stream

    // Find (run, tile) for this slot.
    int slot_idx = int(blockIdx.y), run_idx = -1, tile = 0;
    for (int r = 0; r < rows.n_runs; r++) {
        const int nt = (rows.runs[r].n_tokens + P - 1) / P;
        if (slot_idx < nt) {
            run_idx = r;
            tile = nt - 1 - slot_idx;
            break;
        }
        slot_idx -= nt;
    }
    if (run_idx < 0) return;
    const SeqRun run = rows.runs[run_idx];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int h0 = int(blockIdx.x) * HB;  // the block's first q head
    const int Hq = p.n_heads, Hkv = p.n_kv_heads;
    const int kvh = h0 / (Hq / Hkv);                    // (HB divides the group size Hq / Hkv)
    const int h = h0 + warp % HB;                       // this warp's q head
    const int row0 = run.row + tile * P;                // batch row of the tile's first position
    const int n_pos = min(P, run.n_tokens - tile * P);  // valid positions, >= 1
    const int pos0 = run.pos + tile * P;                // its position
    const int kv_end = pos0 + n_pos;                    // keys [0, kv_end) can be attended
    const int n_kt = (kv_end + kFlashKeys - 1) / kFlashKeys;

    const int64_t kv_row = int64_t(Hkv) * D;  // elements between consecutive positions in the cache
    const int64_t cache_off = int64_t(run.slot) * p.n_ctx * kv_row + int64_t(kvh) * D;
    const bf16* kc = static_cast<const bf16*>(p.k_cache) + cache_off;
    const bf16* vc = static_cast<const bf16*>(p.v_cache) + cache_off;

    // This warp's query rows: Q tile rows [16 warp, 16 warp + 16) = positions [wp0, wp0 + 16) of the tile for head
    // h; the thread holds rows g and g + 8 of them.
    const int wrow0 = warp * 16, wp0 = 16 * (warp / HB);
    const bool warp_live = wp0 < n_pos;
    const int w_first_pos = pos0 + wp0;
    const int w_last_pos = pos0 + min(wp0 + 15, n_pos - 1);
    const int rpos0 = pos0 + wp0 + g, rpos1 = rpos0 + 8;

    // Lane addresses for ldmatrix (see the layout notes above).
    const uint32_t q_lane = q_base + uint32_t((wrow0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes +
                                              8 * (lane >> 4) * int(sizeof(bf16)));
    const uint32_t k_lane =
        k_base + uint32_t(((lane & 7) + 8 * (lane >> 4)) * kRowBytes + 8 * ((lane >> 3) & 1) * int(sizeof(bf16)));
    const uint32_t v_lane =
        v_base + uint32_t(((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + 8 * (lane >> 4) * int(sizeof(bf16)));

    // Prologue: Q and the last key tile.
    flash_load_q<D, HB>(q_base, q_in, row0, h0, Hq, n_pos);
    flash_load_tile<D>(k_base, kc + int64_t(n_kt - 1) * kFlashKeys * kv_row, kv_row, kv_end - (n_kt - 1) * kFlashKeys);
    cp_async_commit();

    constexpr float kLog2e = 1.4426950408889634f;
    const float scale = rsqrtf(float(D));
    float o[kDB][4];
#pragma unroll
    for (int i = 0; i < kDB; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows g, g + 8 (scores, not yet scaled by log2 e)
    float l0 = 0.0f, l1 = 0.0f;            // this thread's share of the running sums (its 16 of 64 columns)

    for (int kt = n_kt - 1; kt >= 0; kt--) {
        const int key0 = kt * kFlashKeys;
        cp_async_wait_all();
        __syncthreads();  // K tile kt (and Q) landed for all threads; every warp is done with the V buffer
        flash_load_tile<D>(v_base, vc + int64_t(key0) * kv_row, kv_row, kv_end - key0);
        cp_async_commit();

        // A warp whose rows all lie before this key tile (or past the run's end) has nothing to do here.
        const bool active = warp_live && key0 <= w_last_pos;
        uint32_t pa[kFlashKeys / 16][4];  // P as A fragments, one per 16 keys
        if (active) {
            float s[kNB][4];
#pragma unroll
            for (int i = 0; i < kNB; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) {
                uint32_t a[4];
                ldsm_x4(q_lane + ks * 32, a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int np = 0; np < kNB / 2; np++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(k_lane + np * 16 * kRowBytes + ks * 32, b0, b1, b2, b3);
                    mma_bf16_16816(s[2 * np], a, b0, b1);
                    mma_bf16_16816(s[2 * np + 1], a, b2, b3);
                }
            }
            // Scores, causal mask, row max.
            const bool need_mask = key0 + kFlashKeys - 1 > w_first_pos;
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < kNB; nb++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = round_bf16(round_bf16(s[nb][e]) * scale);
                    if (need_mask) {
                        const int key = key0 + nb * 8 + 2 * t4 + (e & 1);
                        if (key > (e < 2 ? rpos0 : rpos1)) v = -INFINITY;
                    }
                    s[nb][e] = v;
                }
                mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
            }
            // The 4 lanes of a quad (same g) hold the 64 columns of the same two rows.
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            // A row with every key so far masked keeps max -inf: use 0 as the reference so exp2 gives 0, not NaN.
            const float ref0 = mn0 == -INFINITY ? 0.0f : mn0 * kLog2e;
            const float ref1 = mn1 == -INFINITY ? 0.0f : mn1 * kLog2e;
            const float corr0 = exp2f(m0 * kLog2e - ref0), corr1 = exp2f(m1 * kLog2e - ref1);  // 0 while m = -inf
            m0 = mn0;
            m1 = mn1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int nb = 0; nb < kNB; nb++) {
                const float p0 = round_bf16(exp2f(fmaf(s[nb][0], kLog2e, -ref0)));
                const float p1 = round_bf16(exp2f(fmaf(s[nb][1], kLog2e, -ref0)));
                const float p2 = round_bf16(exp2f(fmaf(s[nb][2], kLog2e, -ref1)));
                const float p3 = round_bf16(exp2f(fmaf(s[nb][3], kLog2e, -ref1)));
                sum0 += p0 + p1;
                sum1 += p2 + p3;
                pa[nb / 2][(nb & 1) * 2 + 0] = pack_bf16x2(p0, p1);  // row g
                pa[nb / 2][(nb & 1) * 2 + 1] = pack_bf16x2(p2, p3);  // row g + 8
            }
            l0 = fmaf(l0, corr0, sum0);
            l1 = fmaf(l1, corr1, sum1);
#pragma unroll
            for (int i = 0; i < kDB; i++) {
                o[i][0] *= corr0;
                o[i][1] *= corr0;
                o[i][2] *= corr1;
                o[i][3] *= corr1;
            }
        }

        cp_async_wait_all();
        __syncthreads();  // V tile kt landed; every warp is done with the K buffer
        if (kt > 0) {
            const int prev0 = key0 - kFlashKeys;
            flash_load_tile<D>(k_base, kc + int64_t(prev0) * kv_row, kv_row, kv_end - prev0);
            cp_async_commit();
        }

        if (active) {
#pragma unroll
            for (int kk = 0; kk < kFlashKeys / 16; kk++) {
#pragma unroll
                for (int dp = 0; dp < D / 16; dp++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(v_lane + kk * 16 * kRowBytes + dp * 32, b0, b1, b2, b3);
                    mma_bf16_16816(o[2 * dp], pa[kk], b0, b1);
                    mma_bf16_16816(o[2 * dp + 1], pa[kk], b2, b3);
                }
            }
        }
    }

    if (!warp_live) return;
    // Row sums over the quad; the key at the row's own position is never masked, so l > 0 for valid rows.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;

    // o = bf16(O / l) goes over this warp's own Q rows in shared memory (only this warp ever read them), then the
    // warp writes its rows with the gate in 16-byte pieces.
    bf16* wq = sQ + wrow0 * kStride;
#pragma unroll
    for (int i = 0; i < kDB; i++) {
        const int col = i * 8 + 2 * t4;
        *reinterpret_cast<__nv_bfloat162*>(wq + g * kStride + col) =
            __floats2bfloat162_rn(o[i][0] * inv0, o[i][1] * inv0);
        *reinterpret_cast<__nv_bfloat162*>(wq + (g + 8) * kStride + col) =
            __floats2bfloat162_rn(o[i][2] * inv1, o[i][3] * inv1);
    }
    __syncwarp();
    constexpr int kChunks = D / 8;
    const int n_rows = min(16, n_pos - wp0);
    for (int c = lane; c < n_rows * kChunks; c += 32) {
        const int r = c / kChunks, col = (c % kChunks) * 8;
        const int64_t trow = row0 + wp0 + r;
        const uint4 gate =
            *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.qg) + (trow * Hq + h) * 2 * D + D + col);
        float gf[8], of[8];
        unpack8(gate, gf);
        unpack8(*reinterpret_cast<const uint4*>(wq + r * kStride + col), of);
#pragma unroll
        for (int j = 0; j < 8; j++) of[j] *= round_bf16(sigmoidf_(gf[j]));
        *reinterpret_cast<uint4*>(static_cast<bf16*>(p.out) + (trow * Hq + h) * D + col) = pack8(of);
    }
}

// q heads of one kv head a block serves (decode split kernel and flash kernel): 4, 2 or 1, the largest that is at
// most `wanted` and divides the group size G = Hq / Hkv.
int heads_per_block(int wanted, int G) { return wanted >= 4 && G % 4 == 0 ? 4 : wanted >= 2 && G % 2 == 0 ? 2 : 1; }

// Position splits of a decode step's attention: ceil(n_ctx / kAttnSplitKeys), at most max_splits (<= kAttnMaxSplits).
int n_splits(int n_ctx, int max_splits) {
    return std::min(std::min(max_splits, kAttnMaxSplits), std::max(1, (n_ctx + kAttnSplitKeys - 1) / kAttnSplitKeys));
}

// Opts the flash kernel for head dim D into its dynamic shared memory (above the 48 KB default for D >= 128),
// once per device.
template <int D, int HB>
void flash_smem_opt_in() {
    static std::atomic<uint64_t> done{0};
    opt_in_smem(attn_flash_kernel<D, HB>, flash_smem_bytes<D>(), done,
                "cudaFuncSetAttribute (flash attention shared memory)");
}

// The flash kernel with HB q heads a block: grid (Hq / HB, tile slots of kFlashRows / HB positions).
template <int D, int HB>
void launch_flash(const AttentionArgs& a, const RowMap& rows, const bf16* q_scratch, int64_t tile_slots,
                  const LaunchContext& ctx) {
    flash_smem_opt_in<D, HB>();
    cuda::launch(attn_flash_kernel<D, HB>, dim3(unsigned(a.n_heads / HB), unsigned(tile_slots)), dim3(kFlashThreads),
                 flash_smem_bytes<D>(), ctx, "attention flash kernel (prefill)", a, rows, q_scratch);
}

template <int D>
void run_attention(const AttentionArgs& a, const RowMap& rows, bf16* q_scratch, float* split_scratch,
                   const LaunchContext& ctx) {
    const int T = rows.n_rows;
    const int S = T <= kAttnSplitMaxRows ? n_splits(a.n_ctx, ctx.attn_max_splits) : 1;
    if (S > 1 && rows.n_rows == rows.n_runs) {  // decode, split over positions: the core kernel does the prep
        const int hpb = heads_per_block(ctx.attn_heads_per_block, a.n_heads / a.n_kv_heads);
        using Core = void (*)(AttentionArgs, RowMap, const bf16*, float*);
        const Core core = hpb == 4   ? attn_core_kernel<D, true, true, 4>
                          : hpb == 2 ? attn_core_kernel<D, true, true, 2>
                                     : attn_core_kernel<D, true, true, 1>;
        cuda::launch(core, dim3(unsigned(a.n_heads / hpb), unsigned(T), unsigned(S)), dim3(kAttnWarps * 32), 0, ctx,
                     "attention core kernel (prep, split over positions)", a, rows, static_cast<const bf16*>(nullptr),
                     split_scratch);
        cuda::launch(attn_merge_kernel<D>, dim3(unsigned(a.n_heads), unsigned(T)), dim3(D), 0, ctx,
                     "attention split merge kernel", a, static_cast<const float*>(split_scratch), S);
        return;
    }
    dim3 prep_grid(unsigned(T), ceil_div(a.n_heads + a.n_kv_heads, kAttnWarps));
    cuda::launch(attn_prep_kernel<D>, prep_grid, dim3(kAttnWarps * 32), 0, ctx,
                 "attention prep kernel (q/k norm, RoPE, KV cache write)", a, rows, q_scratch);
    // Prefill: tensor-core tiles of HB q heads of one kv head (ctx.attn_prefill_heads_per_block, a divisor of the
    // group size) and P = 64 / HB positions. Tile slots: sum over runs of ceil(n / P) <= ceil(T / P) + n_runs - 1.
    const int hb = heads_per_block(ctx.attn_prefill_heads_per_block, a.n_heads / a.n_kv_heads);
    const int64_t tile_slots = int64_t(ceil_div(T, kFlashRows / hb)) + std::max(rows.n_runs, 1) - 1;
    // (decode steps of many one-token runs take the per-row kernel below: a 64-row tile would hold one live row)
    if (T > kAttnSplitMaxRows && rows.n_rows > rows.n_runs && tile_slots <= 65535 && aligned16(q_scratch) &&
        aligned16(a.qg) && aligned16(a.out) && aligned16(a.k_cache) && aligned16(a.v_cache)) {
        const bf16* q = q_scratch;
        if (hb == 4)
            launch_flash<D, 4>(a, rows, q, tile_slots, ctx);
        else if (hb == 2)
            launch_flash<D, 2>(a, rows, q, tile_slots, ctx);
        else
            launch_flash<D, 1>(a, rows, q, tile_slots, ctx);
        return;
    }
    if (S > 1) {
        dim3 core_grid(unsigned(a.n_heads), unsigned(T), unsigned(S));
        cuda::launch(attn_core_kernel<D, true>, core_grid, dim3(kAttnWarps * 32), 0, ctx,
                     "attention core kernel (split over positions)", a, rows, static_cast<const bf16*>(q_scratch),
                     split_scratch);
        cuda::launch(attn_merge_kernel<D>, dim3(unsigned(a.n_heads), unsigned(T)), dim3(D), 0, ctx,
                     "attention split merge kernel", a, static_cast<const float*>(split_scratch), S);
    } else {
        dim3 core_grid(unsigned(a.n_heads), unsigned(T));
        cuda::launch(attn_core_kernel<D, false>, core_grid, dim3(kAttnWarps * 32), 0, ctx, "attention core kernel", a,
                     rows, static_cast<const bf16*>(q_scratch), static_cast<float*>(nullptr));
    }
}

}  // namespace

size_t attention_split_floats(int max_heads, int max_head_dim) {
    return size_t(kAttnSplitMaxRows) * size_t(max_heads) * size_t(kAttnMaxSplits) * size_t(max_head_dim + 2);
}

void attention(const AttentionArgs& a, const RowMap& rows, bf16* q_scratch, float* split_scratch,
               const LaunchContext& ctx) {
    if (rows.n_rows <= 0) return;
    if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
        throw Error(Status::unsupported, "CUDA attention: " + std::to_string(a.n_heads) +
                                             " q heads are not a multiple of " + std::to_string(a.n_kv_heads) +
                                             " kv heads");
    if (a.rotary_dim < 0 || a.rotary_dim > a.head_dim || a.rotary_dim % 2 != 0)
        throw Error(Status::unsupported, "CUDA attention: rotary dims " + std::to_string(a.rotary_dim) +
                                             " must be even and at most the head dim");
    switch (a.head_dim) {
        case 64: return run_attention<64>(a, rows, q_scratch, split_scratch, ctx);
        case 128: return run_attention<128>(a, rows, q_scratch, split_scratch, ctx);
        case 256: return run_attention<256>(a, rows, q_scratch, split_scratch, ctx);
        default: break;
    }
    static_assert(kMaxHeadDim == 256, "largest instantiated head dim");
    throw Error(Status::unsupported,
                "CUDA attention: head dim " + std::to_string(a.head_dim) + " is not built (64, 128 and 256 are)");
}

HY_CUDA_TRACE_BINDER(attention)

}  // namespace hy::cuda
