// Paged latent KV cache: page-table addressing, reserve / truncate / release, accepted-path compaction
// (including the ordering hazard of reference/ddtree.md) and its argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "rank/kv/latent_kv.h"

namespace ddtree::kv {
namespace {

LatentKvShape small_shape() { return LatentKvShape{2, 3, 4, 10, 3, 4}; }  // 2 layers, rows of 3, pages of 4

TEST(LatentKv, PageTableAddressing) {
  LatentKvCache c(small_shape());
  EXPECT_EQ(c.capacity(0), 0);
  c.reserve(1, 6);  // 2 pages
  EXPECT_EQ(c.capacity(1), 8);
  EXPECT_EQ(c.free_pages(), 8);
  const int32_t* pt = c.page_table();
  EXPECT_GE(pt[1 * 4 + 0], 0);
  EXPECT_GE(pt[1 * 4 + 1], 0);
  EXPECT_EQ(pt[1 * 4 + 2], -1);
  // Slot t lives at page_table[r][t / page_size], offset t % page_size: distinct rows, stable addresses.
  for (int layer = 0; layer < 2; ++layer)
    for (int t = 0; t < 8; ++t) c.row(layer, 1, t)[0] = float(100 * layer + t);
  for (int layer = 0; layer < 2; ++layer)
    for (int t = 0; t < 8; ++t) EXPECT_EQ(c.row(layer, 1, t)[0], float(100 * layer + t));
  EXPECT_EQ(c.row(0, 1, 5) - c.row(0, 1, 4), 3);  // same page: adjacent rows
  EXPECT_THROW(c.row(0, 1, 8), KvError);          // page 2 unmapped
  EXPECT_THROW(c.row(0, 0, 0), KvError);          // request 0 has nothing
  EXPECT_THROW(c.row(2, 1, 0), KvError);          // no layer 2
  EXPECT_THROW(c.reserve(3, 1), KvError);         // no request 3
  EXPECT_THROW(c.reserve(0, 17), KvError);        // more than 4 pages per request
}

TEST(LatentKv, ReserveTruncateRelease) {
  LatentKvCache c(small_shape());
  c.reserve(0, 16);
  c.reserve(1, 16);
  EXPECT_EQ(c.free_pages(), 2);
  EXPECT_THROW(c.reserve(2, 12), KvError);  // needs 3 pages, 2 free: nothing changes
  EXPECT_EQ(c.free_pages(), 2);
  EXPECT_EQ(c.capacity(2), 0);
  c.truncate(0, 5);  // keeps 2 pages
  EXPECT_EQ(c.capacity(0), 8);
  EXPECT_EQ(c.free_pages(), 4);
  c.reserve(0, 5);  // already there: no change
  EXPECT_EQ(c.free_pages(), 4);
  c.release(1);
  EXPECT_EQ(c.free_pages(), 8);
  c.set_page(2, 0, 9);
  EXPECT_EQ(c.page_of(2, 0), 9);
  EXPECT_EQ(c.capacity(2), 4);
}

// Reference compaction: read every source row, then write (the "read all before writing" form).
TEST(LatentKv, CompactAcceptedMatchesReference) {
  const std::vector<std::vector<int32_t>> paths = {{0}, {0, 1, 2}, {0, 2, 3}, {0, 2, 5, 9}, {0, 1, 4, 5, 11}};
  for (int64_t P : {0, 3, 4, 7}) {
    for (const auto& path : paths) {
      LatentKvCache c(LatentKvShape{2, 3, 4, 6, 1, 6});
      c.reserve(0, P + 12);
      for (int layer = 0; layer < 2; ++layer)
        for (int64_t t = 0; t < P + 12; ++t)
          for (int k = 0; k < 3; ++k) c.row(layer, 0, t)[k] = float(1000 * layer + 10 * t + k);
      std::vector<std::vector<float>> want;  // rows P .. P + len - 1 after compaction, layer-major
      for (int layer = 0; layer < 2; ++layer)
        for (int32_t node : path) want.emplace_back(c.row(layer, 0, P + node), c.row(layer, 0, P + node) + 3);
      c.compact_accepted(0, P, path.data(), int(path.size()));
      std::size_t w = 0;
      for (int layer = 0; layer < 2; ++layer)
        for (std::size_t k = 0; k < path.size(); ++k, ++w)
          EXPECT_EQ(std::vector<float>(c.row(layer, 0, P + int64_t(k)), c.row(layer, 0, P + int64_t(k)) + 3), want[w])
              << "P " << P << " k " << k;
      // The prefix is untouched.
      for (int64_t t = 0; t < P; ++t) EXPECT_EQ(c.row(1, 0, t)[2], float(1000 + 10 * t + 2));
    }
  }
}

TEST(LatentKv, CompactRejectsBadPaths) {
  LatentKvCache c(small_shape());
  c.reserve(0, 8);
  const int32_t not_root[] = {1, 2};
  const int32_t not_increasing[] = {0, 3, 2};
  const int32_t out_of_range[] = {0, 9};
  EXPECT_THROW(c.compact_accepted(0, 0, not_root, 2), KvError);
  EXPECT_THROW(c.compact_accepted(0, 0, not_increasing, 3), KvError);
  EXPECT_THROW(c.compact_accepted(0, 0, out_of_range, 2), KvError);
  EXPECT_THROW(c.compact_accepted(0, 0, out_of_range, 0), KvError);
}

}  // namespace
}  // namespace ddtree::kv
