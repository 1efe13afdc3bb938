// Element-wise reduction maths, shared by the CPU kernels and (later) the CUDA kernels.
//
// Storage type T is what sits in memory; Acc is what we compute in. f16/bf16 accumulate in
// float and are rounded once when stored; signed integer sum/prod wrap (computed unsigned, as
// PyTorch's integer arithmetic does); bool is logical (sum/max/bor = or, prod/min/band = and,
// bxor = xor).
#pragma once

#include <cstdint>
#include <type_traits>

#include "reduce/half.h"
#include "smddp/types.h"

namespace smddp::reduce {

struct f16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };
struct bool_t { uint8_t v; };

template <class T> struct Traits {  // integers and f32/f64: compute in T itself
  using Acc = T;
  static SMDDP_HD Acc load(T v) { return v; }
  static SMDDP_HD T store(Acc a) { return a; }
};
template <> struct Traits<f16_t> {
  using Acc = float;
  static SMDDP_HD Acc load(f16_t v) { return f16_to_f32(v.bits); }
  static SMDDP_HD f16_t store(Acc a) { return f16_t{f32_to_f16(a)}; }
};
template <> struct Traits<bf16_t> {
  using Acc = float;
  static SMDDP_HD Acc load(bf16_t v) { return bf16_to_f32(v.bits); }
  static SMDDP_HD bf16_t store(Acc a) { return bf16_t{f32_to_bf16(a)}; }
};
template <> struct Traits<bool_t> {
  using Acc = uint8_t;
  static SMDDP_HD Acc load(bool_t v) { return v.v != 0; }
  static SMDDP_HD bool_t store(Acc a) { return bool_t{static_cast<uint8_t>(a != 0)}; }
};

template <class A> SMDDP_HD A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class A> SMDDP_HD A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// avg's final division by the world size. Integers divide in 64 bits (truncating toward zero):
// the world size need not fit in an 8-bit element type (128 ranks of i8 divided by -128, 256 of
// u8 by 0). Their sum wraps before the division, in every algorithm alike (NCCL's ncclAvg too):
// an average of 8-bit values whose sum overflows 8 bits is not their mathematical mean.
template <class A> SMDDP_HD A divide_by_world(A v, int divisor) {
  if constexpr (std::is_integral_v<A> && std::is_signed_v<A>) {
    return static_cast<A>(static_cast<int64_t>(v) / divisor);
  } else if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<uint64_t>(v) / static_cast<uint64_t>(divisor));
  } else {
    return v / static_cast<A>(divisor);
  }
}

// One binary operator per ReduceOp; avg and premul_sum combine like sum (their scaling is a
// separate pre/post step, see Scale).
template <ReduceOp Op, bool IsBool> struct Combine;
template <bool B> struct Combine<ReduceOp::sum, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) { if constexpr (B) return a | b; else return wrap_add(a, b); }
};
template <bool B> struct Combine<ReduceOp::avg, B> : Combine<ReduceOp::sum, B> {};
template <bool B> struct Combine<ReduceOp::premul_sum, B> : Combine<ReduceOp::sum, B> {};
template <bool B> struct Combine<ReduceOp::prod, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) { if constexpr (B) return a & b; else return wrap_mul(a, b); }
};
template <bool B> struct Combine<ReduceOp::min, B> {
  // NaN propagates like torch.minimum: if either is NaN the result is NaN.
  template <class A> static SMDDP_HD A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) { if (a != a) return a; if (b != b) return b; }
    return b < a ? b : a;
  }
};
template <bool B> struct Combine<ReduceOp::max, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) { if (a != a) return a; if (b != b) return b; }
    return a < b ? b : a;
  }
};
template <bool B> struct Combine<ReduceOp::band, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) { return a & b; }
};
template <bool B> struct Combine<ReduceOp::bor, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) { return a | b; }
};
template <bool B> struct Combine<ReduceOp::bxor, B> {
  template <class A> static SMDDP_HD A apply(A a, A b) { return a ^ b; }
};

}  // namespace smddp::reduce
