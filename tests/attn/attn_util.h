// Verify-attention test fixtures shared by the CPU tests (tests/attn), the GPU tests (tests/gpu) and the
// benchmark (bench/bench_verify_attn.cpp): seeded random problems with the hazards that make tests bite,
// an independent brute-force reference, and comparisons against the correctness bar of
// reference/mla-verify-attention.md.
//
// A problem: a batch of requests, each a prefix of P tokens and a tree of N nodes generated as a parent
// array (chain, star, deep, bushy, random) with vis rows derived from it. Poison (on by default): KV
// pages that no request uses and slots past each request's P + N are NaN; page tables are a random
// permutation of the physical pages and their unused entries hold out-of-range sentinels; vis bits past
// N (up to 64 W) are random garbage. The brute force shares no code with the library: it gathers each
// request's keys into a dense f32 matrix by walking the page table itself, builds the mask from the
// parent array (not from the vis rows) and computes the softmax in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ddtree/kernels.h"

namespace ddtree::test::attn {

constexpr int kQK = DDT_ATTN_DIM_QK, kV = DDT_ATTN_DIM_V;
constexpr uint16_t kNaN16 = 0x7FC0;

// Test-side bf16 conversions, written independently of kernels/common/bf16.h (round half to even via
// the f32 bit pattern).
inline float bf16_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_bf16(float f) {
  if (std::isnan(f)) return kNaN16;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xFFFFu, upper = u >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) return uint16_t(upper + 1);
  return uint16_t(upper);
}

enum class Shape { kChain, kStar, kDeep, kBushy, kRandom };
inline const char* shape_name(Shape s) {
  switch (s) {
    case Shape::kChain: return "chain";
    case Shape::kStar: return "star";
    case Shape::kDeep: return "deep";
    case Shape::kBushy: return "bushy";
    default: return "random";
  }
}

// parent[0] = -1, parent[i] < i.
inline std::vector<int> make_parents(std::mt19937_64& rng, int n, Shape shape) {
  std::vector<int> par(n, -1);
  for (int i = 1; i < n; ++i) {
    switch (shape) {
      case Shape::kChain: par[i] = i - 1; break;
      case Shape::kStar: par[i] = 0; break;
      case Shape::kDeep: par[i] = (rng() % 8 != 0) ? i - 1 : int(rng() % std::min(i, 4)) + std::max(0, i - 4); break;
      case Shape::kBushy: par[i] = int(rng() % i); break;
      default: par[i] = std::max(0, i - 1 - int(rng() % 6)); break;
    }
  }
  return par;
}

struct ReqSpec {
  int prefix;
  int nodes;
  Shape shape = Shape::kRandom;
};

struct Options {
  int heads = 8;
  int page_size = 64;
  int extra_rows = 0;      // padding rows after the last request's rows
  int extra_words = 0;     // vis words beyond ceil(max N / 64) (garbage bits past N)
  int spare_pages = 3;     // physical pages nobody uses (NaN when poisoned)
  int spare_entries = 2;   // page-table entries per request beyond the largest need (sentinels)
  bool poison = true;
  float q_scale = 1.0f;    // > 1: peakier softmax
  float softmax_scale = 0.07216878f;  // 1 / sqrt(192)
  int p_precision = DDT_ATTN_P_HILO;  // DDT_ATTN_P_BF16: compare with p_bf16_tol()
};

struct Problem {
  Options opt;
  std::vector<ReqSpec> reqs;
  int batch = 0, total_nodes = 0, max_pages = 1, W = 1;
  int64_t num_pages = 1;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> page_table, prefix, offsets;
  std::vector<uint64_t> vis;
  std::vector<std::vector<int>> parents;

  int64_t slots_needed(int r) const { return int64_t(reqs[r].prefix) + reqs[r].nodes; }
  int64_t pages_needed(int r) const { return (slots_needed(r) + opt.page_size - 1) / opt.page_size; }

  // Params over caller-owned buffers: host vectors for _cpu, device copies for _cuda.
  ddt_verify_attn_params params(const uint16_t* q_, const uint16_t* kv_, const int32_t* pt, const int32_t* pre,
                                const int32_t* off, const uint64_t* vis_, uint16_t* out, float* lse,
                                uint32_t* status) const {
    return ddt_verify_attn_params{q_, kv_, pt, pre, off, vis_, batch, total_nodes, opt.heads, opt.page_size,
                                  max_pages, num_pages, W, opt.softmax_scale, out, lse, status, opt.p_precision};
  }
  ddt_verify_attn_params host_params(uint16_t* out, float* lse, uint32_t* status) const {
    return params(q.data(), kv.data(), page_table.data(), prefix.data(), offsets.data(), vis.data(), out, lse, status);
  }
  size_t out_size() const { return size_t(total_nodes) * opt.heads * kV; }
  size_t lse_size() const { return size_t(total_nodes) * opt.heads; }
};

// The used data (q, parents, KV rows of slots < P + N, the permutation) comes from `seed` alone, the
// poison from a second stream: the same problem with and without poison has identical used data.
inline Problem make_problem(uint64_t seed, const std::vector<ReqSpec>& reqs, const Options& opt = {}) {
  Problem p;
  p.opt = opt;
  p.reqs = reqs;
  p.batch = int(reqs.size());
  std::mt19937_64 rng(seed), junk(seed ^ 0x5DEECE66Dull);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.offsets.assign(p.batch + 1, 0);
  int max_n = 1;
  int64_t max_need = 1, total_pages = 0;
  for (int r = 0; r < p.batch; ++r) {
    p.offsets[r + 1] = p.offsets[r] + reqs[r].nodes;
    max_n = std::max(max_n, reqs[r].nodes);
    max_need = std::max(max_need, p.pages_needed(r));
    total_pages += p.pages_needed(r);
  }
  p.total_nodes = p.offsets[p.batch] + opt.extra_rows;
  p.W = (max_n + 63) / 64 + opt.extra_words;
  p.max_pages = int(max_need) + opt.spare_entries;
  p.num_pages = total_pages + opt.spare_pages;
  p.prefix.resize(p.batch);
  for (int r = 0; r < p.batch; ++r) p.prefix[r] = reqs[r].prefix;
  // Physical pages: a random permutation; request r takes the next pages_needed(r) of it.
  std::vector<int32_t> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.page_table.assign(size_t(p.batch) * p.max_pages, 0);
  const int32_t sentinels[4] = {-1, int32_t(p.num_pages), std::numeric_limits<int32_t>::max(),
                                std::numeric_limits<int32_t>::min()};
  int64_t next = 0;
  for (int r = 0; r < p.batch; ++r)
    for (int k = 0; k < p.max_pages; ++k)
      p.page_table[size_t(r) * p.max_pages + k] =
          k < p.pages_needed(r) ? perm[next++] : (opt.poison ? sentinels[junk() % 4] : 0);
  // KV: NaN everywhere (poison) or random finite values, then the used slots.
  const size_t page_elems = size_t(opt.page_size) * kQK;
  p.kv.resize(size_t(p.num_pages) * page_elems);
  for (auto& x : p.kv) x = opt.poison ? kNaN16 : f32_bf16(0.5f * nd(junk));
  for (int r = 0; r < p.batch; ++r)
    for (int64_t t = 0; t < p.slots_needed(r); ++t) {
      const int64_t page = p.page_table[size_t(r) * p.max_pages + t / opt.page_size];
      uint16_t* row = p.kv.data() + size_t(page) * page_elems + size_t(t % opt.page_size) * kQK;
      for (int d = 0; d < kQK; ++d) row[d] = f32_bf16(nd(rng));
    }
  // Queries (padding rows too: they must be ignored).
  p.q.resize(size_t(p.total_nodes) * opt.heads * kQK);
  for (auto& x : p.q) x = f32_bf16(opt.q_scale * nd(rng));
  // Trees and vis rows: vis[i] = vis[parent[i]] | {i}; bits past N garbage when poisoned.
  p.vis.assign(size_t(p.total_nodes) * p.W, 0);
  p.parents.resize(p.batch);
  for (int r = 0; r < p.batch; ++r) {
    const int n = reqs[r].nodes;
    p.parents[r] = make_parents(rng, n, reqs[r].shape);
    for (int i = 0; i < n; ++i) {
      uint64_t* row = p.vis.data() + size_t(p.offsets[r] + i) * p.W;
      if (i > 0) std::memcpy(row, p.vis.data() + size_t(p.offsets[r] + p.parents[r][i]) * p.W, size_t(p.W) * 8);
      row[i / 64] |= uint64_t(1) << (i % 64);
    }
    if (opt.poison)
      for (int i = 0; i < n; ++i) {
        uint64_t* row = p.vis.data() + size_t(p.offsets[r] + i) * p.W;
        for (int b = n; b < 64 * p.W; ++b)
          if (junk() & 1) row[b / 64] |= uint64_t(1) << (b % 64);
      }
  }
  if (opt.poison)
    for (size_t i = size_t(p.offsets[p.batch]) * p.W; i < p.vis.size(); ++i) p.vis[i] = junk();
  return p;
}

// Recomputes the vis rows of request r from a parent array given by the caller (e.g. to test a mask
// other than the generated one).
// The single-node decode of chain node i of a batch-1 chain problem p: prefix P + i (the node's ancestors
// become prefix), one node (itself, vis bit 0) at slot P + i, the same KV cache and page table.
inline Problem chain_node_decode(const Problem& p, int i) {
  const int H = p.opt.heads;
  Problem d = p;
  d.prefix = {p.prefix[0] + i};
  d.offsets = {0, 1};
  d.total_nodes = 1;
  d.q.assign(p.q.begin() + size_t(i) * H * kQK, p.q.begin() + size_t(i + 1) * H * kQK);
  d.vis.assign(size_t(d.W), 0);
  d.vis[0] = 1;
  return d;
}

inline void set_tree(Problem& p, int r, const std::vector<int>& parents) {
  p.parents[r] = parents;
  for (int i = 0; i < p.reqs[r].nodes; ++i) {
    uint64_t* row = p.vis.data() + size_t(p.offsets[r] + i) * p.W;
    std::fill(row, row + p.W, 0);
    if (i > 0) std::memcpy(row, p.vis.data() + size_t(p.offsets[r] + parents[i]) * p.W, size_t(p.W) * 8);
    row[i / 64] |= uint64_t(1) << (i % 64);
  }
}

// ---- the brute force ----
struct Ref {
  std::vector<double> out;   // [total_nodes, H, 512]
  std::vector<double> lse;   // [total_nodes, H]
  std::vector<char> bad;     // [total_nodes]: rows expected to be NaN
  std::vector<double> mass;  // [total_nodes, H, 512]: sum_j p_j |v_jd| / l, the scale of P's rounding error
};

// mask(r, i, j): is key slot j visible to node i of request r. Default: prefix or ancestor-or-self by
// walking the parent array.
template <class Mask>
Ref brute_force(const Problem& p, Mask mask, int row_begin = 0, int row_end = -1) {
  const int H = p.opt.heads;
  if (row_end < 0) row_end = p.total_nodes;
  Ref ref;
  ref.out.assign(size_t(p.total_nodes) * H * kV, 0.0);
  ref.lse.assign(size_t(p.total_nodes) * H, -std::numeric_limits<double>::infinity());
  ref.bad.assign(p.total_nodes, 0);
  ref.mass.assign(ref.out.size(), 0.0);
  for (int r = 0; r < p.batch; ++r) {
    const int n = p.offsets[r + 1] - p.offsets[r];
    if (n == 0 || p.offsets[r + 1] <= row_begin || p.offsets[r] >= row_end) continue;
    const int64_t keys = int64_t(p.prefix[r]) + n;
    std::vector<float> K(size_t(keys) * kQK);  // dense gather
    for (int64_t t = 0; t < keys; ++t) {
      const int64_t page = p.page_table[size_t(r) * p.max_pages + t / p.opt.page_size];
      const uint16_t* src = p.kv.data() + (size_t(page) * p.opt.page_size + size_t(t % p.opt.page_size)) * kQK;
      for (int d = 0; d < kQK; ++d) K[size_t(t) * kQK + d] = bf16_f32(src[d]);
    }
    std::vector<double> s(keys);
    std::vector<char> m(keys);
    for (int i = std::max(0, row_begin - p.offsets[r]); i < n && p.offsets[r] + i < row_end; ++i) {
      const int row = p.offsets[r] + i;
      for (int64_t j = 0; j < keys; ++j) m[j] = mask(r, i, j);
      for (int h = 0; h < H; ++h) {
        const uint16_t* qh = p.q.data() + (size_t(row) * H + h) * kQK;
        double qd[kQK];
        for (int d = 0; d < kQK; ++d) qd[d] = bf16_f32(qh[d]);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          if (!m[j]) continue;
          const float* k = K.data() + size_t(j) * kQK;
          double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          for (int d = 0; d < kQK; d += 4) {
            a0 += qd[d] * k[d]; a1 += qd[d + 1] * k[d + 1]; a2 += qd[d + 2] * k[d + 2]; a3 += qd[d + 3] * k[d + 3];
          }
          s[j] = double(p.opt.softmax_scale) * ((a0 + a1) + (a2 + a3));
          mx = std::max(mx, s[j]);
        }
        double* o = ref.out.data() + (size_t(row) * H + h) * kV;
        double* ms = ref.mass.data() + (size_t(row) * H + h) * kV;
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no visible key: 0 / -inf
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          if (!m[j]) continue;
          const double e = std::exp(s[j] - mx);
          sum += e;
          const float* v = K.data() + size_t(j) * kQK;
          for (int d = 0; d < kV; ++d) {
            o[d] += e * v[d];
            ms[d] += e * std::abs(double(v[d]));
          }
        }
        for (int d = 0; d < kV; ++d) {
          o[d] /= sum;
          ms[d] /= sum;
        }
        ref.lse[size_t(row) * H + h] = mx + std::log(sum);
      }
    }
  }
  return ref;
}

inline Ref brute_force(const Problem& p, int row_begin = 0, int row_end = -1) {
  return brute_force(p, [&](int r, int i, int64_t j) {
    if (j < p.prefix[r]) return true;
    for (int a = i; a >= 0; a = p.parents[r][a])
      if (a == j - p.prefix[r]) return true;
    return false;
  }, row_begin, row_end);
}

// ---- comparisons ----
inline int bf16_ulps(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t h) { return (h & 0x8000u) ? -int(h & 0x7FFFu) : int(h); };
  return std::abs(ord(a) - ord(b));
}

struct Tol {
  double out_abs = 8e-4, out_rel = 2.0 / 128, cos = 5e-6;  // the bar (mla-verify-attention.md)
  double lse_abs = 1e-6, lse_rel = 8.0 / 65536;
  // Extra, tighter bounds (< 0: off): out within this many bf16 ulps of the expected bf16 value unless
  // the absolute difference is below ulp_abs_floor (tiny values, where f32 cancellation error exceeds
  // an ulp); out / lse relative bound against the double reference.
  int max_ulps = -1;
  double ulp_abs_floor = 4e-6;
  double out_rel_tight = -1, lse_tight = -1;
  // P rounded before the PV product (DDT_ATTN_P_BF16): each weight p_j carries a relative error up to p_round
  // (bf16: 2^-8), so out_d may move by up to p_round x mass_d (mass_d = sum_j p_j |v_jd| / l, Ref::mass) on top of
  // the bar: an element passes when |a - b| <= max(out_abs, out_rel |b|) + p_round x mass_d. 0: off (the bar).
  double p_round = 0;
};

// The bar of the opt-in P precision DDT_ATTN_P_BF16 (kernels.h): P as one bf16 (unit roundoff 2^-8) before PV.
inline Tol p_bf16_tol() {
  Tol t;
  t.p_round = 1.0 / 256;
  return t;
}

// The tolerances for the f64 CPU twin against the brute force: half a bf16 ulp (2^-8 relative, plus
// the f32 step) on out, f32 rounding on lse.
inline Tol twin_tol() {
  Tol t;
  t.out_rel_tight = 1.0 / 256 * 1.0001;
  t.lse_tight = 1e-6;
  return t;
}
// GPU oracle against the CPU twin: the bar, and at most 1 bf16 ulp apart.
inline Tol oracle_tol() {
  Tol t;
  t.max_ulps = 1;
  return t;
}

struct Report {
  bool ok = true;
  int64_t bad_elems = 0, nan_mismatch = 0, ulp_over = 0, lse_bad = 0, checked = 0;
  double max_abs = 0, max_rel = 0, cos_diff = 0, lse_max_abs = 0;
  int max_ulps = 0;
  std::string first;  // the worst / first failing element, printed
  std::string str() const {
    std::ostringstream s;
    s << (ok ? "ok" : "FAIL") << ": " << checked << " elements, max abs " << max_abs << ", max rel " << max_rel
      << ", cosine diff " << cos_diff << ", max ulps " << max_ulps << ", lse max abs " << lse_max_abs
      << "; failing: " << bad_elems << " out, " << nan_mismatch << " NaN/inf mismatches, " << ulp_over
      << " over the ulp bound, " << lse_bad << " lse" << (first.empty() ? "" : "; first: " + first);
    return s.str();
  }
};

// out/lse (bf16 / f32 from a kernel) against expected values (double), for rows [row_begin, row_end).
// Rows marked bad must be NaN everywhere. `expect16` (optional) gives the expected bf16 values for
// the ulp check.
inline Report compare(const std::vector<uint16_t>& out, const std::vector<float>& lse, const std::vector<double>& eout,
                      const std::vector<double>& exp_lse, const std::vector<char>& bad_rows, int heads, const Tol& tol,
                      const std::vector<uint16_t>* expect16 = nullptr, int row_begin = 0, int row_end = -1,
                      const std::vector<double>* mass = nullptr) {
  Report rep;
  const int rows = int(bad_rows.size());
  if (row_end < 0) row_end = rows;
  double dot = 0, na = 0, nb = 0;
  auto note = [&](const std::string& what) { if (rep.first.empty()) rep.first = what; };
  for (int row = row_begin; row < row_end; ++row)
    for (int h = 0; h < heads; ++h) {
      const size_t rh = size_t(row) * heads + h;
      const float l = lse[rh];
      if (bad_rows[row]) {
        bool all_nan = std::isnan(l);
        for (int d = 0; d < kV; ++d) all_nan = all_nan && std::isnan(bf16_f32(out[rh * kV + d]));
        if (!all_nan) { ++rep.nan_mismatch; note("row " + std::to_string(row) + " should be NaN (bad request)"); }
        continue;
      }
      const double el = exp_lse[rh];
      if (std::isinf(el) || std::isnan(el) || std::isinf(l) || std::isnan(l)) {
        if (!(el == double(l) || (std::isnan(el) && std::isnan(l)))) {  // (a NaN row: NaN where NaN is expected)
          ++rep.lse_bad;
          note("lse[" + std::to_string(row) + "," + std::to_string(h) + "] = " + std::to_string(l) + " expected " +
               std::to_string(el));
        }
      } else {
        const double e = std::abs(double(l) - el);
        rep.lse_max_abs = std::max(rep.lse_max_abs, e);
        bool good = e <= tol.lse_abs || e <= tol.lse_rel * std::abs(el);
        if (tol.lse_tight >= 0) good = good && e <= tol.lse_tight * std::max(1.0, std::abs(el));
        if (!good) {
          ++rep.lse_bad;
          note("lse[" + std::to_string(row) + "," + std::to_string(h) + "] = " + std::to_string(l) + " expected " +
               std::to_string(el));
        }
      }
      for (int d = 0; d < kV; ++d) {
        const size_t i = rh * kV + d;
        const double a = bf16_f32(out[i]), b = eout[i];
        ++rep.checked;
        if (std::isnan(a) || std::isinf(a) || std::isnan(b) || std::isinf(b)) {
          if (!(a == b || (std::isnan(a) && std::isnan(b)))) { ++rep.nan_mismatch; note("out[" + std::to_string(i) + "] = " + std::to_string(a) + " expected " + std::to_string(b)); }
          continue;
        }
        dot += a * b; na += a * a; nb += b * b;
        const double e = std::abs(a - b);
        const double rel = e / std::max(std::abs(b), 1e-30);
        if (e > rep.max_abs) rep.max_abs = e;
        if (rel > rep.max_rel && std::abs(b) > 1e-6) rep.max_rel = rel;
        const double slack = tol.p_round > 0 && mass ? tol.p_round * (*mass)[i] : 0.0;
        bool good = e <= std::max(tol.out_abs, tol.out_rel * std::abs(b)) + slack;
        if (tol.out_rel_tight >= 0) good = good && e <= tol.out_rel_tight * std::abs(b) + 1e-30;
        if (!good) {
          ++rep.bad_elems;
          note("out[row " + std::to_string(row) + ", head " + std::to_string(h) + ", dim " + std::to_string(d) +
               "] = " + std::to_string(a) + " expected " + std::to_string(b));
        }
        if (expect16) {
          const int u = bf16_ulps(out[i], (*expect16)[i]);
          rep.max_ulps = std::max(rep.max_ulps, u);
          if (tol.max_ulps >= 0 && u > tol.max_ulps && e > tol.ulp_abs_floor) {
            ++rep.ulp_over;
            note("out[row " + std::to_string(row) + ", head " + std::to_string(h) + ", dim " + std::to_string(d) +
                 "] " + std::to_string(u) + " ulps: " + std::to_string(a) + " vs " + std::to_string(b));
          }
        }
      }
    }
  rep.cos_diff = (na > 0 && nb > 0) ? 1.0 - dot / std::sqrt(na * nb) : 0.0;
  if (rep.cos_diff < 0) rep.cos_diff = 0;
  rep.ok = rep.bad_elems == 0 && rep.nan_mismatch == 0 && rep.ulp_over == 0 && rep.lse_bad == 0 &&
           rep.cos_diff < tol.cos;
  return rep;
}

inline Report compare_to_ref(const std::vector<uint16_t>& out, const std::vector<float>& lse, const Ref& ref,
                             int heads, const Tol& tol) {
  return compare(out, lse, ref.out, ref.lse, ref.bad, heads, tol, nullptr, 0, -1, &ref.mass);
}

// A kernel result (bf16 / f32) as the expected values of another comparison (e.g. GPU vs CPU twin).
struct Result {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  uint32_t status = 0;
  int rc = DDT_OK;
};

// mass: Ref::mass of the problem, for a tolerance with p_round > 0 (without it such a tolerance is the bar alone).
inline Report compare_results(const Result& got, const Result& want, int heads, const Tol& tol,
                              const std::vector<double>* mass = nullptr) {
  std::vector<double> eo(want.out.size()), el(want.lse.size());
  const int rows = int(want.lse.size() / heads);
  std::vector<char> bad(rows, 0);
  for (size_t i = 0; i < eo.size(); ++i) eo[i] = bf16_f32(want.out[i]);
  for (size_t i = 0; i < el.size(); ++i) el[i] = want.lse[i];
  for (int r = 0; r < rows; ++r) bad[r] = std::isnan(want.lse[size_t(r) * heads]);
  return compare(got.out, got.lse, eo, el, bad, heads, tol, &want.out, 0, -1, mass);
}

inline Result run_cpu(const Problem& p, uint16_t out_poison = 0xFFFF, uint32_t status0 = 0) {
  Result res;
  res.out.assign(p.out_size(), out_poison);
  res.lse.assign(p.lse_size(), std::numeric_limits<float>::quiet_NaN());
  res.status = status0;
  auto prm = p.host_params(res.out.data(), res.lse.data(), &res.status);
  res.rc = ddt_verify_attn_cpu(&prm);
  return res;
}

// NaN scores are never hidden (a NaN in q or in a visible key makes the row NaN, out and lse; only "no visible
// key" gives 0 / -inf). Three requests: in request 0, node 1's q is NaN in every head (every score of those
// rows NaN: the running max never leaves -inf) and node 3's q has one NaN dim per head; request 1's prefix
// key 0 has a NaN in its K part (every row of request 1 sees one NaN score among finite ones); request 2 is
// clean. nan_nodes lists the nodes whose every head must come out NaN.
struct NanScoreCase {
  Problem p;
  std::vector<int> nan_nodes;
};
inline NanScoreCase make_nan_score_problem(uint64_t seed, int page_size, int heads = 8) {
  Options o;
  o.heads = heads;
  o.page_size = page_size;
  NanScoreCase c{make_problem(seed, {{300, 5, Shape::kBushy}, {200, 7, Shape::kChain}, {70, 3, Shape::kStar}}, o), {}};
  Problem& p = c.p;
  for (int h = 0; h < heads; ++h) {
    uint16_t* q1 = p.q.data() + (size_t(p.offsets[0] + 1) * heads + h) * kQK;
    std::fill(q1, q1 + kQK, kNaN16);
    p.q[(size_t(p.offsets[0] + 3) * heads + h) * kQK + 10 + h] = kNaN16;
  }
  const int64_t page = p.page_table[size_t(1) * p.max_pages + 0];  // request 1, slot 0
  p.kv[size_t(page) * size_t(page_size) * kQK + 5] = kNaN16;
  c.nan_nodes = {p.offsets[0] + 1, p.offsets[0] + 3};
  for (int n = p.offsets[1]; n < p.offsets[2]; ++n) c.nan_nodes.push_back(n);
  return c;
}

}  // namespace ddtree::test::attn
