// hybrid-kernel-bench: memory throughput of the decode GEMV launch shapes (and cuBLASLt for reference) on the
// Qwen3.5-4B projection shapes, to choose cuda::gemv_config and cuda::gemv_mma_config. Built with CUDA only; needs
// a GPU.
//
// Each measurement is a CUDA graph of kLaunches back-to-back launches of one shape that cycle through enough
// copies of the weights (>= 256 MB) that L2 (50 MB on an H200) holds none of them, replayed several times; the
// figure is weight bytes / median replay time. Usage: hybrid-kernel-bench [T] [fp8] (rows of x, 1..256; default 1;
// fp8: the FP8 GEMVs of kernels/cuda/fp8_matmul.cuh, every launch shape, on the same shapes with FP8 weights). Above
// kTcGemvMaxTokens rows (the batched GEMMs) it times cuBLASLt's first 8 heuristic choices instead of the GEMVs. With
// sm_90a code, 3 to 128 rows: the wgmma GEMM too (kernels/cuda/gemm_wgmma.cuh), a shape's matrices in one launch,
// at every K split ("wgmma parts 1: GB/s, 2: ..."; * marks the split the backend chooses).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/fp8.h"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/matmul.cuh"
#include "model/quantize.h"

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

// The FP8 GEMV launch shapes on the FP8 versions of the shapes (weights 1 byte, scales 4 bytes per 128 x 128).
void bench_fp8(int T, const std::vector<Shape>& shapes, cudaStream_t s, const LaunchContext& pdl, bf16* x, void* y) {
    std::printf("\nFP8 weights (e4m3, 128 x 128 block scales); GB/s of weights and scales read\n\n");
    std::printf("| shape | MB | FP8 GEMV launch shapes, PDL on: GB/s |\n|---|---:|---|\n");
    std::vector<Fp8GemvConfig> configs;
    if (T <= kGemvBlockMaxTokens)
        configs = {{false, 1, 8},           {false, 2, 4},           {false, 2, 8},           {false, 4, 4},
                   {false, 4, 8},           {false, 8, 4},           {false, 8, 8},           {false, 1, 4, false, 2},
                   {false, 1, 8, false, 2}, {false, 2, 4, false, 2}, {false, 4, 4, false, 2}, {false, 1, 4, false, 4},
                   {false, 2, 4, false, 4}};
    if (T == 1)
        for (int split : {1, 2, 4})
            for (int rows : {2, 4}) configs.push_back({false, split, 0, false, rows, true});
    configs.push_back({true, 0, 2, false});
    configs.push_back({true, 0, 4, false});
    configs.push_back({true, 0, 2, true});
    configs.push_back({true, 0, 4, true});
    for (const Shape& sh : shapes) {
        if (sh.out_f32) continue;  // (lm_head stays bf16)
        int64_t rows = 0;
        for (int64_t n : sh.n) rows += n;
        const size_t wbytes = size_t(rows) * size_t(sh.K);
        const size_t sbytes = size_t(fp8_scale_rows(rows, 0) * fp8_scale_cols(sh.K)) * 4 + 4096;
        const size_t bytes = wbytes + sbytes;
        const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / bytes + 1));
        char* w = nullptr;
        HY_CUDA_CHECK(cudaMalloc(&w, bytes * size_t(copies)));
        HY_CUDA_CHECK(cudaMemset(w, 0, bytes * size_t(copies)));
        auto group = [&](int i) {
            Fp8Group g;
            char* base = w + size_t(i % copies) * bytes;
            const float* sc = reinterpret_cast<const float*>(base + wbytes);
            int64_t off = 0;
            char* yp = static_cast<char*>(y);
            for (int64_t n : sh.n) {
                Matrix m{
                    base + off * sh.K, DType::F8_E4M3, n, sh.K, sc + fp8_scale_row(off, 0) * fp8_scale_cols(sh.K), 0};
                g.add(m, yp);
                off += n;
                yp += size_t(n) * size_t(T) * 2;
            }
            return g;
        };
        const double total = double(bytes) * kLaunches;
        const Fp8GemvConfig chosen = fp8_gemv_config(sh.K, T);
        std::string line = "| " + std::string(sh.name) + " | " + std::to_string(int(bytes / 1e6)) + " | ";
        char buf[160];
        bool first = true;
        for (Fp8GemvConfig c : configs) {
            if (c.tensor_cores && sh.K % 64 != 0) continue;
            if (c.stream && (fp8_stream_words(sh.K, c.split) == 0 || sh.K * 4 > kFp8StreamMaxSmem)) continue;
            const double ms = time_graph(s, [&] {
                for (int i = 0; i < kLaunches; i++) gemv_fp8_group_with(x, T, group(i), sh.K, DType::F8_E4M3, c, pdl);
            });
            const bool is_chosen =
                c.tensor_cores == chosen.tensor_cores && c.stream == chosen.stream &&
                (c.stream || c.per == chosen.per) &&
                (c.tensor_cores ? c.bits == chosen.bits : c.split == chosen.split && c.rows == chosen.rows);
            if (c.stream)
                std::snprintf(buf, sizeof buf, "%sstream %dx%d%s: %.0f", first ? "" : "; ", c.split, c.rows,
                              is_chosen ? "*" : "", total / (ms * 1e-3) / 1e9);
            else if (c.tensor_cores)
                std::snprintf(buf, sizeof buf, "%s%s/%d%s: %.0f", first ? "" : "; ", c.bits ? "mma-bits" : "mma-cvt",
                              c.per, is_chosen ? "*" : "", total / (ms * 1e-3) / 1e9);
            else
                std::snprintf(buf, sizeof buf, "%s%d,%d%s%s: %.0f", first ? "" : "; ", c.split, c.per,
                              c.rows > 1 ? ("x" + std::to_string(c.rows)).c_str() : "", is_chosen ? "*" : "",
                              total / (ms * 1e-3) / 1e9);
            line += buf;
            first = false;
        }
        for (Fp8GemvConfig c : configs) {  // the fused gate/up/SiLU kernels
            if (!sh.gate_up || c.stream ||
                (!c.tensor_cores && (c.rows != 1 || c.split > 2 || c.per != 4 + 4 * (c.split == 1))))
                continue;
            const Fp8GemvConfig fc = fp8_gate_up_config(sh.K, T);
            const bool is_chosen = c.tensor_cores == fc.tensor_cores && c.per == fc.per &&
                                   (c.tensor_cores ? c.bits == fc.bits : c.split == fc.split);
            const double ms = time_graph(s, [&] {
                for (int i = 0; i < kLaunches; i++) {
                    Fp8Group g = group(i);
                    Matrix a{g.w[0], DType::F8_E4M3, sh.n[0], sh.K, g.scales[0], 0};
                    Matrix b{g.w[1], DType::F8_E4M3, sh.n[1], sh.K, g.scales[1], 0};
                    bf16* yb = static_cast<bf16*>(y);
                    gemv_fp8_gate_up_with(x, T, a, b, yb, yb + 8 * sh.n[0], yb + 16 * sh.n[0], c, pdl);
                }
            });
            std::snprintf(buf, sizeof buf, "; fused gate/up/SiLU %s%s/%d%s: %.0f",
                          c.tensor_cores ? (c.bits ? "mma-bits" : "mma-cvt") : "cores",
                          c.tensor_cores ? "" : (" " + std::to_string(c.split)).c_str(), c.per, is_chosen ? "*" : "",
                          total / (ms * 1e-3) / 1e9);
            line += buf;
        }
        std::printf("%s |\n", line.c_str());
        std::fflush(stdout);
        HY_CUDA_CHECK(cudaFree(w));
    }
    std::printf(
        "\n(split,per[xR]: CUDA cores, warps per row, words of 16 weights per lane per round, R rows per warp; mma/u: "
        "tensor cores, "
        "u chunks of 64 weights in flight per warp; * = the backend's choice)\n");
}

// Which operand arrangements and activation-scale layouts cuBLASLt's block-scaled FP8 GEMM (VEC128 and BLK128x128
// scales) takes on this GPU, and whether they compute the right thing: x [T, K] and W [N, K] with scales that vary
// by 2^-6..2^6 between groups (so a scale read from the wrong place shows), against a host reference over the
// dequantized values. Prints one line per arrangement.
void probe_block_scaled(cudaStream_t s) {
    const int T = 256, N = 512, K = 1024, KB = K / 128;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> ex(-6, 6);
    std::vector<float> x(size_t(T) * K), w(size_t(N) * K);
    for (int t = 0; t < T; t++)
        for (int kb = 0; kb < KB; kb++) {
            const float f = std::ldexp(1.0f, ex(rng));
            for (int i = 0; i < 128; i++) x[size_t(t) * K + kb * 128 + i] = nd(rng) * f;
        }
    std::vector<float> bf(size_t(N / 128) * KB);
    for (float& f : bf) f = std::ldexp(1.0f, ex(rng));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) w[size_t(n) * K + k] = nd(rng) * 0.05f * bf[size_t(n / 128) * KB + k / 128];
    std::vector<uint8_t> wq(w.size()), xq(x.size());
    std::vector<float> wsc(bf.size()), xs_t(size_t(T) * KB), xs_k(size_t(T) * KB);
    quantize_fp8_blocks(w.data(), N, K, 0, wq.data(), wsc.data());
    std::vector<double> xd(x.size()), wd(w.size());
    for (int t = 0; t < T; t++)
        for (int kb = 0; kb < KB; kb++) {
            float amax = 0.0f;
            for (int i = 0; i < 128; i++) amax = std::max(amax, std::fabs(x[size_t(t) * K + kb * 128 + i]));
            const float sc = amax > 0 ? amax / 448.0f : 1.0f, inv = 1.0f / sc;
            xs_t[size_t(kb) * T + t] = sc;
            xs_k[size_t(t) * KB + kb] = sc;
            for (int i = 0; i < 128; i++) {
                const size_t j = size_t(t) * K + kb * 128 + i;
                xq[j] = f32_to_f8_e4m3(x[j] * inv);
                xd[j] = double(f8_e4m3_to_f32(xq[j])) * sc;
            }
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            wd[size_t(n) * K + k] = double(f8_e4m3_to_f32(wq[size_t(n) * K + k])) * wsc[size_t(n / 128) * KB + k / 128];
    std::vector<double> ref(size_t(T) * N);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += xd[size_t(t) * K + k] * wd[size_t(n) * K + k];
            ref[size_t(t) * N + n] = a;
        }
    auto dev = [](const void* h, size_t bytes) {
        void* d = nullptr;
        HY_CUDA_CHECK(cudaMalloc(&d, bytes));
        HY_CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
        return d;
    };
    void* d_xq = dev(xq.data(), xq.size());
    void* d_wq = dev(wq.data(), wq.size());
    void* d_ws = dev(wsc.data(), wsc.size() * 4);
    void* d_xs[2] = {dev(xs_t.data(), xs_t.size() * 4), dev(xs_k.data(), xs_k.size() * 4)};
    void* d_y = nullptr;
    HY_CUDA_CHECK(cudaMalloc(&d_y, size_t(T) * N * 2));
    void* work = nullptr;
    const size_t work_bytes = size_t(32) << 20;
    HY_CUDA_CHECK(cudaMalloc(&work, work_bytes));
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    std::printf("\nblock-scaled FP8 GEMM probe (T %d, N %d, K %d; x scales t-contiguous or k-contiguous):\n", T, N, K);
    // arrangement 0: A = W (BLK128x128), B = x (VEC128), D = N x T col-major (= y [T, N] row-major)
    // arrangement 1: A = x (VEC128), B = W (BLK128x128), D = T x N col-major (= y^T)
    // arrangement 2: as 1 with C and D in row order (= y)
    for (int arr = 0; arr < 3; arr++)
        for (int lay = 0; lay < 2; lay++) {
            cublasLtMatmulDesc_t op;
            cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
            const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                          blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            const int32_t am = arr == 0 ? blk : vec, bm = arr == 0 ? vec : blk;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm);
            const void* ap = arr == 0 ? d_ws : d_xs[lay];
            const void* bp = arr == 0 ? d_xs[lay] : d_ws;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ap, sizeof ap);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bp, sizeof bp);
            const int64_t m = arr == 0 ? N : T, n = arr == 0 ? T : N;
            cublasLtMatrixLayout_t la, lb, lc;
            cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, m, K);
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, n, K);
            cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, arr == 2 ? n : m);
            if (arr == 2) {
                const cublasLtOrder_t row = CUBLASLT_ORDER_ROW;
                cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row);
            }
            cublasLtMatmulPreference_t pref;
            cublasLtMatmulPreferenceCreate(&pref);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &work_bytes,
                                                 sizeof work_bytes);
            cublasLtMatmulHeuristicResult_t res{};
            int found = 0;
            const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found);
            std::string line = "  arrangement " + std::to_string(arr) +
                               (lay == 0 ? ", x scales t-contiguous" : ", x scales k-contiguous") +
                               ": heuristic status " + std::to_string(int(st)) + ", found " + std::to_string(found);
            if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
                const float alpha = 1.0f, beta = 0.0f;
                HY_CUDA_CHECK(cudaMemset(d_y, 0xff, size_t(T) * N * 2));
                const cublasStatus_t rs =
                    cublasLtMatmul(h, op, &alpha, arr == 0 ? d_wq : d_xq, la, arr == 0 ? d_xq : d_wq, lb, &beta, d_y,
                                   lc, d_y, lc, &res.algo, work, work_bytes, s);
                HY_CUDA_CHECK(cudaStreamSynchronize(s));
                std::vector<uint16_t> yh(size_t(T) * N);
                HY_CUDA_CHECK(cudaMemcpy(yh.data(), d_y, yh.size() * 2, cudaMemcpyDeviceToHost));
                double num = 0, den = 0;
                for (int t = 0; t < T; t++)
                    for (int nn = 0; nn < N; nn++) {
                        const size_t at = arr == 1 ? size_t(nn) * T + t : size_t(t) * N + nn;
                        const double got = double(bf16_to_f32(yh[at])), want = ref[size_t(t) * N + nn];
                        num += (got - want) * (got - want);
                        den += want * want;
                    }
                char buf[96];
                std::snprintf(buf, sizeof buf, "; run status %d, rel err %.3g", int(rs), std::sqrt(num / den));
                line += buf;
            }
            std::printf("%s\n", line.c_str());
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(op);
        }
    std::fflush(stdout);
    cublasLtDestroy(h);
    for (void* p : {d_xq, d_wq, d_ws, d_xs[0], d_xs[1], d_y, work}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        int T = argc > 1 ? std::atoi(argv[1]) : 1;
        if (T < 1 || T > 256) T = 1;
        int major = 0;
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
        cudaStream_t s;
        HY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        LaunchContext no_pdl;  // cuBLASLt is timed without PDL, the GEMVs with it where the device has it
        no_pdl.stream = s;
        LaunchContext pdl = no_pdl;
        pdl.pdl = major >= 9;
        // the cluster GEMV needs code built for 9.0+ as well (the backend's own check, CudaBackend::settings)
        const bool clusters = hy::make_cuda_backend(0)->settings().find("clusters on") != std::string::npos;
        LaunchContext wgmma = pdl;  // the wgmma GEMM (sm_90a code)
        wgmma.clusters = clusters;
        wgmma.wgmma = clusters && wgmma_available();
        wgmma.wgmma_gemm_max_rows = kWgmmaGemmMaxRows;
        wgmma.wide_gemv_max_rows = 0;  // (9-16 rows to the wgmma GEMM, not the cluster GEMV)
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&wgmma.sm_count, cudaDevAttrMultiProcessorCount, 0));
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
        const size_t xrows = size_t(std::max(T, 8));
        HY_CUDA_CHECK(cudaMalloc(&x, xrows * 16384 * 2));
        HY_CUDA_CHECK(cudaMemset(x, 0, xrows * 16384 * 2));
        HY_CUDA_CHECK(cudaMalloc(&y, xrows * 248320 * 4 * 3));
        std::printf("T = %d; GB/s of weights read (median of %d replays of %d launches)\n\n", T, kReps, kLaunches);
        std::printf(
            T > kGemvMaxTokens
                ? "| shape | MB | cuBLASLt | cuBLASLt's next heuristic choices, rank: GB/s |\n|---|---:|---:|---|\n"
                : "| shape | MB | cuBLASLt | GEMV launch shapes, PDL on: split,per: GB/s |\n|---|---:|---:|---|\n");
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
            // ms of kLaunches gate/up/SiLU launches (gemv_gate_up) under c, for a gate+up shape
            auto gate_up_ms = [&](const LaunchContext& c) {
                return time_graph(s, [&] {
                    for (int i = 0; i < kLaunches; i++) {
                        bf16* yb = static_cast<bf16*>(y);
                        gemv_gate_up(x, T, wcopy(i), wcopy(i) + sh.n[0] * sh.K, sh.n[0], sh.K, yb, yb + T * sh.n[0],
                                     yb + 2 * T * sh.n[0], c);
                    }
                });
            };
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
            if (T > kGemvMaxTokens && T <= kWideGemvMaxTokens && clusters) {  // the tensor-core GEMV in clusters
                LaunchContext wide = pdl;
                wide.clusters = true;
                wide.tc_gemv_all = false;
                wide.wide_gemv_max_rows = kWideGemvMaxTokens;
                ms = time_graph(s, [&] {
                    for (int i = 0; i < kLaunches; i++)
                        gemv_wide_with(x, T, group(i), sh.K, sh.out_f32, gemv_mma_config(sh.K), wide);
                });
                std::snprintf(buf, sizeof buf, "wide: %.0f; ", total / (ms * 1e-3) / 1e9);
                line += buf;
                if (sh.gate_up) {
                    ms = gate_up_ms(wide);
                    std::snprintf(buf, sizeof buf, "wide gate/up/SiLU: %.0f; ", total / (ms * 1e-3) / 1e9);
                    line += buf;
                }
            }
            if (T >= 3 && T <= kWgmmaGemmMaxRows && wgmma.wgmma && clusters) {
                // the wgmma GEMM, the shape's matrices in one launch, K split in parts (* = the backend's choice)
                int64_t tiles = 0;
                for (int64_t n : sh.n) tiles += (n + 127) / 128;
                const int chosen = wgmma_gemm_parts(tiles * 128, sh.K, wgmma.sm_count);
                line += "wgmma parts ";
                for (int parts : {1, 2, 4, 8}) {
                    ms = time_graph(s, [&] {
                        for (int i = 0; i < kLaunches; i++)
                            wgmma_gemm_group(x, T, group(i), sh.K, sh.out_f32, wgmma, parts);
                    });
                    std::snprintf(buf, sizeof buf, "%d%s: %.0f%s", parts, parts == chosen ? "*" : "",
                                  total / (ms * 1e-3) / 1e9, parts == 8 ? "; " : ", ");
                    line += buf;
                }
                if (sh.gate_up && wgmma_gemm_rows(T, wgmma)) {  // gate/up/SiLU in one launch (the backend's split)
                    ms = gate_up_ms(wgmma);
                    std::snprintf(buf, sizeof buf, "wgmma gate/up/SiLU: %.0f; ", total / (ms * 1e-3) / 1e9);
                    line += buf;
                }
            }
            if (T > kTcGemvMaxTokens) {  // batched: cuBLASLt's other heuristic choices (rank: GB/s)
                bool first = true;
                for (int rank = 1; rank < 8; rank++) {
                    Gemm ranked;
                    ranked.set_workspace(ws);
                    ranked.set_heuristic_rank(rank);
                    ranked.run(x, T, wcopy(0), sh.n[0], sh.K, y, sh.out_f32, no_pdl);  // (makes the first plan)
                    if (ranked.heuristic_rank_used() != rank) break;                   // the heuristic offers fewer
                    ms = time_graph(s, [&] {
                        for (int i = 0; i < kLaunches; i++) {
                            int64_t off = 0;
                            for (int64_t n : sh.n) {
                                ranked.run(x, T, wcopy(i) + off * sh.K, n, sh.K, y, sh.out_f32, no_pdl);
                                off += n;
                            }
                        }
                    });
                    std::snprintf(buf, sizeof buf, "%s%d: %.0f", first ? "" : "; ", rank, total / (ms * 1e-3) / 1e9);
                    line += buf;
                    first = false;
                }
                std::printf("%s |\n", line.c_str());
                std::fflush(stdout);
                HY_CUDA_CHECK(cudaFree(w));
                continue;
            }
            // the GEMV launch shapes (PDL on); * = the one the backend chooses for this K
            if (T > kGemvBlockMaxTokens) {  // the tensor-core GEMV (gate and up as a group of two)
                const MmaGemvConfig mc = gemv_mma_config(sh.K);
                bool first = true;
                for (MmaGemvConfig c : {MmaGemvConfig{8, 4}, MmaGemvConfig{8, 2}, MmaGemvConfig{16, 2},
                                        MmaGemvConfig{16, 4}, MmaGemvConfig{4, 4}}) {
                    ms = time_graph(s, [&] {
                        for (int i = 0; i < kLaunches; i++) gemv_mma_with(x, T, group(i), sh.K, sh.out_f32, c, pdl);
                    });
                    std::snprintf(buf, sizeof buf, "%s%d,%d%s: %.0f", first ? "" : "; ", c.parts, c.unroll,
                                  (c.parts == mc.parts && c.unroll == mc.unroll) ? "*" : "", total / (ms * 1e-3) / 1e9);
                    line += buf;
                    first = false;
                }
                if (sh.gate_up) {  // the gate/up/SiLU kernel (gemv_mma_config's shape)
                    ms = gate_up_ms(pdl);
                    std::snprintf(buf, sizeof buf, "; gate/up/SiLU kernel: %.0f", total / (ms * 1e-3) / 1e9);
                    line += buf;
                }
                std::printf("%s |\n", line.c_str());
                std::fflush(stdout);
                HY_CUDA_CHECK(cudaFree(w));
                continue;
            }
            const GemvConfig chosen = sh.gate_up ? GemvConfig{2, 8} : gemv_config(sh.K);
            std::vector<GemvConfig> shapes_to_try;
            if (sh.gate_up)
                shapes_to_try = {{2, 8}};  // (the gate/up/SiLU kernel has one shape)
            else
                shapes_to_try = {{2, 8}, {4, 8}, {8, 8}};
            bool first = true;
            for (GemvConfig c : shapes_to_try) {
                ms = time_graph(s, [&] {
                    for (int i = 0; i < kLaunches; i++) {
                        if (sh.gate_up) {
                            bf16* yb = static_cast<bf16*>(y);
                            gemv_gate_up(x, T, wcopy(i), wcopy(i) + sh.n[0] * sh.K, sh.n[0], sh.K, yb, yb + T * sh.n[0],
                                         yb + 2 * T * sh.n[0], pdl);
                        } else {
                            gemv_group_with(x, T, group(i), sh.K, sh.out_f32, c, pdl);
                        }
                    }
                });
                std::snprintf(buf, sizeof buf, "%s%d,%d%s: %.0f", first ? "" : "; ", c.split, c.per,
                              (c.split == chosen.split && c.per == chosen.per) ? "*" : "", total / (ms * 1e-3) / 1e9);
                line += buf;
                first = false;
            }
            std::printf("%s |\n", line.c_str());
            std::fflush(stdout);
            HY_CUDA_CHECK(cudaFree(w));
        }
        if (T <= kTcGemvMaxTokens)
            std::printf(
                T > kGemvBlockMaxTokens
                    ? "\n(tensor-core GEMV, parts,unroll: warps per 16-row tile, 32-value chunks per warp and "
                      "round; * = the backend's choice)\n"
                    : "\n(split,per: warps per row, 16-byte words per lane per round; * = the backend's choice)\n");
        if (argc > 2 && std::string(argv[2]) == "fp8" && T <= kGemvMaxTokens) {
            bench_fp8(T, shapes, s, pdl, x, y);
            if (T == 1) probe_block_scaled(s);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-kernel-bench: %s\n", e.what());
        return 1;
    }
}
