// Benchmark (and check) of the foundation kernels on the GPU: tree build and accept walk in microseconds
// against the single-threaded CPU heap in the same run, top-K over the vocabulary in GB/s against the
// same-run device copy bandwidth, the accepted path's KV compaction in TB/s (read + write) against the same
// copy bandwidth. Every timed configuration is first checked against the CPU twin; a wrong result makes the
// program exit 1.
//
// usage: bench_kernels [--quick] [--tree-only] [--kv-only]
// Timing: CUDA events around R back-to-back launches on one stream (R chosen so a sample lasts >= ~2 ms),
// median of 5 samples; "graph us" is the same kernel captured R times in one CUDA graph (launch gaps
// shrink to the graph's). Inputs of the top-K are larger than L2 (rows x vocab x 4 bytes >= 300 MB).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ddtree/kernels.h"
#include "bench/bench_util.h"
#include "tests/gpu/gpu_util.h"
#include "tests/unit/test_util.h"

using namespace ddtree;
using test::DevBuf;
using namespace ddtree::bench;

namespace {
int g_wrong = 0;

double cpu_us(int reps, const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int sample = 0; sample < 5; ++sample) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void bench_topk(cudaStream_t s, double copy_tbs, bool quick) {
  std::printf("\n## top-K over a vocabulary shard (rows = batch x draft positions), f32 logits\n");
  std::printf("| rows | vocab | k | us | GB/s | fraction of copy BW | ids = CPU twin |\n|---|---|---|---|---|---|---|\n");
  struct C { int rows, vocab, k; };
  // 512 rows = batch 64 x 8 draft positions; 8 rows = batch 1. 163840 = Kimi-K2's vocabulary (TP1),
  // 20480 = its shard at TP8.
  std::vector<C> cases = {{512, 163840, 64}, {512, 163840, 512}, {64, 163840, 64}, {8, 163840, 64},
                          {512, 20480, 64}, {512, 20480, 512}, {8, 20480, 64}};
  if (quick) cases.resize(2);
  std::mt19937_64 rng(1);
  for (auto c : cases) {
    auto x = test::random_logits(rng, c.rows, c.vocab, 0.05f, 0.0f, 3.0f);
    DevBuf<float> dx(x), dv(size_t(c.rows) * c.k), dl(c.rows);
    DevBuf<int32_t> di(size_t(c.rows) * c.k);
    DevBuf<uint32_t> ds(1);
    ds.poison(0);
    ddt_topk_shard_params p{dx.ptr, c.vocab, c.rows, c.vocab, 0, c.k, dv.ptr, di.ptr, dl.ptr, ds.ptr};
    BENCH_OK(ddt_topk_shard_cuda(&p, s));
    std::vector<float> hv(size_t(c.rows) * c.k), hl(c.rows);
    std::vector<int32_t> hi(size_t(c.rows) * c.k);
    uint32_t hs = 0;
    ddt_topk_shard_params hp{x.data(), c.vocab, c.rows, c.vocab, 0, c.k, hv.data(), hi.data(), hl.data(), &hs};
    BENCH_OK(ddt_topk_shard_cpu(&hp));
    const bool ok = same(di.download(), hi) && same(dv.download(), hv);
    g_wrong += !ok;
    const double bytes = double(c.rows) * c.vocab * 4;
    const int reps = std::max(3, int(2e-3 / (bytes / 3e12)));
    const double us = time_us(s, reps, [&] { BENCH_OK(ddt_topk_shard_cuda(&p, s)); });
    const double gbs = bytes / (us * 1e-6) / 1e9;
    // A read-only kernel's ceiling is the read half of a copy's bytes/s at the same total rate.
    std::printf("| %d | %d | %d | %.1f | %.0f | %.2f | %s |\n", c.rows, c.vocab, c.k, us, gbs, gbs / (copy_tbs * 1e3),
                ok ? "yes" : "NO");
  }
}

void bench_tree_and_accept(cudaStream_t s, bool quick) {
  std::printf("\n## tree build (DDTree best-first) and accept walk; depth L = 16, K = min(budget, 1024)\n");
  std::printf("| batch | budget | build us | build graph us | CPU heap us | speedup | walk us | walk graph us | CPU walk us | tree = CPU twin |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  const int L = 16, V = 32000;
  std::vector<int> batches = {1, 8, 64}, budgets = {16, 64, 256, 512};
  if (quick) { batches = {64}; budgets = {64}; }
  std::mt19937_64 rng(2);
  for (int batch : batches)
    for (int B : budgets) {
      const int K = std::min(B, 1024), N = B + 1, mp = L + 1;
      auto d = test::random_draft(rng, batch, L, K, V, 0.1f, 0.0f, 3.0f);
      std::vector<int32_t> roots(batch, 5), prefix(batch, 1000), maxnew(batch, 1 << 20);
      test::Tree h(batch, B);
      auto hp = h.params(d, roots, prefix, B);
      const double cpu = cpu_us(batch >= 64 ? 5 : 50, [&] { BENCH_OK(ddt_tree_build_cpu(&hp)); });
      DevBuf<float> dlp(d.lp);
      DevBuf<int32_t> dids(d.ids), droots(roots), dprefix(prefix), dtok(size_t(batch) * N), dpar(size_t(batch) * N),
          ddep(size_t(batch) * N), dslot(size_t(batch) * N), dpos(size_t(batch) * N), dfc(size_t(batch) * N),
          dns(size_t(batch) * N), dcnt(batch);
      DevBuf<float> dsc(size_t(batch) * N);
      DevBuf<uint64_t> dvis(size_t(batch) * N * ((N + 63) / 64));
      DevBuf<uint32_t> dst(1);
      dst.poison(0);
      ddt_tree_build_params p{dlp.ptr, dids.ptr, droots.ptr, dprefix.ptr, batch, L, K, B, dtok.ptr, dpar.ptr, ddep.ptr,
                              dsc.ptr, dslot.ptr, dpos.ptr, dvis.ptr, dfc.ptr, dns.ptr, dcnt.ptr, dst.ptr};
      BENCH_OK(ddt_tree_build_cuda(&p, s));
      const bool ok = same(dtok.download(), h.tokens) && same(dpar.download(), h.parents) &&
                      same(dvis.download(), h.vis) && same(dns.download(), h.next_sibling) &&
                      same(dsc.download(), h.scores) && same(dcnt.download(), h.node_count);
      g_wrong += !ok;
      const double gpu = time_us(s, 200, [&] { BENCH_OK(ddt_tree_build_cuda(&p, s)); });
      const double gg = graph_us(s, 50, [&] { BENCH_OK(ddt_tree_build_cuda(&p, s)); });
      // Accept: keys that follow each node's first child (long accepted paths: the walk's worst case).
      std::vector<uint64_t> keys(size_t(batch) * N);
      for (int b = 0; b < batch; ++b)
        for (int i = 0; i < N; ++i) {
          const int fc = h.first_child[size_t(b) * N + i];
          keys[size_t(b) * N + i] = ddt_pack_key(1.0f, fc >= 0 ? h.tokens[size_t(b) * N + fc] : 7);
        }
      std::vector<int32_t> path(size_t(batch) * mp), nt(size_t(batch) * mp), pl(batch), nn(batch), bo(batch), fi(batch);
      uint32_t hs = 0;
      ddt_accept_params ah{keys.data(), h.tokens.data(), h.parents.data(), h.node_count.data(), batch, N, mp,
                           maxnew.data(), nullptr, 0, path.data(), pl.data(), nt.data(), nn.data(), bo.data(), fi.data(), &hs};
      const double cpu_walk = cpu_us(50, [&] { BENCH_OK(ddt_accept_cpu(&ah)); });
      DevBuf<uint64_t> dkeys(keys);
      DevBuf<int32_t> dmax(maxnew), dpath(path.size()), dnt(nt.size()), dpl(batch), dnn(batch), dbo(batch), dfi(batch);
      ddt_accept_params ag{dkeys.ptr, dtok.ptr, dpar.ptr, dcnt.ptr, batch, N, mp, dmax.ptr, nullptr, 0, dpath.ptr,
                           dpl.ptr, dnt.ptr, dnn.ptr, dbo.ptr, dfi.ptr, dst.ptr};
      BENCH_OK(ddt_accept_cuda(&ag, s));
      const bool ok2 = same(dpath.download(), path) && same(dnt.download(), nt) && same(dbo.download(), bo);
      g_wrong += !ok2;
      const double walk = time_us(s, 200, [&] { BENCH_OK(ddt_accept_cuda(&ag, s)); });
      const double wg = graph_us(s, 50, [&] { BENCH_OK(ddt_accept_cuda(&ag, s)); });
      std::printf("| %d | %d | %.2f | %.2f | %.1f | %.1fx | %.2f | %.2f | %.2f | %s |\n", batch, B, gpu, gg, cpu, cpu / gg,
                  walk, wg, cpu_walk, ok && ok2 ? "yes" : "NO");
    }
}
// The accepted path's KV compaction (ddtree/kernels.h section 5) for a step of a 61-layer model (Kimi-K2's): bf16
// latent rows of 1,152 B, pages of 64, every request's path the deepest jumps (path[k] = 2k: every accepted node
// moves), so bytes = batch x 61 x moves x 1,152 x 2 (read + write). Each request's prefix is one page, its tree
// the next pages; pages shuffled over the pool. Timed in place (a repeat moves the same number of rows); the
// small batches' rows stay in L2 across repeats, the large ones' (>= 64: > 100 MB a launch) do not. Remap: the
// same paths at page size 1 (page-table swaps only, no KV bytes).
void bench_kv_compact(cudaStream_t s, double copy_tbs, bool quick) {
  std::printf("\n### Accepted-path KV compaction (61 layers, rows of 1,152 B, page 64; every accepted node moves)\n");
  std::printf("| batch | accepted nodes | MB moved (r + w) | us | graph us | TB/s (r + w) | fraction of copy BW | remap us | = CPU twin |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const int layers = 61, row = 1152, page = 64, mp = DDT_MAX_DEPTH + 1;
  struct Case { int batch, len; };
  std::vector<Case> cases = {{1, 4}, {1, 16}, {8, 8}, {64, 8}, {64, 16}, {256, 8}, {256, 16}};
  if (quick) cases = {{1, 8}, {64, 8}};
  for (const Case& c : cases) {
    const int N = 2 * c.len;                                    // tree width: nodes 0 .. 2 (len - 1) used
    const int per_req = 1 + (N + page - 1) / page;             // the prefix page + the tree's pages
    const int64_t pages = int64_t(c.batch) * per_req;
    const int64_t stride = pages * page * row;
    std::vector<int32_t> table(size_t(c.batch) * per_req), prefix(c.batch, page), path(size_t(c.batch) * mp, -1),
        len(c.batch, c.len);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(17));
    for (int b = 0; b < c.batch; ++b)
      for (int k = 0; k < c.len; ++k) path[size_t(b) * mp + k] = 2 * k;
    std::vector<uint8_t> kv(size_t(stride) * layers);
    std::mt19937_64 rng(c.batch * 100 + c.len);
    for (size_t i = 0; i < kv.size(); i += 8) {
      const uint64_t x = rng();
      std::memcpy(kv.data() + i, &x, std::min<size_t>(8, kv.size() - i));
    }
    DevBuf<uint8_t> dkv(kv);
    DevBuf<int32_t> dt(table), dp(prefix), dpath(path), dlen(len);
    DevBuf<uint32_t> ds(1);
    ds.poison(0);
    uint32_t st = 0;
    ddt_kv_compact_params hp{kv.data(), stride, layers, row, page, pages, table.data(), per_req, prefix.data(),
                             path.data(), len.data(), c.batch, mp, 0, &st};
    ddt_kv_compact_params gp{dkv.ptr, stride, layers, row, page, pages, dt.ptr, per_req, dp.ptr, dpath.ptr, dlen.ptr,
                             c.batch, mp, 0, ds.ptr};
    BENCH_OK(ddt_kv_compact_cpu(&hp));
    BENCH_OK(ddt_kv_compact_cuda(&gp, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    const bool ok = same(dkv.download(), kv) && ds.download()[0] == 0 && st == 0;
    const int reps = c.batch >= 64 ? 20 : 200;
    const double us = time_us(s, reps, [&] { BENCH_OK(ddt_kv_compact_cuda(&gp, s)); });
    const double gus = graph_us(s, reps, [&] { BENCH_OK(ddt_kv_compact_cuda(&gp, s)); });
    // Remap at page size 1: one page per slot, the same paths.
    const int slots = page + N;
    std::vector<int32_t> table1(size_t(c.batch) * slots);
    for (size_t i = 0; i < table1.size(); ++i) table1[i] = int32_t(i);
    DevBuf<int32_t> dt1(table1);
    ddt_kv_compact_params rp{dkv.ptr, int64_t(table1.size()) * row, 1, row, 1, int64_t(table1.size()), dt1.ptr, slots,
                             dp.ptr, dpath.ptr, dlen.ptr, c.batch, mp, 1, ds.ptr};
    std::vector<int32_t> want1 = table1;
    uint32_t st1 = 0;
    ddt_kv_compact_params rh = rp;
    rh.kv = kv.data();
    rh.page_table = want1.data();
    rh.prefix_lens = prefix.data();
    rh.path = path.data();
    rh.path_len = len.data();
    rh.status = &st1;
    BENCH_OK(ddt_kv_compact_cpu(&rh));
    BENCH_OK(ddt_kv_compact_cuda(&rp, s));
    const bool ok1 = same(dt1.download(), want1) && ds.download()[0] == 0 && st1 == 0;
    const double rus = time_us(s, 200, [&] { BENCH_OK(ddt_kv_compact_cuda(&rp, s)); });
    const double bytes = 2.0 * c.batch * layers * (c.len - 1) * row;
    const double tbs = bytes / (us * 1e-6) / 1e12;
    if (!ok || !ok1) ++g_wrong;
    std::printf("| %d | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", c.batch, c.len, bytes / 1e6, us, gus,
                tbs, tbs / copy_tbs, rus, ok && ok1 ? "yes" : "NO");
  }
}
}  // namespace

int main(int argc, char** argv) {
  bool quick = false, tree_only = false, kv_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--tree-only") tree_only = true;
    else if (a == "--kv-only") kv_only = true;
    else { std::fprintf(stderr, "usage: bench_kernels [--quick] [--tree-only] [--kv-only]\n"); return 2; }
  }
  if (!ddt_cuda_available()) {
    std::printf("bench_kernels: no GPU visible; nothing to measure\n");
    return 77;
  }
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_tbs = copy_bandwidth_tbs(s);
  std::printf("# bench_kernels on %s (%d SMs); device copy %.2f TB/s (read + write, same run)\n", prop.name,
              prop.multiProcessorCount, copy_tbs);
  if (!tree_only && !kv_only) bench_topk(s, copy_tbs, quick);
  if (!kv_only) bench_tree_and_accept(s, quick);
  if (!tree_only) bench_kv_compact(s, copy_tbs, quick);
  std::printf("\nwrong results: %d\n", g_wrong);
  return g_wrong ? 1 : 0;
}
