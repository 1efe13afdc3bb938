// Independent reference for the collective tests: input patterns and a plain scalar reduction
// (one element at a time, in double or exact integer arithmetic), with no code shared with the
// library's kernels beyond the f16/bf16 bit conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reduce/element_io.h"
#include "smddp/types.h"

namespace smddp::testing {

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}

// The value rank `r` contributes at element i: small integers for arithmetic ops (exact in every
// float type, no integer overflow for sums), {-1,1,2} for prod, random bits for bitwise ops.
inline double input_value(int r, size_t i, DataType t, ReduceOp op, int salt) {
  const uint64_t h = mix((static_cast<uint64_t>(r) << 40) ^ (static_cast<uint64_t>(i) * 2654435761ULL) ^
                         static_cast<uint64_t>(salt) << 20);
  const bool is_unsigned = t == DataType::u8;
  if (t == DataType::boolean) return (h % 3 == 0) ? 1.0 : 0.0;
  switch (op) {
    case ReduceOp::prod: {
      static const double signed_v[] = {1, 2, -1, 1}, unsigned_v[] = {1, 2, 3, 1};
      return is_unsigned ? unsigned_v[h % 4] : signed_v[h % 4];
    }
    case ReduceOp::band: case ReduceOp::bor: case ReduceOp::bxor:
      return static_cast<double>(h % (t == DataType::i8 || t == DataType::u8 ? 256 : 65536)) - (is_unsigned ? 0 : 0);
    default:
      return is_unsigned ? static_cast<double>(h % 11) : static_cast<double>(h % 11) - 5.0;
  }
}

inline void store_value(void* buf, size_t i, DataType t, double v) { reduce::store_element(buf, i, t, v); }
inline double load_value(const void* buf, size_t i, DataType t) { return reduce::load_element(buf, i, t); }

// Wraps an exact integer result to the storage type, as two's-complement hardware does.
inline int64_t wrap_to(DataType t, int64_t v) {
  switch (t) {
    case DataType::i8: return static_cast<int8_t>(static_cast<uint8_t>(v));
    case DataType::u8: return static_cast<uint8_t>(v);
    case DataType::i32: return static_cast<int32_t>(static_cast<uint32_t>(v));
    default: return v;
  }
}

// Reference result at element i of reducing `world` ranks' inputs (input_value) with `op`.
inline double reference_value(int world, size_t idx, DataType t, Reduction op, int salt) {
  if (t == DataType::boolean) {
    bool acc = input_value(0, idx, t, op.op, salt) != 0;
    for (int r = 1; r < world; ++r) {
      bool v = input_value(r, idx, t, op.op, salt) != 0;
      switch (op.op) {
        case ReduceOp::sum: case ReduceOp::max: case ReduceOp::bor: acc = acc || v; break;
        case ReduceOp::prod: case ReduceOp::min: case ReduceOp::band: acc = acc && v; break;
        case ReduceOp::bxor: acc = acc != v; break;
        default: break;
      }
    }
    return acc;
  }
  if (is_floating(t)) {
    double acc = 0;
    for (int r = 0; r < world; ++r) {
      double v = input_value(r, idx, t, op.op, salt);
      if (op.op == ReduceOp::premul_sum) v *= op.factor;
      if (r == 0) { acc = v; continue; }
      switch (op.op) {
        case ReduceOp::prod: acc *= v; break;
        case ReduceOp::min: acc = std::min(acc, v); break;
        case ReduceOp::max: acc = std::max(acc, v); break;
        default: acc += v; break;
      }
    }
    return op.op == ReduceOp::avg ? acc / world : acc;
  }
  int64_t acc = 0;
  for (int r = 0; r < world; ++r) {
    int64_t v = static_cast<int64_t>(input_value(r, idx, t, op.op, salt));
    if (r == 0) { acc = v; continue; }
    switch (op.op) {
      case ReduceOp::prod: acc = wrap_to(t, static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v))); break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
      case ReduceOp::band: acc &= v; break;
      case ReduceOp::bor: acc |= v; break;
      case ReduceOp::bxor: acc ^= v; break;
      default: acc = wrap_to(t, acc + v); break;
    }
  }
  acc = wrap_to(t, acc);
  if (op.op == ReduceOp::avg) acc = wrap_to(t, acc / world);
  return static_cast<double>(acc);
}

// Allowed |got - want| for a result of magnitude |want| (0 for exact types).
inline double tolerance(DataType t, double want) {
  const double m = std::max(1.0, std::fabs(want));
  switch (t) {
    case DataType::f32: return 1e-5 * m;
    case DataType::f64: return 1e-12 * m;
    case DataType::f16: return 1e-3 * m;
    case DataType::bf16: return 8e-3 * m;
    default: return 0;
  }
}

// FNV-1a of a buffer, to compare results bit for bit across ranks and runs.
inline uint64_t fingerprint(const void* p, size_t bytes) {
  uint64_t h = 1469598103934665603ULL;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

}  // namespace smddp::testing
