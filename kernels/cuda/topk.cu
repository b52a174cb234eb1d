// Top-K over a vocabulary shard, and the cross-shard combine (C ABI: ddtree/kernels.h, section 1).
//
// topk_shard: one CTA of 512 threads per row. Radix select on the order-preserving 32-bit key:
//   pass A   row max, NaN flag, 2048-bin histogram of key bits [31:21];
//   select   the bin holding the k-th largest key; if every key at or above that bin fits the candidate
//            buffer (2048), one pass collects them and a bitonic sort of (key, ~column) composites gives
//            (logit desc, id asc); otherwise refine on bits [20:10], then [9:0] (exact threshold T), and
//            take the columns == T in column order (smallest ids) with an ordered block scan;
//   the first pass after A also sums e^(x - max) as exact fixed-point integers (topk_math.h), so the
//   lse is bitwise the CPU twin's whatever the summation order.
// Typical logits take 2 passes over the row (the second mostly from L2).
// topk_combine: one CTA per row; each candidate's output rank is its index in its own sorted list plus,
// for every other shard, the count of entries that beat it (binary search), so no merge loop is serial.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/numerics.h"
#include "kernels/common/topk_math.h"
#include "kernels/common/validate.h"
#include "kernels/cuda/cuda_check.cuh"

namespace ddtree::kern {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kCap = 2048;   // candidate buffer, >= DDT_MAX_TOPK
static_assert(kCap >= DDT_MAX_TOPK, "candidate buffer must hold k");

struct TopkSmem {
  uint32_t hist[kBins];
  uint64_t cand[kCap];
  uint32_t warp_u[kWarps];
  float warp_f[kWarps];
  unsigned long long warp_d[kWarps];
  int sel_digit;
  uint32_t sel_gt;  // keys above the selected bin (cumulative over levels)
  uint32_t sel_in;  // keys inside the selected bin
  uint32_t count;
  uint32_t taken;
};

// Calls f(col, x) for this thread's columns of the row (16-byte loads when the row is 16-byte aligned).
template <class F>
__device__ __forceinline__ void for_each_col(const float* row, int vocab, F&& f) {
  const int v4 = (reinterpret_cast<uintptr_t>(row) & 15) == 0 ? vocab >> 2 : 0;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  for (int i = threadIdx.x; i < v4; i += kThreads) {
    const float4 q = __ldg(row4 + i);
    f(4 * i, q.x); f(4 * i + 1, q.y); f(4 * i + 2, q.z); f(4 * i + 3, q.w);
  }
  for (int c = 4 * v4 + threadIdx.x; c < vocab; c += kThreads) f(c, __ldg(row + c));
}

__device__ float block_max_f(float v, TopkSmem& s) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if ((threadIdx.x & 31) == 0) s.warp_f[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = s.warp_f[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, s.warp_f[w]);
  __syncthreads();
  return m;
}

// Integer sum over the block (exact).
__device__ uint64_t block_sum_u64(uint64_t v, TopkSmem& s) {
  unsigned long long u = v;
  for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xFFFFFFFFu, u, o);
  if ((threadIdx.x & 31) == 0) s.warp_d[threadIdx.x >> 5] = u;
  __syncthreads();
  uint64_t t = 0;
  for (int w = 0; w < kWarps; ++w) t += s.warp_d[w];
  __syncthreads();
  return t;
}

// Finds the digit d of the histogram with  gt + count(digits > d) < need <= gt + count(digits >= d).
// Each thread owns 4 consecutive bins; suffix sums over threads by warp shuffles.
__device__ void select_digit(TopkSmem& s, int nbins, uint32_t gt, uint32_t need) {
  const int per = nbins / kThreads;  // 4 for 2048 bins, 2 for 1024
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  uint32_t mine = 0;
  for (int j = 0; j < per; ++j) mine += s.hist[t * per + j];
  // inclusive suffix sum within the warp (lanes above)
  uint32_t suf = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t v = __shfl_down_sync(0xFFFFFFFFu, suf, o);
    if (lane + o < 32) suf += v;
  }
  if (lane == 0) s.warp_u[warp] = suf;  // warp total
  __syncthreads();
  uint32_t above = gt + (suf - mine);
  for (int w = warp + 1; w < kWarps; ++w) above += s.warp_u[w];
  for (int j = per - 1; j >= 0; --j) {
    const uint32_t h = s.hist[t * per + j];
    if (above < need && need <= above + h) {
      s.sel_digit = t * per + j;
      s.sel_gt = above;
      s.sel_in = h;
    }
    above += h;
  }
  __syncthreads();
}

// Bitonic sort of s.cand[0, n2) descending (n2 a power of two).
__device__ void sort_desc(TopkSmem& s, int n2) {
  for (int size = 2; size <= n2; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < (n2 >> 1); i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const uint64_t a = s.cand[lo], b = s.cand[hi];
        const bool desc = (lo & size) == 0;
        if ((a < b) == desc) { s.cand[lo] = b; s.cand[hi] = a; }
      }
      __syncthreads();
    }
}

__global__ void __launch_bounds__(kThreads) topk_shard_kernel(ddt_topk_shard_params p) {
  __shared__ TopkSmem s;
  const int r = blockIdx.x;
  const float* row = p.logits + int64_t(r) * p.ld;
  const int vocab = p.vocab;
  const uint32_t keff = uint32_t(min(p.k, vocab));

  for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[i] = 0;
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  // Pass A.
  float m = num::kNegInf;
  int nan = 0;
  for_each_col(row, vocab, [&](int, float x) {
    if (num::is_nan(x)) nan = 1; else m = fmaxf(m, x);
    atomicAdd(&s.hist[num::order_bits(x) >> 21], 1u);
  });
  if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_NAN_LOGIT);
  m = block_max_f(m, s);
  if (threadIdx.x == 0 && m == -num::kNegInf) atomicOr(p.status, DDT_DATA_NAN_LOGIT);  // +inf logit

  uint64_t sum = 0;
  bool summed = false;
  auto add_exp = [&](float x) { sum += exp_fixed(x, m); };

  // Radix levels: (shift, bits). lo..hi: the key range of the selected bin.
  uint32_t prefix = 0, prefix_mask = 0, gt = 0;
  const int shifts[3] = {21, 10, 0};
  const int nbins_at[3] = {2048, 2048, 1024};
  int level = 0;
  bool collected = false;
  for (; level < 3; ++level) {
    const int sh = shifts[level];
    if (level > 0) {
      for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[i] = 0;
      __syncthreads();
      const uint32_t dmask = uint32_t(nbins_at[level] - 1);
      for_each_col(row, vocab, [&](int, float x) {
        if (!summed) add_exp(x);
        const uint32_t key = num::order_bits(x);
        if ((key & prefix_mask) == prefix) atomicAdd(&s.hist[(key >> sh) & dmask], 1u);
      });
      summed = true;
      __syncthreads();
    }
    select_digit(s, nbins_at[level], gt, keff);
    const uint32_t digit = uint32_t(s.sel_digit);
    gt = s.sel_gt;
    const uint32_t in = s.sel_in;
    prefix |= digit << sh;
    prefix_mask |= uint32_t(nbins_at[level] - 1) << sh;
    if (gt + in <= uint32_t(kCap)) {
      // Collect every key >= the bin's lower bound: at most kCap of them.
      const uint32_t lower = prefix;
      for_each_col(row, vocab, [&](int c, float x) {
        if (!summed) add_exp(x);
        const uint32_t key = num::order_bits(x);
        if (key >= lower) s.cand[atomicAdd(&s.count, 1u)] = (uint64_t(key) << 32) | uint64_t(0xFFFFFFFFu - c);
      });
      summed = true;
      collected = true;
      break;
    }
    __syncthreads();
  }
  if (!collected) {
    // Exact threshold T = prefix; gt < keff keys above it, more than kCap - gt equal to it.
    const uint32_t T = prefix;
    for_each_col(row, vocab, [&](int c, float x) {
      const uint32_t key = num::order_bits(x);
      if (key > T) s.cand[atomicAdd(&s.count, 1u)] = (uint64_t(key) << 32) | uint64_t(0xFFFFFFFFu - c);
    });
    if (threadIdx.x == 0) s.taken = 0;
    __syncthreads();
    const uint32_t need = keff - gt;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int base = 0; base < vocab; base += kThreads) {
      const int c = base + threadIdx.x;
      const bool eq = c < vocab && num::order_bits(row[c]) == T;
      const unsigned bal = __ballot_sync(0xFFFFFFFFu, eq);
      if (lane == 0) s.warp_u[warp] = __popc(bal);
      __syncthreads();
      uint32_t before = s.taken + __popc(bal & ((1u << lane) - 1u));
      uint32_t total = 0;
      for (int w = 0; w < kWarps; ++w) { if (w < warp) before += s.warp_u[w]; total += s.warp_u[w]; }
      if (eq && before < need) s.cand[gt + before] = (uint64_t(T) << 32) | uint64_t(0xFFFFFFFFu - c);
      __syncthreads();
      if (threadIdx.x == 0) s.taken += total;
      __syncthreads();
      if (s.taken >= need) break;
    }
    if (threadIdx.x == 0) s.count = keff;
    __syncthreads();
  }
  __syncthreads();
  const int count = int(s.count);
  int n2 = 1;
  while (n2 < count) n2 <<= 1;
  for (int i = count + threadIdx.x; i < n2; i += kThreads) s.cand[i] = 0;
  __syncthreads();
  sort_desc(s, n2);
  const uint64_t total = block_sum_u64(sum, s);
  if (threadIdx.x == 0) p.out_lse[r] = finish_lse(m, total);
  for (int j = threadIdx.x; j < p.k; j += kThreads) {
    const int64_t o = int64_t(r) * p.k + j;
    if (j < int(keff) && j < count) {
      p.out_values[o] = num::key_value(s.cand[j]);
      p.out_ids[o] = p.vocab_offset + int32_t(num::key_id(s.cand[j]));
    } else {
      p.out_values[o] = num::kNegInf;
      p.out_ids[o] = -1;
    }
  }
}

constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads) topk_combine_kernel(ddt_topk_combine_params p) {
  __shared__ int len[64];
  __shared__ float lse_s;
  const int r = blockIdx.x, S = p.shards, K = p.k;
  auto idx = [&](int s, int j) { return (int64_t(s) * p.rows + r) * K + j; };
  auto comp = [&](int s, int j) { return num::pack_key(p.values[idx(s, j)], uint32_t(p.ids[idx(s, j)])); };
  // Valid prefix length of each shard's list (padding, id -1, only at the tail).
  for (int s = threadIdx.x; s < S; s += kCombineThreads) {
    int lo = 0, hi = K;  // first j with id < 0
    while (lo < hi) { const int mid = (lo + hi) / 2; if (p.ids[idx(s, mid)] >= 0) lo = mid + 1; else hi = mid; }
    len[s] = lo;
  }
  if (threadIdx.x == 0) {
    float m = num::kNegInf;
    for (int s = 0; s < S; ++s) m = fmaxf(m, p.lse[int64_t(s) * p.rows + r]);
    uint64_t sum = 0;
    if (m != num::kNegInf)
      for (int s = 0; s < S; ++s) sum += exp_fixed(p.lse[int64_t(s) * p.rows + r], m);
    lse_s = finish_lse(m, sum);
  }
  __syncthreads();
  int total = 0;
  for (int s = 0; s < S; ++s) total += len[s];
  for (int t = threadIdx.x; t < S * K; t += kCombineThreads) {
    const int s = t / K, j = t % K;
    if (j >= len[s]) continue;
    const uint64_t c = comp(s, j);
    int rank = j;
    for (int o = 0; o < S && rank < K; ++o) {
      if (o == s) continue;
      int lo = 0, hi = len[o];  // entries of list o with composite > c form a prefix
      while (lo < hi) { const int mid = (lo + hi) / 2; if (comp(o, mid) > c) lo = mid + 1; else hi = mid; }
      rank += lo;
    }
    if (rank < K) {
      p.out_logprobs[int64_t(r) * K + rank] = logprob(num::key_value(c), lse_s);  // as the CPU twin
      p.out_ids[int64_t(r) * K + rank] = p.ids[idx(s, j)];
    }
  }
  for (int j = total + threadIdx.x; j < K; j += kCombineThreads) {
    p.out_logprobs[int64_t(r) * K + j] = num::kNegInf;
    p.out_ids[int64_t(r) * K + j] = -1;
  }
}

}  // namespace
}  // namespace ddtree::kern

using namespace ddtree::kern;

extern "C" int ddt_topk_shard_cuda(const ddt_topk_shard_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->rows == 0) return DDT_OK;
  topk_shard_kernel<<<p->rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}

extern "C" int ddt_topk_combine_cuda(const ddt_topk_combine_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->rows == 0) return DDT_OK;
  topk_combine_kernel<<<p->rows, kCombineThreads, 0, static_cast<cudaStream_t>(stream)>>>(*p);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}
