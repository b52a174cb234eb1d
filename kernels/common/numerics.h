// Exact, portable numerics shared by the CPU twins and the CUDA kernels (host and device).
//
// Everything here must produce bitwise-identical results on the host (g++, -ffp-contract=off) and on the
// device (nvcc): float arithmetic goes through DDT_ADD / DDT_MUL / DDT_DIV, which are the _rn intrinsics
// on the device (never contracted into FMAs) and plain operators on the host. Nothing here calls libm.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define DDT_HD __host__ __device__ __forceinline__
#else
#define DDT_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define DDT_ADD(a, b) __fadd_rn((a), (b))
#define DDT_MUL(a, b) __fmul_rn((a), (b))
#define DDT_DIV(a, b) __fdiv_rn((a), (b))
#else
#define DDT_ADD(a, b) ((a) + (b))
#define DDT_MUL(a, b) ((a) * (b))
#define DDT_DIV(a, b) ((a) / (b))
#endif

namespace ddtree::num {

DDT_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return __builtin_bit_cast(uint32_t, x);
#endif
}
DDT_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}
DDT_HD bool is_nan(float x) { return (f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

constexpr float kNegInf = -__builtin_huge_valf();

// Order-preserving map f32 -> u32: a < b  <=>  order_bits(a) < order_bits(b), and -0 == +0 (as for
// plain argmax, so ties between them go to the smaller id). NaN maps like -inf (callers flag it). The smallest image, order_bits(-inf) = 0x007FFFFF, is > 0, so a
// packed key of 0 is below every real key and marks "empty".
DDT_HD uint32_t order_bits(float x) {
  if (is_nan(x)) x = kNegInf;
  if (x == 0.0f) x = 0.0f;  // -0 -> +0
  const uint32_t u = f32_bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
DDT_HD float from_order_bits(uint32_t k) {
  return bits_f32((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// Packed argmax key: larger value wins, ties to the smaller id (0xFFFFFFFF - id in the low half).
DDT_HD uint64_t pack_key(float value, uint32_t id) {
  return (uint64_t(order_bits(value)) << 32) | uint64_t(0xFFFFFFFFu - id);
}
DDT_HD uint32_t key_id(uint64_t key) { return 0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu); }
DDT_HD float key_value(uint64_t key) { return from_order_bits(uint32_t(key >> 32)); }

// SplitMix64 finaliser: a bijective 64-bit mixer.
DDT_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Natural log of a positive normal float from +, *, / only (bitwise identical on host and device).
// x = m 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.172, series to
// s^9: truncation < 3e-9 relative; absolute error of the result ~1e-7. Not for x <= 0 (returns -inf).
DDT_HD float portable_log(float x) {
  uint32_t u = f32_bits(x);
  if (x <= 0.0f || (u & 0x7F800000u) == 0u) return kNegInf;  // zero, negative or subnormal
  int e = int((u >> 23) & 0xFFu) - 127;
  float m = bits_f32((u & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421356f) { m = DDT_MUL(m, 0.5f); e += 1; }
  const float f = DDT_ADD(m, -1.0f);                    // exact (Sterbenz)
  const float s = DDT_DIV(f, DDT_ADD(2.0f, f));
  const float s2 = DDT_MUL(s, s);
  float poly = DDT_ADD(DDT_MUL(s2, 1.0f / 9.0f), 1.0f / 7.0f);
  poly = DDT_ADD(DDT_MUL(poly, s2), 1.0f / 5.0f);
  poly = DDT_ADD(DDT_MUL(poly, s2), 1.0f / 3.0f);
  poly = DDT_ADD(DDT_MUL(poly, s2), 1.0f);
  const float ln_m = DDT_MUL(DDT_MUL(2.0f, s), poly);
  return DDT_ADD(DDT_MUL(float(e), 0.693147182f), ln_m);
}

// floor(x) as an int for |x| < 2^31, from a truncating conversion (exact on both sides).
DDT_HD int floor_to_int(float x) {
  const int t = int(x);
  return (float(t) > x) ? t - 1 : t;
}

// e^y for y <= 0 from +, *, / and exponent bits (bitwise identical on host and device). y = k ln2 + r with
// |r| <= ln2 / 2 (Cody-Waite split of ln2), e^r by its Taylor series to r^8 (truncation < 1e-8 relative),
// scaled by 2^k; y < -87 (below the normal range) gives 0. Relative error ~2e-7.
DDT_HD float portable_exp(float y) {
  if (!(y > -87.0f)) return 0.0f;  // also NaN -> 0
  if (y > 0.0f) y = 0.0f;
  const int k = floor_to_int(DDT_ADD(DDT_MUL(y, 1.44269504f), 0.5f));
  const float kf = float(k);
  const float r = DDT_ADD(DDT_ADD(y, -DDT_MUL(kf, 0.693145752f)), -DDT_MUL(kf, 1.42860677e-06f));
  float p = DDT_ADD(DDT_MUL(r, 1.0f / 40320.0f), 1.0f / 5040.0f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f / 720.0f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f / 120.0f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f / 24.0f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f / 6.0f);
  p = DDT_ADD(DDT_MUL(p, r), 0.5f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f);
  p = DDT_ADD(DDT_MUL(p, r), 1.0f);              // e^r in [0.70, 1.42]
  return DDT_MUL(p, bits_f32(uint32_t(k + 127) << 23));  // k in [-126, 0]: 2^k is a normal float
}

// Gumbel(0, 1) noise keyed by (request seed, absolute output position, token id): the same numbers on
// every backend, rank and step, so speculative sampling draws exactly what plain sampling draws.
// u = (2 j + 1) 2^-24 with j a 23-bit hash: exact in f32, strictly inside (0, 1).
DDT_HD float gumbel(uint64_t seed, int64_t position, uint32_t token) {
  const uint64_t h = mix64(mix64(mix64(seed) ^ uint64_t(position)) ^ uint64_t(token));
  const float u = DDT_MUL(float(uint32_t(h >> 41) * 2u + 1u), 5.9604644775390625e-08f);  // 2^-24
  return -portable_log(-portable_log(u));
}

// Value whose packed key a sampling (T > 0) or greedy (T == 0) accept compares. NaN -> -inf.
DDT_HD float sample_value(float logit, float temperature, uint64_t seed, int64_t position, uint32_t token) {
  if (is_nan(logit)) return kNegInf;
  if (temperature == 0.0f) return logit;
  return DDT_ADD(DDT_DIV(logit, temperature), gumbel(seed, position, token));
}

}  // namespace ddtree::num
