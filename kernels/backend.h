// The one interface the Qwen3.5 forward (model/forward.cpp) calls. Backends are peers behind it: the CPU backend
// (kernels/cpu/, fp32 arithmetic, the reference) and the CUDA backend (kernels/cuda/, bf16 activations).
//
// Memory: every pointer handed to an op points into the model's arena, which the backend itself allocated with
// alloc() (host memory for the CPU, device memory for CUDA). "act" tensors have the backend's act_dtype() (F32 on
// the CPU, BF16 on CUDA); weight matrices keep a per-matrix dtype; small parameter vectors (norm weights, A_log,
// dt_bias, conv taps) are F32. Shapes are given row-major, outermost first, as [T, H] etc.
//
// A batch is T tokens laid out as rows; it is made of runs, each a stretch of consecutive positions of one
// sequence slot (prefill of one prompt = one run of T tokens; batched decode = T runs of one token).
// Token-wise ops (matmul, norms, MLP) see only rows; the mixers (attention, Gated DeltaNet) use the runs to find
// each row's sequence state and position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/common.h"

namespace hy {

#if defined(__CUDACC__)
#define HY_HOST_DEVICE __host__ __device__
#else
#define HY_HOST_DEVICE
#endif

// A weight matrix in the arena: row-major [rows, cols]; a projection computes y = x W^T (rows = out features).
//
// FP8 matrices (dtype F8_E4M3 or F8_E5M2, as Qwen's official FP8 releases and `--quant fp8` store them): the real
// weight of element (r, c) is fp8_value(data[r, c]) * scales[fp8_scale_row(r, rows of a segment), c / 128], the
// scale of its 128 x 128 block. A stacked matrix (MoE experts: gate_up [E * 2I, H], down [E * H, I]) is made of
// segments of scale_segment_rows rows (I for gate_up, whose gate and up halves are each a segment; H for down),
// blocked independently: a segment whose rows are not a multiple of 128 ends in a short block row of its own.
//
// Integer matrices (dtype Q8 or Q4, `--quant int8` / `--quant int4`, model/quantize.h): group-wise symmetric, a scale
// per `group` consecutive weights of a row (int_quant_shape_ok: group 32 or a multiple of 64 dividing cols, cols a
// multiple of 64). The real weight of (r, c) is q(r, c) * scales[r, c / group], scales F32 [rows, cols / group]
// row-major (a scale can be negative). Q8: data int8 [rows, cols], codes in [-127, 127]. Q4: data [rows, cols / 2]
// bytes, codes in [-8, 7] stored as q + 8 in a nibble; each row is cut into chunks of kQuantChunk (64) columns held in
// 32 bytes: byte i of a chunk holds column i in its low nibble and column 32 + i in its high nibble (one 32-byte load,
// a mask and a shift give the chunk's 64 codes in order; 16-byte loads give 16 bytes of each half). Rows are
// independent, so segments (MoE experts) need nothing more: scale_segment_rows is 0.
struct Matrix {
    const void* data = nullptr;
    DType dtype = DType::BF16;
    int64_t rows = 0;
    int64_t cols = 0;
    // FP8: F32 [fp8_scale_rows(rows, scale_segment_rows), fp8_scale_cols(cols)] row-major; Q8/Q4: F32 [rows,
    // cols / group]; nullptr for 16- and 32-bit matrices.
    const float* scales = nullptr;
    int64_t scale_segment_rows = 0;  // rows of one independently blocked segment; 0: the whole matrix is one segment
    int64_t group = 0;               // Q8/Q4 only: weights of a row per scale
};

// Columns of a Q4 packing chunk (and the unit the integer kernels step by).
constexpr int64_t kQuantChunk = 64;

// The group sizes of Q8/Q4 matrices: 32 (two groups per chunk) or a multiple of 64 up to 1024 (so that a group's
// integer sum, at most 1024 * 127 * 127, is exact in f32).
inline bool int_quant_group_ok(int64_t group) {
    return group == kQuantChunk / 2 || (group >= kQuantChunk && group <= 1024 && group % kQuantChunk == 0);
}
// A Q8/Q4 matrix of `cols` columns can have groups of `group`: a valid group dividing cols, cols a multiple of 64.
inline bool int_quant_shape_ok(int64_t cols, int64_t group) {
    return int_quant_group_ok(group) && cols > 0 && cols % kQuantChunk == 0 && cols % group == 0;
}

inline bool is_int_quant(DType t) { return t == DType::Q8 || t == DType::Q4; }

// The code of column c of one Q4 row (row: the row's cols / 2 bytes), in [-8, 7].
HY_HOST_DEVICE inline int q4_code(const uint8_t* row, int64_t c) {
    const uint8_t b = row[c / kQuantChunk * (kQuantChunk / 2) + c % (kQuantChunk / 2)];
    return int(c % kQuantChunk < kQuantChunk / 2 ? b & 0x0f : b >> 4) - 8;
}

// The side of an FP8 scale block (weight_block_size [128, 128]).
constexpr int64_t kFp8Block = 128;

// The scale row of matrix row r (0 <= r < rows) of an FP8 matrix whose segments have `segment_rows` rows (0: one
// segment): (r / seg) * ceil(seg / 128) + (r % seg) / 128. The one place this index is computed: kernels, the
// loader and the quantizer all call it.
HY_HOST_DEVICE inline int64_t fp8_scale_row(int64_t r, int64_t segment_rows) {
    if (segment_rows <= 0) return r / kFp8Block;
    return r / segment_rows * ((segment_rows + kFp8Block - 1) / kFp8Block) + r % segment_rows / kFp8Block;
}
// Rows of the scale matrix of an FP8 matrix of `rows` rows (a multiple of segment_rows when that is > 0).
HY_HOST_DEVICE inline int64_t fp8_scale_rows(int64_t rows, int64_t segment_rows) {
    return rows > 0 ? fp8_scale_row(rows - 1, segment_rows) + 1 : 0;
}
// Columns of the scale matrix: ceil(cols / 128).
HY_HOST_DEVICE inline int64_t fp8_scale_cols(int64_t cols) { return (cols + kFp8Block - 1) / kFp8Block; }

inline bool is_fp8(DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2; }

// Bytes of the F32 scales of a matrix of this dtype and shape (FP8 block scales, Q8/Q4 group scales; 0 otherwise).
inline size_t matrix_scale_bytes(const Matrix& m) {
    if (is_int_quant(m.dtype)) return m.group > 0 ? size_t(m.rows * (m.cols / m.group)) * 4 : 0;
    if (is_fp8(m.dtype)) return size_t(fp8_scale_rows(m.rows, m.scale_segment_rows) * fp8_scale_cols(m.cols)) * 4;
    return 0;
}

// The bytes a pass over m reads: its elements, and for FP8/Q8/Q4 its F32 scales.
inline size_t matrix_bytes(const Matrix& m) {
    size_t n = size_t(m.rows) * row_bytes(m.dtype, m.cols);
    if (m.scales) n += matrix_scale_bytes(m);
    return n;
}

// Rows [r0, r0 + n) of m as a matrix of their own (data and, for FP8/Q8/Q4, scales offset). For FP8, r0 must start a
// scale block row (a multiple of the segment rows, or of 128 when the matrix is one segment), and n must cover whole
// segments (the view keeps m's segment rows); e.g. expert e's gate_up is matrix_rows(gate_up, e * 2I, 2I).
// Q8/Q4: any r0 and n.
inline Matrix matrix_rows(const Matrix& m, int64_t r0, int64_t n) {
    Matrix v = m;
    v.data = static_cast<const char*>(m.data) + size_t(r0) * row_bytes(m.dtype, m.cols);
    v.rows = n;
    if (m.scales && is_int_quant(m.dtype))
        v.scales = m.scales + r0 * (m.cols / m.group);
    else if (m.scales)
        v.scales = m.scales + fp8_scale_row(r0, m.scale_segment_rows) * fp8_scale_cols(m.cols);
    return v;
}

// Batch rows [row, row + n_tokens) are positions [pos, pos + n_tokens) of sequence slot `slot`.
struct SeqRun {
    int32_t slot = 0;
    int32_t pos = 0;
    int32_t row = 0;
    int32_t n_tokens = 0;
};

// Host-side description of one forward step. The pointed-to arrays stay valid until the next begin_batch().
struct BatchDesc {
    int32_t n_tokens = 0;                // T
    const int32_t* token_ids = nullptr;  // [T]
    const SeqRun* runs = nullptr;        // [n_runs], rows in increasing order, covering [0, T)
    int32_t n_runs = 0;
};

// Sizes that bound every step; fixed at load.
struct BatchLimits {
    int32_t max_tokens = 0;  // rows per step (prefill chunk)
    int32_t max_runs = 0;    // runs per step (= number of sequence slots)
    int32_t n_ctx = 0;       // positions per sequence slot (KV cache length)
    int32_t n_slots = 0;     // sequence slots
};

// One gated full-attention layer's core, after the q/k/v projections and before o_proj (QWEN35.md):
//   q = RMSNorm1p(query; q_norm), k = RMSNorm1p(k; k_norm) per head over D; RoPE on the first R dims of q and k
//   (rotate_half pairs (i, i + R/2), angle = pos * inv_freq[i], inv_freq of kernels/rope.h: theta^(-2i/R), or YaRN's;
//   cos and sin times rope_attention_factor); k (after norm and
//   RoPE) and v are written to the KV cache at their positions; o = softmax(q k^T / sqrt(D) + causal) v (GQA);
//   out = o * sigmoid(gate).
struct AttentionArgs {
    const void* qg = nullptr;       // act [T, Hq, 2*D]: per head the query (first D) then the gate (next D)
    const void* k = nullptr;        // act [T, Hkv, D] (before k_norm)
    const void* v = nullptr;        // act [T, Hkv, D]
    const float* q_norm = nullptr;  // F32 [D] (zero-centred: applied as 1 + w)
    const float* k_norm = nullptr;  // F32 [D]
    void* k_cache = nullptr;        // act [n_slots, n_ctx, Hkv, D], this layer's
    void* v_cache = nullptr;        // act [n_slots, n_ctx, Hkv, D]
    void* out = nullptr;            // act [T, Hq * D]
    int n_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0, n_ctx = 0;
    float rope_theta = 0.0f, eps = 0.0f;
    // YaRN (ModelConfig's fields of the same names): factor 0 is plain RoPE
    float rope_yarn_factor = 0.0f, rope_yarn_low = 0.0f, rope_yarn_range = 1.0f, rope_attention_factor = 1.0f;
};

// One Gated DeltaNet layer's core, after the input projections and before out_proj (QWEN35.md):
//   mixed = silu(causal depthwise conv over time of qkv, kernel K, with the conv state holding the previous K-1
//   inputs); q, k, v = split(mixed); q, k l2-normalised over Dk (eps 1e-6), q *= 1/sqrt(Dk);
//   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias); per value head h (key head h / (Hv/Hk)), per token:
//     S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q
//   y = (norm_w * RMSNorm(o) over Dv (no 1+)) * silu(z).
// Updates conv_state and ssm_state of every slot in the batch.
struct GatedDeltaNetArgs {
    const void* qkv = nullptr;       // act [T, C], C = 2*Hk*Dk + Hv*Dv, channel order [q | k | v], before the conv
    const void* z = nullptr;         // act [T, Hv * Dv]
    const void* b = nullptr;         // act [T, Hv]
    const void* a = nullptr;         // act [T, Hv]
    const float* conv_w = nullptr;   // F32 [C, K]; tap K-1 multiplies the current token
    const float* A_log = nullptr;    // F32 [Hv]
    const float* dt_bias = nullptr;  // F32 [Hv]
    const float* norm_w = nullptr;   // F32 [Dv]
    void* conv_state = nullptr;      // act [n_slots, K-1, C]: the last K-1 pre-conv inputs, oldest first
    float* ssm_state = nullptr;      // F32 [n_slots, Hv, Dk, Dv]
    void* out = nullptr;             // act [T, Hv * Dv]
    int n_k_heads = 0, n_v_heads = 0, k_dim = 0, v_dim = 0, conv_kernel = 0;
    float eps = 0.0f;  // of the gated RMSNorm
};

// The model shapes a backend's scratch depends on (Backend::workspace_bytes).
struct WorkspaceShape {
    int max_heads = 0;            // the most heads of a mixer (attention query heads, Gated DeltaNet value heads)
    int max_head_dim = 0;         // the largest head dim
    int hidden = 0;               // H
    int n_experts = 0;            // E (0: no MoE layer)
    int experts_per_tok = 0;      // k
    int moe_intermediate = 0;     // I of a routed expert
    int shared_intermediate = 0;  // Is of the shared expert (0: none)
    int64_t fp8_max_cols = 0;     // the most columns (K) of an FP8 or Q8/Q4 matrix (0: none; lm_head not counted)
    int64_t fp8_max_elems = 0;    // the most elements (rows x cols) of an FP8 or Q8/Q4 matrix (lm_head not counted)
};

// The routed experts of one MoE layer, stacked in the arena whatever the checkpoint's layout (fused 3-D tensors or
// one tensor per expert): expert e's SwiGLU is gate = rows [e*2I, e*2I + I) of gate_up, up = rows [e*2I + I,
// (e+1)*2I), down = rows [e*H, (e+1)*H) of down. FP8 experts: gate_up.scale_segment_rows = I, down's = H (each
// expert's gate, up and down blocked on their own, as the per-expert tensors of the checkpoint); matrix_rows()
// gives one expert's part.
struct MoeExperts {
    Matrix gate_up;        // [E * 2I, H]
    Matrix down;           // [E * H, I]
    int n_experts = 0;     // E
    int intermediate = 0;  // I
};

// The shared expert of a MoE layer (Qwen3.5-MoE, Qwen3-Next; docs/QWEN35.md "Mixture-of-experts members"): a SwiGLU
// every row goes through, scaled by sigmoid(x . gate). gate_proj.rows == 0: the layer has none.
struct SharedExpert {
    Matrix gate_proj;  // [Is, H]
    Matrix up_proj;    // [Is, H]
    Matrix down_proj;  // [H, Is]
    Matrix gate;       // [1, H] (shared_expert_gate)
};

// One projection of a group over a shared input (Backend::matmul_group): y[rows, w.rows] = x[rows, w.cols] @ w^T.
struct Projection {
    Matrix w;
    void* y = nullptr;  // act [rows, w.rows]
};

// How the CUDA backend runs, fixed when it is made (Model::load passes ModelParams::cuda).
struct CudaOptions {
    bool graphs = true;  // record steps of at most 16 rows and every decode step, replay them as CUDA graphs
    // Comparisons and tests only (the defaults are the fast settings):
    bool pdl = true;             // programmatic dependent launch (used only where the device runs 9.0 code)
    bool l2_evict_first = true;  // decode GEMVs load weights with an L2 evict-first policy
    bool gdn_fused_conv = true;  // decode steps do the Gated DeltaNet conv inside the recurrence kernel
    // Decode steps of more than 8 sequences: the Gated DeltaNet states streamed through one block an SM that takes
    // (sequence, head) items in turn, the next item's state copied in while the current one is computed (bitwise
    // the same results; not yet measured, so off by default). gdn_decode_stream_blocks > 0: at most that many blocks
    // (tests: several items a block); 0: as many as fit on the device.
    bool gdn_decode_stream = false;
    int gdn_decode_stream_blocks = 0;
    // Decode steps of more than 8 sequences (the Gated DeltaNet state staged in shared memory): a kernel of at most
    // 80 registers a thread, so that three heads share an SM (value heads up to 128); false: 128 registers, two
    // heads an SM. Bitwise the same results. Off by default: on an H100 three blocks lost 2-4% at b = 64-256 (both
    // at 85-87% of DRAM; docs/perf-notes.md, thirty-first session); not yet measured on an H200.
    bool gdn_decode_three_blocks = false;
    // Prefill: the most rows a Gated DeltaNet conv thread takes (its weights loaded once for them; 1 to 16); 0: the
    // tuned default (16). The results are bitwise the same for every value.
    int gdn_conv_rows = 0;
    // MoE experts grouped by expert from this many rows on (every weight type); 0: the tuned default (16 rows, FP8
    // experts 32)
    int moe_grouped_min_rows = 0;
    // The grouped expert GEMM copies 64 K values a stage (three stages, 83 KB of shared memory a block) instead of
    // 128 (two stages, 104 KB), as it does by itself on GPUs that give a block less (sm_86, sm_89). Bitwise the same
    // results; for tests on the larger GPUs.
    bool moe_group_k64 = false;
    // Decode attention split over positions: a block takes up to this many q heads of one kv head (1, 2 or 4; the
    // largest that divides the group size); 0: the tuned default. Results are bitwise the same for every value.
    int attn_heads_per_block = 0;
    // Prefill (flash) attention: a block takes up to this many q heads of one kv head (1, 2 or 4; the largest that
    // divides the group size), sharing each K and V tile it loads; 0: the tuned default. Bitwise the same results.
    int attn_prefill_heads_per_block = 0;
    // Decode attention: at most this many position splits per (row, head) (1 to 128); 0: the tuned default.
    int attn_max_splits = 0;
    // Q8/Q4 decode GEMVs: split K in two halves (twice the blocks) 1: wherever K allows, -1: never, 0: for short
    // matrices (the tuned default). A row's result does not depend on the batch either way.
    int int_gemv_split_k = 0;
    // Q8/Q4 decode GEMVs: the codes copied into shared memory in cp.async stages (up to 32 KB a block in flight)
    // instead of loaded into registers, bitwise the same results. 1: always, -1: never, 0: the tuned default (for
    // 2 to 4 rows of x; H200, 4B shapes, forty-third session: int4 b=2 +11%, int8 b=3 +45%, but b=1 -2 to -3% and
    // b=8 -5 to -7%; docs/perf-notes.md).
    int int_gemv_staged = 0;
    // bf16 matrices with 3 to 16 rows of x (batched decode): 1: all on the tensor-core GEMV (singles, pairs, gate/up,
    // lm_head; 9-16 rows as two mma n-tiles), -1: only groups of 3 or 4 matrices of 3-8 rows there, the others on
    // cuBLASLt; 2: the default up to 8 rows, then groups of 3-4 matrices of up to 16 rows on the tensor-core GEMV and
    // the others on cuBLASLt (wide_gemv off unless 1); 0: the tuned default (all on the tensor-core GEMV up to 8
    // rows; 9-16 rows as wide_gemv says). A row's result does not depend on the batch (3 to 16 rows with 1 or with
    // wide_gemv's clusters; 3 to 8 otherwise).
    int small_batch_gemv = 0;
    // bf16 matrices with 9 to 64 rows of x that small_batch_gemv leaves to cuBLASLt: 1: all on the tensor-core GEMV
    // in thread-block clusters (sm_90; the same sums as the 3-16-row GEMV, so a row's result is the same in any batch
    // of 3 to 64 rows), -1: all on cuBLASLt; 0: the tuned default (9-16 rows in clusters, more on cuBLASLt).
    int wide_gemv = 0;
    // bf16 matrices with 9 to 128 rows of x that the GEMVs above leave to cuBLASLt, on the wgmma GEMM of
    // kernels/cuda/gemm_wgmma.cuh instead (sm_90a; K split over a thread-block cluster, a row's result independent of
    // the batch it runs in; gate/up/SiLU as one kernel). 0 (default): by shape (tuning.cuh): groups of matrices that
    // share x up to 64 rows, lone matrices, gate/up/SiLU and logits up to 32, and 9-16 rows too rather than the
    // cluster GEMV unless wide_gemv is given (H200, thirtieth session: b=12 and b=16 +16%, b=48 +1.6%, b=64 +1%
    // against 2; docs/perf-notes.md); a row's bits change where its matrices change kernel (8/9, 32/33, 64/65 rows).
    // 2: every matrix up to 64 rows, 9-16 rows in clusters (the twenty-ninth session's default: H100 b=32 +11%, b=64
    // +5% against cuBLASLt); 1: every matrix up to 128 rows (b=128 -29%); -1: none (cuBLASLt).
    int wgmma_gemm = 0;
    // The wgmma GEMM's K split (cluster size): 1, 2, 4 or 8; 0: by shape and SM count (wgmma_gemm_parts).
    int wgmma_gemm_parts = 0;
    // Q8/Q4 matrices, and FP8 (e4m3) ones when fp8_block_scaled_gemm is false, with 9 to 64 rows of x (batched
    // decode) on the wgmma GEMM reading their codes (sm_90a; kernels/cuda/gemm_wgmma.cuh: weights turned into bf16 in
    // registers, W8A16 / W4A16) when true (the default; thirty-eighth session, 4B decode at 16/32/64 rows against
    // false: H100 int4 +18%/+18%/+10%, int8 +27%/+7%/+12%; H200 int4 +4%/+10%/+3%, int8 +17%/+1%/+2%; FP8 W8A8 stayed
    // faster than it on the H100, so block-scaled FP8 keeps its GEMM); false: Q8/Q4 dequantized to bf16 scratch for
    // cuBLASLt, FP8 as fp8_block_scaled_gemm says. Its K split is wgmma_gemm_parts.
    bool wgmma_quant = true;
    // Its consumer warpgroups a block: 1 (each thread converts and multiplies both 64-row tiles) or 2 (default: one
    // tile each, twice the warps to hide the conversion's latency; the same bits). 4B decode at 16/32/64 rows against
    // 1: int8 H200 +29%/+37%/+10% (thirty-eighth session), H100 +20%/+23%/+10%; int4 H100 +34%/+17%/+10%; FP8 (W8A16)
    // H100 +21%/+19%/+4% (fortieth session, every [gpu] case passing; docs/perf-notes.md).
    int wgmma_quant_warpgroups = 2;
    // The wgmma GEMMs (9-64 rows, K split not given by wgmma_gemm_parts) split their tiles x K chunks evenly over
    // two blocks an SM (stream-K; a tile's parts added in a fixed block order, so a row's bits still depend on N, K and
    // the SM count only) instead of splitting K into 1-8 parts over a cluster, which at 64 rows leaves about 0.73
    // waves (most SMs one block, some two; fortieth session's profile). Workspace: 32 KB of partial sums a block
    // (8.4 MB with 132 SMs), where either is on. 4B decode at 16/32/64 rows, stream-K against the cluster split
    // (H100, forty-second session, docs/perf-notes.md): quantized int8 +3%/+8%/+8%, int4 +7%/+9%/+6%, fp8 W8A16
    // +1%/+5%/+2%, so on by default; bf16 -10%/-9%/-1%, so off.
    bool wgmma_stream_k = false;       // the bf16 wgmma GEMM
    bool wgmma_stream_k_quant = true;  // the quantized (int8/int4/fp8) wgmma GEMM
    // FP8 matrices with more rows than the FP8 GEMVs take (over 8): true (default), FP8 tensor cores
    // with the activations quantized per row and 128-value group (W8A8 with cuBLASLt block scales, the checkpoints'
    // "activation_scheme: dynamic", as vLLM and transformers run them); false: the weights dequantized to bf16 and
    // the bf16 GEMM (W8A16, as the GEMVs and the CPU backend: closer to the CPU, slower; kernels/cuda/fp8_matmul.cuh,
    // BENCHMARKS.md "FP8 weights on the GPU").
    bool fp8_block_scaled_gemm = true;
    // Builds with -DHY_CUDA_TRACE=ON only (timing studies; refused otherwise): every kernel's start and ready times
    // are written to this file when the backend is destroyed (tools/gpu/trace_summary.py reads it). Empty: none.
    std::string trace_file;
};

// The value fill_random gives element i for `seed`: the top 24 bits of splitmix64(seed + i), as a float in [0, 1).
HY_HOST_DEVICE inline float random_unit(uint64_t seed, uint64_t i) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(z >> 40) * (1.0f / 16777216.0f);
}

// The greedy pick of one logits row (Backend::argmax_rows).
struct TokenPick {
    int32_t id = -1;       // arg max over ids [0, n_valid), lowest id on ties; -1 when no logit there is > -inf
    float logprob = 0.0f;  // log-softmax over ids [0, n_valid) at id: -log(sum_j exp(logit_j - logit_id)), natural log
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char* name() const = 0;
    // The backend's launch settings in one line ("graphs on, pdl on, ..."; empty when it has none), for --verbose
    // and tests.
    virtual std::string settings() const { return {}; }
    // The device in a few words, for the line a program prints after the load: "CPU, 8 threads", "NVIDIA H200
    // (compute capability 9.0)".
    virtual std::string device_name() const = 0;
    // Element type of activations, KV cache and conv state.
    virtual DType act_dtype() const = 0;
    // Storage type for a weight matrix stored as `checkpoint` in the file.
    virtual DType matrix_dtype(DType checkpoint) const = 0;

    // ---- memory ----
    // Allocates the arena (once, at load). Throws hy::Error(out_of_memory) on failure.
    virtual void* alloc(size_t bytes) = 0;
    // True when alloc() returns zeroed memory whose pages are only made resident when first written (the CPU
    // backend's anonymous mappings): the load then does not zero the state, and a KV cache no sequence reaches
    // costs no memory.
    virtual bool alloc_zeroed() const { return false; }
    // The most arena bytes that can ever be resident (the CPU backend: the machine's physical memory); 0 when the
    // backend does not say (alloc() reports what does not fit). The load refuses a larger arena with the numbers.
    virtual size_t memory_capacity() const { return 0; }
    virtual void free(void* p) = 0;
    virtual void upload(void* dst, const void* src, size_t bytes) = 0;    // host -> arena
    virtual void download(void* dst, const void* src, size_t bytes) = 0;  // arena -> host (synchronizes)
    // Host memory that copies to and from the arena run fastest with (page-locked on CUDA: the bus's full speed, no
    // staging by the driver; on the CPU plain memory whose pages are made resident when first written). For states
    // kept off the arena (the server's conversation-state cache). The memory is freed when the last copy of the
    // pointer goes, which may be after the backend. Throws hy::Error(out_of_memory) on failure.
    virtual std::shared_ptr<void> alloc_host(size_t bytes);
    // As download()/upload(), but they may return before the copy is done: dst and src must stay valid and
    // unchanged until the next synchronize(). From alloc_host() memory they overlap nothing on the host.
    virtual void download_async(void* dst, const void* src, size_t bytes) { download(dst, src, bytes); }
    virtual void upload_async(void* dst, const void* src, size_t bytes) { upload(dst, src, bytes); }
    virtual void fill_zero(void* dst, size_t bytes) = 0;
    // dst[n] (F32 or BF16, arena) = values uniform in [lo, hi) from a counter-based hash of (seed, index):
    // deterministic, the same on every backend up to the dtype's rounding. For dummy weights (ModelParams).
    virtual void fill_random(void* dst, size_t n, DType dtype, float lo, float hi, uint64_t seed) = 0;
    // Bytes of private scratch the backend needs for these limits; handed over once with set_workspace().
    virtual size_t workspace_bytes(const BatchLimits& limits, const WorkspaceShape& shape) const = 0;
    virtual void set_workspace(void* ws, const BatchLimits& limits) = 0;
    virtual void synchronize() = 0;
    // Measured copy bandwidth of this device in GB/s (bytes read + bytes written per second, large buffers),
    // the ceiling hybrid-bench compares decode against; 0 when the backend does not measure it. Allocates
    // temporary memory outside the arena: call only from tools.
    virtual double copy_bandwidth_gbs() { return 0.0; }
    // Bytes of device memory in use now (the whole device: total minus free, so it counts the runtime's own
    // context and any other process); 0 when the backend does not measure it. For tools.
    virtual size_t device_memory_used() { return 0; }
    // Host threads the backend computes with (the CPU backend's pool); 0 for a device backend. For tools.
    virtual int host_threads() const { return 0; }

    // ---- one forward step ----
    virtual void begin_batch(const BatchDesc& batch) = 0;
    // Instead of begin_batch and the step's ops: when the backend recorded the previous step and can run it again
    // (the CUDA backend's graphs) and `batch` has that step's shape (rows, runs, rows per run), enqueues it again
    // with batch's token ids, positions and slots and returns true; else does nothing and returns false. The
    // caller guarantees that the ops it would issue for `batch` are those of that step (Model: same rows per run,
    // logits rows and greedy picks), so the host skips recording them (about 300 ops per decode step).
    virtual bool repeat_step(const BatchDesc& batch) {
        (void)batch;
        return false;
    }
    // x[T, H] = table[token_ids] (converted to act).
    virtual void embed(const Matrix& table, void* x) = 0;
    // y[rows, dim] = x * rsqrt(mean(x^2) + eps) * (zero_centred ? 1 + w : w); fp32 math; y may alias x.
    virtual void rms_norm(const void* x, const float* w, int64_t rows, int dim, float eps, bool zero_centred,
                          void* y) = 0;
    // The residual add and the next sub-layer's norm in one op: x[rows, dim] += d, then y = rms_norm(x) as above
    // (same memory results as add() then rms_norm(); y may alias x, d must not alias x or y).
    virtual void add_rms_norm(void* x, const void* d, const float* w, int64_t rows, int dim, float eps,
                              bool zero_centred, void* y) = 0;
    // y[rows, w.rows] = x[rows, w.cols] @ w^T with fp32 accumulation.
    virtual void matmul(const void* x, int64_t rows, const Matrix& w, void* y) = 0;
    // Projections of one input, e.g. attention's q/k/v or the Gated DeltaNet's input projections: for each i,
    // p[i].y = x[rows, K] @ p[i].w^T (every p[i].w.cols == K; no y aliases x). Same results as n matmul() calls;
    // the CUDA backend reads x once and runs the group as one GEMV launch for decode-sized rows.
    virtual void matmul_group(const void* x, int64_t rows, const Projection* p, int n) = 0;
    // The SwiGLU MLP's first half (QWEN35.md "Decoder layer", MLP): gate[rows, F] = x @ w_gate^T, up[rows, F] = x @
    // w_up^T, then act[rows, F] = silu(gate) * up (act may alias gate; gate and up are left holding the projections).
    // Same results as matmul, matmul, silu_mul; the CUDA backend runs it as one GEMV kernel for 1-2 rows (1-8 for FP8,
    // Q8 and Q4).
    virtual void gate_up_silu(const void* x, int64_t rows, const Matrix& w_gate, const Matrix& w_up, void* gate,
                              void* up, void* act) = 0;
    // The MoE router (docs/QWEN35.md "Mixture-of-experts members"): p = softmax(x @ router^T) in fp32 over the E
    // experts (router [E, H]); ids[t, 0..k) = the k most probable experts of row t, most probable first, ties to the
    // lower id (as torch.topk); weights[t, j] = p[t, ids[t, j]], divided by their sum when `normalize`. weights F32
    // [rows, k] and ids I32 [rows, k] are arena buffers; 1 <= k <= E.
    virtual void moe_route(const void* x, int64_t rows, const Matrix& router, int k, bool normalize, float* weights,
                           int32_t* ids) = 0;
    // The MoE block's experts (fused: routed and shared): y[t] = r[t] + sigmoid(x_t . shared.gate) * s[t], where
    // r[t] = sum over j of weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j], added in increasing e
    // (the order transformers accumulates them in), and s[t] = shared.down_proj(silu(shared.gate_proj(x_t)) *
    // shared.up_proj(x_t)) (s = 0 when shared.gate_proj.rows == 0). x, y act [rows, H]; y must not alias x. The
    // values are those of the routed sum, gate_up_silu, matmul and the gated add in sequence; the CUDA backend runs
    // the shared expert inside the routed experts' two kernels for decode-sized rows.
    virtual void moe_experts(const void* x, int64_t rows, const MoeExperts& experts, const SharedExpert& shared,
                             const float* weights, const int32_t* ids, int k, void* y) = 0;
    // y[n] += x[n].
    virtual void add(void* y, const void* x, int64_t n) = 0;
    // y[n] = silu(gate[n]) * up[n] (the MLP activation; n = rows * F).
    virtual void silu_mul(const void* gate, const void* up, int64_t n, void* y) = 0;
    virtual void attention(const AttentionArgs& args) = 0;
    virtual void gated_delta_net(const GatedDeltaNetArgs& args) = 0;
    // y[n, dim] = x[rows[i], :] for the host list rows[0..n).
    virtual void gather_rows(const void* x, int64_t dim, const int32_t* rows, int n, void* y) = 0;
    // logits[n, w.rows] (F32, arena) = x[n, w.cols] @ w^T.
    virtual void logits(const void* x, int n, const Matrix& w, float* logits) = 0;
    // picks[i] (arena) = the greedy pick of row i of logits (F32 [n, row_len], arena) over ids [0, n_valid)
    // (n_valid <= row_len); NaN logits count as -inf. The CPU backend computes the log-probability with the
    // sampler's log_softmax_at (so it equals a host-sampled token's); CUDA sums in fp32 (agrees to about 1e-5).
    virtual void argmax_rows(const float* logits, int n, int row_len, int n_valid, TokenPick* picks) = 0;
};

// The CPU backend (always built). n_threads <= 0 uses all cores.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
// The CUDA backend on `device`; throws hy::Error(backend) when this build has no CUDA or no usable GPU is present,
// hy::Error(invalid_argument) for a trace file in a build without HY_CUDA_TRACE.
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaOptions& options = {});
// True when this build includes CUDA and a usable GPU is present.
bool cuda_available();

inline std::shared_ptr<void> Backend::alloc_host(size_t bytes) {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    if (!p)
        throw Error(Status::out_of_memory, "cannot allocate " + std::to_string(bytes >> 20) + " MiB of host memory");
    return std::shared_ptr<void>(p, std::free);
}

}  // namespace hy
