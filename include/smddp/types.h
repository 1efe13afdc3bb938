// Element types and reduction operators understood by every smddp collective.
#pragma once

#include <cstddef>
#include <cstdint>

namespace smddp {

enum class DataType : uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64, boolean };
inline constexpr int kNumDataTypes = 9;

enum class ReduceOp : uint8_t { sum, prod, min, max, avg, band, bor, bxor, premul_sum };
inline constexpr int kNumReduceOps = 9;

// Size of one element in bytes.
size_t dtype_size(DataType t);
const char* to_string(DataType t);
const char* to_string(ReduceOp op);
bool is_floating(DataType t);

// A reduction: the operator plus, for premul_sum, the factor each input is multiplied by
// before the sum (PyTorch's _make_nccl_premul_sum). Implicitly made from a plain ReduceOp.
struct Reduction {
  ReduceOp op = ReduceOp::sum;
  double factor = 1.0;  // used by premul_sum only

  Reduction() = default;
  Reduction(ReduceOp o) : op(o) {}  // NOLINT: implicit on purpose
  static Reduction premul_sum(double f) {
    Reduction r(ReduceOp::premul_sum);
    r.factor = f;
    return r;
  }
};

// Where a collective's buffers live: host memory unless said otherwise, or the memory of CUDA
// device `device` of this process (docs/gpu.md says what runs on it today). All ranks of a
// collective must use the same kind (a rank's GPU may differ); MismatchError otherwise.
struct Memory {
  enum class Kind : uint8_t { host, cuda };
  Kind kind = Kind::host;
  int device = 0;  // cuda only
  // cuda only: the caller's stream (a cudaStream_t). The collective reads its inputs after the
  // work queued on that stream so far (an event it waits on, as NCCL orders a call after the
  // caller's stream); the host is not blocked. Null: the inputs are ready when the call is made.
  void* stream = nullptr;
  static Memory host_memory() { return {}; }
  static Memory cuda(int device, void* stream = nullptr) { return {Kind::cuda, device, stream}; }
};

// Whether `op` is defined on `t`: bitwise ops need integers or bool; everything else works on all.
bool supports(DataType t, ReduceOp op);

}  // namespace smddp
