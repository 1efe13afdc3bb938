// The communicator behind the public pimpl: validates arguments on the caller's thread, numbers
// operations, and hands them to the engine wrapped with deadline, consistency checks and abort logic.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "algorithms/bounce_pool.h"
#include "algorithms/scratch_pool.h"
#include "algorithms/algorithm.h"
#include "core/p2p_staging.h"
#include "core/pair_order.h"
#include "device/slot_stores.h"
#include "engine/engine.h"
#include "smddp/communicator.h"
#include "topology/topology.h"
#include "transport/shm/shm_group.h"

namespace smddp::ofi {
class Endpoint;
}

namespace smddp::detail {

class CommunicatorImpl {
 public:
  CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options options);
  ~CommunicatorImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }
  int process_local_rank() const { return options_.local_rank.value_or(topo_.local_rank()); }
  // Whether this thread runs or completes one of its operations (engine::Engine::held_by_this_thread).
  bool held_by_this_thread() const { return engine_ && engine_->held_by_this_thread(); }

  Work collective(algorithms::CollArgs args);
  // Point to point on host or CUDA memory (CUDA: through host copies, p2p_staging.h).
  Work send(const void* buf, size_t bytes, int peer, uint32_t tag, const Memory& memory);
  Work recv(void* buf, size_t bytes, int peer, uint32_t tag, const Memory& memory);
  Work recv_any(void* buf, size_t bytes, uint32_t tag, const Memory& memory);
  void abort(const std::string& reason);

  // Argument checks shared by the public entry points; throw InvalidArgument.
  void check_rank(int r, const char* what, const char* op) const;
  void check_buffer(const void* p, size_t count, const char* what, const char* op) const;
  void check_count(size_t count, size_t blocks, DataType t, const char* op) const;
  void check_dtype(DataType t, const char* op) const;
  // Input and output may share memory only as the in-place form of the collective lays them out:
  // the input at `in_place_send` (an address inside or equal to the output, or the output inside
  // the input). Any other overlap would have the algorithm read what it already wrote.
  void check_overlap(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                     uintptr_t in_place_send, const char* op) const;
  // At call time: CUDA memory is usable here (built with CUDA, a driver, the device exists);
  // throws InvalidArgument naming the op and the reason otherwise.
  void check_memory(const Memory& m, const char* op) const;
  // This process made the communicator (not a child forked from it: fork_generation.h); throws
  // InvalidArgument naming the op otherwise.
  void check_process(const char* op) const;
  // Whether this is a child forked from the process that made the communicator: its destructor
  // must then leave the shared state, the engine thread (absent here) and the sockets alone.
  bool forked_away() const;

 private:
  OpInfo make_op(const char* name, int peer = -1);
  // announced_by: what wakes a sleeping engine when the op may progress (engine::Announcer).
  Work submit_p2p(const char* name, int peer, P2pPoll poll, std::shared_ptr<std::atomic<int>> source,
                  engine::Announcer announced_by);
  // Index of a global rank within this node's shm group, or -1 when it is on another node.
  int local_index(int global_rank) const;
  void run_collective(OpInfo& op, const algorithms::CollArgs& args);
  // CUDA memory across nodes: the collective on host copies, whole or in pieces of
  // `piece_elements` a block (staging_piece_elements; 0: whole) (host_staging.h).
  void run_staged(algorithms::Context& ctx, OpInfo& op, const algorithms::CollArgs& args,
                  const algorithms::Algorithm& algo, device::Device& dev, size_t piece_elements);
  // How many collective sequence numbers `args` takes: one, or one per piece when it is staged
  // in pieces (each piece's network tags are its own). Equal on every rank that agrees on it.
  size_t sequence_numbers(const algorithms::CollArgs& args) const;
  // What the selector picks for `args` with `count` elements (a piece's, or all of them).
  const algorithms::Algorithm& algorithm_for(const algorithms::CollArgs& args, size_t count) const;
  // A point-to-point operation: on(p) builds it on p, which is `buf` itself for host memory and
  // a host buffer staged to or from `buf` for CUDA memory.
  Work point_to_point(const char* name, int peer, bool is_send, void* buf, size_t bytes, const Memory& m,
                      const std::function<P2pPoll(void*)>& on, std::shared_ptr<std::atomic<int>> source = nullptr);
  // The device and peer windows for a collective's memory (CUDA: made on first use per GPU).
  device::Device& device_for(const Memory& m);
  device::PeerWindows* windows_for(const Memory& m);
  // One shared-memory round with no data: compares the announced fingerprints.
  void agreement_round(algorithms::Context& ctx);
  // The same across nodes: swaps fingerprints with the other nodes, then a shared-memory round
  // compares this node's and shares what each rank found; throws MismatchError naming both sides.
  void agree_across_nodes(algorithms::Context& ctx, const shm::Group::Fingerprint& mine);
  // On a failure that leaves ranks out of step: abort the group so every rank stops now.
  void fail(const std::exception_ptr& e);
  // Marks the communicator dead here, on this node (abort word) and on other nodes (store key).
  // `mismatch`: the reason is a disagreement, raised on the other nodes as MismatchError too.
  void abort_everywhere(const std::string& reason, bool mismatch = false);
  // While waiting on the network (every 20 ms): throws if this node's group or (via the store,
  // asked at most every kStoreWatchPeriod) another node aborted.
  void watch_remote(const OpInfo& op);
  // The same, asking the store now.
  void watch_remote_now(const OpInfo& op);
  // How a disagreement that this rank heard of (an abort) ends the message of `op`, a collective:
  // nothing written, or, once its algorithm had started, outputs perhaps partly written
  // (algorithms::kMaybeWritten).
  std::string written_claim(const OpInfo& op) const;
  // A transfer to a rank on another node failed (its connection closed): that node may have
  // aborted and the rank closed its endpoint, which comes after the abort's store key. Returns
  // that abort (watch_remote's error) if it shows up within a short grace, else `failure`.
  std::exception_ptr cause_of_transfer_failure(const OpInfo& op, std::exception_ptr failure);
  // What a failed collective raises: `failure`, or what lies behind it (a broken connection's
  // abort; an abort's disagreement, as MismatchError).
  std::exception_ptr cause_of_failure(const OpInfo& op, std::exception_ptr failure);
  // After a failed collective on GPU memory: waits for the copies and kernels it queued, which
  // still read and write the caller's buffers (freed once the Work fails). Never throws.
  void drain_after_failure(const Memory& m) noexcept;
  std::string prefix() const;

  uint64_t fork_generation_;  // the process's at construction (fork_generation.h)
  int creator_pid_;
  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  Options options_;
  bool consistency_;  // SMDDP_CHECK_CONSISTENCY: fingerprints compared in every collective
  size_t staging_piece_;  // SMDDP_CUDA_STAGING_PIECE
  bool net_bounce_ = false;  // SMDDP_CUDA_NET_BOUNCE
  // This rank's kind of stores into its staging slots (SMDDP_SHM_STORES), measured and chosen
  // by the host collectives as they run (device/slot_stores.h).
  device::StoreKindChooser slot_stores_{device::StoreKindChooser::Setting::plain};
  std::vector<const algorithms::Algorithm*> overrides_;
  topology::Topology topo_;
  bool multi_node_ = false;
  std::unique_ptr<shm::Group> shm_;         // the ranks of this node
  // The staging slots of shm_, page-locked for CUDA when a GPU is first used (device_for), so
  // the GPU's copies into them are DMA and its kernels reduce them in place rather than the CPU
  // (cuda.h's reduce_on_host). Declared after shm_ and before cuda_: unregistered after the
  // streams drained and before the segment is unmapped.
  struct SlotsForCuda {
    void* base = nullptr;  // registered
    bool tried = false;
    ~SlotsForCuda();
  } slots_for_cuda_;
  std::unique_ptr<ofi::Endpoint> net_;      // every rank, when they span nodes
  PairOrder pair_order_{0};                 // net_'s point-to-point numbering (the polling thread)
  std::unique_ptr<algorithms::ScratchPool> scratch_;  // after net_: unregisters before it closes
  std::unique_ptr<algorithms::ScratchPool> staging_pool_;  // across nodes: host copies of CUDA buffers
  std::unique_ptr<algorithms::BouncePool> bounce_pool_;   // across nodes: CUDA messages bounced (net_exchange.h)
  std::unique_ptr<P2pStagingPool> p2p_staging_;           // host copies of point-to-point CUDA buffers
  std::unique_ptr<device::PeerWindows> windows_;      // the node's peers' host memory (single-copy algorithms)
  struct CudaSide {  // per GPU: its stream (device) and IPC windows; the windows close first
    std::unique_ptr<device::Device> dev;
    std::unique_ptr<device::PeerWindows> windows;
    // The stream drains before the windows close: no queued copy may still read a peer's
    // memory through a mapping being closed.
    ~CudaSide();
  };
  // Used by run_collective and by the point-to-point operations on CUDA memory as the engine
  // polls them, never at once: the thread that runs a collective polls the send/recv ops beside
  // it from inside its waits (Engine::poll_p2p_beside), between its own copies, and the engine
  // thread takes no others while it runs.
  std::map<int, CudaSide> cuda_;
  std::mutex submit_mu_;  // issue order = sequence order
  uint64_t seq_ = 0;
  uint64_t coll_seq_ = 0;
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> next_store_watch_{0};  // watch_remote: steady_clock ticks
  bool moving_data_ = false;  // the running collective's algorithm has started (engine thread)
  std::shared_ptr<engine::Engine> engine_;  // last: its thread must stop before the rest dies
};

}  // namespace smddp::detail
