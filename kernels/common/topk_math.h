// The top-K kernels' log-sum-exp arithmetic, one definition for the CPU twin and the CUDA kernel.
// lse = m + log(sum_v exp(x_v - m)), exp in f32, the sum in f64, m = row max (NaN and -inf excluded).
// The two backends differ only in summation order and in libm vs CUDA exp/log (a few ulp of the f32 lse).
#pragma once

#include <math.h>

#include "kernels/common/numerics.h"

namespace ddtree::kern {

DDT_HD double exp_term(float x, float m) {
  if (num::is_nan(x) || x == num::kNegInf) return 0.0;
  return double(expf(x - m));
}
DDT_HD double exp_term_d(float lse_s, float m) {
  if (num::is_nan(lse_s) || lse_s == num::kNegInf) return 0.0;
  return exp(double(lse_s) - double(m));
}
DDT_HD float finish_lse(float m, double sum) {
  if (m == num::kNegInf || !(sum > 0.0)) return num::kNegInf;
  return float(double(m) + log(sum));
}
// value - lse; -inf stays -inf (also when the whole row is -inf, where lse = -inf too).
DDT_HD float logprob(float value, float lse) {
  if (value == num::kNegInf || lse == num::kNegInf) return num::kNegInf;
  return DDT_ADD(value, -lse);
}

}  // namespace ddtree::kern
