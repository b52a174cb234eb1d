// bf16 <-> f32 shared by the host (CPU twins, tests) and the device (CUDA kernels), without cuda_bf16.h:
// a bf16 value is the upper 16 bits of an IEEE f32, passed around as its uint16_t bit pattern.
#pragma once

#include <stdint.h>

#include "kernels/common/numerics.h"

namespace ddtree::num {

constexpr uint16_t kBf16QuietNaN = 0x7FC0u;  // what kernels write for a poisoned (invalid) output

// Exact widening.
DDT_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// Round to nearest, ties to even (as __float2bfloat16_rn for every non-NaN input: finite values that round
// past the largest bf16 become +-inf, subnormals round like normals). NaN stays NaN (sign kept, quiet bit
// set, so a NaN whose payload sits in the low half does not turn into an infinity).
DDT_HD uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(rounded >> 16);
}

DDT_HD bool bf16_is_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7F80u; }

}  // namespace ddtree::num
