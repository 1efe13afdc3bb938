// Communicator: a fixed group of ranks that run collectives together.
//
// Every collective is asynchronous: it returns a Work handle at once and runs on the
// communicator's engine, in issue order (the same order must be used on every rank).
// `work.wait()` is the blocking form. Buffers must stay valid until the work completes.
// `memory` says where the buffers are (types.h: host by default, or a CUDA device's memory;
// docs/gpu.md). In-place forms: pass the same pointer as send and recv (allreduce, reduce, allgather with
// send == recv + rank*count, reduce_scatter with recv == send + rank*count).
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "smddp/errors.h"
#include "smddp/store.h"
#include "smddp/types.h"

namespace smddp {

namespace detail {
struct OpState;
class CommunicatorImpl;
}  // namespace detail

struct Options {
  // Deadline of every wait inside a collective, from the moment it starts to run.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Distinguishes communicators made from one store (subgroups): becomes a key prefix. Groups
  // made at the same time from one store need names of their own: the ranks of two groups with
  // one name could pair across them (each rank numbers its communicators per name and rank).
  // Communicators made one after another under one name are kept apart by that number.
  std::string name = "default";
  // Per-communicator algorithm choice, same syntax as SMDDP_ALGO ("allreduce:rs_ag,..."); takes
  // precedence over the environment. Empty: the selector decides.
  std::string algorithms;
  // Run a collective on the calling thread when the engine is idle (no hand-off). Unset: the
  // SMDDP_INLINE setting. The PyTorch backend turns it off, so that async_op=True calls return
  // at once and overlap; it runs its synchronous calls inline with an InlineScope instead.
  // Either way, wait() runs a collective that the engine thread has not started yet.
  std::optional<bool> inline_execution;
  // This process's local rank on its node among all the job's processes (torchrun's LOCAL_RANK),
  // which picks the NIC its traffic between nodes takes: local rank l drives GPU l and the NIC
  // nearest it, or NIC l mod NICs. Unset: its local rank in this communicator, which is the same
  // for a communicator of all the node's processes, but 0 on every process of a subgroup with
  // one process per node (HSDP's replicate groups, a device mesh's data-parallel dimension), so
  // that all of a node's processes would share its first NIC.
  std::optional<int> local_rank;
};

// While an InlineScope(true) lives on a thread, a collective that thread issues to an idle
// communicator runs at once on that thread, as with Options::inline_execution = true, whatever
// the options say. For a caller that waits for the result right away (torch's synchronous
// collectives): the engine thread's two hand-offs cost more than a small collective itself.
// Scopes nest; each restores what it found.
class InlineScope {
 public:
  explicit InlineScope(bool enable = true);
  ~InlineScope();
  InlineScope(const InlineScope&) = delete;
  InlineScope& operator=(const InlineScope&) = delete;

 private:
  bool previous_;
};

// Handle to one asynchronous operation.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::OpState> s) : state_(std::move(s)) {}
  // True once the operation finished (successfully or not); never blocks.
  bool test() const;
  // Blocks until the operation finishes; rethrows its error.
  void wait() const;
  // Like wait(), but gives up after `timeout`: returns false if still running.
  bool wait_for(std::chrono::milliseconds timeout) const;
  // Sequence number of the operation within its communicator (1, 2, ...).
  uint64_t sequence() const;
  // For a receive from any source: the rank the message comes from, once known (else -1).
  int source() const;
  // Calls `callback` once the operation finishes, with its error (null on success): on the
  // thread that completes it, or at once on this thread if it already finished (then what it
  // throws reaches this caller). A collective's callback may wait for collectives of the same
  // communicator issued before it ends (they run on its thread, in issue order: DDP's PowerSGD
  // hook does this), also through another communicator's callback on the same thread. Waiting
  // there on point-to-point work, or on a collective queued behind some, raises Error (that
  // work moves only after the callback returns), as does a point-to-point op's callback waiting
  // on this communicator's unfinished work. A callback must not block on another thread's
  // progress. A callback that throws does not stop the others (they, like those before it, see
  // the operation's own result); if the operation succeeded, wait() then throws an Error
  // carrying the callback's message.
  void then(std::function<void(std::exception_ptr)> callback) const;
  // A collective queued while the engine dozes (SMDDP_ENGINE_DOZE_US) starts a tick after it was
  // queued, or at once in wait() / wait_for(). For a caller that will not wait soon but wants it
  // progressing meanwhile (overlap with compute): start it, and what was queued before it, now.
  // No-op once it started.
  void expedite() const;

 private:
  std::shared_ptr<detail::OpState> state_;
};

class Communicator {
 public:
  // Collective over `size` ranks: every rank calls this with the same store, size and name.
  Communicator(std::shared_ptr<Store> store, int rank, int size, Options options = {});
  // Ends the communicator: its engine thread is joined, queued work fails. Called from a
  // callback of one of its own operations (Work::then), it returns at once and the teardown runs
  // on a thread of its own after the callback.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const Options& options() const;
  // This process's local rank on its node as the communicator's traffic between nodes uses it to
  // pick a NIC: Options::local_rank where set, else its place among this communicator's ranks
  // on its node. A communicator made from this one's ranks (torch's split_group) passes it on,
  // so that the subgroup's traffic takes this process's own NIC.
  int process_local_rank() const;

  Work allreduce(const void* send, void* recv, size_t count, DataType type, Reduction op, Memory memory = {});
  // Several tensors' worth in one allreduce (torch's allreduce_coalesced, gradient buckets): the
  // parts lie back to back in send and recv; ranks must agree on every part's size, not just the
  // total (MismatchError otherwise).
  Work allreduce_coalesced(const void* send, void* recv, const std::vector<size_t>& parts, DataType type,
                           Reduction op, Memory memory = {});
  // recv holds size()*count elements: rank r's block at r*count.
  Work allgather(const void* send, void* recv, size_t count, DataType type, Memory memory = {});
  // send holds size()*recv_count elements; rank r gets the reduction of block r.
  Work reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, Reduction op,
                      Memory memory = {});
  Work broadcast(void* buffer, size_t count, DataType type, int root, Memory memory = {});
  // recv is used on the root only (may be null elsewhere).
  Work reduce(const void* send, void* recv, size_t count, DataType type, Reduction op, int root,
              Memory memory = {});
  // recv (root only) holds size()*count elements.
  Work gather(const void* send, void* recv, size_t count, DataType type, int root, Memory memory = {});
  // send (root only) holds size()*count elements.
  Work scatter(const void* send, void* recv, size_t count, DataType type, int root, Memory memory = {});
  // Equal blocks of `count` elements to and from every rank.
  Work alltoall(const void* send, void* recv, size_t count, DataType type, Memory memory = {});
  // Per-peer counts and displacements, in elements (MPI_Alltoallv).
  Work alltoallv(const void* send, const std::vector<size_t>& send_counts,
                 const std::vector<size_t>& send_displs, void* recv,
                 const std::vector<size_t>& recv_counts, const std::vector<size_t>& recv_displs,
                 DataType type, Memory memory = {});
  // Point to point. Messages between a pair of ranks are matched in order; tags must agree. On
  // CUDA memory (`memory`) the bytes travel through page-locked host copies made by the GPU's
  // copy engines after the work queued on memory.stream at the call; either side may use host
  // or CUDA memory, whatever the other uses.
  Work send(const void* buffer, size_t count, DataType type, int peer, uint32_t tag = 0, Memory memory = {});
  Work recv(void* buffer, size_t count, DataType type, int peer, uint32_t tag = 0, Memory memory = {});
  // Receives the next message with `tag` from whichever rank sends one (MPI_ANY_SOURCE);
  // Work::source() tells which. Across nodes a message is at most the libfabric provider's
  // largest single message (InvalidArgument beyond it). It fails with PeerError once a rank of
  // its node dies (as ULFM fails MPI_ANY_SOURCE), and, in a communicator on one node, once every
  // other rank has left with no message for it and no send of this rank to itself is under way.
  Work recv_any(void* buffer, size_t count, DataType type, uint32_t tag = 0, Memory memory = {});
  // `timeout` > 0 replaces Options::timeout for this barrier (PyTorch's monitored_barrier).
  Work barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // Aborts the communicator: pending and future work fail with AbortedError, peers are told.
  void abort(const std::string& reason = "aborted by user");

 private:
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace smddp
