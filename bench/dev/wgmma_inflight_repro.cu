// Minimal reproducer (compile-only) of the ptxas behaviour that blocked keeping S in flight across loop
// iterations in the sm_90a attention kernel (docs/PERF_NOTES.md S12): an S accumulator (m64n32) issued at
// the end of an iteration and awaited in the next, with a second accumulator O whose wgmmas are issued and
// awaited inside the iteration. A starting point for the next attempt.
// build (repository root): nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -I. -c bench/dev/wgmma_inflight_repro.cu \
//          -o /tmp/repro.o -Xptxas -v [variant flags]
// What ptxas (CUDA 13) says, per variant:
//   (none)          C7514: "wgmma.mma_async instructions are serialized due to non wgmma instructions reading
//                   accumulator registers"
//   -DNO_PV         clean: S alone in flight across the back edge is fine
//   -DRESCALE       O *= alpha before PV's issue: C7517, a full wgmma wait injected at the loop top (it awaits S
//                   before PV is issued, so nothing overlaps)
//   -DLATE_RESCALE  O *= alpha after PV's wait instead: C7514 again
//   -DSTOREP        P stores to shared memory: no change (C7514)
#include <cstdint>

#include "kernels/cuda/wgmma.cuh"

using namespace ddtree::kern::sm90;

__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// dq, dk, dp, dv: shared-memory descriptors (never run; ptxas's view is what matters here).
__global__ void inflight_repro(float* out, int n, uint64_t dq, uint64_t dk, uint64_t dp, uint64_t dv) {
  float s[16], o[16], pr[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i] = pr[i] = 0.0f;
  reg_fence(o);
  reg_fence(pr);
  float alpha = 1.0f, l = 0.0f;
  reg_fence(s);
  wgmma_fence();
  for (int st = 0; st < 4; ++st) wgmma_m64n32k16_ss(s, dq + st * 2, dk + st * 2, st > 0);  // S(0)
  wgmma_commit();
#pragma unroll 1
  for (int it = 0; it < n; ++it) {  // S(it) in flight here
#ifdef RESCALE
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] *= alpha;
#endif
#ifndef NO_PV
    reg_fence(o);
    wgmma_fence();
    for (int st = 0; st < 2; ++st) wgmma_m64n32k16_ss(o, dp + st * 2, dv + st * 2, 1);  // PV(it)
    wgmma_commit();
    wgmma_wait1();  // S(it)
#else
    wgmma_wait_all();  // S(it)
#endif
    reg_fence(s);
    float mx = -1e30f;
#pragma unroll
    for (int i = 0; i < 16; ++i) mx = fmaxf(mx, s[i]);
    alpha = __expf(-mx);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      pr[i] = __expf(s[i] - mx);
      l += pr[i];
    }
    wgmma_wait_all();  // PV(it)
    reg_fence(o);
#ifdef LATE_RESCALE
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i] *= alpha;
#endif
#ifdef STOREP
#pragma unroll
    for (int i = 0; i < 16; ++i)
      asm volatile("st.shared.f32 [%0], %1;" ::"r"(i * 128 + threadIdx.x * 4), "f"(pr[i]) : "memory");
#endif
    reg_fence(s);
    wgmma_fence();
    for (int st = 0; st < 4; ++st) wgmma_m64n32k16_ss(s, dq + st * 2 + it, dk + st * 2, st > 0);  // S(it + 1)
    wgmma_commit();
  }
  wgmma_wait_all();
  reg_fence(s);
  out[threadIdx.x] = l + s[0] + o[0] + pr[3] + alpha;
}
