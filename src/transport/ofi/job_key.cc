#include "transport/ofi/job_key.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "smddp/errors.h"

namespace smddp::ofi {

namespace {
// splitmix64's finaliser: every bit of the result depends on every bit of the input.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<uint8_t> new_job_token() {
  std::vector<uint8_t> token(kJobTokenBytes);
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw SystemError(std::string("smddp: getrandom for the job token failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return token;
}

uint64_t job_key(const std::vector<uint8_t>& token) {
  if (token.size() != kJobTokenBytes)
    throw InvalidArgument(std::string("smddp: the Store's ") + kJobTokenKey + " holds " + std::to_string(token.size()) +
                          " bytes, not a " + std::to_string(kJobTokenBytes) +
                          "-byte job token (a rank of another smddp version, or another program's key?)");
  uint64_t a = 0, b = 0;
  std::memcpy(&a, token.data(), 8);
  std::memcpy(&b, token.data() + 8, 8);
  return mix(a ^ mix(b + 0x9e3779b97f4a7c15ULL));
}

uint64_t constant_tag_bits(int size, int rank_bits) {
  int used = 0;  // bits a rank number needs
  while (used < rank_bits && (uint64_t{1} << used) < static_cast<uint64_t>(size)) ++used;
  uint64_t bits = 0;
  for (int b = used; b < rank_bits; ++b) bits |= uint64_t{1} << (64 - rank_bits + b);
  return bits;
}

ForeignSweep::ForeignSweep(uint64_t key, uint64_t check_bits, std::chrono::milliseconds period)
    : key_(key), period_(period) {
  for (int b = 0; b < 64; ++b)
    if (check_bits & (uint64_t{1} << b)) bits_.push_back(b);
  enabled_ = !bits_.empty();
}

bool ForeignSweep::next(Clock::time_point now, uint64_t* tag, uint64_t* ignore) {
  if (!enabled_ || outstanding_ || now < due_) return false;
  const uint64_t bit = uint64_t{1} << bits_[current_];
  *tag = (key_ & bit) ^ bit;  // that bit the opposite of ours
  *ignore = ~bit;             // and nothing else looked at
  outstanding_ = true;
  return true;
}

size_t ForeignSweep::discarded(uint64_t wire_tag) {
  outstanding_ = false;
  last_tag_ = wire_tag;
  return ++dropped_;
}

void ForeignSweep::found_none(Clock::time_point now) {
  outstanding_ = false;
  if (++current_ < bits_.size()) return;
  current_ = 0;
  due_ = now + period_;
}

std::string hex_tag(uint64_t tag) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(tag));
  return buf;
}

}  // namespace smddp::ofi
