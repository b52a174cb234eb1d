// CUDA error handling for the C ABI launchers: a failing runtime call returns DDT_ERR_CUDA with the call,
// file:line and CUDA's message recorded for ddt_last_error_message().
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/common/validate.h"

#define DDT_CUDA_RETURN(call)                                                                          \
  do {                                                                                                 \
    cudaError_t ddt_err_ = (call);                                                                     \
    if (ddt_err_ != cudaSuccess)                                                                       \
      return ::ddtree::kern::fail(DDT_ERR_CUDA, std::string(#call " at " __FILE__ ":") +               \
                                                    std::to_string(__LINE__) + ": " +                  \
                                                    cudaGetErrorString(ddt_err_));                     \
  } while (0)

// After a launch: reports launch-configuration errors without synchronising.
#define DDT_CUDA_LAUNCHED() DDT_CUDA_RETURN(cudaGetLastError())

namespace ddtree::kern {
// Block-wide helpers.
template <class T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
}  // namespace ddtree::kern
