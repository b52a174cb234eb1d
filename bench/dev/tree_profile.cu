// Dev harness (not shipped): where the tree builder's time goes, per CTA, from clock64 stamps compiled into
// a private copy of kernels/cuda/tree_build.cu (DDT_TREE_PROFILE). Runs the bench's draft shapes through
// every selection path that fits (serial: shared-memory heap; rounds; regheap: register heap, budgets up to
// kRegHeapMaxBudget) and prints per-stage cycles (median and max over the batch), the rounds path's
// phase / attempt / generation counts and candidate-set size, and the register heap's pops, exact-tie
// reductions and cycles per pop. Stamps: 0 start, 1 log-probs staged, 2 theta chosen, 3 set complete,
// 4 sorted, 5 selection done, 6 end; counters: 8 phases, 9 attempts, 10 generations, 11 set size,
// 12 tie reductions, 13 pops.
// build (from build/): nvcc -std=c++20 -arch=sm_90a -O3 -I../kernels/include -I.. ../bench/dev/tree_profile.cu \
//   ../kernels/common/validate.cpp ../kernels/cpu/topk_cpu.cpp ../kernels/cpu/tree_build_cpu.cpp -o tree_profile
// usage: tree_profile   (exits 1 if a tree differs from the CPU twin)
#define DDT_TREE_PROFILE 1
#include "kernels/cuda/tree_build.cu"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <random>
#include <vector>

#include "tests/unit/test_util.h"

using namespace ddtree;

int main() {
  const int L = 16, V = 32000;
  int wrong = 0;
  std::printf("| batch | budget | path | prefetch | theta | expand | sort | select total | output | total | phases | attempts | generations | set size | pops | ties | select/pop |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int batch : {1, 64})
    for (int B : {16, 64, 95, 256, 512})
      for (int path : {0, 1, 2}) {  // 0 serial, 1 rounds, 2 register heap
        const bool rounds = path == 1;
        // The register heap runs up to 3 slots per lane (B slots: B 95 is above the launcher's
        // kRegHeapMaxBudget, to see where the switch to rounds should be; its aux fields fit B <= 96).
        if (path == 2 && B > 96) continue;
        std::mt19937_64 rng(2);
        const int K = std::min(B, 1024), N = B + 1;
        auto d = test::random_draft(rng, batch, L, K, V, 0.1f, 0.0f, 3.0f);
        std::vector<int32_t> roots(batch, 5), prefix(batch, 1000);
        auto dev = [](size_t bytes) { void* p; cudaMalloc(&p, bytes); return p; };
        float* lp = (float*)dev(d.lp.size() * 4);
        int32_t* ids = (int32_t*)dev(d.ids.size() * 4);
        cudaMemcpy(lp, d.lp.data(), d.lp.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(ids, d.ids.data(), d.ids.size() * 4, cudaMemcpyHostToDevice);
        int32_t* r0 = (int32_t*)dev(batch * 4);
        int32_t* p0 = (int32_t*)dev(batch * 4);
        cudaMemcpy(r0, roots.data(), batch * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(p0, prefix.data(), batch * 4, cudaMemcpyHostToDevice);
        const size_t bn = size_t(batch) * N;
        ddt_tree_build_params p{lp, ids, r0, p0, batch, L, K, B,
                                (int32_t*)dev(bn * 4), (int32_t*)dev(bn * 4), (int32_t*)dev(bn * 4), (float*)dev(bn * 4),
                                (int32_t*)dev(bn * 4), (int32_t*)dev(bn * 4), (uint64_t*)dev(bn * 8 * ((N + 63) / 64)),
                                (int32_t*)dev(bn * 4), (int32_t*)dev(bn * 4), (int32_t*)dev(batch * 4), (uint32_t*)dev(4)};
        const int limit = kern::max_dynamic_smem();
        const int cs = rounds ? kern::rounds_capacity(B) : 0;
        const int reg_spl = path == 2 ? (B + 31) / 32 : 0;
        const auto t = kern::plan(L, K, B, cs, reg_spl > 0);
        if (int(t.bytes) > limit) continue;
        std::vector<long long> prof(1024 * 16);
        for (int rep = 0; rep < 3; ++rep) {  // warm up, then the last run is read
          cudaMemset(p.status, 0, 4);
          std::vector<long long> zero(1024 * 16, 0);
          cudaMemcpyToSymbol(kern::g_tree_profile, zero.data(), zero.size() * 8);
          kern::tree_build_kernel<<<batch, kern::kThreads, t.bytes>>>(p, cs, reg_spl);
          cudaDeviceSynchronize();
        }
        cudaMemcpyFromSymbol(prof.data(), kern::g_tree_profile, prof.size() * 8);
        // Check against the CPU twin (tokens, parents, scores, node counts).
        test::Tree h(batch, B);
        auto hp = h.params(d, roots, prefix, B);
        ddt_tree_build_cpu(&hp);
        std::vector<int32_t> tok(bn), par(bn), cnt_(batch);
        std::vector<float> sco(bn);
        cudaMemcpy(tok.data(), p.tokens, bn * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(par.data(), p.parents, bn * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(sco.data(), p.scores, bn * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(cnt_.data(), p.node_count, batch * 4, cudaMemcpyDeviceToHost);
        const bool ok = tok == h.tokens && par == h.parents && cnt_ == h.node_count &&
                        std::memcmp(sco.data(), h.scores.data(), bn * 4) == 0;
        const char* name = path == 0 ? "serial" : path == 1 ? "rounds" : "regheap";
        if (!ok) { std::printf("MISMATCH vs CPU twin: batch %d budget %d %s\n", batch, B, name); wrong = 1; }
        auto stat = [&](int a, int b2, bool med) {
          std::vector<long long> v;
          for (int i = 0; i < batch; ++i) v.push_back(prof[i * 16 + b2] - prof[i * 16 + a]);
          std::sort(v.begin(), v.end());
          return med ? v[v.size() / 2] : v.back();
        };
        auto cnt = [&](int slot) {
          long long mx = 0;
          for (int i = 0; i < batch; ++i) mx = std::max(mx, prof[i * 16 + slot]);
          return mx;
        };
        if (rounds)
          std::printf("| %d | %d | rounds | %lld | %lld/%lld | %lld/%lld | %lld/%lld | %lld/%lld | %lld | %lld/%lld | %lld | %lld | %lld | %lld | - | - | - |\n",
                      batch, B, stat(0, 1, true), stat(1, 2, true), stat(1, 2, false), stat(2, 3, true), stat(2, 3, false),
                      stat(3, 4, true), stat(3, 4, false), stat(1, 5, true), stat(1, 5, false), stat(5, 6, true),
                      stat(0, 6, true), stat(0, 6, false), cnt(8), cnt(9), cnt(10), cnt(11));
        else if (path == 2)  // pops (slot 13) and tie reductions (slot 12): max over CTAs
          std::printf("| %d | %d | regheap | %lld | - | - | - | %lld/%lld | %lld | %lld/%lld | - | - | - | - | %lld | %lld | %lld |\n",
                      batch, B, stat(0, 1, true), stat(1, 5, true), stat(1, 5, false), stat(5, 6, true), stat(0, 6, true),
                      stat(0, 6, false), cnt(13), cnt(12), stat(1, 5, true) / std::max(1LL, cnt(13)));
        else
          std::printf("| %d | %d | serial | %lld | - | - | - | %lld/%lld | %lld | %lld/%lld | - | - | - | - | - | - | %lld |\n", batch,
                      B, stat(0, 1, true), stat(1, 5, true), stat(1, 5, false), stat(5, 6, true), stat(0, 6, true),
                      stat(0, 6, false), stat(1, 5, true) / B);
      }
  std::printf("(cycles, median/max over the batch's CTAs at ~1.98 GHz; counts are the max over CTAs)\n");
  return (cudaGetLastError() == cudaSuccess && !wrong) ? 0 : 1;
}
