// Dev harness (not shipped, CPU only): how rounding P before the PV product moves a flash kernel's output against the
// correctness bar. The sweep's problems (tests/attn/attn_util.h) go through an emulated online softmax over 64-key
// tiles (f32 p, unrounded l, f64 PV accumulation) with P exact, as bf16, as fp16 or as a bf16 hi + lo pair; each
// result is compared with the f64 brute force by the bar (Tol{}); P as bf16 also by its own bar (p_bf16_tol). docs/PERF_NOTES.md S41. Second table: the KV split
// at fixed positions (every split_keys keys) with each split's unnormalised partial o stored as f32, bf16 or fp16
// before the combine (P as hi + lo; docs/PERF_NOTES.md "Split partials in 16 bits").
// build (repo root): g++ -std=c++20 -O2 -I. -Ikernels/include bench/dev/attn_p_precision.cpp -o attn_p_precision
#include "tests/attn/attn_util.h"
#include <cstdio>
using namespace ddtree::test::attn;
enum Mode { kExact, kBf16, kFp16, kHiLo };
enum Partial { kF32, kPBf16, kPFp16 };
static float round_p(float p, Mode m) {
  switch (m) {
    case kExact: return p;
    case kBf16: return bf16_f32(f32_bf16(p));
    case kFp16: return float(_Float16(p));
    case kHiLo: { float hi = bf16_f32(f32_bf16(p)); float lo = bf16_f32(f32_bf16(p - hi)); return hi + lo; }
  }
  return p;
}
static float round_partial(double o, Partial m) {
  switch (m) {
    case kF32: return float(o);
    case kPBf16: return bf16_f32(f32_bf16(float(o)));
    case kPFp16: return float(_Float16(float(o)));
  }
  return float(o);
}
// split_keys 0: no split (one pass, f64 accumulation); else splits of split_keys keys, each partial o rounded by pm.
Result emulate(const Problem& p, Mode mode, int64_t split_keys = 0, Partial pm = kF32) {
  const int H = p.opt.heads;
  Result res;
  res.out.assign(size_t(p.total_nodes) * H * kV, 0);
  res.lse.assign(size_t(p.total_nodes) * H, -INFINITY);
  const float l2e = 1.4426950408889634f;
  for (int r = 0; r < p.batch; ++r) {
    const int n = p.offsets[r + 1] - p.offsets[r];
    const int64_t keys = int64_t(p.prefix[r]) + n;
    std::vector<float> K(size_t(keys) * kQK);
    for (int64_t t = 0; t < keys; ++t) {
      const int64_t page = p.page_table[size_t(r) * p.max_pages + t / p.opt.page_size];
      const uint16_t* src = p.kv.data() + (size_t(page) * p.opt.page_size + size_t(t % p.opt.page_size)) * kQK;
      for (int d = 0; d < kQK; ++d) K[size_t(t) * kQK + d] = bf16_f32(src[d]);
    }
    for (int i = 0; i < n; ++i) {
      const int row = p.offsets[r] + i;
      auto vis = [&](int64_t j) {
        if (j < p.prefix[r]) return true;
        for (int a = i; a >= 0; a = p.parents[r][a]) if (a == j - p.prefix[r]) return true;
        return false;
      };
      for (int h = 0; h < H; ++h) {
        const uint16_t* qh = p.q.data() + (size_t(row) * H + h) * kQK;
        const int64_t sk = split_keys > 0 ? split_keys : keys + 64;
        std::vector<float> ms, ls;          // per split: max (log2 units), sum
        std::vector<std::vector<float>> os; // per split: the stored (rounded) unnormalised o
        for (int64_t s0 = 0; s0 < keys; s0 += sk) {
          const int64_t s1 = std::min(keys, s0 + sk);
          std::vector<double> o(kV, 0.0);
          float m_run = -INFINITY, l_run = 0;
          for (int64_t k0 = s0; k0 < s1; k0 += 64) {
            float s[64]; float mx = -INFINITY;
            for (int e = 0; e < 64; ++e) {
              const int64_t j = k0 + e;
              if (j >= s1 || !vis(j)) { s[e] = -INFINITY; continue; }
              double a = 0; const float* k = &K[size_t(j) * kQK];
              for (int d = 0; d < kQK; ++d) a += double(bf16_f32(qh[d])) * k[d];
              s[e] = float(a) * (p.opt.softmax_scale * l2e);
              mx = std::max(mx, s[e]);
            }
            const float m_new = std::max(m_run, mx), m_use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = exp2f(m_run - m_use);
            for (auto& x : o) x *= alpha;
            l_run *= alpha;
            for (int e = 0; e < 64; ++e) {
              const float pe = exp2f(s[e] - m_use);
              l_run += pe;
              const float pr = round_p(pe, mode);
              if (pr == 0) continue;
              const float* v = &K[size_t(k0 + e) * kQK];
              for (int d = 0; d < kV; ++d) o[d] += double(pr) * v[d];
            }
            m_run = m_new;
          }
          std::vector<float> orounded(kV);
          for (int d = 0; d < kV; ++d) orounded[d] = split_keys > 0 ? round_partial(o[d], pm) : float(o[d]);
          if (split_keys <= 0) {  // one pass: keep the f64 accumulator's division below
            ms.push_back(m_run); ls.push_back(l_run);
            uint16_t* out = &res.out[(size_t(row) * H + h) * kV];
            if (l_run != 0) {
              for (int d = 0; d < kV; ++d) out[d] = f32_bf16(float(o[d] / l_run));
              res.lse[size_t(row) * H + h] = m_run * 0.6931471805599453f + logf(l_run);
            }
            break;
          }
          ms.push_back(m_run); ls.push_back(l_run); os.push_back(orounded);
        }
        if (split_keys <= 0) continue;
        // The combine: M = max m, weights 2^(m_s - M), in split order (f32, as the GPU combine).
        float M = -INFINITY;
        for (float m : ms) M = std::max(M, m);
        if (M == -INFINITY) continue;
        float L = 0;
        std::vector<float> O(kV, 0.f);
        for (size_t i = 0; i < ms.size(); ++i) {
          if (ls[i] == 0) continue;
          const float w = exp2f(ms[i] - M);
          L += ls[i] * w;
          for (int d = 0; d < kV; ++d) O[d] += os[i][d] * w;
        }
        uint16_t* out = &res.out[(size_t(row) * H + h) * kV];
        if (L == 0) continue;
        for (int d = 0; d < kV; ++d) out[d] = f32_bf16(O[d] / L);
        res.lse[size_t(row) * H + h] = M * 0.6931471805599453f + logf(L);
      }
    }
  }
  return res;
}
int main() {
  using S = Shape;
  struct C { const char* name; uint64_t seed; std::vector<ReqSpec> reqs; int heads, page; float qs; };
  std::vector<C> cases = {
      {"T63_P300_random", 6, {{300, 63, S::kRandom}}, 8, 64, 1},
      {"T128_P1_peaky", 10, {{1, 128, S::kRandom}}, 8, 64, 6},
      {"T513_max_tree_q3", 13, {{40, 513, S::kRandom}}, 8, 64, 3},
      {"T64_P2048", 15, {{2048, 64, S::kBushy}}, 8, 64, 1},
      {"T32_P1000_peaky8", 20, {{1000, 32, S::kBushy}}, 8, 13, 8},
      {"T130_P31_H24_peaky", 24, {{31, 130, S::kBushy}}, 24, 32, 6},
      {"T64_P500_q2", 31, {{500, 64, S::kBushy}}, 8, 64, 2},
      {"T64_P500_q4", 32, {{500, 64, S::kBushy}}, 8, 64, 4},
  };
  const char* names[] = {"exact", "bf16", "fp16", "hi+lo"};
  for (const C& c : cases) {
    Options o; o.heads = c.heads; o.page_size = c.page; o.q_scale = c.qs;
    const Problem p = make_problem(c.seed, c.reqs, o);
    const Ref ref = brute_force(p);
    for (int m = 0; m < 4; ++m) {
      const Result r = emulate(p, Mode(m));
      const Report rep = compare_to_ref(r.out, r.lse, ref, c.heads, Tol{});
      std::printf("%-22s %-6s %s bad %lld / %lld, max abs %.2e, cos %.2e\n", c.name, names[m], rep.ok ? "ok  " : "FAIL",
                  (long long)rep.bad_elems, (long long)rep.checked, rep.max_abs, rep.cos_diff);
      if (m == kBf16) {  // the same result under the bar of the opt-in bf16 P mode (p_bf16_tol)
        const Report rb = compare_to_ref(r.out, r.lse, ref, c.heads, p_bf16_tol());
        std::printf("%-22s %-6s %s bad %lld / %lld (bf16 P bar)\n", c.name, "bf16", rb.ok ? "ok  " : "FAIL",
                    (long long)rb.bad_elems, (long long)rb.checked);
      }
    }
    const char* pnames[] = {"f32", "bf16", "fp16"};
    for (int64_t sk : {64, 128, 512})
      for (int pm = 0; pm < 3; ++pm) {
        const Result r = emulate(p, kHiLo, sk, Partial(pm));
        const Report rep = compare_to_ref(r.out, r.lse, ref, c.heads, Tol{});
        std::printf("%-22s split %3lld partial %-4s %s bad %lld / %lld, max abs %.2e, cos %.2e\n", c.name, (long long)sk,
                    pnames[pm], rep.ok ? "ok  " : "FAIL", (long long)rep.bad_elems, (long long)rep.checked, rep.max_abs,
                    rep.cos_diff);
      }
  }
}
