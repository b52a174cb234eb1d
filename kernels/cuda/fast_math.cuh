// Device math the flash kernels share where a faster form gives the same bits as the CUDA library's on every input
// that matters (tests/gpu/test_fast_math_gpu.cu checks it over all 2^32 inputs).
#pragma once

namespace ddtree::kern::attn {

// 2^x by the MUFU alone (ex2.approx.ftz): the same bits as exp2f wherever the result is normal (x >= -126, where
// exp2f is this instruction; below it exp2f adds a compare and two multiplies for a denormal result), 0 below (a
// softmax weight under 2^-126 of the row's largest, which is 1). The flash kernels' softmax (every path alike);
// the combine keeps exp2f (both its schedules call it alike; a split's weight is one exp per row).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ddtree::kern::attn
