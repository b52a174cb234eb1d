// Tree-verify attention, the pieces both flash kernels share (verify_attn_portable.cu, verify_attn_sm90.cu):
// the device-side scheduling over requests (a block scan of per-request item counts, item lookup), the
// node_offsets check, row fills (padding / poison) and the fixed-order combine of KV splits. Both kernels
// use the same workspace layout (kernels/common/verify_attn_split.h): partial row (split s, request-local row
// i) of request r at partial_base_r + s x rows_r + i, f32 o[512] in ws_o and (m in log2 units, l) in ws_ml.
// Included by one .cu each (internal linkage: each gets its own copy of the combine kernel).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/common/bf16.h"
#include "kernels/common/numerics.h"
#include "kernels/cuda/fast_math.cuh"
#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/common/verify_attn_split.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ddtree::kern::attn {
namespace {

// Dev profiling of both flash kernels (bench/dev/attn_profile.cu defines DDT_ATTN_PROFILE): thread 0 of each
// CTA adds the cycles of each phase to per-CTA accumulators in shared memory (warp 0's view: a barrier slot is
// the time warp 0 waits for the slowest warp), added to g_attn_profile[blockIdx.x] at the kernel's end (a
// global read-modify-write per stamp would stall warp 0 for an L2 round trip inside the phase it measures).
// Compiled out otherwise.
#ifdef DDT_ATTN_PROFILE
__device__ long long g_attn_profile[4096][16];
__device__ __forceinline__ long long* prof_acc() {
  __shared__ long long acc[16];
  return acc;
}
// Which first-only timeline slots this CTA has stamped (bit per slot; shared-memory atomics: two threads stamp).
__device__ __forceinline__ unsigned* prof_first_mask() {
  __shared__ unsigned mask;
  return &mask;
}
#define DDT_PROF_INIT()                                        \
  do {                                                         \
    if (threadIdx.x < 16) prof_acc()[threadIdx.x] = 0;         \
    if (threadIdx.x == 0) *prof_first_mask() = 0;              \
  } while (0)  // before a barrier
#define DDT_PROF_FLUSH()                                                                     \
  do {                                                                                       \
    __syncthreads();                                                                         \
    if (threadIdx.x < 16) g_attn_profile[blockIdx.x % 4096][threadIdx.x] += prof_acc()[threadIdx.x]; \
  } while (0)
#define DDT_PROF_START(t) long long t = clock64()
#define DDT_PROF_LAP(slot, t)              \
  do {                                     \
    if (threadIdx.x == 0) {                \
      const long long now_ = clock64();    \
      prof_acc()[slot] += now_ - (t);      \
      (t) = now_;                          \
    }                                      \
  } while (0)
#define DDT_PROF_COUNT(slot) do { if (threadIdx.x == 0) ++prof_acc()[slot]; } while (0)
// A per-CTA timeline (the sm_90a kernel): thread 0's clock64 at 0 entry, 1 first item, 2 first tile's bytes
// landed, 3 last item done, 4 exit (first_only: kept from the first pass), and globaltimer ns at 5 entry, 6 exit;
// the startup in detail (clock64, first pass): 7 node_offsets checked, 8 scan done (thread 0), 9 first item's
// geometry, 10 its page check done, 11 its first KV copy issued (the producer's thread 256; between them 12 the
// geometry published to the math warps, 13 Q's copy issued, 14 the first tile's slot known). The combine's
// threads 0 stamp globaltimer ns in g_attn_comb: 0 entry, 1 after pdl_wait, 2 exit; and of the CTA schedule's first
// item: 3 located, 4 M over the splits done, 5 warp 0's chain done, 6 every chain done (past the barrier), 7 the
// slice written; and of its prologue before the wait: 8 plan header read (planned calls), 9 node_offsets checked,
// 10 scan done, 11 first item located. The harness zeroes both before the launch.
__device__ long long g_attn_cta[4096][16];
__device__ long long g_attn_comb[4096][12];
__device__ __forceinline__ long long globaltimer_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// (first_only: the flag lives in shared memory, so a stamp is one global store and no global read; reading the
// slot back first cost a DRAM round trip after an L2 flush, inside the time it stamped: docs/PERF_NOTES.md S25)
#define DDT_PROF_CTA_AT(slot, thread, first_only)                                                 \
  do {                                                                                            \
    if (threadIdx.x == (thread)) {                                                                \
      if (!(first_only) || !(atomicOr(prof_first_mask(), 1u << (slot)) & (1u << (slot))))         \
        g_attn_cta[blockIdx.x % 4096][slot] = clock64();                                          \
    }                                                                                             \
  } while (0)
#define DDT_PROF_CTA(slot, first_only) DDT_PROF_CTA_AT(slot, 0, first_only)
#define DDT_PROF_CTA_NS(slot) do { if (threadIdx.x == 0) g_attn_cta[blockIdx.x % 4096][slot] = globaltimer_ns(); } while (0)
#define DDT_PROF_COMB_NS(slot) do { if (threadIdx.x == 0) g_attn_comb[blockIdx.x % 4096][slot] = globaltimer_ns(); } while (0)
#define DDT_PROF_COMB_FIRST_NS(slot, first) do { if (threadIdx.x == 0 && (first)) g_attn_comb[blockIdx.x % 4096][slot] = globaltimer_ns(); } while (0)
#else
#define DDT_PROF_COMB_FIRST_NS(slot, first) do {} while (0)
#define DDT_PROF_CTA_AT(slot, thread, first_only) do {} while (0)
#define DDT_PROF_CTA(slot, first_only) do {} while (0)
#define DDT_PROF_CTA_NS(slot) do {} while (0)
#define DDT_PROF_COMB_NS(slot) do {} while (0)
#define DDT_PROF_INIT() do {} while (0)
#define DDT_PROF_FLUSH() do {} while (0)
#define DDT_PROF_START(t) do {} while (0)
#define DDT_PROF_LAP(slot, t) do {} while (0)
#define DDT_PROF_COUNT(slot) do {} while (0)
#endif

// ---- cp.async (sm_80+), used by both flash kernels ----
// 16-byte async copy global -> shared; src_bytes = 0 zero-fills the destination without reading src.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

constexpr int kWarps = 8;              // both flash kernels and the combine run 256-thread CTAs
constexpr int kThreads = kWarps * 32;
constexpr int kScanBufInts = 3 * kThreads;  // run_flash_items' scan: lead items, last-split items, partial rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Writes the flattened (node, head) rows f_begin + warp, + f_stride, ... < f_end (of total_nodes * H) with
// one value (a lane writes 16 bf16). Used for padding (0 / -inf) and poison (NaN / NaN).
__device__ void fill_rows(const ddt_verify_attn_params& p, int64_t f_begin, int64_t f_end, int64_t f_stride,
                          uint16_t v, float l) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp >= kWarps) return;  // warps past the first 8 (the sm_90a kernel's producer warpgroup) write nothing
  const uint32_t v2 = uint32_t(v) | (uint32_t(v) << 16);
  const uint4 vv = make_uint4(v2, v2, v2, v2);
  for (int64_t f = f_begin + warp; f < f_end; f += f_stride) {
    uint4* o = reinterpret_cast<uint4*>(p.out + f * kDimV);
    o[lane] = vv;
    o[lane + 32] = vv;
    if (lane == 0) p.lse[f] = l;
  }
}

// ---- scheduling: per-request item counts, a block scan over requests, item lookup ----
struct Counts {
  int items;           // work items of this request in the kernel at hand (the main kernels: of its leading splits)
  int partial_rows;    // workspace rows of this request (rows x splits when split, else 0)
  int tail_items = 0;  // the main kernels: the items of its last split (listed after every request's leading ones)
};
// Request r's rows (nodes x heads) and split plan (an invalid request: one unsplit item per row tile).
struct RequestPlan {
  int64_t rows;
  SplitPlan s;
};
__device__ __forceinline__ RequestPlan request_plan(const ddt_verify_attn_params& p, int r, int split_keys,
                                                    int row_tile) {
  const Request q = make_request(p, r);
  const int64_t rows = int64_t(q.nodes) * p.heads;
  return {rows, split_plan(request_shape_ok(p, q) ? q.keys : 0, rows, split_keys, row_tile)};
}
// A flash kernel with row tiles of RowTile rows: row_tiles x splits items per request, local = split x row_tiles +
// row tile. The scan order lists every request's leading items first, request by request, then the last split's
// items of the requests that list it last (last_split_listed_last: T x H <= 128, at most 32 splits), request by
// request; item b runs on CTA b % grid (kernels/common/verify_attn_split.h, docs/PERF_NOTES.md S32 - S34).
template <int RowTile>
struct MainCounts {
  int split_keys;
  __device__ Counts operator()(const ddt_verify_attn_params& p, int r) const {
    const RequestPlan rp = request_plan(p, r, split_keys, RowTile);
    const int tail = last_split_listed_last(rp.rows, rp.s.splits) ? rp.s.row_tiles : 0;
    return {rp.s.row_tiles * rp.s.splits - tail, rp.s.splits > 1 ? int(rp.rows * rp.s.splits) : 0, tail};
  }
};
// The combine: per split request, one item per kWarps rows when the warp schedule takes it (at most
// kCombineFewSplits splits and warp_rows: a warp per row), else `slices` items per row (a CTA per (row,
// 512 / slices dims)).
// warp_rows: the launch's choice (combine_warp_mode) to use the warp schedule at all.
__device__ __forceinline__ bool combine_by_warps(bool warp_rows, int splits) {
  return warp_rows && splits <= kCombineFewSplits;
}
struct CombineCounts {
  int split_keys;
  bool warp_rows;
  int slices;  // the CTA schedule's items per row (verify_attn_combine_kernel's kSlices)
  __device__ Counts operator()(const ddt_verify_attn_params& p, int r) const {
    const RequestPlan rp = request_plan(p, r, split_keys, kRowTile);  // (the splits do not depend on the tile)
    if (rp.s.splits <= 1) return {0, 0};  // only split requests have partials to combine
    const int64_t items = combine_by_warps(warp_rows, rp.s.splits)
                              ? (rp.rows + kWarps - 1) / kWarps
                              : rp.rows * slices;
    return {int(items), int(rp.rows * rp.s.splits)};
  }
};

// Block-wide inclusive scan of the counts over requests: thread i sums a contiguous chunk of requests
// (node_offsets must be well formed, so every count and total fits in int: the host bounds them), then a
// warp-shuffle scan and the warp totals (two barriers). s_items / s_rows [kThreads] receive the inclusive
// prefix sums per thread chunk, and s_tail [kThreads] (the main kernels' scan) those of tail_items. Ends with a
// barrier. Threads past the first kThreads (the sm_90a kernel's producer warpgroup, which instantiates it with
// kJoinOnly) only take part in the barriers.
template <bool kJoinOnly = false, class F>
__device__ void scan_requests(const ddt_verify_attn_params& p, F counts, int* s_items, int* s_rows,
                              int* s_tail = nullptr) {
  __shared__ int s_warp_items[kWarps], s_warp_rows[kWarps], s_warp_tail[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (kJoinOnly) {
    __syncthreads();
    __syncthreads();
    return;
  }
  const bool scans = tid < kThreads;
  const int per = (p.batch + kThreads - 1) / kThreads;
  const int r_lo = scans && tid * per < p.batch ? tid * per : p.batch;
  const int r_hi = r_lo + per < p.batch ? r_lo + per : p.batch;
  int a = 0, b = 0, t = 0;
  for (int r = r_lo; r < r_hi; ++r) {
    const Counts c = counts(p, r);
    a += c.items;
    b += c.partial_rows;
    t += c.tail_items;
  }
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int va = __shfl_up_sync(0xFFFFFFFFu, a, off), vb = __shfl_up_sync(0xFFFFFFFFu, b, off),
              vt = __shfl_up_sync(0xFFFFFFFFu, t, off);
    if (lane >= off) { a += va; b += vb; t += vt; }
  }
  if (scans && lane == 31) { s_warp_items[warp] = a; s_warp_rows[warp] = b; s_warp_tail[warp] = t; }
  __syncthreads();
  if (scans) {
    for (int w = 0; w < warp; ++w) { a += s_warp_items[w]; b += s_warp_rows[w]; t += s_warp_tail[w]; }
    s_items[tid] = a;
    s_rows[tid] = b;
    if (s_tail) s_tail[tid] = t;
  }
  __syncthreads();
}
// The main kernels' item count from their scan: every request's leading items, then every last split's.
__device__ __forceinline__ int scanned_main_items(const int* s_items, const int* s_tail) {
  return s_items[kThreads - 1] + s_tail[kThreads - 1];
}

struct Item {
  int r;             // request (-1: none)
  int local;         // item index within the request
  int partial_base;  // the request's first workspace row
};
// Item b (< total) from the scan: the thread chunk holding it (binary search), then a walk over the
// chunk's requests. With s_tail (the main kernels' scan), b past the leading items is the (b - lead)-th
// last-split item, local = the request's leading items + its index in the last split. Any thread may call it
// (no barrier).
template <class F>
__device__ Item locate_item(const ddt_verify_attn_params& p, F counts, const int* s_items, const int* s_rows,
                            int b, const int* s_tail = nullptr) {
  const bool tail = s_tail && b >= s_items[kThreads - 1];
  const int* s_count = tail ? s_tail : s_items;
  if (tail) b -= s_items[kThreads - 1];
  int lo = 0, hi = kThreads - 1;  // first chunk whose inclusive count exceeds b
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (s_count[mid] > b) hi = mid; else lo = mid + 1;
  }
  int a0 = lo > 0 ? s_count[lo - 1] : 0, b0 = lo > 0 ? s_rows[lo - 1] : 0;
  const int per = (p.batch + kThreads - 1) / kThreads;
  const int r_hi = min((lo + 1) * per, p.batch);
  for (int r = lo * per; r < r_hi; ++r) {
    const Counts c = counts(p, r);
    const int n = tail ? c.tail_items : c.items;
    if (b < a0 + n) return {r, (tail ? c.items : 0) + b - a0, b0};
    a0 += n;
    b0 += c.partial_rows;
  }
  return {-1, 0, 0};  // unreachable for b < total
}

// Every CTA of both kernels: is node_offsets well formed? (a block-wide OR; ends with a barrier)
__device__ bool offsets_bad(const ddt_verify_attn_params& p) {
  bool bad = false;
  for (int i = threadIdx.x; i <= p.batch; i += kThreads) bad |= !offsets_entry_ok(p, i);
  return __syncthreads_or(bad);
}

// A plan's header against the call (ddt_verify_attn_sm90_planned_cuda): 0 if usable; DDT_DATA_BAD_PLAN if it was
// made for other scalars, holds more items than the buffer (capacity) or was never written; DDT_DATA_BAD_INDEX if
// it found node_offsets malformed. Either way the main kernel poisons every row and the combine does nothing.
__device__ uint32_t plan_verdict(const ddt_verify_attn_params& p, int split_keys, const PlanHeader& h,
                                 int64_t capacity) {
  if (h.magic != kPlanMagic || h.batch != p.batch || h.heads != p.heads || h.split_keys != split_keys ||
      h.total_nodes != p.total_nodes || h.page_size != p.page_size || h.max_pages != p.max_pages ||
      h.vis_words != p.vis_words || h.num_pages != p.num_pages || h.items < 0 || h.items > capacity)
    return DDT_DATA_BAD_PLAN;
  return h.offsets_bad ? DDT_DATA_BAD_INDEX : 0u;
}
// Shared words of a planned call (one array per CTA, as round_items): [0] the header's verdict, [1] its item
// count, [2] its rows_end.
__device__ __forceinline__ int* plan_words() {
  __shared__ int words[3];
  return words;
}
// Thread 0 reads the header and publishes it in plan_words (ends with a barrier).
__device__ void read_plan_header(const ddt_verify_attn_params& p, int split_keys, const PlanHeader* plan,
                                 int64_t capacity) {
  int* w = plan_words();
  if (threadIdx.x == 0) {
    const PlanHeader h = *plan;
    w[0] = int(plan_verdict(p, split_keys, h, capacity));
    w[1] = h.items;
    w[2] = h.rows_end;
  }
  __syncthreads();
}

// The combine: for each row of a split request, merge its splits' (m, l, o):
//   M = max_s m_s; w_s = 2^(m_s - M); L = sum_s w_s l_s; out = (sum_s w_s o_s) x (1 / L); lse = ln(2) M + ln(L).
// The sums in one fixed order: chain w (w < 8) adds the splits s = w, w + 8, ... in increasing order from 0,
// then the 8 chains are added in chain order from 0. The order does not depend on the split count (a split
// past the last is never read; an empty split, all keys masked, adds exact zeros), so the result is
// deterministic, batch invariant, and a chain node equals its single-node decode (FIDELITY rule E: the chain
// has extra, empty splits). Two schedules of that one order:
//  - one CTA per (row, slice of 512 / kSlices dims) (an item, kSlices = 1, 2, 4, 8, 16: combine_slices): warp w runs
//    chain w over the slice's dims, the CTA adds the chains. Any S. With few rows (batch 1 at long contexts:
//    8 rows, hundreds of splits) a CTA per row leaves most SMs idle and each CTA latency-bound; slices give
//    more CTAs and, with fewer loads per lane per split, more splits' loads in flight per warp. Every slice
//    recomputes M, the weights and L the same way; slice 0 writes lse.
//  - S <= kCombineFewSplits = 8 (chains of one split) and warp_mode != 0: one warp per row (combine_row_warp;
//    items of kWarps rows). Fewer instructions per row (one item lookup per 8 rows, no block barrier) but one
//    split's loads in flight per warp at a time: the launcher picks it when there are rows enough to fill the
//    GPU (combine_warp_mode). Both schedules give the same bits (a GPU test compares them).
// Lanes of the warp schedule and of a CTA per row hold the partial positions [4 lane + 128 k, +4), k < 4 (coalesced
// 512-byte warp loads per split); the sliced CTA schedules' lanes hold consecutive positions of the slice
// (verify_attn_combine_kernel). A slice (at least 32 positions from a multiple of 32) holds whole 16-dim blocks, so
// it is also a set of whole dims; each result goes to its dim (partial_dim). Every dim sees the same operations in
// every schedule. A split marked bad (m = NaN) or holding a NaN score (l = NaN) makes the row NaN;
// no visible key at all (M = -inf, every l = 0): 0 / -inf.
// acc += wgt x v (one split's o at 4 dims): a chain's step, the same operations per dim in every schedule (their
// bitwise equality rests on it).
__device__ __forceinline__ void combine_chain_add(float4& acc, float wgt, const float4 v) {
  acc.x += wgt * v.x;
  acc.y += wgt * v.y;
  acc.z += wgt * v.z;
  acc.w += wgt * v.w;
}
// The sums of the 4 partial positions 4 q .. 4 q + 3 times 1 / L, as bf16, to their dims in the output row out
// (partial_pos: two pairs of adjacent dims, 16 k + 2 c and 16 k + 8 + 2 c, for q = 4 k + c).
__device__ __forceinline__ void combine_store_pos4(uint16_t* out, int q, float4 sum, float inv) {
  const uint32_t x = num::f32_to_bf16(sum.x * inv), y = num::f32_to_bf16(sum.y * inv);
  const uint32_t z = num::f32_to_bf16(sum.z * inv), w = num::f32_to_bf16(sum.w * inv);
  const int d = partial_dim(4 * q);  // (the pair at positions 4 q + 2, + 3 is dims d + 8, d + 9)
  *reinterpret_cast<uint32_t*>(out + d) = x | (y << 16);
  *reinterpret_cast<uint32_t*>(out + d + 8) = z | (w << 16);
}
// One warp, one row of at most kCombineFewSplits splits: prow = the row's partial row of split 0 (split s:
// prow + s n_rows), out_row its output row.
__device__ __forceinline__ void combine_row_warp(const ddt_verify_attn_params& p, const float* ws_o,
                                                 const float* ws_ml, int64_t prow, int64_t n_rows, int splits,
                                                 int64_t out_row) {
  static_assert(kCombineFewSplits <= kWarps, "a warp-per-row chain holds one split");
  const int lane = threadIdx.x & 31;
  // Lane s < splits holds split s's (m, l); the others -inf / 0 (neutral in the vote, the max and the weights).
  float m = num::kNegInf, l = 0.0f;
  if (lane < splits) {
    m = ws_ml[(prow + lane * n_rows) * 2];
    l = ws_ml[(prow + lane * n_rows) * 2 + 1];
  }
  const bool bad = __any_sync(0xFFFFFFFFu, isnan(m) || isnan(l));
  const float m_max = warp_max(m);
  uint2* o = reinterpret_cast<uint2*>(p.out + out_row * kDimV);  // 4 bf16 per uint2
  if (bad || m_max == num::kNegInf) {
    const uint16_t v = bad ? num::kBf16QuietNaN : uint16_t(0);
    const uint32_t v2 = uint32_t(v) | (uint32_t(v) << 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[lane + 32 * k] = make_uint2(v2, v2);
    if (lane == 0) p.lse[out_row] = bad ? num::bits_f32(0x7FC00000u) : num::kNegInf;
    return;
  }
  const float wgt_lane = exp2f(m - m_max);  // split lane's weight (the CTA schedule's formula)
  float4 sum[4] = {};
  float l_all = 0.0f;
  // Chain s = split s alone, then added to the sums: the CTA schedule's operations in its order, except that
  // the CTA schedule also adds the +0 sums of its warps past the last split. Those change no bit: the totals
  // start at +0 and a round-to-nearest add gives -0 only when both operands are -0, so no total is ever -0
  // (this needs subnormals kept: kernels/CMakeLists.txt refuses -ftz=true). (One split's
  // loads in flight per warp: with rows enough, the other warps cover the latency; a rolled loop keeps the
  // kernel's code small: after an L2 flush every instruction-cache miss goes to memory.)
#pragma unroll 1
  for (int s = 0; s < splits; ++s) {
    const float wgt = __shfl_sync(0xFFFFFFFFu, wgt_lane, s), ls = __shfl_sync(0xFFFFFFFFu, l, s);
    const float4* src = reinterpret_cast<const float4*>(ws_o + (prow + s * n_rows) * kDimV);
    float4 acc[4] = {};
    float l_sum = 0.0f;
    l_sum += wgt * ls;
#pragma unroll
    for (int k = 0; k < 4; ++k) combine_chain_add(acc[k], wgt, src[lane + 32 * k]);
    l_all += l_sum;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sum[k].x += acc[k].x;
      sum[k].y += acc[k].y;
      sum[k].z += acc[k].z;
      sum[k].w += acc[k].w;
    }
  }
  const float inv = 1.0f / l_all;
#pragma unroll
  for (int k = 0; k < 4; ++k) combine_store_pos4(p.out + out_row * kDimV, lane + 32 * k, sum[k], inv);
  if (lane == 0) p.lse[out_row] = __fmaf_rn(m_max, kLn2, logf(l_all));  // (explicit: every epilogue rounds alike)
}
// kSlices (1, 2, 4, 8, 16): the CTA schedule's items are (row, 512 / kSlices dims), the launcher's choice
// (combine_slices). (At most 64 registers: 4 CTAs per SM keep the CTA schedule's loads in flight; ptxas takes 70
// without the bound, and 3 CTAs per SM cost the 32k shapes ~2%. More splits in flight per warp for the 2- and
// 4-slice schedules need more registers, hence fewer CTAs: docs/PERF_NOTES.md S22, tried and not kept; the 8-
// and 16-slice schedules hold 2 and 1 dims per lane and load a round's (m, l) one split per lane, so 6 and 12 splits
// in flight fit, issued together (cuobjdump: every load of a round before its first use).)
// Lanes: kSlices 1 as the warp schedule (positions [4 lane + 128 k, +4), k < 4); kSlices > 1: the slice is the
// row's partial positions [slice x 512 / kSlices, +512 / kSlices) (the same set of dims), lane holding kF = 16 /
// kSlices consecutive ones.
template <int kF>
__device__ __forceinline__ void combine_load_lane(float (&d)[kF], const float* src) {
  if constexpr (kF % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kF / 4; ++k) {
      const float4 v = reinterpret_cast<const float4*>(src)[k];
      d[4 * k] = v.x, d[4 * k + 1] = v.y, d[4 * k + 2] = v.z, d[4 * k + 3] = v.w;
    }
  } else if constexpr (kF == 2) {
    const float2 v = *reinterpret_cast<const float2*>(src);
    d[0] = v.x, d[1] = v.y;
  } else {
    d[0] = *src;
  }
}
// The kF values of partial positions pos .. pos + kF - 1 (times inv, as bf16) to their dims in the output row out
// (partial_pos: positions 2 t, 2 t + 1 are adjacent dims, one 4-byte store per pair).
template <int kF>
__device__ __forceinline__ void combine_store_lane(uint16_t* out, int pos, const float (&v)[kF], float inv) {
  if constexpr (kF == 1) {
    out[partial_dim(pos)] = uint16_t(num::f32_to_bf16(v[0] * inv));
  } else {
#pragma unroll
    for (int i = 0; i < kF; i += 2)
      *reinterpret_cast<uint32_t*>(out + partial_dim(pos + i)) =
          num::f32_to_bf16(v[i] * inv) | (num::f32_to_bf16(v[i + 1] * inv) << 16);
  }
}
template <int kSlices>
__global__ void __launch_bounds__(kThreads, 4)
    verify_attn_combine_kernel(ddt_verify_attn_params p, int split_keys, const float* ws_o, const float* ws_ml,
                               int warp_mode, const PlanHeader* plan, int64_t plan_capacity) {
  static_assert(kSlices == 1 || kSlices == 2 || kSlices == 4 || kSlices == 8 || kSlices == 16,
                "a slice is whole dims of every lane");
  constexpr int kF = 16 / kSlices;  // (kSlices > 1) dims per lane per split
  constexpr int kInFlight = kSlices == 16 ? 12 : kSlices == 8 ? 6 : kSlices == 4 ? 4 : 2;  // (kSlices > 1) a chain's splits whose loads are in flight together
  __shared__ int s_items[kThreads], s_rows[kThreads];
  __shared__ __align__(16) float s_acc[kWarps][kDimV / kSlices];  // per-warp partial sums of a slice (16 KB / kSlices)
  __shared__ float s_l[kWarps], s_m[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  DDT_PROF_COMB_NS(0);
  const CombineCounts counts{split_keys, warp_mode != 0, kSlices};
  // (planned call: the plan kernel finished before the main kernel started, so its header is visible here.
  // node_offsets is checked in any case: the scan below reads it, and a stale plan must not make it trusted.)
  // (The early returns wait for the main kernel too: a combine that exits without the wait lets its grid complete
  // while the main kernel still poisons the rows, and a kernel launched after it with PDL would wait only for it.)
  if (plan) {
    read_plan_header(p, split_keys, plan, plan_capacity);
    DDT_PROF_COMB_NS(8);
    if (plan_words()[0] != 0) {  // the main kernel poisoned every row
      pdl_wait();
      return;
    }
  }
  if (offsets_bad(p)) {  // the main kernel poisoned every row (or, with a stale plan, left them undefined)
    pdl_wait();
    return;
  }
  DDT_PROF_COMB_NS(9);
  scan_requests(p, counts, s_items, s_rows);
  DDT_PROF_COMB_NS(10);
  const int total = s_items[kThreads - 1];
  const int H = p.heads;
  // The first item's location and request (inputs only) before the wait as well (through shared memory: values
  // kept in registers across the item loop cost the sliced schedules spills).
  __shared__ Item s_first;
  __shared__ Request s_first_q;
  if (tid == 0 && int(blockIdx.x) < total) {
    s_first = locate_item(p, counts, s_items, s_rows, blockIdx.x);
    s_first_q = make_request(p, s_first.r);
  }
  __syncthreads();
  DDT_PROF_COMB_NS(11);
  // Launched with programmatic dependent launch: the checks, the scan and the first item's lookup above read
  // only the inputs and run while the main kernel finishes; its partials are read only after this wait.
  pdl_wait();
  DDT_PROF_COMB_NS(1);
  bool probe_warp = false;  // DDTREE_ATTN_COMBINE=probe: a row of this CTA was merged by the warp schedule
  for (int b = blockIdx.x; b < total; b += gridDim.x) {
    const bool first = b == int(blockIdx.x);
    const Item item = first ? s_first : locate_item(p, counts, s_items, s_rows, b);
    const Request q = first ? s_first_q : make_request(p, item.r);
    const int64_t n_rows = int64_t(q.nodes) * H;
    const SplitPlan plan = split_plan(q.keys, n_rows, split_keys);  // shape checked: only split requests have items
    if (combine_by_warps(warp_mode != 0, plan.splits)) {  // (uniform over the CTA: an item's rows share the request)
      const int64_t i = int64_t(item.local) * kWarps + warp;  // request-local row of this warp
      if (i < n_rows)
        combine_row_warp(p, ws_o, ws_ml, int64_t(item.partial_base) + i, n_rows, plan.splits,
                         int64_t(q.first_row) * H + i);
      probe_warp |= warp_mode == 2;
      continue;
    }
    DDT_PROF_COMB_FIRST_NS(3, first);
    const int64_t i = item.local / kSlices;              // request-local row
    const int d0 = (item.local % kSlices) * (kDimV / kSlices);  // the slice's first dim
    const int64_t prow = int64_t(item.partial_base) + i;  // split s: prow + s * n_rows
    // 1. M and the bad flag over all splits (block-wide; max is order-free, NaN marks are sticky).
    float m_max = num::kNegInf;
    bool bad = false;
    for (int s = tid; s < plan.splits; s += kThreads) {
      const float m = ws_ml[(prow + s * n_rows) * 2], l = ws_ml[(prow + s * n_rows) * 2 + 1];
      bad |= isnan(m) || isnan(l);  // a bad page (m NaN) or a NaN score (l NaN; m -inf if all were NaN)
      m_max = fmaxf(m_max, m);
    }
    m_max = warp_max(m_max);
    bad = __syncthreads_or(bad);  // (also orders the previous item's reads of s_acc before the writes below)
    if (lane == 0) s_m[warp] = m_max;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, s_m[w]);
    DDT_PROF_COMB_FIRST_NS(4, first);
    const int64_t out_row = int64_t(q.first_row) * H + i;
    uint16_t* o = p.out + out_row * kDimV + d0;
    if (bad || m_max == num::kNegInf) {
      const uint16_t v = bad ? num::kBf16QuietNaN : uint16_t(0);
      for (int d = tid; d < kDimV / kSlices; d += kThreads) o[d] = v;
      if (tid == 0 && d0 == 0) p.lse[out_row] = bad ? num::bits_f32(0x7FC00000u) : num::kNegInf;
      continue;
    }
    // 2. Warp w: splits w, w + 8, ... in order, the slice's dims; 3. the warp sums in warp order.
    float l_sum = 0.0f;
    if constexpr (kSlices == 1) {  // (a row per CTA: the loop of the schedule before the slices)
      float4 acc[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
      for (int s = warp; s < plan.splits; s += kWarps) {
        const int64_t pr = prow + s * n_rows;
        const float wgt = exp2f(ws_ml[pr * 2] - m_max);
        l_sum += wgt * ws_ml[pr * 2 + 1];
        const float4* src = reinterpret_cast<const float4*>(ws_o + pr * kDimV);
#pragma unroll
        for (int k = 0; k < 4; ++k) combine_chain_add(acc[k], wgt, src[lane + 32 * k]);
      }
      DDT_PROF_COMB_FIRST_NS(5, first);
      float4* s_acc4 = reinterpret_cast<float4*>(s_acc[warp]);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_acc4[32 * k + lane] = acc[k];
      if (lane == 0) s_l[warp] = l_sum;
      __syncthreads();
      DDT_PROF_COMB_FIRST_NS(6, first);
      if (tid < 128) {  // thread t finishes the row's float4 t
        float l_all = 0.0f;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          l_all += s_l[w];
          const float4 v = reinterpret_cast<const float4*>(s_acc[w])[tid];
          sum.x += v.x;
          sum.y += v.y;
          sum.z += v.z;
          sum.w += v.w;
        }
        combine_store_pos4(o, tid, sum, 1.0f / l_all);
        if (tid == 0) p.lse[out_row] = __fmaf_rn(m_max, kLn2, logf(l_all));  // (explicit: every epilogue rounds alike)
      }
    } else {
      float acc[kF];
#pragma unroll
      for (int k = 0; k < kF; ++k) acc[k] = 0.0f;
      const int64_t step = int64_t(kWarps) * n_rows;  // partial rows from one split of the chain to its next
      const float2* ml = reinterpret_cast<const float2*>(ws_ml) + prow + warp * n_rows;  // (m, l) of split warp
      const float* src = ws_o + (prow + warp * n_rows) * kDimV + d0 + kF * lane;
      if constexpr (kSlices >= 8) {
        // (m, l) of the round's split j by lane j (one load per lane, its weight computed there, handed to the
        // other lanes by shuffles): the other lanes' loads are only o's, kF floats per split, so the round's
        // loads fit the registers without ptxas interleaving them with the adds (it did with a (m, l) per lane
        // per split: one load latency per few splits instead of one per round).
        for (int s0 = warp; s0 < plan.splits; s0 += kInFlight * kWarps) {
          const int sj = s0 + kWarps * lane;
          float2 ml_lane = make_float2(num::kNegInf, 0.0f);
          if (lane < kInFlight && sj < plan.splits) ml_lane = ml[int64_t(lane) * step];
          float os[kInFlight][kF];
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
#pragma unroll
            for (int k = 0; k < kF; ++k) os[j][k] = 0.0f;
            if (s0 + j * kWarps < plan.splits) combine_load_lane<kF>(os[j], src);
            src += step * kDimV;
          }
          ml += kInFlight * step;
          const float wgt_lane = exp2f(ml_lane.x - m_max);
#pragma unroll
          for (int j = 0; j < kInFlight; ++j) {
            const float wgt = __shfl_sync(0xFFFFFFFFu, wgt_lane, j), lj = __shfl_sync(0xFFFFFFFFu, ml_lane.y, j);
            if (s0 + j * kWarps < plan.splits) {
              l_sum += wgt * lj;
#pragma unroll
              for (int k = 0; k < kF; ++k) acc[k] += wgt * os[j][k];  // (combine_chain_add's operation per dim)
            }
          }
        }
      } else
      for (int s0 = warp; s0 < plan.splits; s0 += kInFlight * kWarps) {
        float2 mls[kInFlight];
        float os[kInFlight][kF];
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) {  // (pointers stepped, not j x step: no hoisted 64-bit products)
          mls[j] = make_float2(0.0f, 0.0f);  // (set on every path: otherwise values carried across iterations spill)
#pragma unroll
          for (int k = 0; k < kF; ++k) os[j][k] = 0.0f;
          if (s0 + j * kWarps < plan.splits) {
            mls[j] = *ml;
            combine_load_lane<kF>(os[j], src);
          }
          ml += step;
          src += step * kDimV;
        }
#pragma unroll
        for (int j = 0; j < kInFlight; ++j)
          if (s0 + j * kWarps < plan.splits) {
            const float wgt = exp2f(mls[j].x - m_max);
            l_sum += wgt * mls[j].y;
#pragma unroll
            for (int k = 0; k < kF; ++k) acc[k] += wgt * os[j][k];  // (combine_chain_add's operation per dim)
          }
      }
      DDT_PROF_COMB_FIRST_NS(5, first);
#pragma unroll
      for (int k = 0; k < kF; ++k) s_acc[warp][kF * lane + k] = acc[k];
      if (lane == 0) s_l[warp] = l_sum;
      __syncthreads();
      DDT_PROF_COMB_FIRST_NS(6, first);
      if (tid < 32) {  // thread t finishes lane t's dims
        float l_all = 0.0f, sum[kF];
#pragma unroll
        for (int k = 0; k < kF; ++k) sum[k] = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          l_all += s_l[w];
#pragma unroll
          for (int k = 0; k < kF; ++k) sum[k] += s_acc[w][kF * tid + k];
        }
        combine_store_lane<kF>(o - d0, d0 + kF * tid, sum, 1.0f / l_all);
        if (tid == 0 && d0 == 0)
          p.lse[out_row] = __fmaf_rn(m_max, kLn2, logf(l_all));  // (explicit: every epilogue rounds alike)
      }
    }
    DDT_PROF_COMB_FIRST_NS(7, first);
  }
  if (probe_warp && tid == 0) atomicOr(p.status, DDT_DATA_PROBE_COMBINE);
  DDT_PROF_COMB_NS(2);
}

// The main-kernel body both flash kernels share, after their shared-memory setup: (1) node_offsets as a whole
// (malformed: no row can be attributed; every CTA poisons a grid-strided share of all rows, CTA 0 sets the
// status bit); (2) this CTA's items blockIdx.x + j gridDim.x below the device-side total, in rounds of
// kMaxItemsPerCta (the scan lives in scan_buf, kScanBufInts ints that the items overwrite, so each round
// redoes it and lists its items first; the grid is the resident CTAs or fewer, idle CTAs cost one scan),
// process(item, planned record or null) for each; (3) padding rows [off[batch], total_nodes) as 0 / -inf,
// grid-strided.
// kPlanned (the sm_90a kernel's instantiation for planned calls; plan non-null): (1) and the scan come
// from the plan instead: the header's verdict (read beside the first round's items: one round trip) and the items
// listed in scan order.
// The CTA's item list of the current round. One array per CTA whatever run_flash_items is instantiated with
// (a __shared__ variable inside the template would be one per instantiation: the sm_90a kernel's two roles
// run two instantiations and must read the same list).
__device__ __forceinline__ Item* round_items() {
  __shared__ Item s_list[kMaxItemsPerCta];
  return s_list;
}
// The planned records of the round's items (the sm_90a producer builds an item's geometry from them), one array
// per CTA like round_items.
__device__ __forceinline__ PlanItem* round_plan() {
  __shared__ PlanItem s_plan[kMaxItemsPerCta];
  return s_plan;
}
// No row can be attributed (node_offsets malformed, or a refused plan): every CTA poisons a grid-strided share of
// all rows, CTA 0 sets the status bit.
__device__ __forceinline__ void poison_every_row(const ddt_verify_attn_params& p, uint32_t status_bit) {
  fill_rows(p, int64_t(blockIdx.x) * kWarps, int64_t(p.total_nodes) * p.heads, int64_t(gridDim.x) * kWarps,
            num::kBf16QuietNaN, num::bits_f32(0x7FC00000u));
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(p.status, status_bit);
}
// kJoinOnly: threads that neither scan nor locate items (the sm_90a kernel's producer warpgroup: its copy of
// this code then fits its 40 registers), but read the list and take part in every barrier.
template <int RowTile, bool kJoinOnly = false, bool kPlanned = false, class Process>
__device__ void run_flash_items(const ddt_verify_attn_params& p, int split_keys, int* scan_buf, Process process,
                                const PlanHeader* plan = nullptr, int64_t plan_capacity = 0) {
  Item* s_list = round_items();
  const int tid = threadIdx.x;
  const int H = p.heads;
  DDT_PROF_INIT();
  if (!kPlanned && offsets_bad(p)) {  // (planned: the header's verdict, below)
    if (!kJoinOnly) poison_every_row(p, DDT_DATA_BAD_INDEX);
    return;
  }
  DDT_PROF_CTA(7, true);
#pragma unroll 1
  for (int64_t round = 0;; ++round) {
    __syncthreads();  // the previous round's items are done with the shared buffers and s_list
    if constexpr (kPlanned) {
      // This round's records (loads issued before the header's verdict is known: one round trip in all).
      const PlanItem* items = reinterpret_cast<const PlanItem*>(plan + 1);
      const int64_t b = int64_t(blockIdx.x) + (round * kMaxItemsPerCta + tid) * int64_t(gridDim.x);
      PlanItem rec{-1, 0, 0, 0, 0, 0, 0, 0};
      if (!kJoinOnly && tid < kMaxItemsPerCta && b < plan_capacity) rec = items[b];
      if (round == 0) {
        read_plan_header(p, split_keys, plan, plan_capacity);
        if (const uint32_t verdict = uint32_t(plan_words()[0])) {
          if (!kJoinOnly) poison_every_row(p, verdict);
          return;
        }
        DDT_PROF_CTA(8, true);
      }
      if (!kJoinOnly && tid < kMaxItemsPerCta) {
        const bool in = b < plan_words()[1];
        s_list[tid] = in ? Item{rec.r, rec.local, rec.partial_base} : Item{-1, 0, 0};
        round_plan()[tid] = rec;
      }
    } else {
      int* s_items = scan_buf;
      int* s_rows = s_items + kThreads;
      int* s_tail = s_rows + kThreads;
      scan_requests<kJoinOnly>(p, MainCounts<RowTile>{split_keys}, s_items, s_rows, s_tail);
      DDT_PROF_CTA(8, true);
      if (!kJoinOnly && tid < kMaxItemsPerCta) {
        const int total = scanned_main_items(s_items, s_tail);
        const int64_t b = int64_t(blockIdx.x) + (round * kMaxItemsPerCta + tid) * int64_t(gridDim.x);
        s_list[tid] = b < total ? locate_item(p, MainCounts<RowTile>{split_keys}, s_items, s_rows, int(b), s_tail)
                                : Item{-1, 0, 0};
      }
    }
    __syncthreads();
    if (s_list[0].r < 0) break;  // uniform: no item left for this CTA
#pragma unroll 1
    for (int k = 0; k < kMaxItemsPerCta; ++k) {
      const Item item = s_list[k];
      if (item.r < 0) break;
      const PlanItem* rec = nullptr;
      if constexpr (kPlanned) rec = round_plan() + k;
      // (has_next: another item of this CTA's follows; at the round's last slot assumed, and always in unplanned
      // calls. Every role reads the same list, so they agree. The sm_90a kernel's planned S65 staging asks.)
      if constexpr (std::is_invocable_v<Process, const Item&, const PlanItem*, bool>)
        process(item, rec, !kPlanned || k + 1 >= kMaxItemsPerCta || s_list[k + 1].r >= 0);
      else process(item, rec);
    }
    // A list that did not fill (its items are blockIdx.x + j gridDim.x in increasing j) was this CTA's last:
    // leave without another scan (uniform: items never write s_list; every role reads the same entry). The
    // barrier keeps the sm_90a kernel's producer warpgroup, whose last copies may still be in flight, alive
    // until the math warps are done with them (as the next round's first barrier did before).
    if (s_list[kMaxItemsPerCta - 1].r < 0) {
      __syncthreads();
      break;
    }
  }
  if (!kJoinOnly) {
    const int64_t rows_end = kPlanned ? plan_words()[2] : p.batch > 0 ? p.node_offsets[p.batch] : 0;
    fill_rows(p, rows_end * H + int64_t(blockIdx.x) * kWarps, int64_t(p.total_nodes) * H,
              int64_t(gridDim.x) * kWarps, 0, num::kNegInf);
  }
  DDT_PROF_FLUSH();
}

// ---- host side, shared by the two flash launchers ----
// What a flash launcher needs to know about the current device, asked once per device and launcher.
struct FlashDeviceInfo {
  int state = 0;         // 0 not asked, 1 ok, -2 a CUDA query or opt-in failed (not cached: asked again),
                         // other negative values: the launcher's own refusals (cached)
  int main_ctas = 0;     // resident main-kernel CTAs (occupancy x SMs)
  int narrow8_ctas = 0;  // the portable launcher's narrow-8 kernels' resident CTAs (0: not asked; the sm_90a one)
  int sms = 0;           // multiprocessors
  int combine_ctas[kCombineSliceKinds] = {};  // resident combine CTAs of verify_attn_combine_kernel<1 << k>
};
// Opts `kernel` in to `smem` bytes of dynamic shared memory and sizes both launches' persistent grids on
// device `dev`: state 1, or -2 with the CUDA error cleared.
template <class Kernel>
inline FlashDeviceInfo resident_grids(Kernel kernel, int threads, int smem, int dev) {
  int sms = 0, occ = 0, occ_c[kCombineSliceKinds] = {};
  FlashDeviceInfo failed;
  failed.state = -2;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_c[0], verify_attn_combine_kernel<1>, kThreads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_c[1], verify_attn_combine_kernel<2>, kThreads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_c[2], verify_attn_combine_kernel<4>, kThreads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_c[3], verify_attn_combine_kernel<8>, kThreads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_c[4], verify_attn_combine_kernel<16>, kThreads, 0) != cudaSuccess ||
      occ < 1 || *std::min_element(occ_c, occ_c + kCombineSliceKinds) < 1) {
    (void)cudaGetLastError();
    return failed;
  }
  FlashDeviceInfo info;
  info.state = 1;
  info.main_ctas = occ * sms;
  info.sms = sms;
  for (int k = 0; k < kCombineSliceKinds; ++k) info.combine_ctas[k] = occ_c[k] * sms;
  return info;
}
// query(dev) -> FlashDeviceInfo for the current device, cached per device behind a mutex (launches may come
// from several host threads); one cache per launcher (each passes its own lambda type).
template <class Query>
FlashDeviceInfo cached_device_info(Query query) {
  constexpr int kMaxDevices = 64;
  static FlashDeviceInfo info[kMaxDevices];
  static std::mutex mu;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    FlashDeviceInfo failed;
    failed.state = -2;
    return failed;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (info[dev].state != 0) return info[dev];
  const FlashDeviceInfo got = query(dev);
  if (got.state != -2) info[dev] = got;
  return got;
}

// Arguments, split_keys and the caller's workspace against what these capacities need (ddtree/kernels.h
// section 4). DDT_OK or the error code, with its message recorded (name: the entry point, for the message).
inline int check_flash_call(const ddt_verify_attn_params* p, int split_keys, const void* workspace,
                            size_t workspace_bytes, const char* name) {
  if (int rc = validate(p)) return rc;
  size_t need = 0;
  if (int rc = ddt_verify_attn_portable_workspace(p, split_keys, &need)) return rc;
  const std::string who = name;
  if (need > 0 && !workspace)
    return fail(DDT_ERR_NULL, who + ": workspace is null (ddt_verify_attn_portable_workspace: " +
                                  std::to_string(need) + " bytes)");
  if (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return fail(DDT_ERR_ALIGN, who + ": workspace must be 16-byte aligned");
  if (workspace_bytes < need)
    return fail(DDT_ERR_SHAPE, who + ": workspace_bytes " + std::to_string(workspace_bytes) + " < " +
                                   std::to_string(need) + " needed for these capacities");
  return DDT_OK;
}

// DDTREE_ATTN_COMBINE, read per call (the tests compare the schedules; a captured graph keeps its capture's
// value): cta / half / quarter / eighth / sixteenth force the CTA schedule with 1 / 2 / 4 / 8 / 16 slices, warp
// the warp schedule, probe the
// warp schedule with DDT_DATA_PROBE_COMBINE marked; unset or any other value: the defaults below.
struct CombineForce {
  int warp_mode = -1;  // -1: default
  int slices = 0;      // 0: default
};
inline CombineForce combine_force() {
  const char* env = std::getenv("DDTREE_ATTN_COMBINE");
  if (!env) return {};
  if (std::strcmp(env, "cta") == 0) return {0, 1};
  if (std::strcmp(env, "half") == 0) return {0, 2};
  if (std::strcmp(env, "quarter") == 0) return {0, 4};
  if (std::strcmp(env, "eighth") == 0) return {0, 8};
  if (std::strcmp(env, "sixteenth") == 0) return {0, 16};
  if (std::strcmp(env, "warp") == 0) return {1, 0};
  if (std::strcmp(env, "probe") == 0) return {2, 0};
  return {};
}
// The combine's warp_mode: 1 (the warp schedule for requests of <= 8 splits) when the batch's row capacity
// gives at least two items of 8 rows per SM, else 0 (the CTA schedule: with few rows the loads of a row's
// splits run in parallel; docs/PERF_NOTES.md S19: 512 rows are faster by CTAs, 4,096 by warps). The schedule
// changes no bit. The row capacity counts padding rows: a graph captured at a large capacity takes the warp
// schedule for small real batches too (slower there, docs/PERF_NOTES.md S19, not wrong).
inline int combine_warp_mode(const ddt_verify_attn_params& p, int sms, const CombineForce& force) {
  if (force.warp_mode >= 0) return force.warp_mode;
  return int64_t(p.total_nodes) * p.heads >= int64_t(2 * kWarps) * sms ? 1 : 0;
}
// The CTA schedule's slices per row: as many (16, 8, 4, 2, 1) as keep the items of the batch's row capacity
// within one wave of that instantiation's resident CTAs (docs/PERF_NOTES.md S21: with few rows the sliced
// schedules save 2-20 us per call at batch 1; at 512 rows and more, slices cost 3-14%: more items, each with its
// barriers). 8 and 16 slices only when a request may have more than kCombineDeepSplits splits (the capacities'
// longest context): their gain is fewer rounds of loads per chain (S29: 128k T 1 b 1 -6 us), and with a few
// splits per chain the extra CTAs cost ~1 us (8k at split 512: 17 splits). Changes no bit (a slice's dims see
// the same operations).
inline int combine_slices(const ddt_verify_attn_params& p, int split_keys, const FlashDeviceInfo& dev,
                          const CombineForce& force) {
  if (force.slices > 0) return force.slices;
  const int64_t rows = int64_t(p.total_nodes) * p.heads;
  // (more than kCombineDeepSplits splits <=> more keys than kCombineDeepSplits x split_keys; in 64 bits)
  const bool deep = split_keys > 0 && int64_t(p.max_pages) * p.page_size > int64_t(kCombineDeepSplits) * split_keys;
  for (int k = kCombineSliceKinds - 1; k > 0; --k)
    if ((k <= 2 || deep) && rows * (1 << k) <= dev.combine_ctas[k]) return 1 << k;
  return 1;
}

// The combine launch after a flash kernel (when the capacities allow a split: some request may split).
// plan / plan_capacity: a planned call's plan (the combine then takes the plan's verdict instead of checking
// node_offsets itself), else null / 0.
inline int launch_combine(const ddt_verify_attn_params& p, int split_keys, const Bounds& b, const FlashDeviceInfo& dev,
                          float* ws_o, float* ws_ml, cudaStream_t s, const PlanHeader* plan = nullptr,
                          int64_t plan_capacity = 0) {
  if (b.combine_items == 0) return DDT_OK;
  const CombineForce force = combine_force();
  const int warp_mode = combine_warp_mode(p, dev.sms, force);
  const int slices = combine_slices(p, split_keys, dev, force);
  const int64_t ctas = dev.combine_ctas[std::countr_zero(unsigned(slices))];
  // (items: at most `slices` per row of the row capacity; fewer with the warp schedule)
  const int64_t items = std::min<int64_t>(b.combine_items, int64_t(p.total_nodes) * p.heads * slices);
  const dim3 g(unsigned(std::max<int64_t>(1, std::min<int64_t>(items, ctas))));
  const float* o = ws_o;
  const float* ml = ws_ml;
  // PDL (kernels/cuda/pdl.cuh): the main kernels signal launch_dependents at their start, so the combine's
  // launch, checks and scan overlap the main kernel; pdl_wait inside orders its reads of the partials.
  auto launch = [&](auto kernel) {
    return launch_pdl(kernel, g, dim3(kThreads), 0, s, p, split_keys, o, ml, warp_mode, plan, plan_capacity);
  };
  switch (slices) {
    case 16: DDT_CUDA_RETURN(launch(verify_attn_combine_kernel<16>)); break;
    case 8: DDT_CUDA_RETURN(launch(verify_attn_combine_kernel<8>)); break;
    case 4: DDT_CUDA_RETURN(launch(verify_attn_combine_kernel<4>)); break;
    case 2: DDT_CUDA_RETURN(launch(verify_attn_combine_kernel<2>)); break;
    default: DDT_CUDA_RETURN(launch(verify_attn_combine_kernel<1>)); break;
  }
  return DDT_OK;
}

}  // namespace
}  // namespace ddtree::kern::attn
