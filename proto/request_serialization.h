// How gRPC turns the bytes of a thermocline.v1 request into its message, for every binary that
// includes the generated service (grpc_cpp_plugin's additional_header_includes puts this header
// into generation.grpc.pb.h, ahead of any use).
//
// gRPC's default deserializer answers any parse failure with INTERNAL and empty details, and a
// proto3 string field that is not UTF-8 is a parse failure: a bad request would look like a
// server fault with no word of what was wrong. These specializations read the same wire format
// (nothing changes for clients, the descriptors and reflection stay those of generation.proto),
// but refuse such a request with INVALID_ARGUMENT naming the field ("stop[1] must be valid
// UTF-8 ..."), and a request that is not protobuf at all with INVALID_ARGUMENT naming the type.
//
// Only the streaming calls' requests (GenerateRequest, ChatRequest) are specialized: generated
// unary handlers parse through the base
// protobuf::MessageLite, which cannot be specialized for one service without changing every
// other (health, reflection) in the same binary, so the gateway registers its unary methods
// raw and calls DeserializeRequest itself (gateway/service.h).
#pragma once

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>

#include "thermocline/v1/generation.pb.h"

namespace thermocline::v1 {

// Parses `buffer` into `msg` (and clears the buffer). Before the real parse, every string field
// the descriptor names, nested messages included, is checked for UTF-8 with protobuf's own test,
// so the field the parser would refuse is the one named.
grpc::Status DeserializeRequest(grpc::ByteBuffer* buffer, google::protobuf::Message* msg);

template <class T>
class RequestSerializationTraits {
 public:
  static grpc::Status Serialize(const grpc::protobuf::MessageLite& msg, grpc::ByteBuffer* bb,
                                bool* own_buffer) {
    return grpc::GenericSerialize<grpc::ProtoBufferWriter, T>(msg, bb, own_buffer);
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer, T* msg) {
    return DeserializeRequest(buffer, msg);
  }
};

}  // namespace thermocline::v1

namespace grpc {

template <>
class SerializationTraits<thermocline::v1::GenerateRequest, void>
    : public thermocline::v1::RequestSerializationTraits<thermocline::v1::GenerateRequest> {};

template <>
class SerializationTraits<thermocline::v1::ChatRequest, void>
    : public thermocline::v1::RequestSerializationTraits<thermocline::v1::ChatRequest> {};

}  // namespace grpc
