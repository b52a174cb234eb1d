// Top-K CPU twin against brute force: ids exact (ties to the smaller id), values exact, lse and log-probs
// against an f64 reference; shard combine equals the unsharded top-K (FIDELITY.md: top-K across shards).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "ddtree/kernels.h"
#include "test_util.h"

using namespace ddtree;

namespace {
// Brute force: stable sort of column indices by value descending (NaN as -inf): ties keep id order.
std::vector<int> brute_order(const float* x, int vocab) {
  std::vector<int> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto val = [&](int i) { return std::isnan(x[i]) ? -test::kInf : x[i]; };
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return val(a) > val(b); });
  return idx;
}
double ref_lse(const float* x, int vocab) {
  double m = -INFINITY;
  for (int v = 0; v < vocab; ++v) if (!std::isnan(x[v])) m = std::max(m, double(x[v]));
  if (m == -INFINITY) return m;
  long double s = 0;
  for (int v = 0; v < vocab; ++v) if (!std::isnan(x[v])) s += std::exp((long double)x[v] - m);
  return double(m + std::log(s));
}
}  // namespace

struct TopkCase { int rows, vocab, k; int64_t ld; float tie, ninf; };

class TopkCpu : public ::testing::TestWithParam<TopkCase> {};

TEST_P(TopkCpu, MatchesBruteForce) {
  const TopkCase c = GetParam();
  std::mt19937_64 rng(c.rows * 131 + c.vocab * 7 + c.k);
  const int64_t ld = c.ld > 0 ? c.ld : c.vocab;
  auto x = test::random_logits(rng, c.rows, c.vocab, c.tie, c.ninf, 3.0f, ld);
  std::vector<float> vals(size_t(c.rows) * c.k, std::nanf("")), lse(c.rows, std::nanf(""));
  std::vector<int32_t> ids(size_t(c.rows) * c.k, -7);
  uint32_t status = 0;
  ddt_topk_shard_params p{x.data(), ld, c.rows, c.vocab, 1000, c.k, vals.data(), ids.data(), lse.data(), &status};
  ASSERT_EQ(ddt_topk_shard_cpu(&p), DDT_OK);
  EXPECT_EQ(status, 0u);
  for (int r = 0; r < c.rows; ++r) {
    const float* row = x.data() + r * ld;
    auto order = brute_order(row, c.vocab);
    for (int j = 0; j < c.k; ++j) {
      if (j < c.vocab) {
        ASSERT_EQ(ids[r * c.k + j], 1000 + order[j]) << "row " << r << " rank " << j;
        const float want = row[order[j]];
        ASSERT_TRUE(vals[r * c.k + j] == want || (std::isnan(want) && vals[r * c.k + j] == -test::kInf));
      } else {
        ASSERT_EQ(ids[r * c.k + j], -1);
        ASSERT_EQ(vals[r * c.k + j], -test::kInf);
      }
    }
    const double want = ref_lse(row, c.vocab);
    if (std::isinf(want)) EXPECT_EQ(lse[r], float(want));
    else EXPECT_NEAR(lse[r], want, 4 * std::ldexp(1.0, std::ilogb(std::max(1.0, std::fabs(want))) - 23));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopkCpu, ::testing::Values(
    TopkCase{3, 1, 1, 0, 0.2f, 0.0f}, TopkCase{4, 7, 3, 8, 0.5f, 0.2f}, TopkCase{5, 100, 16, 0, 0.3f, 0.1f},
    TopkCase{2, 5, 9, 0, 0.0f, 0.0f} /* k > vocab */, TopkCase{3, 4096, 512, 4100, 0.8f, 0.1f},
    TopkCase{2, 3000, 1024, 0, 0.9f, 0.05f}, TopkCase{2, 20480, 64, 0, 0.3f, 0.02f}));

TEST(TopkCpu, AllMinusInfAndNanRows) {
  const int vocab = 12, k = 4;
  std::vector<float> x(2 * vocab, -test::kInf);
  x[vocab + 3] = std::nanf("");
  x[vocab + 5] = 2.0f;
  std::vector<float> vals(2 * k), lse(2);
  std::vector<int32_t> ids(2 * k);
  uint32_t status = 0;
  ddt_topk_shard_params p{x.data(), vocab, 2, vocab, 0, k, vals.data(), ids.data(), lse.data(), &status};
  ASSERT_EQ(ddt_topk_shard_cpu(&p), DDT_OK);
  EXPECT_EQ(status, uint32_t(DDT_DATA_NAN_LOGIT));
  EXPECT_EQ(lse[0], -test::kInf);
  EXPECT_EQ((std::vector<int32_t>(ids.begin(), ids.begin() + k)), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(ids[k], 5);
  EXPECT_EQ(lse[1], 2.0f);
  EXPECT_EQ((std::vector<int32_t>(ids.begin() + k, ids.end())), (std::vector<int32_t>{5, 0, 1, 2}));  // NaN (3) as -inf
  // Combine of an all -inf row: log-probs -inf, never NaN.
  std::vector<float> lp(2 * k);
  std::vector<int32_t> out_ids(2 * k);
  ddt_topk_combine_params cp{vals.data(), ids.data(), lse.data(), 1, 2, k, lp.data(), out_ids.data()};
  ASSERT_EQ(ddt_topk_combine_cpu(&cp), DDT_OK);
  for (float v : std::vector<float>(lp.begin(), lp.begin() + k)) EXPECT_EQ(v, -test::kInf);
  EXPECT_EQ(lp[k], 0.0f);
}

TEST(TopkCpu, PlusInfinityLogitIsFlaggedAndTakesAllTheMass) {
  std::vector<float> x = {test::kInf, 1.0f, 0.0f, -1.0f};
  std::vector<float> vals(2), lse(1), lp(2);
  std::vector<int32_t> ids(2), out_ids(2);
  uint32_t status = 0;
  ddt_topk_shard_params p{x.data(), 4, 1, 4, 0, 2, vals.data(), ids.data(), lse.data(), &status};
  ASSERT_EQ(ddt_topk_shard_cpu(&p), DDT_OK);
  EXPECT_EQ(status, uint32_t(DDT_DATA_NAN_LOGIT));
  EXPECT_EQ(lse[0], test::kInf);
  ddt_topk_combine_params cp{vals.data(), ids.data(), lse.data(), 1, 1, 2, lp.data(), out_ids.data()};
  ASSERT_EQ(ddt_topk_combine_cpu(&cp), DDT_OK);
  EXPECT_EQ(out_ids[0], 0);
  EXPECT_EQ(lp[0], 0.0f);
  EXPECT_EQ(lp[1], -test::kInf);
}

class TopkCombineCpu : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(TopkCombineCpu, ShardedEqualsUnsharded) {
  const auto [shards, vocab, k] = GetParam();
  const int rows = 6;
  std::mt19937_64 rng(shards * 1000 + k);
  auto x = test::random_logits(rng, rows, vocab, 0.4f, 0.1f);
  // Unsharded reference through the same API (S = 1) and an f64 log_softmax.
  std::vector<float> v1(rows * k), l1(rows), lp1(rows * k);
  std::vector<int32_t> i1(rows * k), id1(rows * k);
  uint32_t st = 0;
  ddt_topk_shard_params p1{x.data(), vocab, rows, vocab, 0, k, v1.data(), i1.data(), l1.data(), &st};
  ASSERT_EQ(ddt_topk_shard_cpu(&p1), DDT_OK);
  // Shards: contiguous column ranges of unequal width, each with its own row stride.
  std::vector<float> vs(size_t(shards) * rows * k), ls(size_t(shards) * rows);
  std::vector<int32_t> is(size_t(shards) * rows * k);
  const int base = vocab / shards;
  for (int s = 0, off = 0; s < shards; ++s) {
    const int w = s == shards - 1 ? vocab - off : base;
    const int64_t ld = (w + 3) / 4 * 4;
    std::vector<float> xs(size_t(rows) * ld, std::nanf(""));
    for (int r = 0; r < rows; ++r) std::copy_n(x.data() + r * vocab + off, w, xs.data() + r * ld);
    ddt_topk_shard_params ps{xs.data(), ld, rows, w, off, k, vs.data() + size_t(s) * rows * k,
                             is.data() + size_t(s) * rows * k, ls.data() + size_t(s) * rows, &st};
    ASSERT_EQ(ddt_topk_shard_cpu(&ps), DDT_OK);
    off += w;
  }
  std::vector<float> lps(rows * k);
  std::vector<int32_t> ids(rows * k);
  ddt_topk_combine_params cs{vs.data(), is.data(), ls.data(), shards, rows, k, lps.data(), ids.data()};
  ASSERT_EQ(ddt_topk_combine_cpu(&cs), DDT_OK);
  ddt_topk_combine_params c1{v1.data(), i1.data(), l1.data(), 1, rows, k, lp1.data(), id1.data()};
  ASSERT_EQ(ddt_topk_combine_cpu(&c1), DDT_OK);
  EXPECT_EQ(ids, id1) << "token ids must be exact across shard counts";
  for (int r = 0; r < rows; ++r) {
    const double lse = ref_lse(x.data() + r * vocab, vocab);
    for (int j = 0; j < k; ++j) {
      const float got = lps[r * k + j];
      ASSERT_FALSE(std::isnan(got));
      if (ids[r * k + j] < 0 || x[r * vocab + ids[r * k + j]] == -test::kInf) { ASSERT_EQ(got, -test::kInf); continue; }
      const double want = double(x[r * vocab + ids[r * k + j]]) - lse;
      // Stated bound: 8 ulp of max(|logit|, |lse|, 1) (one rounding of the f32 lse, one of the subtraction).
      const double mag = std::max({std::fabs(double(x[r * vocab + ids[r * k + j]])), std::fabs(lse), 1.0});
      ASSERT_NEAR(got, want, 8 * std::ldexp(1.0, std::ilogb(mag) - 23)) << "row " << r << " j " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, TopkCombineCpu, ::testing::Values(
    std::make_tuple(1, 50, 8), std::make_tuple(2, 50, 8), std::make_tuple(3, 61, 16), std::make_tuple(8, 1000, 64),
    std::make_tuple(8, 20, 4) /* k > shard width */, std::make_tuple(5, 23, 23)));

TEST(TopkCpu, ArgumentErrors) {
  float x[8] = {}; float v[4]; int32_t i[4]; float l[2]; uint32_t st = 0;
  ddt_topk_shard_params p{x, 4, 2, 4, 0, 2, v, i, l, &st};
  EXPECT_EQ(ddt_topk_shard_cpu(&p), DDT_OK);
  auto q = p; q.logits = nullptr;
  EXPECT_EQ(ddt_topk_shard_cpu(&q), DDT_ERR_NULL);
  EXPECT_NE(std::string(ddt_last_error_message()).find("logits"), std::string::npos);
  q = p; q.logits = reinterpret_cast<const float*>(reinterpret_cast<const char*>(x) + 2);
  EXPECT_EQ(ddt_topk_shard_cpu(&q), DDT_ERR_ALIGN);
  q = p; q.k = 0;
  EXPECT_EQ(ddt_topk_shard_cpu(&q), DDT_ERR_SHAPE);
  q = p; q.k = DDT_MAX_TOPK + 1;
  EXPECT_EQ(ddt_topk_shard_cpu(&q), DDT_ERR_SHAPE);
  q = p; q.ld = 3;
  EXPECT_EQ(ddt_topk_shard_cpu(&q), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_topk_shard_cpu(nullptr), DDT_ERR_NULL);
}
