// CPU twin of the top-K kernels (kernels/cuda/topk.cu): plain and obviously right; the cpu backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/numerics.h"
#include "kernels/common/topk_math.h"
#include "kernels/common/validate.h"

using namespace ddtree;

extern "C" int ddt_topk_shard_cpu(const ddt_topk_shard_params* p) {
  if (int rc = kern::validate(p)) return rc;
  std::vector<uint64_t> keys;
  for (int r = 0; r < p->rows; ++r) {
    const float* x = p->logits + int64_t(r) * p->ld;
    // Composite key per column: (order bits of the logit, NaN as -inf) << 32 | (0xFFFFFFFF - column):
    // sorting composites descending is sorting by (logit desc, id asc).
    keys.resize(p->vocab);
    float m = num::kNegInf;
    bool nan = false;
    for (int v = 0; v < p->vocab; ++v) {
      nan |= num::is_nan(x[v]);
      keys[v] = num::pack_key(x[v], uint32_t(v));
      if (!num::is_nan(x[v]) && x[v] > m) m = x[v];
    }
    if (nan || m == -num::kNegInf) *p->status |= DDT_DATA_NAN_LOGIT;  // NaN or +inf logit
    uint64_t sum = 0;  // exact integer sum: order-free
    if (m != num::kNegInf)
      for (int v = 0; v < p->vocab; ++v) sum += kern::exp_fixed(x[v], m);
    p->out_lse[r] = kern::finish_lse(m, sum);
    const int take = std::min(p->k, p->vocab);
    std::partial_sort(keys.begin(), keys.begin() + take, keys.end(), std::greater<uint64_t>());
    for (int j = 0; j < p->k; ++j) {
      const int64_t o = int64_t(r) * p->k + j;
      if (j < take) {
        p->out_values[o] = num::key_value(keys[j]);
        p->out_ids[o] = p->vocab_offset + int32_t(num::key_id(keys[j]));
      } else {
        p->out_values[o] = num::kNegInf;
        p->out_ids[o] = -1;
      }
    }
  }
  return DDT_OK;
}

extern "C" int ddt_topk_combine_cpu(const ddt_topk_combine_params* p) {
  if (int rc = kern::validate(p)) return rc;
  std::vector<uint64_t> cand;
  for (int r = 0; r < p->rows; ++r) {
    float m = num::kNegInf;
    for (int s = 0; s < p->shards; ++s) m = std::max(m, p->lse[int64_t(s) * p->rows + r]);
    uint64_t sum = 0;
    if (m != num::kNegInf)
      for (int s = 0; s < p->shards; ++s) sum += kern::exp_fixed(p->lse[int64_t(s) * p->rows + r], m);
    const float lse = kern::finish_lse(m, sum);
    cand.clear();
    for (int s = 0; s < p->shards; ++s)
      for (int j = 0; j < p->k; ++j) {
        const int64_t i = (int64_t(s) * p->rows + r) * p->k + j;
        if (p->ids[i] >= 0) cand.push_back(num::pack_key(p->values[i], uint32_t(p->ids[i])));
      }
    const int take = std::min<int>(p->k, int(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + take, cand.end(), std::greater<uint64_t>());
    for (int j = 0; j < p->k; ++j) {
      const int64_t o = int64_t(r) * p->k + j;
      if (j < take) {
        p->out_logprobs[o] = kern::logprob(num::key_value(cand[j]), lse);
        p->out_ids[o] = int32_t(num::key_id(cand[j]));
      } else {
        p->out_logprobs[o] = num::kNegInf;
        p->out_ids[o] = -1;
      }
    }
  }
  return DDT_OK;
}
