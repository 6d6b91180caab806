#include "kernels/cuda/fp8_matmul.cuh"

#include "kernels/cuda/fp8_convert.cuh"

#include <algorithm>
#include <string>

namespace hy::cuda {

namespace {

// Four e4m3 codes (bytes b0..b3 of w) as two bf16x2 registers {b0, b1} and {b2, b3} holding value * 2^-120, by
// moving bits (no conversion instructions): the sign stays on top, the 7 exponent and mantissa bits go under bf16's
// 8-bit exponent (bias 127 against e4m3's 7), so every code, subnormals included, maps exactly (e4m3 subnormals
// become bf16 subnormals). The NaN codes (0x7f, 0xff) do not map to NaN: e4m3_nan_bits() tells them apart.
__device__ __forceinline__ void e4m3x4_to_bf16x2_scaled(uint32_t w, uint32_t& lo, uint32_t& hi) {
    const uint32_t x = __byte_perm(w, 0u, 0x1404), y = __byte_perm(w, 0u, 0x3424);  // each byte << 8 in its half
    lo = (x & 0x80008000u) | ((x >> 4) & 0x07f007f0u);
    hi = (y & 0x80008000u) | ((y >> 4) & 0x07f007f0u);
}
// Bits 0x80 of a byte are set where a code of w is an e4m3 NaN (0x7f or 0xff): (w & 0x7f..) + 0x01.. carries into
// bit 7 exactly for 0x7f.
__device__ __forceinline__ uint32_t e4m3_nan_bits(uint32_t w) {
    return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

__device__ __forceinline__ int64_t scale_cols(int K) { return (K + kFp8Block - 1) / kFp8Block; }

// ---- the CUDA-core GEMV (1-2 rows, 1-4 rows per warp) ----
// As matmul.cu's decode GEMV, with 16-byte words of 16 fp8 weights: kSplit warps share a row (lane l of part q reads
// the words l + 32 q, l + 32 q + 32 kSplit, ...), a lane holds kPer words per row per round, the first round is
// loaded before the PDL wait. A word lies in one 128-column block: its 16 products are summed, then multiplied by
// the block's scale and added to the lane's sum; lanes and parts are summed in a fixed order (the launch shape
// depends on K alone), so an output does not depend on the group or the batch.
template <int NT, int kPer, int kR, bool kE5M2>
__device__ __forceinline__ void fp8_rows_dot(const uint8_t* const (&w_row)[kR], const float* const (&s_row)[kR],
                                             bool valid, const bf16* __restrict__ x, int K, int first, int step,
                                             float (&acc)[kR][NT], uint64_t pol) {
    const int K16 = K / 16;
    uint4 wv[kR][kPer];
    auto load = [&](int base) {
#pragma unroll
        for (int r = 0; r < kR; r++)
#pragma unroll
            for (int u = 0; u < kPer; u++)
                if (base + step * u < K16)
                    wv[r][u] = ld_weight(reinterpret_cast<const uint4*>(w_row[r]) + base + step * u, pol);
    };
    if (valid) load(first);
    pdl_wait();
#pragma unroll
    for (int r = 0; r < kR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if (!valid) return;
    for (int base = first;;) {
#pragma unroll
        for (int u = 0; u < kPer; u++) {
            const int word = base + step * u;
            if (word >= K16) break;
            float wf[kR][16], sc[kR];
#pragma unroll
            for (int r = 0; r < kR; r++) {
                unpack16<kE5M2>(wv[r][u], wf[r]);
                sc[r] = __ldg(s_row[r] + word / 8);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const uint4* xw = reinterpret_cast<const uint4*>(x + int64_t(t) * K) + 2 * word;
                float xf[16];
                unpack8(__ldg(xw), xf);
                unpack8(__ldg(xw + 1), xf + 8);
#pragma unroll
                for (int r = 0; r < kR; r++) {
                    float p = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; e++) p = fmaf(wf[r][e], xf[e], p);
                    acc[r][t] = fmaf(p, sc[r], acc[r][t]);
                }
            }
        }
        base += step * kPer;
        if (base >= K16) break;
        load(base);
    }
}

struct Fp8Member {
    const uint8_t* w;
    const float* scales;
    void* y;
    int n, segment_rows, first_block;
};

// The member of the group block blockIdx.x works on (constant indices: see matmul.cu's group_member).
__device__ __forceinline__ Fp8Member fp8_member(const Fp8Group& g) {
    Fp8Member m{g.w[0], g.scales[0], g.y[0], g.n[0], g.segment_rows[0], 0};
#pragma unroll
    for (int j = 1; j < Fp8Group::kMax; j++)
        if (j < g.count && int(blockIdx.x) >= g.block_end[j - 1])
            m = Fp8Member{g.w[j], g.scales[j], g.y[j], g.n[j], g.segment_rows[j], g.block_end[j - 1]};
    return m;
}

// kR consecutive rows per group of kSplit warps: each word of x is unpacked once for the kR rows (the rows past the
// member's end read its last row again and store nothing).
template <int NT, int kSplit, int kPer, int kR, bool kE5M2>
__global__ void __launch_bounds__(gemv_block_warps<kSplit>() * 32)
    gemv_fp8_kernel(const bf16* __restrict__ x, const __grid_constant__ Fp8Group g, int K) {
    constexpr int kRows = gemv_block_warps<kSplit>() / kSplit * kR;
    __shared__ float part[gemv_block_warps<kSplit>()][kR * NT];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const Fp8Member m = fp8_member(g);
    const int n0 = (int(blockIdx.x) - m.first_block) * kRows + warp / kSplit * kR;
    const bool valid = n0 < m.n;
    const uint8_t* w_row[kR];
    const float* s_row[kR];
#pragma unroll
    for (int r = 0; r < kR; r++) {
        const int nr = !valid ? 0 : n0 + r < m.n ? n0 + r : m.n - 1;
        w_row[r] = m.w + int64_t(nr) * K;
        s_row[r] = m.scales + fp8_scale_row(nr, m.segment_rows) * scale_cols(K);
    }
    float acc[kR][NT];
    fp8_rows_dot<NT, kPer, kR, kE5M2>(w_row, s_row, valid, x, K, lane + 32 * (warp % kSplit), 32 * kSplit, acc,
                                      weight_policy(g.evict_first));
    if (!reduce_parts<kR * NT, kSplit>(&acc[0][0], part) || !valid || lane != 0) return;
    bf16* y = static_cast<bf16*>(m.y);
#pragma unroll
    for (int r = 0; r < kR; r++)
        if (n0 + r < m.n)
#pragma unroll
            for (int t = 0; t < NT; t++) y[int64_t(t) * m.n + n0 + r] = to_bf16(acc[r][t]);
}

// Gate and up rows of feature n by the same kSplit warps, then the activation (as matmul.cu's gate/up kernel).
template <int NT, int kSplit, int kPer, bool kE5M2>
__global__ void __launch_bounds__(gemv_block_warps<kSplit>() * 32)
    gemv_fp8_gate_up_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ wg, const float* __restrict__ sg,
                            const uint8_t* __restrict__ wu, const float* __restrict__ su, int segment_rows,
                            bf16* gate_out, bf16* up_out, bf16* act_out, int N, int K, bool evict_first) {
    constexpr int kRows = gemv_block_warps<kSplit>() / kSplit;
    __shared__ float part[gemv_block_warps<kSplit>()][2 * NT];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * kRows + warp / kSplit;
    const bool valid = n < N;
    const int nr = valid ? n : 0;
    const int64_t srow = fp8_scale_row(nr, segment_rows) * scale_cols(K);
    const uint8_t* const w_row[2] = {wg + int64_t(nr) * K, wu + int64_t(nr) * K};
    const float* const s_row[2] = {sg + srow, su + srow};
    float acc[2][NT];
    fp8_rows_dot<NT, kPer, 2, kE5M2>(w_row, s_row, valid, x, K, lane + 32 * (warp % kSplit), 32 * kSplit, acc,
                                     weight_policy(evict_first));
    if (!reduce_parts<2 * NT, kSplit>(&acc[0][0], part) || !valid || lane != 0) return;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float gv = round_bf16(acc[0][t]), uv = round_bf16(acc[1][t]);
        const int64_t o = int64_t(t) * N + n;
        up_out[o] = to_bf16(uv);
        if (act_out != gate_out) gate_out[o] = to_bf16(gv);
        act_out[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
    }
}

// fp8_matmul.cuh, gemv_fp8_expert_gate_up: gemv_fp8_gate_up_kernel's loop over one choice's expert (blockIdx.y),
// as matmul.cu's gemv_expert_gate_up_kernel: the shared expert's blocks first (their weights loaded before the
// PDL wait), then each routed choice's (after it: the ids come from the top-k kernel). Feature Is of a shared
// block is the shared expert's gate (a bf16 vector): its warps sum their words of x . gate after fp8_rows_dot
// (which loads nothing for it).
template <int kSplit, int kPer, bool kE5M2>
__global__ void __launch_bounds__(gemv_block_warps<kSplit>() * 32)
    gemv_fp8_expert_gate_up_kernel(const __grid_constant__ ExpertGateUpArgs a) {
    constexpr int kWarps = gemv_block_warps<kSplit>(), kRows = kWarps / kSplit;
    __shared__ float part[kWarps][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = int(blockIdx.x) * kRows + warp / kSplit;
    const int64_t n_shared = a.Is > 0 ? a.rows : 0;
    const bool shared = int64_t(blockIdx.y) < n_shared;
    const int64_t n = int64_t(blockIdx.y) - n_shared;  // the routed choice t k + j
    const int H = a.H;
    const int64_t sc = scale_cols(H);
    const uint8_t* wg = nullptr;
    const uint8_t* wu = nullptr;
    const float* sg = nullptr;
    const float* su = nullptr;
    int64_t t = 0;
    if (shared) {
        t = blockIdx.y;
        if (i < a.Is) {
            wg = static_cast<const uint8_t*>(a.shared_gate_proj) + int64_t(i) * H;
            wu = static_cast<const uint8_t*>(a.shared_up_proj) + int64_t(i) * H;
            sg = a.shared_gate_scales + fp8_scale_row(i, 0) * sc;
            su = a.shared_up_scales + fp8_scale_row(i, 0) * sc;
        }
    } else {
        pdl_wait();     // the routing comes from the top-k kernel
        pdl_trigger();  // (after the wait: the down kernel reads the routing before its own wait)
        t = n / a.k;
        const int e = a.ids[n];
        if (i < a.I && e >= 0 && e < a.E) {
            const int64_t rg = int64_t(e) * 2 * a.I + i, ru = rg + a.I;
            wg = static_cast<const uint8_t*>(a.gate_up) + rg * H;
            wu = static_cast<const uint8_t*>(a.gate_up) + ru * H;
            sg = a.gate_up_scales + fp8_scale_row(rg, a.segment_rows) * sc;
            su = a.gate_up_scales + fp8_scale_row(ru, a.segment_rows) * sc;
        }
    }
    const bool valid = wg != nullptr;
    const uint8_t* const w_row[2] = {wg, wu};
    const float* const s_row[2] = {sg, su};
    const int first = lane + 32 * (warp % kSplit), step = 32 * kSplit;
    const bf16* xt = a.x + t * H;
    float acc[2][1];
    fp8_rows_dot<1, kPer, 2, kE5M2>(w_row, s_row, valid, xt, H, first, step, acc, weight_policy(a.evict_first));
    if (shared && i == a.Is) {  // the shared expert's gate: this warp's 8-value words of x . gate
        const uint4* g4 = reinterpret_cast<const uint4*>(a.shared_gate);
        const uint4* x4 = reinterpret_cast<const uint4*>(xt);
        for (int w = first; w < H / 8; w += step) {
            float gf[8], xf[8];
            unpack8(__ldg(g4 + w), gf);
            unpack8(__ldg(x4 + w), xf);
#pragma unroll
            for (int c = 0; c < 8; c++) acc[0][0] = fmaf(gf[c], xf[c], acc[0][0]);
        }
    }
    if (shared) pdl_trigger();
    if (!reduce_parts<2, kSplit>(&acc[0][0], part) || lane != 0) return;
    const float g = round_bf16(acc[0][0]), u = round_bf16(acc[1][0]);
    if (!shared) {
        if (i < a.I) a.act[n * a.I + i] = to_bf16(round_bf16(siluf_(g)) * u);
    } else if (i < a.Is) {
        a.shared_act[t * a.Is + i] = to_bf16(round_bf16(siluf_(g)) * u);
    } else if (i == a.Is) {
        a.shared_gate_out[t] = round_bf16(1.0f / (1.0f + expf(-g)));
    }
}

template <int kSplit, int kPer, bool kE5M2>
void fp8_expert_gate_up_launch(const ExpertGateUpArgs& a, const LaunchContext& ctx) {
    constexpr int kRows = gemv_block_warps<kSplit>() / kSplit;
    const int cols = a.Is > 0 ? std::max(a.I, a.Is + 1) : a.I;
    const int64_t choices = a.rows * a.k + (a.Is > 0 ? a.rows : 0);
    launch(gemv_fp8_expert_gate_up_kernel<kSplit, kPer, kE5M2>,
           dim3(unsigned(ceil_div(cols, kRows)), unsigned(choices)), gemv_block_warps<kSplit>() * 32, 0, ctx,
           "MoE FP8 gate/up GEMV kernel", a);
}

template <int NT, int kSplit, int kPer, int kR, bool kE5M2>
void gemv_fp8_launch(const bf16* x, Fp8Group g, int64_t K, const LaunchContext& ctx) {
    constexpr int kWarps = gemv_block_warps<kSplit>(), kRows = kWarps / kSplit * kR;
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + kRows - 1) / kRows;
    g.evict_first = ctx.evict_first;
    launch(gemv_fp8_kernel<NT, kSplit, kPer, kR, kE5M2>, unsigned(g.block_end[g.count - 1]), kWarps * 32, 0, ctx,
           "FP8 gemv kernel", x, g, int(K));
}

template <int NT, bool kE5M2>
void gemv_fp8_shape(const bf16* x, const Fp8Group& g, int64_t K, Fp8GemvConfig c, const LaunchContext& ctx) {
    switch (c.rows * 1000 + c.split * 100 + c.per) {
        case 1108: return gemv_fp8_launch<NT, 1, 8, 1, kE5M2>(x, g, K, ctx);
        case 1204: return gemv_fp8_launch<NT, 2, 4, 1, kE5M2>(x, g, K, ctx);
        case 1208: return gemv_fp8_launch<NT, 2, 8, 1, kE5M2>(x, g, K, ctx);
        case 1404: return gemv_fp8_launch<NT, 4, 4, 1, kE5M2>(x, g, K, ctx);
        case 1408: return gemv_fp8_launch<NT, 4, 8, 1, kE5M2>(x, g, K, ctx);
        case 1804: return gemv_fp8_launch<NT, 8, 4, 1, kE5M2>(x, g, K, ctx);
        case 1808: return gemv_fp8_launch<NT, 8, 8, 1, kE5M2>(x, g, K, ctx);
        case 2104: return gemv_fp8_launch<NT, 1, 4, 2, kE5M2>(x, g, K, ctx);
        case 2108: return gemv_fp8_launch<NT, 1, 8, 2, kE5M2>(x, g, K, ctx);
        case 2204: return gemv_fp8_launch<NT, 2, 4, 2, kE5M2>(x, g, K, ctx);
        case 2404: return gemv_fp8_launch<NT, 4, 4, 2, kE5M2>(x, g, K, ctx);
        case 4104: return gemv_fp8_launch<NT, 1, 4, 4, kE5M2>(x, g, K, ctx);
        case 4204: return gemv_fp8_launch<NT, 2, 4, 4, kE5M2>(x, g, K, ctx);
        default:
            throw Error(Status::internal, "FP8 gemv: no kernel for split " + std::to_string(c.split) + ", " +
                                              std::to_string(c.per) + " words per lane, " + std::to_string(c.rows) +
                                              " rows per warp");
    }
}

template <int NT, int kSplit, int kPer, bool kE5M2>
void gate_up_fp8_launch(const bf16* x, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out, bf16* act_out,
                        const LaunchContext& ctx) {
    constexpr int kWarps = gemv_block_warps<kSplit>(), kRows = kWarps / kSplit;
    launch(gemv_fp8_gate_up_kernel<NT, kSplit, kPer, kE5M2>, ceil_div(wg.rows, kRows), kWarps * 32, 0, ctx,
           "FP8 gemv gate/up/SiLU kernel", x, static_cast<const uint8_t*>(wg.data), wg.scales,
           static_cast<const uint8_t*>(wu.data), wu.scales, int(wg.scale_segment_rows), gate_out, up_out, act_out,
           int(wg.rows), int(wg.cols), ctx.evict_first);
}

template <int NT, bool kE5M2>
void gate_up_fp8_shape(const bf16* x, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out, bf16* act_out,
                       Fp8GemvConfig c, const LaunchContext& ctx) {
    switch (c.split * 100 + c.per) {
        case 104: return gate_up_fp8_launch<NT, 1, 4, kE5M2>(x, wg, wu, gate_out, up_out, act_out, ctx);
        case 108: return gate_up_fp8_launch<NT, 1, 8, kE5M2>(x, wg, wu, gate_out, up_out, act_out, ctx);
        case 204: return gate_up_fp8_launch<NT, 2, 4, kE5M2>(x, wg, wu, gate_out, up_out, act_out, ctx);
        case 404: return gate_up_fp8_launch<NT, 4, 4, kE5M2>(x, wg, wu, gate_out, up_out, act_out, ctx);
        case 804: return gate_up_fp8_launch<NT, 8, 4, kE5M2>(x, wg, wu, gate_out, up_out, act_out, ctx);
        default:
            throw Error(Status::internal, "FP8 gemv gate/up: no kernel for split " + std::to_string(c.split) + ", " +
                                              std::to_string(c.per) + " words per lane");
    }
}

// ---- the streaming GEMV (1 row of x) ----
// The block converts x [K] once into shared memory as f32, permuted so that the 16 values of word j are 4 float4
// at xs[v * K16 + j] (v = 0..3: a warp's lanes read consecutive float4, no bank conflicts). Its 8 warps form
// kGroups = 8 / kSplit row groups; group r takes the rows first + r, first + r + kGroups, ... (kR of them) and its
// kSplit warps share each row's words (lane l of warp q: words l + 32 q + 32 kSplit u, u < kW); the next row's words
// are loaded while the current row is summed, the first row's before the PDL wait. A word's 16 products are summed,
// then multiplied by the block's scale (as fp8_rows_dot); lanes and warps are summed in a fixed order.
template <int kW, int kSplit, int kR, bool kE5M2>
__global__ void __launch_bounds__(256)
    gemv_fp8_stream_kernel(const bf16* __restrict__ x, const __grid_constant__ Fp8Group g, int K) {
    constexpr int kGroups = 8 / kSplit;
    extern __shared__ float4 xs[];  // [4][K / 16]
    __shared__ float part[8][kR];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = warp % kSplit;
    const Fp8Member m = fp8_member(g);
    const int K16 = K / 16;
    const int first = (int(blockIdx.x) - m.first_block) * kGroups * kR + warp / kSplit;
    const uint64_t pol = weight_policy(g.evict_first);
    const int j0 = lane + 32 * q;
    uint4 wv[2][kW];
    auto load = [&](uint4(&buf)[kW], int n) {
        const uint4* row = reinterpret_cast<const uint4*>(m.w + int64_t(n) * K);
#pragma unroll
        for (int u = 0; u < kW; u++)
            if (j0 + 32 * kSplit * u < K16) buf[u] = ld_weight(row + j0 + 32 * kSplit * u, pol);
    };
    if (first < m.n) load(wv[0], first);
    pdl_wait();
    for (int j = threadIdx.x; j < K16; j += 256) {
        const uint4* xw = reinterpret_cast<const uint4*>(x) + 2 * j;
        float f[16];
        unpack8(__ldg(xw), f);
        unpack8(__ldg(xw + 1), f + 8);
#pragma unroll
        for (int v = 0; v < 4; v++) xs[v * K16 + j] = make_float4(f[4 * v], f[4 * v + 1], f[4 * v + 2], f[4 * v + 3]);
    }
    __syncthreads();
    float acc[kR];
#pragma unroll
    for (int i = 0; i < kR; i++) {
        const int n = first + i * kGroups;
        acc[i] = 0.0f;
        if (n >= m.n) continue;  // (the same for the whole group)
        if (i + 1 < kR && n + kGroups < m.n) load(wv[(i + 1) & 1], n + kGroups);
        const float* s_row = m.scales + fp8_scale_row(n, m.segment_rows) * scale_cols(K);
#pragma unroll
        for (int u = 0; u < kW; u++) {
            const int j = j0 + 32 * kSplit * u;
            if (j >= K16) break;
            float wf[16];
            unpack16<kE5M2>(wv[i & 1][u], wf);
            float p = 0.0f;
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const float4 xv = xs[v * K16 + j];
                p = fmaf(wf[4 * v], xv.x, p);
                p = fmaf(wf[4 * v + 1], xv.y, p);
                p = fmaf(wf[4 * v + 2], xv.z, p);
                p = fmaf(wf[4 * v + 3], xv.w, p);
            }
            acc[i] = fmaf(p, __ldg(s_row + j / 8), acc[i]);
        }
    }
    if (!reduce_parts<kR, kSplit>(acc, part) || lane != 0) return;
    bf16* y = static_cast<bf16*>(m.y);
#pragma unroll
    for (int i = 0; i < kR; i++)
        if (first + i * kGroups < m.n) y[first + i * kGroups] = to_bf16(acc[i]);
}

template <int kW, int kSplit, int kR, bool kE5M2>
void gemv_fp8_stream_launch(const bf16* x, Fp8Group g, int64_t K, const LaunchContext& ctx) {
    constexpr int kRows = 8 / kSplit * kR;
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + kRows - 1) / kRows;
    g.evict_first = ctx.evict_first;
    launch(gemv_fp8_stream_kernel<kW, kSplit, kR, kE5M2>, unsigned(g.block_end[g.count - 1]), 256,
           size_t(K) * sizeof(float), ctx, "FP8 gemv kernel (streaming)", x, g, int(K));
}

template <int kW, bool kE5M2>
void gemv_fp8_stream_rows(const bf16* x, const Fp8Group& g, int64_t K, Fp8GemvConfig c, const LaunchContext& ctx) {
    switch (c.split * 10 + c.rows) {
        case 12: return gemv_fp8_stream_launch<kW, 1, 2, kE5M2>(x, g, K, ctx);
        case 14: return gemv_fp8_stream_launch<kW, 1, 4, kE5M2>(x, g, K, ctx);
        case 22: return gemv_fp8_stream_launch<kW, 2, 2, kE5M2>(x, g, K, ctx);
        case 24: return gemv_fp8_stream_launch<kW, 2, 4, kE5M2>(x, g, K, ctx);
        case 42: return gemv_fp8_stream_launch<kW, 4, 2, kE5M2>(x, g, K, ctx);
        case 44: return gemv_fp8_stream_launch<kW, 4, 4, kE5M2>(x, g, K, ctx);
        default:
            throw Error(Status::internal, "FP8 streaming gemv: no kernel for split " + std::to_string(c.split) + ", " +
                                              std::to_string(c.rows) + " rows per group");
    }
}

template <bool kE5M2>
void gemv_fp8_stream(const bf16* x, const Fp8Group& g, int64_t K, Fp8GemvConfig c, const LaunchContext& ctx) {
    switch (fp8_stream_words(K, c.split)) {
        case 4: return gemv_fp8_stream_rows<4, kE5M2>(x, g, K, c, ctx);
        case 6: return gemv_fp8_stream_rows<6, kE5M2>(x, g, K, c, ctx);
        case 8: return gemv_fp8_stream_rows<8, kE5M2>(x, g, K, c, ctx);
        default:
            throw Error(Status::internal, "FP8 streaming gemv: K " + std::to_string(K) + " needs more than 8 words " +
                                              "per lane with " + std::to_string(c.split) + " warps per row");
    }
}

// ---- the tensor-core GEMV (3 to 8 rows) ----
// As matmul.cu's tensor-core GEMV: a warp owns a tile of 16 output features and every kMmaParts-th chunk of K, here
// chunks of 64 values. Lane (g = lane / 4, q = lane % 4) loads the 16 fp8 weights [16q, 16q + 16) of the chunk for
// rows g and g + 8 (one 16-byte word each) and the same 16 values of x row g (two words); mma j (0..3) takes the
// values 16q + 4j + {0, 1 | 2, 3} as k = {2q, 2q + 1 | 2q + 8, 2q + 9} of A and B alike (a consistent permutation of
// k). A chunk lies in one 128-column block and the tile in one block row (segments are multiples of 16 rows): its
// four products go to a zeroed fragment that is then scaled and added to the sums.
constexpr int kMmaParts = 8;

// The tile of 16 rows starting at row0 of kM matrices of N rows (same segments; w[i], sc[i] = the tile's scale row)
// against x: acc[i][0..3] of lane (gi, q) = rows row0 + gi (0, 1) and row0 + gi + 8 (2, 3), x rows 2q, 2q + 1, over
// this warp's chunks (warp, warp + kMmaParts, ...). Weights of the first round are loaded before the PDL wait.
template <int kMmaUnroll, bool kE5M2, bool kBits, int kM>
__device__ __forceinline__ void fp8_tile_dot(const bf16* __restrict__ x, int T, const uint8_t* const (&w)[kM],
                                             const float* const (&sc)[kM], int N, int row0, int K, bool evict_first,
                                             float (&acc)[kM][4]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
    const bool va = row0 + gi < N, vb = row0 + gi + 8 < N;
    const uint4* wa[kM];
    const uint4* wb[kM];
#pragma unroll
    for (int i = 0; i < kM; i++) {
        wa[i] = reinterpret_cast<const uint4*>(w[i] + int64_t(va ? row0 + gi : 0) * K) + q;
        wb[i] = reinterpret_cast<const uint4*>(w[i] + int64_t(vb ? row0 + gi + 8 : 0) * K) + q;
    }
    const uint4* xr = reinterpret_cast<const uint4*>(x + int64_t(gi < T ? gi : 0) * K) + 2 * q;
    const bool vx = gi < T;
    const int n_chunks = K / 64;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint64_t pol = weight_policy(evict_first);
    uint4 ra[kM][kMmaUnroll], rb[kM][kMmaUnroll];
    auto load_w = [&](int c0) {
#pragma unroll
        for (int i = 0; i < kM; i++)
#pragma unroll
            for (int u = 0; u < kMmaUnroll; u++) {
                const int c = c0 + kMmaParts * u;
                ra[i][u] = c < n_chunks && va ? ld_weight(wa[i] + 4 * c, pol) : zero;
                rb[i][u] = c < n_chunks && vb ? ld_weight(wb[i] + 4 * c, pol) : zero;
            }
    };
#pragma unroll
    for (int i = 0; i < kM; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.0f;
    uint32_t nan_a[kM] = {}, nan_b[kM] = {};  // (kBits) NaN codes met in rows gi, gi + 8
    load_w(warp);
    pdl_wait();
    for (int c0 = warp; c0 < n_chunks; c0 += kMmaParts * kMmaUnroll) {
        uint4 rx[kMmaUnroll][2];
#pragma unroll
        for (int u = 0; u < kMmaUnroll; u++) {
            const int c = c0 + kMmaParts * u;
            rx[u][0] = c < n_chunks && vx ? __ldg(xr + 8 * c) : zero;
            rx[u][1] = c < n_chunks && vx ? __ldg(xr + 8 * c + 1) : zero;
        }
        uint4 ca[kM][kMmaUnroll], cb[kM][kMmaUnroll];
#pragma unroll
        for (int i = 0; i < kM; i++)
#pragma unroll
            for (int u = 0; u < kMmaUnroll; u++) {
                ca[i][u] = ra[i][u];
                cb[i][u] = rb[i][u];
            }
        if (c0 + kMmaParts * kMmaUnroll < n_chunks) load_w(c0 + kMmaParts * kMmaUnroll);
#pragma unroll
        for (int u = 0; u < kMmaUnroll; u++) {
            const int c = c0 + kMmaParts * u;
            if (c >= n_chunks) break;
            const uint32_t xw[8] = {rx[u][0].x, rx[u][0].y, rx[u][0].z, rx[u][0].w,
                                    rx[u][1].x, rx[u][1].y, rx[u][1].z, rx[u][1].w};
#pragma unroll
            for (int i = 0; i < kM; i++) {
                const uint32_t wa4[4] = {ca[i][u].x, ca[i][u].y, ca[i][u].z, ca[i][u].w};
                const uint32_t wb4[4] = {cb[i][u].x, cb[i][u].y, cb[i][u].z, cb[i][u].w};
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    // weights 4j .. 4j + 3 of the lane's 16: the low and high halves of word j
                    uint32_t a0, a1, a2, a3;
                    if constexpr (kBits) {
                        e4m3x4_to_bf16x2_scaled(wa4[j], a0, a2);
                        e4m3x4_to_bf16x2_scaled(wb4[j], a1, a3);
                        nan_a[i] |= e4m3_nan_bits(wa4[j]);
                        nan_b[i] |= e4m3_nan_bits(wb4[j]);
                    } else {
                        a0 = fp8x2_to_bf16x2<kE5M2>(wa4[j]);
                        a2 = fp8x2_to_bf16x2<kE5M2>(wa4[j] >> 16);
                        a1 = fp8x2_to_bf16x2<kE5M2>(wb4[j]);
                        a3 = fp8x2_to_bf16x2<kE5M2>(wb4[j] >> 16);
                    }
                    mma_bf16_16816(part, a0, a1, a2, a3, xw[2 * j], xw[2 * j + 1]);
                }
                const float s = __ldg(sc[i] + c / 2);
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][e] = fmaf(part[e], s, acc[i][e]);
            }
        }
    }
    if constexpr (kBits) {
        // the quad of lanes gi holds all of rows gi and gi + 8: a NaN code in either makes its outputs NaN; the
        // scaled bf16 values carry 2^-120
#pragma unroll
        for (int i = 0; i < kM; i++) {
            nan_a[i] |= __shfl_xor_sync(0xffffffffu, nan_a[i], 1);
            nan_a[i] |= __shfl_xor_sync(0xffffffffu, nan_a[i], 2);
            nan_b[i] |= __shfl_xor_sync(0xffffffffu, nan_b[i], 1);
            nan_b[i] |= __shfl_xor_sync(0xffffffffu, nan_b[i], 2);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[i][e] *= 0x1p120f;
                if ((e < 2 ? nan_a[i] : nan_b[i]) != 0) acc[i][e] = __int_as_float(0x7fffffff);
            }
        }
    }
}

// Sums the kMmaParts warps' fragments (in warp order) into warp 0's acc; false in the other warps.
template <int kM>
__device__ __forceinline__ bool fp8_tile_reduce(float (&acc)[kM][4], float (*red)[32][4 * kM]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < kM; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][lane][4 * i + e] = acc[i][e];
    __syncthreads();
    if (warp != 0) return false;
#pragma unroll
    for (int i = 0; i < kM; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = red[0][lane][4 * i + e];
#pragma unroll
            for (int p = 1; p < kMmaParts; p++) v += red[p][lane][4 * i + e];
            acc[i][e] = v;
        }
    return true;
}

template <int kMmaUnroll, bool kE5M2, bool kBits>
__global__ void __launch_bounds__(kMmaParts * 32)
    gemv_fp8_mma_kernel(const bf16* __restrict__ x, int T, const __grid_constant__ Fp8Group g, int K) {
    __shared__ float red[kMmaParts][32][4];
    pdl_trigger();
    const int lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
    const Fp8Member m = fp8_member(g);
    const int N = m.n;
    const int row0 = (int(blockIdx.x) - m.first_block) * 16;
    const uint8_t* const w[1] = {m.w};
    const float* const sc[1] = {m.scales + fp8_scale_row(row0, m.segment_rows) * scale_cols(K)};
    float acc[1][4];
    fp8_tile_dot<kMmaUnroll, kE5M2, kBits, 1>(x, T, w, sc, N, row0, K, g.evict_first, acc);
    if (!fp8_tile_reduce<1>(acc, red)) return;
    bf16* y = static_cast<bf16*>(m.y);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int t = 2 * q + (e & 1), n = row0 + gi + (e >= 2 ? 8 : 0);
        if (t < T && n < N) y[int64_t(t) * N + n] = to_bf16(acc[0][e]);
    }
}

// Gate and up tiles of the same 16 features in one block, then the activation (as gemv_fp8_gate_up_kernel).
template <int kMmaUnroll, bool kE5M2, bool kBits>
__global__ void __launch_bounds__(kMmaParts * 32)
    gemv_fp8_mma_gate_up_kernel(const bf16* __restrict__ x, int T, const uint8_t* __restrict__ wg,
                                const float* __restrict__ sg, const uint8_t* __restrict__ wu,
                                const float* __restrict__ su, int segment_rows, bf16* gate_out, bf16* up_out,
                                bf16* act_out, int N, int K, bool evict_first) {
    __shared__ float red[kMmaParts][32][8];
    pdl_trigger();
    const int lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
    const int row0 = int(blockIdx.x) * 16;
    const int64_t srow = fp8_scale_row(row0, segment_rows) * scale_cols(K);
    const uint8_t* const w[2] = {wg, wu};
    const float* const sc[2] = {sg + srow, su + srow};
    float acc[2][4];
    fp8_tile_dot<kMmaUnroll, kE5M2, kBits, 2>(x, T, w, sc, N, row0, K, evict_first, acc);
    if (!fp8_tile_reduce<2>(acc, red)) return;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int t = 2 * q + (e & 1), n = row0 + gi + (e >= 2 ? 8 : 0);
        if (t >= T || n >= N) continue;
        const float gv = round_bf16(acc[0][e]), uv = round_bf16(acc[1][e]);
        const int64_t o = int64_t(t) * N + n;
        up_out[o] = to_bf16(uv);
        if (act_out != gate_out) gate_out[o] = to_bf16(gv);
        act_out[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
    }
}

template <int kMmaUnroll, bool kE5M2, bool kBits>
void gemv_fp8_mma_launch(const bf16* x, int64_t T, Fp8Group g, int64_t K, const LaunchContext& ctx) {
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + 15) / 16;
    g.evict_first = ctx.evict_first;
    launch(gemv_fp8_mma_kernel<kMmaUnroll, kE5M2, kBits>, unsigned(g.block_end[g.count - 1]), kMmaParts * 32, 0, ctx,
           "FP8 tensor-core gemv kernel", x, int(T), g, int(K));
}

template <bool kE5M2>
void gemv_fp8_mma(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, Fp8GemvConfig c, const LaunchContext& ctx) {
    if constexpr (!kE5M2) {  // (the bit conversion is e4m3's)
        if (c.bits && c.per == 2) return gemv_fp8_mma_launch<2, false, true>(x, T, g, K, ctx);
        if (c.bits && c.per == 4) return gemv_fp8_mma_launch<4, false, true>(x, T, g, K, ctx);
    }
    if (c.per == 2) return gemv_fp8_mma_launch<2, kE5M2, false>(x, T, g, K, ctx);
    if (c.per == 4) return gemv_fp8_mma_launch<4, kE5M2, false>(x, T, g, K, ctx);
    throw Error(Status::internal, "FP8 tensor-core gemv: no kernel for " + std::to_string(c.per) + " chunks in flight");
}

template <int kMmaUnroll, bool kE5M2, bool kBits>
void gate_up_fp8_mma_launch(const bf16* x, int64_t T, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out,
                            bf16* act_out, const LaunchContext& ctx) {
    launch(gemv_fp8_mma_gate_up_kernel<kMmaUnroll, kE5M2, kBits>, ceil_div(wg.rows, 16), kMmaParts * 32, 0, ctx,
           "FP8 tensor-core gemv gate/up/SiLU kernel", x, int(T), static_cast<const uint8_t*>(wg.data), wg.scales,
           static_cast<const uint8_t*>(wu.data), wu.scales, int(wg.scale_segment_rows), gate_out, up_out, act_out,
           int(wg.rows), int(wg.cols), ctx.evict_first);
}

// ---- more rows: dequantize, or quantize the activations ----
// One thread per 16-byte word of w: 16 weights times their block scale, as bf16.
template <bool kE5M2>
__global__ void dequantize_fp8_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scales, int segment_rows,
                                      int64_t rows, int K, bf16* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    const int64_t K16 = K / 16;
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * K16) return;
    const int64_t r = i / K16, word = i % K16;
    const float s = scales[fp8_scale_row(r, segment_rows) * scale_cols(K) + word / 8];
    float f[16];
    unpack16<kE5M2>(reinterpret_cast<const uint4*>(w)[i], f);
#pragma unroll
    for (int e = 0; e < 16; e++) f[e] *= s;
    uint4* o = reinterpret_cast<uint4*>(out) + 2 * i;
    o[0] = pack8(f);
    o[1] = pack8(f + 8);
}

// Any K: one thread per weight.
template <bool kE5M2>
__global__ void dequantize_fp8_any_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scales,
                                          int segment_rows, int64_t rows, int K, bf16* __restrict__ out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * K) return;
    const int64_t r = i / K, c = i % K;
    const float s = scales[fp8_scale_row(r, segment_rows) * scale_cols(K) + c / kFp8Block];
    out[i] = to_bf16(fp8x2_to_f32<kE5M2>(w[i]).x * s);
}

// One warp per (row, 128-value group): 4 values per lane.
__global__ void quantize_rows_fp8_kernel(const bf16* __restrict__ x, int64_t T, int K, uint8_t* __restrict__ q,
                                         float* __restrict__ s) {
    pdl_trigger();
    pdl_wait();
    const int groups = K / 128;
    const int64_t gi = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gi >= T * groups) return;
    const int64_t t = gi / groups, grp = gi % groups;
    const bf16* xp = x + t * K + grp * 128 + lane * 4;
    const uint2 raw = *reinterpret_cast<const uint2*>(xp);
    const __nv_bfloat162 b0 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 b1 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    const float v[4] = {__low2float(b0), __high2float(b0), __low2float(b1), __high2float(b1)};
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const float inv = 1.0f / scale;
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE, __NV_E4M3);
    reinterpret_cast<uint32_t*>(q + t * K + grp * 128)[lane] = uint32_t(lo) | (uint32_t(hi) << 16);
    if (lane == 0) s[grp * T + t] = scale;  // (cuBLASLt's VEC128 scales: the rows contiguous)
}

}  // namespace

// kW of the streaming kernel: the words per lane and row, rounded up to 4, 6 or 8.
int fp8_stream_words(int64_t K, int split) {
    const int64_t need = (K / 16 + 32 * split - 1) / (32 * split);
    return need <= 4 ? 4 : need <= 6 ? 6 : need <= 8 ? 8 : 0;
}

bool fp8_gemv_fits(const bf16* x, int64_t T, const Matrix& w) {
    if (!is_fp8(w.dtype) || !w.scales || T < 1 || T > kGemvMaxTokens) return false;
    const int64_t K = w.cols;
    if (K % (fp8_gemv_config(K, T).tensor_cores ? 64 : 16) != 0 || K > (int64_t(1) << 30) ||
        w.rows > (int64_t(1) << 30))
        return false;
    return w.scale_segment_rows % 16 == 0 && aligned16(x) && aligned16(w.data);
}

// Launch shapes (hybrid-kernel-bench T fp8 measures them; run 104, BENCHMARKS.md "FP8 weights on the GPU"). One row:
// up to K 2560 the streaming kernel with 1 warp per row and 4 rows per warp (in_proj 3,037 GB/s against 2,495 for
// the best one-row-per-warp shape), beyond it CUDA cores with 2 warps per row, 4 words per lane and 4 rows (o_proj
// 2,401 against 1,999; down_proj 2,848 against 2,210). Two rows: tensor cores up to K 2560 (mma-cvt/2), CUDA cores
// with 1 warp, 8 words and 2 rows beyond (o_proj 1,824 against 1,608). 3-8 rows: tensor cores with conversion
// instructions (they beat the bit moves on every shape: in_proj 2,487 against 2,057 GB/s at 6 rows), 2 chunks in
// flight up to K 2560, 4 beyond. (2 rows of a K that is not a multiple of 64: CUDA cores, 2 warps of 4 words.)
Fp8GemvConfig fp8_gemv_config(int64_t K, int64_t T) {
    if (T > 2) return {true, 0, K > 2560 ? 4 : 2, false};
    if (T == 2) {
        if (K > 2560) return {false, 1, 8, false, 2};
        return K % 64 == 0 ? Fp8GemvConfig{true, 0, 2, false} : Fp8GemvConfig{false, 2, 4};
    }
    if (K <= 2560 && fp8_stream_words(K, 1) != 0) return {false, 1, 0, false, 4, true};
    return {false, 2, 4, false, 4};
}

// The fused gate/up/SiLU GEMV: one row on CUDA cores (gate and up rows by the same warp), 2-8 rows as the GEMVs.
bool gemv_fp8_expert_gate_up_fits(const ExpertGateUpArgs& a) {
    auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    const bool shared_ok = a.Is == 0 || (a16(a.shared_gate_proj) && a16(a.shared_up_proj) && a16(a.shared_gate) &&
                                         a.shared_gate_scales && a.shared_up_scales);
    return a.rows >= 1 && a.k >= 1 && a.I >= 1 && a.H % 16 == 0 && a.H <= (1 << 24) && a16(a.x) && a16(a.gate_up) &&
           a.gate_up_scales && shared_ok && a.rows * a.k + a.rows <= 65535;
}

void gemv_fp8_expert_gate_up(ExpertGateUpArgs a, bool e5m2, const LaunchContext& ctx) {
    if (!gemv_fp8_expert_gate_up_fits(a))
        throw Error(Status::internal, "MoE FP8 gate/up GEMV: shape or alignment not taken");
    a.evict_first = ctx.evict_first;
    // one warp a feature, the row in one round of 4 words a lane up to H = 2048 (35B-A3B), of 8 up to 4096
    if (a.H <= 2048)
        return e5m2 ? fp8_expert_gate_up_launch<1, 4, true>(a, ctx) : fp8_expert_gate_up_launch<1, 4, false>(a, ctx);
    if (a.H <= 4096)
        return e5m2 ? fp8_expert_gate_up_launch<1, 8, true>(a, ctx) : fp8_expert_gate_up_launch<1, 8, false>(a, ctx);
    e5m2 ? fp8_expert_gate_up_launch<2, 8, true>(a, ctx) : fp8_expert_gate_up_launch<2, 8, false>(a, ctx);
}

Fp8GemvConfig fp8_gate_up_config(int64_t K, int64_t T) {
    if (T >= 2) return fp8_gemv_config(K, T);
    return K <= 4096 ? Fp8GemvConfig{false, 1, 8} : Fp8GemvConfig{false, 4, 4};
}

void gemv_fp8_group(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, const LaunchContext& ctx) {
    gemv_fp8_group_with(x, T, g, K, dtype, fp8_gemv_config(K, T), ctx);
}

void gemv_fp8_group_with(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, Fp8GemvConfig c,
                         const LaunchContext& ctx) {
    if (g.count < 1 || g.count > Fp8Group::kMax) throw Error(Status::internal, "FP8 gemv: bad group");
    const bool e5m2 = dtype == DType::F8_E5M2;
    if (c.tensor_cores) {
        if (T < 1 || T > kGemvMaxTokens || K % 64 != 0)
            throw Error(Status::internal,
                        "FP8 gemv: " + std::to_string(T) + " rows of " + std::to_string(K) + " values");
        return e5m2 ? gemv_fp8_mma<true>(x, T, g, K, c, ctx) : gemv_fp8_mma<false>(x, T, g, K, c, ctx);
    }
    if (c.stream) {
        if (T != 1 || K % 16 != 0 || K * 4 > kFp8StreamMaxSmem)
            throw Error(Status::internal,
                        "FP8 streaming gemv: " + std::to_string(T) + " rows of " + std::to_string(K) + " values");
        return e5m2 ? gemv_fp8_stream<true>(x, g, K, c, ctx) : gemv_fp8_stream<false>(x, g, K, c, ctx);
    }
    switch (T * 2 + (e5m2 ? 1 : 0)) {
        case 2: return gemv_fp8_shape<1, false>(x, g, K, c, ctx);
        case 3: return gemv_fp8_shape<1, true>(x, g, K, c, ctx);
        case 4: return gemv_fp8_shape<2, false>(x, g, K, c, ctx);
        case 5: return gemv_fp8_shape<2, true>(x, g, K, c, ctx);
        default: throw Error(Status::internal, "FP8 gemv: " + std::to_string(T) + " rows on CUDA cores (at most 2)");
    }
}

void gemv_fp8_gate_up(const bf16* x, int64_t T, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out,
                      bf16* act_out, const LaunchContext& ctx) {
    gemv_fp8_gate_up_with(x, T, wg, wu, gate_out, up_out, act_out, fp8_gate_up_config(wg.cols, T), ctx);
}

void gemv_fp8_gate_up_with(const bf16* x, int64_t T, const Matrix& wg, const Matrix& wu, bf16* gate_out, bf16* up_out,
                           bf16* act_out, Fp8GemvConfig c, const LaunchContext& ctx) {
    if (wg.rows != wu.rows || wg.cols != wu.cols || wg.dtype != wu.dtype ||
        wg.scale_segment_rows != wu.scale_segment_rows)
        throw Error(Status::internal, "FP8 gemv gate/up: the gate and up matrices differ in shape or format");
    const bool e5m2 = wg.dtype == DType::F8_E5M2;
    if (c.tensor_cores) {
        if (T < 1 || T > kGemvMaxTokens || wg.cols % 64 != 0)
            throw Error(Status::internal,
                        "FP8 gemv gate/up: " + std::to_string(T) + " rows of " + std::to_string(wg.cols) + " values");
        const int v = (e5m2 ? 100 : 0) + (c.bits && !e5m2 ? 10 : 0) + c.per;
        switch (v) {
            case 2: return gate_up_fp8_mma_launch<2, false, false>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            case 4: return gate_up_fp8_mma_launch<4, false, false>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            case 12: return gate_up_fp8_mma_launch<2, false, true>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            case 14: return gate_up_fp8_mma_launch<4, false, true>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            case 102: return gate_up_fp8_mma_launch<2, true, false>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            case 104: return gate_up_fp8_mma_launch<4, true, false>(x, T, wg, wu, gate_out, up_out, act_out, ctx);
            default: throw Error(Status::internal, "FP8 gemv gate/up: no tensor-core kernel for this shape");
        }
    }
    switch (T * 2 + (e5m2 ? 1 : 0)) {
        case 2: return gate_up_fp8_shape<1, false>(x, wg, wu, gate_out, up_out, act_out, c, ctx);
        case 3: return gate_up_fp8_shape<1, true>(x, wg, wu, gate_out, up_out, act_out, c, ctx);
        case 4: return gate_up_fp8_shape<2, false>(x, wg, wu, gate_out, up_out, act_out, c, ctx);
        case 5: return gate_up_fp8_shape<2, true>(x, wg, wu, gate_out, up_out, act_out, c, ctx);
        default:
            throw Error(Status::internal, "FP8 gemv gate/up: " + std::to_string(T) + " rows on CUDA cores (at most 2)");
    }
}

void dequantize_fp8(const Matrix& w, bf16* out, const LaunchContext& ctx) {
    const int threads = 256;
    const auto* d = static_cast<const uint8_t*>(w.data);
    const bool e5m2 = w.dtype == DType::F8_E5M2;
    const char* what = "FP8 dequantize kernel";
    const int seg = int(w.scale_segment_rows), K = int(w.cols);
    if (w.cols % 16 == 0 && aligned16(w.data) && aligned16(out)) {
        const int64_t words = w.rows * (w.cols / 16);
        if (e5m2)
            launch(dequantize_fp8_kernel<true>, ceil_div(words, threads), threads, 0, ctx, what, d, w.scales, seg,
                   w.rows, K, out);
        else
            launch(dequantize_fp8_kernel<false>, ceil_div(words, threads), threads, 0, ctx, what, d, w.scales, seg,
                   w.rows, K, out);
        return;
    }
    const int64_t n = w.rows * w.cols;
    if (e5m2)
        launch(dequantize_fp8_any_kernel<true>, ceil_div(n, threads), threads, 0, ctx, what, d, w.scales, seg, w.rows,
               K, out);
    else
        launch(dequantize_fp8_any_kernel<false>, ceil_div(n, threads), threads, 0, ctx, what, d, w.scales, seg, w.rows,
               K, out);
}

void quantize_rows_fp8(const bf16* x, int64_t T, int64_t K, uint8_t* q, float* s, const LaunchContext& ctx) {
    if (K % 128 != 0) throw Error(Status::internal, "FP8 activation quantization: K % 128 != 0");
    const int64_t warps = T * (K / 128);
    launch(quantize_rows_fp8_kernel, ceil_div(warps, 8), 256, 0, ctx, "FP8 activation quantize kernel", x, T, int(K), q,
           s);
}

void matmul_fp8(Gemm& gemm, const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, Fp8GemmMode mode,
                const Fp8Scratch& scratch, const LaunchContext& ctx) {
    if (T <= 0 || w.rows <= 0) return;
    const int64_t N = w.rows, K = w.cols;
    if (!out_f32 && fp8_gemv_fits(x, T, w)) {
        Fp8Group g;
        g.add(w, y);
        return gemv_fp8_group(x, T, g, K, w.dtype, ctx);
    }
    // (cuBLASLt reads the activation scales [K / 128, T] with 16-byte aligned rows: the GEMM takes a multiple of 4
    // rows, the GEMV the 1-3 rows left)
    const int64_t T4 = T / 4 * 4;
    if (mode == Fp8GemmMode::block_scaled && !out_f32 && w.dtype == DType::F8_E4M3 && K % 128 == 0 && N % 16 == 0 &&
        w.scale_segment_rows % 128 == 0 && aligned16(x) && aligned16(y) && size_t(T * K) <= scratch.act_bytes &&
        size_t(N * K) <= scratch.weight_elems && (T4 == T || fp8_gemv_fits(x + T4 * K, T - T4, w))) {
        quantize_rows_fp8(x, T4, K, scratch.act, scratch.act_scales, ctx);
        // cuBLASLt reads the 128 x 128 weight scales [N / 128, K / 128] with rows of a multiple of 4 values (16
        // bytes; PyTorch pads them so for its BlockWise128x128): other widths (K 256, 768, ...) get a padded copy
        // in the dequantization scratch, which this path leaves unused and which holds it (N * K bf16 values
        // against ceil(N / 128) * pad4(K / 128) floats).
        const float* ws = w.scales;
        const int64_t kb = K / 128, kb4 = (kb + 3) / 4 * 4;
        if (kb4 != kb) {
            float* padded = reinterpret_cast<float*>(scratch.weight);
            check(cudaMemcpy2DAsync(padded, size_t(kb4) * 4, w.scales, size_t(kb) * 4, size_t(kb) * 4,
                                    size_t(fp8_scale_rows(N, w.scale_segment_rows)), cudaMemcpyDeviceToDevice,
                                    ctx.stream),
                  "FP8 weight scales (padded copy)");
            ws = padded;
        }
        if (gemm.run_fp8(scratch.act, scratch.act_scales, T4, static_cast<const uint8_t*>(w.data), ws, N, K,
                         static_cast<bf16*>(y), ctx)) {
            if (T4 < T) {
                Fp8Group g;
                g.add(w, static_cast<bf16*>(y) + T4 * N);
                gemv_fp8_group(x + T4 * K, T - T4, g, K, w.dtype, ctx);
            }
            return;
        }
    }
    if (size_t(N * K) > scratch.weight_elems)
        throw Error(Status::internal, "FP8 matmul: the dequantization scratch holds " +
                                          std::to_string(scratch.weight_elems) + " values, " + std::to_string(N) +
                                          " x " + std::to_string(K) + " needed");
    dequantize_fp8(w, scratch.weight, ctx);
    matmul_written_weights(gemm, x, T, scratch.weight, N, K, y, out_f32, ctx);
}

HY_CUDA_TRACE_BINDER(fp8_matmul)

}  // namespace hy::cuda
