// Accepted-path KV compaction on the GPU (C ABI: ddtree/kernels.h, section 5; CPU twin kernels/cpu/kv_compact_cpu.cpp).
//
// Copy: one CTA (128 threads) per (request, group of layers: one layer each unless that makes more than ~2,048
// CTAs). Thread 0 checks the request and lists its moves (kernels/common/kv_compact.h, the CPU twin's function) into
// shared memory; then the rows move in rounds of 128 x 8 chunks (16 bytes, or 4 where row_bytes, layer_stride or kv
// are not 16-byte multiples), chunks numbered layer-major, then move-major (move m, chunk w of its row): each thread
// loads its chunks of the round, the CTA syncs, then stores them. That equals the one-by-one copies in increasing k:
// the only overlaps are a source slot P + path[j] that a later move k (path[j] = k, j < k) writes, and a read of move
// j is numbered below the write of move k at the same chunk, so it happens in an earlier round or before the same
// round's barrier; no move reads a slot an earlier move wrote.
// Remap (page_size 1): one warp per request; its lanes warm L1, then lane 0 swaps the page-table entries in increasing
// k.
// Both start with pdl_wait (the path comes from the accept kernel, the launch before on the stream).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "kernels/common/kv_compact.h"
#include "kernels/common/validate.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ddtree::kern {
namespace {

constexpr int kCompactThreads = 128;
constexpr int kChunksPerThread = 8;  // chunks in flight per thread per round

// Warms L1 with request r's path entries and the page-table entries of its moves' slots (one warp, lane = 0 .. 31:
// one lane per path entry; its loads of the path entry, then of the two table entries, are cached in L1, ld.ca), so
// that lane 0's check and swaps that follow (kv_compact_moves: ~3 dependent loads per path entry) read L1 hits
// instead of a chain of L2 latencies. The remap kernel only: it saves it 1.5-2% (0.1 us of 4-7.5 us); the copy kernel
// measured the same with and without it (docs/PERF_NOTES.md K6). Values out of range are skipped (the check itself
// decides); returns a value only to keep the loads (callers pass it to an empty asm).
__device__ __forceinline__ uint32_t kv_compact_warm(const ddt_kv_compact_params& p, int r, int lane) {
  const int len = min(__ldca(p.path_len + r), p.max_path);
  const int32_t P = __ldca(p.prefix_lens + r);
  const int64_t row0 = int64_t(r) * p.max_pages, slots = int64_t(p.max_pages) * p.page_size;
  const uint32_t ps = uint32_t(p.page_size);
  uint32_t sink = 0;
  for (int k = lane; k < len; k += 32) {
    const int32_t node = __ldca(p.path + int64_t(r) * p.max_path + k);
    const uint32_t s = uint32_t(P) + uint32_t(node), d = uint32_t(P) + uint32_t(k);  // (as kv_compact_moves)
    if (P >= 0 && node >= 0 && s < slots && d < slots)
      sink += uint32_t(__ldca(p.page_table + row0 + s / ps)) + uint32_t(__ldca(p.page_table + row0 + d / ps));
  }
  return sink;
}

// V: the chunk, uint4 (16 bytes) or uint32_t. stagger_ns: a test hook (DDTREE_KV_COMPACT_STAGGER, read per call):
// odd warps sleep that long before each round's loads, so a missing barrier between a round's loads and stores
// shows as wrong bytes in the tests; 0 in use.
template <class V>
__global__ void __launch_bounds__(kCompactThreads) kv_compact_kernel(ddt_kv_compact_params p, int layers_per_cta,
                                                                      unsigned stagger_ns) {
  __shared__ KvMove moves[kMaxKvMoves];
  __shared__ int n_moves;
  const int r = blockIdx.x, layer0 = blockIdx.y * layers_per_cta;
  const int nl = min(layers_per_cta, p.num_layers - layer0);
  pdl_wait();  // path and path_len come from the accept kernel
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    const int n = kv_compact_moves(&p, r, moves);
    n_moves = n;
    if (n < 0 && blockIdx.y == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);  // (one report per request)
  }
  __syncthreads();
  const int n = n_moves;
  if (n <= 0) return;
  unsigned char* base = static_cast<unsigned char*>(p.kv) + int64_t(layer0) * p.layer_stride;
  const int per_row = p.row_bytes / int(sizeof(V));
  const int per_layer = n * per_row;  // <= 32 x 16,384
  const int total = nl * per_layer;   // < 2^31: the launcher keeps layers_per_cta x 32 x 16,384 below it
  // Chunk c = (layer l, move m, chunk w), numbered layer-major then move-major (the order argued above, per layer).
  auto at = [&](int c, bool src) {
    const int l = c / per_layer, rest = c - l * per_layer, m = rest / per_row;
    return reinterpret_cast<V*>(base + int64_t(l) * p.layer_stride + (src ? moves[m].src : moves[m].dst)) +
           (rest - m * per_row);
  };
  for (int c0 = 0; c0 < total; c0 += kCompactThreads * kChunksPerThread) {
    V v[kChunksPerThread];
    if (stagger_ns && (threadIdx.x & 32)) __nanosleep(stagger_ns);
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int c = c0 + i * kCompactThreads + int(threadIdx.x);
      if (c < total) v[i] = *at(c, true);
    }
    __syncthreads();  // every chunk of the round read before any is written
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int c = c0 + i * kCompactThreads + int(threadIdx.x);
      if (c < total) *at(c, false) = v[i];
    }
  }
}

// Remap: one warp per request (the lanes warm L1, lane 0 checks and swaps).
__global__ void __launch_bounds__(kCompactThreads) kv_remap_kernel(ddt_kv_compact_params p) {
  pdl_wait();
  pdl_launch_dependents();
  const int r = blockIdx.x * (kCompactThreads / 32) + int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  if (r >= p.batch) return;  // (whole warps)
  const uint32_t sink = kv_compact_warm(p, r, lane);
  asm volatile("" ::"r"(sink));  // (keeps the warming loads; no effect)
  if (lane != 0) return;
  KvMove moves[kMaxKvMoves];
  const int n = kv_compact_moves(&p, r, moves);
  if (n < 0) {
    atomicOr(p.status, DDT_DATA_BAD_INDEX);
    return;
  }
  for (int i = 0; i < n; ++i) {
    const int32_t t = p.page_table[moves[i].dst_entry];
    p.page_table[moves[i].dst_entry] = p.page_table[moves[i].src_entry];
    p.page_table[moves[i].src_entry] = t;
  }
}

}  // namespace
}  // namespace ddtree::kern

using namespace ddtree::kern;

extern "C" int ddt_kv_compact_cuda(const ddt_kv_compact_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->batch == 0) return DDT_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->remap) {
    const int per_cta = kCompactThreads / 32;
    const unsigned grid = unsigned((p->batch + per_cta - 1) / per_cta);
    DDT_CUDA_RETURN(launch_pdl(kv_remap_kernel, dim3(grid), dim3(kCompactThreads), 0, s, *p));
    return DDT_OK;
  }
  const bool wide = p->row_bytes % 16 == 0 && p->layer_stride % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(p->kv) % 16 == 0;
  // Layers per CTA: one (request, layer) each while that gives at most ~2,048 CTAs (about one resident wave of these
  // small CTAs on an H100 / H200), else enough layers each to come back to ~2,048: the check runs once per CTA.
  const int64_t pairs = int64_t(p->batch) * p->num_layers;
  // (At most 4,095 layers per CTA: its chunk count, layers x 32 moves x 16,384 chunks at most, stays below 2^31.)
  const int lpc = int(std::min<int64_t>({p->num_layers, 4095, std::max<int64_t>(1, (pairs + 2047) / 2048)}));
  const dim3 grid(unsigned(p->batch), unsigned((p->num_layers + lpc - 1) / lpc));
  const char* stagger_env = std::getenv("DDTREE_KV_COMPACT_STAGGER");  // (test hook: see kv_compact_kernel)
  const unsigned stagger = stagger_env && stagger_env[0] == '1' ? 100000u : 0u;
  if (wide) DDT_CUDA_RETURN(launch_pdl(kv_compact_kernel<uint4>, grid, dim3(kCompactThreads), 0, s, *p, lpc, stagger));
  else DDT_CUDA_RETURN(launch_pdl(kv_compact_kernel<uint32_t>, grid, dim3(kCompactThreads), 0, s, *p, lpc, stagger));
  return DDT_OK;
}
