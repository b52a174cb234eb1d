// Scheduler (rank 0): the waiting queue, admission with KV reservation for the worst case, continuous
// batching (every running request takes part in every step; new requests join at the next step), the step
// plan, and the routing of each step's tokens to the request's sink. No gRPC here: the service
// (service.cpp) adapts a stream to RequestSink and maps ErrorKind to status codes.
//
// Threads: submit / drain / fail_all / stats may be called from any thread; run() is the step loop and
// owns the engine (the only thread that calls into MPI on rank 0).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rank/engine/engine.h"

namespace ddtree::coord {

enum class ErrorKind { kInvalidArgument, kResourceExhausted, kUnavailable, kFailedPrecondition, kInternal };

enum class Finish { kLength, kStop, kEos, kCancelled, kError };

struct ChunkOut {
  std::vector<int32_t> tokens;
  int32_t accepted_draft = 0;
  uint64_t step = 0;
  uint32_t batch_requests = 0;
  std::vector<float> logits;  // [tokens, vocab] (test option)
};

struct Completion {
  Finish reason = Finish::kLength;
  uint32_t prompt_tokens = 0, completion_tokens = 0, steps = 0, max_batch_requests = 0;
  std::vector<uint32_t> accept_hist;  // [depth + 1]
  double queue_s = 0, first_token_s = 0, total_s = 0;
};

// Where a request's output goes. Called from the step loop only (never concurrently for one request);
// implementations must not block. After on_complete or on_fail nothing else is called.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void on_chunk(ChunkOut&& c) = 0;
  virtual void on_complete(const Completion& c) = 0;
  virtual void on_fail(ErrorKind kind, const std::string& message) = 0;
  virtual bool cancelled() const = 0;  // the client went away
};

// A request as a client states it (0 / unset = the server default).
struct NewRequest {
  std::string id;
  std::vector<int32_t> prompt;
  uint32_t max_new = 0;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  int mode = 0;     // 0 default, else engine::Mode
  int drafter = 0;  // 0 default, else engine::DrafterKind
  uint32_t depth = 0, budget = 0;
  std::vector<int32_t> oracle_reference;
  bool return_logits = false;
};

struct SchedulerOptions {
  int max_batch = 8;              // requests per step (<= engine max_requests)
  int max_queue = 128;            // waiting requests; more are refused (RESOURCE_EXHAUSTED)
  uint32_t default_max_new = 64;
  engine::Mode default_mode = engine::Mode::kTree;
  engine::DrafterKind default_drafter = engine::DrafterKind::kNgram;
  int default_depth = 4;
  int default_budget = 16;
  bool test_options = false;      // accept the oracle drafter and returned logits
};

struct SchedulerStats {
  uint64_t steps = 0, rows = 0, completed = 0, prompt_tokens = 0, generated_tokens = 0;
  uint64_t spec_drafts = 0, spec_accepted = 0;
  uint32_t max_batch = 0, running = 0, waiting = 0;
  double idle_s = 0;      // since the loop last made progress
  bool draining = false, dead = false;
};

struct SubmitError {
  ErrorKind kind;
  std::string message;
};

class Scheduler {
 public:
  Scheduler(engine::RankEngine& engine, const SchedulerOptions& o);

  // Validates and queues a request. Returns false (and fills *err) when it is refused; the sink is then
  // never called.
  bool submit(NewRequest&& r, std::shared_ptr<RequestSink> sink, SubmitError* err);
  // Stop admitting; run() returns once every running and waiting request is done.
  void drain();
  // The engine is gone (a rank died, the job is being killed): every open request fails with UNAVAILABLE,
  // new ones are refused. Safe from any thread while run() is blocked in a collective.
  void fail_all(const std::string& why);
  SchedulerStats stats() const;

  // The step loop (rank 0's main thread). Returns after a drain, having sent the shutdown plan.
  void run();

 private:
  struct Req {
    uint64_t seq = 0;
    engine::RequestSpec spec;
    std::shared_ptr<RequestSink> sink;
    std::string id;
    int64_t committed = 0;
    Completion usage;
    bool eos_stops = true;
    bool done = false;
    std::chrono::steady_clock::time_point arrived, admitted, first_token;
  };

  bool validate(NewRequest& r, engine::RequestSpec& spec, SubmitError* err) const;
  void finish(Req& r, Finish why);

  engine::RankEngine& engine_;
  SchedulerOptions o_;
  std::vector<int32_t> eos_ids_;
  int64_t vocab_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::vector<std::unique_ptr<Req>> running_;  // admission order (the batch order)
  std::vector<int32_t> free_slots_;
  int64_t reserved_pages_ = 0;
  bool draining_ = false, dead_ = false;
  uint64_t next_seq_ = 0, step_ = 0;
  SchedulerStats stats_;
  std::chrono::steady_clock::time_point last_progress_;
};

}  // namespace ddtree::coord
