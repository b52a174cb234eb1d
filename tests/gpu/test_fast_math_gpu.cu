// The flash kernels' fast device math against the CUDA library over every f32 input (kernels/cuda/fast_math.cuh).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/cuda/fast_math.cuh"

namespace {

// counts[0]: inputs whose exp2f result is normal, zero, inf or NaN and whose exp2_ftz bits differ from it;
// counts[1]: inputs whose exp2f result is a denormal and whose exp2_ftz result is not +0; counts[2]: inputs with a
// denormal exp2f result (flushed: the documented difference); counts[3]: inputs checked.
__global__ void exp2_ftz_against_exp2f(unsigned long long* counts) {
  unsigned long long differ = 0, not_flushed = 0, denormal = 0, checked = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const float x = __uint_as_float(uint32_t(i));
    const float want = exp2f(x), got = ddtree::kern::attn::exp2_ftz(x);
    const uint32_t wb = __float_as_uint(want), gb = __float_as_uint(got);
    const bool want_denormal = (wb & 0x7F800000u) == 0 && (wb & 0x007FFFFFu) != 0;
    if (want_denormal) {
      ++denormal;
      not_flushed += gb != 0u;
    } else if (want != want) {  // NaN: any NaN
      differ += got == got;
    } else {
      differ += wb != gb;
    }
    ++checked;
  }
  atomicAdd(&counts[0], differ);
  atomicAdd(&counts[1], not_flushed);
  atomicAdd(&counts[2], denormal);
  atomicAdd(&counts[3], checked);
}

TEST(FastMath, Exp2FtzEqualsExp2fWhereverTheResultIsNormal) {
  unsigned long long* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4 * sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 4 * sizeof(unsigned long long)), cudaSuccess);
  exp2_ftz_against_exp2f<<<1024, 256>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long h[4] = {};
  ASSERT_EQ(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  std::printf("  exp2_ftz vs exp2f: %llu inputs, %llu with a denormal exp2f result (all flushed: %s), %llu differing "
              "elsewhere\n", h[3], h[2], h[1] == 0 ? "yes" : "no", h[0]);
  EXPECT_EQ(h[3], 1ull << 32);
  EXPECT_EQ(h[0], 0ull) << "exp2_ftz differs from exp2f where the result is normal, zero, inf or NaN";
  EXPECT_EQ(h[1], 0ull) << "exp2_ftz returned a nonzero value where exp2f's result is a denormal";
  EXPECT_GT(h[2], 0ull) << "no input gave a denormal exp2f result: the check of the flush did not run";
}

}  // namespace
