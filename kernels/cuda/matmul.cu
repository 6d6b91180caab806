#include "kernels/cuda/matmul.cuh"

#include "kernels/cuda/gemm_wgmma.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace hy::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw Error(Status::backend, std::string("cuBLASLt error in ") + what + ": status " + std::to_string(int(s)));
}

// ---- the decode GEMV ----
// A row of W is read by kSplit warps (each takes every kSplit-th 512-byte piece: lane l of part q reads the
// 16-byte words l + 32 q, l + 32 q + 32 kSplit, ...); a lane holds kPer words per round. The launch shape
// (gemv_config) gives most rows a single round: every weight load of a warp is issued at once, before the kernel
// waits for its predecessor (PDL, cuda_common.cuh): weights are never written by a kernel, so while the previous
// kernel finishes, this one already streams its weights; x (8 values per word, reused by every warp, from L1/L2)
// is read after the wait. Partial sums are warp-reduced, then added in part order: each output is a fixed-order
// fp32 sum that depends only on K (the launch shape is chosen from K), not on the group or the batch.
template <int kPer>
__device__ __forceinline__ void load_round(const uint4* __restrict__ wr, int base, int step, int K8, uint4* wv,
                                           uint64_t pol) {
#pragma unroll
    for (int u = 0; u < kPer; u++)
        if (base + step * u < K8) wv[u] = ld_weight(wr + base + step * u, pol);
}

// acc[r][t] += the words base, base + step, ... (kPer of them, below K8) of row r times the same words of x[t]
// (each word of x is loaded once for the kR rows).
template <int NT, int kPer, int kR>
__device__ __forceinline__ void fma_round(const uint4 (&wv)[kR][kPer], const bf16* __restrict__ x, int K, int base,
                                          int step, float (&acc)[kR][NT]) {
    const int K8 = K / 8;
#pragma unroll
    for (int u = 0; u < kPer; u++) {
        const int word = base + step * u;
        if (word >= K8) break;
        float wf[kR][8];
#pragma unroll
        for (int r = 0; r < kR; r++) unpack8(wv[r][u], wf[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xf[8];
            unpack8(__ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K) + word), xf);
#pragma unroll
            for (int r = 0; r < kR; r++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][t] = fmaf(wf[r][e], xf[e], acc[r][t]);
        }
    }
}

// acc[r][t] = W[row r, :] . x[t, :] over this warp's share, for kR rows of W (w_row[r]; valid[r] false: no loads,
// acc[r] stays 0). Waits for the predecessor kernel after issuing the first round of weight loads.
template <int NT, int kPer, int kR>
__device__ __forceinline__ void rows_dot(const bf16* const (&w_row)[kR], const bool (&valid)[kR],
                                         const bf16* __restrict__ x, int K, int first, int step, float (&acc)[kR][NT],
                                         uint64_t pol) {
    const int K8 = K / 8;
    uint4 wv[kR][kPer];
#pragma unroll
    for (int r = 0; r < kR; r++)
        if (valid[r]) load_round<kPer>(reinterpret_cast<const uint4*>(w_row[r]), first, step, K8, wv[r], pol);
    pdl_wait();
#pragma unroll
    for (int r = 0; r < kR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if (!valid[0]) return;  // (rows are filled in order: no valid row after an invalid one)
    for (int base = first;;) {
        fma_round<NT, kPer, kR>(wv, x, K, base, step, acc);
        base += step * kPer;
        if (base >= K8) break;
#pragma unroll
        for (int r = 0; r < kR; r++)
            if (valid[r]) load_round<kPer>(reinterpret_cast<const uint4*>(w_row[r]), base, step, K8, wv[r], pol);
    }
}

// kSplit warps per output feature of one of up to GemvGroup::kMax matrices sharing x (blocks are assigned to the
// matrices in order: matrix s owns blocks [block_end[s-1], block_end[s])).
template <int NT, typename OutT, int kSplit, int kPer>
__global__ void __launch_bounds__(gemv_block_warps<kSplit>() * 32)
    gemv_kernel(const bf16* __restrict__ x, const __grid_constant__ GemvGroup g, int K) {
    constexpr int kRows = gemv_block_warps<kSplit>() / kSplit;  // rows per block
    __shared__ float part[gemv_block_warps<kSplit>()][NT];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const GroupMember mem = group_member(g);
    void* y_out = mem.y;
    const int N = mem.n, first_block = mem.first_block;
    const int n = (int(blockIdx.x) - first_block) * kRows + warp / kSplit;
    const bool valid[1] = {n < N};
    const bf16* const w_row[1] = {mem.w + int64_t(valid[0] ? n : 0) * K};
    float acc[1][NT];
    rows_dot<NT, kPer, 1>(w_row, valid, x, K, lane + 32 * (warp % kSplit), 32 * kSplit, acc,
                          weight_policy(g.evict_first));
    if (!reduce_parts<NT, kSplit>(acc[0], part) || !valid[0] || lane != 0) return;
    OutT* y = static_cast<OutT*>(y_out);
#pragma unroll
    for (int t = 0; t < NT; t++) y[int64_t(t) * N + n] = store_as<OutT>(acc[0][t]);
}

// The MLP's gate and up projections and the activation in one pass: kSplit warps per feature n compute
// g = bf16(x.Wg[n]) and u = bf16(x.Wu[n]), write u to up_out, g to gate_out (when act_out is not gate_out) and
// bf16(bf16(silu(g)) * u) to act_out: the same memory as matmul, matmul, silu_mul. Both rows' first rounds are
// loaded before the wait.
template <int NT, int kSplit, int kPer>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_gate_up_kernel(const bf16* __restrict__ x, const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                        bf16* gate_out, bf16* up_out, bf16* act_out, int N, int K, bool evict_first) {
    constexpr int kRows = kGemvWarps / kSplit;
    __shared__ float part[kGemvWarps][2 * NT];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * kRows + warp / kSplit;
    const bool v = n < N;
    const bool valid[2] = {v, v};
    const bf16* const w_row[2] = {wg + int64_t(v ? n : 0) * K, wu + int64_t(v ? n : 0) * K};
    float acc[2][NT];  // gate, up
    rows_dot<NT, kPer, 2>(w_row, valid, x, K, lane + 32 * (warp % kSplit), 32 * kSplit, acc,
                          weight_policy(evict_first));
    if (!reduce_parts<2 * NT, kSplit>(&acc[0][0], part) || !v || lane != 0) return;
    const float* ag = acc[0];
    const float* au = acc[1];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float gv = round_bf16(ag[t]), uv = round_bf16(au[t]);
        const int64_t o = int64_t(t) * N + n;
        up_out[o] = to_bf16(uv);
        if (act_out != gate_out) gate_out[o] = to_bf16(gv);
        act_out[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
    }
}

// matmul.cuh, gemv_expert_gate_up: gemv_gate_up_kernel's loop over one choice's expert (blockIdx.y).
template <int kSplit, int kPer>
__global__ void __launch_bounds__(gemv_block_warps<kSplit>() * 32)
    gemv_expert_gate_up_kernel(const __grid_constant__ ExpertGateUpArgs a) {
    constexpr int kWarps = gemv_block_warps<kSplit>(), kRows = kWarps / kSplit;
    __shared__ float part[kWarps][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = int(blockIdx.x) * kRows + warp / kSplit;
    const int64_t n_shared = a.Is > 0 ? a.rows : 0;
    const bool shared = int64_t(blockIdx.y) < n_shared;
    const int64_t n = int64_t(blockIdx.y) - n_shared;  // the routed choice t k + j
    const int64_t H = a.H;
    const bf16* wg = nullptr;
    const bf16* wu = nullptr;
    int64_t t = 0;
    if (shared) {  // (weights: loaded before the wait, in rows_dot)
        t = blockIdx.y;
        if (i < a.Is) {
            wg = static_cast<const bf16*>(a.shared_gate_proj) + i * H;
            wu = static_cast<const bf16*>(a.shared_up_proj) + i * H;
        } else if (i == a.Is) {
            wg = wu = a.shared_gate;  // (its dot twice: both rows' loads stay defined)
        }
    } else {
        pdl_wait();     // the routing comes from the top-k kernel
        pdl_trigger();  // (after the wait: the down kernel reads the routing before its own wait)
        t = n / a.k;
        const int e = a.ids[n];
        if (i < a.I && e >= 0 && e < a.E) {
            wg = static_cast<const bf16*>(a.gate_up) + (int64_t(e) * 2 * a.I + i) * H;
            wu = wg + int64_t(a.I) * H;
        }
    }
    const bool valid[2] = {wg != nullptr, wu != nullptr};
    const bf16* const w_row[2] = {valid[0] ? wg : a.x, valid[1] ? wu : a.x};
    float acc[2][1];
    rows_dot<1, kPer, 2>(w_row, valid, a.x + t * H, int(H), lane + 32 * (warp % kSplit), 32 * kSplit, acc,
                         weight_policy(a.evict_first));  // (waits for the predecessor; a second wait returns at once)
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

template <int kSplit, int kPer>
void expert_gate_up_launch(const ExpertGateUpArgs& a, const LaunchContext& ctx) {
    constexpr int kRows = gemv_block_warps<kSplit>() / kSplit;
    const int cols = a.Is > 0 ? std::max(a.I, a.Is + 1) : a.I;
    const int64_t choices = a.rows * a.k + (a.Is > 0 ? a.rows : 0);
    launch(gemv_expert_gate_up_kernel<kSplit, kPer>, dim3(unsigned(ceil_div(cols, kRows)), unsigned(choices)),
           gemv_block_warps<kSplit>() * 32, 0, ctx, "MoE gate/up GEMV kernel", a);
}

template <int NT, typename OutT, int kSplit, int kPer>
void gemv_launch(const bf16* x, GemvGroup g, int64_t K, const LaunchContext& ctx) {
    constexpr int kWarps = gemv_block_warps<kSplit>(), kRows = kWarps / kSplit;
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + kRows - 1) / kRows;
    g.evict_first = ctx.evict_first;
    launch(gemv_kernel<NT, OutT, kSplit, kPer>, unsigned(g.block_end[g.count - 1]), kWarps * 32, 0, ctx, "gemv kernel",
           x, g, int(K));
}

template <int NT, typename OutT>
void gemv_shape(const bf16* x, const GemvGroup& g, int64_t K, GemvConfig c, const LaunchContext& ctx) {
    if (c.split == 2 && c.per == 8) return gemv_launch<NT, OutT, 2, 8>(x, g, K, ctx);
    if (c.split == 4 && c.per == 8) return gemv_launch<NT, OutT, 4, 8>(x, g, K, ctx);
    if (c.split == 8 && c.per == 8) return gemv_launch<NT, OutT, 8, 8>(x, g, K, ctx);
    throw Error(Status::internal, "gemv: no kernel for split " + std::to_string(c.split) + ", " +
                                      std::to_string(c.per) + " words per lane");
}

template <typename OutT>
void gemv_rows(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, GemvConfig c, const LaunchContext& ctx) {
    switch (T) {
        case 1: return gemv_shape<1, OutT>(x, g, K, c, ctx);
        case 2: return gemv_shape<2, OutT>(x, g, K, c, ctx);
        default: throw Error(Status::internal, "gemv: " + std::to_string(T) + " rows (at most 2)");
    }
}

template <int NT>
void gate_up_launch(const bf16* x, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out, bf16* up_out,
                    bf16* act_out, const LaunchContext& ctx) {
    constexpr int kSplit = 2, kPer = 8, kRows = kGemvWarps / kSplit;
    launch(gemv_gate_up_kernel<NT, kSplit, kPer>, ceil_div(N, kRows), kGemvWarps * 32, 0, ctx,
           "gemv gate/up/SiLU kernel", x, wg, wu, gate_out, up_out, act_out, int(N), int(K), ctx.evict_first);
}

// The weight words of lane (g, q) of a warp on the 16-feature tile whose row g is `row`: word q of rows row and
// row + 8 of each of kM matrices of K values a row (row 0 where the row is past the matrix: va, vb false).
template <int kM>
__device__ __forceinline__ void tile_weight_words(const bf16* const (&w)[kM], int row, bool va, bool vb, int K, int q,
                                                  const uint4* (&wa)[kM], const uint4* (&wb)[kM]) {
#pragma unroll
    for (int m = 0; m < kM; m++) {
        wa[m] = reinterpret_cast<const uint4*>(w[m] + int64_t(va ? row : 0) * K) + q;
        wb[m] = reinterpret_cast<const uint4*>(w[m] + int64_t(vb ? row + 8 : 0) * K) + q;
    }
}

// ---- the small-batch GEMV on tensor cores (3 to 16 rows of x: one or two mma n-tiles of 8 rows) ----
// With more than 2 rows the GEMV above becomes bound by reading x from L1 (every weight word meets every row),
// so here the products run on tensor cores: mma.sync m16n8k16 with A = 16 weight rows x 16 k, B = 16 k x 8 rows
// of x (rows >= T are zeros), fp32 accumulation. A warp owns a tile of 16 output features and every kParts-th
// chunk of 32 k of it (the kParts warps of a block share the tile and are summed in a fixed order at the end).
// The k order inside a chunk is permuted the same way for A and B (a dot product does not care): lane (g = lane/4,
// q = lane%4) loads the 16-byte words W[row g][8q .. 8q+7] and W[row g+8][...] and x[row g][8q .. 8q+7] of the
// chunk, and the two mma of the chunk take its halves {8q+0,1 | 8q+2,3} and {8q+4,5 | 8q+6,7} as k = {2q, 2q+1 |
// 2q+8, 2q+9}. A round is kUnroll chunks a warp; the loads of round r + 1 (weights and x) are issued before the
// products of round r, so a warp always has a round in flight (weights of the first round before the PDL wait).
// Each output sums the same products in the same order whatever T is (the launch shape depends on K and the
// group's tile count only; each n-tile's sums run the same chunks in the same order), so a row of x gets the same
// result in any batch of 3 to 16 rows.
// acc[m][nt] (the mma C fragment: feature row0 + g, x rows 8 nt + 2q, + 1; feature row0 + g + 8, same x rows) =
// this warp's share of W_m[row0 .. row0 + 15, :] . x[t, :] for kM matrices of N rows over the same x and kNT
// n-tiles of 8 rows, then summed over the block's kParts warps in warp order into warp 0's acc (red: kParts x 32 x
// 4 kM kNT floats of shared memory). Returns
// false in the other warps. Waits for the predecessor kernel after issuing the first round of weight loads.
template <int kParts, int kUnroll, int kM, int kNT>
__device__ __forceinline__ bool mma_tile_dot(const bf16* __restrict__ x, int T, const bf16* const (&w)[kM], int N,
                                             int row0, int K, bool evict_first, float (*red)[32][4 * kM * kNT],
                                             float (&acc)[kM][kNT][4]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
    const bool va = row0 + gi < N, vb = row0 + gi + 8 < N;
    const uint4* wa[kM];
    const uint4* wb[kM];
    tile_weight_words(w, row0 + gi, va, vb, K, q, wa, wb);
    const uint4* xr[kNT];
    bool vx[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; nt++) {
        vx[nt] = gi + 8 * nt < T;
        xr[nt] = reinterpret_cast<const uint4*>(x + int64_t(vx[nt] ? gi + 8 * nt : 0) * K) + q;
    }
    const int n_chunks = K / 32;
    constexpr int kStep = kParts * kUnroll;  // chunks of a block per round
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const uint64_t pol = weight_policy(evict_first);
    auto load_w = [&](uint4(&ra)[kM][kUnroll], uint4(&rb)[kM][kUnroll], int c0) {
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const int c = c0 + kParts * u;
                ra[m][u] = c < n_chunks && va ? ld_weight(wa[m] + 4 * c, pol) : zero;
                rb[m][u] = c < n_chunks && vb ? ld_weight(wb[m] + 4 * c, pol) : zero;
            }
    };
    auto load_x = [&](uint4(&rx)[kNT][kUnroll], int c0) {
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const int c = c0 + kParts * u;
                rx[nt][u] = c < n_chunks && vx[nt] ? __ldg(xr[nt] + 4 * c) : zero;
            }
    };
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nt][i] = 0.0f;
    uint4 ra[kM][kUnroll], rb[kM][kUnroll], rx[kNT][kUnroll];
    load_w(ra, rb, warp);
    pdl_wait();
    load_x(rx, warp);
    for (int c0 = warp; c0 < n_chunks; c0 += kStep) {
        uint4 na[kM][kUnroll], nb[kM][kUnroll], nx[kNT][kUnroll];
        load_w(na, nb, c0 + kStep);  // (past the end: no loads, zeros)
        load_x(nx, c0 + kStep);
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int nt = 0; nt < kNT; nt++)
#pragma unroll
                for (int u = 0; u < kUnroll; u++) {
                    const uint4& b = rx[nt][u];
                    mma_bf16_16816(acc[m][nt], ra[m][u].x, rb[m][u].x, ra[m][u].y, rb[m][u].y, b.x, b.y);
                    mma_bf16_16816(acc[m][nt], ra[m][u].z, rb[m][u].z, ra[m][u].w, rb[m][u].w, b.z, b.w);
                }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
#pragma unroll
            for (int m = 0; m < kM; m++) {
                ra[m][u] = na[m][u];
                rb[m][u] = nb[m][u];
            }
#pragma unroll
            for (int nt = 0; nt < kNT; nt++) rx[nt][u] = nx[nt][u];
        }
    }
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][lane][4 * (kNT * m + nt) + i] = acc[m][nt][i];
    __syncthreads();
    if (warp != 0) return false;
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 4 * (kNT * m + nt) + i;
                float v = red[0][lane][j];
#pragma unroll
                for (int p = 1; p < kParts; p++) v += red[p][lane][j];
                acc[m][nt][i] = v;
            }
    return true;
}

template <typename OutT, int kParts, int kUnroll, int kNT>
__global__ void __launch_bounds__(kParts * 32)
    gemv_mma_kernel(const bf16* __restrict__ x, int T, const __grid_constant__ GemvGroup g, int K) {
    __shared__ float red[kParts][32][4 * kNT];
    pdl_trigger();
    const GroupMember mem = group_member(g);
    const int N = mem.n, row0 = (int(blockIdx.x) - mem.first_block) * 16;
    const bf16* const w[1] = {mem.w};
    float acc[1][kNT][4];
    if (!mma_tile_dot<kParts, kUnroll, 1, kNT>(x, T, w, N, row0, K, g.evict_first, red, acc)) return;
    OutT* y = static_cast<OutT*>(mem.y);
    const int lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int t = 8 * nt + 2 * q + (i & 1), n = row0 + gi + (i >= 2 ? 8 : 0);
            if (t < T && n < N) y[int64_t(t) * N + n] = store_as<OutT>(acc[0][nt][i]);
        }
}

// gate and up (N rows each) of 3 to 16 rows of x in one pass, with gemv_gate_up_kernel's outputs and roundings
template <int kParts, int kUnroll, int kNT>
__global__ void __launch_bounds__(kParts * 32)
    gemv_mma_gate_up_kernel(const bf16* __restrict__ x, int T, const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                            bf16* gate_out, bf16* up_out, bf16* act_out, int N, int K, bool evict_first) {
    __shared__ float red[kParts][32][8 * kNT];
    pdl_trigger();
    const int row0 = int(blockIdx.x) * 16;
    const bf16* const w[2] = {wg, wu};
    float acc[2][kNT][4];
    if (!mma_tile_dot<kParts, kUnroll, 2, kNT>(x, T, w, N, row0, K, evict_first, red, acc)) return;
    const int lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int t = 8 * nt + 2 * q + (i & 1), n = row0 + gi + (i >= 2 ? 8 : 0);
            if (t >= T || n >= N) continue;
            const float gv = round_bf16(acc[0][nt][i]), uv = round_bf16(acc[1][nt][i]);
            const int64_t o = int64_t(t) * N + n;
            up_out[o] = to_bf16(uv);
            if (act_out != gate_out) gate_out[o] = to_bf16(gv);
            act_out[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
        }
}

template <typename OutT, int kParts, int kUnroll>
void gemv_mma_launch(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, const LaunchContext& ctx) {
    if (T > 8)
        launch(gemv_mma_kernel<OutT, kParts, kUnroll, 2>, unsigned(g.block_end[g.count - 1]), kParts * 32, 0, ctx,
               "tensor-core gemv kernel (16 rows)", x, int(T), g, int(K));
    else
        launch(gemv_mma_kernel<OutT, kParts, kUnroll, 1>, unsigned(g.block_end[g.count - 1]), kParts * 32, 0, ctx,
               "tensor-core gemv kernel", x, int(T), g, int(K));
}

template <typename OutT>
void gemv_mma(const bf16* x, int64_t T, GemvGroup g, int64_t K, MmaGemvConfig c, const LaunchContext& ctx) {
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + 15) / 16;
    g.evict_first = ctx.evict_first;
    if (c.parts == 8 && c.unroll == 4) return gemv_mma_launch<OutT, 8, 4>(x, T, g, K, ctx);
    if (c.parts == 8 && c.unroll == 2) return gemv_mma_launch<OutT, 8, 2>(x, T, g, K, ctx);
    if (c.parts == 16 && c.unroll == 2) return gemv_mma_launch<OutT, 16, 2>(x, T, g, K, ctx);
    if (c.parts == 16 && c.unroll == 4) return gemv_mma_launch<OutT, 16, 4>(x, T, g, K, ctx);
    if (c.parts == 4 && c.unroll == 4) return gemv_mma_launch<OutT, 4, 4>(x, T, g, K, ctx);
    throw Error(Status::internal,
                "tensor-core gemv: no launch shape " + std::to_string(c.parts) + "," + std::to_string(c.unroll));
}

// ---- The tensor-core GEMV for 9 to 64 rows: x and the weights through shared memory, a tile's K parts in a cluster
// With more rows the register kernel above becomes bound by its x loads (every warp reads all rows of x for its 16
// features: at 64 rows four times the weight bytes). Here the products and their order are the same as in
// mma_tile_dot, but the work is laid out differently: the kParts warps that share a 16-feature tile live in the
// kWideCluster blocks of a thread-block cluster (kPB parts per block), and a block holds kTiles tiles of the same
// parts, so each chunk of x it copies into shared memory serves kTiles x 16 features (x: 64 / (16 kTiles) of the
// weight bytes at 64 rows). Each lane copies its own weight words (the A fragments) into shared memory as well, so
// that kWideStages - 1 rounds of weights are in flight without holding registers (the first rounds' before the PDL
// wait). At the end each block leaves its warps' fp32 sums in shared memory and each block of the cluster sums a
// share of the tile outputs over the kParts parts in part order, reading the others' shared memory (distributed
// shared memory), as mma_tile_dot sums its warps: a row's result is bitwise the same as the 3-16-row kernel's for
// the same K, in any batch of 3 to 64 rows.
constexpr int kWideCluster = 8;  // blocks per cluster (kParts / kPB)
constexpr int kWideStages = 4;   // rounds of x and weights in shared memory
constexpr int kWideWarps = 8;    // warps per block for one matrix (kM = 1; gate/up: 4)

template <int kM, int kPB>
constexpr int wide_tiles() {
    return kWideWarps / (kM * kPB) > 0 ? kWideWarps / (kM * kPB) : 1;
}
// 16-byte words of a stage: x [kPB][kU][8 kNT rows][4], then the weights [warp][kM][kU][2][32 lanes]
template <int kM, int kNT, int kPB, int kU>
constexpr int wide_stage_words() {
    return kPB * kU * 8 * kNT * 4 + wide_tiles<kM, kPB>() * kPB * kM * kU * 2 * 32;
}
template <int kM, int kNT, int kPB, int kU>
constexpr size_t wide_smem_bytes() {
    const size_t stages = size_t(kWideStages) * wide_stage_words<kM, kNT, kPB, kU>() * 16;
    const size_t red = size_t(kPB) * wide_tiles<kM, kPB>() * kM * kNT * 4 * 32 * 4;
    return stages > red ? stages : red;
}

// x [T <= 8 kNT, K] against kM matrices w[m] of N rows: the block's kTiles tiles start at feature 16 tile0; calls
// epi(v[kM], t, n) once for each output (t < T, n < N) that this block of the cluster sums. Every thread of every
// block of the cluster must call it (it holds two cluster barriers).
template <int kM, int kNT, int kPB, int kU, typename Epi>
__device__ __forceinline__ void wide_tile_dot(const bf16* __restrict__ x, int T, const bf16* const (&w)[kM], int N,
                                              int tile0, int K, bool evict_first, Epi&& epi) {
    constexpr int kTiles = wide_tiles<kM, kPB>();
    constexpr int kThreads = kTiles * kPB * 32;
    constexpr int kRowsX = 8 * kNT;
    constexpr int kP = kWideCluster * kPB;  // parts of a tile (mma_tile_dot's kParts)
    constexpr int kXWords = kPB * kU * kRowsX * 4;
    constexpr int kStageWords = wide_stage_words<kM, kNT, kPB, kU>();
    extern __shared__ __align__(16) unsigned char wide_smem[];
    uint4* stages = reinterpret_cast<uint4*>(wide_smem);  // [kWideStages][kStageWords]
    float* red = reinterpret_cast<float*>(wide_smem);     // after the products: [kPB][kTiles][kM][kNT][4][32]
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, gi = lane >> 2, q = lane & 3;
    const int j = warp % kPB, f = warp / kPB;
    const int rank = int(blockIdx.x) % kWideCluster;
    const int p_first = rank * kPB, p = p_first + j;
    const int n_chunks = K / 32;
    const int row0 = 16 * (tile0 + f);
    const bool va = row0 + gi < N, vb = row0 + gi + 8 < N;
    const uint4* wa[kM];
    const uint4* wb[kM];
    tile_weight_words(w, row0 + gi, va, vb, K, q, wa, wb);
    // chunks of the block's first part (the others have as many or one fewer); rounds of kU chunks
    const int n_first = p_first < n_chunks ? (n_chunks - p_first + kP - 1) / kP : 0;
    const int rounds = (n_first + kU - 1) / kU;
    const uint64_t pol = weight_policy(evict_first);
    // this lane's weight words of round r: [m][u][2] at stage + kXWords + ((warp * kM + m) * kU + u) * 64 + h * 32
    auto issue_w = [&](int r) {
        if (r >= rounds) return;
        uint4* st = stages + (r % kWideStages) * kStageWords + kXWords;
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int u = 0; u < kU; u++) {
                const int c = p + (r * kU + u) * kP;
                uint4* d = st + ((warp * kM + m) * kU + u) * 64 + lane;
                cp_async16_policy(smem_addr(d), c < n_chunks && va ? wa[m] + 4 * c : wa[m], c < n_chunks && va, pol);
                cp_async16_policy(smem_addr(d + 32), c < n_chunks && vb ? wb[m] + 4 * c : wb[m], c < n_chunks && vb,
                                  pol);
            }
    };
    auto issue_x = [&](int r) {  // round r's x into its stage
        if (r >= rounds) return;
        uint4* st = stages + (r % kWideStages) * kStageWords;
        for (int e = tid; e < kXWords; e += kThreads) {
            const int qw = e & 3, row = (e >> 2) % kRowsX, u = (e >> 2) / kRowsX % kU, jj = (e >> 2) / kRowsX / kU;
            const int c = p_first + jj + (r * kU + u) * kP;
            const bool ok = row < T && c < n_chunks;
            cp_async16(smem_addr(st + e), ok ? x + int64_t(row) * K + 32 * c + 8 * qw : x, ok);
        }
    };
    float acc[kM][kNT][4];
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nt][i] = 0.0f;
                // the first kWideStages - 1 rounds: weights before the PDL wait, x after; one commit group per round
#pragma unroll
    for (int s = 0; s < kWideStages - 1; s++) issue_w(s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < kWideStages - 1; s++) {
        issue_x(s);
        cp_async_commit();
    }
    for (int r = 0; r < rounds; r++) {
        cp_async_wait<kWideStages - 2>();
        __syncthreads();  // round r is in; every warp is done with round r - 1's stage, which is refilled now
        issue_w(r + kWideStages - 1);
        issue_x(r + kWideStages - 1);
        cp_async_commit();
        const uint4* st = stages + (r % kWideStages) * kStageWords;
        const uint4* sx = st + j * (kU * kRowsX * 4);
        const uint4* sw = st + kXWords + warp * kM * kU * 64 + lane;
#pragma unroll
        for (int u = 0; u < kU; u++) {
            if (p + (r * kU + u) * kP >= n_chunks) continue;  // (warp-uniform)
            uint4 ra[kM], rb[kM];
#pragma unroll
            for (int m = 0; m < kM; m++) {
                ra[m] = sw[(m * kU + u) * 64];
                rb[m] = sw[(m * kU + u) * 64 + 32];
            }
#pragma unroll
            for (int nt = 0; nt < kNT; nt++) {
                const uint4 b = sx[(u * kRowsX + 8 * nt + gi) * 4 + q];
#pragma unroll
                for (int m = 0; m < kM; m++) {
                    mma_bf16_16816(acc[m][nt], ra[m].x, rb[m].x, ra[m].y, rb[m].y, b.x, b.y);
                    mma_bf16_16816(acc[m][nt], ra[m].z, rb[m].z, ra[m].w, rb[m].w, b.z, b.w);
                }
            }
        }
    }
    cp_async_wait_all();
    __syncthreads();  // the stages are free: the sums go there
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int nt = 0; nt < kNT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[((((j * kTiles + f) * kM + m) * kNT + nt) * 4 + i) * 32 + lane] = acc[m][nt][i];
    cluster_arrive();
    cluster_wait();
    constexpr int kShare = kTiles * kNT * 4 * 32 / kWideCluster;  // outputs (x kM) each block of the cluster sums
    static_assert(kTiles * kNT * 4 * 32 % kWideCluster == 0, "the outputs split evenly over the cluster");
    const uint32_t red_addr = smem_addr(red);
    for (int e = rank * kShare + tid; e < (rank + 1) * kShare; e += kThreads) {
        const int ln = e & 31, i = (e >> 5) & 3, nt = (e >> 7) % kNT, ff = (e >> 7) / kNT;
        float v[kM];
#pragma unroll
        for (int m = 0; m < kM; m++) {
            float part[kP];
#pragma unroll
            for (int pp = 0; pp < kP; pp++) {
                const uint32_t off =
                    uint32_t((((((pp % kPB) * kTiles + ff) * kM + m) * kNT + nt) * 4 + i) * 32 + ln) * 4;
                part[pp] = ld_cluster_f32(cluster_smem_addr(red_addr + off, uint32_t(pp / kPB)));
            }
            float s = part[0];
#pragma unroll
            for (int pp = 1; pp < kP; pp++) s += part[pp];
            v[m] = s;
        }
        const int t = 8 * nt + 2 * (ln & 3) + (i & 1), n = 16 * (tile0 + ff) + (ln >> 2) + (i >= 2 ? 8 : 0);
        if (t < T && n < N) epi(v, t, n);
    }
    cluster_arrive();  // no block leaves while another may still read its shared memory
    cluster_wait();
}

// One matrix of a group per cluster (matrix s owns tile groups [block_end[s-1], block_end[s]), kTiles tiles each).
template <typename OutT, int kNT, int kPB, int kU>
__global__ void __launch_bounds__(kWideWarps * 32)
    gemv_wide_kernel(const bf16* __restrict__ x, int T, const __grid_constant__ GemvGroup g, int K) {
    pdl_trigger();
    constexpr int kTiles = wide_tiles<1, kPB>();
    const int tg = int(blockIdx.x) / kWideCluster;
    const GroupMember mem = group_member(g, tg);
    const bf16* const w[1] = {mem.w};
    OutT* y = static_cast<OutT*>(mem.y);
    const int N = mem.n;
    wide_tile_dot<1, kNT, kPB, kU>(
        x, T, w, N, (tg - mem.first_block) * kTiles, K, g.evict_first,
        [&](const float(&v)[1], int t, int n) { y[int64_t(t) * N + n] = store_as<OutT>(v[0]); });
}

// gate and up (N rows each) in one pass, with gemv_gate_up_kernel's outputs and roundings
template <int kNT, int kPB, int kU>
__global__ void __launch_bounds__(kWideWarps / 2 * 32)
    gemv_wide_gate_up_kernel(const bf16* __restrict__ x, int T, const bf16* __restrict__ wg,
                             const bf16* __restrict__ wu, bf16* gate_out, bf16* up_out, bf16* act_out, int N, int K,
                             bool evict_first) {
    pdl_trigger();
    constexpr int kTiles = wide_tiles<2, kPB>();
    const bf16* const w[2] = {wg, wu};
    wide_tile_dot<2, kNT, kPB, kU>(x, T, w, N, int(blockIdx.x) / kWideCluster * kTiles, K, evict_first,
                                   [&](const float(&v)[2], int t, int n) {
                                       const float gv = round_bf16(v[0]), uv = round_bf16(v[1]);
                                       const int64_t o = int64_t(t) * N + n;
                                       up_out[o] = to_bf16(uv);
                                       if (act_out != gate_out) gate_out[o] = to_bf16(gv);
                                       act_out[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
                                   });
}

template <int kNT, int kPB, int kU, typename OutT>
void wide_launch(const bf16* x, int64_t T, GemvGroup g, int64_t K, const LaunchContext& ctx) {
    constexpr int kTiles = wide_tiles<1, kPB>();
    for (int i = 0; i < g.count; i++)
        g.block_end[i] = (i ? g.block_end[i - 1] : 0) + int(ceil_div(ceil_div(g.n[i], 16), kTiles));
    g.evict_first = ctx.evict_first;
    constexpr size_t smem = wide_smem_bytes<1, kNT, kPB, kU>();
    static std::atomic<uint64_t> done{0};
    const char* what = "tensor-core gemv kernel (clusters, 9-64 rows)";
    opt_in_smem(gemv_wide_kernel<OutT, kNT, kPB, kU>, smem, done, what);
    launch_clusters(gemv_wide_kernel<OutT, kNT, kPB, kU>, dim3(unsigned(g.block_end[g.count - 1]) * kWideCluster),
                    dim3(kWideWarps * 32), kWideCluster, smem, ctx, what, x, int(T), g, int(K));
}

template <int kNT, int kPB, int kU>
void wide_gate_up_launch(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                         bf16* up_out, bf16* act_out, const LaunchContext& ctx) {
    constexpr int kTiles = wide_tiles<2, kPB>();
    constexpr size_t smem = wide_smem_bytes<2, kNT, kPB, kU>();
    static std::atomic<uint64_t> done{0};
    const char* what = "tensor-core gemv gate/up/SiLU kernel (clusters, 9-64 rows)";
    opt_in_smem(gemv_wide_gate_up_kernel<kNT, kPB, kU>, smem, done, what);
    launch_clusters(gemv_wide_gate_up_kernel<kNT, kPB, kU>, dim3(ceil_div(ceil_div(N, 16), kTiles) * kWideCluster),
                    dim3(kWideWarps / 2 * 32), kWideCluster, smem, ctx, what, x, int(T), wg, wu, gate_out, up_out,
                    act_out, int(N), int(K), ctx.evict_first);
}

// The launch for T rows and gemv_mma_config(K)'s parts (8: one part a block, rounds of 2 chunks; 16: two parts a
// block, rounds of 1 chunk, so that a stage stays 16 KB). The rounds do not change the sums' order.
template <typename OutT>
void wide_dispatch(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, MmaGemvConfig c, const LaunchContext& ctx) {
    auto by_rows = [&](auto pb, auto u) {
        constexpr int kPB = decltype(pb)::value, kU = decltype(u)::value;
        if (T <= 16) return wide_launch<2, kPB, kU, OutT>(x, T, g, K, ctx);
        if (T <= 32) return wide_launch<4, kPB, kU, OutT>(x, T, g, K, ctx);
        return wide_launch<8, kPB, kU, OutT>(x, T, g, K, ctx);
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    if (c.parts == 8) return by_rows(I1{}, I2{});
    if (c.parts == 16) return by_rows(I2{}, I1{});
    throw Error(Status::internal,
                "wide tensor-core gemv: no launch shape " + std::to_string(c.parts) + "," + std::to_string(c.unroll));
}

void wide_gate_up_dispatch(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K,
                           bf16* gate_out, bf16* up_out, bf16* act_out, MmaGemvConfig c, const LaunchContext& ctx) {
    auto by_rows = [&](auto pb, auto u) {
        constexpr int kPB = decltype(pb)::value, kU = decltype(u)::value;
        if (T <= 16) return wide_gate_up_launch<2, kPB, kU>(x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
        if (T <= 32) return wide_gate_up_launch<4, kPB, kU>(x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
        return wide_gate_up_launch<8, kPB, kU>(x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    if (c.parts == 8) return by_rows(I1{}, I2{});
    if (c.parts == 16) return by_rows(I2{}, I1{});
    throw Error(Status::internal, "wide tensor-core gate/up: no launch shape " + std::to_string(c.parts) + "," +
                                      std::to_string(c.unroll));
}

// Any shape and alignment (rare: odd K or unaligned rows): one warp per output feature, scalar loads.
template <typename OutT>
__global__ void matmul_scalar_kernel(const bf16* __restrict__ x, int64_t T, const bf16* __restrict__ w,
                                     OutT* __restrict__ y, int64_t N, int64_t K) {
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t n = int64_t(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
    if (n >= N) return;
    const bf16* wr = w + n * K;
    for (int64_t t = 0; t < T; t++) {
        const bf16* xr = x + t * K;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32) acc = fmaf(to_f32(wr[k]), to_f32(xr[k]), acc);
        acc = warp_sum(acc);
        if (lane == 0) y[t * N + n] = store_as<OutT>(acc);
    }
}

void matmul_scalar(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
                   const LaunchContext& ctx) {
    const unsigned grid = ceil_div(N, kGemvWarps);
    const char* what = "scalar matmul kernel";
    if (out_f32)
        launch(matmul_scalar_kernel<float>, grid, kGemvWarps * 32, 0, ctx, what, x, T, w, static_cast<float*>(y), N, K);
    else
        launch(matmul_scalar_kernel<bf16>, grid, kGemvWarps * 32, 0, ctx, what, x, T, w, static_cast<bf16*>(y), N, K);
}

}  // namespace

static_assert(kGemvBlockMaxTokens == 2, "gemv_rows and gemv_gate_up instantiate 1 and 2 rows");
static_assert(kWideGemvMaxTokens == 64, "the wide tensor-core GEMV instantiates 2, 4 and 8 n-tiles");
static_assert(kGemvMaxTokens == 8 && kTcGemvMaxTokens == 16,
              "the tensor-core GEMV takes up to 16 rows (one or two mma n-tiles of 8)");

bool gemv_fits(const bf16* x, int64_t T, const bf16* w, int64_t K) {
    return T >= 1 && T <= kGemvBlockMaxTokens && K % 8 == 0 && K <= (int64_t(1) << 30) && aligned16(x) && aligned16(w);
}

// 3 to 8 rows: every matrix with tc_all, else only groups of 3 or 4 matrices (before the pipelined kernel,
// hybrid-kernel-bench at 8 rows: the 4B q/k/v group 2.6 TB/s and the Gated DeltaNet input group 2.8 TB/s against
// 2.1 and 2.0 for their cuBLASLt calls; single matrices and the gate/up pair were faster with cuBLASLt: o_proj 2.2
// vs 1.8, down_proj 2.9 vs 2.1, gate+up 3.4 vs 2.9, lm_head 4.2 vs 3.6).
bool gemv_group_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, int count, bool tc_all, int group_max_rows) {
    if (T >= 1 && T <= kGemvBlockMaxTokens) return gemv_fits(x, T, w, K);
    if (T > group_max_rows && !tc_all) return false;  // (9-16 rows: every matrix, or groups up to group_max_rows)
    return T <= kTcGemvMaxTokens && (tc_all || count == 1 || count >= 3) && K % 32 == 0 && K <= (int64_t(1) << 30) &&
           aligned16(x) && aligned16(w);
}

// Measured on an H200 (docs/perf-notes.md, hybrid-kernel-bench, 4B shapes, PDL on): rows up to 3072 values take 2
// warps of 8 words per lane (K = 2560: 3.9-4.6 TB/s, against 3.6-4.2 with 4 warps), up to 8192 values 4 warps of
// 8 words (o_proj, K = 4096: 3.2 TB/s against 2.4 with 2 and 3.0 with 8 warps), longer rows 8 warps of 8 words
// (down_proj, K = 9216: 3.8 TB/s against 3.4 with 4 warps of 16 words); past 16384 values, several rounds.
GemvConfig gemv_config(int64_t K) {
    const int64_t K8 = K / 8;
    if (K8 <= 32 * 12) return {2, 8};
    if (K8 <= 32 * 4 * 8) return {4, 8};
    return {8, 8};
}

void gemv(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
          const LaunchContext& ctx) {
    GemvGroup g;
    g.add(w, y, N);
    gemv_group(x, T, g, K, out_f32, ctx);
}

void gemv_group(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, const LaunchContext& ctx) {
    gemv_group_with(x, T, g, K, out_f32, gemv_config(K), ctx);
}

void gemv_group_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, GemvConfig c,
                     const LaunchContext& ctx) {
    if (g.count < 1 || g.count > GemvGroup::kMax) throw Error(Status::internal, "gemv: bad group");
    if (gemv_wide_rows(T, ctx)) return gemv_wide_with(x, T, g, K, out_f32, gemv_mma_config(K), ctx);
    if (wgmma_gemm_rows(T, ctx)) return wgmma_gemm_group(x, T, g, K, out_f32, ctx);
    if (T > kGemvBlockMaxTokens) return gemv_mma_with(x, T, g, K, out_f32, gemv_mma_config(K), ctx);
    if (out_f32)
        gemv_rows<float>(x, T, g, K, c, ctx);
    else
        gemv_rows<bf16>(x, T, g, K, c, ctx);
}

// hybrid-kernel-bench at 4 and 8 rows, H200, 4B shapes (run 124): K = 2560 (the projection groups, gate/up, lm_head)
// 8 warps of 2 chunks (3.1-3.5 TB/s, lm_head 3.9-4.0), K = 4096 (o_proj, out_proj) 16 of 2 (2.4 against 2.25-2.36
// with 8 of 4), K = 9216 (down_proj) 8 of 4 (2.7-2.8 against 2.2-2.3 with 8 of 2).
MmaGemvConfig gemv_mma_config(int64_t K) {
    if (K <= 3072) return {8, 2};
    if (K <= 8192) return {16, 2};
    return {8, 4};
}

void gemv_mma_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, MmaGemvConfig c,
                   const LaunchContext& ctx) {
    if (g.count < 1 || g.count > GemvGroup::kMax) throw Error(Status::internal, "gemv: bad group");
    if (T <= kGemvBlockMaxTokens || T > kTcGemvMaxTokens || K % 32 != 0)
        throw Error(Status::internal,
                    "tensor-core gemv: " + std::to_string(T) + " rows of " + std::to_string(K) + " values");
    if (out_f32)
        gemv_mma<float>(x, T, g, K, c, ctx);
    else
        gemv_mma<bf16>(x, T, g, K, c, ctx);
}

bool gemv_wide_rows(int64_t T, const LaunchContext& ctx) {
    return ctx.clusters && T > kGemvMaxTokens && T <= ctx.wide_gemv_max_rows && T <= kWideGemvMaxTokens &&
           !(ctx.tc_gemv_all && T <= ctx.tc_gemv_max_rows && T <= kTcGemvMaxTokens);
}

bool gemv_wide_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, const LaunchContext& ctx) {
    return gemv_wide_rows(T, ctx) && K % 32 == 0 && K <= (int64_t(1) << 30) && aligned16(x) && aligned16(w);
}

void gemv_wide_with(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, MmaGemvConfig c,
                    const LaunchContext& ctx) {
    if (g.count < 1 || g.count > GemvGroup::kMax) throw Error(Status::internal, "gemv: bad group");
    if (T <= kGemvBlockMaxTokens || T > kWideGemvMaxTokens || K % 32 != 0 || !ctx.clusters)
        throw Error(Status::internal, "wide tensor-core gemv: " + std::to_string(T) + " rows of " + std::to_string(K) +
                                          " values" + (ctx.clusters ? "" : " (no thread-block clusters)"));
    if (out_f32)
        wide_dispatch<float>(x, T, g, K, c, ctx);
    else
        wide_dispatch<bf16>(x, T, g, K, c, ctx);
}

// The tensor-core gate/up/SiLU kernel of launch shape c over kNT n-tiles of 8 rows.
template <int kNT>
void gate_up_mma_launch(MmaGemvConfig c, const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K,
                        bf16* gate_out, bf16* up_out, bf16* act_out, const LaunchContext& ctx) {
    const char* what =
        kNT == 1 ? "tensor-core gemv gate/up/SiLU kernel" : "tensor-core gemv gate/up/SiLU kernel (16 rows)";
    const unsigned grid = ceil_div(N, 16);
    if (c.parts == 8 && c.unroll == 2)
        return launch(gemv_mma_gate_up_kernel<8, 2, kNT>, grid, 8 * 32, 0, ctx, what, x, int(T), wg, wu, gate_out,
                      up_out, act_out, int(N), int(K), ctx.evict_first);
    if (c.parts == 16 && c.unroll == 2)
        return launch(gemv_mma_gate_up_kernel<16, 2, kNT>, grid, 16 * 32, 0, ctx, what, x, int(T), wg, wu, gate_out,
                      up_out, act_out, int(N), int(K), ctx.evict_first);
    if (c.parts == 8 && c.unroll == 4)
        return launch(gemv_mma_gate_up_kernel<8, 4, kNT>, grid, 8 * 32, 0, ctx, what, x, int(T), wg, wu, gate_out,
                      up_out, act_out, int(N), int(K), ctx.evict_first);
    throw Error(Status::internal, "gemv_gate_up: no tensor-core launch shape " + std::to_string(c.parts) + "," +
                                      std::to_string(c.unroll));
}

// 2 warps per feature, 8 words per lane and matrix per round (K = 2560: 3.8 TB/s against 3.6 with one warp of 16).
void gemv_gate_up(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                  bf16* up_out, bf16* act_out, const LaunchContext& ctx) {
    if (gemv_wide_rows(T, ctx) && K % 32 == 0)
        return wide_gate_up_dispatch(x, T, wg, wu, N, K, gate_out, up_out, act_out, gemv_mma_config(K), ctx);
    if (wgmma_gemm_rows(T, ctx)) return wgmma_gate_up(x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
    if (T > kGemvBlockMaxTokens && T <= kTcGemvMaxTokens && K % 32 == 0) {
        const MmaGemvConfig c = gemv_mma_config(K);
        if (T > 8) return gate_up_mma_launch<2>(c, x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
        return gate_up_mma_launch<1>(c, x, T, wg, wu, N, K, gate_out, up_out, act_out, ctx);
    }
    switch (T) {
        case 1: return gate_up_launch<1>(x, wg, wu, N, K, gate_out, up_out, act_out, ctx);
        case 2: return gate_up_launch<2>(x, wg, wu, N, K, gate_out, up_out, act_out, ctx);
        default:
            throw Error(Status::internal, "gemv_gate_up: " + std::to_string(T) + " rows of " + std::to_string(K) +
                                              " values (1-2 rows, or 3-16 with K % 32 == 0)");
    }
}

bool gemv_expert_gate_up_fits(const ExpertGateUpArgs& a) {
    const bool shared_ok =
        a.Is == 0 || (aligned16(a.shared_gate_proj) && aligned16(a.shared_up_proj) && aligned16(a.shared_gate));
    return a.rows >= 1 && a.k >= 1 && a.I >= 1 && a.H % 8 == 0 && a.H <= (1 << 24) && aligned16(a.x) &&
           aligned16(a.gate_up) && shared_ok && a.rows * a.k + a.rows <= 65535;
}

void gemv_expert_gate_up(ExpertGateUpArgs a, const LaunchContext& ctx) {
    if (!gemv_expert_gate_up_fits(a)) throw Error(Status::internal, "MoE gate/up GEMV: shape or alignment not taken");
    a.evict_first = ctx.evict_first;
    const GemvConfig c = gemv_config(a.H);
    // (rounds of 4 words where one round holds the row: the same sums, 62 registers instead of 96; faster at b=1,
    // docs/perf-notes.md, thirty-third session)
    if (c.split == 2 && a.H / 8 <= 32 * 2 * 4) return expert_gate_up_launch<2, 4>(a, ctx);
    if (c.split == 2 && c.per == 8) return expert_gate_up_launch<2, 8>(a, ctx);
    if (c.split == 4 && c.per == 8) return expert_gate_up_launch<4, 8>(a, ctx);
    if (c.split == 8 && c.per == 8) return expert_gate_up_launch<8, 8>(a, ctx);
    throw Error(Status::internal, "MoE gate/up GEMV: no kernel for split " + std::to_string(c.split));
}

Gemm::Gemm() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
    check_lt(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    check_lt(cublasLtMatmulDescCreate(&op_fp8_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate (FP8)");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                  b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof a_mode),
             "set A_SCALE_MODE");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof b_mode),
             "set B_SCALE_MODE");
    check_lt(cublasLtMatmulDescCreate(&op_fp8_xa_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate (FP8)");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_xa_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_xa_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_xa_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &b_mode, sizeof b_mode),
             "set A_SCALE_MODE");
    check_lt(cublasLtMatmulDescSetAttribute(op_fp8_xa_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &a_mode, sizeof a_mode),
             "set B_SCALE_MODE");
    plans_.reserve(kMaxPlans);
}

Gemm::~Gemm() {
    for (Plan& p : plans_) destroy(p);
    if (op_) cublasLtMatmulDescDestroy(op_);
    if (op_fp8_) cublasLtMatmulDescDestroy(op_fp8_);
    if (op_fp8_xa_) cublasLtMatmulDescDestroy(op_fp8_xa_);
    if (handle_) cublasLtDestroy(handle_);
}

void Gemm::destroy(Plan& p) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    p.a = p.b = p.c = nullptr;
}

// Column-major view: W [N, K] row-major is a K x N column-major matrix A, used transposed; x [T, K] is K x T (B);
// y [T, N] is N x T (C = D). So D = A^T B.
// FP8 (run_fp8): A and B e4m3 with the same column-major views; the A scales BLK128x128 are column-major
// [K / 128, N / 128], the same memory as the checkpoint's row-major [N / 128, K / 128]; the B scales VEC128 are
// stored with the T dimension contiguous (g * T + t; PyTorch's 1x128 blockwise scales have strides [1, T] for the
// same cuBLASLt mode).
Gemm::Plan& Gemm::plan(int64_t T, int64_t N, int64_t K, bool out_f32, bool fp8) {
    for (Plan& p : plans_)
        if (p.T == T && p.N == N && p.K == K && p.out_f32 == out_f32 && p.fp8 == fp8) return p;
    Plan p;
    p.T = T;
    p.N = N;
    p.K = K;
    p.out_f32 = out_f32;
    p.fp8 = fp8;
    // (scale pointers must be set for the heuristic to consider block-scaled algorithms: any device address will do)
    const void* any = workspace_;
    // FP8: the arrangement with x as A first (the one NVIDIA's block-scaled sample uses), then w as A
    for (int attempt = 0; attempt < (fp8 ? 2 : 1); attempt++) {
        destroy(p);
        p.x_as_a = fp8 && attempt == 0;
        const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
        const int64_t m = p.x_as_a ? T : N, n = p.x_as_a ? N : T;
        cublasLtMatmulDesc_t op = !fp8 ? op_ : p.x_as_a ? op_fp8_xa_ : op_fp8_;
        try {
            if (fp8) {
                check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof any),
                         "set A_SCALE_POINTER");
                check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof any),
                         "set B_SCALE_POINTER");
            }
            check_lt(cublasLtMatrixLayoutCreate(&p.a, in, uint64_t(K), uint64_t(m), K), "layout A");
            check_lt(cublasLtMatrixLayoutCreate(&p.b, in, uint64_t(K), uint64_t(n), K), "layout B");
            check_lt(cublasLtMatrixLayoutCreate(&p.c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(m), uint64_t(n),
                                                p.x_as_a ? n : m),
                     "layout C");
            if (p.x_as_a) {  // D = x w^T [T, N] in row order: y as it is
                const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
                check_lt(cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row),
                         "layout C order");
            }
            cublasLtMatmulPreference_t pref = nullptr;
            check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
            size_t ws = kWorkspaceBytes;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
            constexpr int kMaxRank = 16;
            cublasLtMatmulHeuristicResult_t results[kMaxRank] = {};
            const int want = std::min(heuristic_rank_, kMaxRank - 1) + 1;
            int found = 0;
            cublasStatus_t s =
                cublasLtMatmulAlgoGetHeuristic(handle_, op, p.a, p.b, p.c, p.c, pref, want, results, &found);
            cublasLtMatmulPreferenceDestroy(pref);
            last_rank_ = std::max(0, std::min(want, found) - 1);
            const cublasLtMatmulHeuristicResult_t& result = results[last_rank_];
            p.found = s == CUBLAS_STATUS_SUCCESS && found > 0;
            if (!p.found && !fp8)
                throw Error(Status::backend, "cuBLASLt has no algorithm for a bf16 matmul of " + std::to_string(T) +
                                                 " x " + std::to_string(K) + " by " + std::to_string(N) + " x " +
                                                 std::to_string(K) + "^T");
            p.algo = result.algo;
        } catch (...) {
            destroy(p);
            throw;
        }
        if (p.found) break;
    }
    if (plans_.size() < kMaxPlans) {
        plans_.push_back(p);
        return plans_.back();
    }
    Plan& victim = plans_[next_victim_];
    next_victim_ = (next_victim_ + 1) % kMaxPlans;
    destroy(victim);
    victim = p;
    return victim;
}

void Gemm::run(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
               const LaunchContext& ctx) {
    if (!workspace_) throw Error(Status::internal, "cuBLASLt matmul before set_workspace");
    Plan& p = plan(T, N, K, out_f32, false);
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(cublasLtMatmul(handle_, op_, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                            kWorkspaceBytes, ctx.stream),
             "cublasLtMatmul");
}

bool Gemm::run_fp8(const uint8_t* xq, const float* xs, int64_t T, const uint8_t* w, const float* ws, int64_t N,
                   int64_t K, bf16* y, const LaunchContext& ctx) {
    if (!workspace_) throw Error(Status::internal, "cuBLASLt matmul before set_workspace");
    Plan& p = plan(T, N, K, false, true);
    if (!p.found) return false;
    cublasLtMatmulDesc_t op = p.x_as_a ? op_fp8_xa_ : op_fp8_;
    const void* a_scales = p.x_as_a ? static_cast<const void*>(xs) : ws;
    const void* b_scales = p.x_as_a ? static_cast<const void*>(ws) : xs;
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof a_scales),
             "set A_SCALE_POINTER");
    check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof b_scales),
             "set B_SCALE_POINTER");
    const float alpha = 1.0f, beta = 0.0f;
    const void* a = p.x_as_a ? static_cast<const void*>(xq) : w;
    const void* b = p.x_as_a ? static_cast<const void*>(w) : xq;
    check_lt(cublasLtMatmul(handle_, op, &alpha, a, p.a, b, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                            kWorkspaceBytes, ctx.stream),
             "cublasLtMatmul (FP8 block scales)");
    return true;
}

void matmul(Gemm& gemm, const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
            const LaunchContext& ctx) {
    if (T <= 0 || N <= 0) return;
    if (gemv_fits(x, T, w, K)) {
        gemv(x, T, w, N, K, y, out_f32, ctx);
    } else if (ctx.tc_gemv_all && T > kGemvBlockMaxTokens && T <= ctx.tc_gemv_max_rows &&
               gemv_group_fits(x, T, w, K, 1, true)) {
        GemvGroup g;
        g.add(w, y, N);
        gemv_mma_with(x, T, g, K, out_f32, gemv_mma_config(K), ctx);
    } else if (gemv_wide_fits(x, T, w, K, ctx)) {
        GemvGroup g;
        g.add(w, y, N);
        gemv_wide_with(x, T, g, K, out_f32, gemv_mma_config(K), ctx);
    } else if (wgmma_gemm_fits(x, T, w, K, ctx) &&
               T <= (out_f32 ? ctx.wgmma_logits_max_rows : ctx.wgmma_lone_max_rows)) {
        wgmma_gemm(x, T, w, N, K, y, out_f32, ctx);
    } else if (K % 8 == 0 && N % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y))
        gemm.run(x, T, w, N, K, y, out_f32, ctx);
    else
        matmul_scalar(x, T, w, N, K, y, out_f32, ctx);
}

void matmul_written_weights(Gemm& gemm, const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y,
                            bool out_f32, const LaunchContext& ctx) {
    if (T <= 0 || N <= 0) return;
    if (K % 8 == 0 && N % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y))
        gemm.run(x, T, w, N, K, y, out_f32, ctx);
    else
        matmul_scalar(x, T, w, N, K, y, out_f32, ctx);
}

HY_CUDA_TRACE_BINDER(matmul)

}  // namespace hy::cuda
