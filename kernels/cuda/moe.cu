#include "kernels/cuda/moe.cuh"

#include "kernels/cuda/fp8_convert.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/matmul.cuh"

#include <algorithm>
#include <climits>

namespace hy::cuda {

namespace {

constexpr int kMoeWarps = 8;  // output rows per block (one warp each)
constexpr int kRouteThreads = 256;
constexpr int kMaxTopK = 32;
constexpr int kMaxExperts = 4096;

// sum_i a[i] * b[i] over K values, fp32, by one warp (every lane gets it); 16-byte loads when both rows allow.
__device__ __forceinline__ float warp_dot(const bf16* a, const bf16* b, int K) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    if (((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) == 0 && K % 8 == 0) {
        const uint4* a4 = reinterpret_cast<const uint4*>(a);
        const uint4* b4 = reinterpret_cast<const uint4*>(b);
        for (int i = lane; i < K / 8; i += 32) {
            float fa[8], fb[8];
            unpack8(a4[i], fa);
            unpack8(b4[i], fb);
#pragma unroll
            for (int j = 0; j < 8; j++) s = fmaf(fa[j], fb[j], s);
        }
    } else {
        for (int i = lane; i < K; i += 32) s = fmaf(to_f32(a[i]), to_f32(b[i]), s);
    }
    return warp_sum(s);
}

// The weight types of the experts' kernels (template argument kW): bf16, FP8 codes with 128 x 128 block scales, or
// Q8/Q4 codes with a scale per row and group (kernels/backend.h Matrix).
constexpr int kWBf16 = 0, kWE4M3 = 1, kWE5M2 = 2, kWQ8 = 3, kWQ4 = 4;
constexpr bool is_fp8_w(int kW) { return kW == kWE4M3 || kW == kWE5M2; }
constexpr bool is_int_w(int kW) { return kW == kWQ8 || kW == kWQ4; }

// sum_c x[c] * fp8(w[c]) * s[c / 128] over K values, fp32, by one warp (every lane gets it): with 16-byte words
// (16 codes, one block) where x and w allow, each word's 16 products summed, then times its block's scale (as the
// FP8 GEMVs, fp8_matmul.cu), a lane's words in rounds of kFp8DotWords loaded at once (lane l: words l, l + 32, ...);
// else value by value.
constexpr int kFp8DotWords = 4;  // (H = 2048: the whole row in one round)
template <bool kE5M2>
__device__ __forceinline__ float warp_dot_fp8(const bf16* x, const uint8_t* w, const float* s, int K) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    if (((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) & 15u) == 0 && K % 16 == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        const uint4* x4 = reinterpret_cast<const uint4*>(x);
        const int K16 = K / 16;
        for (int base = lane; base < K16; base += 32 * kFp8DotWords) {
            uint4 wv[kFp8DotWords];
#pragma unroll
            for (int u = 0; u < kFp8DotWords; u++)
                if (base + 32 * u < K16) wv[u] = __ldg(w4 + base + 32 * u);
#pragma unroll
            for (int u = 0; u < kFp8DotWords; u++) {
                const int i = base + 32 * u;
                if (i >= K16) break;
                float wf[16], xf[16];
                unpack16<kE5M2>(wv[u], wf);
                unpack8(x4[2 * i], xf);
                unpack8(x4[2 * i + 1], xf + 8);
                float p = 0.0f;
#pragma unroll
                for (int j = 0; j < 16; j++) p = fmaf(wf[j], xf[j], p);
                acc = fmaf(p, __ldg(s + i / 8), acc);
            }
        }
    } else {
        for (int c = lane; c < K; c += 32)
            acc = fmaf(fp8_to_f32<kE5M2>(w[c]) * __ldg(s + c / kFp8Block), to_f32(x[c]), acc);
    }
    return warp_sum(acc);
}

// sum_c x[c] * q[c] * s[c / group] over K values (K a multiple of 64, x and w 16-byte aligned: int_quant_shape_ok),
// fp32, by one warp (every lane gets it), the weights never rounded: a lane takes 16-byte words l, l + 32, ... in
// rounds of kFp8DotWords loaded at once; each word's codes lie in one group per nibble half (Q8: 16 codes of
// columns 16 i ..; Q4: word i is half i % 2 of 64-column chunk i / 2, its low nibbles columns 64 (i / 2) + 16 (i % 2)
// .., its high nibbles 32 columns on), whose products are summed, then times the group's scale (as the integer
// GEMV sums a group before its scale, int_matmul.cuh).
template <bool kQ4>
__device__ __forceinline__ float warp_dot_int(const bf16* x, const uint8_t* w, const float* s, int K, int group) {
    const int lane = threadIdx.x & 31;
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const uint4* x4 = reinterpret_cast<const uint4*>(x);  // 8 values a word
    const int n_words = kQ4 ? K / 32 : K / 16;
    float acc = 0.0f;
    for (int base = lane; base < n_words; base += 32 * kFp8DotWords) {
        uint4 wv[kFp8DotWords];
#pragma unroll
        for (int u = 0; u < kFp8DotWords; u++)
            if (base + 32 * u < n_words) wv[u] = __ldg(w4 + base + 32 * u);
#pragma unroll
        for (int u = 0; u < kFp8DotWords; u++) {
            const int i = base + 32 * u;
            if (i >= n_words) break;
            const uint32_t b[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
            // c0: the first column of the word's (low) codes
            const int c0 = kQ4 ? 64 * (i / 2) + 16 * (i % 2) : 16 * i;
            float xf[16];
            unpack8(x4[c0 / 8], xf);
            unpack8(x4[c0 / 8 + 1], xf + 8);
            float p = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const uint32_t byte = (b[j / 4] >> (8 * (j % 4))) & 0xffu;
                p = fmaf(float(kQ4 ? int(byte & 15u) - 8 : int(int8_t(byte))), xf[j], p);
            }
            acc = fmaf(p, __ldg(s + c0 / group), acc);
            if constexpr (kQ4) {  // the high nibbles: columns c0 + 32 ..
                unpack8(x4[c0 / 8 + 4], xf);
                unpack8(x4[c0 / 8 + 5], xf + 8);
                float h = 0.0f;
#pragma unroll
                for (int j = 0; j < 16; j++) h = fmaf(float(int((b[j / 4] >> (8 * (j % 4) + 4)) & 15u) - 8), xf[j], h);
                acc = fmaf(h, __ldg(s + (c0 + 32) / group), acc);
            }
        }
    }
    return warp_sum(acc);
}

// x . row `row` of an expert matrix of K columns (ExpertMatrix: bf16, FP8 with its block scales or Q8/Q4 with its
// group scales), by one warp.
template <int kW>
__device__ __forceinline__ float expert_dot(const bf16* x, const ExpertMatrix& m, int64_t row, int K) {
    if constexpr (kW == kWBf16) {
        return warp_dot(x, static_cast<const bf16*>(m.w) + row * K, K);
    } else if constexpr (is_int_w(kW)) {
        return warp_dot_int<kW == kWQ4>(x, static_cast<const uint8_t*>(m.w) + row * (kW == kWQ4 ? K / 2 : K),
                                        m.scales + row * (K / m.group), K, m.group);
    } else {
        const int64_t scale_cols = (K + kFp8Block - 1) / kFp8Block;
        return warp_dot_fp8<kW == kWE5M2>(x, static_cast<const uint8_t*>(m.w) + row * K,
                                          m.scales + fp8_scale_row(row, m.segment_rows) * scale_cols, K);
    }
}

// x . row `row` of one of the shared expert's matrices (MoeShared: bf16, or the routed experts' type kW), by one
// warp.
template <int kW>
__device__ __forceinline__ float shared_dot(const bf16* x, const MoeShared& sh, const ExpertMatrix& m, int64_t row,
                                            int K) {
    if (kW != kWBf16 && sh.quantized) return expert_dot<kW>(x, m, row, K);
    return warp_dot(x, static_cast<const bf16*>(m.w) + row * K, K);
}

// The router's choice for one row by one warp (E <= 32 kPer): softmax over the row's bf16 logits in fp32, then k
// rounds of a warp arg-max over the experts not yet taken, the logits held in registers (the larger logit, the
// lower id on ties, as torch.topk on the CPU). Lane j < k gets choice j: its expert id and its weight, bf16-rounded,
// divided by the sum of the k probabilities (added in choice order) when `normalize`.
struct Choice {
    int id;
    float weight;
};
template <int kPer>
__device__ __forceinline__ Choice warp_top_k(const bf16* __restrict__ logits, int E, int k, bool normalize) {
    const int lane = threadIdx.x & 31;
    float v[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < kPer; q++) {
        const int e = lane + 32 * q;
        v[q] = e < E ? __bfloat162float(logits[e]) : -INFINITY;
        mx = fmaxf(mx, v[q]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kPer; q++)
        if (lane + 32 * q < E) sum += expf(v[q] - mx);
    sum = warp_sum(sum);
    // Each expert's key: the bf16 logit's bits made to order as unsigned integers (NaN lowest), then 0xFFFF - e,
    // so the largest key is the larger logit and, between equal ones, the lower id; a round's arg-max is then
    // one warp max-reduction (redux.sync) over the lanes' largest keys. (E <= 1024 < 0xFFFF.)
    uint32_t key[kPer];
#pragma unroll
    for (int q = 0; q < kPer; q++) {
        const int e = lane + 32 * q;
        uint32_t b = __bfloat16_as_ushort(__float2bfloat16(v[q]));  // (exact: v is a bf16 value)
        if (b == 0x8000u) b = 0u;                                   // -0 == +0 (then the lower id wins)
        const uint32_t ord = (b & 0x7fffu) > 0x7f80u ? 0u : (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
        key[q] = e < E ? (ord << 16) | (0xffffu - uint32_t(e)) : 0u;
    }
    // Each lane keeps the largest of its keys; a round takes the warp's largest (one redux.sync) and only the lane
    // that held it clears that key and finds its next largest. The round's logit is read back from the key's
    // upper half (the order map is one to one on bf16 bits; NaN keys give a NaN, -0 gives +0: the same expf).
    uint32_t best = 0;
#pragma unroll
    for (int q = 0; q < kPer; q++) best = max(best, key[q]);
    Choice mine{0, 0.0f};
    float total = 0.0f;
    for (int j = 0; j < k; j++) {
        const uint32_t top = __reduce_max_sync(0xffffffffu, best);
        if (best == top) {  // (keys are distinct: each holds its id)
            best = 0;
#pragma unroll
            for (int q = 0; q < kPer; q++) {
                if (key[q] == top) key[q] = 0u;  // taken
                best = max(best, key[q]);
            }
        }
        const int best_id = int(0xffffu - (top & 0xffffu));
        const uint32_t ord = top >> 16, bits = (ord & 0x8000u) ? (ord & 0x7fffu) : (~ord & 0xffffu);
        const float p = expf(__uint_as_float(bits << 16) - mx) / sum;
        total += p;
        if (lane == j) mine = Choice{best_id, p};
    }
    mine.weight = round_bf16(normalize ? mine.weight / total : mine.weight);
    return mine;
}

// Up to 1024 experts: one warp per row (warp_top_k).
template <int kPer>
__global__ void moe_route_warp_kernel(const bf16* __restrict__ router_logits, int E, int k, bool normalize,
                                      float* weights, int32_t* ids) {
    pdl_trigger();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const Choice c = warp_top_k<kPer>(router_logits + row * E, E, k, normalize);
    if (lane < k) {
        weights[row * k + lane] = c.weight;
        ids[row * k + lane] = c.id;
    }
}

// More than 1024 experts: one block per row, the row's logits in shared memory, softmax in fp32; every thread ranks
// its experts by counting the logits above them (equal ones: the lower id first, as torch.topk on the CPU), and
// the experts of rank < k write their probability at their rank; the k are then summed in rank order.
__global__ void moe_route_kernel(const bf16* __restrict__ router_logits, int E, int k, bool normalize, float* weights,
                                 int32_t* ids) {
    extern __shared__ float logit[];  // [E]
    __shared__ float scratch[32];
    __shared__ float chosen_p[kMaxTopK];
    __shared__ int chosen_id[kMaxTopK];
    pdl_trigger();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        logit[e] = to_f32(router_logits[row * E + e]);
        mx = fmaxf(mx, logit[e]);
    }
    mx = warp_max(mx);
    if (lane == 0) scratch[warp] = mx;
    __syncthreads();
    mx = lane < n_warps ? scratch[lane] : -INFINITY;
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) sum += expf(logit[e] - mx);
    sum = block_sum(sum, scratch);  // (synchronizes: every logit is in shared memory)
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = logit[e];
        int rank = 0;
        for (int o = 0; o < E && rank < k; o++) {
            const float u = logit[o];
            rank += (u > v || (u == v && o < e)) ? 1 : 0;
        }
        if (rank < k) {
            chosen_p[rank] = expf(v - mx) / sum;
            chosen_id[rank] = e;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int j = 0; j < k; j++) total += chosen_p[j];
        for (int j = 0; j < k; j++) {
            weights[row * k + j] = round_bf16(normalize ? chosen_p[j] / total : chosen_p[j]);
            ids[row * k + j] = chosen_id[j];
        }
    }
}

// ---- Decode (few rows): one warp per output, reading only the chosen experts' rows ----
// The expert weights depend on the router's choice, so gate/up cannot load any before its PDL wait. It lets the
// next kernel (down) start only after that wait: the choice is then complete, and down loads its first weights
// before its own wait (for one or two rows, where the whole grid is resident at once).
constexpr int kDownWords = 2;     // prefetching down: words per lane per row and round (I = 512: one round)
constexpr int kDownWordsFp8 = 1;  // (FP8: 16 codes a word, I = 512 in one round; 2 words a lane spilled registers)
// The gate/up of up to kMoeGateUpGemvMaxRows rows on the GEMV's loop (matmul.cuh, gemv_expert_gate_up) where it
// takes the shapes, else moe_gate_up_kernel below.
constexpr bool kMoeGateUpGemv = true;

// act[(t k + j), i] = bf16(bf16(silu(bf16(gate_e . x_t))) * bf16(up_e . x_t)), e = ids[t k + j]; one warp per i.
// (More than kMoeGateUpGemvMaxRows rows, or where the decode GEMV's loop does not take the shapes: H % 8 != 0 or x
// not 16-byte aligned.)
// (Run 99: this kernel loading a lane's whole gate and up words at once, 124 registers and two blocks per SM, was
// slower: b=1 14.98 us against 12.63 in the trace, batches of 8-32 1.5-5% slower. gemv_expert_gate_up does load them
// at once, but with two warps a feature and 62 registers, and wins at 1-2 rows.)
// Blocks x >= rows k (with a shared expert): shared_act[t, i] likewise with the shared expert's gate and up, t =
// x - rows k; and one warp of the row's first block: shared_gate[t] = bf16(sigmoid(bf16(x_t . gate))).
// kW: the routed experts' weight type (the shared expert's too where sh.quantized, else bf16).
template <int kW>
__global__ void moe_gate_up_kernel(const bf16* __restrict__ x, ExpertMatrix gate_up, const int32_t* __restrict__ ids,
                                   int E, int H, int I, int k, int64_t rows, bf16* act, MoeShared sh, bf16* shared_act,
                                   float* shared_gate) {
    pdl_wait();
    pdl_trigger();                  // (after the wait: the down kernel reads the routing before its own wait)
    const int64_t tj = blockIdx.x;  // t * k + j, or rows * k + t
    const int warp = threadIdx.x >> 5;
    const int i = blockIdx.y * kMoeWarps + warp;
    if (tj >= rows * k) {  // the shared expert
        const int64_t t = tj - rows * k;
        const bf16* xr = x + t * H;
        if (i < sh.Is) {
            const float g = round_bf16(shared_dot<kW>(xr, sh, sh.gate_proj, i, H));
            const float u = round_bf16(shared_dot<kW>(xr, sh, sh.up_proj, i, H));
            if ((threadIdx.x & 31) == 0) shared_act[t * sh.Is + i] = to_bf16(round_bf16(siluf_(g)) * u);
        }
        if (blockIdx.y == 0 && warp == kMoeWarps - 1) {
            const float g = round_bf16(warp_dot(xr, sh.gate, H));
            if ((threadIdx.x & 31) == 0) shared_gate[t] = round_bf16(1.0f / (1.0f + expf(-g)));
        }
        return;
    }
    if (i >= I) return;
    const int e = ids[tj];
    const bf16* xr = x + (tj / k) * H;
    float a = 0.0f;
    if (e >= 0 && e < E) {
        const float g = round_bf16(expert_dot<kW>(xr, gate_up, int64_t(e) * 2 * I + i, H));
        const float u = round_bf16(expert_dot<kW>(xr, gate_up, int64_t(e) * 2 * I + I + i, H));
        a = round_bf16(siluf_(g)) * u;
    }
    if ((threadIdx.x & 31) == 0) act[tj * I + i] = to_bf16(a);
}

// The position, in increasing expert id (ties: the lower choice index), of choice `lane` of the k in `my_id`
// (lanes >= k pass anything and get a position no choice has); every lane of the warp calls it.
__device__ __forceinline__ int choice_rank(int my_id, int lane, int k) {
    int rank = 0;
    for (int c = 0; c < k; c++) {
        const int other = __shfl_sync(0xffffffffu, my_id, c);
        rank += (other < my_id || (other == my_id && c < lane)) ? 1 : 0;
    }
    return lane < k ? rank : INT_MAX;
}

// y[t, h] = the bf16 running sum over the row's experts in increasing id of bf16(bf16(down_e[h] . act) * w); one
// warp per h, the experts one after another.
// With a shared expert (sh.down_proj): then acc = bf16(acc + bf16(shared_gate[t] * bf16(down_s[h] . shared_act[t]))).
// kW: the routed experts' weight type.
template <int kW>
__global__ void moe_down_kernel(const bf16* __restrict__ act, ExpertMatrix down, const float* __restrict__ weights,
                                const int32_t* __restrict__ ids, int E, int H, int I, int k, MoeShared sh,
                                const bf16* __restrict__ shared_act, const float* __restrict__ shared_gate, bf16* y) {
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y * kMoeWarps + (threadIdx.x >> 5);
    if (h >= H) return;
    float acc = 0.0f;
    int prev = -1;
    for (int n = 0; n < k; n++) {  // the row's choices in increasing expert id
        int j = -1;
        for (int c = 0; c < k; c++) {
            const int e = ids[t * k + c];
            if (e > prev && (j < 0 || e < ids[t * k + j])) j = c;
        }
        if (j < 0) break;
        const int e = ids[t * k + j];
        prev = e;
        if (e >= E) break;
        const float d = round_bf16(expert_dot<kW>(act + (t * k + j) * I, down, int64_t(e) * H + h, I));
        acc = round_bf16(acc + round_bf16(d * weights[t * k + j]));
    }
    if (sh.down_proj.w) {
        const float d = round_bf16(shared_dot<kW>(shared_act + t * sh.Is, sh, sh.down_proj, h, sh.Is));
        acc = round_bf16(acc + round_bf16(shared_gate[t] * d));
    }
    if ((threadIdx.x & 31) == 0) y[t * H + h] = to_bf16(acc);
}

// moe_down_kernel's values for one or two rows, by blocks of kDownRows outputs: warp w < kDownWarps takes the
// row's choices w, w + kDownWarps, ... and computes their dot products for the block's kDownRows outputs, a last
// warp the shared expert's (sh.down_proj); the sums are then formed in shared memory, experts in increasing id.
// Every warp loads its first round of weights (kDownRows rows x kDownWords or kDownWordsFp8 16-byte words per lane)
// before the PDL wait: the routing is complete by then (this kernel starts only once gate/up has passed its own wait;
// read through L2) and the shared expert's rows do not depend on it. Then one wave of blocks keeps about 8 KB per warp
// in flight. kW: bf16 (I a multiple of 8; words of 8 values) or FP8 (I and Is multiples of 16, H of 8; words of 16
// codes, each word's products summed, then times its block's scale, as warp_dot_fp8: the block's 8 rows share a scale
// row); the shared expert, if any, of the same type.
constexpr int kDownRows = 8;   // outputs per block
constexpr int kDownWarps = 8;  // warps over the routed choices (then one for the shared expert)
template <int kW>
__global__ void __launch_bounds__((kDownWarps + 1) * 32, 2)
    moe_down_rows_kernel(const bf16* __restrict__ act, ExpertMatrix down, const float* __restrict__ weights,
                         const int32_t* __restrict__ ids, int E, int H, int I, int k, bool evict_first, MoeShared sh,
                         const bf16* __restrict__ shared_act, const float* __restrict__ shared_gate, bf16* y) {
    static_assert(kW == kWBf16 || is_fp8_w(kW), "bf16 or FP8 experts");
    constexpr int kVals = kW == kWBf16 ? 8 : 16;                       // values a word
    constexpr int kWords = kW == kWBf16 ? kDownWords : kDownWordsFp8;  // words a lane per row and round
    __shared__ float dots[kMaxTopK + 1][kDownRows];  // bf16-rounded dot products; row k: the shared expert's
    __shared__ int order[kMaxTopK];                  // the choices in increasing expert id
    __shared__ int n_valid;
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const int h0 = blockIdx.y * kDownRows, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint64_t pol = weight_policy(evict_first);
    const bool is_shared = warp == kDownWarps;
    const int n_rows = min(kDownRows, H - h0);
    const int K = is_shared ? sh.Is : I, KW = K / kVals;
    // the matrix (fields picked one by one: a reference to either parameter would copy it to the stack)
    const uint8_t* mw = static_cast<const uint8_t*>(is_shared ? sh.down_proj.w : down.w);
    const float* ms = is_shared ? sh.down_proj.scales : down.scales;
    const int64_t mseg = is_shared ? sh.down_proj.segment_rows : down.segment_rows;
    // this warp's first choice (routed warps) and its weight rows
    int j = warp, e = -1;
    auto expert_of = [&](int jj) {
        const int ee = jj < k ? __ldcg(ids + t * k + jj) : -1;
        return ee >= 0 && ee < E ? ee : -1;
    };
    auto row0_of = [&](int ee) { return is_shared ? int64_t(h0) : int64_t(ee) * H + h0; };  // the matrix row of h0
    auto rows_of = [&](int ee) {
        return reinterpret_cast<const uint4*>(mw + row0_of(ee) * K * int64_t(kW == kWBf16 ? 2 : 1));
    };
    uint4 wv[kDownRows][kWords];
    auto load = [&](const uint4* w, int base) {
#pragma unroll
        for (int r = 0; r < kDownRows; r++)
#pragma unroll
            for (int q = 0; q < kWords; q++)
                if (r < n_rows && base + 32 * q < KW) wv[r][q] = ld_weight(w + int64_t(r) * KW + base + 32 * q, pol);
    };
    const bool active = is_shared ? sh.down_proj.w != nullptr : j < k;
    if (!is_shared && active) e = expert_of(j);
    if (active && (is_shared || e >= 0)) load(rows_of(e), lane);
    if (warp == 0) {  // the order of the choices (out-of-range ids, which the router makes none of, are skipped)
        const int id = lane < k ? __ldcg(ids + t * k + lane) : 0;
        const bool valid = lane < k && id >= 0 && id < E;
        const int rank = choice_rank(valid ? id : INT_MAX, lane, k);
        const unsigned vm = __ballot_sync(0xffffffffu, valid);
        if (valid) order[rank] = lane;
        if (lane == 0) n_valid = __popc(vm);
    }
    pdl_wait();
    for (bool first = true; active; first = false) {
        if (!first) {  // the next choice of this warp
            j += kDownWarps;
            if (is_shared || j >= k) break;
            e = expert_of(j);
            if (e >= 0) load(rows_of(e), lane);
        }
        if (!is_shared && e < 0) continue;
        const uint4* w = rows_of(e);
        const uint4* a4 = reinterpret_cast<const uint4*>(is_shared ? shared_act + t * K : act + (t * k + j) * I);
        // FP8: the scale row of the block's rows (h0 is a multiple of 8 inside one expert's segment)
        const float* srow =
            kW == kWBf16 ? nullptr : ms + fp8_scale_row(row0_of(e), mseg) * ((K + kFp8Block - 1) / kFp8Block);
        float part[kDownRows];
#pragma unroll
        for (int r = 0; r < kDownRows; r++) part[r] = 0.0f;
        for (int base = lane;;) {
#pragma unroll
            for (int q = 0; q < kWords; q++) {
                const int wi = base + 32 * q;
                if (wi >= KW) break;
                float af[kVals];
                unpack8(a4[(kVals / 8) * wi], af);
                if constexpr (kVals == 16) unpack8(a4[2 * wi + 1], af + 8);
                const float sc = kW == kWBf16 ? 1.0f : __ldg(srow + wi / 8);
#pragma unroll
                for (int r = 0; r < kDownRows; r++) {
                    float wf[kVals];
                    if constexpr (kW == kWBf16)
                        unpack8(wv[r][q], wf);
                    else
                        unpack16<kW == kWE5M2>(wv[r][q], wf);
                    if constexpr (kW == kWBf16) {
#pragma unroll
                        for (int c = 0; c < 8; c++) part[r] = fmaf(wf[c], af[c], part[r]);
                    } else {
                        float p = 0.0f;
#pragma unroll
                        for (int c = 0; c < 16; c++) p = fmaf(wf[c], af[c], p);
                        part[r] = fmaf(p, sc, part[r]);
                    }
                }
            }
            base += 32 * kWords;
            if (base >= KW) break;
            load(w, base);
        }
#pragma unroll
        for (int r = 0; r < kDownRows; r++) {
            const float d = round_bf16(warp_sum(part[r]));
            if (lane == 0) dots[is_shared ? k : j][r] = d;
        }
        if (is_shared) break;
    }
    __syncthreads();
    if (threadIdx.x < n_rows) {
        const int r = threadIdx.x;
        float acc = 0.0f;
        for (int n = 0; n < n_valid; n++) {
            const int jj = order[n];
            acc = round_bf16(acc + round_bf16(dots[jj][r] * weights[t * k + jj]));
        }
        if (sh.down_proj.w) acc = round_bf16(acc + round_bf16(shared_gate[t] * dots[k][r]));
        y[t * H + h0 + r] = to_bf16(acc);
    }
}

// ---- Prefill and large batches: the rows grouped by expert, a grouped GEMM on tensor cores ----
// moe_group_kernel sorts the n = rows * k choices by expert (stable: within an expert, in increasing t k + j) and
// cuts each expert's run of positions into tiles of kGroupRows; each tile is one block row of the two grouped
// GEMMs (gate/up with the SiLU product, then down with the routing weight), which read the expert's weights once
// per tile instead of once per row. moe_combine_kernel then adds each row's k weighted outputs in increasing expert
// id. A row's values depend only on the row and its experts (each output is one thread's fixed-order sum over K),
// never on the other rows of the batch.
constexpr int kGroupRows = 64;   // BM: positions (rows of A) per tile
constexpr int kGroupCols = 128;  // BN: weight rows per block (gate/up: 64 activation columns, gate and up)
// BK, the k extent of a shared-memory stage, is a template argument: 128 (256 bytes of a weight row) where a block
// may have moe_grouped_gemm_smem<128>() bytes of shared memory (sm_80, sm_90), else 64 (sm_86, sm_89: 99 KB).
// group_stages<BK>(): the cp.async ring, group_stages - 1 stages in flight while one is multiplied.
template <int BK>
constexpr int group_stages() {
    return BK == 128 ? 2 : 3;
}
constexpr int kGroupPad = 8;        // row padding: ldmatrix rows 2 BK + 16 bytes apart, conflict-free
constexpr int kGroupThreads = 256;  // 8 warps: 2 (rows) x 4 (columns), 32 x 32 outputs each
constexpr int kGroupScanThreads = 256;

// Block e (one per expert): counts every expert's choices (shared-memory histogram), then writes its own
// positions and tiles. Outputs: src_row[p] = t and choice[p] = t k + j of sorted position p; pos[t k + j] = p;
// tiles[3 s .. 3 s + 2] = (expert, first position, end position) of tile s, expert -1 past the last tile (written by
// the last block up to max_tiles).
__global__ void __launch_bounds__(kGroupScanThreads)
    moe_group_kernel(const int32_t* __restrict__ ids, int n, int k, int E, int max_tiles, int32_t* src_row,
                     int32_t* choice, int32_t* pos, int32_t* tiles) {
    extern __shared__ int count[];  // [E]
    __shared__ int warp_total[kGroupScanThreads / 32];
    __shared__ int sums[2][kGroupScanThreads / 32];
    pdl_trigger();
    pdl_wait();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = kGroupScanThreads / 32;
    const int e = blockIdx.x;
    for (int i = tid; i < E; i += kGroupScanThreads) count[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kGroupScanThreads) {
        const int id = ids[i];
        if (id >= 0 && id < E) atomicAdd(&count[id], 1);
    }
    __syncthreads();
    // first position and first tile of expert e: sums over the experts below it
    int before = 0, tiles_before = 0;
    for (int i = tid; i < e; i += kGroupScanThreads) {
        before += count[i];
        tiles_before += (count[i] + kGroupRows - 1) / kGroupRows;
    }
    before = __reduce_add_sync(0xffffffffu, before);
    tiles_before = __reduce_add_sync(0xffffffffu, tiles_before);
    if (lane == 0) {
        sums[0][warp] = before;
        sums[1][warp] = tiles_before;
    }
    __syncthreads();
    before = tiles_before = 0;
    for (int w = 0; w < n_warps; w++) {
        before += sums[0][w];
        tiles_before += sums[1][w];
    }
    const int mine = count[e], my_tiles = (mine + kGroupRows - 1) / kGroupRows;
    for (int m = tid; m < my_tiles; m += kGroupScanThreads) {
        int32_t* tile = tiles + 3 * int64_t(tiles_before + m);
        tile[0] = e;
        tile[1] = before + m * kGroupRows;
        tile[2] = before + mine;
    }
    if (e == E - 1)
        for (int s = tiles_before + my_tiles + tid; s < max_tiles; s += kGroupScanThreads) tiles[3 * int64_t(s)] = -1;
    // stable scatter of this expert's choices
    int running = before;
    for (int base = 0; base < n; base += kGroupScanThreads) {
        const int i = base + tid;
        const bool match = i < n && ids[i] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, match);
        if (lane == 0) warp_total[warp] = __popc(ballot);
        __syncthreads();
        int offset = running;
        for (int w = 0; w < warp; w++) offset += warp_total[w];
        if (match) {
            const int p = offset + __popc(ballot & ((1u << lane) - 1u));
            src_row[p] = i / k;
            choice[p] = i;
            pos[i] = p;
        }
        for (int w = 0; w < n_warps; w++) running += warp_total[w];
        __syncthreads();
    }
}

// One tile (blockIdx.x, from moe_group_kernel) times one column block (blockIdx.y) of its expert's matrix, on
// tensor cores (mma m16n8k16, fp32 accumulation, A and W through shared memory by a ring of group_stages<BK>()
// cp.async stages of BK values in moe_grouped_gemm_smem<BK, kW>() bytes of dynamic shared memory). At 2-4 rows a tile
// (decode batches) the kernel streams weights: 256-byte pieces of a weight row a stage read faster than 64-byte ones
// (H100, 35B-A3B shapes, b=64: 2,478 against 1,735 tok/s; docs/perf-notes.md, thirty-second session). kGateUp: A = x
// rows gathered by src_row, W = gate_up[e] [2I, H], K = H; the block's 128 weight rows are, per warp column wn, 16 gate
// rows and the 16 up rows of the same activation columns, so each thread holds a column's gate and up values: out = act
// [n, I] at the sorted positions, bf16(bf16(silu(bf16(g))) * bf16(u)). Else: A = act [n, I] (sorted positions), W =
// down[e] [H, I], K = I; out = y_slot [n, H], bf16(bf16(d) * weight of the position's choice).
// FP8 weights (kW != kWBf16; K a multiple of 16): the stages hold the codes (half the bytes of bf16), each stage is
// converted (exactly) into one bf16 tile in shared memory before the products, and a stage's products are summed
// apart, then multiplied by their 128 x 128 block's scale and added in fp32 (a stage lies in one block of columns:
// BK divides 128), as the FP8 GEMVs scale each block's sum (fp8_matmul.cu).
// Q8/Q4 weights: the stages hold the codes (Q4: the 64-column chunks' packed bytes), and each stage is converted into
// bf16(q * scale) of its group (the weights the dense path's dequantize_int gives its bf16 GEMM, int_matmul.cuh).
template <bool kGateUp, int BK, int kW>
__global__ void __launch_bounds__(kGroupThreads)
    moe_grouped_gemm_kernel(const bf16* __restrict__ a, const int32_t* __restrict__ src_row, ExpertMatrix wm, int N,
                            int K, int I, const int32_t* __restrict__ tiles, const int32_t* __restrict__ choice,
                            const float* __restrict__ weights, bf16* out) {
    constexpr int kStages = group_stages<BK>();
    constexpr bool kFp8 = is_fp8_w(kW), kCodes = kW != kWBf16;      // (kCodes: a stage is converted to bconv)
    constexpr int kWBits = kW == kWBf16 ? 16 : kW == kWQ4 ? 4 : 8;  // bits of a weight
    constexpr int kWElems = 128 / kWBits;                           // weights in a 16-byte word
    constexpr int kWRow = kCodes ? BK * kWBits / 8 + 16 : 2 * (BK + kGroupPad);  // bytes between W rows of a stage
    extern __shared__ __align__(16) unsigned char group_smem[];
    auto as = reinterpret_cast<bf16(*)[kGroupRows][BK + kGroupPad]>(group_smem);
    unsigned char* ws = group_smem + sizeof(bf16) * kStages * kGroupRows * (BK + kGroupPad);  // W stages (raw)
    // the tile the products read: stage s itself (bf16), or the bf16 tile stage s is converted into (codes)
    auto bconv = reinterpret_cast<bf16(*)[BK + kGroupPad]>(ws + kStages * kGroupCols * kWRow);
    pdl_trigger();
    pdl_wait();
    const int expert = tiles[3 * int64_t(blockIdx.x)];
    if (expert < 0) return;
    const int p0 = tiles[3 * int64_t(blockIdx.x) + 1], p_end = tiles[3 * int64_t(blockIdx.x) + 2];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm_ = warp >> 2, wn = warp & 3;
    // this thread copies 16-byte word `chunk` of kAPasses A rows and word `w_chunk` of kWPasses W rows of every stage;
    // words at or past K are zero-filled (K a multiple of 8; of 16 for FP8; of 64 for Q8/Q4)
    constexpr int kWords = BK / 8, kRowsPerPass = kGroupThreads / kWords;
    constexpr int kAPasses = kGroupRows / kRowsPerPass;
    constexpr int kWWords = BK / kWElems, kWRowsPerPass = kGroupThreads / kWWords;
    constexpr int kWPasses = kGroupCols / kWRowsPerPass;
    const int chunk = tid % kWords, row0 = tid / kWords;
    const int w_chunk = tid % kWWords, w_row0 = tid / kWWords;
    const bf16* a_src[kAPasses];
    bool a_valid[kAPasses];
#pragma unroll
    for (int q = 0; q < kAPasses; q++) {
        const int ar = row0 + kRowsPerPass * q;
        a_valid[q] = p0 + ar < p_end;
        const int64_t a_row = a_valid[q] ? (kGateUp ? src_row[p0 + ar] : p0 + ar) : 0;
        a_src[q] = a + a_row * K + chunk * 8;
    }
    // the expert's weight row (0 <= row < N) of row r of the block's W tile, and whether it is one
    auto weight_row = [&](int r, bool& valid) {
        if (kGateUp) {
            const int col = blockIdx.y * (kGroupCols / 2) + (r / 32) * 16 + (r % 16);
            valid = col < I;
            return valid ? (r % 32 >= 16 ? I : 0) + col : 0;
        }
        const int row = blockIdx.y * kGroupCols + r;
        valid = row < N;
        return valid ? row : 0;
    };
    const unsigned char* w_src[kWPasses];
    bool w_valid[kWPasses];
    const float* w_scales[kWPasses];  // Q8/Q4: the scale row of the thread's W rows
    const unsigned char* we = static_cast<const unsigned char*>(wm.w) + int64_t(expert) * N * K * kWBits / 8;
#pragma unroll
    for (int q = 0; q < kWPasses; q++) {
        const int row = weight_row(w_row0 + kWRowsPerPass * q, w_valid[q]);
        w_src[q] = we + (int64_t(row) * K + w_chunk * kWElems) * kWBits / 8;
        w_scales[q] = is_int_w(kW) ? wm.scales + (int64_t(expert) * N + row) * (K / wm.group) : nullptr;
    }
    auto load_stage = [&](int s, int k0) {
        const bool k_in = k0 + chunk * 8 < K;
#pragma unroll
        for (int q = 0; q < kAPasses; q++)
            cp_async16(smem_addr(&as[s][row0 + kRowsPerPass * q][chunk * 8]), a_src[q] + (k_in ? k0 : 0),
                       a_valid[q] && k_in);
        const bool w_in = k0 + w_chunk * kWElems < K;
#pragma unroll
        for (int q = 0; q < kWPasses; q++)
            cp_async16(smem_addr(ws + (s * kGroupCols + w_row0 + kWRowsPerPass * q) * kWRow + w_chunk * 16),
                       w_src[q] + (w_in ? k0 * kWBits / 8 : 0), w_valid[q] && w_in);
    };
    // FP8: the scale rows of this thread's 8 output columns (bconv rows wn 32 + nj 8 + c2 + c); a stage's block of
    // columns is (its first k) / 128
    const float* s_row[4][2] = {};
    if constexpr (kFp8) {
        const int64_t scale_cols = (K + kFp8Block - 1) / kFp8Block;
#pragma unroll
        for (int nj = 0; nj < 4; nj++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                bool valid;
                const int row = weight_row(wn * 32 + nj * 8 + (lane & 3) * 2 + c, valid);
                s_row[nj][c] = wm.scales + fp8_scale_row(int64_t(expert) * N + row, wm.segment_rows) * scale_cols;
            }
    }
    float acc[2][4][4], part[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nj = 0; nj < 4; nj++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][nj][c] = part[mi][nj][c] = 0.0f;
    const int n_k = (K + BK - 1) / BK;
    // (a commit without copies is an empty group, so that group kt is always stage kt's)
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < n_k) load_stage(s, s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < n_k; kt++) {
        const int s = kt % kStages;
        cp_async_wait<kStages - 2>();
        __syncthreads();  // stage s is complete for every thread, and stage kt - 1's reads are done
        const int next = kt + kStages - 1;
        if (next < n_k) load_stage(next % kStages, next * BK);
        cp_async_commit();
        if constexpr (is_int_w(kW)) {  // stage s's codes -> bconv, bf16(q * scale) (this thread's words of the stage)
#pragma unroll
            for (int q = 0; q < kWPasses; q++) {
                const int r = w_row0 + kWRowsPerPass * q;
                const uint4 v = *reinterpret_cast<const uint4*>(ws + (s * kGroupCols + r) * kWRow + w_chunk * 16);
                const uint32_t b[4] = {v.x, v.y, v.z, v.w};
                // c0: the stage column of the word's (low) codes; Q4: the high nibbles are columns c0 + 32 ..
                const int c0 = kW == kWQ4 ? 64 * (w_chunk / 2) + 16 * (w_chunk % 2) : 16 * w_chunk;
                const int k0 = kt * BK;
                const float sc = c0 + k0 < K ? __ldg(w_scales[q] + (k0 + c0) / wm.group) : 0.0f;
                float f[16];
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint32_t byte = (b[j / 4] >> (8 * (j % 4))) & 0xffu;
                    f[j] = float(kW == kWQ4 ? int(byte & 15u) - 8 : int(int8_t(byte))) * sc;
                }
                uint4* dst = reinterpret_cast<uint4*>(&bconv[r][c0]);
                dst[0] = pack8(f);
                dst[1] = pack8(f + 8);
                if constexpr (kW == kWQ4) {
                    const float sh = c0 + 32 + k0 < K ? __ldg(w_scales[q] + (k0 + c0 + 32) / wm.group) : 0.0f;
#pragma unroll
                    for (int j = 0; j < 16; j++) f[j] = float(int((b[j / 4] >> (8 * (j % 4) + 4)) & 15u) - 8) * sh;
                    uint4* hi = reinterpret_cast<uint4*>(&bconv[r][c0 + 32]);
                    hi[0] = pack8(f);
                    hi[1] = pack8(f + 8);
                }
            }
            __syncthreads();
        }
        if constexpr (kFp8) {  // stage s's codes -> bconv (this thread's words of the stage)
#pragma unroll
            for (int q = 0; q < kWPasses; q++) {
                const int r = w_row0 + kWRowsPerPass * q;
                const uint4 v = *reinterpret_cast<const uint4*>(ws + (s * kGroupCols + r) * kWRow + w_chunk * 16);
                const uint32_t in[4] = {v.x, v.y, v.z, v.w};
                uint32_t o[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    o[2 * i] = fp8x2_to_bf16x2<kW == kWE5M2>(in[i]);
                    o[2 * i + 1] = fp8x2_to_bf16x2<kW == kWE5M2>(in[i] >> 16);
                }
                uint4* dst = reinterpret_cast<uint4*>(&bconv[r][w_chunk * 16]);
                dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
                dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
            }
            __syncthreads();
        }
        auto b_tile = [&](int r, int c) -> const bf16* {
            if constexpr (kCodes) return &bconv[r][c];
            return reinterpret_cast<const bf16*>(ws + (s * kGroupCols + r) * kWRow) + c;
        };
        float(&sum)[2][4][4] = kFp8 ? part : acc;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t af[2][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                ldsm_x4(smem_addr(&as[s][wm_ * 32 + mi * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]), af[mi][0],
                        af[mi][1], af[mi][2], af[mi][3]);
#pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                const int q = lane >> 3;
                ldsm_x4(smem_addr(b_tile(wn * 32 + pr * 16 + (lane & 7) + (q >> 1) * 8, ks * 16 + (q & 1) * 8)),
                        bfr[2 * pr][0], bfr[2 * pr][1], bfr[2 * pr + 1][0], bfr[2 * pr + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int nj = 0; nj < 4; nj++)
                    mma_bf16_16816(sum[mi][nj], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[nj][0], bfr[nj][1]);
        }
        if constexpr (kFp8) {  // this stage's sums times their block's scale
            const int block = kt * BK / kFp8Block;
            float sc[4][2];
#pragma unroll
            for (int nj = 0; nj < 4; nj++)
#pragma unroll
                for (int c = 0; c < 2; c++) sc[nj][c] = __ldg(s_row[nj][c] + block);
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int nj = 0; nj < 4; nj++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        acc[mi][nj][c] = fmaf(part[mi][nj][c], sc[nj][c & 1], acc[mi][nj][c]);
                        part[mi][nj][c] = 0.0f;
                    }
        }
    }
    cp_async_wait<0>();
    const int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int p = p0 + wm_ * 32 + mi * 16 + g + 8 * half;
            if (p >= p_end) continue;
            if (kGateUp) {
#pragma unroll
                for (int nj = 0; nj < 2; nj++) {
                    const int col = blockIdx.y * (kGroupCols / 2) + wn * 16 + nj * 8 + c2;
                    if (col >= I) continue;
                    float v[2];
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        v[c] = round_bf16(siluf_(round_bf16(acc[mi][nj][2 * half + c]))) *
                               round_bf16(acc[mi][nj + 2][2 * half + c]);
                    *reinterpret_cast<__nv_bfloat162*>(out + int64_t(p) * I + col) = __floats2bfloat162_rn(v[0], v[1]);
                }
            } else {
                const float wt = weights[choice[p]];
#pragma unroll
                for (int nj = 0; nj < 4; nj++) {
                    const int col = blockIdx.y * kGroupCols + wn * 32 + nj * 8 + c2;
                    if (col >= N) continue;
                    float v[2];
#pragma unroll
                    for (int c = 0; c < 2; c++) v[c] = round_bf16(round_bf16(acc[mi][nj][2 * half + c]) * wt);
                    *reinterpret_cast<__nv_bfloat162*>(out + int64_t(p) * N + col) = __floats2bfloat162_rn(v[0], v[1]);
                }
            }
        }
}

// The grouped GEMM's dynamic shared memory: group_stages<BK>() stages of A and W tiles (bf16 W, BK 128: 104,448
// bytes, two blocks an SM; BK 64: 82,944; FP8 and Q8 W: the stages' codes and one bf16 tile, BK 128: 106,496; BK 64:
// 76,800; Q4 BK 128: 90,112), opted in above the 48 KB default with the largest carveout, once per device and kernel.
template <int BK, int kW>
constexpr size_t moe_grouped_gemm_smem() {
    const size_t a = size_t(group_stages<BK>()) * kGroupRows * (BK + kGroupPad) * sizeof(bf16);
    if (kW == kWBf16) return a + size_t(group_stages<BK>()) * kGroupCols * (BK + kGroupPad) * sizeof(bf16);
    const size_t row = size_t(BK) * (kW == kWQ4 ? 4 : 8) / 8 + 16;  // (bytes of a stage's W row: codes and a pad)
    return a + size_t(group_stages<BK>()) * kGroupCols * row + size_t(kGroupCols) * (BK + kGroupPad) * sizeof(bf16);
}

template <bool kGateUp, int BK, int kW>
void moe_grouped_gemm_opt_in() {
    static std::atomic<uint64_t> done{0};
    opt_in_smem(moe_grouped_gemm_kernel<kGateUp, BK, kW>, moe_grouped_gemm_smem<BK, kW>(), done,
                "cudaFuncSetAttribute (MoE grouped GEMM shared memory)", true);
}

// Both grouped GEMMs (gate/up with the SiLU product, then down) with BK values a stage.
template <int BK, int kW>
void moe_grouped_gemms(const bf16* x, const int32_t* src_row, const ExpertMatrix& gate_up, const ExpertMatrix& down,
                       int H, int I, int max_tiles, const int32_t* tiles, const int32_t* choice, const float* weights,
                       bf16* act, bf16* y_slot, const LaunchContext& ctx) {
    moe_grouped_gemm_opt_in<true, BK, kW>();
    moe_grouped_gemm_opt_in<false, BK, kW>();
    launch(moe_grouped_gemm_kernel<true, BK, kW>, dim3(unsigned(max_tiles), ceil_div(I, kGroupCols / 2)), kGroupThreads,
           moe_grouped_gemm_smem<BK, kW>(), ctx, "MoE grouped gate/up kernel", x, src_row, gate_up, 2 * I, H, I, tiles,
           choice, weights, act);
    launch(moe_grouped_gemm_kernel<false, BK, kW>, dim3(unsigned(max_tiles), ceil_div(H, kGroupCols)), kGroupThreads,
           moe_grouped_gemm_smem<BK, kW>(), ctx, "MoE grouped down kernel", static_cast<const bf16*>(act), src_row,
           down, H, I, I, tiles, choice, weights, y_slot);
}

// y[t, :] = the bf16 running sum of the row's k weighted expert outputs (y_slot at their sorted positions) in
// increasing expert id; one block per row, two columns per thread.
__global__ void moe_combine_kernel(const bf16* __restrict__ y_slot, const int32_t* __restrict__ pos,
                                   const int32_t* __restrict__ ids, int E, int H, int k, bf16* y) {
    __shared__ int order[kMaxTopK];
    __shared__ int n_valid;
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.x;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int id = lane < k ? ids[t * k + lane] : 0;
        const bool valid = lane < k && id >= 0 && id < E;
        // out-of-range ids (the router makes none) sort last and are skipped
        const int rank = choice_rank(valid ? id : INT_MAX, lane, k);
        const unsigned vm = __ballot_sync(0xffffffffu, valid);
        if (valid) order[rank] = pos[t * k + lane];
        if (lane == 0) n_valid = __popc(vm);
    }
    __syncthreads();
    for (int h = 2 * threadIdx.x; h < H; h += 2 * blockDim.x) {
        float a0 = 0.0f, a1 = 0.0f;
        for (int j = 0; j < n_valid; j++) {
            const float2 v =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(y_slot + int64_t(order[j]) * H + h));
            a0 = round_bf16(a0 + v.x);
            a1 = round_bf16(a1 + v.y);
        }
        *reinterpret_cast<__nv_bfloat162*>(y + t * H + h) = __floats2bfloat162_rn(a0, a1);
    }
}

// One block per row. H a multiple of 8: 16-byte words, the gate's loaded before the PDL wait (a weight).
__global__ void add_sigmoid_gated_kernel(bf16* y, const bf16* __restrict__ s, const bf16* __restrict__ x,
                                         const bf16* __restrict__ gate, int H) {
    __shared__ float scratch[32];
    pdl_trigger();
    const int64_t t = blockIdx.x;
    float g = 0.0f;
    if (H % 8 == 0) {
        const int H8 = H / 8;
        const uint4* g4 = reinterpret_cast<const uint4*>(gate);
        const uint4 g0 = int(threadIdx.x) < H8 ? __ldg(g4 + threadIdx.x) : make_uint4(0u, 0u, 0u, 0u);
        pdl_wait();
        const uint4* x4 = reinterpret_cast<const uint4*>(x + t * H);
        for (int w = threadIdx.x; w < H8; w += blockDim.x) {
            float xf[8], gf[8];
            unpack8(x4[w], xf);
            unpack8(w == int(threadIdx.x) ? g0 : __ldg(g4 + w), gf);
#pragma unroll
            for (int c = 0; c < 8; c++) g = fmaf(xf[c], gf[c], g);
        }
        g = round_bf16(block_sum(g, scratch));
        const float sg = round_bf16(1.0f / (1.0f + expf(-g)));
        uint4* y4 = reinterpret_cast<uint4*>(y + t * H);
        const uint4* s4 = reinterpret_cast<const uint4*>(s + t * H);
        for (int w = threadIdx.x; w < H8; w += blockDim.x) {
            float yf[8], sf[8];
            unpack8(y4[w], yf);
            unpack8(s4[w], sf);
#pragma unroll
            for (int c = 0; c < 8; c++) yf[c] += round_bf16(sg * sf[c]);
            y4[w] = pack8(yf);
        }
        return;
    }
    pdl_wait();
    for (int i = threadIdx.x; i < H; i += blockDim.x) g = fmaf(to_f32(x[t * H + i]), to_f32(gate[i]), g);
    g = round_bf16(block_sum(g, scratch));
    const float sg = round_bf16(1.0f / (1.0f + expf(-g)));
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        y[t * H + i] = to_bf16(to_f32(y[t * H + i]) + round_bf16(sg * to_f32(s[t * H + i])));
}

}  // namespace

void check_moe_route(int E, int k) {
    if (k < 1 || k > kMaxTopK || k > E || E > kMaxExperts)
        throw Error(Status::unsupported, "CUDA MoE router: " + std::to_string(E) + " experts, top-" +
                                             std::to_string(k) + " (supported: up to 4096 experts, top-32)");
}

void moe_top_k(const bf16* router_logits, int64_t rows, int E, int k, bool normalize, float* weights, int32_t* ids,
               const LaunchContext& ctx) {
    if (rows <= 0) return;
    check_moe_route(E, k);
    if (E <= 256)
        return launch(moe_route_warp_kernel<8>, unsigned(rows), 32, 0, ctx, "MoE top-k kernel", router_logits, E, k,
                      normalize, weights, ids);
    if (E <= 512)
        return launch(moe_route_warp_kernel<16>, unsigned(rows), 32, 0, ctx, "MoE top-k kernel", router_logits, E, k,
                      normalize, weights, ids);
    if (E <= 1024)
        return launch(moe_route_warp_kernel<32>, unsigned(rows), 32, 0, ctx, "MoE top-k kernel", router_logits, E, k,
                      normalize, weights, ids);
    launch(moe_route_kernel, unsigned(rows), kRouteThreads, size_t(E) * 4, ctx, "MoE top-k kernel", router_logits, E, k,
           normalize, weights, ids);
}

size_t moe_index_ints(int64_t rows, int E, int k) {
    const int64_t n = rows * k;
    return size_t(3 * n + 3 * moe_max_tiles(rows, E, k));
}

int64_t moe_max_tiles(int64_t rows, int E, int k) {
    const int64_t n = rows * k;
    return (n + kGroupRows - 1) / kGroupRows + std::min<int64_t>(E, n);
}

bool moe_grouped(int64_t rows, int H, int I, const LaunchContext& ctx, DType weights) {
    const int align = weights == DType::BF16 ? 8 : 16;
    return rows >= (is_fp8(weights) ? ctx.moe_grouped_min_rows_fp8 : ctx.moe_grouped_min_rows) && H % align == 0 &&
           I % align == 0;
}

bool moe_fuses_shared(int64_t rows, int H, int I, int Is, const LaunchContext& ctx, DType weights) {
    // (from 32 rows the shared expert's own GEMV/GEMM, which reads its weights once for all rows, is faster: run 98)
    return rows <= kMoeFusedSharedMaxRows && !moe_grouped(rows, H, I, ctx, weights) && H % 8 == 0 && Is % 8 == 0 &&
           Is > 0;
}

namespace {

// moe_experts for one weight type (kW).
template <int kW>
void moe_experts_as(const bf16* x, int64_t rows, const MoeExperts& ex, int H, const float* weights, const int32_t* ids,
                    int k, const MoeShared* shared, const MoeScratch& scratch, bf16* y, const LaunchContext& ctx) {
    const int E = ex.n_experts, I = ex.intermediate;
    const ExpertMatrix gate_up{ex.gate_up.data, ex.gate_up.scales, ex.gate_up.scale_segment_rows,
                               int(ex.gate_up.group)};
    const ExpertMatrix down{ex.down.data, ex.down.scales, ex.down.scale_segment_rows, int(ex.down.group)};
    const DType wtype = ex.gate_up.dtype;
    if (!moe_grouped(rows, H, I, ctx, wtype)) {
        const MoeShared sh = shared ? *shared : MoeShared{};
        ExpertGateUpArgs a;
        a.x = x;
        a.gate_up = gate_up.w;
        a.gate_up_scales = gate_up.scales;
        a.segment_rows = gate_up.segment_rows;
        a.ids = ids;
        a.E = E;
        a.H = H;
        a.I = I;
        a.k = k;
        a.rows = rows;
        a.shared_gate_proj = sh.gate_proj.w;
        a.shared_up_proj = sh.up_proj.w;
        a.shared_gate_scales = sh.gate_proj.scales;
        a.shared_up_scales = sh.up_proj.scales;
        a.shared_gate = sh.gate;
        a.Is = sh.Is;
        a.act = scratch.act;
        a.shared_act = scratch.shared_act;
        a.shared_gate_out = scratch.shared_gate;
        const int cols = std::max(I, sh.Is);
        const bool gemv_rows = kMoeGateUpGemv && rows <= kMoeGateUpGemvMaxRows;
        if (kW == kWBf16 && gemv_rows && gemv_expert_gate_up_fits(a))
            gemv_expert_gate_up(a, ctx);
        else if (is_fp8_w(kW) && gemv_rows && (sh.Is == 0 || sh.quantized) && gemv_fp8_expert_gate_up_fits(a))
            gemv_fp8_expert_gate_up(a, kW == kWE5M2, ctx);
        else
            launch(moe_gate_up_kernel<kW>, dim3(unsigned(rows * k + (shared ? rows : 0)), ceil_div(cols, kMoeWarps)),
                   kMoeWarps * 32, 0, ctx, "MoE gate/up kernel", x, gate_up, ids, E, H, I, k, rows, scratch.act, sh,
                   scratch.shared_act, scratch.shared_gate);
        // (the prefetching down kernel: bf16, or FP8 with the shared expert, if any, FP8 too)
        const bool down_rows = rows <= 2 && (kW == kWBf16 ? I % 8 == 0
                                                          : is_fp8_w(kW) && I % 16 == 0 && H % 8 == 0 &&
                                                                (sh.Is == 0 || (sh.quantized && sh.Is % 16 == 0)));
        if (down_rows)
            launch(moe_down_rows_kernel < kW == kWBf16 || is_fp8_w(kW) ? kW : kWBf16 >,
                   dim3(unsigned(rows), ceil_div(H, kDownRows)), (kDownWarps + 1) * 32, 0, ctx,
                   "MoE down kernel (prefetching)", static_cast<const bf16*>(scratch.act), down, weights, ids, E, H, I,
                   k, ctx.evict_first, sh, static_cast<const bf16*>(scratch.shared_act),
                   static_cast<const float*>(scratch.shared_gate), y);
        else
            launch(moe_down_kernel<kW>, dim3(unsigned(rows), ceil_div(H, kMoeWarps)), kMoeWarps * 32, 0, ctx,
                   "MoE down kernel", static_cast<const bf16*>(scratch.act), down, weights, ids, E, H, I, k, sh,
                   static_cast<const bf16*>(scratch.shared_act), static_cast<const float*>(scratch.shared_gate), y);
        return;
    }
    const int n = int(rows * k);
    const int max_tiles = int(moe_max_tiles(rows, E, k));
    int32_t* src_row = scratch.index;
    int32_t* choice = src_row + n;
    int32_t* pos = choice + n;
    int32_t* tiles = pos + n;
    launch(moe_group_kernel, unsigned(E), kGroupScanThreads, size_t(E) * 4, ctx, "MoE grouping kernel", ids, n, k, E,
           max_tiles, src_row, choice, pos, tiles);
    if (!ctx.moe_group_k64 && size_t(ctx.smem_optin) >= moe_grouped_gemm_smem<128, kW>())
        moe_grouped_gemms<128, kW>(x, src_row, gate_up, down, H, I, max_tiles, tiles, choice, weights, scratch.act,
                                   scratch.y_slot, ctx);
    else
        moe_grouped_gemms<64, kW>(x, src_row, gate_up, down, H, I, max_tiles, tiles, choice, weights, scratch.act,
                                  scratch.y_slot, ctx);
    launch(moe_combine_kernel, unsigned(rows), 256, 0, ctx, "MoE combine kernel",
           static_cast<const bf16*>(scratch.y_slot), static_cast<const int32_t*>(pos), ids, E, H, k, y);
}

}  // namespace

bool moe_experts_take(const Matrix& gate_up, const Matrix& down) {
    if (gate_up.dtype != down.dtype) return false;
    if (is_int_quant(gate_up.dtype))
        return int_quant_shape_ok(gate_up.cols, gate_up.group) && int_quant_shape_ok(down.cols, down.group);
    return gate_up.dtype == DType::BF16 || is_fp8(gate_up.dtype);
}

void moe_experts(const bf16* x, int64_t rows, const MoeExperts& ex, int H, const float* weights, const int32_t* ids,
                 int k, const MoeShared* shared, const MoeScratch& scratch, bf16* y, const LaunchContext& ctx) {
    if (rows <= 0) return;
    const DType t = ex.gate_up.dtype;
    if (!moe_experts_take(ex.gate_up, ex.down))
        throw Error(Status::internal, std::string("CUDA MoE experts: weights ") + dtype_name(t) + " / " +
                                          dtype_name(ex.down.dtype) +
                                          " (supported: both BF16, F8_E4M3, F8_E5M2, Q8 or Q4 with valid groups)");
    if (shared && !moe_fuses_shared(rows, H, ex.intermediate, shared->Is, ctx, t))
        throw Error(Status::internal, "CUDA MoE experts: a shared expert cannot be fused for these rows");
    if (t == DType::BF16) return moe_experts_as<kWBf16>(x, rows, ex, H, weights, ids, k, shared, scratch, y, ctx);
    if (t == DType::F8_E4M3) return moe_experts_as<kWE4M3>(x, rows, ex, H, weights, ids, k, shared, scratch, y, ctx);
    if (t == DType::Q8) return moe_experts_as<kWQ8>(x, rows, ex, H, weights, ids, k, shared, scratch, y, ctx);
    if (t == DType::Q4) return moe_experts_as<kWQ4>(x, rows, ex, H, weights, ids, k, shared, scratch, y, ctx);
    moe_experts_as<kWE5M2>(x, rows, ex, H, weights, ids, k, shared, scratch, y, ctx);
}

void add_sigmoid_gated(bf16* y, const bf16* s, const bf16* x, const bf16* gate, int64_t rows, int H,
                       const LaunchContext& ctx) {
    if (rows <= 0) return;
    launch(add_sigmoid_gated_kernel, unsigned(rows), 256, 0, ctx, "MoE shared-expert gate kernel", y, s, x, gate, H);
}

HY_CUDA_TRACE_BINDER(moe)

}  // namespace hy::cuda
