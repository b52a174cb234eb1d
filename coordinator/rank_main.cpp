// ddtree-rank: one rank of the engine. Start N of them with mpirun; rank 0 also hosts the coordinator
// (scheduler + gRPC service), the other ranks follow rank 0's step plans and never bind a port.
//
//   mpirun -np 2 ddtree-rank --model DIR [--listen 127.0.0.1:50051] [--mode tree] [--drafter ngram] ...
//   (ddtree-rank --help lists every option)
//
// Startup: MPI, every rank checks it runs the same build and options (Comm::check_same_everywhere), loads
// its tensor-parallel shard, a barrier, then rank 0 binds the port (--port-file gets the bound port, written
// once the server accepts calls: readiness) and runs the step loop.
// Shutdown: SIGUSR1 (mpirun forwards it to every rank; rank 0 acts on it) drains: new requests are refused,
// running and queued ones finish, then rank 0 sends the shutdown plan and every rank exits 0 together.
// Failure: any exception in a step, or the step watchdog, ends the whole job (Comm::abort, non-zero exit);
// SIGTERM / SIGINT (mpirun kills the job this way when a rank dies) fail every open stream with UNAVAILABLE
// first, then exit non-zero.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "coordinator/scheduler.h"
#include "coordinator/service.h"
#include "rank/comm/comm.h"
#include "rank/engine/engine.h"
#include "rank/model/model.h"

namespace {

using namespace ddtree;

struct Args {
  std::string model, listen = "127.0.0.1:50051", port_file, backend = "cpu";
  std::string mode = "tree", drafter = "ngram", oracle_profile;
  int depth = 4, budget = 16, max_batch = 8, max_queue = 128, page_size = 16, max_new = 64;
  int64_t max_seq_len = 1024;
  double step_timeout_s = 60.0;
  bool test_options = false;
  std::string test_fault;
  int test_fault_rank = 1;
  uint64_t test_fault_step = 3;
};

const char* kUsage =
    "usage: mpirun -np N ddtree-rank --model DIR [options]\n"
    "  --model DIR               Hugging Face model directory (config.json + safetensors)\n"
    "  --backend cpu             compute backend (cpu; cuda comes with the GPU loop)\n"
    "  --listen HOST:PORT        gRPC address of rank 0 (default 127.0.0.1:50051; port 0 = any free port)\n"
    "  --port-file FILE          rank 0 writes the bound port here once it serves (readiness)\n"
    "  --mode tree|chain|autoregressive   default speculation mode (default tree)\n"
    "  --drafter ngram|oracle    default drafter (default ngram; oracle needs --enable-test-options)\n"
    "  --depth L                 default draft depth (default 4)\n"
    "  --budget B                default tree budget (default 16)\n"
    "  --max-batch N             requests per step (default 8)\n"
    "  --max-queue N             waiting requests before RESOURCE_EXHAUSTED (default 128)\n"
    "  --max-seq-len N           KV slots per request: prompt + max_new + tree width (default 1024)\n"
    "  --page-size N             KV page size in tokens (default 16)\n"
    "  --default-max-new-tokens N  (default 64)\n"
    "  --step-timeout-s S        watchdog: a step longer than this ends the job (default 60)\n"
    "  --enable-test-options     accept TestOptions (oracle reference, returned logits)\n"
    "  --oracle-profile P        oracle rank probabilities and depth decay, 'p0,p1,...[/decay]' (default 0.6,0.15,0.1/0.9)\n"
    "  --test-fault kill|hang --test-fault-rank R --test-fault-step S   fault injection for tests\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "ddtree-rank: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--model") a.model = val();
      else if (k == "--listen") a.listen = val();
      else if (k == "--port-file") a.port_file = val();
      else if (k == "--backend") a.backend = val();
      else if (k == "--mode") a.mode = val();
      else if (k == "--drafter") a.drafter = val();
      else if (k == "--depth") a.depth = std::stoi(val());
      else if (k == "--budget") a.budget = std::stoi(val());
      else if (k == "--max-batch") a.max_batch = std::stoi(val());
      else if (k == "--max-queue") a.max_queue = std::stoi(val());
      else if (k == "--max-seq-len") a.max_seq_len = std::stoll(val());
      else if (k == "--page-size") a.page_size = std::stoi(val());
      else if (k == "--default-max-new-tokens") a.max_new = std::stoi(val());
      else if (k == "--step-timeout-s") a.step_timeout_s = std::stod(val());
      else if (k == "--enable-test-options") a.test_options = true;
      else if (k == "--oracle-profile") a.oracle_profile = val();
      else if (k == "--test-fault") a.test_fault = val();
      else if (k == "--test-fault-rank") a.test_fault_rank = std::stoi(val());
      else if (k == "--test-fault-step") a.test_fault_step = std::stoull(val());
      else if (k == "--help" || k == "-h") {
        std::fputs(kUsage, stdout);
        std::exit(0);
      } else usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  if (a.model.empty()) usage("--model is required");
  if (a.backend != "cpu") usage("--backend " + a.backend + ": only the cpu backend runs the engine so far");
  if (a.test_fault != "" && a.test_fault != "kill" && a.test_fault != "hang") usage("--test-fault kill|hang");
  return a;
}

engine::Mode parse_mode(const std::string& s) {
  if (s == "tree") return engine::Mode::kTree;
  if (s == "chain") return engine::Mode::kChain;
  if (s == "autoregressive" || s == "ar") return engine::Mode::kAutoregressive;
  usage("--mode " + s);
}
engine::DrafterKind parse_drafter(const std::string& s) {
  if (s == "ngram") return engine::DrafterKind::kNgram;
  if (s == "oracle") return engine::DrafterKind::kOracle;
  usage("--drafter " + s);
}

// Signals are blocked in every thread and taken by one sigwait thread (no async-signal-safety traps).
sigset_t handled_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGUSR1);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

int run(int argc, char** argv) {
  const sigset_t sigs = handled_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before MPI and gRPC start their threads

  auto comm = make_mpi_comm(&argc, &argv);
  const Args a = parse(argc, argv);
  const int rank = comm->rank(), world = comm->size();
  auto log = [&](const std::string& m) {
    std::fprintf(stderr, "[ddtree rank %d] %s\n", rank, m.c_str());
    std::fflush(stderr);
  };

  // Every rank must run the same build with the same engine options (the listen address may differ).
  std::ostringstream fp;
  fp << build_id() << "|" << a.model << "|" << a.mode << "|" << a.drafter << "|" << a.depth << "|" << a.budget << "|"
     << a.max_batch << "|" << a.max_seq_len << "|" << a.page_size << "|" << a.oracle_profile << "|" << a.test_options;
  comm->check_same_everywhere("build and engine options", fp.str());

  try {
    engine::EngineOptions eo;
    eo.page_size = a.page_size;
    eo.max_requests = a.max_batch;
    eo.max_seq_len = a.max_seq_len;
    eo.step_timeout_s = a.step_timeout_s;
    if (!a.oracle_profile.empty()) eo.oracle = draft::parse_oracle_profile(a.oracle_profile);
    if (!a.test_fault.empty()) {
      eo.test_fault = a.test_fault == "kill" ? 1 : 2;
      eo.test_fault_rank = a.test_fault_rank;
      eo.test_fault_step = a.test_fault_step;
    }
    model::Model model = model::Model::load(a.model, model::ShardSpec{rank, world});
    // Different checkpoints behind the same path (several hosts) would make the ranks' collectives differ.
    comm->check_same_everywhere("model config", model.config().fingerprint());
    if (world > 1)
      model.set_all_reduce([&](float* d, std::size_t n) { comm->all_reduce(d, d, n, DType::kF32, ReduceOp::kSum); });
    engine::RankEngine engine(*comm, model, eo);
    log("loaded " + a.model + " shard " + std::to_string(rank) + "/" + std::to_string(world) + " (vocab [" +
        std::to_string(model.ranges().vocab0) + ", " + std::to_string(model.ranges().vocab1) + "))");
    comm->barrier();

    if (rank != 0) {
      engine.start_watchdog();
      // Followers: SIGUSR1 is rank 0's business; SIGTERM / SIGINT end this process at once.
      std::thread([sigs] {
        for (;;) {
          int sig = 0;
          if (sigwait(&sigs, &sig) == 0 && sig != SIGUSR1) std::_Exit(128 + sig);
        }
      }).detach();
      engine.follow();
      log("shutdown");
      return 0;
    }

    coord::SchedulerOptions so;
    so.max_batch = a.max_batch;
    so.max_queue = a.max_queue;
    so.default_max_new = uint32_t(a.max_new);
    so.default_mode = parse_mode(a.mode);
    so.default_drafter = parse_drafter(a.drafter);
    so.default_depth = a.depth;
    so.default_budget = a.budget;
    so.test_options = a.test_options;
    coord::Scheduler scheduler(engine, so);
    coord::ServerInfo info;
    info.world_size = world;
    info.build_id = build_id();
    info.test_options = a.test_options;
    info.stall_after_s = a.step_timeout_s;
    coord::DDTreeService service(scheduler, model.config(), info);
    engine.start_watchdog([&scheduler](const std::string& why) {
      scheduler.fail_all(why);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the statuses reach the clients
    });

    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(a.listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    // Long silent streams (a long prefill) must not be cut by keepalive policing.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.SetMaxSendMessageSize(64 << 20);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server || port == 0) comm->abort(2, "cannot listen on " + a.listen);
    if (!a.port_file.empty()) {
      const std::string tmp = a.port_file + ".tmp";
      std::ofstream(tmp) << port << "\n";
      std::rename(tmp.c_str(), a.port_file.c_str());  // atomic: readers never see a partial file
    }
    const std::string host = a.listen.substr(0, a.listen.rfind(':'));
    log("serving ddtree.v1.DDTree on " + host + ":" + std::to_string(port) + " (world " + std::to_string(world) +
        ", default mode " + a.mode + ", drafter " + a.drafter + ")");

    std::thread([&scheduler, sigs, log] {
      for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0) continue;
        if (sig == SIGUSR1) {
          log("SIGUSR1: draining (running requests finish, new ones are refused)");
          scheduler.drain();
          continue;
        }
        log(std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") +
            ": the job is being ended; failing every open stream with UNAVAILABLE");
        scheduler.fail_all("the engine is shutting down (a rank died or the job was killed)");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the statuses reach the clients
        std::_Exit(128 + sig);
      }
    }).detach();

    try {
      scheduler.run();
    } catch (const std::exception& e) {
      scheduler.fail_all(std::string("engine failure: ") + e.what());
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      comm->abort(1, std::string("step loop: ") + e.what());
    }
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    const coord::SchedulerStats st = scheduler.stats();
    log("shutdown after " + std::to_string(st.steps) + " steps, " + std::to_string(st.completed) + " requests, " +
        std::to_string(st.generated_tokens) + " tokens");
    return 0;
  } catch (const std::exception& e) {
    comm->abort(1, e.what());
  }
  return 1;  // not reached: abort does not return
}

}  // namespace

int main(int argc, char** argv) { return run(argc, argv); }
