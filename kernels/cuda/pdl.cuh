// Programmatic dependent launch (PDL, sm_90+): a kernel launched with launch_pdl may start (its CTAs
// scheduled, their prologue run) while the previous kernel on the stream is still finishing; it must call
// pdl_wait() before its first global-memory access that depends on that kernel (reads of its outputs, and
// any write another kernel may still read). pdl_wait returns once the previous grid has completed and its
// writes are visible, so correctness never depends on where pdl_launch_dependents() is called: that only
// lets the NEXT kernel on the stream be scheduled early (we call it right after pdl_wait, so at most one
// dependent grid waits on SM resources at a time). Inside a CUDA graph captured from the stream the launch
// attribute becomes a programmatic edge. Below sm_90 both device calls compile to nothing and launch_pdl
// launches normally. DDTREE_PDL=0 in the environment turns PDL off.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

namespace ddtree::kern {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches use PDL: the current device supports it (compute capability >= 9.0, asked once per
// device) and the environment does not turn it off (DDTREE_PDL=0: for comparisons and debugging).
inline bool pdl_supported() {
  static const bool enabled = [] {
    const char* e = std::getenv("DDTREE_PDL");
    return !(e && e[0] == '0' && e[1] == 0);
  }();
  if (!enabled) return false;
  constexpr int kMaxDevices = 64;
  static signed char known[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) { (void)cudaGetLastError(); return false; }
  if (known[dev] == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    known[dev] = major >= 9 ? 1 : -1;
  }
  return known[dev] > 0;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization where supported.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_supported() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace ddtree::kern
