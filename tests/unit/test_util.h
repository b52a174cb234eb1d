// Shared helpers for the kernel tests: seeded random inputs with the hazards that make tests bite
// (exact ties, -inf entries, NaN when asked), and a C++ wrapper for the tree builder's outputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "ddtree/kernels.h"

namespace ddtree::test {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits [rows, vocab]: normal(0, scale), a fraction snapped to a coarse grid (exact ties) and a
// fraction set to -inf.
inline std::vector<float> random_logits(std::mt19937_64& rng, int64_t rows, int vocab, float tie_frac = 0.2f,
                                        float ninf_frac = 0.05f, float scale = 3.0f, int64_t ld = -1) {
  if (ld < 0) ld = vocab;
  std::vector<float> x(size_t(rows * ld), std::nanf(""));  // padding columns are NaN: never read
  std::normal_distribution<float> nd(0.0f, scale);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < vocab; ++v) {
      float val = nd(rng);
      const float t = u(rng);
      if (t < tie_frac) val = std::round(val * 2.0f) / 2.0f;
      else if (t < tie_frac + ninf_frac) val = -kInf;
      x[size_t(r * ld + v)] = val;
    }
  return x;
}

// Draft distributions for the tree builder: [batch, depth, k] log-probs sorted descending with their
// token ids (distinct per position), from random logits through the CPU top-K path.
struct Draft {
  int batch, depth, k, vocab;
  std::vector<float> lp;
  std::vector<int32_t> ids;
};

inline Draft random_draft(std::mt19937_64& rng, int batch, int depth, int k, int vocab, float tie_frac = 0.3f,
                          float ninf_frac = 0.1f, float scale = 2.0f) {
  Draft d{batch, depth, k, vocab, {}, {}};
  const int rows = batch * depth;
  std::vector<float> logits = random_logits(rng, rows, vocab, tie_frac, ninf_frac, scale);
  std::vector<float> vals(size_t(rows) * k), lse(rows);
  std::vector<int32_t> ids(size_t(rows) * k);
  uint32_t status = 0;
  ddt_topk_shard_params sp{logits.data(), vocab, rows, vocab, 0, k, vals.data(), ids.data(), lse.data(), &status};
  ddt_topk_shard_cpu(&sp);
  d.lp.resize(size_t(rows) * k);
  d.ids.resize(size_t(rows) * k);
  ddt_topk_combine_params cp{vals.data(), ids.data(), lse.data(), 1, rows, k, d.lp.data(), d.ids.data()};
  ddt_topk_combine_cpu(&cp);
  return d;
}

struct Tree {
  int batch, n, w;
  std::vector<int32_t> tokens, parents, depths, slots, positions, first_child, next_sibling, node_count;
  std::vector<float> scores;
  std::vector<uint64_t> vis;
  uint32_t status = 0;
  Tree(int batch_, int budget) : batch(batch_), n(budget + 1), w((budget + 64) / 64) {
    const size_t bn = size_t(batch) * n;
    tokens.assign(bn, -7); parents.assign(bn, -7); depths.assign(bn, -7); slots.assign(bn, -7);
    positions.assign(bn, -7); first_child.assign(bn, -7); next_sibling.assign(bn, -7);
    scores.assign(bn, std::nanf("")); vis.assign(bn * w, 0xDEADBEEFull); node_count.assign(batch, -7);
  }
  ddt_tree_build_params params(const Draft& d, const std::vector<int32_t>& roots, const std::vector<int32_t>& prefix,
                               int budget) {
    return ddt_tree_build_params{d.lp.data(), d.ids.data(), roots.data(), prefix.data(), d.batch, d.depth, d.k, budget,
                                 tokens.data(), parents.data(), depths.data(), scores.data(), slots.data(),
                                 positions.data(), vis.data(), first_child.data(), next_sibling.data(),
                                 node_count.data(), &status};
  }
};

}  // namespace ddtree::test
