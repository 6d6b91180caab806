// Per-architecture tuning constants. Launch shapes (threads per block, rows per block) are the same for every
// architecture so that host code can compute them; what differs per architecture is chosen inside the kernels at
// compile time from __CUDA_ARCH__ through these named constants.
//
// Supported: sm_80 (A100), sm_86 (RTX 30xx / A10), sm_89 (L4 / RTX 40xx), sm_90 / sm_90a (H100 / H200).
#pragma once

namespace hy::cuda {

// Compute capability encodings as __CUDA_ARCH__ spells them.
constexpr int kArchAmpere = 800;
constexpr int kArchAmpereConsumer = 860;
constexpr int kArchAda = 890;
constexpr int kArchHopper = 900;
// The oldest architecture the kernels are written for (bf16 arithmetic, cp.async, 164 KB shared memory).
constexpr int kArchMin = kArchAmpere;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "hybrid's CUDA kernels need compute capability 8.0 or newer (bf16); set CMAKE_CUDA_ARCHITECTURES accordingly"
#endif

// Launch shapes shared by host and device code.
constexpr int kGemvWarps = 4;      // warps per CUDA-core GEMV block (more when a row takes more warps)
constexpr int kGemvMaxTokens = 8;  // rows up to which a GEMV may be used; more always go to cuBLASLt
// Rows up to which the bf16 tensor-core GEMV may take a matrix: two mma n-tiles of 8 rows (a row's sums do not
// depend on the tile count, so rows 3-16 give the same results in any batch of that range).
constexpr int kTcGemvMaxTokens = 16;
// Rows up to which a GEMV is the CUDA-core kernel (then the tensor-core group GEMV or cuBLASLt): with 3 or 4 rows
// the CUDA-core kernel is bound by reading x from L1 (H200, 4B shapes: decode b=4 924 tok/s against 1,169 on the
// tensor-core/cuBLASLt path, b=3 836 against 893; b=2 650 with it, 605 without; docs/perf-notes.md, fourth session).
constexpr int kGemvBlockMaxTokens = 2;
// Rows up to which bf16 matrices may take the tensor-core GEMV in clusters (matmul.cuh, gemv_wide_with: 2, 4 or 8
// mma n-tiles), and up to which they take it by default (9-16 rows; CudaOptions::wide_gemv: 1 up to 64, -1 none).
// H100, 4B shapes, runs 136-137 (docs/perf-notes.md): b=12 2,494 tok/s against 2,420 on cuBLASLt, b=16 3,220
// against 3,144; but b=32 5,287 against 5,547 and b=64 7,489 against 8,924 (a block does only 5-10 rounds of 2
// chunks, so the pipeline's fill and the cluster sum weigh, and cuBLASLt streams its tiles better).
constexpr int kWideGemvMaxTokens = 64;
constexpr int kWideGemvDefaultMaxTokens = 16;
// Rows up to which the wgmma GEMM (gemm_wgmma.cuh) takes what the GEMVs leave (groups sharing x; other matrices by
// the bounds below). H100, 4B shapes, twenty-ninth session: hybrid-bench b=32 6,150 tok/s against 5,536 on cuBLASLt,
// b=64 9,491 against 9,023, but b=128 9,101 against 12,866 (every block of 128 features streams all of x: at 128 rows
// 16 KB a chunk beside 16 KB of weights). hybrid-kernel-bench at 64 rows (GB/s, wgmma / cuBLASLt): Gated DeltaNet
// inputs 2,130 / 1,620, q|k|v 2,043 / 1,755, down_proj 2,215 / 2,124, but o_proj 1,865 / 2,059 and gate+up 2,234 /
// 2,464 (hence the routing by shape below; docs/perf-notes.md). CudaOptions::wgmma_gemm = 1: up to 128.
constexpr int kWgmmaGemmDefaultMaxRows = 64;
// By default (CudaOptions::wgmma_gemm = 0) the wgmma GEMM takes groups of matrices sharing x up to 64 rows but lone
// projections, gate/up/SiLU and logits only up to 32 (cuBLASLt streams those wider or longer matrices faster at
// 33-64 rows), and 9-16 rows too, from the cluster GEMV (H100 kernel-bench at 16 rows, GB/s, wgmma / cluster GEMV:
// Gated DeltaNet inputs 2,578 / 2,171, q|k|v 2,626 / 2,165, o_proj 2,166 / 1,769, down_proj 2,468 / 2,031, gate/up/SiLU
// 2,633 / 2,357). H200, thirtieth session, against every matrix up to 64 rows and 9-16 in clusters: b=12 3,537 /
// 3,531 tok/s against 3,040 / 3,038 (+16%), b=16 4,549 / 4,535 against 3,910 / 3,903 (+16%), b=48 +1.6%, b=64 +1%;
// with gate/up and logits on cuBLASLt from 17 rows, b=24 and b=32 lost 3%, so they stay on it up to 32.
constexpr int kWgmmaLoneMaxRows = 32;
constexpr int kWgmmaGateUpMaxRows = 32;
constexpr int kWgmmaLogitsMaxRows = 32;
// With 3 to 8 rows every bf16 matrix goes to the tensor-core GEMV (true), or only groups of 3-4 matrices (false: the
// others to cuBLASLt); CudaOptions::small_batch_gemv overrides it.
constexpr bool kTcGemvAll = true;
constexpr int kNormThreads = 256;  // threads per row of RMSNorm
constexpr int kAttnWarps = 4;      // warps per (row, q head) in the attention core
constexpr int kElementwiseThreads = 256;
// Attention over the KV cache for steps of at most kAttnSplitMaxRows rows (decode) is split over the positions
// (flash-decoding): min(ceil(n_ctx / kAttnSplitKeys), kAttnDefaultSplits) blocks per (row, head), fixed when a step's
// graph is captured; each takes an equal share of the row's keys [0, pos] at run time, then the splits are merged.
constexpr int kAttnSplitMaxRows = 16;
constexpr int kAttnSplitKeys = 32;
constexpr int kAttnMaxSplits = 128;     // the most any step uses (the split scratch is sized for it)
constexpr int kAttnDefaultSplits = 64;  // the most a step uses by default (CudaOptions::attn_max_splits)
// q heads of one kv head that one decode attention block serves (each key and value it loads is used for all of
// them; CudaOptions::attn_heads_per_block overrides it). H200, 4B shapes, b=1 at 16k positions (run 121): 1 head
// 307 tok/s, 2 heads 334, 4 heads 326 (168 registers: fewer blocks in flight).
constexpr int kAttnHeadsPerBlock = 2;
// q heads of one kv head that one prefill (flash) attention block serves, each K and V tile it loads used for all
// of them (CudaOptions::attn_prefill_heads_per_block overrides it). H100, 4B shapes, prefill 16384: the kernel 5.50
// ms a layer at 4 against 5.72 at 1 (ncu); end to end within noise (41,247 / 41,228 against 41,211 / 41,411 tok/s).
constexpr int kAttnPrefillHeadsPerBlock = 4;
// Rows from which the MoE experts run grouped by expert (a tile GEMM per expert) instead of one GEMV pass per
// (row, choice) (moe.cuh; CudaOptions::moe_grouped_min_rows overrides it). H100, 35B-A3B shapes, thirty-second
// session (the grouped GEMM with 256-byte stages), tok/s grouped against per row: b=12 1,060 / 1,085, b=16 1,223 /
// 1,202, b=24 1,449 / 1,353, b=32 1,685 / 1,483.
constexpr int kMoeGroupedMinRows = 16;
// ... for FP8 experts: the grouped GEMM converts each stage's codes to bf16 (a second barrier), and the per-row
// kernels read half the bytes. H100, 35B-A3B shapes, thirty-sixth session (run 19, `--quant fp8 -b 16,24`), tok/s
// grouped from 16 against from 32: b=16 984.8 / 1,258.4 (+28%), b=24 1,158.5 / 1,371.1 (+18%).
constexpr int kMoeGroupedMinRowsFp8 = 32;
// The shared expert runs inside the routed experts' per-row kernels up to this many rows (run 98, 35B-A3B shapes:
// b=1 +12%, b=8 +4%, b=16 equal, b=32 -3% against its own kernels).
constexpr int kMoeFusedSharedMaxRows = 16;
// The per-row experts' gate/up/SiLU on the decode GEMV's loop (matmul.cuh, gemv_expert_gate_up: two warps a feature,
// both rows' words loaded at once, the shared expert's before the PDL wait) up to this many rows; more rows: one warp
// a feature (moe.cu, moe_gate_up_kernel). H100, 35B-A3B shapes, thirty-third session, tok/s against the one-warp
// kernel: b=1 355.8 / 345.3 (+3.0%), b=2 528.6 / 519.3 (+1.8%), b=8 908.9 / 959.4 (-5.3%).
constexpr int kMoeGateUpGemvMaxRows = 2;

}  // namespace hy::cuda
