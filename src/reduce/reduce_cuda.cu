// CUDA reduction kernels over the same element-wise maths as the CPU kernels (reduce_ops.h).
// Launched by src/device/cuda on the communicator's stream (reduce_cuda.h).
#include <algorithm>

#include "reduce/reduce_cuda.h"
#include "reduce/reduce_ops.h"
#include "reduce/vector_split.h"

namespace smddp::reduce::cuda {

namespace {

struct Sources {
  const void* p[kMaxSources];
};

// One source's element in the accumulator's type, scaled where the op premultiplies; and the
// accumulated value stored, divided where the op averages. Both kernels combine through these.
template <class T, ReduceOp Op>
__device__ __forceinline__ typename Traits<T>::Acc load_scaled(T v, double factor) {
  using Acc = typename Traits<T>::Acc;
  Acc a = Traits<T>::load(v);
  if constexpr (Op == ReduceOp::premul_sum) a = a * static_cast<Acc>(factor);
  return a;
}
template <class T, ReduceOp Op>
__device__ __forceinline__ T store_result(typename Traits<T>::Acc acc, int divisor) {
  if constexpr (Op == ReduceOp::avg) acc = divide_by_world(acc, divisor);
  return Traits<T>::store(acc);
}
template <class T, ReduceOp Op>
using CombineFor = Combine<Op, std::is_same_v<T, bool_t>>;

// Element i of the reduction.
template <class T, ReduceOp Op>
__device__ __forceinline__ T reduce_element(const Sources& srcs, int nsrc, size_t i, double factor, int divisor) {
  auto acc = load_scaled<T, Op>(static_cast<const T*>(srcs.p[0])[i], factor);
  for (int s = 1; s < nsrc; ++s)
    acc = CombineFor<T, Op>::apply(acc, load_scaled<T, Op>(static_cast<const T*>(srcs.p[s])[i], factor));
  return store_result<T, Op>(acc, divisor);
}

// One element per thread and load: the kernel that ran on the H100 (docs/gpu.md).
template <class T, ReduceOp Op>
__global__ void reduce_kernel(T* dst, Sources srcs, int nsrc, size_t count, double factor, int divisor) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = reduce_element<T, Op>(srcs, nsrc, i, factor, divisor);
}

// 16 bytes per thread and load (SMDDP_CUDA_VECTOR_REDUCE): 4-16 times the bytes in flight of
// the scalar kernel, which is what a kernel capped at a few SMs needs to approach HBM's rate.
// The elements before the first 16-byte boundary and after the last whole vector, or all of them
// where the operands' offsets within 16 bytes differ, go one by one (vector_split.h).
template <class T>
union Vector {
  uint4 raw;
  T e[kVectorBytes / sizeof(T)];
};

template <class T, ReduceOp Op>
__global__ void reduce_vector_kernel(T* dst, Sources srcs, int nsrc, VectorSplit split, double factor,
                                     int divisor) {
  using Acc = typename Traits<T>::Acc;
  constexpr size_t kPer = kVectorBytes / sizeof(T);
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = first; k < split.head + split.tail; k += stride) {
    const size_t i = scalar_element(split, k, sizeof(T));
    dst[i] = reduce_element<T, Op>(srcs, nsrc, i, factor, divisor);
  }
  for (size_t v = first; v < split.vectors; v += stride) {
    const size_t at = split.head + v * kPer;  // 16-byte aligned in every operand
    Vector<T> in;
    in.raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(srcs.p[0]) + at);
    Acc acc[kPer];
#pragma unroll
    for (size_t e = 0; e < kPer; ++e) acc[e] = load_scaled<T, Op>(in.e[e], factor);
    for (int s = 1; s < nsrc; ++s) {
      in.raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(srcs.p[s]) + at);
#pragma unroll
      for (size_t e = 0; e < kPer; ++e) acc[e] = CombineFor<T, Op>::apply(acc[e], load_scaled<T, Op>(in.e[e], factor));
    }
    Vector<T> out;
#pragma unroll
    for (size_t e = 0; e < kPer; ++e) out.e[e] = store_result<T, Op>(acc[e], divisor);
    *reinterpret_cast<uint4*>(dst + at) = out.raw;
  }
}

template <class T, ReduceOp Op>
cudaError_t launch(const ReduceArgs& a, cudaStream_t stream, int max_blocks, bool vectors) {
  Sources s{};
  for (int i = 0; i < a.nsrc && i < kMaxSources; ++i) s.p[i] = a.srcs[i];
  auto blocks_for = [&](size_t work) {
    return static_cast<int>(std::min<size_t>((work + kThreads - 1) / kThreads, static_cast<size_t>(std::max(max_blocks, 1))));
  };
  if (vectors) {
    uintptr_t addrs[kMaxSources + 1];
    addrs[0] = reinterpret_cast<uintptr_t>(a.dst);
    for (int i = 0; i < a.nsrc; ++i) addrs[i + 1] = reinterpret_cast<uintptr_t>(a.srcs[i]);
    const VectorSplit split = vector_split(addrs, a.nsrc + 1, a.count, sizeof(T));
    if (split.vectors > 0) {
      reduce_vector_kernel<T, Op><<<blocks_for(std::max(split.vectors, split.head + split.tail)), kThreads, 0,
                                    stream>>>(static_cast<T*>(a.dst), s, a.nsrc, split, a.op.factor, a.divisor);
      return cudaGetLastError();
    }
  }
  reduce_kernel<T, Op><<<blocks_for(a.count), kThreads, 0, stream>>>(static_cast<T*>(a.dst), s, a.nsrc, a.count,
                                                                     a.op.factor, a.divisor);
  return cudaGetLastError();
}

template <class T>
cudaError_t by_op(const ReduceArgs& a, cudaStream_t stream, int max_blocks, bool vectors) {
  switch (a.op.op) {
    case ReduceOp::sum: return launch<T, ReduceOp::sum>(a, stream, max_blocks, vectors);
    case ReduceOp::prod: return launch<T, ReduceOp::prod>(a, stream, max_blocks, vectors);
    case ReduceOp::min: return launch<T, ReduceOp::min>(a, stream, max_blocks, vectors);
    case ReduceOp::max: return launch<T, ReduceOp::max>(a, stream, max_blocks, vectors);
    case ReduceOp::avg: return launch<T, ReduceOp::avg>(a, stream, max_blocks, vectors);
    case ReduceOp::premul_sum: return launch<T, ReduceOp::premul_sum>(a, stream, max_blocks, vectors);
    default:
      if constexpr (std::is_integral_v<T> || std::is_same_v<T, bool_t>) {
        if (a.op.op == ReduceOp::band) return launch<T, ReduceOp::band>(a, stream, max_blocks, vectors);
        if (a.op.op == ReduceOp::bor) return launch<T, ReduceOp::bor>(a, stream, max_blocks, vectors);
        return launch<T, ReduceOp::bxor>(a, stream, max_blocks, vectors);
      }
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t reduce(const ReduceArgs& a, cudaStream_t stream, int max_blocks, bool vectors) {
  if (a.count == 0) return cudaSuccess;
  if (a.nsrc < 1 || a.nsrc > kMaxSources) return cudaErrorInvalidValue;
  switch (a.dtype) {
    case DataType::f32: return by_op<float>(a, stream, max_blocks, vectors);
    case DataType::f64: return by_op<double>(a, stream, max_blocks, vectors);
    case DataType::f16: return by_op<f16_t>(a, stream, max_blocks, vectors);
    case DataType::bf16: return by_op<bf16_t>(a, stream, max_blocks, vectors);
    case DataType::i8: return by_op<int8_t>(a, stream, max_blocks, vectors);
    case DataType::u8: return by_op<uint8_t>(a, stream, max_blocks, vectors);
    case DataType::i32: return by_op<int32_t>(a, stream, max_blocks, vectors);
    case DataType::i64: return by_op<int64_t>(a, stream, max_blocks, vectors);
    case DataType::boolean: return by_op<bool_t>(a, stream, max_blocks, vectors);
  }
  return cudaErrorInvalidValue;
}

}  // namespace smddp::reduce::cuda
