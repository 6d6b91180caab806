// hybrid-kernel-bench: memory throughput of the decode GEMV launch shapes (and cuBLASLt for reference) on the
// Qwen3.5-4B projection shapes, to choose cuda::gemv_config. Built with CUDA only; needs a GPU.
//
// Each measurement is a CUDA graph of kLaunches back-to-back launches of one shape that cycle through enough
// copies of the weights (>= 256 MB) that L2 (50 MB on an H200) holds none of them, replayed several times; the
// figure is weight bytes / median replay time. Usage: hybrid-kernel-bench [T] (rows of x, 1..8; default 1).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/matmul.cuh"

using namespace hy;
using namespace hy::cuda;

namespace {

constexpr int kLaunches = 32;
constexpr int kReps = 7;

struct Shape {
    const char* name;
    std::vector<int64_t> n;  // output rows per matrix of the group (sharing x)
    int64_t K;
    bool out_f32 = false;
    bool gate_up = false;  // n = {F, F}: gate and up with the SiLU product
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <class Body>
double time_graph(cudaStream_t s, Body&& body) {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    HY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    body();
    HY_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    HY_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    cudaEvent_t e0, e1;
    HY_CUDA_CHECK(cudaEventCreate(&e0));
    HY_CUDA_CHECK(cudaEventCreate(&e1));
    HY_CUDA_CHECK(cudaGraphLaunch(e, s));  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < kReps; r++) {
        HY_CUDA_CHECK(cudaEventRecord(e0, s));
        HY_CUDA_CHECK(cudaGraphLaunch(e, s));
        HY_CUDA_CHECK(cudaEventRecord(e1, s));
        HY_CUDA_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        HY_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        int T = argc > 1 ? std::atoi(argv[1]) : 1;
        if (T < 1 || T > kGemvMaxTokens) T = 1;
        int major = 0;
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        cudaStream_t s;
        HY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        LaunchContext no_pdl;  // cuBLASLt is timed without PDL, the GEMVs with it where the device has it
        no_pdl.stream = s;
        LaunchContext pdl = no_pdl;
        pdl.pdl = major >= 9;
        const std::vector<Shape> shapes = {
            {"gdn in_proj qkv|z|b|a", {8192, 4096, 32, 32}, 2560},
            {"attn q|k|v", {8192, 1024, 1024}, 2560},
            {"o_proj / out_proj", {2560}, 4096},
            {"down_proj", {2560}, 9216},
            {"gate+up+SiLU", {9216, 9216}, 2560, false, true},
            {"lm_head (F32 out)", {248320}, 2560, true},
        };
        Gemm gemm;
        void* ws = nullptr;
        HY_CUDA_CHECK(cudaMalloc(&ws, Gemm::kWorkspaceBytes));
        gemm.set_workspace(ws);
        bf16* x = nullptr;
        void* y = nullptr;
        HY_CUDA_CHECK(cudaMalloc(&x, size_t(8) * 16384 * 2));
        HY_CUDA_CHECK(cudaMemset(x, 0, size_t(8) * 16384 * 2));
        HY_CUDA_CHECK(cudaMalloc(&y, size_t(8) * 248320 * 4 * 3));
        std::printf("T = %d; GB/s of weights read (median of %d replays of %d launches)\n\n", T, kReps, kLaunches);
        std::printf("| shape | MB | cuBLASLt | GEMV launch shapes, PDL on: split,per: GB/s |\n|---|---:|---:|---|\n");
        for (const Shape& sh : shapes) {
            int64_t rows = 0;
            for (int64_t n : sh.n) rows += n;
            const size_t bytes = size_t(rows) * size_t(sh.K) * 2;
            const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / bytes + 1));
            bf16* w = nullptr;
            HY_CUDA_CHECK(cudaMalloc(&w, bytes * size_t(copies)));
            HY_CUDA_CHECK(cudaMemset(w, 0, bytes * size_t(copies)));
            auto wcopy = [&](int i) { return w + size_t(i % copies) * (bytes / 2); };
            auto group = [&](int i) {
                GemvGroup g;
                int64_t off = 0;
                char* yp = static_cast<char*>(y);
                for (int64_t n : sh.n) {
                    g.add(wcopy(i) + off * sh.K, yp, n);
                    off += n;
                    yp += size_t(n) * size_t(T) * (sh.out_f32 ? 4 : 2);
                }
                return g;
            };
            const double total = double(bytes) * kLaunches;
            std::string line = "| " + std::string(sh.name) + " | " + std::to_string(int(bytes / 1e6)) + " | ";
            // cuBLASLt, one call per matrix
            double ms = time_graph(s, [&] {
                for (int i = 0; i < kLaunches; i++) {
                    int64_t off = 0;
                    for (int64_t n : sh.n) {
                        gemm.run(x, T, wcopy(i) + off * sh.K, n, sh.K, y, sh.out_f32, no_pdl);
                        off += n;
                    }
                }
            });
            char buf[128];
            std::snprintf(buf, sizeof buf, "%.0f | ", total / (ms * 1e-3) / 1e9);
            line += buf;
            // the GEMV launch shapes (PDL on); * = the one the backend chooses for this K
            const GemvConfig chosen = sh.gate_up ? GemvConfig{2, 8} : gemv_config(sh.K);
            std::vector<GemvConfig> shapes_to_try;
            if (sh.gate_up || T > kGemvBlockMaxTokens)
                shapes_to_try = {{2, 8}};  // (more rows: the tensor-core GEMV, which has one shape)
            else
                shapes_to_try = {{2, 8}, {4, 8}, {8, 8}};
            bool first = true;
            for (GemvConfig c : shapes_to_try) {
                ms = time_graph(s, [&] {
                    for (int i = 0; i < kLaunches; i++) {
                        if (sh.gate_up && T <= kGemvBlockMaxTokens) {
                            bf16* yb = static_cast<bf16*>(y);
                            gemv_gate_up(x, T, wcopy(i), wcopy(i) + sh.n[0] * sh.K, sh.n[0], sh.K, yb, yb + 8 * sh.n[0],
                                         yb + 16 * sh.n[0], pdl);
                        } else {
                            gemv_group_with(x, T, group(i), sh.K, sh.out_f32, c, pdl);
                        }
                    }
                });
                if (T > kGemvBlockMaxTokens)
                    std::snprintf(buf, sizeof buf, "tensor-core GEMV%s: %.0f",
                                  sh.gate_up ? " (gate, up as a group)" : "", total / (ms * 1e-3) / 1e9);
                else
                    std::snprintf(buf, sizeof buf, "%s%d,%d%s: %.0f", first ? "" : "; ", c.split, c.per,
                                  (c.split == chosen.split && c.per == chosen.per) ? "*" : "",
                                  total / (ms * 1e-3) / 1e9);
                line += buf;
                first = false;
            }
            std::printf("%s |\n", line.c_str());
            std::fflush(stdout);
            HY_CUDA_CHECK(cudaFree(w));
        }
        std::printf("\n(split,per: warps per row, 16-byte words per lane per round; * = the backend's choice)\n");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-kernel-bench: %s\n", e.what());
        return 1;
    }
}
