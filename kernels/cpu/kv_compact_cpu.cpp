// CPU twin of the accepted-path KV compaction (kernels/cuda/kv_compact.cu; ddtree/kernels.h, section 5): per
// request the moves one by one in increasing k (reference/ddtree.md: a destination P + k is never the source of a
// later move, whose node path[j] > path[k] >= k), every layer; or, with remap, the page-table swaps in the same order.
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/common/kv_compact.h"
#include "kernels/common/validate.h"

using namespace ddtree;

extern "C" int ddt_kv_compact_cpu(const ddt_kv_compact_params* p) {
  if (int rc = kern::validate(p)) return rc;
  unsigned char* kv = static_cast<unsigned char*>(p->kv);
  kern::KvMove moves[kern::kMaxKvMoves];
  for (int r = 0; r < p->batch; ++r) {
    const int n = kern::kv_compact_moves(p, r, moves);
    if (n < 0) {
      *p->status |= DDT_DATA_BAD_INDEX;
      continue;
    }
    if (p->remap) {
      for (int i = 0; i < n; ++i) std::swap(p->page_table[moves[i].dst_entry], p->page_table[moves[i].src_entry]);
      continue;
    }
    for (int layer = 0; layer < p->num_layers; ++layer) {
      unsigned char* base = kv + int64_t(layer) * p->layer_stride;
      for (int i = 0; i < n; ++i) std::memcpy(base + moves[i].dst, base + moves[i].src, size_t(p->row_bytes));
    }
  }
  return DDT_OK;
}
