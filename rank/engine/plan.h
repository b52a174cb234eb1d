// The host step plan: what rank 0's scheduler decided for one step, sent to every rank over MPI before the
// step runs (ARCHITECTURE.md "One speculative step", 1). Every rank holds the same per-request state, so a
// plan only carries what rank 0 alone knows: new requests (their whole spec, prompt included), requests
// to drop (cancelled by a client), which requests run this step, and the committed KV length each one must
// have (a cheap check that the ranks' states have not diverged).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddtree::engine {

enum class Mode : int32_t { kAutoregressive = 1, kChain = 2, kTree = 3 };
enum class DrafterKind : int32_t { kNone = 0, kNgram = 1, kOracle = 2 };
const char* mode_name(Mode m);
const char* drafter_name(DrafterKind d);

// Everything every rank needs to know about a request, fixed at admission.
struct RequestSpec {
  int32_t slot = -1;                // row of the KV page table (unique among live requests)
  std::vector<int32_t> prompt;      // >= 1 token ids
  int32_t max_new = 1;              // tokens to generate at most (>= 1)
  float temperature = 0.0f;         // 0 = greedy
  uint64_t seed = 0;
  Mode mode = Mode::kAutoregressive;
  DrafterKind drafter = DrafterKind::kNone;
  int32_t depth = 1;                // draft positions per step (chain / tree), 1..DDT_MAX_DEPTH
  int32_t budget = 1;               // tree nodes besides the root (tree)
  std::vector<int32_t> stop_ids;    // eos ids included unless the client asked to ignore eos
  bool return_logits = false;       // test option: gather each emitted token's full logits to rank 0
  std::vector<int32_t> reference;   // oracle drafter: the reference continuation

  // Tree width N of a decode step: 1 (autoregressive), depth + 1 (chain), budget + 1 (tree).
  int width() const;
  // Draft positions (0 for autoregressive) and candidates per position (K = 1 for a chain, min(B, V)).
  int draft_depth() const { return mode == Mode::kAutoregressive ? 0 : depth; }
  int topk(int64_t vocab) const;
  // Most KV slots the request can ever need: prompt + max_new + one tree.
  int64_t worst_case_tokens() const { return int64_t(prompt.size()) + max_new + width(); }
};

struct StepPlan {
  uint64_t step = 0;
  bool shutdown = false;              // every rank leaves its loop (no step runs)
  std::vector<RequestSpec> admit;     // new requests (their first step is in `batch`)
  std::vector<int32_t> release;       // slots dropped before this step (client cancelled)
  std::vector<int32_t> batch;         // slots that run this step, in order
  std::vector<int64_t> prefix;        // [batch] committed KV length of each (0 = prefill step)
};

class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> serialize(const StepPlan& p);
// Throws PlanError for a truncated or malformed buffer.
StepPlan deserialize(const std::vector<uint8_t>& bytes);

}  // namespace ddtree::engine
