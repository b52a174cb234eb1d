// Scheduler: see scheduler.h.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <cmath>

#include "ddtree/kernels.h"

namespace ddtree::coord {

using Clock = std::chrono::steady_clock;
namespace {
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

Scheduler::Scheduler(engine::RankEngine& engine, const SchedulerOptions& o) : engine_(engine), o_(o) {
  const model::ModelConfig& c = engine_.model().config();
  vocab_ = c.vocab_size;
  for (int64_t e : c.eos_token_ids) eos_ids_.push_back(int32_t(e));
  o_.max_batch = std::min(o_.max_batch, engine_.options().max_requests);
  for (int s = engine_.options().max_requests - 1; s >= 0; --s) free_slots_.push_back(s);
  last_progress_ = Clock::now();
}

bool Scheduler::validate(NewRequest& r, engine::RequestSpec& s, SubmitError* err) const {
  auto fail = [&](ErrorKind k, std::string m) {
    *err = SubmitError{k, std::move(m)};
    return false;
  };
  const auto bad = [&](std::string m) { return fail(ErrorKind::kInvalidArgument, std::move(m)); };
  if (r.prompt.empty()) return bad("prompt_token_ids is empty (need at least one token)");
  for (std::size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_)
      return bad("prompt_token_ids[" + std::to_string(i) + "] = " + std::to_string(r.prompt[i]) +
                 " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  if (!std::isfinite(r.temperature) || r.temperature < 0.0f)
    return bad("sampling.temperature must be finite and >= 0");
  s.prompt = std::move(r.prompt);
  s.max_new = int32_t(r.max_new ? r.max_new : o_.default_max_new);
  if (s.max_new < 1) return bad("stopping.max_new_tokens must be >= 1");
  s.temperature = r.temperature;
  s.seed = r.seed;
  s.mode = r.mode ? engine::Mode(r.mode) : o_.default_mode;
  if (s.mode != engine::Mode::kAutoregressive && s.mode != engine::Mode::kChain && s.mode != engine::Mode::kTree)
    return bad("speculation.mode " + std::to_string(r.mode) + " is not a known mode");
  s.depth = int32_t(r.depth ? r.depth : uint32_t(o_.default_depth));
  s.budget = int32_t(r.budget ? r.budget : uint32_t(o_.default_budget));
  if (s.mode == engine::Mode::kAutoregressive) {
    s.drafter = engine::DrafterKind::kNone;
    s.depth = 1;
    s.budget = 1;
  } else {
    s.drafter = r.drafter ? engine::DrafterKind(r.drafter) : o_.default_drafter;
    if (s.drafter != engine::DrafterKind::kNgram && s.drafter != engine::DrafterKind::kOracle)
      return bad("speculation.drafter " + std::to_string(r.drafter) + " is not a known drafter");
    if (s.depth < 1 || s.depth > DDT_MAX_DEPTH)
      return bad("speculation.draft_depth " + std::to_string(s.depth) + " is outside [1, " + std::to_string(DDT_MAX_DEPTH) + "]");
    if (s.mode == engine::Mode::kChain) s.budget = s.depth;
    if (s.budget < 1 || s.budget > DDT_MAX_BUDGET)
      return bad("speculation.tree_budget " + std::to_string(s.budget) + " is outside [1, " + std::to_string(DDT_MAX_BUDGET) + "]");
  }
  for (int32_t t : r.stop_ids) {
    if (t < 0 || t >= vocab_) return bad("stopping.stop_token_ids has " + std::to_string(t) + ", outside the vocabulary");
    s.stop_ids.push_back(t);
  }
  if (!r.ignore_eos) s.stop_ids.insert(s.stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
  if (!o_.test_options && (s.drafter == engine::DrafterKind::kOracle || r.return_logits || !r.oracle_reference.empty()))
    return fail(ErrorKind::kFailedPrecondition,
                "test_options and the oracle drafter need a server started with --enable-test-options");
  s.return_logits = r.return_logits;
  s.reference = std::move(r.oracle_reference);
  if (s.worst_case_tokens() > engine_.options().max_seq_len)
    return bad("prompt (" + std::to_string(s.prompt.size()) + ") + max_new_tokens (" + std::to_string(s.max_new) +
               ") + tree width (" + std::to_string(s.width()) + ") exceeds the server's --max-seq-len " +
               std::to_string(engine_.options().max_seq_len));
  return true;
}

bool Scheduler::submit(NewRequest&& r, std::shared_ptr<RequestSink> sink, SubmitError* err) {
  auto q = std::make_unique<Req>();
  q->id = r.id;
  q->eos_stops = !r.ignore_eos;
  if (!validate(r, q->spec, err)) return false;
  q->sink = std::move(sink);
  q->arrived = Clock::now();
  q->usage.prompt_tokens = uint32_t(q->spec.prompt.size());
  q->usage.accept_hist.assign(std::size_t(q->spec.draft_depth() + 1), 0);
  std::lock_guard lk(mu_);
  if (dead_) {
    *err = {ErrorKind::kUnavailable, "the engine has failed (a rank died); no new requests"};
    return false;
  }
  if (draining_) {
    *err = {ErrorKind::kUnavailable, "the server is draining; no new requests"};
    return false;
  }
  if (int(waiting_.size()) >= o_.max_queue) {
    *err = {ErrorKind::kResourceExhausted, "the waiting queue is full (" + std::to_string(o_.max_queue) + " requests)"};
    return false;
  }
  q->seq = next_seq_++;
  waiting_.push_back(std::move(q));
  cv_.notify_all();
  return true;
}

void Scheduler::drain() {
  std::lock_guard lk(mu_);
  draining_ = true;
  cv_.notify_all();
}

void Scheduler::fail_all(const std::string& why) {
  std::lock_guard lk(mu_);
  if (dead_) return;
  dead_ = true;
  for (auto& r : running_) r->sink->on_fail(ErrorKind::kUnavailable, why);
  for (auto& r : waiting_) r->sink->on_fail(ErrorKind::kUnavailable, why);
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  SchedulerStats s = stats_;
  s.running = uint32_t(running_.size());
  s.waiting = uint32_t(waiting_.size());
  s.idle_s = seconds(last_progress_, Clock::now());
  s.draining = draining_;
  s.dead = dead_;
  return s;
}

// Called with mu_ held.
void Scheduler::finish(Req& r, Finish why) {
  const auto now = Clock::now();
  r.usage.reason = why;
  r.usage.queue_s = seconds(r.arrived, r.admitted);
  r.usage.first_token_s = r.usage.completion_tokens ? seconds(r.arrived, r.first_token) : 0.0;
  r.usage.total_s = seconds(r.arrived, now);
  r.done = true;
  r.sink->on_complete(r.usage);
  free_slots_.push_back(r.spec.slot);
  reserved_pages_ -= engine_.pages_for(r.spec.worst_case_tokens());
  ++stats_.completed;
}

void Scheduler::run() {
  const int64_t pool = engine_.options().num_pages;
  engine::StepResult res;
  for (;;) {
    engine::StepPlan plan;
    std::vector<Req*> batch;
    {
      std::unique_lock lk(mu_);
      for (;;) {
        last_progress_ = Clock::now();
        if (dead_) return;
        // Clients that went away: their KV is released by this step's plan.
        for (auto it = running_.begin(); it != running_.end();) {
          if ((*it)->sink->cancelled()) {
            plan.release.push_back((*it)->spec.slot);
            finish(**it, Finish::kCancelled);
            it = running_.erase(it);
          } else {
            ++it;
          }
        }
        for (auto it = waiting_.begin(); it != waiting_.end();) {
          if ((*it)->sink->cancelled()) {
            (*it)->usage.reason = Finish::kCancelled;
            (*it)->sink->on_complete((*it)->usage);
            it = waiting_.erase(it);
          } else {
            ++it;
          }
        }
        // Admission (FIFO): a free page-table row and KV pages for the request's worst case.
        while (!waiting_.empty() && int(running_.size()) < o_.max_batch && !free_slots_.empty()) {
          Req& w = *waiting_.front();
          const int pages = engine_.pages_for(w.spec.worst_case_tokens());
          if (reserved_pages_ + pages > pool) break;
          reserved_pages_ += pages;
          w.spec.slot = free_slots_.back();
          free_slots_.pop_back();
          w.admitted = Clock::now();
          w.committed = 0;
          plan.admit.push_back(w.spec);
          running_.push_back(std::move(waiting_.front()));
          waiting_.pop_front();
        }
        if (!running_.empty() || !plan.release.empty()) break;
        if (draining_ && waiting_.empty()) {
          plan.shutdown = true;
          break;
        }
        cv_.wait_for(lk, std::chrono::milliseconds(100));
      }
      plan.step = ++step_;
      for (auto& r : running_) {
        plan.batch.push_back(r->spec.slot);
        plan.prefix.push_back(r->committed);
        batch.push_back(r.get());
      }
    }
    engine_.share_plan(&plan);  // every rank (rank 0 included) runs the plan as decoded
    if (plan.shutdown) return;
    engine_.run_step(plan, res);

    std::lock_guard lk(mu_);
    if (dead_) return;
    const auto now = Clock::now();
    last_progress_ = now;
    const uint32_t nb = uint32_t(batch.size());
    ++stats_.steps;
    stats_.rows += uint64_t(res.rows);
    stats_.max_batch = std::max(stats_.max_batch, nb);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Req& r = *batch[i];
      engine::RequestStepResult& o = res.requests[i];
      r.committed = o.committed;
      r.usage.steps += 1;
      r.usage.max_batch_requests = std::max(r.usage.max_batch_requests, nb);
      if (!o.prefill) {
        r.usage.accept_hist[std::size_t(o.accepted_draft)] += 1;
        if (r.spec.draft_depth() > 0) {
          ++stats_.spec_drafts;
          stats_.spec_accepted += uint64_t(o.accepted_draft);
        }
      } else {
        stats_.prompt_tokens += r.spec.prompt.size();
      }
      if (!o.tokens.empty() && r.usage.completion_tokens == 0) r.first_token = now;
      r.usage.completion_tokens += uint32_t(o.tokens.size());
      stats_.generated_tokens += o.tokens.size();
      const int32_t last = o.tokens.empty() ? -1 : o.tokens.back();
      ChunkOut c;
      c.tokens = std::move(o.tokens);
      c.accepted_draft = o.prefill ? 0 : o.accepted_draft;
      c.step = res.step;
      c.batch_requests = nb;
      c.logits = std::move(o.logits);
      if (!r.sink->cancelled()) r.sink->on_chunk(std::move(c));
      if (o.finished != 0) {
        Finish why = Finish::kLength;
        if (o.finished == 3) why = Finish::kError;  // bad data (e.g. NaN logits): no tokens this step
        else if (o.finished == 1)
          why = r.eos_stops && std::find(eos_ids_.begin(), eos_ids_.end(), last) != eos_ids_.end() ? Finish::kEos
                                                                                                 : Finish::kStop;
        finish(r, why);
      }
    }
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const std::unique_ptr<Req>& r) { return r->done; }),
                   running_.end());
  }
}

}  // namespace ddtree::coord
