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
#include <mutex>
#include <utility>
#include <vector>

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

// Whether a launch of `kernel` uses PDL: the environment does not turn it off (DDTREE_PDL=0: for comparisons
// and debugging), the current device supports it (compute capability >= 9.0) and the kernel's loaded image
// was compiled for a >= 9.0 target (cudaFuncGetAttributes' ptxVersion): code JIT-compiled from older PTX has
// no griddepcontrol.wait (pdl_wait compiles to nothing below sm_90) and must not start early. Asked once per
// (device, kernel); host queries only, so it is safe inside a stream capture.
inline bool pdl_supported(const void* kernel) {
  static const bool enabled = [] {
    const char* e = std::getenv("DDTREE_PDL");
    return !(e && e[0] == '0' && e[1] == 0);
  }();
  if (!enabled) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) { (void)cudaGetLastError(); return false; }
  struct Known { int dev; const void* kernel; bool ok; };
  static std::mutex mu;
  static std::vector<Known> known;
  std::lock_guard<std::mutex> lock(mu);
  for (const Known& k : known)
    if (k.dev == dev && k.kernel == kernel) return k.ok;
  int major = 0;
  cudaFuncAttributes fa{};
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool ok = major >= 9 && fa.ptxVersion >= 90;
  known.push_back({dev, kernel, ok});
  return ok;
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
  cfg.numAttrs = pdl_supported(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace ddtree::kern
