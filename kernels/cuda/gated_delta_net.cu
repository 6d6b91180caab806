// The Gated DeltaNet kernels. Rounding follows a bf16 PyTorch model where it is free: the conv output and its SiLU
// are rounded to bf16, beta = sigmoid(b) is rounded, the recurrence output o is rounded before the gated norm, the
// normed o and its product with the norm weight are rounded. The state and the recurrence are fp32.
#include "kernels/cuda/gated_delta_net.cuh"

namespace hy::cuda {

namespace {

constexpr int kMaxConvKernel = 16;
constexpr int kConvThreads = 256;
constexpr int kMaxValueDim = 256;  // threads of the recurrence block (one per value column)

// Thread per (row, channel). Input j of the window of row t is at run index i - (K-1) + j; a negative index reads
// the conv state of the row's slot ([K-1, C], oldest first).
// With update_state (every run is one token, so the thread is the only reader of its slot's state column), the
// thread also shifts the state by its input, replacing conv_state_kernel.
__global__ void conv_kernel(const bf16* __restrict__ qkv, const float* __restrict__ conv_w, bf16* conv_state,
                            RowMap rows, int64_t C, int K, bool update_state, bf16* __restrict__ mixed) {
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(rows.n_rows) * C) return;
    const int64_t t = idx / C, c = idx % C;
    const int i = rows.in_run[t];
    bf16* st = conv_state + int64_t(rows.slot[t]) * (K - 1) * C;
    const float* w = conv_w + c * K;
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        const int src = i - (K - 1) + j;
        const float in = src >= 0 ? to_f32(qkv[(t - i + src) * C + c]) : to_f32(st[int64_t(K - 1 + src) * C + c]);
        acc = fmaf(w[j], in, acc);
    }
    mixed[idx] = to_bf16(siluf_(round_bf16(acc)));
    if (update_state) {
        for (int j = 0; j + 1 < K - 1; j++) st[int64_t(j) * C + c] = st[int64_t(j + 1) * C + c];
        if (K > 1) st[int64_t(K - 2) * C + c] = qkv[t * C + c];
    }
}

// Thread per (run, channel): the new state holds the last K-1 inputs of [old state, run].
__global__ void conv_state_kernel(const bf16* __restrict__ qkv, bf16* __restrict__ conv_state, RowMap rows,
                                  int64_t C, int K) {
    const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (idx >= int64_t(rows.n_runs) * C) return;
    const SeqRun run = rows.runs[idx / C];
    const int64_t c = idx % C;
    bf16* st = conv_state + int64_t(run.slot) * (K - 1) * C;
    bf16 last[kMaxConvKernel];
    for (int j = 0; j < K - 1; j++) {
        const int src = run.n_tokens - (K - 1) + j;
        last[j] = src >= 0 ? qkv[(int64_t(run.row) + src) * C + c] : st[int64_t(K - 1 + src) * C + c];
    }
    for (int j = 0; j < K - 1; j++) st[int64_t(j) * C + c] = last[j];
}

__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One block per (value head h, run r), one thread per value column e (Dv threads, Dv / 32 warps). Thread e owns
// column e of the head's state S [Dk, Dv]: its Dk values live in registers for the whole run, so every product
// over Dk is thread-local. Per token each warp l2-normalizes q and k of key head h / (Hv/Hk) into its own shared
// copy (fp32) and each thread updates its column:
//   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
// then the block applies the gated RMSNorm over the head: y = bf16(bf16(w * bf16(o * rsqrt(mean(o^2) + eps))) *
// silu(z)), o rounded to bf16 first.
template <int DK>
__global__ void __launch_bounds__(kMaxValueDim) recurrence_kernel(GatedDeltaNetArgs p, RowMap rows,
                                                                  const bf16* __restrict__ mixed) {
    constexpr int kPer = DK / 32;
    constexpr int kMaxWarps = kMaxValueDim / 32;
    __shared__ float sq[kMaxWarps][DK], sk[kMaxWarps][DK];
    __shared__ float red[2][kMaxWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int h = blockIdx.x;
    const SeqRun run = rows.runs[blockIdx.y];
    const int Hk = p.n_k_heads, Hv = p.n_v_heads, Dv = p.v_dim;
    const int kh = h / (Hv / Hk);
    const int e = threadIdx.x;
    const int64_t C = 2 * int64_t(Hk) * DK + int64_t(Hv) * Dv;
    float* S = p.ssm_state + (int64_t(run.slot) * Hv + h) * DK * Dv + e;  // column e, stride Dv
    float s[DK];
#pragma unroll
    for (int d = 0; d < DK; d++) s[d] = S[int64_t(d) * Dv];
    const float A = expf(p.A_log[h]);
    const float dt_bias = p.dt_bias[h];
    const float q_scale = rsqrtf(float(DK));
    const float norm_w = p.norm_w[e];
    const bf16* b_in = static_cast<const bf16*>(p.b);
    const bf16* a_in = static_cast<const bf16*>(p.a);
    const bf16* z_in = static_cast<const bf16*>(p.z);
    bf16* out = static_cast<bf16*>(p.out);
    float* wq = sq[warp];
    float* wk = sk[warp];
    for (int i = 0; i < run.n_tokens; i++) {
        const int64_t row = int64_t(run.row) + i;
        const bf16* m = mixed + row * C;
        float qv[kPer], kv[kPer], qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            qv[j] = to_f32(m[kh * DK + lane + 32 * j]);
            kv[j] = to_f32(m[int64_t(Hk) * DK + kh * DK + lane + 32 * j]);
            qq += qv[j] * qv[j];
            kk += kv[j] * kv[j];
        }
        const float qn = rsqrtf(warp_sum(qq) + 1e-6f) * q_scale, kn = rsqrtf(warp_sum(kk) + 1e-6f);
        __syncwarp();  // this warp's readers of the previous token are done with wq/wk
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            wq[lane + 32 * j] = qv[j] * qn;
            wk[lane + 32 * j] = kv[j] * kn;
        }
        __syncwarp();
        const float v = to_f32(m[2 * int64_t(Hk) * DK + int64_t(h) * Dv + e]);
        const float beta = round_bf16(sigmoidf_(to_f32(b_in[row * Hv + h])));
        const float decay = expf(-A * softplusf_(to_f32(a_in[row * Hv + h]) + dt_bias));
        float km = 0.0f;
#pragma unroll
        for (int d = 0; d < DK; d++) {
            s[d] *= decay;
            km = fmaf(s[d], wk[d], km);
        }
        const float u = beta * (v - km);
        float o = 0.0f;
#pragma unroll
        for (int d = 0; d < DK; d++) {
            s[d] = fmaf(wk[d], u, s[d]);
            o = fmaf(s[d], wq[d], o);
        }
        // Gated RMSNorm over the head's Dv outputs. red is double-buffered by token parity, so one barrier per
        // token suffices: no warp can write this buffer again before every warp has passed the next barrier.
        o = round_bf16(o);
        const float part = warp_sum(o * o);
        if (lane == 0) red[i & 1][warp] = part;
        __syncthreads();
        float ss = 0.0f;
        for (int w = 0; w < n_warps; w++) ss += red[i & 1][w];
        const float inv = rsqrtf(ss / float(Dv) + p.eps);
        const int64_t oi = row * int64_t(Hv) * Dv + int64_t(h) * Dv + e;
        const float nrm = round_bf16(norm_w * round_bf16(o * inv));
        out[oi] = to_bf16(nrm * siluf_(to_f32(z_in[oi])));
    }
#pragma unroll
    for (int d = 0; d < DK; d++) S[int64_t(d) * Dv] = s[d];
}

template <int DK>
void launch_recurrence(const GatedDeltaNetArgs& a, const RowMap& rows, const bf16* mixed, cudaStream_t s) {
    dim3 grid(unsigned(a.n_v_heads), unsigned(rows.n_runs));
    recurrence_kernel<DK><<<grid, a.v_dim, 0, s>>>(a, rows, mixed);
    check_launch("Gated DeltaNet recurrence + gated RMSNorm kernel");
}

}  // namespace

void gated_delta_net(const GatedDeltaNetArgs& a, const RowMap& rows, bf16* mixed, cudaStream_t stream) {
    if (rows.n_rows <= 0) return;
    const int K = a.conv_kernel;
    if (K < 1 || K > kMaxConvKernel)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: conv kernel " + std::to_string(K) + " (1 to 16 supported)");
    if (a.n_k_heads <= 0 || a.n_v_heads % a.n_k_heads != 0)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: value heads must be a multiple of key heads");
    if (a.v_dim <= 0 || a.v_dim % 32 != 0 || a.v_dim > kMaxValueDim)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: value head dim " + std::to_string(a.v_dim) +
                                             " is not a multiple of 32 up to " + std::to_string(kMaxValueDim));
    if (a.k_dim != 32 && a.k_dim != 64 && a.k_dim != 128)
        throw Error(Status::unsupported, "CUDA Gated DeltaNet: key head dim " + std::to_string(a.k_dim) +
                                             " is not built (32, 64 and 128 are)");
    const int64_t C = 2 * int64_t(a.n_k_heads) * a.k_dim + int64_t(a.n_v_heads) * a.v_dim;
    const bf16* qkv = static_cast<const bf16*>(a.qkv);
    bf16* conv_state = static_cast<bf16*>(a.conv_state);

    const bool one_token_runs = rows.n_rows == rows.n_runs;  // decode: the conv kernel updates the state itself
    conv_kernel<<<ceil_div(int64_t(rows.n_rows) * C, kConvThreads), kConvThreads, 0, stream>>>(
        qkv, a.conv_w, conv_state, rows, C, K, one_token_runs, mixed);
    check_launch("Gated DeltaNet conv kernel");
    if (K > 1 && !one_token_runs) {
        conv_state_kernel<<<ceil_div(int64_t(rows.n_runs) * C, kConvThreads), kConvThreads, 0, stream>>>(
            qkv, conv_state, rows, C, K);
        check_launch("Gated DeltaNet conv state kernel");
    }
    switch (a.k_dim) {
        case 32: launch_recurrence<32>(a, rows, mixed, stream); break;
        case 64: launch_recurrence<64>(a, rows, mixed, stream); break;
        default: launch_recurrence<128>(a, rows, mixed, stream); break;
    }
}

}  // namespace hy::cuda
