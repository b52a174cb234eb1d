// Tree-verify attention, the portable flash kernel's work split (ddtree/kernels.h, section 4): how a request's
// rows and keys are cut into work items, and the host-side bounds that size the grid and the workspace from
// capacities. A plain header (host and device) so the CPU build answers ddt_verify_attn_portable_workspace
// with the same number and the unit tests check the bounds against the per-request plans.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "ddtree/kernels.h"
#include "kernels/common/numerics.h"

namespace ddtree::kern::attn {

constexpr int kRowTile = 32;  // query rows (node x head, flattened) per work item
constexpr int kKeyTile = 32;  // key slots per KV tile (splits are whole tiles at absolute positions)

// ---- KV split: fixed absolute positions ----
// The caller chooses split_keys (0: never split; else a positive multiple of kKeyTile): a request whose P + N
// exceeds it is cut at the absolute positions split_keys, 2 split_keys, ... and its partials are combined in a
// fixed order. The plan depends on split_keys and on the request's own keys only where it must (the number
// of splits), so (a) a row's arithmetic does not depend on the rest of the batch (batch invariance), and
// (b) a chain node i of a tree at prefix P and the single-node decode at prefix P + i see the same splits
// over their common keys; the chain's extra (masked) keys and splits add exact zeros, so the two agree
// bitwise (FIDELITY rule E on cuda). One split_keys per deployment: a small value (e.g. 512) fills the GPU
// for batch 1 at long contexts; 0 suits large batches (no partial traffic, no workspace).
constexpr int kMaxItemsPerCta = 16;       // a persistent CTA lists its items 16 at a time (rounds)
constexpr int kCombineMaxSlices = 16;     // combine, CTA schedule: at most 16 items (dim slices) per row
constexpr int kCombineSliceKinds = 5;     // its instantiations: 1, 2, 4, 8, 16 slices
constexpr int kCombineDeepSplits = 32;    // combine: 8 and 16 slices only for requests of more splits than this
constexpr int kCombineFewSplits = 8;      // combine, requests of at most this many splits: a warp per row

struct SplitPlan {
  int row_tiles;            // ceil(rows / row_tile)
  int splits;               // key ranges (1: no split, the item writes out / lse itself)
  int64_t tiles_per_split;  // key tiles per range (the last may be shorter)
};

// keys = P + N of a request whose scalars are valid (0 for an invalid one: one item per row tile, no
// split), rows = N x H, split_keys as above (validated by the launcher); row_tile: the kernel's rows per item
// (the portable kernel's 32, its narrow-8 instantiation's 8, the sm_90a kernel's 64; the splits do not depend on it).
DDT_HD SplitPlan split_plan(int64_t keys, int64_t rows, int split_keys, int row_tile = kRowTile) {
  SplitPlan s;
  s.row_tiles = int((rows + row_tile - 1) / row_tile);
  s.splits = 1;
  const int64_t ktiles = (keys + kKeyTile - 1) / kKeyTile;
  s.tiles_per_split = ktiles > 0 ? ktiles : 1;
  if (rows <= 0 || split_keys <= 0 || keys <= split_keys) return s;
  s.tiles_per_split = split_keys / kKeyTile;
  s.splits = int((ktiles + s.tiles_per_split - 1) / s.tiles_per_split);
  return s;
}

// Scan order of the flash kernels' items (kernels/cuda/verify_attn_sched.cuh, MainCounts): a request of at most
// kLastSplitLastRows rows (T x H <= 128) and at most kLastSplitLastSplits splits lists its last split after every
// request's other items; any other keeps its splits together, request-major. The last split is the short one:
// listed among the full ones, item b % grid gave some CTAs a full item more than others (2k T 1 b 64: 24 key
// tiles against a mean of 16). A request of many row tiles keeps them together instead: its items already mix,
// and a split moved away re-reads the request's Q (rows x 1,152 B) from DRAM; measured 3-6% slower at 512-8k
// T >= 32 (docs/PERF_NOTES.md S32). A request of many splits (P + N > 16k at split_keys 512) has enough items for
// b % grid to balance by itself, and moving its last split measured 1.5-2% slower at 32k b 32 (S33, S34); the
// bound counts splits, so at another split_keys it sits at other lengths (measured at 512 only).
// A request of one split (P + N <= split_keys, or split_keys 0) is all last split: with split_keys 0 the
// requests of more than 128 rows come first, then the others (a longest-first order; not measured).
constexpr int64_t kLastSplitLastRows = 128;
constexpr int kLastSplitLastSplits = 32;
DDT_HD bool last_split_listed_last(int64_t rows, int splits) {
  return rows <= kLastSplitLastRows && splits <= kLastSplitLastSplits;
}

// Upper bounds over every device-data instance with these host-known capacities (max_keys bounds a valid
// request's P + N): work items of the main kernel (of row_tile rows each), partial rows of the workspace, combine items.
struct Bounds {
  int64_t items, partial_rows, combine_items;
};
inline Bounds capacity_bounds(const ddt_verify_attn_params& p, int split_keys, int row_tile = kRowTile) {
  // A valid request has P + N <= max_pages x page_size and P < 2^31, N <= total_nodes (also keeps the
  // products below in int64 whatever the capacities).
  const int64_t max_keys = std::min<int64_t>(int64_t(p.max_pages) * p.page_size, int64_t(INT32_MAX) + p.total_nodes);
  const int64_t smax = split_keys > 0 && max_keys > split_keys ? (max_keys + split_keys - 1) / split_keys : 1;
  const int64_t rows = int64_t(p.total_nodes) * p.heads;
  // sum_r ceil(N_r H / row_tile) <= total_nodes H / row_tile + batch; each request has at most smax splits.
  const int64_t tiles = (rows + row_tile - 1) / row_tile + p.batch;
  Bounds b;
  b.items = tiles * smax;
  b.partial_rows = smax > 1 ? rows * smax : 0;  // sum_r N_r H x splits_r over split requests
  // Combine items: at most kCombineMaxSlices per row of a split request (the CTA schedule; a warp per row: fewer).
  b.combine_items = b.partial_rows > 0 ? rows * kCombineMaxSlices : 0;
  return b;
}
constexpr int64_t kPartialRowBytes = int64_t(DDT_ATTN_DIM_V + 2) * 4;  // f32 o[512] + (m, l)
// A split partial's o (a workspace row of 512 f32, read only by the combine) lies in a permuted order inside every
// aligned block of 16 dims: dim 16 k + 8 h + 2 c + e at position 16 k + 4 c + 2 h + e. An mma / wgmma accumulator
// thread holds dims 2 c, 2 c + 1 of adjacent 8-dim blocks (h = 0, 1), so its 4 values of a 16-dim block are one
// 16-byte store at position 16 k + 4 c (docs/PERF_NOTES.md S37). Two positions 2 t, 2 t + 1 hold two adjacent dims.
DDT_HD constexpr int partial_pos(int dim) { return (dim & ~15) | ((dim & 6) << 1) | ((dim & 8) >> 2) | (dim & 1); }
DDT_HD constexpr int partial_dim(int pos) { return (pos & ~15) | ((pos & 12) >> 1) | ((pos & 2) << 2) | (pos & 1); }

// ---- the sm_90a kernel's per-step plan (ddt_verify_attn_sm90_plan_cuda) ----
// Device memory: a PlanHeader, then PlanItem[capacity] in the order the main kernel's scan would produce them
// (item b goes to CTA b % grid, as in the scan). Made once per speculative step: it depends on batch, heads,
// split_keys, the capacities and the contents of node_offsets, prefix_lens and page_table, not on q, kv_cache,
// vis, softmax_scale or the outputs. The header repeats the scalars it was made for, so a planned call with
// other scalars is caught on the device (every row poisoned, DDT_DATA_BAD_PLAN).
constexpr int32_t kPlanMagic = 0x4E4C5044;  // "DPLN"
struct PlanHeader {
  int32_t magic;        // kPlanMagic once the plan kernel has written it
  int32_t batch, heads, split_keys, total_nodes, page_size, max_pages, vis_words;
  int32_t items;        // items listed (<= the capacity the plan buffer holds)
  int32_t offsets_bad;  // 1: node_offsets is malformed (the call poisons every row, DDT_DATA_BAD_INDEX)
  int32_t rows_end;     // node_offsets[batch]: rows from here to total_nodes are padding
  int32_t pad;
  int64_t num_pages;
  int64_t pad2;
};
static_assert(sizeof(PlanHeader) == 64, "64-byte header: items start 16-byte aligned");
struct alignas(16) PlanItem {  // (16-byte aligned: two vector loads per record)
  int32_t r, local, partial_base;  // the scan's Item
  int32_t bad;                     // the request's shape or a page of the item's key range is bad
  int32_t first_row, nodes, prefix;  // node_offsets[r], N_r, P_r
  int32_t first_page;              // physical page of the item's first key (bad items, empty ranges: 0)
};
static_assert(sizeof(PlanItem) == 32, "32-byte plan items");
// The plan buffer for these capacities: room for every item the sm_90a kernel can have (the 32-row bound
// covers its 64-row items).
inline int64_t plan_bytes(const Bounds& b) { return int64_t(sizeof(PlanHeader)) + b.items * int64_t(sizeof(PlanItem)); }
// The header of a plan made for p and split_keys (the plan kernel's and its CPU twin's): `items` listed;
// offsets_ok: node_offsets well formed (else nothing is listed and rows_end is 0).
DDT_HD PlanHeader plan_header(const ddt_verify_attn_params& p, int split_keys, int32_t items, bool offsets_ok) {
  PlanHeader h{};
  h.magic = kPlanMagic;
  h.batch = p.batch;
  h.heads = p.heads;
  h.split_keys = split_keys;
  h.total_nodes = p.total_nodes;
  h.page_size = p.page_size;
  h.max_pages = p.max_pages;
  h.vis_words = p.vis_words;
  h.items = items;
  h.offsets_bad = offsets_ok ? 0 : 1;
  h.rows_end = offsets_ok && p.batch > 0 ? p.node_offsets[p.batch] : 0;
  h.num_pages = p.num_pages;
  return h;
}
// A plan argument of the entry points (who: the name for the message): non-null, 16-byte aligned, at least
// ddt_verify_attn_sm90_plan_bytes; *capacity = the items it holds. DDT_OK or the error, its message recorded.
int check_plan(const ddt_verify_attn_params* p, int split_keys, const void* plan, size_t plan_bytes, const char* who,
               int64_t* capacity);


}  // namespace ddtree::kern::attn
