// Dev harness (not shipped, CPU only): how rounding P before the PV product moves a flash kernel's output against the
// correctness bar. The sweep's problems (tests/attn/attn_util.h) go through the emulated flash kernel of
// tests/attn/attn_emulate.h (online softmax over 64-key tiles, f32 p, unrounded l, f64 PV accumulation) with P
// exact, as bf16, as fp16 or as a bf16 hi + lo pair; each result is compared with the f64 brute force by the bar
// (Tol{}); P as bf16 also by its own bar (p_bf16_tol). docs/PERF_NOTES.md S41, S57. Second table: the KV split at fixed
// positions (every split_keys keys) with each split's unnormalised partial o stored as f32, bf16 or fp16 before the
// combine (P as hi + lo; docs/PERF_NOTES.md "Split partials in 16 bits").
// build (repo root): g++ -std=c++20 -O2 -I. -Ikernels/include bench/dev/attn_p_precision.cpp -o attn_p_precision
#include "tests/attn/attn_emulate.h"
#include <cstdio>
using namespace ddtree::test::attn;
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
      const Result r = emulate(p, PRound(m));
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
        const Result r = emulate(p, kHiLo, sk, PartialStore(pm));
        const Report rep = compare_to_ref(r.out, r.lse, ref, c.heads, Tol{});
        std::printf("%-22s split %3lld partial %-4s %s bad %lld / %lld, max abs %.2e, cos %.2e\n", c.name, (long long)sk,
                    pnames[pm], rep.ok ? "ok  " : "FAIL", (long long)rep.bad_elems, (long long)rep.checked, rep.max_abs,
                    rep.cos_diff);
      }
  }
}
