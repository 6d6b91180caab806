// FP8 (e4m3, e5m2) codes to f32 and bf16 on the device, exactly: every e4m3 and e5m2 value is an f16, an f32 and a
// bf16 value. Shared by the FP8 GEMVs (fp8_matmul.cu) and the MoE experts' FP8 kernels (moe.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace hy::cuda {

// Two fp8 codes (the low byte first) as two exact f32 values: fp8 -> f16 is exact for both formats (cvt.f16x2 on
// 8.9+), f16 -> f32 too.
template <bool kE5M2>
__device__ __forceinline__ float2 fp8x2_to_f32(uint32_t two) {
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), kE5M2 ? __NV_E5M2 : __NV_E4M3);
    return __half22float2(__half2(h));
}

// 16 fp8 codes of a 16-byte word -> f[0..15] (byte i -> f[i]).
template <bool kE5M2>
__device__ __forceinline__ void unpack16(const uint4& u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 lo = fp8x2_to_f32<kE5M2>(w[i]), hi = fp8x2_to_f32<kE5M2>(w[i] >> 16);
        f[4 * i] = lo.x;
        f[4 * i + 1] = lo.y;
        f[4 * i + 2] = hi.x;
        f[4 * i + 3] = hi.y;
    }
}

// Two fp8 codes as a bf16x2 register (exact: every e4m3 and e5m2 value is a bf16 value).
template <bool kE5M2>
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two) {
    const float2 f = fp8x2_to_f32<kE5M2>(two);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t*>(&b);
}

// One fp8 code as its exact f32 value.
template <bool kE5M2>
__device__ __forceinline__ float fp8_to_f32(uint8_t code) {
    return fp8x2_to_f32<kE5M2>(code).x;
}

}  // namespace hy::cuda
