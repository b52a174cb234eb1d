// Tree-verify MLA attention on the GPU, the PORTABLE flash kernel (ddtree/kernels.h, section 4;
// reference/mla-verify-attention.md; issue 5): mma.sync.m16n8k16 bf16 -> f32 tensor cores, ldmatrix,
// cp.async double-buffered paged KV tiles, online softmax in f32 (exp2 of log2e-scaled scores), the KV split
// at fixed positions of each request with a fixed-order combine. Compiles for sm_80 .. sm_120 (<= 99 KB of
// shared memory per CTA, static_asserted). Same semantics and outputs as the oracle (verify_attn_oracle.cu)
// and the CPU twin to the correctness bar: bad data -> status bit + NaN rows of that request, padding rows
// 0 / -inf, lse = ln sum exp(scaled score).
//
// Work decomposition (plan and arithmetic: docs/PERF_NOTES.md, "Tree-verify attention: portable kernel"):
//  - Rows: request r's (node, head) pairs flattened as node * H + head (contiguous in q / out / lse), in row
//    tiles of kBM = 32: tile t = request-local rows [32 t, 32 t + 32). At H = 8 a tile is 4 nodes x 8 heads,
//    so all heads of a node share each KV tile load. (The narrow-8 kernel's row tiles are 8 rows: kNarrowN.)
//  - Keys: request r's slots 0 .. P + N - 1 in key tiles of kBN = 32 at absolute positions (32 k .. 32 k + 31).
//    A request with P + N > split_keys (the caller's constant) is cut at the absolute positions split_keys,
//    2 split_keys, ... (kernels/common/verify_attn_split.h: batch invariant, and a chain node equals the
//    single-node decode bitwise); the partial results (f32 o, running max m, sum l per row) go to the
//    caller's workspace and verify_attn_combine_kernel merges them in a fixed order.
//  - Work item = (request, split, row tile), numbered request by request, split then tile, except that the last
//    split of a request of at most 128 rows and 32 splits is listed after every other item (MainCounts in
//    verify_attn_sched.cuh; the tiles of one split stay neighbours in time: they share its KV tiles through
//    L2). Persistent CTAs: every CTA scans the per-request item counts (device data: node_offsets,
//    prefix_lens) and takes items blockIdx.x, + gridDim.x, ... (listed kMaxItemsPerCta at a time; the grid
//    is the resident CTAs, graph-safe).
//  - Per key tile: S = Q K^T (K = 576): warp w computes the partial product of m-tile (w & 1) (16 rows) over
//    the dim quarter (w >> 1) (144 dims, 9 k-steps; its Q fragments live in registers for the whole item)
//    for all 32 keys; the 4 partials of each row are summed in a fixed order through shared memory by the
//    softmax threads (8 per row, 4 keys each), which apply scale and mask, keep the row's running max / sum
//    in registers, and write P as a bf16 pair hi + lo (hi = bf16(p), lo = bf16(p - hi): p to ~2^-17
//    relative, so the PV product is as accurate as f32 P; rounding P to one bf16 alone misses the element
//    bar on peaked attention over few keys) and the rescale factor to shared memory. Then
//    O[32 x 512] = alpha O + P_hi V + P_lo V, V = dims 0..511 of the same KV tile: warp w owns output dims
//    [64 w, 64 w + 64) of all 32 rows (64 f32 accumulators per thread). With p_precision DDT_ATTN_P_BF16 (the
//    kPBf16 instantiations) P is hi alone: no P lo stores and one PV product (wide and narrow paths).
//  - Requests of at most 16 rows (T 1 at H 8 / 16: decode) take the narrow path instead (process_item<1 / 2>:
//    rows as the MMA's N, S^T = K Q^T and O^T = V^T P^T), bitwise equal to the 32-row path above. The kernel comes
//    in three instantiations (PortableMode): wide-only, narrow-16 (the narrow path for requests of at most 16 rows)
//    and narrow-8 (every request on the 8-row narrow path in 8-row items, at two CTAs per SM); the launcher takes a
//    narrow one for decode-like batches (DDTREE_PORTABLE_NARROW forces one; below and docs/PERF_NOTES.md S39, S81).
//  - KV tiles: 8 threads per key slot, each slot's address through the page table (any page size >= 1);
//    slots >= P + N are zero-filled (cp.async src-size 0) and never read from global memory; 16-byte chunks
//    XOR-swizzled by (slot & 7) so ldmatrix (K for QK, .trans for V) is free of bank conflicts.
//  - Data checks: node_offsets by every CTA (malformed: every row NaN); a request's scalars and the pages
//    of the item's key range by the item (bad: the item's rows NaN, or for a split its partial m = NaN,
//    which the combine turns into NaN rows); padding rows [off[batch], total_nodes) grid-strided by all CTAs.
// No host sync, no allocation (the dynamic shared-memory opt-in and the occupancy query are one-time host
// calls per device).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/common/bf16.h"
#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/common/verify_attn_split.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/verify_attn_sched.cuh"

namespace ddtree::kern::attn {
namespace {


// ---- config ----
constexpr int kBM = kRowTile;          // 32 query rows (node x head, flattened) per row tile
constexpr int kBN = kKeyTile;          // 32 key slots per KV tile
constexpr int kChunks = kDimQK / 8;     // 72 16-byte chunks per cache row
constexpr int kQKSteps = kDimQK / 16;   // 36 k-steps of 16 dims
constexpr int kStepsPerWarp = kQKSteps / 4;  // 9: each warp covers a quarter of the 576 dims
constexpr int kSpStride = kBN + 8;      // f32 row stride of the partial-score buffer (conflict-free float2 stores)
constexpr int kPStride = kBN + 8;       // bf16 row stride of P (80 bytes: conflict-free ldmatrix)
static_assert(kDimQK == 576 && kDimV == 512, "tiling below assumes 512 latent + 64 rope dims");
constexpr int kNarrowN = 8;                      // the narrow path's rows per n-tile (mma.sync's N)
constexpr int kNarrowRows = 2 * kNarrowN;        // requests of at most 16 rows take the narrow path (kNT 1 or 2)
static_assert(kWarps * 64 == kDimV, "each warp owns 64 output dims");
static_assert(kBM == 32 && kBN == 32 && kThreads == kBM * 8, "softmax mapping: 8 threads per row, 4 keys each");
static_assert(kThreads == kBN * 8 && kChunks % 8 == 0, "KV loader: 8 threads per slot, 9 chunks each");

// ---- shared-memory plan (bytes) ----
constexpr int kKvTileBytes = kBN * kDimQK * 2;                 // 36,864: one tile of 32 cache rows
constexpr int kSmemKv = 2 * kKvTileBytes;                      // 73,728: double buffer
constexpr int kSmemSp = 4 * kBM * kSpStride * 4;               // 20,480: 4 partial score tiles (f32); the
                                                               //   request scan (kScanBufInts) before the items
constexpr int kSmemP = 2 * kBM * kPStride * 2;                 //  5,120: P hi and P lo (bf16)
constexpr int kSmemRow = 2 * kBM * 4;                          //    256: rescale factor, 1 / l per row
constexpr int kSmemBytes = kSmemKv + kSmemSp + kSmemP + kSmemRow;  // 99,584
// Static: the CTA's item list and the scan's warp totals (3 x kWarps ints), with alignment (ptxas: 384 on
// sm_86 and sm_120).
constexpr int kSmemStatic = kMaxItemsPerCta * 16 + 3 * kWarps * 4 + 32;  // 384
static_assert(kSmemBytes + kSmemStatic + 128 <= 99 * 1024,
              "sm_120 (and sm_86/89) allow at most 99 KB of shared memory per CTA, static + dynamic");
static_assert(kKvTileBytes % 128 == 0 && kSmemSp % 16 == 0 && kSmemP % 16 == 0, "16-byte aligned sections");
static_assert(kSmemSp >= kScanBufInts * 4, "the request scan fits the partial-score buffer");

// ---- PTX wrappers (sm_80+) ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// (cp_async16 / cp_async_commit / cp_async_wait_all: verify_attn_sched.cuh)

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
// D = A B + D, A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 f32.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `c` (0..71) of slot row `s` (0..31) in a KV tile: chunks XOR-swizzled by
// s & 7 inside their aligned group of 8 (72 = 9 x 8, so the result stays in the row).
__device__ __forceinline__ uint32_t kv_chunk_off(int s, int c) {
  return uint32_t(s * (kDimQK * 2) + ((c ^ (s & 7)) << 4));
}

// Shared-memory views of the main kernel.
struct Smem {
  unsigned char* kv;  // [2][32 slots][72 chunks] bf16, swizzled
  float* sp;          // [4][32][kSpStride] f32 partial scores (dim quarters)
  uint16_t* p_hi;     // [32][kPStride] bf16
  uint16_t* p_lo;     // [32][kPStride] bf16
  float* alpha;       // [32] rescale factor of the current key tile
  float* inv_l;       // [32] 1 / l at the end
};

// The narrow path (kNT = 1, 2: requests of at most 8 / 16 rows, e.g. T 1 at H 8 / 16: decode) swaps the MMAs'
// operands, so the rows are the MMA's N (8 kNT) instead of 32 rows of M of which T 1 at H 8 uses 8:
//   S^T [32 keys x 8 kNT rows] = K Q^T: warp (km = w & 1, dq = w >> 1) the keys [16 km, +16) over the dim quarter dq
//                                        (A = K by ldmatrix, B = Q^T fragments in registers), written transposed
//                                        to the same partial-score buffer;
//   O^T [512 dims x 8 kNT rows] += V^T P^T: warp w its 64 dims as 4 m-tiles (A = V by ldmatrix.trans, B = P^T, i.e.
//                                        P's rows, by ldmatrix), hi then lo per 16-key step.
// Everything between (the partial sums, scale, mask, softmax, P hi / lo, rescale factors, row sums) is the wide
// path's code. Every output element is the same chain of MMAs over the same k-steps in the same order with A and B
// swapped, so a row's bits do not depend on the path (FIDELITY rule E: a chain node, in a wide item, equals its
// single-node decode, a narrow one), provided an MMA's dot product is the same with its operands swapped (checked
// bitwise on the GPU: PortableNarrowPathEqualsWidePathBitwise, ChainNodeEqualsSingleNodeDecodeBitwise).
// Thread (warp, lane = 4 g + c) holds S^T / O^T fragment elements (key or dim g (+ 8), row 2 c (+ 1)) per n-tile.
// One work item: rows [kTileRows t, kTileRows (t + 1)) of request r (q) against key tiles [kt_begin, kt_end) of its
// split; kNT = 0: the wide path (32 rows as M), 1 / 2: the narrow path.
// (The kernel with the narrow path inlines all three: 255 registers, 40 B of stack on sm_90 (56 / 76 B of spill
// stores / loads; sm_80: 16 B, 12 / 20 B), outside the tile loops (cuobjdump); the kernel without it: 233 registers,
// no stack. __noinline__ per path removed the spills but put the params on the stack: ~24 local loads per tile.)
// kPBf16: p_precision DDT_ATTN_P_BF16: P as one bf16 (no P lo, one PV product), else the hi + lo pair.
// kTileRows: the rows of an item (kBM; the narrow-8 kernel's items are 8-row tiles: kNarrowN, kNT 1).
template <int kNT, bool kPBf16, int kTileRows = kBM>
__device__ void process_item(const ddt_verify_attn_params& p, int split_keys, const Item item, const Request& q,
                             const Smem& sm, float* ws_o, float* ws_ml) {
  static_assert(kTileRows == kBM || (kTileRows == kNarrowN && kNT == 1), "8-row items on the 8-row narrow path only");
  constexpr bool kNarrow = kNT > 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.heads;
  const float nan = num::bits_f32(0x7FC00000u);
  __syncthreads();  // the previous item is done with every shared buffer
  DDT_PROF_START(tp);
  DDT_PROF_COUNT(9);

  const int64_t n_rows = int64_t(q.nodes) * H;
  const bool shape_ok = request_shape_ok(p, q);
  const SplitPlan plan = split_plan(shape_ok ? q.keys : 0, n_rows, split_keys, kTileRows);
  const int t = item.local % plan.row_tiles, split = item.local / plan.row_tiles;
  const bool is_split = plan.splits > 1;
  const int64_t row0 = int64_t(q.first_row) * H;  // global flattened row of the request's row 0
  const int64_t tile_row0 = int64_t(t) * kTileRows;  // first request-local flattened row of this item
  const int rows_here = n_rows - tile_row0 < kTileRows ? int(n_rows - tile_row0) : kTileRows;
  // Workspace row of (split, request-local row i): partial_base + split * n_rows + i.
  const int64_t prow0 = int64_t(item.partial_base) + int64_t(split) * n_rows + tile_row0;

  // 1. The request's scalars and the pages of this item's key range (all pages when not split). Bad: the
  //    rows are NaN (split: partial m = NaN, the combine poisons the rows; every split checks its own pages).
  const int64_t ktiles = (q.keys + kBN - 1) / kBN;
  const int64_t kt_begin = int64_t(split) * plan.tiles_per_split;
  const int64_t kt_end = kt_begin + plan.tiles_per_split < ktiles ? kt_begin + plan.tiles_per_split : ktiles;
  bool bad = !shape_ok;
  if (!bad) {
    const int64_t key0 = kt_begin * kBN, key1 = kt_end * kBN < q.keys ? kt_end * kBN : q.keys;
    const int64_t pg0 = key0 / p.page_size, pg1 = (key1 + p.page_size - 1) / p.page_size;
    for (int64_t k = pg0 + tid; k < pg1; k += kThreads) bad |= !page_ok(p, q, k);
  }
  if (__syncthreads_or(bad)) {
    if (tid == 0) atomicOr(p.status, DDT_DATA_BAD_INDEX);
    if (!is_split) {
      fill_rows(p, row0 + tile_row0, row0 + tile_row0 + rows_here, kWarps, num::kBf16QuietNaN, nan);
    } else {
      for (int i = tid; i < rows_here; i += kThreads) ws_ml[(prow0 + i) * 2] = nan;
    }
    return;
  }
  // From here the request is well formed: every slot of the key range maps to a checked page.

  // 2. Q fragments in registers: warp (mt = warp & 1, dq = warp >> 1) holds the A fragments of rows
  //    [16 mt, 16 mt + 16) for dims [144 dq, 144 dq + 144) (9 k-steps x 4 registers). Rows past the
  //    request's end are zero.
  const int g = lane >> 2, c = lane & 3;
  const int mt = warp & 1, dq = warp >> 1;  // (narrow: mt is the key m-tile)
  // Narrow: the B fragments of Q^T, rows 8 nt + g, dims (k0 + 2 c, + 1) and (k0 + 8 + 2 c, + 1) of each k-step.
  uint32_t qT[kStepsPerWarp][kNarrow ? kNT : 1][2];
  if constexpr (kNarrow) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = nt * 8 + g;
      const bool v = r < rows_here;
      const uint32_t* qr = reinterpret_cast<const uint32_t*>(p.q + (row0 + tile_row0 + (v ? r : 0)) * kDimQK);
#pragma unroll
      for (int ks = 0; ks < kStepsPerWarp; ++ks) {
        const int w0 = (dq * 144 + ks * 16) / 2 + c;
        qT[ks][nt][0] = v ? __ldg(qr + w0) : 0u;
        qT[ks][nt][1] = v ? __ldg(qr + w0 + 4) : 0u;
      }
    }
  }
  uint32_t qf[kNarrow ? 1 : kStepsPerWarp][4];
  if constexpr (!kNarrow) {
    const int ra = mt * 16 + g, rb = ra + 8;
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(p.q + (row0 + tile_row0 + ra) * kDimQK);
    const uint32_t* qb = reinterpret_cast<const uint32_t*>(p.q + (row0 + tile_row0 + rb) * kDimQK);
    const bool va = ra < rows_here, vb = rb < rows_here;
#pragma unroll
    for (int ks = 0; ks < kStepsPerWarp; ++ks) {
      const int w0 = (dq * 144 + ks * 16) / 2 + c;  // u32 index of dims (k0 + 2c, k0 + 2c + 1)
      qf[ks][0] = va ? __ldg(qa + w0) : 0u;
      qf[ks][1] = vb ? __ldg(qb + w0) : 0u;
      qf[ks][2] = va ? __ldg(qa + w0 + 4) : 0u;
      qf[ks][3] = vb ? __ldg(qb + w0 + 4) : 0u;
    }
  }

  // Softmax thread role: row sr = tid / 8, keys [4 (tid & 7), +4) of each tile.
  const int sr = tid >> 3, sk = (tid & 7) * 4;
  const bool s_valid = sr < rows_here;
  const uint64_t* s_vis = p.vis + (int64_t(q.first_row) + (tile_row0 + sr) / H) * p.vis_words;  // used only if valid
  const float scale_log2 = p.softmax_scale * kLog2e;
  float m_run = num::kNegInf, l_run = 0.0f;  // the row's running max (log2 units); this thread's share of its sum

  // Loader role: slot ls = tid / 8, chunks (tid & 7) + 8 i, i < 9. Where a slot lives is looked up one tile
  // ahead (SlotRef: the page-table load is issued a whole tile before its use, the division done there too),
  // so issuing a tile's copies never waits on a global load. (Issuing the 9 copies per thread still costs
  // warp 0 ~900 of ~3800 cycles per tile: the memory pipeline is shared with the ldmatrix traffic, ~180 KB of
  // shared-memory traffic per tile; docs/PERF_NOTES.md.)
  const int ls = tid >> 3, lc = tid & 7;
  const uint32_t kv_base = smem_addr(sm.kv);
  struct SlotRef {
    int32_t page;  // physical page (valid when in)
    uint32_t off;  // slot within the page
    bool in;       // slot < P + N
  };
  auto slot_ref = [&](int64_t kt) {
    SlotRef r;
    const int64_t j = kt * kBN + ls;
    r.in = j < q.keys;
    int64_t lpage = 0;
    if (j <= 0x7FFFFFFF) {  // 32-bit division (a 64-bit one is a long software routine on the GPU)
      lpage = uint32_t(j) / uint32_t(p.page_size);
      r.off = uint32_t(j) - uint32_t(lpage) * uint32_t(p.page_size);
    } else {
      lpage = j / p.page_size;
      r.off = uint32_t(j % p.page_size);
    }
    r.page = r.in ? int32_t(page_entry(p, q, lpage)) : 0;
    return r;
  };
  auto load_tile = [&](const SlotRef& r, int buf) {
    const uint16_t* src = p.kv_cache + (int64_t(r.page) * p.page_size + r.off) * kDimQK;  // = kv_row_offset
    const uint32_t dst = kv_base + uint32_t(buf * kKvTileBytes);
#pragma unroll
    for (int i = 0; i < kChunks / 8; ++i) {
      const int ch = lc + 8 * i;
      cp_async16(dst + kv_chunk_off(ls, ch), src + ch * 8, r.in ? 16 : 0);
    }
    cp_async_commit();
  };

  // Wide: O [m-tile][n-tile of this warp's 64 dims][fragment]; narrow: O^T [m-tile of this warp's 64 dims][n-tile of
  // rows][fragment].
  constexpr int kA = kNarrow ? 4 : 2, kB = kNarrow ? kNT : 8;
  float acc[kA][kB][4];
#pragma unroll
  for (int a = 0; a < kA; ++a)
#pragma unroll
    for (int b = 0; b < kB; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.0f;

  load_tile(slot_ref(kt_begin), 0);
  SlotRef next = slot_ref(kt_begin + 1 < kt_end ? kt_begin + 1 : kt_begin);  // tile kt_begin + 1's slot
  DDT_PROF_LAP(1, tp);  // item prologue: scalars, page checks, Q fragments, first load issued
  for (int64_t it = kt_begin; it < kt_end; ++it) {
    const int buf = int((it - kt_begin) & 1);
    const int64_t k0 = it * kBN;
    DDT_PROF_COUNT(10);
    cp_async_wait_all();
    DDT_PROF_LAP(2, tp);  // waiting for the tile's bytes
    __syncthreads();  // (A) tile `it` visible; every warp is done with tile it-1 (its buffer, P, partials)
    DDT_PROF_LAP(3, tp);  // barrier A
    if (it + 1 < kt_end) load_tile(next, buf ^ 1);
    if (it + 2 < kt_end) next = slot_ref(it + 2);  // used a tile from now
    DDT_PROF_LAP(4, tp);  // next tile's loads issued
    const uint32_t kv = kv_base + uint32_t(buf * kKvTileBytes);

    // S partial = Q[16 rows, dim quarter] K[32 keys, dim quarter]^T.
    if constexpr (kNarrow) {  // S^T partial = K[16 keys (m-tile mt), dim quarter] Q[8 kNT rows, dim quarter]^T
      float sp[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sp[nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kStepsPerWarp; ++ks) {
        // A = K: matrices (keys 0-7, dims 0-7), (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15)
        const int s = mt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        const int ch = dq * 18 + 2 * ks + (lane >> 4);
        uint32_t ka[4];
        ldmatrix_x4(kv + kv_chunk_off(s, ch), ka[0], ka[1], ka[2], ka[3]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma_bf16(sp[nt], ka, qT[ks][nt][0], qT[ks][nt][1]);
      }
      // (key, row) of the fragment to the wide path's [quarter][row][key] layout. Rows 8 kNT .. 31 of the buffer keep
      // what an earlier item or the request scan left there (any bits, NaN too): the softmax below sums them, then
      // selects -inf for every score of a row past rows_here before any further use, so nothing of them reaches a
      // valid row.
      float* dst = sm.sp + dq * (kBM * kSpStride);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int r = nt * 8 + 2 * c, k = mt * 16 + g;
        dst[r * kSpStride + k] = sp[nt][0];
        dst[(r + 1) * kSpStride + k] = sp[nt][1];
        dst[r * kSpStride + k + 8] = sp[nt][2];
        dst[(r + 1) * kSpStride + k + 8] = sp[nt][3];
      }
    } else {
      float sp[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sp[nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kStepsPerWarp; ++ks) {
        const int ch0 = dq * 18 + 2 * ks;  // chunk of dims k0 .. k0 + 7
#pragma unroll
        for (int np = 0; np < 2; ++np) {   // keys 16 np .. 16 np + 15
          const int s = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int ch = ch0 + ((lane >> 3) & 1);
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(kv + kv_chunk_off(s, ch), b0, b1, b2, b3);
          mma_bf16(sp[2 * np], qf[ks], b0, b1);
          mma_bf16(sp[2 * np + 1], qf[ks], b2, b3);
        }
      }
      float* dst = sm.sp + dq * (kBM * kSpStride);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        *reinterpret_cast<float2*>(dst + (mt * 16 + g) * kSpStride + nt * 8 + 2 * c) = make_float2(sp[nt][0], sp[nt][1]);
        *reinterpret_cast<float2*>(dst + (mt * 16 + g + 8) * kSpStride + nt * 8 + 2 * c) =
            make_float2(sp[nt][2], sp[nt][3]);
      }
    }
    DDT_PROF_LAP(5, tp);  // QK (warp 0's share)
    __syncthreads();  // (B) partial scores complete
    DDT_PROF_LAP(6, tp);

    // Online softmax: row sr, keys k0 + sk .. +3. Partials summed in a fixed order (dim quarters 0+1, 2+3). The
    // narrow paths: only the warps holding rows 0 .. 8 kNT - 1 (4 rows per warp), the rows their PV and epilogues
    // read; the other warps' rows lie past the item (S82).
    if (!kNarrow || warp < 2 * kNT) {
      float s[4];
      const float4 p0 = *reinterpret_cast<const float4*>(sm.sp + 0 * kBM * kSpStride + sr * kSpStride + sk);
      const float4 p1 = *reinterpret_cast<const float4*>(sm.sp + 1 * kBM * kSpStride + sr * kSpStride + sk);
      const float4 p2 = *reinterpret_cast<const float4*>(sm.sp + 2 * kBM * kSpStride + sr * kSpStride + sk);
      const float4 p3 = *reinterpret_cast<const float4*>(sm.sp + 3 * kBM * kSpStride + sr * kSpStride + sk);
      s[0] = (p0.x + p1.x) + (p2.x + p3.x);
      s[1] = (p0.y + p1.y) + (p2.y + p3.y);
      s[2] = (p0.z + p1.z) + (p2.z + p3.z);
      s[3] = (p0.w + p1.w) + (p2.w + p3.w);
      float mx = num::kNegInf;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = k0 + sk + e;
        const bool vis = s_valid && j < q.keys && visible(s_vis, q, j);
        s[e] = vis ? s[e] * scale_log2 : num::kNegInf;
        mx = fmaxf(mx, s[e]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 4));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == num::kNegInf ? 0.0f : m_new;  // no key yet: keep e^(-inf) = 0, not NaN
      const float alpha = exp2_ftz(m_run - m_use);
      float pe[4], sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pe[e] = exp2_ftz(s[e] - m_use);
        sum += pe[e];
      }
      l_run = l_run * alpha + sum;  // this thread's 4-key share; the row's 8 shares are added at the end
      m_run = m_new;
      // P = hi + lo, both bf16 (p - hi is exact in f32; kPBf16: hi alone).
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(pe[0], pe[1]);
      const __nv_bfloat162 h23 = __floats2bfloat162_rn(pe[2], pe[3]);
      uint2 hi;
      hi.x = *reinterpret_cast<const uint32_t*>(&h01);
      hi.y = *reinterpret_cast<const uint32_t*>(&h23);
      *reinterpret_cast<uint2*>(sm.p_hi + sr * kPStride + sk) = hi;
      if constexpr (!kPBf16) {
        const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
        const __nv_bfloat162 l01 = __floats2bfloat162_rn(pe[0] - f01.x, pe[1] - f01.y);
        const __nv_bfloat162 l23 = __floats2bfloat162_rn(pe[2] - f23.x, pe[3] - f23.y);
        uint2 lo;
        lo.x = *reinterpret_cast<const uint32_t*>(&l01);
        lo.y = *reinterpret_cast<const uint32_t*>(&l23);
        *reinterpret_cast<uint2*>(sm.p_lo + sr * kPStride + sk) = lo;
      }
      if ((tid & 7) == 0) sm.alpha[sr] = alpha;
    }
    DDT_PROF_LAP(7, tp);  // softmax
    __syncthreads();  // (C) P and the rescale factors complete
    DDT_PROF_LAP(8, tp);

    // O = alpha O + P_hi V + P_lo V for this warp's 64 dims (kPBf16: no P_lo term).
    if constexpr (kNarrow) {  // O^T = alpha O^T + V^T P_hi^T + V^T P_lo^T, the warp's dims as 4 m-tiles
      float al[kNT][2];  // rows 8 nt + 2 c, + 1
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        al[nt][0] = sm.alpha[nt * 8 + 2 * c];
        al[nt][1] = sm.alpha[nt * 8 + 2 * c + 1];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          acc[a][nt][0] *= al[nt][0];
          acc[a][nt][1] *= al[nt][1];
          acc[a][nt][2] *= al[nt][0];
          acc[a][nt][3] *= al[nt][1];
        }
      const uint32_t phi = smem_addr(sm.p_hi), plo = smem_addr(sm.p_lo);
#pragma unroll
      for (int ks = 0; ks < kBN / 16; ++ks) {
        // B = P^T: P's rows 8 nt + (0..7), keys 16 ks + (0..7) and (8..15): matrices (rows 0-7, keys 0-7), (rows 0-7,
        // keys 8-15), (rows 8-15, keys 0-7), (rows 8-15, keys 8-15)
        // (kNT 1: the first two matrices only, by .x2, whose addresses come from lanes 0-15)
        uint32_t ph[2 * kNT], pl[2 * kNT];
        {
          const int row = (lane & 7) + ((lane >> 4) << 3);
          const int col = ks * 16 + (((lane >> 3) & 1) << 3);
          const uint32_t off = uint32_t((row * kPStride + col) * 2);
          if constexpr (kNT == 2) {
            ldmatrix_x4(phi + off, ph[0], ph[1], ph[2], ph[3]);
            if constexpr (!kPBf16) ldmatrix_x4(plo + off, pl[0], pl[1], pl[2], pl[3]);
          } else {
            ldmatrix_x2(phi + off, ph[0], ph[1]);
            if constexpr (!kPBf16) ldmatrix_x2(plo + off, pl[0], pl[1]);
          }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {  // dims 64 warp + 16 a .. + 15
          // A = V^T by .trans: matrices (dims 0-7, keys 0-7), (dims 8-15, keys 0-7), (dims 0-7, keys 8-15), (dims
          // 8-15, keys 8-15) of the step
          const int s = ks * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int ch = warp * 8 + a * 2 + ((lane >> 3) & 1);
          uint32_t va[4];
          ldmatrix_x4_trans(kv + kv_chunk_off(s, ch), va[0], va[1], va[2], va[3]);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            mma_bf16(acc[a][nt], va, ph[2 * nt], ph[2 * nt + 1]);
            if constexpr (!kPBf16) mma_bf16(acc[a][nt], va, pl[2 * nt], pl[2 * nt + 1]);
          }
        }
      }
    } else {
      float al[2][2];
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        al[a][0] = sm.alpha[a * 16 + g];
        al[a][1] = sm.alpha[a * 16 + g + 8];
      }
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          acc[a][b][0] *= al[a][0];
          acc[a][b][1] *= al[a][0];
          acc[a][b][2] *= al[a][1];
          acc[a][b][3] *= al[a][1];
        }
      const uint32_t phi = smem_addr(sm.p_hi), plo = smem_addr(sm.p_lo);
#pragma unroll
      for (int ks = 0; ks < kBN / 16; ++ks) {
        uint32_t pa[2][4], pb[2][4];  // A fragments of P hi / P lo, m-tiles 0 and 1
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          const int row = a * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int col = ks * 16 + ((lane >> 4) << 3);
          const uint32_t off = uint32_t((row * kPStride + col) * 2);
          ldmatrix_x4(phi + off, pa[a][0], pa[a][1], pa[a][2], pa[a][3]);
          if constexpr (!kPBf16) ldmatrix_x4(plo + off, pb[a][0], pb[a][1], pb[a][2], pb[a][3]);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {  // dims 64 warp + 16 np .. + 15
          const int s = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int ch = warp * 8 + np * 2 + (lane >> 4);
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(kv + kv_chunk_off(s, ch), b0, b1, b2, b3);
#pragma unroll
          for (int a = 0; a < 2; ++a) {
            mma_bf16(acc[a][2 * np], pa[a], b0, b1);
            mma_bf16(acc[a][2 * np + 1], pa[a], b2, b3);
            if constexpr (!kPBf16) {
              mma_bf16(acc[a][2 * np], pb[a], b0, b1);
              mma_bf16(acc[a][2 * np + 1], pb[a], b2, b3);
            }
          }
        }
      }
    }
    DDT_PROF_LAP(11, tp);  // PV (warp 0's share)
  }

  // The row sum from its 8 threads' shares (a fixed butterfly order).
  l_run += __shfl_xor_sync(0xFFFFFFFFu, l_run, 1);
  l_run += __shfl_xor_sync(0xFFFFFFFFu, l_run, 2);
  l_run += __shfl_xor_sync(0xFFFFFFFFu, l_run, 4);

  // 3. Not split: normalise and store; lse = ln(2) m + ln(l) (m in log2 units); no visible key: 0 / -inf.
  //    Split: the unnormalised o and (m, l) of each row go to the workspace for the combine.
  if (is_split) {
    if ((tid & 7) == 0 && s_valid) {
      ws_ml[(prow0 + sr) * 2] = m_run;
      ws_ml[(prow0 + sr) * 2 + 1] = l_run;
    }
    if constexpr (kNarrow) {
      // The partial positions (partial_pos) of dims 16 k + g and 16 k + 8 + g are 16 k + 4 (g / 2) + (g & 1) and + 2:
      // lanes g and g ^ 1 (lane ^ 4, the same rows) swap one value, so even g writes the float2 at 16 k + 4 (g / 2)
      // and odd g the one at + 2 (whole 32-byte sectors). (Every lane shuffles; the row check comes after.)
      const bool odd = (g & 1) != 0;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // rows 8 nt + 2 c + e
          const int row = nt * 8 + 2 * c + e;
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            const float v0 = acc[a][nt][e], v1 = acc[a][nt][2 + e];  // dims 64 warp + 16 a + g, + 8
            const float other = __shfl_xor_sync(0xFFFFFFFFu, odd ? v0 : v1, 4);
            if (row < rows_here) {
              const int pos = (partial_pos(warp * 64 + a * 16 + g) & ~1) + (odd ? 2 : 0);
              *reinterpret_cast<float2*>(ws_o + (prow0 + row) * kDimV + pos) =
                  odd ? make_float2(other, v1) : make_float2(v0, other);
            }
          }
        }
    } else {
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = a * 16 + g + half * 8;
          if (row >= rows_here) continue;
          // (positions, not dims: the dims 16 k + 2 c (+ 1) and 16 k + 8 + 2 c (+ 1) of the warp's 64 are one
          // float4 at position 16 k + 4 c, partial_pos)
          float4* o = reinterpret_cast<float4*>(ws_o + (prow0 + row) * kDimV + warp * 64 + 4 * c);
#pragma unroll
          for (int k = 0; k < 4; ++k)
            o[4 * k] = make_float4(acc[a][2 * k][2 * half], acc[a][2 * k][2 * half + 1], acc[a][2 * k + 1][2 * half],
                                   acc[a][2 * k + 1][2 * half + 1]);
        }
    }
    DDT_PROF_LAP(12, tp);  // epilogue
    return;
  }
  if ((tid & 7) == 0) {
    // No visible key <=> l = 0 (a finite visible score gives l >= 1); a NaN score makes l NaN: out and lse
    // NaN (also when every visible score is NaN and m stayed -inf).
    const bool any = l_run != 0.0f;
    sm.inv_l[sr] = any ? 1.0f / l_run : 0.0f;
    if (s_valid) p.lse[row0 + tile_row0 + sr] = any ? __fmaf_rn(m_run, kLn2, logf(l_run)) : num::kNegInf;
  }
  __syncthreads();
  if constexpr (kNarrow) {  // O^T fragments: dims 64 warp + 16 a + g (+ 8), rows 8 nt + 2 c (+ 1)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = nt * 8 + 2 * c + e;
        if (row >= rows_here) continue;
        const float inv = sm.inv_l[row];
        uint16_t* o = p.out + (row0 + tile_row0 + row) * kDimV + warp * 64 + g;
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          o[16 * a] = uint16_t(num::f32_to_bf16(acc[a][nt][e] * inv));
          o[16 * a + 8] = uint16_t(num::f32_to_bf16(acc[a][nt][2 + e] * inv));
        }
      }
  } else {
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = a * 16 + g + half * 8;
        if (row >= rows_here) continue;
        const float inv = sm.inv_l[row];
        uint32_t* o = reinterpret_cast<uint32_t*>(p.out + (row0 + tile_row0 + row) * kDimV + warp * 64);
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          const uint32_t lo = num::f32_to_bf16(acc[a][b][2 * half] * inv);
          const uint32_t hi = num::f32_to_bf16(acc[a][b][2 * half + 1] * inv);
          o[b * 4 + c] = lo | (hi << 16);
        }
      }
  }
  DDT_PROF_LAP(12, tp);  // epilogue
}

// ws_o [partial rows][512] f32, ws_ml [partial rows][2] f32 (m in log2 units, l): the caller's workspace.
// kMode, which paths the kernel holds (the bits of a row do not depend on it: the paths are bitwise equal,
// PortableNarrowPathEqualsWidePathBitwise, so the launcher may pick any per call):
//  - kWideOnly: every item on the wide path (tree batches).
//  - kNarrow16: requests of at most 16 rows take the narrow path (process_item<1> / <2>), the others the wide one.
//    Not the wide kernel for all: the narrow paths inlined beside the wide one raise the kernel to 255 registers and
//    40 B of stack, and the wide path then runs 3-4% slower (S39, measured).
//  - kNarrow8: every item on the 8-row narrow path (process_item<1> over items of 8-row tiles: a request of more rows
//    is several items), at 128 registers, so that two CTAs share an SM where shared memory allows (sm_90, sm_100) and hide
//    each other's barriers (docs/PERF_NOTES.md S81; S40: the 16-row path spills its Q^T at 128 registers).
// probe: each narrow item sets DDT_DATA_PROBE_NARROW (DDTREE_PORTABLE_NARROW=probe / probe8: the tests' evidence).
// kPBf16: p_precision DDT_ATTN_P_BF16 (P as one bf16, one PV product), else the default hi + lo.
enum PortableMode : int { kWideOnly = 0, kNarrow16 = 1, kNarrow8 = 2 };
template <int kMode, bool kPBf16>
__global__ void __launch_bounds__(kThreads, kMode == kNarrow8 ? 2 : 1)
    verify_attn_portable_kernel(ddt_verify_attn_params p, int split_keys, float* ws_o, float* ws_ml, int probe) {
  pdl_launch_dependents();  // the combine (launched with PDL) may start its scan now; it waits for this grid
  extern __shared__ __align__(128) unsigned char smem[];
  Smem sm;
  sm.kv = smem;
  sm.sp = reinterpret_cast<float*>(smem + kSmemKv);
  sm.p_hi = reinterpret_cast<uint16_t*>(smem + kSmemKv + kSmemSp);
  sm.p_lo = sm.p_hi + kBM * kPStride;
  sm.alpha = reinterpret_cast<float*>(smem + kSmemKv + kSmemSp + kSmemP);
  sm.inv_l = sm.alpha + kBM;
  constexpr int kItemRows = kMode == kNarrow8 ? kNarrowN : kBM;
  run_flash_items<kItemRows>(p, split_keys, reinterpret_cast<int*>(sm.sp), [&](const Item& item, const PlanItem*) {
    const Request q = make_request(p, item.r);
    if constexpr (kMode == kNarrow8) {
      process_item<1, kPBf16, kNarrowN>(p, split_keys, item, q, sm, ws_o, ws_ml);
      if (probe && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_PROBE_NARROW);
    } else if constexpr (kMode == kNarrow16) {
      // The path from the request's row count alone (batch invariant; a request of a bad shape is poisoned the
      // same way on every path).
      const int64_t n_rows = int64_t(q.nodes) * p.heads;
      if (n_rows <= kNarrowN) process_item<1, kPBf16>(p, split_keys, item, q, sm, ws_o, ws_ml);
      else if (n_rows <= kNarrowRows) process_item<2, kPBf16>(p, split_keys, item, q, sm, ws_o, ws_ml);
      else process_item<0, kPBf16>(p, split_keys, item, q, sm, ws_o, ws_ml);
      if (n_rows <= kNarrowRows && probe && threadIdx.x == 0) atomicOr(p.status, DDT_DATA_PROBE_NARROW);
    } else {
      process_item<0, kPBf16>(p, split_keys, item, q, sm, ws_o, ws_ml);
    }
  });
}

// Per device, once: the dynamic shared-memory opt-in and the grid sizes that keep every CTA resident: main_ctas of
// the wide-only and narrow-16 kernels (the smallest of the four), narrow8_ctas of the two narrow-8 ones (the smaller).
FlashDeviceInfo device_info() {
  return cached_device_info([](int dev) {
    auto grids = [dev](auto kernel) { return resident_grids(kernel, kThreads, kSmemBytes, dev); };
    FlashDeviceInfo info = grids(verify_attn_portable_kernel<kWideOnly, false>);
    for (const FlashDeviceInfo other : {grids(verify_attn_portable_kernel<kNarrow16, false>),
                                        grids(verify_attn_portable_kernel<kWideOnly, true>),
                                        grids(verify_attn_portable_kernel<kNarrow16, true>)}) {
      if (other.state != 1) return other;
      info.main_ctas = std::min(info.main_ctas, other.main_ctas);
    }
    for (const FlashDeviceInfo other : {grids(verify_attn_portable_kernel<kNarrow8, false>),
                                        grids(verify_attn_portable_kernel<kNarrow8, true>)}) {
      if (other.state != 1) return other;
      info.narrow8_ctas = info.narrow8_ctas == 0 ? other.main_ctas : std::min(info.narrow8_ctas, other.main_ctas);
    }
    return info;
  });
}

}  // namespace
}  // namespace ddtree::kern::attn

extern "C" int ddt_verify_attn_portable_cuda(const ddt_verify_attn_params* p, int split_keys, void* workspace,
                                             size_t workspace_bytes, void* stream) {
  using namespace ddtree::kern;
  if (int rc = attn::check_flash_call(p, split_keys, workspace, workspace_bytes, "verify_attn_portable")) return rc;
  if (p->total_nodes == 0) return DDT_OK;  // no row to write (batch > 0 then needs off[batch] = 0 anyway)
  const attn::FlashDeviceInfo dev = attn::device_info();
  if (dev.state != 1)
    return fail(DDT_ERR_CUDA, "verify_attn_portable: cannot opt in to 97 KB of dynamic shared memory or query "
                              "occupancy (a GPU or build without this kernel's architecture?)");
  const attn::Bounds b = attn::capacity_bounds(*p, split_keys);
  float* ws_o = static_cast<float*>(workspace);
  float* ws_ml = ws_o + b.partial_rows * attn::kDimV;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The kernel (PortableMode): decode-like batches (the average request of at most 16 rows: heads x total_nodes <= 16
  // x batch; total_nodes is the rows' capacity, so padding rows count: a decode batch captured with much padding takes
  // the wide kernel, 1.2x slower at T 1, never wrong) take a kernel with the narrow path: the narrow-8 one for at most
  // 8 rows on average where it gets more resident CTAs than the others (two per SM: sm_90, sm_100), else the
  // narrow-16 one; tree batches the wide one. DDTREE_PORTABLE_NARROW forces one: 0 the wide kernel, 1 the narrow-16
  // one, 8 the narrow-8 one; probe / probe8 the narrow-16 / narrow-8 one with DDT_DATA_PROBE_NARROW marked (read
  // per call: the tests compare the kernels; a captured CUDA graph keeps the value of its capture).
  const char* narrow_env = std::getenv("DDTREE_PORTABLE_NARROW");
  const std::string forced = narrow_env ? narrow_env : "";
  const bool probe = forced == "probe" || forced == "probe8";
  const int64_t rows = int64_t(p->heads) * p->total_nodes;
  int mode = attn::kWideOnly;
  if (forced == "1" || forced == "probe") mode = attn::kNarrow16;
  else if (forced == "8" || forced == "probe8") mode = attn::kNarrow8;
  else if (forced != "0" && rows <= attn::kNarrowN * int64_t(p->batch) && dev.narrow8_ctas > dev.main_ctas)
    mode = attn::kNarrow8;
  else if (forced != "0" && rows <= attn::kNarrowRows * int64_t(p->batch)) mode = attn::kNarrow16;
  // Persistent grid: the resident CTAs (fewer when the item bound is smaller); each takes its items in rounds.
  const int64_t items = mode == attn::kNarrow8 ? attn::capacity_bounds(*p, split_keys, attn::kNarrowN).items : b.items;
  int64_t grid = std::min<int64_t>(items, mode == attn::kNarrow8 ? dev.narrow8_ctas : dev.main_ctas);
  if (grid < 1) grid = 1;  // padding rows only
  const bool p_bf16 = p->p_precision == DDT_ATTN_P_BF16;  // (validate() admitted only the two DDT_ATTN_P_ values)
  using attn::verify_attn_portable_kernel;
  auto* kernel = mode == attn::kNarrow8  ? (p_bf16 ? verify_attn_portable_kernel<attn::kNarrow8, true>
                                                   : verify_attn_portable_kernel<attn::kNarrow8, false>)
                 : mode == attn::kNarrow16 ? (p_bf16 ? verify_attn_portable_kernel<attn::kNarrow16, true>
                                                     : verify_attn_portable_kernel<attn::kNarrow16, false>)
                                           : (p_bf16 ? verify_attn_portable_kernel<attn::kWideOnly, true>
                                                     : verify_attn_portable_kernel<attn::kWideOnly, false>);
  kernel<<<unsigned(grid), attn::kThreads, attn::kSmemBytes, s>>>(*p, split_keys, ws_o, ws_ml, probe ? 1 : 0);
  DDT_CUDA_LAUNCHED();
  return attn::launch_combine(*p, split_keys, b, dev, ws_o, ws_ml, s);
}
