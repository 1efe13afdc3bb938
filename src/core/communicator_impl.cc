#include "core/communicator_impl.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cstring>
#include <thread>

#include "algorithms/registry.h"
#include "core/config.h"
#include "core/fingerprint.h"
#include "core/fork_generation.h"
#include "core/logging.h"
#include "core/p2p.h"
#include "core/host_staging.h"
#include "core/shm_settings.h"
#include "core/slot_store_turns.h"
#include "device/cuda.h"
#include "device/device.h"
#include "device/host_copy.h"
#include "topology/topology.h"
#ifdef SMDDP_HAVE_LIBFABRIC
#include "core/cross_node_agreement.h"
#include "core/p2p_across_nodes.h"
#include "transport/ofi/endpoint.h"
#else
namespace smddp::ofi {
// A build without libfabric never makes an endpoint (net_ stays null), but unique_ptr's
// destructor still needs a complete type here.
class Endpoint {};
}  // namespace smddp::ofi
#endif

namespace smddp::detail {

using algorithms::CollArgs;
using algorithms::CollKind;

namespace {

// Scratch buffers up to this size stay with the communicator between collectives; larger ones
// (a one-off huge message through an algorithm that needs scratch of its size) are freed.
constexpr size_t kScratchKeep = size_t{64} << 20;
constexpr size_t kMinStagingPiece = size_t{64} << 10;  // SMDDP_CUDA_STAGING_PIECE, when not 0

// Each rank counts, in the store itself, the communicators it made there under this name. The
// ranks of a group make theirs in the same order, so the counts agree and a reused store never
// hands out a stale key. What it assumes: groups made from one store have names of their own
// (the counter is per name and group rank, so two disjoint groups of one name share counters),
// and the ranks' counts stay in step. Every construction given a store and a rank in range
// counts, one that fails too (a setting one rank refuses fails them all, and a retry finds them
// level); a rank that made one more than its peers under the name is a generation apart from
// them afterwards (a store for each attempt, as torchelastic gives, keeps them apart).
std::string next_store_prefix(Store& store, const std::string& name, int rank) {
  const int64_t generation = store.add("smddp/" + name + "/made_by/" + std::to_string(rank), 1) - 1;
  return "smddp/" + name + "/" + std::to_string(generation) + "/";
}

// SMDDP_CUDA_STAGING_PIECE, checked: 0 (whole buffers) or at least 64k, since each piece is a
// collective of its own and pays its rounds.
size_t staging_piece_setting() {
  const int64_t v = config::get_int("SMDDP_CUDA_STAGING_PIECE");
  const std::string what = "smddp: SMDDP_CUDA_STAGING_PIECE=" + config::get_string("SMDDP_CUDA_STAGING_PIECE");
  if (v < 0) throw InvalidArgument(what + " is negative (0 stages whole buffers; else at least 64k)");
  if (v > 0 && static_cast<size_t>(v) < kMinStagingPiece)
    throw InvalidArgument(what + " is below 64k (each piece is a collective of its own); 0 stages whole buffers");
  return static_cast<size_t>(v);
}

}  // namespace

namespace {
// The engine's sleep while every op it polls waits on the network (none on one node, or
// without libfabric): until the endpoint's completion queue has news.
void wake_network_sleeper([[maybe_unused]] ofi::Endpoint* ep) {
#ifdef SMDDP_HAVE_LIBFABRIC
  if (ep) ep->wake_sleeper();
#endif
}

engine::P2pSleep network_sleep([[maybe_unused]] ofi::Endpoint* ep) {
#ifdef SMDDP_HAVE_LIBFABRIC
  if (ep)
    return {[ep](const std::function<bool()>& ready, std::chrono::microseconds timeout) {
              ep->sleep_until_news(ready, timeout);
            },
            [ep] { ep->wake_sleeper(); }};
#endif
  return {};
}
}  // namespace

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options options)
    : fork_generation_(fork_generation()),
      creator_pid_(static_cast<int>(::getpid())),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      consistency_(false),
      staging_piece_(0) {
  if (!store) throw InvalidArgument("smddp: Communicator needs a store (got null)");
  if (size < 1) throw InvalidArgument("smddp: communicator size must be >= 1 (got " + std::to_string(size) + ")");
  if (rank < 0 || rank >= size)
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  // Counted before anything of this rank's own can fail, so that a failed attempt counts on every
  // rank and the next one finds its peers at the same generation.
  store_ = std::make_shared<PrefixStore>(next_store_prefix(*store, options_.name, rank), std::move(store));
  bool host_reads = false;
  try {
    if (options_.timeout.count() <= 0) throw InvalidArgument("smddp: timeout must be positive");
    if (options_.local_rank && *options_.local_rank < 0)
      throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": Options::local_rank " +
                            std::to_string(*options_.local_rank) + " is negative");
    consistency_ = config::get_bool("SMDDP_CHECK_CONSISTENCY");
    staging_piece_ = staging_piece_setting();
    net_bounce_ = config::get_bool("SMDDP_CUDA_NET_BOUNCE");
    algorithms::env_overrides();  // a bad SMDDP_ALGO fails here, at construction, with a clear message
    device::host_copy_kind();     // and a bad SMDDP_HOST_COPY
    slot_stores_ = device::StoreKindChooser(device::StoreKindChooser::parse(config::get_string("SMDDP_SHM_STORES")));
    algorithms::host_window_mode();  // and SMDDP_HOST_WINDOW
    reduce::isa();                   // and SMDDP_REDUCE_ISA
    config::get_int("SMDDP_CUDA_SMS");  // and the CUDA device's, read when a CUDA tensor first comes
    config::get_bool("SMDDP_CUDA_VECTOR_REDUCE");
    overrides_ = algorithms::parse_overrides(options_.algorithms);
    std::vector<const algorithms::Algorithm*> all_overrides = overrides_;
    for (const algorithms::Algorithm* a : algorithms::env_overrides()) all_overrides.push_back(a);
    host_reads = algorithms::host_reads_possible(algorithms::host_window_mode(), config::get_bool("SMDDP_SHM_STEAL"),
                                                 all_overrides);
  } catch (const std::exception& e) {
    // Set on this rank alone (its environment, its Options): the others would wait for its
    // topology record until their timeout, then say it never joined. Tell them why.
    topology::publish_setup_failure(*store_, rank, e.what());
    throw;
  }
  topo_ = topology::discover(*store_, rank, size, options_.timeout);
  multi_node_ = topo_.num_nodes() > 1;
  // Host copies of CUDA buffers (host_staging.h, p2p_staging.h): page-locked where CUDA is, so
  // the device's copies run at full speed and without the driver's own staging; across nodes
  // also registered with the network (below).
  algorithms::ScratchPool::Hook cuda_copy_on = [](const void* p, size_t n) {
    device::cuda_register_host(const_cast<void*>(p), n);
  };
  algorithms::ScratchPool::Hook cuda_copy_off = [](const void* p, size_t) {
    device::cuda_unregister_host(const_cast<void*>(p));
  };
  SMDDP_LOG(INFO, rank) << "topology: " << topo_.describe();
  if (multi_node_) {
#ifdef SMDDP_HAVE_LIBFABRIC
    // Shared memory among this node's ranks (keys of their own), libfabric among all ranks.
    PrefixStore node_store("node" + std::to_string(topo_.node()) + "/", store_);
    // Ranks on other nodes wait for this one's address next: a failure before it (the node's
    // memory; an endpoint without a provider, with a bad SMDDP_OFI_* value) gives them the reason.
    auto or_tell_the_others = [&](auto make) {
      try {
        make();
      } catch (const ofi::PeerSetupFailure&) {  // another's reason, published by it
        throw;
      } catch (const std::exception& e) {
        ofi::Endpoint::publish_setup_failure(*store_, rank, e.what());
        throw;
      }
    };
    or_tell_the_others([&] {
      shm_ = std::make_unique<shm::Group>(node_store, topo_.local_rank(), topo_.local_size(),
                                          shm_group_config(topo_.oversubscribed(), host_reads, topo_.local_size()), options_.timeout,
                                          topo_.local_ranks());
    });
    or_tell_the_others([&] {
      net_ = std::make_unique<ofi::Endpoint>(*store_, rank, size, process_local_rank(), options_.timeout);
    });
    pair_order_ = PairOrder(size);
    shm_->set_idle_hook([ep = net_.get()] { return ep->progress(); });
    // Scratch buffers are registered with the network once, when made (where the provider
    // needs registered memory), instead of on every transfer.
    const algorithms::ScratchPool::Hook to_net = [ep = net_.get()](const void* p, size_t n) {
      ep->register_region(p, n);
    };
    const algorithms::ScratchPool::Hook off_net = [ep = net_.get()](const void* p, size_t) {
      ep->unregister_region(p);
    };
    scratch_ = std::make_unique<algorithms::ScratchPool>(to_net, off_net);
    cuda_copy_on = [to_net](const void* p, size_t n) {
      const bool locked = device::cuda_register_host(const_cast<void*>(p), n);
      try {
        to_net(p, n);
      } catch (...) {  // the buffer is not made (ScratchPool::get): undo the page-locking too
        if (locked) device::cuda_unregister_host(const_cast<void*>(p));
        throw;
      }
    };
    cuda_copy_off = [off_net](const void* p, size_t n) {
      off_net(p, n);
      device::cuda_unregister_host(const_cast<void*>(p));
    };
    staging_pool_ = std::make_unique<algorithms::ScratchPool>(cuda_copy_on, cuda_copy_off);
    bounce_pool_ = std::make_unique<algorithms::BouncePool>(cuda_copy_on, cuda_copy_off);
#else
    throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": the ranks span " + topo_.describe() +
                          ", but this build has no libfabric transport (SMDDP_WITH_LIBFABRIC=OFF)");
#endif
  } else {
    shm_ = std::make_unique<shm::Group>(*store_, rank, size, shm_group_config(topo_.oversubscribed(), host_reads, size),
                                        options_.timeout);
  }
  if (!scratch_) scratch_ = std::make_unique<algorithms::ScratchPool>();
  p2p_staging_ = std::make_unique<P2pStagingPool>(cuda_copy_on, cuda_copy_off, kScratchKeep);
  windows_ = device::cma_windows([g = shm_.get()](int r) { return g->pid_of(r); });
  shm_->set_disagreement_handler([this](const std::vector<Fingerprint>& all) {
    const std::vector<int> global = multi_node_ ? topo_.local_ranks() : std::vector<int>{};
    throw MismatchError(prefix() + "ranks called different collectives: " + describe_disagreement(all, global) +
                        std::string(algorithms::kNothingWritten));
  });
  engine_ = std::make_shared<engine::Engine>(
      options_.inline_execution.value_or(config::get_bool("SMDDP_INLINE")),
      engine::Doze{std::chrono::microseconds(config::get_int("SMDDP_ENGINE_DOZE_US")),
                   std::chrono::microseconds(config::get_int("SMDDP_ENGINE_DOZE_WINDOW_US"))},
      engine::P2pSleep{[g = shm_.get()](const std::function<bool()>& ready, std::chrono::microseconds timeout) {
                         g->sleep_on_fifos(ready, timeout);
                       },
                       [g = shm_.get()] { g->wake_fifo_sleeper(); }},
      network_sleep(net_.get()), [g = shm_.get(), ep = net_.get()] {
        // A send or receive submitted while a collective runs (on any thread): the
        // collective's waits start it (Engine::poll_p2p_beside), so wake them where they sleep.
        g->wake_waiters();
        wake_network_sleeper(ep);
      });
  SMDDP_LOG(INFO, rank) << "communicator '" << options_.name << "' ready: rank " << rank << " of " << size
                        << ", transport shm, reduce kernels " << reduce::isa() << ", host copies "
                        << device::host_copy_kind();
}

CommunicatorImpl::~CommunicatorImpl() {
  // Everywhere: ranks on other nodes waiting on this one's messages hear it from the store
  // (over efa no connection closes to tell them).
  if (engine_ && engine_->pending() > 0 && !shm_->aborted())
    abort_everywhere("rank " + std::to_string(rank_) + " destroyed its communicator with work in flight");
  engine_->shutdown(std::make_exception_ptr(AbortedError("smddp: the communicator was destroyed")));
  engine_.reset();
  if (shm_->rounds_taken() > 0) {
    SMDDP_LOG(INFO, rank_) << "took " << shm_->rounds_taken() << " rounds of late node-mates (SMDDP_SHM_STEAL)";
  }
  shm_->depart();
}

bool CommunicatorImpl::forked_away() const { return forked_since(fork_generation_); }

std::string CommunicatorImpl::prefix() const { return "smddp: rank " + std::to_string(rank_) + ": "; }

OpInfo CommunicatorImpl::make_op(const char* name, int peer) {
  OpInfo op;
  op.name = name;
  op.seq = ++seq_;
  op.rank = rank_;
  op.size = size_;
  op.peer = peer;
  op.timeout = options_.timeout;
  return op;
}

void CommunicatorImpl::fail(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const MismatchError& ex) {
    // Every rank found it in the same round; the ranks' programs have diverged, so whatever they
    // call next would not line up either: stop the group, as after a lost rank.
    // The other ranks read the reason without this rank's claim about its outputs: theirs may
    // be written (written_claim).
    abort_everywhere(algorithms::without_written_claim(ex.what()), /*mismatch=*/true);
  } catch (const InvalidArgument& ex) {
    // Detected before any data moved, on every rank alike: the communicator stays usable. Found
    // by one rank inside its algorithm (a read past what a peer exposed, its sizes differing
    // with the consistency check off), the peers are mid-collective: stop the group, or they
    // wait for this rank until their timeout.
    if (moving_data_) abort_everywhere(ex.what());
  } catch (const std::exception& ex) {
    abort_everywhere(ex.what());
  }
}

namespace {
// Leads the store's abort reason when it is a disagreement (abort_everywhere, watch_remote).
constexpr char kMismatchMark[] = "mismatch:";
}  // namespace

void CommunicatorImpl::abort_everywhere(const std::string& reason, bool mismatch) {
  failed_.store(true);
  shm_->abort(reason, mismatch);
#ifdef SMDDP_HAVE_LIBFABRIC
  if (net_) net_->wake_sleeper();  // an engine asleep on the network (the abort rings the FIFO bells)
#endif
  // Other nodes do not see this node's shared memory: tell them through the store.
  if (multi_node_) {
    try {
      const std::string v = (mismatch ? kMismatchMark : "") + reason;
      if (!store_->check("abort")) store_->set("abort", std::vector<uint8_t>(v.begin(), v.end()));
    } catch (...) {  // the store itself may be gone; the peers' deadlines still hold
    }
  }
}

std::string CommunicatorImpl::written_claim(const OpInfo& op) const {
  if (op.coll_seq == 0) return "";  // point-to-point: its own error says what it left
  return std::string(moving_data_ ? algorithms::kMaybeWritten : algorithms::kNothingWritten);
}

void CommunicatorImpl::watch_remote(const OpInfo& op) {
  // The node's abort word is in memory; the store is one server for the whole job, which every
  // rank waiting on the network asked every 20 ms (50 requests a second each: 25,000 at 512
  // ranks, through a whole training run). A failure that breaks a connection is asked about at
  // once (cause_of_transfer_failure); one that does not is heard of a period later at most.
  constexpr auto kStoreWatchPeriod = std::chrono::milliseconds(250);
  shm_->throw_if_aborted(op);
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t due = next_store_watch_.load(std::memory_order_relaxed);
  if (now < due) return;
  const int64_t next = now + std::chrono::duration_cast<Clock::duration>(kStoreWatchPeriod).count();
  if (!next_store_watch_.compare_exchange_strong(due, next, std::memory_order_relaxed)) return;
  watch_remote_now(op);
}

void CommunicatorImpl::watch_remote_now(const OpInfo& op) {
  // This node's abort word only: the deadline is the network wait's to enforce, since it knows
  // which rank it waits for (a deadline check here raced it and named no rank).
  shm_->throw_if_aborted(op);
  if (store_->check("abort")) {
    auto v = store_->get("abort", std::chrono::seconds(5));
    std::string reason(v.begin(), v.end());
    const bool mismatch = reason.rfind(kMismatchMark, 0) == 0;
    if (mismatch) reason.erase(0, sizeof kMismatchMark - 1);
    const std::string what =
        "smddp: " + op.describe() + " failed: the communicator was aborted on another node: " + reason;
    // A node whose ranks had not yet heard of a disagreement raises it as what it is.
    if (mismatch) throw MismatchError(what + written_claim(op));
    throw AbortedError(what);
  }
}

std::exception_ptr CommunicatorImpl::cause_of_transfer_failure(const OpInfo& op, std::exception_ptr failure) {
  // The other node's rank wrote the key before it closed the connection, but a store may apply
  // a set after the peer's next request: poll a little. Only a failure path waits this long.
  constexpr auto kGrace = std::chrono::seconds(1);
  const auto until = Clock::now() + kGrace;
  for (;;) {
    try {
      watch_remote_now(op);
    } catch (const MismatchError&) {  // (an InvalidArgument: caught before the store's errors)
      return std::current_exception();
    } catch (const AbortedError&) {
      return std::current_exception();
    } catch (...) {  // the store itself failed: the transfer's error is all there is
      return failure;
    }
    if (Clock::now() >= until) return failure;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void CommunicatorImpl::agreement_round(algorithms::Context& ctx) {
  shm_->begin_round();
  // No device fence: this round carries no data (an empty collective, or one whose algorithm
  // never synchronised and so wrote nothing a peer reads), and on a GPU it would block the host
  // on the caller's stream.
  shm_->arrive();
  ctx.wait_all();
}

void CommunicatorImpl::agree_across_nodes(algorithms::Context& ctx, const Fingerprint& mine) {
#ifdef SMDDP_HAVE_LIBFABRIC
  const std::vector<Finding> found = share_findings(ctx, exchange_fingerprints(ctx, mine));
  if (found.empty()) return;
  // This node's ranks agree (the shared-memory round compared them first): name them beside
  // every rank elsewhere that one of them found differing.
  std::vector<std::pair<int, Fingerprint>> known;
  for (int r : topo_.local_ranks()) known.emplace_back(r, mine);
  for (const auto& f : found) known.emplace_back(f.rank, f.fp);
  std::sort(known.begin(), known.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Fingerprint> all;
  std::vector<int> ranks;
  for (const auto& [r, fp] : known) {
    ranks.push_back(r);
    all.push_back(fp);
  }
  throw MismatchError(prefix() + "ranks called different collectives: " + describe_disagreement(all, ranks) +
                      std::string(algorithms::kNothingWritten));
#else
  (void)ctx;
  (void)mine;
#endif
}

void CommunicatorImpl::run_collective(OpInfo& op, const CollArgs& args) {
  if (failed_.load() || shm_->aborted())
    throw AbortedError("smddp: " + op.describe() + " not started: the communicator was aborted: " +
                       shm_->abort_reason());
  moving_data_ = false;
  if (args.timeout.count() > 0) op.timeout = args.timeout;
  op.deadline = Clock::now() + op.timeout;
  shm_->publish_deadline(op.deadline);
  // The failure's cause once a network wait published it (Context::publish_failure), before
  // the unwinding cancelled this collective's transfers.
  std::exception_ptr published;
  const std::function<std::exception_ptr(std::exception_ptr)> publish = [&](std::exception_ptr failure) {
    if (!published) {
      published = cause_of_failure(op, std::move(failure));
      fail(published);
    }
    return published;
  };
  // Sends and receives in flight beside this collective (on the engine thread: Engine::loop; none
  // on a caller's, which runs only on an idle engine), and those submitted while it runs (from
  // another thread, on a caller's), are polled from its waits: their peer may need them
  // before it joins this collective. The node's waits call them with the network's progress,
  // and keep polling (no long sleeps) while any remain; inside a node only while any do (the
  // gate), the node's own waits otherwise. So do the waits on the network (Context::beside).
  const bool beside = engine_->runs_collective_here();
  const std::function<bool()> poll_beside = [this] { return engine_->poll_p2p_beside(); };
  struct IdleHookRestored {  // the hook it replaces (across nodes: the network's progress)
    shm::Group& g;
    std::function<bool()> hook, gate, news;
    ~IdleHookRestored() { g.set_idle_hook(std::move(hook), std::move(gate), std::move(news)); }
  };
  std::optional<IdleHookRestored> restore;
  if (beside) {
    restore.emplace(IdleHookRestored{*shm_, shm_->idle_hook(), shm_->idle_hook_gate(), shm_->idle_hook_news()});
    // A send submitted meanwhile (news) keeps the node's waits from going to sleep on it.
    const std::function<bool()> p2p_news = [this] { return engine_->p2p_beside_pending(); };
    if (restore->hook) {
      shm_->set_idle_hook(
          [this, &node_idle = restore->hook] {
            const bool net = node_idle();
            const bool p2p = engine_->poll_p2p_beside();
            return net || p2p;
          },
          {}, p2p_news);
    } else {
      shm_->set_idle_hook(poll_beside, p2p_news, p2p_news);
    }
  }
  try {
    const bool empty = args.kind != CollKind::barrier && args.uniform && args.count == 0;
    const std::function<void()> watch = [&] { watch_remote(op); };
    // Device memory that the network cannot reach (CUDA without FI_HMEM) runs across nodes on
    // host copies (host_staging.h): the algorithm then sees host memory, and only the copies in
    // and out see the GPU. A large one runs in pieces, each piece a collective of its own (all
    // with the algorithm chosen for a whole piece). With SMDDP_CUDA_NET_BOUNCE it runs on its
    // device instead, and only its network messages are bounced through host buffers
    // (net_exchange.h). Memory the network reaches is the algorithm's as it is, on its device
    // (NetExchange fences before the network touches it).
    device::Device& mem_dev = device_for(args.memory);
    const bool unreachable = multi_node_ && !mem_dev.network_addressable();
    const bool bounced = unreachable && net_bounce_;
    const bool staged = unreachable && !bounced;
    const size_t piece_elements = staged ? staging_piece_elements(args, size_, staging_piece_) : 0;
    // Host memory's copies and reductions into the staging slots take this rank's kind of stores
    // (device/slot_stores.h), and are timed to choose it.
    device::Device& algo_dev = staged ? device::host() : mem_dev;
    std::optional<device::SlotStoreDevice> slot_dev;
    device::StoreKindChooser::Turn stores;
    if (&algo_dev == &device::host()) {
      stores = begin_slot_stores(slot_stores_, args, size_);
      slot_dev.emplace(algo_dev, shm_->slot(0, 0), shm_->all_slots_bytes(), stores.kind);
    }
    algorithms::Context ctx{*shm_, slot_dev ? *slot_dev : algo_dev, op, multi_node_ ? &topo_ : nullptr, net_.get(),
                            multi_node_ ? &watch : nullptr, scratch_.get(),
                            windows_for(staged ? Memory{} : args.memory), multi_node_ ? &publish : nullptr};
    if (beside) ctx.beside = &poll_beside;
    if (bounced) ctx.bounce = bounce_pool_.get();
    // Before any round: the fence of the first arrive() (or the staging's) then also waits for
    // the caller's work, so no peer reads this rank's buffers before they are written.
    if (args.ready) device::cuda_wait(mem_dev, args.ready.get());
    const algorithms::Algorithm* algo =
        empty ? nullptr : &algorithm_for(args, piece_elements ? piece_elements : args.count);
    if (consistency_) {
      // Compared in the algorithm's first shared-memory round, before it combines or copies
      // anything into an output. Across nodes the algorithms may start on the network, and an
      // empty collective has no rounds at all: those compare in a round of their own first,
      // across nodes after swapping fingerprints with the other nodes (cross_node_agreement.h).
      // The algorithm is in it: ranks that picked different ones would run different rounds.
      const Fingerprint fp = fingerprint(op.coll_seq, args, algo, piece_elements, bounced);
      shm_->announce(fp);
      if (multi_node_) agree_across_nodes(ctx, fp);
      else if (empty) agreement_round(ctx);
    }
    if (empty) return;
    SMDDP_LOG(TRACE, rank_) << op.describe() << ": " << algorithms::to_string(args.kind) << ':' << algo->name
                            << " count " << args.count << ' ' << to_string(args.dtype);
    moving_data_ = true;
    if (staged) {
      run_staged(ctx, op, args, *algo, mem_dev, piece_elements);
    } else {
      algo->run(ctx, args);
      ctx.dev.fence();  // the outputs are complete when the collective is
      if (shm_->announcement_pending()) agreement_round(ctx);  // an algorithm that never synchronised
    }
    if (slot_dev) end_slot_stores(slot_stores_, stores, *slot_dev, rank_);
    scratch_->trim(kScratchKeep);
    if (bounced) bounce_pool_->trim(kScratchKeep);
  } catch (...) {
    drain_after_failure(args.memory);
    std::rethrow_exception(publish(std::current_exception()));
  }
}

std::exception_ptr CommunicatorImpl::cause_of_failure(const OpInfo& op, std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const SystemError&) {
    // Across nodes: the peer whose connection broke is more often a messenger (its node aborted
    // and it left) than the cause; the abort names the cause, as on every other rank.
    if (multi_node_) failure = cause_of_transfer_failure(op, failure);
  } catch (...) {
  }
  try {
    std::rethrow_exception(failure);
  } catch (const AbortedError& e) {
    // Across nodes a rank may hear of a disagreement from a node-mate's abort before finding it
    // itself (directly, or as the cause of a broken connection): the collective it was running
    // failed for that reason, so say so.
    if (shm_->aborted_by_mismatch()) return std::make_exception_ptr(MismatchError(e.what() + written_claim(op)));
  } catch (...) {
  }
  return failure;
}

void CommunicatorImpl::run_staged(algorithms::Context& ctx, OpInfo& op, const CollArgs& args,
                                  const algorithms::Algorithm& algo, device::Device& dev, size_t piece_elements) {
  if (piece_elements == 0) {
    HostStaging staging(*staging_pool_);
    const CollArgs host_args = staging.stage_in(dev, args, rank_, size_);
    algo.run(ctx, host_args);
    if (shm_->announcement_pending()) agreement_round(ctx);
    staging.stage_out(dev);  // only after success: a failed collective leaves the outputs alone
  } else {
    // Piece k runs as collective number coll_seq + k (collective() reserved them), so its
    // messages never match another piece's. Every piece runs `algo`, the one the ranks compared
    // (chosen for a whole piece; the algorithms run at any count): a shorter last piece
    // choosing again by its size could pick by settings the ranks never compared.
    struct Restore {
      OpInfo& op;
      uint64_t first;
      ~Restore() { op.coll_seq = first; }
    } restore{op, op.coll_seq};
    PipelinedStaging staging(*staging_pool_, dev, args, rank_, size_, staging_piece_);
    staging.run([&](const CollArgs& piece, size_t k) {
      op.coll_seq = restore.first + k;
      algo.run(ctx, piece);
      if (shm_->announcement_pending()) agreement_round(ctx);
    });
  }
  staging_pool_->trim(kScratchKeep);
}

const algorithms::Algorithm& CommunicatorImpl::algorithm_for(const CollArgs& args, size_t count) const {
  // The selector sees all ranks' data: reduce_scatter's input and allgather's output are
  // `count` per rank.
  const size_t blocks =
      args.kind == CollKind::reduce_scatter || args.kind == CollKind::allgather ? static_cast<size_t>(size_) : 1;
  return algorithms::select(args.kind, count * blocks * dtype_size(args.dtype), size_, overrides_,
                            multi_node_ ? &topo_ : nullptr, args.memory.kind == Memory::Kind::cuda,
                            !multi_node_ && !topo_.oversubscribed());
}

size_t CommunicatorImpl::sequence_numbers(const CollArgs& args) const {
  // CUDA memory across nodes reserves one number per staging piece whether or not it turns out
  // staged: this runs on the caller's thread, where asking the device (device_for) would race
  // the engine's. Numbers left unused are skipped alike on every rank.
  if (!multi_node_ || args.memory.kind != Memory::Kind::cuda) return 1;
  return staging_pieces(args, size_, staging_piece_);
}

void CommunicatorImpl::drain_after_failure(const Memory& m) noexcept {
  if (m.kind != Memory::Kind::cuda) return;
  auto it = cuda_.find(m.device);
  if (it == cuda_.end() || !it->second.dev) return;
  try {
    it->second.dev->fence();
  } catch (...) {  // a GPU fault: the error on its way says what failed
  }
}

CommunicatorImpl::CudaSide::~CudaSide() {
  if (!dev) return;
  try {
    dev->fence();
  } catch (...) {  // a destructor must not throw; closing the windows is still right
  }
}

namespace {
// Empty when this process can use CUDA, else why not (asked once: it initialises CUDA).
const std::string& cuda_problem() {
  static const std::string none;
  if (device::cuda_stand_in()) return none;  // tests: set after the answer below may be cached
  static const std::string why = [] {
    std::string w;
    return device::cuda_usable(&w) ? std::string() : w;
  }();
  return why;
}
}  // namespace

void CommunicatorImpl::check_memory(const Memory& m, const char* op) const {
  if (m.kind == Memory::Kind::host) return;
  const std::string what = prefix() + op + " on CUDA device " + std::to_string(m.device) + " memory: ";
  if (const std::string& why = cuda_problem(); !why.empty()) throw InvalidArgument(what + why);
  const int n = device::cuda_device_count();
  if (m.device < 0 || m.device >= n)
    throw InvalidArgument(what + "no such device (this process sees " + std::to_string(n) + ")");
}

device::Device& CommunicatorImpl::device_for(const Memory& m) {
  if (m.kind == Memory::Kind::host) return device::host();
  CudaSide& side = cuda_[m.device];
  if (!side.dev) side.dev = device::cuda_device(m.device);
  if (!slots_for_cuda_.tried) {
    slots_for_cuda_.tried = true;
    void* base = shm_->slot(0, 0);
    const size_t bytes = shm_->all_slots_bytes();
    if (device::cuda_register_host(base, bytes)) slots_for_cuda_.base = base;
    SMDDP_LOG(INFO, rank_) << "staging slots (" << bytes << " bytes) "
                           << (slots_for_cuda_.base ? "page-locked for CUDA" : "not page-locked: CUDA declined");
  }
  return *side.dev;
}

CommunicatorImpl::SlotsForCuda::~SlotsForCuda() {
  if (base) device::cuda_unregister_host(base);
}

device::PeerWindows* CommunicatorImpl::windows_for(const Memory& m) {
  if (m.kind == Memory::Kind::host) return windows_.get();
  if (device::cuda_stand_in()) return nullptr;  // tests: IPC is not stood in (device/cuda.h)
  CudaSide& side = cuda_[m.device];
  if (!side.windows) side.windows = device::cuda_ipc_windows(device_for(m));
  return side.windows.get();
}

Work CommunicatorImpl::collective(CollArgs args) {
  check_process(algorithms::to_string(args.kind));
  check_memory(args.memory, algorithms::to_string(args.kind));
  if (args.memory.kind == Memory::Kind::cuda && args.memory.stream)
    args.ready = device::cuda_event_after(args.memory.stream, args.memory.device);
  auto state = std::make_shared<OpState>();
  std::optional<engine::Task> here;
  {
    std::lock_guard<std::mutex> g(submit_mu_);
    OpInfo op = make_op(algorithms::to_string(args.kind));
    op.coll_seq = coll_seq_ + 1;
    coll_seq_ += sequence_numbers(args);
    state->seq = op.seq;
    state->name = op.name;
    state->rank = rank_;
    state->fork_generation = fork_generation_;
    engine::Task t;
    t.state = state;
    t.start_now = args.memory.kind == Memory::Kind::cuda;
    t.run = [this, op, args = std::move(args)]() mutable { run_collective(op, args); };
    here = engine_->submit(std::move(t));
  }
  // Inline: run it with submit_mu_ released, so that other threads can still issue (they queue
  // behind it) while it waits for its peers. Through a reference of its own: a callback of it
  // may destroy this communicator (Communicator::~Communicator), whose engine outlives that
  // teardown then until run_claimed returns.
  const std::shared_ptr<engine::Engine> engine = engine_;
  if (here) engine->run_claimed(std::move(*here));
  else engine->run_nested_through(state.get());  // issued from a callback of this engine's
  return Work(state);
}

Work CommunicatorImpl::submit_p2p(const char* name, int peer, P2pPoll poll, std::shared_ptr<std::atomic<int>> source,
                                  engine::Announcer announced_by) {
  auto state = std::make_shared<OpState>();
  state->source = std::move(source);
  std::lock_guard<std::mutex> g(submit_mu_);
  OpInfo op = make_op(name, peer);
  state->seq = op.seq;
  state->name = op.name;
  state->rank = rank_;
  state->fork_generation = fork_generation_;
  engine::Task t;
  t.state = state;
  t.p2p = true;
  t.announced_by = announced_by;
  t.poll = [this, op, poll = std::move(poll)]() mutable {
    if (op.deadline == Clock::time_point{}) op.deadline = Clock::now() + op.timeout;
    try {
      // Each operation looks for an abort first, at every poll (p2p::Send and the others; a
      // transfer across nodes cancels what it posted before the error leaves it).
      return poll(*shm_, op);
    } catch (const SystemError&) {
      // A broken connection to another node is more often the peer leaving after its node
      // aborted (a receive that found a disagreement, say) than the cause: as for collectives,
      // the abort the peer left in the store names the cause (and a disagreement stays one).
      std::exception_ptr cause = std::current_exception();
      if (multi_node_ && (op.peer < 0 || local_index(op.peer) < 0)) cause = cause_of_transfer_failure(op, cause);
      fail(cause);
      std::rethrow_exception(cause);
    } catch (const std::exception& e) {
      // Any failure mid-message (a tag/size mismatch included) leaves the byte stream between
      // the pair unreadable: the communicator cannot go on.
      abort_everywhere(e.what());
      throw;
    }
  };
  if (engine_->submit(std::move(t))) throw std::logic_error("smddp: the engine handed back a point-to-point op");
  return Work(state);
}

int CommunicatorImpl::local_index(int global_rank) const {
  if (!multi_node_) return global_rank;
  const auto& l = topo_.local_ranks();
  auto it = std::find(l.begin(), l.end(), global_rank);
  return it == l.end() ? -1 : static_cast<int>(it - l.begin());
}


Work CommunicatorImpl::point_to_point(const char* name, int peer, bool is_send, void* buf, size_t bytes,
                                      const Memory& m, const std::function<P2pPoll(void*)>& on,
                                      std::shared_ptr<std::atomic<int>> source) {
  // Host memory between ranks of this node: the FIFOs' pushes and pops wake the engine; with a
  // rank on another node, the network's completions. A receive from any rank across nodes
  // (both) and CUDA memory (the copies' events) are polled.
  if (m.kind != Memory::Kind::cuda) {
    const engine::Announcer by = !multi_node_ || (peer >= 0 && local_index(peer) >= 0) ? engine::Announcer::node_fifos
                                 : peer >= 0                                            ? engine::Announcer::network
                                                                                        : engine::Announcer::none;
    return submit_p2p(name, peer, on(buf), std::move(source), by);
  }
  // The caller's stream's work so far, marked now on the caller's thread (as for collectives).
  std::shared_ptr<void> ready = m.stream ? device::cuda_event_after(m.stream, m.device) : nullptr;
  P2pStagingPool::Lease host = p2p_staging_->take(bytes);
  P2pPoll on_host = on(host.data());
  auto staged = std::make_shared<StagedP2p>(
      is_send, buf, bytes, std::move(host), [this, m]() -> device::Device& { return device_for(m); }, std::move(ready),
      std::move(on_host));
  return submit_p2p(name, peer, polled(std::move(staged)), std::move(source), engine::Announcer::none);
}

Work CommunicatorImpl::send(const void* buf, size_t bytes, int peer, uint32_t tag, const Memory& memory) {
  check_process("send");
  check_memory(memory, "send");
  const int local = local_index(peer);
  return point_to_point("send", peer, true, const_cast<void*>(buf), bytes, memory, [&](void* p) {
#ifdef SMDDP_HAVE_LIBFABRIC
    if (local < 0)
      return polled(std::make_shared<NetTransfer>(*net_, pair_order_, true, p, bytes, peer, tag,
                                                  [this](const OpInfo& op) { watch_remote(op); }));
#endif
    return polled(std::make_shared<p2p::Send>(p, bytes, local, tag));
  });
}

Work CommunicatorImpl::recv(void* buf, size_t bytes, int peer, uint32_t tag, const Memory& memory) {
  check_process("recv");
  check_memory(memory, "recv");
  const int local = local_index(peer);
  return point_to_point("recv", peer, false, buf, bytes, memory, [&](void* p) {
#ifdef SMDDP_HAVE_LIBFABRIC
    if (local < 0)
      return polled(std::make_shared<NetTransfer>(*net_, pair_order_, false, p, bytes, peer, tag,
                                                  [this](const OpInfo& op) { watch_remote(op); }));
#endif
    return polled(std::make_shared<p2p::Recv>(p, bytes, local, tag));
  });
}

Work CommunicatorImpl::recv_any(void* buf, size_t bytes, uint32_t tag, const Memory& memory) {
  check_process("recv");
  check_memory(memory, "recv");
  auto source = std::make_shared<std::atomic<int>>(-1);
  return point_to_point("recv", -1, false, buf, bytes, memory, [&](void* p) {
#ifdef SMDDP_HAVE_LIBFABRIC
    if (multi_node_)
      return polled(std::make_shared<NetOrLocalAnySource>(*net_, pair_order_, p, bytes, tag, topo_.local_ranks(),
                                                          source, [this](const OpInfo& op) { watch_remote(op); }));
#endif
    return polled(std::make_shared<p2p::RecvAny>(p, bytes, tag, source));
  }, source);
}

void CommunicatorImpl::abort(const std::string& reason) {
  check_process("abort");
  abort_everywhere("rank " + std::to_string(rank_) + ": " + reason);
}

}  // namespace smddp::detail
