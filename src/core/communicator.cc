// The public Communicator and Work: argument checking and forwarding to CommunicatorImpl.
#include "smddp/communicator.h"

#include <thread>

#include "core/communicator_impl.h"
#include "core/fork_generation.h"
#include "core/cpu_relax.h"
#include "core/fingerprint.h"

namespace smddp {

using algorithms::CollArgs;
using algorithms::CollKind;

// --- Work ---

namespace {

// Throws a copy of the operation's error, with a string of its own, rather than the stored
// object itself. Every waiter (several threads may wait on copies of one Work) then owns what it
// catches, and the stored object, released by whichever thread drops the operation last (often
// the engine), is never read by a handler at that moment. libstdc++ counts references to an
// exception and to runtime_error's string in code ThreadSanitizer does not see, so sharing them
// across threads was also reported as a race on the exception's vptr.
[[noreturn]] void throw_copy_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const MismatchError& x) {
    throw MismatchError(std::string(x.what()));
  } catch (const InvalidArgument& x) {
    throw InvalidArgument(std::string(x.what()));
  } catch (const TimeoutError& x) {
    throw TimeoutError(std::string(x.what()), x.missing_ranks());
  } catch (const PeerError& x) {
    throw PeerError(std::string(x.what()), x.peer());
  } catch (const AbortedError& x) {
    throw AbortedError(std::string(x.what()));
  } catch (const SystemError& x) {
    throw SystemError(std::string(x.what()));
  } catch (const Error& x) {
    throw Error(std::string(x.what()));
  }
}

}  // namespace

InlineScope::InlineScope(bool enable) : previous_(engine::Engine::inline_on_this_thread()) {
  engine::Engine::inline_on_this_thread() = enable;
}

InlineScope::~InlineScope() { engine::Engine::inline_on_this_thread() = previous_; }

bool Work::test() const { return !state_ || state_->done.load(std::memory_order_acquire); }

namespace {
// A child forked after the operation was issued must not wait for it: waiting may run a
// collective nobody has started, as the parent's rank (fork_generation.h).
void check_same_process(const detail::OpState& s) {
  if (s.fork_generation != detail::OpState::kAnyProcess && detail::forked_since(s.fork_generation))
    throw InvalidArgument("smddp: " + s.describe() + " was issued by the process this one was forked from (a "
                          "DataLoader worker, multiprocessing's fork start method): only that process can wait for it");
}
}  // namespace

void Work::wait() const {
  if (!state_) return;
  check_same_process(*state_);
  // Not started yet and next in line: run it here rather than wake the engine and sleep.
  // (A callback of a collective this thread is completing: run what is queued up to it here.)
  // (Inside such a callback, work that only the engine thread can progress: a clear error.)
  if (!state_->done.load(std::memory_order_acquire))
    if (auto engine = state_->engine.lock())
      if (!engine->run_here(state_.get())) {
        engine->run_nested_through(state_.get());
        engine->check_wait_can_end(*state_);
        engine->expedite(state_.get());  // queued behind others, unwoken: do not sit out a tick
      }
  // Short spin first: collectives that ran inline are already done, small ones finish quickly.
  for (int i = 0; i < 200 && !state_->done.load(std::memory_order_acquire); ++i) cpu_relax();
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->done.load(std::memory_order_acquire); });
  if (state_->error) throw_copy_of(state_->error);
}

bool Work::wait_for(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  check_same_process(*state_);
  expedite();  // it does not run the collective here: have the engine start it now
  std::unique_lock<std::mutex> lk(state_->mu);
  if (!state_->cv.wait_for(lk, timeout, [&] { return state_->done.load(std::memory_order_acquire); })) return false;
  if (state_->error) throw_copy_of(state_->error);
  return true;
}

uint64_t Work::sequence() const { return state_ ? state_->seq : 0; }

int Work::source() const { return state_ && state_->source ? state_->source->load() : -1; }

void Work::then(std::function<void(std::exception_ptr)> callback) const {
  if (!state_) {
    callback(nullptr);
    return;
  }
  check_same_process(*state_);
  state_->on_complete(std::move(callback));
}

void Work::expedite() const {
  if (!state_ || state_->done.load(std::memory_order_acquire)) return;
  check_same_process(*state_);
  if (auto engine = state_->engine.lock()) engine->expedite(state_.get());
}

// --- Communicator ---

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, Options options)
    : impl_(std::make_unique<detail::CommunicatorImpl>(std::move(store), rank, size, std::move(options))) {}

Communicator::~Communicator() {
  // In a child forked from the process that made it, what it holds is the parent's (shared
  // memory, sockets, an engine thread that does not exist here): leave it all. Its memory is the
  // child's own copy, gone when the child exits.
  if (impl_ && impl_->forked_away()) (void)impl_.release();
  // Destroyed from a callback of one of its own operations (a future's callback dropping the
  // last reference to its process group), on the engine thread or on a caller's thread running
  // a collective inline: the teardown joins that thread and waits for that operation to end, so
  // here it would wait for itself (the engine joining itself raised std::terminate). It runs on
  // a thread of its own instead, once the operation returns; nothing of it is used meanwhile.
  if (impl_ && impl_->held_by_this_thread())
    std::thread([impl = std::move(impl_)]() mutable { impl.reset(); }).detach();
}

int Communicator::rank() const { return impl_->rank(); }
int Communicator::size() const { return impl_->size(); }
const Options& Communicator::options() const { return impl_->options(); }
int Communicator::process_local_rank() const { return impl_->process_local_rank(); }

namespace {
void check_reduction(const detail::CommunicatorImpl& c, DataType t, Reduction op, const char* name) {
  c.check_dtype(t, name);
  if (!supports(t, op.op))
    throw InvalidArgument("smddp: rank " + std::to_string(c.rank()) + ": " + name + ": reduce op " +
                          to_string(op.op) + " is not supported for dtype " + to_string(t));
}
}  // namespace

Work Communicator::allreduce(const void* send, void* recv, size_t count, DataType type, Reduction op, Memory memory) {
  check_reduction(*impl_, type, op, "allreduce");
  impl_->check_count(count, 1, type, "allreduce");
  impl_->check_buffer(send, count, "send", "allreduce");
  impl_->check_buffer(recv, count, "recv", "allreduce");
  const size_t bytes = count * dtype_size(type);
  impl_->check_overlap(send, bytes, recv, bytes, reinterpret_cast<uintptr_t>(recv), "allreduce");
  CollArgs a;
  a.kind = CollKind::allreduce;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type; a.op = op;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::allreduce_coalesced(const void* send, void* recv, const std::vector<size_t>& parts,
                                       DataType type, Reduction op, Memory memory) {
  size_t count = 0;
  for (size_t p : parts) count += p;
  check_reduction(*impl_, type, op, "allreduce_coalesced");
  impl_->check_count(count, 1, type, "allreduce_coalesced");
  impl_->check_buffer(send, count, "send", "allreduce_coalesced");
  impl_->check_buffer(recv, count, "recv", "allreduce_coalesced");
  const size_t bytes = count * dtype_size(type);
  impl_->check_overlap(send, bytes, recv, bytes, reinterpret_cast<uintptr_t>(recv), "allreduce_coalesced");
  CollArgs a;
  a.kind = CollKind::allreduce;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type; a.op = op;
  a.parts = detail::parts_signature(parts);
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::allgather(const void* send, void* recv, size_t count, DataType type, Memory memory) {
  impl_->check_dtype(type, "allgather");
  impl_->check_count(count, static_cast<size_t>(size()), type, "allgather");
  impl_->check_buffer(send, count, "send", "allgather");
  impl_->check_buffer(recv, count, "recv", "allgather");
  // In place: the input is this rank's block of the output.
  const size_t bytes = count * dtype_size(type);
  impl_->check_overlap(send, bytes, recv, bytes * static_cast<size_t>(size()),
                       reinterpret_cast<uintptr_t>(recv) + bytes * static_cast<size_t>(rank()), "allgather");
  CollArgs a;
  a.kind = CollKind::allgather;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, Reduction op, Memory memory) {
  check_reduction(*impl_, type, op, "reduce_scatter");
  impl_->check_count(recv_count, static_cast<size_t>(size()), type, "reduce_scatter");
  impl_->check_buffer(send, recv_count, "send", "reduce_scatter");
  impl_->check_buffer(recv, recv_count, "recv", "reduce_scatter");
  // In place: the output is this rank's block of the input.
  const size_t bytes = recv_count * dtype_size(type);
  impl_->check_overlap(send, bytes * static_cast<size_t>(size()), recv, bytes,
                       reinterpret_cast<uintptr_t>(recv) - bytes * static_cast<size_t>(rank()), "reduce_scatter");
  CollArgs a;
  a.kind = CollKind::reduce_scatter;
  a.send = send; a.recv = recv; a.count = recv_count; a.dtype = type; a.op = op;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::broadcast(void* buffer, size_t count, DataType type, int root, Memory memory) {
  impl_->check_dtype(type, "broadcast");
  impl_->check_rank(root, "root", "broadcast");
  impl_->check_count(count, 1, type, "broadcast");
  impl_->check_buffer(buffer, count, "data", "broadcast");
  CollArgs a;
  a.kind = CollKind::broadcast;
  a.send = buffer; a.recv = buffer; a.count = count; a.dtype = type; a.root = root;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::reduce(const void* send, void* recv, size_t count, DataType type, Reduction op, int root, Memory memory) {
  check_reduction(*impl_, type, op, "reduce");
  impl_->check_rank(root, "root", "reduce");
  impl_->check_count(count, 1, type, "reduce");
  impl_->check_buffer(send, count, "send", "reduce");
  if (rank() == root) {
    impl_->check_buffer(recv, count, "recv", "reduce");
    const size_t bytes = count * dtype_size(type);
    impl_->check_overlap(send, bytes, recv, bytes, reinterpret_cast<uintptr_t>(recv), "reduce");
  }
  CollArgs a;
  a.kind = CollKind::reduce;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type; a.op = op; a.root = root;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::gather(const void* send, void* recv, size_t count, DataType type, int root, Memory memory) {
  impl_->check_dtype(type, "gather");
  impl_->check_rank(root, "root", "gather");
  impl_->check_count(count, static_cast<size_t>(size()), type, "gather");
  impl_->check_buffer(send, count, "send", "gather");
  if (rank() == root) {
    impl_->check_buffer(recv, count, "recv", "gather");
    const size_t bytes = count * dtype_size(type);
    impl_->check_overlap(send, bytes, recv, bytes * static_cast<size_t>(size()),
                         reinterpret_cast<uintptr_t>(recv) + bytes * static_cast<size_t>(root), "gather");
  }
  CollArgs a;
  a.kind = CollKind::gather;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type; a.root = root;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::scatter(const void* send, void* recv, size_t count, DataType type, int root, Memory memory) {
  impl_->check_dtype(type, "scatter");
  impl_->check_rank(root, "root", "scatter");
  impl_->check_count(count, static_cast<size_t>(size()), type, "scatter");
  if (rank() == root) impl_->check_buffer(send, count, "send", "scatter");
  impl_->check_buffer(recv, count, "recv", "scatter");
  if (rank() == root) {
    const size_t bytes = count * dtype_size(type);
    impl_->check_overlap(send, bytes * static_cast<size_t>(size()), recv, bytes,
                         reinterpret_cast<uintptr_t>(recv) - bytes * static_cast<size_t>(root), "scatter");
  }
  CollArgs a;
  a.kind = CollKind::scatter;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type; a.root = root;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::alltoall(const void* send, void* recv, size_t count, DataType type, Memory memory) {
  impl_->check_dtype(type, "alltoall");
  impl_->check_count(count, static_cast<size_t>(size()), type, "alltoall");
  impl_->check_buffer(send, count, "send", "alltoall");
  impl_->check_buffer(recv, count, "recv", "alltoall");
  const size_t bytes = count * dtype_size(type) * static_cast<size_t>(size());
  impl_->check_overlap(send, bytes, recv, bytes, reinterpret_cast<uintptr_t>(recv), "alltoall");
  CollArgs a;
  a.kind = CollKind::alltoall;
  a.send = send; a.recv = recv; a.count = count; a.dtype = type;
  const auto w = static_cast<size_t>(size());
  a.send_counts.assign(w, count);
  a.recv_counts.assign(w, count);
  for (size_t j = 0; j < w; ++j) {
    a.send_displs.push_back(j * count);
    a.recv_displs.push_back(j * count);
  }
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::alltoallv(const void* send, const std::vector<size_t>& send_counts,
                             const std::vector<size_t>& send_displs, void* recv,
                             const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                             DataType type, Memory memory) {
  impl_->check_dtype(type, "alltoallv");
  const auto w = static_cast<size_t>(size());
  if (send_counts.size() != w || send_displs.size() != w || recv_counts.size() != w || recv_displs.size() != w)
    throw InvalidArgument("smddp: rank " + std::to_string(rank()) + ": alltoallv: counts and displacements need " +
                          std::to_string(w) + " entries each (one per rank)");
  // A block's end, count + displacement: checked for wrapping first (a displacement near
  // SIZE_MAX made a small end that passed, and the block was read before the buffer).
  auto block_end = [&](size_t count, size_t displ, const char* which) {
    size_t end = 0;
    if (__builtin_add_overflow(count, displ, &end))
      throw InvalidArgument("smddp: rank " + std::to_string(rank()) + ": alltoallv: " + which + " block of " +
                            std::to_string(count) + " elements at displacement " + std::to_string(displ) +
                            " overflows the addressable size");
    return end;
  };
  for (size_t j = 0; j < w; ++j) {
    impl_->check_count(block_end(send_counts[j], send_displs[j], "a send"), 1, type, "alltoallv");
    impl_->check_count(block_end(recv_counts[j], recv_displs[j], "a receive"), 1, type, "alltoallv");
    impl_->check_buffer(send, send_counts[j], "send", "alltoallv");
    impl_->check_buffer(recv, recv_counts[j], "recv", "alltoallv");
  }
  // In place (send == recv) is allowed: the algorithms read every block to send before a
  // received one may land on it. Other overlaps are refused, as for alltoall.
  impl_->check_overlap(send, algorithms::alltoall_extent(send_counts, send_displs) * dtype_size(type), recv,
                       algorithms::alltoall_extent(recv_counts, recv_displs) * dtype_size(type),
                       reinterpret_cast<uintptr_t>(recv), "alltoallv");
  CollArgs a;
  a.kind = CollKind::alltoall;
  a.send = send; a.recv = recv; a.dtype = type; a.uniform = false;
  a.send_counts = send_counts; a.send_displs = send_displs;
  a.recv_counts = recv_counts; a.recv_displs = recv_displs;
  a.memory = memory;
  return impl_->collective(std::move(a));
}

Work Communicator::send(const void* buffer, size_t count, DataType type, int peer, uint32_t tag, Memory memory) {
  impl_->check_dtype(type, "send");
  impl_->check_rank(peer, "peer", "send");
  impl_->check_count(count, 1, type, "send");
  impl_->check_buffer(buffer, count, "send", "send");
  return impl_->send(buffer, count * dtype_size(type), peer, tag, memory);
}

Work Communicator::recv(void* buffer, size_t count, DataType type, int peer, uint32_t tag, Memory memory) {
  impl_->check_dtype(type, "recv");
  impl_->check_rank(peer, "peer", "recv");
  impl_->check_count(count, 1, type, "recv");
  impl_->check_buffer(buffer, count, "recv", "recv");
  return impl_->recv(buffer, count * dtype_size(type), peer, tag, memory);
}

Work Communicator::recv_any(void* buffer, size_t count, DataType type, uint32_t tag, Memory memory) {
  impl_->check_dtype(type, "recv");
  impl_->check_count(count, 1, type, "recv");
  impl_->check_buffer(buffer, count, "recv", "recv");
  return impl_->recv_any(buffer, count * dtype_size(type), tag, memory);
}

Work Communicator::barrier(std::chrono::milliseconds timeout) {
  CollArgs a;
  a.kind = CollKind::barrier;
  a.timeout = timeout;
  return impl_->collective(std::move(a));
}

void Communicator::abort(const std::string& reason) { impl_->abort(reason); }

}  // namespace smddp
