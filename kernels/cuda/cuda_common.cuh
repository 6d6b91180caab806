// Shared pieces of the CUDA kernels: error checks that throw hy::Error naming the failing call, bf16 helpers,
// warp/block reductions and the per-batch row map the mixers read.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/tuning.cuh"

namespace hy::cuda {

using bf16 = __nv_bfloat16;

// Throws hy::Error(backend) "CUDA error in <what>: <reason>" when `e` is not cudaSuccess.
inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
        throw Error(Status::backend, std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + " (" +
                                         cudaGetErrorString(e) + ")");
}
// Checks a launch (configuration errors surface here; faults surface at the next synchronizing call).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Sets a kernel's dynamic shared memory limit to `bytes` (above the 48 KB default) and, with max_carveout, the
// largest shared-memory carveout, once per device (a function attribute holds for the current device only). done:
// the kernel's own bit set of devices done (a function-local static at the call site).
template <typename... KArgs>
void opt_in_smem(void (*kernel)(KArgs...), size_t bytes, std::atomic<uint64_t>& done, const char* what,
                 bool max_carveout = false) {
    int dev = 0;
    check(cudaGetDevice(&dev), what);
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)), what);
    if (max_carveout)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared)),
              what);
    done.fetch_or(bit, std::memory_order_relaxed);
}

#define HY_CUDA_CHECK(call) ::hy::cuda::check((call), #call)

// Where and how a backend launches its kernels: its stream and the launch features it uses, set once when the
// backend is made (from CudaOptions and the device; kernels/backend.h). Every launcher of kernels/cuda takes one.
struct LaunchContext {
    cudaStream_t stream = nullptr;
    bool pdl = false;         // launch with programmatic dependent launch (device and code of 9.0+)
    bool clusters = false;    // thread-block clusters may be used (device and code of 9.0+)
    bool evict_first = true;  // decode GEMVs load weights with an L2 evict-first policy (matmul.cuh)
    bool gdn_fused_conv =
        true;  // decode steps do the Gated DeltaNet conv in the recurrence kernel (gated_delta_net.cuh)
    // gated_delta_net.cuh: decode steps without the conv inside stream the heads' states through blocks that each
    // take several (run, head) items (two state buffers); gdn_decode_stream_blocks > 0 caps the blocks (tests)
    bool gdn_decode_stream = false;
    int gdn_decode_stream_blocks = 0;
    // gated_delta_net.cuh: decode steps that stage the state take the 80-register kernel (three blocks an SM) where
    // Dv <= 128; false (the default): the 128-register one (two blocks an SM). Bitwise the same results.
    bool gdn_decode_three_blocks = false;
    // gated_delta_net.cuh: the most rows a prefill conv thread takes (its weights loaded once for them); 0: 16
    int gdn_conv_rows = 0;
    int moe_grouped_min_rows = kMoeGroupedMinRows;         // moe.cuh: rows from which the experts run grouped by expert
    int moe_grouped_min_rows_fp8 = kMoeGroupedMinRowsFp8;  // ... FP8 experts
    bool moe_group_k64 = false;  // moe.cuh: the grouped GEMM's stages of 64 K values even where 128 fit
    int attn_heads_per_block = kAttnHeadsPerBlock;  // attention.cuh: q heads of one kv head per decode block
    int attn_prefill_heads_per_block = kAttnPrefillHeadsPerBlock;  // attention.cuh: ... per prefill (flash) block
    int attn_max_splits = kAttnDefaultSplits;  // attention.cuh: most position splits of a decode step
    int int_gemv_split_k = 0;  // int_matmul.cuh: the Q8/Q4 GEMV splits K in two: 1 always, -1 never, 0 by shape
    // int_matmul.cuh: the Q8/Q4 GEMV copies its codes into shared memory (cp.async): 1 always, -1 never, 0 by rows
    int int_gemv_staged = 0;
    // matmul.cuh: bf16 matrices with 3 to tc_gemv_max_rows rows of x all go to the tensor-core GEMV (singles, pairs,
    // gate/up, lm_head); false: only groups of 3 or 4 matrices of 3 to 8 rows, the others to cuBLASLt
    bool tc_gemv_all = kTcGemvAll;
    // kGemvMaxTokens by default (run 128 measured b=16 at 3,270 tok/s with 9-16 rows here against 3,873 on cuBLASLt;
    // such rows now go to the cluster GEMV below); kTcGemvMaxTokens with CudaOptions::small_batch_gemv = 1
    int tc_gemv_max_rows = kGemvMaxTokens;
    // matmul.cuh: bf16 matrices with 9 to this many rows (and not taken by the above) go to the tensor-core GEMV in
    // clusters (gemv_wide_with) where ctx.clusters; 0: none (cuBLASLt)
    int wide_gemv_max_rows = kWideGemvDefaultMaxTokens;
    // matmul.cuh: groups of 3 or 4 bf16 matrices (the q/k/v and Gated DeltaNet input projections) of up to this many
    // rows go to the tensor-core GEMV when the above leave them to cuBLASLt (gemv_group_fits)
    int tc_group_max_rows = kGemvMaxTokens;
    // gemm_wgmma.cuh: bf16 matrices with kWgmmaGemmMinRows to this many rows that no GEMV above takes go to the wgmma
    // GEMM (where wgmma and clusters) instead of cuBLASLt; 0: none
    int wgmma_gemm_max_rows = kWgmmaGemmDefaultMaxRows;
    // ... of which lone matrices (not logits) up to wgmma_lone_max_rows, the gate/up/SiLU pair up to
    // wgmma_gate_up_max_rows and logits up to wgmma_logits_max_rows (more: cuBLASLt). The backend sets the tuned
    // bounds (tuning.cuh) for CudaOptions::wgmma_gemm = 0, the default; with 1 or 2 these stay unbounded.
    int wgmma_lone_max_rows = 1 << 30;
    int wgmma_gate_up_max_rows = 1 << 30;
    int wgmma_logits_max_rows = 1 << 30;
    int wgmma_gemm_parts = 0;  // its K split (1, 2, 4, 8); 0: wgmma_gemm_parts by shape
    // gemm_wgmma.cuh: Q8/Q4 matrices with kWgmmaGemmMinRows to this many rows (at most 64) on the quantized wgmma
    // GEMM (where wgmma and clusters); 0 (CudaOptions::wgmma_quant false): none (the dequantization path)
    int wgmma_quant_max_rows = 0;
    // ... and FP8 matrices too (CudaOptions::wgmma_quant and not fp8_block_scaled_gemm: it replaces the W8A16
    // dequantization; the FP8 tensor-core GEMM is faster than it)
    bool wgmma_quant_fp8 = false;
    // ... its consumer warpgroups a block: 1 (each thread converts and multiplies both 64-row tiles) or 2 (one tile
    // each: twice the warps to hide the conversion's latency; every weight format, CudaOptions::wgmma_quant_warpgroups,
    // default 2)
    int wgmma_quant_warpgroups = 2;
    // gemm_wgmma.cuh: the wgmma GEMMs (bf16 and quantized, 9-64 rows, K split not given) as a stream-K split over
    // stream_k_blocks blocks (CudaOptions::wgmma_stream_k for bf16, wgmma_stream_k_quant for int8/int4/fp8), their
    // partial sums [stream_k_blocks][128 x 64] fp32 and flags [stream_k_blocks] (zero between launches) in the
    // workspace; off or no workspace: the cluster K split
    bool wgmma_stream_k = false;
    bool wgmma_stream_k_quant = false;
    float* stream_k_partials = nullptr;
    int* stream_k_flags = nullptr;
    int stream_k_blocks = 0;
    bool wgmma = false;  // the build has sm_90a code for the device (wgmma_available)
    int sm_count = 0;    // the device's multiprocessors (launch shapes that fill the device)
    int smem_optin = 0;  // the most dynamic shared memory a block may opt in to, bytes (0: not read)
};

// Per batch row, on the device (filled by the backend's begin_batch from the host runs).
struct RowMap {
    const int32_t* slot = nullptr;    // [T] sequence slot of the row
    const int32_t* pos = nullptr;     // [T] absolute position of the row in its sequence
    const int32_t* in_run = nullptr;  // [T] index of the row inside its run (0 = the run's first row)
    const SeqRun* runs = nullptr;     // [n_runs]
    int32_t n_rows = 0;
    int32_t n_runs = 0;
};

__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf16(float v) { return __float2bfloat16_rn(v); }
// Rounds through bf16 (to mirror where a bf16 PyTorch model rounds an intermediate).
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// 8 bf16 values in one 16-byte word.
union Bf16x8 {
    uint4 u;
    __nv_bfloat162 h2[4];
};

__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
    Bf16x8 v;
    v.u = u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 p = __bfloat1622float2(v.h2[i]);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float* f) {
    Bf16x8 v;
#pragma unroll
    for (int i = 0; i < 4; i++) v.h2[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return v.u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the function synchronizes the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

// True when p is 16-byte aligned (the vector loads' requirement).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The fp32 result of a product stored as OutT (F32 as it is; bf16 rounded to nearest even).
template <typename OutT>
__device__ __forceinline__ OutT store_as(float v);
template <>
__device__ __forceinline__ float store_as<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ bf16 store_as<bf16>(float v) {
    return to_bf16(v);
}

// ---- Weight loads and tensor-core products (the GEMVs of matmul.cu and the experts of moe.cu) ----
// The L2 policy of weight loads: evict-first, or normal.
__device__ __forceinline__ uint64_t weight_policy(bool evict_first) {
    uint64_t pol;
    if (evict_first)
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

// A weight word: read once per step, so it bypasses L1 (x, reused by every warp, stays there); pol from
// weight_policy.
__device__ __forceinline__ uint4 ld_weight(const uint4* p, uint64_t pol) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p), "l"(pol));
    return r;
}

// ---- The decode GEMVs' block shape and split reduction (matmul.cu, fp8_matmul.cu) ----
// Warps per block of a GEMV whose rows take kSplit warps: kGemvWarps, or kSplit when that is larger.
template <int kSplit>
constexpr int gemv_block_warps() {
    return kSplit > kGemvWarps ? kSplit : kGemvWarps;
}

// Reduces the kSplit parts of each row of the block into acc of part 0 (returns false in the other parts).
template <int NT, int kSplit>
__device__ __forceinline__ bool reduce_parts(float* acc, float (*part)[NT]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
    if constexpr (kSplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++) part[warp][t] = acc[t];
        }
        __syncthreads();
        if (warp % kSplit != 0) return false;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = part[warp][t];
#pragma unroll
            for (int q = 1; q < kSplit; q++) v += part[warp + q][t];
            acc[t] = v;
        }
    }
    return true;
}

// D += A B on tensor cores, one warp: A 16x16 bf16 (row-major fragment a0..a3), B 16x8 bf16 (column-major fragment
// b0, b1), C/D 16x8 fp32 (c[0..3]); PTX ISA "mma.sync.aligned.m16n8k16", the fragment layouts of its figures.
__device__ __forceinline__ void mma_bf16_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// ---- Shared-memory tiles: cp.async copies and ldmatrix loads (attention.cu, moe.cu) ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when !valid nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16-byte global -> shared copy with an L2 cache policy (weight_policy).
__device__ __forceinline__ void cp_async16_policy(uint32_t dst, const void* src, bool valid, uint64_t pol) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(n),
                 "l"(pol)
                 : "memory");
}

// Shared-memory address of the same variable in block `rank` of the cluster, and a 4-byte load from it (sm_90).
__device__ __forceinline__ uint32_t cluster_smem_addr(uint32_t addr, uint32_t rank) {
    uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
#else
    (void)addr;
    (void)rank;
    __trap();
#endif
    return r;
}
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#else
    (void)addr;
    __trap();
#endif
    return v;
}

// volatile: the shared memory behind a fixed address changes between loop iterations (cp.async), so these loads
// must not be merged or hoisted by the compiler.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// ---- The decode-step trace (builds with -DHY_CUDA_TRACE=ON only; CudaOptions::trace_file) ----
// When bound, block (0, 0, 0) of every kernel of this backend appends two %globaltimer stamps (ns): when it
// started (in pdl_trigger) and when its wait for the predecessor returned (in pdl_wait). Kernels start and pass
// their waits in stream order, so entry i of both lists belongs to the i-th launch; the time from one kernel's
// wait to the next one's is what that kernel costs on the critical path of the pipelined step. Not bound (the
// default), it costs a constant-cache load and a branch per thread; builds without HY_CUDA_TRACE have none of it.
#if defined(HY_CUDA_TRACE)
struct TraceBuf {
    unsigned long long* start = nullptr;  // [cap]
    unsigned long long* ready = nullptr;  // [cap]
    unsigned int* count = nullptr;        // [2]: entries taken in start, in ready
    unsigned int cap = 0;
};
// One copy per translation unit (CUDA without relocatable device code); each kernel file binds its own with
// HY_CUDA_TRACE_BINDER, and the backend binds them all (trace_bind_all).
static __constant__ TraceBuf g_trace;
#define HY_CUDA_TRACE_BINDER(name)                                                                \
    void trace_bind_##name(const TraceBuf& t) {                                                   \
        check(cudaMemcpyToSymbol(g_trace, &t, sizeof t), "cudaMemcpyToSymbol(trace, " #name ")"); \
    }
void trace_bind_all(const TraceBuf& t);

__device__ __forceinline__ void trace_stamp(int which) {
    if (g_trace.start && threadIdx.x == 0 && (blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        const unsigned int i = atomicAdd(g_trace.count + which, 1u);
        if (i < g_trace.cap) (which ? g_trace.ready : g_trace.start)[i] = now;
    }
}

// Host side: while set, launch() appends each launch to this list (the backend's trace log).
struct LaunchRecord {
    const char* what;
    unsigned blocks;
    unsigned threads;
};
inline std::vector<LaunchRecord>*& launch_log() {
    static std::vector<LaunchRecord>* log = nullptr;
    return log;
}
// While alive, sends the launches to `to` instead of the trace log (when a trace log is set); restores it after.
struct LaunchLogTo {
    std::vector<LaunchRecord>* const saved;
    explicit LaunchLogTo(std::vector<LaunchRecord>* to) : saved(launch_log()) {
        if (saved) launch_log() = to;
    }
    ~LaunchLogTo() { launch_log() = saved; }
    LaunchLogTo(const LaunchLogTo&) = delete;
    LaunchLogTo& operator=(const LaunchLogTo&) = delete;
};
#else
__device__ __forceinline__ void trace_stamp(int) {}
#define HY_CUDA_TRACE_BINDER(name)
#endif

// ---- Programmatic dependent launch (PDL, compute capability 9.0+) ----
// A kernel launched with launch() may start while the kernel before it on the stream is still running, so that
// its launch latency and its prologue (e.g. loading weights, which no kernel writes) overlap the predecessor's
// tail. The protocol every kernel of this backend follows:
//   - pdl_trigger() early (lets the next kernel be scheduled once every block of this one has started);
//   - pdl_wait() in every thread before the first read of memory that an earlier kernel writes, before the first
//     write of memory that an earlier kernel reads, and before any early return. pdl_wait() returns once the
//     preceding kernel has completed and its writes are visible; since that kernel waited for its own
//     predecessor, everything enqueued earlier is complete too.
// Both are no-ops below sm_90 and when the kernel was launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    trace_stamp(1);
}
__device__ __forceinline__ void pdl_trigger() {
    trace_stamp(0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, ctx.stream>>>(args...) in clusters of cluster_x blocks along x (1: no cluster
// attribute; more needs ctx.clusters), on ctx's stream with the PDL attribute when ctx.pdl; checks the launch.
template <typename... KArgs, typename... Args>
void launch_clusters(void (*kernel)(KArgs...), dim3 grid, dim3 block, unsigned cluster_x, size_t smem,
                     const LaunchContext& ctx, const char* what, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx.stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (ctx.pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
#if defined(HY_CUDA_TRACE)
    if (std::vector<LaunchRecord>* log = launch_log())
        log->push_back(LaunchRecord{what, grid.x * grid.y * grid.z, block.x * block.y * block.z});
#endif
}

// Launches kernel<<<grid, block, smem, ctx.stream>>>(args...) with the PDL attribute when ctx.pdl; checks the
// launch.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const LaunchContext& ctx, const char* what,
            Args&&... args) {
    launch_clusters(kernel, grid, block, 1, smem, ctx, what, std::forward<Args>(args)...);
}

// The cluster barrier (barrier.cluster), in two halves: cluster_arrive() marks the calling thread as arrived
// (release semantics) and returns; cluster_wait() waits until every thread of every block of the cluster has
// arrived (acquire semantics). Every thread of the cluster must call both, in that order. No-ops below sm_90, where
// no kernel is launched in clusters.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait;" ::: "memory");
#endif
}

}  // namespace hy::cuda
