#include "kernels/cuda/matmul.cuh"

namespace hy::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw Error(Status::backend, std::string("cuBLASLt error in ") + what + ": status " + std::to_string(int(s)));
}

template <typename OutT>
__device__ __forceinline__ OutT store_as(float v);
template <>
__device__ __forceinline__ float store_as<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 store_as<bf16>(float v) { return to_bf16(v); }

// A weight word: read once per step, so it bypasses L1 (x, reused by every warp, stays there).
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// acc[t] += W[row, :] . x[t, :] over this lane's share: lanes stride over K in 16-byte words (8 bf16); each round
// issues kGemvUnroll predicated weight loads before using any, so a row of K <= 32 * 8 * kGemvUnroll costs one
// memory round trip (no serial tail); each word is multiplied with the same 8 values of every token's x (L1).
// With a K split over kSplit warps, this warp takes the words first, first + step, ... (step = 32 * kSplit).
template <int NT>
__device__ __forceinline__ void row_dot(const bf16* __restrict__ w_row, const bf16* __restrict__ x, int K,
                                        float* acc, int first, int step) {
    const uint4* wr = reinterpret_cast<const uint4*>(w_row);
    const int K8 = K / 8;
    for (int base = first; base < K8; base += step * kGemvUnroll) {
        uint4 wv[kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; u++)
            if (base + step * u < K8) wv[u] = ld_weight(wr + base + step * u);
#pragma unroll
        for (int u = 0; u < kGemvUnroll; u++) {
            if (base + step * u >= K8) break;
            float wf[8];
            unpack8(wv[u], wf);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float xf[8];
                unpack8(__ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K) + base + step * u), xf);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[t] = fmaf(wf[j], xf[j], acc[t]);
            }
        }
    }
}

// kSplit warps per output feature of one of up to GemvGroup::kMax matrices sharing x (blocks are assigned to
// the matrices in order: matrix s owns blocks [block_end[s-1], block_end[s])); each warp takes every kSplit-th
// 16-byte word of the row. Partial sums are warp-reduced, then added in part order, so each output is a
// fixed-order fp32 sum that depends only on K (kSplit is chosen from K), not on the group it was computed in.
template <int NT, typename OutT, int kSplit>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const bf16* __restrict__ x, GemvGroup g, int K) {
    constexpr int kRows = kGemvWarps / kSplit;  // rows per block
    __shared__ float part[kGemvWarps][NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int s = 0;
#pragma unroll
    for (int j = 0; j < GemvGroup::kMax - 1; j++) s += (j < g.count - 1 && int(blockIdx.x) >= g.block_end[j]);
    const int first_block = s ? g.block_end[s - 1] : 0;
    const int n = (int(blockIdx.x) - first_block) * kRows + warp / kSplit;
    const int N = g.n[s];
    const bool valid = n < N;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (valid) row_dot<NT>(g.w[s] + int64_t(n) * K, x, K, acc, lane + 32 * (warp % kSplit), 32 * kSplit);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
    if constexpr (kSplit > 1) {
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < NT; t++) part[warp][t] = acc[t];
        }
        __syncthreads();
        if (warp % kSplit != 0) return;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = part[warp][t];
#pragma unroll
            for (int q = 1; q < kSplit; q++) v += part[warp + q][t];
            acc[t] = v;
        }
    }
    if (!valid || lane != 0) return;
    OutT* y = static_cast<OutT*>(g.y[s]);
#pragma unroll
    for (int t = 0; t < NT; t++) y[int64_t(t) * N + n] = store_as<OutT>(acc[t]);
}

// The MLP's gate and up projections and the activation in one pass: per feature n the warp computes
// g = bf16(x.Wg[n]) and u = bf16(x.Wu[n]), writes u to up_out, g to gate_out (when act_out is not gate_out) and
// bf16(bf16(silu(g)) * u) to act_out: the same memory as matmul, matmul, silu_mul.
template <int NT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_gate_up_kernel(const bf16* __restrict__ x, const bf16* __restrict__ wg, const bf16* __restrict__ wu,
                        bf16* gate_out, bf16* up_out, bf16* act_out, int N, int K) {
    const int n = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
    if (n >= N) return;
    float ag[NT], au[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ag[t] = au[t] = 0.0f;
    const int lane = threadIdx.x & 31;
    row_dot<NT>(wg + int64_t(n) * K, x, K, ag, lane, 32);
    row_dot<NT>(wu + int64_t(n) * K, x, K, au, lane, 32);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float g = round_bf16(warp_sum(ag[t])), u = round_bf16(warp_sum(au[t]));
        if ((threadIdx.x & 31) == 0) {
            const int64_t o = int64_t(t) * N + n;
            up_out[o] = to_bf16(u);
            if (act_out != gate_out) gate_out[o] = to_bf16(g);
            act_out[o] = to_bf16(round_bf16(siluf_(g)) * u);
        }
    }
}

template <typename OutT, int kSplit>
void gemv_typed(const bf16* x, int64_t T, GemvGroup g, int64_t K, cudaStream_t stream) {
    constexpr int kRows = kGemvWarps / kSplit;
    for (int i = 0; i < g.count; i++) g.block_end[i] = (i ? g.block_end[i - 1] : 0) + (g.n[i] + kRows - 1) / kRows;
    const unsigned grid = unsigned(g.block_end[g.count - 1]);
    const int threads = kGemvWarps * 32;
    switch (T) {
        case 1: gemv_kernel<1, OutT, kSplit><<<grid, threads, 0, stream>>>(x, g, int(K)); break;
        case 2: gemv_kernel<2, OutT, kSplit><<<grid, threads, 0, stream>>>(x, g, int(K)); break;
        case 3: gemv_kernel<3, OutT, kSplit><<<grid, threads, 0, stream>>>(x, g, int(K)); break;
        case 4: gemv_kernel<4, OutT, kSplit><<<grid, threads, 0, stream>>>(x, g, int(K)); break;
        default: throw Error(Status::internal, "gemv: " + std::to_string(T) + " rows (at most 4)");
    }
    check_launch("gemv kernel");
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Any shape and alignment (rare: odd K or unaligned rows): one warp per output feature, scalar loads.
template <typename OutT>
__global__ void matmul_scalar_kernel(const bf16* __restrict__ x, int64_t T, const bf16* __restrict__ w,
                                     OutT* __restrict__ y, int64_t N, int64_t K) {
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
                   cudaStream_t stream) {
    const unsigned grid = ceil_div(N, kGemvWarps);
    if (out_f32)
        matmul_scalar_kernel<float><<<grid, kGemvWarps * 32, 0, stream>>>(x, T, w, static_cast<float*>(y), N, K);
    else
        matmul_scalar_kernel<bf16><<<grid, kGemvWarps * 32, 0, stream>>>(x, T, w, static_cast<bf16*>(y), N, K);
    check_launch("scalar matmul kernel");
}

}  // namespace

static_assert(kGemvMaxTokens == 4, "gemv_typed instantiates 1..4 tokens");

bool gemv_fits(const bf16* x, int64_t T, const bf16* w, int64_t K) {
    return T >= 1 && T <= kGemvMaxTokens && K % 8 == 0 && K <= (int64_t(1) << 30) && aligned16(x) && aligned16(w);
}

void gemv(const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32, cudaStream_t stream) {
    GemvGroup g;
    g.add(w, y, N);
    gemv_group(x, T, g, K, out_f32, stream);
}

void gemv_group(const bf16* x, int64_t T, const GemvGroup& g, int64_t K, bool out_f32, cudaStream_t stream) {
    if (g.count < 1 || g.count > GemvGroup::kMax) throw Error(Status::internal, "gemv: bad group");
    // Long rows (few outputs in decode: o_proj, out_proj, down_proj) split K over two warps for more loads in
    // flight; the choice depends on K only, so a matrix gives the same bits alone or in a group.
    if (out_f32)
        gemv_typed<float, 1>(x, T, g, K, stream);
    else if (K >= kGemvSplitMinK)
        gemv_typed<bf16, 2>(x, T, g, K, stream);
    else
        gemv_typed<bf16, 1>(x, T, g, K, stream);
}

void gemv_gate_up(const bf16* x, int64_t T, const bf16* wg, const bf16* wu, int64_t N, int64_t K, bf16* gate_out,
                  bf16* up_out, bf16* act_out, cudaStream_t stream) {
    const unsigned grid = ceil_div(N, kGemvWarps);
    const int threads = kGemvWarps * 32;
    switch (T) {
        case 1: gemv_gate_up_kernel<1><<<grid, threads, 0, stream>>>(x, wg, wu, gate_out, up_out, act_out, int(N), int(K)); break;
        case 2: gemv_gate_up_kernel<2><<<grid, threads, 0, stream>>>(x, wg, wu, gate_out, up_out, act_out, int(N), int(K)); break;
        case 3: gemv_gate_up_kernel<3><<<grid, threads, 0, stream>>>(x, wg, wu, gate_out, up_out, act_out, int(N), int(K)); break;
        case 4: gemv_gate_up_kernel<4><<<grid, threads, 0, stream>>>(x, wg, wu, gate_out, up_out, act_out, int(N), int(K)); break;
        default: throw Error(Status::internal, "gemv_gate_up: " + std::to_string(T) + " rows (at most 4)");
    }
    check_launch("gemv gate/up/SiLU kernel");
}

Gemm::Gemm() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
    check_lt(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    plans_.reserve(kMaxPlans);
}

Gemm::~Gemm() {
    for (Plan& p : plans_) destroy(p);
    if (op_) cublasLtMatmulDescDestroy(op_);
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
Gemm::Plan& Gemm::plan(int64_t T, int64_t N, int64_t K, bool out_f32) {
    for (Plan& p : plans_)
        if (p.T == T && p.N == N && p.K == K && p.out_f32 == out_f32) return p;
    Plan p;
    p.T = T; p.N = N; p.K = K; p.out_f32 = out_f32;
    try {
        check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(K), uint64_t(N), K), "layout A");
        check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(K), uint64_t(T), K), "layout B");
        check_lt(cublasLtMatrixLayoutCreate(&p.c, out_f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(N), uint64_t(T), N),
                 "layout C");
        cublasLtMatmulPreference_t pref = nullptr;
        check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
        size_t ws = kWorkspaceBytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, op_, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (s != CUBLAS_STATUS_SUCCESS || found == 0)
            throw Error(Status::backend, "cuBLASLt has no algorithm for a bf16 matmul of " + std::to_string(T) + " x " +
                                             std::to_string(K) + " by " + std::to_string(N) + " x " +
                                             std::to_string(K) + "^T");
        p.algo = result.algo;
    } catch (...) {
        destroy(p);
        throw;
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
               cudaStream_t stream) {
    if (!workspace_) throw Error(Status::internal, "cuBLASLt matmul before set_workspace");
    Plan& p = plan(T, N, K, out_f32);
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(cublasLtMatmul(handle_, op_, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                            kWorkspaceBytes, stream),
             "cublasLtMatmul");
}

void matmul(Gemm& gemm, const bf16* x, int64_t T, const bf16* w, int64_t N, int64_t K, void* y, bool out_f32,
            cudaStream_t stream) {
    if (T <= 0 || N <= 0) return;
    if (gemv_fits(x, T, w, K))
        gemv(x, T, w, N, K, y, out_f32, stream);
    else if (K % 8 == 0 && N % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y))
        gemm.run(x, T, w, N, K, y, out_f32, stream);
    else
        matmul_scalar(x, T, w, N, K, y, out_f32, stream);
}

}  // namespace hy::cuda
