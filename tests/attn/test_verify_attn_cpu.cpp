// Tree-verify MLA attention, CPU twin (ddt_verify_attn_cpu) against an independent brute force
// (tests/attn/attn_util.h: dense gather through the page table, mask from the parent array, double
// softmax), on the sweep of reference/mla-verify-attention.md that a CPU can afford in CI (a few
// seconds): T in {1, 2, 7, 8, 9, 63, 64, 65, 128, 513}, chain / star / deep / bushy / random trees, P in
// {0, 1, 63, 64, 65, 300}, page sizes 1, 64 and odd ones, H in {1, 8, 16}, mixed batches with empty
// requests and padding rows; poison that must not change anything; bad indices; argument errors; chain ==
// causal; bf16 conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "ddtree/kernels.h"
#include "kernels/common/verify_attn_split.h"
#include "tests/attn/attn_emulate.h"
#include "tests/attn/attn_util.h"

using namespace ddtree::test::attn;

namespace {

struct Case {
  const char* name;
  uint64_t seed;
  std::vector<ReqSpec> reqs;
  int heads, page_size, extra_rows = 0, extra_words = 0;
  float q_scale = 1.0f;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  os << c.name << " H=" << c.heads << " page=" << c.page_size << " reqs=";
  for (auto& r : c.reqs) os << "(P" << r.prefix << ",N" << r.nodes << "," << shape_name(r.shape) << ")";
  return os;
}

Options opts(const Case& c) {
  Options o;
  o.heads = c.heads;
  o.page_size = c.page_size;
  o.extra_rows = c.extra_rows;
  o.extra_words = c.extra_words;
  o.q_scale = c.q_scale;
  return o;
}

const std::vector<Case>& sweep() {
  using S = Shape;
  static const std::vector<Case> cases = {
      {"T1_P0", 1, {{0, 1, S::kChain}}, 1, 1},
      {"T2_P1", 2, {{1, 2, S::kChain}}, 8, 64},
      {"T7_P63_star_odd_page", 3, {{63, 7, S::kStar}}, 16, 7},
      {"T8_P64_deep", 4, {{64, 8, S::kDeep}}, 8, 64},
      {"T9_P65_bushy_page1", 5, {{65, 9, S::kBushy}}, 16, 1},
      {"T63_P300_random", 6, {{300, 63, S::kRandom}}, 8, 64},
      {"T64_P0_page3", 7, {{0, 64, S::kBushy}}, 16, 3},
      {"T65_P64_two_words", 8, {{64, 65, S::kBushy}}, 8, 64, 0, 1},
      {"T128_P65_deep_page1", 9, {{65, 128, S::kDeep}}, 2, 1},
      {"T128_P1_peaky", 10, {{1, 128, S::kRandom}}, 1, 64, 0, 0, 6.0f},
      {"mixed_H16", 11, {{0, 1, S::kChain}, {300, 17, S::kDeep}, {63, 9, S::kStar}, {1, 128, S::kBushy}, {64, 8, S::kChain}},
       16, 64, 5},
      {"mixed_odd_page_empty", 12, {{65, 64, S::kStar}, {0, 7, S::kChain}, {5, 0}, {300, 2, S::kChain}, {1, 63, S::kRandom}},
       8, 5, 3},
      {"T513_max_tree", 13, {{40, 513, S::kRandom}}, 1, 64, 0, 0, 3.0f},
      {"batch_empty_only_padding", 14, {{7, 0}}, 8, 64, 4},
  };
  return cases;
}

class VerifyAttnCpu : public ::testing::TestWithParam<Case> {};

TEST_P(VerifyAttnCpu, TwinMatchesBruteForce) {
  const Case& c = GetParam();
  const Problem p = make_problem(c.seed, c.reqs, opts(c));
  const Result got = run_cpu(p);
  ASSERT_EQ(got.rc, DDT_OK) << ddt_last_error_message();
  EXPECT_EQ(got.status, 0u);
  const Ref ref = brute_force(p);
  const Report rep = compare_to_ref(got.out, got.lse, ref, c.heads, twin_tol());
  EXPECT_TRUE(rep.ok) << rep.str();
}

// Poison in what must not be read (unused pages, slots past P + N, unused page-table entries, vis bits
// past N, padding rows' q / vis) and in the output buffer before the call changes nothing, bitwise.
// Run on the sweep's cases of at most 150k (row, head, key) triples (CI time; the large ones add no path).
class VerifyAttnCpuPoison : public ::testing::TestWithParam<Case> {};

std::vector<Case> small_sweep() {
  std::vector<Case> small;
  for (const Case& c : sweep()) {
    int64_t cost = 0;  // (row, head, key) triples
    for (const auto& r : c.reqs) cost += int64_t(r.nodes) * c.heads * (r.prefix + r.nodes);
    if (cost <= 150000) small.push_back(c);
  }
  return small;
}

TEST_P(VerifyAttnCpuPoison, PoisonChangesNothing) {
  const Case& c = GetParam();
  Options clean = opts(c);
  clean.poison = false;
  const Problem pp = make_problem(c.seed, c.reqs, opts(c)), pc = make_problem(c.seed, c.reqs, clean);
  const Result a = run_cpu(pp, 0xFFFF), b = run_cpu(pc, 0x1234, DDT_DATA_NAN_LOGIT);
  ASSERT_EQ(a.rc, DDT_OK);
  ASSERT_EQ(b.rc, DDT_OK);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0);
  EXPECT_EQ(b.status, DDT_DATA_NAN_LOGIT) << "the status word is never cleared";
}

INSTANTIATE_TEST_SUITE_P(Sweep, VerifyAttnCpu, ::testing::ValuesIn(sweep()),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Sweep, VerifyAttnCpuPoison, ::testing::ValuesIn(small_sweep()),
                         [](const auto& info) { return std::string(info.param.name); });

// A chain tree is the causal mask: node i sees slots 0 .. P + i. Checked against the brute force with
// an explicit causal mask, and bitwise against the twin decoding one node at prefix P + i.
TEST(VerifyAttnCpu, ChainEqualsCausal) {
  for (int page : {1, 64, 5}) {
    Options o;
    o.heads = 8;
    o.page_size = page;
    const int P = 65, N = 20;
    const Problem p = make_problem(21 + page, {{P, N, Shape::kChain}}, o);
    const Result got = run_cpu(p);
    const Ref causal = brute_force(p, [&](int, int i, int64_t j) { return j <= P + i; });
    const Report rep = compare_to_ref(got.out, got.lse, causal, o.heads, twin_tol());
    EXPECT_TRUE(rep.ok) << "page " << page << ": " << rep.str();
    for (int i = 0; i < N; ++i) {
      const Result one = run_cpu(chain_node_decode(p, i));  // node i alone at prefix P + i
      ASSERT_EQ(one.rc, DDT_OK);
      EXPECT_EQ(0, std::memcmp(one.out.data(), got.out.data() + size_t(i) * o.heads * kV, one.out.size() * 2))
          << "page " << page << " node " << i;
      EXPECT_EQ(0, std::memcmp(one.lse.data(), got.lse.data() + size_t(i) * o.heads, one.lse.size() * 4));
    }
  }
}

// p_precision DDT_ATTN_P_BF16 permits a kernel to round P to bf16; the twin (the reference) computes at the default
// precision either way: bitwise the same result (kernels.h).
TEST(VerifyAttnCpu, TwinComputesAtTheDefaultPrecisionForEitherPPrecision) {
  Options o;
  o.q_scale = 6.0f;  // (peaked rows: where a rounded P would show)
  Problem p = make_problem(31, {{70, 33, Shape::kBushy}, {0, 5, Shape::kChain}}, o);
  const Result hilo = run_cpu(p);
  p.opt.p_precision = DDT_ATTN_P_BF16;
  const Result bf16 = run_cpu(p);
  ASSERT_EQ(hilo.rc, DDT_OK);
  ASSERT_EQ(bf16.rc, DDT_OK);
  EXPECT_EQ(hilo.out, bf16.out);
  EXPECT_EQ(0, std::memcmp(hilo.lse.data(), bf16.lse.data(), hilo.lse.size() * 4));
}

// The bars themselves, on an emulated flash kernel (tests/attn/attn_emulate.h) over peaked problems of the sweep: P as
// a bf16 hi + lo pair meets the default bar; P as one bf16 misses the default bar (so a kernel's bf16 mode cannot hide
// under it) and meets the bf16-P bar (p_bf16_tol: the default bar plus 2^-8 sum_j p_j |v_jd| / l); P rounded to 5
// significant bits (relative error up to 2^-5) misses the bf16-P bar (so its extra term is not loose enough to admit
// a coarser rounding). The GPU kernels are held to the same bars in tests/gpu.
TEST(VerifyAttnCpu, BarsAdmitTheirRoundingOfPAndRejectCoarser) {
  struct C { const char* name; uint64_t seed; ReqSpec req; int heads, page; float q_scale; };
  for (const C& c : {C{"T128_P1_peaky", 10, {1, 128, Shape::kRandom}, 8, 64, 6.0f},
                     C{"T130_P31_H24_peaky", 24, {31, 130, Shape::kBushy}, 24, 32, 6.0f}}) {
    SCOPED_TRACE(c.name);
    Options o;
    o.heads = c.heads;
    o.page_size = c.page;
    o.q_scale = c.q_scale;
    const Problem p = make_problem(c.seed, {c.req}, o);
    const Ref ref = brute_force(p);
    const Result hilo_r = emulate(p, kHiLo), bf16 = emulate(p, kBf16), bits5 = emulate(p, kBits5);
    const Report hilo = compare_to_ref(hilo_r.out, hilo_r.lse, ref, c.heads, Tol{});
    const Report bf16_default = compare_to_ref(bf16.out, bf16.lse, ref, c.heads, Tol{});
    const Report bf16_own = compare_to_ref(bf16.out, bf16.lse, ref, c.heads, p_bf16_tol());
    const Report bits5_bf16_bar = compare_to_ref(bits5.out, bits5.lse, ref, c.heads, p_bf16_tol());
    std::printf("  %s: hi + lo vs the bar: %s\n  bf16 vs the bar: %lld elements out; vs the bf16-P bar: %s\n  5 bits vs the "
                "bf16-P bar: %lld elements out\n", c.name, hilo.str().c_str(), (long long)bf16_default.bad_elems,
                bf16_own.str().c_str(), (long long)bits5_bf16_bar.bad_elems);
    EXPECT_TRUE(hilo.ok) << hilo.str();
    EXPECT_GT(bf16_default.bad_elems, 0);
    EXPECT_TRUE(bf16_own.ok) << bf16_own.str();
    EXPECT_GT(bits5_bf16_bar.bad_elems, 0);
  }
}

// A row whose mask shows no key at all (P = 0, empty vis row): out 0, lse -inf. Padding rows likewise.
TEST(VerifyAttnCpu, NoVisibleKeyAndPaddingRows) {
  Options o;
  o.heads = 2;
  o.extra_rows = 2;
  Problem p = make_problem(31, {{0, 3, Shape::kChain}}, o);
  std::fill(p.vis.begin() + size_t(1) * p.W, p.vis.begin() + size_t(2) * p.W, 0);  // node 1 sees nothing
  const Result got = run_cpu(p);
  ASSERT_EQ(got.rc, DDT_OK);
  for (int row : {1, 3, 4})
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(got.lse[size_t(row) * 2 + h], -std::numeric_limits<float>::infinity()) << row;
      for (int d = 0; d < kV; ++d) ASSERT_EQ(got.out[(size_t(row) * 2 + h) * kV + d], 0u) << row;
    }
  EXPECT_TRUE(std::isfinite(got.lse[0]) && std::isfinite(got.lse[4]));
  EXPECT_EQ(got.status, 0u);
}

// NaN scores: the rows that see one are NaN (out and lse), also when every score of the row is NaN; every
// other row exactly as in a clean run; no status bit (the data is not malformed, only not finite).
TEST(VerifyAttnCpu, NanScoresMakeTheirRowsNaN) {
  for (int page : {1, 64}) {
    SCOPED_TRACE("page " + std::to_string(page));
    const NanScoreCase c = make_nan_score_problem(57, page);
    const Problem& p = c.p;
    const Result got = run_cpu(p);
    const Result clean = run_cpu(make_problem(57, p.reqs, p.opt));
    ASSERT_EQ(got.rc, DDT_OK);
    EXPECT_EQ(got.status, 0u);
    for (int row = 0; row < p.total_nodes; ++row) {
      const bool want_nan = std::find(c.nan_nodes.begin(), c.nan_nodes.end(), row) != c.nan_nodes.end();
      for (int h = 0; h < p.opt.heads; ++h) {
        const size_t rh = size_t(row) * p.opt.heads + h;
        if (want_nan) {
          EXPECT_TRUE(std::isnan(got.lse[rh])) << "row " << row << " head " << h;
          for (int d = 0; d < kV; ++d) ASSERT_TRUE(std::isnan(bf16_f32(got.out[rh * kV + d]))) << "row " << row;
        } else {
          EXPECT_EQ(0, std::memcmp(&got.lse[rh], &clean.lse[rh], 4)) << "row " << row;
          EXPECT_EQ(0, std::memcmp(&got.out[rh * kV], &clean.out[rh * kV], kV * 2)) << "row " << row;
        }
      }
    }
  }
}

// Device-data errors: DDT_DATA_BAD_INDEX, the offending request's rows NaN, every other row exactly as
// in a clean run. Malformed node_offsets poison every row.
TEST(VerifyAttnCpu, BadIndicesPoisonOnlyTheirRequest) {
  Options o;
  o.heads = 4;
  o.page_size = 16;
  o.extra_rows = 1;
  const std::vector<ReqSpec> reqs = {{40, 5, Shape::kBushy}, {100, 9, Shape::kDeep}, {0, 3, Shape::kChain}};
  const Problem base = make_problem(41, reqs, o);
  const Result clean = run_cpu(base);
  ASSERT_EQ(clean.status, 0u);
  struct Mutation {
    const char* what;
    std::function<void(Problem&)> apply;
    int bad_request;  // -1: every row
  };
  const std::vector<Mutation> muts = {
      {"page -1", [](Problem& p) { p.page_table[1 * p.max_pages + 2] = -1; }, 1},
      {"page == num_pages", [](Problem& p) { p.page_table[1 * p.max_pages + 0] = int32_t(p.num_pages); }, 1},
      {"last needed page huge", [](Problem& p) { p.page_table[0 * p.max_pages + 2] = 1 << 30; }, 0},
      {"prefix < 0", [](Problem& p) { p.prefix[2] = -1; }, 2},
      {"P + N beyond the page table row", [](Problem& p) { p.prefix[0] = p.max_pages * p.opt.page_size; }, 0},
      {"N > 64 W", [](Problem& p) { p.offsets = {0, 5, 5 + 65, 5 + 65}; p.total_nodes = 70; p.reqs[1].nodes = 65;
                                    p.q.resize(size_t(70) * p.opt.heads * kQK); p.vis.resize(size_t(70) * p.W); }, 1},
      {"offsets decreasing", [](Problem& p) { p.offsets[2] = 4; }, -1},
      {"offsets[0] != 0", [](Problem& p) { p.offsets[0] = 1; }, -1},
      {"offsets end > total_nodes", [](Problem& p) { p.offsets[3] = p.total_nodes + 1; }, -1},
  };
  for (const auto& m : muts) {
    SCOPED_TRACE(m.what);
    Problem p = base;
    m.apply(p);
    const Result got = run_cpu(p);
    ASSERT_EQ(got.rc, DDT_OK);
    EXPECT_EQ(got.status, DDT_DATA_BAD_INDEX);
    for (int row = 0; row < p.total_nodes; ++row) {
      int owner = -1;
      for (int r = 0; r < p.batch; ++r)
        if (row >= p.offsets[r] && row < p.offsets[r + 1]) owner = r;
      const bool expect_nan = m.bad_request < 0 || owner == m.bad_request;
      for (int h = 0; h < o.heads; ++h) {
        const size_t rh = size_t(row) * o.heads + h;
        if (expect_nan) {
          EXPECT_TRUE(std::isnan(got.lse[rh])) << "row " << row;
          for (int d = 0; d < kV; ++d) ASSERT_EQ(got.out[rh * kV + d], kNaN16) << "row " << row;
        } else if (p.total_nodes == base.total_nodes) {
          EXPECT_EQ(0, std::memcmp(&got.lse[rh], &clean.lse[rh], 4)) << "row " << row;
          EXPECT_EQ(0, std::memcmp(&got.out[rh * kV], &clean.out[rh * kV], kV * 2)) << "row " << row;
        } else {
          EXPECT_FALSE(std::isnan(got.lse[rh])) << "row " << row;
        }
      }
    }
  }
}

// Host-visible argument errors: a code and a message, nothing written.
TEST(VerifyAttnCpu, ArgumentErrors) {
  Options o;
  o.heads = 2;
  const Problem p = make_problem(51, {{3, 2, Shape::kChain}}, o);
  std::vector<uint16_t> out(p.out_size() + 8, 0xABCD);
  std::vector<float> lse(p.lse_size(), 7.0f);
  uint32_t st = 0;
  const auto good = p.host_params(out.data(), lse.data(), &st);
  ASSERT_EQ(ddt_verify_attn_cpu(&good), DDT_OK);
  std::fill(out.begin(), out.end(), 0xABCD);
  std::fill(lse.begin(), lse.end(), 7.0f);
  struct Bad {
    const char* what;
    std::function<void(ddt_verify_attn_params&)> apply;
    int code;
  };
  const std::vector<Bad> bads = {
      {"q null", [](auto& x) { x.q = nullptr; }, DDT_ERR_NULL},
      {"kv null", [](auto& x) { x.kv_cache = nullptr; }, DDT_ERR_NULL},
      {"page_table null", [](auto& x) { x.page_table = nullptr; }, DDT_ERR_NULL},
      {"prefix null", [](auto& x) { x.prefix_lens = nullptr; }, DDT_ERR_NULL},
      {"offsets null", [](auto& x) { x.node_offsets = nullptr; }, DDT_ERR_NULL},
      {"vis null", [](auto& x) { x.vis = nullptr; }, DDT_ERR_NULL},
      {"out null", [](auto& x) { x.out = nullptr; }, DDT_ERR_NULL},
      {"lse null", [](auto& x) { x.lse = nullptr; }, DDT_ERR_NULL},
      {"status null", [](auto& x) { x.status = nullptr; }, DDT_ERR_NULL},
      {"q misaligned", [](auto& x) { x.q = x.q + 1; }, DDT_ERR_ALIGN},
      {"kv misaligned", [](auto& x) { x.kv_cache = x.kv_cache + 4; }, DDT_ERR_ALIGN},
      {"out misaligned", [](auto& x) { x.out = x.out + 2; }, DDT_ERR_ALIGN},
      {"vis misaligned", [](auto& x) { x.vis = reinterpret_cast<const uint64_t*>(reinterpret_cast<const char*>(x.vis) + 4); }, DDT_ERR_ALIGN},
      {"heads 0", [](auto& x) { x.heads = 0; }, DDT_ERR_SHAPE},
      {"heads 257", [](auto& x) { x.heads = 257; }, DDT_ERR_SHAPE},
      {"page_size 0", [](auto& x) { x.page_size = 0; }, DDT_ERR_SHAPE},
      {"batch -1", [](auto& x) { x.batch = -1; }, DDT_ERR_SHAPE},
      {"total_nodes -1", [](auto& x) { x.total_nodes = -1; }, DDT_ERR_SHAPE},
      {"max_pages 0", [](auto& x) { x.max_pages = 0; }, DDT_ERR_SHAPE},
      {"num_pages 0", [](auto& x) { x.num_pages = 0; }, DDT_ERR_SHAPE},
      {"vis_words 0", [](auto& x) { x.vis_words = 0; }, DDT_ERR_SHAPE},
      {"scale NaN", [](auto& x) { x.softmax_scale = std::nanf(""); }, DDT_ERR_VALUE},
      {"scale inf", [](auto& x) { x.softmax_scale = std::numeric_limits<float>::infinity(); }, DDT_ERR_VALUE},
      {"scale 0", [](auto& x) { x.softmax_scale = 0.0f; }, DDT_ERR_VALUE},
      {"scale < 0", [](auto& x) { x.softmax_scale = -0.1f; }, DDT_ERR_VALUE},
      {"p_precision 2", [](auto& x) { x.p_precision = 2; }, DDT_ERR_VALUE},
      {"p_precision -1", [](auto& x) { x.p_precision = -1; }, DDT_ERR_VALUE},
  };
  for (const auto& b : bads) {
    auto prm = good;
    b.apply(prm);
    EXPECT_EQ(ddt_verify_attn_cpu(&prm), b.code) << b.what;
    EXPECT_NE(std::string(ddt_last_error_message()).find("verify_attn"), std::string::npos) << b.what;
    // Without a GPU (or a cuda backend) the _cuda entry returns the same validation code first.
    EXPECT_EQ(ddt_verify_attn_cuda(&prm, nullptr), b.code) << b.what;
  }
  EXPECT_EQ(ddt_verify_attn_cpu(nullptr), DDT_ERR_NULL);
  for (uint16_t x : out) ASSERT_EQ(x, 0xABCD) << "an argument error wrote output";
  for (float x : lse) ASSERT_EQ(x, 7.0f);
  EXPECT_EQ(st, 0u);
}

// bf16 conversions of the library against the test's own (round half to even; NaN stays NaN; overflow
// to inf) on special values and 10^5 random bit patterns, and exhaustive exact widening.
TEST(VerifyAttnCpu, Bf16Conversions) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = ddt_bf16_to_f32(uint16_t(h));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ASSERT_EQ(u, h << 16);
  }
  auto check = [](float x) {
    const uint16_t got = ddt_f32_to_bf16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(bf16_f32(got))) << x;
      return;
    }
    ASSERT_EQ(got, f32_bf16(x)) << x;
    // Nearest: no other bf16 is closer (checked in double).
    const double d = std::abs(double(bf16_f32(got)) - x);
    for (int s : {-1, 1}) {
      const uint16_t n = uint16_t(got + s);
      if (!std::isnan(bf16_f32(n)) && !std::isinf(double(bf16_f32(got)))) {
        ASSERT_LE(d, std::abs(double(bf16_f32(n)) - x)) << x;
      }
    }
  };
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* tie -> even (down) */, 1.01171875f /* tie -> even (up) */,
                  3.3895314e38f /* the largest bf16 */, 3.3963e38f /* above its half-way point: inf */, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(), std::nanf("")})
    check(x);
  EXPECT_EQ(ddt_f32_to_bf16(1.00390625f), 0x3F80);
  EXPECT_EQ(ddt_f32_to_bf16(1.01171875f), 0x3F82);
  EXPECT_EQ(ddt_f32_to_bf16(3.3961e38f), 0x7F7F);  // just below the half-way point to 2^128
  EXPECT_EQ(ddt_f32_to_bf16(3.3963e38f), 0x7F80);  // just above it: +inf
  uint32_t nan_low = 0x7F800001u;  // NaN whose payload is only in the low half: must stay NaN
  float fn;
  std::memcpy(&fn, &nan_low, 4);
  EXPECT_TRUE(std::isnan(ddt_bf16_to_f32(ddt_f32_to_bf16(fn))));
  std::mt19937_64 rng(61);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = uint32_t(rng());
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
  }
}

// The flash kernels' work split (kernels/common/verify_attn_split.h), checked here because the grid and the
// workspace are sized from it on the host: for random capacities, split lengths and requests inside the
// capacities, every plan covers its key tiles exactly with cuts at absolute multiples of split_keys, and the
// per-request sums never exceed the capacity bounds (a miss would be a lost work item or a workspace overrun
// on the GPU). The sm_90a kernel plans with 64-row tiles against the same bounds and the same combine (whose
// counts use the 32-row plan): its split counts must equal the portable plan's, its items fit the bound.
TEST(VerifyAttnSplit, PlansCutAtAbsolutePositionsAndStayInsideTheCapacityBounds) {
  using namespace ddtree::kern::attn;
  std::mt19937_64 rng(67);
  const int split_choices[] = {0, 32, 64, 256, 512, 1024, 4096};
  for (int trial = 0; trial < 3000; ++trial) {
    const int S = split_choices[trial % 7];
    ddt_verify_attn_params p{};
    p.batch = 1 + int(rng() % 70);
    p.heads = 1 + int(rng() % (trial % 3 == 0 ? 64 : 16));
    p.page_size = trial % 2 ? 64 : 1 + int(rng() % 17);
    const int64_t max_keys_want = 1 + int64_t(rng() % (trial % 5 == 0 ? 140000 : 5000));
    p.max_pages = int((max_keys_want + p.page_size - 1) / p.page_size);
    p.total_nodes = int(rng() % (p.batch * 80 + 1));
    const int64_t max_keys = int64_t(p.max_pages) * p.page_size;
    const Bounds b = capacity_bounds(p, S);
    int64_t items = 0, items64 = 0, partial_rows = 0, nodes_left = p.total_nodes;
    for (int r = 0; r < p.batch; ++r) {
      const int64_t n = (rng() % 4 == 0) ? nodes_left : int64_t(rng() % (nodes_left + 1));
      nodes_left -= n;
      const int64_t rows = n * p.heads;
      if (n > max_keys || rng() % 10 == 0) {  // an invalid request (bad scalars): one item per row tile
        items += split_plan(0, rows, S).row_tiles;
        items64 += split_plan(0, rows, S, 64).row_tiles;
        ASSERT_EQ(split_plan(0, rows, S).splits, 1);
        ASSERT_EQ(split_plan(0, rows, S, 64).splits, 1);
        continue;
      }
      const int64_t keys = n + int64_t(rng() % (max_keys - n + 1));
      const SplitPlan s = split_plan(keys, rows, S);
      const int64_t ktiles = (keys + kKeyTile - 1) / kKeyTile;
      ASSERT_GE(s.splits, 1);
      ASSERT_EQ(s.row_tiles, (rows + kRowTile - 1) / kRowTile);
      if (rows > 0) {
        ASSERT_LT(int64_t(s.splits - 1) * s.tiles_per_split, ktiles) << "an empty split";
        ASSERT_GE(int64_t(s.splits) * s.tiles_per_split, ktiles) << "key tiles left over";
      }
      if (s.splits > 1) {
        ASSERT_EQ(s.tiles_per_split * kKeyTile, S) << "cuts at absolute multiples of split_keys";
        partial_rows += rows * s.splits;
      } else {
        ASSERT_TRUE(S == 0 || keys <= S || rows == 0);
      }
      items += int64_t(s.row_tiles) * s.splits;
      const SplitPlan s64 = split_plan(keys, rows, S, 64);
      ASSERT_EQ(s64.splits, s.splits) << "the sm_90a plan splits where the portable one does";
      ASSERT_EQ(s64.row_tiles, (rows + 63) / 64);
      items64 += int64_t(s64.row_tiles) * s64.splits;
    }
    ASSERT_LE(items, b.items) << "trial " << trial;
    ASSERT_LE(items64, b.items) << "trial " << trial << " (sm_90a plan)";
    ASSERT_LE(partial_rows, b.partial_rows) << "trial " << trial;
    size_t bytes = 0;
    ASSERT_EQ(ddt_verify_attn_portable_workspace(&p, S, &bytes), DDT_OK);
    ASSERT_EQ(bytes, size_t(b.partial_rows) * size_t(kPartialRowBytes));
    if (S == 0) {
      ASSERT_EQ(bytes, 0u);
    }
    // The sm_90a plan: a 64-byte header and a 32-byte record per item of the bound (>= the 64-row items).
    size_t plan = 0;
    ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&p, S, &plan), DDT_OK);
    ASSERT_EQ(plan, 64 + size_t(b.items) * 32);
    ASSERT_GE(int64_t(plan), 64 + items64 * 32) << "trial " << trial;
  }
  // A chain node and its single-node decode: the same cut points over their common keys (rule E).
  for (int S : {32, 512, 1024}) {
    const SplitPlan chain = split_plan(1000 + 40, 40 * 8, S), decode = split_plan(1000 + 7 + 1, 8, S);
    if (chain.splits > 1 && decode.splits > 1) {
      EXPECT_EQ(chain.tiles_per_split, decode.tiles_per_split);
    }
  }
  // Extreme capacities (page_size = max_pages = 2^31 - 1): no int64 overflow; unsplit needs no workspace,
  // a split length that would need >= 2^31 partial rows is refused.
  ddt_verify_attn_params huge{};
  huge.batch = 29; huge.total_nodes = 100; huge.heads = 8;
  huge.page_size = 0x7FFFFFFF; huge.max_pages = 0x7FFFFFFF;
  size_t huge_bytes = 1;
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&huge, 0, &huge_bytes), DDT_OK);
  EXPECT_EQ(huge_bytes, 0u);
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&huge, 512, &huge_bytes), DDT_ERR_SHAPE);
  ddt_verify_attn_params bad{};
  size_t bytes = 0;
  EXPECT_EQ(ddt_verify_attn_portable_workspace(nullptr, 512, &bytes), DDT_ERR_NULL);
  bad.batch = 1; bad.heads = 0; bad.page_size = 1; bad.max_pages = 1;
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&bad, 512, &bytes), DDT_ERR_SHAPE);
  bad.heads = 1;
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&bad, 48, &bytes), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&bad, 512, &bytes), DDT_OK);
  // The plan's size: the same checks.
  EXPECT_EQ(ddt_verify_attn_sm90_plan_bytes(&bad, 512, nullptr), DDT_ERR_NULL);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_bytes(&bad, 48, &bytes), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_bytes(&huge, 512, &bytes), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_bytes(&bad, 512, &bytes), DDT_OK);
  EXPECT_EQ(bytes, 64u + 32u);  // batch 1, no rows: the bound's one item (a tile per request, one split)
}

}  // namespace

namespace {

// The CPU twin's plan of a problem (PlanItem storage: 16-byte aligned; the header, then the items).
struct CpuPlan {
  std::vector<ddtree::kern::attn::PlanItem> buf;
  const ddtree::kern::attn::PlanHeader& header() const {
    return *reinterpret_cast<const ddtree::kern::attn::PlanHeader*>(buf.data());
  }
  const ddtree::kern::attn::PlanItem* items() const {
    return reinterpret_cast<const ddtree::kern::attn::PlanItem*>(&header() + 1);
  }
};
CpuPlan cpu_plan(const Problem& pb, int split_keys) {
  std::vector<uint16_t> out(pb.out_size());
  std::vector<float> lse(pb.lse_size());
  uint32_t status = 0;
  const ddt_verify_attn_params p = pb.host_params(out.data(), lse.data(), &status);
  size_t bytes = 0;
  EXPECT_EQ(ddt_verify_attn_sm90_plan_bytes(&p, split_keys, &bytes), DDT_OK);
  CpuPlan plan;
  plan.buf.resize(bytes / sizeof(ddtree::kern::attn::PlanItem) + 2);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cpu(&p, split_keys, plan.buf.data(), bytes), DDT_OK);
  return plan;
}

// The plan kernel's CPU twin (ddt_verify_attn_sm90_plan_cpu) on a hand-counted batch: r0 P 600 N 2 (16 rows, 602
// keys: 2 splits at 512, 1 row tile), r1 P 10 N 1 (11 keys: unsplit), r2 P 1000 N 9 (72 rows: 2 row tiles, 1009
// keys: 2 splits) with a bad page in r2's second split. Items in order (request, split x row_tiles + tile, the
// request's first workspace row), the leading splits' first, then every request's last split: (0,0,0) (2,0,32)
// (2,1,32), then (0,1,0) (1,0,32) (2,2,32) (2,3,32); r2's split-1 items bad. Also: a malformed node_offsets
// (header only), and the argument errors.
TEST(VerifyAttnPlanCpu, ItemsInScanOrderWithPageVerdictsAndFirstPages) {
  using namespace ddtree::kern::attn;
  Options o;
  o.heads = 8;
  o.page_size = 64;
  Problem pb = make_problem(5, {{600, 2, Shape::kChain}, {10, 1, Shape::kChain}, {1000, 9, Shape::kBushy}}, o);
  const int bad_page = 600 / 64 + 1;  // r2, keys 640..703: inside its second split (512..1008)
  pb.page_table[size_t(2) * pb.max_pages + bad_page] = -1;
  std::vector<uint16_t> out(pb.out_size());
  std::vector<float> lse(pb.lse_size());
  uint32_t status = 0;
  const ddt_verify_attn_params prm = pb.host_params(out.data(), lse.data(), &status);
  size_t bytes = 0;
  ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&prm, 512, &bytes), DDT_OK);
  std::vector<PlanItem> buf(bytes / sizeof(PlanItem) + 2);  // (16-byte aligned storage)
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 512, buf.data(), bytes), DDT_OK);
  const PlanHeader& h = *reinterpret_cast<const PlanHeader*>(buf.data());
  const PlanItem* it = reinterpret_cast<const PlanItem*>(&h + 1);
  EXPECT_EQ(h.magic, kPlanMagic);
  EXPECT_EQ(h.batch, 3);
  EXPECT_EQ(h.heads, 8);
  EXPECT_EQ(h.split_keys, 512);
  EXPECT_EQ(h.total_nodes, 12);
  EXPECT_EQ(h.num_pages, pb.num_pages);
  EXPECT_EQ(h.offsets_bad, 0);
  EXPECT_EQ(h.rows_end, 12);
  ASSERT_EQ(h.items, 7);
  const int want[7][4] = {{0, 0, 0, 0}, {2, 0, 32, 0}, {2, 1, 32, 0}, {0, 1, 0, 0}, {1, 0, 32, 0}, {2, 2, 32, 1}, {2, 3, 32, 1}};
  const int64_t first_key[7] = {0, 0, 0, 512, 0, 512, 512};
  for (int b = 0; b < 7; ++b) {
    SCOPED_TRACE("item " + std::to_string(b));
    EXPECT_EQ(it[b].r, want[b][0]);
    EXPECT_EQ(it[b].local, want[b][1]);
    EXPECT_EQ(it[b].partial_base, want[b][2]);
    EXPECT_EQ(it[b].bad, want[b][3]);
    const int r = want[b][0];
    EXPECT_EQ(it[b].first_row, pb.offsets[r]);
    EXPECT_EQ(it[b].nodes, pb.offsets[r + 1] - pb.offsets[r]);
    EXPECT_EQ(it[b].prefix, pb.prefix[r]);
    EXPECT_EQ(it[b].first_page, want[b][3] ? 0 : pb.page_table[size_t(r) * pb.max_pages + first_key[b] / 64]);
  }
  // Unsplit (split_keys 0): one item per row tile, no workspace rows.
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 0, buf.data(), bytes), DDT_OK);
  ASSERT_EQ(h.items, 4);  // r0, r1, r2 tile 0, r2 tile 1
  EXPECT_EQ(it[3].local, 1);  // (r2, row tile 1)
  EXPECT_EQ(it[3].bad, 1);  // r2's whole key range includes the bad page
  EXPECT_EQ(it[3].partial_base, 0);
  // Requests of more than 128 rows keep their splits together, request-major, in the first phase; the last split
  // of the others comes after every other item. r0 and r2: 2 nodes x 8 heads (16 rows, 602 keys: 2 splits); r1:
  // 17 nodes (136 rows, 3 row tiles, 617 keys: 2 splits). First workspace rows: r0 0, r1 2 x 16 = 32, r2 32 +
  // 2 x 136 = 304. Unsplit (split_keys 0): r1's 3 row tiles first, then r0 and r2 (every item of an unsplit
  // request is its last split's).
  {
    const Problem mix =
        make_problem(6, {{600, 2, Shape::kChain}, {600, 17, Shape::kBushy}, {600, 2, Shape::kChain}}, o);
    const CpuPlan plan = cpu_plan(mix, 512), plan0 = cpu_plan(mix, 0);
    const PlanItem* im = plan.items();
    ASSERT_EQ(plan.header().items, 10);
    const int order[10][3] = {{0, 0, 0},  {1, 0, 32}, {1, 1, 32}, {1, 2, 32}, {1, 3, 32},
                              {1, 4, 32}, {1, 5, 32}, {2, 0, 304}, {0, 1, 0}, {2, 1, 304}};
    for (int b = 0; b < 10; ++b) {
      SCOPED_TRACE("split 512, item " + std::to_string(b));
      EXPECT_EQ(im[b].r, order[b][0]);
      EXPECT_EQ(im[b].local, order[b][1]);
      EXPECT_EQ(im[b].partial_base, order[b][2]);
    }
    ASSERT_EQ(plan0.header().items, 5);
    const int order0[5][2] = {{1, 0}, {1, 1}, {1, 2}, {0, 0}, {2, 0}};
    for (int b = 0; b < 5; ++b) {
      SCOPED_TRACE("split 0, item " + std::to_string(b));
      EXPECT_EQ(plan0.items()[b].r, order0[b][0]);
      EXPECT_EQ(plan0.items()[b].local, order0[b][1]);
      EXPECT_EQ(plan0.items()[b].partial_base, 0);
    }
  }
  // The boundary, at one head: 128 rows (r0, 2 row tiles) last split last, 129 rows (r1, 3 row tiles)
  // request-major.
  {
    Options o1 = o;
    o1.heads = 1;
    const CpuPlan plan = cpu_plan(make_problem(8, {{600, 128, Shape::kBushy}, {600, 129, Shape::kBushy}}, o1), 512);
    const PlanItem* ie = plan.items();
    ASSERT_EQ(plan.header().items, 10);  // 728 / 729 keys: 2 splits each; 2 + 3 row tiles
    const int order[10][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {0, 2}, {0, 3}};
    for (int b = 0; b < 10; ++b) {
      SCOPED_TRACE("item " + std::to_string(b));
      EXPECT_EQ(ie[b].r, order[b][0]);
      EXPECT_EQ(ie[b].local, order[b][1]);
    }
  }
  // The split bound (32 at split_keys 512): r1 has 16,384 keys (32 splits: last split last), r2 16,385 (33 splits:
  // request-major); r0 and r3: 16 rows, 602 keys (2 splits). First workspace rows: r0 0, r1 2 x 16 = 32, r2 32 +
  // 32 x 8 = 288, r3 288 + 33 x 8 = 552.
  {
    const CpuPlan plan = cpu_plan(make_problem(7, {{600, 2, Shape::kChain}, {16383, 1, Shape::kChain},
                                                   {16384, 1, Shape::kChain}, {600, 2, Shape::kChain}}, o), 512);
    const PlanItem* il = plan.items();
    ASSERT_EQ(plan.header().items, 2 + 32 + 33 + 2);
    std::vector<std::array<int, 3>> want;  // (request, local, first workspace row)
    want.push_back({0, 0, 0});
    for (int l = 0; l < 31; ++l) want.push_back({1, l, 32});
    for (int l = 0; l < 33; ++l) want.push_back({2, l, 288});
    want.push_back({3, 0, 552});
    want.push_back({0, 1, 0});
    want.push_back({1, 31, 32});
    want.push_back({3, 1, 552});
    for (int b = 0; b < int(want.size()); ++b) {
      SCOPED_TRACE("item " + std::to_string(b));
      EXPECT_EQ(il[b].r, want[size_t(b)][0]);
      EXPECT_EQ(il[b].local, want[size_t(b)][1]);
      EXPECT_EQ(il[b].partial_base, want[size_t(b)][2]);
    }
  }
  // Malformed node_offsets: the header says so and lists nothing.
  Problem bad_off = pb;
  bad_off.offsets[2] = bad_off.offsets[1] - 1;
  const ddt_verify_attn_params prm2 = bad_off.host_params(out.data(), lse.data(), &status);
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm2, 512, buf.data(), bytes), DDT_OK);
  EXPECT_EQ(h.offsets_bad, 1);
  EXPECT_EQ(h.items, 0);
  EXPECT_EQ(h.rows_end, 0);
  // Argument errors.
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 512, nullptr, bytes), DDT_ERR_NULL);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 512, reinterpret_cast<char*>(buf.data()) + 8, bytes), DDT_ERR_ALIGN);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 512, buf.data(), bytes - 1), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cpu(&prm, 48, buf.data(), bytes), DDT_ERR_SHAPE);
}

// The plan's order balances the persistent CTAs (item b runs on CTA b % grid; docs/PERF_NOTES.md S32): 2k T 1 b 64
// at split_keys 512 (2,049 keys per request: 4 splits of 8 64-key tiles and a last one of 1) on 132 CTAs. Listing
// every last split after the full ones leaves the busiest CTA 2 full items and one last one (17 tiles, mean 16);
// the request-major order it replaced gave 3 full items (24 tiles) to some. (Only the indices are read: every
// request aliases the same 33 pages.)
TEST(VerifyAttnPlanCpu, LastSplitsAfterTheFullOnesBalanceTheCtas) {
  using namespace ddtree::kern::attn;
  const int batch = 64, heads = 8, grid = 132, pages = 33;
  std::vector<int32_t> page_table(size_t(batch) * pages), prefix(batch, 2048), offsets(batch + 1);
  for (int r = 0; r < batch; ++r)
    for (int k = 0; k < pages; ++k) page_table[size_t(r) * pages + k] = k;
  for (int r = 0; r <= batch; ++r) offsets[r] = r;
  std::vector<uint16_t> dummy16(16);
  std::vector<uint64_t> vis(batch, 1);
  std::vector<float> lse(16);
  uint32_t status = 0;
  ddt_verify_attn_params p{};
  p.q = dummy16.data();
  p.kv_cache = dummy16.data();
  p.page_table = page_table.data();
  p.prefix_lens = prefix.data();
  p.node_offsets = offsets.data();
  p.vis = vis.data();
  p.batch = batch;
  p.total_nodes = batch;
  p.heads = heads;
  p.page_size = 64;
  p.max_pages = pages;
  p.num_pages = pages;
  p.vis_words = 1;
  p.softmax_scale = 0.04f;
  p.out = dummy16.data();
  p.lse = lse.data();
  p.status = &status;
  size_t bytes = 0;
  ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&p, 512, &bytes), DDT_OK);
  std::vector<PlanItem> buf(bytes / sizeof(PlanItem) + 2);
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cpu(&p, 512, buf.data(), bytes), DDT_OK);
  const PlanHeader& h = *reinterpret_cast<const PlanHeader*>(buf.data());
  const PlanItem* it = reinterpret_cast<const PlanItem*>(&h + 1);
  ASSERT_EQ(h.items, batch * 5);
  std::vector<int> tiles_listed, tiles_request_major(size_t(h.items));
  for (int b = 0; b < h.items; ++b) {
    const int tiles = it[b].local < 4 ? 8 : 1;  // one row tile: local = split
    tiles_listed.push_back(tiles);
    tiles_request_major[size_t(it[b].r) * 5 + size_t(it[b].local)] = tiles;
    if (b < batch * 4) {
      ASSERT_LT(it[b].local, 4) << "item " << b << ": the full splits first";
    } else {
      ASSERT_EQ(it[b].local, 4) << "item " << b;
      ASSERT_EQ(it[b].r, b - batch * 4) << "then the last splits, request by request";
    }
  }
  auto busiest = [&](const std::vector<int>& tiles) {
    std::vector<int> load(grid, 0);
    for (size_t b = 0; b < tiles.size(); ++b) load[b % grid] += tiles[b];
    return *std::max_element(load.begin(), load.end());
  };
  std::printf("  2k T 1 b 64 on %d CTAs: busiest CTA %d key tiles (request-major order: %d; mean %.1f)\n", grid,
              busiest(tiles_listed), busiest(tiles_request_major), 64.0 * 33 / grid);
  EXPECT_EQ(busiest(tiles_listed), 17);
  EXPECT_EQ(busiest(tiles_request_major), 24);
}

}  // namespace

// The split partials' order (partial_pos / partial_dim, docs/PERF_NOTES.md S37): a permutation of the 512 dims
// that keeps every aligned 16-dim block; an accumulator thread's 4 values of a 16-dim block (dims 16 m + 2 c, + 1
// and 16 m + 8 + 2 c, + 1) are 4 consecutive positions from 16 m + 4 c (its one 16-byte store); positions 2 t,
// 2 t + 1 are adjacent dims (the combine's 4-byte output stores); and every combine slice (512 / kSlices positions
// from a multiple of that) holds exactly the same set of dims.
TEST(VerifyAttnCpu, PartialOrderIsABlockPermutation) {
  using namespace ddtree::kern::attn;
  constexpr int kDimV = DDT_ATTN_DIM_V;
  std::vector<int> hits(kDimV, 0);
  for (int d = 0; d < kDimV; ++d) {
    const int pos = partial_pos(d);
    ASSERT_GE(pos, 0);
    ASSERT_LT(pos, kDimV);
    EXPECT_EQ(pos / 16, d / 16) << "dim " << d;
    EXPECT_EQ(partial_dim(pos), d) << "dim " << d;
    ++hits[size_t(pos)];
  }
  for (int pos = 0; pos < kDimV; ++pos) EXPECT_EQ(hits[size_t(pos)], 1) << "position " << pos;
  for (int m = 0; m < kDimV / 16; ++m)
    for (int c = 0; c < 4; ++c) {
      const int dims[4] = {16 * m + 2 * c, 16 * m + 2 * c + 1, 16 * m + 8 + 2 * c, 16 * m + 8 + 2 * c + 1};
      for (int i = 0; i < 4; ++i) EXPECT_EQ(partial_pos(dims[i]), 16 * m + 4 * c + i) << "m " << m << " c " << c;
    }
  for (int t = 0; t < kDimV / 2; ++t) EXPECT_EQ(partial_dim(2 * t + 1), partial_dim(2 * t) + 1) << "pair " << t;
  for (int slices : {2, 4, 8, 16}) {
    const int len = kDimV / slices;
    for (int s = 0; s < slices; ++s)
      for (int pos = s * len; pos < (s + 1) * len; ++pos) {
        const int d = partial_dim(pos);
        EXPECT_TRUE(d >= s * len && d < (s + 1) * len) << slices << " slices, position " << pos;
      }
  }
}
