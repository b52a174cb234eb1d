// Test problems for the accepted-path KV compaction (ddtree/kernels.h, section 5), shared by the CPU twin's tests
// and the GPU tests: a batch of requests with random prefixes (page boundaries +-1 and 0 included), random tree
// widths and accepted paths, their pages drawn from a shuffled pool (no page shared), random row bytes (the
// values are opaque, NaN patterns included), page-table entries past a request's pages left as -1 or garbage
// (never to be read), and optionally corrupted requests (every data check of the ABI), plus independent checks:
// a copy reference that reads all of a request's sources, then writes (reference/ddtree.md's second form; the twin
// copies one by one), and the remap's defining properties.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ddtree/kernels.h"

namespace ddtree::test {

struct KvCompactCase {
  int layers = 1, row_bytes = 16, page_size = 1, max_pages = 1, max_path = 1, batch = 0;
  int64_t num_pages = 1, layer_stride = 0;
  std::vector<uint8_t> kv;              // [layers][layer_stride bytes]
  std::vector<int32_t> table;           // [batch, max_pages]
  std::vector<int32_t> prefix, path, path_len;  // [batch], [batch, max_path], [batch]
  std::vector<int> bad_kind;            // [batch] 0 = a good request, else the corruption (make_kv_compact_case)

  // The params over the given buffers (host or device copies of the fields above).
  ddt_kv_compact_params params(void* kv_buf, int32_t* table_buf, const int32_t* prefix_buf, const int32_t* path_buf,
                               const int32_t* len_buf, uint32_t* status, int remap = 0) const {
    ddt_kv_compact_params p{};
    p.kv = kv_buf;
    p.layer_stride = layer_stride;
    p.num_layers = layers;
    p.row_bytes = row_bytes;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.page_table = table_buf;
    p.max_pages = max_pages;
    p.prefix_lens = prefix_buf;
    p.path = path_buf;
    p.path_len = len_buf;
    p.batch = batch;
    p.max_path = max_path;
    p.remap = remap;
    p.status = status;
    return p;
  }
};

// bad_every > 0: every bad_every-th request (r % bad_every == bad_every - 1) is corrupted, the kind cycling through
// the ABI's checks: 1 path_len 0, 2 path_len > max_path, 3 path[0] != 0, 4 a repeated node, 5 P < 0, 6 the last
// node past max_pages x page_size, 7 a moved slot's page -1, 8 a moved slot's page >= num_pages. only_kind > 0: the
// last request alone, with that kind. A corrupted request first gets moves (path {0, 2, 3} when max_path >= 3), so
// that a kernel skipping a check would change the cache, not only miss the status bit.
inline KvCompactCase make_kv_compact_case(uint64_t seed, int layers, int row_bytes, int page_size, int batch,
                                          int max_path, int bad_every = 0, int layer_pad = 0, int only_kind = 0) {
  std::mt19937_64 rng(seed);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  KvCompactCase c;
  c.layers = layers;
  c.row_bytes = row_bytes;
  c.page_size = page_size;
  c.batch = batch;
  c.max_path = max_path;
  std::vector<int64_t> P(batch), N(batch);
  int64_t total_pages = 0;
  int need_max = 1;
  auto kind_of = [&](int r) {
    if (only_kind > 0) return r == batch - 1 ? only_kind : 0;
    return bad_every > 0 && r % bad_every == bad_every - 1 ? 1 + (r / bad_every) % 8 : 0;
  };
  for (int r = 0; r < batch; ++r) {
    const int64_t base = page_size * uni(0, 4);
    P[r] = std::max<int64_t>(0, r % 3 == 0 ? base + uni(-1, 1) : uni(0, 5 * page_size + 40));
    N[r] = uni(1, 64);
    if (kind_of(r)) N[r] = std::max<int64_t>(N[r], 4);  // (room for the moves of path {0, 2, 3})
    const int64_t pages = (P[r] + N[r] + page_size - 1) / page_size;
    total_pages += pages;
    need_max = std::max<int>(need_max, int(pages));
  }
  c.max_pages = need_max + int(uni(0, 3));
  c.num_pages = total_pages + uni(1, 8);
  c.layer_stride = c.num_pages * page_size * row_bytes + int64_t(layer_pad);
  c.kv.resize(size_t(c.layer_stride) * layers);
  for (size_t i = 0; i < c.kv.size(); i += 8) {  // (8 random bytes a draw)
    const uint64_t x = rng();
    std::memcpy(c.kv.data() + i, &x, std::min<size_t>(8, c.kv.size() - i));
  }
  std::vector<int32_t> pool(size_t(c.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  c.table.assign(size_t(batch) * c.max_pages, -1);
  c.prefix.assign(size_t(batch), 0);
  c.path.assign(size_t(batch) * max_path, -1);
  c.path_len.assign(size_t(batch), 1);
  c.bad_kind.assign(size_t(batch), 0);
  size_t next = 0;
  for (int r = 0; r < batch; ++r) {
    const int64_t pages = (P[r] + N[r] + page_size - 1) / page_size;
    int32_t* row = c.table.data() + size_t(r) * c.max_pages;
    for (int64_t k = 0; k < pages; ++k) row[k] = pool[next++];
    for (int64_t k = pages; k < c.max_pages; ++k) row[k] = uni(0, 1) ? -1 : int32_t(1 << 30);  // never read
    c.prefix[r] = int32_t(P[r]);
    // The accepted path: the root, then a random increasing choice of nodes 1 .. N - 1 (a root-to-leaf path of
    // the builder's trees is increasing; chains (path[k] == k) and deep jumps both occur).
    const int len = int(uni(1, std::min<int64_t>(max_path, N[r])));
    std::vector<int32_t> nodes(size_t(N[r] - 1));
    std::iota(nodes.begin(), nodes.end(), 1);
    std::shuffle(nodes.begin(), nodes.end(), rng);
    if (uni(0, 3) == 0) std::iota(nodes.begin(), nodes.end(), 1);  // a prefix of the chain: nothing moves
    std::vector<int32_t> pick(nodes.begin(), nodes.begin() + (len - 1));
    std::sort(pick.begin(), pick.end());
    int32_t* pr = c.path.data() + size_t(r) * max_path;
    pr[0] = 0;
    for (int k = 1; k < len; ++k) pr[k] = pick[size_t(k - 1)];
    c.path_len[r] = len;
    if (const int kind = kind_of(r)) {
      c.bad_kind[r] = kind;
      if (max_path >= 3) {  // moves: slot P + 2 -> P + 1, P + 3 -> P + 2
        pr[0] = 0;
        pr[1] = 2;
        pr[2] = 3;
        c.path_len[r] = 3;
      }
      switch (kind) {
        case 1: c.path_len[r] = 0; break;
        case 2:  // a whole row of increasing nodes, then one more counted (read past the row if unchecked)
          for (int k = 1; k < max_path; ++k) pr[k] = k + 1;
          c.path_len[r] = max_path + 1;
          break;
        case 3: pr[0] = 1; break;
        case 4:
          if (max_path >= 3) pr[2] = 2; else pr[0] = 5;
          break;
        case 5: c.prefix[r] = -1 - int32_t(uni(0, 5)); break;
        case 6:  // the last node's slot is the first past the page table's row
          if (max_path >= 2) {
            if (c.path_len[r] < 2) c.path_len[r] = 2;
            pr[c.path_len[r] - 1] = int32_t(int64_t(c.max_pages) * page_size - P[r]);
          } else {
            pr[0] = 7;
          }
          break;
        case 7:
        case 8:
          if (max_path >= 3) row[(P[r] + (kind == 7 ? 2 : 1)) / page_size] = kind == 7 ? -1 : int32_t(c.num_pages);
          else pr[0] = 9;
          break;
      }
    }
  }
  return c;
}

// Reference compaction (copy mode) of the case's host buffers, in place: per good request, every source row of
// every layer read first, then all written.
inline void kv_compact_reference(const KvCompactCase& c, std::vector<uint8_t>& kv, const std::vector<int32_t>& table) {
  for (int r = 0; r < c.batch; ++r) {
    if (c.bad_kind[r]) continue;
    const int len = c.path_len[r];
    const int32_t* pr = c.path.data() + size_t(r) * c.max_path;
    const int64_t P = c.prefix[r];
    const int32_t* row = table.data() + size_t(r) * c.max_pages;
    auto at = [&](int layer, int64_t slot) {
      return kv.data() + size_t(layer) * c.layer_stride +
             size_t((int64_t(row[slot / c.page_size]) * c.page_size + slot % c.page_size) * c.row_bytes);
    };
    for (int layer = 0; layer < c.layers; ++layer) {
      std::vector<std::vector<uint8_t>> src;
      for (int k = 0; k < len; ++k) src.emplace_back(at(layer, P + pr[k]), at(layer, P + pr[k]) + c.row_bytes);
      for (int k = 0; k < len; ++k) std::memcpy(at(layer, P + k), src[size_t(k)].data(), size_t(c.row_bytes));
    }
  }
}

// Checks a remapped table (page_size 1) against the original: for each good request, slot P + k holds the entry
// of P + path[k] (k < path_len), the request's row holds the same multiset of entries, and entries outside
// [P, P + path[last]] are unchanged; bad requests' rows are unchanged. Returns the first violation or "".
inline std::string kv_remap_violation(const KvCompactCase& c, const std::vector<int32_t>& before,
                                      const std::vector<int32_t>& after) {
  for (int r = 0; r < c.batch; ++r) {
    const int32_t* b = before.data() + size_t(r) * c.max_pages;
    const int32_t* a = after.data() + size_t(r) * c.max_pages;
    const std::string who = "request " + std::to_string(r) + ": ";
    if (c.bad_kind[r]) {
      if (!std::equal(a, a + c.max_pages, b)) return who + "bad request's row changed";
      continue;
    }
    const int len = c.path_len[r];
    const int32_t* pr = c.path.data() + size_t(r) * c.max_path;
    const int64_t P = c.prefix[r], last = P + pr[len - 1];
    for (int k = 0; k < len; ++k)
      if (a[P + k] != b[P + pr[k]]) return who + "slot P + " + std::to_string(k) + " is not node " + std::to_string(pr[k]);
    for (int64_t t = 0; t < c.max_pages; ++t)
      if ((t < P || t > last) && a[t] != b[t]) return who + "entry " + std::to_string(t) + " outside the moves changed";
    std::vector<int32_t> sa(a, a + c.max_pages), sb(b, b + c.max_pages);
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    if (sa != sb) return who + "the row's set of pages changed";
  }
  return "";
}

}  // namespace ddtree::test
