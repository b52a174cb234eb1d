// Tree-verify MLA attention on the GPU: both CUDA kernels, the oracle (ddt_verify_attn_cuda) and the
// portable flash kernel (ddt_verify_attn_portable_cuda), against the f64 CPU twin and the independent
// brute force (tests/attn/attn_util.h), to the correctness bar of reference/mla-verify-attention.md (out:
// abs 8e-4 or rel 2/128 per element, cosine difference < 5e-6; lse: abs 1e-6 or rel 8/65536); the oracle
// also within 1 bf16 ulp of the twin (except where both are below 4e-6 apart); the portable kernel rounds
// its softmax in f32 tiles and splits long requests' keys (combined in a fixed order), so it gets the bar
// only (its max ulps are printed). Also (each kernel): bad page / offset data (status bit, NaN rows of that
// request only; also a bad page inside one split of a split request), the portable workspace contract, chain node ==
// single-node decode bitwise, batch invariance (a request's rows bitwise equal alone, in another batch
// and at another position), CUDA graph capture + replay with new inputs in place (variable P and N
// inside fixed capacities, padding rows), large prefixes (P = 16k) against the brute force on sampled
// rows. Outputs are poisoned before every launch; inputs carry NaN in everything that must not be read.
// Chain node == single-node decode bitwise (rule E) for the oracle and the portable kernel at several
// split lengths.
// Every comparison prints one line (max abs / rel error, cosine difference, max ulps) so the log alone
// shows the margins. Exits 77 (ctest: skipped) when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "ddtree/kernels.h"
#include "gpu_util.h"
#include "kernels/common/verify_attn_split.h"
#include "tests/attn/attn_util.h"

using namespace ddtree::test::attn;
using ddtree::test::DevBuf;

namespace {

// A problem's inputs on the device plus output buffers.
struct DevProblem {
  DevBuf<uint16_t> q, kv, out;
  DevBuf<int32_t> pt, prefix, offsets;
  DevBuf<uint64_t> vis;
  DevBuf<float> lse;
  DevBuf<uint32_t> status;
  explicit DevProblem(const Problem& p)
      : q(p.q), kv(p.kv), out(p.out_size()), pt(p.page_table), prefix(p.prefix), offsets(p.offsets), vis(p.vis),
        lse(p.lse_size()), status(1) {}
  // Re-uploads p's inputs into the same buffers (sizes must match: graph replay).
  void upload(const Problem& p, cudaStream_t s) {
    ASSERT_EQ(p.q.size(), q.n); ASSERT_EQ(p.kv.size(), kv.n); ASSERT_EQ(p.page_table.size(), pt.n);
    ASSERT_EQ(p.vis.size(), vis.n); ASSERT_EQ(p.prefix.size(), prefix.n);
    q.upload(p.q, s); kv.upload(p.kv, s); pt.upload(p.page_table, s); prefix.upload(p.prefix, s);
    offsets.upload(p.offsets, s); vis.upload(p.vis, s);
  }
  ddt_verify_attn_params params(const Problem& p) {
    return p.params(q.ptr, kv.ptr, pt.ptr, prefix.ptr, offsets.ptr, vis.ptr, out.ptr, lse.ptr, status.ptr);
  }
  void poison_outputs(cudaStream_t s = nullptr) {
    GPU_CHECK(cudaMemsetAsync(out.ptr, 0xFF, out.n * 2, s));      // bf16 NaN pattern
    GPU_CHECK(cudaMemsetAsync(lse.ptr, 0x7F, lse.n * 4, s));      // f32 3.39e38: a finite, obviously wrong value
    GPU_CHECK(cudaMemsetAsync(status.ptr, 0, 4, s));
  }
  Result result() {
    Result r;
    r.out = out.download();
    r.lse = lse.download();
    r.status = status.download()[0];
    return r;
  }
};

// The kernels under test: entry point and the tolerance against the CPU twin.
using KernelFn = int (*)(const ddt_verify_attn_params*, void*);
struct Kernel {
  const char* name;
  KernelFn fn;
  Tol vs_twin;
  bool p_bf16 = false;  // p_precision DDT_ATTN_P_BF16: every comparison by p_bf16_tol (with the problem's Ref::mass)
};
// The rounding scale of P (Ref::mass) that k's comparisons need: p's brute force for a kernel that rounds P, else
// empty (p: a problem with valid page indices; rows a data error poisons are compared as NaN, not by value).
std::vector<double> mass_for(const Kernel& k, const Problem& p) {
  return k.p_bf16 ? brute_force(p).mass : std::vector<double>{};
}
const std::vector<double>* or_null(const std::vector<double>& mass) { return mass.empty() ? nullptr : &mass; }
const Kernel kOracle{"oracle", ddt_verify_attn_cuda, oracle_tol()};
// The portable kernel at two split lengths: 512 (the benchmarks' value) and 64 (many splits per request).
template <int kSplitKeys>
int portable(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_portable_with_workspace(p, kSplitKeys, stream);
}
const Kernel kPortable{"portable", portable<512>, Tol{}};
const Kernel kPortable64{"port-s64", portable<64>, Tol{}};
// An environment variable set to value (nullptr: unset) for the object's scope, or (one argument) left as it is and
// free to change; the caller's setting restored after (the kernels' test hooks: DDTREE_*_NARROW, DDTREE_SM90_QTMA,
// DDTREE_ATTN_COMBINE, ... are read per call).
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* name) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
  }
  ScopedEnv(const char* name, const char* value) : ScopedEnv(name) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};
// The portable kernel forced onto its narrow-8 instantiation (DDTREE_PORTABLE_NARROW=8: every request in 8-row items
// whatever the batch, where the default takes it only for decode batches), split 64: the sweep, the bad data, graph
// replay and batch invariance run on it too.
template <int kSplitKeys>
int portable_narrow8(const ddt_verify_attn_params* p, void* stream) {
  const ScopedEnv forced("DDTREE_PORTABLE_NARROW", "8");
  return portable<kSplitKeys>(p, stream);
}
const Kernel kPortableNarrow8{"port-n8", portable_narrow8<64>, Tol{}};
// The sm_90a kernel (compute capability 9.0 only) at 512, 64, 96 and 0 (never split). 96: key ranges that start
// off a 64-key boundary (split 1 starts at 96): the cp.async path whatever the page size.
template <int kSplitKeys>
int sm90(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_sm90_with_workspace(p, kSplitKeys, stream);
}
// The same with a plan made right before the call (ddt_verify_attn_sm90_plan_cuda + _planned_cuda).
template <int kSplitKeys>
int sm90_planned(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_sm90_planned_with_workspace(p, kSplitKeys, stream);
}
// A kernel entry at p_precision DDT_ATTN_P_BF16 (P as one bf16 before PV; kernels.h): p_bf16<portable<512>> etc.
template <KernelFn kFn>
constexpr KernelFn p_bf16 = ddtree::test::with_p_bf16<kFn>;
// Every kernel the GPU runs; the sm_90a ones are left out, with a printed note, off compute capability 9.0
// (and Sm90KernelOnThisGpu reports that as a skip). The bf16-P ones are compared by their own bar (p_bf16_tol).
const std::vector<Kernel>& kernels_under_test() {
  static const std::vector<Kernel> ks = [] {
    std::vector<Kernel> v = {kOracle, kPortable, kPortable64, kPortableNarrow8,
                             {"port-bf16", p_bf16<portable<512>>, p_bf16_tol(), true}};
    if (ddtree::test::gpu_is_sm90()) {
      v.push_back({"sm90", sm90<512>, Tol{}});
      v.push_back({"sm90-s64", sm90<64>, Tol{}});
      v.push_back({"sm90-s96", sm90<96>, Tol{}});
      v.push_back({"sm90-s0", sm90<0>, Tol{}});
      v.push_back({"sm90-plan", sm90_planned<512>, Tol{}});
      v.push_back({"sm90-p96", sm90_planned<96>, Tol{}});
      v.push_back({"sm90-p0", sm90_planned<0>, Tol{}});
      v.push_back({"sm90-bf16", p_bf16<sm90<512>>, p_bf16_tol(), true});
      v.push_back({"sm90-bf16-s0", p_bf16<sm90<0>>, p_bf16_tol(), true});
      v.push_back({"sm90-bf16-p96", p_bf16<sm90_planned<96>>, p_bf16_tol(), true});
    } else {
      std::printf("  (not compute capability 9.0: the sm_90a kernel is not in the kernel lists)\n");
    }
    return v;
  }();
  return ks;
}

Result run_gpu(const Problem& p, KernelFn fn = ddt_verify_attn_cuda) {
  DevProblem d(p);
  d.poison_outputs();
  auto prm = d.params(p);
  Result r;
  r.rc = fn(&prm, nullptr);
  EXPECT_EQ(r.rc, DDT_OK) << ddt_last_error_message();
  Result got = d.result();
  got.rc = r.rc;
  return got;
}

struct Case {
  const char* name;
  uint64_t seed;
  std::vector<ReqSpec> reqs;
  int heads, page_size, extra_rows = 0, extra_words = 0;
  float q_scale = 1.0f;
};

Options opts(const Case& c) {
  Options o;
  o.heads = c.heads;
  o.page_size = c.page_size;
  o.extra_rows = c.extra_rows;
  o.extra_words = c.extra_words;
  o.q_scale = c.q_scale;
  return o;
}

std::vector<Case> sweep() {
  using S = Shape;
  std::vector<Case> cases = {
      {"T1_P0", 1, {{0, 1, S::kChain}}, 1, 1},
      {"T2_P1", 2, {{1, 2, S::kChain}}, 8, 64},
      {"T7_P63_star_page7", 3, {{63, 7, S::kStar}}, 16, 7},
      {"T8_P64_deep", 4, {{64, 8, S::kDeep}}, 8, 64},
      {"T9_P65_bushy_page1", 5, {{65, 9, S::kBushy}}, 16, 1},
      {"T63_P300_random", 6, {{300, 63, S::kRandom}}, 8, 64},
      {"T64_P0_page3", 7, {{0, 64, S::kBushy}}, 16, 3},
      {"T65_P64_two_words", 8, {{64, 65, S::kBushy}}, 8, 64, 0, 1},
      {"T128_P65_deep_page1", 9, {{65, 128, S::kDeep}}, 8, 1},
      {"T128_P1_peaky", 10, {{1, 128, S::kRandom}}, 8, 64, 0, 0, 6.0f},
      {"mixed_H16", 11, {{0, 1, S::kChain}, {300, 65, S::kDeep}, {63, 9, S::kStar}, {1, 128, S::kBushy}, {64, 8, S::kChain}},
       16, 64, 5},
      {"mixed_page5_empty", 12, {{65, 64, S::kStar}, {0, 7, S::kChain}, {5, 0}, {300, 2, S::kChain}, {1, 63, S::kRandom}},
       8, 5, 3},
      {"T513_max_tree", 13, {{40, 513, S::kRandom}}, 8, 64, 0, 0, 3.0f},
      {"padding_only", 14, {{7, 0}}, 8, 64, 4},
      // Larger prefixes (the CPU twin is the reference up to P = 2k).
      {"T64_P2048_page64", 15, {{2048, 64, S::kBushy}}, 8, 64},
      {"T16_P2047_page1", 16, {{2047, 16, S::kDeep}}, 16, 1},
      {"T128_P2049_chain", 17, {{2049, 128, S::kChain}}, 8, 64},
      {"mixed_2k", 18, {{2048, 8, S::kStar}, {0, 33, S::kBushy}, {1000, 65, S::kRandom}, {2000, 1, S::kChain}, {64, 128, S::kDeep}},
       8, 64, 2},
      {"mixed_2k_page1_H16", 19, {{1500, 9, S::kRandom}, {17, 64, S::kChain}, {2048, 2, S::kStar}}, 16, 1},
      {"T32_P1000_peaky_page13", 20, {{1000, 32, S::kBushy}}, 8, 13, 0, 0, 8.0f},
      // Head counts that do not divide the portable kernel's 32-row tiles (rows of one node split across
      // tiles, tiles holding parts of several nodes), and more heads than a tile has rows.
      {"T9_P100_H3_page1", 21, {{100, 9, S::kBushy}, {33, 22, S::kDeep}}, 3, 1, 2},
      {"T40_P70_H5_page64", 22, {{70, 40, S::kRandom}, {0, 3, S::kStar}}, 5, 64, 1},
      {"T3_P129_H64_page16", 23, {{129, 3, S::kChain}, {64, 5, S::kStar}}, 64, 16},
      {"T130_P31_H24_peaky", 24, {{31, 130, S::kBushy}}, 24, 32, 0, 0, 6.0f},
  };
  return cases;
}

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class VerifyAttnGpu : public ::testing::TestWithParam<Case> {};

TEST_P(VerifyAttnGpu, KernelsMatchCpuTwinAndBruteForce) {
  const Case& c = GetParam();
  const Problem p = make_problem(c.seed, c.reqs, opts(c));
  const Result cpu = run_cpu(p);
  ASSERT_EQ(cpu.rc, DDT_OK);
  const Ref brute = brute_force(p);
  for (const Kernel& k : kernels_under_test()) {
    SCOPED_TRACE(k.name);
    const Result gpu = run_gpu(p, k.fn);
    EXPECT_EQ(gpu.status, cpu.status);
    const Report vs_twin = compare_results(gpu, cpu, c.heads, k.vs_twin, k.p_bf16 ? &brute.mass : nullptr);
    std::printf("  %-26s %-8s vs twin:  %s\n", c.name, k.name, vs_twin.str().c_str());
    EXPECT_TRUE(vs_twin.ok) << vs_twin.str();
    const Report vs_brute = compare_to_ref(gpu.out, gpu.lse, brute, c.heads, k.p_bf16 ? p_bf16_tol() : Tol{});
    std::printf("  %-26s %-8s vs brute: %s\n", c.name, k.name, vs_brute.str().c_str());
    EXPECT_TRUE(vs_brute.ok) << vs_brute.str();
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, VerifyAttnGpu, ::testing::ValuesIn(sweep()),
                         [](const auto& info) { return std::string(info.param.name); });

// Large prefixes: the brute force on sampled rows (first, last, a middle one of each request).
TEST(VerifyAttnGpu, LargePrefixAgainstBruteForceOnSampledRows) {
  struct L { int P, N, H, page; Shape shape; };
  for (const L l : {L{16384, 16, 8, 64, Shape::kBushy}, L{8191, 65, 8, 1, Shape::kDeep}, L{32768, 8, 16, 64, Shape::kChain}}) {
    Options o;
    o.heads = l.H;
    o.page_size = l.page;
    const Problem p = make_problem(uint64_t(l.P) * 7 + l.N, {{l.P, l.N, l.shape}, {l.P / 3, l.N, Shape::kStar}}, o);
    const int rows[] = {0, l.N / 2, l.N - 1, l.N, 2 * l.N - 1};
    std::vector<Ref> refs;
    for (int row : rows) refs.push_back(brute_force(p, row, row + 1));
    for (const Kernel& k : kernels_under_test()) {
      const Result gpu = run_gpu(p, k.fn);
      EXPECT_EQ(gpu.status, 0u) << k.name;
      for (size_t i = 0; i < refs.size(); ++i) {
        const int row = rows[i];
        const Ref& ref = refs[i];
        const Report rep = compare(gpu.out, gpu.lse, ref.out, ref.lse, ref.bad, l.H, k.p_bf16 ? p_bf16_tol() : Tol{},
                                   nullptr, row, row + 1, &ref.mass);
        std::printf("  %-8s P=%d N=%d H=%d page=%d row %d: %s\n", k.name, l.P, l.N, l.H, l.page, row, rep.str().c_str());
        EXPECT_TRUE(rep.ok) << k.name << " P=" << l.P << " row " << row << ": " << rep.str();
      }
    }
  }
}

// Device-data errors: same status and NaN rows as the twin, other rows still within 1 ulp of the twin.
TEST(VerifyAttnGpu, BadIndicesPoisonOnlyTheirRequest) {
  Options o;
  o.heads = 4;
  o.page_size = 16;
  o.extra_rows = 1;
  const Problem base = make_problem(41, {{40, 5, Shape::kBushy}, {100, 9, Shape::kDeep}, {0, 3, Shape::kChain}}, o);
  const std::vector<std::pair<const char*, std::function<void(Problem&)>>> muts = {
      {"page -1", [](Problem& p) { p.page_table[1 * p.max_pages + 2] = -1; }},
      {"page == num_pages", [](Problem& p) { p.page_table[1 * p.max_pages + 0] = int32_t(p.num_pages); }},
      {"prefix < 0", [](Problem& p) { p.prefix[2] = -1; }},
      {"P + N beyond the table row", [](Problem& p) { p.prefix[0] = p.max_pages * p.opt.page_size; }},
      {"offsets decreasing", [](Problem& p) { p.offsets[2] = 4; }},
      {"offsets end > total_nodes", [](Problem& p) { p.offsets[3] = p.total_nodes + 1; }},
  };
  for (const Kernel& k : kernels_under_test()) {
    const std::vector<double> mass = mass_for(k, base);
    for (const auto& [what, apply] : muts) {
      SCOPED_TRACE(std::string(k.name) + ": " + what);
      Problem p = base;
      apply(p);
      const Result gpu = run_gpu(p, k.fn), cpu = run_cpu(p);
      EXPECT_EQ(gpu.status, DDT_DATA_BAD_INDEX);
      EXPECT_EQ(cpu.status, DDT_DATA_BAD_INDEX);
      const Report rep = compare_results(gpu, cpu, o.heads, k.vs_twin, or_null(mass));
      EXPECT_TRUE(rep.ok) << rep.str();
      int nan_rows = 0;
      for (int row = 0; row < p.total_nodes; ++row) nan_rows += std::isnan(gpu.lse[size_t(row) * o.heads]);
      std::printf("  %-8s bad data '%s': status %u, %d of %d rows NaN, %s\n", k.name, what, gpu.status, nan_rows,
                  p.total_nodes, rep.str().c_str());
      EXPECT_GT(nan_rows, 0);
    }
  }
}

// NaN scores (a NaN q row, a NaN dim of q, a NaN in a visible key; attn_util.h): every kernel gives the rows
// that see one NaN (out and lse) like the CPU twin, the others to the bar; split and unsplit paths, TMA
// (page 64) and cp.async (page 1) loads.
TEST(VerifyAttnGpu, NanScoresMakeTheirRowsNaN) {
  for (int page : {1, 64}) {
    const NanScoreCase c = make_nan_score_problem(57, page);
    const Result cpu = run_cpu(c.p);
    ASSERT_EQ(cpu.rc, DDT_OK);
    for (const Kernel& k : kernels_under_test()) {
      SCOPED_TRACE(std::string(k.name) + ", page " + std::to_string(page));
      const Result gpu = run_gpu(c.p, k.fn);
      EXPECT_EQ(gpu.status, 0u);
      const Report rep = compare_results(gpu, cpu, c.p.opt.heads, k.vs_twin, or_null(mass_for(k, c.p)));
      std::printf("  NaN scores, page %-2d %-8s vs twin: %s\n", page, k.name, rep.str().c_str());
      EXPECT_TRUE(rep.ok) << rep.str();
      for (int node : c.nan_nodes)
        for (int h = 0; h < c.p.opt.heads; ++h) {
          const size_t rh = size_t(node) * c.p.opt.heads + h;
          EXPECT_TRUE(std::isnan(gpu.lse[rh])) << "node " << node << " head " << h;
          EXPECT_TRUE(std::isnan(bf16_f32(gpu.out[rh * kV]))) << "node " << node << " head " << h;
        }
    }
  }
}

// A tree wider than 64 W (N_r > 64 vis_words) is a shape error of that request only (its rows past 64 W
// included: the portable kernel gives an invalid request one unsplit item per row tile, each poisoning its
// rows). Both kernels: status bit, that request's rows NaN, the others right.
TEST(VerifyAttnGpu, TreeWiderThanVisWordsPoisonsAllItsRows) {
  Options o;
  o.heads = 8;
  o.page_size = 16;
  o.extra_rows = 2;
  const Problem base = make_problem(43, {{30, 40, Shape::kBushy}, {10, 100, Shape::kChain}, {5, 7, Shape::kDeep}}, o);
  ASSERT_EQ(base.W, 2);
  // A W = 1 view of the same data: request 1 (100 nodes) no longer fits its vis rows; 0 and 2 still do.
  Problem p = base;
  p.W = 1;
  std::vector<uint64_t> vis1(size_t(p.total_nodes));
  for (int row = 0; row < p.total_nodes; ++row) vis1[row] = base.vis[size_t(row) * base.W];
  p.vis = vis1;
  const Result cpu = run_cpu(p);
  EXPECT_EQ(cpu.status, DDT_DATA_BAD_INDEX);
  for (const Kernel& k : kernels_under_test()) {
    SCOPED_TRACE(k.name);
    const Result gpu = run_gpu(p, k.fn);
    EXPECT_EQ(gpu.status, DDT_DATA_BAD_INDEX);
    const std::vector<double> mass = mass_for(k, base);
    const Report rep = compare_results(gpu, cpu, o.heads, k.vs_twin, or_null(mass));
    std::printf("  %-8s tree wider than 64 W: %s\n", k.name, rep.str().c_str());
    EXPECT_TRUE(rep.ok) << rep.str();
    for (int row = p.offsets[1]; row < p.offsets[2]; ++row)
      EXPECT_TRUE(std::isnan(gpu.lse[size_t(row) * o.heads + 7])) << "row " << row;
  }
}

// Chain node i == decoding node i alone at prefix P + i, bitwise (FIDELITY rule E on cuda): the oracle
// visits keys by absolute slot; the portable kernel splits at absolute positions, so for one split_keys a
// chain node and the single-node decode see the same splits (the chain's masked extra keys and splits add
// exact zeros). P = 1000, N = 40: with split_keys 1024 the chain (1040 keys) is split while the decodes of
// nodes 0..23 (<= 1024 keys) are not: the split + combine path must equal the unsplit one bitwise.
Result run_gpu_with_env(const Problem& p, KernelFn fn, const char* name, const char* value);  // (below)

TEST(VerifyAttnGpu, ChainNodeEqualsSingleNodeDecodeBitwise) {
  struct K { const char* name; KernelFn fn; };
  std::vector<K> kernels = {{"oracle", ddt_verify_attn_cuda}, {"portable s0", portable<0>},
                            {"portable s64", portable<64>}, {"portable s512", portable<512>},
                            {"portable s1024", portable<1024>}, {"portable-bf16 s0", p_bf16<portable<0>>},
                            {"portable-bf16 s512", p_bf16<portable<512>>}};
  if (ddtree::test::gpu_is_sm90())
    for (K k : {K{"sm90 s0", sm90<0>}, K{"sm90 s64", sm90<64>}, K{"sm90 s512", sm90<512>}, K{"sm90 s1024", sm90<1024>},
                K{"sm90-bf16 s0", p_bf16<sm90<0>>}, K{"sm90-bf16 s512", p_bf16<sm90<512>>}})
      kernels.push_back(k);
  for (int page : {1, 64}) {
    Options o;
    o.heads = 8;
    o.page_size = page;
    const int P = 1000, N = 40;
    const Problem p = make_problem(71 + page, {{P, N, Shape::kChain}}, o);
    for (const K& k : kernels) {
      SCOPED_TRACE(std::string(k.name) + " page " + std::to_string(page));
      const Result chain = run_gpu(p, k.fn);
      int checked = 0;
      for (int i : {0, 5, 10, 15, 20, 23, 24, 25, 30, 35, 39}) {
        const Result one = run_gpu(chain_node_decode(p, i), k.fn);
        EXPECT_EQ(0, std::memcmp(one.out.data(), chain.out.data() + size_t(i) * o.heads * kV, one.out.size() * 2))
            << "node " << i;
        EXPECT_EQ(0, std::memcmp(one.lse.data(), chain.lse.data() + size_t(i) * o.heads, one.lse.size() * 4))
            << "node " << i;
        ++checked;
      }
      // Across the combine's two schedules (the same bits: CombineSchedulesEqualBitwise): the decode merged by
      // the warp schedule against the chain merged by the CTA one (the default takes the CTA one for batches
      // this small). Only split 512 / 1024 have requests of <= 8 splits here; the others rerun the same path.
      const Result chain_cta = run_gpu_with_env(p, k.fn, "DDTREE_ATTN_COMBINE", "cta");
      for (int i : {5, 24, 39}) {
        const Result one = run_gpu_with_env(chain_node_decode(p, i), k.fn, "DDTREE_ATTN_COMBINE", "warp");
        EXPECT_EQ(0, std::memcmp(one.out.data(), chain_cta.out.data() + size_t(i) * o.heads * kV, one.out.size() * 2))
            << "node " << i << ", decode by the warp schedule";
        EXPECT_EQ(0, std::memcmp(one.lse.data(), chain_cta.lse.data() + size_t(i) * o.heads, one.lse.size() * 4))
            << "node " << i << ", decode by the warp schedule";
        ++checked;
      }
      std::printf("  %-15s page %2d: chain node == single-node decode (bitwise) checked at %d nodes\n", k.name, page,
                  checked);
    }
  }
}

// The sm_90a kernel's narrow path (requests of at most 16 rows: rows as wgmma's N) gives the wide path's
// bits (FIDELITY rule E: a decode row (narrow) must equal the same row inside a chain (wide); the test above
// checks that at H 8 through the chain): the same batch run with the narrow path on and off
// (DDTREE_SM90_NARROW=probe / 0), out and lse compared bitwise (a NaN equals a NaN), at H 8 / 16 / 5, pages
// 1 (cp.async) and 64 (TMA), prefixes at page and split boundaries and long ones (several splits), peaked
// scores, NaN scores, never split / split 64 / 96 (ranges off a 64-key boundary) / 512. The probe mode sets
// DDT_DATA_PROBE_NARROW when a narrow item ran: the evidence that the comparison is not wide against wide.
// Rows (of out and lse) whose bits differ between two results (NaN == NaN, whatever the payload).
int rows_differing(const Result& a, const Result& b) {
  auto same = [](float x, float y) { return std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y)); };
  int n = 0;
  for (size_t row = 0; row < a.lse.size(); ++row) {
    bool differ = !same(a.lse[row], b.lse[row]);
    for (int d = 0; d < kV; ++d) {
      const uint16_t ua = a.out[row * kV + d], ub = b.out[row * kV + d];
      differ |= ua != ub && !(std::isnan(bf16_f32(ua)) && std::isnan(bf16_f32(ub)));
    }
    n += differ;
  }
  return n;
}

// Runs fn with the environment variable `name` set to value (nullptr: unset), restoring the caller's setting.
Result run_gpu_with_env(const Problem& p, KernelFn fn, const char* name, const char* value) {
  const ScopedEnv env(name, value);
  return run_gpu(p, fn);
}
Result run_gpu_with_qtma(const Problem& p, KernelFn fn, const char* value) {
  return run_gpu_with_env(p, fn, "DDTREE_SM90_QTMA", value);
}

// Problems with requests of at most 16 rows (the flash kernels' narrow paths) beside wider ones: H 8 / 16 / 5, page
// size 64 and 1, peaked scores, NaN scores.
struct NarrowSetup {
  const char* name;
  Problem p;
};
std::vector<NarrowSetup> narrow_setups() {
  using Setup = NarrowSetup;
  const std::vector<ReqSpec> common = {{0, 1, Shape::kChain},   {1, 1, Shape::kChain},    {63, 1, Shape::kChain},
                                       {64, 1, Shape::kChain},  {65, 1, Shape::kChain},   {511, 1, Shape::kChain},
                                       {512, 1, Shape::kChain}, {1000, 2, Shape::kChain}, {2047, 2, Shape::kStar},
                                       {5000, 1, Shape::kChain}, {300, 9, Shape::kBushy}};
  auto problem = [&](uint64_t seed, int heads, int page, const std::vector<ReqSpec>& reqs, float q_scale = 1.0f,
                     int extra_rows = 0) {
    Options o;
    o.heads = heads;
    o.page_size = page;
    o.q_scale = q_scale;
    o.extra_rows = extra_rows;
    return make_problem(seed, reqs, o);
  };
  // (H 5: 15, 15, 10 and 5 rows: both narrow widths, partly empty n-tiles)
  const std::vector<ReqSpec> h5 = {{100, 3, Shape::kChain}, {129, 3, Shape::kStar}, {4000, 2, Shape::kChain},
                                   {700, 1, Shape::kChain}};
  std::vector<Setup> setups = {{"H 8 page 64", problem(105, 8, 64, common)},
                               {"H 8 page 1", problem(106, 8, 1, common)},
                               {"H 16 page 64", problem(107, 16, 64, common)},
                               {"H 16 page 1", problem(108, 16, 1, common)},
                               {"H 5 page 64", problem(109, 5, 64, h5, 1.0f, 3)},
                               {"H 5 page 1", problem(110, 5, 1, h5)},
                               {"H 8 peaked", problem(111, 8, 64, common, 6.0f)}};
  {  // NaN scores in narrow requests: request 0's node 0, head 3, q all NaN; request 1's prefix key 5 NaN in K
    Problem p = problem(112, 8, 64, {{300, 1, Shape::kChain}, {200, 2, Shape::kChain}, {70, 1, Shape::kChain}, {600, 1, Shape::kChain}});
    uint16_t* q = p.q.data() + (size_t(p.offsets[0]) * 8 + 3) * kQK;
    std::fill(q, q + kQK, kNaN16);
    p.kv[size_t(p.page_table[size_t(1) * p.max_pages]) * 64 * kQK + 5 * kQK + 7] = kNaN16;
    setups.push_back({"H 8 NaN scores", p});
  }
  return setups;
}

// One kernel's narrow-path result (DDTREE_*_NARROW=probe) against its wide-path result (=0) and the CPU twin: the
// narrow path ran (its probe bit), gives every row the wide path's bits and meets the bar; the NaN-score setup has
// its 17 NaN rows.
void expect_narrow_equals_wide(const NarrowSetup& su, const Result& narrow, const Result& wide, const Result& cpu,
                               const char* kernel, const Tol& tol = Tol{}, const std::vector<double>* mass = nullptr) {
  EXPECT_EQ(narrow.status, cpu.status | DDT_DATA_PROBE_NARROW) << su.name << ": the narrow path did not run";
  EXPECT_EQ(wide.status, cpu.status) << su.name;
  const int rows_differ = rows_differing(narrow, wide);
  int nan_rows = 0;
  for (float l : wide.lse) nan_rows += std::isnan(l);
  Result narrow_status_masked = narrow;
  narrow_status_masked.status &= ~DDT_DATA_PROBE_NARROW;
  const Report rep = compare_results(narrow_status_masked, cpu, su.p.opt.heads, tol, mass);
  std::printf("  %s narrow vs wide %-15s: %d of %zu rows differ (%d NaN rows); narrow vs twin: %s\n", kernel, su.name,
              rows_differ, wide.lse.size(), nan_rows, rep.str().c_str());
  EXPECT_EQ(rows_differ, 0) << su.name;
  EXPECT_TRUE(rep.ok) << su.name << ": " << rep.str();
  if (std::string(su.name).find("NaN") != std::string::npos) {
    EXPECT_EQ(nan_rows, 17) << "1 + 2 x 8 NaN rows";
  }
}

TEST(VerifyAttnGpu, Sm90NarrowPathEqualsWidePathBitwise) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  using Setup = NarrowSetup;
  const std::vector<Setup> setups = narrow_setups();
  for (const Setup& su : setups) {  // (checked before the environment is changed: an ASSERT returns early)
    bool has_narrow = false;
    for (int r = 0; r < su.p.batch; ++r) has_narrow |= (su.p.offsets[r + 1] - su.p.offsets[r]) * su.p.opt.heads <= 16;
    ASSERT_TRUE(has_narrow) << su.name;
  }
  const ScopedEnv restore("DDTREE_SM90_NARROW");  // (set below per run)
  for (const Setup& su : setups) {
    const Problem& p = su.p;
    const Result cpu = run_cpu(p);
    const std::vector<double> mass = brute_force(p).mass;  // (the bf16-P runs' bar)
    for (KernelFn fn : {sm90<0>, sm90<64>, sm90<96>, sm90<512>, p_bf16<sm90<0>>, p_bf16<sm90<96>>,
                        p_bf16<sm90<512>>}) {
      const bool rounds_p = fn == p_bf16<sm90<0>> || fn == p_bf16<sm90<96>> || fn == p_bf16<sm90<512>>;
      setenv("DDTREE_SM90_NARROW", "probe", 1);
      const Result narrow = run_gpu(p, fn);
      setenv("DDTREE_SM90_NARROW", "0", 1);
      const Result wide = run_gpu(p, fn);
      // Q loaded by the math warps' cp.async (rows past a request zero) instead of the producer's TMA (the next
      // rows of q): the same bits for every row.
      const Result wide_cp = run_gpu_with_qtma(p, fn, "0");
      setenv("DDTREE_SM90_NARROW", "probe", 1);
      const Result narrow_cp = run_gpu_with_qtma(p, fn, "0");
      // The narrow path at wgmma N = 16 also for requests of <= 8 rows (N = 8 by default): the same bits.
      setenv("DDTREE_SM90_NARROW", "16", 1);
      const Result narrow16 = run_gpu(p, fn);
      EXPECT_EQ(rows_differing(narrow, narrow16), 0) << su.name << ": narrow path at N = 8 vs N = 16";
      EXPECT_EQ(narrow16.status, narrow.status & ~DDT_DATA_PROBE_NARROW) << su.name;
      setenv("DDTREE_SM90_NARROW", "probe", 1);
      EXPECT_EQ(rows_differing(narrow, narrow_cp), 0) << su.name << ": narrow path, Q by TMA vs cp.async";
      EXPECT_EQ(rows_differing(wide, wide_cp), 0) << su.name << ": wide path, Q by TMA vs cp.async";
      EXPECT_EQ(narrow_cp.status, narrow.status) << su.name;
      EXPECT_EQ(wide_cp.status, wide.status) << su.name;
      expect_narrow_equals_wide(su, narrow, wide, cpu, rounds_p ? "sm90-bf16" : "sm90",
                                rounds_p ? p_bf16_tol() : Tol{}, rounds_p ? &mass : nullptr);
    }
  }
}

// The portable kernel's narrow path (requests of at most 8 / 16 rows: the MMAs with rows as N) gives the wide path's
// bits for every row, at every split length, and runs (DDT_DATA_PROBE_NARROW with DDTREE_PORTABLE_NARROW=probe); so
// does the narrow-8 kernel (=probe8: every request on the 8-row narrow path in 8-row items, the setups' requests of 9
// to 144 rows included).
TEST(VerifyAttnGpu, PortableNarrowPathEqualsWidePathBitwise) {
  for (const NarrowSetup& su : narrow_setups()) {
    const Result cpu = run_cpu(su.p);
    const std::vector<double> mass = brute_force(su.p).mass;  // (the bf16-P runs' bar)
    for (KernelFn fn : {portable<0>, portable<64>, portable<96>, portable<512>, p_bf16<portable<0>>,
                        p_bf16<portable<512>>}) {
      const bool rounds_p = fn == p_bf16<portable<0>> || fn == p_bf16<portable<512>>;
      const Result narrow = run_gpu_with_env(su.p, fn, "DDTREE_PORTABLE_NARROW", "probe");
      const Result narrow8 = run_gpu_with_env(su.p, fn, "DDTREE_PORTABLE_NARROW", "probe8");
      const Result wide = run_gpu_with_env(su.p, fn, "DDTREE_PORTABLE_NARROW", "0");
      const char* name = rounds_p ? "portable-bf16" : "portable";
      const char* name8 = rounds_p ? "portable-bf16 narrow-8" : "portable narrow-8";
      expect_narrow_equals_wide(su, narrow, wide, cpu, name, rounds_p ? p_bf16_tol() : Tol{}, rounds_p ? &mass : nullptr);
      expect_narrow_equals_wide(su, narrow8, wide, cpu, name8, rounds_p ? p_bf16_tol() : Tol{}, rounds_p ? &mass : nullptr);
    }
  }
}

// Slices request r out of p into a batch-1 problem over the same KV cache and page numbering.
Problem single(const Problem& p, int r) {
  Problem s = p;
  const int n = p.offsets[r + 1] - p.offsets[r], H = p.opt.heads;
  s.reqs = {p.reqs[r]};
  s.batch = 1;
  s.total_nodes = n;
  s.offsets = {0, n};
  s.prefix = {p.prefix[r]};
  s.page_table.assign(p.page_table.begin() + size_t(r) * p.max_pages, p.page_table.begin() + size_t(r + 1) * p.max_pages);
  s.q.assign(p.q.begin() + size_t(p.offsets[r]) * H * kQK, p.q.begin() + size_t(p.offsets[r + 1]) * H * kQK);
  s.vis.assign(p.vis.begin() + size_t(p.offsets[r]) * p.W, p.vis.begin() + size_t(p.offsets[r + 1]) * p.W);
  s.parents = {p.parents[r]};
  return s;
}

// Reverses the order of the requests (rows, page-table rows, prefixes) over the same KV cache.
Problem reversed(const Problem& p) {
  Problem s = p;
  const int H = p.opt.heads;
  s.q.clear(); s.vis.clear(); s.page_table.clear(); s.prefix.clear(); s.reqs.clear(); s.parents.clear();
  s.offsets = {0};
  for (int r = p.batch - 1; r >= 0; --r) {
    s.q.insert(s.q.end(), p.q.begin() + size_t(p.offsets[r]) * H * kQK, p.q.begin() + size_t(p.offsets[r + 1]) * H * kQK);
    s.vis.insert(s.vis.end(), p.vis.begin() + size_t(p.offsets[r]) * p.W, p.vis.begin() + size_t(p.offsets[r + 1]) * p.W);
    s.page_table.insert(s.page_table.end(), p.page_table.begin() + size_t(r) * p.max_pages,
                        p.page_table.begin() + size_t(r + 1) * p.max_pages);
    s.prefix.push_back(p.prefix[r]);
    s.reqs.push_back(p.reqs[r]);
    s.parents.push_back(p.parents[r]);
    s.offsets.push_back(s.offsets.back() + p.offsets[r + 1] - p.offsets[r]);
  }
  s.total_nodes = s.offsets.back();
  return s;
}

// Batch invariance: every request's rows are bitwise the same alone, in the batch, and in the reversed
// batch (FIDELITY.md rule E needs batch-invariant kernels).
TEST(VerifyAttnGpu, BatchInvariance) {
  Options o;
  o.heads = 8;
  o.page_size = 64;
  const Problem p = make_problem(81, {{700, 9, Shape::kBushy}, {0, 64, Shape::kDeep}, {2000, 1, Shape::kChain},
                                      {63, 128, Shape::kStar}, {129, 17, Shape::kRandom}}, o);
  const Problem rp = reversed(p);
  const size_t HV = size_t(o.heads) * kV;
  for (const Kernel& k : kernels_under_test()) {
    SCOPED_TRACE(k.name);
    const Result all = run_gpu(p, k.fn);
    const Result rev = run_gpu(rp, k.fn);
    for (int r = 0; r < p.batch; ++r) {
      const Result one = run_gpu(single(p, r), k.fn);
      const int n = p.offsets[r + 1] - p.offsets[r];
      const int rr = p.batch - 1 - r;
      EXPECT_EQ(0, std::memcmp(one.out.data(), all.out.data() + size_t(p.offsets[r]) * HV, size_t(n) * HV * 2)) << "request " << r;
      EXPECT_EQ(0, std::memcmp(one.lse.data(), all.lse.data() + size_t(p.offsets[r]) * o.heads, size_t(n) * o.heads * 4));
      EXPECT_EQ(0, std::memcmp(one.out.data(), rev.out.data() + size_t(rp.offsets[rr]) * HV, size_t(n) * HV * 2)) << "request " << r;
      EXPECT_EQ(0, std::memcmp(one.lse.data(), rev.lse.data() + size_t(rp.offsets[rr]) * o.heads, size_t(n) * o.heads * 4));
    }
  }
}

// The replay problems: p0 (captured) and 5 more with other data in the same capacities, and the CPU twin's result
// of each of the 5 (computed once: the twin is single-threaded, and recomputing it for each of the 10 kernels under
// test took ~90 of the test's ~100 s on the GPU machine).
struct ReplaySet {
  std::vector<Problem> problems;  // [0] = the captured one
  std::vector<Result> cpu;        // cpu[i]: twin of problems[i + 1]
  std::vector<std::vector<double>> mass;  // mass[i]: Ref::mass of problems[i + 1] (for the bf16-P kernels; sm_90 only)
};
constexpr int kReplays = 5, kReplayBatch = 4, kReplayRows = 300, kReplayWords = 3, kReplayPage = 16;
constexpr int kReplayEntries = 2100 / kReplayPage + 2, kReplayPages = 4 * kReplayEntries + 3;
const ReplaySet& replay_set() {
  static const ReplaySet set = [] {
    ReplaySet s;
    std::mt19937_64 rng(91);
    auto make = [&](uint64_t seed) {
      std::vector<ReqSpec> reqs;
      int rows = 0, max_n = 1;
      int64_t pages = 0, max_need = 1;
      for (int r = 0; r < kReplayBatch; ++r) {
        ReqSpec q{int(rng() % 2000), int(1 + rng() % 70), Shape(rng() % 5)};
        reqs.push_back(q);
        rows += q.nodes;
        max_n = std::max(max_n, q.nodes);
        const int64_t need = (q.prefix + q.nodes + kReplayPage - 1) / kReplayPage;
        pages += need;
        max_need = std::max(max_need, need);
      }
      Options o;
      o.heads = 8;
      o.page_size = kReplayPage;
      o.extra_rows = kReplayRows - rows;
      o.extra_words = kReplayWords - (max_n + 63) / 64;
      o.spare_entries = int(kReplayEntries - max_need);
      o.spare_pages = int(kReplayPages - pages);
      return make_problem(seed, reqs, o);
    };
    s.problems.push_back(make(1000));
    for (int rep = 0; rep < kReplays; ++rep) {
      s.problems.push_back(make(2000 + rep));
      s.cpu.push_back(run_cpu(s.problems.back()));
      if (ddtree::test::gpu_is_sm90()) s.mass.push_back(brute_force(s.problems.back()).mass);
    }
    return s;
  }();
  return set;
}

// Capture once, replay with new inputs copied into the same buffers: batch 4, capacities fixed
// (total_nodes 300, W 3, max_pages, num_pages), P and N vary per replay (padding rows take the rest).
void graph_replay(const Kernel& k) {
  SCOPED_TRACE(k.name);
  const ReplaySet& set = replay_set();
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Problem& p0 = set.problems[0];
  DevProblem d(p0);
  auto prm = d.params(p0);  // every pointer and capacity fixed; the data changes
  d.poison_outputs(s);
  ASSERT_EQ(k.fn(&prm, s), DDT_OK);  // warm-up outside the capture
  GPU_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(k.fn(&prm, s), DDT_OK);
  GPU_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < kReplays; ++rep) {
    const Problem& p = set.problems[size_t(rep) + 1];
    ASSERT_EQ(p.total_nodes, kReplayRows);
    ASSERT_EQ(p.W, kReplayWords);
    ASSERT_EQ(p.max_pages, kReplayEntries);
    ASSERT_EQ(p.num_pages, kReplayPages);
    d.upload(p, s);
    d.poison_outputs(s);
    GPU_CHECK(cudaGraphLaunch(exec, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    const Result gpu = d.result();
    const Result& cpu = set.cpu[size_t(rep)];
    EXPECT_EQ(gpu.status, 0u);
    const Report rep_ = compare_results(gpu, cpu, 8, k.vs_twin, k.p_bf16 ? &set.mass[size_t(rep)] : nullptr);
    std::printf("  %-8s graph replay %d (rows %d of %d): %s\n", k.name, rep, p.offsets[kReplayBatch], kReplayRows, rep_.str().c_str());
    EXPECT_TRUE(rep_.ok) << "replay " << rep << ": " << rep_.str();
  }
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  GPU_CHECK(cudaStreamDestroy(s));
}

TEST(VerifyAttnGpu, GraphCaptureReplayWithNewInputs) {
  for (const Kernel& k : kernels_under_test()) graph_replay(k);
}

// A long request with few rows splits its keys (the portable kernel): a bad page inside ONE split must
// still poison every row of the request (the combine sees that split's NaN mark), the other request stays
// right, and the oracle agrees. Pages in the first, a middle and the last split.
TEST(VerifyAttnGpu, BadPageInOneSplitPoisonsTheWholeRequest) {
  Options o;
  o.heads = 8;
  o.page_size = 16;
  const Problem base = make_problem(47, {{4000, 3, Shape::kChain}, {50, 6, Shape::kBushy}}, o);
  for (int entry : {0, 120, int(base.pages_needed(0)) - 1}) {
    Problem p = base;
    p.page_table[size_t(entry)] = -7;
    const Result cpu = run_cpu(p);
    ASSERT_EQ(cpu.status, DDT_DATA_BAD_INDEX);
    for (const Kernel& k : kernels_under_test()) {
      SCOPED_TRACE(std::string(k.name) + " page entry " + std::to_string(entry));
      const Result gpu = run_gpu(p, k.fn);
      EXPECT_EQ(gpu.status, DDT_DATA_BAD_INDEX);
      const Report rep = compare_results(gpu, cpu, o.heads, k.vs_twin, or_null(mass_for(k, base)));
      std::printf("  %-8s bad page entry %d of a split request: %s\n", k.name, entry, rep.str().c_str());
      EXPECT_TRUE(rep.ok) << rep.str();
      for (int row = 0; row < 3; ++row)
        for (int h = 0; h < o.heads; ++h) EXPECT_TRUE(std::isnan(gpu.lse[size_t(row) * o.heads + h])) << row;
    }
  }
}

// The sm_90a kernel's persistent loop over many items per CTA (more than one round of 16 items on a 132-SM
// GPU): 300 requests whose items take the narrow and the wide path in turn, three of them with a bad page, at
// split 64 (~2,500 items) and 512. Against the CPU twin, and Q by the producer's TMA == Q by the math warps'
// cp.async bitwise: the item handover ring and the Q region's reuse over long mixed sequences.
// Its problem (also Sm90StagedPartialsEqualUnstagedBitwise's): H 8, page size 64.
Problem mixed_paths_problem() {
  std::vector<ReqSpec> reqs;
  const int kNodes[] = {1, 2, 3, 9, 1, 5};  // 8 / 16 rows: narrow; 24 / 72 / 40 rows: wide (72: two row tiles)
  for (int i = 0; i < 300; ++i)
    reqs.push_back({100 + (i * 7919) % 600, kNodes[i % 6], i % 3 == 0 ? Shape::kChain : Shape::kBushy});
  Problem p = make_problem(61, reqs, Options{});
  for (int r : {7, 100, 233}) p.page_table[size_t(r) * p.max_pages + 1] = -3;  // (every request needs >= 2 pages)
  return p;
}
TEST(VerifyAttnGpu, Sm90ManyItemsPerCtaMixedPaths) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  const Options o;
  const Problem p = mixed_paths_problem();
  const Result cpu = run_cpu(p);
  ASSERT_EQ(cpu.status, DDT_DATA_BAD_INDEX);
  for (KernelFn fn : {sm90<64>, sm90<512>}) {
    const Result tma = run_gpu_with_qtma(p, fn, nullptr), cp = run_gpu_with_qtma(p, fn, "0");
    const Report rep = compare_results(tma, cpu, o.heads, Tol{});
    const int differ = rows_differing(tma, cp);
    std::printf("  sm90 split %d, %d requests: vs twin %s; Q by TMA vs cp.async: %d rows differ\n",
                fn == sm90<64> ? 64 : 512, p.batch, rep.str().c_str(), differ);
    EXPECT_TRUE(rep.ok) << rep.str();
    EXPECT_EQ(tma.status, DDT_DATA_BAD_INDEX);
    EXPECT_EQ(cp.status, DDT_DATA_BAD_INDEX);
    EXPECT_EQ(differ, 0);
  }
}

// The combine's schedules of one summation order (a CTA per row, or per half, quarter, eighth or sixteenth of a
// row's dims, which the launcher picks for few rows; a warp per row for requests of at most 8 splits, which it
// picks only when the batch has rows enough) give the same bits: the same batch with DDTREE_ATTN_COMBINE=cta,
// =half, =quarter, =eighth, =sixteenth and =probe (the warp schedule, and DDT_DATA_PROBE_COMBINE in the status word as the evidence that it ran),
// out and lse compared bitwise, both flash kernels at split 64 (requests of 1 .. 12 splits: both sides of 8, and
// one of 275) and 512, H 8 and 16, a bad page, and the NaN-score problem (split 64: it has at most 305 keys);
// each against the twin.
TEST(VerifyAttnGpu, CombineSchedulesEqualBitwise) {
  struct Case { const char* name; Problem p; bool splits_at_512; };
  std::vector<Case> cases;
  for (int heads : {8, 16}) {
    Options o;
    o.heads = heads;
    o.page_size = 64;
    o.q_scale = heads == 16 ? 4.0f : 1.0f;  // (H 16: peaked scores)
    std::vector<ReqSpec> reqs;
    const int kNodes[] = {1, 3, 9, 2, 17};
    for (int i = 0; i < 40; ++i)
      reqs.push_back({40 + (i * 173) % 720, kNodes[i % 5], i % 2 ? Shape::kChain : Shape::kBushy});  // S 1 .. 12 at 64
    // A long decode: 275 splits at 64 (34 at 512), so each warp's chain of the sliced schedules runs more than
    // one group of 32 splits and several batches of loads.
    reqs.push_back({17550, 1, Shape::kChain});
    Problem p = make_problem(71 + heads, reqs, o);
    p.page_table[size_t(3) * p.max_pages + 1] = -3;  // request 3 (561 keys: split at 64 and 512): a bad page
    cases.push_back({heads == 8 ? "H 8, bad page" : "H 16 peaked, bad page", p, true});
  }
  cases.push_back({"NaN scores", make_nan_score_problem(57, 64).p, false});  // (at most 305 keys)
  std::vector<Kernel> ks = {kPortable, kPortable64};
  if (ddtree::test::gpu_is_sm90()) {
    ks.push_back({"sm90", sm90<512>, Tol{}});
    ks.push_back({"sm90-s64", sm90<64>, Tol{}});
  }
  for (const Case& c : cases) {
    const Result cpu = run_cpu(c.p);
    ASSERT_EQ(cpu.rc, DDT_OK);
    for (const Kernel& k : ks) {
      if (!c.splits_at_512 && (k.fn == portable<512> || k.fn == sm90<512>)) continue;  // nothing to combine
      SCOPED_TRACE(std::string(c.name) + ", " + k.name);
      const Result cta = run_gpu_with_env(c.p, k.fn, "DDTREE_ATTN_COMBINE", "cta");
      const Result warp = run_gpu_with_env(c.p, k.fn, "DDTREE_ATTN_COMBINE", "probe");
      EXPECT_EQ(cta.status, cpu.status);
      EXPECT_EQ(warp.status, cpu.status | DDT_DATA_PROBE_COMBINE) << "the warp schedule did not run";
      const Report rep = compare_results(cta, cpu, c.p.opt.heads, k.vs_twin);
      const int differ = rows_differing(cta, warp);
      std::printf("  %-22s %-8s CTA schedule vs twin: %s; rows differing from it: warp %d", c.name, k.name,
                  rep.str().c_str(), differ);
      EXPECT_TRUE(rep.ok) << rep.str();
      EXPECT_EQ(differ, 0);
      for (const char* sliced : {"half", "quarter", "eighth", "sixteenth"}) {
        const Result r = run_gpu_with_env(c.p, k.fn, "DDTREE_ATTN_COMBINE", sliced);
        const int differ_sliced = rows_differing(cta, r);
        std::printf(", %s %d", sliced, differ_sliced);
        EXPECT_EQ(r.status, cpu.status) << sliced;
        EXPECT_EQ(differ_sliced, 0) << sliced;
      }
      std::printf("\n");
    }
  }
}

// The workspace contract: its size depends only on capacities; a missing, misaligned or short workspace
// is refused before launching; a split problem run twice through the same (dirty) workspace gives bitwise
// the same result.
TEST(VerifyAttnGpu, PortableWorkspaceContract) {
  Options o;
  o.heads = 8;
  o.page_size = 64;
  const Problem p = make_problem(49, {{6000, 2, Shape::kChain}, {30, 5, Shape::kStar}}, o);
  DevProblem d(p);
  auto prm = d.params(p);
  size_t need = 0;
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&prm, 512, &need), DDT_OK);
  ASSERT_GT(need, 0u) << "this problem must be able to split";
  auto moved = prm;
  moved.prefix_lens = nullptr;  // data pointers do not matter to the size
  size_t need2 = 0;
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&moved, 512, &need2), DDT_OK);
  EXPECT_EQ(need, need2);
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&prm, 512, nullptr), DDT_ERR_NULL);
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&prm, 100, &need2), DDT_ERR_SHAPE);  // not a multiple of 32
  EXPECT_EQ(ddt_verify_attn_portable_workspace(&prm, -32, &need2), DDT_ERR_SHAPE);
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&prm, 0, &need2), DDT_OK);
  EXPECT_EQ(need2, 0u);  // never split: no workspace
  DevBuf<char> ws(need + 64);
  EXPECT_EQ(ddt_verify_attn_portable_cuda(&prm, 512, nullptr, need, nullptr), DDT_ERR_NULL);
  EXPECT_EQ(ddt_verify_attn_portable_cuda(&prm, 512, ws.ptr + 8, need, nullptr), DDT_ERR_ALIGN);
  EXPECT_EQ(ddt_verify_attn_portable_cuda(&prm, 512, ws.ptr, need - 1, nullptr), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_portable_cuda(&prm, 48, ws.ptr, need, nullptr), DDT_ERR_SHAPE);
  GPU_CHECK(cudaMemset(ws.ptr, 0x00, need));
  d.poison_outputs();
  ASSERT_EQ(ddt_verify_attn_portable_cuda(&prm, 512, ws.ptr, need, nullptr), DDT_OK) << ddt_last_error_message();
  const Result first = d.result();
  GPU_CHECK(cudaMemset(ws.ptr, 0xFF, need));  // NaN everywhere
  d.poison_outputs();
  ASSERT_EQ(ddt_verify_attn_portable_cuda(&prm, 512, ws.ptr, need, nullptr), DDT_OK);
  const Result second = d.result();
  EXPECT_EQ(0, std::memcmp(first.out.data(), second.out.data(), first.out.size() * 2));
  EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * 4));
  const Report rep = compare_to_ref(first.out, first.lse, brute_force(p), o.heads, Tol{});
  std::printf("  portable workspace contract (P 6000, split): %s\n", rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
}

// The sm_90a kernel: in every kernel list above on a compute capability 9.0 GPU; elsewhere it must refuse
// with DDT_ERR_ARCH (and this test reports the skip).
// The planned call is the unplanned one, bitwise (out, lse, status), on every sweep case, at every split length
// of the kernel lists, with bad pages and malformed node_offsets too (the plan carries their verdicts).
TEST(VerifyAttnGpu, Sm90PlannedEqualsUnplannedBitwise) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  std::vector<Problem> problems;
  for (const Case& c : sweep()) problems.push_back(make_problem(c.seed, c.reqs, opts(c)));
  {
    Problem bad_page = make_problem(31, {{1000, 9, Shape::kBushy}, {700, 3, Shape::kChain}});
    bad_page.page_table[bad_page.max_pages + 5] = int32_t(bad_page.num_pages);  // request 1, its page 5
    problems.push_back(bad_page);
    Problem bad_offsets = make_problem(32, {{100, 9, Shape::kBushy}, {70, 3, Shape::kChain}});
    bad_offsets.offsets[1] = bad_offsets.offsets[2] + 1;  // not monotone
    problems.push_back(bad_offsets);
  }
  const std::pair<KernelFn, KernelFn> pairs[] = {{sm90<512>, sm90_planned<512>}, {sm90<64>, sm90_planned<64>},
                                                 {sm90<96>, sm90_planned<96>}, {sm90<0>, sm90_planned<0>}};
  const int splits[] = {512, 64, 96, 0};
  for (size_t i = 0; i < problems.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      SCOPED_TRACE("problem " + std::to_string(i) + ", split_keys " + std::to_string(splits[k]));
      const Result a = run_gpu(problems[i], pairs[k].first), b = run_gpu(problems[i], pairs[k].second);
      EXPECT_EQ(a.status, b.status);
      EXPECT_EQ(rows_differing(a, b), 0);
    }
  }
  std::printf("  planned == unplanned bitwise: %zu problems x 4 split lengths\n", problems.size());
}

// S65's staged partials (planned calls only: rows 0-31 of a split item whose last tile sits in KV stage 1 and that
// another item of the CTA follows leave through that stage and the producer's bulk copies) against the unplanned
// calls, which never stage: out, lse and status bitwise, both precisions. Many items per CTA (items b go to CTA b %
// grid, grid = the SMs): (a) exactly 16 per CTA, so every CTA's last item sits at its round's last slot, where
// has_next is assumed and the producer copies the last staged rows out at its exit; (b) 16 or 17 per CTA, across a
// round boundary; (c) the mixed problem of Sm90ManyItemsPerCtaMixedPaths (narrow, wide, bad pages) at split 512
// and 64 (one tile per split: nothing stages). Requests of 9-16 nodes (2 row tiles at H 8; the second has 8-64
// rows, fewer than 32 for 9-11 nodes) and 1,601-1,990 keys (4 splits of 512: three of 8 tiles, the last of 2-8).
TEST(VerifyAttnGpu, Sm90StagedPartialsEqualUnstagedBitwise) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  auto staged_problem = [&](uint64_t seed, int extra_requests) {
    std::vector<ReqSpec> reqs;
    const int n = 2 * sms + extra_requests;  // 8 items per request (4 splits x 2 row tiles): 16 per CTA, + extras
    for (int i = 0; i < n; ++i)
      reqs.push_back({1592 + (i * 7919) % 383, 9 + i % 8, i % 3 == 0 ? Shape::kChain : Shape::kBushy});
    return make_problem(seed, reqs);
  };
  std::vector<std::pair<std::string, Problem>> problems;
  problems.emplace_back("16 items per CTA", staged_problem(71, 0));
  problems.emplace_back("16-17 items per CTA", staged_problem(72, 3));
  problems.emplace_back("mixed paths, bad pages", mixed_paths_problem());
  const std::pair<KernelFn, KernelFn> pairs[] = {{sm90<512>, sm90_planned<512>},
                                                 {p_bf16<sm90<512>>, p_bf16<sm90_planned<512>>},
                                                 {sm90<64>, sm90_planned<64>}};
  const char* names[] = {"split 512", "split 512, bf16 P", "split 64"};
  for (const auto& [what, prob] : problems) {
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(what + ", " + names[k]);
      const Result unstaged = run_gpu(prob, pairs[k].first), staged = run_gpu(prob, pairs[k].second);
      const int differ = rows_differing(unstaged, staged);
      std::printf("  %s, %d requests, %s: %d rows differ, status %u / %u\n", what.c_str(), prob.batch, names[k], differ,
                  unstaged.status, staged.status);
      EXPECT_EQ(unstaged.status, staged.status);
      EXPECT_EQ(differ, 0);
    }
  }
  // (the unplanned side is checked against the CPU twin by the sweep and Sm90ManyItemsPerCtaMixedPaths)
}

// The plan kernel against its CPU twin (ddt_verify_attn_sm90_plan_cpu): the header and every listed item, byte for
// byte, on every sweep case, a bad page and malformed node_offsets, at four split lengths.
TEST(VerifyAttnGpu, Sm90PlanKernelEqualsCpuTwin) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  using ddtree::kern::attn::PlanHeader;
  using ddtree::kern::attn::PlanItem;
  std::vector<Problem> problems;
  for (const Case& c : sweep()) problems.push_back(make_problem(c.seed, c.reqs, opts(c)));
  Problem bad_page = make_problem(31, {{1000, 9, Shape::kBushy}, {700, 3, Shape::kChain}});
  bad_page.page_table[bad_page.max_pages + 5] = int32_t(bad_page.num_pages);
  problems.push_back(bad_page);
  Problem bad_offsets = make_problem(32, {{100, 9, Shape::kBushy}, {70, 3, Shape::kChain}});
  bad_offsets.offsets[1] = bad_offsets.offsets[2] + 1;
  problems.push_back(bad_offsets);
  // 300 requests (several per scan chunk) of 8 to 160 rows: the two phases of the scan order (a last split of
  // <= 128 rows listed after every other item) with requests on both sides of the bound.
  std::vector<ReqSpec> many;
  const int kNodes[] = {1, 17, 3, 16, 20, 2};  // x 8 heads: 8, 136, 24, 128, 160, 16 rows
  for (int i = 0; i < 300; ++i)
    many.push_back({100 + (i * 7919) % 600, kNodes[i % 6], i % 3 ? Shape::kBushy : Shape::kChain});
  problems.push_back(make_problem(33, many));
  int compared = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const Problem& pb = problems[i];
    DevProblem d(pb);
    const auto dev = d.params(pb);
    std::vector<uint16_t> out(pb.out_size());
    std::vector<float> lse(pb.lse_size());
    uint32_t status = 0;
    const auto host = pb.host_params(out.data(), lse.data(), &status);
    for (int split : {512, 64, 96, 0}) {
      SCOPED_TRACE("problem " + std::to_string(i) + ", split_keys " + std::to_string(split));
      size_t bytes = 0;
      ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&dev, split, &bytes), DDT_OK);
      ddtree::test::DevBuf<unsigned char> plan(bytes);
      GPU_CHECK(cudaMemset(plan.ptr, 0xFF, bytes));
      ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(&dev, split, plan.ptr, bytes, nullptr), DDT_OK);
      const std::vector<unsigned char> got = plan.download();
      std::vector<PlanItem> want_buf(bytes / sizeof(PlanItem) + 2);
      ASSERT_EQ(ddt_verify_attn_sm90_plan_cpu(&host, split, want_buf.data(), bytes), DDT_OK);
      const auto* want = reinterpret_cast<const unsigned char*>(want_buf.data());
      const auto& h = *reinterpret_cast<const PlanHeader*>(want);
      ASSERT_EQ(std::memcmp(got.data(), want, sizeof(PlanHeader)), 0) << "header";
      ASSERT_LE(sizeof(PlanHeader) + size_t(h.items) * sizeof(PlanItem), bytes);
      for (int b = 0; b < h.items; ++b)
        ASSERT_EQ(std::memcmp(got.data() + sizeof(PlanHeader) + b * sizeof(PlanItem),
                              want + sizeof(PlanHeader) + b * sizeof(PlanItem), sizeof(PlanItem)), 0)
            << "item " << b;
      ++compared;
    }
  }
  std::printf("  plan kernel == CPU twin byte for byte: %d plans\n", compared);
}

// A plan made for other scalars (here: other heads, another batch), or never written, is refused on the device:
// every row NaN, DDT_DATA_BAD_PLAN, no fault; the same plan with the right scalars works afterwards.
TEST(VerifyAttnGpu, Sm90PlanForOtherParamsPoisonsEveryRow) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  const Problem p = make_problem(33, {{900, 9, Shape::kBushy}, {40, 2, Shape::kChain}});
  DevProblem d(p);
  auto prm = d.params(p);
  size_t plan_bytes = 0, ws_bytes = 0;
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&prm, 512, &ws_bytes), DDT_OK);
  auto other = prm;
  other.heads = prm.heads / 2;  // (a plan for fewer heads fits the same buffer)
  size_t need512 = 0;
  ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&prm, 512, &need512), DDT_OK);
  ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&prm, 64, &plan_bytes), DDT_OK);  // (the larger: more items)
  ASSERT_GE(plan_bytes, need512);
  ddtree::test::DevBuf<unsigned char> plan(plan_bytes), ws(ws_bytes + 16);
  auto all_nan = [&](const Result& r) {
    size_t n = 0;
    for (float l : r.lse) n += std::isnan(l);
    for (uint16_t o : r.out) n += std::isnan(bf16_f32(o));
    return n == r.lse.size() + r.out.size();
  };
  // A plan made for `made_for` at `made_split` (null: never written, an all-zero header), then the call for prm at
  // split 512: refused on the device.
  auto expect_refused = [&](const ddt_verify_attn_params* made_for, int made_split, const char* what) {
    SCOPED_TRACE(what);
    if (made_for) ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(made_for, made_split, plan.ptr, plan_bytes, nullptr), DDT_OK);
    else GPU_CHECK(cudaMemset(plan.ptr, 0, plan_bytes));
    d.poison_outputs();
    ASSERT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 512, plan.ptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_OK);
    const Result r = d.result();
    EXPECT_EQ(r.status, DDT_DATA_BAD_PLAN);
    EXPECT_TRUE(all_nan(r));
  };
  expect_refused(nullptr, 512, "never written");
  expect_refused(&other, 512, "other heads");
  auto other_batch = prm;
  other_batch.batch = 1;
  expect_refused(&other_batch, 512, "another batch");
  expect_refused(&prm, 64, "another split length");
  // The right plan: the unplanned call's result.
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, 512, plan.ptr, plan_bytes, nullptr), DDT_OK);
  d.poison_outputs();
  ASSERT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 512, plan.ptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_OK);
  const Result r = d.result();
  const Result u = run_gpu(p, sm90<512>);
  EXPECT_EQ(r.status, 0u);
  EXPECT_EQ(rows_differing(r, u), 0);
  // Host-visible plan errors.
  EXPECT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 512, nullptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_ERR_NULL);
  EXPECT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 512, plan.ptr + 8, plan_bytes - 8, ws.ptr, ws_bytes, nullptr),
            DDT_ERR_ALIGN);
  EXPECT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 512, plan.ptr, need512 - 1, ws.ptr, ws_bytes, nullptr),
            DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, 512, plan.ptr, need512 - 32, nullptr), DDT_ERR_SHAPE);
  EXPECT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, 48, plan.ptr, plan_bytes, nullptr), DDT_ERR_SHAPE);
  GPU_CHECK(cudaDeviceSynchronize());
}

// One plan, several layers: q, kv_cache, vis and softmax_scale change between the calls (a step's layers),
// node_offsets, prefix_lens and page_table do not. Each planned call equals the unplanned call on the same
// inputs, bitwise; the plan buffer starts 0xFF-filled, so it holds only what this plan kernel wrote.
TEST(VerifyAttnGpu, Sm90PlanReusedAcrossLayers) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  const std::vector<ReqSpec> reqs = {{1500, 9, Shape::kBushy}, {40, 1, Shape::kChain}, {3000, 70, Shape::kRandom}};
  for (int split : {512, 96}) {
    SCOPED_TRACE("split_keys " + std::to_string(split));
    Options o;
    o.heads = 8;
    o.page_size = split == 96 ? 16 : 64;  // (96: the cp.async path)
    o.poison = false;  // (each layer's cache is laid out for its own page table; without NaN slots the rows stay finite)
    const Problem p0 = make_problem(41, reqs, o);
    DevProblem d(p0);
    auto prm = d.params(p0);
    size_t plan_bytes = 0, ws_bytes = 0;
    ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&prm, split, &plan_bytes), DDT_OK);
    ASSERT_EQ(ddt_verify_attn_portable_workspace(&prm, split, &ws_bytes), DDT_OK);
    ddtree::test::DevBuf<unsigned char> plan(plan_bytes), ws(ws_bytes + 16);
    GPU_CHECK(cudaMemset(plan.ptr, 0xFF, plan_bytes));
    ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, split, plan.ptr, plan_bytes, nullptr), DDT_OK);
    for (int layer = 0; layer < 3; ++layer) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      Problem pl = make_problem(100 + layer, reqs, o);  // other q, kv and trees; same sizes
      pl.page_table = p0.page_table;
      pl.prefix = p0.prefix;
      pl.offsets = p0.offsets;
      d.q.upload(pl.q);
      d.kv.upload(pl.kv);
      d.vis.upload(pl.vis);
      auto lp = prm;
      lp.softmax_scale = prm.softmax_scale * (1.0f + 0.25f * layer);
      d.poison_outputs();
      ASSERT_EQ(ddtree::test::verify_attn_sm90_with_workspace(&lp, split, nullptr), DDT_OK);
      const Result u = d.result();
      d.poison_outputs();
      ASSERT_EQ(ddt_verify_attn_sm90_planned_cuda(&lp, split, plan.ptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_OK);
      const Result r = d.result();
      EXPECT_EQ(u.status, 0u);
      EXPECT_EQ(r.status, u.status);
      EXPECT_EQ(rows_differing(r, u), 0);
      size_t nan = 0;
      for (float l : r.lse) nan += std::isnan(l);
      EXPECT_EQ(nan, 0u);
    }
  }
}

// A stale plan (the same scalars, other node_offsets / page_table contents than when it was made) gives undefined
// results but no fault: a page entry far out of the cache after planning (cp.async path, page size 32, split 96)
// and node_offsets changed to other well-formed values. The call must return and the device stay healthy.
TEST(VerifyAttnGpu, Sm90StalePlanNeverFaults) {
  if (!ddtree::test::gpu_is_sm90()) GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  Options o;
  o.heads = 8;
  o.page_size = 32;
  Problem p = make_problem(43, {{700, 4, Shape::kChain}, {300, 4, Shape::kBushy}}, o);
  DevProblem d(p);
  auto prm = d.params(p);
  size_t plan_bytes = 0;
  ASSERT_EQ(ddt_verify_attn_sm90_plan_bytes(&prm, 96, &plan_bytes), DDT_OK);
  ddtree::test::DevBuf<unsigned char> plan(plan_bytes);
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, 96, plan.ptr, plan_bytes, nullptr), DDT_OK);
  for (int32_t& e : p.page_table) e = e >= 0 && e < p.num_pages ? int32_t(1 << 24) : e;  // every used entry
  p.offsets[1] = p.offsets[2] - 1;  // well formed, other rows per request
  d.pt.upload(p.page_table);
  d.offsets.upload(p.offsets);
  d.poison_outputs();
  size_t ws_bytes = 0;
  ASSERT_EQ(ddt_verify_attn_portable_workspace(&prm, 96, &ws_bytes), DDT_OK);
  ddtree::test::DevBuf<unsigned char> ws(ws_bytes + 16);
  ASSERT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 96, plan.ptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_OK);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // The device still works: a fresh plan over the changed inputs gives the unplanned result.
  ASSERT_EQ(ddt_verify_attn_sm90_plan_cuda(&prm, 96, plan.ptr, plan_bytes, nullptr), DDT_OK);
  d.poison_outputs();
  ASSERT_EQ(ddt_verify_attn_sm90_planned_cuda(&prm, 96, plan.ptr, plan_bytes, ws.ptr, ws_bytes, nullptr), DDT_OK);
  const Result r = d.result();
  d.poison_outputs();
  ASSERT_EQ(ddtree::test::verify_attn_sm90_with_workspace(&prm, 96, nullptr), DDT_OK);
  const Result u = d.result();
  EXPECT_EQ(r.status, u.status);
  EXPECT_NE(u.status & DDT_DATA_BAD_INDEX, 0u);  // the out-of-range pages are seen by both
  EXPECT_EQ(rows_differing(r, u), 0);
}

TEST(VerifyAttnGpu, Sm90KernelOnThisGpu) {
  const Problem p = make_problem(6, {{70, 9, Shape::kBushy}});
  DevProblem d(p);
  auto prm = d.params(p);
  const int rc = ddtree::test::verify_attn_sm90_with_workspace(&prm, 512, nullptr);
  if (!ddtree::test::gpu_is_sm90()) {
    EXPECT_EQ(rc, DDT_ERR_ARCH) << ddt_last_error_message();
    GTEST_SKIP() << "not a compute capability 9.0 GPU: the sm_90a kernel is not run";
  }
  EXPECT_EQ(rc, DDT_OK) << ddt_last_error_message();
  EXPECT_EQ(ddtree::test::verify_attn_sm90_with_workspace(&prm, 48, nullptr), DDT_ERR_SHAPE);  // not a multiple of 32
  GPU_CHECK(cudaDeviceSynchronize());
}

// p_precision DDT_ATTN_P_BF16 (kernels.h): the flash kernels round P to one bf16 and run one PV product. Shown on
// peaked problems (unsplit and split, TMA and cp.async pages, H 8 / 24, a 513-node tree, a batch with decode rows:
// the narrow paths) at split 512 and 0, the sm_90a kernel planned and not: the result differs from the default's (the
// mode took effect), meets its own bar (p_bf16_tol) against the brute force and, where the emulation predicts it
// (bench/dev/attn_p_precision.cpp: the peaked cases), misses the default bar (so the bar's extra term is what
// admits it); lse is bitwise the default's (the row sums add the unrounded f32 weights in both modes). The oracle
// computes at the default precision for either value: bitwise its default results.
TEST(VerifyAttnGpu, PBf16RoundsPInTheFlashKernelsAndMeetsItsBar) {
  struct C { const char* name; uint64_t seed; std::vector<ReqSpec> reqs; int heads, page; float q_scale; bool misses_bar; };
  const std::vector<C> cases = {
      {"T128_P1_peaky", 10, {{1, 128, Shape::kRandom}}, 8, 64, 6.0f, true},
      {"T130_P31_H24_peaky_page32", 24, {{31, 130, Shape::kBushy}}, 24, 32, 6.0f, true},
      {"T513_max_tree_q3", 13, {{40, 513, Shape::kRandom}}, 8, 64, 3.0f, true},
      {"mixed_decode_P1500_q4", 33, {{1500, 1, Shape::kChain}, {700, 9, Shape::kBushy}, {2000, 2, Shape::kChain}, {300, 64, Shape::kDeep}},
       8, 64, 4.0f, false},
  };
  for (const C& c : cases) {
    Options o;
    o.heads = c.heads;
    o.page_size = c.page;
    o.q_scale = c.q_scale;
    const Problem p = make_problem(c.seed, c.reqs, o);
    const Ref brute = brute_force(p);
    {
      Problem pb = p;
      pb.opt.p_precision = DDT_ATTN_P_BF16;
      EXPECT_EQ(rows_differing(run_gpu(p, ddt_verify_attn_cuda), run_gpu(pb, ddt_verify_attn_cuda)), 0)
          << c.name << " oracle: p_precision changed bits";
    }
    struct Pair { const char* name; KernelFn hilo, bf16; };
    std::vector<Pair> pairs = {{"portable s512", portable<512>, p_bf16<portable<512>>},
                               {"portable s0", portable<0>, p_bf16<portable<0>>}};
    if (ddtree::test::gpu_is_sm90())
      for (const Pair& k : {Pair{"sm90 s512", sm90<512>, p_bf16<sm90<512>>}, Pair{"sm90 s0", sm90<0>, p_bf16<sm90<0>>},
                            Pair{"sm90-plan s96", sm90_planned<96>, p_bf16<sm90_planned<96>>}})
        pairs.push_back(k);
    for (const Pair& k : pairs) {
      SCOPED_TRACE(std::string(c.name) + ", " + k.name);
      const Result hilo = run_gpu(p, k.hilo), bf16 = run_gpu(p, k.bf16);
      EXPECT_EQ(bf16.status, 0u);
      const int differ = rows_differing(hilo, bf16);
      const Report own = compare_to_ref(bf16.out, bf16.lse, brute, c.heads, p_bf16_tol());
      const Report dflt = compare_to_ref(bf16.out, bf16.lse, brute, c.heads, Tol{});
      const Report hilo_bar = compare_to_ref(hilo.out, hilo.lse, brute, c.heads, Tol{});
      std::printf("  %-26s %-13s bf16 P: %d of %zu rows differ from hi + lo; own bar: %s; elements outside the "
                  "default bar: %lld (hi + lo: %lld)\n", c.name, k.name, differ, hilo.lse.size(), own.str().c_str(),
                  (long long)dflt.bad_elems, (long long)hilo_bar.bad_elems);
      EXPECT_GT(differ, 0) << "p_precision DDT_ATTN_P_BF16 had no effect";
      EXPECT_TRUE(own.ok) << own.str();
      EXPECT_TRUE(hilo_bar.ok) << hilo_bar.str();
      if (c.misses_bar) {
        EXPECT_GT(dflt.bad_elems, 0) << "expected to miss the default bar (emulation)";
      }
      EXPECT_EQ(0, std::memcmp(hilo.lse.data(), bf16.lse.data(), hilo.lse.size() * 4)) << "lse changed";
    }
  }
}

TEST(VerifyAttnGpu, HostVisibleErrorsReturnCodesWithoutLaunching) {
  const Problem p = make_problem(5, {{3, 2, Shape::kChain}});
  DevProblem d(p);
  auto good = d.params(p);
  for (const Kernel& k : kernels_under_test()) {
    SCOPED_TRACE(k.name);
    auto bad = good;
    bad.heads = 0;
    EXPECT_EQ(k.fn(&bad, nullptr), DDT_ERR_SHAPE);
    bad = good;
    bad.kv_cache = good.kv_cache + 1;
    EXPECT_EQ(k.fn(&bad, nullptr), DDT_ERR_ALIGN);
    bad = good;
    bad.softmax_scale = std::nanf("");
    EXPECT_EQ(k.fn(&bad, nullptr), DDT_ERR_VALUE);
    bad = good;
    bad.status = nullptr;
    EXPECT_EQ(k.fn(&bad, nullptr), DDT_ERR_NULL);
    if (!k.p_bf16) {  // (the bf16-P wrappers set the field themselves)
      bad = good;
      bad.p_precision = 2;
      EXPECT_EQ(k.fn(&bad, nullptr), DDT_ERR_VALUE);
    }
    bad = good;
    bad.total_nodes = 0;
    EXPECT_EQ(k.fn(&bad, nullptr), DDT_OK);  // nothing to do, nothing launched
    GPU_CHECK(cudaDeviceSynchronize());
    GPU_CHECK(cudaGetLastError());
  }
}

}  // namespace
