// An emulated flash kernel for precision studies and for tests of the correctness bars themselves (CPU only): the
// problem's rows through an online softmax over 64-key tiles from key 0 (f32 scores and p, the row sum l of the
// unrounded p, f64 PV accumulation), with P rounded before the PV product as a kernel would (PRound), optionally split
// at fixed positions every split_keys keys with each split's unnormalised partial o stored as f32, bf16 or fp16
// (PartialStore) before a combine in split order (f32, as the GPU combine). Used by bench/dev/attn_p_precision.cpp
// (docs/PERF_NOTES.md S41, S57) and tests/attn/test_verify_attn_cpu.cpp (the bf16-P bar admits bf16 rounding and
// rejects coarser).
#pragma once

#include <cmath>

#include "tests/attn/attn_util.h"

namespace ddtree::test::attn {

// How P is rounded before the PV product: exact (f32), one bf16, one fp16, a bf16 hi + lo pair, or (kBits5, a
// deliberately coarse mutant for the tests) 5 significant bits (relative error up to 2^-5).
enum PRound { kExact, kBf16, kFp16, kHiLo, kBits5 };
enum PartialStore { kF32, kPBf16, kPFp16 };
inline float round_p(float p, PRound m) {
  switch (m) {
    case kExact: return p;
    case kBf16: return bf16_f32(f32_bf16(p));
    case kFp16: return float(_Float16(p));
    case kHiLo: { float hi = bf16_f32(f32_bf16(p)); float lo = bf16_f32(f32_bf16(p - hi)); return hi + lo; }
    case kBits5: {
      int e = 0;
      const float m = std::frexp(p, &e);  // p = m 2^e, m in [0.5, 1)
      return std::ldexp(std::nearbyint(m * 32.0f) / 32.0f, e);
    }
  }
  return p;
}
inline float round_partial(double o, PartialStore m) {
  switch (m) {
    case kF32: return float(o);
    case kPBf16: return bf16_f32(f32_bf16(float(o)));
    case kPFp16: return float(_Float16(float(o)));
  }
  return float(o);
}
// split_keys 0: no split (one pass, f64 accumulation); else splits of split_keys keys, each partial o rounded by pm.
inline Result emulate(const Problem& p, PRound mode, int64_t split_keys = 0, PartialStore pm = kF32) {
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

}  // namespace ddtree::test::attn
