// The Gated DeltaNet kernels. Rounding follows a bf16 PyTorch model where it is free: the conv output and its SiLU
// are rounded to bf16, beta = sigmoid(b) is rounded, the recurrence output o is rounded before the gated norm, the
// normed o and its product with the norm weight are rounded. The state and the recurrence are fp32.
//
// Kernels (all launched with cuda::launch, i.e. with programmatic dependent launch where enabled):
//   conv_kernel          causal conv + SiLU -> mixed [T, C]; in decode (every run one token) also the conv state
//   conv_state_kernel    otherwise: the conv state <- the last K-1 inputs of [state, run]
//   decode_kernel        every run one token: one block per (value head, run) does the whole head,
//                        the state update, o and the gated RMSNorm; in small decode steps on compute capability
//                        9.0 also the conv and the conv state update (then conv_kernel is not launched);
//                        larger steps stage the state in shared memory (or with decode_staged_kernel: the same
//                        body, 80 registers a thread, three blocks an SM, where Dv <= 128; ctx.gdn_decode_three_blocks)
//   prefill_kernel       otherwise: one block per (32 value columns, value head, run) runs the recurrence over the
//                        run token by token and writes o (bf16) to out; then
//   gated_norm_kernel    out = norm_w * RMSNorm(o) * silu(z) per (row, value head), in place.
//
// Batch invariance: a token's outputs and state depend only on its sequence, never on how tokens are grouped into
// runs, chunks or steps, on other runs or on the batch size. The two recurrence kernels share the per-column code
// (same thread owning the same Dk rows, same accumulation order, same butterflies), the q/k l2 norm code and the
// gate code, and the two gated-norm paths share one fixed summation order over the head; no float atomics.
#include "kernels/cuda/gated_delta_net.cuh"

#include <algorithm>
#include <atomic>

namespace hy::cuda {

namespace {

constexpr int kMaxConvKernel = 16;
constexpr int kConvThreads = 256;
constexpr int kMaxValueDim = 256;

// Recurrence thread layout (both recurrence kernels): a column group of kGroupLanes = 8 consecutive lanes
// (g = lane & 7) owns two adjacent value columns a = 2p, b = 2p + 1 of one head's state S [Dk, Dv]; lane g holds
// the Dk rows d = 4 (g + 8 j) + c (j < Dk/32, c < 4) of both columns in registers. Why: per token every owner of
// a state element needs k and q of its Dk rows from shared memory, and two columns per thread halve that traffic
// (shared memory delivers 32 words per clock per SM: with one column per thread it, not the FMAs, would bound a
// token); eight lanes per column keep the butterfly over Dk at three shuffles while leaving 4 warps for the 32
// columns an SM gets in a single-sequence prefill. The float4 chunks 4 (g + 8 j) of one warp's k/q loads are 128
// contiguous bytes, so the loads are conflict-free broadcasts.
constexpr int kGroupLanes = 8;
constexpr int kPrefillCols = 32;                                   // value columns per prefill block
constexpr int kPrefillThreads = kPrefillCols / 2 * kGroupLanes;    // 128
constexpr int kChunk = 32;                                         // tokens staged in shared memory at a time
constexpr int kDecodeMaxThreads = kMaxValueDim / 4 * kGroupLanes;  // decode block: 2 Dv threads, whole head
constexpr int kNormWarps = 8;                                      // (row, head) items per gated-norm block
// The decode kernel with the conv inside (decode_kernel<DK, true>): conv kernel size 4 only, at most
// kFusedConvPer channels per thread (2 Dk + Dv <= kFusedConvPer * 2 Dv), Hv/Hk <= kMaxClusterHeads.
constexpr int kFusedConvTaps = 4;
constexpr int kFusedConvPer = 2;
constexpr int kMaxClusterHeads = 8;
// Decode steps of more runs keep conv_kernel: each block would do a share of the conv that conv_kernel spreads over
// the whole GPU (and the q, k channels twice); H200, 4B shapes: b = 64 9,240 against 9,514 tok/s, b = 8 the same.
constexpr int kFusedConvMaxRuns = 8;
// decode_stream_kernel's two state buffers fit in an SM's shared memory up to this many floats a head (Dk Dv).
constexpr int kStreamMaxStateFloats = 128 * 128;
// decode_staged_kernel: value heads up to this size (2 Dv threads a block), kStagedBlocksPerSm blocks an SM by
// registers (80 a thread; their 64 KB of staged state each at Dk = Dv = 128 fit the SM's shared memory three times).
constexpr int kStagedMaxValueDim = 128;
constexpr int kStagedBlocksPerSm = 3;

// Channel (in [0, C)) of list index i of a decode block's conv channels: q of key head kh (i < DK), k (i < 2 DK),
// v of value head h.
template <int DK>
__device__ __forceinline__ int64_t fused_conv_channel(int i, int kh, int h, int Hk, int Dv) {
    if (i < DK) return int64_t(kh) * DK + i;
    if (i < 2 * DK) return int64_t(Hk) * DK + int64_t(kh) * DK + (i - DK);
    return 2 * int64_t(Hk) * DK + int64_t(h) * Dv + (i - 2 * DK);
}

// VEC consecutive bf16 channels: 8 as one 16-byte word, or 1 (the fallback for unaligned pointers).
template <int VEC>
__device__ __forceinline__ void load_channels(const bf16* p, float (&f)[VEC]) {
    if constexpr (VEC == 8)
        unpack8(*reinterpret_cast<const uint4*>(p), f);
    else
        f[0] = to_f32(*p);
}
template <int VEC>
__device__ __forceinline__ void copy_channels(bf16* dst, const bf16* src) {
    if constexpr (VEC == 8)
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    else
        *dst = *src;
}
// VEC consecutive bf16 channels kept as loaded (the conv state rows a decode thread writes back unchanged).
template <int VEC>
struct RawChannels {
    uint4 v8;
    bf16 v1;
    __device__ __forceinline__ void load(const bf16* p) {
        if constexpr (VEC == 8)
            v8 = *reinterpret_cast<const uint4*>(p);
        else
            v1 = *p;
    }
    __device__ __forceinline__ void unpack(float (&f)[VEC]) const {
        if constexpr (VEC == 8)
            unpack8(v8, f);
        else
            f[0] = to_f32(v1);
    }
    __device__ __forceinline__ void store(bf16* p) const {
        if constexpr (VEC == 8)
            *reinterpret_cast<uint4*>(p) = v8;
        else
            *p = v1;
    }
};

// grid (C / VEC / kConvThreads, min(ceil(T / R), 65535)): thread per (VEC channels, R consecutive rows), row groups
// strided by gridDim.y (R = rows_per_block). Input j of the window of row t is at run index i - (K-1) + j; a negative
// index reads the conv state of the row's slot ([K-1, C], oldest first). Per channel acc = sum_j w[j] in[j] (FMAs in
// order j), mixed = bf16(silu(bf16(acc))). With update_state (every run is one token, so the thread is the only
// reader of its slot's state columns), the thread also shifts the state by its input, replacing conv_state_kernel:
// from the words it loaded (the state rows before the wait, the input after it), not by reading them again.
// Why R rows a thread: its VEC K weights are loaded once for them (lane stride VEC K 4 bytes: each load instruction
// of a warp touches 32 lines); with one row a thread, a 4,096-row prefill spent about 600 us a layer on them (run
// 126's trace: 615 us for 64 MB in and out).
template <int VEC>
__global__ void __launch_bounds__(kConvThreads)
    conv_kernel(const bf16* __restrict__ qkv, const float* __restrict__ conv_w, bf16* conv_state, RowMap rows,
                int64_t C, int K, bool update_state, int rows_per_block, bf16* __restrict__ mixed) {
    pdl_trigger();
    const int64_t c = (int64_t(blockIdx.x) * kConvThreads + threadIdx.x) * VEC;
    const bool active = c < C;
    const float* w = conv_w + (active ? c : 0) * K;              // [VEC, K]
    const int64_t first = int64_t(blockIdx.y) * rows_per_block;  // the block's first row
    // Loaded before the wait: the first kPreTaps taps of the weights (never written by a kernel) and, in decode
    // (every run one token), taps 0 .. K-2 of the block's first row, which are the conv state: only this kernel
    // writes it, in earlier steps, and those are complete before the step's first kernel (see decode_kernel).
    constexpr int kPreTaps = 4;
    float wpre[VEC][kPreTaps];
    if (K == kPreTaps && (reinterpret_cast<uintptr_t>(conv_w) & 15u) == 0) {  // a channel's taps as one float4
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            const float4 q = active ? *reinterpret_cast<const float4*>(w + v * kPreTaps) : make_float4(0, 0, 0, 0);
            wpre[v][0] = q.x;
            wpre[v][1] = q.y;
            wpre[v][2] = q.z;
            wpre[v][3] = q.w;
        }
    } else {
#pragma unroll
        for (int v = 0; v < VEC; v++)
#pragma unroll
            for (int j = 0; j < kPreTaps; j++) wpre[v][j] = active && j < K ? w[v * K + j] : 0.0f;
    }
    const bool pre_state = update_state && active && K - 1 <= kPreTaps && first < rows.n_rows;
    RawChannels<VEC> spre[kPreTaps];  // taps 0 .. K-2 of the first row (its conv state) as loaded
    if (pre_state) {
        const bf16* st0 = conv_state + int64_t(rows.slot[first]) * (K - 1) * C + c;
#pragma unroll
        for (int j = 0; j < kPreTaps; j++)
            if (j < K - 1) spre[j].load(st0 + int64_t(j) * C);
    }
    pdl_wait();  // qkv comes from the projection; the state and mixed may still be used by earlier kernels
    if (!active) return;
    for (int64_t t0 = first; t0 < rows.n_rows; t0 += int64_t(gridDim.y) * rows_per_block)
        for (int64_t t = t0, end = std::min<int64_t>(t0 + rows_per_block, rows.n_rows); t < end; t++) {
            const int i = rows.in_run[t];
            bf16* st = conv_state + int64_t(rows.slot[t]) * (K - 1) * C + c;
            float acc[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++) acc[v] = 0.0f;
            const bool use_pre = pre_state && t == first;
            auto input = [&](int j, float(&in)[VEC]) {  // tap j's input
                const int src = i - (K - 1) + j;
                load_channels<VEC>(src >= 0 ? qkv + (t - i + src) * C + c : st + int64_t(K - 1 + src) * C, in);
            };
            // use_pre (a one-token run, so i = 0 and tap K-1 is the row's own input): the input as loaded, for the
            // state update too
            RawChannels<VEC> x_raw;
            if (use_pre) x_raw.load(qkv + t * C + c);
#pragma unroll
            for (int j = 0; j < kPreTaps; j++) {  // FMAs in order j, as below
                if (j >= K) break;
                float in[VEC];
                if (use_pre && j < K - 1)
                    spre[j].unpack(in);
                else if (use_pre && j == K - 1)
                    x_raw.unpack(in);
                else
                    input(j, in);
#pragma unroll
                for (int v = 0; v < VEC; v++) acc[v] = fmaf(wpre[v][j], in[v], acc[v]);
            }
            for (int j = kPreTaps; j < K; j++) {
                float in[VEC];
                if (use_pre && j == K - 1)
                    x_raw.unpack(in);
                else
                    input(j, in);
#pragma unroll
                for (int v = 0; v < VEC; v++) acc[v] = fmaf(w[v * K + j], in[v], acc[v]);
            }
#pragma unroll
            for (int v = 0; v < VEC; v++) acc[v] = siluf_(round_bf16(acc[v]));
            if constexpr (VEC == 8)
                *reinterpret_cast<uint4*>(mixed + t * C + c) = pack8(acc);
            else
                mixed[t * C + c] = to_bf16(acc[0]);
            if (update_state && use_pre) {  // (K - 1 <= kPreTaps: spre holds the whole state)
#pragma unroll
                for (int j = 0; j + 1 < kPreTaps; j++)
                    if (j + 1 < K - 1) spre[j + 1].store(st + int64_t(j) * C);
                if (K > 1) x_raw.store(st + int64_t(K - 2) * C);
            } else if (update_state) {
                for (int j = 0; j + 1 < K - 1; j++) copy_channels<VEC>(st + int64_t(j) * C, st + int64_t(j + 1) * C);
                if (K > 1) copy_channels<VEC>(st + int64_t(K - 2) * C, qkv + t * C + c);
            }
        }
}

// grid (C / VEC / kConvThreads, min(n_runs, 65535)): thread per (run, VEC channels); the new state holds the last
// K-1 inputs of [old state, run]. In place in increasing j: new row j reads old row n_tokens + j > j (or an input).
template <int VEC>
__global__ void __launch_bounds__(kConvThreads)
    conv_state_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ conv_state, RowMap rows, int64_t C, int K) {
    pdl_trigger();
    pdl_wait();  // conv_kernel (the predecessor) reads the old state
    const int64_t c = (int64_t(blockIdx.x) * kConvThreads + threadIdx.x) * VEC;
    if (c >= C) return;
    for (int r = blockIdx.y; r < rows.n_runs; r += gridDim.y) {
        const SeqRun run = rows.runs[r];
        bf16* st = conv_state + int64_t(run.slot) * (K - 1) * C + c;
        for (int j = 0; j < K - 1; j++) {
            const int src = run.n_tokens - (K - 1) + j;
            copy_channels<VEC>(st + int64_t(j) * C,
                               src >= 0 ? qkv + (int64_t(run.row) + src) * C + c : st + int64_t(K - 1 + src) * C);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Per-token math shared by the kernels. Every function here is the single definition of its rounding and
// summation order; the products and sums that must match between kernels use explicit _rn intrinsics so that no
// context-dependent FMA contraction can creep in.

__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// {beta, decay} of one (token, value head): beta = bf16(sigmoid(b)), decay = exp(g), g = -A softplus(a + dt_bias),
// A = exp(A_log).
__device__ __forceinline__ float2 token_gates(float b, float a, float A, float dt_bias) {
    return make_float2(round_bf16(sigmoidf_(b)), expf(__fmul_rn(-A, softplusf_(__fadd_rn(a, dt_bias)))));
}

// l2 norm of a q or k vector of DK values spread over VL = DK/8 consecutive lanes (aligned groups of VL lanes):
// lane li holds x[0..3] = elements 4 li .. 4 li + 3 and x[4..7] = elements DK/2 + 4 li .. + 3. Returns
// rsqrt(sum x^2 + 1e-6) in every lane of the group; the sum order (8 sequential FMAs, then a butterfly over the
// group) is fixed. All 32 lanes of the warp must call it.
template <int VL>
__device__ __forceinline__ float l2_inv(const float (&x)[8]) {
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) p = __fmaf_rn(x[i], x[i], p);
#pragma unroll
    for (int o = VL / 2; o > 0; o >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, o));
    return rsqrtf(__fadd_rn(p, 1e-6f));
}

// Loads the 8 raw values of lane li of a q or k vector (see l2_inv) as two 8-byte words.
template <int DK>
__device__ __forceinline__ void load_qk_raw(const bf16* vec, int li, uint2 (&r)[2]) {
    r[0] = *reinterpret_cast<const uint2*>(vec + 4 * li);
    r[1] = *reinterpret_cast<const uint2*>(vec + DK / 2 + 4 * li);
}

__device__ __forceinline__ void unpack_qk_raw(const uint2 (&r)[2], float (&x)[8]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r[h].x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r[h].y));
        x[4 * h] = lo.x;
        x[4 * h + 1] = lo.y;
        x[4 * h + 2] = hi.x;
        x[4 * h + 3] = hi.y;
    }
}

// The factor of lane li's 8 values of a q (is_q) or k vector: q = x rsqrt(.) / sqrt(DK) (the two factors
// multiplied first, as before), k = x rsqrt(.). Branch-free, so that the compiler can overlap the butterflies of
// several vectors.
template <int DK>
__device__ __forceinline__ float qk_factor(const uint2 (&r)[2], bool is_q) {
    float x[8];
    unpack_qk_raw(r, x);
    const float inv = l2_inv<DK / 8>(x);
    return is_q ? __fmul_rn(inv, rsqrtf(float(DK))) : inv;
}

// Stores lane li's 8 normalized values x f (fp32) to the vector dst [DK].
template <int DK>
__device__ __forceinline__ void store_qk(const uint2 (&r)[2], int li, float f, float* dst) {
    float x[8];
    unpack_qk_raw(r, x);
    *reinterpret_cast<float4*>(dst + 4 * li) =
        make_float4(__fmul_rn(x[0], f), __fmul_rn(x[1], f), __fmul_rn(x[2], f), __fmul_rn(x[3], f));
    *reinterpret_cast<float4*>(dst + DK / 2 + 4 * li) =
        make_float4(__fmul_rn(x[4], f), __fmul_rn(x[5], f), __fmul_rn(x[6], f), __fmul_rn(x[7], f));
}

__device__ __forceinline__ float& comp(float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
__device__ __forceinline__ float comp(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// This lane's k or q rows 4 (g + 8 j) .. + 3 from a staged fp32 vector [DK].
template <int J>
__device__ __forceinline__ void load_rows(const float* v, int g, float4 (&x)[J]) {
#pragma unroll
    for (int j = 0; j < J; j++) x[j] = *reinterpret_cast<const float4*>(v + 4 * (g + 8 * j));
}

// The state rows of this lane for columns e0, e0 + 1 of a head's S [DK, Dv] (S points at row 0, column e0).
template <int J>
__device__ __forceinline__ void load_state(const float* S, int Dv, int g, float4 (&sa)[J], float4 (&sb)[J]) {
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float2 v = *reinterpret_cast<const float2*>(S + int64_t(4 * (g + 8 * j) + c) * Dv);
            comp(sa[j], c) = v.x;
            comp(sb[j], c) = v.y;
        }
}

// The row addresses are recomputed from a base the compiler cannot match with load_state's (the empty asm), so
// they are not kept live in registers across the token's math; __stcg keeps the stores global ones.
template <int J>
__device__ __forceinline__ void store_state(float* S, int Dv, int g, const float4 (&sa)[J], const float4 (&sb)[J]) {
    asm volatile("" : "+l"(S), "+r"(Dv));
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            __stcg(reinterpret_cast<float2*>(S + int64_t(4 * (g + 8 * j) + c) * Dv),
                   make_float2(comp(sa[j], c), comp(sb[j], c)));
}

// Decode stages a head's state S [DK, Dv] (fp32) in shared memory: 16-byte chunk ch of row r sits at chunk
// ch ^ ((r >> 2) & 7) of that row (Dv is a multiple of 32, so a row has a multiple of 8 chunks). Why the XOR: a
// recurrence lane g reads rows 4 (g + 8 j) + c, whose (r >> 2) & 7 is g, so the 8 lanes of a column group read 8
// different bank groups and a warp's float2 read takes the minimum 2 wavefronts; a warp copying 32 consecutive
// chunks of a row touches each bank group 4 times (the minimum for 512 bytes).
__device__ __forceinline__ int staged_index(int r, int col, int Dv) {
    return r * Dv + ((col >> 2) ^ ((r >> 2) & 7)) * 4 + (col & 3);
}

// Copies (cp.async, 16 bytes a thread per round) or writes back (16-byte global stores that skip L1) the state of
// a decode block: 2 Dv threads, DK/8 rounds; thread t takes chunk t % (Dv/4) of rows t / (Dv/4) + 8 k, so each
// warp moves whole 128-byte lines.
template <int DK>
__device__ __forceinline__ void stage_state_async(float* sS, const float* S, int Dv, int tid) {
    const int cpr = Dv / 4, r0 = tid / cpr, col = 4 * (tid % cpr);
#pragma unroll
    for (int k = 0; k < DK / 8; k++) {
        const int r = r0 + 8 * k;
        cp_async16(smem_addr(sS + staged_index(r, col, Dv)), S + int64_t(r) * Dv + col, true);
    }
    cp_async_commit();
}
template <int DK>
__device__ __forceinline__ void write_back_state(const float* sS, float* S, int Dv, int tid) {
    const int cpr = Dv / 4, r0 = tid / cpr, col = 4 * (tid % cpr);
#pragma unroll
    for (int k = 0; k < DK / 8; k++) {
        const int r = r0 + 8 * k;
        __stcg(reinterpret_cast<float4*>(S + int64_t(r) * Dv + col),
               *reinterpret_cast<const float4*>(sS + staged_index(r, col, Dv)));
    }
}

// This lane's rows of columns e, e + 1 (e even) between registers and the staged state.
template <int J>
__device__ __forceinline__ void read_staged(const float* sS, int Dv, int g, int e, float4 (&sa)[J], float4 (&sb)[J]) {
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float2 v = *reinterpret_cast<const float2*>(sS + staged_index(4 * (g + 8 * j) + c, e, Dv));
            comp(sa[j], c) = v.x;
            comp(sb[j], c) = v.y;
        }
}
// (As in store_state, the empty asm keeps the compiler from holding read_staged's addresses live across the math.)
template <int J>
__device__ __forceinline__ void write_staged(float* sS, int Dv, int g, int e, const float4 (&sa)[J],
                                             const float4 (&sb)[J]) {
    asm volatile("" : "+l"(sS), "+r"(Dv), "+r"(g), "+r"(e));
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            *reinterpret_cast<float2*>(sS + staged_index(4 * (g + 8 * j) + c, e, Dv)) =
                make_float2(comp(sa[j], c), comp(sb[j], c));
}

// Sum over the 8 lanes of a column group, butterfly xor 1, 2, 4: every lane gets the same bits.
__device__ __forceinline__ float group_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 4));
    return v;
}

// Sums column a's partials and column b's over the group in three shuffles (o needs no broadcast): the result is
// column a's sum in lanes g < 4 and column b's in lanes g >= 4.
__device__ __forceinline__ float group_sum_pair(float pa, float pb, int g) {
    const bool hi = (g & 4) != 0;
    float keep = hi ? pb : pa;
    keep = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, hi ? pa : pb, 4));
    keep = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, keep, 2));
    keep = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, keep, 1));
    return keep;
}

// The per-column token math, split in two halves (the prefill loop interleaves the halves of two columns). A
// lane's partial dot products use two accumulators, acc[c & 1] summing its rows in order (j, c): enough independent
// FMA chains to keep the per-token critical path short, one add to combine. The element operations are those of
// the reference loop: S = decay S; km = S^T k; u = beta (v - km); S += k u^T; o = S^T q.

// A lane's k and q rows come as registers (float4 [J], as load_rows fills them) or read where used from a staged fp32
// vector (StagedRows: the same float4 chunks 4 (g + 8 j)); the token functions below take either (KR, QR), with the
// same operations in the same order, so the same bits.
struct StagedRows {
    const float* v;  // [DK] in shared memory
    int g;           // the lane's index in its column group
    __device__ __forceinline__ float4 operator[](int j) const {
        return *reinterpret_cast<const float4*>(v + 4 * (g + 8 * j));
    }
};

// First half of a token for one column: S = decay S, then km = S^T k (the full sum, in every lane of the group).
template <int J, typename KR>
__device__ __forceinline__ float decay_and_km(float4 (&s)[J], const KR& k, float decay) {
    float acc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < J; j++) {
        const float4 kj = k[j];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float& x = comp(s[j], c);
            x = __fmul_rn(x, decay);
            acc[c & 1] = __fmaf_rn(x, comp(kj, c), acc[c & 1]);
        }
    }
    return group_sum(__fadd_rn(acc[0], acc[1]));
}

// Second half for one column: S += k u^T, then this lane's partial of o = S^T q (reduce with group_sum_pair).
template <int J, typename KR, typename QR>
__device__ __forceinline__ float update_and_o(float4 (&s)[J], const KR& k, const QR& q, float u) {
    float acc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < J; j++) {
        const float4 kj = k[j], qj = q[j];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float& x = comp(s[j], c);
            x = __fmaf_rn(comp(kj, c), u, x);
            acc[c & 1] = __fmaf_rn(x, comp(qj, c), acc[c & 1]);
        }
    }
    return __fadd_rn(acc[0], acc[1]);
}

// u = beta (v - km).
__device__ __forceinline__ float delta_u(float beta, float v, float km) { return __fmul_rn(beta, __fsub_rn(v, km)); }

// Gated RMSNorm over a head's Dv outputs (o already rounded to bf16), in one fixed order: lane l of a warp holds
// o[l + 32 i] in o32[i] (i < Dv/32); the lane sums its squares in order i, then a butterfly over the warp. Every
// lane gets rsqrt(mean(o^2) + eps).
__device__ __forceinline__ float head_inv_rms(const float (&o32)[kMaxValueDim / 32], int Dv, float eps) {
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxValueDim / 32; i++)
        if (i < Dv / 32) p = __fmaf_rn(o32[i], o32[i], p);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, o));
    return rsqrtf(__fadd_rn(__fdiv_rn(p, float(Dv)), eps));
}

// y = bf16(bf16(w * bf16(o * inv)) * silu(z)).
__device__ __forceinline__ bf16 gated_out(float o, float inv, float w, float z) {
    const float nrm = round_bf16(__fmul_rn(w, round_bf16(__fmul_rn(o, inv))));
    return to_bf16(__fmul_rn(nrm, siluf_(z)));
}

// Columns e, e + 1 of a head staged in shared memory (decode): read into the recurrence layout, the token's
// update (decay_and_km, delta_u, update_and_o), written back; oa, ob: this lane's partials of the two columns' o.
// k and q are read from the staged sk, sq [DK] where used, not held in registers: 32 registers fewer at DK = 128,
// which lets decode_staged_kernel fit three blocks an SM.
template <int J>
__device__ __forceinline__ void staged_column_pair(float* sS, int Dv, int g, int e, const float* sk, const float* sq,
                                                   float2 gate, float2 v, float& oa, float& ob) {
    const StagedRows k{sk, g}, q{sq, g};
    float4 sa[J], sb[J];
    read_staged<J>(sS, Dv, g, e, sa, sb);
    const float km_a = decay_and_km<J>(sa, k, gate.y), km_b = decay_and_km<J>(sb, k, gate.y);
    oa = update_and_o<J>(sa, k, q, delta_u(gate.x, v.x, km_a));
    ob = update_and_o<J>(sb, k, q, delta_u(gate.x, v.y, km_b));
    write_staged<J>(sS, Dv, g, e, sa, sb);
}

// The end of a decode block's head: this lane's partials of o for columns e0, e0 + 1 (oa, ob) and e1, e1 + 1 (oc,
// od) summed over the column group and rounded to bf16 into so [Dv], then (threads tid < Dv) out_tid =
// gated_out(o[tid], the head's inverse RMS, norm_w, z). Every thread of the block calls it (a block barrier).
__device__ __forceinline__ void head_gated_output(float* so, float oa, float ob, float oc, float od, int e0, int e1,
                                                  int g, int tid, int Dv, float eps, float norm_w, float z,
                                                  bf16* out_tid) {
    const float o0 = round_bf16(group_sum_pair(oa, ob, g));
    const float o1 = round_bf16(group_sum_pair(oc, od, g));
    if ((g & 3) == 0) {
        so[e0 + (g >> 2)] = o0;
        so[e1 + (g >> 2)] = o1;
    }
    __syncthreads();
    if (tid < Dv) {  // whole warps (Dv is a multiple of 32)
        const int lane = tid & 31;
        float o32[kMaxValueDim / 32];
#pragma unroll
        for (int i = 0; i < kMaxValueDim / 32; i++) o32[i] = i < Dv / 32 ? so[lane + 32 * i] : 0.0f;
        const float inv = head_inv_rms(o32, Dv, eps);
        *out_tid = gated_out(so[tid], inv, norm_w, z);
    }
}

// The conv of one channel of a decode token, as conv_kernel computes it (FMAs in order j from 0, then bf16(silu(
// bf16(acc)))): x[0 .. 2] the conv state (oldest first), x[3] the token's input, w the channel's 4 taps.
__device__ __forceinline__ bf16 conv4_channel(const float* w, const float (&x)[kFusedConvTaps]) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kFusedConvTaps; j++) acc = fmaf(w[j], x[j], acc);
    return to_bf16(siluf_(round_bf16(acc)));
}

// ---------------------------------------------------------------------------------------------------------------
// Decode: every run is one token. grid (Hv, n_runs), block 2 Dv threads: thread t is lane g = t & 7 of column group
// p = t >> 3 (p < Dv/4) and owns two column pairs, e = 2p, 2p + 1 and e = Dv/2 + 2p, + 1, each handled exactly as a
// prefill thread handles its pair. Steps of up to kFusedConvMaxRuns runs (kConv) load the state straight into the
// recurrence layout (a warp request: 8 rows x 32 bytes) before the wait. Larger steps stage the head's state in
// shared memory (staged_index): copied in with cp.async in whole lines before the wait, read into the recurrence
// layout one column pair at a time, written back there and stored in whole lines. (At b = 64 the direct loads kept
// the L1 pipe 85% busy and DRAM at 44%, ncu run 126; staged, 36% and 57%, 116 -> 89 us, run 127. At b = 8 the
// staged kernel lost 32% of the step, run 127, probably because a block needing 64 KB of shared memory and
// another carveout cannot start beside the GEMV before it; not profiled.) Four columns per thread amortize the
// per-thread overhead; with 128 registers a thread two blocks (heads) share an SM. The whole head is in the block, so
// the gated norm needs one more barrier and no second kernel. Warp 0 normalizes q and k (lanes < VL q, VL .. 2VL-1 k).
//
// kConv (conv kernel size 4, compute capability 9.0): the kernel also does the conv of the 2 Dk + Dv channels it
// reads (q and k of its key head, v of its head; at most two per thread) and the conv state update, instead of
// conv_kernel and a kernel boundary. The blocks of the Hv/Hk value heads sharing a key head form a cluster: all
// of them read the old conv state of the shared q and k channels, so the first one writes their new state only
// after a cluster barrier (placed after the recurrence, which hides it); each writes its own v channels. Bitwise
// the same outputs and states as conv_kernel followed by the kernel without kConv.
//
// The kernel's body is decode_block; decode_kernel<DK, kConv> launches it for any Dv (512 threads at most, so 128
// registers a thread), decode_staged_kernel<DK> the staged path for Dv <= kStagedMaxValueDim with at most 80
// registers a thread (k and q read from shared memory where used), so that three blocks share an SM: more heads' state
// copies in flight (ncu, H200, b = 256: two blocks an SM, DRAM 65%, 71% of cycles with no eligible warp). On an H100
// it lost (b = 256: 395 us a layer at 84.7% of DRAM against 365 us at 86.5% with two blocks), so it is opt-in.
template <int DK, bool kConv>
__device__ __forceinline__ void decode_block(const GatedDeltaNetArgs& p, const RowMap& rows,
                                             const bf16* __restrict__ mixed) {
    constexpr int J = DK / 32, VL = DK / 8;
    __shared__ __align__(16) float sq[DK];
    __shared__ __align__(16) float sk[DK];
    __shared__ float so[kMaxValueDim];
    __shared__ __align__(16) bf16 sconv[kConv ? 2 * DK + kMaxValueDim : 1];  // kConv: q, k, v after the conv
    extern __shared__ __align__(16) float sS[];                              // [DK, Dv], staged_index
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, g = tid & 7;
    const int h = blockIdx.x;
    const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dv = p.v_dim;
    const int e0 = 2 * (tid >> 3), e1 = e0 + Dv / 2;  // first columns of the two pairs
    const int kh = h / (Hv / Hk);
    const int64_t C = 2 * int64_t(Hk) * DK + int64_t(Hv) * Dv;
    const float A = expf(p.A_log[h]);  // weights: readable before the wait
    const float dt_bias = p.dt_bias[h];
    const float norm_w = tid < Dv ? p.norm_w[tid] : 0.0f;
    // The run table (copied in before the step's first kernel) and this layer's state (written only by this
    // kernel in earlier steps, or by work enqueued before the step) are complete before any kernel of the step
    // starts, so the state loads go out before the wait and overlap the projection kernel's tail.
    const SeqRun run = rows.runs[blockIdx.y];
    const int64_t row = run.row;
    float* S = p.ssm_state + (int64_t(run.slot) * Hv + h) * DK * Dv;
    // kStaged (large steps, no kConv): the state through shared memory; else straight into registers
    constexpr bool kStaged = !kConv;
    float4 sa[J], sb[J], sc[J], sd[J];  // columns e0, e0 + 1, e1, e1 + 1
    if constexpr (kStaged) {
        stage_state_async<DK>(sS, S, Dv, tid);
    } else {
        load_state<J>(S + e0, Dv, g, sa, sb);
        load_state<J>(S + e1, Dv, g, sc, sd);
    }
    // kConv: the conv state and weights of this thread's conv channels (list index i = tid + u 2 Dv < 2 DK + Dv:
    // q, k, v), loaded before the wait like the recurrent state (the conv state is written only by this kernel, in
    // earlier steps) and used only after it (a use before the wait would hold the block there until the loads
    // return); xs[u][3] is the token's input, loaded after the wait.
    bf16 xs[kConv ? kFusedConvPer : 1][kFusedConvTaps];
    float4 cw[kConv ? kFusedConvPer : 1];
    if constexpr (kConv) {
        const bf16* st = static_cast<const bf16*>(p.conv_state) + int64_t(run.slot) * (kFusedConvTaps - 1) * C;
#pragma unroll
        for (int u = 0; u < kFusedConvPer; u++) {
            const int i = tid + u * int(blockDim.x);
            if (i >= 2 * DK + Dv) break;
            const int64_t c = fused_conv_channel<DK>(i, kh, h, Hk, Dv);
#pragma unroll
            for (int j = 0; j + 1 < kFusedConvTaps; j++) xs[u][j] = st[int64_t(j) * C + c];
            cw[u] = *reinterpret_cast<const float4*>(p.conv_w + c * kFusedConvTaps);
        }
    }
    pdl_wait();  // mixed and the activations come from the kernels just before
    // the gate inputs and z, loaded here with the conv inputs (one memory wait for all, not one more after the
    // conv's barriers)
    const bf16 b_in = static_cast<const bf16*>(p.b)[row * Hv + h], a_in = static_cast<const bf16*>(p.a)[row * Hv + h];
    const int64_t oi = row * int64_t(Hv) * Dv + int64_t(h) * Dv + tid;  // output column tid (threads < Dv)
    const bf16 z_in = tid < Dv ? static_cast<const bf16*>(p.z)[oi] : to_bf16(0.0f);
    const bf16* m = mixed + row * C;
    const bf16* mv = m + 2 * int64_t(Hk) * DK + int64_t(h) * Dv;
    if constexpr (kConv) {
        const bf16* in = static_cast<const bf16*>(p.qkv) + row * C;
#pragma unroll
        for (int u = 0; u < kFusedConvPer; u++) {
            const int i = tid + u * int(blockDim.x);
            if (i >= 2 * DK + Dv) break;
            xs[u][kFusedConvTaps - 1] = in[fused_conv_channel<DK>(i, kh, h, Hk, Dv)];
            float x[kFusedConvTaps];
#pragma unroll
            for (int j = 0; j < kFusedConvTaps; j++) x[j] = to_f32(xs[u][j]);
            const float w[kFusedConvTaps] = {cw[u].x, cw[u].y, cw[u].z, cw[u].w};
            sconv[i] = conv4_channel(w, x);
        }
        cluster_arrive();  // the old conv state is read
        __syncthreads();
        mv = sconv + 2 * DK;
    }
    const float2 v0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(mv + e0));
    const float2 v1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(mv + e1));
    const float2 gate = token_gates(to_f32(b_in), to_f32(a_in), A, dt_bias);
    const float z = to_f32(z_in);
    if (tid < 32) {
        const int which = lane / VL, li = lane % VL;  // which: 0 q, 1 k, 2.. idle lanes (DK < 128)
        uint2 r[2] = {make_uint2(0u, 0u), make_uint2(0u, 0u)};
        const bf16* vec = kConv ? sconv + which * DK : m + int64_t(which) * Hk * DK + int64_t(kh) * DK;
        if (which < 2) load_qk_raw<DK>(vec, li, r);
        const float f = qk_factor<DK>(r, which == 0);
        if (which < 2) store_qk<DK>(r, li, f, which == 0 ? sq : sk);
    }
    if constexpr (kStaged) cp_async_wait_all();
    __syncthreads();

    float oa, ob, oc, od;
    if constexpr (kStaged) {  // columns e0, e0 + 1, then e1, e1 + 1: 32 state registers live at a time (each
                              // thread rewrites the words it read)
        staged_column_pair<J>(sS, Dv, g, e0, sk, sq, gate, v0, oa, ob);
        staged_column_pair<J>(sS, Dv, g, e1, sk, sq, gate, v1, oc, od);
    } else {  // the four columns interleaved (the loads went out before the wait)
        float4 kx[J], qx[J];
        load_rows<J>(sk, g, kx);
        load_rows<J>(sq, g, qx);
        const float km_a = decay_and_km<J>(sa, kx, gate.y), km_b = decay_and_km<J>(sb, kx, gate.y);
        const float km_c = decay_and_km<J>(sc, kx, gate.y), km_d = decay_and_km<J>(sd, kx, gate.y);
        oa = update_and_o<J>(sa, kx, qx, delta_u(gate.x, v0.x, km_a));
        ob = update_and_o<J>(sb, kx, qx, delta_u(gate.x, v0.y, km_b));
        oc = update_and_o<J>(sc, kx, qx, delta_u(gate.x, v1.x, km_c));
        od = update_and_o<J>(sd, kx, qx, delta_u(gate.x, v1.y, km_d));
        store_state<J>(S + e0, Dv, g, sa, sb);
        store_state<J>(S + e1, Dv, g, sc, sd);
    }
    head_gated_output(so, oa, ob, oc, od, e0, e1, g, tid, Dv, p.eps, norm_w, z, static_cast<bf16*>(p.out) + oi);
    if constexpr (kStaged) write_back_state<DK>(sS, S, Dv, tid);  // (the barrier above ordered the staged writes)
    if constexpr (kConv) {  // the new conv state: rows 1 .. 3 of the window; shared q, k channels by one block
        cluster_wait();
        bf16* st = static_cast<bf16*>(p.conv_state) + int64_t(run.slot) * (kFusedConvTaps - 1) * C;
        const bool owns_qk = h % (Hv / Hk) == 0;
#pragma unroll
        for (int u = 0; u < kFusedConvPer; u++) {
            const int i = tid + u * int(blockDim.x);
            if (i >= 2 * DK + Dv) break;
            if (i < 2 * DK && !owns_qk) continue;
            const int64_t c = fused_conv_channel<DK>(i, kh, h, Hk, Dv);
#pragma unroll
            for (int j = 0; j + 1 < kFusedConvTaps; j++) st[int64_t(j) * C + c] = xs[u][j + 1];
        }
    }
}

template <int DK, bool kConv>
__global__ void __launch_bounds__(kDecodeMaxThreads)
    decode_kernel(GatedDeltaNetArgs p, RowMap rows, const bf16* __restrict__ mixed) {
    decode_block<DK, kConv>(p, rows, mixed);
}

template <int DK>
__global__ void __launch_bounds__(2 * kStagedMaxValueDim, kStagedBlocksPerSm)
    decode_staged_kernel(GatedDeltaNetArgs p, RowMap rows, const bf16* __restrict__ mixed) {
    decode_block<DK, false>(p, rows, mixed);
}

// Decode steps that stage the state (no conv inside), streamed: a block takes the items (run, value head) i =
// blockIdx.x, blockIdx.x + gridDim.x, ... (item i: run i / Hv, head i % Hv) and computes each exactly as
// decode_kernel's staged path does (the same functions in the same order, so the same bits), with two state
// buffers: the next item's state is copied in (cp.async) while the current one is computed and written back. Why:
// decode_kernel's blocks each copy in, compute and write back one head in turn, two blocks an SM (registers), so
// the state stream has gaps (ncu, H200, b = 64: DRAM 57%, run 127); here an SM's block keeps a head's 64 KB (Dk =
// Dv = 128) in flight while it computes (ctx.gdn_decode_stream; Dk Dv <= kStreamMaxStateFloats).
template <int DK>
__global__ void __launch_bounds__(kDecodeMaxThreads)
    decode_stream_kernel(GatedDeltaNetArgs p, RowMap rows, const bf16* __restrict__ mixed, int n_items) {
    constexpr int J = DK / 32, VL = DK / 8;
    __shared__ __align__(16) float sq[DK];
    __shared__ __align__(16) float sk[DK];
    __shared__ float so[kMaxValueDim];
    extern __shared__ __align__(16) float sS[];  // [2][DK, Dv], staged_index
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, g = tid & 7;
    const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dv = p.v_dim;
    const int e0 = 2 * (tid >> 3), e1 = e0 + Dv / 2;  // first columns of the two pairs
    const int64_t C = 2 * int64_t(Hk) * DK + int64_t(Hv) * Dv;
    const int64_t state_floats = int64_t(DK) * Dv;
    auto state_of = [&](int item) {  // (the run table and the state are complete before the step: see decode_kernel)
        return p.ssm_state + (int64_t(rows.runs[item / Hv].slot) * Hv + item % Hv) * state_floats;
    };
    int item = int(blockIdx.x);
    if (item < n_items) stage_state_async<DK>(sS, state_of(item), Dv, tid);  // before the wait, as decode_kernel
    pdl_wait();  // mixed and the activations come from the kernels just before
    for (int n = 0; item < n_items; item += int(gridDim.x), n++) {
        float* cur = sS + (n & 1) * state_floats;
        const int next = item + int(gridDim.x);
        if (next < n_items) {  // the other buffer's last reader (write_back two items ago) passed the loop's barrier
            stage_state_async<DK>(sS + ((n + 1) & 1) * state_floats, state_of(next), Dv, tid);
        }
        const int h = item % Hv, kh = h / (Hv / Hk);
        const SeqRun run = rows.runs[item / Hv];
        const int64_t row = run.row;
        float* S = state_of(item);
        const float A = expf(p.A_log[h]);
        const float dt_bias = p.dt_bias[h];
        const float norm_w = tid < Dv ? p.norm_w[tid] : 0.0f;
        const bf16 b_in = static_cast<const bf16*>(p.b)[row * Hv + h];
        const bf16 a_in = static_cast<const bf16*>(p.a)[row * Hv + h];
        const int64_t oi = row * int64_t(Hv) * Dv + int64_t(h) * Dv + tid;  // output column tid (threads < Dv)
        const bf16 z_in = tid < Dv ? static_cast<const bf16*>(p.z)[oi] : to_bf16(0.0f);
        const bf16* m = mixed + row * C;
        const bf16* mv = m + 2 * int64_t(Hk) * DK + int64_t(h) * Dv;
        const float2 v0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(mv + e0));
        const float2 v1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(mv + e1));
        const float2 gate = token_gates(to_f32(b_in), to_f32(a_in), A, dt_bias);
        const float z = to_f32(z_in);
        if (tid < 32) {
            const int which = lane / VL, li = lane % VL;  // which: 0 q, 1 k, 2.. idle lanes (DK < 128)
            uint2 r[2] = {make_uint2(0u, 0u), make_uint2(0u, 0u)};
            const bf16* vec = m + int64_t(which) * Hk * DK + int64_t(kh) * DK;
            if (which < 2) load_qk_raw<DK>(vec, li, r);
            const float f = qk_factor<DK>(r, which == 0);
            if (which < 2) store_qk<DK>(r, li, f, which == 0 ? sq : sk);
        }
        if (next < n_items)
            cp_async_wait<1>();  // this item's state is in (the next one's may still be in flight)
        else
            cp_async_wait_all();
        __syncthreads();

        float oa, ob, oc, od;  // (as decode_kernel's staged path)
        staged_column_pair<J>(cur, Dv, g, e0, sk, sq, gate, v0, oa, ob);
        staged_column_pair<J>(cur, Dv, g, e1, sk, sq, gate, v1, oc, od);
        head_gated_output(so, oa, ob, oc, od, e0, e1, g, tid, Dv, p.eps, norm_w, z, static_cast<bf16*>(p.out) + oi);
        write_back_state<DK>(cur, S, Dv, tid);  // (the barrier above ordered the staged writes)
        __syncthreads();                        // cur, sq, sk and so are free for the items after
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Prefill (any runs): grid (Dv/32, Hv, n_runs), kPrefillThreads = 128 threads; block (s, h, r) owns value columns
// [32 s, 32 s + 32) of head h for run r (thread t: lane g = t & 7 of group p = t >> 3, columns 32 s + 2p, + 1).
// Splitting a head's columns over blocks puts 128 blocks on the GPU for one sequence of a 32-head model.
//
// The run is processed in chunks of kChunk tokens. Per chunk, all threads stage in shared memory (fp32):
//   sq, sk [kChunk][DK]  the l2-normalized q and k of key head h / (Hv/Hk)
//   sv [kChunk][32]      v of the block's columns
//   sgate [kChunk]       {beta, decay}
// from raw bf16 values that were loaded into registers while the previous chunk ran (so the global latency is
// hidden); then the token loop needs only shared-memory broadcasts, FMAs and the group butterflies (see the loop
// for how the two columns of a thread are skewed). A chunk costs two barriers; staging is ~10% of the time.
// o is rounded to bf16 and written to out; gated_norm_kernel then applies the gated RMSNorm.
// Registers: ~205 per thread at Dk = 128 (state 32, k/q of two tokens 64, the next chunk's raw values 37).
template <int DK>
struct PrefillStage {
    static constexpr int VL = DK / 8;                         // lanes per q/k vector
    static constexpr int kVecPerPass = kPrefillThreads / VL;  // vectors normalized per pass
    static constexpr int kPasses = 2 * kChunk / kVecPerPass;  // q and k of kChunk tokens
    static_assert(kPasses * kVecPerPass == 2 * kChunk, "chunk must fill whole passes");
    static_assert(kChunk * kPrefillCols / 8 == kPrefillThreads, "one 16-byte v load per thread");
    uint2 qk[kPasses][2];  // raw q/k of the chunk (see load_qk_raw)
    uint4 v;               // 8 raw v values: token tid / 4, columns 8 (tid % 4) ..
    float b, a;            // raw gates of token tid (tid < kChunk)
};

template <int DK>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(GatedDeltaNetArgs p, RowMap rows, const bf16* __restrict__ mixed) {
    using Stage = PrefillStage<DK>;
    constexpr int J = DK / 32, VL = Stage::VL;
    __shared__ __align__(16) float sq[kChunk][DK];
    __shared__ __align__(16) float sk[kChunk][DK];
    __shared__ __align__(16) float sv[kChunk][kPrefillCols];
    __shared__ __align__(16) float2 sgate[kChunk];
    pdl_trigger();
    const int tid = threadIdx.x, g = tid & 7, c0 = 2 * (tid >> 3);  // c0: first column inside the block
    const int h = blockIdx.y;
    const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dv = p.v_dim;
    const int kh = h / (Hv / Hk);
    const int64_t C = 2 * int64_t(Hk) * DK + int64_t(Hv) * Dv;
    const int col0 = blockIdx.x * kPrefillCols;  // block's first column in the head
    const float A = expf(p.A_log[h]);
    const float dt_bias = p.dt_bias[h];
    const bf16* b_in = static_cast<const bf16*>(p.b);
    const bf16* a_in = static_cast<const bf16*>(p.a);
    bf16* out = static_cast<bf16*>(p.out);
    pdl_wait();  // the run table, mixed, the activations and the state come from earlier work on the stream
    const SeqRun run = rows.runs[blockIdx.z];
    const int n_tokens = run.n_tokens;
    if (n_tokens <= 0) return;  // block-uniform

    float* S = p.ssm_state + (int64_t(run.slot) * Hv + h) * DK * Dv + col0 + c0;
    float4 sa[J], sb[J];
    load_state<J>(S, Dv, g, sa, sb);

    // Issues the global loads of the raw chunk at run index i0 (n tokens) into st.
    auto load_chunk = [&](int i0, int n, Stage& st) {
        const int li = tid % VL;
#pragma unroll
        for (int r = 0; r < Stage::kPasses; r++) {
            const int vi = r * Stage::kVecPerPass + tid / VL, t = vi >> 1, which = vi & 1;
            st.qk[r][0] = st.qk[r][1] = make_uint2(0u, 0u);
            if (t < n)
                load_qk_raw<DK>(mixed + (int64_t(run.row) + i0 + t) * C + int64_t(which) * Hk * DK + int64_t(kh) * DK,
                                li, st.qk[r]);
        }
        const int tv = tid >> 2;
        st.v = make_uint4(0u, 0u, 0u, 0u);
        if (tv < n)
            st.v = *reinterpret_cast<const uint4*>(mixed + (int64_t(run.row) + i0 + tv) * C + 2 * int64_t(Hk) * DK +
                                                   int64_t(h) * Dv + col0 + 8 * (tid & 3));
        st.b = st.a = 0.0f;
        if (tid < n) {
            const int64_t gi = (int64_t(run.row) + i0 + tid) * Hv + h;
            st.b = to_f32(b_in[gi]);
            st.a = to_f32(a_in[gi]);
        }
    };
    // Normalizes / converts the registers of a chunk of n tokens into the shared staging buffers.
    auto stage_chunk = [&](const Stage& st, int n) {
        const int li = tid % VL;
        float f[Stage::kPasses];
#pragma unroll
        for (int r = 0; r < Stage::kPasses; r++) f[r] = qk_factor<DK>(st.qk[r], ((tid / VL) & 1) == 0);
#pragma unroll
        for (int r = 0; r < Stage::kPasses; r++) {
            const int vi = r * Stage::kVecPerPass + tid / VL, t = vi >> 1, which = vi & 1;
            if (t < n) store_qk<DK>(st.qk[r], li, f[r], which == 0 ? sq[t] : sk[t]);
        }
        const int tv = tid >> 2;
        if (tv < n) {
            float vf[8];
            unpack8(st.v, vf);
            float* d = &sv[tv][8 * (tid & 3)];
            *reinterpret_cast<float4*>(d) = make_float4(vf[0], vf[1], vf[2], vf[3]);
            *reinterpret_cast<float4*>(d + 4) = make_float4(vf[4], vf[5], vf[6], vf[7]);
        }
        if (tid < n) sgate[tid] = token_gates(st.b, st.a, A, dt_bias);
    };

    Stage st;
    load_chunk(0, min(kChunk, n_tokens), st);
    const int64_t o_col = int64_t(h) * Dv + col0 + c0 + (g >> 2);  // output column of lanes g = 0 and g = 4
    const int64_t o_stride = int64_t(Hv) * Dv;
    for (int i0 = 0; i0 < n_tokens; i0 += kChunk) {
        const int n = min(kChunk, n_tokens - i0);
        __syncthreads();  // every thread is done reading the previous chunk's staging
        stage_chunk(st, n);
        __syncthreads();
        if (i0 + kChunk < n_tokens) load_chunk(i0 + kChunk, min(kChunk, n_tokens - i0 - kChunk), st);

        // Token loop, skewed by half a token between the two columns: column a runs one token ahead of column b,
        // so that the km butterfly of one column (three dependent shuffles) is in flight while the other column's
        // update issues; with one warp per scheduler nothing else would hide it. Per column, a token is
        //   u = beta (v - km);  S += k u^T;  o = S^T q  (update_and_o)  then  S = decay' S;  km' = S^T k'
        // of the next token (decay_and_km); the chunk's first token gets its decay_and_km in the prologue, its
        // last token none.
        const float* vrow = &sv[0][c0];
        auto u_of = [&](int t, int col, float km) { return delta_u(sgate[t].x, vrow[t * kPrefillCols + col], km); };
        bf16* o_ptr = out + (int64_t(run.row) + i0) * o_stride + o_col;  // advances one row per token written
        auto write_o = [&](float pa, float pb) {
            const float o = round_bf16(group_sum_pair(pa, pb, g));
            if ((g & 3) == 0) *o_ptr = to_bf16(o);
            o_ptr += o_stride;
        };
        float4 kA[J], kB[J], qA[J], qB[J];
        load_rows<J>(sk[0], g, kA);
        load_rows<J>(sq[0], g, qA);
        float km_a = decay_and_km<J>(sa, kA, sgate[0].y);
        float km_b = decay_and_km<J>(sb, kA, sgate[0].y);
        float oa = update_and_o<J>(sa, kA, qA, u_of(0, 0, km_a));  // column a's o partial of the oldest token
        if (n == 1) {
            write_o(oa, update_and_o<J>(sb, kA, qA, u_of(0, 1, km_b)));
            continue;
        }
        load_rows<J>(sk[1], g, kB);
        km_a = decay_and_km<J>(sa, kB, sgate[1].y);
        // Column b finishes token t, column a does token t + 1 (needs t + 2 < n). On entry kc, qc = k_t, q_t,
        // kn = k_{t+1}, km_b of t, km_a of t + 1, oa of t; on exit kn, qn = k_{t+1}, q_{t+1}, kc = k_{t+2}, so
        // the next call swaps the roles (the loop is unrolled by two to avoid register copies).
        auto step = [&](int t, float4(&kc)[J], float4(&qc)[J], float4(&kn)[J], float4(&qn)[J]) {
            const float ob = update_and_o<J>(sb, kc, qc, u_of(t, 1, km_b));
            km_b = decay_and_km<J>(sb, kn, sgate[t + 1].y);
            write_o(oa, ob);
            load_rows<J>(sq[t + 1], g, qn);
            oa = update_and_o<J>(sa, kn, qn, u_of(t + 1, 0, km_a));
            load_rows<J>(sk[t + 2], g, kc);
            km_a = decay_and_km<J>(sa, kc, sgate[t + 2].y);
        };
        // The chunk's last two tokens t = n - 2, n - 1 (same entry state as step).
        auto finish = [&](int t, float4(&kc)[J], float4(&qc)[J], float4(&kn)[J], float4(&qn)[J]) {
            const float ob = update_and_o<J>(sb, kc, qc, u_of(t, 1, km_b));
            km_b = decay_and_km<J>(sb, kn, sgate[t + 1].y);
            write_o(oa, ob);
            load_rows<J>(sq[t + 1], g, qn);
            oa = update_and_o<J>(sa, kn, qn, u_of(t + 1, 0, km_a));
            write_o(oa, update_and_o<J>(sb, kn, qn, u_of(t + 1, 1, km_b)));
        };
        int t = 0;
        for (; t + 3 < n; t += 2) {
            step(t, kA, qA, kB, qB);
            step(t + 1, kB, qB, kA, qA);
        }
        if (t + 2 < n) {
            step(t, kA, qA, kB, qB);
            finish(t + 1, kB, qB, kA, qA);
        } else {
            finish(t, kA, qA, kB, qB);
        }
    }
    store_state<J>(S, Dv, g, sa, sb);
}

// Gated RMSNorm in place over o [T, Hv, Dv] (bf16, from prefill_kernel): one warp per (row, head), lane l handles
// columns l + 32 i (the order of head_inv_rms). y = norm_w * RMSNorm(o) * silu(z).
__global__ void __launch_bounds__(kNormWarps * 32)
    gated_norm_kernel(const bf16* __restrict__ z, const float* __restrict__ norm_w, int64_t n_items, int Dv, float eps,
                      bf16* out) {
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    float w[kMaxValueDim / 32];
#pragma unroll
    for (int i = 0; i < kMaxValueDim / 32; i++) w[i] = i < Dv / 32 ? norm_w[lane + 32 * i] : 0.0f;
    pdl_wait();  // o comes from prefill_kernel, z from the projection
    const int64_t item = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);  // row * Hv + head
    if (item >= n_items) return;
    bf16* o_row = out + item * Dv;
    const bf16* z_row = z + item * Dv;
    float o32[kMaxValueDim / 32];
#pragma unroll
    for (int i = 0; i < kMaxValueDim / 32; i++) o32[i] = i < Dv / 32 ? to_f32(o_row[lane + 32 * i]) : 0.0f;
    const float inv = head_inv_rms(o32, Dv, eps);
#pragma unroll
    for (int i = 0; i < kMaxValueDim / 32; i++)
        if (i < Dv / 32) o_row[lane + 32 * i] = gated_out(o32[i], inv, w[i], to_f32(z_row[lane + 32 * i]));
}

// Opts decode_kernel<DK, false> (the staged state) into DK kMaxValueDim 4 bytes of dynamic shared memory (above the 48
// KB default at DK = 128) and the largest shared-memory carveout (the kernel's global accesses skip L1), once per
// kernel and device.
template <int DK>
void decode_smem_opt_in() {
    static std::atomic<uint64_t> done{0};
    opt_in_smem(decode_kernel<DK, false>, size_t(DK) * kMaxValueDim * sizeof(float), done,
                "cudaFuncSetAttribute (Gated DeltaNet decode shared memory and carveout)", true);
}
// The same for decode_staged_kernel<DK> (DK kStagedMaxValueDim floats).
template <int DK>
void decode_staged_smem_opt_in() {
    static std::atomic<uint64_t> done{0};
    opt_in_smem(decode_staged_kernel<DK>, size_t(DK) * kStagedMaxValueDim * sizeof(float), done,
                "cudaFuncSetAttribute (Gated DeltaNet staged decode shared memory and carveout)", true);
}

// decode_stream_kernel<DK>'s blocks: ctx.gdn_decode_stream_blocks, or as many as fit on the device at once (the
// occupancy calculator, once per shape), at most one per item.
template <int DK>
unsigned stream_blocks(int Dv, size_t smem, int n_items, const LaunchContext& s) {
    static std::atomic<uint64_t> done{0};
    opt_in_smem(decode_stream_kernel<DK>, size_t(2) * kStreamMaxStateFloats * sizeof(float), done,
                "cudaFuncSetAttribute (Gated DeltaNet streamed decode shared memory and carveout)", true);
    int blocks = s.gdn_decode_stream_blocks;
    if (blocks <= 0) {
        static std::atomic<int> per_sm_of_dv[kMaxValueDim / 32 + 1];  // (per value head size; 0: not asked yet)
        std::atomic<int>& cached = per_sm_of_dv[Dv / 32];
        int per_sm = cached.load(std::memory_order_relaxed);
        if (per_sm == 0) {
            check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_stream_kernel<DK>, 2 * Dv, smem),
                  "cudaOccupancyMaxActiveBlocksPerMultiprocessor (Gated DeltaNet streamed decode)");
            per_sm = std::max(1, per_sm);
            cached.store(per_sm, std::memory_order_relaxed);
        }
        blocks = per_sm * std::max(1, s.sm_count);
    }
    return unsigned(std::min(blocks, n_items));
}

template <int DK>
void launch_recurrence(const GatedDeltaNetArgs& a, const RowMap& rows, const bf16* mixed, bool decode, bool fused_conv,
                       const LaunchContext& s) {
    if (decode) {
        const dim3 grid(unsigned(a.n_v_heads), unsigned(rows.n_runs)), block(unsigned(2 * a.v_dim));
        const size_t smem = size_t(DK) * size_t(a.v_dim) * sizeof(float);  // the staged state (no kConv)
        if (!fused_conv && s.gdn_decode_stream && DK * a.v_dim <= kStreamMaxStateFloats) {
            const int n_items = rows.n_runs * a.n_v_heads;
            launch(decode_stream_kernel<DK>, dim3(stream_blocks<DK>(a.v_dim, 2 * smem, n_items, s)), block, 2 * smem, s,
                   "Gated DeltaNet decode kernel (streamed: recurrence + gated RMSNorm)", a, rows, mixed, n_items);
            return;
        }
        if (fused_conv) {
            launch_clusters(decode_kernel<DK, true>, grid, block, unsigned(a.n_v_heads / a.n_k_heads), 0, s,
                            "Gated DeltaNet decode kernel (conv + recurrence + gated RMSNorm)", a, rows, mixed);
        } else if (s.gdn_decode_three_blocks && a.v_dim <= kStagedMaxValueDim) {
            decode_staged_smem_opt_in<DK>();
            launch(decode_staged_kernel<DK>, grid, block, smem, s,
                   "Gated DeltaNet decode kernel (recurrence + gated RMSNorm, three blocks an SM)", a, rows, mixed);
        } else {
            decode_smem_opt_in<DK>();
            launch(decode_kernel<DK, false>, grid, block, smem, s,
                   "Gated DeltaNet decode kernel (recurrence + gated RMSNorm)", a, rows, mixed);
        }
        return;
    }
    launch(prefill_kernel<DK>, dim3(unsigned(a.v_dim / kPrefillCols), unsigned(a.n_v_heads), unsigned(rows.n_runs)),
           dim3(kPrefillThreads), 0, s, "Gated DeltaNet prefill recurrence kernel", a, rows, mixed);
    const int64_t n_items = int64_t(rows.n_rows) * a.n_v_heads;
    launch(gated_norm_kernel, dim3(ceil_div(n_items, kNormWarps)), dim3(kNormWarps * 32), 0, s,
           "Gated DeltaNet gated RMSNorm kernel", static_cast<const bf16*>(a.z), a.norm_w, n_items, a.v_dim, a.eps,
           static_cast<bf16*>(a.out));
}

}  // namespace

void gated_delta_net(const GatedDeltaNetArgs& a, const RowMap& rows, bf16* mixed, const LaunchContext& ctx) {
    if (rows.n_rows <= 0) return;
    const int K = a.conv_kernel;
    if (K < 1 || K > kMaxConvKernel)
        throw Error(Status::unsupported,
                    "CUDA Gated DeltaNet: conv kernel " + std::to_string(K) + " (1 to 16 supported)");
    if (a.n_k_heads <= 0 || a.n_v_heads % a.n_k_heads != 0)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: value heads must be a multiple of key heads");
    if (a.v_dim <= 0 || a.v_dim % 32 != 0 || a.v_dim > kMaxValueDim)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: value head dim " + std::to_string(a.v_dim) +
                                             " is not a multiple of 32 up to " + std::to_string(kMaxValueDim));
    if (a.k_dim != 32 && a.k_dim != 64 && a.k_dim != 128)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: key head dim " + std::to_string(a.k_dim) +
                                             " is not built (32, 64 and 128 are)");
    // The recurrence kernels read mixed with 8- and 16-byte loads (rows of C, a multiple of 32, bf16 values).
    if ((reinterpret_cast<uintptr_t>(mixed) & 15u) != 0)
        throw Error(Status::internal, "CUDA Gated DeltaNet: scratch is not 16-byte aligned");
    const int64_t C = 2 * int64_t(a.n_k_heads) * a.k_dim + int64_t(a.n_v_heads) * a.v_dim;
    const bf16* qkv = static_cast<const bf16*>(a.qkv);
    bf16* conv_state = static_cast<bf16*>(a.conv_state);

    const bool one_token_runs = rows.n_rows == rows.n_runs;  // decode: the conv kernel updates the state itself
    // 8 channels per conv thread when the activations allow 16-byte accesses (C is a multiple of 32) and the step
    // has enough rows to fill the GPU that way; small decode steps take one channel per thread (8x the threads,
    // shorter per-thread chains; the same arithmetic per channel).
    const bool vec = ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(conv_state)) & 15u) == 0 &&
                     int64_t(rows.n_rows) * C >= int64_t(1) << 18;
    const int V = vec ? 8 : 1;
    // rows a conv thread takes (its weights loaded once for them): up to 16 (ctx.gdn_conv_rows) in prefill, so that a
    // 4,096-row step still has 256 row groups; 1 in decode (each row its own sequence, few rows)
    const int conv_rows_max = ctx.gdn_conv_rows > 0 ? ctx.gdn_conv_rows : 16;
    const int conv_rows = one_token_runs ? 1 : int(std::clamp<int64_t>(rows.n_rows / 256, 1, conv_rows_max));
    const dim3 conv_grid(ceil_div(C / V, kConvThreads),
                         unsigned(std::min<int64_t>(ceil_div(rows.n_rows, conv_rows), 65535)));
    // decode: the conv inside the recurrence kernel where it can be (see decode_kernel)
    const int ratio = a.n_v_heads / a.n_k_heads;
    const bool fused_conv = one_token_runs && rows.n_runs <= kFusedConvMaxRuns && ctx.gdn_fused_conv &&
                            K == kFusedConvTaps && ratio <= kMaxClusterHeads &&
                            2 * a.k_dim + a.v_dim <= kFusedConvPer * 2 * a.v_dim &&
                            (reinterpret_cast<uintptr_t>(a.conv_w) & 15u) == 0 &&  // (4 taps as one float4)
                            (ratio == 1 || ctx.clusters);
    if (!fused_conv) {
        launch(vec ? conv_kernel<8> : conv_kernel<1>, conv_grid, dim3(kConvThreads), 0, ctx,
               "Gated DeltaNet conv kernel", qkv, a.conv_w, conv_state, rows, C, K, one_token_runs, conv_rows, mixed);
        if (K > 1 && !one_token_runs) {
            const dim3 grid(ceil_div(C / V, kConvThreads), unsigned(std::min(rows.n_runs, 65535)));
            launch(vec ? conv_state_kernel<8> : conv_state_kernel<1>, grid, dim3(kConvThreads), 0, ctx,
                   "Gated DeltaNet conv state kernel", qkv, conv_state, rows, C, K);
        }
    }
    switch (a.k_dim) {
        case 32: launch_recurrence<32>(a, rows, mixed, one_token_runs, fused_conv, ctx); break;
        case 64: launch_recurrence<64>(a, rows, mixed, one_token_runs, fused_conv, ctx); break;
        default: launch_recurrence<128>(a, rows, mixed, one_token_runs, fused_conv, ctx); break;
    }
}

HY_CUDA_TRACE_BINDER(gated_delta_net)

}  // namespace hy::cuda
