// Pieces shared by backend.cc and backend_movement.cc.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "smddp/communicator.h"

namespace smddp::torch_backend {

// What one or more submissions left to do: the core operations, the user's output tensors, the
// copies to run once they all finished, and the tensors whose memory they use.
struct Pending {
  std::vector<smddp::Work> ops;
  std::vector<at::Tensor> outputs;
  std::vector<std::function<void()>> finalizers;
  std::vector<at::Tensor> keep_alive;

  void merge(Pending&& o) {
    for (auto& x : o.ops) ops.push_back(std::move(x));
    for (auto& x : o.outputs) outputs.push_back(std::move(x));
    for (auto& x : o.finalizers) finalizers.push_back(std::move(x));
    for (auto& x : o.keep_alive) keep_alive.push_back(std::move(x));
  }
};

}  // namespace smddp::torch_backend
