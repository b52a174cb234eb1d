// Dev harness (not shipped): where the portable verify-attention kernel's time goes, from clock64 stamps
// compiled into a private copy of kernels/cuda/verify_attn_portable.cu (DDT_ATTN_PROFILE): warp 0's cycles
// per key tile in each phase (tile wait, barrier A, load issue, QK, barrier B, softmax, barrier C, PV), the
// item prologue and epilogue per item, and the kernel time, on a few benchmark shapes (H = 8, page 64,
// shuffled pages, bushy trees).
// build (from the repo root; add -DATTN_PROFILE_SM90 for the sm_90a kernel): nvcc -std=c++20 -arch=sm_90a -O3 -Ikernels/include -I. bench/dev/attn_profile.cu \
//   kernels/common/validate.cpp kernels/common/verify_attn_split.cpp -o attn_profile
// usage: [ATTN_PROFILE_P=bf16] [ATTN_PROFILE_PLANNED=1: the laps of a planned call] [ATTN_PROFILE_DUMP=1: the CTAs
//   that exit last and first, each with its startup] attn_profile
// The sm_90a build also prints a timeline row per shape: the API call against the main kernel alone and the
// combine alone (L2 flushed, median of 9); then the stamped timelines of one unplanned and one planned call,
// each the call of median event time among 5 stamped calls.
// With -DATTN_PROFILE_SM90 the sm_90a kernel instead (kernels/cuda/verify_attn_sm90.cu; its slot 13 = mask, scale
// and row max, split out of "QK"; "softmax" is then the exp2 and P stores).
#define DDT_ATTN_PROFILE 1
#ifdef ATTN_PROFILE_SM90
#include "kernels/cuda/verify_attn_sm90.cu"
#define ATTN_ENTRY ddt_verify_attn_sm90_cuda
#else
#include "kernels/cuda/verify_attn_portable.cu"
#define ATTN_ENTRY ddt_verify_attn_portable_cuda
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <random>
#include <vector>

__global__ void timeline_empty_kernel() {}

int main() {
  using namespace ddtree::kern::attn;
  constexpr int H = 8, kPage = 64;
  // ATTN_PROFILE_P=bf16: the calls at p_precision DDT_ATTN_P_BF16 (P as one bf16, one PV product)
  const char* p_env = std::getenv("ATTN_PROFILE_P");
  const int p_precision = p_env && std::string(p_env) == "bf16" ? DDT_ATTN_P_BF16 : DDT_ATTN_P_HILO;
  std::printf("# p_precision %s\n", p_precision == DDT_ATTN_P_BF16 ? "bf16" : "hilo (default)");
  struct Shape { int P, T, batch; };
  std::printf("| P | T | batch | kernel us | items | tiles | prologue/item | wait | bar A | load issue | QK | bar B | "
              "softmax | bar C | PV | mask+max | sum/tile | epilogue/item |\n|");
  for (int i = 0; i < 18; ++i) std::printf("---|");
  std::printf("\n");
  // ATTN_PROFILE_SHAPES="P,T,batch ...": these shapes instead of the default list
  std::vector<Shape> shapes = {Shape{32768, 16, 32}, Shape{32768, 1, 32}, Shape{32768, 8, 1}, Shape{32768, 1, 1},
                               Shape{2048, 64, 64},  Shape{2048, 1, 64},  Shape{131072, 1, 1}, Shape{32768, 64, 1}};
  if (const char* env = std::getenv("ATTN_PROFILE_SHAPES")) {
    shapes.clear();
    for (const char* c = env; *c;) {
      Shape sh{};
      int used = 0;
      if (std::sscanf(c, " %d,%d,%d%n", &sh.P, &sh.T, &sh.batch, &used) != 3 || sh.P < 0 || sh.T < 1 || sh.batch < 1) {
        std::fprintf(stderr, "ATTN_PROFILE_SHAPES: expected \"P,T,batch ...\", got \"%s\"\n", c);
        return 2;
      }
      shapes.push_back(sh);
      c += used;
      while (*c == ' ') ++c;
    }
  }
  for (const Shape sh : shapes) {
    const int keys = sh.P + sh.T, max_pages = (keys + kPage - 1) / kPage, total = sh.batch * sh.T;
    const int64_t num_pages = int64_t(sh.batch) * max_pages;
    std::mt19937_64 rng(sh.P + sh.T);
    std::vector<uint16_t> kv(size_t(num_pages) * kPage * kDimQK), q(size_t(total) * H * kDimQK);
    for (auto& x : kv) x = uint16_t(0x3C00 + (rng() & 0x3FF)) ^ uint16_t((rng() & 1) << 15);  // +-[0.0078, 0.0156)
    for (auto& x : q) x = uint16_t(0x3F00 + (rng() & 0xFF)) ^ uint16_t((rng() & 1) << 15);     // +-[0.5, 1)
    std::vector<int32_t> pt(num_pages), prefix(sh.batch, sh.P), off(sh.batch + 1);
    for (int64_t i = 0; i < num_pages; ++i) pt[i] = int32_t(i);
    std::shuffle(pt.begin(), pt.end(), rng);
    for (int r = 0; r <= sh.batch; ++r) off[r] = r * sh.T;
    const int W = (sh.T + 63) / 64;
    std::vector<uint64_t> vis(size_t(total) * W, 0);
    for (int r = 0; r < sh.batch; ++r)
      for (int i = 0; i < sh.T; ++i) {
        uint64_t* row = &vis[size_t(r * sh.T + i) * W];
        if (i > 0) for (int w = 0; w < W; ++w) row[w] = vis[size_t(r * sh.T + int(rng() % i)) * W + w];
        row[i / 64] |= uint64_t(1) << (i % 64);
      }
    auto up = [](const auto& v) {
      void* d = nullptr;
      cudaMalloc(&d, v.size() * sizeof(v[0]));
      cudaMemcpy(d, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice);
      return d;
    };
    uint16_t* dkv = (uint16_t*)up(kv);
    uint16_t* dq = (uint16_t*)up(q);
    int32_t* dpt = (int32_t*)up(pt);
    int32_t* dpre = (int32_t*)up(prefix);
    int32_t* doff = (int32_t*)up(off);
    uint64_t* dvis = (uint64_t*)up(vis);
    uint16_t* dout; float* dlse; uint32_t* dst;
    cudaMalloc(&dout, size_t(total) * H * kDimV * 2);
    cudaMalloc(&dlse, size_t(total) * H * 4);
    cudaMalloc(&dst, 4);
    cudaMemset(dst, 0, 4);
    ddt_verify_attn_params prm{dq, dkv, dpt, dpre, doff, dvis, sh.batch, total, H, kPage, max_pages, num_pages, W,
                               0.1352337f, dout, dlse, dst, p_precision};
    size_t ws_bytes = 0;
    const int split_keys = 512;
    ddt_verify_attn_portable_workspace(&prm, split_keys, &ws_bytes);
    void* ws = nullptr;
    cudaMalloc(&ws, ws_bytes + 16);
    // The call whose per-tile laps the table shows: the unplanned API call, or with ATTN_PROFILE_PLANNED=1 (sm_90a
    // build) a planned one, its plan made once here (the laps of what only planned calls run, e.g. S65's staging).
    void* lap_plan = nullptr;
    size_t lap_plan_bytes = 0;
#ifdef ATTN_PROFILE_SM90
    if (const char* e = std::getenv("ATTN_PROFILE_PLANNED"); e && e[0] == '1') {
      ddt_verify_attn_sm90_plan_bytes(&prm, split_keys, &lap_plan_bytes);
      cudaMalloc(&lap_plan, lap_plan_bytes);
      ddt_verify_attn_sm90_plan_cuda(&prm, split_keys, lap_plan, lap_plan_bytes, nullptr);
    }
#endif
    auto lap_call = [&] {
#ifdef ATTN_PROFILE_SM90
      if (lap_plan)
        return ddt_verify_attn_sm90_planned_cuda(&prm, split_keys, lap_plan, lap_plan_bytes, ws, ws_bytes, nullptr);
#endif
      return ATTN_ENTRY(&prm, split_keys, ws, ws_bytes, nullptr);
    };
    if (lap_call() != DDT_OK) {
      std::printf("launch failed\n");
      return 1;
    }
    cudaDeviceSynchronize();
    static long long zero[4096][16];
    cudaMemcpyToSymbol(g_attn_profile, zero, sizeof zero);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    auto event_us = [&](auto launch) {  // one launch between two events, us
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return ms * 1e3f;
    };
    const float ms = event_us([&] { lap_call(); }) * 1e-3f;
    static long long prof[4096][16];
    cudaMemcpyFromSymbol(prof, g_attn_profile, sizeof prof);
    cudaFree(lap_plan);
    long long sum[16] = {};
    for (int b = 0; b < 4096; ++b)
      for (int k = 0; k < 16; ++k) sum[k] += prof[b][k];
  // (slot 13 is 0 for the portable kernel)
    const double items = double(sum[9]), tiles = double(sum[10]);
    const int slots[] = {2, 3, 4, 5, 6, 7, 8, 11, 13};
    double per_tile = 0;
    std::printf("| %d | %d | %d | %.1f | %.0f | %.0f | %.0f |", sh.P, sh.T, sh.batch, ms * 1e3, items, tiles, sum[1] / items);
    for (int k : slots) {
      std::printf(" %.0f |", sum[k] / tiles);
      per_tile += sum[k] / tiles;
    }
    std::printf(" %.0f | %.0f |%s\n", per_tile, sum[12] / items, sum[15] > 0 ? " (TMA, 1 copy per tile)" : sum[14] > 0 ? " (TMA, 9 boxes)" : "");
#ifdef ATTN_PROFILE_SM90
    {  // Timeline: the API call, the main kernel alone, the combine alone, an empty kernel (CUDA events around
       // each, L2 flushed before each sample, median of 9). The main kernel here carries the profile stamps.
      const FlashDeviceInfo dev = device_info();
      const Bounds b = capacity_bounds(prm, split_keys);
      const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(b.items, dev.main_ctas)));
      float* ws_o = static_cast<float*>(ws);
      float* ws_ml = ws_o + b.partial_rows * kDimV;
      CUtensorMap map{};
      const int tma = encode_kv_map(&map, prm);
      CUtensorMap qmap_wide{}, qmap_narrow{};
      const int qtma = encode_q_maps(&qmap_wide, &qmap_narrow, prm);
      void* flush = nullptr;
      cudaMalloc(&flush, size_t(256) << 20);
      auto time_us = [&](auto launch) {
        std::vector<float> v;
        for (int i = 0; i < 9; ++i) {
          cudaMemsetAsync(flush, i, size_t(256) << 20);
          v.push_back(event_us(launch));
        }
        std::sort(v.begin(), v.end());
        return v[4];
      };
      const float t_api = time_us([&] { ATTN_ENTRY(&prm, split_keys, ws, ws_bytes, nullptr); });
      const float t_main = time_us([&] {
        auto* kernel = p_precision == DDT_ATTN_P_BF16 ? verify_attn_sm90_kernel<false, true>
                                                      : verify_attn_sm90_kernel<false, false>;
        kernel<<<grid, kCtaThreads, kSmemBytes>>>(prm, split_keys, ws_o, ws_ml, map, tma, 1, qmap_wide, qmap_narrow, qtma,
                                                  kv_evict_first_pays(b), nullptr, 0);
      });
      const float t_comb = time_us([&] { launch_combine(prm, split_keys, b, dev, ws_o, ws_ml, nullptr); });
      const float t_empty = time_us([&] { timeline_empty_kernel<<<1, 32>>>(); });
      std::printf("|   timeline: API %.1f us = main kernel %.1f (grid %u) + combine %.1f (%lld items); empty kernel %.1f |\n",
                  t_api, t_main, grid, t_comb, (long long)b.combine_items, t_empty);
      auto timeline = [&](const char* label, auto call) {  // Per-CTA timeline of one main-kernel launch after an L2 flush (g_attn_cta, CTAs that ran an item):
         // median / max over those CTAs of each phase, in us (clock64 at 1.98 GHz; start skew and span from
         // globaltimer, ns).
        // (One API call: the main kernel and the combine under PDL, both stamped. The call is made kCalls times,
        // each after an L2 flush, and the one of median event time is shown: a single call's stamps disagreed
        // with the timed medians before, docs/PERF_NOTES.md S29.)
        constexpr int kCalls = 5;
        static long long calls_cta[kCalls][4096][16], calls_comb[kCalls][4096][12];
        float call_t[kCalls];
        for (int i = 0; i < kCalls; ++i) {
          std::memset(calls_cta[i], 0, sizeof calls_cta[i]);
          std::memset(calls_comb[i], 0, sizeof calls_comb[i]);
          cudaMemcpyToSymbol(g_attn_cta, calls_cta[i], sizeof calls_cta[i]);
          cudaMemcpyToSymbol(g_attn_comb, calls_comb[i], sizeof calls_comb[i]);
          cudaMemsetAsync(flush, 7, size_t(256) << 20);
          call_t[i] = event_us([&] { call(); }) * 1e-3f;
          cudaMemcpyFromSymbol(calls_cta[i], g_attn_cta, sizeof calls_cta[i]);
          cudaMemcpyFromSymbol(calls_comb[i], g_attn_comb, sizeof calls_comb[i]);
        }
        int order[kCalls];
        for (int i = 0; i < kCalls; ++i) order[i] = i;
        std::sort(order, order + kCalls, [&](int a, int b) { return call_t[a] < call_t[b]; });
        const int pick = order[kCalls / 2];
        const auto& cta = calls_cta[pick];
        const auto& comb = calls_comb[pick];
        const float t = call_t[pick];
        std::printf("|   %s: %d stamped calls, event time min / median / max %.1f / %.1f / %.1f us; the median call below |\n",
                    label, kCalls, call_t[order[0]] * 1e3f, t * 1e3f, call_t[order[kCalls - 1]] * 1e3f);
        long long t0 = 0, t_end = 0;
        for (unsigned c = 0; c < grid; ++c) {
          if (t0 == 0 || cta[c][5] < t0) t0 = cta[c][5];
          t_end = std::max(t_end, cta[c][6]);
        }
        std::vector<double> col[6];
        for (unsigned c = 0; c < grid; ++c) {
          if (cta[c][1] == 0) continue;  // no item
          col[0].push_back((cta[c][5] - t0) * 1e-3);
          for (int k = 1; k <= 4; ++k) col[k].push_back((cta[c][k] - cta[c][k - 1]) / 1980.0);
          col[5].push_back((cta[c][6] - t0) * 1e-3);
        }
        auto med_max = [](std::vector<double>& v) {
          if (v.empty()) return std::string("-");
          std::sort(v.begin(), v.end());
          char buf[48];
          std::snprintf(buf, sizeof buf, "%.1f / %.1f", v[v.size() / 2], v.back());
          return std::string(buf);
        };
        // CTA c's clock64 stamp k in us after its entry (clock64 at 1.98 GHz), or -1 when it was not stamped.
        auto after_entry = [&](unsigned c, int k) { return cta[c][k] ? (cta[c][k] - cta[c][0]) / 1980.0 : -1.0; };
        // The startup in detail: median over the working CTAs of each stamp after the CTA's entry (us).
        std::vector<double> st[10];
        const int st_slot[10] = {7, 8, 1, 9, 10, 11, 2, 12, 13, 14};
        for (unsigned c = 0; c < grid; ++c) {
          if (cta[c][1] == 0) continue;
          for (int k = 0; k < 10; ++k)
            if (cta[c][st_slot[k]] != 0) st[k].push_back(after_entry(c, st_slot[k]));
        }
        std::printf("|   %s startup (us after entry, median / max): offsets checked %s, scan done %s, math first item %s; "
                    "producer: geometry %s, page check %s, published %s, Q issued %s, first slot known %s, first KV copy "
                    "issued %s; first tile landed %s |\n",
                    label, med_max(st[0]).c_str(), med_max(st[1]).c_str(), med_max(st[2]).c_str(), med_max(st[3]).c_str(),
                    med_max(st[4]).c_str(), med_max(st[7]).c_str(), med_max(st[8]).c_str(), med_max(st[9]).c_str(),
                    med_max(st[5]).c_str(), med_max(st[6]).c_str());
        if (std::getenv("ATTN_PROFILE_DUMP")) {  // the working CTAs that exit last and first, with their startup (us)
          std::vector<unsigned> by_exit;
          for (unsigned c = 0; c < grid; ++c)
            if (cta[c][1] != 0) by_exit.push_back(c);
          std::sort(by_exit.begin(), by_exit.end(), [&](unsigned a, unsigned b) { return cta[a][6] > cta[b][6]; });
          for (size_t i = 0; i < by_exit.size(); ++i) {
            if (i >= 6 && i + 3 < by_exit.size()) continue;  // (the 6 last and the 3 first)
            const unsigned c = by_exit[i];
            std::printf("|   %s CTA %u (exit rank %zu): entry %.1f, published %.1f, Q issued %.1f, first KV copy issued "
                        "%.1f, first tile landed %.1f, last item done %.1f, exit %.1f (us after the first entry: entry "
                        "and exit; after its own entry: the rest) |\n",
                        label, c, i, (cta[c][5] - t0) * 1e-3, after_entry(c, 12), after_entry(c, 13),
                        after_entry(c, 11), after_entry(c, 2), after_entry(c, 3), (cta[c][6] - t0) * 1e-3);
          }
        }
        // The combine after the main kernel (globaltimer ns, relative to the main kernel's first entry).
        long long c_in = 0, c_w0 = 0, c_w1 = 0, c_out = 0;
        int c_n = 0;
        for (int c = 0; c < 4096; ++c) {
          if (comb[c][0] == 0) continue;
          ++c_n;
          c_in = c_in == 0 ? comb[c][0] : std::min(c_in, comb[c][0]);
          if (comb[c][1]) {
            c_w0 = c_w0 == 0 ? comb[c][1] : std::min(c_w0, comb[c][1]);
            c_w1 = std::max(c_w1, comb[c][1]);
          }
          c_out = std::max(c_out, comb[c][2]);
        }
        if (c_n > 0)
          std::printf("|   %s call timeline (us after the main kernel's first entry): main last exit %.1f; combine (%d CTAs) "
                      "first entry %.1f, past pdl_wait %.1f .. %.1f, last exit %.1f; event time %.1f |\n",
                      label, (t_end - t0) * 1e-3, c_n, (c_in - t0) * 1e-3, (c_w0 - t0) * 1e-3, (c_w1 - t0) * 1e-3,
                      (c_out - t0) * 1e-3, t * 1e3);
        {  // The combine's first item in detail (CTA schedule): median / max over the CTAs of each stamp, us after
           // the CTA's own pdl_wait return.
          std::vector<double> cd[6];
          for (int c = 0; c < 4096; ++c) {
            if (comb[c][1] == 0 || comb[c][3] == 0) continue;
            for (int k = 0; k < 5; ++k)
              if (comb[c][3 + k]) cd[k].push_back((comb[c][3 + k] - comb[c][1]) * 1e-3);
            cd[5].push_back((comb[c][2] - comb[c][1]) * 1e-3);
          }
          if (!cd[0].empty())
            std::printf("|   %s combine first item (%zu CTAs; us after each CTA's pdl_wait, median / max): located %s, "
                        "M done %s, warp 0's chain done %s, all chains done %s, written %s, exit %s |\n",
                        label, cd[0].size(), med_max(cd[0]).c_str(), med_max(cd[1]).c_str(), med_max(cd[2]).c_str(),
                        med_max(cd[3]).c_str(), med_max(cd[4]).c_str(), med_max(cd[5]).c_str());
        }
        {  // The combine's prologue before its pdl_wait (CTA schedule and warp schedule alike): us after each CTA's
           // entry, median / max; and its CTAs that entered after the main kernel's last exit (placed on SMs the
           // main kernel freed last: their prologue is not hidden under it).
          std::vector<double> pr[5];
          int late = 0, n = 0;
          for (int c = 0; c < 4096; ++c) {
            if (comb[c][0] == 0) continue;
            ++n;
            late += comb[c][0] > t_end;
            const int slots[5] = {8, 9, 10, 11, 1};
            for (int k = 0; k < 5; ++k)
              if (comb[c][slots[k]]) pr[k].push_back((comb[c][slots[k]] - comb[c][0]) * 1e-3);
          }
          if (n > 0)
            std::printf("|   %s combine prologue (us after each CTA's entry, median / max): plan header %s, offsets checked %s, "
                        "scan done %s, first item located %s, past pdl_wait %s; %d of %d CTAs entered after the main "
                        "kernel's last exit |\n",
                        label, med_max(pr[0]).c_str(), med_max(pr[1]).c_str(), med_max(pr[2]).c_str(),
                        med_max(pr[3]).c_str(), med_max(pr[4]).c_str(), late, n);
        }
        const size_t working = col[0].size();
        std::printf("|   %s CTA timeline (%zu CTAs with items of %u; us, median / max): start skew %s, entry -> first item %s, "
                    "-> first tile landed %s, -> last item done %s, -> exit %s; exit %s after the first entry; span "
                    "%.1f us; event time %.1f us |\n",
                    label, working, grid, med_max(col[0]).c_str(), med_max(col[1]).c_str(), med_max(col[2]).c_str(),
                    med_max(col[3]).c_str(), med_max(col[4]).c_str(), med_max(col[5]).c_str(), (t_end - t0) * 1e-3,
                    t * 1e3);
      };
      timeline("unplanned", [&] { ATTN_ENTRY(&prm, split_keys, ws, ws_bytes, nullptr); });
      {  // The planned call (ddt_verify_attn_sm90_planned_cuda) with the step's plan made beforehand.
        size_t plan_bytes = 0;
        ddt_verify_attn_sm90_plan_bytes(&prm, split_keys, &plan_bytes);
        void* plan = nullptr;
        cudaMalloc(&plan, plan_bytes);
        ddt_verify_attn_sm90_plan_cuda(&prm, split_keys, plan, plan_bytes, nullptr);
        const float t_planned = time_us(
            [&] { ddt_verify_attn_sm90_planned_cuda(&prm, split_keys, plan, plan_bytes, ws, ws_bytes, nullptr); });
        std::printf("|   planned API call %.1f us |\n", t_planned);
        timeline("planned", [&] { ddt_verify_attn_sm90_planned_cuda(&prm, split_keys, plan, plan_bytes, ws, ws_bytes, nullptr); });
        cudaFree(plan);
      }
      cudaFree(flush);
    }
#endif
    uint32_t st = 1;
    cudaMemcpy(&st, dst, 4, cudaMemcpyDeviceToHost);
    if (st != 0 || cudaGetLastError() != cudaSuccess) { std::printf("status %u / CUDA error\n", st); return 1; }
    for (void* ptr : {(void*)dkv, (void*)dq, (void*)dpt, (void*)dpre, (void*)doff, (void*)dvis, (void*)dout, (void*)dlse,
                      (void*)dst, ws})
      cudaFree(ptr);
  }
  std::printf("(cycles at ~1.98 GHz, warp 0's view, summed over CTAs and divided by tiles or items)\n");
  return 0;
}
