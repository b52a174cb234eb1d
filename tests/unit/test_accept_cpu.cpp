// Accept CPU twin: greedy walk equals a direct walk over the child lists; sampled accept equals plain
// Gumbel-max sampling at each output position (rule E) and matches the target distribution (rule D);
// stop tokens, max_new, malformed trees and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "ddtree/kernels.h"
#include "test_util.h"

using namespace ddtree;

namespace {

struct Accepted {
  std::vector<int32_t> path, path_len, new_tokens, num_new, bonus, finished;
  uint32_t status = 0;
};

// Builds trees, makes target logits in which node i's argmax is, with probability p_follow, the token of
// one of its children (so acceptance actually happens), then runs keys + accept on the CPU twin.
struct Scenario {
  int batch, budget, depth, vocab, n;
  test::Draft draft;
  test::Tree tree;
  std::vector<float> logits;  // [batch * n, vocab]
  std::vector<int32_t> roots, prefix;
  Scenario(std::mt19937_64& rng, int batch_, int budget_, int depth_, int vocab_, float p_follow)
      : batch(batch_), budget(budget_), depth(depth_), vocab(vocab_), n(budget_ + 1),
        draft(test::random_draft(rng, batch_, depth_, std::min(budget_, vocab_), vocab_, 0.2f, 0.0f, 4.0f)),  // peaked: deep trees
        tree(batch_, budget_) {
    roots.resize(batch); prefix.resize(batch);
    for (int b = 0; b < batch; ++b) { roots[b] = int32_t(rng() % vocab); prefix[b] = int32_t(rng() % 100); }
    auto p = tree.params(draft, roots, prefix, budget);
    EXPECT_EQ(ddt_tree_build_cpu(&p), DDT_OK);
    logits = test::random_logits(rng, int64_t(batch) * n, vocab, 0.0f, 0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0, 1);
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < tree.node_count[b]; ++i) {
        const int64_t o = int64_t(b) * n;
        std::vector<int> kids;
        for (int c = tree.first_child[o + i]; c != -1; c = tree.next_sibling[o + c]) kids.push_back(c);
        if (kids.empty() || u(rng) > p_follow) continue;
        // mostly the first child (the best-scored, with the deepest subtree), sometimes another
        const int32_t tok = tree.tokens[o + kids[u(rng) < 0.7f ? 0 : rng() % kids.size()]];
        logits[(o + i) * vocab + tok] = 8.0f;  // clear argmax (and likely sample at T = 1)
      }
  }
  Accepted run(float temperature, const std::vector<uint64_t>& seeds, const std::vector<int32_t>& max_new,
               const std::vector<int32_t>& stops) {
    std::vector<uint64_t> keys(size_t(batch) * n, 0xBADull);
    uint32_t st = 0;
    ddt_sample_keys_params kp{logits.data(), vocab, batch, n, vocab, 0, tree.positions.data(), seeds.data(),
                              temperature, keys.data(), &st};
    EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_OK);
    const int mp = depth + 1;
    Accepted a;
    a.path.assign(size_t(batch) * mp, -9); a.new_tokens.assign(size_t(batch) * mp, -9);
    a.path_len.assign(batch, -9); a.num_new.assign(batch, -9); a.bonus.assign(batch, -9); a.finished.assign(batch, -9);
    ddt_accept_params ap{keys.data(), tree.tokens.data(), tree.parents.data(), tree.node_count.data(), batch, n, mp,
                         max_new.data(), stops.data(), int(stops.size()), a.path.data(), a.path_len.data(),
                         a.new_tokens.data(), a.num_new.data(), a.bonus.data(), a.finished.data(), &a.status};
    EXPECT_EQ(ddt_accept_cpu(&ap), DDT_OK);
    return a;
  }
};

// Independent plain-decoding sampler: argmax over v of logit/T + gumbel(seed, pos, v) (greedy at T = 0),
// ties to the smaller id, computed here without the packed keys.
int32_t plain_sample(const float* logits, int vocab, float T, uint64_t seed, int64_t pos) {
  int32_t best = -1;
  float bv = 0;
  for (int v = 0; v < vocab; ++v) {
    const float x = T == 0.0f ? logits[v] : logits[v] / T + ddt_gumbel(seed, pos, v);
    if (best < 0 || x > bv) { best = v; bv = x; }
  }
  return best;
}

}  // namespace

TEST(AcceptCpu, GreedyEqualsDirectWalkAndPlainDecoding) {
  std::mt19937_64 rng(11);
  std::map<int, int> hist;  // accepted tokens per request step -> count
  for (int rep = 0; rep < 20; ++rep) {
    Scenario s(rng, 8, 1 + int(rng() % 64), 1 + int(rng() % 8), 12 + int(rng() % 50), 0.8f);
    std::vector<uint64_t> seeds(s.batch, 0);
    std::vector<int32_t> max_new(s.batch, 1000);
    Accepted a = s.run(0.0f, seeds, max_new, {});
    EXPECT_EQ(a.status, 0u);
    const int mp = s.depth + 1;
    for (int b = 0; b < s.batch; ++b) {
      const int64_t o = int64_t(b) * s.n;
      // Direct walk over first_child / next_sibling with the plain argmax of each node's logits.
      std::vector<int32_t> path{0}, toks;
      int cur = 0;
      while (true) {
        const int32_t g = plain_sample(&s.logits[(o + cur) * s.vocab], s.vocab, 0.0f, 0, 0);
        int c = s.tree.first_child[o + cur];
        while (c != -1 && s.tree.tokens[o + c] != g) c = s.tree.next_sibling[o + c];
        toks.push_back(g);
        if (c == -1) break;
        path.push_back(c);
        cur = c;
      }
      // toks = target tokens along the path: the emitted tokens are exactly these (tok[child] == g[parent]).
      ASSERT_EQ(a.path_len[b], int(path.size()));
      ASSERT_EQ(a.num_new[b], int(toks.size()));
      for (size_t j = 0; j < path.size(); ++j) ASSERT_EQ(a.path[b * mp + j], path[j]);
      for (size_t j = path.size(); j < size_t(mp); ++j) ASSERT_EQ(a.path[b * mp + j], -1);
      for (size_t j = 0; j < toks.size(); ++j) ASSERT_EQ(a.new_tokens[b * mp + j], toks[j]);
      ASSERT_EQ(a.bonus[b], toks.back());
      ASSERT_EQ(a.finished[b], 0);
      hist[a.path_len[b] - 1]++;
    }
  }
  // The test must exercise acceptance: zero and several accepted drafts both occur.
  EXPECT_GT(hist[0], 0);
  EXPECT_GT(hist.rbegin()->first, 3);
}

TEST(AcceptCpu, SampledEqualsPlainSamplingAtEachPosition) {
  std::mt19937_64 rng(12);
  int differs_from_greedy = 0, emitted_total = 0, accepted_total = 0;
  for (int rep = 0; rep < 20; ++rep) {
    Scenario s(rng, 6, 1 + int(rng() % 48), 1 + int(rng() % 6), 10 + int(rng() % 30), 0.9f);
    std::vector<uint64_t> seeds(s.batch);
    for (auto& x : seeds) x = rng();
    std::vector<int32_t> max_new(s.batch, 1000);
    const float T = 1.0f;
    Accepted a = s.run(T, seeds, max_new, {});
    const int mp = s.depth + 1;
    for (int b = 0; b < s.batch; ++b) {
      const int64_t o = int64_t(b) * s.n;
      // Rule E: emitted token j was sampled at node path[j] (the parent of path[j+1]) at its output
      // position prefix + j + 1, exactly as plain sampling of that position would.
      for (int j = 0; j < a.num_new[b]; ++j) {
        const int node = a.path[b * mp + j];
        ASSERT_EQ(s.tree.positions[o + node], s.prefix[b] + j);
        const int32_t want = plain_sample(&s.logits[(o + node) * s.vocab], s.vocab, T, seeds[b], s.prefix[b] + j + 1);
        ASSERT_EQ(a.new_tokens[b * mp + j], want) << "request " << b << " token " << j;
        differs_from_greedy += want != plain_sample(&s.logits[(o + node) * s.vocab], s.vocab, 0.0f, 0, 0);
        ++emitted_total;
      }
      accepted_total += a.path_len[b] - 1;
      // The walk stopped because no child carries the sampled bonus token.
      const int last = a.path[b * mp + a.path_len[b] - 1];
      for (int c = s.tree.first_child[o + last]; c != -1; c = s.tree.next_sibling[o + c])
        ASSERT_NE(s.tree.tokens[o + c], a.bonus[b]);
    }
  }
  EXPECT_GT(accepted_total, 0);
  EXPECT_GE(differs_from_greedy * 5, emitted_total) << "sampled output must differ from greedy at >= 20%";
}

TEST(AcceptCpu, SampledKeysFollowTheTargetDistribution) {
  // Rule D: chi-square over many draws (one row per output position, fixed seed), tiny vocabulary,
  // T >= 1, top-1 probability <= 0.7. Critical values at p = 1e-3.
  const double kCrit[] = {0, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588};
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  const int V = int(logits.size());
  for (float T : {1.0f, 1.7f}) {
    const int draws = 60000;
    std::vector<float> x(size_t(draws) * 8);
    std::vector<int32_t> pos(draws);
    for (int i = 0; i < draws; ++i) { std::copy(logits.begin(), logits.end(), x.begin() + size_t(i) * 8); pos[i] = i; }
    std::vector<uint64_t> keys(draws), seeds{424242};
    uint32_t st = 0;
    ddt_sample_keys_params kp{x.data(), 8, 1, draws, V, 0, pos.data(), seeds.data(), T, keys.data(), &st};
    ASSERT_EQ(ddt_sample_keys_cpu(&kp), DDT_OK);
    std::vector<double> cnt(V, 0), prob(V);
    for (auto k : keys) cnt[ddt_key_token(k)] += 1;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(double(logits[v]) / T);
    double chi2 = 0, pmax = 0;
    for (int v = 0; v < V; ++v) {
      prob[v] = std::exp(double(logits[v]) / T) / z;
      pmax = std::max(pmax, prob[v]);
      const double e = prob[v] * draws;
      chi2 += (cnt[v] - e) * (cnt[v] - e) / e;
    }
    ASSERT_LE(pmax, 0.7);
    EXPECT_LT(chi2, kCrit[V - 1]) << "T=" << T;
  }
}

TEST(AcceptCpu, StopTokensAndMaxNewTruncate) {
  std::mt19937_64 rng(13);
  Scenario s(rng, 16, 32, 6, 20, 1.0f);
  std::vector<uint64_t> seeds(s.batch, 0);
  std::vector<int32_t> unlimited(s.batch, 1000);
  Accepted full = s.run(0.0f, seeds, unlimited, {});
  const int mp = s.depth + 1;
  // max_new: cut every request to 2 tokens (or 0 for request 0).
  std::vector<int32_t> two(s.batch, 2);
  two[0] = 0;
  Accepted cut = s.run(0.0f, seeds, two, {});
  for (int b = 0; b < s.batch; ++b) {
    const int want = b == 0 ? 0 : std::min(2, full.num_new[b]);
    ASSERT_EQ(cut.num_new[b], want);
    ASSERT_EQ(cut.finished[b], (want == 2 || b == 0) ? 2 : 0);
    for (int j = 0; j < want; ++j) ASSERT_EQ(cut.new_tokens[b * mp + j], full.new_tokens[b * mp + j]);
    ASSERT_EQ(cut.path_len[b], full.path_len[b]);  // KV bookkeeping is unaffected
  }
  // Stop token: the second emitted token of request 1 (if any) stops it there, inclusively.
  int b = 1;
  while (b < s.batch && full.num_new[b] < 3) ++b;
  ASSERT_LT(b, s.batch) << "scenario has no request with 3 tokens";
  const int32_t stop = full.new_tokens[b * mp + 1];
  Accepted st = s.run(0.0f, seeds, unlimited, {999, stop});
  int first = 0;
  while (full.new_tokens[b * mp + first] != stop) ++first;
  EXPECT_EQ(st.num_new[b], first + 1);
  EXPECT_EQ(st.finished[b], 1);
  EXPECT_EQ(st.new_tokens[b * mp + first], stop);
}

TEST(AcceptCpu, MalformedInputsSetStatusNotCrash) {
  std::mt19937_64 rng(14);
  Scenario s(rng, 2, 8, 3, 10, 1.0f);
  std::vector<uint64_t> seeds(2, 0);
  std::vector<int32_t> max_new(2, 100);
  s.tree.node_count[1] = s.n + 5;  // out of range
  Accepted a = s.run(0.0f, seeds, max_new, {});
  EXPECT_EQ(a.status, uint32_t(DDT_DATA_BAD_INDEX));
  EXPECT_EQ(a.num_new[1], 0);
  EXPECT_EQ(a.path_len[1], 1);
  EXPECT_EQ(a.finished[1], 3);
  EXPECT_EQ(a.bonus[1], -1);
  EXPECT_GE(a.num_new[0], 1);  // the other request is unaffected
}

TEST(AcceptCpu, ArgumentErrors) {
  float x[4] = {}; int32_t pos[1] = {0}; uint64_t keys[1]; uint64_t seed[1] = {1}; uint32_t st = 0;
  ddt_sample_keys_params kp{x, 4, 1, 1, 4, 0, pos, seed, 1.0f, keys, &st};
  EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_OK);
  kp.temperature = -0.5f;
  EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_ERR_TEMPERATURE);
  kp.temperature = NAN;
  EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_ERR_TEMPERATURE);
  kp.temperature = 1.0f; kp.seeds = nullptr;
  EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_ERR_NULL);
  kp.temperature = 0.0f;  // greedy needs no seeds
  EXPECT_EQ(ddt_sample_keys_cpu(&kp), DDT_OK);
}
