// The whole engine end to end on the cpu backend: real `mpirun ... ddtree-rank` jobs on a generated
// checkpoint, driven through real gRPC streams (ctest: tests/engine/CMakeLists.txt).
//
// Environment (ctest sets it): DDTREE_RANK_BIN, DDTREE_MPIEXEC, DDTREE_MPI_FLAGS (space separated),
// DDTREE_TEST_MODELS (holding moe/), DDTREE_TEST_NP (ranks of the server the suites use, default 1).
//
// Suites:
//  - RuleE (FIDELITY.md rule E, within one TP size): autoregressive vs chain vs tree, greedy and sampled,
//    oracle and n-gram drafters, prompts of 1 and page boundary +-1 tokens: bit-identical tokens AND the
//    logits each token was chosen from; the oracle's accept-length histogram covers 0..L; sampled output
//    differs from greedy at >= 20% of positions; concurrent mixed batches give every stream its solo result
//    and the server's statistics show that steps batched them.
//  - Serving: validation errors map to INVALID_ARGUMENT / FAILED_PRECONDITION, cancellation frees the request.
//  - CrossNp (rule M): -np 1 vs -np 2, teacher forced on the same tokens while they agree.
//  - Fault: rank 1 killed mid-stream / hung: the client gets an error, the job exits non-zero, in time.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddtree/v1/ddtree.grpc.pb.h"

namespace {

namespace v1 = ::ddtree::v1;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string env(const char* k, const char* def = "") {
  const char* v = std::getenv(k);
  return v ? v : def;
}
int test_np() { return std::atoi(env("DDTREE_TEST_NP", "1").c_str()); }
std::string model_dir() {
  const std::string root = env("DDTREE_TEST_MODELS");
  return root.empty() ? root : root + "/moe";
}

// ---------------------------------------------------------------------------------------------------
// A server job: mpirun -np N ddtree-rank ... in its own process group, output to a log file.
class Server {
 public:
  static std::unique_ptr<Server> start(int np, const std::vector<std::string>& extra, const std::string& model = "") {
    auto s = std::unique_ptr<Server>(new Server());
    static int counter = 0;
    s->dir_ = fs::temp_directory_path() / ("ddtree_e2e_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(s->dir_);
    s->log_ = (s->dir_ / "server.log").string();
    const std::string port_file = (s->dir_ / "port").string();
    std::vector<std::string> args = {env("DDTREE_MPIEXEC", "mpirun"), "-np", std::to_string(np)};
    std::istringstream fl(env("DDTREE_MPI_FLAGS"));
    for (std::string f; fl >> f;) args.push_back(f);
    for (const std::string& a : {env("DDTREE_RANK_BIN"), std::string("--model"), model.empty() ? model_dir() : model,
                                 std::string("--listen"),
                                 std::string("127.0.0.1:0"), std::string("--port-file"), port_file,
                                 std::string("--enable-test-options")})
      args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    s->np_ = np;
    s->pid_ = fork();
    if (s->pid_ == 0) {
      setpgid(0, 0);
      const int fd = open(s->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> av;
      for (auto& a : args) av.push_back(a.data());
      av.push_back(nullptr);
      execvp(av[0], av.data());
      _exit(127);
    }
    setpgid(s->pid_, s->pid_);
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (!fs::exists(port_file)) {
      if (s->poll_exit() || Clock::now() > until) {
        ADD_FAILURE() << "server did not start; log:\n" << s->log_text();
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream(port_file) >> s->port_;
    s->channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(s->port_), grpc::InsecureChannelCredentials());
    s->stub_ = v1::DDTree::NewStub(s->channel_);
    return s;
  }

  ~Server() {
    if (!exit_code_) {
      kill(-pid_, SIGKILL);
      wait_exit(10);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  v1::DDTree::Stub& stub() { return *stub_; }
  int np() const { return np_; }
  pid_t pid() const { return pid_; }
  std::string log_text() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // The job's exit status once it ended (non-blocking).
  bool poll_exit() {
    if (exit_code_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return true;
    }
    return false;
  }
  std::optional<int> wait_exit(double timeout_s) {
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (!poll_exit()) {
      if (Clock::now() > until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }
  // Graceful drain (SIGUSR1 to mpirun, which forwards it): the job must exit 0 by itself.
  std::optional<int> stop(double timeout_s) {
    kill(pid_, SIGUSR1);
    return wait_exit(timeout_s);
  }

  v1::HealthCheckResponse health() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::HealthCheckResponse r;
    const grpc::Status st = stub_->HealthCheck(&ctx, v1::HealthCheckRequest(), &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return r;
  }

 private:
  Server() = default;
  fs::path dir_;
  std::string log_;
  int np_ = 0, port_ = 0;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DDTree::Stub> stub_;
};

// One server per -np, shared by the suites, drained at the end (which must be clean: exit 0).
std::map<int, std::unique_ptr<Server>>& servers() {
  static std::map<int, std::unique_ptr<Server>> s;
  return s;
}
Server* shared_server(int np) {
  auto& s = servers()[np];
  if (!s) s = Server::start(np, {"--max-batch", "8", "--page-size", "16", "--oracle-profile", "0.65,0.15,0.1/0.96"});
  return s.get();
}
class StopServers : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto& [np, s] : servers()) {
      if (!s) continue;
      const auto rc = s->stop(30);
      EXPECT_TRUE(rc.has_value()) << "np " << np << ": the job did not exit after SIGUSR1 (drain)";
      if (rc) {
        EXPECT_EQ(*rc, 0) << "np " << np << ": drain must exit 0; log:\n" << s->log_text();
      }
    }
    servers().clear();
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new StopServers);

#define REQUIRE_ENV()                                                                      \
  if (!model_dir().empty() && !env("DDTREE_RANK_BIN").empty()) {                       \
  } else                                                                                   \
    GTEST_SKIP() << "DDTREE_TEST_MODELS / DDTREE_RANK_BIN not set (run through ctest)";

// ---------------------------------------------------------------------------------------------------
// Requests and results.
struct Spec {
  v1::SpeculationMode mode = v1::SPECULATION_MODE_AUTOREGRESSIVE;
  v1::DrafterKind drafter = v1::DRAFTER_KIND_UNSPECIFIED;
  int depth = 0, budget = 0;
  std::string name() const {
    std::string m = mode == v1::SPECULATION_MODE_AUTOREGRESSIVE ? "ar" : mode == v1::SPECULATION_MODE_CHAIN ? "chain" : "tree";
    if (drafter == v1::DRAFTER_KIND_ORACLE) m += "/oracle";
    if (drafter == v1::DRAFTER_KIND_NGRAM) m += "/ngram";
    return m + " L" + std::to_string(depth) + " B" + std::to_string(budget);
  }
};

v1::GenerateRequest make_request(const std::vector<int32_t>& prompt, int max_new, float temperature, uint64_t seed,
                                 const Spec& sp, const std::vector<int32_t>& reference = {}, bool logits = true) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_token_ids(t);
  r.mutable_stopping()->set_max_new_tokens(uint32_t(max_new));
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(temperature);
  r.mutable_sampling()->set_seed(seed);
  r.mutable_speculation()->set_mode(sp.mode);
  r.mutable_speculation()->set_drafter(sp.drafter);
  r.mutable_speculation()->set_draft_depth(uint32_t(sp.depth));
  r.mutable_speculation()->set_tree_budget(uint32_t(sp.budget));
  for (int32_t t : reference) r.mutable_test_options()->add_oracle_reference_token_ids(t);
  r.mutable_test_options()->set_return_logits(logits);
  return r;
}

struct Result {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  bool complete = false;
  v1::Complete done;
  int chunks = 0;
};

Result generate(v1::DDTree::Stub& stub, const v1::GenerateRequest& req, double deadline_s = 120) {
  Result res;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(int64_t(deadline_s * 1000)));
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_chunk()) {
      ++res.chunks;
      res.tokens.insert(res.tokens.end(), m.chunk().token_ids().begin(), m.chunk().token_ids().end());
      res.logits.insert(res.logits.end(), m.chunk().test_logits().begin(), m.chunk().test_logits().end());
    } else if (m.has_complete()) {
      res.complete = true;
      res.done = m.complete();
    }
  }
  res.status = reader->Finish();
  return res;
}

std::vector<int32_t> prompt_of(int len, uint64_t seed, int vocab, bool repetitive = false) {
  std::vector<int32_t> p;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < len; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p.push_back(repetitive && i >= 6 ? p[std::size_t(i % 6)] : int32_t(x % uint64_t(vocab)));
  }
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, std::size_t* first = nullptr) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first) *first = i;
      return false;
    }
  return true;
}

void add_hist(std::vector<uint64_t>& h, const v1::Complete& c) {
  const auto& a = c.usage().accept_length_counts();
  if (h.size() < std::size_t(a.size())) h.resize(std::size_t(a.size()), 0);
  for (int i = 0; i < a.size(); ++i) h[std::size_t(i)] += a[i];
}
std::string hist_str(const std::vector<uint64_t>& h) {
  std::string s;
  for (uint64_t x : h) s += std::to_string(x) + " ";
  return s;
}

constexpr int kVocab = 3001;  // the moe preset
constexpr int kMaxNew = 24;

// ---------------------------------------------------------------------------------------------------
// Rule E: every mode and drafter gives the autoregressive run's tokens and logits, bitwise.
TEST(RuleE, ModesAgreeGreedyAndSampled) {
  REQUIRE_ENV();
  Server* srv = shared_server(test_np());
  ASSERT_NE(srv, nullptr);
  const int L = 4;
  const std::vector<Spec> specs = {
      {v1::SPECULATION_MODE_CHAIN, v1::DRAFTER_KIND_ORACLE, L, 0},
      {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, L, 12},
      {v1::SPECULATION_MODE_CHAIN, v1::DRAFTER_KIND_NGRAM, L, 0},
      {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, L, 12},
      {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, 5, 30},  // deeper and bushier
      {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, 1, 8},   // a star
  };
  // Prompts of 1 token, page boundaries +-1 (page size 16), and a repetitive one (n-gram matches).
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(1, 1, kVocab), prompt_of(15, 2, kVocab),
                                                     prompt_of(16, 3, kVocab), prompt_of(17, 4, kVocab),
                                                     prompt_of(30, 5, kVocab, true)};
  std::map<std::string, std::vector<uint64_t>> hist;
  std::map<std::string, std::pair<double, double>> speed;  // tokens, seconds (server side, total_seconds)
  std::vector<std::vector<int32_t>> greedy(prompts.size());
  std::size_t differ = 0, total = 0;
  for (float temp : {0.0f, 1.0f}) {
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      const uint64_t seed = 1000 + p;
      const Result ref = generate(srv->stub(), make_request(prompts[p], kMaxNew, temp, seed, Spec{}));
      ASSERT_TRUE(ref.status.ok()) << ref.status.error_message();
      ASSERT_EQ(ref.tokens.size(), std::size_t(kMaxNew));
      ASSERT_EQ(ref.logits.size(), std::size_t(kMaxNew) * kVocab);
      speed["ar"].first += double(ref.tokens.size());
      speed["ar"].second += ref.done.total_seconds();
      EXPECT_EQ(ref.done.finish_reason(), v1::FINISH_REASON_LENGTH);
      if (temp == 0.0f) {
        greedy[p] = ref.tokens;
      } else {
        for (std::size_t i = 0; i < ref.tokens.size(); ++i) differ += ref.tokens[i] != greedy[p][i];
        total += ref.tokens.size();
      }
      for (const Spec& sp : specs) {
        SCOPED_TRACE("temperature " + std::to_string(temp) + ", prompt " + std::to_string(p) + ", " + sp.name());
        const Result r = generate(srv->stub(), make_request(prompts[p], kMaxNew, temp, seed, sp, ref.tokens));
        ASSERT_TRUE(r.status.ok()) << r.status.error_message();
        EXPECT_EQ(r.tokens, ref.tokens);
        std::size_t at = 0;
        EXPECT_TRUE(same_bits(r.logits, ref.logits, &at))
            << "logits differ first at token " << at / kVocab << ", column " << at % kVocab;
        add_hist(hist[sp.name() + (temp > 0 ? " sampled" : " greedy")], r.done);
        speed[sp.name()].first += double(r.tokens.size());
        speed[sp.name()].second += r.done.total_seconds();
      }
    }
  }
  for (auto& [name, h] : hist) {
    std::printf("accept-length histogram %-28s: %s\n", name.c_str(), hist_str(h).c_str());
    if (name.find("oracle") != std::string::npos) {
      const int depth = std::stoi(name.substr(name.find(" L") + 2));
      ASSERT_EQ(h.size(), std::size_t(depth + 1)) << name;
      for (int a = 0; a <= depth; ++a) EXPECT_GT(h[std::size_t(a)], 0u) << name << ": no step accepted " << a;
    }
  }
  for (auto& [name, ts] : speed)
    std::printf("np %d %-22s: %.0f tokens in %.2f s = %.0f tokens/s (one stream, returned logits included)\n",
                srv->np(), name.c_str(), ts.first, ts.second, ts.first / ts.second);
  std::printf("sampled (T=1) differs from greedy at %zu of %zu positions\n", differ, total);
  EXPECT_GE(double(differ), 0.2 * double(total));
}

// Concurrent streams of every mode in one batch: each gets exactly its solo result; steps batched them.
TEST(RuleE, ConcurrentMixedBatches) {
  REQUIRE_ENV();
  Server* srv = shared_server(test_np());
  ASSERT_NE(srv, nullptr);
  struct Job {
    std::vector<int32_t> prompt;
    float temp;
    Spec spec;
    Result solo, mixed;
  };
  std::vector<Job> jobs;
  const Spec specs[] = {{v1::SPECULATION_MODE_AUTOREGRESSIVE, v1::DRAFTER_KIND_UNSPECIFIED, 0, 0},
                        {v1::SPECULATION_MODE_CHAIN, v1::DRAFTER_KIND_ORACLE, 3, 0},
                        {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, 4, 10},
                        {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, 3, 8},
                        {v1::SPECULATION_MODE_CHAIN, v1::DRAFTER_KIND_NGRAM, 5, 0},
                        {v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, 2, 20}};
  for (int i = 0; i < 6; ++i)
    jobs.push_back(Job{prompt_of(1 + 7 * i, 50 + uint64_t(i), kVocab, i == 4), i % 2 ? 0.8f : 0.0f, specs[i], {}, {}});
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    const Result ar = generate(srv->stub(), make_request(j.prompt, kMaxNew, j.temp, 7 + i, Spec{}, {}, false));
    ASSERT_TRUE(ar.status.ok());
    j.solo = generate(srv->stub(), make_request(j.prompt, kMaxNew, j.temp, 7 + i, j.spec, ar.tokens));
    ASSERT_TRUE(j.solo.status.ok());
    EXPECT_EQ(j.solo.tokens, ar.tokens);
  }
  const uint32_t max_before = srv->health().stats().max_step_batch_requests();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::thread> th;
    for (std::size_t i = 0; i < jobs.size(); ++i)
      th.emplace_back([&, i] {
        Job& j = jobs[i];
        const Result ar_ref = j.solo;
        j.mixed = generate(srv->stub(), make_request(j.prompt, kMaxNew, j.temp, 7 + i, j.spec, ar_ref.tokens));
      });
    for (auto& t : th) t.join();
    uint32_t most = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      SCOPED_TRACE("round " + std::to_string(round) + ", stream " + std::to_string(i) + " " + jobs[i].spec.name());
      const Job& j = jobs[i];
      ASSERT_TRUE(j.mixed.status.ok()) << j.mixed.status.error_message();
      EXPECT_EQ(j.mixed.tokens, j.solo.tokens);
      EXPECT_TRUE(same_bits(j.mixed.logits, j.solo.logits));
      most = std::max(most, j.mixed.done.usage().max_step_batch_requests());
    }
    std::printf("round %d: the most requests one step batched (seen by the streams) = %u\n", round, most);
    EXPECT_GE(most, 3u) << "steps did not batch the concurrent streams";
  }
  const v1::HealthCheckResponse h = srv->health();
  std::printf("server: steps %llu, rows %llu, max batch %u (before the concurrent rounds: %u), drafts %llu, "
              "accepted %llu\n",
              (unsigned long long)h.stats().steps_total(), (unsigned long long)h.stats().step_rows_total(),
              h.stats().max_step_batch_requests(), max_before, (unsigned long long)h.stats().spec_decode_num_drafts(),
              (unsigned long long)h.stats().spec_decode_num_accepted_tokens());
  EXPECT_GE(h.stats().max_step_batch_requests(), 3u);
}

// ---------------------------------------------------------------------------------------------------
TEST(Serving, ValidationStatusCodes) {
  REQUIRE_ENV();
  Server* srv = shared_server(test_np());
  ASSERT_NE(srv, nullptr);
  const Spec tree{v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, 4, 8};
  EXPECT_EQ(generate(srv->stub(), make_request({}, 4, 0, 0, tree)).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(generate(srv->stub(), make_request({1, kVocab}, 4, 0, 0, tree)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(generate(srv->stub(), make_request({1, 2}, 4, 0, 0, Spec{v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, 4, 600}))
                .status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(generate(srv->stub(), make_request({1, 2}, 4, 0, 0, Spec{v1::SPECULATION_MODE_CHAIN, v1::DRAFTER_KIND_NGRAM, 33, 0}))
                .status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(generate(srv->stub(), make_request({1, 2}, 100000, 0, 0, tree)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(generate(srv->stub(), make_request({1, 2}, 4, -1.0f, 0, tree)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Defaults (mode, drafter, depth, budget, max_new) come from the server: a bare request works.
  v1::GenerateRequest bare;
  bare.add_prompt_token_ids(3);
  bare.mutable_stopping()->set_max_new_tokens(3);
  bare.mutable_stopping()->set_ignore_eos(true);
  const Result r = generate(srv->stub(), bare);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.done.usage().accept_length_counts_size(), 5) << "server default depth 4";
}

TEST(Serving, StopTokensAndCancel) {
  REQUIRE_ENV();
  Server* srv = shared_server(test_np());
  ASSERT_NE(srv, nullptr);
  const auto prompt = prompt_of(9, 77, kVocab);
  const Result ref = generate(srv->stub(), make_request(prompt, 12, 0, 0, Spec{}, {}, false));
  ASSERT_TRUE(ref.status.ok());
  // A stop token ends the stream right after it, in every mode (tree: the stop may sit mid-path).
  for (const Spec& sp : {Spec{}, Spec{v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_ORACLE, 4, 8}}) {
    v1::GenerateRequest req = make_request(prompt, 12, 0, 0, sp, ref.tokens, false);
    req.mutable_stopping()->add_stop_token_ids(ref.tokens[5]);
    const Result r = generate(srv->stub(), req);
    ASSERT_TRUE(r.status.ok());
    const auto stop_at = std::find(ref.tokens.begin(), ref.tokens.end(), ref.tokens[5]) - ref.tokens.begin();
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + stop_at + 1)) << sp.name();
    EXPECT_EQ(r.done.finish_reason(), v1::FINISH_REASON_STOP);
  }
  // Cancel after the first chunk: the stream ends CANCELLED and the server drops the request.
  {
    grpc::ClientContext ctx;
    auto reader = srv->stub().Generate(&ctx, make_request(prompt, 900, 0, 0, Spec{}, {}, false));
    v1::GenerateResponse m;
    ASSERT_TRUE(reader->Read(&m));
    ctx.TryCancel();
    while (reader->Read(&m)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (srv->health().stats().running_requests() != 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(srv->health().stats().running_requests(), 0u) << "the cancelled request is still running";
  const Result again = generate(srv->stub(), make_request(prompt, 12, 0, 0, Spec{}, {}, false));
  EXPECT_TRUE(again.status.ok());
  EXPECT_EQ(again.tokens, ref.tokens);
}

// A checkpoint whose LM head row 0 is NaN (bf16 0x7FC0): every target row holds a NaN logit. The kernels
// flag it (DDT_DATA_NAN_LOGIT), the ranks agree through the keys' max-reduction, and the request fails with
// INTERNAL and no tokens, while the job keeps serving.
TEST(Serving, NanLogitsFailTheRequestNotTheJob) {
  REQUIRE_ENV();
  const fs::path dir = fs::temp_directory_path() / ("ddtree_e2e_nan_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(model_dir(), dir, fs::copy_options::recursive);
  {  // find lm_head.weight in its shard and overwrite its first row with NaN
    std::string index((std::istreambuf_iterator<char>(std::ifstream(dir / "model.safetensors.index.json").rdbuf())),
                      std::istreambuf_iterator<char>());
    const std::string key = "\"lm_head.weight\": \"";
    const auto at = index.find(key);
    ASSERT_NE(at, std::string::npos);
    const std::string shard = index.substr(at + key.size(), index.find('"', at + key.size()) - at - key.size());
    std::fstream f(dir / shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t hlen = 0;
    f.read(reinterpret_cast<char*>(&hlen), 8);
    std::string hdr(hlen, '\0');
    f.read(hdr.data(), std::streamsize(hlen));
    const auto t = hdr.find("\"lm_head.weight\"");
    ASSERT_NE(t, std::string::npos);
    ASSERT_NE(hdr.find("\"BF16\"", t), std::string::npos);
    const auto off = hdr.find("\"data_offsets\"", t);
    const auto lb = hdr.find('[', off);
    const uint64_t begin = std::stoull(hdr.substr(lb + 1));
    const std::vector<uint16_t> nan_row(256, 0x7FC0);  // hidden size of the moe preset
    f.seekp(std::streamoff(8 + hlen + begin));
    f.write(reinterpret_cast<const char*>(nan_row.data()), std::streamsize(nan_row.size() * 2));
  }
  auto srv = Server::start(test_np(), {}, dir.string());
  ASSERT_NE(srv, nullptr);
  for (const Spec& sp : {Spec{}, Spec{v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, 4, 8}}) {
    const Result r = generate(srv->stub(), make_request(prompt_of(8, 5, kVocab), 6, 0, 0, sp, {}, false));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL) << sp.name() << ": " << r.status.error_message();
    EXPECT_TRUE(r.tokens.empty()) << sp.name();
  }
  EXPECT_EQ(srv->health().status(), v1::SERVING_STATUS_SERVING) << "one bad request must not end the job";
  EXPECT_EQ(srv->health().stats().running_requests(), 0u);
  const auto rc = srv->stop(30);
  EXPECT_TRUE(rc.has_value() && *rc == 0) << srv->log_text();
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------------
// Rule M between -np 1 and -np 2 (fp32 on both sides: relative error <= 1e-4 per position), teacher
// forced: both runs see the same tokens as long as their greedy choices agree; they must agree wherever the
// reference (np 1) is decisive (top-1 minus top-2 > 1e-2 x std of the row).
TEST(CrossNp, RuleMOneVsTwoRanks) {
  REQUIRE_ENV();
  Server* a = shared_server(1);
  Server* b = shared_server(2);
  ASSERT_TRUE(a && b);
  int below_eps = 0, compared = 0;
  double worst = 0;
  for (int p = 0; p < 4; ++p) {
    const auto prompt = prompt_of(3 + 9 * p, 300 + uint64_t(p), kVocab);
    const Spec tree{v1::SPECULATION_MODE_TREE, v1::DRAFTER_KIND_NGRAM, 4, 12};
    const Result ra = generate(a->stub(), make_request(prompt, kMaxNew, 0, 0, Spec{}));
    const Result rb = generate(b->stub(), make_request(prompt, kMaxNew, 0, 0, p % 2 ? tree : Spec{}));
    ASSERT_TRUE(ra.status.ok() && rb.status.ok());
    for (std::size_t t = 0; t < ra.tokens.size(); ++t) {
      const float* x = &ra.logits[t * kVocab];
      const float* y = &rb.logits[t * kVocab];
      double num = 0, den = 0, mean = 0, var = 0;
      for (int v = 0; v < kVocab; ++v) {
        num += double(x[v] - y[v]) * double(x[v] - y[v]);
        den += double(x[v]) * double(x[v]);
        mean += x[v];
      }
      mean /= kVocab;
      for (int v = 0; v < kVocab; ++v) var += (x[v] - mean) * (x[v] - mean);
      const double rel = std::sqrt(num / den);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-4) << "prompt " << p << " position " << t;
      ++compared;
      std::vector<float> s(x, x + kVocab);
      std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
      const bool decisive = s[0] - s[1] > 1e-2 * std::sqrt(var / kVocab);
      if (!decisive) ++below_eps;
      if (ra.tokens[t] != rb.tokens[t]) {
        EXPECT_FALSE(decisive) << "np1 and np2 disagree at a decisive position " << t;
        break;  // the sequences diverge: teacher forcing ends here
      }
    }
  }
  std::printf("rule M np1 vs np2: %d positions, worst relative error %.3g, %d below eps\n", compared, worst, below_eps);
}

// ---------------------------------------------------------------------------------------------------
// Faults: the job must end by itself, non-zero, and the client must see an error.
void fault_case(const std::vector<std::string>& flags, const char* what) {
  auto srv = Server::start(2, flags);
  ASSERT_NE(srv, nullptr);
  const auto t0 = Clock::now();
  const Result r = generate(srv->stub(), make_request(prompt_of(8, 9, kVocab), 400, 0, 0, Spec{}, {}, false), 60);
  std::printf("%s: client status %d (%s) after %zu tokens, %.2f s\n", what, int(r.status.error_code()),
              r.status.error_message().c_str(), r.tokens.size(),
              std::chrono::duration<double>(Clock::now() - t0).count());
  EXPECT_FALSE(r.status.ok()) << "the client must see an error";
  EXPECT_FALSE(r.complete);
  EXPECT_GT(r.tokens.size(), 0u) << "the fault should hit mid-stream";
  const auto rc = srv->wait_exit(45);
  ASSERT_TRUE(rc.has_value()) << "the job did not exit by itself; log:\n" << srv->log_text();
  EXPECT_NE(*rc, 0) << srv->log_text();
  std::printf("%s: job exit %d after %.2f s\n--- server log\n%s---\n", what, *rc,
              std::chrono::duration<double>(Clock::now() - t0).count(), srv->log_text().c_str());
}

TEST(Fault, KillRank1MidStream) {
  REQUIRE_ENV();
  fault_case({"--test-fault", "kill", "--test-fault-rank", "1", "--test-fault-step", "6"}, "rank 1 killed");
}

TEST(Fault, HungRankWatchdogEndsJob) {
  REQUIRE_ENV();
  fault_case({"--test-fault", "hang", "--test-fault-rank", "1", "--test-fault-step", "6", "--step-timeout-s", "2"},
             "rank 1 hung");
}

}  // namespace
