// The CPU backend: host memory, F32 activations, its own thread pool (thread_pool.h). The reference implementation:
// the fused ops (add_rms_norm, matmul_group, gate_up_silu) are the plain ops in sequence.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "base/softmax.h"
#include "kernels/cpu/cpu_ops.h"

namespace hy {

namespace {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n_threads) : pool_(n_threads) {}

    const char* name() const override { return "cpu"; }
    int host_threads() const override { return pool_.size(); }
    std::string device_name() const override {
        return "CPU, " + std::to_string(pool_.size()) + (pool_.size() == 1 ? " thread" : " threads");
    }
    DType act_dtype() const override { return DType::F32; }
    DType matrix_dtype(DType checkpoint) const override { return checkpoint; }

    // An anonymous mapping: zeroed, and its pages become resident only when written (a KV cache that no sequence
    // reaches costs nothing). 2 MiB alignment and transparent huge pages: the decode loop streams every weight once
    // per token, and huge pages spare it a TLB miss every 4 KiB.
    void* alloc(size_t bytes) override {
        constexpr size_t kHuge = size_t(2) << 20;
        const size_t n = std::max(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
        void* raw = ::mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED)
            throw Error(Status::out_of_memory,
                        "cannot allocate the model arena of " + std::to_string(bytes >> 20) + " MiB in host memory");
        char* const r = static_cast<char*>(raw);
        char* const p = r + (kHuge - reinterpret_cast<uintptr_t>(r) % kHuge) % kHuge;
        if (p > r) ::munmap(r, size_t(p - r));                                        // the unaligned head
        if (r + n + kHuge > p + n) ::munmap(p + n, size_t(r + n + kHuge - (p + n)));  // and the rest of the tail
        madvise(p, n, MADV_HUGEPAGE);  // advisory: ignored where unsupported
        mapped_.push_back({p, n});
        return p;
    }
    void free(void* p) override {
        for (size_t i = 0; i < mapped_.size(); i++)
            if (mapped_[i].first == p) {
                ::munmap(p, mapped_[i].second);
                mapped_.erase(mapped_.begin() + std::ptrdiff_t(i));
                return;
            }
    }
    bool alloc_zeroed() const override { return true; }
    size_t memory_capacity() const override { return host_memory_bytes(); }
    void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
    void fill_random(void* dst, size_t n, DType dtype, float lo, float hi, uint64_t seed) override {
        if (dtype != DType::F32 && dtype != DType::BF16)
            throw Error(Status::internal, std::string("fill_random: ") + dtype_name(dtype) + " is not filled");
        pool_.parallel_for(int64_t(n), 1 << 16, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; i++) {
                const float v = lo + (hi - lo) * random_unit(seed, uint64_t(i));
                if (dtype == DType::F32)
                    static_cast<float*>(dst)[i] = v;
                else
                    static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
            }
        });
    }
    void synchronize() override {}
    double copy_bandwidth_gbs() override {
        const size_t n = size_t(256) << 20;  // 256 MiB each way, far beyond the caches
        std::vector<char> a(n, 1), b(n, 2);
        double best = 0.0;
        for (int rep = 0; rep < 5; rep++) {
            const auto t0 = std::chrono::steady_clock::now();
            // Parallel copy in per-thread stripes, as the kernels read weights.
            pool_.parallel_for(64, 1, [&](int64_t p0, int64_t p1, int) {
                for (int64_t part = p0; part < p1; part++)
                    std::memcpy(b.data() + n / 64 * size_t(part), a.data() + n / 64 * size_t(part), n / 64);
            });
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::max(best, 2.0 * double(n) / dt / 1e9);
        }
        return best;
    }

    size_t workspace_bytes(const BatchLimits& l, const WorkspaceShape& s) const override {
        // The mixers: q scratch [T, Hq, D] (or GDN mixed [T, C], which is no larger than T * 4 * heads * dim),
        // scores [threads, n_ctx]. MoE layers (used at other times than the mixers' scratch): router logits [T, E],
        // then the gathered rows of one expert [T, H], its gate|up [T, 2I], activation [T, I], output [T, H] and
        // row list [T] (cpu::moe_experts); then the shared expert's gate|up [T, 2 Is], output [T, H] and gate [T].
        const size_t T = size_t(l.max_tokens);
        const size_t mixers =
            T * size_t(s.max_heads) * size_t(s.max_head_dim) * 4 * 4 + size_t(pool_.size()) * size_t(l.n_ctx) * 4;
        const size_t H = size_t(s.hidden), E = size_t(s.n_experts), I = size_t(s.moe_intermediate);
        const size_t Is = size_t(s.shared_intermediate);
        const size_t moe = E > 0 ? T * std::max({E, 2 * H + 3 * I + 1, 2 * Is + H + 1}) * 4 : 0;
        return std::max(mixers, moe);
    }
    void set_workspace(void* ws, const BatchLimits& l) override {
        limits_ = l;
        scratch_ = static_cast<float*>(ws);
        row_slot_.assign(size_t(l.max_tokens), 0);
        row_pos_.assign(size_t(l.max_tokens), 0);
    }

    void begin_batch(const BatchDesc& b) override {
        batch_ = b;
        for (int r = 0; r < b.n_runs; r++) {
            const SeqRun& run = b.runs[r];
            for (int i = 0; i < run.n_tokens; i++) {
                row_slot_[size_t(run.row + i)] = run.slot;
                row_pos_[size_t(run.row + i)] = run.pos + i;
            }
        }
    }

    void embed(const Matrix& table, void* x) override {
        float* out = static_cast<float*>(x);
        const size_t row_bytes = size_t(table.cols) * dtype_size(table.dtype);
        for (int t = 0; t < batch_.n_tokens; t++)
            convert_to_f32(static_cast<const char*>(table.data) + size_t(batch_.token_ids[t]) * row_bytes, table.dtype,
                           out + int64_t(t) * table.cols, size_t(table.cols));
    }
    void rms_norm(const void* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred,
                  void* y) override {
        cpu::rms_norm(static_cast<const float*>(x), w, rows, dim, eps, zero_centred, static_cast<float*>(y), pool_);
    }
    void add_rms_norm(void* x, const void* d, const float* w, int64_t rows, int dim, float eps, bool zero_centred,
                      void* y) override {
        add(x, d, rows * dim);
        rms_norm(x, w, rows, dim, eps, zero_centred, y);
    }
    void matmul(const void* x, int64_t rows, const Matrix& w, void* y) override {
        cpu::matmul(static_cast<const float*>(x), rows, w, static_cast<float*>(y), pool_);
    }
    void matmul_group(const void* x, int64_t rows, const Projection* p, int n) override {
        for (int i = 0; i < n; i++) matmul(x, rows, p[i].w, p[i].y);
    }
    void gate_up_silu(const void* x, int64_t rows, const Matrix& w_gate, const Matrix& w_up, void* gate, void* up,
                      void* act) override {
        matmul(x, rows, w_gate, gate);
        matmul(x, rows, w_up, up);
        silu_mul(gate, up, rows * w_gate.rows, act);
    }
    void moe_route(const void* x, int64_t rows, const Matrix& router, int k, bool normalize, float* weights,
                   int32_t* ids) override {
        const int E = int(router.rows);
        if (k < 1 || k > E) throw Error(Status::invalid_argument, "moe_route: k must lie in [1, E]");
        float* logits = scratch_;  // [rows, E]
        cpu::matmul(static_cast<const float*>(x), rows, router, logits, pool_);
        for (int64_t t = 0; t < rows; t++)
            cpu::softmax_top_k(logits + t * E, E, k, normalize, weights + t * k, ids + t * k);
    }
    // The routed experts (cpu::moe_experts), then the shared expert in the scratch the routed pass is done with:
    // gate|up [rows, Is] each, its output [rows, H] and the gate's logits [rows].
    void moe_experts(const void* x, int64_t rows, const MoeExperts& ex, const SharedExpert& shared,
                     const float* weights, const int32_t* ids, int k, void* y) override {
        const float* xx = static_cast<const float*>(x);
        float* yy = static_cast<float*>(y);
        cpu::moe_experts(xx, rows, ex, weights, ids, k, yy, scratch_, pool_);
        if (shared.gate_proj.rows == 0) return;
        const int64_t Is = shared.gate_proj.rows, H = shared.gate.cols;
        float* gate = scratch_;
        float* up = gate + rows * Is;
        float* s = up + rows * Is;
        float* g = s + rows * H;
        gate_up_silu(x, rows, shared.gate_proj, shared.up_proj, gate, up, gate);
        cpu::matmul(gate, rows, shared.down_proj, s, pool_);
        cpu::matmul(xx, rows, shared.gate, g, pool_);
        for (int64_t t = 0; t < rows; t++) {
            const float sg = 1.0f / (1.0f + std::exp(-g[t]));
            for (int64_t i = 0; i < H; i++) yy[t * H + i] += sg * s[t * H + i];
        }
    }
    void add(void* y, const void* x, int64_t n) override {
        float* yy = static_cast<float*>(y);
        const float* xx = static_cast<const float*>(x);
        for (int64_t i = 0; i < n; i++) yy[i] += xx[i];
    }
    void silu_mul(const void* gate, const void* up, int64_t n, void* y) override {
        cpu::silu_mul(static_cast<const float*>(gate), static_cast<const float*>(up), n, static_cast<float*>(y), pool_);
    }
    void attention(const AttentionArgs& args) override {
        const size_t q_floats = size_t(batch_.n_tokens) * size_t(args.n_heads) * size_t(args.head_dim);
        cpu::RowMap rows{batch_.n_tokens, row_slot_.data(), row_pos_.data()};
        cpu::attention(args, rows, scratch_, scratch_ + q_floats, pool_);
    }
    void gated_delta_net(const GatedDeltaNetArgs& args) override {
        cpu::gated_delta_net(args, batch_, scratch_, pool_);
    }
    void gather_rows(const void* x, int64_t dim, const int32_t* rows, int n, void* y) override {
        for (int i = 0; i < n; i++)
            std::memmove(static_cast<float*>(y) + int64_t(i) * dim,
                         static_cast<const float*>(x) + int64_t(rows[i]) * dim, size_t(dim) * 4);
    }
    void logits(const void* x, int n, const Matrix& w, float* out) override {
        cpu::matmul(static_cast<const float*>(x), n, w, out, pool_);
    }
    void argmax_rows(const float* logits, int n, int row_len, int n_valid, TokenPick* picks) override {
        for (int r = 0; r < n; r++) {
            const float* v = logits + int64_t(r) * row_len;
            int32_t best = -1;
            for (int i = 0; i < n_valid; i++)  // NaN and -inf never win
                if (v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
            TokenPick p;
            if (best >= 0) {  // the host sampler's own formula, so a pick's log-probability equals a sampled one's
                p.id = best;
                p.logprob = float(log_softmax_at(std::span<const float>(v, size_t(row_len)), n_valid, best));
            }
            picks[r] = p;
        }
    }

private:
    cpu::ThreadPool pool_;
    std::vector<std::pair<void*, size_t>> mapped_;  // alloc()'s mappings: start, length
    BatchLimits limits_;
    BatchDesc batch_;
    float* scratch_ = nullptr;  // the workspace: attention q [T, Hq, D] then scores [threads, n_ctx]; GDN mixed [T, C]
    std::vector<int32_t> row_slot_, row_pos_;  // [max_tokens], sized once at load
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

#ifndef HY_HAVE_CUDA
#ifndef HY_NO_CUDA_WHY  // (set by CMakeLists.txt: -DHY_CUDA=OFF, or no nvcc at configure time)
#define HY_NO_CUDA_WHY "configured without CUDA"
#endif
std::unique_ptr<Backend> make_cuda_backend(int, const CudaOptions&) {
    throw Error(Status::backend,
                "this build of hybrid has no CUDA backend: it was built without CUDA (" HY_NO_CUDA_WHY ")");
}
bool cuda_available() { return false; }
#endif

}  // namespace hy
