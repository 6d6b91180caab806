// Q8/Q4 projections on CUDA: the tensor-core GEMV for up to 8 rows and the dequantization for the GEMM
// (int_matmul.cuh).
#include "kernels/cuda/int_matmul.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <string>

namespace hy::cuda {

namespace {

// Warps per block of the GEMV (each takes every kIntWarps-th 64-column chunk of the block's 16 rows) and chunks of
// weights per warp in flight (Q4: 16 bytes per lane and chunk, Q8: 32).
constexpr int kIntWarps = 8;
static_assert(kIntWarps * 32 == 256, "the scale-table copy maps 256 threads to 16 rows x 16");
template <bool kQ4>
constexpr int kIntDepth = kQ4 ? 4 : 2;
// A GEMV launch whose matrices have fewer 16-row tiles than this per SM splits K in two (twice the blocks; H200,
// 4B shapes: the 160-tile out_proj and down_proj).
constexpr int kIntSplitKTilesPerSm = 2;
// Shared-memory strides: x rows of K + kIntXPad values (2K + 64 bytes: the 8 tokens' 16-byte reads of a lane
// quarter fall in distinct banks), and scale rows of int_scale_stride(E) floats for E entries (= 2 mod 32: the 8
// rows of a warp's 4- or 8-byte reads fall in distinct banks).
constexpr int kIntXPad = 32;
__host__ __device__ inline int int_scale_stride(int E) { return E + ((2 - E % 32) + 32) % 32; }

// The staged GEMV (CudaOptions::int_gemv_staged): the tile's codes are copied into shared memory with cp.async in
// stages of 16 rows x 512 bytes (two 16-byte pieces a thread), kIntStages of them in flight, instead of into
// registers; a row's 512 bytes of a stage are 16 units of 32 bytes (a Q4 chunk, half a Q8 chunk) stored at unit
// u ^ (row % 8), so the 8 rows of a warp's 8-byte reads of one unit fall in distinct banks.
constexpr int kIntStageBytes = 16 * 512;
constexpr int kIntStages = 4;

// Scale entries per row and 64-column chunk in the GEMV's shared table: 2 (the halves' groups) for group 32, else 1.
inline int int_scale_entries(int64_t group) { return group == 32 ? 2 : 1; }

// Bytes of dynamic shared memory of one GEMV block: the tile's per-chunk scale table, T rows of x, the warps'
// partial sums, and (staged) the stages of codes.
size_t int_gemv_smem(int64_t T, int64_t K, int64_t group, bool staged = false) {
    return size_t(16) * size_t(int_scale_stride(int(K / 64 * int_scale_entries(group)))) * 4 +
           size_t(T) * size_t(K + kIntXPad) * 2 + size_t(kIntWarps) * 32 * 4 * 4 +
           (staged ? size_t(kIntStages) * kIntStageBytes : 0);
}

// The largest dynamic shared memory a block may ask for on this device (opted in once per kernel at first launch).
size_t int_gemv_smem_limit() {
    static const size_t limit = [] {
        int dev = 0, v = 0;
        check(cudaGetDevice(&dev), "cudaGetDevice");
        check(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
        return size_t(v);
    }();
    return limit;
}

// A 4-byte global -> shared copy (cp.async.ca: the 16-byte form needs 16-byte aligned rows of scales).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// An 8-byte weight load with the cache hints of ld_weight.
__device__ __forceinline__ uint2 ld_weight8(const void* p, uint64_t pol) {
    uint2 r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(r.x), "=r"(r.y)
        : "l"(p), "l"(pol));
    return r;
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// Four Q4 codes held as nibbles (value + 8) in the low 4 bits of each byte of `nib` -> two bf16x2 registers holding
// codes (byte 0, byte 1) and (byte 2, byte 3), exactly: 0x43NN is the bf16 value 128 + NN (NN < 128), and
// 128 + n - 136 = n - 8 is exact.
__device__ __forceinline__ void q4_nibbles_to_bf16x2(uint32_t nib, uint32_t& lo, uint32_t& hi) {
    const __nv_bfloat162 off = __floats2bfloat162_rn(136.0f, 136.0f);
    uint32_t a = __byte_perm(nib, 0x43434343u, 0x4140), b = __byte_perm(nib, 0x43434343u, 0x4342);
    lo = bf16x2_bits(__hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), off));
    hi = bf16x2_bits(__hsub2(*reinterpret_cast<__nv_bfloat162*>(&b), off));
}

// Four Q8 codes (int8, byte 0 first) -> two bf16x2 registers (byte 0, byte 1), (byte 2, byte 3), exactly: with the
// sign bit flipped a byte is c + 128 in [0, 255]; 0x4B0000uu is the f32 value 2^23 + uu, minus 2^23 + 128 gives c;
// |c| <= 128 is a bf16 value.
__device__ __forceinline__ void q8_bytes_to_bf16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
    const uint32_t u = w ^ 0x80808080u;
    const float bias = 8388736.0f;  // 2^23 + 128
    const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - bias;
    const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - bias;
    const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - bias;
    const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - bias;
    lo = bf16x2_bits(__floats2bfloat162_rn(f0, f1));
    hi = bf16x2_bits(__floats2bfloat162_rn(f2, f3));
}

// The tensor-core GEMV over a group of matrices that share x: block b owns 16 output features of one member (the
// members' 16-row tiles numbered one after another; block_end[m] = tiles up to and including member m). Before the
// wait for the predecessor the block starts its weights (registers, kIntDepth chunks per warp) and copies its
// rows' scales into a shared table with one entry per 64-column chunk (kSplit, group 32: two, the chunk's halves);
// after it, x's T rows (cp.async). Lane (gi = lane / 4, q = lane % 4) of warp w holds, for rows gi and gi + 8 of
// the tile and every chunk c = w, w + kIntWarps, ... of 64 columns, the codes of columns 8q .. 8q + 7 (the chunk's
// low half) and 32 + 8q .. 32 + 8q + 7 (its high half), and reads x row gi's values of the same columns from shared
// memory (x row gi is token gi; lanes of tokens >= T read row 0, whose results land in columns of the mma output
// that are never stored). mma m (0..3) takes columns {0, 1 | 2, 3} + 4 (m & 1) of half m / 2 as k = {2q, 2q + 1 |
// 2q + 8, 2q + 9}, for A (the weights) and B (x) alike. The low half's two products (mma 0, 1) and the high half's
// (mma 2, 3) go to zeroed fragments that are multiplied by their group's scale (kSplit, group 32: the halves' own;
// else the chunk's) and added to the sums. The warps' sums are then added in warp order.
// Q4 rows: a chunk is 32 bytes, byte i holding column i (low nibble) and 32 + i (high nibble), so the lane's 8
// bytes at 8q give both halves. Q8 rows: a chunk is 64 bytes, the lane reads 8 at 8q and 8 at 32 + 8q.
// The loop's addresses are a pointer advanced per kDepth chunks plus constant offsets, and rows past N read row 0
// (their sums are never stored), so the loads of a whole step need no checks but the last step's chunk bound.
//
// kSwiGLU (the MLP's gate_up_silu): g holds gate (member 0) and up (member 1) of N rows each; block b's tile is
// gate's rows 8b .. 8b + 7 (tile rows 0-7) and up's same rows (tile rows 8-15), so each lane ends up holding gate
// and up of the same (token, feature) and writes gate, up and act = silu(gate) * up (bf16 values, as silu_mul).
// Every row's sum is computed as in the plain mode, so gate and up are bitwise those of a group of the two.
//
// kHalves (K split in two, for matrices too short to fill the GPU with 16-row tiles; K / 64 even): block b's tile
// is rows 8b .. 8b + 7 of the members (tile rows 0-7: the first half of K, tile rows 8-15: the same rows' second
// half), and blockIdx.y takes tokens 4 blockIdx.y .. + 3: the mma's column 2 t + h is token t's x over half h, so
// lane (gi, q) reads x of token gi / 2, half gi % 2, and its sums c0 (rows' first half by x's first half) and c3
// (second by second) are token q's two halves: y = c0 + c3 after the warps' sums (c1, c2 are never stored). A
// token's arithmetic does not depend on T.
//
// kStaged (CudaOptions::int_gemv_staged): the same sums, bit for bit (warp w still takes chunks w, w + 8, ... in
// order), with the codes copied into shared memory instead of registers: warp w copies tile rows w and w + 8, 512
// bytes a row and stage (lane l: bytes 16 l .. 16 l + 15), the first kIntStages stages before the PDL wait and
// each later one into the buffer that the stage kIntStages before it freed; so a block keeps up to 32 KB of codes
// in flight without registers to hold them.
template <bool kQ4, bool kSwiGLU, bool kSplit, bool kHalves = false, bool kStaged = false>
__global__ void __launch_bounds__(kIntWarps * 32, 2)
    gemv_int_kernel(const bf16* __restrict__ x, int T, Fp8Group g, int K, int group, bool out_f32, bf16* act) {
    static_assert(!(kSwiGLU && kHalves), "the SwiGLU tile already holds 8 rows of two matrices");
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_trigger();
    // the member and its tile
    const int tile = int(blockIdx.x);
    const uint8_t* w = g.w[0];
    const float* scales = g.scales[0];
    void* y = g.y[0];
    int N = g.n[0], first = 0;
    if constexpr (!kSwiGLU) {
#pragma unroll
        for (int m = 1; m < Fp8Group::kMax; m++)
            if (m < g.count && tile >= g.block_end[m - 1]) {
                w = g.w[m];
                scales = g.scales[m];
                y = g.y[m];
                N = g.n[m];
                first = g.block_end[m - 1];
            }
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, q = lane & 3;
    // the tile's first row, and the matrix and row of tile rows gi (a) and gi + 8 (b)
    constexpr bool k8Rows = kSwiGLU || kHalves;
    const int row0 = (tile - first) * (k8Rows ? 8 : 16);
    const int ra_row = row0 + gi, rb_row = k8Rows ? row0 + gi : row0 + gi + 8;
    const bool va = ra_row < N, vb = rb_row < N;
    constexpr int kChunkBytes = kQ4 ? 32 : 64, kWords = kQ4 ? 1 : 2, kDepth = kIntDepth<kQ4>;
    constexpr int kStep = kIntWarps * kDepth;  // chunks per loop step of a block
    constexpr int kEntries = kSplit ? 2 : 1;   // scale entries per chunk
    const int n_chunks = K / 64, G = K / group, gs = int_scale_stride(n_chunks * kEntries);
    const int n_loop = kHalves ? n_chunks / 2 : n_chunks;  // chunks a tile row runs over
    const int64_t row_bytes = int64_t(n_chunks) * kChunkBytes;
    // kHalves: the block's tokens
    const int tq = kHalves ? int(blockIdx.y) * 4 : 0, Tb = kHalves ? min(4, T - tq) : T;
    float* s_sc = reinterpret_cast<float*>(smem);                     // [16][gs]
    bf16* s_x = reinterpret_cast<bf16*>(smem + size_t(16) * gs * 4);  // [Tb][K + kIntXPad]
    float* s_red = reinterpret_cast<float*>(smem + size_t(16) * gs * 4 + size_t(Tb) * (K + kIntXPad) * 2);
    uint8_t* s_w = reinterpret_cast<uint8_t*>(s_red + kIntWarps * 32 * 4);  // kStaged: [kIntStages][16][512]
    const uint64_t pol = weight_policy(g.evict_first != 0);
    const uint2 zero2 = make_uint2(0u, 0u);
    constexpr int kRegDepth = kStaged ? 1 : kDepth;  // (kStaged: the register buffers are unused)
    uint2 ra[kRegDepth][kWords], rb[kRegDepth][kWords];
    // the lane's bytes of chunk `warp` in rows a and b (rows past N: row 0's)
    const uint8_t* pa = w + int64_t(va ? ra_row : 0) * row_bytes + 8 * q + warp * kChunkBytes;
    const uint8_t* pb = (kSwiGLU ? g.w[1] : w) + int64_t(vb ? rb_row : 0) * row_bytes + 8 * q + warp * kChunkBytes +
                        (kHalves ? int64_t(n_loop) * kChunkBytes : 0);
    // the loads of the step whose first chunk is c0 (the lane's chunks c0 + kIntWarps u) from qa / qb (chunk c0)
    auto load_w = [&](const uint8_t* qa, const uint8_t* qb, int c0) {
        const bool whole = c0 + kIntWarps * (kDepth - 1) < n_loop;
#pragma unroll
        for (int u = 0; u < kRegDepth; u++) {
            const bool in = whole || c0 + kIntWarps * u < n_loop;
#pragma unroll
            for (int h = 0; h < kWords; h++) {
                const int off = u * kIntWarps * kChunkBytes + 32 * h;
                ra[u][h] = in ? ld_weight8(qa + off, pol) : zero2;
                rb[u][h] = in ? ld_weight8(qb + off, pol) : zero2;
            }
        }
    };
    // kStaged: the copy of tile rows `warp` (sw_a) and `warp` + 8 (sw_b), stage s of n_stages: 512 bytes a row from
    // byte 512 s of the row's loop, into buffer s % kIntStages
    constexpr int kStageChunks = 512 / kChunkBytes;
    const int n_stages = (n_loop + kStageChunks - 1) / kStageChunks;
    const uint8_t* sw_a = nullptr;
    const uint8_t* sw_b = nullptr;
    if constexpr (kStaged) {
        const int r_a = row0 + warp, r_b = k8Rows ? row0 + warp : row0 + warp + 8;
        sw_a = w + int64_t(r_a < N ? r_a : 0) * row_bytes + 16 * lane;
        sw_b = (kSwiGLU ? g.w[1] : w) + int64_t(r_b < N ? r_b : 0) * row_bytes + 16 * lane +
               (kHalves ? int64_t(n_loop) * kChunkBytes : 0);
    }
    const int sw_off = warp * 512 + (((lane >> 1) ^ (warp & 7)) * 32) + (lane & 1) * 16;
    auto copy_stage = [&](int s) {
        const int off = s * 512;
        if (off + 16 * lane < n_loop * kChunkBytes) {
            uint8_t* dst = s_w + (s % kIntStages) * kIntStageBytes + sw_off;
            cp_async16_policy(smem_addr(dst), sw_a + off, true, pol);
            cp_async16_policy(smem_addr(dst + 8 * 512), sw_b + off, true, pol);
        }
    };
    if constexpr (!kStaged) load_w(pa, pb, warp);
    // the tile's scale table: entry e of row r is the scale of chunk e (kSplit: of half e, group e; kHalves: of
    // the row's half r / 8, from chunk n_loop on for r >= 8); rows past N hold zeros, never read into a result.
    // Thread i copies entries i % 16, i % 16 + 16, ... of row i / 16.
    {
        const int per_row = n_loop * kEntries;
        const int cpg = kSplit ? 1 : group / 64;  // entries per group
        const int r = int(threadIdx.x) >> 4;
        const int row = k8Rows ? row0 + (r & 7) : row0 + r;
        const int eo = kHalves && r >= 8 ? n_loop * kEntries : 0;  // the entry of the row's first chunk
        const float* src = (kSwiGLU && r >= 8 ? g.scales[1] : scales) + int64_t(row < N ? row : 0) * G;
        float* dst = s_sc + r * gs;
        for (int e = int(threadIdx.x) & 15; e < per_row; e += 16) {
            if (row < N)
                cp_async4(smem_addr(dst + e), src + (cpg == 1 ? e + eo : (e + eo) / cpg));
            else
                dst[e] = 0.0f;
        }
    }
    if constexpr (kStaged) {
#pragma unroll
        for (int s = 0; s < kIntStages; s++) {
            if (s < n_stages) copy_stage(s);
            cp_async_commit();
        }
    }
    pdl_wait();  // x comes from the kernel before
    for (int i = int(threadIdx.x); i < Tb * (K / 8); i += kIntWarps * 32) {
        const int t = i / (K / 8), c = (i - t * (K / 8)) * 8;
        cp_async16(smem_addr(s_x + int64_t(t) * (K + kIntXPad) + c), x + int64_t(tq + t) * K + c, true);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    // the lane's x (row gi, or row 0 for tokens >= T; kHalves: token gi / 2's half gi % 2) and scale rows, at chunk
    // `warp`
    const int xt = kHalves ? gi >> 1 : gi;
    const bf16* xr =
        s_x + int64_t(xt < Tb ? xt : 0) * (K + kIntXPad) + (kHalves ? (gi & 1) * (n_loop * 64) : 0) + 8 * q + 64 * warp;
    const float* sa = s_sc + gi * gs + kEntries * warp;
    const float* sb = s_sc + (gi + 8) * gs + kEntries * warp;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // one chunk's products (codes wa of row a and wb of row b; x at xc, the scale entries at sca / scb), scaled and
    // added to the sums
    auto chunk = [&](const uint2(&wa)[kWords], const uint2(&wb)[kWords], const bf16* xc, const float* sca,
                     const float* scb) {
        const uint4 x0 = *reinterpret_cast<const uint4*>(xc);       // columns 8q .. 8q + 7
        const uint4 x1 = *reinterpret_cast<const uint4*>(xc + 32);  // 32 + 8q .. + 7
        const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};  // low, high half
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int half = m >> 1;
            uint32_t a0, a1, a2, a3;
            if constexpr (kQ4) {
                const uint32_t ua = (m & 1) ? wa[0].y : wa[0].x, ub = (m & 1) ? wb[0].y : wb[0].x;
                const int sh = half ? 4 : 0;
                q4_nibbles_to_bf16x2((ua >> sh) & 0x0F0F0F0Fu, a0, a2);
                q4_nibbles_to_bf16x2((ub >> sh) & 0x0F0F0F0Fu, a1, a3);
            } else {
                const uint32_t ua = (m & 1) ? wa[half].y : wa[half].x;
                const uint32_t ub = (m & 1) ? wb[half].y : wb[half].x;
                q8_bytes_to_bf16x2(ua, a0, a2);
                q8_bytes_to_bf16x2(ub, a1, a3);
            }
            mma_bf16_16816(part[half], a0, a1, a2, a3, xw[2 * m], xw[2 * m + 1]);
        }
        float s_alo, s_ahi, s_blo, s_bhi;
        if constexpr (kSplit) {
            const float2 s_a = *reinterpret_cast<const float2*>(sca);
            const float2 s_b = *reinterpret_cast<const float2*>(scb);
            s_alo = s_a.x, s_ahi = s_a.y, s_blo = s_b.x, s_bhi = s_b.y;
        } else {
            s_alo = s_ahi = sca[0];
            s_blo = s_bhi = scb[0];
        }
        acc[0] = fmaf(part[1][0], s_ahi, fmaf(part[0][0], s_alo, acc[0]));
        acc[1] = fmaf(part[1][1], s_ahi, fmaf(part[0][1], s_alo, acc[1]));
        acc[2] = fmaf(part[1][2], s_bhi, fmaf(part[0][2], s_blo, acc[2]));
        acc[3] = fmaf(part[1][3], s_bhi, fmaf(part[0][3], s_blo, acc[3]));
    };
    if constexpr (kStaged) {
        // stage st holds chunks kStageChunks st .. + kStageChunks - 1; warp w takes those = w (mod 8). Before stage
        // st (st >= 1) the block refills the buffer stage st - 1 used with stage st - 1 + kIntStages (the wait
        // leaves that many groups in flight that stage st is older than); once nothing is left to copy, the first
        // stage not copied before the wait waits for all.
        const int first_drain = max(kIntStages, n_stages - kIntStages + 1);
        for (int st = 0; st < n_stages; st++) {
            if (st > 0) {
                if (st - 1 + kIntStages < n_stages) {
                    cp_async_wait<kIntStages - 2>();
                    __syncthreads();
                    copy_stage(st - 1 + kIntStages);
                    cp_async_commit();
                } else if (st == first_drain) {
                    cp_async_wait_all();
                    __syncthreads();
                }
            }
            const uint8_t* bw = s_w + (st % kIntStages) * kIntStageBytes;
#pragma unroll
            for (int u = 0; u < kStageChunks / kIntWarps; u++) {
                const int lc = warp + kIntWarps * u, c = st * kStageChunks + lc;
                if (c >= n_loop) break;
                uint2 wa[kWords], wb[kWords];
#pragma unroll
                for (int h = 0; h < kWords; h++) {
                    const int unit = ((kWords * lc + h) ^ gi) * 32 + 8 * q;
                    wa[h] = *reinterpret_cast<const uint2*>(bw + gi * 512 + unit);
                    wb[h] = *reinterpret_cast<const uint2*>(bw + (gi + 8) * 512 + unit);
                }
                const int d = c - warp;  // chunks past the lane's first (x and scale pointers are at chunk `warp`)
                chunk(wa, wb, xr + 64 * d, sa + kEntries * d, sb + kEntries * d);
            }
        }
    } else {
        for (int c0 = warp; c0 < n_loop; c0 += kStep) {
            uint2 ca[kDepth][kWords], cb[kDepth][kWords];
#pragma unroll
            for (int u = 0; u < kDepth; u++)
#pragma unroll
                for (int h = 0; h < kWords; h++) {
                    ca[u][h] = ra[u][h];
                    cb[u][h] = rb[u][h];
                }
            pa += kStep * kChunkBytes;
            pb += kStep * kChunkBytes;
            if (c0 + kStep < n_loop) load_w(pa, pb, c0 + kStep);
#pragma unroll
            for (int u = 0; u < kDepth; u++) {
                if (c0 + kIntWarps * u >= n_loop) break;
                const int e = kEntries * kIntWarps * u;  // the chunk's first entry, from the step's
                chunk(ca[u], cb[u], xr + 64 * kIntWarps * u, sa + e, sb + e);
            }
            xr += 64 * kStep;
            sa += kEntries * kStep;
            sb += kEntries * kStep;
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) s_red[(warp * 32 + lane) * 4 + e] = acc[e];
    __syncthreads();
    if (warp != 0) return;
    float v4[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float v = s_red[lane * 4 + e];
#pragma unroll
        for (int p = 1; p < kIntWarps; p++) v += s_red[(p * 32 + lane) * 4 + e];
        v4[e] = v;
    }
    if constexpr (kSwiGLU) {
#pragma unroll
        for (int e = 0; e < 2; e++) {  // (token 2q + e, feature row0 + gi): gate in v4[e], up in v4[e + 2]
            const int t = 2 * q + e, n = row0 + gi;
            if (t >= T || n >= N) continue;
            const float gv = round_bf16(v4[e]), uv = round_bf16(v4[e + 2]);
            const int64_t o = int64_t(t) * N + n;
            static_cast<bf16*>(g.y[1])[o] = to_bf16(uv);
            if (act != static_cast<bf16*>(y)) static_cast<bf16*>(y)[o] = to_bf16(gv);
            act[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
        }
    } else if constexpr (kHalves) {  // token tq + q, feature row0 + gi: the halves' sums in v4[0] and v4[3]
        const int t = tq + q, n = row0 + gi;
        if (q < Tb && n < N) {
            const float v = v4[0] + v4[3];
            if (out_f32)
                static_cast<float*>(y)[int64_t(t) * N + n] = v;
            else
                static_cast<bf16*>(y)[int64_t(t) * N + n] = to_bf16(v);
        }
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float v = v4[e];
            const int t = 2 * q + (e & 1), n = row0 + gi + (e >= 2 ? 8 : 0);
            if (t >= T || n >= N) continue;
            if (out_f32)
                static_cast<float*>(y)[int64_t(t) * N + n] = v;
            else
                static_cast<bf16*>(y)[int64_t(t) * N + n] = to_bf16(v);
        }
    }
}

// out[r, c] = bf16(q(r, c) * scale): thread i writes the 8 columns 8 (i % (K / 8)) .. + 7 of row i / (K / 8).
template <bool kQ4>
__global__ void dequantize_int_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scales, int64_t rows,
                                      int K, int group, bf16* __restrict__ out) {
    pdl_trigger();
    pdl_wait();  // (out may still be read by the kernel before)
    const int64_t runs = K / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * runs) return;
    const int64_t r = i / runs;
    const int c = int(i % runs) * 8;  // first column
    const float s = scales[r * (K / group) + c / group];
    float v[8];
    if constexpr (kQ4) {
        // columns c .. c + 7 of a chunk's low (high) half: the low (high) nibbles of its bytes c % 32 .. + 7
        const int in = c % 64;
        const uint2 b = *reinterpret_cast<const uint2*>(w + r * (K / 2) + (c / 64) * 32 + in % 32);
        const int sh = in < 32 ? 0 : 4;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t word = j < 4 ? b.x : b.y;
            v[j] = float(int((word >> (8 * (j % 4) + sh)) & 0xFu) - 8);
        }
    } else {
        const uint2 b = *reinterpret_cast<const uint2*>(w + r * K + c);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t word = j < 4 ? b.x : b.y;
            v[j] = float(int8_t((word >> (8 * (j % 4))) & 0xFFu));
        }
    }
    uint4 o;
    uint32_t* ow = &o.x;
#pragma unroll
    for (int j = 0; j < 4; j++) ow[j] = bf16x2_bits(__floats2bfloat162_rn(v[2 * j] * s, v[2 * j + 1] * s));
    *reinterpret_cast<uint4*>(out + r * K + c) = o;
}

}  // namespace

bool int_gemv_fits(const bf16* x, int64_t T, const Matrix& w) {
    return T >= 1 && T <= kGemvMaxTokens && is_int_quant(w.dtype) && w.scales && int_quant_shape_ok(w.cols, w.group) &&
           w.rows > 0 && aligned16(x) && aligned16(w.data) &&
           int_gemv_smem(T, w.cols, w.group) <= int_gemv_smem_limit();
}

namespace {

// The device's SM count (once).
int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        check(cudaGetDevice(&dev), "cudaGetDevice");
        check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
        return v;
    }();
    return n;
}

// Launches the GEMV over g's members (checked by the callers; block_end and evict_first set here); with act, the
// SwiGLU mode over g = {gate, up}. K is split in two halves (kHalves) when ctx.int_gemv_split_k says so: 1 always,
// -1 never, 0 (the default) when the members have fewer 16-row tiles than kIntSplitKTilesPerSm per SM; always
// only where K / 64 is even, never in the SwiGLU mode. The choice depends on the shapes alone, not on T.
void launch_int_gemv(const bf16* x, int64_t T, Fp8Group g, int64_t K, DType dtype, int64_t group, bool out_f32,
                     const LaunchContext& ctx, bf16* act = nullptr) {
    const bool swiglu = act != nullptr;
    int64_t tiles16 = 0;
    for (int m = 0; m < g.count; m++) tiles16 += ceil_div(g.n[m], 16);
    const bool halves = !swiglu && (K / 64) % 2 == 0 &&
                        (ctx.int_gemv_split_k > 0 ||
                         (ctx.int_gemv_split_k == 0 && tiles16 < int64_t(kIntSplitKTilesPerSm) * sm_count()));
    const int tile_rows = halves ? 8 : 16;
    for (int m = 0; m < g.count; m++) g.block_end[m] = int(ceil_div(g.n[m], tile_rows)) + (m ? g.block_end[m - 1] : 0);
    g.evict_first = ctx.evict_first ? 1 : 0;
    const bool q4 = dtype == DType::Q4, split = group == 32;
    const int mode = swiglu ? 1 : halves ? 2 : 0;
    const int64_t Tb = halves ? std::min<int64_t>(T, 4) : T;  // x rows a block stages
    const bool staged =
        (ctx.int_gemv_staged > 0 || (ctx.int_gemv_staged == 0 && T >= kIntStagedMinRows && T <= kIntStagedMaxRows)) &&
        int_gemv_smem(Tb, K, group, true) <= int_gemv_smem_limit();
    using Kernel = void (*)(const bf16*, int, Fp8Group, int, int, bool, bf16*);
    // [q4][plain, swiglu, halves][split]
    static constexpr Kernel kernels[2][3][2] = {
        {{gemv_int_kernel<false, false, false>, gemv_int_kernel<false, false, true>},
         {gemv_int_kernel<false, true, false>, gemv_int_kernel<false, true, true>},
         {gemv_int_kernel<false, false, false, true>, gemv_int_kernel<false, false, true, true>}},
        {{gemv_int_kernel<true, false, false>, gemv_int_kernel<true, false, true>},
         {gemv_int_kernel<true, true, false>, gemv_int_kernel<true, true, true>},
         {gemv_int_kernel<true, false, false, true>, gemv_int_kernel<true, false, true, true>}}};
    static constexpr Kernel staged_kernels[2][3][2] = {
        {{gemv_int_kernel<false, false, false, false, true>, gemv_int_kernel<false, false, true, false, true>},
         {gemv_int_kernel<false, true, false, false, true>, gemv_int_kernel<false, true, true, false, true>},
         {gemv_int_kernel<false, false, false, true, true>, gemv_int_kernel<false, false, true, true, true>}},
        {{gemv_int_kernel<true, false, false, false, true>, gemv_int_kernel<true, false, true, false, true>},
         {gemv_int_kernel<true, true, false, false, true>, gemv_int_kernel<true, true, true, false, true>},
         {gemv_int_kernel<true, false, false, true, true>, gemv_int_kernel<true, false, true, true, true>}}};
    const Kernel kernel = (staged ? staged_kernels : kernels)[q4][mode][split];
    static bool opted_in[2][2][3][2] = {};  // (the shared-memory opt-in, once per kernel)
    if (!opted_in[staged][q4][mode][split]) {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(int_gemv_smem_limit())),
              "cudaFuncSetAttribute (integer GEMV shared memory)");
        opted_in[staged][q4][mode][split] = true;
    }
    const unsigned blocks = swiglu ? unsigned(ceil_div(g.n[0], 8)) : unsigned(g.block_end[g.count - 1]);
    const char* what =
        swiglu   ? (q4 ? "Q4 tensor-core gate/up/SiLU gemv kernel" : "Q8 tensor-core gate/up/SiLU gemv kernel")
        : halves ? (q4 ? "Q4 tensor-core gemv kernel (K halves)" : "Q8 tensor-core gemv kernel (K halves)")
                 : (q4 ? "Q4 tensor-core gemv kernel" : "Q8 tensor-core gemv kernel");
    const dim3 grid(blocks, halves ? unsigned(ceil_div(T, 4)) : 1u);
    launch(kernel, grid, dim3(kIntWarps * 32), int_gemv_smem(Tb, K, group, staged), ctx, what, x, int(T), g, int(K),
           int(group), out_f32, act);
}

}  // namespace

void gemv_int_group(const bf16* x, int64_t T, const Fp8Group& g, int64_t K, DType dtype, int64_t group,
                    const LaunchContext& ctx) {
    if (g.count < 1 || g.count > Fp8Group::kMax || !is_int_quant(dtype))
        throw Error(Status::internal, "integer GEMV group: 1 to 4 Q8/Q4 members expected");
    for (int m = 0; m < g.count; m++) {
        const Matrix w{g.w[m], dtype, g.n[m], K, g.scales[m], 0, group};
        if (!int_gemv_fits(x, T, w) || g.segment_rows[m] != 0)
            throw Error(Status::internal, "integer GEMV group: shape or alignment not taken");
    }
    launch_int_gemv(x, T, g, K, dtype, group, false, ctx);
}

void gemv_int_gate_up(const bf16* x, int64_t T, const Matrix& w_gate, const Matrix& w_up, bf16* gate, bf16* up,
                      bf16* act, const LaunchContext& ctx) {
    if (!int_gemv_fits(x, T, w_gate) || !int_gemv_fits(x, T, w_up) || w_gate.dtype != w_up.dtype ||
        w_gate.rows != w_up.rows || w_gate.cols != w_up.cols || w_gate.group != w_up.group ||
        w_gate.scale_segment_rows != 0 || w_up.scale_segment_rows != 0)
        throw Error(Status::internal, "integer gate/up GEMV: shapes, dtypes or alignment not taken");
    if (!gate || !up || !act || up == gate || up == act)
        throw Error(Status::internal, "integer gate/up GEMV: gate, up and act (which may alias gate) expected");
    Fp8Group g;
    g.add(w_gate, gate);
    g.add(w_up, up);
    launch_int_gemv(x, T, g, w_gate.cols, w_gate.dtype, w_gate.group, false, ctx, act);
}

void gemv_int(const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, const LaunchContext& ctx) {
    if (!int_gemv_fits(x, T, w)) throw Error(Status::internal, "integer GEMV: shape or alignment not taken");
    Fp8Group g;
    g.add(w, y);
    launch_int_gemv(x, T, g, w.cols, w.dtype, w.group, out_f32, ctx);
}

void dequantize_int(const Matrix& w, bf16* out, const LaunchContext& ctx) {
    if (!is_int_quant(w.dtype) || !w.scales || !int_quant_shape_ok(w.cols, w.group))
        throw Error(Status::internal, "integer dequantize: not a Q8/Q4 matrix with a valid group");
    const int threads = 256;
    const int64_t n = w.rows * (w.cols / 8);
    const auto* d = static_cast<const uint8_t*>(w.data);
    if (w.dtype == DType::Q4)
        launch(dequantize_int_kernel<true>, ceil_div(n, threads), threads, 0, ctx, "Q4 dequantize kernel", d, w.scales,
               w.rows, int(w.cols), int(w.group), out);
    else
        launch(dequantize_int_kernel<false>, ceil_div(n, threads), threads, 0, ctx, "Q8 dequantize kernel", d, w.scales,
               w.rows, int(w.cols), int(w.group), out);
}

void matmul_int(Gemm& gemm, const bf16* x, int64_t T, const Matrix& w, void* y, bool out_f32, const Fp8Scratch& scratch,
                const LaunchContext& ctx) {
    if (T <= 0 || w.rows <= 0) return;
    if (int_gemv_fits(x, T, w)) return gemv_int(x, T, w, y, out_f32, ctx);
    const int64_t N = w.rows, K = w.cols;
    if (size_t(N * K) > scratch.weight_elems) {  // (a quantized lm_head: larger than the scratch is sized for)
        int64_t step = kGemvMaxTokens;           // rows per GEMV: as many as its shared memory holds
        while (step > 1 && !int_gemv_fits(x, step, w)) step--;
        if (!int_gemv_fits(x, 1, w))
            throw Error(Status::internal, "integer matmul: the dequantization scratch holds " +
                                              std::to_string(scratch.weight_elems) + " values, " + std::to_string(N) +
                                              " x " + std::to_string(K) + " needed");
        const size_t ys = out_f32 ? 4 : 2;
        for (int64_t t = 0; t < T; t += step)
            gemv_int(x + t * K, std::min<int64_t>(step, T - t), w, static_cast<char*>(y) + size_t(t * N) * ys, out_f32,
                     ctx);
        return;
    }
    dequantize_int(w, scratch.weight, ctx);
    matmul_written_weights(gemm, x, T, scratch.weight, N, K, y, out_f32, ctx);
}

HY_CUDA_TRACE_BINDER(int_matmul)

}  // namespace hy::cuda
