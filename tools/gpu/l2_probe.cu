// L2 probe (a measurement, not part of the engine): does a weight matrix placed in L2 ahead of a decode GEMV make
// the GEMV faster on this GPU, and do bulk L2 prefetches (cp.async.bulk.prefetch.L2, prefetch.global.L2) place it
// as well as reading it does? For each matrix size (K = 2560, 8-48 MB), after a 512 MB flush of L2: a
// block-per-row GEMV timed cold, after a read of the matrix by every SM, after bulk prefetches from 132 or 32
// one-warp blocks (64 or 16 KB each), after per-line prefetches from all SMs; then a 10 us spin kernel followed by
// the GEMV with the prefetch on a second stream during the spin. Times are event-timed single launches (they
// include a few microseconds of launch overhead), medians of 15. Results: docs/perf-notes.md, sixth session.
// Build and run on the GPU machine (sm_90 or newer):
//   nvcc -O2 -arch=sm_90a -o l2_probe tools/gpu/l2_probe.cu && ./l2_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

__device__ __forceinline__ uint4 ldw(const uint4* p, bool ef) {
    uint4 r;
    uint64_t pol;
    if (ef)
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(pol));
    return r;
}

// one row per 2 warps (K = 2560: 320 words, 64 lanes x 5), 4 warps per block
__global__ void gemv(const uint4* w, const uint4* x, float* y, int N, int K8, bool ef) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * 2 + warp / 2;
    if (n >= N) return;
    const uint4* wr = w + (size_t)n * K8;
    uint4 v[8];
    int first = lane + 32 * (warp % 2);
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int k = first + 64 * u;
        if (k < K8) v[u] = ldw(wr + k, ef);
    }
    float acc = 0;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int k = first + 64 * u;
        if (k < K8) {
            uint4 xv = __ldg(x + k);
            const __nv_bfloat162* a = (const __nv_bfloat162*)&v[u];
            const __nv_bfloat162* b = (const __nv_bfloat162*)&xv;
            for (int e = 0; e < 4; e++) {
                float2 fa = __bfloat1622float2(a[e]), fb = __bfloat1622float2(b[e]);
                acc += fa.x * fb.x + fa.y * fb.y;
            }
        }
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    if (lane == 0) atomicAdd(y + n, acc);
}

__global__ void tma_prefetch(const char* p, size_t bytes, unsigned chunk) {
    if (threadIdx.x) return;
    size_t n = (bytes + chunk - 1) / chunk;
    for (size_t c = blockIdx.x; c < n; c += gridDim.x) {
        size_t lo = c * chunk, sz = bytes - lo < chunk ? bytes - lo : chunk;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + lo), "r"(unsigned(sz)) : "memory");
    }
}
__global__ void line_prefetch(const char* p, size_t bytes) {
    for (size_t o = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * 128; o < bytes;
         o += size_t(gridDim.x) * blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}
__global__ void read_all(const uint4* p, size_t n16, float* sink) {
    float s = 0;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
        uint4 v = ldw(p + i, false);
        s += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
    }
    if (s == 1.2345f) *sink = s;
}
__global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

int main() {
    const int K = 2560, K8 = K / 8;
    char* flush;
    size_t flush_bytes = size_t(512) << 20;
    cudaMalloc(&flush, flush_bytes);
    size_t maxw = size_t(64) << 20;
    char* w;
    cudaMalloc(&w, maxw);
    cudaMemset(w, 0x11, maxw);
    uint4* x;
    cudaMalloc(&x, K * 2);
    cudaMemset(x, 0x22, K * 2);
    float* y;
    cudaMalloc(&y, 64 << 20);
    float* sink;
    cudaMalloc(&sink, 4);
    cudaStream_t s1, s2;
    cudaStreamCreate(&s1);
    cudaStreamCreate(&s2);
    cudaEvent_t e0, e1, ep;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&ep);
    auto do_flush = [&] {
        cudaMemsetAsync(flush, 1, flush_bytes, s1);
        read_all<<<264, 512, 0, s1>>>((const uint4*)flush, flush_bytes / 16, sink);
    };
    int sms = 132;
    for (size_t mb : {8, 16, 24, 32, 48}) {
        size_t bytes = mb << 20;
        int N = int(bytes / (K * 2));
        auto run_gemv = [&](cudaStream_t s, bool ef) {
            gemv<<<(N + 1) / 2, 128, 0, s>>>((const uint4*)w, x, y, N, K8, ef);
        };
        const char* names[] = {"cold",        "warm(read_all)", "tma64K x132",      "tma64K x32",
                               "tma16K x132", "line x264x512",  "cold evict_first", "tma64K x132 ef"};
        for (int mode = 0; mode < 8; mode++) {
            std::vector<float> t;
            for (int rep = 0; rep < 15; rep++) {
                do_flush();
                bool ef = mode >= 6;
                if (mode == 1) read_all<<<264, 512, 0, s1>>>((const uint4*)w, bytes / 16, sink);
                if (mode == 2 || mode == 7) tma_prefetch<<<sms, 32, 0, s1>>>(w, bytes, 64 << 10);
                if (mode == 3) tma_prefetch<<<32, 32, 0, s1>>>(w, bytes, 64 << 10);
                if (mode == 4) tma_prefetch<<<sms, 32, 0, s1>>>(w, bytes, 16 << 10);
                if (mode == 5) line_prefetch<<<264, 512, 0, s1>>>(w, bytes);
                spin<<<1, 32, 0, s1>>>(30000);  // let prefetches land
                cudaEventRecord(e0, s1);
                run_gemv(s1, ef);
                cudaEventRecord(e1, s1);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms * 1000);
            }
            std::sort(t.begin(), t.end());
            printf("%2zu MB %-18s gemv %7.2f us  (%6.0f GB/s)\n", mb, names[mode], t[t.size() / 2],
                   bytes / (t[t.size() / 2] * 1e3));
        }
        // overlap: spin 10us on s1 then gemv; prefetch on s2 concurrently started with the spin
        for (int mode = 0; mode < 3; mode++) {
            std::vector<float> t;
            for (int rep = 0; rep < 15; rep++) {
                do_flush();
                cudaStreamSynchronize(s1);
                cudaEventRecord(e0, s1);
                cudaEventRecord(ep, s1);
                cudaStreamWaitEvent(s2, ep, 0);
                if (mode == 1) tma_prefetch<<<32, 32, 0, s2>>>(w, bytes, 64 << 10);
                if (mode == 2) tma_prefetch<<<sms, 32, 0, s2>>>(w, bytes, 64 << 10);
                spin<<<1, 32, 0, s1>>>(10000);
                run_gemv(s1, true);
                cudaEventRecord(e1, s1);
                cudaStreamSynchronize(s2);
                cudaEventSynchronize(e1);
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms * 1000);
            }
            std::sort(t.begin(), t.end());
            printf("%2zu MB spin10us+gemv(ef) with prefetch mode %d: %7.2f us\n", mb, mode, t[t.size() / 2]);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("done: %s\n", cudaGetErrorString(e));
}
