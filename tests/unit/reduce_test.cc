// Reduction kernels against a scalar loop, for every ISA this CPU has, every dtype and op,
// odd lengths (vector tails), many sources, aliasing of dst and a source, and f16/bf16 rounding.
#include "reduce/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "reduce/element_io.h"
#include "reduce/half.h"
#include "smddp/errors.h"

namespace {

using namespace smddp;
using namespace smddp::reduce;

TEST(Half, F16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = f16_to_f32(b);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), b) << "f16 bits " << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);            // rounds to inf
  EXPECT_EQ(f32_to_f16(5.96046448e-8f), 0x0001);      // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.98023224e-8f), 0x0000);      // half of it: tie to even 0
}

TEST(Half, Bf16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h);
  }
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
}

double scalar_ref(const std::vector<std::vector<double>>& in, size_t i, ReduceOp op, bool is_bool, double factor) {
  double acc = 0;
  for (size_t s = 0; s < in.size(); ++s) {
    double v = in[s][i];
    if (op == ReduceOp::premul_sum) v *= factor;
    if (s == 0) {
      acc = v;
      continue;
    }
    if (is_bool) {
      bool a = acc != 0, b = v != 0;
      acc = (op == ReduceOp::prod || op == ReduceOp::min || op == ReduceOp::band) ? (a && b)
            : op == ReduceOp::bxor                                                ? (a != b)
                                                                                  : (a || b);
      continue;
    }
    switch (op) {
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::band:
        acc = static_cast<double>(static_cast<int64_t>(acc) & static_cast<int64_t>(v));
        break;
      case ReduceOp::bor:
        acc = static_cast<double>(static_cast<int64_t>(acc) | static_cast<int64_t>(v));
        break;
      case ReduceOp::bxor:
        acc = static_cast<double>(static_cast<int64_t>(acc) ^ static_cast<int64_t>(v));
        break;
      default:
        acc += v;
        break;
    }
  }
  return acc;  // avg's division is applied by the caller (float vs integer semantics)
}

void put(void* p, size_t i, DataType t, double v) {
  store_element(p, i, t, v);
}
double get(const void* p, size_t i, DataType t) {
  return load_element(p, i, t);
}

struct Isa {
  const char* name;
  void (*fn)(const ReduceArgs&);
  bool available;
};
void PrintTo(const Isa& isa, std::ostream* os) { *os << isa.name; }  // in test names, not its bytes

std::vector<Isa> isas() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return {{"scalar", scalar::reduce, true},
          {"avx2", avx2::reduce, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
          {"avx512", avx512::reduce, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")}};
#else
  return {{"scalar", scalar::reduce, true}};
#endif
}

// One test per instruction set this build has, so that one the CPU lacks shows as skipped,
// naming it, rather than left out of a test that passes.
class ReduceIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!GetParam().available) GTEST_SKIP() << "this CPU lacks " << GetParam().name;
  }
};

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceIsa, ::testing::ValuesIn(isas()),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(p.param.name); });

TEST_P(ReduceIsa, EveryDtypeOpMatchesScalarLoop) {
  const DataType types[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,   DataType::i8,
                            DataType::u8,  DataType::i32, DataType::i64, DataType::boolean};
  std::mt19937 rng(42);
  {
    const Isa& isa = GetParam();
    for (DataType t : types) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        const auto op = static_cast<ReduceOp>(o);
        if (!supports(t, op)) continue;
        for (int nsrc : {1, 2, 3, 8}) {
          for (size_t n : {size_t{1}, size_t{15}, size_t{1024}, size_t{3001}}) {
            std::vector<std::vector<double>> vals(static_cast<size_t>(nsrc), std::vector<double>(n));
            std::vector<std::vector<uint64_t>> bufs(static_cast<size_t>(nsrc), std::vector<uint64_t>(n + 1));
            std::vector<const void*> srcs;
            for (int s = 0; s < nsrc; ++s) {
              for (size_t i = 0; i < n; ++i) {
                double v = (op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor)
                               ? static_cast<double>(rng() % 128)
                           : op == ReduceOp::prod                        ? static_cast<double>(rng() % 3 + 1)
                           : t == DataType::u8 || t == DataType::boolean ? static_cast<double>(rng() % 2)
                                                                         : static_cast<double>(rng() % 17) - 8;
                put(bufs[static_cast<size_t>(s)].data(), i, t, v);
                vals[static_cast<size_t>(s)][i] = get(bufs[static_cast<size_t>(s)].data(), i, t);
              }
              srcs.push_back(bufs[static_cast<size_t>(s)].data());
            }
            std::vector<uint64_t> dst(n + 1);
            Reduction red = op == ReduceOp::premul_sum ? Reduction::premul_sum(0.25) : Reduction(op);
            isa.fn({dst.data(), srcs.data(), nsrc, n, t, red, nsrc});
            // Aliased form: dst is source 0.
            std::vector<uint64_t> alias = bufs[0];
            std::vector<const void*> srcs2 = srcs;
            srcs2[0] = alias.data();
            isa.fn({alias.data(), srcs2.data(), nsrc, n, t, red, nsrc});
            for (size_t i = 0; i < n; ++i) {
              double want = scalar_ref(vals, i, op, t == DataType::boolean, 0.25);
              if (op == ReduceOp::avg && is_floating(t)) {
                double s = 0;
                for (auto& v : vals) s += v[i];
                want = s / nsrc;
              } else if (op == ReduceOp::avg) {
                int64_t s = 0;
                for (auto& v : vals) s += static_cast<int64_t>(v[i]);
                want = static_cast<double>(s / nsrc);  // C++ truncation toward zero
              }
              if (!is_floating(t) && op == ReduceOp::prod) {  // wrap like the hardware
                int64_t p = 1;
                for (auto& v : vals) p *= static_cast<int64_t>(v[i]);
                std::vector<uint64_t> tmp(1);
                put(tmp.data(), 0, t, static_cast<double>(p));
                want = get(tmp.data(), 0, t);
              }
              const double tol = t == DataType::f16    ? 2e-3 * std::max(1.0, std::fabs(want))
                                 : t == DataType::bf16 ? 1e-2 * std::max(1.0, std::fabs(want))
                                 : is_floating(t)      ? 1e-6 * std::max(1.0, std::fabs(want))
                                                       : 0;
              ASSERT_LE(std::fabs(get(dst.data(), i, t) - want), tol)
                  << isa.name << ' ' << to_string(t) << ' ' << to_string(op) << " nsrc=" << nsrc << " n=" << n
                  << " i=" << i;
              ASSERT_EQ(get(alias.data(), i, t), get(dst.data(), i, t)) << "aliased result differs";
            }
          }
        }
      }
    }
  }
}

TEST(ReduceKernels, HalfAccumulatesInFloatAndRoundsOnce) {
  // 2048 + 1 + 1 in f16: rounding after each add would give 2048 (1 is below half an ulp at
  // 2048); rounding once gives 2050.
  uint16_t a = f32_to_f16(2048.0f), b = f32_to_f16(1.0f), c = f32_to_f16(1.0f), out = 0;
  const void* srcs[] = {&a, &b, &c};
  reduce::reduce({&out, srcs, 3, 1, DataType::f16, ReduceOp::sum, 3});
  EXPECT_EQ(f16_to_f32(out), 2050.0f);
}

// Every instruction set gives the same bits for premul_sum: scale (rounded), then add (rounded).
// GCC contracts x * f + acc into one fused multiply-add where FMA is enabled (the AVX2 and
// AVX-512 copies), rounding once: here -1 + 1.00000012 * 1.5 gave 1.5 * 2^-23 there and 2^-22 on
// the scalar copy, so ranks on different paths (SMDDP_REDUCE_ISA, or nodes with other CPUs)
// disagreed. The library is built with -ffp-contract=off.
TEST_P(ReduceIsa, PremulSumRoundsTheProduct) {
  const float a = -1.0f, b = 0.0f, c = 1.00000012f;  // 0x3F800001: c * 1.5 is a tie in f32
  const void* srcs[] = {&a, &b, &c};
  volatile float product = c * 1.5f;  // rounded on its own, wherever this test is compiled
  const float want = (a * 1.5f + b * 1.5f) + product;
  {
    const Isa& isa = GetParam();
    float out = 0;
    isa.fn({&out, srcs, 3, 1, DataType::f32, Reduction::premul_sum(1.5), 3});
    EXPECT_EQ(out, want) << isa.name << ": " << out << " (a fused multiply-add gives 1.78813934e-07)";
  }
}

// avg of 8-bit integers divides by the world size, which does not fit in 8 bits from 128 (i8) or
// 256 (u8) ranks: it was narrowed to the element type first (-128 / -128 = 1 for 128 ranks
// averaging -1; a divisor of 0, SIGFPE, for 256 ranks of u8).
TEST_P(ReduceIsa, IntegerAvgDividesByTheWholeWorldSize) {
  {
    const Isa& isa = GetParam();
    const int8_t m1 = -1;
    const void* s8[] = {&m1};
    int8_t out8 = 0;
    isa.fn({&out8, s8, 1, 1, DataType::i8, ReduceOp::avg, 128});  // one rank's partial sum, -1, over 128 ranks
    EXPECT_EQ(out8, 0) << isa.name << " i8";                      // -1 / 128 truncates to 0
    const int8_t minus128 = -128;
    const void* s8b[] = {&minus128};
    isa.fn({&out8, s8b, 1, 1, DataType::i8, ReduceOp::avg, 128});
    EXPECT_EQ(out8, -1) << isa.name << " i8, sum -128 over 128";
    const uint8_t v = 200;
    const void* su[] = {&v};
    uint8_t outu = 0;
    isa.fn({&outu, su, 1, 1, DataType::u8, ReduceOp::avg, 256});
    EXPECT_EQ(outu, 0) << isa.name << " u8 over 256";
    isa.fn({&outu, su, 1, 1, DataType::u8, ReduceOp::avg, 300});
    EXPECT_EQ(outu, 0) << isa.name << " u8 over 300";
    isa.fn({&outu, su, 1, 1, DataType::u8, ReduceOp::avg, 2});
    EXPECT_EQ(outu, 100) << isa.name << " u8 over 2";
  }
}

// is_copy: where it says a reduction of one source may be a copy (the CUDA device then copies
// instead of launching the kernel), the kernels write exactly the source's bytes; the scaling
// ops, several sources and unsupported pairs are never copies.
TEST(ReduceKernels, OneSourceCopiesAreWhatTheKernelsWrite) {
  const DataType types[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,   DataType::i8,
                            DataType::u8,  DataType::i32, DataType::i64, DataType::boolean};
  std::mt19937_64 rng(7);
  size_t copies = 0;
  for (DataType t : types) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      for (const Reduction red : {Reduction(op), Reduction::premul_sum(1.0), Reduction::premul_sum(0.5)}) {
        if (red.op != op && op != ReduceOp::premul_sum) continue;
        for (int divisor : {1, 2}) {
          const size_t n = 1000, es = dtype_size(t);
          std::vector<std::byte> src(n * es), dst(n * es);
          for (size_t i = 0; i < n; ++i) {
            // Any bits of the type, but no NaN (a kernel may quiet one) and bools of 0 and 1.
            const double v = t == DataType::boolean ? static_cast<double>(rng() % 2)
                             : is_floating(t) ? static_cast<double>(static_cast<int64_t>(rng() % 200001) - 100000) / 64
                                              : static_cast<double>(static_cast<int64_t>(rng() % 255) - 127);
            put(src.data(), i, t, t == DataType::u8 ? std::fabs(v) : v);
          }
          const void* srcs[] = {src.data()};
          const ReduceArgs a{dst.data(), srcs, 1, n, t, red, divisor};
          const bool scales =
              (op == ReduceOp::avg && divisor != 1) || (op == ReduceOp::premul_sum && red.factor != 1.0);
          EXPECT_EQ(is_copy(a), supports(t, op) && !scales) << to_string(t) << ' ' << to_string(op) << " /" << divisor;
          if (!is_copy(a)) continue;
          ++copies;
          reduce::reduce(a);
          EXPECT_EQ(std::memcmp(dst.data(), src.data(), n * es), 0)
              << to_string(t) << ' ' << to_string(op) << ": the kernel did not write its one source";
          const void* two[] = {src.data(), src.data()};
          EXPECT_FALSE(is_copy({dst.data(), two, 2, n, t, red, divisor}));
        }
      }
    }
  }
  EXPECT_GT(copies, 40u);
}

TEST(ReduceKernels, UnsupportedCombinationThrows) {
  float x = 1;
  const void* s[] = {&x};
  EXPECT_THROW(reduce::reduce({&x, s, 1, 1, DataType::f32, ReduceOp::band, 1}), InvalidArgument);
}

// SMDDP_REDUCE_ISA: the best by default; a forced value that this build or CPU cannot run, or a
// misspelt one, is an error that names it instead of quietly running other kernels.
TEST(ReduceKernels, ForcedIsaIsCheckedAgainstTheBuildAndTheCpu) {
  EXPECT_STREQ(choose_isa("", true, true, true), "avx512");
  EXPECT_STREQ(choose_isa("", true, true, false), "avx2");
  EXPECT_STREQ(choose_isa("", true, false, false), "scalar");
  EXPECT_STREQ(choose_isa("", false, false, false), "scalar");
  EXPECT_STREQ(choose_isa("avx2", true, true, true), "avx2");
  EXPECT_STREQ(choose_isa("avx512", true, true, true), "avx512");
  EXPECT_STREQ(choose_isa("scalar", true, true, true), "scalar");
  EXPECT_STREQ(choose_isa("scalar", false, false, false), "scalar");
  const auto refused = [](const char* force, bool built, bool has2, bool has512, const std::string& words) {
    try {
      choose_isa(force, built, has2, has512);
      ADD_FAILURE() << force << ": no exception";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("SMDDP_REDUCE_ISA is '") + force + "'"), std::string::npos)
          << e.what();
    }
  };
  refused("avx512", true, true, false, "this CPU lacks AVX-512F/BW");
  refused("avx2", true, false, false, "this CPU lacks AVX2/FMA");
  refused("avx2", false, false, false, "only the portable kernels");
  refused("avx512", false, false, false, "only the portable kernels");
  refused("AVX2", true, true, true, "known: avx512, avx2, scalar");
  refused("sse", true, true, true, "known: avx512, avx2, scalar");
}

}  // namespace
