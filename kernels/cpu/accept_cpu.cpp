// CPU twin of the accept kernels (kernels/cuda/accept.cu): per-node packed target keys (greedy or
// Gumbel-max sampled) and the tree walk (reference/ddtree.md "Greedy accept" / "Lossless sampling").
#include <cstdint>

#include "kernels/common/accept_walk.h"
#include "kernels/common/numerics.h"
#include "kernels/common/validate.h"

using namespace ddtree;

extern "C" int ddt_sample_keys_cpu(const ddt_sample_keys_params* p) {
  if (int rc = kern::validate(p)) return rc;
  const int64_t rows = int64_t(p->batch) * p->nodes;
  bool nan = false;
  for (int64_t row = 0; row < rows; ++row) {
    const float* x = p->logits + row * p->ld;
    const int64_t out_pos = int64_t(p->positions[row]) + 1;  // position of the token being sampled
    const uint64_t seed = p->temperature > 0.0f ? p->seeds[row / p->nodes] : 0;
    uint64_t best = 0;
    for (int v = 0; v < p->vocab; ++v) {
      nan |= num::is_nan(x[v]);
      const uint32_t id = uint32_t(p->vocab_offset + v);
      const uint64_t key = num::pack_key(num::sample_value(x[v], p->temperature, seed, out_pos, id), id);
      if (key > best) best = key;
    }
    p->out_keys[row] = best;
  }
  if (nan) *p->status |= DDT_DATA_NAN_LOGIT;
  return DDT_OK;
}

extern "C" int ddt_accept_cpu(const ddt_accept_params* p) {
  if (int rc = kern::validate(p)) return rc;
  for (int b = 0; b < p->batch; ++b) {
    const int64_t t = int64_t(b) * p->n;
    kern::AcceptOut out{p->path + int64_t(b) * p->max_path, p->new_tokens + int64_t(b) * p->max_path};
    // Follow the child (lowest index first, i.e. pop order) whose token equals the node's target token.
    auto find_child = [&](int cur, int count, int32_t target) {
      for (int j = cur + 1; j < count; ++j)
        if (p->parents[t + j] == cur && p->tokens[t + j] == target) return j;
      return -1;
    };
    const uint32_t bad = kern::accept_walk(p, b, find_child, out);
    if (bad) *p->status |= bad;
  }
  return DDT_OK;
}
