// The CUDA backend: bf16 activations, KV cache and conv state; bf16 weight matrices; fp32 recurrent state.
//
// The backend owns its stream, its cuBLASLt handle and a small pinned host staging buffer for the per-batch row
// map; all device memory is the one arena from alloc(), the backend's scratch being the workspace piece of it.
// Ops are enqueued on the stream and return at once; download() and synchronize() wait. Each op of the Backend
// interface runs the kernels its comment names, chosen from the op's shape only (the fused ops add_rms_norm,
// matmul_group and gate_up_silu are what model/forward.cpp calls; nothing is fused behind its back).
//
// Steps of at most kGraphMaxTokens rows, and decode steps of any batch size, are recorded rather than launched and
// replayed as one CUDA graph (graph.cuh): the same kernels, captured once per step shape and replayed.
// CudaOptions (kernels/backend.h), given when the backend is made, turn graphs, programmatic dependent launch
// (cuda_common.cuh; used on compute capability 9.0+ only), the decode GEMVs' L2 evict-first weight loads
// (matmul.cuh) and the Gated DeltaNet's fused decode conv (gated_delta_net.cuh) off for comparisons; in builds with
// -DHY_CUDA_TRACE=ON, CudaOptions::trace_file writes every kernel's start and ready times to a file when the backend
// is destroyed (start_trace()).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/fp8_matmul.cuh"
#include "kernels/cuda/gated_delta_net.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/graph.cuh"
#include "kernels/cuda/int_matmul.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/norm.cuh"

#ifndef HY_CUDA_ARCHITECTURES
#define HY_CUDA_ARCHITECTURES "unknown"
#endif

namespace hy {

#if defined(HY_CUDA_TRACE)
namespace cuda {
void trace_bind_argmax(const TraceBuf& t);
void trace_bind_attention(const TraceBuf& t);
void trace_bind_elementwise(const TraceBuf& t);
void trace_bind_embed(const TraceBuf& t);
void trace_bind_fp8_matmul(const TraceBuf& t);
void trace_bind_int_matmul(const TraceBuf& t);
void trace_bind_gated_delta_net(const TraceBuf& t);
void trace_bind_matmul(const TraceBuf& t);
void trace_bind_moe(const TraceBuf& t);
void trace_bind_norm(const TraceBuf& t);
void trace_bind_all(const TraceBuf& t) {
    trace_bind_argmax(t);
    trace_bind_attention(t);
    trace_bind_elementwise(t);
    trace_bind_embed(t);
    trace_bind_fp8_matmul(t);
    trace_bind_int_matmul(t);
    trace_bind_gated_delta_net(t);
    trace_bind_matmul(t);
    trace_bind_moe(t);
    trace_bind_norm(t);
}
}  // namespace cuda
#endif

namespace {

using cuda::bf16;

__global__ void probe_kernel() {}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Throws unless `device` exists and this build has machine code for it.
void check_device(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    // "no NVIDIA GPU found" first: without a GPU the driver's own words mislead ("CUDA driver version is
    // insufficient for CUDA runtime version")
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        throw Error(Status::backend, std::string("no NVIDIA GPU found (cudaGetDeviceCount: ") +
                                         (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    }
    if (device < 0 || device >= n)
        throw Error(Status::backend,
                    "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " present)");
    cudaDeviceProp prop{};
    HY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    HY_CUDA_CHECK(cudaSetDevice(device));
    if (prop.major * 100 + prop.minor * 10 < cuda::kArchMin)
        throw Error(Status::backend, std::string("CUDA device ") + prop.name + " has compute capability " +
                                         std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                                         "; hybrid needs 8.0 or newer (bf16)");
    cudaFuncAttributes attr{};
    e = cudaFuncGetAttributes(&attr, probe_kernel);
    if (e != cudaSuccess) {
        cudaGetLastError();  // clear the (non-sticky) error state
        throw Error(Status::backend, std::string("this build of hybrid has no CUDA kernels for ") + prop.name +
                                         " (compute capability " + std::to_string(prop.major) + "." +
                                         std::to_string(prop.minor) +
                                         "); it was built for CMAKE_CUDA_ARCHITECTURES=" + HY_CUDA_ARCHITECTURES +
                                         ": rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(prop.major) +
                                         std::to_string(prop.minor));
    }
}

// One kernel call (or cuBLASLt call, or copy) of a backend op, with its arguments (pointers into the arena).
// Recorded ops are captured into a CUDA graph as they are and replayed.
struct Op {
    enum class Kind : uint8_t {
        copy_h2d,
        embed,
        rms_norm,
        matmul,
        logits,
        add,
        silu_mul,
        attention,
        gated_delta_net,
        gather_rows,
        argmax,
        gemv_group,
        gate_up,
        gemv_quant_group,
        gate_up_quant,
        add_rms_norm,
        moe_route,
        moe_experts,
        add_sigmoid_gated,
    };
    Kind kind = Kind::copy_h2d;
    const void* x = nullptr;   // main input (copy source, table, norm/matmul input, add addend, silu gate)
    const void* x2 = nullptr;  // silu up; add_rms_norm addend
    void* y = nullptr;         // output (add: the accumulator)
    void* y2 = nullptr;        // gate_up: up output; add_rms_norm: norm output
    void* y3 = nullptr;        // gate_up: activation output
    const float* w = nullptr;  // norm weight
    Matrix m, m2;              // matmul weights (gate_up: gate, up)
    int64_t n = 0;             // rows, or elements (add, silu_mul), or bytes (copy)
    int64_t dim = 0;
    int64_t n2 = 0;  // argmax: n_valid
    int64_t n3 = 0;  // moe_experts: I
    float eps = 0.0f;
    bool flag = false;  // rms_norm zero_centred; matmul: not the wgmma GEMM
    cuda::GemvGroup group;
    cuda::Fp8Group fp8;  // gemv_quant_group: FP8 or Q8/Q4 members (their dtype in m.dtype, Q8/Q4's group in m.group)
    cuda::MoeShared shared;  // moe_experts: the fused shared expert (gate_proj null: none)
    AttentionArgs attn;
    GatedDeltaNetArgs gdn;
    cuda::RowMap rows;
};

// Appends every argument of `op` to a signature (field by field: no padding bytes).
void sign(const Op& op, std::vector<uint64_t>& sig) {
    auto u = [&](uint64_t v) { sig.push_back(v); };
    auto p = [&](const void* v) { sig.push_back(uint64_t(reinterpret_cast<uintptr_t>(v))); };
    auto f = [&](float v) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        sig.push_back(b);
    };
    u(uint64_t(op.kind));
    p(op.x);
    p(op.x2);
    p(op.y);
    p(op.y2);
    p(op.y3);
    p(op.w);
    for (const Matrix* m : {&op.m, &op.m2}) {
        p(m->data);
        u(uint64_t(m->dtype));
        u(uint64_t(m->rows));
        u(uint64_t(m->cols));
        p(m->scales);
        u(uint64_t(m->scale_segment_rows));
        u(uint64_t(m->group));
    }
    u(uint64_t(op.n));
    u(uint64_t(op.dim));
    u(uint64_t(op.n2));
    u(uint64_t(op.n3));
    f(op.eps);
    u(op.flag);
    if (op.kind == Op::Kind::gemv_group) {
        u(uint64_t(op.group.count));
        for (int k = 0; k < op.group.count; k++) {
            p(op.group.w[k]);
            p(op.group.y[k]);
            u(uint64_t(op.group.n[k]));
        }
    }
    if (op.kind == Op::Kind::gemv_quant_group) {
        u(uint64_t(op.fp8.count));
        for (int k = 0; k < op.fp8.count; k++) {
            p(op.fp8.w[k]);
            p(op.fp8.scales[k]);
            p(op.fp8.y[k]);
            u(uint64_t(op.fp8.n[k]));
            u(uint64_t(op.fp8.segment_rows[k]));
        }
    }
    if (op.kind == Op::Kind::moe_experts) {
        for (const cuda::ExpertMatrix* m : {&op.shared.gate_proj, &op.shared.up_proj, &op.shared.down_proj}) {
            p(m->w);
            p(m->scales);
            u(uint64_t(m->segment_rows));
            u(uint64_t(m->group));
        }
        p(op.shared.gate);
        u(uint64_t(op.shared.Is));
        u(op.shared.quantized);
    }
    if (op.kind == Op::Kind::attention) {
        const AttentionArgs& a = op.attn;
        p(a.qg);
        p(a.k);
        p(a.v);
        p(a.q_norm);
        p(a.k_norm);
        p(a.k_cache);
        p(a.v_cache);
        p(a.out);
        u(uint64_t(a.n_heads));
        u(uint64_t(a.n_kv_heads));
        u(uint64_t(a.head_dim));
        u(uint64_t(a.rotary_dim));
        u(uint64_t(a.n_ctx));
        f(a.rope_theta);
        f(a.eps);
        f(a.rope_yarn_factor);
        f(a.rope_yarn_low);
        f(a.rope_yarn_range);
        f(a.rope_attention_factor);
    }
    if (op.kind == Op::Kind::gated_delta_net) {
        const GatedDeltaNetArgs& g = op.gdn;
        p(g.qkv);
        p(g.z);
        p(g.b);
        p(g.a);
        p(g.conv_w);
        p(g.A_log);
        p(g.dt_bias);
        p(g.norm_w);
        p(g.conv_state);
        p(g.ssm_state);
        p(g.out);
        u(uint64_t(g.n_k_heads));
        u(uint64_t(g.n_v_heads));
        u(uint64_t(g.k_dim));
        u(uint64_t(g.v_dim));
        u(uint64_t(g.conv_kernel));
        f(g.eps);
    }
    if (op.kind == Op::Kind::attention || op.kind == Op::Kind::gated_delta_net) {
        const cuda::RowMap& r = op.rows;
        p(r.slot);
        p(r.pos);
        p(r.in_run);
        p(r.runs);
        u(uint64_t(r.n_rows));
        u(uint64_t(r.n_runs));
    }
}

class CudaBackend final : public Backend {
public:
    CudaBackend(int device, const CudaOptions& o) : device_(device), graphs_enabled_(o.graphs) {
#if !defined(HY_CUDA_TRACE)
        if (!o.trace_file.empty())
            throw Error(Status::invalid_argument,
                        "a CUDA trace file was asked for, but this build has no tracing "
                        "(configure with -DHY_CUDA_TRACE=ON)");
#endif
        check_device(device);
        HY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        HY_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming));
        gemm_ = std::make_unique<cuda::Gemm>();
        // Programmatic dependent launch and the cluster barrier are compiled in only for compute capability
        // 9.0+ (__CUDA_ARCH__ >= 900): they need a device of 9.0+ running code built for 9.0+. A newer GPU without
        // machine code of its own runs the driver's compilation of the newest portable PTX of the build (compute_89
        // by default: sm_90a code is not portable), which has none of them, so the backend uses none there (the
        // PTX architecture of the code the device runs, as CUB finds it).
        int major = 0;
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        cudaFuncAttributes probe{};
        HY_CUDA_CHECK(cudaFuncGetAttributes(&probe, probe_kernel));
        const bool sm90_code = major >= 9 && probe.ptxVersion >= 90;
        int clusters = 0;
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device));
        ctx_.stream = stream_;
        ctx_.pdl = sm90_code && o.pdl;
        ctx_.clusters = sm90_code && clusters != 0;
        ctx_.evict_first = o.l2_evict_first;
        ctx_.gdn_fused_conv = o.gdn_fused_conv;
        ctx_.gdn_decode_stream = o.gdn_decode_stream;
        ctx_.gdn_decode_stream_blocks = std::max(0, o.gdn_decode_stream_blocks);
        ctx_.gdn_decode_three_blocks = o.gdn_decode_three_blocks;
        if (o.gdn_conv_rows < 0 || o.gdn_conv_rows > 16)
            throw Error(Status::invalid_argument,
                        "CudaOptions::gdn_conv_rows must be 0 to 16, got " + std::to_string(o.gdn_conv_rows));
        ctx_.gdn_conv_rows = o.gdn_conv_rows;
        if (o.moe_grouped_min_rows > 0)
            ctx_.moe_grouped_min_rows = ctx_.moe_grouped_min_rows_fp8 = o.moe_grouped_min_rows;
        ctx_.moe_group_k64 = o.moe_group_k64;
        if (o.attn_heads_per_block > 0) ctx_.attn_heads_per_block = o.attn_heads_per_block;
        if (o.attn_prefill_heads_per_block > 0) ctx_.attn_prefill_heads_per_block = o.attn_prefill_heads_per_block;
        if (o.attn_max_splits > 0) ctx_.attn_max_splits = std::min(o.attn_max_splits, cuda::kAttnMaxSplits);
        ctx_.int_gemv_split_k = o.int_gemv_split_k < 0 ? -1 : o.int_gemv_split_k > 0 ? 1 : 0;
        ctx_.int_gemv_staged = o.int_gemv_staged < 0 ? -1 : o.int_gemv_staged > 0 ? 1 : 0;
        if (o.small_batch_gemv == 2) {  // the default up to 8 rows; then groups of 3-4 up to 16, cuBLASLt for others
            ctx_.tc_group_max_rows = cuda::kTcGemvMaxTokens;
            ctx_.wide_gemv_max_rows = 0;
        } else {
            if (o.small_batch_gemv != 0) ctx_.tc_gemv_all = o.small_batch_gemv > 0;
            if (o.small_batch_gemv > 0) ctx_.tc_gemv_max_rows = cuda::kTcGemvMaxTokens;
        }
        if (o.wide_gemv != 0) ctx_.wide_gemv_max_rows = o.wide_gemv > 0 ? cuda::kWideGemvMaxTokens : 0;
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&ctx_.sm_count, cudaDevAttrMultiProcessorCount, device));
        HY_CUDA_CHECK(cudaDeviceGetAttribute(&ctx_.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        ctx_.wgmma = sm90_code && cuda::wgmma_available();
        if (o.wgmma_gemm < -1 || o.wgmma_gemm > 2)
            throw Error(Status::invalid_argument,
                        "CudaOptions::wgmma_gemm must be -1, 0, 1 or 2, got " + std::to_string(o.wgmma_gemm));
        if (o.wgmma_gemm == 1 || o.wgmma_gemm == -1)
            ctx_.wgmma_gemm_max_rows = o.wgmma_gemm > 0 ? cuda::kWgmmaGemmMaxRows : 0;
        if (o.wgmma_gemm == 0) {  // by shape (tuning.cuh)
            ctx_.wgmma_lone_max_rows = cuda::kWgmmaLoneMaxRows;
            ctx_.wgmma_gate_up_max_rows = cuda::kWgmmaGateUpMaxRows;
            ctx_.wgmma_logits_max_rows = cuda::kWgmmaLogitsMaxRows;
            // 9-16 rows leave the cluster GEMV for it where it runs, unless wide_gemv is given
            if (o.wide_gemv == 0 && ctx_.wgmma && ctx_.clusters) ctx_.wide_gemv_max_rows = 0;
        }
        if (o.wgmma_gemm_parts != 0 && o.wgmma_gemm_parts != 1 && o.wgmma_gemm_parts != 2 && o.wgmma_gemm_parts != 4 &&
            o.wgmma_gemm_parts != 8)
            throw Error(Status::invalid_argument, "CudaOptions::wgmma_gemm_parts must be 0, 1, 2, 4 or 8, got " +
                                                      std::to_string(o.wgmma_gemm_parts));
        ctx_.wgmma_gemm_parts = o.wgmma_gemm_parts;
        ctx_.wgmma_quant_max_rows = o.wgmma_quant ? cuda::kWgmmaQuantMaxRows : 0;
        ctx_.wgmma_quant_fp8 = o.wgmma_quant && !o.fp8_block_scaled_gemm;
        if (o.wgmma_quant_warpgroups != 1 && o.wgmma_quant_warpgroups != 2)
            throw Error(Status::invalid_argument, "CudaOptions::wgmma_quant_warpgroups must be 1 or 2, got " +
                                                      std::to_string(o.wgmma_quant_warpgroups));
        ctx_.wgmma_quant_warpgroups = o.wgmma_quant_warpgroups;
        ctx_.wgmma_stream_k = o.wgmma_stream_k && ctx_.wgmma && ctx_.clusters;
        ctx_.wgmma_stream_k_quant = o.wgmma_stream_k_quant && ctx_.wgmma && ctx_.clusters && o.wgmma_quant;
        ctx_.stream_k_blocks =
            ctx_.wgmma_stream_k || ctx_.wgmma_stream_k_quant ? cuda::kWgmmaStreamKBlocksPerSm * ctx_.sm_count : 0;
        fp8_mode_ = o.fp8_block_scaled_gemm ? cuda::Fp8GemmMode::block_scaled : cuda::Fp8GemmMode::dequantize;
#if defined(HY_CUDA_TRACE)
        if (!o.trace_file.empty()) start_trace(o.trace_file);
#endif
        ops_.reserve(kMaxRecordedOps);
        sig_.reserve(kMaxRecordedOps * 24);
    }
    ~CudaBackend() override {
        try {
            flush();
        } catch (const Error&) {}
        if (stream_) cudaStreamSynchronize(stream_);
#if defined(HY_CUDA_TRACE)
        finish_trace();
#endif
        graphs_.clear();
        gemm_.reset();
        if (staging_) cudaFreeHost(staging_);
        if (bounce_) cudaFreeHost(bounce_);
        if (staging_done_) cudaEventDestroy(staging_done_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }
    std::string device_name() const override {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return "CUDA device " + std::to_string(device_);
        return std::string(prop.name) + " (compute capability " + std::to_string(prop.major) + "." +
               std::to_string(prop.minor) + ")";
    }
    std::string settings() const override {
        auto on = [](bool b) { return b ? "on" : "off"; };
        return std::string("graphs ") + on(graphs_enabled_) + ", pdl " + on(ctx_.pdl) + ", clusters " +
               on(ctx_.clusters) + ", l2 evict-first " + on(ctx_.evict_first) + ", gdn fused conv " +
               on(ctx_.gdn_fused_conv) + ", gdn streamed decode " + on(ctx_.gdn_decode_stream) +
               ", gdn decode blocks an SM " + (ctx_.gdn_decode_three_blocks ? "3" : "2") + ", moe grouped from " +
               std::to_string(ctx_.moe_grouped_min_rows) + " rows (FP8 " +
               std::to_string(ctx_.moe_grouped_min_rows_fp8) + "), attention q heads per decode block up to " +
               std::to_string(ctx_.attn_heads_per_block) + ", prefill attention q heads per block up to " +
               std::to_string(ctx_.attn_prefill_heads_per_block) + ", attention splits up to " +
               std::to_string(ctx_.attn_max_splits) + ", integer gemv K split " +
               (ctx_.int_gemv_split_k > 0   ? "always"
                : ctx_.int_gemv_split_k < 0 ? "never"
                                            : "by shape") +
               ", integer gemv codes staged in shared memory " +
               (ctx_.int_gemv_staged > 0   ? std::string("always")
                : ctx_.int_gemv_staged < 0 ? std::string("never")
                                           : std::to_string(cuda::kIntStagedMinRows) + "-" +
                                                 std::to_string(cuda::kIntStagedMaxRows) + " rows") +
               ", bf16 gemv of 3-" +
               (ctx_.tc_gemv_all ? std::to_string(ctx_.tc_gemv_max_rows) + " rows all tensor-core"
                                 : std::string("8 rows groups tensor-core")) +
               (ctx_.tc_group_max_rows > cuda::kGemvMaxTokens
                    ? ", groups tensor-core up to " + std::to_string(ctx_.tc_group_max_rows) + " rows"
                    : std::string()) +
               (ctx_.wide_gemv_max_rows > 0 && ctx_.clusters
                    ? ", bf16 gemv of up to " + std::to_string(ctx_.wide_gemv_max_rows) + " rows in clusters"
                    : std::string()) +
               (ctx_.wgmma_gemm_max_rows > 0
                    ? (ctx_.wgmma && ctx_.clusters
                           ? ", bf16 wgmma gemm up to " + std::to_string(ctx_.wgmma_gemm_max_rows) + " rows" +
                                 (ctx_.wgmma_lone_max_rows < ctx_.wgmma_gemm_max_rows ||
                                          ctx_.wgmma_gate_up_max_rows < ctx_.wgmma_gemm_max_rows ||
                                          ctx_.wgmma_logits_max_rows < ctx_.wgmma_gemm_max_rows
                                      ? " (lone matrices up to " + std::to_string(ctx_.wgmma_lone_max_rows) +
                                            ", gate/up up to " + std::to_string(ctx_.wgmma_gate_up_max_rows) +
                                            ", logits up to " + std::to_string(ctx_.wgmma_logits_max_rows) + ")"
                                      : std::string()) +
                                 ", K parts " +
                                 (ctx_.wgmma_gemm_parts > 0 ? std::to_string(ctx_.wgmma_gemm_parts)
                                                            : std::string("by shape")) +
                                 (ctx_.wgmma_stream_k ? ", stream-k" : "")
                           : std::string(", no wgmma gemm (no sm_90a code for this device)"))
                    : std::string()) +
               (ctx_.wgmma && ctx_.clusters && ctx_.wgmma_quant_max_rows > 0
                    ? std::string(ctx_.wgmma_quant_fp8 ? ", q8/q4/fp8" : ", q8/q4") + " wgmma gemm of " +
                          std::to_string(cuda::kWgmmaGemmMinRows) + "-" +
                          std::to_string(std::min(ctx_.wgmma_quant_max_rows, cuda::kWgmmaQuantMaxRows)) + " rows" +
                          (ctx_.wgmma_quant_warpgroups == 2 ? " (2 warpgroups)" : "") +
                          (ctx_.wgmma_stream_k_quant ? ", stream-k" : "")
                    : std::string()) +
               ", fp8 gemm " + (fp8_mode_ == cuda::Fp8GemmMode::block_scaled ? "block-scaled" : "dequantize") +
               (gemm_->fp8_shapes_without_algorithm() > 0
                    ? " (cuBLASLt had no block-scaled algorithm for " +
                          std::to_string(gemm_->fp8_shapes_without_algorithm()) + " shapes: those dequantize)"
                    : "");
    }
    DType act_dtype() const override { return DType::BF16; }
    // FP8 matrices stay FP8 (fp8_matmul.cuh), Q8/Q4 stay Q8/Q4 (int_matmul.cuh; --quant int8 / int4 ask for
    // them); everything else is bf16.
    DType matrix_dtype(DType checkpoint) const override {
        return is_fp8(checkpoint) || is_int_quant(checkpoint) ? checkpoint : DType::BF16;
    }

    // The device memory free now (cudaMemGetInfo): the load refuses a larger arena before allocating, naming the
    // context that would fit.
    size_t memory_capacity() const override {
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return free_b;
    }
    void* alloc(size_t bytes) override {
        HY_CUDA_CHECK(cudaSetDevice(device_));
        void* p = nullptr;
        cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw Error(Status::out_of_memory, "cannot allocate the model arena of " + std::to_string(bytes >> 20) +
                                                   " MiB on the GPU (" + std::to_string(free_b >> 20) +
                                                   " MiB free of " + std::to_string(total_b >> 20) +
                                                   "): " + cudaGetErrorString(e));
        }
        return p;
    }
    void free(void* p) override {
        flush();
        if (stream_) cudaStreamSynchronize(stream_);
        cudaFree(p);
    }
    void upload(void* dst, const void* src, size_t bytes) override {
        flush();
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        HY_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may reuse src at once
    }
    // Small downloads (a decode step's picks) go through a pinned bounce buffer: a copy into pageable memory is
    // staged by the driver and costs several microseconds more on the path between two tokens.
    void download(void* dst, const void* src, size_t bytes) override {
        flush();
        if (bytes <= kBounceBytes) {
            if (!bounce_) HY_CUDA_CHECK(cudaMallocHost(&bounce_, kBounceBytes));
            HY_CUDA_CHECK(cudaMemcpyAsync(bounce_, src, bytes, cudaMemcpyDeviceToHost, stream_));
            HY_CUDA_CHECK(cudaStreamSynchronize(stream_));
            std::memcpy(dst, bounce_, bytes);
            return;
        }
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        HY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    std::shared_ptr<void> alloc_host(size_t bytes) override {
        HY_CUDA_CHECK(cudaSetDevice(device_));
        void* p = nullptr;
        const cudaError_t e = cudaMallocHost(&p, std::max<size_t>(bytes, 1));
        if (e != cudaSuccess) {
            cudaGetLastError();
            throw Error(Status::out_of_memory, "cannot allocate " + std::to_string(bytes >> 20) +
                                                   " MiB of page-locked host memory: " + cudaGetErrorString(e));
        }
        return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    }
    void download_async(void* dst, const void* src, size_t bytes) override {
        flush();
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    void upload_async(void* dst, const void* src, size_t bytes) override {
        flush();
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    }
    void fill_zero(void* dst, size_t bytes) override {
        flush();
        HY_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
    }
    void fill_random(void* dst, size_t n, DType dtype, float lo, float hi, uint64_t seed) override {
        if (dtype != DType::F32 && dtype != DType::BF16)
            throw Error(Status::internal, std::string("fill_random: ") + dtype_name(dtype) + " is not filled");
        flush();
        cuda::fill_random(dst, int64_t(n), dtype == DType::F32, lo, hi, seed, ctx_);
    }
    void synchronize() override {
        flush();
        HY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    size_t device_memory_used() override {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return total_b - free_b;
    }
    // Device-to-device copies of 1 GiB (bytes read + written per second), best of 5 after a warm-up; the buffers
    // are temporary allocations outside the arena (tools only).
    double copy_bandwidth_gbs() override {
        flush();
        const size_t n = size_t(1) << 30;
        void *a = nullptr, *b = nullptr;
        cudaEvent_t e0 = nullptr, e1 = nullptr;
        double best = 0.0;
        if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess &&
            cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
            cudaMemsetAsync(a, 1, n, stream_);
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream_);
            for (int rep = 0; rep < 5; rep++) {
                cudaEventRecord(e0, stream_);
                cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, stream_);
                cudaEventRecord(e1, stream_);
                float ms = 0.0f;
                if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess &&
                    ms > 0)
                    best = std::max(best, 2.0 * double(n) / (double(ms) * 1e-3) / 1e9);
            }
        }
        cudaGetLastError();
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        if (a) cudaFree(a);
        if (b) cudaFree(b);
        return best;
    }

    // Workspace: cuBLASLt scratch | row map (token ids, slot, pos, index in run, gather rows) [T] each | runs |
    // bf16 scratch A [T, 4 * heads * head_dim] (attention q [T, Hq, D] or GDN mixed [T, C]) | attention split
    // partials | argmax partials [T] | MoE models: the grouped experts' outputs [T * k, H] bf16 and index
    // (cuda::MoeScratch). workspace_bytes() records the scratch sizes that set_workspace() lays out.
    size_t workspace_bytes(const BatchLimits& l, const WorkspaceShape& s) const override {
        const int max_heads = s.max_heads, max_head_dim = s.max_head_dim;
        const size_t T = size_t(std::max(l.max_tokens, 1)), R = size_t(std::max(l.max_runs, 1));
        const size_t hd = size_t(std::max(max_heads, 1)) * size_t(std::max(max_head_dim, 1));
        // >= Hq * D and >= C = 2 Hk Dk + Hv Dv <= 3 Hv Dv; MoE layers use it for the experts' activations [T * k, I]
        scratch_a_elems_ = align256(std::max({T * 4 * hd, T * size_t(s.experts_per_tok) * size_t(s.moe_intermediate),
                                              T * size_t(s.n_experts)}) *
                                    2) /
                           2;
        split_floats_ = cuda::attention_split_floats(std::max(max_heads, 1), std::max(max_head_dim, 1));
        moe_slot_elems_ = moe_index_ints_ = 0;
        if (s.n_experts > 0) {
            // (also the shared expert's buffers: gate|up [T, 2 Is] and output [T, H], or fused: act [T, Is] and
            // gates [T] fp32)
            const size_t Is = size_t(s.shared_intermediate), H = size_t(s.hidden);
            moe_slot_elems_ = align256(T * std::max(size_t(s.experts_per_tok) * H, 2 * Is + H + 2) * 2) / 2;
            moe_index_ints_ = align256(cuda::moe_index_ints(int64_t(T), s.n_experts, s.experts_per_tok) * 4) / 4;
        }
        // FP8 matrices (cuda::Fp8Scratch): quantized activations [T, K] and their scales, a bf16 copy of the
        // largest matrix
        fp8_act_bytes_ = s.fp8_max_elems > 0 ? align256(T * size_t(s.fp8_max_cols)) : 0;
        fp8_weight_elems_ = s.fp8_max_elems > 0 ? align256(size_t(s.fp8_max_elems) * 2) / 2 : 0;
        // stream-K partials only where a GEMM may split: bf16 with wgmma_stream_k, quantized matrices with
        // wgmma_stream_k_quant (a bf16 model does not reserve them for the quantized GEMM)
        stream_k_ws_blocks_ = ctx_.wgmma_stream_k || (ctx_.wgmma_stream_k_quant && s.fp8_max_elems > 0)
                                  ? size_t(ctx_.stream_k_blocks)
                                  : 0;
        return align256(cuda::Gemm::kWorkspaceBytes) + align256(5 * T * 4 + R * sizeof(SeqRun)) + scratch_a_elems_ * 2 +
               align256(split_floats_ * 4) + align256(cuda::argmax_scratch_floats(int(T)) * 4) + moe_slot_elems_ * 2 +
               moe_index_ints_ * 4 + fp8_act_bytes_ + align256(fp8_act_bytes_ / 128 * 4 + 4) + fp8_weight_elems_ * 2 +
               stream_k_bytes();
    }
    // The wgmma GEMMs' stream-K partials and flags (LaunchContext::stream_k_*), at the workspace's end.
    size_t stream_k_bytes() const {
        const size_t b = stream_k_ws_blocks_;
        return b == 0 ? 0 : align256(b * cuda::kWgmmaStreamKPartialFloats * 4) + align256(b * 4);
    }
    void set_workspace(void* ws, const BatchLimits& l) override {
        if (scratch_a_elems_ == 0) throw Error(Status::internal, "CUDA backend: set_workspace before workspace_bytes");
        flush();
        synchronize();
        graphs_.clear();  // captured graphs point into the old workspace
        last_graph_ = nullptr;
        limits_ = l;
        ws_ = static_cast<char*>(ws);
        gemm_->set_workspace(ws_);
        const size_t T = size_t(std::max(l.max_tokens, 1)), R = size_t(std::max(l.max_runs, 1));
        if (staging_) cudaFreeHost(staging_);
        staging_ = nullptr;
        HY_CUDA_CHECK(cudaMallocHost(&staging_, 5 * T * 4 + R * sizeof(SeqRun)));
        last_runs_.reserve(R);
        recorded_runs_.reserve(R);
        char* d = ws_ + align256(cuda::Gemm::kWorkspaceBytes);
        d_tokens_ = reinterpret_cast<int32_t*>(d);
        d_slot_ = d_tokens_ + T;
        d_pos_ = d_slot_ + T;
        d_in_run_ = d_pos_ + T;
        d_gather_ = d_in_run_ + T;
        d_runs_ = reinterpret_cast<SeqRun*>(d_gather_ + T);
        scratch_a_ = reinterpret_cast<bf16*>(d + align256(5 * T * 4 + R * sizeof(SeqRun)));
        split_scratch_ = reinterpret_cast<float*>(scratch_a_ + scratch_a_elems_);
        argmax_scratch_ =
            reinterpret_cast<float*>(reinterpret_cast<char*>(split_scratch_) + align256(split_floats_ * 4));
        moe_slot_ = reinterpret_cast<bf16*>(reinterpret_cast<char*>(argmax_scratch_) +
                                            align256(cuda::argmax_scratch_floats(int(T)) * 4));
        moe_index_ = reinterpret_cast<int32_t*>(moe_slot_ + moe_slot_elems_);
        char* f = reinterpret_cast<char*>(moe_index_ + moe_index_ints_);
        fp8_scratch_.act = reinterpret_cast<uint8_t*>(f);
        fp8_scratch_.act_bytes = fp8_act_bytes_;
        fp8_scratch_.act_scales = reinterpret_cast<float*>(f + fp8_act_bytes_);
        fp8_scratch_.weight = reinterpret_cast<bf16*>(f + fp8_act_bytes_ + align256(fp8_act_bytes_ / 128 * 4 + 4));
        fp8_scratch_.weight_elems = fp8_weight_elems_;
        ctx_.stream_k_partials = nullptr;  // (no partials: the GEMMs do not split)
        ctx_.stream_k_flags = nullptr;
        if (stream_k_ws_blocks_ > 0) {
            const size_t b = stream_k_ws_blocks_;
            char* k = reinterpret_cast<char*>(fp8_scratch_.weight + fp8_weight_elems_);
            ctx_.stream_k_partials = reinterpret_cast<float*>(k);
            ctx_.stream_k_flags = reinterpret_cast<int*>(k + align256(b * cuda::kWgmmaStreamKPartialFloats * 4));
            HY_CUDA_CHECK(cudaMemset(ctx_.stream_k_flags, 0, b * 4));
        }
    }

    void begin_batch(const BatchDesc& b) override {
        if (!staging_) throw Error(Status::internal, "CUDA backend: begin_batch before set_workspace");
        if (b.n_tokens > limits_.max_tokens || b.n_runs > std::max(limits_.max_runs, 1))
            throw Error(Status::invalid_argument, "CUDA backend: batch of " + std::to_string(b.n_tokens) +
                                                      " rows and " + std::to_string(b.n_runs) +
                                                      " runs exceeds the load-time limits");
        flush();
        wait_staging();
        fill_staging(b);
        // Graphs for small steps and for every decode step (one token per run: few distinct shapes, one graph per
        // batch size); prefill steps of other shapes would rarely repeat.
        recording_ = graphs_enabled_ && (b.n_tokens <= kGraphMaxTokens || b.n_runs == b.n_tokens);
        if (recording_) {
            recorded_runs_.clear();
            for (int r = 0; r < b.n_runs; r++) recorded_runs_.push_back(b.runs[r].n_tokens);
        }
        // One copy of the row arrays, the gather rows and the runs (contiguous in the staging buffer and on the
        // device): a recorded step's gather_rows() fills its part of the staging buffer before the graph runs, so
        // the graph has a single copy node, ahead of every kernel.
        Op c;
        c.kind = Op::Kind::copy_h2d;
        c.x = staging_;
        c.y = d_tokens_;
        c.n = int64_t(5 * size_t(limits_.max_tokens) * 4 + size_t(b.n_runs) * sizeof(SeqRun));
        submit(c);
        if (!recording_) HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        rows_ = cuda::RowMap{d_slot_, d_pos_, d_in_run_, d_runs_, b.n_tokens, b.n_runs};
    }

    bool repeat_step(const BatchDesc& b) override {
        if (!last_graph_ || recording_ || b.n_tokens != last_rows_ || b.n_runs != int(last_runs_.size())) return false;
        for (int r = 0; r < b.n_runs; r++)
            if (b.runs[r].n_tokens != last_runs_[size_t(r)]) return false;
        wait_staging();
        fill_staging(b);
        rows_ = cuda::RowMap{d_slot_, d_pos_, d_in_run_, d_runs_, b.n_tokens, b.n_runs};
        cuda::check(launch_graph(last_graph_), "cudaGraphLaunch");
        HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        return true;
    }

    void embed(const Matrix& table, void* x) override {
        require_bf16(table, "embedding table");
        Op op;
        op.kind = Op::Kind::embed;
        op.m = table;
        op.y = x;
        op.n = rows_.n_rows;
        submit(op);
    }
    void rms_norm(const void* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred,
                  void* y) override {
        Op op;
        op.kind = Op::Kind::rms_norm;
        op.x = x;
        op.w = w;
        op.n = rows;
        op.dim = dim;
        op.eps = eps;
        op.flag = zero_centred;
        op.y = y;
        submit(op);
    }
    // FP8 w: cuda::matmul_fp8 (the FP8 GEMV for up to 8 rows, else CudaOptions::fp8_gemm); Q8/Q4 w:
    // cuda::matmul_int (the integer GEMV for up to 8 rows, else dequantized to bf16 for cuBLASLt).
    void matmul(const void* x, int64_t rows, const Matrix& w, void* y) override { matmul(x, rows, w, y, false); }
    // no_wgmma: never the wgmma GEMM (gate/up past LaunchContext::wgmma_gate_up_max_rows: cuBLASLt).
    void matmul(const void* x, int64_t rows, const Matrix& w, void* y, bool no_wgmma) {
        require_matrix(w, "weight matrix", true);
        Op op;
        op.kind = Op::Kind::matmul;
        op.flag = no_wgmma;
        op.x = x;
        op.n = rows;
        op.m = w;
        op.y = y;
        submit(op);
    }
    // One add_rms_norm kernel.
    void add_rms_norm(void* x, const void* d, const float* w, int64_t rows, int dim, float eps, bool zero_centred,
                      void* y) override {
        if (d == x || d == y) throw Error(Status::internal, "CUDA add_rms_norm: the addend aliases x or y");
        Op op;
        op.kind = Op::Kind::add_rms_norm;
        op.y = x;
        op.x2 = d;
        op.w = w;
        op.n = rows;
        op.dim = dim;
        op.eps = eps;
        op.flag = zero_centred;
        op.y2 = y;
        submit(op);
    }
    // Whether every bf16 matrix of `rows` rows of x may go to the tensor-core GEMV (LaunchContext::tc_gemv_all,
    // tc_gemv_max_rows); else only groups of 3 or 4 matrices of 3 to 8 rows.
    bool tc_all(int64_t rows) const { return ctx_.tc_gemv_all && rows <= ctx_.tc_gemv_max_rows; }
    // With 1 to 8 rows (cuda::kGemvMaxTokens; bf16 up to 16, kTcGemvMaxTokens, where tc_all allows it, or up to
    // tc_group_max_rows for groups of 3 or 4), consecutive projections that gemv_group_fits (up to GemvGroup::kMax of
    // them; with 3 to 8 rows unless tc_all only groups of 3 or 4) run as one GEMV launch, and with the rows the
    // cluster GEMV takes (cuda::gemv_wide_rows: 9-16 by default) any consecutive ones that gemv_wide_fits, likewise
    // with the wgmma GEMM's rows (cuda::wgmma_gemm_rows, CudaOptions::wgmma_gemm) those that wgmma_gemm_fits; the
    // others as matmul(): the GEMV for 1-2 rows where it fits, the cluster GEMV for its rows, else cuBLASLt
    // (hybrid-kernel-bench: at 8 rows the 4B q/k/v group streams 2.6 TB/s and the Gated DeltaNet input group 2.8 TB/s
    // against 2.1 and 2.0 for their cuBLASLt calls).
    void matmul_group(const void* x, int64_t rows, const Projection* p, int n) override {
        const bf16* xb = static_cast<const bf16*>(x);
        for (int k = 0; k < n; k++) {
            require_matrix(p[k].w, "weight matrix", true);
            if (p[k].y == x) throw Error(Status::internal, "CUDA matmul_group: an output aliases the input");
        }
        auto groupable = [&](const Projection& q) {
            if (is_fp8(q.w.dtype))
                return cuda::fp8_gemv_fits(xb, rows, q.w) || cuda::wgmma_quant_fits(xb, rows, q.w, ctx_);
            if (is_int_quant(q.w.dtype))
                return cuda::int_gemv_fits(xb, rows, q.w) || cuda::wgmma_quant_fits(xb, rows, q.w, ctx_);
            const bf16* w = static_cast<const bf16*>(q.w.data);
            if (cuda::gemv_wide_rows(rows, ctx_)) return cuda::gemv_wide_fits(xb, rows, w, q.w.cols, ctx_);
            if (cuda::wgmma_gemm_rows(rows, ctx_)) return cuda::wgmma_gemm_fits(xb, rows, w, q.w.cols, ctx_);
            return rows >= 1 && rows <= cuda::kTcGemvMaxTokens &&
                   cuda::gemv_group_fits(xb, rows, w, q.w.cols, 1, tc_all(rows), ctx_.tc_group_max_rows);
        };
        auto same_kind = [&](const Projection& a, const Projection& b) {
            return a.w.dtype == b.w.dtype && a.w.cols == b.w.cols && a.w.group == b.w.group;
        };
        for (int i = 0; i < n;) {
            int j = i;
            if (groupable(p[i])) {
                j = i + 1;
                while (j < n && j - i < cuda::GemvGroup::kMax && groupable(p[j]) && same_kind(p[i], p[j])) j++;
            }
            // FP8 and Q8/Q4 members: any group of 2 to 4 (their GEMVs take single matrices as well)
            if (j - i >= 2 && (is_fp8(p[i].w.dtype) || is_int_quant(p[i].w.dtype))) {
                Op op;
                op.kind = Op::Kind::gemv_quant_group;
                op.x = x;
                op.n = rows;
                op.dim = p[i].w.cols;
                op.m.dtype = p[i].w.dtype;
                op.m.group = p[i].w.group;
                for (int k = i; k < j; k++) op.fp8.add(p[k].w, p[k].y);
                submit(op);
                i = j;
            } else if (j - i >= 2 &&
                       (cuda::gemv_wide_rows(rows, ctx_) || cuda::wgmma_gemm_rows(rows, ctx_) ||
                        cuda::gemv_group_fits(xb, rows, static_cast<const bf16*>(p[i].w.data), p[i].w.cols, j - i,
                                              tc_all(rows), ctx_.tc_group_max_rows))) {
                Op op;
                op.kind = Op::Kind::gemv_group;
                op.x = x;
                op.n = rows;
                op.dim = p[i].w.cols;
                for (int k = i; k < j; k++) op.group.add(static_cast<const bf16*>(p[k].w.data), p[k].y, p[k].w.rows);
                submit(op);
                i = j;
            } else {
                matmul(x, rows, p[i].w, p[i].y);
                i++;
            }
        }
    }
    // 1-2 rows where the GEMV fits (FP8 and Q8/Q4: 1-8 rows; bf16 3-16 rows on tensor cores when every bf16 matrix
    // goes there, CudaOptions::small_batch_gemv): one gate/up/SiLU GEMV kernel (cuda::gemv_gate_up,
    // cuda::gemv_fp8_gate_up, cuda::gemv_int_gate_up; bf16 with the wgmma GEMM's rows, CudaOptions::wgmma_gemm, the
    // wgmma gate/up/SiLU kernel); Q8/Q4 beyond: gate and up as one matmul_group, then silu_mul; else matmul, matmul,
    // silu_mul.
    void gate_up_silu(const void* x, int64_t rows, const Matrix& w_gate, const Matrix& w_up, void* gate, void* up,
                      void* act) override {
        require_matrix(w_gate, "weight matrix", true);
        require_matrix(w_up, "weight matrix", true);
        if (gate == x || up == x || gate == up)
            throw Error(Status::internal, "CUDA gate_up_silu: gate, up and x must be distinct buffers");
        const bf16* xb = static_cast<const bf16*>(x);
        const bool same = w_gate.rows == w_up.rows && w_gate.cols == w_up.cols && w_gate.dtype == w_up.dtype &&
                          w_gate.scale_segment_rows == w_up.scale_segment_rows;
        const bool fp8 = is_fp8(w_gate.dtype), int_quant = is_int_quant(w_gate.dtype);
        // the one-kernel path: FP8 and Q8/Q4 (a group size shared by both) when their GEMV takes the rows, bf16 when
        // its GEMV does
        bool fits = false;
        if (fp8)
            fits = (cuda::fp8_gemv_fits(xb, rows, w_gate) && cuda::fp8_gemv_fits(xb, rows, w_up)) ||
                   (cuda::wgmma_quant_fits(xb, rows, w_gate, ctx_) && cuda::wgmma_quant_fits(xb, rows, w_up, ctx_));
        else if (int_quant)
            fits = w_gate.group == w_up.group && w_gate.scale_segment_rows == 0 &&
                   ((cuda::int_gemv_fits(xb, rows, w_gate) && cuda::int_gemv_fits(xb, rows, w_up)) ||
                    (cuda::wgmma_quant_fits(xb, rows, w_gate, ctx_) && cuda::wgmma_quant_fits(xb, rows, w_up, ctx_)));
        else if (rows <= cuda::kGemvBlockMaxTokens)
            fits = cuda::gemv_fits(xb, rows, static_cast<const bf16*>(w_gate.data), w_gate.cols) &&
                   cuda::gemv_fits(xb, rows, static_cast<const bf16*>(w_up.data), w_up.cols);
        else if (cuda::gemv_wide_rows(rows, ctx_))  // 9 to 64 rows: the tensor-core GEMV in clusters
            fits = cuda::gemv_wide_fits(xb, rows, static_cast<const bf16*>(w_gate.data), w_gate.cols, ctx_) &&
                   cuda::gemv_wide_fits(xb, rows, static_cast<const bf16*>(w_up.data), w_up.cols, ctx_);
        else if (cuda::wgmma_gemm_rows(rows, ctx_)) {  // CudaOptions::wgmma_gemm's rows: the wgmma gate/up/SiLU kernel
            if (rows > ctx_.wgmma_gate_up_max_rows) {  // (by shape: cuBLASLt streams the two wide matrices faster)
                matmul(x, rows, w_gate, gate, true);
                matmul(x, rows, w_up, up, true);
                silu_mul(gate, up, rows * w_gate.rows, act);
                return;
            }
            fits = cuda::wgmma_gemm_fits(xb, rows, static_cast<const bf16*>(w_gate.data), w_gate.cols, ctx_) &&
                   cuda::wgmma_gemm_fits(xb, rows, static_cast<const bf16*>(w_up.data), w_up.cols, ctx_);
        } else  // 3 to 16 rows: the tensor-core gate/up/SiLU GEMV when every bf16 matrix goes to the tensor-core GEMV
            fits = tc_all(rows) &&
                   cuda::gemv_group_fits(xb, rows, static_cast<const bf16*>(w_gate.data), w_gate.cols, 2, true) &&
                   cuda::gemv_group_fits(xb, rows, static_cast<const bf16*>(w_up.data), w_up.cols, 2, true);
        if (same && int_quant && !fits && w_gate.group == w_up.group) {
            // Q8/Q4, more rows: the two as one group (dequantized), then silu_mul
            const Projection pair[2] = {{w_gate, gate}, {w_up, up}};
            matmul_group(x, rows, pair, 2);
            silu_mul(gate, up, rows * w_gate.rows, act);
            return;
        }
        if (same && fits) {
            Op op;
            op.kind = fp8 || int_quant ? Op::Kind::gate_up_quant : Op::Kind::gate_up;
            op.x = x;
            op.m = w_gate;
            op.m2 = w_up;
            op.y = gate;
            op.y2 = up;
            op.y3 = act;
            op.n = rows;
            submit(op);
            return;
        }
        matmul(x, rows, w_gate, gate);
        matmul(x, rows, w_up, up);
        silu_mul(gate, up, rows * w_gate.rows, act);
    }
    // The router's logits through matmul() (the GEMV for 1-2 rows, else cuBLASLt; bf16 as transformers' linear),
    // then one top-k kernel (cuda::moe_top_k: softmax and the choice on the device).
    void moe_route(const void* x, int64_t rows, const Matrix& router, int k, bool normalize, float* weights,
                   int32_t* ids) override {
        require_bf16(router, "MoE router");
        cuda::check_moe_route(int(router.rows), k);
        if (size_t(rows) * size_t(router.rows) > scratch_a_elems_)
            throw Error(Status::internal, "CUDA MoE router: workspace too small");
        matmul(x, rows, router, scratch_a_);  // [rows, E]
        Op op;
        op.kind = Op::Kind::moe_route;
        op.x = scratch_a_;
        op.n = rows;
        op.dim = k;
        op.n2 = router.rows;
        op.flag = normalize;
        op.y = weights;
        op.y2 = ids;
        submit(op);
    }
    // Two kernels (cuda::moe_experts: the chosen experts' gate/up/SiLU, then down_proj and the weighted sum).
    // Decode-sized rows: two kernels, the shared expert inside them (cuda::moe_experts' fused path). Else the
    // routed experts' kernels, then the shared expert as gate_up_silu, matmul and add_sigmoid_gated in the MoE
    // slot buffer (free again once the routed experts' combine has run): gate|up [rows, 2 Is], output [rows, H].
    void moe_experts(const void* x, int64_t rows, const MoeExperts& ex, const SharedExpert& shared,
                     const float* weights, const int32_t* ids, int k, void* y) override {
        if (!cuda::moe_experts_take(ex.gate_up, ex.down))
            throw Error(Status::unsupported, std::string("CUDA MoE experts: gate_up ") + dtype_name(ex.gate_up.dtype) +
                                                 ", down " + dtype_name(ex.down.dtype) +
                                                 " (supported: both BF16, one FP8 type, Q8 or Q4)");
        const int H = int(ex.gate_up.cols);
        const int64_t Is = shared.gate_proj.rows;
        if (Is > 0) {
            require_matrix(shared.gate_proj, "shared expert", true);
            require_matrix(shared.up_proj, "shared expert", true);
            require_matrix(shared.down_proj, "shared expert", true);
            require_bf16(shared.gate, "shared expert gate");
        }
        // The per-row kernels take a shared expert of bf16 or of the routed experts' type (FP8: one scale segment a
        // matrix, as the loader makes them).
        const DType wt = ex.gate_up.dtype;
        auto all_of = [&](DType t) {
            return shared.gate_proj.dtype == t && shared.up_proj.dtype == t && shared.down_proj.dtype == t;
        };
        const bool shared_quantized =
            wt != DType::BF16 && all_of(wt) &&
            (!is_fp8(wt) || (shared.gate_proj.scale_segment_rows == 0 && shared.up_proj.scale_segment_rows == 0 &&
                             shared.down_proj.scale_segment_rows == 0));
        const bool fused = Is > 0 && (all_of(DType::BF16) || shared_quantized) &&
                           cuda::moe_fuses_shared(rows, H, ex.intermediate, int(Is), ctx_, wt);
        if (size_t(rows) * size_t(k) * size_t(ex.intermediate) > scratch_a_elems_ ||
            (cuda::moe_grouped(rows, H, ex.intermediate, ctx_, wt) &&
             (size_t(rows) * size_t(k) * size_t(H) > moe_slot_elems_ ||
              cuda::moe_index_ints(rows, ex.n_experts, k) > moe_index_ints_)) ||
            (Is > 0 && size_t(rows) * size_t(2 * Is + H) > moe_slot_elems_))
            throw Error(Status::internal, "CUDA MoE experts: workspace too small");
        Op op;
        op.kind = Op::Kind::moe_experts;
        op.x = x;
        op.n = rows;
        op.m = ex.gate_up;
        op.m2 = ex.down;
        op.dim = k;
        op.n2 = ex.n_experts;
        op.w = weights;
        op.x2 = ids;
        op.y = y;
        op.n3 = ex.intermediate;
        if (fused) {
            auto em = [](const Matrix& m) {
                return cuda::ExpertMatrix{m.data, m.scales, m.scale_segment_rows, int(m.group)};
            };
            op.shared = cuda::MoeShared{em(shared.gate_proj),
                                        em(shared.up_proj),
                                        em(shared.down_proj),
                                        static_cast<const bf16*>(shared.gate.data),
                                        int(Is),
                                        shared_quantized};
        }
        submit(op);
        if (Is == 0 || fused) return;
        bf16* gate = moe_slot_;
        bf16* up = gate + rows * Is;
        bf16* s = up + rows * Is;
        gate_up_silu(x, rows, shared.gate_proj, shared.up_proj, gate, up, gate);
        matmul(gate, rows, shared.down_proj, s);
        add_sigmoid_gated(y, s, x, shared.gate, rows);
    }
    // y[t] += sigmoid(x_t . gate) * s[t] (the shared expert's gated add): one kernel (cuda::add_sigmoid_gated).
    void add_sigmoid_gated(void* y, const void* s, const void* x, const Matrix& gate, int64_t rows) {
        require_bf16(gate, "shared expert gate");
        Op op;
        op.kind = Op::Kind::add_sigmoid_gated;
        op.y = y;
        op.x2 = s;
        op.x = x;
        op.m = gate;
        op.n = rows;
        submit(op);
    }
    void add(void* y, const void* x, int64_t n) override {
        Op op;
        op.kind = Op::Kind::add;
        op.y = y;
        op.x = x;
        op.n = n;
        submit(op);
    }
    void silu_mul(const void* gate, const void* up, int64_t n, void* y) override {
        Op op;
        op.kind = Op::Kind::silu_mul;
        op.x = gate;
        op.x2 = up;
        op.n = n;
        op.y = y;
        submit(op);
    }
    void attention(const AttentionArgs& args) override {
        const size_t need = size_t(rows_.n_rows) * size_t(args.n_heads) * size_t(args.head_dim);
        if (need > scratch_a_elems_ || cuda::attention_split_floats(args.n_heads, args.head_dim) > split_floats_)
            throw Error(Status::internal, "CUDA attention: workspace too small");
        Op op;
        op.kind = Op::Kind::attention;
        op.attn = args;
        op.rows = rows_;
        submit(op);
    }
    void gated_delta_net(const GatedDeltaNetArgs& args) override {
        const size_t C = 2 * size_t(args.n_k_heads) * size_t(args.k_dim) + size_t(args.n_v_heads) * size_t(args.v_dim);
        const size_t T = size_t(rows_.n_rows);
        if (T * C > scratch_a_elems_) throw Error(Status::internal, "CUDA Gated DeltaNet: workspace too small");
        Op op;
        op.kind = Op::Kind::gated_delta_net;
        op.gdn = args;
        op.rows = rows_;
        submit(op);
    }
    void gather_rows(const void* x, int64_t dim, const int32_t* rows, int n, void* y) override {
        if (n <= 0) return;
        if (n > limits_.max_tokens) throw Error(Status::invalid_argument, "CUDA gather_rows: too many rows");
        if (x == y) {  // in place: only valid when the rows are already in place
            for (int i = 0; i < n; i++)
                if (rows[i] != i)
                    throw Error(Status::invalid_argument, "CUDA gather_rows: overlapping in-place gather");
            return;
        }
        wait_staging();
        int32_t* h = static_cast<int32_t*>(staging_) + 4 * size_t(limits_.max_tokens);
        std::memcpy(h, rows, size_t(n) * 4);
        if (!recording_) {  // (a recorded step's begin_batch copy, run when the graph runs, carries them)
            Op c;
            c.kind = Op::Kind::copy_h2d;
            c.x = h;
            c.y = d_gather_;
            c.n = int64_t(n) * 4;
            submit(c);
            HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        }
        Op op;
        op.kind = Op::Kind::gather_rows;
        op.x = x;
        op.dim = dim;
        op.n = n;
        op.y = y;
        submit(op);
    }
    void logits(const void* x, int n, const Matrix& w, float* out) override {
        require_matrix(w, "output matrix", true);
        Op op;
        op.kind = Op::Kind::logits;
        op.x = x;
        op.n = n;
        op.m = w;
        op.y = out;
        submit(op);
    }

    void argmax_rows(const float* logits, int n, int row_len, int n_valid, TokenPick* picks) override {
        if (n > limits_.max_tokens) throw Error(Status::invalid_argument, "CUDA argmax_rows: too many rows");
        Op op;
        op.kind = Op::Kind::argmax;
        op.x = logits;
        op.n = n;
        op.dim = row_len;
        op.n2 = n_valid;
        op.y = picks;
        submit(op);
    }

private:
    static constexpr int kGraphMaxTokens = 16;  // steps of at most this many rows (or all decode) are graphs
    static constexpr size_t kMaxRecordedOps = 4096;

    // Runs the op now, or appends it to the recorded step.
    void submit(const Op& op) {
        if (!recording_) {
            last_graph_ = nullptr;  // the work on the stream is no longer just the last recorded step
            exec(op);
            return;
        }
        if (ops_.size() == kMaxRecordedOps) {  // an unusually long step: run what was recorded, go on eagerly
            last_graph_ = nullptr;
            for (const Op& o : ops_) exec(o);
            ops_.clear();
            sig_.clear();
            recording_ = false;
            HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
            exec(op);
            return;
        }
        ops_.push_back(op);
        sign(op, sig_);
    }

    // Ends a recorded step: launches its graph (capturing the recorded ops on the first occurrence).
    void flush() {
        if (!recording_) return;
        recording_ = false;
        if (!ops_.empty()) {
            cudaGraphExec_t g = graphs_.find(sig_);
            if (!g) {
#if defined(HY_CUDA_TRACE)
                std::vector<cuda::LaunchRecord> names;  // the captured launches, for the trace
                g = graphs_.capture(sig_, stream_, [&] {
                    const cuda::LaunchLogTo to_names(&names);
                    for (const Op& o : ops_) exec(o);
                });
                if (trace_.start) graph_launches_[g] = std::move(names);
#else
                g = graphs_.capture(sig_, stream_, [&] {
                    for (const Op& o : ops_) exec(o);
                });
#endif
            }
            const cudaError_t e = launch_graph(g);
            last_graph_ = e == cudaSuccess ? g : nullptr;
            last_rows_ = rows_.n_rows;
            last_runs_.assign(recorded_runs_.begin(), recorded_runs_.end());
            ops_.clear();
            sig_.clear();
            cuda::check(e, "cudaGraphLaunch");
        }
        HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
    }

    void exec(const Op& op) {
        using K = Op::Kind;
        switch (op.kind) {
            case K::copy_h2d:
                HY_CUDA_CHECK(cudaMemcpyAsync(op.y, op.x, size_t(op.n), cudaMemcpyHostToDevice, stream_));
                return;
            case K::embed:
                cuda::embed(static_cast<const bf16*>(op.m.data), op.m.cols, d_tokens_, int(op.n),
                            static_cast<bf16*>(op.y), ctx_);
                return;
            case K::rms_norm:
                cuda::rms_norm(static_cast<const bf16*>(op.x), op.w, op.n, int(op.dim), op.eps, op.flag,
                               static_cast<bf16*>(op.y), ctx_);
                return;
            case K::matmul:
            case K::logits:
                if (op.kind == K::matmul && (is_fp8(op.m.dtype) || is_int_quant(op.m.dtype)) &&
                    cuda::wgmma_quant_fits(static_cast<const bf16*>(op.x), op.n, op.m, ctx_)) {
                    cuda::Fp8Group g;
                    g.add(op.m, op.y);
                    cuda::wgmma_gemm_quant_group(static_cast<const bf16*>(op.x), op.n, g, op.m.cols, op.m.dtype,
                                                 op.m.group, ctx_, ctx_.wgmma_gemm_parts);
                    return;
                }
                if (is_fp8(op.m.dtype)) {
                    cuda::matmul_fp8(*gemm_, static_cast<const bf16*>(op.x), op.n, op.m, op.y, op.kind == K::logits,
                                     fp8_mode_, fp8_scratch_, ctx_);
                    return;
                }
                if (is_int_quant(op.m.dtype)) {
                    cuda::matmul_int(*gemm_, static_cast<const bf16*>(op.x), op.n, op.m, op.y, op.kind == K::logits,
                                     fp8_scratch_, ctx_);
                    return;
                }
                if (op.kind == K::matmul && op.flag) {  // (not the wgmma GEMM)
                    cuda::LaunchContext c = ctx_;
                    c.wgmma_gemm_max_rows = 0;
                    cuda::matmul(*gemm_, static_cast<const bf16*>(op.x), op.n, static_cast<const bf16*>(op.m.data),
                                 op.m.rows, op.m.cols, op.y, false, c);
                    return;
                }
                cuda::matmul(*gemm_, static_cast<const bf16*>(op.x), op.n, static_cast<const bf16*>(op.m.data),
                             op.m.rows, op.m.cols, op.y, op.kind == K::logits, ctx_);
                return;
            case K::add: cuda::add(static_cast<bf16*>(op.y), static_cast<const bf16*>(op.x), op.n, ctx_); return;
            case K::silu_mul:
                cuda::silu_mul(static_cast<const bf16*>(op.x), static_cast<const bf16*>(op.x2), op.n,
                               static_cast<bf16*>(op.y), ctx_);
                return;
            case K::attention: cuda::attention(op.attn, op.rows, scratch_a_, split_scratch_, ctx_); return;
            case K::gated_delta_net: cuda::gated_delta_net(op.gdn, op.rows, scratch_a_, ctx_); return;
            case K::gather_rows:
                cuda::gather_rows(static_cast<const bf16*>(op.x), op.dim, d_gather_, int(op.n),
                                  static_cast<bf16*>(op.y), ctx_);
                return;
            case K::argmax:
                cuda::argmax_rows(static_cast<const float*>(op.x), int(op.n), int(op.dim), int(op.n2),
                                  static_cast<TokenPick*>(op.y), argmax_scratch_, ctx_);
                return;
            case K::gemv_group:
                cuda::gemv_group(static_cast<const bf16*>(op.x), op.n, op.group, op.dim, false, ctx_);
                return;
            case K::gemv_quant_group:
                if (cuda::wgmma_quant_rows(op.n, ctx_))  // (9+ rows: matmul_group took them for the quantized wgmma)
                    cuda::wgmma_gemm_quant_group(static_cast<const bf16*>(op.x), op.n, op.fp8, op.dim, op.m.dtype,
                                                 op.m.group, ctx_, ctx_.wgmma_gemm_parts);
                else if (is_int_quant(op.m.dtype))
                    cuda::gemv_int_group(static_cast<const bf16*>(op.x), op.n, op.fp8, op.dim, op.m.dtype, op.m.group,
                                         ctx_);
                else
                    cuda::gemv_fp8_group(static_cast<const bf16*>(op.x), op.n, op.fp8, op.dim, op.m.dtype, ctx_);
                return;
            case K::gate_up_quant:
                if (cuda::wgmma_quant_rows(op.n, ctx_))
                    return cuda::wgmma_gate_up_quant(static_cast<const bf16*>(op.x), op.n, op.m, op.m2,
                                                     static_cast<bf16*>(op.y), static_cast<bf16*>(op.y2),
                                                     static_cast<bf16*>(op.y3), ctx_, ctx_.wgmma_gemm_parts);
                if (is_int_quant(op.m.dtype))
                    return cuda::gemv_int_gate_up(static_cast<const bf16*>(op.x), op.n, op.m, op.m2,
                                                  static_cast<bf16*>(op.y), static_cast<bf16*>(op.y2),
                                                  static_cast<bf16*>(op.y3), ctx_);
                cuda::gemv_fp8_gate_up(static_cast<const bf16*>(op.x), op.n, op.m, op.m2, static_cast<bf16*>(op.y),
                                       static_cast<bf16*>(op.y2), static_cast<bf16*>(op.y3), ctx_);
                return;
            case K::gate_up:
                cuda::gemv_gate_up(static_cast<const bf16*>(op.x), op.n, static_cast<const bf16*>(op.m.data),
                                   static_cast<const bf16*>(op.m2.data), op.m.rows, op.m.cols, static_cast<bf16*>(op.y),
                                   static_cast<bf16*>(op.y2), static_cast<bf16*>(op.y3), ctx_);
                return;
            case K::moe_route:
                cuda::moe_top_k(static_cast<const bf16*>(op.x), op.n, int(op.n2), int(op.dim), op.flag,
                                static_cast<float*>(op.y), static_cast<int32_t*>(op.y2), ctx_);
                return;
            case K::moe_experts: {
                MoeExperts ex;
                ex.gate_up = op.m;
                ex.down = op.m2;
                ex.n_experts = int(op.n2);
                ex.intermediate = int(op.n3);
                cuda::MoeScratch scratch;
                scratch.act = scratch_a_;
                scratch.y_slot = moe_slot_;
                scratch.index = moe_index_;
                // the fused shared expert's activation [rows, Is] and gates [rows] (fp32 aligned) in the slot buffer
                scratch.shared_act = moe_slot_;
                scratch.shared_gate = reinterpret_cast<float*>(moe_slot_ + (op.n * op.shared.Is + 1) / 2 * 2);
                cuda::moe_experts(
                    static_cast<const bf16*>(op.x), op.n, ex, int(op.m.cols), op.w, static_cast<const int32_t*>(op.x2),
                    int(op.dim), op.shared.gate_proj.w ? &op.shared : nullptr, scratch, static_cast<bf16*>(op.y), ctx_);
                return;
            }
            case K::add_sigmoid_gated:
                cuda::add_sigmoid_gated(static_cast<bf16*>(op.y), static_cast<const bf16*>(op.x2),
                                        static_cast<const bf16*>(op.x), static_cast<const bf16*>(op.m.data), op.n,
                                        int(op.m.cols), ctx_);
                return;
            case K::add_rms_norm:
                cuda::add_rms_norm(static_cast<bf16*>(op.y), static_cast<const bf16*>(op.x2), op.w, op.n, int(op.dim),
                                   op.eps, op.flag, static_cast<bf16*>(op.y2), ctx_);
                return;
        }
    }

    // Launches graph g on the stream (when tracing, its captured launches go to the trace log first).
    cudaError_t launch_graph(cudaGraphExec_t g) {
#if defined(HY_CUDA_TRACE)
        if (trace_.start) {
            const std::vector<cuda::LaunchRecord>& names = graph_launches_[g];
            trace_log_.insert(trace_log_.end(), names.begin(), names.end());
        }
#endif
        return cudaGraphLaunch(g, stream_);
    }

    void wait_staging() { HY_CUDA_CHECK(cudaEventSynchronize(staging_done_)); }
    // Writes the row map of b (token ids, slot, position and index in run per row; the runs) into the staging
    // buffer; the caller has waited for its previous use (wait_staging).
    void fill_staging(const BatchDesc& b) {
        const size_t T = size_t(limits_.max_tokens);
        int32_t* h = static_cast<int32_t*>(staging_);
        int32_t *tok = h, *slot = h + T, *pos = h + 2 * T, *in_run = h + 3 * T;
        std::memcpy(tok, b.token_ids, size_t(b.n_tokens) * 4);
        for (int r = 0; r < b.n_runs; r++) {
            const SeqRun& run = b.runs[r];
            for (int i = 0; i < run.n_tokens; i++) {
                slot[run.row + i] = run.slot;
                pos[run.row + i] = run.pos + i;
                in_run[run.row + i] = i;
            }
        }
        std::memcpy(h + 5 * T, b.runs, size_t(b.n_runs) * sizeof(SeqRun));
    }

#if defined(HY_CUDA_TRACE)
    // CudaOptions::trace_file (builds with HY_CUDA_TRACE; timing studies): every kernel's start and ready stamps
    // (cuda_common.cuh) and the host's list of launches in the order the GPU runs them (eager launches, and each
    // graph's captured list per replay); written to FILE when the backend is destroyed, one line per kernel: index,
    // description, start and ready in ns. tools/gpu/trace_summary.py turns it into per-kernel costs.
    void start_trace(const std::string& file) {
        constexpr unsigned kCap = 1u << 21;
        trace_file_ = file;
        HY_CUDA_CHECK(cudaMalloc(&trace_.start, size_t(kCap) * 8));
        HY_CUDA_CHECK(cudaMalloc(&trace_.ready, size_t(kCap) * 8));
        HY_CUDA_CHECK(cudaMalloc(&trace_.count, 8));
        HY_CUDA_CHECK(cudaMemset(trace_.count, 0, 8));
        trace_.cap = kCap;
        cuda::trace_bind_all(trace_);
        trace_log_.reserve(kCap);
        cuda::launch_log() = &trace_log_;
    }
    void finish_trace() {
        if (!trace_.start) return;
        cuda::launch_log() = nullptr;
        unsigned count[2] = {0, 0};
        cudaMemcpy(count, trace_.count, 8, cudaMemcpyDeviceToHost);
        const size_t n = std::min<size_t>({count[0], count[1], trace_.cap});
        std::vector<unsigned long long> start(n), ready(n);
        cudaMemcpy(start.data(), trace_.start, n * 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(ready.data(), trace_.ready, n * 8, cudaMemcpyDeviceToHost);
        if (FILE* f = std::fopen(trace_file_.c_str(), "w")) {
            std::fprintf(f,
                         "# hybrid CUDA trace: %u kernels started, %u passed their wait, %zu launches logged\n"
                         "# index\tkernel\tblocks\tthreads\tstart_ns\tready_ns\n",
                         count[0], count[1], trace_log_.size());
            for (size_t i = 0; i < n; i++) {
                const cuda::LaunchRecord r = i < trace_log_.size() ? trace_log_[i] : cuda::LaunchRecord{"?", 0, 0};
                std::fprintf(f, "%zu\t%s\t%u\t%u\t%llu\t%llu\n", i, r.what, r.blocks, r.threads, start[i], ready[i]);
            }
            std::fclose(f);
        } else {
            std::fprintf(stderr, "hybrid: CUDA trace: cannot write %s\n", trace_file_.c_str());  // (a destructor)
        }
        const cuda::TraceBuf none{};
        cuda::trace_bind_all(none);
        cudaFree(trace_.start);
        cudaFree(trace_.ready);
        cudaFree(trace_.count);
        trace_ = none;
    }
#endif
    static void require_bf16(const Matrix& m, const char* what) {
        if (m.dtype != DType::BF16)
            throw Error(Status::internal,
                        std::string("CUDA backend: ") + what + " is " + dtype_name(m.dtype) + ", expected BF16");
    }
    // bf16, or FP8 with scales; also Q8/Q4 with scales and a valid group where int_ok (the ops that take them).
    static void require_matrix(const Matrix& m, const char* what, bool int_ok = false) {
        if (is_fp8(m.dtype) && m.scales) return;
        if (int_ok && is_int_quant(m.dtype) && m.scales && int_quant_shape_ok(m.cols, m.group)) return;
        require_bf16(m, what);
    }

    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t staging_done_ = nullptr;  // recorded after the last use of the staging buffer was enqueued
    std::unique_ptr<cuda::Gemm> gemm_;
    BatchLimits limits_{};
    char* ws_ = nullptr;
    void* staging_ = nullptr;  // pinned host: tokens, slot, pos, in_run, gather rows [max_tokens] each, runs
    static constexpr size_t kBounceBytes = size_t(64) << 10;
    void* bounce_ = nullptr;  // pinned host, for downloads of at most kBounceBytes (made on first use)
    int32_t *d_tokens_ = nullptr, *d_slot_ = nullptr, *d_pos_ = nullptr, *d_in_run_ = nullptr, *d_gather_ = nullptr;
    SeqRun* d_runs_ = nullptr;
    bf16* scratch_a_ = nullptr;
    float* split_scratch_ = nullptr;   // attention partials of decode steps split over positions
    float* argmax_scratch_ = nullptr;  // argmax_rows partials
    bf16* moe_slot_ = nullptr;         // MoE grouped outputs [T * k, H]
    int32_t* moe_index_ = nullptr;     // MoE grouping index
    mutable size_t scratch_a_elems_ = 0, split_floats_ = 0;
    mutable size_t moe_slot_elems_ = 0, moe_index_ints_ = 0;   // MoE models (workspace_bytes)
    mutable size_t fp8_act_bytes_ = 0, fp8_weight_elems_ = 0;  // FP8 matrices (workspace_bytes)
    mutable size_t stream_k_ws_blocks_ = 0;  // stream-K partials the workspace holds (workspace_bytes)
    cuda::Fp8Scratch fp8_scratch_;
    cuda::Fp8GemmMode fp8_mode_ = cuda::Fp8GemmMode::dequantize;
    cuda::RowMap rows_{};
    cuda::LaunchContext ctx_;  // the stream and launch settings every kernel launcher gets
    // CUDA graph replay of small steps (CudaOptions::graphs).
    bool graphs_enabled_ = true;
    bool recording_ = false;
    std::vector<Op> ops_;        // the step being recorded (capacity reserved once)
    std::vector<uint64_t> sig_;  // the recorded step's signature
    cuda::GraphCache graphs_;
    // repeat_step(): the graph launched last, if nothing ran on the stream after it, and its step's shape
    cudaGraphExec_t last_graph_ = nullptr;
    int last_rows_ = 0;
    std::vector<int32_t> last_runs_, recorded_runs_;  // rows per run (capacity reserved in set_workspace)
#if defined(HY_CUDA_TRACE)
    cuda::TraceBuf trace_{};
    std::string trace_file_;
    std::vector<cuda::LaunchRecord> trace_log_;
    std::unordered_map<cudaGraphExec_t, std::vector<cuda::LaunchRecord>> graph_launches_;
#endif
};

}  // namespace

bool cuda_available() {
    try {
        check_device(0);
        return true;
    } catch (const Error&) {
        return false;
    }
}

std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options) {
    return std::make_unique<CudaBackend>(device, options);
}

}  // namespace hy
