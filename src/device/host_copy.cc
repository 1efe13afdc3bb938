#include "device/host_copy.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "core/config.h"
#include "smddp/errors.h"

namespace smddp::device {

namespace {

// Below kLoopMin memcpy is a handful of vector moves whatever the alignment. glibc stops using
// rep movsb above the L2 size (512 KiB a core here; a few MiB at most on today's CPUs) and
// chooses non-temporal stores for copies far larger than the caches, which the loop lacks: from
// kLoopMax on, memcpy again.
constexpr size_t kLoopMin = 512;
constexpr size_t kLoopMax = size_t{4} << 20;
static_assert(kLoopMin >= 128, "the loops copy a head of up to 31 bytes and need n >= head");

using CopyFn = void (*)(void*, const void*, size_t);

#if defined(__x86_64__)
// Stores aligned to the vector of V bytes (the head is copied unaligned by memcpy), loads
// unaligned: the source is the side out of step. Four vectors an iteration; the tail by memcpy.
// Always inlined, so that each caller's target (AVX2 or the SSE2 baseline) makes the moves.
template <size_t V>
[[gnu::always_inline]] inline void copy_vectors(void* dst, const void* src, size_t n) {
  typedef char Vec __attribute__((vector_size(V), may_alias));
  typedef char Unaligned __attribute__((vector_size(V), may_alias, aligned(1)));
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  const size_t head = (V - (reinterpret_cast<uintptr_t>(d) & (V - 1))) & (V - 1);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 4 * V <= n; i += 4 * V) {
    const Unaligned* from = reinterpret_cast<const Unaligned*>(s + i);
    const Vec a = from[0], b = from[1], c = from[2], e = from[3];
    Vec* to = reinterpret_cast<Vec*>(d + i);
    to[0] = a;
    to[1] = b;
    to[2] = c;
    to[3] = e;
  }
  std::memcpy(d + i, s + i, n - i);
}

__attribute__((target("avx2"))) void copy_avx2(void* dst, const void* src, size_t n) { copy_vectors<32>(dst, src, n); }
void copy_sse2(void* dst, const void* src, size_t n) { copy_vectors<16>(dst, src, n); }
#endif

struct Choice {
  CopyFn loop;  // null: memcpy for every copy
  const char* name;
};

#if defined(__x86_64__)
// Seconds of the fastest of `tries` memcpys of n bytes to `to`.
double fastest_copy(std::byte* to, const std::byte* from, size_t n, int tries) {
  double best = 1e9;
  for (int i = 0; i < tries; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to, from, n);
    asm volatile("" : : "r"(to) : "memory");  // the copy is the point: keep it
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Whether this CPU's memcpy is slow when the destination lies a few bytes past the source within
// a page (the rep movsb hazard above), measured: a 64 KiB copy 16 bytes ahead against one 64
// bytes ahead, in cache, fastest of 15 each, interleaved. Where the hazard is, the first takes
// about 20 times as long (AMD EPYC with glibc 2.36). Intel's rep movsb has no such penalty (within
// 1.4 times), and there memcpy beats our loop at these distances too (docs/performance.md,
// "Copies"), so only a clear 3 times picks the loop. Costs up to about 0.5 ms, once per process.
bool memcpy_slow_at_short_distance() {
  // One page-aligned allocation: the source at its start, the destination a page-multiple later
  // plus the distance under test.
  constexpr size_t kBytes = size_t{64} << 10, kSpan = kBytes + 4096;
  std::byte* const buf = static_cast<std::byte*>(std::aligned_alloc(4096, 2 * kSpan));
  if (!buf) return true;  // cannot measure: keep the loop, safe on every CPU
  std::memset(buf, 1, 2 * kSpan);
  std::byte* const src = buf;
  std::byte* const dst = buf + kSpan;
  double near = 1e9, far = 1e9;
  for (int round = 0; round < 3; ++round) {
    near = std::min(near, fastest_copy(dst + 16, src, kBytes, 5));
    far = std::min(far, fastest_copy(dst + 64, src, kBytes, 5));
  }
  std::free(buf);
  return near > 3 * far;
}
#endif

// `kind` as SMDDP_HOST_COPY names it; auto: the best loop this CPU has where its memcpy is slow
// at short distances, else memcpy for every copy.
Choice choose(const std::string& kind) {
  if (kind == "libc") return {nullptr, "libc"};
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2");
  if (kind == "avx2" && avx2) return {copy_avx2, "avx2"};
  if (kind == "sse2") return {copy_sse2, "sse2"};  // every x86-64 has SSE2
  if (kind == "auto") {
    static const bool slow = memcpy_slow_at_short_distance();
    if (!slow) return {nullptr, "libc"};
    return avx2 ? Choice{copy_avx2, "avx2"} : Choice{copy_sse2, "sse2"};
  }
#else
  if (kind == "auto") return {nullptr, "libc"};
#endif
  throw InvalidArgument("smddp: SMDDP_HOST_COPY='" + kind +
                        "' is not auto, libc or a vector loop this CPU runs (avx2, sse2 on x86-64)");
}

const Choice& choice() {
  static const Choice c = choose(config::get_string("SMDDP_HOST_COPY"));
  return c;
}

void copy_with(const Choice& c, void* dst, const void* src, size_t bytes) {
  if (c.loop && host_copy_takes_loop(dst, src, bytes)) c.loop(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
}

}  // namespace

bool host_copy_takes_loop(const void* dst, const void* src, size_t bytes) {
  // How far the destination lies past the source within a page: 1-31 is what the CPU's string
  // move takes for a possible overlap and runs byte by byte (measured 1-31 slow, 0 and 32-4095
  // fast); up to 63 kept for CPUs that may check whole lines.
  const uintptr_t ahead = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return ahead != 0 && ahead < 64 && bytes >= kLoopMin && bytes < kLoopMax;
}

void host_copy(void* dst, const void* src, size_t bytes) { copy_with(choice(), dst, src, bytes); }

void host_copy_as(const std::string& kind, void* dst, const void* src, size_t bytes) {
  copy_with(choose(kind), dst, src, bytes);
}

const char* host_copy_kind() { return choice().name; }

void host_copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  host_copy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  host_copy(d + i, s + i, bytes - i);
#else
  host_copy(dst, src, bytes);
#endif
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

bool streaming_stores_built() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

}  // namespace smddp::device
