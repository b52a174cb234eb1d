// Backend discovery for the C ABI.
#include <cuda_runtime.h>

#include "ddtree/kernels.h"

extern "C" int ddt_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n > 0 ? 1 : 0;
}
