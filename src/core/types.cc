#include "smddp/types.h"

#include "smddp/version.h"

namespace smddp {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::f16: return 2;
    case DataType::bf16: return 2;
    case DataType::i8: return 1;
    case DataType::u8: return 1;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::boolean: return 1;
  }
  return 0;
}

const char* to_string(DataType t) {
  switch (t) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::f16: return "f16";
    case DataType::bf16: return "bf16";
    case DataType::i8: return "i8";
    case DataType::u8: return "u8";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
    case DataType::boolean: return "bool";
  }
  return "invalid-dtype";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
    case ReduceOp::band: return "band";
    case ReduceOp::bor: return "bor";
    case ReduceOp::bxor: return "bxor";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "invalid-op";
}

bool is_floating(DataType t) {
  return t == DataType::f32 || t == DataType::f64 || t == DataType::f16 || t == DataType::bf16;
}

bool supports(DataType t, ReduceOp op) {
  if (static_cast<int>(t) >= kNumDataTypes || static_cast<int>(op) >= kNumReduceOps) return false;
  switch (op) {
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor: return !is_floating(t);
    case ReduceOp::premul_sum: return is_floating(t);  // a real factor has no integer meaning
    case ReduceOp::avg: return t != DataType::boolean;
    default: return true;
  }
}

const char* version() { return SMDDP_VERSION_STRING; }
const char* build_info() { return SMDDP_BUILD_INFO; }

}  // namespace smddp
