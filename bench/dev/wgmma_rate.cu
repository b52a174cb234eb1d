// How fast the sm_90a attention kernel's wgmma shapes run with nothing else in the way (docs/PERF_NOTES.md S66):
// one CTA per SM (dynamic shared memory sized so), two warpgroups (the kernel's math warpgroups), shared memory
// filled with random bf16, and per "tile" the wgmma sequence of one variant, committed and awaited, the two
// warpgroups in step (bar.sync between phases, as the kernel's lockstep tile loop). Prints cycles per tile (median
// over the CTAs, thread 0's clock64) and the tensor rate in FMA per cycle per SM.
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
// build: nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 bench/dev/wgmma_rate.cu -o wgmma_rate
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

// ---- generated wrappers (operand lists written out) ----
__device__ __forceinline__ void mma_m64n32k16_ss(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void mma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}
__device__ __forceinline__ void mma_m64n256k16_ss_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}
// ---- end of generated wrappers ----

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void math_bar() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// 128B-swizzle descriptor (the kernel's sw128_desc).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t((lbo & 0x3FFFFu) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFFu) >> 4) << 32) | (uint64_t(1) << 62);
}

constexpr int kBox = 8192;                                 // [64 rows][64 bf16], 128B swizzle
constexpr int kOffQ = 0, kOffKv = 9 * kBox, kOffP = 18 * kBox;  // Q 576 dims, one KV tile, P
constexpr int kSmem = 200 * 1024;                          // > half of 227 KB: one CTA per SM
enum Mode { S32, S32RS, S32RS8, S64HALF, S64ONE, S64BOTH, PV1, PV2, LOCK1, LOCK2, HALF1, HALF2, PAIR1, PAIR2, kModes };
const char* kNames[kModes] = {"s32", "s32rs", "s32rs8", "s64half", "s64one", "s64both", "pv1", "pv2", "lock1", "lock2", "half1", "half2", "pair1", "pair2"};
// FMA per tile per SM (both warpgroups).
const double kS = 64.0 * 64 * 576, kPv = 64.0 * 64 * 512;
const double kFma[kModes] = {kS,       kS,           kS,       kS,           kS,       2 * kS,           kPv, 2 * kPv,
                             kS + kPv, kS + 2 * kPv, kS + kPv, kS + 2 * kPv, 2 * (kS + kPv), 2 * (kS + 2 * kPv)};
// Tiles per loop iteration (the pair variants: two).
const int kTilesPerIter[kModes] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2};

template <int kMode>
__global__ void __launch_bounds__(256, 1) rate_kernel(int tiles, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x, wg = tid >> 7;
  // random bf16 in [-1, 1): an LCG per 32-bit word
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
    for (int i = 0; i < 4; ++i) qr[st][i] = 0x3C003C00u ^ (tid * 2654435761u + st * 97u + i);
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
        mma_m64n32k16_ss(s32, dq0 + off, dk0 + off, st > 0);
      }
#pragma unroll
      for (int st = 36 - kRs; st < 36; ++st)
        mma_m64n32k16_rs(s32, qr[st & 3], dk0 + uint64_t(((st >> 2) * kBox + (st & 3) * 32) >> 4), 1);
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
          mma_m64n64k16_ss(s64, dq0 + off, dk0 + off, i > 0);
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
      for (int ks = 0; ks < kPvSteps; ++ks) mma_m64n256k16_ss_tb(acc, dp + uint64_t((ks & 3) * 2), dv0 + uint64_t((ks & 3) * 128), 1);
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
  cudaError_t e = cudaDeviceSynchronize();
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
