// Turning PyTorch tensors and options into what the smddp core takes: element type, count,
// reduction, and contiguous buffers (with a copy back when the user's tensor is not contiguous).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>

#include "smddp/types.h"

namespace smddp::torch_backend {

// A contiguous view smddp can work on: `tensor` is the user's tensor itself when it was
// contiguous, else a contiguous copy that `copy_back()` writes into the user's tensor.
struct Staged {
  at::Tensor user;
  at::Tensor tensor;
  bool copied = false;
  void* data() const { return tensor.data_ptr(); }
  void copy_back() const {
    if (copied) user.copy_(tensor);
  }
};
Staged stage(const at::Tensor& t);

// What a buffer is to smddp: element type and count. For data movement any dtype works (as bytes
// when smddp has no such type); for reductions complex tensors reduce as (re, im) pairs, which is
// right for sum/avg/premul_sum and rejected for the others.
struct Elems {
  DataType dtype;
  size_t count;
};
Elems movement_elems(const at::Tensor& t);
// movement_elems' units per tensor element: 1 for a dtype smddp has, else its bytes (also for
// an empty tensor, whose count says nothing).
size_t units_per_element(const at::Tensor& t);
Elems reduction_elems(const at::Tensor& t, const Reduction& r, const char* op, int rank);

Reduction to_reduction(const ::c10d::ReduceOp& op, const char* coll);

// Rejects what this build cannot take, naming the collective: undefined and sparse tensors,
// devices other than CPU and CUDA, CUDA tensors where this PyTorch has no CUDA.
void check_tensor(const at::Tensor& t, const char* coll, int rank);
void check_single(const std::vector<at::Tensor>& ts, const char* coll, int rank);
void check_same_type(const at::Tensor& a, const at::Tensor& b, const char* coll, int rank);
// The tensors of one call must be on one device (NCCL's rule); names both devices otherwise.
void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* coll, int rank);

// Where a tensor's memory is, for the core: host, or its GPU with the caller's current stream.
Memory memory_of(const at::Tensor& t);

}  // namespace smddp::torch_backend
