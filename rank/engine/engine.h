// RankEngine: one rank's part of the speculative loop (ARCHITECTURE.md "One speculative step"), on the cpu
// backend. Every rank runs the same sequence of collectives per step:
//
//   plan      rank 0 -> all   (MPI broadcast of the serialized StepPlan: size, then bytes)
//   draft     every rank: drafter logits over its vocabulary shard -> ddt_topk_shard -> gather to rank 0
//             -> ddt_topk_combine -> ddt_tree_build (rank 0) -> broadcast trees (tokens, positions,
//             parents, node counts; ancestor bitmask rows)
//   verify    every rank: Model::forward on its tensor-parallel shard (all-reduce sums inside, rank order)
//   keys      every rank: ddt_sample_keys over its vocabulary shard (greedy or Gumbel-max keyed by
//             (seed, absolute position)) -> all-reduce max over packed u64 keys
//   accept    rank 0: ddt_accept per request -> broadcast decisions (path, emitted tokens, bonus, finished)
//   commit    every rank: compact the accepted path's KV (LatentKvCache::compact_accepted), append the
//             tokens to its copy of the request's context, release finished requests
//   logits    (test option) gather the emitted tokens' logits rows to rank 0
//
// The per-request state (context tokens, committed KV length, root token) is replicated on every rank and
// changes only through plans and broadcast decisions, so the ranks never disagree; each plan carries the
// committed lengths rank 0 expects and a rank that differs fails the step.
//
// Modes: autoregressive = verify of a 1-node tree (the root), chain = the tree builder with K = 1 and budget
// = depth, tree = DDTree with budget B and K = min(B, V). A request's first step is its prefill: the whole
// prompt as a causal chain, the first token sampled from the last row (position prompt_len - 1).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "rank/comm/comm.h"
#include "rank/draft/drafter.h"
#include "rank/engine/plan.h"
#include "rank/kv/latent_kv.h"
#include "rank/model/model.h"

namespace ddtree::engine {

struct EngineOptions {
  int page_size = 16;
  int max_requests = 16;         // live requests at once (rows of the page table)
  int64_t max_seq_len = 1024;    // most KV slots one request may use (prompt + max_new + tree width)
  int num_pages = 0;             // KV pool; 0 = max_requests * ceil(max_seq_len / page_size)
  draft::NgramOptions ngram;
  draft::OracleProfile oracle;
  double step_timeout_s = 60.0;  // watchdog: a step (collectives included) running longer ends the job
  // Fault injection for tests: rank `test_fault_rank` kills itself with SIGKILL (test_fault = 1) or hangs
  // forever (test_fault = 2) when it starts step number `test_fault_step`.
  int test_fault = 0;
  int test_fault_rank = -1;
  uint64_t test_fault_step = 0;
};

// One request's outcome of one step (every rank computes it; `logits` only on rank 0).
struct RequestStepResult {
  int32_t slot = -1;
  bool prefill = false;
  std::vector<int32_t> tokens;   // emitted this step
  int32_t accepted_draft = 0;    // draft tokens accepted (decode steps)
  int32_t finished = 0;          // 0 running, 1 stop token, 2 max_new reached, 3 failed (NaN logits)
  int64_t committed = 0;         // KV slots committed after the step (the next plan's prefix)
  std::vector<float> logits;     // [tokens.size(), vocab] when return_logits (rank 0)
};

struct StepResult {
  uint64_t step = 0;
  int64_t rows = 0;              // forward rows of the step
  std::vector<RequestStepResult> requests;  // in plan.batch order
};

class EngineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RankEngine {
 public:
  RankEngine(Comm& comm, model::Model& model, const EngineOptions& o);
  ~RankEngine();

  const EngineOptions& options() const { return o_; }
  const model::Model& model() const { return model_; }
  Comm& comm() { return comm_; }
  int pages_for(int64_t tokens) const { return int((tokens + o_.page_size - 1) / o_.page_size); }

  // Collective: rank 0 passes its plan, every rank returns the plan it received.
  StepPlan share_plan(const StepPlan* plan_on_root);
  // Collective: applies the plan's releases and admissions and runs the step (nothing for a shutdown plan).
  void run_step(const StepPlan& plan, StepResult& out);
  // Ranks other than 0: receive plans and run steps until a shutdown plan arrives.
  void follow();

  // The watchdog: a step running longer than step_timeout_s ends the whole job (Comm::abort), after
  // calling `on_fatal` (rank 0: fail every open stream with UNAVAILABLE) if one is given.
  void start_watchdog(std::function<void(const std::string&)> on_fatal = {});

 private:
  struct Live {
    RequestSpec spec;
    std::vector<int32_t> tokens;  // prompt + generated; the last is the root of the next tree
    int64_t committed = 0;        // KV slots [0, committed) hold the context before the root
    int32_t emitted = 0;
  };
  struct Tree;  // one request's tree of this step (engine.cpp)

  const draft::Drafter* drafter_for(DrafterKind k) const;
  void maybe_inject_fault(uint64_t step) const;
  void run_step_impl(const StepPlan& plan, StepResult& out);

  Comm& comm_;
  model::Model& model_;
  EngineOptions o_;
  std::unique_ptr<kv::LatentKvCache> cache_;
  std::unique_ptr<draft::Drafter> ngram_, oracle_;
  std::map<int32_t, Live> live_;

  std::atomic<int64_t> step_started_ns_{0};  // 0 = idle
  std::atomic<uint64_t> step_no_{0};
  std::atomic<bool> stop_watchdog_{false};
  std::thread watchdog_;
  std::function<void(const std::string&)> on_fatal_;
};

}  // namespace ddtree::engine
