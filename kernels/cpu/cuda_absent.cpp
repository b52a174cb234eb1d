// Built instead of kernels/cuda/*.cu when this build has no CUDA compiler: every _cuda entry point
// validates its arguments like the real one and then returns DDT_ERR_NO_CUDA (never a silent no-op).
#include "kernels/common/validate.h"

namespace {
template <class P>
int absent(const P* p) {
  if (int rc = ddtree::kern::validate(p)) return rc;
  return ddtree::kern::fail(DDT_ERR_NO_CUDA, "this build of ddtree-engine has no cuda backend");
}
}  // namespace

extern "C" {
int ddt_cuda_available(void) { return 0; }
int ddt_topk_shard_cuda(const ddt_topk_shard_params* p, void*) { return absent(p); }
int ddt_topk_combine_cuda(const ddt_topk_combine_params* p, void*) { return absent(p); }
int ddt_tree_build_cuda(const ddt_tree_build_params* p, void*) { return absent(p); }
int ddt_sample_keys_cuda(const ddt_sample_keys_params* p, void*) { return absent(p); }
int ddt_accept_cuda(const ddt_accept_params* p, void*) { return absent(p); }
int ddt_kv_compact_cuda(const ddt_kv_compact_params* p, void*) { return absent(p); }
int ddt_verify_attn_cuda(const ddt_verify_attn_params* p, void*) { return absent(p); }
int ddt_verify_attn_portable_cuda(const ddt_verify_attn_params* p, int, void*, size_t, void*) { return absent(p); }
int ddt_verify_attn_sm90_cuda(const ddt_verify_attn_params* p, int, void*, size_t, void*) { return absent(p); }
int ddt_verify_attn_sm90_plan_cuda(const ddt_verify_attn_params* p, int, void*, size_t, void*) { return absent(p); }
int ddt_verify_attn_sm90_planned_cuda(const ddt_verify_attn_params* p, int, const void*, size_t, void*, size_t, void*) {
  return absent(p);
}
}
