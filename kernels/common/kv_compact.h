// Accepted-path KV compaction (ddtree/kernels.h, section 5), the parts shared by the CPU twin and the CUDA
// kernel: a request's data check and the list of its row moves, one definition for both.
#pragma once

#include <stdint.h>

#include "ddtree/kernels.h"
#include "kernels/common/numerics.h"

namespace ddtree::kern {

// One row move of a request: byte offsets inside a layer's cache ([num_pages, page_size, row_bytes]) and the
// page-table entries (for remap) of the source slot P + path[k] and the destination slot P + k.
struct KvMove {
  int64_t src, dst;          // byte offsets in a layer
  int64_t src_entry, dst_entry;  // indices into page_table
};
constexpr int kMaxKvMoves = DDT_MAX_DEPTH;  // path_len <= max_path <= DDT_MAX_DEPTH + 1, the root never moves

// Checks request r's path and pages and lists its moves (path[k] != k, in increasing k) into moves[]. Returns
// the number of moves (0 .. kMaxKvMoves) or -1 when the request fails a data check (ddtree/kernels.h: nothing of
// it may then be written).
DDT_HD int kv_compact_moves(const ddt_kv_compact_params* p, int r, KvMove* moves) {
  const int len = p->path_len[r];
  if (len < 1 || len > p->max_path) return -1;
  const int32_t* path = p->path + int64_t(r) * p->max_path;
  if (path[0] != 0) return -1;
  for (int k = 1; k < len; ++k)
    if (path[k] <= path[k - 1]) return -1;
  const int64_t P = p->prefix_lens[r];
  if (P < 0 || P + path[len - 1] >= int64_t(p->max_pages) * p->page_size) return -1;
  const int64_t row0 = int64_t(r) * p->max_pages;
  const uint32_t ps = uint32_t(p->page_size);
  int n = 0;
  for (int k = 1; k < len; ++k) {
    if (path[k] == k) continue;
    // (slots as u32: P and path[k] are non-negative int32 here, so their sum is below 2^32, and a 32-bit division
    // is a few instructions on the GPU where a 64-bit one is a long software routine)
    const uint32_t s = uint32_t(P) + uint32_t(path[k]), d = uint32_t(P) + uint32_t(k);
    const int64_t se = row0 + s / ps, de = row0 + d / ps;
    const int64_t sp = p->page_table[se], dp = p->page_table[de];
    if (sp < 0 || sp >= p->num_pages || dp < 0 || dp >= p->num_pages) return -1;
    moves[n].src = (sp * ps + s % ps) * p->row_bytes;
    moves[n].dst = (dp * ps + d % ps) * p->row_bytes;
    moves[n].src_entry = se;
    moves[n].dst_entry = de;
    ++n;
  }
  return n;
}

}  // namespace ddtree::kern
