// Drafters: what proposes the per-position token distributions a speculative step builds its tree from.
//
// One interface for every drafter (model-free ones here; the DFlash block drafter later): given a request's
// context, fill per-draft-position logits over this rank's vocabulary shard [vocab0, vocab1). Positions a
// drafter has no opinion about stay -inf (the tree builder never expands a -inf candidate, so a row of -inf
// ends the tree at that depth). The engine then runs ddt_topk_shard on every rank, gathers the shard lists
// to rank 0 and combines them (ddt_topk_combine) before ddt_tree_build: exactly the path a sharded model
// drafter takes, so the speculative loop does not change when one arrives.
//
// Drafters run on every rank with the same inputs (the context is replicated: every rank sees the prompt
// in the step plan and every accepted token in the broadcast accept decisions) and must be deterministic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddtree::draft {

// What a drafter may look at for one request and one step.
struct DraftContext {
  const std::vector<int32_t>* tokens = nullptr;     // prompt + generated so far; the last one is the root
                                                    // (the bonus token whose successors are drafted)
  int64_t prompt_len = 0;                           // tokens[0, prompt_len) are the prompt
  uint64_t seed = 0;                                // the request's sampling seed
  const std::vector<int32_t>* reference = nullptr;  // oracle only: the reference continuation (generated
                                                    // tokens of an autoregressive run), else null
};

// Where a drafter writes: logits[depth, vocab1 - vocab0] for draft positions 1..depth after the root, over
// the vocabulary shard [vocab0, vocab1). The engine fills it with -inf before the call.
struct DraftShard {
  float* logits = nullptr;
  int depth = 0;
  int64_t vocab0 = 0, vocab1 = 0;
  int64_t vocab_size = 0;  // the full vocabulary
  int k = 1;               // candidates per position the tree will use (K of the top-K)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  virtual void draft(const DraftContext& ctx, const DraftShard& out) const = 0;
};

// Prompt lookup (vLLM's / SGLang's / TGI's n-gram speculator): the longest suffix of the context (at most
// max_ngram, at least min_ngram tokens) that also occurs earlier; every earlier occurrence votes for the
// tokens that followed it at each draft depth, logit = log(votes). Several occurrences with different
// continuations give several candidates, so a tree branches where the context offers alternatives.
struct NgramOptions {
  int min_ngram = 1;
  int max_ngram = 4;
  int max_matches = 64;       // most recent occurrences considered
  int64_t window = 4096;      // only the last `window` tokens are searched
};
std::unique_ptr<Drafter> make_ngram_drafter(const NgramOptions& o = {});

// Tests and benchmarks only. Knows the reference continuation and, at draft depth d, places the true token
// at rank r of its K candidates with probability rank_prob[r] * depth_decay^(d-1) (and leaves it out with
// the remaining probability); the other candidates are distinct pseudo-random tokens, candidate r has
// logit -r. The draw depends only on (seed, request seed, absolute position of the drafted token), so
// chain and tree runs see the same draws ("one profile serves chain and tree"): with K = 1 only rank-0
// hits survive. Past the end of the reference every candidate is random.
struct OracleProfile {
  std::vector<double> rank_prob = {0.6, 0.15, 0.1};
  double depth_decay = 0.9;
  uint64_t seed = 1;
};
// "0.6,0.15,0.1/0.9" -> rank_prob {0.6, 0.15, 0.1}, depth_decay 0.9 ("/decay" optional). Throws
// std::invalid_argument on malformed input or probabilities summing above 1.
OracleProfile parse_oracle_profile(const std::string& s);
std::unique_ptr<Drafter> make_oracle_drafter(const OracleProfile& p);

}  // namespace ddtree::draft
