// The CUDA backend: bf16 activations, KV cache and conv state; bf16 weight matrices; fp32 recurrent state.
//
// The backend owns its stream, its cuBLASLt handle and a small pinned host staging buffer for the per-batch row
// map; all device memory is the one arena from alloc(), the backend's scratch being the workspace piece of it.
// Ops are enqueued on the stream and return at once; download() and synchronize() wait.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/embed.cuh"
#include "kernels/cuda/gated_delta_net.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/norm.cuh"

#ifndef HY_CUDA_ARCHITECTURES
#define HY_CUDA_ARCHITECTURES "unknown"
#endif

namespace hy {

namespace {

using cuda::bf16;

__global__ void probe_kernel() {}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Throws unless `device` exists and this build has machine code for it.
void check_device(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        throw Error(Status::backend, std::string("no usable CUDA GPU (cudaGetDeviceCount: ") +
                                         (e != cudaSuccess ? cudaGetErrorString(e) : "no device found") + ")");
    if (device < 0 || device >= n)
        throw Error(Status::backend, "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                                         " present)");
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
                                         std::to_string(prop.minor) + "); it was built for CMAKE_CUDA_ARCHITECTURES=" +
                                         HY_CUDA_ARCHITECTURES + ": rebuild with -DCMAKE_CUDA_ARCHITECTURES=" +
                                         std::to_string(prop.major) + std::to_string(prop.minor));
    }
}

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int device) : device_(device) {
        check_device(device);
        HY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        HY_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming));
        gemm_ = std::make_unique<cuda::Gemm>();
    }
    ~CudaBackend() override {
        if (stream_) cudaStreamSynchronize(stream_);
        gemm_.reset();
        if (staging_) cudaFreeHost(staging_);
        if (staging_done_) cudaEventDestroy(staging_done_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    const char* name() const override { return "cuda"; }
    DType act_dtype() const override { return DType::BF16; }
    DType matrix_dtype(DType) const override { return DType::BF16; }

    void* alloc(size_t bytes) override {
        HY_CUDA_CHECK(cudaSetDevice(device_));
        void* p = nullptr;
        cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            throw Error(Status::out_of_memory, "cannot allocate the model arena of " + std::to_string(bytes >> 20) +
                                                   " MiB on the GPU (" + std::to_string(free_b >> 20) + " MiB free of " +
                                                   std::to_string(total_b >> 20) + "): " + cudaGetErrorString(e));
        }
        return p;
    }
    void free(void* p) override {
        if (stream_) cudaStreamSynchronize(stream_);
        cudaFree(p);
    }
    void upload(void* dst, const void* src, size_t bytes) override {
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        HY_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may reuse src at once
    }
    void download(void* dst, const void* src, size_t bytes) override {
        HY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        HY_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void fill_zero(void* dst, size_t bytes) override { HY_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_)); }
    void synchronize() override { HY_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    // Device-to-device copies of 1 GiB (bytes read + written per second), best of 5 after a warm-up; the buffers
    // are temporary allocations outside the arena (tools only).
    double copy_bandwidth_gbs() override {
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
                if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0)
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
    // bf16 scratch A [T, 4 * heads * head_dim] (attention q [T, Hq, D] or GDN mixed [T, C]) | bf16 scratch B
    // [T, heads * head_dim] (GDN o).
    size_t workspace_bytes(const BatchLimits& l, int max_heads, int max_head_dim) const override {
        const Layout w = layout(l, max_heads, max_head_dim);
        return w.total;
    }
    void set_workspace(void* ws, const BatchLimits& l) override {
        // The model asks workspace_bytes() with its own head counts; the layout must match, so it is recomputed
        // from the sizes the scratch needs and checked against the bytes recorded then.
        limits_ = l;
        ws_ = static_cast<char*>(ws);
        gemm_->set_workspace(ws_);
        const size_t T = size_t(l.max_tokens), R = size_t(std::max(l.max_runs, 1));
        staging_bytes_ = 5 * T * 4 + R * sizeof(SeqRun);
        if (staging_) cudaFreeHost(staging_);
        staging_ = nullptr;
        HY_CUDA_CHECK(cudaMallocHost(&staging_, staging_bytes_));
        char* d = ws_ + align256(cuda::Gemm::kWorkspaceBytes);
        d_tokens_ = reinterpret_cast<int32_t*>(d);
        d_slot_ = d_tokens_ + T;
        d_pos_ = d_slot_ + T;
        d_in_run_ = d_pos_ + T;
        d_gather_ = d_in_run_ + T;
        d_runs_ = reinterpret_cast<SeqRun*>(d_gather_ + T);
        scratch_a_ = reinterpret_cast<bf16*>(d + align256(5 * T * 4 + R * sizeof(SeqRun)));
        // scratch B follows scratch A; its offset is fixed by the element count chosen in workspace_bytes().
        scratch_b_ = scratch_a_ + scratch_a_elems_;
    }

    void begin_batch(const BatchDesc& b) override {
        if (!staging_) throw Error(Status::internal, "CUDA backend: begin_batch before set_workspace");
        if (b.n_tokens > limits_.max_tokens || b.n_runs > std::max(limits_.max_runs, 1))
            throw Error(Status::invalid_argument, "CUDA backend: batch of " + std::to_string(b.n_tokens) + " rows and " +
                                                      std::to_string(b.n_runs) + " runs exceeds the load-time limits");
        wait_staging();
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
        SeqRun* runs = reinterpret_cast<SeqRun*>(h + 5 * T);
        std::memcpy(runs, b.runs, size_t(b.n_runs) * sizeof(SeqRun));
        // One copy of the four row arrays (the gather slot in between is unused here) and one of the runs.
        HY_CUDA_CHECK(cudaMemcpyAsync(d_tokens_, h, 4 * T * 4, cudaMemcpyHostToDevice, stream_));
        HY_CUDA_CHECK(cudaMemcpyAsync(d_runs_, runs, size_t(b.n_runs) * sizeof(SeqRun), cudaMemcpyHostToDevice, stream_));
        HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        rows_ = cuda::RowMap{d_slot_, d_pos_, d_in_run_, d_runs_, b.n_tokens, b.n_runs};
    }

    void embed(const Matrix& table, void* x) override {
        require_bf16(table, "embedding table");
        cuda::embed(static_cast<const bf16*>(table.data), table.cols, d_tokens_, rows_.n_rows, static_cast<bf16*>(x),
                    stream_);
    }
    void rms_norm(const void* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred, void* y) override {
        cuda::rms_norm(static_cast<const bf16*>(x), w, rows, dim, eps, zero_centred, static_cast<bf16*>(y), stream_);
    }
    void matmul(const void* x, int64_t rows, const Matrix& w, void* y) override {
        require_bf16(w, "weight matrix");
        cuda::matmul(*gemm_, static_cast<const bf16*>(x), rows, static_cast<const bf16*>(w.data), w.rows, w.cols, y,
                     false, stream_);
    }
    void add(void* y, const void* x, int64_t n) override {
        cuda::add(static_cast<bf16*>(y), static_cast<const bf16*>(x), n, stream_);
    }
    void silu_mul(const void* gate, const void* up, int64_t n, void* y) override {
        cuda::silu_mul(static_cast<const bf16*>(gate), static_cast<const bf16*>(up), n, static_cast<bf16*>(y), stream_);
    }
    void attention(const AttentionArgs& args) override {
        const size_t need = size_t(rows_.n_rows) * size_t(args.n_heads) * size_t(args.head_dim);
        if (need > scratch_a_elems_) throw Error(Status::internal, "CUDA attention: workspace too small for q");
        cuda::attention(args, rows_, scratch_a_, stream_);
    }
    void gated_delta_net(const GatedDeltaNetArgs& args) override {
        const size_t C = 2 * size_t(args.n_k_heads) * size_t(args.k_dim) + size_t(args.n_v_heads) * size_t(args.v_dim);
        const size_t T = size_t(rows_.n_rows);
        if (T * C > scratch_a_elems_ || T * size_t(args.n_v_heads) * size_t(args.v_dim) > scratch_b_elems_)
            throw Error(Status::internal, "CUDA Gated DeltaNet: workspace too small");
        cuda::gated_delta_net(args, rows_, scratch_a_, scratch_b_, stream_);
    }
    void gather_rows(const void* x, int64_t dim, const int32_t* rows, int n, void* y) override {
        if (n <= 0) return;
        if (n > limits_.max_tokens) throw Error(Status::invalid_argument, "CUDA gather_rows: too many rows");
        wait_staging();
        int32_t* h = static_cast<int32_t*>(staging_) + 4 * size_t(limits_.max_tokens);
        std::memcpy(h, rows, size_t(n) * 4);
        HY_CUDA_CHECK(cudaMemcpyAsync(d_gather_, h, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
        HY_CUDA_CHECK(cudaEventRecord(staging_done_, stream_));
        if (x == y) {  // in place: only valid when the rows are already in place
            for (int i = 0; i < n; i++)
                if (rows[i] != i) throw Error(Status::invalid_argument, "CUDA gather_rows: overlapping in-place gather");
            return;
        }
        cuda::gather_rows(static_cast<const bf16*>(x), dim, d_gather_, n, static_cast<bf16*>(y), stream_);
    }
    void logits(const void* x, int n, const Matrix& w, float* out) override {
        require_bf16(w, "output matrix");
        cuda::matmul(*gemm_, static_cast<const bf16*>(x), n, static_cast<const bf16*>(w.data), w.rows, w.cols, out,
                     true, stream_);
    }

private:
    struct Layout {
        size_t total = 0;
    };
    // Sizes scratch A and B for the limits and records their element counts (workspace_bytes() is const, so the
    // counts are mutable members; set_workspace() uses them).
    Layout layout(const BatchLimits& l, int max_heads, int max_head_dim) const {
        const size_t T = size_t(std::max(l.max_tokens, 1)), R = size_t(std::max(l.max_runs, 1));
        const size_t hd = size_t(std::max(max_heads, 1)) * size_t(std::max(max_head_dim, 1));
        scratch_a_elems_ = T * 4 * hd;  // >= Hq * D and >= C = 2 Hk Dk + Hv Dv <= 3 Hv Dv
        scratch_b_elems_ = T * hd;
        Layout w;
        w.total = align256(cuda::Gemm::kWorkspaceBytes) + align256(5 * T * 4 + R * sizeof(SeqRun)) +
                  align256(scratch_a_elems_ * 2) + align256(scratch_b_elems_ * 2);
        scratch_a_elems_ = align256(scratch_a_elems_ * 2) / 2;
        return w;
    }
    void wait_staging() { HY_CUDA_CHECK(cudaEventSynchronize(staging_done_)); }
    static void require_bf16(const Matrix& m, const char* what) {
        if (m.dtype != DType::BF16)
            throw Error(Status::internal, std::string("CUDA backend: ") + what + " is " + dtype_name(m.dtype) +
                                              ", expected BF16");
    }

    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t staging_done_ = nullptr;
    std::unique_ptr<cuda::Gemm> gemm_;
    BatchLimits limits_{};
    char* ws_ = nullptr;
    void* staging_ = nullptr;  // pinned host: tokens, slot, pos, in_run, gather rows [max_tokens] each, runs
    size_t staging_bytes_ = 0;
    int32_t *d_tokens_ = nullptr, *d_slot_ = nullptr, *d_pos_ = nullptr, *d_in_run_ = nullptr, *d_gather_ = nullptr;
    SeqRun* d_runs_ = nullptr;
    bf16 *scratch_a_ = nullptr, *scratch_b_ = nullptr;
    mutable size_t scratch_a_elems_ = 0, scratch_b_elems_ = 0;
    cuda::RowMap rows_{};
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

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace hy
