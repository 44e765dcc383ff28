#include "proto/request_serialization.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/stubs/common.h>
#include <google/protobuf/unknown_field_set.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace thermocline::v1 {
namespace {

namespace pb = google::protobuf;

// Messages nest no deeper than this in generation.proto; deeper input is not one of ours.
constexpr int kMaxDepth = 16;

// The wire fields of `bytes` read without a schema (UnknownFieldSet keeps every field as it
// came), matched to `type`'s fields by number: the path of the first string field that is not
// UTF-8, "" when all are, nullopt when the bytes are not protobuf.
std::optional<std::string> FirstInvalidString(const std::string& bytes, const pb::Descriptor& type,
                                              const std::string& prefix, int depth) {
  if (depth > kMaxDepth) return std::nullopt;
  pb::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return std::nullopt;
  std::map<int, int> seen;  // field number -> occurrences so far (index of a repeated field)
  for (int i = 0; i < fields.field_count(); ++i) {
    const pb::UnknownField& f = fields.field(i);
    if (f.type() != pb::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const pb::FieldDescriptor* fd = type.FindFieldByNumber(f.number());
    if (fd == nullptr) continue;  // a field this version does not know: the parser skips it too
    const int index = seen[f.number()]++;
    std::string path = prefix + fd->name();
    if (fd->is_repeated()) path += "[" + std::to_string(index) + "]";
    if (fd->type() == pb::FieldDescriptor::TYPE_STRING) {
      const std::string& s = f.length_delimited();
      // protobuf's own test, so that the field named is exactly the one its parser refuses.
      if (!pb::internal::IsStructurallyValidUTF8(s.data(), static_cast<int>(s.size()))) {
        return path;
      }
    } else if (fd->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      std::optional<std::string> inner =
          FirstInvalidString(f.length_delimited(), *fd->message_type(), path + ".", depth + 1);
      if (!inner.has_value() || !inner->empty()) return inner;
    }
  }
  return std::string();
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

}  // namespace

grpc::Status DeserializeRequest(grpc::ByteBuffer* buffer, google::protobuf::Message* msg) {
  const std::string type = msg->GetDescriptor()->full_name();
  if (buffer == nullptr) return Invalid("the call carried no " + type + " message");
  std::vector<grpc::Slice> slices;
  grpc::Status dumped = buffer->Dump(&slices);
  if (!dumped.ok()) return dumped;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  buffer->Clear();
  // Checked before parsing rather than after a failure: protobuf would also log every bad
  // string on stderr, so any client could write into the gateway's log.
  const std::optional<std::string> bad = FirstInvalidString(bytes, *msg->GetDescriptor(), "", 0);
  if (bad.has_value() && !bad->empty()) {
    return Invalid(*bad + " must be valid UTF-8 (a string field of " + type + ")");
  }
  if (!bad.has_value() || !msg->ParseFromString(bytes)) {
    return Invalid("the request is not a valid " + type + " (malformed protobuf encoding, " +
                   std::to_string(bytes.size()) + " bytes)");
  }
  return grpc::Status::OK;
}

}  // namespace thermocline::v1
