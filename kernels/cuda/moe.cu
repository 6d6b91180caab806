#include "kernels/cuda/moe.cuh"

namespace hy::cuda {

namespace {

constexpr int kMoeWarps = 8;  // output rows per block (one warp each)
constexpr int kRouteThreads = 256;
constexpr int kMaxTopK = 32;
constexpr int kMaxExperts = 4096;

// sum_i a[i] * b[i] over K values, fp32, by one warp (every lane gets it); 16-byte loads when both rows allow.
__device__ __forceinline__ float warp_dot(const bf16* a, const bf16* b, int K) {
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    if (((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) == 0 && K % 8 == 0) {
        const uint4* a4 = reinterpret_cast<const uint4*>(a);
        const uint4* b4 = reinterpret_cast<const uint4*>(b);
        for (int i = lane; i < K / 8; i += 32) {
            float fa[8], fb[8];
            unpack8(a4[i], fa);
            unpack8(b4[i], fb);
#pragma unroll
            for (int j = 0; j < 8; j++) s = fmaf(fa[j], fb[j], s);
        }
    } else {
        for (int i = lane; i < K; i += 32) s = fmaf(to_f32(a[i]), to_f32(b[i]), s);
    }
    return warp_sum(s);
}

// One block per row: the row's logits (bf16, from the router GEMV) in shared memory, softmax in fp32, then warp 0
// picks the top k one at a time (the largest logit not taken, the lower id on ties).
__global__ void moe_route_kernel(const bf16* __restrict__ router_logits, int E, int k, bool normalize, float* weights,
                                 int32_t* ids) {
    extern __shared__ float logit[];  // [E]
    __shared__ float scratch[32];
    __shared__ unsigned char taken[kMaxExperts];
    pdl_trigger();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (int e = threadIdx.x; e < E; e += blockDim.x) logit[e] = to_f32(router_logits[row * E + e]);
    for (int e = threadIdx.x; e < E; e += blockDim.x) taken[e] = 0;
    __syncthreads();
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, logit[e]);
    mx = warp_max(mx);
    if (lane == 0) scratch[warp] = mx;
    __syncthreads();
    mx = lane < n_warps ? scratch[lane] : -INFINITY;
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) sum += expf(logit[e] - mx);
    sum = block_sum(sum, scratch);
    if (warp != 0) return;
    float w[kMaxTopK];
    int id[kMaxTopK];
    float total = 0.0f;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int best_id = E;
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && (logit[e] > best || (logit[e] == best && e < best_id) || best_id == E)) {
                best = logit[e];
                best_id = e;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
            if (oi < E && (best_id == E || ob > best || (ob == best && oi < best_id))) {
                best = ob;
                best_id = oi;
            }
        }
        __syncwarp();
        if (lane == 0) taken[best_id] = 1;
        __syncwarp();
        id[j] = best_id;
        w[j] = expf(best - mx) / sum;
        total += w[j];
    }
    if (lane == 0)
        for (int j = 0; j < k; j++) {
            weights[row * k + j] = round_bf16(normalize ? w[j] / total : w[j]);
            ids[row * k + j] = id[j];
        }
}

// act[(t k + j), i] = bf16(bf16(silu(bf16(gate_e . x_t))) * bf16(up_e . x_t)), e = ids[t k + j]; one warp per i.
__global__ void moe_gate_up_kernel(const bf16* __restrict__ x, const bf16* __restrict__ gate_up,
                                   const int32_t* __restrict__ ids, int E, int H, int I, int k, bf16* act) {
    pdl_trigger();
    pdl_wait();
    const int64_t tj = blockIdx.x;  // t * k + j
    const int i = blockIdx.y * kMoeWarps + (threadIdx.x >> 5);
    if (i >= I) return;
    const int e = ids[tj];
    const bf16* xr = x + (tj / k) * H;
    float a = 0.0f;
    if (e >= 0 && e < E) {
        const bf16* w = gate_up + int64_t(e) * 2 * I * H;
        const float g = round_bf16(warp_dot(xr, w + int64_t(i) * H, H));
        const float u = round_bf16(warp_dot(xr, w + int64_t(I + i) * H, H));
        a = round_bf16(siluf_(g)) * u;
    }
    if ((threadIdx.x & 31) == 0) act[tj * I + i] = to_bf16(a);
}

// y[t, h] = the bf16 running sum over the row's experts in increasing id of bf16(bf16(down_e[h] . act) * w).
__global__ void moe_down_kernel(const bf16* __restrict__ act, const bf16* __restrict__ down,
                                const float* __restrict__ weights, const int32_t* __restrict__ ids, int E, int H, int I,
                                int k, bf16* y) {
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int h = blockIdx.y * kMoeWarps + (threadIdx.x >> 5);
    if (h >= H) return;
    float acc = 0.0f;
    int prev = -1;
    for (int n = 0; n < k; n++) {  // the row's choices in increasing expert id
        int j = -1;
        for (int c = 0; c < k; c++) {
            const int e = ids[t * k + c];
            if (e > prev && (j < 0 || e < ids[t * k + j])) j = c;
        }
        if (j < 0) break;
        const int e = ids[t * k + j];
        prev = e;
        if (e >= E) break;
        const float d = round_bf16(warp_dot(act + (t * k + j) * I, down + (int64_t(e) * H + h) * I, I));
        acc = round_bf16(acc + round_bf16(d * weights[t * k + j]));
    }
    if ((threadIdx.x & 31) == 0) y[t * H + h] = to_bf16(acc);
}

__global__ void add_sigmoid_gated_kernel(bf16* y, const bf16* __restrict__ s, const bf16* __restrict__ x,
                                         const bf16* __restrict__ gate, int H) {
    __shared__ float scratch[32];
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.x;
    float g = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) g = fmaf(to_f32(x[t * H + i]), to_f32(gate[i]), g);
    g = round_bf16(block_sum(g, scratch));
    const float sg = round_bf16(1.0f / (1.0f + expf(-g)));
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        y[t * H + i] = to_bf16(to_f32(y[t * H + i]) + round_bf16(sg * to_f32(s[t * H + i])));
}

}  // namespace

void check_moe_route(int E, int k) {
    if (k < 1 || k > kMaxTopK || k > E || E > kMaxExperts)
        throw Error(Status::unsupported, "CUDA MoE router: " + std::to_string(E) + " experts, top-" +
                                             std::to_string(k) + " (supported: up to 4096 experts, top-32)");
}

void moe_top_k(const bf16* router_logits, int64_t rows, int E, int k, bool normalize, float* weights, int32_t* ids,
               const LaunchContext& ctx) {
    if (rows <= 0) return;
    check_moe_route(E, k);
    launch(moe_route_kernel, unsigned(rows), kRouteThreads, size_t(E) * 4, ctx, "MoE top-k kernel", router_logits, E, k,
           normalize, weights, ids);
}

void moe_experts(const bf16* x, int64_t rows, const MoeExperts& ex, int H, const float* weights, const int32_t* ids,
                 int k, bf16* act, bf16* y, const LaunchContext& ctx) {
    if (rows <= 0) return;
    const int E = ex.n_experts, I = ex.intermediate;
    launch(moe_gate_up_kernel, dim3(unsigned(rows * k), ceil_div(I, kMoeWarps)), kMoeWarps * 32, 0, ctx,
           "MoE gate/up kernel", x, static_cast<const bf16*>(ex.gate_up.data), ids, E, H, I, k, act);
    launch(moe_down_kernel, dim3(unsigned(rows), ceil_div(H, kMoeWarps)), kMoeWarps * 32, 0, ctx, "MoE down kernel",
           static_cast<const bf16*>(act), static_cast<const bf16*>(ex.down.data), weights, ids, E, H, I, k, y);
}

void add_sigmoid_gated(bf16* y, const bf16* s, const bf16* x, const bf16* gate, int64_t rows, int H,
                       const LaunchContext& ctx) {
    if (rows <= 0) return;
    launch(add_sigmoid_gated_kernel, unsigned(rows), 256, 0, ctx, "MoE shared-expert gate kernel", y, s, x, gate, H);
}

HY_CUDA_TRACE_BINDER(moe)

}  // namespace hy::cuda
