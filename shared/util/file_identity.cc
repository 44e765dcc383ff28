#include "shared/util/file_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace thermocline {

absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string why = absl::StrCat(path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(why) : absl::FailedPreconditionError(why);
  }
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<int64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

std::string DescribeFileChange(const FileIdentity& then, const FileIdentity& now) {
  std::vector<std::string> parts;
  if (then.device != now.device || then.inode != now.inode) {
    parts.push_back(absl::StrCat("replaced (inode ", then.inode, " -> ", now.inode, ")"));
  }
  if (then.size != now.size) {
    parts.push_back(absl::StrCat("size ", then.size, " -> ", now.size, " bytes"));
  }
  if (then.mtime_ns != now.mtime_ns) {
    parts.push_back(absl::StrFormat("modified (mtime moved by %.3f s)",
                                    static_cast<double>(now.mtime_ns - then.mtime_ns) * 1e-9));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace thermocline
