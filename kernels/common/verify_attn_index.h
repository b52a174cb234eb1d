// Tree-verify attention (ddtree/kernels.h, section 4): which request a query row belongs to, whether the
// request's device-side data is well formed, key visibility and where a key slot lives in the paged cache.
// One definition for the CPU twin and every CUDA kernel of the family (host and device), so both agree on
// which rows are computed, padded (0 / -inf) or poisoned (NaN + DDT_DATA_BAD_INDEX).
#pragma once

#include <stdint.h>

#include "ddtree/kernels.h"
#include "kernels/common/numerics.h"

namespace ddtree::kern::attn {

constexpr int kDimQK = DDT_ATTN_DIM_QK;  // 576
constexpr int kDimV = DDT_ATTN_DIM_V;    // 512
constexpr int kDimRope = kDimQK - kDimV; // 64

// One entry of the node_offsets check, r in [0, batch]: off[0] == 0, non-decreasing, off[batch] <=
// total_nodes. A kernel may spread the entries over its threads and OR the failures. Any failure poisons
// every row of the call.
DDT_HD bool offsets_entry_ok(const ddt_verify_attn_params& p, int r) {
  const int32_t* off = p.node_offsets;
  if (r == 0) return off[0] == 0;  // (with batch 0 that is all: 0 <= total_nodes)
  bool ok = off[r - 1] <= off[r];
  if (r == p.batch) ok = ok && off[r] <= p.total_nodes;
  return ok;
}

// The request that owns `row`, for well-formed offsets and 0 <= row < off[batch] (so batch >= 1): the
// last r with off[r] <= row (empty requests own nothing). O(log batch).
DDT_HD int owner_request(const ddt_verify_attn_params& p, int row) {
  int lo = 0, hi = p.batch;  // off[lo] <= row < off[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (p.node_offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// A request's geometry from its scalars (the page indices are checked separately, page by page).
struct Request {
  int r;
  int first_row;   // node_offsets[r]
  int nodes;       // N_r
  int64_t prefix;  // P_r
  int64_t keys;    // P_r + N_r: slots 0 .. keys-1 exist
  int64_t pages;   // ceil(keys / page_size): page-table entries the request needs
};

// Request r from its rows and prefix (make_request's reads, or the sm_90a plan's copies of them).
DDT_HD Request request_of(const ddt_verify_attn_params& p, int r, int first_row, int nodes, int64_t prefix) {
  Request q;
  q.r = r;
  q.first_row = first_row;
  q.nodes = nodes;
  q.prefix = prefix;
  q.keys = q.prefix + q.nodes;
  q.pages = q.keys > 0 ? (q.keys + p.page_size - 1) / p.page_size : 0;
  return q;
}
DDT_HD Request make_request(const ddt_verify_attn_params& p, int r) {
  const int first_row = p.node_offsets[r];
  return request_of(p, r, first_row, p.node_offsets[r + 1] - first_row, p.prefix_lens[r]);
}

// Scalar checks: P >= 0, N <= 64 W, P + N <= max_pages * page_size (so every needed page-table entry
// lies in the request's row of the table).
DDT_HD bool request_shape_ok(const ddt_verify_attn_params& p, const Request& q) {
  return q.prefix >= 0 && int64_t(q.nodes) <= int64_t(64) * p.vis_words &&
         q.keys <= int64_t(p.max_pages) * p.page_size;
}

// Page-table entry k (< q.pages) of a shape-checked request: the physical page, unchecked.
DDT_HD int64_t page_entry(const ddt_verify_attn_params& p, const Request& q, int64_t k) {
  return p.page_table[int64_t(q.r) * p.max_pages + k];
}
DDT_HD bool page_ok(const ddt_verify_attn_params& p, const Request& q, int64_t k) {
  const int64_t page = page_entry(p, q, k);
  return page >= 0 && page < p.num_pages;
}

// Is key slot j (< q.keys) visible to the row whose vis words are `vis_row`?
DDT_HD bool visible(const uint64_t* vis_row, const Request& q, int64_t j) {
  if (j < q.prefix) return true;
  const int64_t b = j - q.prefix;  // tree node index, < N <= 64 W
  return (vis_row[b >> 6] >> (b & 63)) & 1u;
}

// Element offset of key slot j's 576-value row in kv_cache (request fully checked).
DDT_HD int64_t kv_row_offset(const ddt_verify_attn_params& p, const Request& q, int64_t j) {
  int64_t lpage, off;
  if (j <= 0x7FFFFFFF) {  // 32-bit division (a 64-bit one is a long software routine on the GPU)
    lpage = uint32_t(j) / uint32_t(p.page_size);
    off = uint32_t(j) - uint32_t(lpage) * uint32_t(p.page_size);
  } else {
    lpage = j / p.page_size;
    off = j % p.page_size;
  }
  return (page_entry(p, q, lpage) * p.page_size + off) * kDimQK;
}

}  // namespace ddtree::kern::attn
