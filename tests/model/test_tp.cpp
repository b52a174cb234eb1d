// Tensor-parallel shards: a shard loaded from the checkpoint holds exactly the slice of the full model
// (bitwise) and computes the same partial results as the full model's weights sliced in memory (bitwise);
// the rank-order sum of the partials equals the full model's result (rule M, fp32: 1e-5), and a whole
// TP forward (threads, LocalTpAllReduce) matches TP1 (rule M) with identical greedy tokens.
#include <gtest/gtest.h>

#include <thread>

#include "model_test_util.h"
#include "rank/model/local_tp.h"

namespace ddtree::model {
namespace {

using test::bitwise_equal;

void expect_same(const Mat& a, const Mat& b, const std::string& what) {
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_TRUE(a.w.size() == b.w.size() && bitwise_equal(a.w.data(), b.w.data(), a.w.size())) << what;
}
void expect_same(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  EXPECT_TRUE(a.size() == b.size() && bitwise_equal(a.data(), b.data(), a.size())) << what;
}
void expect_same(const MlpWeights& a, const MlpWeights& b, const std::string& what) {
  expect_same(a.gate, b.gate, what + ".gate");
  expect_same(a.up, b.up, what + ".up");
  expect_same(a.down, b.down, what + ".down");
}
void expect_same(const ModelWeights& a, const ModelWeights& b) {
  expect_same(a.embed, b.embed, "embed");
  expect_same(a.lm_head, b.lm_head, "lm_head");
  expect_same(a.final_norm, b.final_norm, "norm");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    expect_same(x.q_a, y.q_a, p + "q_a");
    expect_same(x.q_b, y.q_b, p + "q_b");
    expect_same(x.kv_a, y.kv_a, p + "kv_a");
    expect_same(x.kv_b, y.kv_b, p + "kv_b");
    expect_same(x.o, y.o, p + "o");
    expect_same(x.q_a_norm, y.q_a_norm, p + "q_a_norm");
    expect_same(x.kv_a_norm, y.kv_a_norm, p + "kv_a_norm");
    expect_same(x.input_norm, y.input_norm, p + "input_norm");
    expect_same(x.post_norm, y.post_norm, p + "post_norm");
    ASSERT_EQ(x.moe, y.moe);
    if (!x.moe) {
      expect_same(x.dense, y.dense, p + "mlp");
      continue;
    }
    expect_same(x.router, y.router, p + "router");
    expect_same(x.router_bias, y.router_bias, p + "router_bias");
    ASSERT_EQ(x.experts.size(), y.experts.size());
    for (std::size_t e = 0; e < x.experts.size(); ++e) expect_same(x.experts[e], y.experts[e], p + "expert " + std::to_string(e));
    expect_same(x.shared, y.shared, p + "shared");
  }
}

struct Tp : ::testing::TestWithParam<std::tuple<const char*, int>> {
  std::string dir() const { return test::fixture(std::get<0>(GetParam())); }
  int tp() const { return std::get<1>(GetParam()); }
};

TEST_P(Tp, LoadedSliceEqualsSlicedFullAndPartialsSum) {
  if (dir().empty()) GTEST_SKIP() << "fixture not set (run through ctest)";
  const Model full = Model::load(dir());
  const ModelConfig& c = full.config();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int S = tp();
  const int rows = 7;
  // Inputs: normed hidden states for the layer blocks, tokens spanning every vocabulary shard.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(std::size_t(rows * H));
  for (auto& v : x) v = nd(rng);
  std::vector<int32_t> tokens = {0, int32_t(V - 1), int32_t(V / 2), 1, int32_t(V / 3), int32_t(V - 2), 5};

  // Full-model reference results.
  const std::size_t rh = std::size_t(rows * H);
  std::vector<float> full_embed(rh), full_logits(std::size_t(rows * V));
  full.embed_partial(tokens.data(), rows, full_embed.data());
  full.lm_head(x.data(), rows, full_logits.data());
  std::vector<std::vector<float>> full_attn, full_mlp;
  auto run_blocks = [&](const Model& m, std::vector<std::vector<float>>& attn, std::vector<std::vector<float>>& mlp) {
    kv::LatentKvCache cache(m.kv_shape(16, 2, 1, 2));
    cache.reserve(0, rows);
    RequestRows rr;
    rr.n = rows;
    rr.tokens = tokens.data();
    for (int l = 0; l < int(c.num_hidden_layers); ++l) {
      attn.emplace_back(rh);
      mlp.emplace_back(rh);
      m.attention_partial(l, {rr}, x.data(), cache, attn.back().data());
      m.mlp_partial(l, x.data(), rows, mlp.back().data());
    }
  };
  run_blocks(full, full_attn, full_mlp);

  std::vector<float> sum_embed(rh, 0.0f);
  std::vector<std::vector<float>> sum_attn(full_attn.size(), std::vector<float>(rh, 0.0f)), sum_mlp = sum_attn;
  for (int r = 0; r < S; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(S));
    const Model shard = Model::load(dir(), ShardSpec{r, S});
    const Model sliced(c, ShardSpec{r, S}, slice_weights(full.weights(), c, ShardSpec{r, S}));
    expect_same(shard.weights(), sliced.weights());
    // Partial results: loaded shard == sliced full model, bitwise.
    std::vector<std::vector<float>> a1, m1, a2, m2;
    run_blocks(shard, a1, m1);
    run_blocks(sliced, a2, m2);
    for (std::size_t l = 0; l < a1.size(); ++l) {
      EXPECT_TRUE(bitwise_equal(a1[l].data(), a2[l].data(), rh)) << "attention partial, layer " << l;
      EXPECT_TRUE(bitwise_equal(m1[l].data(), m2[l].data(), rh)) << "mlp partial, layer " << l;
      for (std::size_t i = 0; i < rh; ++i) {
        sum_attn[l][i] = sum_attn[l][i] + a1[l][i];
        sum_mlp[l][i] = sum_mlp[l][i] + m1[l][i];
      }
    }
    std::vector<float> e(rh);
    shard.embed_partial(tokens.data(), rows, e.data());
    for (std::size_t i = 0; i < rh; ++i) sum_embed[i] = sum_embed[i] + e[i];
    // Vocabulary shard of the logits: bitwise the full model's columns (each logit is one dot product).
    const ShardRanges& g = shard.ranges();
    std::vector<float> lg(std::size_t(rows * g.vocab()));
    shard.lm_head(x.data(), rows, lg.data());
    for (int i = 0; i < rows; ++i)
      EXPECT_TRUE(bitwise_equal(&lg[std::size_t(i * g.vocab())], &full_logits[std::size_t(i * V + g.vocab0)],
                                std::size_t(g.vocab())))
          << "logit row " << i;
  }
  EXPECT_TRUE(bitwise_equal(sum_embed.data(), full_embed.data(), rh)) << "embedding partials sum exactly";
  for (std::size_t l = 0; l < full_attn.size(); ++l) {
    EXPECT_LT(test::max_rel_err(sum_attn[l].data(), full_attn[l].data(), rows, std::size_t(H)), 1e-5) << "layer " << l;
    EXPECT_LT(test::max_rel_err(sum_mlp[l].data(), full_mlp[l].data(), rows, std::size_t(H)), 1e-5) << "layer " << l;
  }
}

TEST_P(Tp, WholeForwardMatchesTp1) {
  if (dir().empty()) GTEST_SKIP() << "fixture not set (run through ctest)";
  const int S = tp();
  const Model full = Model::load(dir());
  const int64_t V = full.config().vocab_size;
  const auto tokens = test::random_tokens(21, 12, V);
  const std::vector<float> ref = test::prefill_logits(full, tokens);
  std::vector<std::unique_ptr<Model>> shards;
  LocalTpAllReduce ar(S);
  for (int r = 0; r < S; ++r) {
    shards.push_back(std::make_unique<Model>(Model::load(dir(), ShardSpec{r, S})));
    shards.back()->set_all_reduce(ar.fn(r));
  }
  std::vector<std::vector<float>> logits(static_cast<std::size_t>(S));
  std::vector<std::thread> th;
  for (int r = 0; r < S; ++r)
    th.emplace_back([&, r] { logits[std::size_t(r)] = test::prefill_logits(*shards[std::size_t(r)], tokens); });
  for (auto& t : th) t.join();
  std::vector<float> got(ref.size());
  for (int r = 0; r < S; ++r) {
    const ShardRanges& g = shards[std::size_t(r)]->ranges();
    for (std::size_t i = 0; i < tokens.size(); ++i)
      std::copy_n(&logits[std::size_t(r)][i * std::size_t(g.vocab())], g.vocab(), &got[i * std::size_t(V) + std::size_t(g.vocab0)]);
  }
  EXPECT_LT(test::max_rel_err(got.data(), ref.data(), tokens.size(), std::size_t(V)), 1e-5);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const float* a = &got[i * std::size_t(V)];
    const float* b = &ref[i * std::size_t(V)];
    EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "argmax of row " << i;
  }
}

TEST(TpShards, RefusesIndivisibleSplits) {
  const std::string dir = test::fixture("DDTREE_TEST_MODEL_MOE");
  if (dir.empty()) GTEST_SKIP();
  EXPECT_THROW(Model::load(dir, ShardSpec{0, 3}), ConfigError);  // 4 heads over 3 ranks
  EXPECT_THROW(Model::load(dir, ShardSpec{2, 2}), ConfigError);
  const ModelConfig c = load_config(dir);
  const ShardRanges g = shard_ranges(c, ShardSpec{3, 4});  // vocab 3001: shards of 751, the last 748
  EXPECT_EQ(g.vocab0, 2253);
  EXPECT_EQ(g.vocab1, 3001);
  EXPECT_EQ(g.head0, 3);
  EXPECT_EQ(g.moe_inter0, 96);
}

INSTANTIATE_TEST_SUITE_P(Generated, Tp,
                         ::testing::Combine(::testing::Values("DDTREE_TEST_MODEL_MOE", "DDTREE_TEST_MODEL_DENSE"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return std::string(std::string(std::get<0>(info.param)) == "DDTREE_TEST_MODEL_MOE" ? "moe"
                                                                                                               : "dense") +
                                  "_tp" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ddtree::model
