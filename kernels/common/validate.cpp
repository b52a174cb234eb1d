// Argument validation and error reporting for the C ABI (see common/validate.h).
#include "kernels/common/validate.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/common/bf16.h"
#include "kernels/common/numerics.h"

namespace ddtree::kern {
namespace {
thread_local std::string g_last_error;

bool aligned(const void* p, std::size_t a) { return (reinterpret_cast<std::uintptr_t>(p) % a) == 0; }

// Null / alignment check of one pointer argument.
#define DDT_CHECK_PTR(ptr, align)                                                                    \
  do {                                                                                               \
    if ((ptr) == nullptr) return fail(DDT_ERR_NULL, std::string(kname) + ": " #ptr " is null");  \
    if (!aligned((ptr), (align)))                                                                    \
      return fail(DDT_ERR_ALIGN, std::string(kname) + ": " #ptr " is not " #align "-byte aligned"); \
  } while (0)

#define DDT_CHECK_RANGE(cond, code, what)                                                     \
  do {                                                                                        \
    if (!(cond)) return fail((code), std::string(kname) + ": " + (what) + " (" #cond ")"); \
  } while (0)
}  // namespace

int fail(int code, const std::string& msg) {
  g_last_error = msg;
  return code;
}
void clear_error() { g_last_error.clear(); }
const char* g_last_error_ptr() { return g_last_error.c_str(); }

int validate(const ddt_topk_shard_params* p) {
  const char* kname = "topk_shard";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "topk_shard: params is null");
  DDT_CHECK_RANGE(p->rows >= 0 && p->rows <= (1 << 24), DDT_ERR_SHAPE, "rows out of range");
  DDT_CHECK_RANGE(p->vocab >= 1 && p->vocab <= DDT_MAX_VOCAB, DDT_ERR_SHAPE, "vocab out of range");
  DDT_CHECK_RANGE(p->ld >= p->vocab, DDT_ERR_SHAPE, "ld must be >= vocab");
  DDT_CHECK_RANGE(p->vocab_offset >= 0 && int64_t(p->vocab_offset) + p->vocab <= DDT_MAX_VOCAB, DDT_ERR_SHAPE,
                  "vocab_offset out of range");
  DDT_CHECK_RANGE(p->k >= 1 && p->k <= DDT_MAX_TOPK, DDT_ERR_SHAPE, "k out of range 1..DDT_MAX_TOPK");
  DDT_CHECK_PTR(p->logits, 4);
  DDT_CHECK_PTR(p->out_values, 4);
  DDT_CHECK_PTR(p->out_ids, 4);
  DDT_CHECK_PTR(p->out_lse, 4);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

int validate(const ddt_topk_combine_params* p) {
  const char* kname = "topk_combine";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "topk_combine: params is null");
  DDT_CHECK_RANGE(p->shards >= 1 && p->shards <= 64, DDT_ERR_SHAPE, "shards out of range 1..64");
  DDT_CHECK_RANGE(p->rows >= 0 && p->rows <= (1 << 24), DDT_ERR_SHAPE, "rows out of range");
  DDT_CHECK_RANGE(p->k >= 1 && p->k <= DDT_MAX_TOPK, DDT_ERR_SHAPE, "k out of range 1..DDT_MAX_TOPK");
  DDT_CHECK_PTR(p->values, 4);
  DDT_CHECK_PTR(p->ids, 4);
  DDT_CHECK_PTR(p->lse, 4);
  DDT_CHECK_PTR(p->out_logprobs, 4);
  DDT_CHECK_PTR(p->out_ids, 4);
  return DDT_OK;
}

int validate(const ddt_tree_build_params* p) {
  const char* kname = "tree_build";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "tree_build: params is null");
  DDT_CHECK_RANGE(p->budget >= 1 && p->budget <= DDT_MAX_BUDGET, DDT_ERR_BUDGET, "budget must be 1..DDT_MAX_BUDGET");
  DDT_CHECK_RANGE(p->depth >= 1 && p->depth <= DDT_MAX_DEPTH, DDT_ERR_DEPTH, "depth must be 1..DDT_MAX_DEPTH");
  DDT_CHECK_RANGE(p->batch >= 0 && p->batch <= 65535, DDT_ERR_SHAPE, "batch out of range 0..65535");
  DDT_CHECK_RANGE(p->k >= 1 && p->k <= DDT_MAX_TOPK, DDT_ERR_SHAPE, "k out of range 1..DDT_MAX_TOPK");
  DDT_CHECK_PTR(p->logprobs, 4);
  DDT_CHECK_PTR(p->token_ids, 4);
  DDT_CHECK_PTR(p->root_tokens, 4);
  DDT_CHECK_PTR(p->prefix_lens, 4);
  DDT_CHECK_PTR(p->tokens, 4);
  DDT_CHECK_PTR(p->parents, 4);
  DDT_CHECK_PTR(p->depths, 4);
  DDT_CHECK_PTR(p->scores, 4);
  DDT_CHECK_PTR(p->slots, 4);
  DDT_CHECK_PTR(p->positions, 4);
  DDT_CHECK_PTR(p->vis, 8);
  DDT_CHECK_PTR(p->first_child, 4);
  DDT_CHECK_PTR(p->next_sibling, 4);
  DDT_CHECK_PTR(p->node_count, 4);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

int validate(const ddt_sample_keys_params* p) {
  const char* kname = "sample_keys";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "sample_keys: params is null");
  DDT_CHECK_RANGE(std::isfinite(p->temperature) && p->temperature >= 0.0f, DDT_ERR_TEMPERATURE,
                  "temperature must be finite and >= 0");
  DDT_CHECK_RANGE(p->batch >= 0 && p->nodes >= 1 && int64_t(p->batch) * p->nodes <= (1 << 24), DDT_ERR_SHAPE,
                  "batch * nodes out of range");
  DDT_CHECK_RANGE(p->vocab >= 1 && p->vocab <= DDT_MAX_VOCAB, DDT_ERR_SHAPE, "vocab out of range");
  DDT_CHECK_RANGE(p->ld >= p->vocab, DDT_ERR_SHAPE, "ld must be >= vocab");
  DDT_CHECK_RANGE(p->vocab_offset >= 0 && int64_t(p->vocab_offset) + p->vocab <= DDT_MAX_VOCAB, DDT_ERR_SHAPE,
                  "vocab_offset out of range");
  DDT_CHECK_PTR(p->logits, 4);
  DDT_CHECK_PTR(p->positions, 4);
  if (p->temperature > 0.0f) DDT_CHECK_PTR(p->seeds, 8);
  DDT_CHECK_PTR(p->out_keys, 8);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

int validate(const ddt_accept_params* p) {
  const char* kname = "accept";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "accept: params is null");
  DDT_CHECK_RANGE(p->batch >= 0 && p->batch <= 65535, DDT_ERR_SHAPE, "batch out of range 0..65535");
  DDT_CHECK_RANGE(p->n >= 1 && p->n <= DDT_MAX_BUDGET + 1, DDT_ERR_SHAPE, "n (tree width) out of range");
  DDT_CHECK_RANGE(p->max_path >= 1 && p->max_path <= DDT_MAX_DEPTH + 1, DDT_ERR_SHAPE, "max_path out of range");
  DDT_CHECK_RANGE(p->num_stop >= 0 && p->num_stop <= 64, DDT_ERR_SHAPE, "num_stop out of range 0..64");
  DDT_CHECK_PTR(p->keys, 8);
  DDT_CHECK_PTR(p->tokens, 4);
  DDT_CHECK_PTR(p->parents, 4);
  DDT_CHECK_PTR(p->node_count, 4);
  DDT_CHECK_PTR(p->max_new, 4);
  if (p->num_stop > 0) DDT_CHECK_PTR(p->stop_ids, 4);
  DDT_CHECK_PTR(p->path, 4);
  DDT_CHECK_PTR(p->path_len, 4);
  DDT_CHECK_PTR(p->new_tokens, 4);
  DDT_CHECK_PTR(p->num_new, 4);
  DDT_CHECK_PTR(p->bonus, 4);
  DDT_CHECK_PTR(p->finished, 4);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

int validate(const ddt_verify_attn_params* p) {
  const char* kname = "verify_attn";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "verify_attn: params is null");
  DDT_CHECK_RANGE(p->batch >= 0 && p->batch <= 65535, DDT_ERR_SHAPE, "batch out of range 0..65535");
  DDT_CHECK_RANGE(p->total_nodes >= 0 && p->total_nodes <= DDT_ATTN_MAX_ROWS, DDT_ERR_SHAPE,
                  "total_nodes out of range 0..DDT_ATTN_MAX_ROWS");
  DDT_CHECK_RANGE(p->heads >= 1 && p->heads <= DDT_ATTN_MAX_HEADS, DDT_ERR_SHAPE, "heads out of range 1..256");
  DDT_CHECK_RANGE(p->page_size >= 1, DDT_ERR_SHAPE, "page_size must be >= 1");
  DDT_CHECK_RANGE(p->max_pages >= 1, DDT_ERR_SHAPE, "max_pages (page-table row stride) must be >= 1");
  DDT_CHECK_RANGE(p->num_pages >= 1 && p->num_pages <= (int64_t(1) << 40) / p->page_size, DDT_ERR_SHAPE,
                  "num_pages out of range");
  DDT_CHECK_RANGE(p->vis_words >= 1 && p->vis_words <= (1 << 16), DDT_ERR_SHAPE, "vis_words out of range 1..65536");
  DDT_CHECK_RANGE(std::isfinite(p->softmax_scale) && p->softmax_scale > 0.0f, DDT_ERR_VALUE,
                  "softmax_scale must be finite and > 0");
  DDT_CHECK_RANGE(p->p_precision == DDT_ATTN_P_HILO || p->p_precision == DDT_ATTN_P_BF16, DDT_ERR_VALUE,
                  "p_precision must be DDT_ATTN_P_HILO (0) or DDT_ATTN_P_BF16 (1)");
  // Device data (node counts, prefix lengths, page indices) is checked in the kernels: DDT_DATA_BAD_INDEX.
  DDT_CHECK_PTR(p->q, 16);
  DDT_CHECK_PTR(p->kv_cache, 16);
  DDT_CHECK_PTR(p->page_table, 4);
  DDT_CHECK_PTR(p->prefix_lens, 4);
  DDT_CHECK_PTR(p->node_offsets, 4);
  DDT_CHECK_PTR(p->vis, 8);
  DDT_CHECK_PTR(p->out, 16);
  DDT_CHECK_PTR(p->lse, 4);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

int validate(const ddt_kv_compact_params* p) {
  const char* kname = "kv_compact";
  clear_error();
  if (!p) return fail(DDT_ERR_NULL, "kv_compact: params is null");
  DDT_CHECK_RANGE(p->batch >= 0 && p->batch <= 65535, DDT_ERR_SHAPE, "batch out of range 0..65535");
  DDT_CHECK_RANGE(p->num_layers >= 1 && p->num_layers <= 65535, DDT_ERR_SHAPE, "num_layers out of range 1..65535");
  DDT_CHECK_RANGE(p->row_bytes >= 4 && p->row_bytes <= 65536 && p->row_bytes % 4 == 0, DDT_ERR_SHAPE,
                  "row_bytes must be a multiple of 4 in 4..65536");
  DDT_CHECK_RANGE(p->page_size >= 1, DDT_ERR_SHAPE, "page_size must be >= 1");
  DDT_CHECK_RANGE(p->max_pages >= 1, DDT_ERR_SHAPE, "max_pages (page-table row stride) must be >= 1");
  DDT_CHECK_RANGE(p->num_pages >= 1 && p->num_pages <= (int64_t(1) << 40) / p->page_size, DDT_ERR_SHAPE,
                  "num_pages out of range");
  DDT_CHECK_RANGE(p->layer_stride % 4 == 0 && p->layer_stride / p->row_bytes / p->page_size >= p->num_pages &&
                      p->layer_stride <= (int64_t(1) << 62) / p->num_layers,
                  DDT_ERR_SHAPE,
                  "layer_stride must be a multiple of 4, >= num_pages x page_size x row_bytes and <= 2^62 / num_layers");
  DDT_CHECK_RANGE(p->max_path >= 1 && p->max_path <= DDT_MAX_DEPTH + 1, DDT_ERR_SHAPE, "max_path out of range");
  DDT_CHECK_RANGE(p->remap == 0 || (p->remap == 1 && p->page_size == 1), DDT_ERR_SHAPE,
                  "remap must be 0, or 1 with page_size 1");
  DDT_CHECK_PTR(p->kv, 4);
  DDT_CHECK_PTR(p->page_table, 4);
  DDT_CHECK_PTR(p->prefix_lens, 4);
  DDT_CHECK_PTR(p->path, 4);
  DDT_CHECK_PTR(p->path_len, 4);
  DDT_CHECK_PTR(p->status, 4);
  return DDT_OK;
}

}  // namespace ddtree::kern

extern "C" {

const char* ddt_status_string(int status) {
  switch (status) {
    case DDT_OK: return "ok";
    case DDT_ERR_NULL: return "null pointer argument";
    case DDT_ERR_ALIGN: return "misaligned pointer argument";
    case DDT_ERR_SHAPE: return "dimension out of range";
    case DDT_ERR_BUDGET: return "tree budget out of range (1..512)";
    case DDT_ERR_DEPTH: return "tree depth out of range (1..32)";
    case DDT_ERR_TEMPERATURE: return "temperature must be finite and >= 0";
    case DDT_ERR_NO_CUDA: return "cuda backend unavailable (not built, or no GPU)";
    case DDT_ERR_CUDA: return "CUDA runtime error";
    case DDT_ERR_VALUE: return "scalar argument out of range";
    case DDT_ERR_ARCH: return "the GPU lacks the kernel's architecture";
    default: return "unknown status";
  }
}

const char* ddt_last_error_message(void) { return ddtree::kern::g_last_error_ptr(); }

uint32_t ddt_float_order_bits(float x) { return ddtree::num::order_bits(x); }
uint64_t ddt_pack_key(float value, int32_t token_id) { return ddtree::num::pack_key(value, uint32_t(token_id)); }
int32_t ddt_key_token(uint64_t key) { return int32_t(ddtree::num::key_id(key)); }
uint16_t ddt_f32_to_bf16(float x) { return ddtree::num::f32_to_bf16(x); }
float ddt_bf16_to_f32(uint16_t h) { return ddtree::num::bf16_to_f32(h); }
float ddt_gumbel(uint64_t seed, int64_t position, int32_t token_id) {
  return ddtree::num::gumbel(seed, position, uint32_t(token_id));
}

}  // extern "C"
