// Reads and writes one element of any smddp dtype as a double: for tests, benchmarks and
// reference computations (never on a hot path).
#pragma once

#include <cstddef>
#include <cstdint>

#include "reduce/half.h"
#include "smddp/types.h"

namespace smddp::reduce {

inline void store_element(void* buf, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::f32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::f64: static_cast<double*>(buf)[i] = v; break;
    case DataType::f16: static_cast<uint16_t*>(buf)[i] = f32_to_f16(static_cast<float>(v)); break;
    case DataType::bf16: static_cast<uint16_t*>(buf)[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DataType::i8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::u8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::i32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::i64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DataType::boolean: static_cast<uint8_t*>(buf)[i] = v != 0; break;
  }
}

inline double load_element(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::f32: return static_cast<const float*>(buf)[i];
    case DataType::f64: return static_cast<const double*>(buf)[i];
    case DataType::f16: return f16_to_f32(static_cast<const uint16_t*>(buf)[i]);
    case DataType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(buf)[i]);
    case DataType::i8: return static_cast<const int8_t*>(buf)[i];
    case DataType::u8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::i32: return static_cast<const int32_t*>(buf)[i];
    case DataType::i64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::boolean: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

}  // namespace smddp::reduce
