// The accepted-path KV compaction's CPU twin (ddtree/kernels.h, section 5): against a read-all-then-write
// reference on random batches (pages shuffled, prefixes at page boundaries +-1, opaque row bytes of 4 .. 2,304),
// the overlap hazard of reference/ddtree.md spelled out, every data check (the bad request untouched, the others
// compacted), the page-table remap, and the host-visible argument errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddtree/kernels.h"
#include "tests/unit/kv_compact_util.h"

namespace ddtree::test {
namespace {

struct CompactRun {
  std::vector<uint8_t> kv;
  std::vector<int32_t> table;
  uint32_t status = 0;
  int rc = -1;
};
CompactRun run_cpu(const KvCompactCase& c, int remap = 0) {
  CompactRun out{c.kv, c.table};
  const ddt_kv_compact_params p = c.params(out.kv.data(), out.table.data(), c.prefix.data(), c.path.data(),
                                           c.path_len.data(), &out.status, remap);
  out.rc = ddt_kv_compact_cpu(&p);
  return out;
}

// (row_bytes, page_size, layers, batch)
class KvCompactCpu : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(KvCompactCpu, MatchesReadAllThenWriteReference) {
  const auto [row_bytes, page_size, layers, batch] = GetParam();
  size_t moved = 0;  // bytes the reference changed, over all seeds
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const KvCompactCase c = make_kv_compact_case(seed * 7919 + row_bytes, layers, row_bytes, page_size, batch,
                                                 DDT_MAX_DEPTH + 1, 0, seed % 2 ? 0 : 8);
    std::vector<uint8_t> want = c.kv;
    kv_compact_reference(c, want, c.table);
    const CompactRun got = run_cpu(c);
    ASSERT_EQ(got.rc, DDT_OK) << ddt_last_error_message();
    EXPECT_EQ(got.status, 0u);
    EXPECT_EQ(got.table, c.table) << "copy mode must not touch the page table";
    ASSERT_EQ(got.kv.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) moved += want[i] != c.kv[i];
    EXPECT_TRUE(got.kv == want) << "seed " << seed;
  }
  EXPECT_GT(moved, 0u) << "no seed moved a row: the test would prove nothing";
}

INSTANTIATE_TEST_SUITE_P(Shapes, KvCompactCpu,
                         ::testing::Values(std::make_tuple(1152, 64, 3, 7), std::make_tuple(1152, 1, 2, 9),
                                           std::make_tuple(2304, 16, 2, 5), std::make_tuple(12, 4, 2, 33),
                                           std::make_tuple(4, 3, 1, 17), std::make_tuple(16, 64, 4, 1)));

// reference/ddtree.md: for path [0, 2, 3] the row moved to slot P + 1 comes from slot P + 2, which the next move
// overwrites with node 3's row. A copy that wrote before reading would put node 3's row at P + 1.
TEST(KvCompactCpuHazard, Path023KeepsNode2AtSlot1) {
  const int row = 8, P = 5, page = 4, pages = 4;
  std::vector<int32_t> table = {3, 0, 2, 1};  // permuted
  std::vector<uint8_t> kv(size_t(pages * page * row));
  auto at = [&](int slot) { return kv.data() + size_t((table[slot / page] * page + slot % page) * row); };
  for (int slot = 0; slot < pages * page; ++slot)
    for (int b = 0; b < row; ++b) at(slot)[b] = uint8_t(slot);
  const int32_t path[4] = {0, 2, 3, -1}, len = 3, prefix = P;
  uint32_t status = 0;
  ddt_kv_compact_params p{};
  p.kv = kv.data();
  p.layer_stride = int64_t(kv.size());
  p.num_layers = 1;
  p.row_bytes = row;
  p.page_size = page;
  p.num_pages = pages;
  p.page_table = table.data();
  p.max_pages = pages;
  p.prefix_lens = &prefix;
  p.path = path;
  p.path_len = &len;
  p.batch = 1;
  p.max_path = 4;
  p.status = &status;
  ASSERT_EQ(ddt_kv_compact_cpu(&p), DDT_OK);
  EXPECT_EQ(status, 0u);
  EXPECT_EQ(at(P)[0], uint8_t(P));
  EXPECT_EQ(at(P + 1)[0], uint8_t(P + 2));
  EXPECT_EQ(at(P + 2)[row - 1], uint8_t(P + 3));
  EXPECT_EQ(at(P + 3)[0], uint8_t(P + 3));  // past the accepted rows: the old node 3, untouched
  EXPECT_EQ(at(P - 1)[0], uint8_t(P - 1));  // the prefix, untouched
}

TEST(KvCompactCpuData, BadRequestsAreReportedAndLeftUntouched) {
  for (int page_size : {1, 4, 64}) {
    // bad_every 3 over 51 requests: 17 bad ones, every corruption kind at least twice.
    const KvCompactCase c = make_kv_compact_case(77 + page_size, 2, 1152, page_size, 51, 9, 3);
    std::vector<uint8_t> want = c.kv;
    kv_compact_reference(c, want, c.table);  // (skips the bad requests)
    const CompactRun got = run_cpu(c);
    ASSERT_EQ(got.rc, DDT_OK);
    EXPECT_EQ(got.status, uint32_t(DDT_DATA_BAD_INDEX));
    EXPECT_TRUE(got.kv == want) << "page_size " << page_size;
    EXPECT_EQ(got.table, c.table);
  }
  // A batch with no bad request leaves the status word as it was (kernels never clear it).
  const KvCompactCase ok = make_kv_compact_case(5, 1, 64, 4, 4, 5);
  CompactRun r{ok.kv, ok.table};
  r.status = 0x100u;
  const ddt_kv_compact_params p = ok.params(r.kv.data(), r.table.data(), ok.prefix.data(), ok.path.data(),
                                            ok.path_len.data(), &r.status);
  ASSERT_EQ(ddt_kv_compact_cpu(&p), DDT_OK);
  EXPECT_EQ(r.status, 0x100u);
}

// Each data check alone: one corrupted request (the last of the batch, so its path row ends the buffer) among good
// ones. The status bit can then only come from that check, and the corrupted request has moves, so a skipped
// check would also change the cache.
TEST(KvCompactCpuData, EachCheckAloneReportsAndLeavesItsRequestUntouched) {
  for (int kind = 1; kind <= 8; ++kind)
    for (int page_size : {1, 16}) {
      const KvCompactCase c = make_kv_compact_case(300 + kind, 2, 64, page_size, 6, 5, 0, 0, kind);
      std::vector<uint8_t> want = c.kv;
      kv_compact_reference(c, want, c.table);
      const CompactRun got = run_cpu(c);
      ASSERT_EQ(got.rc, DDT_OK);
      EXPECT_EQ(got.status, uint32_t(DDT_DATA_BAD_INDEX)) << "kind " << kind << " page_size " << page_size;
      EXPECT_TRUE(got.kv == want) << "kind " << kind << " page_size " << page_size;
      EXPECT_EQ(got.table, c.table);
      if (page_size == 1) {  // the remap: the same checks, the bad request's table row untouched
        const CompactRun remap = run_cpu(c, 1);
        EXPECT_EQ(remap.status, uint32_t(DDT_DATA_BAD_INDEX)) << "remap, kind " << kind;
        EXPECT_EQ(kv_remap_violation(c, c.table, remap.table), "") << "kind " << kind;
      }
    }
}

TEST(KvCompactCpuRemap, SwapsPageTableEntriesAndMovesNoBytes) {
  for (uint64_t seed : {3u, 4u, 5u}) {
    const KvCompactCase c = make_kv_compact_case(seed, 3, 1152, 1, 40, DDT_MAX_DEPTH + 1, seed == 5 ? 4 : 0);
    const CompactRun got = run_cpu(c, 1);
    ASSERT_EQ(got.rc, DDT_OK);
    EXPECT_EQ(got.status, seed == 5 ? uint32_t(DDT_DATA_BAD_INDEX) : 0u);
    EXPECT_TRUE(got.kv == c.kv) << "remap must not move KV bytes";
    EXPECT_EQ(kv_remap_violation(c, c.table, got.table), "");
    EXPECT_NE(got.table, c.table) << "the case remapped nothing";
    // Read through the new table, the accepted slots hold what a copy would have put there.
    std::vector<uint8_t> copied = c.kv;
    kv_compact_reference(c, copied, c.table);
    for (int r = 0; r < c.batch; ++r) {
      if (c.bad_kind[r]) continue;
      for (int k = 0; k < c.path_len[r]; ++k) {
        const int64_t slot = c.prefix[r] + k;
        for (int layer = 0; layer < c.layers; ++layer) {
          const size_t off = size_t(layer) * c.layer_stride;
          const uint8_t* via_remap = c.kv.data() + off + size_t(got.table[size_t(r) * c.max_pages + slot]) * 1152;
          const uint8_t* via_copy = copied.data() + off + size_t(c.table[size_t(r) * c.max_pages + slot]) * 1152;
          ASSERT_TRUE(std::equal(via_remap, via_remap + 1152, via_copy)) << "request " << r << " k " << k;
        }
      }
    }
  }
}

TEST(KvCompactCpuArgs, HostVisibleErrorsReturnCodesWithoutWriting) {
  const KvCompactCase c = make_kv_compact_case(11, 2, 64, 4, 3, 5);
  CompactRun r{c.kv, c.table};
  auto good = [&] {
    return c.params(r.kv.data(), r.table.data(), c.prefix.data(), c.path.data(), c.path_len.data(), &r.status);
  };
  EXPECT_EQ(ddt_kv_compact_cpu(nullptr), DDT_ERR_NULL);
  const std::vector<std::pair<const char*, std::function<void(ddt_kv_compact_params&)>>> cases = {
      {"kv null", [](ddt_kv_compact_params& p) { p.kv = nullptr; }},
      {"table null", [](ddt_kv_compact_params& p) { p.page_table = nullptr; }},
      {"prefix null", [](ddt_kv_compact_params& p) { p.prefix_lens = nullptr; }},
      {"path null", [](ddt_kv_compact_params& p) { p.path = nullptr; }},
      {"path_len null", [](ddt_kv_compact_params& p) { p.path_len = nullptr; }},
      {"status null", [](ddt_kv_compact_params& p) { p.status = nullptr; }},
      {"kv misaligned", [](ddt_kv_compact_params& p) { p.kv = static_cast<uint8_t*>(p.kv) + 2; }},
      {"row_bytes 6", [](ddt_kv_compact_params& p) { p.row_bytes = 6; }},
      {"row_bytes 0", [](ddt_kv_compact_params& p) { p.row_bytes = 0; }},
      {"row_bytes 65540", [](ddt_kv_compact_params& p) { p.row_bytes = 65540; }},
      {"layer_stride short", [](ddt_kv_compact_params& p) { p.layer_stride -= 4; }},
      {"layer_stride odd", [](ddt_kv_compact_params& p) { p.layer_stride += 2; }},
      {"num_layers 0", [](ddt_kv_compact_params& p) { p.num_layers = 0; }},
      {"page_size 0", [](ddt_kv_compact_params& p) { p.page_size = 0; }},
      {"max_pages 0", [](ddt_kv_compact_params& p) { p.max_pages = 0; }},
      {"num_pages 0", [](ddt_kv_compact_params& p) { p.num_pages = 0; }},
      {"max_path 0", [](ddt_kv_compact_params& p) { p.max_path = 0; }},
      {"max_path 34", [](ddt_kv_compact_params& p) { p.max_path = DDT_MAX_DEPTH + 2; }},
      {"batch -1", [](ddt_kv_compact_params& p) { p.batch = -1; }},
      {"remap at page 4", [](ddt_kv_compact_params& p) { p.remap = 1; }},
      {"remap 2", [](ddt_kv_compact_params& p) { p.remap = 2; }},
  };
  for (const auto& [what, mutate] : cases) {
    ddt_kv_compact_params p = good();
    mutate(p);
    const int rc = ddt_kv_compact_cpu(&p);
    const int want = std::string(what).find("null") != std::string::npos ? DDT_ERR_NULL
                     : std::string(what) == "kv misaligned"                ? DDT_ERR_ALIGN
                                                                           : DDT_ERR_SHAPE;
    EXPECT_EQ(rc, want) << what;
    EXPECT_NE(std::string(ddt_last_error_message()), "") << what;
  }
  EXPECT_TRUE(r.kv == c.kv) << "a refused call wrote KV";
  EXPECT_EQ(r.table, c.table);
  EXPECT_EQ(r.status, 0u);
  // The same arguments, unmutated, are accepted (the refusals above are the mutations'). Batch 0 does nothing.
  ddt_kv_compact_params p = good();
  p.batch = 0;
  EXPECT_EQ(ddt_kv_compact_cpu(&p), DDT_OK);
  EXPECT_TRUE(r.kv == c.kv);
  p = good();
  EXPECT_EQ(ddt_kv_compact_cpu(&p), DDT_OK);
}

}  // namespace
}  // namespace ddtree::test
