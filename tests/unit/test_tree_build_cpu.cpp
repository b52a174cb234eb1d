// DDTree builder CPU twin: brute force (the B best prefixes by summed log-prob), structural invariants,
// the mask / slot / position layout, padding and argument errors (reference/ddtree.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "ddtree/kernels.h"
#include "test_util.h"

using namespace ddtree;

namespace {

// Every prefix (r_1..r_d) of ranks with finite log-probs, d <= L, whose score (summed root to leaf in
// f32) is >= tau; pruned since a child's score is not above its parent's.
void enumerate(const float* lp, int L, int K, int d, float score, float tau, std::vector<float>& out, size_t cap) {
  if (d == L || out.size() > cap) return;
  for (int r = 0; r < K; ++r) {
    const float v = lp[d * K + r];
    if (!(v > -test::kInf)) continue;
    const float s = score + v;
    if (s < tau) continue;
    out.push_back(s);
    enumerate(lp, L, K, d + 1, s, tau, out, cap);
  }
}

// Structural invariants of request b of a built tree; returns the node count.
int check_invariants(const test::Tree& t, const test::Draft& d, int b, int32_t root, int32_t prefix) {
  const int N = t.n, W = t.w;
  const int64_t o = int64_t(b) * N;
  const int count = t.node_count[b];
  EXPECT_GE(count, 1);
  EXPECT_LE(count, N);
  EXPECT_EQ(t.tokens[o], root);
  EXPECT_EQ(t.parents[o], -1);
  EXPECT_EQ(t.depths[o], 0);
  EXPECT_EQ(t.scores[o], 0.0f);
  std::vector<std::vector<int>> children(N);
  for (int i = 0; i < N; ++i) {
    EXPECT_EQ(t.slots[o + i], prefix + i);
    EXPECT_EQ(t.positions[o + i], prefix + t.depths[o + i]);
    // vis row = ancestors (padding: {0, i})
    std::set<int> anc;
    if (i < count) {
      for (int j = i; j >= 0; j = t.parents[o + j]) anc.insert(j);
    } else {
      anc = {0, i};
    }
    for (int j = 0; j < W * 64; ++j) {
      const bool bit = (t.vis[(o + i) * W + j / 64] >> (j % 64)) & 1;
      EXPECT_EQ(bit, anc.count(j) == 1) << "vis b=" << b << " i=" << i << " j=" << j;
    }
    if (i == 0) continue;
    if (i >= count) {  // padding
      EXPECT_EQ(t.parents[o + i], -1);
      EXPECT_EQ(t.depths[o + i], 1);
      EXPECT_EQ(t.tokens[o + i], root);
      EXPECT_EQ(t.scores[o + i], -test::kInf);
      EXPECT_EQ(t.first_child[o + i], -1);
      EXPECT_EQ(t.next_sibling[o + i], -1);
      continue;
    }
    const int pa = t.parents[o + i], dep = t.depths[o + i];
    EXPECT_GE(pa, 0);
    EXPECT_LT(pa, i);
    EXPECT_EQ(dep, t.depths[o + pa] + 1);
    EXPECT_LE(dep, d.depth);
    EXPECT_LE(t.scores[o + i], t.scores[o + pa]);
    // token and score come from the draft: score = parent's + lp of that token at depth dep
    const float* lp = d.lp.data() + (int64_t(b) * d.depth + dep - 1) * d.k;
    const int32_t* ids = d.ids.data() + (int64_t(b) * d.depth + dep - 1) * d.k;
    const int r = int(std::find(ids, ids + d.k, t.tokens[o + i]) - ids);
    EXPECT_LT(r, d.k);
    if (r < d.k) {
      EXPECT_EQ(t.scores[o + i], t.scores[o + pa] + lp[r]) << "scores summed root to leaf";
    }
    children[pa].push_back(i);
  }
  for (int i = 0; i < count; ++i) {
    // links = children in pop (index) order; siblings carry distinct tokens
    std::vector<int> linked;
    for (int c = t.first_child[o + i]; c != -1 && linked.size() <= size_t(N); c = t.next_sibling[o + c]) linked.push_back(c);
    EXPECT_EQ(linked, children[i]) << "child list of node " << i;
    std::set<int32_t> toks;
    for (int c : children[i]) toks.insert(t.tokens[o + c]);
    EXPECT_EQ(toks.size(), children[i].size());
  }
  return count;
}

struct BuildCase { int batch, depth, k, budget, vocab; float tie, ninf; };

}  // namespace

class TreeBuildCpu : public ::testing::TestWithParam<BuildCase> {};

TEST_P(TreeBuildCpu, BestPrefixesAndInvariants) {
  const BuildCase c = GetParam();
  std::mt19937_64 rng(c.batch * 7919 + c.depth * 31 + c.budget);
  auto d = test::random_draft(rng, c.batch, c.depth, c.k, c.vocab, c.tie, c.ninf);
  std::vector<int32_t> roots(c.batch), prefix(c.batch);
  for (int b = 0; b < c.batch; ++b) { roots[b] = 3 + b; prefix[b] = b * 63; }
  test::Tree t(c.batch, c.budget);
  auto p = t.params(d, roots, prefix, c.budget);
  ASSERT_EQ(ddt_tree_build_cpu(&p), DDT_OK);
  EXPECT_EQ(t.status, 0u);
  for (int b = 0; b < c.batch; ++b) {
    const int count = check_invariants(t, d, b, roots[b], prefix[b]);
    // Brute force: the tree's scores are exactly the B best prefix scores (multiset), so the B-th
    // boundary is respected whatever the ties. Enumerate every prefix scoring >= the tree's lowest score
    // (all finite prefixes when the tree is not full): a missing better prefix or an included worse one
    // changes the comparison.
    std::vector<float> got(t.scores.begin() + int64_t(b) * t.n + 1, t.scores.begin() + int64_t(b) * t.n + count);
    std::sort(got.begin(), got.end(), std::greater<float>());
    const float tau = (count - 1 == c.budget) ? got.back() : -test::kInf;
    std::vector<float> all;
    const size_t cap = size_t(1) << 22;
    enumerate(d.lp.data() + int64_t(b) * c.depth * c.k, c.depth, c.k, 0, 0.0f, tau, all, cap);
    ASSERT_LE(all.size(), cap) << "case too large for brute force";
    std::sort(all.begin(), all.end(), std::greater<float>());
    const size_t want = std::min<size_t>(all.size(), c.budget);
    EXPECT_EQ(size_t(count - 1), want);
    EXPECT_EQ(got, std::vector<float>(all.begin(), all.begin() + want)) << "request " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Small, TreeBuildCpu, ::testing::Values(
    BuildCase{1, 1, 4, 3, 10, 0.3f, 0.1f}, BuildCase{3, 3, 4, 10, 8, 0.5f, 0.2f}, BuildCase{2, 4, 3, 40, 6, 0.6f, 0.0f},
    BuildCase{4, 6, 3, 64, 5, 0.7f, 0.3f}, BuildCase{2, 5, 5, 200, 9, 0.2f, 0.1f}, BuildCase{1, 8, 3, 511, 4, 0.5f, 0.1f},
    BuildCase{2, 7, 4, 512, 6, 0.4f, 0.2f}, BuildCase{1, 32, 2, 100, 2, 0.0f, 0.0f} /* deep */,
    BuildCase{1, 2, 64, 60, 64, 0.5f, 0.0f} /* bushy */, BuildCase{2, 9, 1, 16, 3, 0.0f, 0.0f} /* chain */));

TEST(TreeBuildCpu, ExactTiesFollowPushOrder) {
  // All log-probs equal: pops go in push (seq) order, a breadth-first-like order fixed by the algorithm:
  // root child (seq0) -> its sibling (seq1) and child (seq2) -> ...
  const int L = 3, K = 2, B = 6;
  test::Draft d{1, L, K, 2, std::vector<float>(L * K, -0.5f), {10, 11, 20, 21, 30, 31}};
  std::vector<int32_t> roots{1}, prefix{0};
  test::Tree t(1, B);
  auto p = t.params(d, roots, prefix, B);
  ASSERT_EQ(ddt_tree_build_cpu(&p), DDT_OK);
  // Hand-run of reference/ddtree.md (max score first, ties to the smaller seq):
  // pop seq0 (node1: d1 r0) -> push seq1 (d1 r1, -0.5), seq2 (child of 1, -1.0)
  // pop seq1 (node2: d1 r1) -> push seq3 (child of 2, -1.0)
  // pop seq2 (node3: d2 r0 under 1) -> push seq4 (d2 r1 under 1, -1.0), seq5 (child of 3, -1.5)
  // pop seq3 (node4: d2 r0 under 2) -> push seq6 (d2 r1 under 2, -1.0), seq7 (child of 4, -1.5)
  // pop seq4 (node5: d2 r1 under 1) -> push seq8 (-1.5); pop seq6 (node6: d2 r1 under 2).
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{1, 10, 11, 20, 20, 21, 21}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, 0, 1, 2, 1, 2}));
  EXPECT_EQ(t.first_child, (std::vector<int32_t>{1, 3, 4, -1, -1, -1, -1}));
  EXPECT_EQ(t.next_sibling, (std::vector<int32_t>{-1, 2, -1, 5, 6, -1, -1}));
}

TEST(TreeBuildCpu, NanLogProbsAreFlaggedAndNeverPushed) {
  const int L = 2, K = 3, B = 8;
  test::Draft d{1, L, K, 3, {-0.1f, std::nanf(""), -1.0f, -0.2f, -test::kInf, -test::kInf}, {1, 2, 3, 4, 5, 6}};
  std::vector<int32_t> roots{0}, prefix{5};
  test::Tree t(1, B);
  auto p = t.params(d, roots, prefix, B);
  ASSERT_EQ(ddt_tree_build_cpu(&p), DDT_OK);
  EXPECT_EQ(t.status, uint32_t(DDT_DATA_NAN_LOGIT));
  // depth1: token 1 only (the NaN rank stops the sibling chain); depth 2: token 4 under it.
  EXPECT_EQ(t.node_count[0], 3);
  EXPECT_EQ(t.tokens[1], 1);
  EXPECT_EQ(t.tokens[2], 4);
}

TEST(TreeBuildCpu, ArgumentErrors) {
  std::mt19937_64 rng(5);
  auto d = test::random_draft(rng, 1, 2, 4, 8);
  std::vector<int32_t> roots{0}, prefix{0};
  test::Tree t(1, 4);
  auto p = t.params(d, roots, prefix, 4);
  EXPECT_EQ(ddt_tree_build_cpu(&p), DDT_OK);
  auto q = p; q.budget = 0;
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_BUDGET);
  q = p; q.budget = DDT_MAX_BUDGET + 1;
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_BUDGET);
  q = p; q.depth = 0;
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_DEPTH);
  q = p; q.depth = DDT_MAX_DEPTH + 1;
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_DEPTH);
  q = p; q.vis = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(t.vis.data()) + 4);
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_ALIGN);
  q = p; q.node_count = nullptr;
  EXPECT_EQ(ddt_tree_build_cpu(&q), DDT_ERR_NULL);
  EXPECT_NE(std::string(ddt_last_error_message()).find("node_count"), std::string::npos);
}
