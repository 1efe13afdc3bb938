// The libfabric transport: one reliable-datagram endpoint (FI_EP_RDM) per rank, tagged messages.
//
// Provider choice: SMDDP_OFI_PROVIDER, else FI_PROVIDER, else the first that offers FI_EP_RDM
// with tagged messages of efa, tcp, tcp;ofi_rxm, sockets (libfabric 1.x: rxm before tcp).
// Addresses travel through the Store.
// Never assumes order between messages (EFA's SRD delivers out of order): every message is
// matched by its 64-bit tag, which carries the sender's rank, the caller's tag and a chunk
// index (messages above the provider's max_msg_size are cut into chunks), XORed with the
// communicator's key (job_key.h: nothing from outside the communicator matches a receive). Completion-queue
// errors become SystemErrors with fi_strerror and the provider's own text; -FI_EAGAIN is met by
// driving progress (reading the completion queue) and trying again.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/op_info.h"
#include "smddp/errors.h"
#include "smddp/store.h"

namespace smddp::ofi {

// The libfabric version this library runs with, e.g. "1.17.0".
std::string runtime_version();
// Providers offering FI_EP_RDM + FI_TAGGED here, in libfabric's order (for smddp.info, logs).
std::vector<std::string> rdm_providers();

// A peer's record in the Store said it failed to set up (Endpoint::publish_setup_failure): its
// reason, which this rank passes on but does not publish as its own.
class PeerSetupFailure : public SystemError {
 public:
  using SystemError::SystemError;
};

class Endpoint {
 public:
  // Collective over all ranks: opens the provider on this rank's rail (rails.h: the domain its
  // local rank picks), publishes the endpoint's address under "ofi/addr/<rank>", and inserts
  // every rank's address into the address vector.
  Endpoint(Store& store, int rank, int size, int local_rank, std::chrono::milliseconds timeout);
  // For a rank that failed before its endpoint published its address (its node's shared memory,
  // no provider, a bad setting): leaves `why` where the other ranks' constructors wait for this
  // rank (its address; the job token for rank 0), so that they fail at once with it instead of at
  // the timeout. Nothing once the address is out (the failure was then a peer's or a disagreement
  // every rank finds), nor where the store fails.
  static void publish_setup_failure(Store& store, int rank, const std::string& why) noexcept;
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  const std::string& provider() const;
  size_t max_message() const;

  // A posted transfer; done() once all its chunks completed.
  struct Request;
  using Handle = std::shared_ptr<Request>;
  // Post a send/receive of `bytes` to/from `peer` under `tag` (collective traffic: bit 31 set).
  // Buffers stay valid until the request is done.
  Handle send(int peer, const void* buf, size_t bytes, uint32_t tag);
  Handle recv(int peer, void* buf, size_t bytes, uint32_t tag);
  // Point to point (`tag` the caller's, any 32 bits): the pair's message number `order` (wire.h:
  // messages between two ranks are matched in the order the ranks posted them, as inside a node),
  // the tag compared when it arrives: a message under another tag fails the receive with a
  // MismatchError naming both tags.
  Handle send_p2p(int peer, const void* buf, size_t bytes, uint32_t tag, uint32_t order);
  Handle recv_p2p(int peer, void* buf, size_t bytes, uint32_t tag, uint32_t order);
  // A receive of the point-to-point message under `tag` that arrives first from any rank, whatever
  // its number (at most max_message() bytes); source() names that rank once it is done, order()
  // the number.
  Handle recv_any(void* buf, size_t bytes, uint32_t tag);
  int source(const Handle& h) const;  // -1 until done
  uint32_t order(const Handle& h) const;  // a receive from any rank: meaningful once done
  // Takes back a receive that has not completed: true if a message landed in it after all (it
  // completed while being withdrawn: the caller must treat it as received), false if it is
  // cancelled and nothing will land. Throws if the receive failed.
  bool withdraw(const Handle& h);
  // --- memory registration ---
  enum class MemoryKind { host, cuda };
  // Registers [buf, buf + bytes) until unregister_region(buf): transfers that lie inside it use
  // this registration instead of one of their own (region_cache.h). For memory whose lifetime
  // the caller controls (the communicator's scratch). Host memory: a no-op unless the provider
  // wants registered buffers (FI_MR_LOCAL, e.g. efa; or SMDDP_OFI_REGISTER=always). GPU memory
  // (kind cuda, `device` the CUDA ordinal) is registered through FI_HMEM and needs a provider
  // opened with it; otherwise InvalidArgument names the provider.
  void register_region(const void* buf, size_t bytes, MemoryKind kind = MemoryKind::host, int device = 0);
  void unregister_region(const void* buf);
  bool registers_memory() const;
  // Registrations made for single transfers so far (a buffer outside every region).
  size_t transfer_registrations() const;

  // Messages from outside this communicator (another key: job_key.h) found queued and dropped.
  size_t foreign_messages_dropped() const;
  // Posts the provider refused for lack of room so far (-FI_EAGAIN: posted again later; tests).
  size_t posts_refused() const;
  // Cancelled operations whose reports did not come in time so far (cancel(): tests).
  size_t cancels_unreported() const;

  // Reads completions; true once `h` is done. Throws SystemError on a completion error.
  bool test(const Handle& h);
  // Abandons a request that is not done (a collective that failed midway): its posted operations
  // are cancelled and an RMA receive's buffer loses its remote access, and it returns once
  // libfabric has reported every one of them, so nothing lands in the buffer afterwards, which
  // the caller may free. At most 1 s (an operation cut by a link that went down never reports:
  // a warning says so); 10 ms for requests with a peer on which a cancel gave up so after they
  // were made, while nothing was heard from that peer since, so that N requests failing one
  // after another do not take N seconds. Harmless on a finished request.
  void cancel(const Handle& h);
  // The same for several requests, waiting for all of them at once, until `give_up` at most (a
  // failed collective's transfers share one: Context::cancels_give_up).
  void cancel(const std::vector<Handle>& hs, std::chrono::steady_clock::time_point give_up);
  // Reads completions and posts what waits to be posted, for every request (errors stay with
  // their requests). For callers busy elsewhere, e.g. a shared-memory wait. Returns whether a
  // transfer of this endpoint is still in flight (posted, or waiting to be): with none, what
  // driving progress may still move is a peer's (a message no receive has taken yet, a first
  // connection, the provider's own protocol).
  bool progress();
  // --- the engine's sleep while its ops wait on the network (completion_wait.h) ---
  // Whether sleep_until_news() blocks on the completion queue's wait object (the provider has
  // one, SMDDP_OFI_WAIT=fd); else it sleeps 50 us at a time.
  bool waits_block() const;
  // Sleeps until a completion may be there to read, wake_sleeper() is called or `timeout`
  // passes, unless ready(), asked once the sleeper counts itself, is true.
  void sleep_until_news(const std::function<bool()>& ready, std::chrono::microseconds timeout);
  void wake_sleeper();
  // Drives progress until `h` is done or op's deadline passes (TimeoutError naming the peer).
  // `watch`, when set, runs every 20 ms while waiting and may throw (abort from elsewhere).
  // `beside`, when set, runs at every poll past the first spins; while it returns true (work
  // that no completion announces still moves, the sends and receives beside a collective) the
  // wait polls every 100 us instead of blocking on the completion queue; a block begins only
  // after it ran once more, with the sleeper counted (work submitted beside meanwhile wakes it).
  void wait(const Handle& h, const OpInfo& op, const std::function<void()>* watch = nullptr,
            const std::function<bool()>* beside = nullptr);
  // Throws wait()'s TimeoutError, naming the peer, if op's deadline has passed: for callers that
  // poll test() themselves.
  void throw_if_late(const Handle& h, const OpInfo& op) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace smddp::ofi
