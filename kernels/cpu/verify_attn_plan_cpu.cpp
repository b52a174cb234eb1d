// CPU twin of the sm_90a kernel's per-step plan (ddt_verify_attn_sm90_plan_cuda, kernels/cuda/verify_attn_sm90.cu;
// layout in kernels/common/verify_attn_split.h): the same header and item records, byte for byte, from a plain
// walk over the requests in order, twice: first every request's leading items (all of a request of more than 128
// rows or more than 32 splits, the splits 0 .. splits - 2 of the others), then the last split of those others
// (last_split_listed_last, kernels/common/verify_attn_split.h). Item b of the plan is the b-th item of that walk:
// request r's items local = split x row_tiles + row tile, 64-row tiles, each with the request's first workspace
// row (the partial rows of the split requests before it), the page check over its key range and the physical
// page of its first key.
#include <cstdint>

#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_index.h"
#include "kernels/common/verify_attn_split.h"

using namespace ddtree;
using namespace ddtree::kern::attn;

extern "C" int ddt_verify_attn_sm90_plan_cpu(const ddt_verify_attn_params* p, int split_keys, void* plan,
                                             size_t plan_bytes) {
  if (int rc = kern::validate(p)) return rc;
  int64_t capacity = 0;
  if (int rc = check_plan(p, split_keys, plan, plan_bytes, "verify_attn_sm90_plan_cpu", &capacity)) return rc;
  constexpr int kRows = 64;  // the sm_90a kernel's rows per item
  auto* items = reinterpret_cast<PlanItem*>(static_cast<PlanHeader*>(plan) + 1);
  bool offsets_ok = true;
  for (int r = 0; r <= p->batch; ++r) offsets_ok = offsets_ok && offsets_entry_ok(*p, r);
  int64_t b = 0;
  for (int last = 0; offsets_ok && last < 2; ++last) {  // the leading splits' items, then the last splits'
    int64_t partial_base = 0;
    for (int r = 0; r < p->batch; ++r) {
      const Request q = make_request(*p, r);
      const int64_t rows = int64_t(q.nodes) * p->heads;
      const bool shape_ok = request_shape_ok(*p, q);
      const SplitPlan sp = split_plan(shape_ok ? q.keys : 0, rows, split_keys, kRows);
      const int leading = last_split_listed_last(rows, sp.splits) ? sp.splits - 1 : sp.splits;  // splits listed first
      for (int split = last ? leading : 0; split < (last ? sp.splits : leading); ++split)
        for (int t = 0; t < sp.row_tiles; ++t, ++b) {
          const int64_t kb = sp.splits > 1 ? int64_t(split) * split_keys : 0;
          const int64_t ke = sp.splits > 1 ? std::min<int64_t>(q.keys, kb + split_keys) : q.keys;
          bool bad = !shape_ok;
          for (int64_t k = kb / p->page_size; !bad && ke > kb && k < (ke + p->page_size - 1) / p->page_size; ++k)
            bad = !page_ok(*p, q, k);
          if (b >= capacity) continue;  // (cannot happen for a plan sized by ddt_verify_attn_sm90_plan_bytes)
          PlanItem& rec = items[b];
          rec.r = r;
          rec.local = split * sp.row_tiles + t;
          rec.partial_base = int32_t(partial_base);
          rec.bad = bad ? 1 : 0;
          rec.first_row = q.first_row;
          rec.nodes = q.nodes;
          rec.prefix = int32_t(q.prefix);
          rec.first_page = !bad && ke > kb ? int32_t(page_entry(*p, q, kb / p->page_size)) : 0;
        }
      if (sp.splits > 1) partial_base += rows * sp.splits;
    }
  }
  *static_cast<PlanHeader*>(plan) = plan_header(*p, split_keys, int32_t(b), offsets_ok);
  return DDT_OK;
}
