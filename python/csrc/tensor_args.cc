#include "tensor_args.h"

#include "smddp/errors.h"
#ifdef SMDDP_TORCH_CUDA
#include "cuda_glue.h"
#endif

namespace smddp::torch_backend {

namespace {
bool native(at::ScalarType s, DataType* out) {
  switch (s) {
    case at::kFloat: *out = DataType::f32; return true;
    case at::kDouble: *out = DataType::f64; return true;
    case at::kHalf: *out = DataType::f16; return true;
    case at::kBFloat16: *out = DataType::bf16; return true;
    case at::kChar: *out = DataType::i8; return true;
    case at::kByte: *out = DataType::u8; return true;
    case at::kInt: *out = DataType::i32; return true;
    case at::kLong: *out = DataType::i64; return true;
    case at::kBool: *out = DataType::boolean; return true;
    default: return false;
  }
}
}  // namespace

Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, t, false};
  return {t, t.contiguous(), true};
}

Elems movement_elems(const at::Tensor& t) {
  DataType d;
  if (native(t.scalar_type(), &d)) return {d, static_cast<size_t>(t.numel())};
  return {DataType::u8, static_cast<size_t>(t.numel()) * t.element_size()};
}

size_t units_per_element(const at::Tensor& t) {
  DataType d;
  return native(t.scalar_type(), &d) ? 1 : static_cast<size_t>(t.element_size());
}

Elems reduction_elems(const at::Tensor& t, const Reduction& r, const char* op, int rank) {
  DataType d;
  if (native(t.scalar_type(), &d)) {
    // Checked here too, in the core's words (it checks again): the coalesced calls check every
    // tensor with this before the first is submitted, and a pair refused later left the first
    // written.
    if (!supports(d, r.op))
      throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + op + ": reduce op " + to_string(r.op) +
                            " is not supported for dtype " + to_string(d));
    return {d, static_cast<size_t>(t.numel())};
  }
  if (t.is_complex()) {
    if (r.op != ReduceOp::sum && r.op != ReduceOp::avg && r.op != ReduceOp::premul_sum)
      throw InvalidArgument(std::string("smddp: ") + op + ": reduce op " + to_string(r.op) +
                            " is not defined for complex tensors (" + c10::toString(t.scalar_type()) +
                            "); use SUM, AVG or PREMUL_SUM");
    const DataType real = t.scalar_type() == at::kComplexDouble ? DataType::f64
                          : t.scalar_type() == at::kComplexFloat ? DataType::f32 : DataType::f16;
    return {real, static_cast<size_t>(t.numel()) * 2};
  }
  throw InvalidArgument(std::string("smddp: ") + op + ": dtype " + c10::toString(t.scalar_type()) +
                        " is not supported for reductions (supported: float32, float64, float16, bfloat16, "
                        "int8, uint8, int32, int64, bool, complex)");
}

Reduction to_reduction(const ::c10d::ReduceOp& op, const char* coll) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: return ReduceOp::sum;
    case ::c10d::ReduceOp::AVG: return ReduceOp::avg;
    case ::c10d::ReduceOp::PRODUCT: return ReduceOp::prod;
    case ::c10d::ReduceOp::MIN: return ReduceOp::min;
    case ::c10d::ReduceOp::MAX: return ReduceOp::max;
    case ::c10d::ReduceOp::BAND: return ReduceOp::band;
    case ::c10d::ReduceOp::BOR: return ReduceOp::bor;
    case ::c10d::ReduceOp::BXOR: return ReduceOp::bxor;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      auto sup = c10::static_intrusive_pointer_cast<::c10d::NCCLPreMulSumSupplement>(op.supplement_);
      if (!sup) throw InvalidArgument(std::string("smddp: ") + coll + ": PREMUL_SUM without a factor");
      double f = sup->tensor_factor.defined() ? sup->tensor_factor.item<double>() : sup->double_factor;
      return Reduction::premul_sum(f);
    }
    default: break;
  }
  throw InvalidArgument(std::string("smddp: ") + coll + ": unknown reduce op " +
                        std::to_string(static_cast<int>(op.op_)));
}

void check_tensor(const at::Tensor& t, const char* coll, int rank) {
  if (!t.defined()) throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + ": undefined tensor");
  if (t.is_sparse())
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll +
                          ": sparse tensors are supported by allreduce (SUM) only, as in gloo");
  if (t.device().is_cuda()) {
#ifndef SMDDP_TORCH_CUDA
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + ": got a tensor on " +
                          t.device().str() + ", but this smddp was built against a PyTorch without CUDA");
#endif
    return;
  }
  if (!t.device().is_cpu())
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + ": got a tensor on " +
                          t.device().str() + "; smddp moves CPU and CUDA tensors");
}

void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* coll, int rank) {
  if (a.device() != b.device())
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + ": tensors on different devices (" +
                          a.device().str() + " and " + b.device().str() + "); one call takes one device");
}

Memory memory_of(const at::Tensor& t) {
  if (!t.device().is_cuda()) return {};
#ifdef SMDDP_TORCH_CUDA
  return cuda_memory(t);
#else
  throw InvalidArgument("smddp: a tensor on " + t.device().str() + ", but this smddp was built against a PyTorch without CUDA");
#endif
}

void check_single(const std::vector<at::Tensor>& ts, const char* coll, int rank) {
  if (ts.size() != 1)
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + " takes exactly one tensor per process (got " +
                          std::to_string(ts.size()) + ")");
  check_tensor(ts[0], coll, rank);
}

void check_same_type(const at::Tensor& a, const at::Tensor& b, const char* coll, int rank) {
  if (a.scalar_type() != b.scalar_type())
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + coll + ": output dtype " +
                          c10::toString(a.scalar_type()) + " differs from input dtype " + c10::toString(b.scalar_type()));
}

}  // namespace smddp::torch_backend
