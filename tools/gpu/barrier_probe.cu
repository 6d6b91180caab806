// Grid-barrier probe (a measurement, not part of the engine): a decode step is about 400 kernels, and at b=1 each
// boundary costs latency the bytes do not (docs/perf-notes.md, thirty-third session). Would one kernel with software
// grid barriers between its phases (all blocks resident, an arrival counter and a generation word) pay less per
// phase than a kernel boundary with programmatic dependent launch in a CUDA graph, as the engine launches them?
// Each phase here: every block writes one word, then (after the barrier or the boundary) reads the word a
// neighbouring block wrote, so the memory of the previous phase is visible as the engine needs it.
//   barrier: one launch of G blocks x 256 threads running kPhases phases, a grid barrier between phases
//   pdl:     kPhases launches of the same kernel (one phase each) captured in a graph, PDL attribute on each
//   plain:   the same without PDL
// Times per phase: event-timed, median of 7 runs; G = SMs x {1, 2, 4}. Build and run on the GPU machine (sm_90):
//   nvcc -O2 -arch=sm_90a -o barrier_probe tools/gpu/barrier_probe.cu && ./barrier_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                             \
    do {                                                                                     \
        cudaError_t e_ = (x);                                                                \
        if (e_ != cudaSuccess) {                                                             \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

constexpr int kPhases = 400;
constexpr int kThreads = 256;

// count: arrivals of the current generation; gen: the generation (both zero at the start)
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen, unsigned n_blocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *reinterpret_cast<volatile unsigned*>(gen);
        __threadfence();  // this block's writes before its arrival
        if (atomicAdd(count, 1u) == n_blocks - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            while (*reinterpret_cast<volatile unsigned*>(gen) == g) __nanosleep(20);
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ void phase(unsigned* words, unsigned* sink, int p) {
    if (threadIdx.x == 0) {
        const unsigned prev = *reinterpret_cast<volatile unsigned*>(&words[(blockIdx.x + 1) % gridDim.x]);
        words[blockIdx.x] = prev + unsigned(p);
        if (prev == 0xffffffffu) *sink = prev;  // (keeps the read)
    }
}

__global__ void barrier_kernel(unsigned* words, unsigned* sink, unsigned* count, unsigned* gen) {
    for (int p = 0; p < kPhases; p++) {
        phase(words, sink, p);
        grid_barrier(count, gen, gridDim.x);
    }
}

__global__ void phase_kernel(unsigned* words, unsigned* sink, int p, bool pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    phase(words, sink, p);
}

int main() {
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s, %d SMs; %d phases; us per phase (median of 7)\n", prop.name, sms, kPhases);
    unsigned *words, *sink, *bar;
    CHECK(cudaMalloc(&words, 4096 * 4));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMalloc(&bar, 8));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, barrier_kernel, kThreads, 0));
    std::printf("| blocks | barrier | pdl graph | plain graph |\n|--:|--:|--:|--:|\n");
    for (int mult : {1, 2, 4}) {
        const int G = sms * mult;
        if (mult > per_sm) break;
        float t[3] = {0, 0, 0};
        for (int mode = 0; mode < 3; mode++) {
            cudaGraphExec_t exec = nullptr;
            if (mode > 0) {  // kPhases launches in a graph
                cudaGraph_t graph;
                CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int p = 0; p < kPhases; p++) {
                    cudaLaunchConfig_t cfg{};
                    cfg.gridDim = dim3(G);
                    cfg.blockDim = dim3(kThreads);
                    cfg.stream = s;
                    cudaLaunchAttribute attr{};
                    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    attr.val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = &attr;
                    cfg.numAttrs = mode == 1 ? 1 : 0;
                    CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, words, sink, p, mode == 1));
                }
                CHECK(cudaStreamEndCapture(s, &graph));
                CHECK(cudaGraphInstantiate(&exec, graph, 0));
                CHECK(cudaGraphDestroy(graph));
            }
            std::vector<float> ms;
            for (int r = 0; r < 8; r++) {
                CHECK(cudaMemsetAsync(bar, 0, 8, s));
                CHECK(cudaEventRecord(e0, s));
                if (mode == 0)
                    barrier_kernel<<<G, kThreads, 0, s>>>(words, sink, bar, bar + 1);
                else
                    CHECK(cudaGraphLaunch(exec, s));
                CHECK(cudaEventRecord(e1, s));
                CHECK(cudaEventSynchronize(e1));
                CHECK(cudaGetLastError());
                float v = 0;
                CHECK(cudaEventElapsedTime(&v, e0, e1));
                if (r > 0) ms.push_back(v);  // (the first run warms up)
            }
            std::sort(ms.begin(), ms.end());
            t[mode] = ms[ms.size() / 2] * 1000.0f / kPhases;
            if (exec) CHECK(cudaGraphExecDestroy(exec));
        }
        std::printf("| %d | %.2f | %.2f | %.2f |\n", G, t[0], t[1], t[2]);
    }
    return 0;
}
