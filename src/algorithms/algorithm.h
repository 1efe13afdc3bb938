// What every algorithm sees: the arguments of one collective and the means to run it (the
// node's shared-memory group, a device for copies and reductions, the op for errors/deadlines).
// Algorithms never touch sockets, CUDA or memcpy directly, and end each round with ctx.arrive()
// and ctx.wait_all() (never shm.arrive(): the device's work must land before the peers are told;
// never shm.wait_all(): across nodes a failure is published before it unwinds).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "device/peer_window.h"
#include "engine/op_info.h"
#include "smddp/types.h"
#include "topology/topology.h"
#include "transport/shm/shm_group.h"

namespace smddp::ofi {
class Endpoint;
}

namespace smddp::algorithms {

class ScratchPool;
class BouncePool;

enum class CollKind { allreduce, allgather, reduce_scatter, broadcast, reduce, gather, scatter, alltoall, barrier };
inline constexpr int kNumCollKinds = 9;
const char* to_string(CollKind k);

struct CollArgs {
  CollKind kind = CollKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  // allreduce, broadcast, reduce: elements; allgather, gather, scatter, alltoall: elements per
  // rank block; reduce_scatter: elements each rank receives.
  size_t count = 0;
  DataType dtype = DataType::f32;
  Reduction op{};
  int root = 0;
  // alltoall(v): elements and displacements per peer (filled for alltoall too).
  std::vector<size_t> send_counts, send_displs, recv_counts, recv_displs;
  // allreduce_coalesced: the number of parts (high 16 bits) and a hash of their sizes (low 48),
  // so ranks that agree on the total but split it differently disagree (0: one part).
  uint64_t parts = 0;
  Memory memory;  // where send and recv are (Context::dev is the device for it)
  // CUDA: an event recorded on the caller's stream at the call; the device waits on it before
  // the collective touches the buffers (run_collective; device/cuda.h).
  std::shared_ptr<void> ready;
  bool uniform = true;  // alltoall with equal blocks: every rank knows every size
  std::chrono::milliseconds timeout{0};  // > 0: replaces the communicator's timeout
};

struct Context {
  shm::Group& shm;  // the ranks of this node; rank()/size() are this node's local rank and size
  device::Device& dev;
  const OpInfo& op;
  const topology::Topology* topo = nullptr;  // set when the communicator spans several nodes
  ofi::Endpoint* net = nullptr;              // likewise: every rank, over libfabric
  // Across nodes: called while waiting on the network; throws if the communicator was aborted
  // on this node or by a rank elsewhere (through the store).
  const std::function<void()>* watch = nullptr;
  ScratchPool* scratch = nullptr;  // buffers kept between collectives (scratch_pool.h)
  device::PeerWindows* windows = nullptr;  // the node's peers' memory, directly (single-copy algorithms)
  // Across nodes: a network wait that failed calls it before the failure unwinds, and throws
  // what it returns (the failure's cause). It makes the failure known to this node's ranks and
  // to other nodes at once: the unwinding then cancels the transfers still posted, which may
  // take a second (ofi::Endpoint::cancel), and a node-mate waiting for this rank gives it only
  // half a second past its deadline to say why it is late (shm::Group::wait).
  const std::function<std::exception_ptr(std::exception_ptr)>* publish_failure = nullptr;
  // When a failed collective stops waiting for libfabric to report its cancelled transfers: set
  // by the first NetExchange that cancels (1 s on), so that all of them together wait 1 s at most.
  std::chrono::steady_clock::time_point cancels_give_up{};
  // Set while sends and receives are in flight beside this collective (engine::Engine::
  // poll_p2p_beside): polls them; true while any remain. Network waits call it at every poll
  // (ofi::Endpoint::wait); the node's waits call it through the group's idle hook.
  const std::function<bool()>* beside = nullptr;
  // Set where the collective's device memory is not the network's (Device::network_reaches):
  // NetExchange bounces the messages of such memory through its host buffers (bounce_pool.h).
  BouncePool* bounce = nullptr;
  int rank() const { return shm.rank(); }
  int size() const { return shm.size(); }
  // Tells the peers this rank finished the round: what it copied or reduced is in memory first
  // (Device::fence), so no peer reads a slot or an output before the data is there.
  void arrive() {
    dev.fence();
    shm.arrive();
  }
  // Waits for this node's ranks to finish the round, or the round `lag` before it
  // (shm::Group::wait_all). Across nodes a failure found here (a node-mate that died or
  // aborted) is published before it unwinds, as a network wait's is (publish_failure): the
  // unwinding then cancels the transfers still posted.
  void wait_all(int lag = 0) {
    try {
      shm.wait_all(op, lag);
    } catch (...) {
      rethrow_published(publish_failure, std::current_exception());
    }
  }
  // Rethrows `failure`, published first where `publish` is set (then what it returns: the cause).
  [[noreturn]] static void rethrow_published(const std::function<std::exception_ptr(std::exception_ptr)>* publish,
                                             std::exception_ptr failure) {
    if (publish && *publish) std::rethrow_exception((*publish)(failure));
    std::rethrow_exception(failure);
  }
};

using AlgoFn = void (*)(Context&, const CollArgs&);

// Where an algorithm works: inside one node (shared memory only) or across nodes.
enum class Scope { node, nodes };

struct Algorithm {
  CollKind kind;
  const char* name;
  AlgoFn run;
  Scope scope = Scope::node;
  bool even_nodes = false;  // needs the same number of ranks on every node (the hierarchical ones)
  // A setting its rounds and messages depend on, which every rank must share: its value is
  // compared with the collective's arguments (core/fingerprint.cc), since ranks that cut a
  // collective differently could still meet in the same number of rounds and combine the wrong
  // pieces. Null: none.
  const char* setting = nullptr;
  size_t (*setting_value)() = nullptr;
};

// How a disagreement's message ends: nothing written, on a rank that found it (or heard of it)
// before its collective moved any data; perhaps partly written, on a rank that heard of it later
// (one that agreed with all its peers may exchange data with some before a pair elsewhere finds
// theirs differ). The abort reason the other ranks read leaves either out (without_written_claim),
// and each adds its own (CommunicatorImpl::written_claim).
inline constexpr std::string_view kNothingWritten =
    ". Nothing was written to the output buffers; the communicator is aborted";
inline constexpr std::string_view kMaybeWritten =
    ". This rank heard of it while its own collective was moving data, so its output buffers may be partly "
    "written; the communicator is aborted";
inline std::string without_written_claim(std::string what) {
  for (const std::string_view claim : {kNothingWritten, kMaybeWritten})
    if (what.size() >= claim.size() && what.compare(what.size() - claim.size(), claim.size(), claim) == 0)
      what.resize(what.size() - claim.size());
  return what;
}

// --- helpers shared by several algorithms ---
inline std::byte* at(void* p, size_t elems, size_t es) { return static_cast<std::byte*>(p) + elems * es; }
inline const std::byte* at(const void* p, size_t elems, size_t es) {
  return static_cast<const std::byte*>(p) + elems * es;
}
// Elements of an alltoall(v) buffer: up to the end of its furthest non-empty block (an empty
// block's displacement need not lie inside the buffer).
inline size_t alltoall_extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t end = 0;
  for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
    if (counts[i] > 0) end = std::max(end, displs[i] + counts[i]);
  return end;
}
// Elements of `dtype` that fit in one staging slot (divided among `parts` sub-blocks).
inline size_t slot_elems(const Context& ctx, DataType t, int parts = 1) {
  return ctx.shm.slot_bytes() / static_cast<size_t>(parts) / dtype_size(t);
}

// Reduce-scatter then gather through staging slots, chunk by chunk; the result lands in recv on
// every rank (out_root < 0: allreduce) or on out_root only (reduce). Defined in allreduce_rs_ag.cc.
void rs_ag_rounds(Context& ctx, const void* send, void* recv, size_t count, DataType t, Reduction op,
                  int out_root);

}  // namespace smddp::algorithms
