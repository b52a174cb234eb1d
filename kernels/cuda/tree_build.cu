// DDTree best-first tree builder on the GPU (C ABI: ddtree/kernels.h, section 2).
//
// One CTA (256 threads) per request; bitwise the CPU twin's trees. Three selection paths fill the same node
// arrays (node i = the i-th pop):
//
// 0. Register heap (budgets up to 64, any input): warp 0 simulates the heap with the frontier in registers
//    (select_regheap, two words per slot): per pop one redux.sync + ballot (a second redux only on an
//    exact score tie), three shuffles and compare-selects, no shared-memory access on the critical path
//    and no divergent branch; ~85 instructions and ~180-200 cycles per pop at budget 64 against ~800 for
//    path 2 (docs/wip/tree_build_notes.md).
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
#include "kernels/cuda/pdl.cuh"

namespace ddtree::kern {
namespace {

constexpr int kThreads = 256;
constexpr int kStageUnroll = 8;  // log-prob loads in flight per thread while staging (depth 32 x 64 ranks / 256)

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
constexpr int kRegHeapMaxSlots = (kRegHeapMaxBudget + 31) / 32;  // its frontier slots per lane (B slots suffice)
static_assert(kRegHeapMaxSlots <= 3, "tree_build_kernel instantiates select_regheap for 1, 2 and 3 slots per lane");
constexpr int kRankSortMax = 256;     // candidate sets up to this size are ordered by rank counting

struct TreeSmemPlan {
  int Lc, Kc, N, cap, cs;  // cap: serial frontier slots; cs: rounds set / frontier capacity (0: serial only)
  int ks;                  // lp_s row stride (floats): Kc, or for the register heap a power of two > Kc
  size_t off_tab;          // register heap: u8 [N][Kc] (parent, rank) -> node, aliasing the rounds region
  size_t off_ids;          // register heap: i32 [Lc][Kc] token ids, staged with the log-probs
  size_t off_lp, off_node_pay, off_score, off_node_prev, off_par, off_fc, off_ns;
  size_t off_s_score, off_s_pay, off_s_push, off_f, off_sort, off_node_of;   // rounds
  size_t off_key, off_pay, off_prev;                                          // serial (aliases rounds)
  size_t bytes;
};

// reg: the register heap's layout (lp_s rows padded to a power-of-two stride > Kc with a -inf column Kc and
// two -inf rows Lc, Lc + 1, see select_regheap; the node table). cs must then be 0.
__host__ __device__ inline TreeSmemPlan plan(int depth, int k, int budget, int cs, bool reg = false) {
  TreeSmemPlan t{};
  t.N = budget + 1;
  t.Lc = depth < budget + 1 ? depth : budget + 1;  // a popped node's depth is <= budget
  t.Kc = k < budget + 1 ? k : budget + 1;          // a pushed rank of a popped node is <= budget
  t.cap = (t.N + 31) / 32 * 32;
  t.cs = cs;
  size_t o = 0;
  auto take = [&](size_t bytes) { const size_t at = o; o += (bytes + 15) / 16 * 16; return at; };
  t.ks = t.Kc;
  if (reg) while (t.ks <= t.Kc || (t.ks & (t.ks - 1))) ++t.ks;
  t.off_lp = take(size_t(reg ? t.Lc + 2 : t.Lc) * t.ks * 4);
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
  t.off_tab = region;
  if (reg) {
    t.off_ids = (region + size_t(t.N) * t.Kc + 15) / 16 * 16;
    const size_t end = t.off_ids + size_t(t.Lc) * t.Kc * 4;
    if (end > t.bytes) t.bytes = end;
  }
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
// keys item_key(score, seq), popped by max). The frontier lives in registers: slot q is register slot q / 32
// of lane q % 32, SPL = ceil(B / 32) slots per lane. A pop's first push reuses the popped slot and a second
// push takes the next fresh slot; only pops 1 .. B - 1 need their pushes kept (the B-th pop's are never
// popped), so at most 1 + (B - 1) = B slots are used (the B-th pop's second push may find no slot: dropped).
// A slot is two words: hi = the score's order bits (0 = empty) and aux (kAux* below), so (hi, aux) compares
// exactly as the CPU twin's item_key. Per pop the cost is instruction issue (a warp's integer instruction
// takes 2 cycles of the 16-lane ALU pipe) plus the chain redux -> ballot -> shuffle -> select -> best pick,
// so everything a pop needs is kept small (docs/wip/tree_build_notes.md, step 8):
//  - each lane picks its best slot ((SPL - 1) 64-bit compares) and reduces it at once; while the redux.sync
//    is in flight it loads its best item's two push log-probs and its parent's score (node_score, shared)
//    and prepares both pushes (the winner's are used);
//  - redux.sync max of the hi words, a ballot; the winner (only lane with hi == max) replaces its best slot
//    by its first push in place, and 3 shuffles give the lane of the fresh slot the second push (hi, aux)
//    and every lane the winner's aux for node_pay (all lanes store the same word); an exact tie (several
//    lanes at the max; also an empty frontier, all lanes at 0) takes a uniform slow path: a redux of aux;
//  - no previous-sibling field: the epilogue of this function derives node_prev by a (parent, rank) table.
// Writes node arrays 1..n (node i = the i-th pop; node_pay in pack_item format) and returns n.
//
// aux bits: 24..31 = 255 - seq (push order: larger = earlier), 23 = 0 in a slot (the shuffled winner word
// sets it when the pop pushed anything), 16..22 = parent node, 0..15 = the item's log-prob byte offset in
// lp_s, ((d - 1) * ks + r) * 4, ks = padded row stride (a power of two, > Kc): the next sibling's log-prob
// is at +4 (column Kc is -inf padding), the first child's at (off | (4 ks - 1)) + 1 (row Lc is -inf padding).
constexpr uint32_t kAuxOff = 0xFFFFu, kAuxAny = 1u << 23, kAuxSeq1 = 1u << 24;
static_assert((32 * kRegHeapMaxSlots - 1) * 2 <= 255 && 32 * kRegHeapMaxSlots <= 127,
              "register heap: seq (8 bits) and parent (7 bits) fields of aux");
static_assert((DDT_MAX_DEPTH + 2) * 128 * 4 <= 0x10000, "register heap: 16-bit log-prob offsets in aux");

// Branch-free selects (selp) for the register heap: its per-lane choices differ between lanes, and left to
// itself the compiler may turn a conditional into a divergent branch (~90 cycles) by sinking an operand's
// computation into it. The asm keeps both operands computed and the choice a single select.
__device__ __forceinline__ uint32_t sel(bool c, uint32_t a, uint32_t b) {
  uint32_t r;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\tselp.b32 %0, %2, %3, p;\n\t}"
      : "=r"(r) : "r"(uint32_t(c)), "r"(a), "r"(b));
  return r;
}
// order_bits(x) for an x that is never -0 (a sum whose first operand is a stored score: never -0), NaN ->
// -inf's bits (fmaxf returns the non-NaN operand): 3 instructions instead of 7.
__device__ __forceinline__ uint32_t order_bits_sum(float x) {
  const uint32_t u = __float_as_uint(fmaxf(x, num::kNegInf));
  return u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
}
// num::from_order_bits in 2 instructions (a shift and a 3-input logic op).
__device__ __forceinline__ float from_order_bits_fast(uint32_t k) {
  return __uint_as_float(k ^ (~uint32_t(int32_t(k) >> 31) | 0x80000000u));
}

template <int SPL>
__device__ int select_regheap(const float* lp_s, int ks, int Kc, int B, uint32_t* node_pay, float* node_score,
                              int32_t* node_prev, uint8_t* tab) {
  const int lane = threadIdx.x & 31;
  uint32_t hi[SPL], aux[SPL];  // aux 0 (an empty slot's start): offset 0, parent 0: its reads stay in range
#pragma unroll
  for (int j = 0; j < SPL; ++j) { hi[j] = 0; aux[j] = 0; }
  const char* lp_b = reinterpret_cast<const char*>(lp_s);
  const char* score_b = reinterpret_cast<const char*>(node_score);
  const uint32_t row_mask = uint32_t(4 * ks - 1);  // (off | row_mask) + 1 = the next row's byte offset
  uint32_t seqtop = 255u << 24;                    // (255 - seq) << 24 for the next push (uniform)
  const float v0 = lp_s[0];
  if (v0 > num::kNegInf) {  // the initial item: the root's rank-0 child, key score = the log-prob itself
    if (lane == 0) { hi[0] = num::order_bits(v0); aux[0] = seqtop; }
    seqtop -= kAuxSeq1;
  }
  int n = 0, next_free = 1;
  // Each pop's bookkeeping (node word z = aux | kAuxAny when it pushed anything, score, seq / next_free
  // advance) is done at the end of its own iteration. Not deferred into the next iteration after its redux
  // (as a first version of this loop did): that version hit an illegal memory access on the H200, and its SASS
  // (ptxas 13.0, sm_90a) appeared to address the deferred stores node_pay[n] / node_score[n] one element too
  // far (node i's words at i + 1, nodes 1.. then read uninitialized shared memory -> out-of-range table /
  // global indices), while the PTX, a host build under AddressSanitizer and the CPU emulation were right: a
  // likely code-generation defect, not reduced to a repro. Check the SASS stores of this loop after changing it.
  node_score[0] = 0.0f;
  while (true) {
    // This lane's best slot (keys (hi, aux) are unique; empty slots have hi 0).
    uint32_t bhi = hi[0], baux = aux[0];
    int bj = 0;
#pragma unroll
    for (int j = 1; j < SPL; ++j) {
      const bool better = ((uint64_t(hi[j]) << 32) | aux[j]) > ((uint64_t(bhi) << 32) | baux);
      bhi = sel(better, hi[j], bhi);
      baux = sel(better, aux[j], baux);
      bj = int(sel(better, uint32_t(j), uint32_t(bj)));
    }
    const uint32_t mhi = __reduce_max_sync(kAll, bhi);
    if (n >= B) break;
    // Speculative pushes of this lane's best item (only the winner's are used), in the CPU twin's order: the
    // next sibling (parent score + its log-prob) then the first child (this score + the next row's first).
    // Padding makes the guards r + 1 < Kc and d < Lc read -inf (not pushed); an item that can pop has
    // d + r <= B, so for it r + 1 < Kc <=> r + 1 < K and d < Lc <=> d < L (the CPU twin's guards).
    const uint32_t off = baux & kAuxOff, coff = (baux | row_mask) & kAuxOff;
    const float v_sib = *reinterpret_cast<const float*>(lp_b + off + 4);
    const float v_child = *reinterpret_cast<const float*>(lp_b + coff + 1);
    const float pscore = *reinterpret_cast<const float*>(score_b + ((baux >> 14) & 0x1FCu));
    const bool sib_ok = v_sib > num::kNegInf, child_ok = v_child > num::kNegInf;  // NaN: not pushed
    const uint32_t sib_hi = order_bits_sum(DDT_ADD(pscore, v_sib));
    const uint32_t child_hi = order_bits_sum(DDT_ADD(from_order_bits_fast(bhi), v_child));
    const uint32_t i = uint32_t(n + 1);  // the popped node
    const uint32_t child_aux = coff + 1u + (seqtop | (i << 16));  // parent i, depth d + 1, rank 0
    // First push, into the popped slot: the next sibling (seq) if pushed, else the first child (seq), else
    // the slot empties (keeping its aux: reads stay in range).
    const uint32_t hi1 = sel(sib_ok, sib_hi, sel(child_ok, child_hi, 0u));
    const uint32_t aux1 = sel(sib_ok, ((baux + 4u) & 0x7FFFFFu) | seqtop, sel(child_ok, child_aux, baux));
    // Second push (both pushed: the first child, seq + 1), for the fresh slot's lane; x == 0: none.
    const uint32_t x = sel(sib_ok && child_ok, child_hi, 0u);
    const uint32_t y = child_aux - kAuxSeq1;
    const uint32_t z = baux | sel(sib_ok || child_ok, kAuxAny, 0u);  // node word + "pushed anything"
    const bool recv = lane == (next_free & 31);
    const int rj = next_free >> 5;

    const bool is_max = bhi == mhi;
    unsigned cand = __ballot_sync(kAll, is_max);
    int w = 31 - __clz(cand);  // the winner lane when it is the only one at the max
    uint32_t wx = __shfl_sync(kAll, x, w), wy = __shfl_sync(kAll, y, w), wz = __shfl_sync(kAll, z, w);
    bool win = is_max;
    if (cand & (cand - 1u)) {  // exact score tie, or the frontier is empty (every lane at 0)
      if (mhi == 0) break;
      DDT_PROF_COUNT(12);
      const uint32_t mlo = __reduce_max_sync(kAll, sel(is_max, baux, 0u));  // smaller seq = larger aux
      win = is_max && baux == mlo;
      w = 31 - __clz(__ballot_sync(kAll, win));
      wx = __shfl_sync(kAll, x, w);
      wy = __shfl_sync(kAll, y, w);
      wz = __shfl_sync(kAll, z, w);
    }
    // The winner's best slot takes its first push; slot next_free (lane next_free % 32) takes the second
    // push (an empty (0, in-range aux) one when there is none: that slot was empty). Never the same slot.
#pragma unroll
    for (int j = 0; j < SPL; ++j) {
      const bool t1 = win && bj == j, t2 = recv && rj == j;
      hi[j] = sel(t2, wx, sel(t1, hi1, hi[j]));
      aux[j] = sel(t2, wy, sel(t1, aux1, aux[j]));
    }
    // Bookkeeping of pop i (every lane stores the same words; node_pay converted after the loop).
    node_pay[i] = wz;
    node_score[i] = from_order_bits_fast(mhi);
    const bool two = wx != 0u;
    next_free += int(two);
    seqtop -= ((wz & kAuxAny) << 1) + sel(two, kAuxSeq1, 0u);  // seq += this pop's pushes
    n = int(i);
  }
  DDT_PROF_SET(13, n);
  // node_pay: aux words -> pack_item; node_prev[i] (rank > 0) = the node of (same parent, rank - 1), which
  // popped before i (its pop pushed i's item), through tab[parent * Kc + rank] (node ids < 256).
  __syncwarp();
  const int ks_log = __ffs(ks) - 1;
  for (int i = 1 + lane; i <= n; i += 32) {
    const uint32_t a = node_pay[i];
    const int pa = int((a >> 16) & 0x7Fu), pos = int((a & kAuxOff) >> 2);
    const int r = pos & (ks - 1);
    node_pay[i] = pack_item(pa, (pos >> ks_log) + 1, r);
    tab[pa * Kc + r] = uint8_t(i);
  }
  __syncwarp();
  for (int i = 1 + lane; i <= n; i += 32) {
    const uint32_t pay = node_pay[i];
    const int r = item_rank(pay);
    if (r > 0) node_prev[i] = tab[item_parent(pay) * Kc + r - 1];
  }
  return n;
}

__global__ void __launch_bounds__(kThreads, 1) tree_build_kernel(ddt_tree_build_params p, int cs, int reg_spl) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Scalars sc;
  const TreeSmemPlan t = plan(p.depth, p.k, p.budget, cs, reg_spl > 0);
  float* lp_s = reinterpret_cast<float*>(smem + t.off_lp);
  uint32_t* node_pay = reinterpret_cast<uint32_t*>(smem + t.off_node_pay);
  float* node_score = reinterpret_cast<float*>(smem + t.off_score);
  int32_t* node_prev = reinterpret_cast<int32_t*>(smem + t.off_node_prev);
  int32_t* par_s = reinterpret_cast<int32_t*>(smem + t.off_par);
  int32_t* fc_s = reinterpret_cast<int32_t*>(smem + t.off_fc);
  int32_t* ns_s = reinterpret_cast<int32_t*>(smem + t.off_ns);

  DDT_PROF_STAMP(0);
  const int b = blockIdx.x, N = t.N, L = p.depth, K = p.k, B = p.budget, Kc = t.Kc, ks = t.ks;
  const float* lp = p.logprobs + int64_t(b) * L * K;
  // The rounds path needs a heap-ordered push tree: log-probs <= 0, rows sorted descending, no NaN (the
  // top-K kernel's output always is). Anything else goes to the serial path, which is exact for any input
  // (budgets up to kRegHeapMaxBudget take the register heap whatever the input).
  pdl_wait();  // the inputs may come from the previous kernel on the stream (programmatic dependent launch)
  pdl_launch_dependents();
  // Every load of a thread is issued before its first store (one global latency, not one per element). The
  // register heap's output reads the token ids from shared memory too (staged here, in the same latency).
  int unordered = 0;
  const int staged = t.Lc * Kc;
  const int32_t* ids = p.token_ids + int64_t(b) * L * K;
  int32_t* ids_s = reinterpret_cast<int32_t*>(smem + t.off_ids);  // register heap only
  for (int base = 0; base < staged; base += kThreads * kStageUnroll) {
    float x[kStageUnroll], prev[kStageUnroll];
    int32_t id[kStageUnroll];
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x), d = i / Kc, r = i - d * Kc;
      x[u] = i < staged ? lp[d * K + r] : 0.0f;
      prev[u] = i < staged && r > 0 && reg_spl == 0 ? lp[d * K + r - 1] : 0.0f;  // the order check: rounds only
      id[u] = i < staged && reg_spl > 0 ? ids[d * K + r] : 0;
    }
#pragma unroll
    for (int u = 0; u < kStageUnroll; ++u) {
      const int i = base + u * kThreads + int(threadIdx.x), d = i / Kc, r = i - d * Kc;
      if (i >= staged) break;
      lp_s[d * ks + r] = x[u];
      if (reg_spl > 0) ids_s[i] = id[u];
      unordered |= num::is_nan(x[u]) || x[u] > 0.0f || (r > 0 && !(x[u] <= prev[u]));
    }
  }
  if (reg_spl > 0) {  // register-heap padding: column Kc of rows 0 .. Lc - 1, rows Lc and Lc + 1
    for (int i = threadIdx.x; i < t.Lc; i += kThreads) lp_s[i * ks + Kc] = num::kNegInf;
    for (int i = threadIdx.x; i < 2 * ks; i += kThreads) lp_s[t.Lc * ks + i] = num::kNegInf;
  }
  for (int i = threadIdx.x; i < N; i += kThreads) { fc_s[i] = -1; ns_s[i] = -1; }
  unordered = __syncthreads_or(unordered);

  DDT_PROF_STAMP(1);  // log-probs staged
  bool done = false;
  if (reg_spl > 0) {  // register heap: any input
    // Warp 0, through a condition ptxas sees as warp-uniform (a shuffle from lane 0): under a plain
    // threadIdx.x < 32 it guards every redux / ballot / shuffle of the loop with a divergence check
    // (BRA.DIV + a uniform register), ~2 extra instructions each and a copy of the redux result right
    // after the redux (the freed uniform register), which stalls issue for the redux latency.
    if (__shfl_sync(kAll, threadIdx.x, 0) < 32) {
      uint8_t* tab = smem + t.off_tab;
      int n;
      if (reg_spl == 1) n = select_regheap<1>(lp_s, ks, Kc, B, node_pay, node_score, node_prev, tab);
      else if (reg_spl == 2) n = select_regheap<2>(lp_s, ks, Kc, B, node_pay, node_score, node_prev, tab);
      else n = select_regheap<3>(lp_s, ks, Kc, B, node_pay, node_score, node_prev, tab);
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
  // One pass writes every per-node output but the child links, the next (after the barrier that completes
  // fc_s / ns_s and par_s) the links and the visibility rows.
  int nan = threadIdx.x == 0 && num::is_nan(lp_s[0]);
  const int32_t P = p.prefix_lens[b];
  const int32_t root = p.root_tokens[b];
  const int64_t o = int64_t(b) * N;
  for (int i = threadIdx.x; i < N; i += kThreads) {
    int32_t tok, pa, d;
    float score;
    if (i == 0) { tok = root; pa = -1; d = 0; score = 0.0f; }
    else if (i <= n) {
      const uint32_t pay = node_pay[i];
      const int r = item_rank(pay);
      d = item_depth(pay); pa = item_parent(pay); score = node_score[i];
      tok = reg_spl > 0 ? ids_s[(d - 1) * Kc + r] : ids[(d - 1) * K + r];
      if (r == 0) fc_s[pa] = i; else ns_s[node_prev[i]] = i;
      if (r + 1 < K) nan |= num::is_nan(lp_s[(d - 1) * ks + r + 1]);
      if (d < L) nan |= num::is_nan(lp_s[d * ks]);
    } else { tok = root; pa = -1; d = 1; score = num::kNegInf; }
    par_s[i] = pa;
    p.tokens[o + i] = tok; p.parents[o + i] = pa; p.depths[o + i] = d; p.scores[o + i] = score;
    p.slots[o + i] = P + i; p.positions[o + i] = P + d;
  }
  if (__syncthreads_or(nan) && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_NAN_LOGIT);
  const int W = vis_words(N);
  for (int i = threadIdx.x; i < N; i += kThreads) {
    p.first_child[o + i] = fc_s[i]; p.next_sibling[o + i] = ns_s[i];
    write_vis_row(par_s, i, W, p.vis + (o + i) * W);
  }
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
  const int reg_spl = p->budget <= kRegHeapMaxBudget ? (p->budget + 31) / 32 : 0;
  int cs = reg_spl == 0 ? rounds_capacity(p->budget) : 0;
  while (cs > 0 && plan(p->depth, p->k, p->budget, cs).bytes > size_t(limit)) cs /= 2;
  if (cs < p->budget + 1) cs = 0;  // a set that cannot hold B + 1 candidates never completes
  const TreeSmemPlan t = plan(p->depth, p->k, p->budget, cs, reg_spl > 0);
  if (t.bytes > size_t(limit))
    return fail(DDT_ERR_SHAPE, "tree_build: depth x k x budget needs more shared memory than this GPU has");
  DDT_CUDA_RETURN(launch_pdl(tree_build_kernel, dim3(p->batch), dim3(kThreads), t.bytes, static_cast<cudaStream_t>(stream),
                             *p, cs, reg_spl));
  return DDT_OK;
}
