// DDTree best-first tree builder on the GPU (C ABI: ddtree/kernels.h, section 2).
//
// One CTA (128 threads) per request. The heap of the CPU twin becomes a frontier array in shared memory
// whose slots are striped over the 32 lanes of warp 0; each lane caches the best key of its slots, and a
// pop is a warp max-reduction of the keys' high halves (__reduce_max_sync) and a ballot (a second
// reduction of the low halves only when high halves tie). All lanes run the same instructions: no
// divergent branch in the loop. The
// key is (order bits of the score) << 32 | (0xFFFFFFFF - push sequence number): the same total order as
// the CPU heap, so pops happen in the same order and the trees are bitwise identical. Log-probs are staged
// in shared memory first so the serial loop never waits on global memory; every lane executes the same
// bookkeeping (no divergent lane-0 branch); afterwards all 128 threads derive the child lists and write
// the outputs (tokens, slots, positions, ancestor bitmask rows) in parallel.
//
// Shared memory: lp [min(L, B+1), min(K, B+1)] f32 + frontier (B+1 rounded to 32) x 16 B + 6 x N x 4 B;
// about 86 KB at B = 512, L = 32 (opt-in above 48 KB; <= 99 KB so it also fits sm_120).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/numerics.h"
#include "kernels/common/tree_layout.h"
#include "kernels/common/validate.h"
#include "kernels/cuda/cuda_check.cuh"

namespace ddtree::kern {
namespace {

constexpr int kThreads = 128;

struct TreeSmemPlan {
  int Lc, Kc, cap, N;
  size_t off_key, off_pay, off_prev, off_lp, off_node_pay, off_score, off_par, off_fc, off_ns, off_node_prev, bytes;
};

__host__ __device__ inline TreeSmemPlan plan(int depth, int k, int budget) {
  TreeSmemPlan t{};
  t.N = budget + 1;
  t.Lc = depth < budget + 1 ? depth : budget + 1;  // a popped node's depth is <= budget
  t.Kc = k < budget + 1 ? k : budget + 1;          // a pushed rank is <= budget
  t.cap = (t.N + 31) / 32 * 32;                    // frontier slots: 1 + (pops with two pushes) <= N
  size_t o = 0;
  t.off_key = o; o += size_t(t.cap) * 8;
  t.off_pay = o; o += size_t(t.cap) * 4;
  t.off_prev = o; o += size_t(t.cap) * 4;
  t.off_lp = o; o += size_t(t.Lc) * t.Kc * 4;
  t.off_node_pay = o; o += size_t(t.N) * 4;
  t.off_score = o; o += size_t(t.N) * 4;
  t.off_par = o; o += size_t(t.N) * 4;
  t.off_fc = o; o += size_t(t.N) * 4;
  t.off_ns = o; o += size_t(t.N) * 4;
  t.off_node_prev = o; o += size_t(t.N) * 4;
  t.bytes = o;
  return t;
}
static_assert(DDT_MAX_BUDGET + 1 <= 1024, "parent index must fit the 10-bit payload field");

__global__ void __launch_bounds__(kThreads) tree_build_kernel(ddt_tree_build_params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const TreeSmemPlan t = plan(p.depth, p.k, p.budget);
  uint64_t* fr_key = reinterpret_cast<uint64_t*>(smem + t.off_key);
  uint32_t* fr_pay = reinterpret_cast<uint32_t*>(smem + t.off_pay);
  float* lp_s = reinterpret_cast<float*>(smem + t.off_lp);
  uint32_t* node_pay = reinterpret_cast<uint32_t*>(smem + t.off_node_pay);
  float* node_score = reinterpret_cast<float*>(smem + t.off_score);
  int32_t* par_s = reinterpret_cast<int32_t*>(smem + t.off_par);
  int32_t* fc_s = reinterpret_cast<int32_t*>(smem + t.off_fc);
  int32_t* ns_s = reinterpret_cast<int32_t*>(smem + t.off_ns);
  int32_t* fr_prev = reinterpret_cast<int32_t*>(smem + t.off_prev);       // item's previous sibling node
  int32_t* node_prev = reinterpret_cast<int32_t*>(smem + t.off_node_prev);
  __shared__ int n_nodes;

  const int b = blockIdx.x, N = t.N, L = p.depth, K = p.k, B = p.budget, Kc = t.Kc;
  const float* lp = p.logprobs + int64_t(b) * L * K;
  for (int i = threadIdx.x; i < t.Lc * Kc; i += kThreads) lp_s[i] = lp[(i / Kc) * K + (i % Kc)];
  for (int i = threadIdx.x; i < t.cap; i += kThreads) fr_key[i] = 0;
  for (int i = threadIdx.x; i < N; i += kThreads) { fc_s[i] = -1; ns_s[i] = -1; }
  __syncthreads();

  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    constexpr unsigned kAll = 0xFFFFFFFFu;
    bool nan = false;
    uint32_t seq = 0;
    int n = 0, next_free = 1;
    uint64_t best = 0;  // best key among this lane's slots (lane + 32 j)
    int best_slot = 0;
    node_score[0] = 0.0f;  // node arrays: every lane stores the same value (no divergent branch)
    {
      const float v = lp_s[0];
      nan |= num::is_nan(v);
      if (v > num::kNegInf) {
        const uint64_t key = item_key(v, seq++);
        if (lane == 0) { fr_key[0] = key; fr_pay[0] = pack_item(0, 1, 0); fr_prev[0] = -1; best = key; }
      }
    }
    __syncwarp();
    while (n < B) {
      // Pop: max of the lanes' best keys. Every branch below is warp-uniform (a divergent branch costs
      // ~90 cycles on the H200, docs/PERF_NOTES.md), so the owner is found by a vote, not a branch.
      const uint32_t hi = uint32_t(best >> 32);
      const uint32_t mhi = __reduce_max_sync(kAll, hi);
      if (mhi == 0) break;  // frontier empty
      unsigned cand = __ballot_sync(kAll, hi == mhi);
      if (__popc(cand) > 1) {  // equal scores: the smaller sequence number (larger low half) wins
        const uint32_t mlo = __reduce_max_sync(kAll, hi == mhi ? uint32_t(best) : 0u);
        cand = __ballot_sync(kAll, hi == mhi && uint32_t(best) == mlo);
      }
      const int slot = __shfl_sync(kAll, best_slot, __ffs(cand) - 1);
      const uint32_t pay = fr_pay[slot];
      const int prev = fr_prev[slot];
      const float s = num::from_order_bits(mhi);
      const int pa = item_parent(pay), d = item_depth(pay), r = item_rank(pay);
      const int i = ++n;
      node_pay[i] = pay;  // node arrays and frontier slots: every lane stores the same value
      node_score[i] = s;
      node_prev[i] = prev;
      // Pushes, in the CPU twin's order: next sibling, then first child.
      uint64_t k1 = 0, k2 = 0;
      uint32_t p1 = 0, p2 = 0;
      int prev1 = -1;
      if (r + 1 < K) {
        const float v = lp_s[(d - 1) * Kc + r + 1];
        nan |= num::is_nan(v);
        if (v > num::kNegInf) {
          k1 = item_key(DDT_ADD(node_score[pa], v), seq++); p1 = pack_item(pa, d, r + 1); prev1 = i;
        }
      }
      if (d < L) {
        const float v = lp_s[d * Kc];
        nan |= num::is_nan(v);
        if (v > num::kNegInf) {
          const uint64_t kc = item_key(DDT_ADD(s, v), seq++);
          const uint32_t pc = pack_item(i, d + 1, 0);
          if (k1 == 0) { k1 = kc; p1 = pc; } else { k2 = kc; p2 = pc; }
        }
      }
      // The popped slot takes the first push; a second push (always a first child) takes a fresh slot.
      fr_key[slot] = k1; fr_pay[slot] = p1; fr_prev[slot] = prev1;
      if (k2 != 0) {
        const int ns = next_free++;
        fr_key[ns] = k2; fr_pay[ns] = p2; fr_prev[ns] = -1;
      }
      // Every lane rescans its slots (uniform trip count; unused slots hold key 0): cheaper than a
      // divergent update of the two lanes whose slots changed.
      best = 0;
      for (int q = lane, end = (next_free + 31) & ~31; q < end; q += 32) {
        const uint64_t kq = fr_key[q];
        if (kq > best) { best = kq; best_slot = q; }
      }
    }
    if (lane == 0) {
      n_nodes = n;
      if (nan) atomicOr(p.status, DDT_DATA_NAN_LOGIT);
    }
  }
  __syncthreads();

  const int n = n_nodes;
  // Child lists: siblings pop in rank order (rank r + 1 is pushed when rank r pops), so a parent's first
  // child is its rank-0 child and a node's next sibling is the node whose item it pushed.
  for (int i = 1 + threadIdx.x; i <= n; i += kThreads) {
    if (item_rank(node_pay[i]) == 0) fc_s[item_parent(node_pay[i])] = i;
    else ns_s[node_prev[i]] = i;
  }
  __syncthreads();
  const int32_t P = p.prefix_lens[b];
  const int32_t root = p.root_tokens[b];
  const int32_t* ids = p.token_ids + int64_t(b) * L * K;
  const int64_t o = int64_t(b) * N;
  for (int i = threadIdx.x; i < N; i += kThreads) {
    int32_t tok, pa, d;
    float sc;
    if (i == 0) { tok = root; pa = -1; d = 0; sc = 0.0f; }
    else if (i <= n) {
      const uint32_t pay = node_pay[i];
      d = item_depth(pay); pa = item_parent(pay); sc = node_score[i];
      tok = ids[(d - 1) * K + item_rank(pay)];
    } else { tok = root; pa = -1; d = 1; sc = num::kNegInf; }
    par_s[i] = pa;
    p.tokens[o + i] = tok; p.parents[o + i] = pa; p.depths[o + i] = d; p.scores[o + i] = sc;
    p.slots[o + i] = P + i; p.positions[o + i] = P + d;
    p.first_child[o + i] = fc_s[i]; p.next_sibling[o + i] = ns_s[i];
  }
  __syncthreads();
  const int W = vis_words(N);
  for (int i = threadIdx.x; i < N; i += kThreads) write_vis_row(par_s, i, W, p.vis + (o + i) * W);
  if (threadIdx.x == 0) p.node_count[b] = n + 1;
}

}  // namespace
}  // namespace ddtree::kern

using namespace ddtree::kern;

extern "C" int ddt_tree_build_cuda(const ddt_tree_build_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->batch == 0) return DDT_OK;
  const TreeSmemPlan t = plan(p->depth, p->k, p->budget);
  static const int max_bytes = [] {  // opt in once to the largest plan (no effect on graph capture)
    const int bytes = int(plan(DDT_MAX_DEPTH, DDT_MAX_TOPK, DDT_MAX_BUDGET).bytes);
    return cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
                   cudaSuccess ? bytes : -1;
  }();
  if (max_bytes < 0) {
    (void)cudaGetLastError();
    return fail(DDT_ERR_CUDA, "tree_build: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed");
  }
  tree_build_kernel<<<p->batch, kThreads, t.bytes, static_cast<cudaStream_t>(stream)>>>(*p);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}
