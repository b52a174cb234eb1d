// Plain fp32 building blocks of the cpu backend. Every function's summation order is fixed by its
// arguments' lengths only (never by how many rows are processed together), so a row's result is the same
// in any batch: the basis of rule E (FIDELITY.md) on the cpu backend. Compiled with -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>

namespace ddtree::model::ops {

// sum_i a[i] * b[i] over n elements: 8 interleaved partial sums (lane k takes i = k mod 8, summed in
// increasing i), combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then the tail in order. Vectorizes
// without reassociation.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[rows, out] = x[rows, in] @ W[out, in]^T (row-major W as stored by PyTorch's Linear). Each element is
// one dot(): independent of `rows`.
inline void matmul_wt(const float* x, int64_t rows, const float* w, int64_t out, int64_t in, float* y) {
  for (int64_t o = 0; o < out; ++o) {
    const float* wr = w + o * in;
    for (int64_t r = 0; r < rows; ++r) y[r * out + o] = dot(x + r * in, wr, in);
  }
}

// transformers' DeepseekV3RMSNorm in fp32: y = w * (x * rsqrt(mean(x^2) + eps)).
inline void rmsnorm(const float* x, const float* w, int64_t n, double eps, float* y) {
  const float var = dot(x, x, n) / float(n);
  const float r = 1.0f / std::sqrt(var + float(eps));
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace ddtree::model::ops
