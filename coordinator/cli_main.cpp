// ddtree-cli: a command-line client of ddtree.v1.DDTree.
//
//   ddtree-cli health   [--addr HOST:PORT] [--wait-s S]      exit 0 once the server is SERVING
//   ddtree-cli generate [--addr HOST:PORT] --prompt 1,2,3 [--max-new-tokens N] [--temperature T] [--seed S]
//                       [--mode tree|chain|autoregressive] [--drafter ngram|oracle] [--depth L] [--budget B]
//                       [--stop 5,6] [--ignore-eos] [--quiet]
// generate prints each chunk's token ids as they stream, then the finish reason, usage and throughput.
// Exit status: 0 on success, 1 when the stream ends with an error status (printed), 2 for usage errors.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddtree/v1/ddtree.grpc.pb.h"

namespace {

namespace v1 = ::ddtree::v1;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "ddtree-cli: %s\nusage: ddtree-cli health [--addr HOST:PORT] [--wait-s S]\n"
               "       ddtree-cli generate [--addr HOST:PORT] --prompt 1,2,3 [--max-new-tokens N] [--temperature T]\n"
               "                  [--seed S] [--mode tree|chain|autoregressive] [--drafter ngram|oracle] [--depth L]\n"
               "                  [--budget B] [--stop ID,...] [--ignore-eos] [--quiet]\n",
               why.c_str());
  std::exit(2);
}

std::vector<int32_t> ids(const std::string& s) {
  std::vector<int32_t> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ',')) v.push_back(int32_t(std::stol(t)));
  return v;
}

const char* reason_name(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_EOS: return "eos";
    case v1::FINISH_REASON_CANCELLED: return "cancelled";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "error";
  }
}

int health(v1::DDTree::Stub& stub, double wait_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::HealthCheckResponse resp;
    const grpc::Status st = stub.HealthCheck(&ctx, v1::HealthCheckRequest(), &resp);
    if (st.ok() && resp.status() == v1::SERVING_STATUS_SERVING) {
      std::printf("serving: world %u, model %s (vocab %u), steps %llu, max batch %u, build %s\n", resp.world_size(),
                  resp.model().model_type().c_str(), resp.model().vocab_size(),
                  (unsigned long long)resp.stats().steps_total(), resp.stats().max_step_batch_requests(),
                  resp.build_id().c_str());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= until) {
      std::fprintf(stderr, "ddtree-cli: not serving: %s\n",
                   st.ok() ? v1::ServingStatus_Name(resp.status()).c_str() : st.error_message().c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("a command is required");
  const std::string cmd = argv[1];
  std::string addr = "127.0.0.1:50051";
  double wait_s = 0;
  bool quiet = false;
  v1::GenerateRequest req;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--addr") addr = val();
      else if (k == "--wait-s") wait_s = std::stod(val());
      else if (k == "--prompt") for (int32_t t : ids(val())) req.add_prompt_token_ids(t);
      else if (k == "--max-new-tokens") req.mutable_stopping()->set_max_new_tokens(uint32_t(std::stoul(val())));
      else if (k == "--stop") for (int32_t t : ids(val())) req.mutable_stopping()->add_stop_token_ids(t);
      else if (k == "--ignore-eos") req.mutable_stopping()->set_ignore_eos(true);
      else if (k == "--temperature") req.mutable_sampling()->set_temperature(std::stof(val()));
      else if (k == "--seed") req.mutable_sampling()->set_seed(std::stoull(val()));
      else if (k == "--depth") req.mutable_speculation()->set_draft_depth(uint32_t(std::stoul(val())));
      else if (k == "--budget") req.mutable_speculation()->set_tree_budget(uint32_t(std::stoul(val())));
      else if (k == "--mode") {
        const std::string m = val();
        req.mutable_speculation()->set_mode(m == "tree"    ? v1::SPECULATION_MODE_TREE
                                            : m == "chain" ? v1::SPECULATION_MODE_CHAIN
                                            : m == "autoregressive" || m == "ar" ? v1::SPECULATION_MODE_AUTOREGRESSIVE
                                                                                 : (usage("--mode " + m), v1::SPECULATION_MODE_UNSPECIFIED));
      } else if (k == "--drafter") {
        const std::string d = val();
        req.mutable_speculation()->set_drafter(d == "ngram"    ? v1::DRAFTER_KIND_NGRAM
                                               : d == "oracle" ? v1::DRAFTER_KIND_ORACLE
                                                               : (usage("--drafter " + d), v1::DRAFTER_KIND_UNSPECIFIED));
      } else if (k == "--quiet") quiet = true;
      else usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = v1::DDTree::NewStub(channel);
  if (cmd == "health") return health(*stub, wait_s);
  if (cmd != "generate") usage("unknown command " + cmd);
  if (req.prompt_token_ids_size() == 0) usage("--prompt is required");

  grpc::ClientContext ctx;
  const auto t0 = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse msg;
  std::size_t n = 0;
  bool complete = false;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) {
      n += std::size_t(msg.chunk().token_ids_size());
      if (!quiet) {
        std::printf("step %llu (batch %u, accepted %u):", (unsigned long long)msg.chunk().step(),
                    msg.chunk().step_batch_requests(), msg.chunk().accepted_draft_tokens());
        for (int32_t t : msg.chunk().token_ids()) std::printf(" %d", t);
        std::printf("\n");
        std::fflush(stdout);
      }
    } else if (msg.has_complete()) {
      complete = true;
      const v1::Complete& c = msg.complete();
      const v1::Usage& u = c.usage();
      std::printf("finish_reason=%s prompt_tokens=%u completion_tokens=%u steps=%u tokens_per_step=%.2f\n",
                  reason_name(c.finish_reason()), u.prompt_tokens(), u.completion_tokens(), u.steps(),
                  u.steps() ? double(u.completion_tokens()) / u.steps() : 0.0);
      std::printf("accept_length_counts (accepted draft tokens per decode step: 0, 1, ...):");
      for (uint32_t x : u.accept_length_counts()) std::printf(" %u", x);
      std::printf("\n");
      std::printf("first_token_s=%.3f total_s=%.3f tokens_per_s=%.1f\n", c.first_token_seconds(), c.total_seconds(),
                  c.total_seconds() > 0 ? u.completion_tokens() / c.total_seconds() : 0.0);
    }
  }
  const grpc::Status st = reader->Finish();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) {
    std::fprintf(stderr, "ddtree-cli: stream failed after %zu tokens: %s: %s\n", n,
                 code_name(st.error_code()), st.error_message().c_str());
    return 1;
  }
  if (!complete) {
    std::fprintf(stderr, "ddtree-cli: stream ended without a complete message\n");
    return 1;
  }
  if (!quiet) std::printf("client wall %.3f s\n", wall);
  return 0;
}
