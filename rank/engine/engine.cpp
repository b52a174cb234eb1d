// RankEngine: see engine.h for the step's sequence of collectives.
#include "rank/engine/engine.h"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "ddtree/kernels.h"

namespace ddtree::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_kernel(int rc, const char* what) {
  if (rc != DDT_OK)
    throw EngineError(std::string(what) + " failed: " + ddt_status_string(rc) + ": " + ddt_last_error_message());
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One request's tree of this step, in the tree builder's layout (kernels.h ddt_tree_build_params).
struct RankEngine::Tree {
  int n = 1, w = 1;
  int32_t count = 1;
  std::vector<int32_t> tokens, parents, depths, slots, positions, first_child, next_sibling;
  std::vector<float> scores;
  std::vector<uint64_t> vis;

  void resize(int n_) {
    n = n_;
    w = (n + 63) / 64;
    for (auto* v : {&tokens, &parents, &depths, &slots, &positions, &first_child, &next_sibling})
      v->assign(std::size_t(n), -1);
    scores.assign(std::size_t(n), 0.0f);
    vis.assign(std::size_t(n) * std::size_t(w), 0);
  }
  // Keeps only the real nodes [0, count): the cpu backend verifies no padding rows (the GPU loop keeps the
  // fixed width N for static shapes). Ancestor rows of real nodes have no bits at or past `count`, so the
  // first ceil(count / 64) words of each row are the whole row.
  void trim() {
    if (count >= n) return;
    const int wc = (count + 63) / 64;
    std::vector<uint64_t> v(std::size_t(count) * std::size_t(wc));
    for (int i = 0; i < count; ++i)
      for (int k = 0; k < wc; ++k) v[std::size_t(i) * std::size_t(wc) + std::size_t(k)] = vis[std::size_t(i) * std::size_t(w) + std::size_t(k)];
    vis = std::move(v);
    w = wc;
    n = count;
    for (auto* x : {&tokens, &parents, &depths, &slots, &positions, &first_child, &next_sibling}) x->resize(std::size_t(n));
    scores.resize(std::size_t(n));
  }
  // The root alone (autoregressive): node 0 = root at slot = position = prefix.
  void root_only(int32_t root, int64_t prefix) {
    resize(1);
    tokens[0] = root;
    parents[0] = -1;
    depths[0] = 0;
    slots[0] = positions[0] = int32_t(prefix);
    vis[0] = 1;
    count = 1;
  }
};

RankEngine::RankEngine(Comm& comm, model::Model& model, const EngineOptions& o) : comm_(comm), model_(model), o_(o) {
  if (o_.page_size < 1 || o_.max_requests < 1 || o_.max_seq_len < 2)
    throw EngineError("engine options: page_size, max_requests >= 1 and max_seq_len >= 2 required");
  const int per_req = pages_for(o_.max_seq_len);
  if (o_.num_pages == 0) o_.num_pages = o_.max_requests * per_req;
  cache_ = std::make_unique<kv::LatentKvCache>(model_.kv_shape(o_.page_size, o_.num_pages, o_.max_requests, per_req));
  ngram_ = draft::make_ngram_drafter(o_.ngram);
  oracle_ = draft::make_oracle_drafter(o_.oracle);
}

RankEngine::~RankEngine() {
  stop_watchdog_ = true;
  if (watchdog_.joinable()) watchdog_.join();
}

void RankEngine::start_watchdog(std::function<void(const std::string&)> on_fatal) {
  if (watchdog_.joinable() || o_.step_timeout_s <= 0) return;
  on_fatal_ = std::move(on_fatal);
  watchdog_ = std::thread([this] {
    while (!stop_watchdog_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int64_t t0 = step_started_ns_.load();
      if (t0 == 0) continue;
      const double s = double(now_ns() - t0) * 1e-9;
      if (s > o_.step_timeout_s) {
        const std::string why = "watchdog: step " + std::to_string(step_no_.load()) + " has run for " +
                                std::to_string(s) + " s (limit " + std::to_string(o_.step_timeout_s) +
                                " s): a rank died or a collective hangs; ending the job";
        if (on_fatal_) on_fatal_(why);
        comm_.abort(4, why);
      }
    }
  });
}

const draft::Drafter* RankEngine::drafter_for(DrafterKind k) const {
  switch (k) {
    case DrafterKind::kNgram: return ngram_.get();
    case DrafterKind::kOracle: return oracle_.get();
    case DrafterKind::kNone: return nullptr;
  }
  return nullptr;
}

StepPlan RankEngine::share_plan(const StepPlan* plan_on_root) {
  std::vector<uint8_t> bytes;
  uint64_t n = 0;
  if (comm_.rank() == 0) {
    bytes = serialize(*plan_on_root);
    n = bytes.size();
  }
  if (comm_.size() > 1) {
    comm_.broadcast(&n, 1, DType::kU64, 0);
    bytes.resize(n);
    comm_.broadcast(bytes.data(), n, DType::kU8, 0);
  }
  return deserialize(bytes);  // rank 0 too: every rank runs the plan it decoded
}

void RankEngine::follow() {
  StepResult res;
  for (;;) {
    const StepPlan plan = share_plan(nullptr);
    if (plan.shutdown) return;
    run_step(plan, res);
  }
}

void RankEngine::maybe_inject_fault(uint64_t step) const {
  if (o_.test_fault == 0 || comm_.rank() != o_.test_fault_rank || step < o_.test_fault_step) return;
  std::fprintf(stderr, "[ddtree rank %d] test fault injection at step %llu: %s\n", comm_.rank(),
               (unsigned long long)step, o_.test_fault == 1 ? "SIGKILL" : "hanging");
  std::fflush(stderr);
  if (o_.test_fault == 1) std::raise(SIGKILL);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void RankEngine::run_step(const StepPlan& plan, StepResult& out) {
  if (plan.shutdown) return;
  step_no_ = plan.step;
  step_started_ns_ = now_ns();
  maybe_inject_fault(plan.step);
  run_step_impl(plan, out);
  step_started_ns_ = 0;
}

void RankEngine::run_step_impl(const StepPlan& plan, StepResult& out) {
  const int S = comm_.size(), me = comm_.rank();
  const model::ShardRanges& rg = model_.ranges();
  const int64_t V = model_.config().vocab_size, Vs = rg.vocab();
  out.step = plan.step;
  out.rows = 0;
  out.requests.clear();

  // ---- releases and admissions (identical on every rank)
  for (int32_t slot : plan.release)
    if (live_.erase(slot)) cache_->release(slot);
  for (const RequestSpec& s : plan.admit) {
    if (s.slot < 0 || s.slot >= o_.max_requests || live_.count(s.slot))
      throw EngineError("plan admits slot " + std::to_string(s.slot) + " which is out of range or live");
    Live lv;
    lv.spec = s;
    lv.tokens = s.prompt;
    live_.emplace(s.slot, std::move(lv));
  }
  const int B = int(plan.batch.size());
  if (B == 0) return;
  std::vector<Live*> req(static_cast<std::size_t>(B), nullptr);
  std::vector<char> prefill(static_cast<std::size_t>(B), 0);
  for (int i = 0; i < B; ++i) {
    auto it = live_.find(plan.batch[std::size_t(i)]);
    if (it == live_.end()) throw EngineError("plan runs slot " + std::to_string(plan.batch[std::size_t(i)]) + " which is not live");
    Live& lv = it->second;
    if (lv.committed != plan.prefix[std::size_t(i)])
      throw EngineError("rank " + std::to_string(me) + ": slot " + std::to_string(lv.spec.slot) + " has " +
                        std::to_string(lv.committed) + " committed KV slots, the plan says " +
                        std::to_string(plan.prefix[std::size_t(i)]) + " (rank states diverged)");
    req[std::size_t(i)] = &lv;
    prefill[std::size_t(i)] = lv.emitted == 0;
  }

  // ---- draft: drafter logits over this vocabulary shard -> top-K per shard -> gather to rank 0
  struct Job {
    int i, L, K;
    std::size_t foff, ioff;  // offsets of this request's block in the packed send buffers
  };
  std::vector<Job> jobs;
  std::vector<float> fsend;    // per job: values [L, K] then lse [L]
  std::vector<int32_t> isend;  // per job: ids [L, K]
  for (int i = 0; i < B; ++i) {
    const Live& lv = *req[std::size_t(i)];
    const int L = lv.spec.draft_depth();
    if (prefill[std::size_t(i)] || L == 0) continue;
    const int K = lv.spec.topk(V);
    Job j{i, L, K, fsend.size(), isend.size()};
    std::vector<float> rows(std::size_t(L) * std::size_t(Vs), kNegInf);
    draft::DraftContext ctx;
    ctx.tokens = &lv.tokens;
    ctx.prompt_len = int64_t(lv.spec.prompt.size());
    ctx.seed = lv.spec.seed;
    ctx.reference = lv.spec.drafter == DrafterKind::kOracle ? &lv.spec.reference : nullptr;
    const draft::Drafter* d = drafter_for(lv.spec.drafter);
    if (d == nullptr) throw EngineError("slot " + std::to_string(lv.spec.slot) + " speculates without a drafter");
    d->draft(ctx, draft::DraftShard{rows.data(), L, rg.vocab0, rg.vocab1, V, K});
    fsend.resize(fsend.size() + std::size_t(L) * std::size_t(K + 1));
    isend.resize(isend.size() + std::size_t(L) * std::size_t(K));
    uint32_t status = 0;
    ddt_topk_shard_params tp{rows.data(), Vs, L, int(Vs), int(rg.vocab0), K, &fsend[j.foff], &isend[j.ioff],
                             &fsend[j.foff + std::size_t(L) * std::size_t(K)], &status};
    check_kernel(ddt_topk_shard_cpu(&tp), "ddt_topk_shard_cpu (draft)");
    jobs.push_back(j);
  }
  std::vector<float> frecv;
  std::vector<int32_t> irecv;
  if (!jobs.empty()) {
    if (S > 1) {
      if (me == 0) {
        frecv.resize(fsend.size() * std::size_t(S));
        irecv.resize(isend.size() * std::size_t(S));
      }
      comm_.gather(fsend.data(), frecv.data(), fsend.size(), DType::kF32, 0);
      comm_.gather(isend.data(), irecv.data(), isend.size(), DType::kI32, 0);
    } else {
      frecv = fsend;
      irecv = isend;
    }
  }

  // ---- trees: rank 0 combines the shards' top-K and builds; then every rank gets them
  std::vector<Tree> trees(static_cast<std::size_t>(B));
  for (int i = 0; i < B; ++i)
    if (!prefill[std::size_t(i)]) trees[std::size_t(i)].root_only(req[std::size_t(i)]->tokens.back(), req[std::size_t(i)]->committed);
  for (const Job& j : jobs) {
    Tree& t = trees[std::size_t(j.i)];
    const Live& lv = *req[std::size_t(j.i)];
    t.resize(lv.spec.width());
    if (me != 0) continue;
    const std::size_t LK = std::size_t(j.L) * std::size_t(j.K);
    std::vector<float> vals(std::size_t(S) * LK), lse(std::size_t(S) * std::size_t(j.L)), lp(LK);
    std::vector<int32_t> ids(std::size_t(S) * LK), gid(LK);
    for (int s = 0; s < S; ++s) {
      const float* fb = frecv.data() + std::size_t(s) * fsend.size() + j.foff;
      const int32_t* ib = irecv.data() + std::size_t(s) * isend.size() + j.ioff;
      std::memcpy(&vals[std::size_t(s) * LK], fb, LK * sizeof(float));
      std::memcpy(&lse[std::size_t(s) * std::size_t(j.L)], fb + LK, std::size_t(j.L) * sizeof(float));
      std::memcpy(&ids[std::size_t(s) * LK], ib, LK * sizeof(int32_t));
    }
    ddt_topk_combine_params cp{vals.data(), ids.data(), lse.data(), S, j.L, j.K, lp.data(), gid.data()};
    check_kernel(ddt_topk_combine_cpu(&cp), "ddt_topk_combine_cpu");
    const int32_t root = lv.tokens.back();
    const int32_t prefix = int32_t(lv.committed);
    uint32_t status = 0;
    ddt_tree_build_params bp{lp.data(), gid.data(), &root, &prefix, 1, j.L, j.K, t.n - 1, t.tokens.data(),
                             t.parents.data(), t.depths.data(), t.scores.data(), t.slots.data(), t.positions.data(),
                             t.vis.data(), t.first_child.data(), t.next_sibling.data(), &t.count, &status};
    check_kernel(ddt_tree_build_cpu(&bp), "ddt_tree_build_cpu");
  }
  if (S > 1 && !jobs.empty()) {
    std::vector<int32_t> ib;
    std::vector<uint64_t> vb;
    for (const Job& j : jobs) {  // the sizes are known everywhere: every rank packs the same layout
      const Tree& t = trees[std::size_t(j.i)];
      ib.insert(ib.end(), t.tokens.begin(), t.tokens.end());
      ib.insert(ib.end(), t.positions.begin(), t.positions.end());
      ib.insert(ib.end(), t.parents.begin(), t.parents.end());
      ib.push_back(t.count);
      vb.insert(vb.end(), t.vis.begin(), t.vis.end());
    }
    comm_.broadcast(ib.data(), ib.size(), DType::kI32, 0);
    comm_.broadcast(vb.data(), vb.size(), DType::kU64, 0);
    std::size_t a = 0, b = 0;
    for (const Job& j : jobs) {
      Tree& t = trees[std::size_t(j.i)];
      const std::size_t n = std::size_t(t.n);
      std::copy(ib.begin() + a, ib.begin() + a + n, t.tokens.begin());
      std::copy(ib.begin() + a + n, ib.begin() + a + 2 * n, t.positions.begin());
      std::copy(ib.begin() + a + 2 * n, ib.begin() + a + 3 * n, t.parents.begin());
      t.count = ib[a + 3 * n];
      a += 3 * n + 1;
      std::copy(vb.begin() + b, vb.begin() + b + t.vis.size(), t.vis.begin());
      b += t.vis.size();
    }
  }

  for (const Job& j : jobs) {
    Tree& t = trees[std::size_t(j.i)];
    if (t.count < 1 || t.count > t.n) throw EngineError("tree of slot " + std::to_string(req[std::size_t(j.i)]->spec.slot) + " has a bad node count");
    t.trim();
  }

  // ---- verify forward on this rank's tensor-parallel shard
  std::vector<model::RequestRows> rows(static_cast<std::size_t>(B));
  std::vector<int64_t> row0(static_cast<std::size_t>(B));
  int64_t total = 0;
  for (int i = 0; i < B; ++i) {
    Live& lv = *req[std::size_t(i)];
    model::RequestRows& rr = rows[std::size_t(i)];
    rr.kv_request = lv.spec.slot;
    if (prefill[std::size_t(i)]) {
      rr.prefix_len = 0;
      rr.n = int(lv.spec.prompt.size());
      rr.tokens = lv.spec.prompt.data();
      cache_->reserve(lv.spec.slot, rr.n);
    } else {
      const Tree& t = trees[std::size_t(i)];
      if (lv.committed + 1 != int64_t(lv.tokens.size())) throw EngineError("internal: context and KV length differ");
      rr.prefix_len = lv.committed;
      rr.n = t.n;
      rr.tokens = t.tokens.data();
      rr.positions = t.positions.data();
      rr.vis = t.vis.data();
      cache_->reserve(lv.spec.slot, lv.committed + t.n);
    }
    row0[std::size_t(i)] = total;
    total += rr.n;
  }
  model::ForwardResult fr;
  model_.forward(rows, *cache_, fr);
  out.rows = total;

  // ---- keys: greedy / Gumbel-max over this shard, then the max across shards. One more u64 per request
  // rides along in the same max-reduction: 1 when any shard saw a NaN target logit (DDT_DATA_NAN_LOGIT),
  // so every rank agrees that the request fails (finished = 3) instead of emitting garbage tokens.
  std::vector<std::size_t> koff(static_cast<std::size_t>(B));
  std::vector<uint64_t> keys, nan_flag(static_cast<std::size_t>(B), 0);
  for (int i = 0; i < B; ++i) {
    const Live& lv = *req[std::size_t(i)];
    koff[std::size_t(i)] = keys.size();
    int nodes;
    const float* lg;
    int32_t last_pos;
    const int32_t* pos;
    if (prefill[std::size_t(i)]) {
      nodes = 1;
      last_pos = int32_t(lv.spec.prompt.size()) - 1;
      pos = &last_pos;
      lg = fr.logits.data() + std::size_t(row0[std::size_t(i)] + last_pos) * std::size_t(Vs);
    } else {
      nodes = trees[std::size_t(i)].n;
      pos = trees[std::size_t(i)].positions.data();
      lg = fr.logits.data() + std::size_t(row0[std::size_t(i)]) * std::size_t(Vs);
    }
    keys.resize(keys.size() + std::size_t(nodes));
    uint32_t status = 0;
    ddt_sample_keys_params kp{lg, Vs, 1, nodes, int(Vs), int(rg.vocab0), pos, &lv.spec.seed, lv.spec.temperature,
                              &keys[koff[std::size_t(i)]], &status};
    check_kernel(ddt_sample_keys_cpu(&kp), "ddt_sample_keys_cpu");
    if (status & DDT_DATA_NAN_LOGIT) nan_flag[std::size_t(i)] = 1;
  }
  const std::size_t flag0 = keys.size();
  keys.insert(keys.end(), nan_flag.begin(), nan_flag.end());
  if (S > 1) comm_.all_reduce(keys.data(), keys.data(), keys.size(), DType::kU64, ReduceOp::kMax);

  // ---- accept on rank 0, decisions to every rank. Record per request: path[MP], path_len, new_tokens[MP],
  // num_new, bonus, finished (MP = draft depth + 1, 1 for a prefill).
  std::vector<std::size_t> doff(static_cast<std::size_t>(B));
  std::vector<int> mp(static_cast<std::size_t>(B));
  std::size_t dsize = 0;
  for (int i = 0; i < B; ++i) {
    mp[std::size_t(i)] = prefill[std::size_t(i)] ? 1 : req[std::size_t(i)]->spec.draft_depth() + 1;
    doff[std::size_t(i)] = dsize;
    dsize += 2 * std::size_t(mp[std::size_t(i)]) + 4;
  }
  std::vector<int32_t> dec(dsize, -1);
  if (me == 0) {
    for (int i = 0; i < B; ++i) {
      const Live& lv = *req[std::size_t(i)];
      Tree pre;
      const Tree* t = &trees[std::size_t(i)];
      if (prefill[std::size_t(i)]) {
        pre.root_only(lv.spec.prompt.back(), int64_t(lv.spec.prompt.size()) - 1);
        t = &pre;
      }
      const int M = mp[std::size_t(i)];
      int32_t* d = &dec[doff[std::size_t(i)]];
      if (keys[flag0 + std::size_t(i)] != 0) {  // NaN target logits: no tokens, the request fails
        d[0] = 0;             // path = {0}
        d[M] = 1;             // path_len
        d[2 * M + 1] = 0;     // num_new
        d[2 * M + 2] = -1;    // bonus
        d[2 * M + 3] = 3;     // finished: bad data (as ddt_accept's code)
        continue;
      }
      const int32_t max_new = lv.spec.max_new - lv.emitted;
      uint32_t status = 0;
      ddt_accept_params ap{&keys[koff[std::size_t(i)]], t->tokens.data(), t->parents.data(), &t->count, 1, t->n, M,
                           &max_new, lv.spec.stop_ids.empty() ? nullptr : lv.spec.stop_ids.data(),
                           int(lv.spec.stop_ids.size()), d, d + M, d + M + 1, d + 2 * M + 1, d + 2 * M + 2,
                           d + 2 * M + 3, &status};
      check_kernel(ddt_accept_cpu(&ap), "ddt_accept_cpu");
      if (status != 0) throw EngineError("accept: data status " + std::to_string(status) + " for slot " + std::to_string(lv.spec.slot));
    }
  }
  if (S > 1) comm_.broadcast(dec.data(), dec.size(), DType::kI32, 0);

  // ---- commit: KV compaction, contexts, results (every rank)
  out.requests.resize(static_cast<std::size_t>(B));
  std::vector<std::vector<int64_t>> logit_rows(static_cast<std::size_t>(B));  // forward rows of the emitted tokens
  bool any_logits = false;
  for (int i = 0; i < B; ++i) {
    Live& lv = *req[std::size_t(i)];
    const int M = mp[std::size_t(i)];
    const int32_t* d = &dec[doff[std::size_t(i)]];
    const int32_t* path = d;
    const int32_t path_len = d[M], num_new = d[2 * M + 1], finished = d[2 * M + 3];
    const int32_t* new_tokens = d + M + 1;
    if (path_len < 1 || path_len > M || num_new < 0 || num_new > M) throw EngineError("malformed accept decision");
    RequestStepResult& r = out.requests[std::size_t(i)];
    r.slot = lv.spec.slot;
    r.prefill = prefill[std::size_t(i)];
    r.tokens.assign(new_tokens, new_tokens + num_new);
    r.accepted_draft = r.prefill ? 0 : path_len - 1;
    r.finished = finished;
    r.logits.clear();
    if (lv.spec.return_logits) {
      any_logits = true;
      for (int k = 0; k < num_new; ++k)
        logit_rows[std::size_t(i)].push_back(row0[std::size_t(i)] +
                                             (r.prefill ? int64_t(lv.spec.prompt.size()) - 1 : int64_t(path[k])));
    }
    if (r.prefill) {
      lv.committed = int64_t(lv.spec.prompt.size());
    } else {
      cache_->compact_accepted(lv.spec.slot, lv.committed, path, path_len);
      lv.committed += path_len;
    }
    cache_->truncate(lv.spec.slot, lv.committed);
    lv.tokens.insert(lv.tokens.end(), new_tokens, new_tokens + num_new);
    lv.emitted += num_new;
    r.committed = lv.committed;
  }

  // ---- test option: the emitted tokens' full logits rows on rank 0
  if (any_logits) {
    const int64_t Vmax = (V + S - 1) / S;  // the model's vocabulary chunks (the last one shorter)
    std::vector<int64_t> all;
    for (auto& v : logit_rows) all.insert(all.end(), v.begin(), v.end());
    const std::size_t R = all.size();
    std::vector<float> send(R * std::size_t(Vmax), kNegInf), recv;
    for (std::size_t k = 0; k < R; ++k)
      std::memcpy(&send[k * std::size_t(Vmax)], fr.logits.data() + std::size_t(all[k]) * std::size_t(Vs),
                  std::size_t(Vs) * sizeof(float));
    if (me == 0) recv.resize(send.size() * std::size_t(S));
    if (S > 1)
      comm_.gather(send.data(), recv.data(), send.size(), DType::kF32, 0);
    else
      recv = send;
    if (me == 0) {
      std::size_t k = 0;
      for (int i = 0; i < B; ++i) {
        std::vector<float>& lg = out.requests[std::size_t(i)].logits;
        lg.assign(logit_rows[std::size_t(i)].size() * std::size_t(V), 0.0f);
        for (std::size_t e = 0; e < logit_rows[std::size_t(i)].size(); ++e, ++k)
          for (int s = 0; s < S; ++s) {
            const int64_t v0 = int64_t(s) * Vmax, v1 = std::min<int64_t>(V, v0 + Vmax);
            if (v1 > v0)
              std::memcpy(&lg[e * std::size_t(V) + std::size_t(v0)], &recv[(std::size_t(s) * R + k) * std::size_t(Vmax)],
                          std::size_t(v1 - v0) * sizeof(float));
          }
      }
    }
  }

  // ---- finished requests leave (every rank, same order)
  for (int i = 0; i < B; ++i)
    if (out.requests[std::size_t(i)].finished != 0) {
      cache_->release(out.requests[std::size_t(i)].slot);
      live_.erase(out.requests[std::size_t(i)].slot);
    }
}

}  // namespace ddtree::engine
