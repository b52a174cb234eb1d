// Benchmark (and check) of tree-verify MLA attention on the GPU: both CUDA kernels in the same run, the
// oracle (ddt_verify_attn_cuda) and the portable flash kernel (ddt_verify_attn_portable_cuda), one table
// row per (shape, kernel), with the portable kernel's speedup over the oracle, on the shapes of reference/mla-verify-attention.md: P in {512, 2k, 8k, 32k, 128k} x T in {1, 8, 16, 32,
// 64, 128}, H = 8, page size 64 (--page), fixed batch per P (64 at 512 and 2k, 32 at 8k and 32k, 8 at 128k) and
// batch 1; random bushy trees (the mask does not change the oracle's cost much: it visits every slot).
// The oracle is the correctness reference, not a fast kernel: its numbers are the baseline the flash
// kernels (issue 5, part 2) are compared against. Shapes whose oracle estimate exceeds --max-est-s run
// the portable kernel only.
//
// usage: bench_verify_attn [--quick] [--min-fraction F] [--max-est-s S] [--page N] [--contiguous] [--chain]
//                          [--portable-only] [--sm90-only] [--plan] [--p-bf16] [--split-keys N] [--shape P,T,batch]
//                          [--workspace-scale X]
//   --page N           tokens per KV page (default 64)
//   --contiguous       physical pages in logical order (default: a random permutation of the pages)
//   --chain            every tree a chain: the causal case (default: random bushy trees)
//   --portable-only    skip the oracle
//   --sm90-only        skip the oracle and the portable kernel (the sm_90a kernel only)
//   --plan             also time the sm_90a kernel with a per-step plan made beforehand (row sm90-plan; the plan
//                      kernel's own time in its last cell)
//   --p-bf16           also time the flash kernels at p_precision DDT_ATTN_P_BF16 (rows portable-bf16, sm90-bf16,
//                      sm90-plan-bf16 with --plan: P as one bf16, one PV product; the speedup cell gives the time over
//                      the hi + lo row's in the same run; checked against the bf16-P bar, p_bf16_tol)
//   --split-keys N     the flash kernels' split length (portable and sm_90a; default 512; 0: never split)
//   --shape P,T,batch  that one shape only (for a profiler: ncu -k ... bench_verify_attn --shape 32768,1,1)
//   --workspace-scale X  allocate the flash kernels' workspace at X (>= 1) times what a call needs: two libraries
//                      whose partial rows differ in size (S73: 1,544 against 2,056 bytes) then allocate alike, so the
//                      buffers allocated after it lie at the same addresses (default 1)
//   --quick            P in {2k, 32k} x T in {1, 8, 16, 64}, fixed batch, and batch 1 at P = 32k
//   --min-fraction F   exit 1 if the portable kernel's fraction of the roofline is below F on a shape
//                      (default 0: no floor; the oracle is never held to it)
//   --max-est-s S      skip the oracle where its estimated time exceeds S seconds (default 2; printed)
//
// Formulas (in the code below, per request, H heads; the reference file's H = 8 numbers generalised):
//   bytes = 1152 (P + T) + 2176 H T        (KV rows once, 576 bf16 each; Q 576 + O 512 bf16 per row and head)
//   FLOPs = 2176 H T (P + T)               (QK 576 + PV 512 multiply-adds per row, head and key, x2)
//   roofline time = max(bytes / 4.3 TB/s, FLOPs / 790 TFLOP/s)   (the reference file's fixed ceilings)
//   fraction = roofline time / measured time. The same-run device copy bandwidth is printed beside it.
// Timing: every sample is one launch between CUDA events, after a 256 MB memset that flushes L2 (--no-flush: none)
// (H200 L2: 60 MB); median of 3-9 samples (9 for the portable kernel). Checking: before timing, 3 sampled (row, head) pairs of every
// shape are recomputed on the host in double (all visible keys) and compared with the bar (out abs 8e-4 or
// rel 2/128, lse abs 1e-6 or rel 8/65536); the status word must stay 0. A wrong result makes the program
// exit 1 ("wrong results" at the end). Output buffers are poisoned (NaN) before each kernel's check.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ddtree/kernels.h"
#include "tests/attn/attn_util.h"
#include "bench/bench_util.h"
#include "tests/gpu/gpu_util.h"

using namespace ddtree::test::attn;
using ddtree::bench::copy_bandwidth_tbs;
using ddtree::test::DevBuf;

namespace {

constexpr double kCeilBw = 4.3e12, kCeilFlops = 790e12;  // reference/mla-verify-attention.md
constexpr int kHeads = 8, kMaxT = 128;
int g_page = 64;             // --page: tokens per KV page
bool g_contiguous = false;   // --contiguous: physical pages in logical order (default: randomly permuted)
bool g_chain = false;        // --chain: every tree is a chain (the causal case; default: random bushy trees)
bool g_no_flush = false;     // --no-flush: no L2 flush before a sample (the previous call's data and code stay in L2:
                             // what a cold start costs, against the default; FlashMLA's table in the reference file
                             // was measured without a flush)
int g_wrong = 0, g_below_floor = 0;

// The kernels timed, in table order (the oracle first: the portable rows print the speedup over it).
struct KernelRow {
  const char* name;
  int (*fn)(const ddt_verify_attn_params*, void*);
  bool p_bf16 = false;  // a --p-bf16 row (the fn sets p_precision DDT_ATTN_P_BF16)
};
int g_split_keys = 512;  // --split-keys: the flash kernels' split length (0: never split)
int portable_kernel(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_portable_with_workspace(p, g_split_keys, stream);
}
int sm90_kernel(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_sm90_with_workspace(p, g_split_keys, stream);
}
// --plan: the sm_90a kernel also with its per-step plan made beforehand (ddt_verify_attn_sm90_plan_cuda once per
// shape, outside the timed call, as FlashMLA's metadata is; the plan kernel's own time is printed in the row).
void* g_plan = nullptr;
size_t g_plan_bytes = 0;
int sm90_make_plan(const ddt_verify_attn_params* p, void* stream) {
  size_t need = 0;
  if (int rc = ddt_verify_attn_sm90_plan_bytes(p, g_split_keys, &need)) return rc;
  if (need > g_plan_bytes) {
    if (g_plan) GPU_CHECK(cudaFree(g_plan));
    GPU_CHECK(cudaMalloc(&g_plan, need));
    g_plan_bytes = need;
  }
  return ddt_verify_attn_sm90_plan_cuda(p, g_split_keys, g_plan, g_plan_bytes, stream);
}
int sm90_planned_kernel(const ddt_verify_attn_params* p, void* stream) {
  return ddtree::test::verify_attn_flash_with_workspace(
      [](const ddt_verify_attn_params* q, int sk, void* ws, size_t ws_bytes, void* st) {
        return ddt_verify_attn_sm90_planned_cuda(q, sk, g_plan, g_plan_bytes, ws, ws_bytes, st);
      },
      p, g_split_keys, stream);
}
// --p-bf16: the same calls at p_precision DDT_ATTN_P_BF16.
constexpr auto portable_bf16_kernel = ddtree::test::with_p_bf16<portable_kernel>;
constexpr auto sm90_bf16_kernel = ddtree::test::with_p_bf16<sm90_kernel>;
constexpr auto sm90_planned_bf16_kernel = ddtree::test::with_p_bf16<sm90_planned_kernel>;
// The sm_90a rows run only on a compute capability 9.0 GPU (the speedup cell also gives the ratio to the portable
// kernel in the same run, and for sm90-plan the plan kernel's time); --sm90-only skips the portable row.
const KernelRow kKernelRows[] = {{"oracle", ddt_verify_attn_cuda},
                                 {"portable", portable_kernel},
                                 {"portable-bf16", portable_bf16_kernel, true},
                                 {"sm90", sm90_kernel},
                                 {"sm90-bf16", sm90_bf16_kernel, true},
                                 {"sm90-plan", sm90_planned_kernel},
                                 {"sm90-plan-bf16", sm90_planned_bf16_kernel, true}};
bool g_sm90 = false, g_skip_portable = false, g_plan_rows = false, g_p_bf16_rows = false;

// Fast host bf16 noise: uniform in [-2, 2) from a xorshift (std::normal_distribution is too slow for
// the 1.2 GB caches of the large shapes).
struct Noise {
  uint64_t x;
  explicit Noise(uint64_t seed) : x(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; }
  void fill(uint16_t* dst, size_t n) {
    size_t i = 0;
    while (i < n) {
      uint64_t r = next();
      for (int k = 0; k < 4 && i < n; ++k, r >>= 16) dst[i++] = f32_bf16(float(int16_t(r & 0xFFFF)) / 16384.0f);
    }
  }
};

// One (P, batch) setup: the KV cache for P + kMaxT slots per request, pages randomly permuted, unused
// page-table entries out of range. Queries and trees are made per T.
struct Setup {
  int P, batch, max_pages;
  int64_t num_pages;
  std::vector<uint16_t> kv;
  std::vector<int32_t> page_table, prefix;
  DevBuf<uint16_t> d_kv;
  DevBuf<int32_t> d_pt, d_prefix;
  Setup(int P_, int batch_, uint64_t seed) : P(P_), batch(batch_) {
    max_pages = (P + kMaxT + g_page - 1) / g_page;
    num_pages = int64_t(batch) * max_pages;
    kv.resize(size_t(num_pages) * g_page * kQK);
    Noise(seed).fill(kv.data(), kv.size());
    std::vector<int32_t> perm(num_pages);
    for (int64_t i = 0; i < num_pages; ++i) perm[i] = int32_t(i);
    if (!g_contiguous) std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
    page_table.assign(perm.begin(), perm.end());
    prefix.assign(batch, P);
    d_kv = DevBuf<uint16_t>(kv);
    d_pt = DevBuf<int32_t>(page_table);
    d_prefix = DevBuf<int32_t>(prefix);
  }
};

// Host reference for one (row, head): double, every visible key; mass[d] = sum_j p_j |v_jd| / l (the scale of a
// rounded P's error: the bf16-P bar, p_bf16_tol).
void reference_row(const Setup& s, const std::vector<uint16_t>& q, const std::vector<uint64_t>& vis, int W, int T,
                   int row, int h, float scale, std::vector<double>& out, double& lse, std::vector<double>& mass) {
  const int r = row / T;
  const int64_t keys = int64_t(s.P) + T;
  const uint16_t* qr = q.data() + (size_t(row) * kHeads + h) * kQK;
  std::vector<double> qd(kQK), sc(keys, -INFINITY);
  for (int d = 0; d < kQK; ++d) qd[d] = bf16_f32(qr[d]);
  auto krow = [&](int64_t j) {
    const int64_t page = s.page_table[size_t(r) * s.max_pages + j / g_page];
    return s.kv.data() + (size_t(page) * g_page + size_t(j % g_page)) * kQK;
  };
  auto visible = [&](int64_t j) {
    if (j < s.P) return true;
    const int64_t b = j - s.P;
    return ((vis[size_t(row) * W + b / 64] >> (b % 64)) & 1) != 0;
  };
  double m = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    if (!visible(j)) continue;
    const uint16_t* k = krow(j);
    double a = 0;
    for (int d = 0; d < kQK; ++d) a += qd[d] * bf16_f32(k[d]);
    sc[j] = scale * a;
    m = std::max(m, sc[j]);
  }
  out.assign(kV, 0.0);
  mass.assign(kV, 0.0);
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) {
    if (!visible(j)) continue;
    const double e = std::exp(sc[j] - m);
    sum += e;
    const uint16_t* k = krow(j);
    for (int d = 0; d < kV; ++d) {
      out[d] += e * bf16_f32(k[d]);
      mass[d] += e * std::abs(double(bf16_f32(k[d])));
    }
  }
  for (auto& o : out) o /= sum;
  for (auto& x : mass) x /= sum;
  lse = m + std::log(sum);
}

void run_shape(cudaStream_t s, Setup& st, int T, double copy_tbs, double max_est_s, double min_fraction,
               DevBuf<char>& flush) {
  const int batch = st.batch, P = st.P, total = batch * T, W = (T + 63) / 64;
  const double bytes = double(batch) * (1152.0 * (P + T) + 2176.0 * kHeads * T);
  const double flops = double(batch) * 2176.0 * kHeads * T * (P + T);
  const double roof_us = std::max(bytes / kCeilBw, flops / kCeilFlops) * 1e6;
  // Oracle estimate: every (row, head) CTA streams all P + T rows through L2 (~3 TB/s effective, pessimistic).
  const double est_s = double(total) * kHeads * (P + T) * 1152.0 / 3e12;
  // Queries and trees: bushy (node i's parent uniform in [0, i)) or, with --chain, chains (parent i - 1).
  std::mt19937_64 rng(uint64_t(P) * 131 + T * 7 + batch);
  std::vector<uint16_t> q(size_t(total) * kHeads * kQK);
  Noise(rng()).fill(q.data(), q.size());
  std::vector<uint64_t> vis(size_t(total) * W, 0);
  std::vector<int32_t> offsets(batch + 1);
  for (int r = 0; r <= batch; ++r) offsets[r] = r * T;
  for (int r = 0; r < batch; ++r)
    for (int i = 0; i < T; ++i) {
      uint64_t* row = vis.data() + size_t(r * T + i) * W;
      if (i > 0) std::memcpy(row, vis.data() + size_t(r * T + (g_chain ? i - 1 : int(rng() % i))) * W, size_t(W) * 8);
      row[i / 64] |= uint64_t(1) << (i % 64);
    }
  DevBuf<uint16_t> dq(q), dout(size_t(total) * kHeads * kV);
  DevBuf<uint64_t> dvis(vis);
  DevBuf<int32_t> doff(offsets);
  DevBuf<float> dlse(size_t(total) * kHeads);
  DevBuf<uint32_t> dst(1);
  const float scale = 0.1352337f;  // 1/sqrt(192) x YaRN mscale^2 (Kimi-K2 / DeepSeek-V3 style)
  ddt_verify_attn_params prm{dq.ptr, st.d_kv.ptr, st.d_pt.ptr, st.d_prefix.ptr, doff.ptr, dvis.ptr, batch, total,
                             kHeads, g_page, st.max_pages, st.num_pages, W, scale, dout.ptr, dlse.ptr, dst.ptr,
                             DDT_ATTN_P_HILO};
  // Host references of the sampled (row, head) pairs, shared by both kernels' checks.
  const int samples[3][2] = {{0, 0}, {total - 1, kHeads - 1}, {total / 2, 3 % kHeads}};
  std::vector<double> ref_out[3], ref_lse(3), ref_mass[3];
  for (int i = 0; i < 3; ++i)
    reference_row(st, q, vis, W, T, samples[i][0], samples[i][1], scale, ref_out[i], ref_lse[i], ref_mass[i]);
  double oracle_us = 0, portable_us = 0, sm90_us = 0, sm90_plan_us = 0;
  for (const KernelRow& k : kKernelRows) {
    const bool is_oracle = k.fn == ddt_verify_attn_cuda;
    const bool planned = k.fn == sm90_planned_kernel || k.fn == sm90_planned_bf16_kernel;
    const bool portable_row = k.fn == portable_kernel || k.fn == portable_bf16_kernel;
    if (!portable_row && !is_oracle && !g_sm90) continue;  // (the sm90 rows)
    if (planned && !g_plan_rows) continue;
    if (k.p_bf16 && !g_p_bf16_rows) continue;
    if (portable_row && g_skip_portable) continue;
    if (is_oracle && max_est_s < 0) continue;  // --portable-only
    if (is_oracle && est_s > max_est_s) {
      std::printf("| %d | %d | %d | %s | skipped: estimated %.1f s > --max-est-s %.1f | | | %.1f | | | | |\n", P, T, batch,
                  k.name, est_s, max_est_s, roof_us);
      continue;
    }
    // The timing helper: median of n launches of fn, L2 flushed before each (unless --no-flush).
    auto median_us = [&](int (*fn)(const ddt_verify_attn_params*, void*), int n) {
      cudaEvent_t e0, e1;
      GPU_CHECK(cudaEventCreate(&e0));
      GPU_CHECK(cudaEventCreate(&e1));
      std::vector<float> ms;
      for (int i = 0; i < n; ++i) {
        if (!g_no_flush) GPU_CHECK(cudaMemsetAsync(flush.ptr, i & 0xFF, flush.n, s));
        GPU_CHECK(cudaEventRecord(e0, s));
        BENCH_OK(fn(&prm, s));
        GPU_CHECK(cudaEventRecord(e1, s));
        GPU_CHECK(cudaEventSynchronize(e1));
        float t = 0;
        GPU_CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
      }
      GPU_CHECK(cudaEventDestroy(e0));
      GPU_CHECK(cudaEventDestroy(e1));
      std::sort(ms.begin(), ms.end());
      return double(ms[ms.size() / 2]) * 1e3;
    };
    double plan_us = 0;
    if (planned) plan_us = median_us(sm90_make_plan, 9);  // (the last one stays for the rows)
    dst.poison(0);
    dout.poison(0xFF);
    BENCH_OK(k.fn(&prm, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    // Check sampled rows.
    const std::vector<uint16_t> out = dout.download();
    const std::vector<float> lse = dlse.download();
    bool ok = dst.download()[0] == 0;
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t base = (size_t(samples[i][0]) * kHeads + samples[i][1]) * kV;
      for (int d = 0; d < kV; ++d) {
        const double e = std::abs(double(bf16_f32(out[base + d])) - ref_out[i][d]);
        if (!(e <= worst)) worst = e;  // NaN sticks
        const double slack = k.p_bf16 ? p_bf16_tol().p_round * ref_mass[i][d] : 0.0;  // (the bf16-P bar)
        if (!(e <= std::max(8e-4, 2.0 / 128 * std::abs(ref_out[i][d])) + slack)) ok = false;
      }
      const double le = std::abs(double(lse[size_t(samples[i][0]) * kHeads + samples[i][1]]) - ref_lse[i]);
      if (!(le <= 1e-6 || le <= 8.0 / 65536 * std::abs(ref_lse[i]))) ok = false;
    }
    g_wrong += !ok;
    // Time: one launch per sample, L2 flushed before each (unless --no-flush).
    const double us = median_us(k.fn, !is_oracle ? 9 : (est_s > 0.05 ? 3 : (est_s > 0.002 ? 5 : 9)));
    const double tbs = bytes / (us * 1e-6) / 1e12, tflops = flops / (us * 1e-6) / 1e12, frac = roof_us / us;
    if (is_oracle) oracle_us = us;
    else if (frac < min_fraction) ++g_below_floor;
    if (k.fn == portable_kernel) portable_us = us;
    if (k.fn == sm90_kernel) sm90_us = us;
    if (k.fn == sm90_planned_kernel) sm90_plan_us = us;
    char speedup[96] = "";
    if (!is_oracle && oracle_us > 0) std::snprintf(speedup, sizeof speedup, "%.1f", oracle_us / us);
    if ((k.fn == sm90_kernel || planned || k.fn == sm90_bf16_kernel) && portable_us > 0)
      std::snprintf(speedup + std::strlen(speedup), sizeof speedup - std::strlen(speedup), "%s%.2fx portable",
                    oracle_us > 0 ? " / " : "", portable_us / us);
    const double hilo_us = k.fn == sm90_bf16_kernel             ? sm90_us
                           : k.fn == sm90_planned_bf16_kernel ? sm90_plan_us
                           : k.fn == portable_bf16_kernel     ? portable_us
                                                              : 0.0;
    if (hilo_us > 0)  // (time over the hi + lo row's: < 1 is faster)
      std::snprintf(speedup + std::strlen(speedup), sizeof speedup - std::strlen(speedup), "%s%.3f of hi+lo",
                    speedup[0] ? " / " : "", us / hilo_us);
    if (planned)
      std::snprintf(speedup + std::strlen(speedup), sizeof speedup - std::strlen(speedup), "%splan %.1f us",
                    speedup[0] ? " / " : "", plan_us);
    std::printf("| %d | %d | %d | %s | %.1f | %.3f | %.1f | %.1f | %.4f | %.3f | %s | %s (worst abs err %.1e) |\n", P, T,
                batch, k.name, us, tbs, tflops, roof_us, frac, tbs / copy_tbs, speedup, ok ? "yes" : "NO", worst);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, portable_only = false;
  double min_fraction = 0.0, max_est_s = 2.0;
  int one_P = 0, one_T = 0, one_batch = 0;  // --shape
  bool shape_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--min-fraction" && i + 1 < argc) min_fraction = std::atof(argv[++i]);
    else if (a == "--max-est-s" && i + 1 < argc) max_est_s = std::atof(argv[++i]);
    else if (a == "--page" && i + 1 < argc) g_page = std::atoi(argv[++i]);
    else if (a == "--contiguous") g_contiguous = true;
    else if (a == "--chain") g_chain = true;
    else if (a == "--no-flush") g_no_flush = true;
    else if (a == "--portable-only") portable_only = true;
    else if (a == "--sm90-only") portable_only = g_skip_portable = true;
    else if (a == "--plan") g_plan_rows = true;
    else if (a == "--p-bf16") g_p_bf16_rows = true;
    else if (a == "--split-keys" && i + 1 < argc) g_split_keys = std::atoi(argv[++i]);
    else if (a == "--workspace-scale" && i + 1 < argc) ddtree::test::g_workspace_scale = std::atof(argv[++i]);
    else if (a == "--shape" && i + 1 < argc && std::sscanf(argv[i + 1], "%d,%d,%d", &one_P, &one_T, &one_batch) == 3) {
      shape_given = true;
      ++i;
    }
    else {
      std::fprintf(stderr, "usage: bench_verify_attn [--quick] [--min-fraction F] [--max-est-s S] [--page N] "
                           "[--contiguous] [--chain] [--no-flush] [--portable-only] [--sm90-only] [--plan] "
                           "[--p-bf16] [--split-keys N] [--shape P,T,batch] [--workspace-scale X]\n");
      return 2;
    }
  }
  if (g_page < 1) { std::fprintf(stderr, "bench_verify_attn: --page must be >= 1\n"); return 2; }
  if (!(ddtree::test::g_workspace_scale >= 1.0 && ddtree::test::g_workspace_scale <= 16.0)) {
    std::fprintf(stderr, "bench_verify_attn: --workspace-scale must be in [1, 16]\n");
    return 2;
  }
  if (shape_given &&
      (one_P < 0 || one_P > (1 << 20) || one_T < 1 || one_T > kMaxT || one_batch < 1 || one_batch > 1024)) {
    std::fprintf(stderr, "bench_verify_attn: --shape P,T,batch needs 0 <= P <= 2^20, 1 <= T <= %d, 1 <= batch <= 1024\n",
                 kMaxT);
    return 2;
  }
  if (!ddt_cuda_available()) {
    std::printf("bench_verify_attn: no GPU visible; nothing to measure\n");
    return 77;
  }
  const auto t0 = std::chrono::steady_clock::now();
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_tbs = copy_bandwidth_tbs(s);
  g_sm90 = ddtree::test::gpu_is_sm90();
  DevBuf<char> flush(size_t(256) << 20);
  std::printf("# bench_verify_attn: the ORACLE (one CTA per row and head, f32, no tensor cores), the PORTABLE flash "
              "kernel (mma.sync bf16, 32 rows x 32 keys per step, cp.async) and the SM90 kernel (wgmma, 64 rows x 64 "
              "keys; %s) on %s (%d SMs)\n",
              g_sm90 ? "timed" : "not run: not compute capability 9.0", prop.name, prop.multiProcessorCount);
  std::printf("# same-run device copy %.2f TB/s (read + write); roofline ceilings fixed at 4.3 TB/s and 790 TFLOP/s "
              "(reference/mla-verify-attention.md); H = %d, page size %d, %s pages, %s trees, %s; split_keys %d (both "
              "flash kernels)\n",
              copy_tbs, kHeads, g_page, g_contiguous ? "contiguous" : "shuffled", g_chain ? "chain" : "bushy",
              g_no_flush ? "NO L2 flush (--no-flush: data and code of the previous call may be in L2)"
                         : "L2 flushed before each sample",
              g_split_keys);
  std::printf("# bytes = batch x (1152 (P+T) + 2176 H T); FLOPs = batch x 2176 H T (P+T); fraction = roofline us / us\n\n");
  std::printf("| P | T | batch | kernel | us | TB/s | TFLOP/s | roofline us | fraction of roofline | fraction of copy BW | "
              "speedup vs oracle | checked vs host f64 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<int> Ps = {512, 2048, 8192, 32768, 131072}, Ts = {1, 8, 16, 32, 64, 128};
  if (quick) { Ps = {2048, 32768}; Ts = {1, 8, 16, 64}; }
  auto fixed_batch = [](int P) { return P <= 2048 ? 64 : (P <= 32768 ? 32 : 8); };
  if (shape_given) {
    Setup st(one_P, one_batch, uint64_t(one_P) * 3 + one_batch);
    run_shape(s, st, one_T, copy_tbs, portable_only ? -1.0 : max_est_s, min_fraction, flush);
    Ps.clear();
  }
  for (int P : Ps)
    for (int batch : {fixed_batch(P), 1}) {
      if (quick && batch == 1 && P < 32768) continue;  // --quick: batch 1 at P = 32k only
      Setup st(P, batch, uint64_t(P) * 3 + batch);
      for (int T : Ts) run_shape(s, st, T, copy_tbs, portable_only ? -1.0 : max_est_s, min_fraction, flush);
    }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nwrong results: %d; shapes below --min-fraction %.3f: %d; wall time %.1f s\n", g_wrong, min_fraction,
              g_below_floor, wall);
  GPU_CHECK(cudaStreamDestroy(s));
  return (g_wrong || g_below_floor) ? 1 : 0;
}
