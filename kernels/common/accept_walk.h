// The accept walk, one definition for the CPU twin and the CUDA kernel (which supplies a warp-parallel
// child search; lane 0 runs the rest). reference/ddtree.md: from the root follow the child whose token is
// the node's target token; emit the path's tokens and then the bonus (the target token at the last
// accepted node); a stop token ends the output (inclusive); max_new truncates.
#pragma once

#include <stdint.h>

#include "ddtree/kernels.h"
#include "kernels/common/numerics.h"

namespace ddtree::kern {

struct AcceptOut {
  int32_t* path;        // [max_path]
  int32_t* new_tokens;  // [max_path]
};

// Target token of node `i` of request `b`, or -1 when its key is empty (0: no logits were reduced).
DDT_HD int32_t target_token(const ddt_accept_params* p, int b, int i) {
  const uint64_t key = p->keys[int64_t(b) * p->n + i];
  return key == 0 ? -1 : int32_t(num::key_id(key));
}

// Walks request b. find_child(cur, count, target) -> the accepted child index or -1. Returns the data
// status bits to OR in (DDT_DATA_BAD_INDEX for a malformed tree or an empty key: the request's outputs
// are then an empty result, path = {0}, num_new = 0, bonus = -1).
template <class FindChild>
DDT_HD uint32_t accept_walk(const ddt_accept_params* p, int b, FindChild&& find_child, AcceptOut out) {
  for (int j = 0; j < p->max_path; ++j) { out.path[j] = -1; out.new_tokens[j] = -1; }
  out.path[0] = 0;
  p->path_len[b] = 1; p->num_new[b] = 0; p->bonus[b] = -1; p->finished[b] = 0;
  const int count = p->node_count[b];
  const int32_t* tok = p->tokens + int64_t(b) * p->n;
  if (count < 1 || count > p->n) { p->finished[b] = 3; return DDT_DATA_BAD_INDEX; }
  int cur = 0, len = 1;
  int32_t target = target_token(p, b, 0);
  if (target < 0) { p->finished[b] = 3; return DDT_DATA_BAD_INDEX; }
  while (len < p->max_path) {
    const int c = find_child(cur, count, target);
    if (c < 0) break;
    out.path[len++] = c;
    cur = c;
    target = target_token(p, b, cur);
    if (target < 0) {
      for (int j = 1; j < len; ++j) out.path[j] = -1;
      p->finished[b] = 3;
      return DDT_DATA_BAD_INDEX;
    }
  }
  // Emitted: tok[path[1..len)] then the bonus; truncated by stop tokens (inclusive) and max_new.
  int emitted = 0, finished = 0;
  const int limit = p->max_new[b] < 0 ? 0 : p->max_new[b];
  for (int j = 1; j <= len && !finished; ++j) {
    if (emitted >= limit) { finished = 2; break; }
    const int32_t x = (j < len) ? tok[out.path[j]] : target;
    out.new_tokens[emitted++] = x;
    for (int s = 0; s < p->num_stop; ++s)
      if (p->stop_ids[s] == x) { finished = 1; break; }
    if (!finished && emitted >= limit) finished = 2;
  }
  p->path_len[b] = len;
  p->num_new[b] = emitted;
  p->bonus[b] = target;
  p->finished[b] = finished;
  return 0;
}

}  // namespace ddtree::kern
