#include "device/slot_stores.h"

#include <algorithm>
#include <chrono>

#include "device/host_copy.h"
#include "smddp/errors.h"
#include "smddp/types.h"

namespace smddp::device {

const char* to_string(StoreKind k) { return k == StoreKind::plain ? "plain" : "streaming"; }

StoreKindChooser::Setting StoreKindChooser::parse(const std::string& value) {
  if (value == "auto") return Setting::automatic;
  if (value == "plain") return Setting::plain;
  if (value == "streaming") {
    if (!streaming_stores_built())
      throw InvalidArgument("smddp: SMDDP_SHM_STORES=streaming: this build has no non-temporal stores (x86-64 only)");
    return Setting::streaming;
  }
  throw InvalidArgument("smddp: SMDDP_SHM_STORES='" + value + "' is not auto, plain or streaming");
}

StoreKindChooser::StoreKindChooser(Setting s) : setting_(streaming_stores_built() ? s : Setting::plain) {
  if (setting_ == Setting::streaming)
    for (Class& c : classes_) c.current = StoreKind::streaming;
}

void StoreKindChooser::Rates::add(double r) {
  ns_per_kib[static_cast<size_t>(next)] = r;
  next = (next + 1) % static_cast<int>(ns_per_kib.size());
  count = std::min(count + 1, static_cast<int>(ns_per_kib.size()));
}

double StoreKindChooser::Rates::least() const {
  if (count == 0) return 0;
  return *std::min_element(ns_per_kib.begin(), ns_per_kib.begin() + count);
}

int StoreKindChooser::class_of(int family, size_t bytes) {
  int size = 0;
  for (size_t b = bytes / kLargeBytes; b >= 4 && size < kSizes - 1; b /= 4) ++size;
  return family * kSizes + size;
}

std::string StoreKindChooser::size_range(int cls) {
  const int size = cls % kSizes;
  auto mib = [](int s) { return s >= 5 ? std::to_string(1 << (2 * s - 10)) + " GiB" : std::to_string(1 << (2 * s)) + " MiB"; };
  return size == kSizes - 1 ? mib(size) + " and more" : mib(size) + " to " + mib(size + 1);
}

double StoreKindChooser::estimate(int cls, StoreKind k) const {
  return classes_[static_cast<size_t>(cls)].rates[static_cast<size_t>(k)].least();
}

StoreKindChooser::Turn StoreKindChooser::begin(int family, size_t message_bytes) {
  if (setting_ == Setting::streaming) return {StoreKind::streaming, false, -1};
  if (setting_ == Setting::plain || family < 0 || family >= kFamilies) return {StoreKind::plain, false, -1};
  const int cls = class_of(family, message_bytes);
  Class& c = classes_[static_cast<size_t>(cls)];
  if (message_bytes < kLargeBytes) return {c.current, false, cls};
  const uint64_t i = c.begun++ % kPeriod;
  if (i == kPlainProbe) return {StoreKind::plain, true, cls};
  if (i == kStreamingProbe) return {StoreKind::streaming, true, cls};
  return {c.current, false, cls};
}

void StoreKindChooser::end(Turn turn, size_t bytes, int64_t ns) {
  if (!turn.probe || turn.cls < 0 || bytes < kSampleBytes || ns <= 0) return;
  Class& c = classes_[static_cast<size_t>(turn.cls)];
  c.rates[static_cast<size_t>(turn.kind)].add(static_cast<double>(ns) * 1024.0 / static_cast<double>(bytes));
  const double plain = estimate(turn.cls, StoreKind::plain), streaming = estimate(turn.cls, StoreKind::streaming);
  if (plain <= 0 || streaming <= 0) return;
  const StoreKind was = c.current;
  if (c.current == StoreKind::plain && plain > kToStreaming * streaming) c.current = StoreKind::streaming;
  else if (c.current == StoreKind::streaming && plain < kToPlain * streaming) c.current = StoreKind::plain;
  if (c.current != was) ++switches_;
}

SlotStoreDevice::SlotStoreDevice(Device& inner, const std::byte* span, size_t span_bytes, StoreKind kind)
    : inner_(inner), span_(span), span_bytes_(span_bytes), kind_(kind) {}

bool SlotStoreDevice::in_span(const void* p) const {
  const auto* b = static_cast<const std::byte*>(p);
  return span_ && b >= span_ && b < span_ + span_bytes_;
}

bool SlotStoreDevice::reads_span(const reduce::ReduceArgs& args) const {
  for (int i = 0; i < args.nsrc; ++i)
    if (in_span(args.srcs[i])) return true;
  return false;
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void SlotStoreDevice::copy(void* dst, const void* src, size_t bytes) {
  const bool writes = in_span(dst);
  if (dst == src || bytes < kMinBytes || !(writes || in_span(src))) return inner_.copy(dst, src, bytes);
  const int64_t t0 = now_ns();
  if (writes && kind_ == StoreKind::streaming) {
    host_copy_streaming(dst, src, bytes);
    unfenced_ = true;
  } else {
    inner_.copy(dst, src, bytes);
  }
  spent_ns_ += now_ns() - t0;
  moved_ += bytes;
}

void SlotStoreDevice::copy_rows(void* dst, size_t dst_stride, const void* src, size_t src_stride, size_t bytes,
                                size_t rows) {
  if (bytes < kMinBytes || !(in_span(dst) || in_span(src)))
    return inner_.copy_rows(dst, dst_stride, src, src_stride, bytes, rows);
  Device::copy_rows(dst, dst_stride, src, src_stride, bytes, rows);  // a copy() per row, each timed
}

void SlotStoreDevice::reduce(const reduce::ReduceArgs& args) {
  const size_t es = dtype_size(args.dtype), bytes = args.count * es;
  const bool writes = in_span(args.dst);
  if (bytes < kMinBytes || !(writes || reads_span(args))) return inner_.reduce(args);
  const int64_t t0 = now_ns();
  if (!writes || kind_ == StoreKind::plain) {
    inner_.reduce(args);
  } else {
    // Piece by piece into piece_, each streamed out before the next: a source that is the
    // destination (allowed when exact) is read for a piece before that piece is written.
    const size_t per = kPieceBytes / es;
    piece_srcs_.resize(static_cast<size_t>(args.nsrc));
    for (size_t done = 0; done < args.count; done += per) {
      const size_t n = std::min(per, args.count - done);
      for (int i = 0; i < args.nsrc; ++i)
        piece_srcs_[static_cast<size_t>(i)] = static_cast<const std::byte*>(args.srcs[i]) + done * es;
      reduce::ReduceArgs piece = args;
      piece.dst = piece_;
      piece.srcs = piece_srcs_.data();
      piece.count = n;
      inner_.reduce(piece);
      host_copy_streaming(static_cast<std::byte*>(args.dst) + done * es, piece_, n * es);
    }
    unfenced_ = true;
  }
  spent_ns_ += now_ns() - t0;
  moved_ += bytes;
}

void SlotStoreDevice::fence() {
  if (unfenced_) {
    store_fence();
    unfenced_ = false;
  }
  inner_.fence();
}

}  // namespace smddp::device
