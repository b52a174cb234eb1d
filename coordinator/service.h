// The gRPC service ddtree.v1.DDTree (proto/ddtree/v1/ddtree.proto) on the callback API: one reactor per
// Generate stream, fed by the scheduler's step loop through a RequestSink. Every failure becomes a gRPC
// status in one place (to_status).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "coordinator/scheduler.h"
#include "ddtree/v1/ddtree.grpc.pb.h"

namespace ddtree::coord {

// The one mapping from engine failures to gRPC status codes.
grpc::Status to_status(ErrorKind kind, const std::string& message);

struct ServerInfo {
  int world_size = 1;
  std::string build_id;
  bool test_options = false;
  double stall_after_s = 60.0;  // HealthCheck says NOT_SERVING when the step loop made no progress this long
};

class DDTreeService final : public ddtree::v1::DDTree::CallbackService {
 public:
  DDTreeService(Scheduler& scheduler, const model::ModelConfig& config, ServerInfo info);

  grpc::ServerWriteReactor<ddtree::v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                                    const ddtree::v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* HealthCheck(grpc::CallbackServerContext* ctx, const ddtree::v1::HealthCheckRequest* req,
                                        ddtree::v1::HealthCheckResponse* resp) override;

 private:
  Scheduler& scheduler_;
  const model::ModelConfig& config_;
  ServerInfo info_;
};

}  // namespace ddtree::coord
