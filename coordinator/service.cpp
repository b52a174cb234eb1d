// DDTreeService: see service.h.
//
// Stream lifetime: a GenerateStream (the RequestSink the scheduler holds, shared_ptr) outlives or
// predeceases its reactor in either order. The reactor deletes itself in OnDone and detaches from the
// stream first; the stream forwards writes only while attached. At most one write is in flight
// (OnWriteDone starts the next); Finish waits for the queue to drain. A client that cancels or disconnects
// marks the stream cancelled; the scheduler drops the request (freeing its KV) at its next step and
// finishes the stream with CANCELLED.
#include "coordinator/service.h"

#include <deque>
#include <memory>
#include <mutex>

namespace ddtree::coord {

namespace v1 = ::ddtree::v1;

grpc::Status to_status(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return {grpc::StatusCode::INVALID_ARGUMENT, message};
    case ErrorKind::kResourceExhausted: return {grpc::StatusCode::RESOURCE_EXHAUSTED, message};
    case ErrorKind::kUnavailable: return {grpc::StatusCode::UNAVAILABLE, message};
    case ErrorKind::kFailedPrecondition: return {grpc::StatusCode::FAILED_PRECONDITION, message};
    case ErrorKind::kInternal: return {grpc::StatusCode::INTERNAL, message};
  }
  return {grpc::StatusCode::UNKNOWN, message};
}

namespace {

v1::FinishReason finish_reason(Finish f) {
  switch (f) {
    case Finish::kLength: return v1::FINISH_REASON_LENGTH;
    case Finish::kStop: return v1::FINISH_REASON_STOP;
    case Finish::kEos: return v1::FINISH_REASON_EOS;
    case Finish::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case Finish::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

class GenerateReactor;

class GenerateStream final : public RequestSink {
 public:
  void attach(GenerateReactor* r) {
    std::lock_guard lk(mu_);
    reactor_ = r;
  }
  // ---- RequestSink (step loop thread)
  void on_chunk(ChunkOut&& c) override {
    v1::GenerateResponse m;
    v1::Chunk* ch = m.mutable_chunk();
    ch->mutable_token_ids()->Add(c.tokens.begin(), c.tokens.end());
    ch->set_accepted_draft_tokens(uint32_t(c.accepted_draft));
    ch->set_step(c.step);
    ch->set_step_batch_requests(c.batch_requests);
    if (!c.logits.empty()) ch->mutable_test_logits()->Add(c.logits.begin(), c.logits.end());
    push(std::move(m));
  }
  void on_complete(const Completion& c) override {
    if (c.reason == Finish::kCancelled) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"));
      return;
    }
    if (c.reason == Finish::kError) {  // the engine failed this request (the job goes on)
      finish(grpc::Status(grpc::StatusCode::INTERNAL,
                          "the model produced NaN logits for this request; no tokens were emitted for that step"));
      return;
    }
    v1::GenerateResponse m;
    v1::Complete* done = m.mutable_complete();
    done->set_finish_reason(finish_reason(c.reason));
    v1::Usage* u = done->mutable_usage();
    u->set_prompt_tokens(c.prompt_tokens);
    u->set_completion_tokens(c.completion_tokens);
    u->set_steps(c.steps);
    u->mutable_accept_length_counts()->Add(c.accept_hist.begin(), c.accept_hist.end());
    u->set_max_step_batch_requests(c.max_batch_requests);
    done->set_queue_seconds(c.queue_s);
    done->set_first_token_seconds(c.first_token_s);
    done->set_total_seconds(c.total_s);
    push(std::move(m));
    finish(grpc::Status::OK);
  }
  void on_fail(ErrorKind kind, const std::string& message) override { finish(to_status(kind, message)); }
  bool cancelled() const override { return cancelled_.load(); }

  // ---- reactor side (gRPC threads)
  void write_done(bool ok);
  void mark_cancelled() { cancelled_ = true; }
  void detach() {
    std::lock_guard lk(mu_);
    reactor_ = nullptr;
  }
  void finish(grpc::Status s);

 private:
  void push(v1::GenerateResponse&& m);

  // recursive: a reaction may run inline on the thread that started the operation.
  std::recursive_mutex mu_;
  GenerateReactor* reactor_ = nullptr;
  std::deque<v1::GenerateResponse> queue_;  // front = the write in flight (references stay valid)
  bool writing_ = false, finishing_ = false, finished_ = false;
  grpc::Status final_;
  std::atomic<bool> cancelled_{false};
};

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateReactor(std::shared_ptr<GenerateStream> s) : s_(std::move(s)) { s_->attach(this); }
  void OnWriteDone(bool ok) override { s_->write_done(ok); }
  void OnCancel() override { s_->mark_cancelled(); }
  void OnDone() override {
    s_->detach();
    delete this;
  }

 private:
  std::shared_ptr<GenerateStream> s_;
};

void GenerateStream::push(v1::GenerateResponse&& m) {
  std::lock_guard lk(mu_);
  if (reactor_ == nullptr || finishing_ || cancelled_) return;
  queue_.push_back(std::move(m));
  if (!writing_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front());
  }
}

void GenerateStream::finish(grpc::Status s) {
  std::lock_guard lk(mu_);
  if (reactor_ == nullptr || finishing_) return;
  finishing_ = true;
  final_ = std::move(s);
  if (!writing_ && !finished_) {
    finished_ = true;
    reactor_->Finish(final_);
  }
}

void GenerateStream::write_done(bool ok) {
  std::lock_guard lk(mu_);
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) {  // the client is gone
    cancelled_ = true;
    queue_.clear();
  }
  if (reactor_ != nullptr && !queue_.empty()) {
    reactor_->StartWrite(&queue_.front());
    return;
  }
  writing_ = false;
  if (reactor_ != nullptr && finishing_ && !finished_) {
    finished_ = true;
    reactor_->Finish(final_);
  }
}

}  // namespace

DDTreeService::DDTreeService(Scheduler& scheduler, const model::ModelConfig& config, ServerInfo info)
    : scheduler_(scheduler), config_(config), info_(std::move(info)) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* DDTreeService::Generate(grpc::CallbackServerContext*,
                                                                          const v1::GenerateRequest* req) {
  auto stream = std::make_shared<GenerateStream>();
  auto* reactor = new GenerateReactor(stream);
  NewRequest r;
  r.id = req->request_id();
  r.prompt.assign(req->prompt_token_ids().begin(), req->prompt_token_ids().end());
  r.temperature = req->sampling().temperature();
  r.seed = req->sampling().seed();
  r.max_new = req->stopping().max_new_tokens();
  r.stop_ids.assign(req->stopping().stop_token_ids().begin(), req->stopping().stop_token_ids().end());
  r.ignore_eos = req->stopping().ignore_eos();
  r.mode = int(req->speculation().mode());
  r.drafter = int(req->speculation().drafter());
  r.depth = req->speculation().draft_depth();
  r.budget = req->speculation().tree_budget();
  r.oracle_reference.assign(req->test_options().oracle_reference_token_ids().begin(),
                            req->test_options().oracle_reference_token_ids().end());
  r.return_logits = req->test_options().return_logits();
  SubmitError err;
  if (!scheduler_.submit(std::move(r), stream, &err)) stream->finish(to_status(err.kind, err.message));
  return reactor;
}

grpc::ServerUnaryReactor* DDTreeService::HealthCheck(grpc::CallbackServerContext* ctx, const v1::HealthCheckRequest*,
                                                     v1::HealthCheckResponse* resp) {
  const SchedulerStats s = scheduler_.stats();
  v1::ServingStatus st = v1::SERVING_STATUS_SERVING;
  if (s.dead || s.idle_s > info_.stall_after_s) st = v1::SERVING_STATUS_NOT_SERVING;
  else if (s.draining) st = v1::SERVING_STATUS_DRAINING;
  resp->set_status(st);
  v1::ServerStats* x = resp->mutable_stats();
  x->set_steps_total(s.steps);
  x->set_step_rows_total(s.rows);
  x->set_max_step_batch_requests(s.max_batch);
  x->set_running_requests(s.running);
  x->set_waiting_requests(s.waiting);
  x->set_completed_requests_total(s.completed);
  x->set_prompt_tokens_total(s.prompt_tokens);
  x->set_generation_tokens_total(s.generated_tokens);
  x->set_spec_decode_num_drafts(s.spec_drafts);
  x->set_spec_decode_num_accepted_tokens(s.spec_accepted);
  x->set_step_loop_idle_seconds(s.idle_s);
  v1::ModelInfo* m = resp->mutable_model();
  m->set_model_type(config_.model_type);
  m->set_vocab_size(uint32_t(config_.vocab_size));
  for (int64_t e : config_.eos_token_ids) m->add_eos_token_ids(int32_t(e));
  m->set_num_hidden_layers(uint32_t(config_.num_hidden_layers));
  resp->set_world_size(uint32_t(info_.world_size));
  resp->set_build_id(info_.build_id);
  resp->set_test_options_enabled(info_.test_options);
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace ddtree::coord
