// CUDA reduction kernels over the same element-wise maths as the CPU kernels (reduce_ops.h).
// Compiled in every build that has nvcc; wired into the device layer by the CUDA issue.
#include <cuda_runtime.h>

#include "reduce/reduce.h"
#include "reduce/reduce_ops.h"

namespace smddp::reduce::cuda {

namespace {

constexpr int kMaxSources = 16;

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
cudaError_t launch(const ReduceArgs& a, cudaStream_t stream) {
  Sources s{};
  for (int i = 0; i < a.nsrc && i < kMaxSources; ++i) s.p[i] = a.srcs[i];
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((a.count + threads - 1) / threads, 4096));
  reduce_kernel<T, Op><<<blocks, threads, 0, stream>>>(static_cast<T*>(a.dst), s, a.nsrc, a.count, a.op.factor,
                                                       a.divisor);
  return cudaGetLastError();
}

template <class T>
cudaError_t by_op(const ReduceArgs& a, cudaStream_t stream) {
  switch (a.op.op) {
    case ReduceOp::sum: return launch<T, ReduceOp::sum>(a, stream);
    case ReduceOp::prod: return launch<T, ReduceOp::prod>(a, stream);
    case ReduceOp::min: return launch<T, ReduceOp::min>(a, stream);
    case ReduceOp::max: return launch<T, ReduceOp::max>(a, stream);
    case ReduceOp::avg: return launch<T, ReduceOp::avg>(a, stream);
    case ReduceOp::premul_sum: return launch<T, ReduceOp::premul_sum>(a, stream);
    default:
      if constexpr (std::is_integral_v<T> || std::is_same_v<T, bool_t>) {
        if (a.op.op == ReduceOp::band) return launch<T, ReduceOp::band>(a, stream);
        if (a.op.op == ReduceOp::bor) return launch<T, ReduceOp::bor>(a, stream);
        return launch<T, ReduceOp::bxor>(a, stream);
      }
      return cudaErrorInvalidValue;
  }
}

}  // namespace

// Reduces up to kMaxSources device buffers on `stream` (asynchronous).
cudaError_t reduce(const ReduceArgs& a, cudaStream_t stream) {
  if (a.count == 0) return cudaSuccess;
  if (a.nsrc < 1 || a.nsrc > kMaxSources) return cudaErrorInvalidValue;
  switch (a.dtype) {
    case DataType::f32: return by_op<float>(a, stream);
    case DataType::f64: return by_op<double>(a, stream);
    case DataType::f16: return by_op<f16_t>(a, stream);
    case DataType::bf16: return by_op<bf16_t>(a, stream);
    case DataType::i8: return by_op<int8_t>(a, stream);
    case DataType::u8: return by_op<uint8_t>(a, stream);
    case DataType::i32: return by_op<int32_t>(a, stream);
    case DataType::i64: return by_op<int64_t>(a, stream);
    case DataType::boolean: return by_op<bool_t>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace smddp::reduce::cuda
