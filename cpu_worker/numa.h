// NUMA placement of the CPU worker: which node's memory holds the cold rows, which CPUs its
// threads run on, and memory allocated on that node (libnuma). On a machine with one node, or
// where libnuma reports no NUMA support, it says so in one line and carries on with ordinary
// memory and the requested CPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::cpu_worker {

// "0-3,6" -> {0, 1, 2, 3, 6}: ascending, distinct; errors name the bad part.
absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view list);

struct NumaPlacement {
  std::optional<int> node;  // memory node of the cold rows (nullopt: no NUMA binding)
  std::vector<int> cpus;    // CPUs the threads are pinned to (empty: not pinned)
  std::string description;  // one line for the log
};

// Pins the calling thread (and so every thread it creates afterwards) to `cpus`, or to the
// node's CPUs when `cpus` is empty and a node is given, and picks the memory node. Call before
// creating the thread pool.
absl::StatusOr<NumaPlacement> PlaceProcess(std::optional<int> numa_node,
                                           const std::vector<int>& cpus);

// Memory on one NUMA node (numa_alloc_onnode), or ordinary anonymous memory when no node is
// given. Zero-filled, page-aligned.
class NodeMemory {
 public:
  NodeMemory() = default;
  static absl::StatusOr<NodeMemory> Allocate(size_t bytes, std::optional<int> node);
  ~NodeMemory();
  NodeMemory(NodeMemory&& other) noexcept;
  NodeMemory& operator=(NodeMemory&& other) noexcept;
  NodeMemory(const NodeMemory&) = delete;
  NodeMemory& operator=(const NodeMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // mlock: a failure names RLIMIT_MEMLOCK and the sizes involved.
  absl::Status Lock();

 private:
  void Free();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool numa_ = false;  // allocated by libnuma (numa_free), else mmap (munmap)
  bool locked_ = false;
};

}  // namespace thermocline::cpu_worker
