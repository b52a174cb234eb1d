// CPU twin of the DDTree best-first tree builder (reference/ddtree.md, exactly): a binary heap, one
// request after another. Also the single-threaded CPU baseline the benchmark compares against.
#include <cstdint>
#include <queue>
#include <vector>

#include "kernels/common/numerics.h"
#include "kernels/common/tree_layout.h"
#include "kernels/common/validate.h"

using namespace ddtree;

namespace {
struct Item {
  uint64_t key;      // item_key(score, seq): the heap order
  uint32_t payload;  // pack_item(parent, depth, rank)
  bool operator<(const Item& o) const { return key < o.key; }  // std::priority_queue pops the max
};
}  // namespace

extern "C" int ddt_tree_build_cpu(const ddt_tree_build_params* p) {
  if (int rc = kern::validate(p)) return rc;
  const int N = kern::tree_width(p->budget), W = kern::vis_words(N), L = p->depth, K = p->k;
  std::vector<int32_t> last_child(N);
  for (int b = 0; b < p->batch; ++b) {
    const float* lp = p->logprobs + int64_t(b) * L * K;
    const int32_t* ids = p->token_ids + int64_t(b) * L * K;
    int32_t* tok = p->tokens + int64_t(b) * N;
    int32_t* par = p->parents + int64_t(b) * N;
    int32_t* dep = p->depths + int64_t(b) * N;
    float* score = p->scores + int64_t(b) * N;
    int32_t* fc = p->first_child + int64_t(b) * N;
    int32_t* ns = p->next_sibling + int64_t(b) * N;
    bool nan = false;
    // A log-prob is pushable when > -inf; NaN is not (and is flagged).
    auto pushable = [&](float v) { nan |= num::is_nan(v); return v > num::kNegInf; };

    for (int i = 0; i < N; ++i) { fc[i] = -1; ns[i] = -1; last_child[i] = -1; }
    tok[0] = p->root_tokens[b]; par[0] = -1; dep[0] = 0; score[0] = 0.0f;
    std::priority_queue<Item> heap;
    uint32_t seq = 0;
    int n = 0;
    if (pushable(lp[0])) heap.push({kern::item_key(lp[0], seq++), kern::pack_item(0, 1, 0)});
    while (n < p->budget && !heap.empty()) {
      const Item it = heap.top();
      heap.pop();
      const float s = num::key_value(it.key);
      const int pa = kern::item_parent(it.payload), d = kern::item_depth(it.payload), r = kern::item_rank(it.payload);
      const int i = ++n;
      tok[i] = ids[(d - 1) * K + r]; par[i] = pa; dep[i] = d; score[i] = s;
      if (last_child[pa] < 0) fc[pa] = i; else ns[last_child[pa]] = i;
      last_child[pa] = i;
      if (r + 1 < K && pushable(lp[(d - 1) * K + r + 1]))
        heap.push({kern::item_key(DDT_ADD(score[pa], lp[(d - 1) * K + r + 1]), seq++), kern::pack_item(pa, d, r + 1)});
      if (d < L && pushable(lp[d * K]))
        heap.push({kern::item_key(DDT_ADD(s, lp[d * K]), seq++), kern::pack_item(i, d + 1, 0)});
    }
    if (nan) *p->status |= DDT_DATA_NAN_LOGIT;
    for (int i = n + 1; i < N; ++i) {  // padding: unreachable, visible to the root and itself
      tok[i] = tok[0]; par[i] = -1; dep[i] = 1; score[i] = num::kNegInf;
    }
    const int32_t P = p->prefix_lens[b];
    for (int i = 0; i < N; ++i) {
      p->slots[int64_t(b) * N + i] = P + i;
      p->positions[int64_t(b) * N + i] = P + dep[i];
      kern::write_vis_row(par, i, W, p->vis + (int64_t(b) * N + i) * W);
    }
    p->node_count[b] = n + 1;
  }
  return DDT_OK;
}
