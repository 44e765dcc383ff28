#include "gateway/reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>
#include <string>

namespace thermocline::gateway {
namespace {

namespace pb = google::protobuf;
namespace rv1 = grpc::reflection::v1;

constexpr int kNotFound = 5;         // google.rpc.Code
constexpr int kInvalidArgument = 3;  // google.rpc.Code
constexpr int kUnimplemented = 12;   // google.rpc.Code

void Error(rv1::ServerReflectionResponse* r, int code, std::string message) {
  r->mutable_error_response()->set_error_code(code);
  r->mutable_error_response()->set_error_message(std::move(message));
}

// `file` and every file it imports, dependencies first, each once: a client builds its pool
// from them in order.
void AddFileAndDeps(const pb::FileDescriptor* file, std::set<std::string>* seen,
                    rv1::FileDescriptorResponse* out) {
  if (!seen->insert(file->name()).second) return;
  for (int i = 0; i < file->dependency_count(); ++i) AddFileAndDeps(file->dependency(i), seen, out);
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
}

void Files(const pb::FileDescriptor* file, rv1::ServerReflectionResponse* r) {
  std::set<std::string> seen;
  AddFileAndDeps(file, &seen, r->mutable_file_descriptor_response());
}

}  // namespace

rv1::ServerReflectionResponse ReflectionV1Service::Answer(
    const rv1::ServerReflectionRequest& request) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  rv1::ServerReflectionResponse r;
  r.set_valid_host(request.host());
  *r.mutable_original_request() = request;
  switch (request.message_request_case()) {
    case rv1::ServerReflectionRequest::kListServices:
      for (const std::string& s : services_) {
        r.mutable_list_services_response()->add_service()->set_name(s);
      }
      break;
    case rv1::ServerReflectionRequest::kFileByFilename: {
      const pb::FileDescriptor* f = pool->FindFileByName(request.file_by_filename());
      if (f == nullptr) {
        Error(&r, kNotFound, "file not found: " + request.file_by_filename());
      } else {
        Files(f, &r);
      }
      break;
    }
    case rv1::ServerReflectionRequest::kFileContainingSymbol: {
      const pb::FileDescriptor* f = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (f == nullptr) {
        Error(&r, kNotFound, "symbol not found: " + request.file_containing_symbol());
      } else {
        Files(f, &r);
      }
      break;
    }
    case rv1::ServerReflectionRequest::kFileContainingExtension: {
      const rv1::ExtensionRequest& e = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(e.containing_type());
      const pb::FieldDescriptor* ext =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, e.extension_number());
      if (ext == nullptr) {
        Error(&r, kNotFound, "extension not found: " + e.containing_type() + " " +
                                 std::to_string(e.extension_number()));
      } else {
        Files(ext->file(), &r);
      }
      break;
    }
    case rv1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        Error(&r, kNotFound, "type not found: " + request.all_extension_numbers_of_type());
        break;
      }
      std::vector<const pb::FieldDescriptor*> exts;
      pool->FindAllExtensions(type, &exts);
      rv1::ExtensionNumberResponse* out = r.mutable_all_extension_numbers_response();
      out->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : exts) out->add_extension_number(f->number());
      break;
    }
    case rv1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      Error(&r, kInvalidArgument, "the request names no message_request");
      break;
    default:
      Error(&r, kUnimplemented, "unknown message_request");
  }
  return r;
}

grpc::Status ReflectionV1Service::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<rv1::ServerReflectionResponse, rv1::ServerReflectionRequest>* stream) {
  rv1::ServerReflectionRequest request;
  while (!context->IsCancelled() && stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace thermocline::gateway
