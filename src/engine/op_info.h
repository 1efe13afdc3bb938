// What a running operation is, for deadlines and for error messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace smddp {

using Clock = std::chrono::steady_clock;

struct OpInfo {
  const char* name = "?";  // "allreduce", "send", ...
  uint64_t seq = 0;        // per-communicator sequence number of every operation, 1-based
  uint64_t coll_seq = 0;   // collectives only: equal on every rank for the same collective
                           // (point-to-point operations differ between ranks), so it keys tags
  int rank = -1;
  int size = 0;
  int peer = -1;           // send/recv only
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline{};

  // "allreduce #17 on rank 0 of 4"
  std::string describe() const {
    std::string s = std::string(name) + " #" + std::to_string(seq) + " on rank " + std::to_string(rank) +
                    " of " + std::to_string(size);
    if (peer >= 0) s += " (peer " + std::to_string(peer) + ")";
    return s;
  }
};

}  // namespace smddp
