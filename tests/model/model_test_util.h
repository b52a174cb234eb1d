// Helpers for the cpu-backend model tests: the generated fixture checkpoints (tools/gen_checkpoint.py, made
// by the ctest fixture `model_checkpoints`), scratch directories, bitwise comparison, plain runs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "rank/model/model.h"

namespace ddtree::model::test {

namespace fs = std::filesystem;

// DDTREE_TEST_MODEL_MOE / _DENSE point at the generated checkpoints (config a: MoE, q LoRA, YaRN, real
// latent dims, 3 bf16 shards; config b: dense, q_proj, plain RoPE, tied, one f32 file).
// ctest passes one directory, DDTREE_TEST_MODELS (holding moe/ and dense/): gtest_discover_tests cannot
// carry a list of environment variables.
inline std::string fixture(const char* which) {
  if (const char* v = std::getenv(which)) return v;
  const char* root = std::getenv("DDTREE_TEST_MODELS");
  if (!root) return std::string();
  return std::string(root) + (std::string(which) == "DDTREE_TEST_MODEL_MOE" ? "/moe" : "/dense");
}
#define REQUIRE_FIXTURE(var, env)                                                          \
  const std::string var = ::ddtree::model::test::fixture(env);                             \
  if (var.empty()) GTEST_SKIP() << env " not set (ctest sets it; run through ctest)";

// A fresh scratch directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("ddtree_model_test_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

inline void copy_dir(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

inline bool bitwise_equal(const float* a, const float* b, std::size_t n, std::size_t* first_diff = nullptr) {
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first_diff) *first_diff = i;
      return false;
    }
  return true;
}

// max over rows of ||a - b|| / ||b|| (rows of length n).
inline double max_rel_err(const float* a, const float* b, std::size_t rows, std::size_t n) {
  double worst = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double d = 0, nb = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double x = double(a[r * n + i]) - double(b[r * n + i]);
      d += x * x;
      nb += double(b[r * n + i]) * double(b[r * n + i]);
    }
    worst = std::max(worst, std::sqrt(d) / std::sqrt(nb));
  }
  return worst;
}

inline std::vector<int32_t> random_tokens(uint64_t seed, int n, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, vocab - 1);
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = int32_t(u(rng));
  return t;
}

// Logits [n, vocab_local] of a causal prefill of `tokens` into a fresh cache (one request, one chunk).
inline std::vector<float> prefill_logits(const Model& m, const std::vector<int32_t>& tokens, int page_size = 16) {
  const int pages = int((tokens.size() + std::size_t(page_size) - 1) / std::size_t(page_size)) + 1;
  kv::LatentKvCache cache(m.kv_shape(page_size, pages, 1, pages));
  cache.reserve(0, int64_t(tokens.size()));
  RequestRows rr;
  rr.n = int(tokens.size());
  rr.tokens = tokens.data();
  ForwardResult out;
  m.forward({rr}, cache, out);
  return out.logits;
}

}  // namespace ddtree::model::test
