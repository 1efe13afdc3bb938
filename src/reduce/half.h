// IEEE half (f16) and bfloat16 conversions to and from float, round-to-nearest-even.
// Plain integer maths so the same code serves host and CUDA kernels (SMDDP_HD).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SMDDP_HD __host__ __device__ __forceinline__
#else
#define SMDDP_HD inline __attribute__((always_inline))
#endif

namespace smddp::reduce {

SMDDP_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
SMDDP_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

SMDDP_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

SMDDP_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

SMDDP_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // subnormal: value = man * 2^-24
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

SMDDP_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (au >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf (incl. rounding)
  if (au < 0x38800000u) {  // result is subnormal or zero: value / 2^-24, rounded to nearest even
    float a = bits_f32(au) * 16777216.0f;  // exact scaling by 2^24
    uint32_t m = static_cast<uint32_t>(a);
    float rem = a - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = (au >> 23) - 112;
  uint32_t man = au & 0x7fffffu;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into exponent correctly
  return static_cast<uint16_t>(sign | h);
}

}  // namespace smddp::reduce
