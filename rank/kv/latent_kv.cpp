// Paged latent KV cache, cpu backend. See latent_kv.h.
#include "rank/kv/latent_kv.h"

#include <algorithm>
#include <cstring>

namespace ddtree::kv {

LatentKvCache::LatentKvCache(const LatentKvShape& s) : shape_(s) {
  if (s.num_layers <= 0 || s.row_dim <= 0 || s.page_size <= 0 || s.num_pages <= 0 || s.max_requests <= 0 ||
      s.max_pages_per_request <= 0)
    throw KvError("LatentKvCache: every shape field must be > 0");
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
  if (path_len < 1 || path == nullptr) throw KvError("compact_accepted: empty path");
  if (path[0] != 0) throw KvError("compact_accepted: path[0] must be 0 (the root)");
  for (int k = 1; k < path_len; ++k)
    if (path[k] <= path[k - 1]) throw KvError("compact_accepted: path must be strictly increasing");
  const int64_t last = prefix_len + path[path_len - 1];
  if (last >= capacity(request)) throw KvError("compact_accepted: path reaches an unmapped slot");
  // In increasing k: the destination P+k is never a later source, since later sources are P+path[j] with
  // path[j] > path[k] >= k.
  for (int layer = 0; layer < shape_.num_layers; ++layer)
    for (int k = 1; k < path_len; ++k) {
      if (path[k] == k) continue;
      std::memcpy(row(layer, request, prefix_len + k), row(layer, request, prefix_len + path[k]),
                  sizeof(float) * std::size_t(shape_.row_dim));
    }
}

void LatentKvCache::fill(float value) { std::fill(data_.begin(), data_.end(), value); }

}  // namespace ddtree::kv
