#include "cpu_worker/numa.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "shared/util/memory_lock.h"
#include "shared/util/page_arena.h"
#include "shared/util/status_macros.h"

namespace thermocline::cpu_worker {

absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view list) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    bool ok = absl::SimpleAtoi(ends[0], &lo);
    hi = lo;
    if (ok && ends.size() == 2) ok = absl::SimpleAtoi(ends[1], &hi);
    if (!ok || lo < 0 || hi < lo || hi >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpus: '", part, "' is not a CPU number or range like 0-3"));
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  if (cpus.empty()) return absl::InvalidArgumentError("--cpus: empty list");
  return cpus;
}

namespace {

absl::Status PinTo(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot pin to CPUs ", absl::StrJoin(cpus, ","),
                                                   ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<NumaPlacement> PlaceProcess(std::optional<int> numa_node,
                                           const std::vector<int>& cpus) {
  NumaPlacement p;
  const bool numa = numa_available() >= 0;
  const int max_node = numa ? numa_max_node() : 0;
  std::string memory;
  if (numa_node.has_value()) {
    if (*numa_node < 0 || *numa_node > max_node) {
      return absl::InvalidArgumentError(absl::StrCat("--numa-node ", *numa_node,
                                                     " does not exist (nodes 0..", max_node, ")"));
    }
    if (!numa) {
      memory = "libnuma reports no NUMA support: cold rows in ordinary memory";
    } else if (max_node == 0) {
      memory = "single NUMA node: cold rows in ordinary memory on node 0";
    } else {
      p.node = *numa_node;
      memory = absl::StrCat("cold rows on NUMA node ", *numa_node);
    }
  } else {
    memory = numa && max_node > 0 ? "no --numa-node: cold rows where the kernel puts them"
                                  : "single NUMA node: cold rows in ordinary memory";
  }
  std::vector<int> pin = cpus;
  if (pin.empty() && numa && numa_node.has_value()) {
    bitmask* mask = numa_allocate_cpumask();
    if (numa_node_to_cpus(*numa_node, mask) == 0) {
      for (unsigned c = 0; c < mask->size; ++c) {
        if (numa_bitmask_isbitset(mask, c)) pin.push_back(static_cast<int>(c));
      }
    }
    numa_free_cpumask(mask);
  }
  if (!pin.empty()) {
    if (absl::Status s = PinTo(pin); !s.ok()) return s;
    p.cpus = pin;
  }
  p.description = absl::StrCat(memory, "; threads ",
                               pin.empty() ? std::string("not pinned")
                                           : absl::StrCat("pinned to CPUs ", absl::StrJoin(pin, ",")));
  return p;
}

absl::StatusOr<NodeMemory> NodeMemory::Allocate(size_t bytes, std::optional<int> node) {
  NodeMemory m;
  m.size_ = std::max<size_t>(bytes, 1);
  if (node.has_value()) {
    // numa_alloc_onnode mmaps and mbinds: pages come from that node as they are first touched.
    m.data_ = static_cast<uint8_t*>(numa_alloc_onnode(m.size_, *node));
    m.numa_ = true;
  } else {
    void* p = mmap(nullptr, m.size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    m.data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  if (m.data_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", m.size_,
                                                     " bytes for the cold rows"));
  }
  // Before the first touch: the cold rows are read a few KiB at a time all over the buffer for
  // every token, as the single process's copies are (util/page_arena.h). Advice only.
  if (HugePagesWanted()) madvise(m.data_, m.size_, MADV_HUGEPAGE);
  return m;
}

NodeMemory::~NodeMemory() { Free(); }

NodeMemory::NodeMemory(NodeMemory&& o) noexcept
    : data_(o.data_), size_(o.size_), numa_(o.numa_), locked_(o.locked_) {
  o.data_ = nullptr;
}

NodeMemory& NodeMemory::operator=(NodeMemory&& o) noexcept {
  if (this != &o) {
    Free();
    data_ = o.data_;
    size_ = o.size_;
    numa_ = o.numa_;
    locked_ = o.locked_;
    o.data_ = nullptr;
  }
  return *this;
}

void NodeMemory::Free() {
  if (data_ == nullptr) return;
  if (locked_) munlock(data_, size_);
  if (numa_) {
    numa_free(data_, size_);
  } else {
    munmap(data_, size_);
  }
  data_ = nullptr;
}

absl::Status NodeMemory::Lock() {
  TC_RETURN_IF_ERROR(LockMemory(data_, size_, "cold rows"));
  locked_ = true;
  return absl::OkStatus();
}

}  // namespace thermocline::cpu_worker
