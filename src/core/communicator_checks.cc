// The checks every call makes of its arguments before anything is queued (communicator_impl.h):
// each error names the operation, the rank and what was wrong.
#include <unistd.h>

#include <sstream>

#include "core/communicator_impl.h"

namespace smddp::detail {

void CommunicatorImpl::check_process(const char* op) const {
  if (!forked_away()) return;
  throw InvalidArgument(prefix() + op + ": this communicator was made in process " + std::to_string(creator_pid_) +
                        ", and process " + std::to_string(::getpid()) +
                        " is a child forked from it (a DataLoader worker, multiprocessing's fork start method): only "
                        "the process that made a communicator can use it");
}

void CommunicatorImpl::check_rank(int r, const char* what, const char* op) const {
  if (r < 0 || r >= size_)
    throw InvalidArgument(prefix() + op + ": " + what + " " + std::to_string(r) + " is outside [0, " +
                          std::to_string(size_) + ")");
}

void CommunicatorImpl::check_buffer(const void* p, size_t count, const char* what, const char* op) const {
  if (count > 0 && p == nullptr)
    throw InvalidArgument(prefix() + op + ": " + what + " buffer is null for " + std::to_string(count) + " elements");
}

void CommunicatorImpl::check_overlap(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                                     uintptr_t in_place_send, const char* op) const {
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (!send || !recv || send_bytes == 0 || recv_bytes == 0 || s == in_place_send) return;
  if (s < r + recv_bytes && r < s + send_bytes) {
    auto range = [](uintptr_t p, size_t n) {
      std::ostringstream os;
      os << "[0x" << std::hex << p << ", +" << std::dec << n << " bytes)";
      return os.str();
    };
    const std::string want = in_place_send == r ? "the same address as recv"
                             : in_place_send > r ? "recv + " + std::to_string(in_place_send - r) + " bytes"
                                                 : "recv - " + std::to_string(r - in_place_send) + " bytes";
    throw InvalidArgument(prefix() + op + ": send " + range(s, send_bytes) + " and recv " + range(r, recv_bytes) +
                          " overlap, but not as the in-place form does (send at " + want + ")");
  }
}

void CommunicatorImpl::check_dtype(DataType t, const char* op) const {
  if (static_cast<int>(t) >= kNumDataTypes)
    throw InvalidArgument(prefix() + op + ": invalid dtype " + std::to_string(static_cast<int>(t)));
}

void CommunicatorImpl::check_count(size_t count, size_t blocks, DataType t, const char* op) const {
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, blocks, &bytes) || __builtin_mul_overflow(bytes, dtype_size(t), &bytes) ||
      bytes > (size_t{1} << 62))
    throw InvalidArgument(prefix() + op + ": count " + std::to_string(count) + " x " + std::to_string(blocks) +
                          " elements of " + to_string(t) + " overflows the addressable size");
}

}  // namespace smddp::detail
