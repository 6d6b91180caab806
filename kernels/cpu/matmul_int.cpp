// CPU matmul y = x W^T with integer weights (Q8 / Q4, `--quant int8` / `--quant int4`; layout in kernels/backend.h).
//
// The activations are quantized per row and weight group to int8 (quantize_activations: scale amax / 127, codes
// rounded to nearest even), the products of codes are summed exactly in int32 per group, and each output is
//   y[t, n] = fma chain over the groups g in increasing order: acc = fma(float(isum_g), ws[n, g] * xs[t, g], acc)
// from acc = 0. float(isum_g) is exact (|isum_g| <= 1024 * 127 * 127 < 2^24), so every variant below (scalar, AVX2,
// AVX-512 VNNI) gives the same bits, whatever the batch, the tile a row falls into or the thread count.
//
// The SIMD variants are compiled with target attributes and chosen at run time (__builtin_cpu_supports), so the
// binary runs on CPUs without them. AVX-512 VNNI: vpdpbusd takes unsigned x signed bytes; the weights are the
// unsigned side (Q8 codes + 128 by an xor, Q4 nibbles as stored = code + 8) and the exact correction is
// 128 * sum(x) (Q8) or 8 * sum(x) (Q4) per row and group, from sums kept with the quantized activations. A tile of
// NR weight rows x NT tokens (NR * NT = 16) keeps 16 int32 accumulators, reduced at the end of each group into one
// vector of the 16 group sums by a transpose-add tree: 512-bit products for groups of 32 (a 64-byte chunk's two
// halves of lanes are its two groups), 256-bit products for larger groups (a cheaper tree on CPUs that split
// 512-bit operations). AVX2: 32 columns at a time, vpmaddubsw with the sign trick (|w| times x carrying w's sign)
// for Q8, the nibbles directly for Q4, tiles of 4 rows x 2 tokens (8 rows x 1 token for one token) reduced by the
// same kind of tree (Q4 in groups of 32: on the 16-bit products themselves, which are small enough).
#include <immintrin.h>

// GCC 12's AVX-512 headers make casts from a wider "undefined" vector (_mm512_castsi256_si512 and the like), which
// -Wmaybe-uninitialized reports inside the headers themselves: a false positive, not about our values.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace hy::cpu {

namespace {

constexpr int64_t kTokenPad = 16;  // the activation scale arrays hold 16 readable entries past the last row

// The int8 activations of one matmul call: xq [T, K] codes, and per group g and row t (transposed, so that
// consecutive rows are adjacent) the scale xs[g * ld + t] = amax / 127 and the code sum xsum[g * ld + t].
struct QuantizedActivations {
    const int8_t* q = nullptr;
    const float* scale = nullptr;
    const int32_t* sum = nullptr;
    int64_t ld = 0;  // row stride of scale and sum: T rounded up to 4, plus kTokenPad
};

// Row t's group g of x [.., K] quantized (see matmul_int in cpu_ops.h).
void quantize_group(const float* x, int64_t n, int8_t* q, float* scale, int32_t* sum) {
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < n; i++) {
        finite = finite && std::isfinite(x[i]);
        amax = std::max(amax, std::fabs(x[i]));
    }
    if (!finite || amax == 0.0f) {
        std::memset(q, 0, size_t(n));
        *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        *sum = 0;
        return;
    }
    const float inv = 127.0f / amax;
    int32_t s = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f);
        q[i] = int8_t(v);
        s += int32_t(v);
    }
    *scale = amax / 127.0f;
    *sum = s;
}

#define HY_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// quantize_group with AVX-512 (n a multiple of 16): the same operations lane by lane (max of |x|, x * inv rounded to
// nearest even, clamped; the sum of the codes in int32), so the same codes, scale and sum.
HY_TARGET_AVX512 void quantize_group_avx512(const float* x, int64_t n, int8_t* q, float* scale, int32_t* sum) {
    __m512 amax_v = _mm512_setzero_ps();
    __mmask16 bad = 0;
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 a = _mm512_and_ps(_mm512_loadu_ps(x + i), abs_mask);
        bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ);  // inf or NaN
        amax_v = _mm512_max_ps(amax_v, a);
    }
    const float amax = _mm512_reduce_max_ps(amax_v);
    if (bad || amax == 0.0f) {
        std::memset(q, 0, size_t(n));
        *scale = bad ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        *sum = 0;
        return;
    }
    const __m512 inv = _mm512_set1_ps(127.0f / amax), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512i s = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i c = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
        s = _mm512_add_epi32(s, c);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(c));
    }
    *scale = amax / 127.0f;
    *sum = _mm512_reduce_add_epi32(s);
}

#define HY_TARGET_AVX2_Q __attribute__((target("avx2,fma")))

// quantize_group with AVX2 (n a multiple of 8): as quantize_group_avx512, 8 lanes at a time.
HY_TARGET_AVX2_Q void quantize_group_avx2(const float* x, int64_t n, int8_t* q, float* scale, int32_t* sum) {
    __m256 amax_v = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
        amax_v = _mm256_max_ps(amax_v, a);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax_v), _mm256_extractf128_ps(amax_v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float amax = _mm_cvtss_f32(m);
    if (_mm256_movemask_ps(bad) != 0 || amax == 0.0f) {
        std::memset(q, 0, size_t(n));
        *scale = _mm256_movemask_ps(bad) != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        *sum = 0;
        return;
    }
    const __m256 inv = _mm256_set1_ps(127.0f / amax), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i s = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v =
            _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
        s = _mm256_add_epi32(s, c);
        const __m128i c16 = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(c16, c16));
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    *scale = amax / 127.0f;
    *sum = _mm_cvtsi128_si32(t);
}

// (the AVX-512 quantizer goes with the VNNI kernels, the AVX2 one with the AVX2 kernels, the scalar one with the
// scalar kernels: the tests' comparison of the instruction sets covers all three)
QuantizedActivations quantize_activations(const float* x, int64_t T, int64_t K, int64_t group, IntIsa isa,
                                          ThreadPool& pool) {
    // Grows to the largest call once (the first steps); rows past T are zero codes with scale 0.
    thread_local std::vector<int8_t> q;
    thread_local std::vector<float> scale;
    thread_local std::vector<int32_t> sum;
    const int64_t t_pad = (T + 3) / 4 * 4, ld = t_pad + kTokenPad, G = K / group;
    if (q.size() < size_t(t_pad * K)) q.resize(size_t(t_pad * K));
    if (scale.size() < size_t(G * ld)) {
        scale.resize(size_t(G * ld));
        sum.resize(size_t(G * ld));
    }
    std::memset(q.data() + T * K, 0, size_t((t_pad - T) * K));
    for (int64_t g = 0; g < G; g++) {
        std::fill(scale.begin() + g * ld + T, scale.begin() + (g + 1) * ld, 0.0f);
        std::fill(sum.begin() + g * ld + T, sum.begin() + (g + 1) * ld, 0);
    }
    auto* const quantize = isa == IntIsa::avx512_vnni              ? quantize_group_avx512
                           : isa == IntIsa::avx2 && group % 8 == 0 ? quantize_group_avx2
                                                                   : quantize_group;
    int8_t* qp = q.data();
    float* sp = scale.data();
    int32_t* up = sum.data();
    pool.parallel_for(T, std::max<int64_t>(1, 16384 / K), [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; t++)
            for (int64_t g = 0; g < G; g++)
                quantize(x + t * K + g * group, group, qp + t * K + g * group, sp + g * ld + t, up + g * ld + t);
    });
    return {qp, sp, up, ld};
}

// ---- scalar reference -------------------------------------------------------------------------------------------

inline int weight_code(const Matrix& m, int64_t r, int64_t c) {
    if (m.dtype == DType::Q8) return static_cast<const int8_t*>(m.data)[r * m.cols + c];
    return q4_code(static_cast<const uint8_t*>(m.data) + r * (m.cols / 2), c);
}

void rows_scalar(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t n0, int64_t n1, float* y) {
    const int64_t K = m.cols, N = m.rows, G = K / m.group;
    thread_local std::vector<int> w;
    if (w.size() < size_t(K)) w.resize(size_t(K));
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t c = 0; c < K; c++) w[size_t(c)] = weight_code(m, n, c);
        const float* ws = m.scales + n * G;
        for (int64_t t = 0; t < T; t++) {
            const int8_t* xq = a.q + t * K;
            float acc = 0.0f;
            for (int64_t g = 0; g < G; g++) {
                int32_t isum = 0;
                for (int64_t c = g * m.group; c < (g + 1) * m.group; c++) isum += w[size_t(c)] * int32_t(xq[c]);
                acc = std::fma(float(isum), ws[g] * a.scale[g * a.ld + t], acc);
            }
            y[t * N + n] = acc;
        }
    }
}

// ---- AVX2 -------------------------------------------------------------------------------------------------------

#define HY_TARGET_AVX2 __attribute__((target("avx2,fma")))

// v[i] = the sum of the 8 lanes of a[i], for 8 vectors (a transpose-add tree: pairs of lanes, pairs of 64-bit
// halves, then the two 128-bit blocks).
HY_TARGET_AVX2 inline __m256i reduce8_avx2(const __m256i* a) {
    __m256i b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                                _mm256_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
    // c[m] block q lane p: block q's sum of a[4m + p]
    return _mm256_add_epi32(_mm256_permute2x128_si256(c[0], c[1], 0x20), _mm256_permute2x128_si256(c[0], c[1], 0x31));
}

// v[i] = the sum of the 16 int16 lanes of a[i] as int32, for 8 vectors whose 8-lane halves sum to at most 2^15 - 1
// in magnitude (Q4 products of one 32-column step: |lane| <= 2 * 15 * 127, 8 of them <= 30,480): the transpose-add
// tree of reduce8_avx2 on 16-bit lanes within each 128-bit half, then the two halves widened and added. The same
// sums as madd-by-ones then reduce8_avx2, in fewer operations.
HY_TARGET_AVX2 inline __m256i reduce8_avx2_i16(const __m256i* a) {
    __m256i b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_epi16(_mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]),
                                _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_epi16(_mm256_unpacklo_epi32(b[2 * i], b[2 * i + 1]),
                                _mm256_unpackhi_epi32(b[2 * i], b[2 * i + 1]));
    // per 128-bit half, lane i: the sum of that half's 8 lanes of a[i]
    const __m256i d = _mm256_add_epi16(_mm256_unpacklo_epi64(c[0], c[1]), _mm256_unpackhi_epi64(c[0], c[1]));
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(d)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(d, 1)));
}

// Rows [n0, n0 + NR) (clamped to the last row) x tokens [t0, t0 + NT) (rows past T hold zero codes), NR x NT = 8;
// lane i is pair (row i / NT, token i % NT). ws8: the weight scales of the lanes, [G][8] (ws8[g * 8 + i] = scale of
// row n0 + i / NT, group g). One token (decode): 8 rows x 1 token, so no lane works on a padding row.
template <DType W, int NR, int NT>
HY_TARGET_AVX2 void tile_avx2(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t n0, int64_t t0,
                              const float* ws8, float* y) {
    static_assert(NR * NT == 8, "a tile is 8 (row, token) pairs");
    const int64_t K = m.cols, N = m.rows, group = m.group, G = K / group;
    const uint8_t* w[NR];
    for (int r = 0; r < NR; r++)
        w[r] = static_cast<const uint8_t*>(m.data) + size_t(std::min(n0 + r, N - 1)) * row_bytes(W, K);
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
    // lane i: token i % NT
    const __m256i tsel = NT == 2 ? _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1) : _mm256_setzero_si256();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m256i iacc[NR * NT];
        if (W == DType::Q4 && group == 32) {  // one step: the 16-bit products go to the 16-bit tree
            const int64_t k = g * 32;
            __m256i wv[NR];
            for (int r = 0; r < NR; r++) {
                const __m256i br = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k / 64 * 32));
                wv[r] = _mm256_and_si256(k % 64 == 0 ? br : _mm256_srli_epi16(br, 4), low4);
            }
            for (int t = 0; t < NT; t++) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * K + k));
                for (int r = 0; r < NR; r++) iacc[r * NT + t] = _mm256_maddubs_epi16(wv[r], xv);
            }
        } else {
            for (int i = 0; i < NR * NT; i++) iacc[i] = _mm256_setzero_si256();
            for (int64_t k = g * group; k < (g + 1) * group; k += 32) {  // (32 columns: half a chunk)
                __m256i wv[NR];
                for (int r = 0; r < NR; r++) {
                    if constexpr (W == DType::Q8) {
                        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
                    } else {  // the chunk's low nibbles hold its first 32 columns, the high nibbles the next 32
                        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k / 64 * 32));
                        wv[r] = _mm256_and_si256(k % 64 == 0 ? b : _mm256_srli_epi16(b, 4), low4);
                    }
                }
                for (int t = 0; t < NT; t++) {
                    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * K + k));
                    for (int r = 0; r < NR; r++) {
                        // Q8: |w| * (x with w's sign), exact (|w|, |x| <= 127: pairs <= 32258); Q4: nibble (<= 15) * x
                        const __m256i p =
                            W == DType::Q8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv[r]), _mm256_sign_epi8(xv, wv[r]))
                                           : _mm256_maddubs_epi16(wv[r], xv);
                        iacc[r * NT + t] = _mm256_add_epi32(iacc[r * NT + t], _mm256_madd_epi16(p, ones));
                    }
                }
            }
        }
        __m256i isum = W == DType::Q4 && group == 32 ? reduce8_avx2_i16(iacc) : reduce8_avx2(iacc);
        if constexpr (W == DType::Q4) {  // - 8 * sum(x): the nibbles are code + 8
            const __m256i xsum = _mm256_permutevar8x32_epi32(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sum + g * a.ld + t0)), tsel);
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(xsum, 3));
        }
        const __m256 xs = _mm256_permutevar8x32_ps(_mm256_loadu_ps(a.scale + g * a.ld + t0), tsel);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_loadu_ps(ws8 + g * 8), xs), acc);
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, acc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++)
            if (n0 + r < N && t0 + t < T) y[(t0 + t) * N + n0 + r] = out[r * NT + t];
}

template <DType W, int NR, int NT>
HY_TARGET_AVX2 void rows_avx2(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t nb0, int64_t nb1,
                              float* y) {
    const int64_t N = m.rows, G = m.cols / m.group;
    thread_local std::vector<float> ws8;
    if (ws8.size() < size_t(G * 8)) ws8.resize(size_t(G * 8));
    for (int64_t nb = nb0; nb < nb1; nb++) {
        const int64_t n0 = nb * NR;
        for (int64_t g = 0; g < G; g++)
            for (int i = 0; i < 8; i++) ws8[size_t(g * 8 + i)] = m.scales[std::min(n0 + i / NT, N - 1) * G + g];
        for (int64_t t0 = 0; t0 < T; t0 += NT) tile_avx2<W, NR, NT>(a, T, m, n0, t0, ws8.data(), y);
    }
}

// ---- AVX-512 VNNI -----------------------------------------------------------------------------------------------

#define HY_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))

// For 16 vectors a[i]: lo[i] = the sum of lanes 0..7 of a[i] (bytes 0..31 of a dpbusd chunk), hi[i] = of lanes
// 8..15 (a transpose-add tree: pairs of lanes, pairs of 64-bit halves, then 128-bit blocks).
HY_TARGET_VNNI inline void reduce16_halves(const __m512i* a, __m512i* lo, __m512i* hi) {
    __m512i b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                                _mm512_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
    // c[m] block q lane p: block q's sum of a[4m + p]
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0x88),
                                _mm512_shuffle_i32x4(c[2 * i], c[2 * i + 1], 0xdd));
    // d[j] blocks: lanes 0..7 of a[8j + p], lanes 8..15 of a[8j + p], then the same of a[8j + 4 + p]
    *lo = _mm512_shuffle_i32x4(d[0], d[1], 0x88);
    *hi = _mm512_shuffle_i32x4(d[0], d[1], 0xdd);
}

// Groups of 32: rows [n0, n0 + NR) (clamped to the last row) x tokens [t0, t0 + NT); pair i = r * NT + t (its
// token i % NT: tsel). ws16: the weight scales of the tile's pairs, [G][16] (ws16[g * 16 + i] = scale of row
// n0 + i / NT, group g). Each 64-byte chunk is one dpbusd per pair; its lanes 0..7 and 8..15 are the two groups.
template <DType W, int NR, int NT>
HY_TARGET_VNNI void tile_vnni_g32(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t n0, int64_t t0,
                                  __m512i tsel, const float* ws16, float* y) {
    static_assert(NR * NT == 16);
    const int64_t K = m.cols, N = m.rows, group = m.group, G = K / group;
    const uint8_t* w[NR];
    for (int r = 0; r < NR; r++)
        w[r] = static_cast<const uint8_t*>(m.data) + size_t(std::min(n0 + r, N - 1)) * row_bytes(W, K);
    const __m512i flip = _mm512_set1_epi8(char(0x80)), low4 = _mm512_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    // acc = fma(float(group g's exact sums), ws * xs, acc), raw: the sums of (unsigned weight) * x
    auto add_group = [&](__m512i raw, int64_t g) HY_TARGET_VNNI {
        const __m512i xsum = _mm512_permutexvar_epi32(tsel, _mm512_loadu_si512(a.sum + g * a.ld + t0));
        const __m512i isum = _mm512_sub_epi32(raw, _mm512_slli_epi32(xsum, W == DType::Q8 ? 7 : 3));  // - 128|8 sum x
        const __m512 xs = _mm512_permutexvar_ps(tsel, _mm512_loadu_ps(a.scale + g * a.ld + t0));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_loadu_ps(ws16 + g * 16), xs), acc);
    };
    for (int64_t g = 0; g < G; g += 2) {  // (the two groups of 32 of chunk g / 2)
        __m512i iacc[16];
        for (int i = 0; i < 16; i++) iacc[i] = _mm512_setzero_si512();
        {
            const int64_t k = g * group;
            __m512i wv[NR];
            for (int r = 0; r < NR; r++) {
                if constexpr (W == DType::Q8) {
                    wv[r] = _mm512_xor_si512(_mm512_loadu_si512(w[r] + k), flip);  // code + 128, unsigned
                } else {
                    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k / 2));
                    wv[r] = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1),
                                             low4);
                }
            }
            for (int t = 0; t < NT; t++) {
                const __m512i xv = _mm512_loadu_si512(a.q + (t0 + t) * K + k);
                for (int r = 0; r < NR; r++) iacc[r * NT + t] = _mm512_dpbusd_epi32(iacc[r * NT + t], wv[r], xv);
            }
        }
        __m512i lo, hi;
        reduce16_halves(iacc, &lo, &hi);
        add_group(lo, g);
        add_group(hi, g + 1);
    }
    alignas(64) float out[16];
    _mm512_store_ps(out, acc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++)
            if (n0 + r < N && t0 + t < T) y[(t0 + t) * N + n0 + r] = out[r * NT + t];
}

// reduce16 on 256-bit vectors: v[i] = the sum of the 8 lanes of a[i] (lanes 0..7 of the result from a[0..7],
// lanes 8..15 from a[8..15]).
HY_TARGET_VNNI inline __m512i reduce16_256(const __m256i* a) {
    __m256i b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                                _mm256_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
    // c[m] block q lane p: block q's sum of a[4m + p]
    const __m256i e0 =
        _mm256_add_epi32(_mm256_permute2x128_si256(c[0], c[1], 0x20), _mm256_permute2x128_si256(c[0], c[1], 0x31));
    const __m256i e1 =
        _mm256_add_epi32(_mm256_permute2x128_si256(c[2], c[3], 0x20), _mm256_permute2x128_si256(c[2], c[3], 0x31));
    return _mm512_inserti64x4(_mm512_castsi256_si512(e0), e1, 1);
}

// Groups of 64 and more: as tile_vnni with 256-bit products (32 columns a step) and one reduction per group; on
// CPUs that split 512-bit operations in two (AMD Zen 4) its reduction tree costs half as much.
template <DType W, int NR, int NT>
HY_TARGET_VNNI void tile_vnni256(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t n0, int64_t t0,
                                 __m512i tsel, const float* ws16, float* y) {
    static_assert(NR * NT == 16);
    const int64_t K = m.cols, N = m.rows, group = m.group, G = K / group;
    const uint8_t* w[NR];
    for (int r = 0; r < NR; r++)
        w[r] = static_cast<const uint8_t*>(m.data) + size_t(std::min(n0 + r, N - 1)) * row_bytes(W, K);
    const __m256i flip = _mm256_set1_epi8(char(0x80)), low4 = _mm256_set1_epi8(0x0f);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m256i iacc[16];
        for (int i = 0; i < 16; i++) iacc[i] = _mm256_setzero_si256();
        for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
            __m256i wv[NR];
            for (int r = 0; r < NR; r++) {
                if constexpr (W == DType::Q8) {
                    wv[r] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k)), flip);
                } else {  // the chunk's low nibbles hold its first 32 columns, the high nibbles the next 32
                    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k / 64 * 32));
                    wv[r] = _mm256_and_si256(k % 64 == 0 ? b : _mm256_srli_epi16(b, 4), low4);
                }
            }
            for (int t = 0; t < NT; t++) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * K + k));
                for (int r = 0; r < NR; r++) iacc[r * NT + t] = _mm256_dpbusd_epi32(iacc[r * NT + t], wv[r], xv);
            }
        }
        const __m512i xsum = _mm512_permutexvar_epi32(tsel, _mm512_loadu_si512(a.sum + g * a.ld + t0));
        const __m512i isum = _mm512_sub_epi32(reduce16_256(iacc), _mm512_slli_epi32(xsum, W == DType::Q8 ? 7 : 3));
        const __m512 xs = _mm512_permutexvar_ps(tsel, _mm512_loadu_ps(a.scale + g * a.ld + t0));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_loadu_ps(ws16 + g * 16), xs), acc);
    }
    alignas(64) float out[16];
    _mm512_store_ps(out, acc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++)
            if (n0 + r < N && t0 + t < T) y[(t0 + t) * N + n0 + r] = out[r * NT + t];
}

// Groups of 32: the 512-bit tile (one reduction serves the two groups of a chunk); larger groups: the 256-bit one
// (measured on the dev VM, AMD Zen 4: about 12% faster for groups of 64 and 128, 3-8% slower for 32; on CPUs with
// full-width 512-bit units the balance may differ).
template <DType W, int NR, int NT>
HY_TARGET_VNNI void rows_vnni(const QuantizedActivations& a, int64_t T, const Matrix& m, int64_t nb0, int64_t nb1,
                              float* y) {
    const int64_t N = m.rows, G = m.cols / m.group;
    thread_local std::vector<float> ws16;
    if (ws16.size() < size_t(G * 16)) ws16.resize(size_t(G * 16));
    alignas(64) int32_t idx_t[16];  // lane i of a tile: token i % NT
    for (int i = 0; i < 16; i++) idx_t[i] = i % NT;
    const __m512i tsel = _mm512_load_si512(idx_t);
    for (int64_t nb = nb0; nb < nb1; nb++) {
        const int64_t n0 = nb * NR;
        for (int64_t g = 0; g < G; g++)
            for (int i = 0; i < 16; i++) ws16[size_t(g * 16 + i)] = m.scales[std::min(n0 + i / NT, N - 1) * G + g];
        if (m.group == 32)
            for (int64_t t0 = 0; t0 < T; t0 += NT) tile_vnni_g32<W, NR, NT>(a, T, m, n0, t0, tsel, ws16.data(), y);
        else
            for (int64_t t0 = 0; t0 < T; t0 += NT) tile_vnni256<W, NR, NT>(a, T, m, n0, t0, tsel, ws16.data(), y);
    }
}

// rows(nb0, nb1) over the blocks of NR weight rows of an N x K matrix, shared out in pieces of about 8192 / (T K /
// NR) blocks (at least one).
template <int NR, class Rows>
void for_row_blocks(ThreadPool& pool, int64_t N, int64_t K, int64_t T, Rows&& rows) {
    pool.parallel_for((N + NR - 1) / NR, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, T * K / NR)),
                      [&](int64_t nb0, int64_t nb1, int) { rows(nb0, nb1); });
}

template <DType W>
void matmul_vnni(const QuantizedActivations& a, int64_t T, const Matrix& m, float* y, ThreadPool& pool) {
    const int64_t N = m.rows, K = m.cols;
    if (T == 1)
        for_row_blocks<16>(pool, N, K, T, [&](int64_t b0, int64_t b1) { rows_vnni<W, 16, 1>(a, T, m, b0, b1, y); });
    else if (T == 2)
        for_row_blocks<8>(pool, N, K, T, [&](int64_t b0, int64_t b1) { rows_vnni<W, 8, 2>(a, T, m, b0, b1, y); });
    else
        for_row_blocks<4>(pool, N, K, T, [&](int64_t b0, int64_t b1) { rows_vnni<W, 4, 4>(a, T, m, b0, b1, y); });
}

template <DType W>
void matmul_avx2(const QuantizedActivations& a, int64_t T, const Matrix& m, float* y, ThreadPool& pool) {
    const int64_t N = m.rows, K = m.cols;
    if (T == 1)  // (one token: 8 rows a tile, no padding token)
        for_row_blocks<8>(pool, N, K, T, [&](int64_t b0, int64_t b1) { rows_avx2<W, 8, 1>(a, T, m, b0, b1, y); });
    else
        for_row_blocks<4>(pool, N, K, T, [&](int64_t b0, int64_t b1) { rows_avx2<W, 4, 2>(a, T, m, b0, b1, y); });
}

}  // namespace

const char* int_isa_name(IntIsa isa) {
    switch (isa) {
        case IntIsa::avx512_vnni: return "avx512-vnni";
        case IntIsa::avx2: return "avx2";
        case IntIsa::scalar: break;
    }
    return "scalar";
}

bool int_isa_supported(IntIsa isa) {
    switch (isa) {
        case IntIsa::avx512_vnni:
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512vnni");
        case IntIsa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case IntIsa::scalar: break;
    }
    return true;
}

IntIsa int_isa_best() {
    static const IntIsa best = int_isa_supported(IntIsa::avx512_vnni) ? IntIsa::avx512_vnni
                               : int_isa_supported(IntIsa::avx2)      ? IntIsa::avx2
                                                                      : IntIsa::scalar;
    return best;
}

void matmul_int(const float* x, int64_t rows, const Matrix& w, float* y, ThreadPool& pool, IntIsa isa) {
    if (!is_int_quant(w.dtype) || !w.scales || !int_quant_shape_ok(w.cols, w.group))
        throw Error(Status::internal, std::string("CPU matmul: ") + dtype_name(w.dtype) + " weights [" +
                                          std::to_string(w.rows) + ", " + std::to_string(w.cols) + "] with group " +
                                          std::to_string(w.group) + (w.scales ? "" : " and no scales"));
    if (!int_isa_supported(isa))
        throw Error(Status::unsupported, std::string("CPU matmul: this CPU lacks ") + int_isa_name(isa));
    if (rows <= 0) return;
    const QuantizedActivations a = quantize_activations(x, rows, w.cols, w.group, isa, pool);
    const bool q8 = w.dtype == DType::Q8;
    switch (isa) {
        case IntIsa::avx512_vnni:
            return q8 ? matmul_vnni<DType::Q8>(a, rows, w, y, pool) : matmul_vnni<DType::Q4>(a, rows, w, y, pool);
        case IntIsa::avx2:
            return q8 ? matmul_avx2<DType::Q8>(a, rows, w, y, pool) : matmul_avx2<DType::Q4>(a, rows, w, y, pool);
        case IntIsa::scalar: break;
    }
    pool.parallel_for(w.rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, rows * w.cols)),
                      [&](int64_t n0, int64_t n1, int) { rows_scalar(a, rows, w, n0, n1, y); });
}

}  // namespace hy::cpu
