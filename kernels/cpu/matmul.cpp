// CPU matmul y = x W^T with W in F32/F16/BF16/FP8 and fp32 accumulation.
//
// A register-blocked micro-kernel computes kRows x kTokens outputs at once with 16-lane accumulators (GCC vector
// extensions: AVX-512, AVX2 or SSE, whatever -march allows; without AVX-512 as two 8-lane halves, lane for lane the
// same arithmetic). Every output (t, n) is accumulated in its own
// 16-lane vector over k in steps of 16, the K % 16 tail is added lane-wise into the same vector, and the lanes are
// summed in one fixed order. So the result of (t, n) does not depend on the block it fell into, the number of
// rows in the batch or the thread count: batched and single-token forwards agree bitwise.
//
// 16-bit weights, 8 or more tokens (prefill): each block of kRows weight rows is widened once into a per-thread f32
// panel (exact), then swept by the F32 micro-kernels over every token, as for FP8 below: the same sums.
//
// FP8 weights (Matrix::scales): each block of kRows weight rows is dequantized once into a per-thread f32 panel
// (fp8 value, exact as base/fp8.h's table, * block scale, one f32 product), then swept by the same F32 micro-kernels
// over every token. So an FP8 matrix gives bitwise the result of the F32 matrix holding its dequantized values, and the
// lookups cost once per weight per call, not per token.
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "base/fp8.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec.h"

namespace hy::cpu {

namespace {

typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

constexpr int kLanes = 16;
#if defined(__AVX512F__)
constexpr int kRows = 4;    // weight rows per micro-kernel
constexpr int kTokens = 6;  // activation rows per micro-kernel (4 x 6 accumulators + 4 weights + 1 input: 29 of 32 zmm)
#else
// Without AVX-512 the micro-kernels hold each output as two 8-lane halves (below): 3 x 2 outputs are 12 of AVX2's 16
// ymm registers, plus 3 weights and 1 input (3 x 2 measured 6% faster than 2 x 3, and 2 x 2 5% slower still)
constexpr int kRows = 3;
constexpr int kTokens = 2;
#endif
static_assert(kRows <= 4, "the row-block switches below take blocks of 1 to 4 rows");
constexpr int kTokenChunk = 64;  // activation rows kept hot in cache while a weight panel is swept

// binary16 bits (one per u32 lane) -> binary32, exactly as f16_to_f32, in vector operations: finite values are the
// exponent and mantissa moved to f32's positions read as an f32 (a subnormal when the exponent is 0), times
// 2^(127 - 15), which is exact; infinities and NaNs get f32's all-ones exponent with the mantissa kept. (Vector
// casts reinterpret the bits in registers; a memcpy through a 64-byte object went through the stack when a vector
// takes two registers.)
template <class VF, class VU>
inline VF f16_bits_to_f32(VU h) {
    const VU mag = h & 0x7fffu;
    VU bits = (VU)((VF)(mag << 13) * 0x1p112f);
    bits = mag >= 0x7c00u ? (0x7f800000u | (mag & 0x3ffu) << 13) : bits;
    bits |= (h & 0x8000u) << 16;
    return (VF)bits;
}

template <DType W>
inline v16f load_w(const void* base, int64_t idx) {
    if constexpr (W == DType::F32) {
        return load_f32(static_cast<const float*>(base) + idx);
    } else if constexpr (W == DType::BF16) {
        const uint16_t* p = static_cast<const uint16_t*>(base) + idx;
        v16f f;
#if defined(__AVX512F__)
        // (the zero-masked forms: GCC 12 warns of the plain ones' undefined sources)
        const __m512i u = _mm512_maskz_slli_epi32(
            0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
        std::memcpy(&f, &u, sizeof f);
#else
        v16h h;
        std::memcpy(&h, p, sizeof h);
        f = (v16f)(__builtin_convertvector(h, v16u) << 16);
#endif
        return f;
    } else {  // F16, exactly as f16_to_f32 (IEEE binary16 -> binary32)
        const uint16_t* p = static_cast<const uint16_t*>(base) + idx;
        v16f f;
#if defined(__AVX512F__)
        // (the masked form with a zero source: GCC 12 warns of the plain one's undefined source)
        const __m512 c = _mm512_mask_cvtph_ps(_mm512_setzero_ps(), __mmask16(0xFFFF),
                                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        std::memcpy(&f, &c, sizeof f);
#else
        v16h h16;
        std::memcpy(&h16, p, sizeof h16);
        f = f16_bits_to_f32<v16f>(__builtin_convertvector(h16, v16u));
#endif
        return f;
    }
}

template <DType W>
inline float load_w1(const void* base, int64_t idx) {
    if constexpr (W == DType::F32)
        return static_cast<const float*>(base)[idx];
    else if constexpr (W == DType::BF16)
        return bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    else
        return f16_to_f32(static_cast<const uint16_t*>(base)[idx]);
}

// Sum of the 16 lanes in a fixed pairwise order.
inline float reduce(v16f v) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#if !defined(__AVX512F__)
// Without AVX-512 the micro-kernels keep each output's 16 lanes as two 8-lane halves (lanes 0-7, 8-15) in native
// 256-bit vectors: the same arithmetic lane by lane, so the same bits as the 16-lane form (GCC kept arrays of 64-byte
// vectors on the stack on AVX2, several times slower).
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint8_t v8b __attribute__((vector_size(8)));

// 8 weights from idx as f32, the values of load_w.
template <DType W>
inline v8f load8_w(const void* base, int64_t idx) {
    if constexpr (W == DType::F32) {
        return load_f32<v8f>(static_cast<const float*>(base) + idx);
    } else if constexpr (W == DType::BF16) {
#if defined(__AVX2__)
        // (one widening load and a shift; GCC 12 turned the generic form into two 128-bit widenings, a byte shift
        // and an insert)
        const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                                static_cast<const uint16_t*>(base) + idx))),
                                            16);
        v8f f;
        std::memcpy(&f, &u, sizeof f);
        return f;
#else
        v8h h;
        std::memcpy(&h, static_cast<const uint16_t*>(base) + idx, sizeof h);
        return (v8f)(__builtin_convertvector(h, v8u) << 16);
#endif
    } else {  // F16
#if defined(__F16C__)
        const __m256 c = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + idx)));
        v8f f;
        std::memcpy(&f, &c, sizeof f);
        return f;
#else
        v8h h16;
        std::memcpy(&h16, static_cast<const uint16_t*>(base) + idx, sizeof h16);
        return f16_bits_to_f32<v8f>(__builtin_convertvector(h16, v8u));
#endif
    }
}

// Sum of the 16 lanes held as halves lo (0-7) and hi (8-15), in reduce()'s order.
inline float reduce2(v8f lo, v8f hi) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = lo[i] + hi[i];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
#endif

// y[t0 + j, n0 + r] for r < NR, j < NT.
template <DType W, int NR, int NT>
inline void micro_kernel(const float* x, int64_t ldx, const void* w, int64_t K, float* y, int64_t ldy, int64_t t0,
                         int64_t n0) {
#if !defined(__AVX512F__)
    v8f acc[2][NR][NT];  // [half][r][j]
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < NR; r++)
            for (int j = 0; j < NT; j++) acc[h][r][j] = v8f{};
    const int64_t K16 = K / kLanes * kLanes;
    for (int64_t k = 0; k < K16; k += kLanes)
        for (int h = 0; h < 2; h++) {
            v8f wv[NR];
            for (int r = 0; r < NR; r++) wv[r] = load8_w<W>(w, (n0 + r) * K + k + 8 * h);
            for (int j = 0; j < NT; j++) {
                const v8f xv = load_f32<v8f>(x + (t0 + j) * ldx + k + 8 * h);
                for (int r = 0; r < NR; r++) acc[h][r][j] += wv[r] * xv;
            }
        }
    for (int64_t k = K16; k < K; k++) {
        const int lane = int(k - K16);
        for (int r = 0; r < NR; r++) {
            float wk = load_w1<W>(w, (n0 + r) * K + k);
            for (int j = 0; j < NT; j++) acc[lane >> 3][r][j][lane & 7] += wk * x[(t0 + j) * ldx + k];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < NT; j++) y[(t0 + j) * ldy + n0 + r] = reduce2(acc[0][r][j], acc[1][r][j]);
#else
    v16f acc[NR][NT];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < NT; j++) acc[r][j] = v16f{};
    const int64_t K16 = K / kLanes * kLanes;
    for (int64_t k = 0; k < K16; k += kLanes) {
        v16f wv[NR];
        for (int r = 0; r < NR; r++) wv[r] = load_w<W>(w, (n0 + r) * K + k);
        for (int j = 0; j < NT; j++) {
            v16f xv = load_f32(x + (t0 + j) * ldx + k);
            for (int r = 0; r < NR; r++) acc[r][j] += wv[r] * xv;
        }
    }
    for (int64_t k = K16; k < K; k++) {
        const int lane = int(k - K16);
        for (int r = 0; r < NR; r++) {
            float wk = load_w1<W>(w, (n0 + r) * K + k);
            for (int j = 0; j < NT; j++) acc[r][j][lane] += wk * x[(t0 + j) * ldx + k];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < NT; j++) y[(t0 + j) * ldy + n0 + r] = reduce(acc[r][j]);
#endif
}

template <DType W, int NR>
inline void row_block(const float* x, int64_t t_begin, int64_t t_end, const void* w, int64_t K, float* y, int64_t ldy,
                      int64_t n0) {
    int64_t t = t_begin;
    for (; t + kTokens <= t_end; t += kTokens) micro_kernel<W, NR, kTokens>(x, K, w, K, y, ldy, t, n0);
    switch (t_end - t) {
        case 5: micro_kernel<W, NR, 5>(x, K, w, K, y, ldy, t, n0); break;
        case 4: micro_kernel<W, NR, 4>(x, K, w, K, y, ldy, t, n0); break;
        case 3: micro_kernel<W, NR, 3>(x, K, w, K, y, ldy, t, n0); break;
        case 2: micro_kernel<W, NR, 2>(x, K, w, K, y, ldy, t, n0); break;
        case 1: micro_kernel<W, NR, 1>(x, K, w, K, y, ldy, t, n0); break;
        default: break;
    }
}

// y[t, n0 + r] for all T tokens and r < nr from an f32 panel [nr, K] holding weight rows n0..n0 + nr (dequantized
// FP8 or widened 16-bit rows): the F32 micro-kernels over chunks of kTokenChunk tokens.
inline void sweep_panel(const float* x, int64_t T, const float* panel, int nr, int64_t K, float* y, int64_t N,
                        int64_t n0) {
    for (int64_t t0 = 0; t0 < T; t0 += kTokenChunk) {
        const int64_t t1 = std::min(T, t0 + kTokenChunk);
        switch (nr) {  // (the panel's rows are rows 0..nr of a matrix whose output columns start at n0)
            case 4: row_block<DType::F32, 4>(x, t0, t1, panel, K, y + n0, N, 0); break;
            case 3: row_block<DType::F32, 3>(x, t0, t1, panel, K, y + n0, N, 0); break;
            case 2: row_block<DType::F32, 2>(x, t0, t1, panel, K, y + n0, N, 0); break;
            default: row_block<DType::F32, 1>(x, t0, t1, panel, K, y + n0, N, 0); break;
        }
    }
}

template <DType W>
void matmul_typed(const float* x, int64_t T, const Matrix& m, float* y, ThreadPool& pool) {
    const int64_t N = m.rows, K = m.cols;
#if !defined(__AVX512F__)
    if (T == 1) {  // one token (decode): 4 rows at a time, 8 accumulators in flight instead of 4 (the same sums)
        pool.parallel_for((N + 3) / 4, std::max<int64_t>(1, 2048 / std::max<int64_t>(1, K)),
                          [&](int64_t nb0, int64_t nb1, int) {
                              for (int64_t nb = nb0; nb < nb1; nb++) {
                                  const int64_t n0 = nb * 4;
                                  switch (std::min<int64_t>(4, N - n0)) {
                                      case 4: micro_kernel<W, 4, 1>(x, K, m.data, K, y, N, 0, n0); break;
                                      case 3: micro_kernel<W, 3, 1>(x, K, m.data, K, y, N, 0, n0); break;
                                      case 2: micro_kernel<W, 2, 1>(x, K, m.data, K, y, N, 0, n0); break;
                                      default: micro_kernel<W, 1, 1>(x, K, m.data, K, y, N, 0, n0); break;
                                  }
                              }
                          });
        return;
    }
#endif
    const int64_t n_blocks = (N + kRows - 1) / kRows;
    // Parallel over weight-row blocks: each weight row is read by one thread, once per token chunk.
    const int64_t min_blocks = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, T * K));
    if constexpr (W != DType::F32) {
        if (T >= 8) {  // (prefill) a block's 16-bit rows widened once into an f32 panel, not once per token pair
            pool.parallel_for(n_blocks, min_blocks, [&](int64_t nb0, int64_t nb1, int) {
                thread_local std::vector<float> panel;  // (this worker's; [kRows, K], grown once)
                if (panel.size() < size_t(kRows * K)) panel.resize(size_t(kRows * K));
                for (int64_t nb = nb0; nb < nb1; nb++) {
                    const int64_t n0 = nb * kRows;
                    const int nr = int(std::min<int64_t>(kRows, N - n0));
                    for (int64_t i = 0; i < nr * K; i++) panel[size_t(i)] = load_w1<W>(m.data, n0 * K + i);
                    sweep_panel(x, T, panel.data(), nr, K, y, N, n0);
                }
            });
            return;
        }
    }
    pool.parallel_for(n_blocks, min_blocks, [&](int64_t nb0, int64_t nb1, int) {
        for (int64_t nb = nb0; nb < nb1; nb++) {
            const int64_t n0 = nb * kRows;
            const int nr = int(std::min<int64_t>(kRows, N - n0));
            for (int64_t t0 = 0; t0 < T; t0 += kTokenChunk) {
                const int64_t t1 = std::min(T, t0 + kTokenChunk);
                switch (nr) {
                    case 4: row_block<W, 4>(x, t0, t1, m.data, K, y, N, n0); break;
                    case 3: row_block<W, 3>(x, t0, t1, m.data, K, y, N, n0); break;
                    case 2: row_block<W, 2>(x, t0, t1, m.data, K, y, N, n0); break;
                    default: row_block<W, 1>(x, t0, t1, m.data, K, y, N, n0); break;
                }
            }
        }
    });
}

typedef uint8_t v16b __attribute__((vector_size(16)));

// e4m3fn codes (VB: 16 or 8 bytes) -> f32 (VF, VU: vectors of as many floats / u32), exactly the table's values:
// the 7 magnitude bits placed under an f32's exponent and mantissa (bits << 20) read 2^(e - 127) (1 + m/8), or
// m 2^-129 for e == 0 (an f32 subnormal); times 2^120 (exact) that is 2^(e - 7) (1 + m/8), or m 2^-9. The NaN codes
// (magnitude 0x7f) are set apart, the sign ORed in.
template <class VF = v16f, class VU = v16u, class VB = v16b>
inline VF e4m3_to_f32(const uint8_t* q) {
    VB b;
    std::memcpy(&b, q, sizeof b);
    const VU u = __builtin_convertvector(b, VU), mag = u & 0x7fu;
    VU bits = (VU)((VF)(mag << 20) * 0x1p120f);  // (vector casts: the bits reinterpreted in registers)
    const VU nan = (VU)(mag == 0x7fu);           // (all ones where true)
    bits = ((bits & ~nan) | (0x7fc00000u & nan)) | (u & 0x80u) << 24;
    return (VF)bits;
}

// rows [n0, n0 + nr) of the FP8 matrix m, dequantized into panel [nr, K] f32: fp8 value * the block's scale.
void dequantize_rows(const Matrix& m, const float* table, int64_t n0, int nr, float* panel) {
    const int64_t K = m.cols, scale_cols = fp8_scale_cols(K);
    for (int r = 0; r < nr; r++) {
        const uint8_t* q = static_cast<const uint8_t*>(m.data) + (n0 + r) * K;
        const float* s = m.scales + fp8_scale_row(n0 + r, m.scale_segment_rows) * scale_cols;
        float* out = panel + int64_t(r) * K;
        for (int64_t kb = 0; kb < scale_cols; kb++) {
            const float scale = s[kb];
            int64_t k = kb * kFp8Block;
            const int64_t k1 = std::min(K, k + kFp8Block);
            if (m.dtype == DType::F8_E4M3)
                for (; k + kLanes <= k1; k += kLanes) {
#if defined(__AVX512F__)
                    const v16f v = e4m3_to_f32(q + k) * scale;
                    std::memcpy(out + k, &v, sizeof v);
#else
                    const v8f lo = e4m3_to_f32<v8f, v8u, v8b>(q + k) * scale,
                              hi = e4m3_to_f32<v8f, v8u, v8b>(q + k + 8) * scale;
                    std::memcpy(out + k, &lo, sizeof lo);
                    std::memcpy(out + k + 8, &hi, sizeof hi);
#endif
                }
            for (; k < k1; k++) out[k] = table[q[k]] * scale;
        }
    }
}

// Decode-sized batches (T <= kTokens): micro_kernel with the E4M3 weights dequantized in registers instead of through
// a panel (the same values and the same order of operations, so the same results bitwise).
template <int NR, int T>
void micro_kernel_e4m3(const float* x, const Matrix& m, const float* table, float* y, int64_t n0) {
    const int64_t K = m.cols, N = m.rows, K16 = K / kLanes * kLanes, scale_cols = fp8_scale_cols(K);
    const uint8_t* q[NR];
    const float* s[NR];
    for (int r = 0; r < NR; r++) {
        q[r] = static_cast<const uint8_t*>(m.data) + (n0 + r) * K;
        s[r] = m.scales + fp8_scale_row(n0 + r, m.scale_segment_rows) * scale_cols;
    }
#if !defined(__AVX512F__)
    v8f acc2[2][NR][T];  // [half][r][j], as micro_kernel without AVX-512
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < NR; r++)
            for (int j = 0; j < T; j++) acc2[h][r][j] = v8f{};
    for (int64_t k = 0; k < K16; k += kLanes)
        for (int h = 0; h < 2; h++) {
            v8f wv[NR];
            for (int r = 0; r < NR; r++) wv[r] = e4m3_to_f32<v8f, v8u, v8b>(q[r] + k + 8 * h) * s[r][k / kFp8Block];
            for (int j = 0; j < T; j++) {
                const v8f xv = load_f32<v8f>(x + j * K + k + 8 * h);
                for (int r = 0; r < NR; r++) acc2[h][r][j] += wv[r] * xv;
            }
        }
    for (int64_t k = K16; k < K; k++) {
        const int lane = int(k - K16);
        for (int r = 0; r < NR; r++) {
            const float wk = table[q[r][k]] * s[r][k / kFp8Block];
            for (int j = 0; j < T; j++) acc2[lane >> 3][r][j][lane & 7] += wk * x[j * K + k];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < T; j++) y[j * N + n0 + r] = reduce2(acc2[0][r][j], acc2[1][r][j]);
#else
    v16f acc[NR][T];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < T; j++) acc[r][j] = v16f{};
    for (int64_t k = 0; k < K16; k += kLanes) {
        v16f wv[NR];
        for (int r = 0; r < NR; r++) wv[r] = e4m3_to_f32(q[r] + k) * s[r][k / kFp8Block];
        for (int j = 0; j < T; j++) {
            const v16f xv = load_f32(x + j * K + k);
            for (int r = 0; r < NR; r++) acc[r][j] += wv[r] * xv;
        }
    }
    for (int64_t k = K16; k < K; k++) {
        const int lane = int(k - K16);
        for (int r = 0; r < NR; r++) {
            const float wk = table[q[r][k]] * s[r][k / kFp8Block];
            for (int j = 0; j < T; j++) acc[r][j][lane] += wk * x[j * K + k];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < T; j++) y[j * N + n0 + r] = reduce(acc[r][j]);
#endif
}

template <int T>
void e4m3_rows(const float* x, const Matrix& m, const float* table, float* y, int64_t n0) {
    switch (std::min<int64_t>(kRows, m.rows - n0)) {
        case 4: micro_kernel_e4m3<4, T>(x, m, table, y, n0); break;
        case 3: micro_kernel_e4m3<3, T>(x, m, table, y, n0); break;
        case 2: micro_kernel_e4m3<2, T>(x, m, table, y, n0); break;
        default: micro_kernel_e4m3<1, T>(x, m, table, y, n0); break;
    }
}

void matmul_fp8(const float* x, int64_t T, const Matrix& m, float* y, ThreadPool& pool) {
    if (!m.scales)
        throw Error(Status::internal, std::string("CPU matmul: ") + dtype_name(m.dtype) + " weights without scales");
    const float* table = fp8_table(m.dtype);
    const int64_t N = m.rows, K = m.cols;
    const int64_t n_blocks = (N + kRows - 1) / kRows;
    const int64_t min_blocks = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, T * K));
    if (m.dtype == DType::F8_E4M3 && T <= kTokens) {
        pool.parallel_for(n_blocks, min_blocks, [&](int64_t nb0, int64_t nb1, int) {
            for (int64_t nb = nb0; nb < nb1; nb++) {
                const int64_t n0 = nb * kRows;
                switch (T) {
                    case 1: e4m3_rows<1>(x, m, table, y, n0); break;
                    case 2: e4m3_rows<2>(x, m, table, y, n0); break;
                    case 3: e4m3_rows<3>(x, m, table, y, n0); break;
                    case 4: e4m3_rows<4>(x, m, table, y, n0); break;
                    case 5: e4m3_rows<5>(x, m, table, y, n0); break;
                    default: e4m3_rows<6>(x, m, table, y, n0); break;
                }
            }
        });
        return;
    }
    pool.parallel_for(n_blocks, min_blocks, [&](int64_t nb0, int64_t nb1, int) {
        // The per-thread panel [kRows, K] grows to the widest matrix once, on the first calls.
        thread_local std::vector<float> panel;
        if (panel.size() < size_t(kRows * K)) panel.resize(size_t(kRows * K));
        for (int64_t nb = nb0; nb < nb1; nb++) {
            const int64_t n0 = nb * kRows;
            const int nr = int(std::min<int64_t>(kRows, N - n0));
            dequantize_rows(m, table, n0, nr, panel.data());
            sweep_panel(x, T, panel.data(), nr, K, y, N, n0);
        }
    });
}

}  // namespace

void matmul(const float* x, int64_t rows, const Matrix& w, float* y, ThreadPool& pool) {
    switch (w.dtype) {
        case DType::F32: return matmul_typed<DType::F32>(x, rows, w, y, pool);
        case DType::BF16: return matmul_typed<DType::BF16>(x, rows, w, y, pool);
        case DType::F16: return matmul_typed<DType::F16>(x, rows, w, y, pool);
        case DType::F8_E4M3:
        case DType::F8_E5M2: return matmul_fp8(x, rows, w, y, pool);
        case DType::Q8:
        case DType::Q4: return matmul_int(x, rows, w, y, pool, int_isa_best());
        default: break;
    }
    throw Error(Status::unsupported, std::string("CPU matmul: unsupported weight dtype ") + dtype_name(w.dtype));
}

}  // namespace hy::cpu
