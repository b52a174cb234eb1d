// DDTree best-first tree builder on the GPU (C ABI: ddtree/kernels.h, section 2).
//
// One CTA (256 threads) per request; bitwise the CPU twin's trees. Three selection paths fill the same node
// arrays (node i = the i-th pop):
//
// 0. Register heap (budgets up to 64, any input): warp 0 simulates the heap with the frontier in registers
//    (select_regheap): per pop one redux.sync + ballot (a second pair only on an exact score tie), one
//    shuffle and compare-selects, no shared-memory access on the critical path and no divergent branch;
//    ~200-250 cycles per pop against ~800 for path 2 (docs/wip/tree_build_notes.md).
// 1. Rounds (budgets above 64). The heap's items form a binary "push tree": an item's pusher is its previous
//    sibling (rank r - 1) or, for a rank-0 item, its parent; an item's key never exceeds its pusher's. The
//    heap pops items in descending (score, then push order); push order among equal scores is the pop
//    order of the pushers, then sibling before child. So the B pops are the B first items of that total
//    order, and the set of all items scoring >= theta is closed under pushers. The CTA grows that set in
//    phases: pick theta (the need-th best score of the frontier through a 2-level histogram, or the
//    frontier's minimum when it holds fewer items than still needed), move the frontier items >= theta into
//    the set, then expand generation by generation (children >= theta join the set, others the next
//    frontier) until the set holds B items. The first phase's theta is a lower bound on the B-th best
//    score (the B-th best "chain" item: all ancestors rank 0), so one phase usually suffices; an overflow
//    raises theta halfway to the frontier's best and retries. Sibling runs join in one step, so a phase
//    takes about one generation per tree level. A bitonic sort by the exact pop order (equal scores
//    compared through their pusher chains) gives the nodes.
// 2. Serial (budgets above 64 with input that is not heap-ordered, and the fallback when the rounds set
//    overflows its shared-memory capacity, e.g. massive exact ties): warp 0
//    simulates the heap: the frontier's slots are striped over the lanes, each lane caches its best key,
//    a pop is a warp max-reduction of the keys' high halves, a ballot (a second reduction of the low halves
//    only on a tie), and uniform bookkeeping (no divergent branch). ~0.4 us per pop on the H200.
//
// Log-probs are staged in shared memory first; afterwards all threads derive the child lists, the NaN
// flags of the pushes the heap would have evaluated, and write the outputs in parallel.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/numerics.h"
#include "kernels/common/tree_layout.h"
#include "kernels/common/validate.h"
#include "kernels/cuda/cuda_check.cuh"

namespace ddtree::kern {
namespace {

constexpr int kThreads = 256;

// Dev profiling (bench/dev/tree_profile.cu defines DDT_TREE_PROFILE): per CTA, clock64 stamps and counters
// in g_tree_profile[blockIdx.x][16]. Compiled out otherwise.
#ifdef DDT_TREE_PROFILE
__device__ long long g_tree_profile[1024][16];
#define DDT_PROF_STAMP(slot) do { if (threadIdx.x == 0) g_tree_profile[blockIdx.x][slot] = clock64(); } while (0)
#define DDT_PROF_COUNT(slot) do { if (threadIdx.x == 0) ++g_tree_profile[blockIdx.x][slot]; } while (0)
#define DDT_PROF_SET(slot, v) do { if (threadIdx.x == 0) g_tree_profile[blockIdx.x][slot] = (v); } while (0)
#else
#define DDT_PROF_STAMP(slot) do {} while (0)
#define DDT_PROF_COUNT(slot) do {} while (0)
#define DDT_PROF_SET(slot, v) do {} while (0)
#endif
constexpr unsigned kAll = 0xFFFFFFFFu;

// Items of the rounds path: payload = parent candidate (11 bits) | depth (6) | rank (10) | kind (1: a
// first child, 0: a next sibling or the initial item) | sibling-done (1: its next sibling was generated).
__host__ __device__ inline uint32_t pack_cand(int parent, int depth, int rank, int kind) {
  return uint32_t(parent) | (uint32_t(depth) << 11) | (uint32_t(rank) << 17) | (uint32_t(kind) << 27);
}
constexpr uint32_t kSiblingDone = 1u << 28;
__device__ inline int cand_parent(uint32_t w) { return int(w & 0x7FFu); }
__device__ inline int cand_depth(uint32_t w) { return int((w >> 11) & 0x3Fu); }
__device__ inline int cand_rank(uint32_t w) { return int((w >> 17) & 0x3FFu); }
__device__ inline int cand_kind(uint32_t w) { return int((w >> 27) & 1u); }
constexpr int kMaxCand = 2048;  // 11-bit candidate ids
constexpr int kRegHeapMaxBudget = 64;  // budgets up to this use the register heap (select_regheap)
constexpr int kRegHeapMaxSlots = (kRegHeapMaxBudget + 1 + 31) / 32;  // its frontier slots per lane
static_assert(kRegHeapMaxSlots <= 3, "tree_build_kernel instantiates select_regheap for 1, 2 and 3 slots per lane");
constexpr int kRankSortMax = 256;     // candidate sets up to this size are ordered by rank counting

struct TreeSmemPlan {
  int Lc, Kc, N, cap, cs;  // cap: serial frontier slots; cs: rounds set / frontier capacity (0: serial only)
  size_t off_lp, off_node_pay, off_score, off_node_prev, off_par, off_fc, off_ns;
  size_t off_s_score, off_s_pay, off_s_push, off_f, off_sort, off_node_of;   // rounds
  size_t off_key, off_pay, off_prev;                                          // serial (aliases rounds)
  size_t bytes;
};

__host__ __device__ inline TreeSmemPlan plan(int depth, int k, int budget, int cs) {
  TreeSmemPlan t{};
  t.N = budget + 1;
  t.Lc = depth < budget + 1 ? depth : budget + 1;  // a popped node's depth is <= budget
  t.Kc = k < budget + 1 ? k : budget + 1;          // a pushed rank of a popped node is <= budget
  t.cap = (t.N + 31) / 32 * 32;
  t.cs = cs;
  size_t o = 0;
  auto take = [&](size_t bytes) { const size_t at = o; o += (bytes + 15) / 16 * 16; return at; };
  t.off_lp = take(size_t(t.Lc) * t.Kc * 4);
  t.off_node_pay = take(size_t(t.N) * 4);
  t.off_score = take(size_t(t.N) * 4);
  t.off_node_prev = take(size_t(t.N) * 4);
  t.off_par = take(size_t(t.N) * 4);
  t.off_fc = take(size_t(t.N) * 4);
  t.off_ns = take(size_t(t.N) * 4);
  const size_t region = o;
  // rounds: set S [cs] (score, payload, pusher), two frontiers [2][cs] (score, payload, pusher),
  // sort keys [pow2 >= cs] u16, node_of [cs] i16
  int n2 = 1;
  while (n2 < cs) n2 <<= 1;
  t.off_s_score = take(size_t(cs) * 4);
  t.off_s_pay = take(size_t(cs) * 4);
  t.off_s_push = take(size_t(cs) * 4);
  t.off_f = take(size_t(2) * cs * 12);
  t.off_sort = take(size_t(n2) * 2);
  t.off_node_of = take(size_t(cs) * 2);
  const size_t rounds_end = o;
  // serial: frontier slots (key, payload, previous sibling), aliasing the rounds region
  o = region;
  t.off_key = take(size_t(t.cap) * 8);
  t.off_pay = take(size_t(t.cap) * 4);
  t.off_prev = take(size_t(t.cap) * 4);
  t.bytes = o > rounds_end ? o : rounds_end;
  return t;
}
// Rounds capacity for a budget: room for generous overshoot, within the 11-bit candidate ids.
__host__ __device__ inline int rounds_capacity(int budget) {
  const int c = 4 * budget + 64;
  return c < kMaxCand ? c : kMaxCand;
}
static_assert(DDT_MAX_BUDGET + 1 <= 1024, "parent node index must fit the 10-bit payload field");

struct Scalars {
  int n, s_count, f_count[2], gen_end, overflow;
  uint32_t theta, fmax, hist_sel, need, valid;
  int chain_depth;       // depths d < chain_depth have a rank-0 chain of finite log-probs above them
  float chain[DDT_MAX_DEPTH + 1];  // chain[d] = score of the all-rank-0 prefix of depth d
  uint32_t hist[256];
};

// Warp 0 finds, in hist[256] (counts per digit), the digit d with above(d) < need <= above(d) + hist[d]
// where above(d) counts the digits > d, and stores it in sc.hist_sel (all lanes of warp 0 call it).
__device__ void select_bin(Scalars& sc, uint32_t need) {
  const int lane = threadIdx.x & 31;
  uint32_t mine = 0;
  for (int j = 0; j < 8; ++j) mine += sc.hist[lane * 8 + j];
  uint32_t suf = mine;  // inclusive suffix sum over lanes >= lane
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t v = __shfl_down_sync(kAll, suf, o);
    if (lane + o < 32) suf += v;
  }
  uint32_t above = suf - mine;
  for (int j = 7; j >= 0; --j) {
    const uint32_t h = sc.hist[lane * 8 + j];
    if (above < need && need <= above + h) sc.hist_sel = uint32_t(lane * 8 + j);
    above += h;
  }
}

// theta such that at least `need` of the `count` scores (order bits from order_of(i); 0 = not a score)
// are >= theta: the lower edge of the 16-bit key bin holding the need-th best, found by two 8-bit
// histogram passes (all threads call it; needs count valid scores >= need). Also counts sc.valid.
template <class OrderOf>
__device__ uint32_t hist_theta(int count, OrderOf order_of, uint32_t need, Scalars& sc) {
  const int tid = threadIdx.x;
  // Histogram adds are warp-aggregated (__match_any_sync): scores crowd into few bins, and per-item
  // atomics on one bin serialize.
  auto add = [&](bool valid, uint32_t bin) {
    const unsigned peers = __match_any_sync(kAll, valid ? bin : 0xFFFFFFFFu);
    if (valid && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sc.hist[bin], uint32_t(__popc(peers)));
  };
  for (int i = tid; i < 256; i += kThreads) sc.hist[i] = 0;
  __syncthreads();
  for (int base = 0; base < count; base += kThreads) {  // uniform trip count: every lane reaches the match
    const int i = base + tid;
    const uint32_t o = i < count ? order_of(i) : 0u;
    add(o != 0u, o >> 24);
  }
  __syncthreads();
  if (tid < 32) select_bin(sc, need);
  __syncthreads();
  const uint32_t b1 = sc.hist_sel;
  uint32_t above = 0;  // scores in bins above b1
  for (int d = int(b1) + 1; d < 256; ++d) above += sc.hist[d];
  __syncthreads();
  for (int i = tid; i < 256; i += kThreads) sc.hist[i] = 0;
  __syncthreads();
  for (int base = 0; base < count; base += kThreads) {
    const int i = base + tid;
    const uint32_t o = i < count ? order_of(i) : 0u;
    add(o != 0u && (o >> 24) == b1, (o >> 16) & 0xFFu);
  }
  __syncthreads();
  if (tid < 32) select_bin(sc, need - above);
  __syncthreads();
  const uint32_t theta = (b1 << 24) | (sc.hist_sel << 16);
  __syncthreads();
  return theta;
}

// True when candidate a pops before candidate b (a != b): higher score first; equal scores in push order,
// which is the pop order of their pushers, and sibling (kind 0) before child (kind 1) for one pusher.
__device__ bool pops_before(int a, int b, const float* s_score, const uint32_t* s_pay, const int32_t* s_push) {
  while (true) {
    const uint32_t oa = num::order_bits(s_score[a]), ob = num::order_bits(s_score[b]);
    if (oa != ob) return oa > ob;
    const int pa = s_push[a], pb = s_push[b];
    if (pa == pb) return cand_kind(s_pay[a]) < cand_kind(s_pay[b]);
    if (pa < 0) return true;  // a is the initial item: pushed first
    if (pb < 0) return false;
    a = pa;
    b = pb;
  }
}

// Rounds selection (all threads). Returns the node count n (>= 0) in sc.n, or sets sc.overflow.
__device__ void select_rounds(const TreeSmemPlan& t, unsigned char* smem, const float* lp_s, int L, int K, int B,
                              uint32_t* node_pay, float* node_score, int32_t* node_prev, Scalars& sc) {
  const int Kc = t.Kc, Lc = t.Lc, cs = t.cs, tid = threadIdx.x;
  float* s_score = reinterpret_cast<float*>(smem + t.off_s_score);
  uint32_t* s_pay = reinterpret_cast<uint32_t*>(smem + t.off_s_pay);
  int32_t* s_push = reinterpret_cast<int32_t*>(smem + t.off_s_push);
  // Frontier q (0 or 1): [cs] scores, then [cs] payloads, then [cs] pushers.
  auto f_score = [&](int q) { return reinterpret_cast<float*>(smem + t.off_f + size_t(q) * cs * 12); };
  auto f_pay = [&](int q) { return reinterpret_cast<uint32_t*>(smem + t.off_f + size_t(q) * cs * 12 + size_t(cs) * 4); };
  auto f_push = [&](int q) { return reinterpret_cast<int32_t*>(smem + t.off_f + size_t(q) * cs * 12 + size_t(cs) * 8); };
  uint16_t* sorted = reinterpret_cast<uint16_t*>(smem + t.off_sort);
  int16_t* node_of = reinterpret_cast<int16_t*>(smem + t.off_node_of);

  if (tid == 0) {
    sc.overflow = 0;
    sc.s_count = 1;  // candidate 0 is the root node (score 0)
    s_score[0] = 0.0f; s_pay[0] = 0; s_push[0] = -1;
    sc.f_count[0] = 0;
    const float v = lp_s[0];
    if (v > num::kNegInf) { f_score(0)[0] = DDT_ADD(0.0f, v);  // root score + log-prob (-0 -> +0, as the heap)
      f_pay(0)[0] = pack_cand(0, 1, 0, 0); f_push(0)[0] = -1; sc.f_count[0] = 1; }
    // Rank-0 chain scores, summed root to leaf as the heap sums them.
    sc.chain[0] = 0.0f;
    int d = 0;
    while (d + 1 < Lc && lp_s[d * Kc] > num::kNegInf) { sc.chain[d + 1] = DDT_ADD(sc.chain[d], lp_s[d * Kc]); ++d; }
    sc.chain_depth = d + 1;
  }
  __syncthreads();
  int cur = 0;
  // Appends an item scoring >= theta to the set, else to the next frontier.
  auto place = [&](float score, uint32_t pay, int pusher, uint32_t theta, int nxt) {
    if (num::order_bits(score) >= theta) {
      const int at = atomicAdd(&sc.s_count, 1);
      if (at < cs) { s_score[at] = score; s_pay[at] = pay; s_push[at] = pusher; } else sc.overflow = 1;
    } else {
      const int at = atomicAdd(&sc.f_count[nxt], 1);
      if (at < cs) { f_score(nxt)[at] = score; f_pay(nxt)[at] = pay; f_push(nxt)[at] = pusher; } else sc.overflow = 1;
    }
  };
  while (true) {
    const int fc = sc.f_count[cur];
    const int have = sc.s_count - 1;
    if (have >= B || fc == 0 || sc.overflow) break;
    const uint32_t need = uint32_t(B - have);
    const int nxt = cur ^ 1;
    DDT_PROF_COUNT(8);  // phases
    // theta, three ways (at least `need` new items score >= theta in each):
    //  - first phase: a lower bound on the B-th best score of all items, the B-th best among the
    //    "chain" items (rank-0 ancestors only, any last rank): their scores are computable at once and
    //    they are a subset of all items, so usually one phase suffices;
    //  - more frontier items than needed: the need-th best frontier score (16-bit bin edge);
    //  - otherwise the frontier's minimum.
    if (tid == 0) { sc.theta = 0xFFFFFFFFu; sc.fmax = 0; sc.valid = 0; }
    __syncthreads();
    for (int i = tid; i < fc; i += kThreads) atomicMax(&sc.fmax, num::order_bits(f_score(cur)[i]));
    bool chosen = false;
    if (have == 0) {
      auto chain_order = [&](int i) -> uint32_t {
        const int d = i / Kc;
        const float v = lp_s[i];
        return (d < sc.chain_depth && v > num::kNegInf) ? num::order_bits(DDT_ADD(sc.chain[d], v)) : 0u;
      };
      uint32_t mine = 0;
      for (int i = tid; i < Lc * Kc; i += kThreads) mine += chain_order(i) != 0u;
      mine = __reduce_add_sync(kAll, mine);  // one atomic per warp, not per item
      if ((tid & 31) == 0 && mine) atomicAdd(&sc.valid, mine);
      __syncthreads();
      if (sc.valid >= need) {
        const uint32_t th = hist_theta(Lc * Kc, chain_order, need, sc);
        if (tid == 0) sc.theta = th;
        chosen = true;
      }
    }
    if (!chosen) {
      if (uint32_t(fc) <= need) {
        for (int i = tid; i < fc; i += kThreads) atomicMin(&sc.theta, num::order_bits(f_score(cur)[i]));
      } else {
        const uint32_t th = hist_theta(fc, [&](int i) { return num::order_bits(f_score(cur)[i]); }, need, sc);
        if (tid == 0) sc.theta = th;
      }
    }
    __syncthreads();
    if (sc.theta > sc.fmax) {  // the chain bound can exceed the frontier's best only if nothing scores there
      __syncthreads();
      if (tid == 0) sc.theta = sc.fmax;
    }
    __syncthreads();
    // Attempts: expand with theta; if the set or the next frontier overflows, raise theta halfway to the
    // frontier's best (in order bits) and retry from the phase's start; at theta = best, a real overflow
    // (massive exact ties) hands the request to the serial path.
    DDT_PROF_STAMP(2);  // theta chosen (last phase)
    const int s0 = sc.s_count;
    uint32_t theta = sc.theta;
    const uint32_t fmax = sc.fmax;
    while (true) {
      __syncthreads();
      if (tid == 0) { sc.s_count = s0; sc.f_count[nxt] = 0; sc.overflow = 0; }
      DDT_PROF_COUNT(9);  // attempts
      __syncthreads();
      for (int i = tid; i < fc; i += kThreads) place(f_score(cur)[i], f_pay(cur)[i], f_push(cur)[i], theta, nxt);
      __syncthreads();
      int gen_begin = s0;
      // Generations: expand the items that joined the set; their pushes >= theta join it too.
      while (true) {
        if (tid == 0) sc.gen_end = sc.s_count < cs ? sc.s_count : cs;
        __syncthreads();
        const int gen_end = sc.gen_end;
        if (gen_begin >= gen_end || sc.overflow) break;
        __syncthreads();  // everyone has read gen_end before new items are appended
        DDT_PROF_COUNT(10);  // generations
        for (int x = gen_begin + tid; x < gen_end; x += kThreads) {
          const uint32_t pay = s_pay[x];
          const int pa = cand_parent(pay), d = cand_depth(pay), r = cand_rank(pay);
          // Pushes the heap would make if x popped. Ranks > B and depths > B can never be among B pops
          // (each needs more than B predecessors), so they are not generated (lp_s has no columns for them).
          // Siblings: the whole run of next siblings scoring >= theta joins the set at once (each pushed by
          // the previous one), and the first one below theta goes to the frontier; the run's members are
          // marked sibling-done so they never generate siblings again.
          if (!(pay & kSiblingDone) && r + 1 < K && r + 1 < Kc) {
            const float sp = s_score[pa];
            const float* row = lp_s + (d - 1) * Kc;
            // Run length by binary search: rows are sorted and NaN-free on this path, so "scores >= theta"
            // holds for a prefix of the ranks.
            int m = 0, hi = (K < Kc ? K : Kc) - (r + 1);
            while (m < hi) {
              const int mid = (m + hi) >> 1;
              const float v = row[r + 1 + mid];
              if (v > num::kNegInf && num::order_bits(DDT_ADD(sp, v)) >= theta) m = mid + 1; else hi = mid;
            }
            int last = x;
            if (m > 0) {
              const int at = atomicAdd(&sc.s_count, m);
#pragma unroll 4
              for (int j = 0; j < m; ++j) {
                if (at + j >= cs) { sc.overflow = 1; break; }
                s_score[at + j] = DDT_ADD(sp, row[r + 1 + j]);
                s_pay[at + j] = pack_cand(pa, d, r + 1 + j, 0) | kSiblingDone;
                s_push[at + j] = j == 0 ? x : at + j - 1;
              }
              last = at + m - 1;
            }
            const int rn = r + 1 + m;
            if (rn < K && rn < Kc && row[rn] > num::kNegInf)
              place(DDT_ADD(sp, row[rn]), pack_cand(pa, d, rn, 0), last, theta, nxt);
          }
          if (d < L && d < Lc) {
            const float v = lp_s[d * Kc];
            if (v > num::kNegInf) place(DDT_ADD(s_score[x], v), pack_cand(x, d + 1, 0, 1), x, theta, nxt);
          }
        }
        gen_begin = gen_end;
        __syncthreads();
      }
      __syncthreads();
      if (!sc.overflow || theta >= fmax) break;
      theta = theta + (fmax - theta + 1) / 2;
    }
    if (sc.overflow) return;
    cur = nxt;
    __syncthreads();
  }
  if (sc.overflow) return;
  DDT_PROF_STAMP(3);  // set complete
  // Order the set's candidates 1..count by pop order. Small sets: each candidate's rank is the number of
  // candidates that pop before it (all threads read the same candidate at once: broadcast loads, no
  // barriers). Large sets: a bitonic sort.
  const int count = sc.s_count - 1;
  if (count <= kRankSortMax) {
    for (int i = tid; i < count; i += kThreads) {
      const int a = i + 1;
      const uint32_t oa = num::order_bits(s_score[a]);
      int rank = 0, ties = 0;  // strictly higher scores, and equal scores (a itself included)
#pragma unroll 8
      for (int j = 1; j <= count; ++j) {
        const uint32_t oj = num::order_bits(s_score[j]);
        rank += oj > oa;
        ties += oj == oa;
      }
      if (ties > 1)  // rare: equal scores are ordered through the pusher chains
        for (int j = 1; j <= count; ++j)
          if (j != a && num::order_bits(s_score[j]) == oa && pops_before(j, a, s_score, s_pay, s_push)) ++rank;
      sorted[rank] = uint16_t(a);
    }
    __syncthreads();
  }
  int n2 = 1;
  while (n2 < count) n2 <<= 1;
  if (count > kRankSortMax) {
    for (int i = tid; i < n2; i += kThreads) sorted[i] = i < count ? uint16_t(i + 1) : uint16_t(0xFFFF);
    __syncthreads();
  }
  for (int size = 2; count > kRankSortMax && size <= n2; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < (n2 >> 1); i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const int a = sorted[lo], b = sorted[hi];
        // "a before b" in the final order; padding (0xFFFF) goes last.
        const bool a_first = b == 0xFFFF || (a != 0xFFFF && pops_before(a, b, s_score, s_pay, s_push));
        const bool want_a_first = (lo & size) == 0;
        if (a_first != want_a_first) { sorted[lo] = uint16_t(b); sorted[hi] = uint16_t(a); }
      }
      __syncthreads();
    }
  DDT_PROF_STAMP(4);  // sorted
  DDT_PROF_SET(11, count);
  const int n = count < B ? count : B;
  if (tid == 0) { node_of[0] = 0; sc.n = n; }
  for (int k = tid; k < n; k += kThreads) node_of[sorted[k]] = int16_t(k + 1);
  __syncthreads();
  for (int k = tid; k < n; k += kThreads) {
    const int c = sorted[k];
    const uint32_t pay = s_pay[c] & ~kSiblingDone;
    const int r = cand_rank(pay);
    node_pay[k + 1] = pack_item(node_of[cand_parent(pay)], cand_depth(pay), r);
    node_score[k + 1] = s_score[c];
    node_prev[k + 1] = r > 0 ? node_of[s_push[c]] : -1;
  }
}

// Serial selection by warp 0 (the heap simulation). Writes node arrays 1..n and returns n.
__device__ int select_serial(const TreeSmemPlan& t, unsigned char* smem, const float* lp_s, int L, int K, int B,
                             uint32_t* node_pay, float* node_score, int32_t* node_prev) {
  uint64_t* fr_key = reinterpret_cast<uint64_t*>(smem + t.off_key);
  uint32_t* fr_pay = reinterpret_cast<uint32_t*>(smem + t.off_pay);
  int32_t* fr_prev = reinterpret_cast<int32_t*>(smem + t.off_prev);  // item's previous sibling node
  const int lane = threadIdx.x & 31, Kc = t.Kc;
  for (int i = lane; i < t.cap; i += 32) fr_key[i] = 0;
  __syncwarp();
  uint32_t seq = 0;
  int n = 0, next_free = 1;
  uint64_t best = 0;  // best key among this lane's slots (lane + 32 j)
  int best_slot = 0;
  node_score[0] = 0.0f;
  if (lp_s[0] > num::kNegInf) {
    const uint64_t key = item_key(lp_s[0], seq++);
    if (lane == 0) { fr_key[0] = key; fr_pay[0] = pack_item(0, 1, 0); fr_prev[0] = -1; best = key; }
  }
  __syncwarp();
  while (n < B) {
    // Every branch below is warp-uniform (a divergent branch costs ~90 cycles, docs/PERF_NOTES.md).
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
      if (v > num::kNegInf) { k1 = item_key(DDT_ADD(node_score[pa], v), seq++); p1 = pack_item(pa, d, r + 1); prev1 = i; }
    }
    if (d < L) {
      const float v = lp_s[d * Kc];
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
    // Every lane rescans its slots (uniform trip count; unused slots hold key 0).
    best = 0;
    for (int q = lane, end = (next_free + 31) & ~31; q < end; q += 32) {
      const uint64_t kq = fr_key[q];
      if (kq > best) { best = kq; best_slot = q; }
    }
  }
  return n;
}

// Register-heap selection by warp 0 (budgets up to kRegHeapMaxBudget, any input; exact: the CPU twin's heap
// keys item_key(score, seq), popped by max). The frontier lives in registers: slot q (0 .. B) is register
// slot q / 32 of lane q % 32, SPL = ceil((B + 1) / 32) slots per lane. A pop's first push reuses the popped
// slot and a second push takes the next fresh slot, so at most 1 + B slots are ever used.
// Per pop, every branch warp-uniform (a divergent branch costs ~90 cycles, docs/PERF_NOTES.md step 4):
//  - each lane picks its best slot (SPL - 1 compare-selects) and computes that item's two pushes at once
//    (two log-prob loads and adds): only the winner's are used, but they overlap the reduction instead of
//    following it;
//  - redux.sync max of the keys' high halves (scores) and a ballot find the winner lane; only on an exact
//    score tie a second redux of the low halves (smaller seq = larger low half) and a ballot;
//  - the winner keeps its first push in the popped slot (no data movement); the second push (always a
//    first child) goes to the fresh slot's lane by one shuffle of its score key.
// Critical path ~ select 30 + redux 52 + ballot 23 + branch 15 + ffs/shfl 45 + slot update 20 ~ 200 cycles
// (+75 on a tie), against ~800 for the shared-memory frontier of select_serial.
// Writes node arrays 1..n (node i = the i-th pop) and returns n.
// Branch-free selects (selp) for the register heap: its per-lane choices differ between lanes, and left to
// itself the compiler may turn a conditional into a divergent branch (~90 cycles) by sinking an operand's
// computation into it. The asm keeps both operands computed and the choice a single select.
__device__ __forceinline__ uint32_t sel(bool c, uint32_t a, uint32_t b) {
  uint32_t r;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\tselp.b32 %0, %2, %3, p;\n\t}"
      : "=r"(r) : "r"(uint32_t(c)), "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ float sel(bool c, float a, float b) {
  return __uint_as_float(sel(c, __float_as_uint(a), __float_as_uint(b)));
}
__device__ __forceinline__ int32_t sel(bool c, int32_t a, int32_t b) { return int32_t(sel(c, uint32_t(a), uint32_t(b))); }
__device__ __forceinline__ uint64_t sel(bool c, uint64_t a, uint64_t b) {
  return (uint64_t(sel(c, uint32_t(a >> 32), uint32_t(b >> 32))) << 32) | sel(c, uint32_t(a), uint32_t(b));
}

template <int SPL>
__device__ int select_regheap(const float* lp_s, int Lc, int Kc, int B, uint32_t* node_pay, float* node_score,
                              int32_t* node_prev) {
  const int lane = threadIdx.x & 31;
  uint64_t key[SPL];     // item_key(score, seq), unique; 0 = empty slot
  uint32_t pay[SPL];     // pack_item(parent node, depth, rank); an emptied slot keeps its last item's (reads stay in range)
  float pscore[SPL];     // the parent node's score: what the item's next sibling adds its log-prob to
  int32_t prev[SPL];     // previous sibling node (whose pop pushed this item); -1 for a first child
#pragma unroll
  for (int j = 0; j < SPL; ++j) { key[j] = 0; pay[j] = pack_item(0, 1, 0); pscore[j] = 0.0f; prev[j] = -1; }
  uint32_t seq = 0;  // push sequence number (uniform)
  const float v0 = lp_s[0];
  if (v0 > num::kNegInf) {  // the initial item: the root's rank-0 child, key score = the log-prob itself
    if (lane == 0) key[0] = item_key(v0, 0);
    seq = 1;
  }
  node_score[0] = 0.0f;
  int n = 0, next_free = 1;
  while (n < B) {
    // This lane's best slot (keys are unique; empty slots are 0).
    uint64_t bkey = key[0];
    uint32_t bpay = pay[0];
    float bps = pscore[0];
    int32_t bprev = prev[0];
    int32_t bj = 0;
#pragma unroll
    for (int j = 1; j < SPL; ++j) {
      const bool better = key[j] > bkey;
      bkey = sel(better, key[j], bkey);
      bpay = sel(better, pay[j], bpay);
      bps = sel(better, pscore[j], bps);
      bprev = sel(better, prev[j], bprev);
      bj = sel(better, int32_t(j), bj);
    }
    const uint32_t bhi = uint32_t(bkey >> 32);
    // Speculative pushes of this lane's best item, in the CPU twin's order (next sibling, then first child).
    // An item that can pop has depth d + rank r <= B (its r previous siblings and d - 1 ancestors pop
    // first), so r + 1 < Kc <=> r + 1 < K and d < Lc <=> d < L for it; for the others the guards only keep
    // the reads inside the staged Lc x Kc log-probs.
    const int d = item_depth(bpay), r = item_rank(bpay);
    const bool has_sib = r + 1 < Kc, has_child = d < Lc;
    const float v_sib = sel(has_sib, lp_s[sel(has_sib, uint32_t((d - 1) * Kc + r + 1), 0u)], num::kNegInf);
    const float v_child = sel(has_child, lp_s[sel(has_child, uint32_t(d * Kc), 0u)], num::kNegInf);
    const bool sib_ok = v_sib > num::kNegInf, child_ok = v_child > num::kNegInf;  // NaN: not pushed
    const float s = num::from_order_bits(bhi);  // the item's score as the heap stores it (-0 -> +0)
    const uint32_t sib_hi = num::order_bits(DDT_ADD(bps, v_sib));
    const uint32_t child_hi = num::order_bits(DDT_ADD(s, v_child));
    const unsigned sib_mask = __ballot_sync(kAll, sib_ok), child_mask = __ballot_sync(kAll, child_ok);

    const uint32_t mhi = __reduce_max_sync(kAll, bhi);
    if (mhi == 0) break;  // frontier empty
    unsigned cand = __ballot_sync(kAll, bhi == mhi);
    if (__popc(cand) > 1) {  // exact score tie: the smaller sequence number (larger low half) pops first
      DDT_PROF_COUNT(12);
      const uint32_t blo = uint32_t(bkey);
      const uint32_t mlo = __reduce_max_sync(kAll, sel(bhi == mhi, blo, 0u));
      cand = __ballot_sync(kAll, bhi == mhi && blo == mlo);
    }
    const int w = __ffs(cand) - 1;  // the winner lane
    const int i = n + 1;            // the popped node
    const uint32_t wpay = __shfl_sync(kAll, bpay, w);
    const int32_t wprev = __shfl_sync(kAll, bprev, w);
    const uint32_t w_child_hi = __shfl_sync(kAll, child_hi, w);
    const float ws = num::from_order_bits(mhi);
    node_pay[i] = wpay;  // every lane stores the same value (no divergent lane-0 branch)
    node_score[i] = ws;
    node_prev[i] = wprev;
    const bool sib = (sib_mask >> w) & 1u, child = (child_mask >> w) & 1u;  // the winner's pushes (uniform)
    // First push (meaningful in the winner lane, whose sib_ok == sib): into the popped slot; the next sibling
    // (sequence seq) if any, else the first child (seq), else the slot empties.
    const uint64_t k1 = (uint64_t(sel(sib_ok, sib_hi, sel(child_ok, child_hi, 0u))) << 32) |
                        sel(sib_ok || child_ok, ~seq, 0u);
    const uint32_t p1 = sel(sib_ok, pack_item(item_parent(bpay), d, r + 1), sel(child_ok, pack_item(i, d + 1, 0), bpay));
    const float ps1 = sel(sib_ok, bps, s);
    const int32_t prev1 = sel(sib_ok, int32_t(i), int32_t(-1));
    // Second push (both pushed: the first child, sequence seq + 1): into the fresh slot next_free.
    const bool two = sib && child;
    const uint64_t k2 = (uint64_t(w_child_hi) << 32) | uint64_t(~(seq + 1));
    const uint32_t p2 = pack_item(i, item_depth(wpay) + 1, 0);
    const bool win = lane == w, recv = two && lane == (next_free & 31);
    const int rj = next_free >> 5;
#pragma unroll
    for (int j = 0; j < SPL; ++j) {
      const bool t1 = win && j == bj, t2 = recv && j == rj;  // never both: slot next_free is not yet used
      key[j] = sel(t1, k1, sel(t2, k2, key[j]));
      pay[j] = sel(t1, p1, sel(t2, p2, pay[j]));
      pscore[j] = sel(t1, ps1, sel(t2, ws, pscore[j]));
      prev[j] = sel(t1, prev1, sel(t2, int32_t(-1), prev[j]));
    }
    seq += uint32_t(sib) + uint32_t(child);
    next_free += int(two);
    n = i;
  }
  DDT_PROF_SET(13, n);
  return n;
}

__global__ void __launch_bounds__(kThreads, 1) tree_build_kernel(ddt_tree_build_params p, int cs, int reg_spl) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Scalars sc;
  const TreeSmemPlan t = plan(p.depth, p.k, p.budget, cs);
  float* lp_s = reinterpret_cast<float*>(smem + t.off_lp);
  uint32_t* node_pay = reinterpret_cast<uint32_t*>(smem + t.off_node_pay);
  float* node_score = reinterpret_cast<float*>(smem + t.off_score);
  int32_t* node_prev = reinterpret_cast<int32_t*>(smem + t.off_node_prev);
  int32_t* par_s = reinterpret_cast<int32_t*>(smem + t.off_par);
  int32_t* fc_s = reinterpret_cast<int32_t*>(smem + t.off_fc);
  int32_t* ns_s = reinterpret_cast<int32_t*>(smem + t.off_ns);

  DDT_PROF_STAMP(0);
  const int b = blockIdx.x, N = t.N, L = p.depth, K = p.k, B = p.budget, Kc = t.Kc;
  const float* lp = p.logprobs + int64_t(b) * L * K;
  // The rounds path needs a heap-ordered push tree: log-probs <= 0, rows sorted descending, no NaN (the
  // top-K kernel's output always is). Anything else goes to the serial path, which is exact for any input
  // (budgets up to kRegHeapMaxBudget take the register heap whatever the input).
  int unordered = 0;
  for (int i = threadIdx.x; i < t.Lc * Kc; i += kThreads) {
    const int d = i / Kc, r = i % Kc;
    const float x = lp[d * K + r];
    lp_s[i] = x;
    unordered |= num::is_nan(x) || x > 0.0f || (r > 0 && !(x <= lp[d * K + r - 1]));
  }
  for (int i = threadIdx.x; i < N; i += kThreads) { fc_s[i] = -1; ns_s[i] = -1; }
  unordered = __syncthreads_or(unordered);

  DDT_PROF_STAMP(1);  // log-probs staged
  bool done = false;
  if (reg_spl > 0) {  // register heap: any input
    if (threadIdx.x < 32) {
      const int Lc = t.Lc;
      int n;
      if (reg_spl == 1) n = select_regheap<1>(lp_s, Lc, Kc, B, node_pay, node_score, node_prev);
      else if (reg_spl == 2) n = select_regheap<2>(lp_s, Lc, Kc, B, node_pay, node_score, node_prev);
      else n = select_regheap<3>(lp_s, Lc, Kc, B, node_pay, node_score, node_prev);
      if (threadIdx.x == 0) sc.n = n;
    }
    done = true;
  } else if (cs > 0 && !unordered) {
    select_rounds(t, smem, lp_s, L, K, B, node_pay, node_score, node_prev, sc);
    done = !sc.overflow;
  }
  if (!done) {
    __syncthreads();
    if (threadIdx.x < 32) {
      const int n = select_serial(t, smem, lp_s, L, K, B, node_pay, node_score, node_prev);
      if (threadIdx.x == 0) sc.n = n;
    }
  }
  __syncthreads();

  DDT_PROF_STAMP(5);  // selection done
  const int n = sc.n;
  // Child lists: siblings pop in rank order (rank r + 1 is pushed when rank r pops), so a parent's first
  // child is its rank-0 child and a node's next sibling is the node whose item it pushed. NaN flags: the
  // log-probs the heap reads when it pops each node (and the initial one), exactly as the CPU twin.
  int nan = threadIdx.x == 0 && num::is_nan(lp_s[0]);
  for (int i = 1 + threadIdx.x; i <= n; i += kThreads) {
    const uint32_t pay = node_pay[i];
    const int d = item_depth(pay), r = item_rank(pay);
    if (r == 0) fc_s[item_parent(pay)] = i; else ns_s[node_prev[i]] = i;
    if (r + 1 < K) nan |= num::is_nan(lp_s[(d - 1) * Kc + r + 1]);
    if (d < L) nan |= num::is_nan(lp_s[d * Kc]);
  }
  if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_NAN_LOGIT);
  const int32_t P = p.prefix_lens[b];
  const int32_t root = p.root_tokens[b];
  const int32_t* ids = p.token_ids + int64_t(b) * L * K;
  const int64_t o = int64_t(b) * N;
  for (int i = threadIdx.x; i < N; i += kThreads) {
    int32_t tok, pa, d;
    float score;
    if (i == 0) { tok = root; pa = -1; d = 0; score = 0.0f; }
    else if (i <= n) {
      const uint32_t pay = node_pay[i];
      d = item_depth(pay); pa = item_parent(pay); score = node_score[i];
      tok = ids[(d - 1) * K + item_rank(pay)];
    } else { tok = root; pa = -1; d = 1; score = num::kNegInf; }
    par_s[i] = pa;
    p.tokens[o + i] = tok; p.parents[o + i] = pa; p.depths[o + i] = d; p.scores[o + i] = score;
    p.slots[o + i] = P + i; p.positions[o + i] = P + d;
    p.first_child[o + i] = fc_s[i]; p.next_sibling[o + i] = ns_s[i];
  }
  __syncthreads();
  const int W = vis_words(N);
  for (int i = threadIdx.x; i < N; i += kThreads) write_vis_row(par_s, i, W, p.vis + (o + i) * W);
  if (threadIdx.x == 0) p.node_count[b] = n + 1;
  DDT_PROF_STAMP(6);
}

// Largest dynamic shared memory a CTA may use on the current device, opted in once per device (the
// attribute applies to the device current when it is set). -1 when the query or the opt-in fails.
int max_dynamic_smem() {
  constexpr int kMaxDevices = 64;
  static int bytes[kMaxDevices] = {};  // 0 = not yet asked
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) { (void)cudaGetLastError(); return -1; }
  if (bytes[dev] > 0) return bytes[dev];
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  optin -= int(sizeof(Scalars)) + 64;
  if (cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  bytes[dev] = optin;
  return optin;
}

}  // namespace
}  // namespace ddtree::kern

using namespace ddtree::kern;

extern "C" int ddt_tree_build_cuda(const ddt_tree_build_params* p, void* stream) {
  if (int rc = validate(p)) return rc;
  if (p->batch == 0) return DDT_OK;
  const int limit = max_dynamic_smem();
  if (limit < 0) return fail(DDT_ERR_CUDA, "tree_build: cannot query or opt in to dynamic shared memory");
  // Path: the register heap up to budget kRegHeapMaxBudget (reg_spl = its slots per lane), rounds above with
  // the largest capacity that fits (cs), the shared-memory serial heap when neither (cs = 0).
  const int reg_spl = p->budget <= kRegHeapMaxBudget ? (p->budget + 1 + 31) / 32 : 0;
  int cs = reg_spl == 0 ? rounds_capacity(p->budget) : 0;
  while (cs > 0 && plan(p->depth, p->k, p->budget, cs).bytes > size_t(limit)) cs /= 2;
  if (cs < p->budget + 1) cs = 0;  // a set that cannot hold B + 1 candidates never completes
  const TreeSmemPlan t = plan(p->depth, p->k, p->budget, cs);
  if (t.bytes > size_t(limit))
    return fail(DDT_ERR_SHAPE, "tree_build: depth x k x budget needs more shared memory than this GPU has");
  tree_build_kernel<<<p->batch, kThreads, t.bytes, static_cast<cudaStream_t>(stream)>>>(*p, cs, reg_spl);
  DDT_CUDA_LAUNCHED();
  return DDT_OK;
}
