// How fast the sm_90a attention kernel's wgmma shapes run with nothing else in the way (docs/PERF_NOTES.md S66):
// one CTA per SM (dynamic shared memory sized so), two warpgroups (the kernel's math warpgroups), shared memory
// filled with random bf16, and per "tile" the wgmma sequence of one variant, committed and awaited, the two
// warpgroups in step (bar.sync between phases, as the kernel's lockstep tile loop). Prints cycles per tile (median
// over the CTAs, thread 0's clock64) and the tensor rate in FMA per cycle per SM. The two warpgroups read the same
// shared-memory operands (one Q, one KV tile, one P): "a tile of its own" (s64both, pair*) means its own wgmmas.
//   s32      each warpgroup S for its 32 keys of the tile: 36 k-steps m64n32, both operands from shared memory
//   s32rs    the same with the rope's 4 k-steps from registers (A = Q rope fragments: the kernel's form)
//   s32rs8   the same with the last 8 k-steps from registers (S67: latent box 7 too)
//   s64half  each warpgroup S for all 64 keys over half of the 576 dims: 18 k-steps m64n64
//   s64one   warpgroup 0 S for the whole tile (36 k-steps m64n64), warpgroup 1 idle
//   s64both  each warpgroup S for a whole tile of its own (FlashMLA's pairs: 2 tiles of S per period)
//   pv1      each warpgroup P V for its 256 dims: 4 k-steps m64n256 (bf16 P)
//   pv2      the same twice (P hi + P lo)
//   lock1 / lock2    s32rs, then pv1 / pv2: the kernel's tensor work per tile in the bf16 / hi + lo modes
//   half1 / half2    s64half, then pv1 / pv2
//   pair1 / pair2    FlashMLA's pair without its softmax: each warpgroup S for a tile of its own (m64n64), then P V for
//                    its 256 dims of both tiles (2 x pv1 / 2 x pv2); cycles per tile = per pair / 2
// build (repository root): nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 -I. bench/dev/wgmma_rate.cu -o wgmma_rate
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/cuda/wgmma.cuh"

using namespace ddtree::kern::sm90;


__device__ __forceinline__ void math_bar() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

constexpr int kBox = 8192;                                 // [64 rows][64 bf16], 128B swizzle
constexpr int kOffQ = 0, kOffKv = 9 * kBox, kOffP = 18 * kBox;  // Q 576 dims, one KV tile, P
constexpr int kSmem = 200 * 1024;                          // > half of 227 KB: one CTA per SM
enum Mode { S32, S32RS, S32RS8, S64HALF, S64ONE, S64BOTH, PV1, PV2, LOCK1, LOCK2, HALF1, HALF2, PAIR1, PAIR2, kModes };
const char* kNames[kModes] = {"s32", "s32rs", "s32rs8", "s64half", "s64one", "s64both", "pv1", "pv2", "lock1", "lock2", "half1", "half2", "pair1", "pair2"};
// FMA per loop iteration per SM (both warpgroups).
const double kS = 64.0 * 64 * 576, kPv = 64.0 * 64 * 512;
const double kFma[kModes] = {kS,       kS,           kS,       kS,           kS,       2 * kS,           kPv, 2 * kPv,
                             kS + kPv, kS + 2 * kPv, kS + kPv, kS + 2 * kPv, 2 * (kS + kPv), 2 * (kS + 2 * kPv)};
// Tiles per loop iteration (s64both and the pair variants: two).
const int kTilesPerIter[kModes] = {1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2, 2};

template <int kMode>
__global__ void __launch_bounds__(256, 1) rate_kernel(int tiles, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x, wg = tid >> 7;
  // random bf16 in [-0.5, 0.5): an LCG per 32-bit word
  uint32_t x = 12345u + 7919u * (tid + 256u * blockIdx.x);
  for (int i = tid; i < kOffP / 4 + kBox / 4; i += 256) {
    uint32_t v = 0;
    for (int h = 0; h < 2; ++h) {
      x = x * 1664525u + 1013904223u;
      const uint32_t bits = 0x3F800000u | (x >> 9);  // [1, 2)
      const float f = __uint_as_float(bits) - 1.5f;
      v |= uint32_t(__float_as_uint(f) >> 16) << (16 * h);
    }
    reinterpret_cast<uint32_t*>(base)[i] = v;
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t sb = uint32_t(__cvta_generic_to_shared(base));
  const uint32_t sq = sb + kOffQ, skv = sb + kOffKv, sp = sb + kOffP;
  uint32_t qr[4][4];
#pragma unroll
  for (int st = 0; st < 4; ++st)
#pragma unroll
    for (int i = 0; i < 4; ++i) qr[st][i] = 0x3C003C00u ^ (tid * 2654435761u + st * 97u + i);  // (any bits: timing only)
  float s32[16], s64[32], acc[128];
#pragma unroll
  for (int i = 0; i < 16; ++i) s32[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) s64[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  float keep = 0.0f;
  math_bar();
  const long long t0 = clock64();
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    constexpr bool kS32 = kMode == S32 || kMode == S32RS || kMode == S32RS8 || kMode == LOCK1 || kMode == LOCK2;
    constexpr int kRs = kMode == S32RS8 ? 8 : (kMode == S32RS || kMode == LOCK1 || kMode == LOCK2) ? 4 : 0;
    constexpr bool kHalf = kMode == S64HALF || kMode == HALF1 || kMode == HALF2;
    constexpr int kPvSteps = (kMode == PV1 || kMode == LOCK1 || kMode == HALF1) ? 4
                             : (kMode == PV2 || kMode == LOCK2 || kMode == HALF2 || kMode == PAIR1) ? 8
                             : kMode == PAIR2 ? 16 : 0;
    if constexpr (kS32) {
      const uint64_t dq0 = sw128_desc(sq, 16, 1024), dk0 = sw128_desc(skv + uint32_t(wg * 4096), 16, 1024);
      reg_fence(s32);
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 36 - kRs; ++st) {
        const uint64_t off = uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4);
        wgmma_m64n32k16_ss(s32, dq0 + off, dk0 + off, st > 0);
      }
#pragma unroll
      for (int st = 36 - kRs; st < 36; ++st)
        wgmma_m64n32k16_rs(s32, qr[st & 3], dk0 + uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4), 1);
      wgmma_commit();
      wgmma_wait_all();
      reg_fence(s32);
      #pragma unroll
      for (int i = 0; i < 16; ++i) keep += s32[i];
    }
    if constexpr (kHalf || kMode == S64ONE || kMode == S64BOTH || kMode == PAIR1 || kMode == PAIR2) {
      if (kMode != S64ONE || wg == 0) {
        const uint64_t dq0 = sw128_desc(sq, 16, 1024), dk0 = sw128_desc(skv, 16, 1024);
        constexpr int kSteps = kHalf ? 18 : 36;
        const int st0 = kHalf ? 18 * wg : 0;
        reg_fence(s64);
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          const int st = st0 + i;
          const uint64_t off = uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4);
          wgmma_m64n64k16_ss(s64, dq0 + off, dk0 + off, i > 0);
        }
        wgmma_commit();
        wgmma_wait_all();
        reg_fence(s64);
        #pragma unroll
        for (int i = 0; i < 32; ++i) keep += s64[i];
      }
    }
    if constexpr (kPvSteps > 0) {
      math_bar();
      const uint64_t dv0 = sw128_desc(skv + uint32_t(4 * wg * kBox), kBox, 1024), dp = sw128_desc(sp, 16, 1024);
      reg_fence(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks) wgmma_m64n256k16_ss_tb(acc, dp + uint64_t((ks & 3) * 2), dv0 + uint64_t((ks & 3) * 128), 1);
      wgmma_commit();
      wgmma_wait_all();
      reg_fence(acc);
    }
    math_bar();
  }
  const long long t1 = clock64();
  float tot = keep;
#pragma unroll
  for (int i = 0; i < 128; ++i) tot += acc[i];
  sink[blockIdx.x * 256 + tid] = tot;
  if (tid == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int kMode>
void run(int sms, int tiles, long long* d_cycles, float* d_sink) {
  cudaFuncSetAttribute(rate_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  for (int rep = 0; rep < 2; ++rep) rate_kernel<kMode><<<sms, 256, kSmem>>>(tiles, d_cycles, d_sink);  // (warm-up, then the one read)
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("| %s | error %s |\n", kNames[kMode], cudaGetErrorString(e));
    return;
  }
  std::vector<long long> c(sms);
  cudaMemcpy(c.data(), d_cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  std::sort(c.begin(), c.end());
  const double per = double(tiles) * kTilesPerIter[kMode];  // cycles per 64-key tile
  const double med = double(c[sms / 2]) / per, mx = double(c[sms - 1]) / per;
  const double fma = kFma[kMode] / kTilesPerIter[kMode];
  std::printf("| %s | %.0f | %.0f | %.0f | %.2f |\n", kNames[kMode], med, mx, fma / med, fma / med / 2048.0);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int tiles = 512;
  long long* d_cycles;
  float* d_sink;
  cudaMalloc(&d_cycles, sms * sizeof(long long));
  cudaMalloc(&d_sink, sms * 256 * sizeof(float));
  std::printf("wgmma rates, %d CTAs (one per SM), %d tiles each; cycles per tile (median / max over CTAs)\n", sms, tiles);
  std::printf("| variant | cycles | max | FMA / cycle / SM | of 2048 |\n|---|---|---|---|---|\n");
  run<S32>(sms, tiles, d_cycles, d_sink);
  run<S32RS>(sms, tiles, d_cycles, d_sink);
  run<S32RS8>(sms, tiles, d_cycles, d_sink);
  run<S64HALF>(sms, tiles, d_cycles, d_sink);
  run<S64ONE>(sms, tiles, d_cycles, d_sink);
  run<S64BOTH>(sms, tiles, d_cycles, d_sink);
  run<PV1>(sms, tiles, d_cycles, d_sink);
  run<PV2>(sms, tiles, d_cycles, d_sink);
  run<LOCK1>(sms, tiles, d_cycles, d_sink);
  run<LOCK2>(sms, tiles, d_cycles, d_sink);
  run<HALF1>(sms, tiles, d_cycles, d_sink);
  run<HALF2>(sms, tiles, d_cycles, d_sink);
  run<PAIR1>(sms, tiles, d_cycles, d_sink);
  run<PAIR2>(sms, tiles, d_cycles, d_sink);
  return 0;
}
