// Forward modes on the cpu backend, rule E (bitwise) throughout:
//  - decode after prefill (and chunked prefill across page boundaries) equals one prefill of the longer
//    sequence;
//  - a row's logits do not depend on the other requests in the batch;
//  - tree verify with the tree builder's real layout (slots P + i, positions P + depth, ancestor bitmask)
//    equals running each root-to-node path as a plain sequence, with another request in the same step;
//  - after accept + KV compaction, decoding the bonus token equals the plain sequence.
// On both generated checkpoints (MoE + q LoRA + YaRN; dense + q_proj + plain RoPE).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "ddtree/kernels.h"
#include "model_test_util.h"

namespace ddtree::model {
namespace {

using test::bitwise_equal;

struct Fixtures : ::testing::TestWithParam<const char*> {
  std::string dir() const { return test::fixture(GetParam()); }
};

#define LOAD_OR_SKIP(m)                                                   \
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not set (run through ctest)"; \
  const Model m = Model::load(dir());

TEST_P(Fixtures, DecodeAfterPrefillEqualsPrefill) {
  LOAD_OR_SKIP(m);
  const int64_t V = m.config().vocab_size;
  const auto tokens = test::random_tokens(7, 21, V);
  const std::vector<float> full = test::prefill_logits(m, tokens);
  // Chunkings: all decode; prefill 1 then decode; chunks straddling the page size 4 (+-1); one big chunk.
  for (const std::vector<int>& chunks : std::vector<std::vector<int>>{
           std::vector<int>(21, 1), {1, 20}, {3, 1, 5, 4, 8}, {4, 4, 4, 4, 4, 1}, {9, 12}, {21}}) {
    kv::LatentKvCache cache(m.kv_shape(4, 8, 1, 8));
    cache.fill(std::nanf(""));  // an unwritten row would poison the logits
    cache.reserve(0, 21);
    std::vector<float> got;
    int64_t p = 0;
    for (int n : chunks) {
      RequestRows rr;
      rr.prefix_len = p;
      rr.n = n;
      rr.tokens = &tokens[std::size_t(p)];
      ForwardResult out;
      m.forward({rr}, cache, out);
      got.insert(got.end(), out.logits.begin(), out.logits.end());
      p += n;
    }
    ASSERT_EQ(got.size(), full.size());
    std::size_t at = 0;
    EXPECT_TRUE(bitwise_equal(got.data(), full.data(), full.size(), &at))
        << "chunks of first size " << chunks[0] << ": first difference at row " << at / std::size_t(V);
  }
}

TEST_P(Fixtures, BatchInvariance) {
  LOAD_OR_SKIP(m);
  const int64_t V = m.config().vocab_size;
  const auto a = test::random_tokens(11, 9, V), b = test::random_tokens(12, 17, V), c = test::random_tokens(13, 1, V);
  const auto la = test::prefill_logits(m, a), lb = test::prefill_logits(m, b), lc = test::prefill_logits(m, c);
  kv::LatentKvCache cache(m.kv_shape(16, 8, 3, 4));
  cache.reserve(0, 17);
  cache.reserve(1, 9);
  cache.reserve(2, 1);
  // Requests in a different order from their cache rows.
  std::vector<RequestRows> batch(3);
  batch[0].kv_request = 1; batch[0].n = 9; batch[0].tokens = a.data();
  batch[1].kv_request = 0; batch[1].n = 17; batch[1].tokens = b.data();
  batch[2].kv_request = 2; batch[2].n = 1; batch[2].tokens = c.data();
  ForwardResult out;
  m.forward(batch, cache, out);
  ASSERT_EQ(out.rows, 27);
  EXPECT_TRUE(bitwise_equal(out.logits.data(), la.data(), la.size()));
  EXPECT_TRUE(bitwise_equal(out.logits.data() + 9 * V, lb.data(), lb.size()));
  EXPECT_TRUE(bitwise_equal(out.logits.data() + 26 * V, lc.data(), lc.size()));
}

// A DDTree from the real tree builder over random draft distributions.
struct BuiltTree {
  int n = 0, w = 0, count = 0;
  std::vector<int32_t> tokens, parents, depths, slots, positions, first_child, next_sibling;
  std::vector<float> scores;
  std::vector<uint64_t> vis;
};

BuiltTree build_tree(uint64_t seed, int64_t vocab, int32_t root, int32_t prefix, int budget, int depth, int k) {
  std::mt19937_64 rng(seed);
  std::vector<float> lp(static_cast<std::size_t>(depth * k));
  std::vector<int32_t> ids(static_cast<std::size_t>(depth * k));
  for (int d = 0; d < depth; ++d) {
    std::vector<int32_t> perm(static_cast<std::size_t>(vocab));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::exponential_distribution<float> ex(1.0f);
    float acc = 0.0f;
    for (int r = 0; r < k; ++r) {
      acc -= ex(rng);  // descending log-probs
      lp[std::size_t(d * k + r)] = acc;
      ids[std::size_t(d * k + r)] = perm[std::size_t(r)];
    }
  }
  BuiltTree t;
  t.n = budget + 1;
  t.w = (t.n + 63) / 64;
  for (auto* v : {&t.tokens, &t.parents, &t.depths, &t.slots, &t.positions, &t.first_child, &t.next_sibling})
    v->assign(std::size_t(t.n), -7);
  t.scores.assign(std::size_t(t.n), 0.0f);
  t.vis.assign(std::size_t(t.n * t.w), 0);
  int32_t count = 0;
  uint32_t status = 0;
  ddt_tree_build_params p{lp.data(), ids.data(), &root, &prefix, 1, depth, k, budget, t.tokens.data(),
                          t.parents.data(), t.depths.data(), t.scores.data(), t.slots.data(), t.positions.data(),
                          t.vis.data(), t.first_child.data(), t.next_sibling.data(), &count, &status};
  EXPECT_EQ(ddt_tree_build_cpu(&p), DDT_OK) << ddt_last_error_message();
  t.count = count;
  return t;
}

// Root-to-node tokens of node i (padding nodes: root, then the node itself, as their vis row {0, i} says).
std::vector<int32_t> path_tokens(const BuiltTree& t, int i) {
  std::vector<int32_t> path;
  if (i >= t.count) return {t.tokens[0], t.tokens[std::size_t(i)]};
  for (int j = i; j >= 0; j = t.parents[std::size_t(j)]) path.push_back(t.tokens[std::size_t(j)]);
  std::reverse(path.begin(), path.end());
  return path;
}
std::vector<int32_t> path_nodes(const BuiltTree& t, int i) {
  std::vector<int32_t> path;
  for (int j = i; j >= 0; j = t.parents[std::size_t(j)]) path.push_back(j);
  std::reverse(path.begin(), path.end());
  return path;
}

TEST_P(Fixtures, TreeVerifyEqualsPathsAndCompaction) {
  LOAD_OR_SKIP(m);
  const int64_t V = m.config().vocab_size;
  const int page = 16;
  struct Case { int prefix, budget, depth, k; uint64_t seed; };
  // Prefix 0, page boundaries +-1, trees from chains (k = 1) to bushy; budgets past 64 (two vis words).
  for (const Case& cs : {Case{0, 6, 6, 1, 1}, Case{15, 12, 4, 4, 2}, Case{16, 20, 3, 8, 3}, Case{17, 70, 6, 6, 4},
                         Case{5, 9, 1, 9, 5}}) {
    SCOPED_TRACE("prefix " + std::to_string(cs.prefix) + " budget " + std::to_string(cs.budget));
    const auto prefix = test::random_tokens(100 + cs.seed, cs.prefix + 1, V);  // last one = the root token
    const std::vector<int32_t> pre(prefix.begin(), prefix.end() - 1);
    const BuiltTree t = build_tree(cs.seed, V, prefix.back(), cs.prefix, cs.budget, cs.depth, cs.k);
    ASSERT_GT(t.count, 1);
    const int pages = (cs.prefix + t.n + 2 + page - 1) / page + 1;
    kv::LatentKvCache cache(m.kv_shape(page, pages + 1, 2, pages));
    cache.fill(std::nanf(""));
    cache.reserve(0, cs.prefix + t.n + 1);
    cache.reserve(1, 5);
    ForwardResult out;
    if (cs.prefix > 0) {
      RequestRows rr;
      rr.n = cs.prefix;
      rr.tokens = pre.data();
      m.forward({rr}, cache, out);
    }
    RequestRows tree;
    tree.prefix_len = cs.prefix;
    tree.n = t.n;
    tree.tokens = t.tokens.data();
    tree.positions = t.positions.data();
    tree.slots = t.slots.data();
    tree.vis = t.vis.data();
    // Another request's prefill rides in the same step, ahead of the tree (any batch mix: rule E).
    const auto other_tokens = test::random_tokens(200 + cs.seed, 5, V);
    RequestRows other;
    other.kv_request = 1;
    other.n = 5;
    other.tokens = other_tokens.data();
    ForwardResult verify;
    m.forward({other, tree}, cache, verify);
    ASSERT_EQ(verify.rows, t.n + 5);
    verify.logits.erase(verify.logits.begin(), verify.logits.begin() + 5 * V);
    int deepest = 0;
    for (int i = 0; i < t.n; ++i) {
      std::vector<int32_t> seq = pre;
      const auto path = path_tokens(t, i);
      seq.insert(seq.end(), path.begin(), path.end());
      const std::vector<float> ref = test::prefill_logits(m, seq);
      const float* last = ref.data() + (seq.size() - 1) * std::size_t(V);
      EXPECT_TRUE(bitwise_equal(verify.logits.data() + std::size_t(i) * V, last, std::size_t(V)))
          << "node " << i << " (depth " << t.depths[std::size_t(i)] << ", " << (i < t.count ? "real" : "padding") << ")";
      if (i < t.count && t.depths[std::size_t(i)] > t.depths[std::size_t(deepest)]) deepest = i;
    }
    // Accept the path to the deepest node, compact, decode the bonus token: equals the plain sequence.
    const auto nodes = path_nodes(t, deepest);
    cache.compact_accepted(0, cs.prefix, nodes.data(), int(nodes.size()));
    cache.truncate(0, cs.prefix + int64_t(nodes.size()) + 1);
    const float* lg = verify.logits.data() + std::size_t(deepest) * V;
    const int32_t bonus = int32_t(std::max_element(lg, lg + V) - lg);
    RequestRows dec;
    dec.prefix_len = cs.prefix + int64_t(nodes.size());
    dec.n = 1;
    dec.tokens = &bonus;
    ForwardResult next;
    m.forward({dec}, cache, next);
    std::vector<int32_t> seq = pre;
    const auto path = path_tokens(t, deepest);
    seq.insert(seq.end(), path.begin(), path.end());
    seq.push_back(bonus);
    const std::vector<float> ref = test::prefill_logits(m, seq);
    EXPECT_TRUE(bitwise_equal(next.logits.data(), ref.data() + (seq.size() - 1) * std::size_t(V), std::size_t(V)))
        << "decode after compaction of a path of " << nodes.size() << " nodes";
  }
}

TEST_P(Fixtures, RejectsMalformedRows) {
  LOAD_OR_SKIP(m);
  kv::LatentKvCache cache(m.kv_shape(16, 4, 2, 4));
  cache.reserve(0, 8);
  const int32_t toks[3] = {1, 2, 3};
  ForwardResult out;
  RequestRows rr;
  rr.n = 3;
  rr.tokens = toks;
  auto expect_bad = [&](RequestRows r, const char* what) {
    EXPECT_THROW(m.forward({r}, cache, out), std::invalid_argument) << what;
  };
  RequestRows r = rr;
  r.prefix_len = 14;
  expect_bad(r, "slots beyond the reserved pages");
  r = rr;
  r.kv_request = 1;
  expect_bad(r, "request without pages");
  const int32_t bad_tok[3] = {1, int32_t(m.config().vocab_size), 3};
  r = rr;
  r.tokens = bad_tok;
  expect_bad(r, "token outside the vocabulary");
  const uint64_t no_self[3] = {1, 1, 5};  // row 1 lacks bit 1
  r = rr;
  r.vis = no_self;
  expect_bad(r, "vis row without its own bit");
  const uint64_t future[3] = {1 | 4, 3, 7};
  r = rr;
  r.vis = future;
  expect_bad(r, "vis row that sees a later row");
  const int32_t slots[3] = {0, 2, 1};
  r = rr;
  r.slots = slots;
  expect_bad(r, "slots not prefix_len + i");
  EXPECT_THROW(m.forward({}, cache, out), std::invalid_argument);
  EXPECT_THROW(m.forward({rr, rr}, cache, out), std::invalid_argument);  // same KV row twice
}

INSTANTIATE_TEST_SUITE_P(Generated, Fixtures, ::testing::Values("DDTREE_TEST_MODEL_MOE", "DDTREE_TEST_MODEL_DENSE"),
                         [](const auto& info) {
                           return std::string(info.param) == "DDTREE_TEST_MODEL_MOE" ? "moe" : "dense";
                         });

}  // namespace
}  // namespace ddtree::model
