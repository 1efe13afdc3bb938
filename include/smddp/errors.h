// The exception hierarchy. Every error smddp raises derives from smddp::Error and carries
// the context needed to act on it (op, sequence number, rank, peer) in its message.
// Work::wait throws a copy of an operation's error by its class (throw_copy_of in
// src/core/communicator.cc): a class added here needs its line there.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace smddp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something wrong: null buffer, bad root, unsupported dtype/op, overflow.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The ranks disagree about a collective (kind, count, dtype, op, root, per-peer counts): raised
// on every rank in the collective's first round, before any output is written. The communicator
// is aborted (its later calls raise AbortedError naming this); make a new one.
class MismatchError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A collective's deadline passed. missing_ranks() names the ranks that never arrived.
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& what, std::vector<int> missing)
      : Error(what), missing_(std::move(missing)) {}
  const std::vector<int>& missing_ranks() const { return missing_; }

 private:
  std::vector<int> missing_;
};

// A peer died, left, or aborted the communicator.
class PeerError : public Error {
 public:
  PeerError(const std::string& what, int peer) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// The communicator was aborted (by this process or a peer) and accepts no more work.
class AbortedError : public Error {
 public:
  using Error::Error;
};

// An operating-system or transport call failed.
class SystemError : public Error {
 public:
  using Error::Error;
};

}  // namespace smddp
