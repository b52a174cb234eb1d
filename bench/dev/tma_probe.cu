// Dev harness (not shipped): how fast one SM's copies fill the sm_90a kernel's 72 KB KV stages, with no math.
// The verify kernel's wide path waits ~0.4-0.5k cycles per 64-key tile for a stage although the tile's copy was
// issued a whole tile (~6k cycles) earlier, and an L2 prefetch of the same bytes did not help (docs/PERF_NOTES.md
// S53, S53b). This probe times the copies alone: CTA c (one per SM) streams its own tiles (64 slots x 1,152 B, one
// page of 64 slots, contiguous) into S stages; a consumer thread waits for each tile, holds it `hold` cycles (the
// math it stands for) and frees the stage. Copy kinds: the kernel's 3D tensor map (box {64 dims, 64 slots, 9 chunks},
// 128-byte swizzle, one copy per tile) and a plain 1D bulk copy of the same contiguous 72 KB (the ideal).
// Printed per configuration: the consumer's cycles per tile (mean over CTAs), the wait share of them, and the
// whole grid's bytes per second (CUDA events, L2 flushed before each run).
// Second table (the issue's "thread-block clusters so tiles that share a KV chunk share its load"): groups of G
// CTAs stream the SAME tiles, as the row tiles of one request's split do (T x H > 64 rows). Either each CTA copies
// the whole tile itself (the second copy hits L2: the kernel's co-scheduled items today), or the G CTAs form a
// thread-block cluster and each copies 1/G of the tile's nine [64 x 64] boxes with TMA multicast into every CTA
// of the cluster (a stage is refilled once all G consumers released it: remote mbarrier arrivals).
// build: nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -O3 bench/dev/tma_probe.cu -o tma_probe
// usage: tma_probe [shared]   (shared: the second table alone)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <string>
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

// The consumer thread of both probes: waits for each tile, holds it `hold` cycles (the math it stands for), frees its
// stage with release(stage); records this CTA's cycles and the waits' part of them.
template <class Release>
__device__ void consume_tiles(uint32_t full0, int tiles, int stages, int hold, Release&& release, long long* cycles,
                              long long* wait_cycles) {
  long long waited = 0;
  const long long t0 = clock64();
  for (int t = 0; t < tiles; ++t) {
    const int s = t % stages;
    const long long w0 = clock64();
    mbar_wait(full0 + 8u * s, uint32_t((t / stages) & 1));
    const long long w1 = clock64();
    waited += w1 - w0;
    while (clock64() - w1 < hold) {
    }
    release(s);
  }
  cycles[blockIdx.x] = clock64() - t0;
  wait_cycles[blockIdx.x] = waited;
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// One arrival on the mbarrier at shared address bar of CTA cta of this cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
// One [64 slots][64 dims] box of the 2D map, to dst of this CTA (mask 0) or to dst of every CTA in mask.
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar, uint16_t mask) {
  if (mask == 0)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
  else
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(mask) : "memory");
}

// Groups of `group` consecutive CTAs stream the same tiles (group g: tiles g x tiles_per_cta ..). multicast = 0:
// each CTA copies its tiles by the 2D map's nine boxes itself (launched without clusters); 1: the group is a
// cluster, CTA rank k copies boxes k, k + group, .. multicast to the whole cluster, and each CTA's stage is
// refilled once every consumer of the cluster freed it.
__global__ void __launch_bounds__(64, 1)
    shared_tile_kernel(const __grid_constant__ CUtensorMap map2d, int tiles_per_cta, int group, int multicast,
                       int hold, long long* cycles, long long* wait_cycles) {
  constexpr int kStages = 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t bars[2 * kStages];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t full0 = smem_u32(bars), empty0 = smem_u32(bars + kStages);
  const uint32_t rank = multicast ? cluster_rank() : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8u * s, 1);
      mbar_init(empty0 + 8u * s, multicast ? group : 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (multicast) cluster_sync();  // every CTA's barriers initialised before any multicast or remote arrival
  else __syncthreads();
  const int64_t first_tile = int64_t(blockIdx.x / group) * tiles_per_cta;
  if (threadIdx.x == 32) {  // producer
    const uint16_t mask = multicast ? uint16_t((1u << group) - 1) : 0;
    for (int t = 0; t < tiles_per_cta; ++t) {
      const int s = t % kStages;
      mbar_wait(empty0 + 8u * s, uint32_t((t / kStages) & 1) ^ 1u);
      const uint32_t bar = full0 + 8u * s, dst = smem_u32(base) + uint32_t(s * kTileBytes);
      mbar_expect_tx(bar, kTileBytes);  // (the whole tile: multicast boxes from the other CTAs count here too)
      const int y = int((first_tile + t) * kSlotsPerTile);
      for (int b = multicast ? int(rank) : 0; b < 9; b += multicast ? group : 1)
        tma_box(dst + uint32_t(b * 8192), &map2d, 64 * b, y, bar, mask);
    }
  } else if (threadIdx.x == 0) {  // consumer
    consume_tiles(full0, tiles_per_cta, kStages, hold, [&](int s) {
      if (multicast)
        for (int c = 0; c < group; ++c) mbar_arrive_cluster(empty0 + 8u * s, uint32_t(c));
      else
        mbar_arrive(empty0 + 8u * s);
    }, cycles, wait_cycles);
  }
  if (multicast) cluster_sync();  // no CTA leaves while a peer may still copy into it or arrive on its barriers
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
    consume_tiles(full0, tiles_per_cta, stages, hold, [&](int s) { mbar_arrive(empty0 + 8u * s); }, cycles, wait_cycles);
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

struct Stats {
  double per_tile, wait_tile, ms;
};

int main(int argc, char** argv) {
  const bool shared_only = argc > 1 && std::string(argv[1]) == "shared";  // the second table alone
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
  // The kernel's 3D map: {64 dims, slots, 9 chunks}, strides 1,152 B per slot and 128 B per chunk, box {64, 64, 9};
  // and its 2D fallback: {576 dims, slots}, box {64, 64} (nine boxes per tile).
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  CUtensorMap map{}, map2d{};
  const cuuint64_t dims[3] = {64, cuuint64_t(tiles) * kSlotsPerTile, 9};
  const cuuint64_t strides[2] = {kRowBytes, 128};
  const cuuint32_t box[3] = {64, 64, 9}, elem[3] = {1, 1, 1};
  const cuuint64_t dims2[2] = {576, cuuint64_t(tiles) * kSlotsPerTile};
  const cuuint64_t strides2[1] = {kRowBytes};
  const cuuint32_t box2[2] = {64, 64};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, kv, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
          CUDA_SUCCESS ||
      encode(&map2d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv, dims2, strides2, box2, elem,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "tensor map encode failed\n");
    return 1;
  }
  const int smem = kMaxStages * kTileBytes + 1024, smem2 = 2 * kTileBytes + 1024;
  CK(cudaFuncSetAttribute(tma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(shared_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem2));
  CK(cudaFuncSetAttribute(shared_tile_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // One timed run of launch() on `ctas` CTAs, L2 flushed first: mean cycles and wait per tile over the CTAs.
  auto measure = [&](int ctas, int flush_byte, auto launch, Stats& st) -> int {
    CK(cudaMemset(flush, flush_byte, size_t(256) << 20));
    CK(cudaEventRecord(e0));
    CK(launch());
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
    st = {cs / ctas / tiles_per_cta, ws / ctas / tiles_per_cta, ms};
    return 0;
  };
  std::printf("# tma_probe: %d SMs, %d tiles of 72 KB per CTA, L2 flushed before each run; SM clock attribute %.2f GHz\n",
              sms, tiles_per_cta, clock_khz * 1e-6);
  if (!shared_only) {
    std::printf("| copy | CTAs | stages | hold cycles | cycles per tile | wait per tile | GB/s per CTA | grid TB/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (int mode : {0, 1})
      for (int ctas : {sms, 65})
        for (int stages : {1, 2, 3})
          for (int hold : {0, 4000}) {
            Stats st{};
            if (measure(ctas, stages + hold, [&] {
                  tma_probe_kernel<<<ctas, 64, smem>>>(map, kv, tiles_per_cta, stages, hold, mode, cyc, wcyc);
                  return cudaGetLastError();
                }, st))
              return 1;
            const double cta_gbs = double(kTileBytes) / (st.per_tile / (clock_khz * 1e3)) * 1e-9;
            const double grid_tbs = double(ctas) * tiles_per_cta * kTileBytes / (st.ms * 1e-3) * 1e-12;
            std::printf("| %s | %d | %d | %d | %.0f | %.0f | %.1f | %.2f |\n", mode == 0 ? "3D map" : "1D bulk", ctas,
                        stages, hold, st.per_tile, st.wait_tile, cta_gbs, grid_tbs);
          }
  }
  // Shared tiles: groups of G CTAs read the same tiles; own copies (L2 hits) against cluster multicast.
  std::printf("\n| G (CTAs per tile) | copy | CTAs | clusters resident | hold cycles | cycles per tile | wait per tile | "
              "tiles into SMs TB/s | unique bytes TB/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int group : {1, 2, 4, 8})
    for (int multicast : {0, 1}) {
      if (group == 1 && multicast) continue;
      const int ctas = sms / group * group;
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = unsigned(multicast ? group : 1);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(unsigned(ctas));
      cfg.blockDim = dim3(64);
      cfg.dynamicSmemBytes = size_t(smem2);
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      int resident = 0;
      if (cudaOccupancyMaxActiveClusters(&resident, shared_tile_kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        resident = -1;
      }
      if (multicast && resident >= 0 && resident * group < ctas) {
        std::printf("| %d | multicast | %d | %d | - | (not all clusters resident: skipped) | | | |\n", group, ctas,
                    resident);
        continue;
      }
      for (int hold : {0, 3000, 6000}) {
        Stats st{};
        if (measure(ctas, group + hold + multicast, [&] {
              return cudaLaunchKernelEx(&cfg, shared_tile_kernel, map2d, tiles_per_cta, group, multicast, hold, cyc,
                                        wcyc);
            }, st))
          return 1;
        const double into = double(ctas) * tiles_per_cta * kTileBytes / (st.ms * 1e-3) * 1e-12;
        std::printf("| %d | %s | %d | %d | %d | %.0f | %.0f | %.2f | %.2f |\n", group,
                    multicast ? "multicast (cluster)" : "own copies", ctas, resident, hold, st.per_tile, st.wait_tile,
                    into, into / group);
      }
    }
  return 0;
}
