// The wgmma GEMM for batched decode (gemm_wgmma.cuh).
#include "kernels/cuda/gemm_wgmma.cuh"

#include "kernels/cuda/fp8_convert.cuh"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

namespace hy::cuda {

namespace {

constexpr int kWgFeatures = 128;  // output features of a block: two m64 tiles
constexpr int kWgChunk = 64;      // K values of a stage: one 128-byte row per feature and per token
constexpr int kWgStages = 4;      // stages of the ring (kWgStages - 1 chunks in flight)
constexpr int kWgThreads = 128;   // one warpgroup

// Bytes of one stage: the weight tile [128 features][128 bytes], then the x tile [kN tokens][128 bytes].
template <int kN>
constexpr int wg_stage_bytes() {
    return (kWgFeatures + kN) * 128;
}
// Dynamic shared memory of a block: the ring, or the fp32 partial sums [2][kN / 2][128 threads] when larger, plus
// 1 KB to align the ring to the 1024-byte period of the 128-byte swizzle.
template <int kN>
constexpr size_t wg_smem_bytes() {
    const size_t ring = size_t(kWgStages) * wg_stage_bytes<kN>();
    const size_t red = size_t(kWgFeatures) * kN * 4;
    return (ring > red ? ring : red) + 1024;
}

// Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte rows, 128-byte swizzle (PTX ISA, wgmma
// "Shared Memory Matrix Layout": Swizzle<3, 4, 3>, address bits 4-6 XOR bits 7-9; the tile is 1024-byte aligned).
__device__ __forceinline__ uint32_t swizzle128(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// The wgmma matrix descriptor of a K-major tile of 128-byte rows at shared address `addr` with the 128-byte swizzle:
// start address >> 4 in bits 0-13, leading byte offset unused for swizzled K-major layouts (1), stride byte offset
// (8 rows: 1024 bytes) >> 4 in bits 32-45, swizzle mode 1 (128 bytes) in bits 62-63. A k-step of 16 values inside
// the 128-byte row adds 32 bytes to addr (the swizzle applies to the address the unit forms).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// Orders this thread's earlier shared-memory writes (cp.async included, once waited for) before later reads of the
// async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// wgmma.fence / commit_group / wait_group (the accumulator registers are ready for, and valid after, the products).
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accesses of v across the asynchronous products.
template <int kR>
__device__ __forceinline__ void fence_registers(float (&v)[kR]) {
#pragma unroll
    for (int i = 0; i < kR; i++) asm volatile("" : "+f"(v[i])::"memory");
}

// The accumulator operands of the wgmma wrappers below (n = 16, 32, 64: 8, 16, 32 fp32 values a thread).
#define HY_WGMMA_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define HY_WGMMA_D16 \
    HY_WGMMA_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define HY_WGMMA_D32                                                                                            \
    HY_WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),    \
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
        "+f"(d[31])

// D[64 x n] += A[64 x 16] B[16 x n] (A and B K-major in shared memory, by descriptor; D fp32 in registers: value
// 4 j + 2 h + c of thread t is row 16 (t / 32) + (t % 32) / 4 + 8 h, column 8 j + 2 (t % 4) + c). PTX ISA
// "wgmma.mma_async", sm_90a.
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : HY_WGMMA_D8
        : "l"(a), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : HY_WGMMA_D16
        : "l"(a), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : HY_WGMMA_D32
        : "l"(a), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, "
        "1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

template <int kN>
__device__ __forceinline__ void wgmma_tile(float (&d)[kN / 2], uint64_t a, uint64_t b) {
    if constexpr (kN == 8)
        wgmma_m64n8k16(d, a, b);
    else if constexpr (kN == 16)
        wgmma_m64n16k16(d, a, b);
    else if constexpr (kN == 32)
        wgmma_m64n32k16(d, a, b);
    else if constexpr (kN == 64)
        wgmma_m64n64k16(d, a, b);
    else
        wgmma_m64n128k16(d, a, b);
}

// D[64 x n] += A[64 x 16] B[16 x n] with A in registers (the register fragment of the PTX ISA's wgmma A operand:
// warp w of the warpgroup holds rows 16 w .. 16 w + 15, laid out as mma.m16n8k16's A: a[0] = (row r, columns 2 q,
// 2 q + 1), a[1] = (row r + 8, the same), a[2] = (row r, columns 2 q + 8, 2 q + 9), a[3] = (row r + 8, the same),
// r = lane / 4, q = lane % 4) and B K-major in shared memory by descriptor; sm_90a. The registers are read
// asynchronously: they keep their values until wgmma_wait_all, and fence_registers on them after it keeps the
// compiler from reusing them earlier.
__device__ __forceinline__ void wgmma_rs_m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : HY_WGMMA_D8
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_rs_m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, "
        "0;\n}\n"
        : HY_WGMMA_D16
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

__device__ __forceinline__ void wgmma_rs_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : HY_WGMMA_D32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#else
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
}

template <int kN>
__device__ __forceinline__ void wgmma_rs_tile(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b) {
    static_assert(kN == 16 || kN == 32 || kN == 64, "the quantized kernel's n-tiles: 16, 32 or 64 rows");
    if constexpr (kN == 16)
        wgmma_rs_m64n16k16(d, a, b);
    else if constexpr (kN == 32)
        wgmma_rs_m64n32k16(d, a, b);
    else
        wgmma_rs_m64n64k16(d, a, b);
}
template <int kR>
__device__ __forceinline__ void fence_registers(uint32_t (&v)[kR]) {
#pragma unroll
    for (int i = 0; i < kR; i++) asm volatile("" : "+r"(v[i])::"memory");
}

// Set by the sm_90a compilation only (wgmma_available reads it).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ int wgmma_compiled = 1;
#else
__device__ int wgmma_compiled = 0;
#endif

// The gate and up projections of gemv_gate_up's contract: gate_out = bf16(x Wg^T), up_out = bf16(x Wu^T), act_out =
// bf16(bf16(silu(gate)) * up) (act_out may be gate_out: then gate is not stored).
// The quantized kernel reads wg and wu as codes with their scales sg and su (segments of segment_rows rows for FP8).
struct WgmmaGateUp {
    const void* wg = nullptr;
    const void* wu = nullptr;
    const float* sg = nullptr;
    const float* su = nullptr;
    int segment_rows = 0;
    bf16* gate = nullptr;
    bf16* up = nullptr;
    bf16* act = nullptr;
    int n = 0;  // rows of each matrix
};

// The stream-K split (CudaOptions::wgmma_stream_k, wgmma_stream_k_quant): a launch of `blocks` blocks (at most the
// resident ones) over work = tiles x chunks (tile-major (tile, chunk) pairs, chunks of kWgChunk K values); block b
// takes the contiguous range [b work / blocks, (b + 1) work / blocks), so every block gets the same number of chunks
// (within one) and the grid fills the device in one wave, where a K split into 1, 2, 4 or 8 parts leaves most SMs one
// block and some two. A block walks its range's tiles from the last to the first: a tile whose first chunks it holds
// but not its last (at most one: the range's last tile) goes first, its fp32 sums stored as this block's partial
// (partials[b], flag b set after them); a tile whose last chunk it holds but not its first (the range's first tile)
// goes last: it waits for the flags of the tile's earlier blocks and adds their partials to its sums from block b - 1
// down, a fixed order, then stores the outputs. So a row's result depends on N, K and blocks only (as with parts: not
// on T or on the other rows), and a block waits only for lower-numbered blocks that stored their partial first (no
// deadlock while all blocks are resident, which the launcher checks). The consumer clears the flags it read (zero
// between launches; the next launch writes only after its PDL wait, so after this one has ended).
struct WgStreamK {
    float* partials = nullptr;  // [blocks][kWgPartialFloats]
    int* flags = nullptr;       // [blocks], zero at launch
    int blocks = 0;             // 0: the cluster K split (parts)
    int work = 0;               // tiles x chunks
};
// The floats of one block's partial: its 128 features x at most 64 rows.
constexpr int kWgPartialFloats = kWgmmaStreamKPartialFloats;
static_assert(kWgPartialFloats == kWgFeatures * 64, "a partial: 128 features x 64 rows");

// The first work item of block b, and the block that holds item w.
__device__ __forceinline__ int sk_begin(int b, const WgStreamK& sk) { return int(int64_t(b) * sk.work / sk.blocks); }
__device__ __forceinline__ int sk_block_of(int w, const WgStreamK& sk) {
    return int((int64_t(w + 1) * sk.blocks + sk.work - 1) / sk.work) - 1;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// This block's sums acc (kM tiles of kN / 2 values a thread, kThreads threads) as its partial, then its flag.
template <int kM, int kN, int kThreads>
__device__ __forceinline__ void sk_store_partial(const float (&acc)[kM][kN / 2], const WgStreamK& sk, int tid) {
    float* p = sk.partials + size_t(blockIdx.x) * kWgPartialFloats;
#pragma unroll
    for (int m = 0; m < kM; m++)
#pragma unroll
        for (int i = 0; i < kN / 2; i++) __stcg(p + (m * (kN / 2) + i) * kThreads + tid, acc[m][i]);
    __threadfence();
    __syncthreads();
    if (tid == 0) st_release_gpu(sk.flags + blockIdx.x, 1);
}
// acc += the partials of blocks blockIdx.x - 1 down to `first` (each once its flag is set; the flag cleared).
template <int kM, int kN, int kThreads>
__device__ __forceinline__ void sk_add_partials(float (&acc)[kM][kN / 2], const WgStreamK& sk, int first, int tid) {
    for (int b = int(blockIdx.x) - 1; b >= first; b--) {
        if (tid == 0) {
            while (ld_acquire_gpu(sk.flags + b) == 0) __nanosleep(64);
            sk.flags[b] = 0;
        }
        __syncthreads();
        const float* p = sk.partials + size_t(b) * kWgPartialFloats;
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int i = 0; i < kN / 2; i++) acc[m][i] += __ldcg(p + (m * (kN / 2) + i) * kThreads + tid);
    }
}

// A block's work: tiles t_last down to t_first (one without stream-K: blockIdx.x / parts) and, for tile t, chunks
// [c_first, c_first + rounds) (chunks(t): its stream-K range's, or K part blockIdx.x % parts of n_chunks).
struct WgBlockWork {
    int t_first, t_last, w_begin = 0, w_end = 0, n_chunks, parts;
    __device__ WgBlockWork(bool stream, const WgStreamK& sk, int parts_, int n_chunks_)
        : n_chunks(n_chunks_), parts(parts_) {
        if (stream) {
            w_begin = sk_begin(int(blockIdx.x), sk);
            w_end = sk_begin(int(blockIdx.x) + 1, sk);
            t_first = w_begin / n_chunks;
            t_last = (w_end - 1) / n_chunks;
        } else {
            t_first = t_last = int(blockIdx.x) / parts;
        }
    }
    __device__ void chunks(bool stream, int tile, int& c_first, int& rounds) const {
        if (stream) {
            c_first = std::max(w_begin - tile * n_chunks, 0);
            rounds = std::min(w_end - tile * n_chunks, n_chunks) - c_first;
        } else {
            const int per = (n_chunks + parts - 1) / parts;
            c_first = int(blockIdx.x) % parts * per;
            rounds = std::max(0, std::min(n_chunks, c_first + per) - c_first);
        }
    }
};

// The end of both kernels: the fp32 sums acc (wgmma tiles 0 and 1, features f0 + .. and f1 + .., all T rows) stored
// as y (or gate/up/SiLU), added over the cluster's parts first when parts > 1. With kWG = 1 thread tid holds both
// tiles' values; with kWG = 2 (256 threads) warpgroup tid / 128 holds its tile's, which go through shared memory
// even when parts == 1 (gate/up/SiLU needs both tiles' values of a feature in one thread). The ring (base its
// 1024-aligned shared address) is free: every cp.async has completed.
template <typename OutT, int kN, bool kGateUp, int kWG = 1>
__device__ __forceinline__ void wg_epilogue(float (&acc)[2 / kWG][kN / 2], unsigned char* ring, uint32_t base, int tid,
                                            int rank, int parts, int T, int N, int f0, int f1, OutT* y,
                                            const WgmmaGateUp& gu) {
    constexpr int kThreads = kWgThreads * kWG;
    // value i = 4 j + 2 h + c of thread t (of a warpgroup) in tile m: feature f_m + 16 (t / 32) + (t % 32) / 4 +
    // 8 h, token 8 j + 2 (t % 4) + c; store(v, i, t) writes the outputs of both tiles' value i of thread t
    auto store = [&](const float(&v)[2], int i, int t) {
        const int f = 16 * (t >> 5) + ((t & 31) >> 2) + 8 * ((i >> 1) & 1);
        const int tok = 8 * (i >> 2) + 2 * (t & 3) + (i & 1);
        if (tok >= T) return;
        if constexpr (kGateUp) {
            const int n = f0 + f;
            if (n >= N) return;
            const float gv = round_bf16(v[0]), uv = round_bf16(v[1]);
            const int64_t o = int64_t(tok) * N + n;
            gu.up[o] = to_bf16(uv);
            if (gu.act != gu.gate) gu.gate[o] = to_bf16(gv);
            gu.act[o] = to_bf16(round_bf16(siluf_(gv)) * uv);
        } else {
            if (f0 + f < N) y[int64_t(tok) * N + f0 + f] = store_as<OutT>(v[0]);
            if (f1 + f < N) y[int64_t(tok) * N + f1 + f] = store_as<OutT>(v[1]);
        }
    };
    if constexpr (kWG == 1) {
        if (parts == 1) {
#pragma unroll
            for (int i = 0; i < kN / 2; i++) {
                const float v[2] = {acc[0][i], acc[1][i]};
                store(v, i, tid);
            }
            return;
        }
    }
    // the sums go to shared memory as red[m][i][thread of the warpgroup]; block `rank` of the cluster adds its share
    // of the (i, thread) pairs over the parts in part order (reading the other blocks' shared memory), then stores
    // them
    __syncthreads();  // every warp is done with the ring
    float* red = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int m = 0; m < 2 / kWG; m++) {
        const int mt = kWG == 1 ? m : tid / kWgThreads;
#pragma unroll
        for (int i = 0; i < kN / 2; i++) red[(mt * (kN / 2) + i) * kWgThreads + tid % kWgThreads] = acc[m][i];
    }
    if (parts > 1) {
        cluster_arrive();
        cluster_wait();
    } else {
        __syncthreads();
    }
    constexpr int kPairs = kN / 2 * kWgThreads;  // (i, thread) pairs of one tile
    const int share = kPairs / parts;            // (parts divides 512)
    for (int e = rank * share + tid; e < (rank + 1) * share; e += kThreads) {
        float v[2];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            if (parts == 1) {
                v[m] = red[m * kPairs + e];
                continue;
            }
            const uint32_t off = base + uint32_t(m * kPairs + e) * 4;
            float part[8];  // (the loads first, all in flight together; then the sum in part order)
#pragma unroll
            for (int p = 0; p < 8; p++)
                part[p] = p < parts ? ld_cluster_f32(cluster_smem_addr(off, uint32_t(p))) : 0.0f;
            float sum = part[0];
#pragma unroll
            for (int p = 1; p < 8; p++)
                if (p < parts) sum += part[p];
            v[m] = sum;
        }
        store(v, e / kWgThreads, e % kWgThreads);
    }
    if (parts > 1) {
        cluster_arrive();  // no block leaves while another may still read its shared memory
        cluster_wait();
    }
}

// Block b takes part b % parts of K (chunks [part * per, ..)); the parts of a tile are one cluster. Tile b / parts
// is, without kGateUp, 128 features of a group member (matrix s owns tiles [block_end[s-1], block_end[s])), the
// first 64 as wgmma tile 0 and the next 64 as tile 1; with kGateUp, features [64 tile, 64 tile + 64) of gate (tile
// 0) and of up (tile 1), so that a thread holds the gate and up sums of the same outputs. With sk.blocks > 0 (then
// parts == 1 and kN <= 64) the block takes its stream-K range of tiles and chunks instead (WgStreamK).
template <typename OutT, int kN, bool kGateUp>
__global__ void __launch_bounds__(kWgThreads)
    gemm_wgmma_kernel(const bf16* __restrict__ x, int T, const __grid_constant__ GemvGroup g,
                      const __grid_constant__ WgmmaGateUp gu, int K, int parts, bool evict_first,
                      const __grid_constant__ WgStreamK sk) {
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char wg_raw[];
    const uint32_t raw_addr = smem_addr(wg_raw);
    const uint32_t base = (raw_addr + 1023u) & ~1023u;
    unsigned char* ring = wg_raw + (base - raw_addr);
    constexpr int kStage = wg_stage_bytes<kN>();
    const int tid = int(threadIdx.x);
    const int rank = int(blockIdx.x) % parts;
    const bool stream = kN <= 64 && sk.blocks > 0;  // (partials hold 64 rows)
    const int n_chunks = (K + kWgChunk - 1) / kWgChunk;
    const uint64_t pol = weight_policy(evict_first);
    const WgBlockWork work(stream, sk, parts, n_chunks);
    // the matrices of wgmma tiles 0 and 1 and their first features (scalars: a dynamically indexed array would go to
    // local memory)
    const bf16 *w0 = nullptr, *w1 = nullptr;
    int f0 = 0, f1 = 0, N = 0, c_first = 0, rounds = 0;
    OutT* y = nullptr;

    // chunk r of this part: 8 16-byte words of each of the 128 weight rows (8 a thread; row r of the stage is row
    // r % 64 of tile r / 64), then of the kN x rows
    auto issue_w = [&](int r) {
        if (r >= rounds) return;
        const uint32_t st = base + uint32_t((r % kWgStages) * kStage);
        const int k0 = (c_first + r) * kWgChunk;
#pragma unroll
        for (int i = 0; i < kWgFeatures * 8 / kWgThreads; i++) {
            const int e = tid + i * kWgThreads, row = e >> 3, c = e & 7, k = k0 + 8 * c;
            const bool hi = row >= 64;
            const int n = (hi ? f1 : f0) + (row & 63);
            const bool ok = n < N && k < K;
            cp_async16_policy(st + swizzle128(row, c), ok ? (hi ? w1 : w0) + int64_t(n) * K + k : w0, ok, pol);
        }
    };
    auto issue_x = [&](int r) {
        if (r >= rounds) return;
        const uint32_t st = base + uint32_t((r % kWgStages) * kStage + kWgFeatures * 128);
        const int k0 = (c_first + r) * kWgChunk;
#pragma unroll
        for (int i = 0; i < (kN * 8 + kWgThreads - 1) / kWgThreads; i++) {
            const int e = tid + i * kWgThreads, row = e >> 3, c = e & 7, k = k0 + 8 * c;
            if (e >= kN * 8) break;
            const bool ok = row < T && k < K;
            cp_async16(st + swizzle128(row, c), ok ? x + int64_t(row) * K + k : x, ok);
        }
    };

    float acc[2][kN / 2];
    for (int tile = work.t_last; tile >= work.t_first; tile--) {
        if constexpr (kGateUp) {
            w0 = static_cast<const bf16*>(gu.wg);
            w1 = static_cast<const bf16*>(gu.wu);
            f0 = f1 = tile * 64;
            N = gu.n;
        } else {
            const GroupMember mem = group_member(g, tile);
            w0 = w1 = mem.w;
            f0 = (tile - mem.first_block) * kWgFeatures;
            f1 = f0 + 64;
            N = mem.n;
            y = static_cast<OutT*>(mem.y);
        }
        work.chunks(stream, tile, c_first, rounds);
        // the sums from 0; the first kWgStages - 1 chunks: weights (before the PDL wait in the first tile), then x;
        // one commit group per chunk
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int i = 0; i < kN / 2; i++) acc[m][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < kWgStages - 1; s++) issue_w(s);
        if (tile == work.t_last) pdl_wait();
#pragma unroll
        for (int s = 0; s < kWgStages - 1; s++) {
            issue_x(s);
            cp_async_commit();
        }
        for (int r = 0; r < rounds; r++) {
            cp_async_wait<kWgStages - 2>();
            fence_proxy_async_shared();
            __syncthreads();  // chunk r is in; every warp's products of chunk r - 1 are done (its stage is refilled
                              // now)
            issue_w(r + kWgStages - 1);
            issue_x(r + kWgStages - 1);
            cp_async_commit();
            const uint32_t st = base + uint32_t((r % kWgStages) * kStage);
            fence_registers(acc[0]);
            fence_registers(acc[1]);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kWgChunk / 16; kk++) {
                const uint64_t b = wg_desc(st + kWgFeatures * 128 + 32 * kk);
                wgmma_tile<kN>(acc[0], wg_desc(st + 32 * kk), b);
                wgmma_tile<kN>(acc[1], wg_desc(st + 64 * 128 + 32 * kk), b);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_registers(acc[0]);
            fence_registers(acc[1]);
        }
        cp_async_wait_all();

        if (!stream) {
            wg_epilogue<OutT, kN, kGateUp>(acc, ring, base, tid, rank, parts, T, N, f0, f1, y, gu);
        } else if (c_first + rounds < n_chunks) {
            sk_store_partial<2, kN, kWgThreads>(acc, sk, tid);
        } else {
            if (c_first > 0) sk_add_partials<2, kN, kWgThreads>(acc, sk, sk_block_of(tile * n_chunks, sk), tid);
            wg_epilogue<OutT, kN, kGateUp>(acc, ring, base, tid, 0, 1, T, N, f0, f1, y, gu);
        }
        if (tile > work.t_first) __syncthreads();  // every warp is done with the ring before the next tile refills it
    }
}

// True when `blocks` blocks of kernel (threads, smem) are all resident at once on the device (occ: the kernel's
// blocks an SM, read once).
template <typename... KArgs>
bool all_resident(void (*kernel)(KArgs...), int threads, size_t smem, int blocks, std::atomic<int>& occ,
                  const LaunchContext& ctx) {
    int n = occ.load(std::memory_order_relaxed);
    if (n < 0) {
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), "wgmma GEMM occupancy");
        occ.store(n, std::memory_order_relaxed);
    }
    return int64_t(n) * ctx.sm_count >= blocks;
}

template <typename OutT, int kN, bool kGateUp>
void wgmma_launch(const bf16* x, int64_t T, const GemvGroup& g, const WgmmaGateUp& gu, unsigned tiles, int64_t K,
                  int parts, WgStreamK sk, const LaunchContext& ctx) {
    constexpr size_t smem = wg_smem_bytes<kN>();
    static std::atomic<uint64_t> done{0};
    static std::atomic<int> occ{-1};
    const char* what = kGateUp ? "wgmma GEMM gate/up/SiLU kernel" : "wgmma GEMM kernel";
    auto* kernel = gemm_wgmma_kernel<OutT, kN, kGateUp>;
    opt_in_smem(kernel, smem, done, what);
    if (sk.blocks > 0 && (kN > 64 || !all_resident(kernel, kWgThreads, smem, sk.blocks, occ, ctx))) sk = WgStreamK{};
    if (sk.blocks > 0) parts = 1;
    launch_clusters(kernel, dim3(sk.blocks > 0 ? unsigned(sk.blocks) : tiles * unsigned(parts)), dim3(kWgThreads),
                    unsigned(parts), smem, ctx, what, x, int(T), g, gu, int(K), parts, ctx.evict_first, sk);
}

template <typename OutT, bool kGateUp>
void wgmma_rows(const bf16* x, int64_t T, const GemvGroup& g, const WgmmaGateUp& gu, unsigned tiles, int64_t K,
                int parts, const WgStreamK& sk, const LaunchContext& ctx) {
    if (T <= 8) return wgmma_launch<OutT, 8, kGateUp>(x, T, g, gu, tiles, K, parts, sk, ctx);
    if (T <= 16) return wgmma_launch<OutT, 16, kGateUp>(x, T, g, gu, tiles, K, parts, sk, ctx);
    if (T <= 32) return wgmma_launch<OutT, 32, kGateUp>(x, T, g, gu, tiles, K, parts, sk, ctx);
    if (T <= 64) return wgmma_launch<OutT, 64, kGateUp>(x, T, g, gu, tiles, K, parts, sk, ctx);
    return wgmma_launch<OutT, 128, kGateUp>(x, T, g, gu, tiles, K, parts, sk, ctx);
}

// ---- The quantized kernel: Q8, Q4 or FP8 (e4m3) codes turned into bf16 weights in registers ----
constexpr int kWgQ8 = 1, kWgQ4 = 2, kWgE4M3 = 3;
constexpr int kWgQuantStages = 5;  // stages of the ring (chunks r .. r + 3 requested while r is converted)

// Bytes of one weight row's 64-value chunk.
template <int kW>
constexpr int wgq_code_bytes() {
    return kW == kWgQ4 ? 32 : 64;
}
// Bytes of one stage: the x tile [kN tokens][128 bytes] (swizzled, first: 1024-byte aligned), the codes [128
// features][wgq_code_bytes], the scales [128 features][2 entries] (1 KB).
template <int kN, int kW>
constexpr int wgq_stage_bytes() {
    return kN * 128 + kWgFeatures * wgq_code_bytes<kW>() + 1024;
}
template <int kN, int kW, int kS>
constexpr size_t wgq_smem_bytes() {
    const size_t ring = size_t(kS) * wgq_stage_bytes<kN, kW>();
    const size_t red = size_t(kWgFeatures) * kN * 4;
    return (ring > red ? ring : red) + 1024;
}

// Where x's values go. Lane q = lane % 4 of a warp reads 16 consecutive codes of each of its weight rows per chunk
// (one 16-byte load for Q8/FP8: columns 16 q .. 16 q + 15; one 8-byte load for Q4: bytes 8 q .. 8 q + 7, whose low
// nibbles are columns 8 q .. 8 q + 7 and high nibbles 32 + 8 q .. 32 + 8 q + 7), and k-step s (0..3) of the chunk
// takes 4 of them as its A fragment's columns {2 q, 2 q + 1} (h = 0) and {2 q + 8, 2 q + 9} (h = 1): Q8/FP8 columns
// 16 q + 4 s + 2 h + {0, 1}; Q4 columns 32 (s / 2) + 8 q + 4 (s % 2) + 2 h + {0, 1}. The products only need x's
// values in the same order, so x word p (values 2 p, 2 p + 1 of the chunk) is copied to word 8 s + 4 h + q of the
// swizzled B tile row (the columns 16 s + 8 h + 2 q + {0, 1} that wgmma pairs with those A columns).
template <int kW>
__device__ __forceinline__ int wgq_x_word(int p) {
    int q, s;
    if constexpr (kW == kWgQ4) {
        q = (p >> 2) & 3;
        s = 2 * (p >> 4) + ((p >> 1) & 1);
    } else {
        q = p >> 3;
        s = (p >> 1) & 3;
    }
    return 8 * s + 4 * (p & 1) + q;
}

// 4-byte global -> shared copy (cp.async.ca); when !valid nothing is read and the 4 bytes are zero-filled.
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Four codes of a word (byte i: the code of column i of the four; Q4: the nibble value + 8 in each byte's low bits)
// times the scale s as bf16 pairs: lo = (byte 0, byte 1), hi = (byte 2, byte 3), each bf16(code * s) rounded to
// nearest even from the exact f32 product, as dequantize_int and the FP8 dequantization write them. Q8/Q4: 0x4B0000uu
// is the f32 value 2^23 + uu, exact; FP8: fp8x2_to_f32 (exact).
template <int kW>
__device__ __forceinline__ void wgq_convert(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
    float f[4];
    if constexpr (kW == kWgE4M3) {
        const float2 a = fp8x2_to_f32<false>(w), b = fp8x2_to_f32<false>(w >> 16);
        f[0] = a.x;
        f[1] = a.y;
        f[2] = b.x;
        f[3] = b.y;
    } else {
        const uint32_t u = kW == kWgQ8 ? w ^ 0x80808080u : w;      // Q8: c + 128 in [0, 255]
        const float bias = kW == kWgQ8 ? 8388736.0f : 8388616.0f;  // 2^23 + 128, 2^23 + 8
        f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - bias;
        f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - bias;
        f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - bias;
        f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - bias;
    }
    lo = pack_bf16x2(f[0] * s, f[1] * s);
    hi = pack_bf16x2(f[2] * s, f[3] * s);
}

// The quantized members of a launch (Fp8Group: Q8/Q4 or FP8 codes, their F32 scales, segment_rows for FP8).
struct QuantMember {
    const uint8_t* w;
    const float* scales;
    void* y;
    int n, first_block, segment_rows;
};
__device__ __forceinline__ QuantMember quant_member(const Fp8Group& g, int block) {
    QuantMember m{g.w[0], g.scales[0], g.y[0], g.n[0], 0, g.segment_rows[0]};
#pragma unroll
    for (int j = 1; j < Fp8Group::kMax; j++)
        if (j < g.count && block >= g.block_end[j - 1])
            m = QuantMember{g.w[j], g.scales[j], g.y[j], g.n[j], g.block_end[j - 1], g.segment_rows[j]};
    return m;
}

// gemm_wgmma_kernel with weights of kW: the same tiles, K split, ring and epilogue (so the same contract), but each
// stage holds the chunk's codes and scales, and each thread turns its rows' codes into bf16(code * scale) A
// fragments in registers (wgq_convert) for wgmma with A from registers; x goes to the B tile in the order those
// fragments need (wgq_x_word), by 4-byte copies. A weight is rounded to bf16 exactly as the dequantize-then-GEMM
// path rounds it; the sums are fp32 on the tensor cores. Scale entries of a row and chunk: Q8/Q4 with group 32 two
// (the chunk's halves), else one (Q8/Q4: the group holding the chunk; FP8: its 128 x 128 block).
template <int kN, bool kGateUp, int kW, int kWG>
// (2 warpgroups: at most 128 registers, two blocks an SM)
__global__ void __launch_bounds__(kWgThreads* kWG, kWG == 2 ? 2 : 1)
    gemm_wgmma_quant_kernel(const bf16* __restrict__ x, int T, const __grid_constant__ Fp8Group g,
                            const __grid_constant__ WgmmaGateUp gu, int K, int group, int parts, bool evict_first,
                            const __grid_constant__ WgStreamK sk) {
    pdl_trigger();
    extern __shared__ __align__(16) unsigned char wg_raw[];
    const uint32_t raw_addr = smem_addr(wg_raw);
    const uint32_t base = (raw_addr + 1023u) & ~1023u;
    unsigned char* ring = wg_raw + (base - raw_addr);
    constexpr int kStage = wgq_stage_bytes<kN, kW>(), kCB = wgq_code_bytes<kW>();
    constexpr int kS = kWgQuantStages;
    constexpr int kAhead = kS - 1;  // chunks requested before the loop
    constexpr int kThreads = kWgThreads * kWG, kWarps = kThreads / 32;
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int rank = int(blockIdx.x) % parts;
    const int n_chunks = K / kWgChunk;
    const bool stream = sk.blocks > 0;
    const WgBlockWork work(stream, sk, parts, n_chunks);
    const uint8_t *w0 = nullptr, *w1 = nullptr;
    const float *s0 = nullptr, *s1 = nullptr;
    int f0 = 0, f1 = 0, N = 0, seg = 0, c_first = 0, rounds = 0;
    bf16* y = nullptr;
    const uint64_t pol = weight_policy(evict_first);
    const int64_t row_bytes = int64_t(n_chunks) * kCB;
    const int G = kW == kWgE4M3 ? (K + 127) / 128 : K / group;  // scale columns
    const bool two = kW != kWgE4M3 && group == 32;              // two scale entries per chunk

    // chunk r of this part: the codes of the 128 rows (row r of the stage is row r % 64 of tile r / 64; rows past N
    // read nothing and hold zeros), and thread i's row's scale entries
    auto issue_w = [&](int r) {
        if (r >= rounds) return;
        const uint32_t st = base + uint32_t((r % kS) * kStage + kN * 128);
        const int chunk = c_first + r;
        // (Q4: the first warpgroup copies, two pieces a thread: with one piece for each of 256 threads ptxas 13.0
        // emitted an LDGSTS with an unwritten cache-policy register, an illegal instruction)
        constexpr int kCopiers = kW == kWgQ4 ? kWgThreads : kThreads;
        if (tid < kCopiers) {
#pragma unroll
            for (int i = 0; i < kWgFeatures * kCB / 16 / kCopiers; i++) {
                const int e = tid + i * kCopiers, row = e / (kCB / 16), c = e % (kCB / 16);
                const bool hi = row >= 64;
                const int n = (hi ? f1 : f0) + (row & 63);
                const bool ok = n < N;
                cp_async16_policy(st + uint32_t(row * kCB + 16 * c),
                                  ok ? (hi ? w1 : w0) + int64_t(n) * row_bytes + int64_t(chunk) * kCB + 16 * c : w0, ok,
                                  pol);
            }
        }
        if (tid >= kWgFeatures) return;
        const bool hi = tid >= 64;
        const int n = (hi ? f1 : f0) + (tid & 63);
        const bool ok = n < N;
        const float* sp = hi ? s1 : s0;
        const int k0 = chunk * kWgChunk;
        const uint32_t sd = st + uint32_t(kWgFeatures * kCB + tid * 8);
        if constexpr (kW == kWgE4M3) {
            cp_async4_zfill(sd, ok ? sp + fp8_scale_row(n, seg) * G + k0 / 128 : sp, ok);
        } else {
            // (the scale column: no integer division for the default groups, 32 for Q4 and 64 for Q8)
            const int col = two ? 2 * chunk : group == kWgChunk ? chunk : k0 / group;
            cp_async4_zfill(sd, ok ? sp + int64_t(n) * G + col : sp, ok);
            if (two) cp_async4_zfill(sd + 4, ok ? sp + int64_t(n) * G + col + 1 : sp, ok);
        }
    };
    // x: warp w copies rows w, w + kWarps, ... (tokens < T; the other rows' products are never stored), lane p its
    // word p
    const int xw = wgq_x_word<kW>(lane);
    auto issue_x = [&](int r) {
        if (r >= rounds) return;
        const uint32_t st = base + uint32_t((r % kS) * kStage);
        const int k0 = (c_first + r) * kWgChunk;
#pragma unroll
        for (int i = 0; i < kN / kWarps; i++) {
            const int t = warp + kWarps * i;
            if (t >= T) break;
            cp_async4_zfill(st + swizzle128(t, xw >> 2) + 4 * (xw & 3), x + int64_t(t) * K + k0 + 2 * lane, true);
        }
    };

    // this thread's wgmma tiles: both (kWG = 1), or tile tid / 128 of its warpgroup (kWG = 2)
    constexpr int kM = 2 / kWG;
    const int m0 = kWG == 1 ? 0 : tid / kWgThreads, wq = warp & 3;  // (wq: the warp in its warpgroup)
    float acc[kM][kN / 2];
    const int gi = lane >> 2, q = lane & 3;
    using Frags = uint32_t[kM][4][4];
    // chunk r's A fragments into a[m][s] (tile m0 + m, k-step s: rows 16 wq + gi and + 8 of the tile)
    auto convert = [&](int r, Frags& a) {
        const unsigned char* codes = ring + (r % kS) * kStage + kN * 128;
        const float* sc = reinterpret_cast<const float*>(codes + kWgFeatures * kCB);
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = 64 * (m0 + m) + 16 * wq + gi + 8 * h;
                const float* rs = sc + row * 2;
                if constexpr (kW == kWgQ4) {
                    const uint2 c = *reinterpret_cast<const uint2*>(codes + row * kCB + 8 * q);
                    const float lo_s = rs[0], hi_s = two ? rs[1] : lo_s;  // columns 0-31, 32-63
                    wgq_convert<kW>(c.x & 0x0F0F0F0Fu, lo_s, a[m][0][h], a[m][0][2 + h]);
                    wgq_convert<kW>(c.y & 0x0F0F0F0Fu, lo_s, a[m][1][h], a[m][1][2 + h]);
                    wgq_convert<kW>((c.x >> 4) & 0x0F0F0F0Fu, hi_s, a[m][2][h], a[m][2][2 + h]);
                    wgq_convert<kW>((c.y >> 4) & 0x0F0F0F0Fu, hi_s, a[m][3][h], a[m][3][2 + h]);
                } else {
                    const uint4 c = *reinterpret_cast<const uint4*>(codes + row * kCB + 16 * q);
                    const float s = rs[two ? (q >> 1) : 0];  // (columns 16 q ..: half q / 2 of the chunk)
                    wgq_convert<kW>(c.x, s, a[m][0][h], a[m][0][2 + h]);
                    wgq_convert<kW>(c.y, s, a[m][1][h], a[m][1][2 + h]);
                    wgq_convert<kW>(c.z, s, a[m][2][h], a[m][2][2 + h]);
                    wgq_convert<kW>(c.w, s, a[m][3][h], a[m][3][2 + h]);
                }
            }
    };
    auto fence_acc = [&] {
#pragma unroll
        for (int m = 0; m < kM; m++) fence_registers(acc[m]);
    };
    // chunk r's products from a (committed, not waited for)
    auto products = [&](int r, Frags& a) {
        const uint32_t st = base + uint32_t((r % kS) * kStage);
        fence_acc();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kWgChunk / 16; kk++) {
            const uint64_t b = wg_desc(st + 32 * kk);
#pragma unroll
            for (int m = 0; m < kM; m++) wgmma_rs_tile<kN>(acc[m], a[m][kk], b);
        }
        wgmma_commit();
    };
    auto fence_a = [&](Frags& a) {
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int kk = 0; kk < 4; kk++) fence_registers(a[m][kk]);
    };
    for (int tile = work.t_last; tile >= work.t_first; tile--) {
        if constexpr (kGateUp) {
            w0 = static_cast<const uint8_t*>(gu.wg);
            w1 = static_cast<const uint8_t*>(gu.wu);
            s0 = gu.sg;
            s1 = gu.su;
            f0 = f1 = tile * 64;
            N = gu.n;
            seg = gu.segment_rows;
        } else {
            const QuantMember mem = quant_member(g, tile);
            w0 = w1 = mem.w;
            s0 = s1 = mem.scales;
            f0 = (tile - mem.first_block) * kWgFeatures;
            f1 = f0 + 64;
            N = mem.n;
            seg = mem.segment_rows;
            y = static_cast<bf16*>(mem.y);
        }
        work.chunks(stream, tile, c_first, rounds);
#pragma unroll
        for (int m = 0; m < kM; m++)
#pragma unroll
            for (int i = 0; i < kN / 2; i++) acc[m][i] = 0.0f;
                // the first kAhead chunks: weights (before the PDL wait in the first tile), then x; one commit group
                // per chunk
#pragma unroll
        for (int s = 0; s < kAhead; s++) issue_w(s);
        if (tile == work.t_last) pdl_wait();
#pragma unroll
        for (int s = 0; s < kAhead; s++) {
            issue_x(s);
            cp_async_commit();
        }
        // chunk r + 1's codes are converted while chunk r's products run, into the other fragment buffer (no
        // register a running product reads is written before it is waited for, so ptxas keeps the products
        // asynchronous); the stage of chunk r - 1 is refilled once every warp has waited for its products
        Frags a0, a1;
        cp_async_wait<kS - 2>();
        fence_proxy_async_shared();
        __syncthreads();
        if (rounds > 0) convert(0, a0);
        auto step = [&](int r, Frags& cur, Frags& nxt) {
            if (r >= rounds) return;
            products(r, cur);
            if (r + 1 < rounds) {
                cp_async_wait<kS - 3>();
                fence_proxy_async_shared();
                __syncthreads();  // chunk r + 1 is in; every warp's products of chunk r - 1 are done
                issue_w(r + kS - 1);
                issue_x(r + kS - 1);
                cp_async_commit();
                convert(r + 1, nxt);
            }
            wgmma_wait_all();
            fence_acc();
            fence_a(cur);
        };
        for (int r = 0; r < rounds; r += 2) {
            step(r, a0, a1);
            step(r + 1, a1, a0);
        }
        cp_async_wait_all();

        if (!stream) {
            wg_epilogue<bf16, kN, kGateUp, kWG>(acc, ring, base, tid, rank, parts, T, N, f0, f1, y, gu);
        } else if (c_first + rounds < n_chunks) {
            sk_store_partial<kM, kN, kThreads>(acc, sk, tid);
        } else {
            if (c_first > 0) sk_add_partials<kM, kN, kThreads>(acc, sk, sk_block_of(tile * n_chunks, sk), tid);
            wg_epilogue<bf16, kN, kGateUp, kWG>(acc, ring, base, tid, 0, 1, T, N, f0, f1, y, gu);
        }
        if (tile > work.t_first) __syncthreads();  // every warp is done with the ring before the next tile refills it
    }
}

template <int kN, bool kGateUp, int kW, int kWG>
void wgq_launch(const bf16* x, int64_t T, const Fp8Group& g, const WgmmaGateUp& gu, unsigned tiles, int64_t K,
                int64_t group, int parts, WgStreamK sk, const LaunchContext& ctx) {
    constexpr size_t smem = wgq_smem_bytes<kN, kW, kWgQuantStages>();
    static std::atomic<uint64_t> done{0};
    static std::atomic<int> occ{-1};
    const char* what = kW == kWgQ8   ? (kGateUp ? "Q8 wgmma gate/up/SiLU kernel" : "Q8 wgmma GEMM kernel")
                       : kW == kWgQ4 ? (kGateUp ? "Q4 wgmma gate/up/SiLU kernel" : "Q4 wgmma GEMM kernel")
                                     : (kGateUp ? "FP8 wgmma gate/up/SiLU kernel" : "FP8 wgmma GEMM kernel");
    auto* kernel = gemm_wgmma_quant_kernel<kN, kGateUp, kW, kWG>;
    opt_in_smem(kernel, smem, done, what);
    if (sk.blocks > 0 && !all_resident(kernel, kWgThreads * kWG, smem, sk.blocks, occ, ctx)) sk = WgStreamK{};
    if (sk.blocks > 0) parts = 1;
    launch_clusters(kernel, dim3(sk.blocks > 0 ? unsigned(sk.blocks) : tiles * unsigned(parts)), dim3(kWgThreads * kWG),
                    unsigned(parts), smem, ctx, what, x, int(T), g, gu, int(K), int(group), parts, ctx.evict_first, sk);
}

template <bool kGateUp, int kW, int kWG>
void wgq_n(const bf16* x, int64_t T, const Fp8Group& g, const WgmmaGateUp& gu, unsigned tiles, int64_t K, int64_t group,
           int parts, const WgStreamK& sk, const LaunchContext& ctx) {
    if (T <= 16) return wgq_launch<16, kGateUp, kW, kWG>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
    if (T <= 32) return wgq_launch<32, kGateUp, kW, kWG>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
    return wgq_launch<64, kGateUp, kW, kWG>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
}

// (ctx.wgmma_quant_warpgroups: 1 or 2 consumer warpgroups a block, for every weight format. The Q4 form once stopped
// at its first launch with cudaErrorIllegalInstruction (thirty-eighth session): ptxas 13.0 emitted issue_w's 16-byte
// weight copy, when all 256 threads made one each, as an LDGSTS whose shared address has a uniform-register part
// ([R+UR+imm]) and whose cache-policy descriptor names UR1, a register nothing writes. issue_w now lets only the first
// warpgroup copy Q4 weights, two pieces a thread; every [gpu] case passes, compute-sanitizer finds nothing (H100,
// fortieth session; docs/perf-notes.md).)
template <bool kGateUp, int kW>
void wgq_rows(const bf16* x, int64_t T, const Fp8Group& g, const WgmmaGateUp& gu, unsigned tiles, int64_t K,
              int64_t group, int parts, const WgStreamK& sk, const LaunchContext& ctx) {
    if (ctx.wgmma_quant_warpgroups == 2) return wgq_n<kGateUp, kW, 2>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
    wgq_n<kGateUp, kW, 1>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
}

template <bool kGateUp>
void wgq_dtype(DType dtype, const bf16* x, int64_t T, const Fp8Group& g, const WgmmaGateUp& gu, unsigned tiles,
               int64_t K, int64_t group, int parts, const WgStreamK& sk, const LaunchContext& ctx) {
    if (dtype == DType::Q8) return wgq_rows<kGateUp, kWgQ8>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
    if (dtype == DType::Q4) return wgq_rows<kGateUp, kWgQ4>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
    wgq_rows<kGateUp, kWgE4M3>(x, T, g, gu, tiles, K, group, parts, sk, ctx);
}

// The K split of a launch of `tiles` blocks' worth of 128 weight rows: given, ctx's, or by shape.
int launch_parts(int parts, int64_t tiles, int64_t K, const LaunchContext& ctx) {
    if (parts <= 0)
        parts =
            ctx.wgmma_gemm_parts > 0 ? ctx.wgmma_gemm_parts : wgmma_gemm_parts(tiles * kWgFeatures, K, ctx.sm_count);
    if (parts != 1 && parts != 2 && parts != 4 && parts != 8)
        throw Error(Status::internal, "wgmma GEMM: " + std::to_string(parts) + " parts (1, 2, 4 or 8)");
    return parts;
}

// The stream-K split (WgStreamK) of a launch of `tiles` tiles over K, where ctx asks for it (ctx.wgmma_stream_k for
// the bf16 GEMM, ctx.wgmma_stream_k_quant for the quantized one; the workspace set) and the K split is not given (parts
// <= 0, ctx.wgmma_gemm_parts == 0), for up to 64 rows: ctx.stream_k_blocks blocks (two an SM), fewer where that would
// leave a block under kStreamKMinChunks chunks; else none (blocks 0: the cluster K split). The launcher also falls back
// to the cluster split where not every block would be resident.
constexpr int64_t kStreamKMinChunks = 4;
WgStreamK stream_k_split(bool quantized, int parts, int64_t T, int64_t tiles, int64_t K, const LaunchContext& ctx) {
    WgStreamK sk;
    if (!(quantized ? ctx.wgmma_stream_k_quant : ctx.wgmma_stream_k) || !ctx.stream_k_partials || !ctx.stream_k_flags ||
        parts > 0 || ctx.wgmma_gemm_parts > 0 || T > 64)
        return sk;
    const int64_t work = tiles * ((K + kWgChunk - 1) / kWgChunk);
    const int64_t blocks = std::min<int64_t>(ctx.stream_k_blocks, work / kStreamKMinChunks);
    if (blocks < 1 || work >= (int64_t(1) << 30)) return sk;
    sk.partials = ctx.stream_k_partials;
    sk.flags = ctx.stream_k_flags;
    sk.blocks = int(blocks);
    sk.work = int(work);
    return sk;
}

void check_wgmma(const LaunchContext& ctx) {
    if (!ctx.wgmma || !ctx.clusters)
        throw Error(Status::backend, "wgmma GEMM: this build has no sm_90a code for the device, or no clusters");
}

}  // namespace

bool wgmma_available() {
    static std::mutex mu;
    static uint64_t known = 0, yes = 0;  // per device bit
    int dev = 0;
    check(cudaGetDevice(&dev), "wgmma_available");
    if (dev >= 64) return false;
    const uint64_t bit = uint64_t(1) << dev;
    std::lock_guard<std::mutex> lock(mu);
    if (!(known & bit)) {
        int v = 0;
        // (no module for this device, or no sm_90a code: the read fails or gives 0)
        if (cudaMemcpyFromSymbol(&v, wgmma_compiled, sizeof v) != cudaSuccess) {
            (void)cudaGetLastError();
            v = 0;
        }
        known |= bit;
        if (v == 1) yes |= bit;
    }
    return (yes & bit) != 0;
}

int wgmma_gemm_parts(int64_t N, int64_t K, int sms) {
    const int64_t tiles = (N + kWgFeatures - 1) / kWgFeatures, chunks = (K + kWgChunk - 1) / kWgChunk;
    int parts = 1;
    while (parts < 8 && tiles * parts < sms) parts *= 2;
    while (parts > 1 && chunks < int64_t(4) * parts) parts /= 2;
    return parts;
}

bool wgmma_gemm_rows(int64_t T, const LaunchContext& ctx) {
    if (!ctx.wgmma || !ctx.clusters || T < kWgmmaGemmMinRows || T > ctx.wgmma_gemm_max_rows || T > kWgmmaGemmMaxRows ||
        gemv_wide_rows(T, ctx))
        return false;
    // (rows the register tensor-core GEMV takes: every matrix under tc_gemv_all, or groups up to tc_group_max_rows)
    return !(T <= kTcGemvMaxTokens && ((ctx.tc_gemv_all && T <= ctx.tc_gemv_max_rows) || T <= ctx.tc_group_max_rows));
}

bool wgmma_gemm_fits(const bf16* x, int64_t T, const bf16* w, int64_t K, const LaunchContext& ctx) {
    return wgmma_gemm_rows(T, ctx) && K % 8 == 0 && K < (int64_t(1) << 30) && aligned16(x) && aligned16(w);
}

void wgmma_gemm_group(const bf16* x, int64_t T, const GemvGroup& group, int64_t K, bool out_f32,
                      const LaunchContext& ctx, int parts) {
    if (T <= 0) return;
    check_wgmma(ctx);
    if (group.count < 1 || group.count > GemvGroup::kMax) throw Error(Status::internal, "wgmma GEMM: bad group");
    GemvGroup g = group;
    int64_t tiles = 0;
    bool aligned = aligned16(x);
    for (int i = 0; i < g.count; i++) {
        tiles += (g.n[i] + kWgFeatures - 1) / kWgFeatures;
        g.block_end[i] = int(tiles);
        aligned = aligned && aligned16(g.w[i]);
    }
    if (T > kWgmmaGemmMaxRows || K % 8 != 0 || K >= (int64_t(1) << 30) || tiles * 8 >= (int64_t(1) << 31) || !aligned)
        throw Error(Status::internal, "wgmma GEMM: " + std::to_string(T) + " rows of " + std::to_string(K) +
                                          " values (at most " + std::to_string(kWgmmaGemmMaxRows) +
                                          " rows, K % 8 == 0, 16-byte aligned rows)");
    if (tiles == 0) return;
    const WgStreamK sk = stream_k_split(false, parts, T, tiles, K, ctx);
    parts = launch_parts(parts, tiles, K, ctx);
    if (out_f32)
        wgmma_rows<float, false>(x, T, g, WgmmaGateUp{}, unsigned(tiles), K, parts, sk, ctx);
    else
        wgmma_rows<bf16, false>(x, T, g, WgmmaGateUp{}, unsigned(tiles), K, parts, sk, ctx);
}

void wgmma_gate_up(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                   bf16* up_out, bf16* act_out, const LaunchContext& ctx, int parts) {
    if (T <= 0 || N <= 0) return;
    check_wgmma(ctx);
    if (T > kWgmmaGemmMaxRows || K % 8 != 0 || K >= (int64_t(1) << 30) || N >= (int64_t(1) << 30) || !aligned16(x) ||
        !aligned16(wg) || !aligned16(wu))
        throw Error(Status::internal, "wgmma gate/up: " + std::to_string(T) + " rows of " + std::to_string(K) +
                                          " values (at most " + std::to_string(kWgmmaGemmMaxRows) +
                                          " rows, K % 8 == 0, 16-byte aligned rows)");
    const int64_t tiles = (N + 63) / 64;  // (each block: 64 gate and 64 up rows)
    const WgStreamK sk = stream_k_split(false, parts, T, tiles, K, ctx);
    parts = launch_parts(parts, tiles, K, ctx);
    WgmmaGateUp gu;
    gu.wg = wg;
    gu.wu = wu;
    gu.gate = gate_out;
    gu.up = up_out;
    gu.act = act_out;
    gu.n = int(N);
    GemvGroup g;
    g.add(wg, up_out, N);  // (unused by the kernel)
    wgmma_rows<bf16, true>(x, T, g, gu, unsigned(tiles), K, parts, sk, ctx);
}

void wgmma_gemm(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
                const LaunchContext& ctx, int parts) {
    if (N <= 0) return;
    if (N >= (int64_t(1) << 30)) throw Error(Status::internal, "wgmma GEMM: " + std::to_string(N) + " rows of w");
    GemvGroup g;
    g.add(w, y, N);
    wgmma_gemm_group(x, T, g, K, out_f32, ctx, parts);
}

bool wgmma_quant_rows(int64_t T, const LaunchContext& ctx) {
    return ctx.wgmma && ctx.clusters && T >= kWgmmaGemmMinRows &&
           T <= std::min<int64_t>(ctx.wgmma_quant_max_rows, kWgmmaQuantMaxRows);
}

bool wgmma_quant_fits(const bf16* x, int64_t T, const Matrix& w, const LaunchContext& ctx) {
    if (!wgmma_quant_rows(T, ctx) || !w.data || !w.scales || w.rows <= 0 || w.rows >= (int64_t(1) << 30) ||
        w.cols % kWgChunk != 0 || w.cols >= (int64_t(1) << 30) || !aligned16(x) || !aligned16(w.data))
        return false;
    if (is_int_quant(w.dtype)) return int_quant_shape_ok(w.cols, w.group) && w.scale_segment_rows == 0;
    return w.dtype == DType::F8_E4M3 && ctx.wgmma_quant_fp8;
}

void wgmma_gemm_quant_group(const bf16* x, int64_t T, const Fp8Group& group, int64_t K, DType dtype, int64_t qgroup,
                            const LaunchContext& ctx, int parts) {
    if (T <= 0) return;
    check_wgmma(ctx);
    if (group.count < 1 || group.count > Fp8Group::kMax)
        throw Error(Status::internal, "quantized wgmma GEMM: 1 to 4 members expected");
    Fp8Group g = group;
    int64_t tiles = 0;
    for (int i = 0; i < g.count; i++) {
        const Matrix w{g.w[i], dtype, g.n[i], K, g.scales[i], g.segment_rows[i], qgroup};
        if (!wgmma_quant_fits(x, T, w, ctx))
            throw Error(Status::internal, std::string("quantized wgmma GEMM: a ") + dtype_name(dtype) + " member of " +
                                              std::to_string(g.n[i]) + " x " + std::to_string(K) + " with " +
                                              std::to_string(T) + " rows is not taken");
        tiles += (g.n[i] + kWgFeatures - 1) / kWgFeatures;
        g.block_end[i] = int(tiles);
    }
    g.evict_first = ctx.evict_first ? 1 : 0;
    const WgStreamK sk = stream_k_split(true, parts, T, tiles, K, ctx);
    parts = launch_parts(parts, tiles, K, ctx);
    wgq_dtype<false>(dtype, x, T, g, WgmmaGateUp{}, unsigned(tiles), K, qgroup, parts, sk, ctx);
}

void wgmma_gate_up_quant(const bf16* x, int64_t T, const Matrix& w_gate, const Matrix& w_up, bf16* gate_out,
                         bf16* up_out, bf16* act_out, const LaunchContext& ctx, int parts) {
    if (T <= 0) return;
    check_wgmma(ctx);
    if (!wgmma_quant_fits(x, T, w_gate, ctx) || !wgmma_quant_fits(x, T, w_up, ctx) || w_gate.dtype != w_up.dtype ||
        w_gate.rows != w_up.rows || w_gate.cols != w_up.cols || w_gate.group != w_up.group ||
        w_gate.scale_segment_rows != w_up.scale_segment_rows)
        throw Error(Status::internal, "quantized wgmma gate/up: shapes, dtypes or alignment not taken");
    if (!gate_out || !up_out || !act_out || up_out == gate_out || up_out == act_out)
        throw Error(Status::internal, "quantized wgmma gate/up: gate, up and act (which may alias gate) expected");
    const int64_t tiles = (w_gate.rows + 63) / 64;  // (each block: 64 gate and 64 up rows)
    const WgStreamK sk = stream_k_split(true, parts, T, tiles, w_gate.cols, ctx);
    parts = launch_parts(parts, tiles, w_gate.cols, ctx);
    WgmmaGateUp gu;
    gu.wg = w_gate.data;
    gu.wu = w_up.data;
    gu.sg = w_gate.scales;
    gu.su = w_up.scales;
    gu.segment_rows = int(w_gate.scale_segment_rows);
    gu.gate = gate_out;
    gu.up = up_out;
    gu.act = act_out;
    gu.n = int(w_gate.rows);
    Fp8Group g;
    g.add(w_gate, up_out);  // (unused by the kernel)
    wgq_dtype<true>(w_gate.dtype, x, T, g, gu, unsigned(tiles), w_gate.cols, w_gate.group, parts, sk, ctx);
}

}  // namespace hy::cuda
