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

// ---- KV split policy (a function of one request's keys and rows: batch invariant) ----
// A partial row costs 2 KB of f32 o + 8 B (m, l), written and read back: ~4.1 KB, i.e. ~3.6 cache rows of
// 1152 B; keys >= 14 x (rows x splits) keeps the partial traffic <= ~26% of the request's KV bytes.
constexpr int kKeysPerPartialRow = 14;
constexpr int kMinSplitKeyTiles = 8;      // a split streams >= ~8 key tiles (256 keys): Q reload, pipeline fill
constexpr int kMaxItemsPerRequest = 264;  // 2 x 132 SMs (H200): enough CTAs for one request to fill the GPU
constexpr int kMaxItemsPerCta = 16;       // a persistent CTA owns at most this many items (grid >= items / 16)
constexpr int kCombineRowsPerItem = 1;    // combine: one CTA per row

struct SplitPlan {
  int row_tiles;            // ceil(rows / 32)
  int splits;               // key ranges (1: no split, the item writes out / lse itself)
  int64_t tiles_per_split;  // key tiles per range (the last may be shorter)
};

// keys = P + N of a request whose scalars are valid (0 for an invalid one: one item per row tile, no
// split), rows = N x H.
DDT_HD SplitPlan split_plan(int64_t keys, int64_t rows) {
  SplitPlan s;
  s.row_tiles = int((rows + kRowTile - 1) / kRowTile);
  s.splits = 1;
  const int64_t ktiles = (keys + kKeyTile - 1) / kKeyTile;
  s.tiles_per_split = ktiles > 0 ? ktiles : 1;
  if (rows <= 0 || ktiles <= 0) return s;
  int64_t n = keys / (int64_t(kKeysPerPartialRow) * rows);               // partial traffic bound
  const int64_t by_len = (ktiles + kMinSplitKeyTiles - 1) / kMinSplitKeyTiles;  // splits long enough
  const int64_t by_fill = (kMaxItemsPerRequest + s.row_tiles - 1) / s.row_tiles;  // items per request
  n = n < by_len ? n : by_len;
  n = n < by_fill ? n : by_fill;
  if (n <= 1) return s;
  s.tiles_per_split = (ktiles + n - 1) / n;
  s.splits = int((ktiles + s.tiles_per_split - 1) / s.tiles_per_split);  // <= n: rows x splits <= keys / 14
  return s;
}

// Upper bounds over every device-data instance with these host-known capacities (max_keys = max_pages x
// page_size bounds a valid request's P + N): work items of the main kernel and partial rows of the workspace.
struct Bounds {
  int64_t items, partial_rows, combine_items;
};
inline Bounds capacity_bounds(const ddt_verify_attn_params& p) {
  const int64_t max_keys = int64_t(p.max_pages) * p.page_size;
  const int64_t ktiles = (max_keys + kKeyTile - 1) / kKeyTile;
  int64_t smax = std::min<int64_t>({kMaxItemsPerRequest, (ktiles + kMinSplitKeyTiles - 1) / kMinSplitKeyTiles,
                                    max_keys / kKeysPerPartialRow});
  if (smax < 1) smax = 1;
  const int64_t rows = int64_t(p.total_nodes) * p.heads;
  // sum_r ceil(N_r H / 32) <= total_nodes H / 32 + batch; per request row_tiles x splits <= row_tiles x
  // smax and <= row_tiles x ceil(264 / row_tiles) <= 263 + row_tiles.
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile + p.batch;
  Bounds b;
  b.items = std::min(tiles * smax, int64_t(kMaxItemsPerRequest - 1) * p.batch + tiles);
  // Split requests: rows x splits <= keys / 14 <= max_keys / 14 each, and <= rows x smax in all.
  b.partial_rows = smax > 1 ? std::min(int64_t(p.batch) * (max_keys / kKeysPerPartialRow), rows * smax) : 0;
  b.combine_items = b.partial_rows > 0 ? (rows + kCombineRowsPerItem - 1) / kCombineRowsPerItem + p.batch : 0;
  return b;
}
constexpr int64_t kPartialRowBytes = int64_t(DDT_ATTN_DIM_V + 2) * 4;  // f32 o[512] + (m, l)


}  // namespace ddtree::kern::attn
