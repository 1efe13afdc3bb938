// CUDA reduction kernels over the same element-wise maths as the CPU kernels (reduce_ops.h).
// Launched by src/device/cuda on the communicator's stream (reduce_cuda.h).
#include <algorithm>

#include "reduce/reduce_cuda.h"
#include "reduce/reduce_ops.h"

namespace smddp::reduce::cuda {

namespace {

struct Sources {
  const void* p[kMaxSources];
};

template <class T, ReduceOp Op>
__global__ void reduce_kernel(T* dst, Sources srcs, int nsrc, size_t count, double factor, int divisor) {
  using Tr = Traits<T>;
  using Acc = typename Tr::Acc;
  using C = Combine<Op, std::is_same_v<T, bool_t>>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    Acc acc = Tr::load(static_cast<const T*>(srcs.p[0])[i]);
    if constexpr (Op == ReduceOp::premul_sum) acc = acc * static_cast<Acc>(factor);
    for (int s = 1; s < nsrc; ++s) {
      Acc v = Tr::load(static_cast<const T*>(srcs.p[s])[i]);
      if constexpr (Op == ReduceOp::premul_sum) v = v * static_cast<Acc>(factor);
      acc = C::apply(acc, v);
    }
    if constexpr (Op == ReduceOp::avg) acc = acc / static_cast<Acc>(divisor);
    dst[i] = Tr::store(acc);
  }
}

template <class T, ReduceOp Op>
cudaError_t launch(const ReduceArgs& a, cudaStream_t stream, int max_blocks) {
  Sources s{};
  for (int i = 0; i < a.nsrc && i < kMaxSources; ++i) s.p[i] = a.srcs[i];
  const int blocks = static_cast<int>(
      std::min<size_t>((a.count + kThreads - 1) / kThreads, static_cast<size_t>(std::max(max_blocks, 1))));
  reduce_kernel<T, Op><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(a.dst), s, a.nsrc, a.count, a.op.factor,
                                                       a.divisor);
  return cudaGetLastError();
}

template <class T>
cudaError_t by_op(const ReduceArgs& a, cudaStream_t stream, int max_blocks) {
  switch (a.op.op) {
    case ReduceOp::sum: return launch<T, ReduceOp::sum>(a, stream, max_blocks);
    case ReduceOp::prod: return launch<T, ReduceOp::prod>(a, stream, max_blocks);
    case ReduceOp::min: return launch<T, ReduceOp::min>(a, stream, max_blocks);
    case ReduceOp::max: return launch<T, ReduceOp::max>(a, stream, max_blocks);
    case ReduceOp::avg: return launch<T, ReduceOp::avg>(a, stream, max_blocks);
    case ReduceOp::premul_sum: return launch<T, ReduceOp::premul_sum>(a, stream, max_blocks);
    default:
      if constexpr (std::is_integral_v<T> || std::is_same_v<T, bool_t>) {
        if (a.op.op == ReduceOp::band) return launch<T, ReduceOp::band>(a, stream, max_blocks);
        if (a.op.op == ReduceOp::bor) return launch<T, ReduceOp::bor>(a, stream, max_blocks);
        return launch<T, ReduceOp::bxor>(a, stream, max_blocks);
      }
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t reduce(const ReduceArgs& a, cudaStream_t stream, int max_blocks) {
  if (a.count == 0) return cudaSuccess;
  if (a.nsrc < 1 || a.nsrc > kMaxSources) return cudaErrorInvalidValue;
  switch (a.dtype) {
    case DataType::f32: return by_op<float>(a, stream, max_blocks);
    case DataType::f64: return by_op<double>(a, stream, max_blocks);
    case DataType::f16: return by_op<f16_t>(a, stream, max_blocks);
    case DataType::bf16: return by_op<bf16_t>(a, stream, max_blocks);
    case DataType::i8: return by_op<int8_t>(a, stream, max_blocks);
    case DataType::u8: return by_op<uint8_t>(a, stream, max_blocks);
    case DataType::i32: return by_op<int32_t>(a, stream, max_blocks);
    case DataType::i64: return by_op<int64_t>(a, stream, max_blocks);
    case DataType::boolean: return by_op<bool_t>(a, stream, max_blocks);
  }
  return cudaErrorInvalidValue;
}

}  // namespace smddp::reduce::cuda
