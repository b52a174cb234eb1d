// The top-K kernels' log-sum-exp, one definition for the CPU twin and the CUDA kernel, bitwise identical
// on both: lse = m + log(sum_v e^(x_v - m)) with m the row max (NaN and -inf excluded), e^y from the
// portable exp, each term truncated to a 64-bit fixed-point integer with 2^-44 resolution and summed as
// integers (exact, so any summation order gives the same bits), log from the portable log.
// Accuracy: each term loses < 2^-44 (the sum is >= 1 since the max term is e^0), so the sum's relative
// error is < vocab * 2^-44 (< 1e-8 at 163840) plus the exp's 2e-7 per term; the lse is within a few ulp.
#pragma once

#include <stdint.h>

#include "kernels/common/numerics.h"

namespace ddtree::kern {

constexpr float kFixedOne = 17592186044416.0f;        // 2^44
constexpr float kFixedInv = 5.684341886080801e-14f;   // 2^-44

// e^(x - m) in fixed point; 0 for NaN and -inf.
DDT_HD uint64_t exp_fixed(float x, float m) {
  if (num::is_nan(x) || x == num::kNegInf) return 0;
  return uint64_t(DDT_MUL(num::portable_exp(DDT_ADD(x, -m)), kFixedOne));
}
DDT_HD float finish_lse(float m, uint64_t sum) {
  if (m == -num::kNegInf) return m;  // a +inf logit (flagged by the kernels): lse = +inf
  if (m == num::kNegInf || sum == 0) return num::kNegInf;
  return DDT_ADD(m, num::portable_log(DDT_MUL(float(sum), kFixedInv)));
}
// value - lse; -inf stays -inf (also when the whole row is -inf, where lse = -inf too).
DDT_HD float logprob(float value, float lse) {
  if (value == num::kNegInf || lse == num::kNegInf) return num::kNegInf;
  if (lse == -num::kNegInf) return value == lse ? 0.0f : num::kNegInf;  // +inf logits share all the mass
  return DDT_ADD(value, -lse);
}

}  // namespace ddtree::kern
