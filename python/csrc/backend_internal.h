// Pieces shared by backend.cc and backend_movement.cc.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

#include "smddp/communicator.h"

namespace smddp::torch_backend {

// What one or more submissions left to do: the core operations, the user's output tensors, the
// copies to run once they all finished, and the tensors whose memory they use.
//
// A Pending dropped with operations in it (a coalesced call that threw after submitting its
// first parts) waits for them before its tensors go: the core still reads and writes their
// memory, and on a GPU the caching allocator would hand it to the next tensor at once.
struct Pending {
  std::vector<smddp::Work> ops;
  std::vector<at::Tensor> outputs;
  std::vector<std::function<void()>> finalizers;
  std::vector<at::Tensor> keep_alive;

  Pending() = default;
  Pending(Pending&& o) noexcept { *this = std::move(o); }
  Pending& operator=(Pending&& o) noexcept {
    drain();
    ops = std::exchange(o.ops, {});
    outputs = std::exchange(o.outputs, {});
    finalizers = std::exchange(o.finalizers, {});
    keep_alive = std::exchange(o.keep_alive, {});
    return *this;
  }
  ~Pending() { drain(); }

  void merge(Pending&& o) {
    for (auto& x : o.ops) ops.push_back(std::move(x));
    for (auto& x : o.outputs) outputs.push_back(std::move(x));
    for (auto& x : o.finalizers) finalizers.push_back(std::move(x));
    for (auto& x : o.keep_alive) keep_alive.push_back(std::move(x));
    o.ops.clear();
  }
  // The operations, for a Work that now owns them and the tensors (ProcessGroupSmddp::finish).
  std::vector<smddp::Work> take_ops() { return std::exchange(ops, {}); }

 private:
  void drain() noexcept;  // backend.cc: waits for what is still in `ops`, errors ignored
};

}  // namespace smddp::torch_backend
