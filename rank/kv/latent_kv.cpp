// Paged latent KV cache, cpu backend. See latent_kv.h.
#include "rank/kv/latent_kv.h"

#include <algorithm>
#include <climits>

#include "ddtree/kernels.h"

namespace ddtree::kv {

LatentKvCache::LatentKvCache(const LatentKvShape& s) : shape_(s) {
  if (s.num_layers <= 0 || s.row_dim <= 0 || s.page_size <= 0 || s.num_pages <= 0 || s.max_requests <= 0 ||
      s.max_pages_per_request <= 0)
    throw KvError("LatentKvCache: every shape field must be > 0");
  if (s.row_dim > 16384) throw KvError("LatentKvCache: row_dim above 16384 (rows of at most 64 KB: kernels.h section 5)");
  data_.assign(std::size_t(s.num_layers) * s.num_pages * s.page_size * s.row_dim, 0.0f);
  table_.assign(std::size_t(s.max_requests) * s.max_pages_per_request, -1);
  free_.reserve(std::size_t(s.num_pages));
  for (int p = s.num_pages - 1; p >= 0; --p) free_.push_back(p);  // pops give 0, 1, 2, ...
}

void LatentKvCache::check_request(int request) const {
  if (request < 0 || request >= shape_.max_requests)
    throw KvError("LatentKvCache: request " + std::to_string(request) + " outside [0, " +
                  std::to_string(shape_.max_requests) + ")");
}

int32_t LatentKvCache::page_of(int request, int page_index) const {
  check_request(request);
  if (page_index < 0 || page_index >= shape_.max_pages_per_request) return -1;
  return table_[std::size_t(request) * shape_.max_pages_per_request + page_index];
}

int64_t LatentKvCache::capacity(int request) const {
  check_request(request);
  int n = 0;
  while (n < shape_.max_pages_per_request && page_of(request, n) >= 0) ++n;
  return int64_t(n) * shape_.page_size;
}

void LatentKvCache::reserve(int request, int64_t num_tokens) {
  check_request(request);
  const int64_t need = (num_tokens + shape_.page_size - 1) / shape_.page_size;
  if (need > shape_.max_pages_per_request)
    throw KvError("LatentKvCache: request " + std::to_string(request) + " needs " + std::to_string(need) +
                  " pages for " + std::to_string(num_tokens) + " tokens; the page table has " +
                  std::to_string(shape_.max_pages_per_request) + " per request");
  int32_t* row = &table_[std::size_t(request) * shape_.max_pages_per_request];
  int64_t missing = 0;
  for (int64_t i = 0; i < need; ++i) missing += row[i] < 0;
  if (missing > int64_t(free_.size()))
    throw KvError("LatentKvCache: out of pages (request " + std::to_string(request) + " needs " +
                  std::to_string(missing) + " more, " + std::to_string(free_.size()) + " free)");
  for (int64_t i = 0; i < need; ++i)
    if (row[i] < 0) {
      row[i] = free_.back();
      free_.pop_back();
    }
}

void LatentKvCache::release(int request) { truncate(request, 0); }

void LatentKvCache::truncate(int request, int64_t num_tokens) {
  check_request(request);
  const int64_t keep = (num_tokens + shape_.page_size - 1) / shape_.page_size;
  int32_t* row = &table_[std::size_t(request) * shape_.max_pages_per_request];
  for (int64_t i = shape_.max_pages_per_request - 1; i >= keep; --i)
    if (row[i] >= 0) {
      free_.push_back(row[i]);
      row[i] = -1;
    }
}

void LatentKvCache::set_page(int request, int page_index, int32_t page) {
  check_request(request);
  if (page_index < 0 || page_index >= shape_.max_pages_per_request)
    throw KvError("LatentKvCache::set_page: page index " + std::to_string(page_index) + " out of range");
  if (page < -1 || page >= shape_.num_pages)
    throw KvError("LatentKvCache::set_page: page " + std::to_string(page) + " out of range");
  int32_t& slot = table_[std::size_t(request) * shape_.max_pages_per_request + page_index];
  if (slot >= 0) free_.push_back(slot);
  slot = page;
  if (page >= 0) {
    auto it = std::find(free_.begin(), free_.end(), page);
    if (it != free_.end()) free_.erase(it);
  }
}

std::size_t LatentKvCache::offset(int layer, int32_t page, int64_t in_page) const {
  return ((std::size_t(layer) * shape_.num_pages + std::size_t(page)) * shape_.page_size + std::size_t(in_page)) *
         shape_.row_dim;
}

float* LatentKvCache::row(int layer, int request, int64_t slot) {
  return const_cast<float*>(static_cast<const LatentKvCache*>(this)->row(layer, request, slot));
}

const float* LatentKvCache::row(int layer, int request, int64_t slot) const {
  check_request(request);
  if (layer < 0 || layer >= shape_.num_layers) throw KvError("LatentKvCache: layer " + std::to_string(layer) + " out of range");
  if (slot < 0) throw KvError("LatentKvCache: negative slot");
  const int64_t pi = slot / shape_.page_size;
  const int32_t page = page_of(request, int(std::min<int64_t>(pi, shape_.max_pages_per_request)));
  if (page < 0)
    throw KvError("LatentKvCache: request " + std::to_string(request) + " slot " + std::to_string(slot) +
                  " has no page (reserve it first)");
  return &data_[offset(layer, page, slot % shape_.page_size)];
}

void LatentKvCache::compact_accepted(int request, int64_t prefix_len, const int32_t* path, int path_len) {
  check_request(request);
  if (prefix_len < 0 || prefix_len > INT32_MAX) throw KvError("compact_accepted: prefix_len out of range");
  // The accepted rows must all be addressable, also the last when it does not move (a missing reserve shows here).
  if (path != nullptr && path_len >= 1 && path_len <= DDT_MAX_DEPTH + 1 &&
      prefix_len + path[path_len - 1] >= capacity(request))
    throw KvError("compact_accepted: path reaches an unmapped slot; nothing was moved");
  // The kernel library's CPU twin (ddtree/kernels.h, section 5) on this request's page-table row: the same moves,
  // checks and order as the GPU cache's compaction kernel.
  const int32_t prefix = int32_t(prefix_len);
  uint32_t status = 0;
  ddt_kv_compact_params p{};
  p.kv = data_.data();
  p.row_bytes = int(sizeof(float)) * shape_.row_dim;
  p.layer_stride = int64_t(shape_.num_pages) * shape_.page_size * p.row_bytes;
  p.num_layers = shape_.num_layers;
  p.page_size = shape_.page_size;
  p.num_pages = shape_.num_pages;
  p.page_table = table_.data() + int64_t(request) * shape_.max_pages_per_request;
  p.max_pages = shape_.max_pages_per_request;
  p.prefix_lens = &prefix;
  p.path = path;
  p.path_len = &path_len;
  p.batch = 1;
  p.max_path = std::clamp(path_len, 1, DDT_MAX_DEPTH + 1);
  p.status = &status;
  if (int rc = ddt_kv_compact_cpu(&p))
    throw KvError(std::string("compact_accepted: ") + ddt_last_error_message() + " (" + ddt_status_string(rc) + ")");
  if (status & DDT_DATA_BAD_INDEX)
    throw KvError("compact_accepted: invalid path (it must start at the root 0, increase strictly, hold at most " +
                  std::to_string(DDT_MAX_DEPTH + 1) + " nodes and stay within the request's mapped slots); nothing "
                  "was moved");
}

void LatentKvCache::fill(float value) { std::fill(data_.begin(), data_.end(), value); }

}  // namespace ddtree::kv
