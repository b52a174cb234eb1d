// GPU kernels against their CPU twins (ddtree/kernels.h): every output bitwise (ids, values, lse,
// log-probs, trees, keys, walks, compacted KV bytes and page tables); random inputs with exact ties, -inf and NaN;
// many batch sizes, budgets, depths, vocabularies and shard counts; outputs poisoned before every run; the whole
// step pipeline (through the accepted path's KV compaction) captured in a CUDA graph and replayed with new inputs
// written in place. Exits 77 (ctest: skipped) when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "ddtree/kernels.h"
#include "gpu_util.h"
#include "tests/unit/kv_compact_util.h"
#include "tests/unit/test_util.h"

using namespace ddtree;
using test::DevBuf;

namespace {

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b, const char* what, size_t* first = nullptr) {
  if (a.size() != b.size()) { ADD_FAILURE() << what << ": size " << a.size() << " vs " << b.size(); return false; }
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      if (first) *first = i;
      ADD_FAILURE() << what << ": first difference at " << i << ": gpu " << a[i] << " cpu " << b[i];
      return false;
    }
  return true;
}

struct TopkOut {
  std::vector<float> vals, lse;
  std::vector<int32_t> ids;
  uint32_t status = 0;
};

TopkOut topk_cpu(const std::vector<float>& x, int64_t ld, int rows, int vocab, int off, int k) {
  TopkOut o;
  o.vals.resize(size_t(rows) * k); o.ids.resize(size_t(rows) * k); o.lse.resize(rows);
  ddt_topk_shard_params p{x.data(), ld, rows, vocab, off, k, o.vals.data(), o.ids.data(), o.lse.data(), &o.status};
  EXPECT_EQ(ddt_topk_shard_cpu(&p), DDT_OK);
  return o;
}

TopkOut topk_gpu(const std::vector<float>& x, int64_t ld, int rows, int vocab, int off, int k) {
  DevBuf<float> dx(x), dv(size_t(rows) * k), dl(rows);
  DevBuf<int32_t> di(size_t(rows) * k);
  DevBuf<uint32_t> ds(1);
  dv.poison(); dl.poison(); di.poison(); ds.poison(0);
  ddt_topk_shard_params p{dx.ptr, ld, rows, vocab, off, k, dv.ptr, di.ptr, dl.ptr, ds.ptr};
  EXPECT_EQ(ddt_topk_shard_cuda(&p, nullptr), DDT_OK) << ddt_last_error_message();
  TopkOut o{dv.download(), dl.download(), di.download(), ds.download()[0]};
  return o;
}

}  // namespace

struct TopkGpuCase { int rows, vocab, k; int64_t ld; float tie, ninf; };
class TopkGpu : public ::testing::TestWithParam<TopkGpuCase> {};

TEST_P(TopkGpu, MatchesCpuTwin) {
  const auto c = GetParam();
  std::mt19937_64 rng(c.rows * 3 + c.vocab + c.k);
  const int64_t ld = c.ld > 0 ? c.ld : c.vocab;
  auto x = test::random_logits(rng, c.rows, c.vocab, c.tie, c.ninf, 3.0f, ld);
  if (c.rows > 1) x[size_t(ld) + 1] = std::nanf("");  // a NaN in row 1
  auto g = topk_gpu(x, ld, c.rows, c.vocab, 77, c.k);
  auto h = topk_cpu(x, ld, c.rows, c.vocab, 77, c.k);
  bitwise_equal(g.ids, h.ids, "ids");
  bitwise_equal(g.vals, h.vals, "values");
  bitwise_equal(g.lse, h.lse, "lse");
  EXPECT_EQ(g.status, h.status);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopkGpu, ::testing::Values(
    TopkGpuCase{3, 1, 1, 0, 0, 0}, TopkGpuCase{5, 7, 3, 9, 0.5f, 0.2f}, TopkGpuCase{4, 5, 9, 0, 0, 0},
    TopkGpuCase{16, 1000, 8, 0, 0.3f, 0.05f}, TopkGpuCase{8, 20480, 64, 0, 0.3f, 0.02f},
    TopkGpuCase{8, 20481, 512, 20484, 0.9f, 0.05f}, TopkGpuCase{6, 163840, 1024, 0, 0.2f, 0.01f},
    TopkGpuCase{4, 163840, 256, 0, 1.0f, 0.0f} /* coarse grid: huge exact ties */,
    TopkGpuCase{4, 50000, 1000, 0, 0.0f, 0.97f} /* mostly -inf: threshold tie fallback */,
    TopkGpuCase{64, 32000, 16, 0, 0.1f, 0.0f}));

TEST(TopkGpu, AllEqualRowUsesOrderedTieSelection) {
  const int rows = 2, vocab = 10000, k = 300;
  std::vector<float> x(size_t(rows) * vocab, -1.25f);
  for (int v = 0; v < vocab; v += 1000) x[v] = 0.0f;  // 10 larger values in row 0
  auto g = topk_gpu(x, vocab, rows, vocab, 0, k);
  auto h = topk_cpu(x, vocab, rows, vocab, 0, k);
  bitwise_equal(g.ids, h.ids, "ids");
  bitwise_equal(g.vals, h.vals, "values");
  bitwise_equal(g.lse, h.lse, "lse");
}

TEST(TopkGpu, CombineMatchesCpuAcrossShardCounts) {
  for (int shards : {1, 2, 3, 8, 16}) {
    for (int k : {4, 64, 512}) {
      const int rows = 24, vocab = 8000 + shards;
      std::mt19937_64 rng(shards * 100 + k);
      auto x = test::random_logits(rng, rows, vocab, 0.3f, 0.05f);
      std::vector<float> vs, ls;
      std::vector<int32_t> is;
      for (int s = 0, off = 0; s < shards; ++s) {
        const int w = s == shards - 1 ? vocab - off : vocab / shards;
        std::vector<float> xs(size_t(rows) * w);
        for (int r = 0; r < rows; ++r) std::copy_n(x.data() + size_t(r) * vocab + off, w, xs.data() + size_t(r) * w);
        auto o = topk_gpu(xs, w, rows, w, off, k);
        vs.insert(vs.end(), o.vals.begin(), o.vals.end());
        is.insert(is.end(), o.ids.begin(), o.ids.end());
        ls.insert(ls.end(), o.lse.begin(), o.lse.end());
        off += w;
      }
      std::vector<float> lp_h(size_t(rows) * k);
      std::vector<int32_t> id_h(size_t(rows) * k);
      ddt_topk_combine_params ch{vs.data(), is.data(), ls.data(), shards, rows, k, lp_h.data(), id_h.data()};
      ASSERT_EQ(ddt_topk_combine_cpu(&ch), DDT_OK);
      DevBuf<float> dv(vs), dl(ls), dlp(size_t(rows) * k);
      DevBuf<int32_t> di(is), did(size_t(rows) * k);
      dlp.poison(); did.poison();
      ddt_topk_combine_params cg{dv.ptr, di.ptr, dl.ptr, shards, rows, k, dlp.ptr, did.ptr};
      ASSERT_EQ(ddt_topk_combine_cuda(&cg, nullptr), DDT_OK);
      SCOPED_TRACE(testing::Message() << "shards " << shards << " k " << k);
      bitwise_equal(did.download(), id_h, "combined ids");
      bitwise_equal(dlp.download(), lp_h, "combined log-probs");
      // Unsharded top-K gives the same ids (the cross-shard contract).
      auto whole = topk_cpu(x, vocab, rows, vocab, 0, k);
      std::vector<float> lp1(size_t(rows) * k);
      std::vector<int32_t> id1(size_t(rows) * k);
      ddt_topk_combine_params c1{whole.vals.data(), whole.ids.data(), whole.lse.data(), 1, rows, k, lp1.data(), id1.data()};
      ASSERT_EQ(ddt_topk_combine_cpu(&c1), DDT_OK);
      bitwise_equal(id_h, id1, "sharded vs unsharded ids");
    }
  }
}

namespace {
struct DevTree {
  int batch, n, w;
  DevBuf<int32_t> tokens, parents, depths, slots, positions, first_child, next_sibling, node_count;
  DevBuf<float> scores;
  DevBuf<uint64_t> vis;
  DevBuf<uint32_t> status;
  DevTree(int batch_, int budget)
      : batch(batch_), n(budget + 1), w((budget + 64) / 64), tokens(size_t(batch_) * n), parents(size_t(batch_) * n),
        depths(size_t(batch_) * n), slots(size_t(batch_) * n), positions(size_t(batch_) * n),
        first_child(size_t(batch_) * n), next_sibling(size_t(batch_) * n), node_count(batch_),
        scores(size_t(batch_) * n), vis(size_t(batch_) * n * w), status(1) {
    for (auto* b : {&tokens, &parents, &depths, &slots, &positions, &first_child, &next_sibling, &node_count}) b->poison(0xAB);
    scores.poison(0xFF); vis.poison(0xCD); status.poison(0);
  }
  ddt_tree_build_params params(const float* lp, const int32_t* ids, const int32_t* roots, const int32_t* prefix,
                               int depth, int k, int budget) {
    return {lp, ids, roots, prefix, batch, depth, k, budget, tokens.ptr, parents.ptr, depths.ptr, scores.ptr,
            slots.ptr, positions.ptr, vis.ptr, first_child.ptr, next_sibling.ptr, node_count.ptr, status.ptr};
  }
  void expect_equal(const test::Tree& h) {
    bitwise_equal(tokens.download(), h.tokens, "tokens");
    bitwise_equal(parents.download(), h.parents, "parents");
    bitwise_equal(depths.download(), h.depths, "depths");
    bitwise_equal(scores.download(), h.scores, "scores");
    bitwise_equal(slots.download(), h.slots, "slots");
    bitwise_equal(positions.download(), h.positions, "positions");
    bitwise_equal(vis.download(), h.vis, "vis");
    bitwise_equal(first_child.download(), h.first_child, "first_child");
    bitwise_equal(next_sibling.download(), h.next_sibling, "next_sibling");
    bitwise_equal(node_count.download(), h.node_count, "node_count");
    EXPECT_EQ(status.download()[0], h.status);
  }
};
}  // namespace

struct BuildGpuCase { int batch, depth, k, budget, vocab; float tie, ninf, scale; };
class TreeBuildGpu : public ::testing::TestWithParam<BuildGpuCase> {};

TEST_P(TreeBuildGpu, BitwiseEqualToCpuTwin) {
  const auto c = GetParam();
  std::mt19937_64 rng(c.batch * 17 + c.budget * 5 + c.depth);
  auto d = test::random_draft(rng, c.batch, c.depth, c.k, c.vocab, c.tie, c.ninf, c.scale);
  if (c.batch > 2) d.lp[size_t(2) * c.depth * c.k + 1] = std::nanf("");  // request 2: NaN rank 1 at depth 1
  std::vector<int32_t> roots(c.batch), prefix(c.batch);
  for (int b = 0; b < c.batch; ++b) { roots[b] = int32_t(rng() % c.vocab); prefix[b] = int32_t(rng() % 5000); }
  test::Tree h(c.batch, c.budget);
  auto hp = h.params(d, roots, prefix, c.budget);
  ASSERT_EQ(ddt_tree_build_cpu(&hp), DDT_OK);
  DevBuf<float> dlp(d.lp);
  DevBuf<int32_t> dids(d.ids), droots(roots), dprefix(prefix);
  DevTree g(c.batch, c.budget);
  auto gp = g.params(dlp.ptr, dids.ptr, droots.ptr, dprefix.ptr, c.depth, c.k, c.budget);
  ASSERT_EQ(ddt_tree_build_cuda(&gp, nullptr), DDT_OK) << ddt_last_error_message();
  g.expect_equal(h);
}

INSTANTIATE_TEST_SUITE_P(Sweep, TreeBuildGpu, ::testing::Values(
    BuildGpuCase{1, 1, 1, 1, 4, 0, 0, 1}, BuildGpuCase{3, 4, 8, 16, 50, 0.5f, 0.1f, 2},
    BuildGpuCase{64, 8, 64, 64, 1000, 0.3f, 0.05f, 2}, BuildGpuCase{8, 16, 256, 256, 5000, 0.3f, 0.0f, 1.5f},
    BuildGpuCase{5, 32, 512, 512, 20000, 0.3f, 0.01f, 1.0f}, BuildGpuCase{64, 32, 512, 512, 4000, 0.6f, 0.1f, 3.0f},
    BuildGpuCase{2, 32, 2, 511, 2, 0.0f, 0.0f, 1.0f} /* deep, narrow */, BuildGpuCase{7, 2, 1024, 300, 2000, 0.9f, 0.0f, 0.3f} /* K > B */,
    BuildGpuCase{9, 6, 3, 100, 3, 1.0f, 0.3f, 0.5f} /* exhausted frontier, exact ties */,
    BuildGpuCase{33, 12, 65, 65, 700, 0.2f, 0.0f, 4.0f}, BuildGpuCase{1, 9, 1, 16, 10, 0, 0, 1} /* chain */));

// Degenerate drafts: all log-probs equal (long sibling runs, every score tied) and all zero (every item
// ties with the root: the candidate set overflows and the kernel falls back to the serial heap).
TEST(TreeBuildGpu, ExactTieDraftsMatchCpuTwin) {
  for (float value : {-0.5f, 0.0f, -0.0f}) {
    for (int budget : {16, 64, 300, 512}) {
      const int batch = 3, depth = 8, k = std::min(budget, 512);
      test::Draft d{batch, depth, k, k, std::vector<float>(size_t(batch) * depth * k, value),
                    std::vector<int32_t>(size_t(batch) * depth * k)};
      for (size_t i = 0; i < d.ids.size(); ++i) d.ids[i] = int32_t(i % k);
      for (int j = 0; j < depth * k; j += 7) d.lp[j] = -1.0f;  // request 0: some structure
      std::vector<int32_t> roots(batch, 2), prefix{0, 64, 4095};
      test::Tree h(batch, budget);
      auto hp = h.params(d, roots, prefix, budget);
      ASSERT_EQ(ddt_tree_build_cpu(&hp), DDT_OK);
      DevBuf<float> dlp(d.lp);
      DevBuf<int32_t> dids(d.ids), droots(roots), dprefix(prefix);
      DevTree g(batch, budget);
      auto gp = g.params(dlp.ptr, dids.ptr, droots.ptr, dprefix.ptr, depth, k, budget);
      ASSERT_EQ(ddt_tree_build_cuda(&gp, nullptr), DDT_OK) << ddt_last_error_message();
      SCOPED_TRACE(testing::Message() << "value " << value << " budget " << budget);
      g.expect_equal(h);
    }
  }
}

// Heap-ordered drafts whose first log-prob is -0.0 (a certain token): the rounds path (budget > 64,
// no overflow) must store +0 scores as the heap does (-0 + ... stays -0 if seeded raw).
TEST(TreeBuildGpu, NegativeZeroLogProbOnTheRoundsPath) {
  for (int budget : {65, 100, 512}) {
    const int batch = 4, depth = 8, k = 128;
    test::Draft d{batch, depth, k, k, std::vector<float>(size_t(batch) * depth * k), std::vector<int32_t>(size_t(batch) * depth * k)};
    for (int b = 0; b < batch; ++b)
      for (int l = 0; l < depth; ++l)
        for (int r = 0; r < k; ++r) {
          const size_t i = (size_t(b) * depth + l) * k + r;
          d.lp[i] = r == 0 ? -0.0f : -0.05f * float(r) - 0.5f * float(b);  // sorted descending
          d.ids[i] = r;
        }
    std::vector<int32_t> roots(batch, 1), prefix(batch, 10);
    test::Tree h(batch, budget);
    auto hp = h.params(d, roots, prefix, budget);
    ASSERT_EQ(ddt_tree_build_cpu(&hp), DDT_OK);
    DevBuf<float> dlp(d.lp);
    DevBuf<int32_t> dids(d.ids), droots(roots), dprefix(prefix);
    DevTree g(batch, budget);
    auto gp = g.params(dlp.ptr, dids.ptr, droots.ptr, dprefix.ptr, depth, k, budget);
    ASSERT_EQ(ddt_tree_build_cuda(&gp, nullptr), DDT_OK) << ddt_last_error_message();
    SCOPED_TRACE(testing::Message() << "budget " << budget);
    g.expect_equal(h);
  }
}

namespace {
struct AcceptCase { int batch, budget, depth, vocab; float temperature; };
}  // namespace
class AcceptGpu : public ::testing::TestWithParam<AcceptCase> {};

TEST_P(AcceptGpu, KeysAndWalkBitwiseEqualToCpuTwin) {
  const auto c = GetParam();
  std::mt19937_64 rng(c.batch * 7 + c.budget + int(c.temperature * 10));
  const int n = c.budget + 1, mp = c.depth + 1;
  auto d = test::random_draft(rng, c.batch, c.depth, std::min(c.budget, c.vocab), c.vocab, 0.2f, 0.0f, 4.0f);
  std::vector<int32_t> roots(c.batch, 1), prefix(c.batch);
  for (auto& x : prefix) x = int32_t(rng() % 3000);
  test::Tree t(c.batch, c.budget);
  auto tp = t.params(d, roots, prefix, c.budget);
  ASSERT_EQ(ddt_tree_build_cpu(&tp), DDT_OK);
  auto logits = test::random_logits(rng, int64_t(c.batch) * n, c.vocab, 0.3f, 0.02f, 1.0f);
  for (int b = 0; b < c.batch; ++b)  // make acceptance happen: boost each node's first child token
    for (int i = 0; i < t.node_count[b]; ++i) {
      const int fc = t.first_child[size_t(b) * n + i];
      if (fc >= 0 && rng() % 10 < 8) logits[(size_t(b) * n + i) * c.vocab + t.tokens[size_t(b) * n + fc]] = 40.0f;
    }
  logits[5] = std::nanf("");
  std::vector<uint64_t> seeds(c.batch);
  for (auto& s : seeds) s = rng();
  std::vector<int32_t> max_new(c.batch);
  for (auto& m : max_new) m = int32_t(rng() % (c.depth + 3));
  std::vector<int32_t> stops{int32_t(rng() % c.vocab), int32_t(rng() % c.vocab)};

  // CPU twin.
  std::vector<uint64_t> keys_h(size_t(c.batch) * n);
  uint32_t st_h = 0;
  ddt_sample_keys_params kh{logits.data(), c.vocab, c.batch, n, c.vocab, 0, t.positions.data(), seeds.data(),
                            c.temperature, keys_h.data(), &st_h};
  ASSERT_EQ(ddt_sample_keys_cpu(&kh), DDT_OK);
  std::vector<int32_t> path_h(size_t(c.batch) * mp), nt_h(size_t(c.batch) * mp), pl_h(c.batch), nn_h(c.batch),
      bo_h(c.batch), fi_h(c.batch);
  ddt_accept_params ah{keys_h.data(), t.tokens.data(), t.parents.data(), t.node_count.data(), c.batch, n, mp,
                       max_new.data(), stops.data(), 2, path_h.data(), pl_h.data(), nt_h.data(), nn_h.data(),
                       bo_h.data(), fi_h.data(), &st_h};
  ASSERT_EQ(ddt_accept_cpu(&ah), DDT_OK);

  // GPU.
  DevBuf<float> dlog(logits);
  DevBuf<int32_t> dpos(t.positions), dtok(t.tokens), dpar(t.parents), dcnt(t.node_count), dmax(max_new), dstop(stops);
  DevBuf<uint64_t> dseed(seeds), dkeys(keys_h.size());
  DevBuf<uint32_t> dst(1);
  DevBuf<int32_t> dpath(path_h.size()), dnt(nt_h.size()), dpl(c.batch), dnn(c.batch), dbo(c.batch), dfi(c.batch);
  for (auto* b : {&dpath, &dnt, &dpl, &dnn, &dbo, &dfi}) b->poison(0xAB);
  dkeys.poison(0xEE); dst.poison(0);
  ddt_sample_keys_params kg{dlog.ptr, c.vocab, c.batch, n, c.vocab, 0, dpos.ptr, dseed.ptr, c.temperature, dkeys.ptr, dst.ptr};
  ASSERT_EQ(ddt_sample_keys_cuda(&kg, nullptr), DDT_OK) << ddt_last_error_message();
  ddt_accept_params ag{dkeys.ptr, dtok.ptr, dpar.ptr, dcnt.ptr, c.batch, n, mp, dmax.ptr, dstop.ptr, 2, dpath.ptr,
                       dpl.ptr, dnt.ptr, dnn.ptr, dbo.ptr, dfi.ptr, dst.ptr};
  ASSERT_EQ(ddt_accept_cuda(&ag, nullptr), DDT_OK) << ddt_last_error_message();
  bitwise_equal(dkeys.download(), keys_h, "keys");
  bitwise_equal(dpath.download(), path_h, "path");
  bitwise_equal(dnt.download(), nt_h, "new_tokens");
  bitwise_equal(dpl.download(), pl_h, "path_len");
  bitwise_equal(dnn.download(), nn_h, "num_new");
  bitwise_equal(dbo.download(), bo_h, "bonus");
  bitwise_equal(dfi.download(), fi_h, "finished");
  EXPECT_EQ(dst.download()[0], st_h);
  EXPECT_EQ(st_h, uint32_t(DDT_DATA_NAN_LOGIT));
  int accepted = 0;
  for (int b = 0; b < c.batch; ++b) accepted += pl_h[b] - 1;
  EXPECT_GT(accepted, 0) << "the scenario must accept drafts";
}

INSTANTIATE_TEST_SUITE_P(Sweep, AcceptGpu, ::testing::Values(
    AcceptCase{1, 16, 4, 100, 0.0f}, AcceptCase{8, 64, 8, 3000, 0.0f}, AcceptCase{64, 64, 8, 1000, 1.0f},
    AcceptCase{13, 512, 32, 200, 0.7f}, AcceptCase{64, 256, 16, 8000, 0.0f}, AcceptCase{3, 100, 6, 163840, 1.3f}));

// The whole per-step device pipeline (top-K -> combine -> tree build -> keys -> accept) captured once in
// a CUDA graph and replayed with fresh inputs copied in place; each replay checked against the CPU twins.
TEST(GraphReplay, StepPipelineWithNewInputsInPlace) {
  const int batch = 8, L = 8, K = 64, B = 96, V = 4096, N = B + 1, mp = L + 1;  // B > 64: the rounds path
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DevBuf<float> d_draft(size_t(batch) * L * V), d_vals(size_t(batch) * L * K), d_lse(size_t(batch) * L),
      d_lp(size_t(batch) * L * K), d_target(size_t(batch) * N * V);
  DevBuf<int32_t> d_ids0(size_t(batch) * L * K), d_ids(size_t(batch) * L * K), d_roots(batch), d_prefix(batch),
      d_maxnew(batch), d_path(size_t(batch) * mp), d_nt(size_t(batch) * mp), d_pl(batch), d_nn(batch), d_bo(batch),
      d_fi(batch);
  DevBuf<uint64_t> d_seeds(batch), d_keys(size_t(batch) * N);
  DevTree tree(batch, B);
  ddt_topk_shard_params tp{d_draft.ptr, V, batch * L, V, 0, K, d_vals.ptr, d_ids0.ptr, d_lse.ptr, tree.status.ptr};
  ddt_topk_combine_params cp{d_vals.ptr, d_ids0.ptr, d_lse.ptr, 1, batch * L, K, d_lp.ptr, d_ids.ptr};
  auto bp = tree.params(d_lp.ptr, d_ids.ptr, d_roots.ptr, d_prefix.ptr, L, K, B);
  ddt_sample_keys_params kp{d_target.ptr, V, batch, N, V, 0, tree.positions.ptr, d_seeds.ptr, 1.0f, d_keys.ptr,
                            tree.status.ptr};
  ddt_accept_params ap{d_keys.ptr, tree.tokens.ptr, tree.parents.ptr, tree.node_count.ptr, batch, N, mp, d_maxnew.ptr,
                       nullptr, 0, d_path.ptr, d_pl.ptr, d_nt.ptr, d_nn.ptr, d_bo.ptr, d_fi.ptr, tree.status.ptr};
  // The accepted path's KV compaction, fed by the accept kernel's device outputs: 3 layers of bf16 latent rows
  // (1,152 B), pages of 16 slots, each request's pages shuffled over the pool (prefixes < 999, N nodes after them).
  const int kv_layers = 3, kv_row = 1152, kv_page = 16, kv_max_pages = (999 + N + kv_page - 1) / kv_page;
  const int64_t kv_pages = int64_t(batch) * kv_max_pages, kv_stride = kv_pages * kv_page * kv_row;
  std::vector<int32_t> kv_table(static_cast<size_t>(kv_pages));
  std::iota(kv_table.begin(), kv_table.end(), 0);
  std::shuffle(kv_table.begin(), kv_table.end(), std::mt19937_64(5));
  DevBuf<uint8_t> d_kv(size_t(kv_stride) * kv_layers);
  DevBuf<int32_t> d_kv_table(kv_table);
  ddt_kv_compact_params kvp{d_kv.ptr, kv_stride, kv_layers, kv_row, kv_page, kv_pages, d_kv_table.ptr, kv_max_pages,
                            d_prefix.ptr, d_path.ptr, d_pl.ptr, batch, mp, 0, tree.status.ptr};
  // Warm-up launch outside capture (first-launch attribute setup), then capture.
  ASSERT_EQ(ddt_tree_build_cuda(&bp, s), DDT_OK);
  GPU_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(ddt_topk_shard_cuda(&tp, s), DDT_OK);
  ASSERT_EQ(ddt_topk_combine_cuda(&cp, s), DDT_OK);
  ASSERT_EQ(ddt_tree_build_cuda(&bp, s), DDT_OK);
  ASSERT_EQ(ddt_sample_keys_cuda(&kp, s), DDT_OK);
  ASSERT_EQ(ddt_accept_cuda(&ap, s), DDT_OK);
  ASSERT_EQ(ddt_kv_compact_cuda(&kvp, s), DDT_OK);
  GPU_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937_64 rng(99);
  int total_accepted = 0;
  for (int rep = 0; rep < 6; ++rep) {
    auto draft = test::random_logits(rng, int64_t(batch) * L, V, 0.2f, 0.01f, 2.0f + rep);
    auto target = test::random_logits(rng, int64_t(batch) * N, V, 0.1f, 0.0f, 1.0f);
    std::vector<int32_t> roots(batch), prefix(batch), maxnew(batch, 100);
    std::vector<uint64_t> seeds(batch);
    for (int b = 0; b < batch; ++b) { roots[b] = int32_t(rng() % V); prefix[b] = int32_t(rng() % 999); seeds[b] = rng(); }
    // CPU twin pipeline first (to know the tree, so the target can favour its first children).
    test::Draft d{batch, L, K, V, std::vector<float>(size_t(batch) * L * K), std::vector<int32_t>(size_t(batch) * L * K)};
    auto tk = topk_cpu(draft, V, batch * L, V, 0, K);
    ddt_topk_combine_params ch{tk.vals.data(), tk.ids.data(), tk.lse.data(), 1, batch * L, K, d.lp.data(), d.ids.data()};
    ASSERT_EQ(ddt_topk_combine_cpu(&ch), DDT_OK);
    test::Tree h(batch, B);
    auto hp = h.params(d, roots, prefix, B);
    ASSERT_EQ(ddt_tree_build_cpu(&hp), DDT_OK);
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < h.node_count[b]; ++i) {
        const int fc = h.first_child[size_t(b) * N + i];
        if (fc >= 0) target[(size_t(b) * N + i) * V + h.tokens[size_t(b) * N + fc]] = 12.0f;
      }
    std::vector<uint64_t> keys(size_t(batch) * N);
    uint32_t st = 0;
    ddt_sample_keys_params kh{target.data(), V, batch, N, V, 0, h.positions.data(), seeds.data(), 1.0f, keys.data(), &st};
    ASSERT_EQ(ddt_sample_keys_cpu(&kh), DDT_OK);
    std::vector<int32_t> path(size_t(batch) * mp), nt(size_t(batch) * mp), pl(batch), nn(batch), bo(batch), fi(batch);
    ddt_accept_params ah{keys.data(), h.tokens.data(), h.parents.data(), h.node_count.data(), batch, N, mp,
                         maxnew.data(), nullptr, 0, path.data(), pl.data(), nt.data(), nn.data(), bo.data(), fi.data(), &st};
    ASSERT_EQ(ddt_accept_cpu(&ah), DDT_OK);
    const std::vector<uint8_t> kv_in = [&] {
      std::vector<uint8_t> v(size_t(kv_stride) * kv_layers);
      for (auto& x : v) x = uint8_t(rng());
      return v;
    }();
    d_kv.upload(kv_in, s);
    std::vector<uint8_t> kv = kv_in;  // (the twin works on a copy: the upload's source stays as it was)
    ddt_kv_compact_params kvh{kv.data(), kv_stride, kv_layers, kv_row, kv_page, kv_pages, kv_table.data(), kv_max_pages,
                              prefix.data(), path.data(), pl.data(), batch, mp, 0, &st};
    ASSERT_EQ(ddt_kv_compact_cpu(&kvh), DDT_OK);
    // New inputs in place, poisoned outputs, replay.
    d_draft.upload(draft, s); d_target.upload(target, s); d_roots.upload(roots, s); d_prefix.upload(prefix, s);
    d_seeds.upload(seeds, s); d_maxnew.upload(maxnew, s);
    GPU_CHECK(cudaMemsetAsync(d_path.ptr, 0xAB, d_path.n * 4, s));
    GPU_CHECK(cudaMemsetAsync(tree.vis.ptr, 0xCD, tree.vis.n * 8, s));
    GPU_CHECK(cudaGraphLaunch(exec, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    SCOPED_TRACE(testing::Message() << "replay " << rep);
    tree.expect_equal(h);
    bitwise_equal(d_path.download(), path, "path");
    bitwise_equal(d_nt.download(), nt, "new_tokens");
    bitwise_equal(d_bo.download(), bo, "bonus");
    bitwise_equal(d_pl.download(), pl, "path_len");
    bitwise_equal(d_nn.download(), nn, "num_new");
    bitwise_equal(d_fi.download(), fi, "finished");
    EXPECT_TRUE(d_kv.download() == kv) << "compacted KV";
    for (int b = 0; b < batch; ++b) total_accepted += pl[b] - 1;
  }
  EXPECT_GT(total_accepted, 0);
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  GPU_CHECK(cudaStreamDestroy(s));
}

// ---- Accepted-path KV compaction (section 5) ----
namespace {
struct KvCompactOut {
  std::vector<uint8_t> kv;
  std::vector<int32_t> table;
  uint32_t status = 0;
};
KvCompactOut kv_compact_run(const test::KvCompactCase& c, bool gpu, int remap, int kv_offset = 0) {
  KvCompactOut o{c.kv, c.table};
  if (!gpu) {
    auto p = c.params(o.kv.data(), o.table.data(), c.prefix.data(), c.path.data(), c.path_len.data(), &o.status, remap);
    EXPECT_EQ(ddt_kv_compact_cpu(&p), DDT_OK) << ddt_last_error_message();
    return o;
  }
  // kv_offset: the cache starts that many bytes into its allocation (4: the 4-byte chunk path).
  std::vector<uint8_t> padded(size_t(kv_offset), 0x5A);
  padded.insert(padded.end(), c.kv.begin(), c.kv.end());
  DevBuf<uint8_t> dkv(padded);
  DevBuf<int32_t> dt(c.table), dp(c.prefix), dpath(c.path), dlen(c.path_len);
  DevBuf<uint32_t> ds(1);
  ds.poison(0);
  auto p = c.params(dkv.ptr + kv_offset, dt.ptr, dp.ptr, dpath.ptr, dlen.ptr, ds.ptr, remap);
  EXPECT_EQ(ddt_kv_compact_cuda(&p, nullptr), DDT_OK) << ddt_last_error_message();
  std::vector<uint8_t> all = dkv.download();
  EXPECT_TRUE(std::all_of(all.begin(), all.begin() + kv_offset, [](uint8_t b) { return b == 0x5A; }));
  o.kv.assign(all.begin() + kv_offset, all.end());
  o.table = dt.download();
  o.status = ds.download()[0];
  return o;
}
struct KvCompactGpuCase { int row_bytes, page_size, layers, batch, bad_every, layer_pad, kv_offset; };
}  // namespace
class KvCompactGpu : public ::testing::TestWithParam<KvCompactGpuCase> {};

// CUDA == CPU twin bitwise (every byte of the cache, the page table, the status word), the twin == the
// read-all-then-write reference, on the 16-byte chunk path (row_bytes, layer_stride, kv all 16-byte multiples)
// and the 4-byte one; with bad requests mixed in.
TEST_P(KvCompactGpu, BitwiseEqualToCpuTwin) {
  const auto g = GetParam();
  size_t moved = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const auto c = test::make_kv_compact_case(seed * 131 + g.batch, g.layers, g.row_bytes, g.page_size, g.batch,
                                              DDT_MAX_DEPTH + 1, g.bad_every, g.layer_pad);
    const KvCompactOut cpu = kv_compact_run(c, false, 0), gpu = kv_compact_run(c, true, 0, g.kv_offset);
    std::vector<uint8_t> want = c.kv;
    test::kv_compact_reference(c, want, c.table);
    EXPECT_TRUE(cpu.kv == want) << "twin vs reference, seed " << seed;
    EXPECT_TRUE(gpu.kv == cpu.kv) << "gpu vs twin, seed " << seed;
    EXPECT_EQ(gpu.table, c.table);
    EXPECT_EQ(gpu.status, cpu.status);
    EXPECT_EQ(cpu.status, g.bad_every ? uint32_t(DDT_DATA_BAD_INDEX) : 0u);
    for (size_t i = 0; i < want.size(); ++i) moved += want[i] != c.kv[i];
  }
  EXPECT_GT(moved, 0u) << "no seed moved a row";
}

INSTANTIATE_TEST_SUITE_P(Sweep, KvCompactGpu, ::testing::Values(
    KvCompactGpuCase{1152, 16, 61, 16, 0, 0, 0},    // Kimi-K2's 61 layers
    KvCompactGpuCase{1152, 64, 4, 64, 0, 0, 0},     // a fixed batch
    KvCompactGpuCase{1152, 64, 61, 1, 0, 0, 0},     // batch 1
    KvCompactGpuCase{1152, 1, 4, 33, 3, 0, 0},      // page size 1, bad requests
    KvCompactGpuCase{1152, 16, 3, 17, 4, 8, 0},     // layer_stride not a 16-byte multiple: 4-byte chunks
    KvCompactGpuCase{1152, 64, 2, 9, 0, 0, 4},      // kv 4 bytes off a 16-byte boundary: 4-byte chunks
    KvCompactGpuCase{12, 4, 3, 40, 5, 0, 0},        // 12-byte rows (the cpu backend's test rows)
    KvCompactGpuCase{2304, 16, 2, 9, 0, 0, 0},      // f32 latent rows
    KvCompactGpuCase{65536, 2, 2, 3, 0, 0, 0},      // the largest rows: several rounds per move
    KvCompactGpuCase{64, 4, 61, 40, 6, 0, 0},       // 2 layers per CTA, the last group of one layer
    KvCompactGpuCase{16, 1, 61, 200, 7, 0, 0}));    // 6 layers per CTA

// Each data check alone (the last request of the batch corrupted, the others good): the status bit, the bad
// request untouched, the others compacted; copy and remap. (Under compute-sanitizer in tests/gpu runs: a check
// skipped for path_len > max_path would read past the path buffer.)
TEST(KvCompactGpuData, EachCheckAloneReportsAndLeavesItsRequestUntouched) {
  for (int kind = 1; kind <= 8; ++kind)
    for (int page_size : {1, 16}) {
      const auto c = test::make_kv_compact_case(300 + kind, 2, 64, page_size, 6, 5, 0, 0, kind);
      for (int remap : {0, 1}) {
        if (remap && page_size != 1) continue;
        const KvCompactOut cpu = kv_compact_run(c, false, remap), gpu = kv_compact_run(c, true, remap);
        EXPECT_EQ(gpu.status, uint32_t(DDT_DATA_BAD_INDEX)) << "kind " << kind << " remap " << remap;
        EXPECT_TRUE(gpu.kv == cpu.kv) << "kind " << kind << " remap " << remap;
        EXPECT_EQ(gpu.table, cpu.table) << "kind " << kind << " remap " << remap;
      }
    }
}

// Every move's source is the next move's destination (path[k] = k + 1), and with DDTREE_KV_COMPACT_STAGGER=1 the
// odd warps of each CTA load 100 us after the even ones: a kernel whose stores of a round did not wait for all of
// the round's loads would overwrite sources first (a mutant without the barrier fails this; measured: see
// docs/PERF_NOTES.md K4).
TEST(KvCompactGpu, StaggeredWarpsStillReadEverySourceFirst) {
  struct Stagger {  // the test hook on for this test only (also when an assertion returns early)
    Stagger() { setenv("DDTREE_KV_COMPACT_STAGGER", "1", 1); }
    ~Stagger() { unsetenv("DDTREE_KV_COMPACT_STAGGER"); }
  } stagger;
  for (int row_bytes : {64, 1152, 12}) {
    auto c = test::make_kv_compact_case(77 + row_bytes, 3, row_bytes, 16, 12, DDT_MAX_DEPTH + 1);
    auto mapped = [&](int r, int64_t slot) {  // a slot of request r's own pages (entries past them are invalid)
      if (slot >= int64_t(c.max_pages) * c.page_size) return false;
      const int32_t page = c.table[size_t(r) * c.max_pages + slot / c.page_size];
      return page >= 0 && page < c.num_pages;
    };
    int moves = 0;
    for (int r = 0; r < c.batch; ++r) {  // path = {0, 2, 3, .., len}: each move's source is the next one's destination
      int32_t* pr = c.path.data() + size_t(r) * c.max_path;
      int len = 1;
      while (len < std::min(c.max_path, 21) && mapped(r, c.prefix[r] + len + 1)) {
        pr[len] = len + 1;
        ++len;
      }
      c.path_len[r] = len;
      moves += len - 1;
    }
    ASSERT_GT(moves, 3 * c.batch);
    const KvCompactOut cpu = kv_compact_run(c, false, 0), gpu = kv_compact_run(c, true, 0);
    std::vector<uint8_t> want = c.kv;
    test::kv_compact_reference(c, want, c.table);
    EXPECT_TRUE(cpu.kv == want) << "row_bytes " << row_bytes;
    EXPECT_TRUE(gpu.kv == cpu.kv) << "row_bytes " << row_bytes;
    EXPECT_EQ(gpu.status, 0u);
  }
}

TEST(KvCompactGpuRemap, BitwiseEqualToCpuTwinAndMovesNoBytes) {
  for (int bad_every : {0, 3}) {
    const auto c = test::make_kv_compact_case(21 + bad_every, 2, 1152, 1, 45, DDT_MAX_DEPTH + 1, bad_every);
    const KvCompactOut cpu = kv_compact_run(c, false, 1), gpu = kv_compact_run(c, true, 1);
    EXPECT_EQ(gpu.table, cpu.table);
    EXPECT_NE(gpu.table, c.table) << "nothing was remapped";
    EXPECT_EQ(test::kv_remap_violation(c, c.table, gpu.table), "");
    EXPECT_TRUE(gpu.kv == c.kv) << "remap moved KV bytes";
    EXPECT_EQ(gpu.status, cpu.status);
    EXPECT_EQ(gpu.status, bad_every ? uint32_t(DDT_DATA_BAD_INDEX) : 0u);
  }
}

TEST(KvCompactGpuArgs, HostVisibleErrorsReturnCodesWithoutLaunching) {
  const auto c = test::make_kv_compact_case(8, 1, 64, 4, 2, 5);
  DevBuf<uint8_t> dkv(c.kv);
  DevBuf<int32_t> dt(c.table), dp(c.prefix), dpath(c.path), dlen(c.path_len);
  DevBuf<uint32_t> ds(1);
  ds.poison(0);
  auto p = c.params(dkv.ptr, dt.ptr, dp.ptr, dpath.ptr, dlen.ptr, ds.ptr);
  p.row_bytes = 6;
  EXPECT_EQ(ddt_kv_compact_cuda(&p, nullptr), DDT_ERR_SHAPE);
  p = c.params(dkv.ptr + 2, dt.ptr, dp.ptr, dpath.ptr, dlen.ptr, ds.ptr);
  EXPECT_EQ(ddt_kv_compact_cuda(&p, nullptr), DDT_ERR_ALIGN);
  p = c.params(dkv.ptr, dt.ptr, dp.ptr, dpath.ptr, dlen.ptr, nullptr);
  EXPECT_EQ(ddt_kv_compact_cuda(&p, nullptr), DDT_ERR_NULL);
  p = c.params(dkv.ptr, dt.ptr, dp.ptr, dpath.ptr, dlen.ptr, ds.ptr, 1);  // remap needs page_size 1
  EXPECT_EQ(ddt_kv_compact_cuda(&p, nullptr), DDT_ERR_SHAPE);
  EXPECT_TRUE(dkv.download() == c.kv);
  EXPECT_EQ(dt.download(), c.table);
  EXPECT_EQ(ds.download()[0], 0u);
  GPU_CHECK(cudaGetLastError());
}

TEST(ArgumentsGpu, HostVisibleErrorsReturnCodesWithoutLaunching) {
  ddt_tree_build_params p{};
  p.budget = 0; p.depth = 4; p.k = 4; p.batch = 1;
  EXPECT_EQ(ddt_tree_build_cuda(&p, nullptr), DDT_ERR_BUDGET);
  p.budget = 8; p.depth = 33;
  EXPECT_EQ(ddt_tree_build_cuda(&p, nullptr), DDT_ERR_DEPTH);
  p.depth = 4;
  EXPECT_EQ(ddt_tree_build_cuda(&p, nullptr), DDT_ERR_NULL);
  ddt_sample_keys_params k{};
  k.temperature = -1.0f;
  EXPECT_EQ(ddt_sample_keys_cuda(&k, nullptr), DDT_ERR_TEMPERATURE);
  GPU_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(cudaGetLastError());
}
