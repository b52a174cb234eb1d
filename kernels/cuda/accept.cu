// Accept on the GPU (C ABI: ddtree/kernels.h, section 3).
//
// sample_keys: one CTA (256 threads) per (request, node) row of a vocabulary shard; each thread keeps the
// max packed key of its columns, then a block max. Greedy keys pack the logit; sampled keys pack
// logit / T + Gumbel(seed, position + 1, id) from kernels/common/numerics.h (bitwise equal to the CPU).
// accept: one warp per request; the child search at each level is a warp-wide ballot over the nodes'
// (parent, token) pairs, the rest of kernels/common/accept_walk.h runs on every lane (same values).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/accept_walk.h"
#include "kernels/common/numerics.h"
#include "kernels/common/validate.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ddtree::kern {
namespace {

constexpr int kKeyThreads = 256;

__global__ void __launch_bounds__(kKeyThreads) sample_keys_kernel(ddt_sample_keys_params p) {
  __shared__ uint64_t warp_best[kKeyThreads / 32];
  const int64_t row = blockIdx.x;
  const float* x = p.logits + row * p.ld;
  const int64_t out_pos = int64_t(p.positions[row]) + 1;
  const uint64_t seed = p.temperature > 0.0f ? p.seeds[row / p.nodes] : 0;
  uint64_t best = 0;
  int nan = 0;
  auto visit = [&](int c, float v) {
    nan |= num::is_nan(v);
    const uint32_t id = uint32_t(p.vocab_offset + c);
    const uint64_t key = num::pack_key(num::sample_value(v, p.temperature, seed, out_pos, id), id);
    best = key > best ? key : best;
  };
  const int v4 = (reinterpret_cast<uintptr_t>(x) & 15) == 0 ? p.vocab >> 2 : 0;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  for (int i = threadIdx.x; i < v4; i += kKeyThreads) {
    const float4 q = __ldg(x4 + i);
    visit(4 * i, q.x); visit(4 * i + 1, q.y); visit(4 * i + 2, q.z); visit(4 * i + 3, q.w);
  }
  for (int c = 4 * v4 + threadIdx.x; c < p.vocab; c += kKeyThreads) visit(c, __ldg(x + c));
  best = warp_max(best);
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_NAN_LOGIT);
  if (threadIdx.x == 0) {
    uint64_t m = 0;
    for (int w = 0; w < kKeyThreads / 32; ++w) m = warp_best[w] > m ? warp_best[w] : m;
    p.out_keys[row] = m;
  }
}

constexpr int kAcceptWarps = 4;

__global__ void __launch_bounds__(kAcceptWarps * 32) accept_kernel(ddt_accept_params p) {
  const int b = blockIdx.x * kAcceptWarps + (threadIdx.x >> 5);
  if (b >= p.batch) return;  // whole warps exit together
  pdl_wait();  // the tree and the keys may come from the previous kernels on the stream
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(b) * p.n;
  AcceptOut out{p.path + int64_t(b) * p.max_path, p.new_tokens + int64_t(b) * p.max_path};
  auto find_child = [&](int cur, int count, int32_t target) {
    for (int base = cur + 1; base < count; base += 32) {
      const int j = base + lane;
      const bool hit = j < count && p.parents[t + j] == cur && p.tokens[t + j] == target;
      const unsigned m = __ballot_sync(0xFFFFFFFFu, hit);
      if (m) return base + __ffs(m) - 1;
    }
    return -1;
  };
  const uint32_t bad = accept_walk(&p, b, find_child, out);
  if (bad && lane == 0) atomicOr(p.status, bad);
}

}  // namespace
}  // namespace ddtree::kern

using namespace ddtree::kern;

extern "C" int ddt_sample_keys_cuda(const ddt_sample_keys_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  const int64_t rows = int64_t(p->batch) * p->nodes;
  if (rows == 0) return DDT_OK;
  sample_keys_kernel<<<unsigned(rows), kKeyThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}

extern "C" int ddt_accept_cuda(const ddt_accept_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->batch == 0) return DDT_OK;
  const unsigned grid = unsigned((p->batch + kAcceptWarps - 1) / kAcceptWarps);
  DDT_CUDA_RETURN(launch_pdl(accept_kernel, dim3(grid), dim3(kAcceptWarps * 32), 0, static_cast<cudaStream_t>(stream), *p));
  return DDT_OK;
}
