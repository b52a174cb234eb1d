// Paged latent KV cache of MLA (cpu backend; the GPU cache implements the same interface on device memory).
//
// Layout (ARCHITECTURE.md "Data layout"):
//   storage per layer: [num_pages, page_size, row_dim] fp32, row_dim = kv_lora_rank + qk_rope_head_dim
//     (576 for the real dims): c_kv after kv_a_layernorm (kv_lora_rank), then k_pe with RoPE applied at the
//     token's position (qk_rope_head_dim, in the "half" layout of transformers' RoPE output: the rotated
//     pairs' first components, then their second components; see rank/model/rope.h).
//   page table: int32 [max_requests, max_pages_per_request]; -1 = no page. Token slot t of request r lives
//     in page page_table[r][t / page_size] at offset t % page_size, in every layer (one table for all).
// The cpu backend keeps rows in fp32 (no bf16 rounding of the KV).
//
// Pages come from a free list owned by the cache (reserve / release); the engine's scheduler may instead
// place pages itself with set_page. Compaction after accept is compact_accepted (reference/ddtree.md
// "KV after accept").
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddtree::kv {

class KvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LatentKvShape {
  int num_layers = 0;
  int row_dim = 0;                 // kv_lora_rank + qk_rope_head_dim (at most 16384)
  int page_size = 64;              // tokens per page
  int num_pages = 0;               // pages in the pool (per layer; a page index means the same in every layer)
  int max_requests = 0;            // rows of the page table
  int max_pages_per_request = 0;   // columns of the page table
};

class LatentKvCache {
 public:
  explicit LatentKvCache(const LatentKvShape& shape);

  const LatentKvShape& shape() const { return shape_; }
  int page_size() const { return shape_.page_size; }
  int row_dim() const { return shape_.row_dim; }

  // The page table, int32 [max_requests, max_pages_per_request] (-1 = unmapped).
  const int32_t* page_table() const { return table_.data(); }
  int32_t page_of(int request, int page_index) const;

  // Makes slots [0, num_tokens) of `request` addressable, taking pages from the free list. Throws KvError
  // when the pool or the request's page-table row is exhausted (nothing is changed then).
  void reserve(int request, int64_t num_tokens);
  // Returns every page of `request` to the free list.
  void release(int request);
  // Returns the pages wholly past slot num_tokens (keeps [0, num_tokens)).
  void truncate(int request, int64_t num_tokens);
  // Direct placement (scheduler-managed pages): maps page_index of request to `page` (-1 unmaps). The page
  // is taken out of the free list if it is there.
  void set_page(int request, int page_index, int32_t page);
  int free_pages() const { return int(free_.size()); }
  // Slots addressable for request: (mapped prefix of its page-table row) x page_size.
  int64_t capacity(int request) const;

  // Row of (layer, request, slot): row_dim floats. Throws KvError if the slot's page is unmapped.
  float* row(int layer, int request, int64_t slot);
  const float* row(int layer, int request, int64_t slot) const;

  // Accepted-path compaction for every layer (reference/ddtree.md): verify wrote tree node i at slot
  // prefix_len + i; accepted node path[k] (depth k) moves to slot prefix_len + k, for k in increasing
  // order, skipping path[k] == k. path[0] must be 0 and path strictly increasing (path[k] >= k), which makes
  // the in-order copy race-free; at most DDT_MAX_DEPTH + 1 (33) nodes, the accept kernel's limit. Throws KvError
  // for an invalid path before copying anything. The copy is the kernel library's CPU twin of the GPU compaction
  // (ddt_kv_compact_cpu, ddtree/kernels.h section 5).
  void compact_accepted(int request, int64_t prefix_len, const int32_t* path, int path_len);

  // Fills every row with `value` (tests poison the cache with NaN so an unwritten row shows).
  void fill(float value);

 private:
  std::size_t offset(int layer, int32_t page, int64_t in_page) const;
  void check_request(int request) const;

  LatentKvShape shape_;
  std::vector<float> data_;     // [num_layers, num_pages, page_size, row_dim]
  std::vector<int32_t> table_;  // [max_requests, max_pages_per_request]
  std::vector<int32_t> free_;   // free page indices (a stack)
};

}  // namespace ddtree::kv
