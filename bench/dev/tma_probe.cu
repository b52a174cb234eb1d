// Dev harness (not shipped): how fast one SM's copies fill the sm_90a kernel's 72 KB KV stages, with no math.
// The verify kernel's wide path waits ~0.4-0.5k cycles per 64-key tile for a stage although the tile's copy was
// issued a whole tile (~6k cycles) earlier, and an L2 prefetch of the same bytes did not help (docs/PERF_NOTES.md
// S53, S53b). This probe times the copies alone: CTA c (one per SM) streams its own tiles (64 slots x 1,152 B, one
// page of 64 slots, contiguous) into S stages; a consumer thread waits for each tile, holds it `hold` cycles (the
// math it stands for) and frees the stage. Copy kinds: the kernel's 3D tensor map (box {64 dims, 64 slots, 9 chunks},
// 128-byte swizzle, one copy per tile) and a plain 1D bulk copy of the same contiguous 72 KB (the ideal).
// Printed per configuration: the consumer's cycles per tile (mean over CTAs), the wait share of them, and the
// whole grid's bytes per second (CUDA events, L2 flushed before each run).
// build: nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 bench/dev/tma_probe.cu -o tma_probe
// usage: tma_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <vector>

constexpr int kRowBytes = 1152;            // one KV slot: 576 bf16
constexpr int kSlotsPerTile = 64;
constexpr int kTileBytes = kRowBytes * kSlotsPerTile;  // 73,728
constexpr int kMaxStages = 3;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// grid: one CTA per SM (or fewer); CTA c copies tiles c x tiles_per_cta .. + tiles_per_cta - 1.
// mode 0: the 3D tensor map (the kernel's copy), 1: a 1D bulk copy of the contiguous tile.
__global__ void __launch_bounds__(64, 1)
    tma_probe_kernel(const __grid_constant__ CUtensorMap map, const unsigned char* kv, int tiles_per_cta, int stages,
                     int hold, int mode, long long* cycles, long long* wait_cycles) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kMaxStages];  // full[s], empty[s]
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + kMaxStages);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full0 + 8u * s, 1);
      mbar_init(empty0 + 8u * s, 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int64_t first_tile = int64_t(blockIdx.x) * tiles_per_cta;
  if (threadIdx.x == 32) {  // producer
    for (int t = 0; t < tiles_per_cta; ++t) {
      const int s = t % stages;
      mbar_wait(empty0 + 8u * s, uint32_t((t / stages) & 1) ^ 1u);  // (first pass: passes)
      const uint32_t bar = full0 + 8u * s, dst = smem_u32(base) + uint32_t(s * kTileBytes);
      mbar_expect_tx(bar, kTileBytes);
      const int64_t tile = first_tile + t;
      if (mode == 0) {
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
            ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(0), "r"(int(tile * kSlotsPerTile)), "r"(0), "r"(bar)
            : "memory");
      } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                     "l"(kv + tile * kTileBytes), "r"(kTileBytes), "r"(bar)
                     : "memory");
      }
    }
  } else if (threadIdx.x == 0) {  // consumer: wait, hold, free
    long long waited = 0;
    const long long t0 = clock64();
    for (int t = 0; t < tiles_per_cta; ++t) {
      const int s = t % stages;
      const long long w0 = clock64();
      mbar_wait(full0 + 8u * s, uint32_t((t / stages) & 1));
      const long long w1 = clock64();
      waited += w1 - w0;
      while (clock64() - w1 < hold) {
      }
      mbar_arrive(empty0 + 8u * s);
    }
    cycles[blockIdx.x] = clock64() - t0;
    wait_cycles[blockIdx.x] = waited;
  }
}

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);           \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles_per_cta = 48;
  const int64_t tiles = int64_t(sms) * tiles_per_cta;
  const size_t bytes = size_t(tiles) * kTileBytes;
  unsigned char* kv = nullptr;
  CK(cudaMalloc(&kv, bytes));
  CK(cudaMemset(kv, 0x3C, bytes));
  void* flush = nullptr;
  CK(cudaMalloc(&flush, size_t(256) << 20));
  long long *cyc = nullptr, *wcyc = nullptr;
  CK(cudaMalloc(&cyc, sms * sizeof(long long)));
  CK(cudaMalloc(&wcyc, sms * sizeof(long long)));
  // The kernel's 3D map: {64 dims, slots, 9 chunks}, strides 1,152 B per slot and 128 B per chunk, box {64, 64, 9}.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  CUtensorMap map{};
  const cuuint64_t dims[3] = {64, cuuint64_t(tiles) * kSlotsPerTile, 9};
  const cuuint64_t strides[2] = {kRowBytes, 128};
  const cuuint32_t box[3] = {64, 64, 9}, elem[3] = {1, 1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, kv, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
      CUDA_SUCCESS) {
    std::fprintf(stderr, "tensor map encode failed\n");
    return 1;
  }
  const int smem = kMaxStages * kTileBytes + 1024;
  CK(cudaFuncSetAttribute(tma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("# tma_probe: %d SMs, %d tiles of 72 KB per CTA, L2 flushed before each run; SM clock attribute %.2f GHz\n",
              sms, tiles_per_cta, clock_khz * 1e-6);
  std::printf("| copy | CTAs | stages | hold cycles | cycles per tile | wait per tile | GB/s per CTA | grid TB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int mode : {0, 1})
    for (int ctas : {sms, 65})
      for (int stages : {1, 2, 3})
        for (int hold : {0, 4000}) {
          CK(cudaMemset(flush, stages + hold, size_t(256) << 20));
          CK(cudaEventRecord(e0));
          tma_probe_kernel<<<ctas, 64, smem>>>(map, kv, tiles_per_cta, stages, hold, mode, cyc, wcyc);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          CK(cudaGetLastError());
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          std::vector<long long> c(ctas), w(ctas);
          CK(cudaMemcpy(c.data(), cyc, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(w.data(), wcyc, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
          double cs = 0, ws = 0;
          for (int i = 0; i < ctas; ++i) {
            cs += double(c[i]);
            ws += double(w[i]);
          }
          const double per_tile = cs / ctas / tiles_per_cta, wait_tile = ws / ctas / tiles_per_cta;
          const double cta_gbs = double(kTileBytes) / (per_tile / (clock_khz * 1e3)) * 1e-9;
          const double grid_tbs = double(ctas) * tiles_per_cta * kTileBytes / (ms * 1e-3) * 1e-12;
          std::printf("| %s | %d | %d | %d | %.0f | %.0f | %.1f | %.2f |\n", mode == 0 ? "3D map" : "1D bulk", ctas,
                      stages, hold, per_tile, wait_tile, cta_gbs, grid_tbs);
        }
  return 0;
}
