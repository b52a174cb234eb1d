// Minimal reproducer (compile-only) of the ptxas behaviour that blocked keeping S in flight across loop
// iterations in the sm_90a attention kernel (docs/PERF_NOTES.md S12): an S accumulator (m64n32) issued at
// the end of an iteration and awaited in the next, with a second accumulator O whose wgmmas are issued and
// awaited inside the iteration. A starting point for the next attempt.
// build: nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -c bench/dev/wgmma_inflight_repro.cu \
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

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void mma_m64n32k16(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}

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
  for (int st = 0; st < 4; ++st) mma_m64n32k16(s, dq + st * 2, dk + st * 2, st > 0);  // S(0)
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
    for (int st = 0; st < 2; ++st) mma_m64n32k16(o, dp + st * 2, dv + st * 2, 1);  // PV(it)
    wgmma_commit();
    wgmma_wait1();  // S(it)
#else
    wgmma_wait0();  // S(it)
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
    wgmma_wait0();  // PV(it)
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
    for (int st = 0; st < 4; ++st) mma_m64n32k16(s, dq + st * 2 + it, dk + st * 2, st > 0);  // S(it + 1)
    wgmma_commit();
  }
  wgmma_wait0();
  reg_fence(s);
  out[threadIdx.x] = l + s[0] + o[0] + pr[3] + alpha;
}
