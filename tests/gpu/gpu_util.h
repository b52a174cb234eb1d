// Device-buffer helpers for the GPU tests and benchmarks (host-side code linked with the CUDA runtime).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ddtree/kernels.h"

#define GPU_CHECK(call)                                                                              \
  do {                                                                                               \
    cudaError_t e_ = (call);                                                                         \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::abort();                                                                                  \
    }                                                                                                \
  } while (0)

namespace ddtree::test {

// A device array of T that can be filled from / read into host vectors, and poisoned with a byte value.
template <class T>
struct DevBuf {
  T* ptr = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) { GPU_CHECK(cudaMalloc(&ptr, (n ? n : 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : ptr(o.ptr), n(o.n) { o.ptr = nullptr; o.n = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept { std::swap(ptr, o.ptr); std::swap(n, o.n); return *this; }
  ~DevBuf() { if (ptr) cudaFree(ptr); }
  void upload(const std::vector<T>& h, cudaStream_t s = nullptr) {
    GPU_CHECK(cudaMemcpyAsync(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison(int byte = 0xFF) { GPU_CHECK(cudaMemset(ptr, byte, n * sizeof(T))); }
};

// A flash verify-attention kernel (portable or sm_90a, ddtree/kernels.h section 4) with its workspace: one
// device buffer grown to the largest size asked so far (grown outside any graph capture: callers warm up
// first), NaN-filled when allocated and never cleared between calls (later calls see earlier partials: the
// kernel must not read what it did not write in the same call).
// A process-wide device buffer grown to `need` bytes when smaller (freed and allocated again, 0xFF-filled).
inline void grow_ff_filled(void*& buf, size_t& cap, size_t need) {
  if (need <= cap) return;
  if (buf) GPU_CHECK(cudaFree(buf));
  GPU_CHECK(cudaMalloc(&buf, need));
  GPU_CHECK(cudaMemset(buf, 0xFF, need));
  cap = need;
}
using VerifyAttnFlashFn = int (*)(const ddt_verify_attn_params*, int, void*, size_t, void*);
// The workspace is allocated at this multiple of what the call needs (bench_verify_attn --workspace-scale: two
// libraries whose partial rows differ in size then allocate alike, so the buffers allocated after it lie at the same
// addresses; docs/PERF_NOTES.md, after S73g). 1 everywhere else.
inline double g_workspace_scale = 1.0;
inline int verify_attn_flash_with_workspace(VerifyAttnFlashFn fn, const ddt_verify_attn_params* p, int split_keys,
                                            void* stream) {
  static void* ws = nullptr;
  static size_t cap = 0;
  size_t need = 0;
  if (int rc = ddt_verify_attn_portable_workspace(p, split_keys, &need)) return rc;
  grow_ff_filled(ws, cap, size_t(double(need) * g_workspace_scale));
  return fn(p, split_keys, ws, cap, stream);
}
inline int verify_attn_portable_with_workspace(const ddt_verify_attn_params* p, int split_keys, void* stream) {
  return verify_attn_flash_with_workspace(ddt_verify_attn_portable_cuda, p, split_keys, stream);
}
inline int verify_attn_sm90_with_workspace(const ddt_verify_attn_params* p, int split_keys, void* stream) {
  return verify_attn_flash_with_workspace(ddt_verify_attn_sm90_cuda, p, split_keys, stream);
}
// The sm_90a kernel with a plan made right before it on the same stream (ddt_verify_attn_sm90_plan_cuda, then
// ddt_verify_attn_sm90_planned_cuda): one process-wide plan buffer, grown as needed, 0xFF-filled when allocated
// (an unwritten header is refused), never cleared between calls.
inline int verify_attn_sm90_planned_with_workspace(const ddt_verify_attn_params* p, int split_keys, void* stream) {
  static void* plan = nullptr;
  static size_t cap = 0;
  size_t need = 0;
  if (int rc = ddt_verify_attn_sm90_plan_bytes(p, split_keys, &need)) return rc;
  grow_ff_filled(plan, cap, need);
  if (int rc = ddt_verify_attn_sm90_plan_cuda(p, split_keys, plan, cap, stream)) return rc;
  return verify_attn_flash_with_workspace(
      [](const ddt_verify_attn_params* q, int s, void* ws, size_t ws_bytes, void* st) {
        return ddt_verify_attn_sm90_planned_cuda(q, s, plan, cap, ws, ws_bytes, st);
      },
      p, split_keys, stream);
}
// Whether the current GPU runs the sm_90a kernel (compute capability 9.0).
// A verify-attention entry (params, stream) at p_precision DDT_ATTN_P_BF16 (P as one bf16 before PV; kernels.h):
// with_p_bf16<entry> for the tests' and the benchmark's bf16-P rows.
template <int (*kEntry)(const ddt_verify_attn_params*, void*)>
int with_p_bf16(const ddt_verify_attn_params* p, void* stream) {
  ddt_verify_attn_params q = *p;
  q.p_precision = DDT_ATTN_P_BF16;
  return kEntry(&q, stream);
}
inline bool gpu_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

}  // namespace ddtree::test
