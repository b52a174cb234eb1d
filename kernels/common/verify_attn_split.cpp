// ddt_verify_attn_portable_workspace and ddt_verify_attn_sm90_plan_bytes (ddtree/kernels.h, section 4): host-only,
// the same answers with or without the cuda backend (the bounds of kernels/common/verify_attn_split.h).
#include <string>

#include "kernels/common/validate.h"
#include "kernels/common/verify_attn_split.h"

extern "C" int ddt_verify_attn_portable_workspace(const ddt_verify_attn_params* p, int split_keys, size_t* bytes) {
  using namespace ddtree::kern;
  clear_error();
  if (!p || !bytes) return fail(DDT_ERR_NULL, "verify_attn_portable_workspace: params or bytes is null");
  if (p->batch < 0 || p->batch > 65535 || p->total_nodes < 0 || p->total_nodes > DDT_ATTN_MAX_ROWS || p->heads < 1 ||
      p->heads > DDT_ATTN_MAX_HEADS || p->page_size < 1 || p->max_pages < 1)
    return fail(DDT_ERR_SHAPE,
                "verify_attn_portable_workspace: batch, total_nodes, heads, page_size or max_pages out of range");
  if (split_keys < 0 || split_keys % attn::kKeyTile != 0)
    return fail(DDT_ERR_SHAPE, "verify_attn_portable: split_keys must be 0 (no split) or a positive multiple of 32, got " +
                                   std::to_string(split_keys));
  const attn::Bounds b = attn::capacity_bounds(*p, split_keys);
  if (b.items > 0x7FFFFFFF || b.partial_rows > 0x7FFFFFFF || b.combine_items > 0x7FFFFFFF)
    return fail(DDT_ERR_SHAPE, "verify_attn_portable_workspace: the capacities need more than 2^31 work items, "
                               "partial rows or combine items");
  *bytes = size_t(b.partial_rows) * size_t(attn::kPartialRowBytes);
  return DDT_OK;
}

extern "C" int ddt_verify_attn_sm90_plan_bytes(const ddt_verify_attn_params* p, int split_keys, size_t* bytes) {
  using namespace ddtree::kern;
  size_t workspace = 0;  // (the same scalar checks and bounds)
  if (int rc = ddt_verify_attn_portable_workspace(p, split_keys, &workspace)) return rc;
  if (!bytes) return fail(DDT_ERR_NULL, "verify_attn_sm90_plan_bytes: bytes is null");
  *bytes = size_t(attn::plan_bytes(attn::capacity_bounds(*p, split_keys)));
  return DDT_OK;
}

namespace ddtree::kern::attn {
int check_plan(const ddt_verify_attn_params* p, int split_keys, const void* plan, size_t plan_bytes, const char* who,
               int64_t* capacity) {
  size_t need = 0;
  if (int rc = ddt_verify_attn_sm90_plan_bytes(p, split_keys, &need)) return rc;
  const std::string name = who;
  if (!plan)
    return fail(DDT_ERR_NULL, name + ": plan is null (ddt_verify_attn_sm90_plan_bytes: " + std::to_string(need) + " bytes)");
  if (reinterpret_cast<uintptr_t>(plan) % 16 != 0) return fail(DDT_ERR_ALIGN, name + ": plan must be 16-byte aligned");
  if (plan_bytes < need)
    return fail(DDT_ERR_SHAPE, name + ": plan_bytes " + std::to_string(plan_bytes) + " < " + std::to_string(need) +
                                   " needed for these capacities");
  *capacity = int64_t((plan_bytes - sizeof(PlanHeader)) / sizeof(PlanItem));
  return DDT_OK;
}
}  // namespace ddtree::kern::attn
