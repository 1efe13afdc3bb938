// What an algorithm run directly on a shm::Group (no Communicator: peer_window_test.cc,
// round_taking_test.cc) is told about its collective: its name, this rank, and a 60 s deadline
// from now, so a hang fails as a timeout naming the op.
#pragma once

#include <chrono>

#include "engine/op_info.h"

namespace smddp::testing {

inline OpInfo op_for(const char* name, int rank, int w) {
  OpInfo op;
  op.name = name;
  op.rank = rank;
  op.size = w;
  op.timeout = std::chrono::seconds(60);
  op.deadline = Clock::now() + op.timeout;
  return op;
}

}  // namespace smddp::testing
