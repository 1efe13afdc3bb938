// Stores into the staging slots (device/slot_stores.h): the streaming copy writes exactly its
// range at every alignment; the slot device gives the same bytes with either kind, in copies and
// in reductions (also one whose destination is a source), streams only into its span, times what
// writes or reads the span; the chooser probes both kinds on the same collectives of a class,
// switches on the margins it documents, and keeps each class apart.
#include "device/slot_stores.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "device/host_copy.h"
#include "smddp/errors.h"

namespace smddp::device {
namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>((seed = seed * 1664525u + 1013904223u) >> 24);
  return v;
}

TEST(StreamingCopy, EveryAlignmentAndSizeCopiesExactlyTheRange) {
  constexpr size_t kGuard = 128;
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 127, 128, 200, 4096, 16 * 1024 + 13, 100 * 1000};
  const auto src = pattern(128 * 1024, 7);
  std::vector<uint8_t> dst(128 * 1024 + 2 * kGuard);
  for (size_t n : sizes)
    for (size_t so = 0; so < 64; so += 9)
      for (size_t dof = 0; dof < 64; dof += 13) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        host_copy_streaming(dst.data() + kGuard + dof, src.data() + so, n);
        store_fence();
        ASSERT_EQ(std::memcmp(dst.data() + kGuard + dof, src.data() + so, n), 0) << n << " bytes, " << so << "/" << dof;
        for (size_t i = 0; i < kGuard + dof; ++i) ASSERT_EQ(dst[i], 0xA5) << "before, " << n << " bytes";
        for (size_t i = kGuard + dof + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xA5) << "after, " << n << " bytes";
      }
}

// Copies and reductions into the span with both kinds, against the host device's own.
TEST(SlotStoreDevice, BothKindsWriteTheSameBytesAndOnlyTheSpanIsTimed) {
  constexpr size_t kCount = 50'000 + 3;  // f32: 4 pieces of 16 KiB and a ragged end
  std::vector<float> a(kCount), b(kCount), want(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i % 1000) * 0.25f;
    b[i] = static_cast<float>((i * 7) % 333) - 100.0f;
  }
  const void* srcs[] = {a.data(), b.data()};
  host().reduce({want.data(), srcs, 2, kCount, DataType::f32, Reduction(ReduceOp::sum)});
  for (StoreKind kind : {StoreKind::plain, StoreKind::streaming}) {
    if (kind == StoreKind::streaming && !streaming_stores_built()) continue;
    std::vector<float> span(2 * kCount + 16, -1.0f), outside(kCount, -1.0f);
    SlotStoreDevice d(host(), reinterpret_cast<std::byte*>(span.data()), span.size() * sizeof(float), kind);
    // 4 bytes into the span: the head is unaligned to the 64-byte lines.
    float* into = span.data() + 1;
    d.reduce({into, srcs, 2, kCount, DataType::f32, Reduction(ReduceOp::sum)});
    d.fence();
    EXPECT_EQ(std::memcmp(into, want.data(), kCount * sizeof(float)), 0) << to_string(kind);
    EXPECT_EQ(span[0], -1.0f);
    EXPECT_EQ(span[kCount + 1], -1.0f);
    EXPECT_EQ(d.moved(), kCount * sizeof(float));
    // In place: the destination is the first source.
    float* second = span.data() + kCount + 8;
    std::memcpy(second, a.data(), kCount * sizeof(float));
    const void* in_place[] = {second, b.data()};
    d.reduce({second, in_place, 2, kCount, DataType::f32, Reduction(ReduceOp::sum)});
    d.copy(outside.data(), second, kCount * sizeof(float));  // reads the span: timed, plain
    d.fence();
    EXPECT_EQ(std::memcmp(outside.data(), want.data(), kCount * sizeof(float)), 0) << to_string(kind);
    EXPECT_EQ(d.moved(), 3 * kCount * sizeof(float));
    // Neither side in the span, or under 16 KiB: the inner device's, untimed.
    std::vector<float> other(kCount);
    d.copy(other.data(), a.data(), kCount * sizeof(float));
    d.copy(into, a.data(), 1024);
    d.fence();
    EXPECT_EQ(std::memcmp(other.data(), a.data(), kCount * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(into, a.data(), 1024), 0);
    EXPECT_EQ(d.moved(), 3 * kCount * sizeof(float));
    EXPECT_GT(d.spent_ns(), 0);
  }
}

TEST(StoreKindChooser, ParsesItsSettingAndRefusesOthers) {
  EXPECT_EQ(StoreKindChooser::parse("auto"), StoreKindChooser::Setting::automatic);
  EXPECT_EQ(StoreKindChooser::parse("plain"), StoreKindChooser::Setting::plain);
  if (streaming_stores_built()) EXPECT_EQ(StoreKindChooser::parse("streaming"), StoreKindChooser::Setting::streaming);
  else EXPECT_THROW(StoreKindChooser::parse("streaming"), InvalidArgument);
  try {
    StoreKindChooser::parse("nt");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SMDDP_SHM_STORES='nt'"), std::string::npos) << e.what();
  }
}

TEST(StoreKindChooser, FixedSettingsNeverProbe) {
  for (auto s : {StoreKindChooser::Setting::plain, StoreKindChooser::Setting::streaming}) {
    if (s == StoreKindChooser::Setting::streaming && !streaming_stores_built()) continue;
    StoreKindChooser c(s);
    const StoreKind want = s == StoreKindChooser::Setting::plain ? StoreKind::plain : StoreKind::streaming;
    for (int i = 0; i < 100; ++i) {
      const auto t = c.begin(0, size_t{4} << 20);
      EXPECT_EQ(t.kind, want);
      EXPECT_FALSE(t.probe);
      c.end(t, size_t{4} << 20, 1'000'000);
    }
    EXPECT_EQ(c.switches(), 0u);
  }
}

// Runs `n` collectives of `family` and `bytes` through c, each probe costing `plain_ns` or
// `streaming_ns` per KiB moved; returns the kinds the non-probes used.
std::vector<StoreKind> run(StoreKindChooser& c, int n, int family, size_t bytes, double plain_ns,
                           double streaming_ns) {
  std::vector<StoreKind> used;
  for (int i = 0; i < n; ++i) {
    const auto t = c.begin(family, bytes);
    if (!t.probe) used.push_back(t.kind);
    const double rate = t.kind == StoreKind::plain ? plain_ns : streaming_ns;
    c.end(t, bytes, static_cast<int64_t>(rate * static_cast<double>(bytes) / 1024.0));
  }
  return used;
}

TEST(StoreKindChooser, ProbesBothKindsAtTheSameCollectivesOfEachPeriod) {
  if (!streaming_stores_built()) GTEST_SKIP() << "no non-temporal stores off x86-64: auto is plain";
  StoreKindChooser c(StoreKindChooser::Setting::automatic);
  std::vector<int> probes;
  for (int i = 0; i < 3 * static_cast<int>(StoreKindChooser::kPeriod); ++i) {
    const auto t = c.begin(1, size_t{2} << 20);
    if (t.probe) probes.push_back(i * 10 + (t.kind == StoreKind::plain ? 0 : 1));
    c.end(t, 0, 0);  // nothing measured: no choice is made
  }
  const int p = static_cast<int>(StoreKindChooser::kPeriod), a = static_cast<int>(StoreKindChooser::kPlainProbe),
            b = static_cast<int>(StoreKindChooser::kStreamingProbe);
  EXPECT_EQ(probes, (std::vector<int>{a * 10, b * 10 + 1, (p + a) * 10, (p + b) * 10 + 1, (2 * p + a) * 10,
                                      (2 * p + b) * 10 + 1}));
  // Small messages and families whose sizes may differ between ranks are never probed.
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(c.begin(1, size_t{512} << 10).probe);
    EXPECT_FALSE(c.begin(-1, size_t{64} << 20).probe);
  }
}

TEST(StoreKindChooser, SwitchesOnItsMarginsAndBack) {
  if (!streaming_stores_built()) GTEST_SKIP() << "no non-temporal stores off x86-64: auto is plain";
  StoreKindChooser c(StoreKindChooser::Setting::automatic);
  const size_t mib4 = size_t{4} << 20;
  const int cls = StoreKindChooser::class_of(0, mib4);
  // Plain 10% dearer: inside the margin, plain stays.
  auto used = run(c, 64, 0, mib4, 110, 100);
  EXPECT_EQ(c.current(cls), StoreKind::plain);
  EXPECT_EQ(c.switches(), 0u);
  // 40% dearer (the far placement measured 60 against 43): streaming once the cheaper plain
  // probes have left the last four, not before.
  const int p = static_cast<int>(StoreKindChooser::kPeriod);
  used = run(c, 3 * p, 0, mib4, 140, 100);
  EXPECT_EQ(c.current(cls), StoreKind::plain);
  used = run(c, p, 0, mib4, 140, 100);
  EXPECT_EQ(c.current(cls), StoreKind::streaming);
  EXPECT_EQ(c.switches(), 1u);
  EXPECT_EQ(used.back(), StoreKind::streaming);
  // Plain cheaper again: the least of its last four probes falls at once, so back to plain.
  used = run(c, 32, 0, mib4, 80, 100);
  EXPECT_EQ(c.current(cls), StoreKind::plain);
  EXPECT_EQ(c.switches(), 2u);
  EXPECT_EQ(used.back(), StoreKind::plain);
  EXPECT_DOUBLE_EQ(c.estimate(cls, StoreKind::plain), 80);
}

TEST(StoreKindChooser, EachFamilyAndSizeChoosesApart) {
  if (!streaming_stores_built()) GTEST_SKIP() << "no non-temporal stores off x86-64: auto is plain";
  StoreKindChooser c(StoreKindChooser::Setting::automatic);
  const size_t mib1 = size_t{1} << 20, mib4 = size_t{4} << 20;
  EXPECT_NE(StoreKindChooser::class_of(1, mib1), StoreKindChooser::class_of(1, mib4));
  EXPECT_EQ(StoreKindChooser::class_of(1, mib4), StoreKindChooser::class_of(1, mib4 * 4 - 1));
  EXPECT_NE(StoreKindChooser::class_of(1, mib4), StoreKindChooser::class_of(2, mib4));
  EXPECT_EQ(StoreKindChooser::class_of(1, size_t{1} << 40), StoreKindChooser::class_of(1, size_t{1} << 30));
  EXPECT_EQ(StoreKindChooser::size_range(StoreKindChooser::class_of(1, mib4)), "4 MiB to 16 MiB");
  EXPECT_EQ(StoreKindChooser::size_range(StoreKindChooser::class_of(1, size_t{1} << 30)), "1 GiB and more");
  // Allgathers of 4 MiB gain from streaming; of 1 MiB they do not; reduce_scatters of 4 MiB do not.
  for (int round = 0; round < 64; ++round) {
    run(c, 1, 1, mib4, 200, 100);
    run(c, 1, 1, mib1, 90, 100);
    run(c, 1, 2, mib4, 100, 100);
  }
  EXPECT_EQ(c.current(StoreKindChooser::class_of(1, mib4)), StoreKind::streaming);
  EXPECT_EQ(c.current(StoreKindChooser::class_of(1, mib1)), StoreKind::plain);
  EXPECT_EQ(c.current(StoreKindChooser::class_of(2, mib4)), StoreKind::plain);
  // Under 1 MiB: the family's smallest class's kind, never probed.
  EXPECT_EQ(c.begin(1, size_t{256} << 10).kind, StoreKind::plain);
}

TEST(StoreKindChooser, ProbesTooSmallToTimeAreNotCounted) {
  if (!streaming_stores_built()) GTEST_SKIP() << "no non-temporal stores off x86-64: auto is plain";
  StoreKindChooser c(StoreKindChooser::Setting::automatic);
  // Collectives of 2 MiB that moved only 64 KiB through the slots (say, a window algorithm's
  // scratch elsewhere): however they timed, nothing is chosen from them.
  for (int i = 0; i < 200; ++i) {
    const auto t = c.begin(0, size_t{2} << 20);
    c.end(t, size_t{64} << 10, t.kind == StoreKind::plain ? 10'000'000 : 1);
  }
  EXPECT_EQ(c.switches(), 0u);
  EXPECT_EQ(c.estimate(StoreKindChooser::class_of(0, size_t{2} << 20), StoreKind::plain), 0);
}

}  // namespace
}  // namespace smddp::device
