// grpc.reflection.v1 for the gateway's gRPC server. Debian's gRPC (1.51) serves reflection
// only as v1alpha (grpc::reflection::InitProtoReflectionServerBuilderPlugin), while current
// grpcurl and grpc_cli ask for v1 first; this answers v1 from the same place v1alpha does, the
// process's generated descriptor pool, so both versions describe the API identically.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace thermocline::gateway {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::Service {
 public:
  // `services`: the fully-qualified names list_services reports (what the server registers;
  // the health service is gRPC's own and has no descriptor in the pool, as with v1alpha).
  explicit ReflectionV1Service(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1::ServerReflectionResponse,
                               grpc::reflection::v1::ServerReflectionRequest>* stream) override;

  // The answer to one request (exposed for tests).
  grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
};

}  // namespace thermocline::gateway
