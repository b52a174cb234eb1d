// ddtree-demo: one DDTree speculative step of the foundation kernels on the chosen backend, end to end:
// draft logits -> top-K (vocabulary-sharded, combined) -> best-first tree -> target keys -> accept walk.
// The drafts and target logits are synthetic (the model arrives with the engine), the kernels are real.
//
// usage: ddtree-demo [--backend auto|cpu|cuda] [--batch B] [--budget N] [--depth L] [--vocab V]
//                    [--shards S] [--temperature T] [--seed X]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ddtree/kernels.h"
#if DDTREE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ddtree::demo {

struct StepConfig {
  int batch = 2, budget = 32, depth = 6, vocab = 2048, shards = 2;
  float temperature = 0.0f;
  uint64_t seed = 1;
};

// Memory of one backend: host vectors for cpu, device allocations for cuda (no allocation inside steps).
struct Mem {
  bool cuda;
  std::vector<void*> owned;
  void* alloc(size_t bytes) {
    void* p = nullptr;
#if DDTREE_HAVE_CUDA
    if (cuda) { if (cudaMalloc(&p, bytes) != cudaSuccess) die("cudaMalloc"); owned.push_back(p); return p; }
#endif
    p = std::calloc(1, bytes);
    owned.push_back(p);
    return p;
  }
  template <class T> T* put(const std::vector<T>& h) {
    T* p = static_cast<T*>(alloc(h.size() * sizeof(T) + 16));
    copy(p, h.data(), h.size() * sizeof(T));
    return p;
  }
  template <class T> std::vector<T> get(const T* p, size_t n) {
    std::vector<T> h(n);
    copy(h.data(), p, n * sizeof(T));
    return h;
  }
  void copy(void* dst, const void* src, size_t bytes) {
#if DDTREE_HAVE_CUDA
    if (cuda) { if (cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) != cudaSuccess) die("cudaMemcpy"); return; }
#endif
    std::memcpy(dst, src, bytes);
  }
  [[noreturn]] static void die(const char* what) { std::fprintf(stderr, "ddtree-demo: %s failed\n", what); std::exit(1); }
  ~Mem() {
    for (void* p : owned) {
#if DDTREE_HAVE_CUDA
      if (cuda) { cudaFree(p); continue; }
#endif
      std::free(p);
    }
  }
};

#define DEMO_OK(call)                                                                            \
  do {                                                                                           \
    const int rc_ = (call);                                                                      \
    if (rc_ != DDT_OK) {                                                                         \
      std::fprintf(stderr, "ddtree-demo: %s: %s\n", ddt_status_string(rc_), ddt_last_error_message()); \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

int run_step(const StepConfig& c, bool cuda) {
  if (c.shards < 1 || c.shards > 64 || c.vocab < c.shards) { std::fprintf(stderr, "ddtree-demo: bad --shards\n"); return 2; }
  Mem m{cuda, {}};
  auto call = [&](auto cpu_fn, auto cuda_fn, const auto* params) {
    return cuda ? cuda_fn(params, nullptr) : cpu_fn(params);
  };
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int rows = c.batch * c.depth, K = std::min(c.budget, c.vocab), N = c.budget + 1, W = (N + 63) / 64;
  uint32_t* status = m.put(std::vector<uint32_t>{0});
  // 1. Draft logits per vocabulary shard -> per-shard top-K -> combined global top-K log-probs.
  std::vector<float> draft(size_t(rows) * c.vocab);
  for (auto& x : draft) x = nd(rng);
  float* vals = static_cast<float*>(m.alloc(sizeof(float) * c.shards * rows * K));
  int32_t* ids = static_cast<int32_t*>(m.alloc(sizeof(int32_t) * c.shards * rows * K));
  float* lse = static_cast<float*>(m.alloc(sizeof(float) * c.shards * rows));
  for (int s = 0, off = 0; s < c.shards; ++s) {
    const int w = s == c.shards - 1 ? c.vocab - off : c.vocab / c.shards;
    std::vector<float> part(size_t(rows) * w);
    for (int r = 0; r < rows; ++r) std::memcpy(&part[size_t(r) * w], &draft[size_t(r) * c.vocab + off], w * 4);
    ddt_topk_shard_params tp{m.put(part), w, rows, w, off, K, vals + size_t(s) * rows * K, ids + size_t(s) * rows * K,
                             lse + size_t(s) * rows, status};
    DEMO_OK(call(ddt_topk_shard_cpu, ddt_topk_shard_cuda, &tp));
    off += w;
  }
  float* lp = static_cast<float*>(m.alloc(sizeof(float) * rows * K));
  int32_t* gid = static_cast<int32_t*>(m.alloc(sizeof(int32_t) * rows * K));
  ddt_topk_combine_params cp{vals, ids, lse, c.shards, rows, K, lp, gid};
  DEMO_OK(call(ddt_topk_combine_cpu, ddt_topk_combine_cuda, &cp));
  // 2. Trees.
  std::vector<int32_t> roots(c.batch, 1), prefix(c.batch);
  for (int b = 0; b < c.batch; ++b) prefix[b] = 100 * (b + 1);
  auto i32 = [&](size_t n) { return static_cast<int32_t*>(m.alloc(n * 4)); };
  int32_t *tok = i32(size_t(c.batch) * N), *par = i32(size_t(c.batch) * N), *dep = i32(size_t(c.batch) * N),
          *slot = i32(size_t(c.batch) * N), *pos = i32(size_t(c.batch) * N), *fc = i32(size_t(c.batch) * N),
          *ns = i32(size_t(c.batch) * N), *cnt = i32(c.batch);
  float* score = static_cast<float*>(m.alloc(sizeof(float) * c.batch * N));
  uint64_t* vis = static_cast<uint64_t*>(m.alloc(sizeof(uint64_t) * c.batch * N * W));
  ddt_tree_build_params bp{lp, gid, m.put(roots), m.put(prefix), c.batch, c.depth, K, c.budget, tok, par, dep, score,
                           slot, pos, vis, fc, ns, cnt, status};
  DEMO_OK(call(ddt_tree_build_cpu, ddt_tree_build_cuda, &bp));
  // 3. Target logits (synthetic: each node's first child is favoured 80% of the time) -> keys -> accept.
  auto h_tok = m.get(tok, size_t(c.batch) * N), h_fc = m.get(fc, size_t(c.batch) * N), h_cnt = m.get(cnt, c.batch);
  auto h_par = m.get(par, size_t(c.batch) * N);
  auto h_score = m.get(score, size_t(c.batch) * N);
  std::vector<float> target(size_t(c.batch) * N * c.vocab);
  for (auto& x : target) x = nd(rng) / 3.0f;
  std::uniform_real_distribution<float> u(0, 1);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < h_cnt[b]; ++i)
      if (h_fc[size_t(b) * N + i] >= 0 && u(rng) < 0.8f)
        target[(size_t(b) * N + i) * c.vocab + h_tok[size_t(b) * N + h_fc[size_t(b) * N + i]]] = 8.0f;
  std::vector<uint64_t> seeds(c.batch, c.seed);
  uint64_t* keys = static_cast<uint64_t*>(m.alloc(sizeof(uint64_t) * c.batch * N));
  ddt_sample_keys_params kp{m.put(target), c.vocab, c.batch, N, c.vocab, 0, pos, m.put(seeds), c.temperature, keys, status};
  DEMO_OK(call(ddt_sample_keys_cpu, ddt_sample_keys_cuda, &kp));
  const int mp = c.depth + 1;
  int32_t *path = i32(size_t(c.batch) * mp), *nt = i32(size_t(c.batch) * mp), *pl = i32(c.batch), *nn = i32(c.batch),
          *bo = i32(c.batch), *fi = i32(c.batch);
  ddt_accept_params ap{keys, tok, par, cnt, c.batch, N, mp, m.put(std::vector<int32_t>(c.batch, 1 << 20)), nullptr, 0,
                       path, pl, nt, nn, bo, fi, status};
  DEMO_OK(call(ddt_accept_cpu, ddt_accept_cuda, &ap));
  auto h_path = m.get(path, size_t(c.batch) * mp), h_nt = m.get(nt, size_t(c.batch) * mp);
  auto h_pl = m.get(pl, c.batch), h_nn = m.get(nn, c.batch);
  const uint32_t h_status = m.get(status, 1)[0];
  std::printf("ddtree-demo: backend %s, batch %d, budget %d, depth %d, vocab %d in %d shards, temperature %g\n",
              cuda ? "cuda" : "cpu", c.batch, c.budget, c.depth, c.vocab, c.shards, c.temperature);
  for (int b = 0; b < c.batch; ++b) {
    std::printf("request %d: tree of %d nodes; first nodes (index:token<-parent score):", b, h_cnt[b]);
    for (int i = 1; i < std::min(h_cnt[b], 9); ++i)
      std::printf(" %d:%d<-%d %.2f", i, h_tok[size_t(b) * N + i], h_par[size_t(b) * N + i], h_score[size_t(b) * N + i]);
    std::printf("\n  accepted path:");
    for (int j = 0; j < h_pl[b]; ++j) std::printf(" %d", h_path[size_t(b) * mp + j]);
    std::printf("  -> %d new tokens:", h_nn[b]);
    for (int j = 0; j < h_nn[b]; ++j) std::printf(" %d", h_nt[size_t(b) * mp + j]);
    std::printf("\n");
  }
  std::printf("data status word: 0x%x\n", h_status);
  return h_status == 0 ? 0 : 1;
}

}  // namespace ddtree::demo

int main(int argc, char** argv) {
  ddtree::demo::StepConfig cfg;
  std::string backend = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "ddtree-demo: %s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--backend") backend = next();
    else if (a == "--batch") cfg.batch = std::atoi(next());
    else if (a == "--budget") cfg.budget = std::atoi(next());
    else if (a == "--depth") cfg.depth = std::atoi(next());
    else if (a == "--vocab") cfg.vocab = std::atoi(next());
    else if (a == "--shards") cfg.shards = std::atoi(next());
    else if (a == "--temperature") cfg.temperature = float(std::atof(next()));
    else if (a == "--seed") cfg.seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--help" || a == "-h") {
      std::printf("usage: ddtree-demo [--backend auto|cpu|cuda] [--batch B] [--budget N] [--depth L] [--vocab V]\n"
                  "                   [--shards S] [--temperature T] [--seed X]\n");
      return 0;
    } else { std::fprintf(stderr, "ddtree-demo: unknown argument %s (see --help)\n", a.c_str()); return 2; }
  }
  if (backend == "auto") backend = ddt_cuda_available() ? "cuda" : "cpu";
  if (backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "ddtree-demo: --backend must be auto, cpu or cuda\n");
    return 2;
  }
  if (backend == "cuda" && !ddt_cuda_available()) {
    std::fprintf(stderr, "ddtree-demo: --backend cuda, but %s\n", ddt_status_string(DDT_ERR_NO_CUDA));
    return 2;
  }
  return ddtree::demo::run_step(cfg, backend == "cuda");
}
