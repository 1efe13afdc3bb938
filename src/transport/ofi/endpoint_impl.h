// The libfabric endpoint's inside (endpoint.h): a transfer's state (Request), the endpoint's
// fids and bookkeeping (Endpoint::Impl), and how transfers are posted and completions read.
// Shared by endpoint.cc (setup, posting) and endpoint_progress.cc (progress, waits, cancels).
#pragma once

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/logging.h"
#include "smddp/errors.h"
#include "transport/ofi/completion_wait.h"
#include "transport/ofi/endpoint.h"
#include "transport/ofi/fid.h"
#include "transport/ofi/job_key.h"
#include "transport/ofi/provider.h"
#include "transport/ofi/region_cache.h"
#include "transport/ofi/wire.h"

namespace smddp::ofi {

inline std::string fi_error(const char* what, ssize_t rc) {
  return std::string("smddp: libfabric ") + what + " failed: " + fi_strerror(static_cast<int>(-rc)) + " (" +
         std::to_string(rc) + ")";
}

inline void check(const char* what, ssize_t rc) {
  if (rc != 0) throw SystemError(fi_error(what, rc));
}

struct ChunkCtx {
  fi_context2 ctx;  // first member: libfabric hands back &ctx as op_context
  Endpoint::Request* req;
};

// A transfer. Tagged: `nchunks` sends or receives, one context each. RMA (collective messages
// of at least SMDDP_OFI_RMA bytes): the receiver registers its buffer for remote writes and
// injects a ticket to the sender; the sender receives the ticket (context 0), then writes the
// chunks with remote completion data (contexts 1..nchunks); the receiver is done when all
// `nchunks` remote completions carrying its id have arrived.
struct Endpoint::Request {
  bool is_send = true;
  bool rma = false;
  int peer = -1;              // -1 for a receive from any rank until its message arrived
  bool any_source = false;    // posted with the sender's tag bits ignored
  const std::byte* sbuf = nullptr;
  std::byte* rbuf = nullptr;
  size_t bytes = 0;
  uint64_t first_tag = 0, ticket_tag = 0;
  size_t nchunks = 1, ops = 1, posted = 0, completed = 0, failed = 0;
  size_t remote_done = 0;     // RMA receiver: chunks written into rbuf
  bool ticket_sent = false;   // RMA receiver
  RmaTicket ticket;
  std::vector<ChunkCtx> ctx;  // one per operation this request posts
  FidOwner<fid_mr> mr;
  void* desc = nullptr;
  FidOwner<fid_mr> ticket_mr;  // RMA sender, where buffers need registering
  void* ticket_desc = nullptr;
  std::string error;
  bool disagrees = false;  // error is the two ranks disagreeing about the message (size, tag)
  // Point-to-point receive (wire.h): matched by the pair's message number, then its tag compared.
  bool check_tag = false;
  uint32_t caller_tag = 0;
  uint32_t order = 0;  // a receive from any rank: the number of the message it took
  uint64_t made = 0;   // its place among the process's requests (requests_made()): cancel()
  bool done() const {
    if (!error.empty()) return true;
    if (rma && !is_send) return ticket_sent && remote_done == nchunks;
    return completed == ops;
  }
  // libfabric holds none of this request's contexts or registrations any more.
  bool quiet() const {
    const bool ours = completed + failed == posted && (posted == ops || !error.empty());
    return ours && (!(rma && !is_send) || done());
  }
};

// Requests made so far in this process, numbered in order (Request::made).
inline std::atomic<uint64_t>& requests_made() {
  static std::atomic<uint64_t> n{0};
  return n;
}

inline std::shared_ptr<Endpoint::Request> make_request(Endpoint::Request proto, size_t max_msg) {
  auto r = std::make_shared<Endpoint::Request>(std::move(proto));
  r->made = requests_made().fetch_add(1, std::memory_order_relaxed) + 1;
  r->nchunks = std::max<size_t>(1, (r->bytes + max_msg - 1) / max_msg);
  if (r->nchunks > kMaxChunks)
    throw InvalidArgument("smddp: a message of " + std::to_string(r->bytes) + " bytes is too large for the libfabric " +
                          "transport: at most " + std::to_string(kMaxChunks) + " messages of " + std::to_string(max_msg) +
                          " bytes (SMDDP_OFI_MAX_MESSAGE)");
  // Operations with contexts of ours: the chunks; an RMA sender also its ticket's receive; an
  // RMA receiver none (its ticket is injected, its data arrives as remote completions).
  r->ops = !r->rma ? r->nchunks : r->is_send ? r->nchunks + 1 : 0;
  r->ctx.resize(r->ops);
  return r;
}

struct Endpoint::Impl {
  int rank = 0, size = 0;
  std::string provider;
  InfoOwner info;
  FidOwner<fid_fabric> fabric;
  FidOwner<fid_domain> domain;
  FidOwner<fid_cq> cq;
  std::unique_ptr<CompletionWait> cq_wait;  // sleeps until cq has news (the engine's waits)
  // Entries read from cq so far: a sleep blocks only if its readiness check read none, since
  // one read there may have completed an op polled before the read (it would not wake anyone).
  size_t completions_read = 0;
  // Per peer (size of them): entries read that moved data to or from it, or reported an error
  // other than a cancellation's (its sign of life: a cancellation's report is the provider's, not
  // the link's); and, when a cancel last gave up waiting for the reports of its transfers, that
  // count and the requests made by then (Endpoint::cancel).
  struct GaveUp {
    size_t heard = 0;
    uint64_t made = 0;
  };
  std::vector<size_t> heard_from;
  std::vector<std::optional<GaveUp>> cancel_gave_up_on;
  void count_sign_of_life(int peer) {
    if (peer >= 0 && static_cast<size_t>(peer) < heard_from.size()) ++heard_from[static_cast<size_t>(peer)];
  }
  FidOwner<fid_av> av;
  FidOwner<fid_ep> ep;
  std::vector<fi_addr_t> addrs;
  std::string rail;  // the domain this endpoint is on
  size_t num_rails = 1;
  size_t max_msg = 0;
  bool need_mr = false;
  bool hmem = false;  // opened with FI_HMEM: device memory can be registered
  RegionCache<FidOwner<fid_mr>> regions;
  size_t transfer_regs = 0;
  size_t posts_refused = 0;  // -FI_EAGAIN on a tagged post (tests)
  size_t cancels_unreported = 0;  // operations a cancel gave up waiting for (tests)
  bool prov_key = true;  // FI_MR_PROV_KEY: the provider picks keys; else each needs its own
  uint64_t next_key = 1;
  uint64_t mr_key() { return prov_key ? 0 : next_key++; }
  size_t rma_min = 0;  // 0: no RMA
  bool virt_addr = false;  // FI_MR_VIRT_ADDR: RMA addresses are virtual, else region offsets
  uint32_t next_rma_id = 1;
  std::unordered_map<uint32_t, std::weak_ptr<Request>> rma_targets;  // RMA receivers by id
  std::mutex mu;  // FI_THREAD_DOMAIN: one thread in the domain at a time
  std::unordered_set<std::shared_ptr<Request>> inflight;
  // The communicator's key (job_key.h), XORed into every tag and RMA completion datum on the
  // wire; the sweep that drops queued messages carrying another.
  uint64_t key = 0;
  std::unique_ptr<ForeignSweep> sweep;
  ChunkCtx sweep_ctx{};  // the context of the sweep's looks (req stays null)
  uint64_t wire(uint64_t tag) const { return tag ^ key; }
  uint64_t wire_data(uint32_t id) const { return id ^ static_cast<uint32_t>(key); }

  ~Impl() {
    // The endpoint first: closing it discards the operations still posted, which point into
    // the requests (buffers, contexts, RMA tickets and their regions), so those must outlive it.
    // Then the rest in reverse order of opening (members are destroyed in reverse declaration
    // order). After a link went down this close flushes the cut transfers: see
    // provider.cc's configure_providers_once for the rxm crash that made over tcp.
    size_t posted = 0;  // operations libfabric still held (point-to-point ones cancel themselves first)
    for (const auto& r : inflight) posted += r->posted - r->completed - r->failed;
    if (posted > 0) {
      SMDDP_LOG(INFO, rank) << "libfabric: the endpoint closes with " << posted
                            << " operation(s) still posted, which the close discards";
    }
    ep.reset();
    inflight.clear();
    if (sweep && sweep->dropped()) {
      SMDDP_LOG(INFO, rank) << "libfabric: " << sweep->dropped()
                            << " messages from outside this communicator were dropped in its lifetime";
    }
  }

  void fail(Request& r, const char* what, ssize_t rc) {
    r.error = fi_error(what, rc) + " (peer rank " + std::to_string(r.peer) + ")";
  }

  // The ranks disagree about a message's size: an error for the request, never a short or
  // truncated buffer taken for a whole one. `theirs`: the peer's size, or "more than ...".
  void size_mismatch(Request& r, const std::string& theirs) {
    r.disagrees = true;
    r.error = "smddp: rank " + std::to_string(rank) + (r.is_send ? " sends " : " expects ") + std::to_string(r.bytes) +
              " bytes " + (r.is_send ? "to" : "from") + " rank " + std::to_string(r.peer) + ", which " +
              (r.is_send ? "expects " : "sent ") + theirs + " (the ranks disagree about the message's size)";
  }

  // A point-to-point message under another tag than its receive's. `theirs`: the sender's tag.
  void tag_mismatch(Request& r, const std::string& theirs) {
    r.disagrees = true;
    r.error = "smddp: rank " + std::to_string(rank) + " expects a message under tag " + std::to_string(r.caller_tag) +
              " from rank " + std::to_string(r.peer) + ", which sent its next message under " + theirs +
              " (the ranks disagree about the message's tag; between two ranks, messages are received in the " +
              "order they were sent, as inside a node)";
  }

  // A receive completion's tag (on the wire) against the receive's: true if it is another
  // message's (the error is set).
  bool tag_disagrees(Request& r, uint64_t wire_tag) {
    if (!r.check_tag || !r.error.empty()) return false;
    const std::string theirs = p2p_tag_disagreement(r.caller_tag, wire(wire_tag));
    if (theirs.empty()) return false;
    tag_mismatch(r, theirs);
    return true;
  }

  // A receive completion's length and chunk field (from its tag on the wire) against the chunk it
  // was posted for (wire.h).
  void check_length(Request& r, const ChunkCtx& c, size_t len, uint64_t wire_tag) {
    const std::string theirs =
        r.is_send ? ticket_length_disagreement(len)  // an RMA sender's ticket
                  : chunk_length_disagreement(r.bytes, max_msg, static_cast<size_t>(&c - r.ctx.data()), len,
                                              wire(wire_tag) & kTicketChunk);
    if (!theirs.empty()) size_mismatch(r, theirs);
  }

  // A point-to-point receive from one rank with a chunk the provider refused (-FI_EAGAIN), to be
  // posted again later.
  bool p2p_receive_waiting() const {
    for (const auto& r : inflight)
      if (r->check_tag && r->error.empty() && r->posted < r->nchunks) return true;
    return false;
  }

  void post(const std::shared_ptr<Request>& r) {
    if (r->rma) return post_rma(*r);
    // A receive from any rank waits while a receive from one rank is not yet all posted: issued
    // before it (PairOrder lets no later one from a rank start while it is open), that one's
    // message is not this one's to take, and with the provider's queue full (efa under load) it
    // would be (drive() posts this one once that one is).
    if (r->any_source && p2p_receive_waiting()) return;
    while (r->posted < r->nchunks && r->error.empty()) {
      const size_t i = r->posted;
      const size_t off = i * max_msg;
      const size_t len = std::min(max_msg, r->bytes - std::min(r->bytes, off));
      ChunkCtx& c = r->ctx[i];
      c.req = r.get();
      const uint64_t tag = wire(r->first_tag + chunk_field(i, r->nchunks));
      // A receive from any rank takes any sender's message under its tag, whatever its number;
      // every receive takes its chunk whether the sender marked it last (compared on arrival).
      const uint64_t ignore =
          kLastChunkBit | (r->any_source ? kSenderBits | kP2pOrderBits : r->check_tag ? kP2pFoldBits : 0);
      ssize_t rc = r->is_send
                       ? fi_tsend(ep.get(), r->sbuf + off, len, r->desc, addrs[static_cast<size_t>(r->peer)], tag, &c.ctx)
                       : fi_trecv(ep.get(), r->rbuf + off, len, r->desc, FI_ADDR_UNSPEC, tag, ignore, &c.ctx);
      if (rc == -FI_EAGAIN) {
        ++posts_refused;
        progress();  // the provider wants its queue drained first
        return;
      }
      if (rc != 0) return fail(*r, r->is_send ? "fi_tsend" : "fi_trecv", rc);
      ++r->posted;
    }
  }

  void post_rma(Request& r) {
    if (!r.error.empty()) return;
    ssize_t rc = 0;
    if (!r.is_send) {  // the ticket goes out once; the data arrives by itself
      if (r.ticket_sent) return;
      rc = fi_tinject(ep.get(), &r.ticket, sizeof r.ticket, addrs[static_cast<size_t>(r.peer)], wire(r.ticket_tag));
      if (rc == -FI_EAGAIN) return progress();
      if (rc != 0) return fail(r, "fi_tinject (RMA ticket)", rc);
      r.ticket_sent = true;
      return;
    }
    if (r.posted == 0) {
      r.ctx[0].req = &r;
      rc = fi_trecv(ep.get(), &r.ticket, sizeof r.ticket, r.ticket_desc, FI_ADDR_UNSPEC, wire(r.ticket_tag), 0,
                    &r.ctx[0].ctx);
      if (rc == -FI_EAGAIN) return progress();
      if (rc != 0) return fail(r, "fi_trecv (RMA ticket)", rc);
      r.posted = 1;
    }
    if (r.completed == 0) return;  // no ticket yet: the receiver has not posted its buffer
    if (r.posted == 1) {
      const std::string theirs = ticket_size_disagreement(r.ticket, r.bytes);
      if (!theirs.empty()) return size_mismatch(r, theirs);
    }
    while (r.posted < r.ops) {
      const size_t i = r.posted - 1, off = i * max_msg;
      const size_t len = std::min(max_msg, r.bytes - std::min(r.bytes, off));
      ChunkCtx& c = r.ctx[r.posted];
      c.req = &r;
      rc = fi_writedata(ep.get(), r.sbuf + off, len, r.desc, wire_data(r.ticket.id), addrs[static_cast<size_t>(r.peer)],
                        r.ticket.addr + off, r.ticket.key, &c.ctx);
      if (rc == -FI_EAGAIN) return progress();
      if (rc != 0) return fail(r, "fi_writedata", rc);
      ++r.posted;
    }
  }

  // Reads completions, then posts the chunks that were refused for lack of room.
  void drive();
  // drive(), then whether `h` is done (with an error or not): a sleep's readiness.
  bool done_now(const Handle& h);
  // Whether a request has something to post that the provider refused for lack of room (only
  // polling posts it: no completion need announce the room).
  bool posts_waiting() const {
    for (const auto& r : inflight) {
      if (!r->error.empty()) continue;
      if (!r->rma && r->posted < r->ops) return true;
      if (r->rma && !r->is_send && !r->ticket_sent) return true;
      if (r->rma && r->is_send && (r->posted == 0 || (r->completed > 0 && r->posted < r->ops))) return true;
    }
    return false;
  }
  // Posts the sweep's next look for foreign messages, if one is due (job_key.h).
  void sweep_foreign();
  // What a look came back with.
  void sweep_result(bool found, uint64_t wire_tag, int err);

  // The memory descriptor of a transfer's buffer where the provider wants one: the cached
  // region's registration, else one for this transfer alone (held by the request).
  void describe(Request& r, const void* buf, size_t bytes, uint64_t access) {
    if (!need_mr || bytes == 0) return;
    if (const auto* region = regions.find(buf, bytes)) {
      r.desc = fi_mr_desc(region->get());
      return;
    }
    check("fi_mr_reg", fi_mr_reg(domain.get(), buf, bytes, access, 0, mr_key(), 0, r.mr.out(), nullptr));
    r.desc = fi_mr_desc(r.mr.get());
    ++transfer_regs;
  }

  // A tagged transfer without RMA: owned, described and posted.
  Handle start(Request proto, const void* buf, uint64_t access) {
    auto r = make_request(std::move(proto), max_msg);
    std::lock_guard<std::mutex> g(mu);
    describe(*r, buf, r->bytes, access);
    inflight.insert(r);
    post(r);
    return r;
  }

  void progress() {
    fi_cq_tagged_entry e[16];
    for (;;) {
      ssize_t n = fi_cq_read(cq.get(), e, 16);
      if (n == -FI_EAGAIN) return;
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq.get(), &err, 0) < 0) return;
        ++completions_read;
        char prov[256] = {};
        const char* ptext = fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, prov, sizeof prov);
        if (err.op_context == &sweep_ctx.ctx) {
          sweep_result(false, 0, err.err);
        } else if (err.op_context) {
          Request* r = reinterpret_cast<ChunkCtx*>(err.op_context)->req;
          r->failed++;
          if (err.err != FI_ECANCELED) count_sign_of_life(r->peer);
          if (err.err == FI_ETRUNC && !r->is_send) {  // the sender's message is larger
            // (A provider that leaves the entry's tag unset leaves it 0: then only the size is known.)
            if (!(err.tag && tag_disagrees(*r, err.tag)))
              size_mismatch(*r, "more (" + std::to_string(err.olen) + " bytes over)");
            continue;
          }
          r->error = std::string("smddp: libfabric ") + (r->is_send ? "send to" : "receive from") + " rank " +
                     std::to_string(r->peer) + " failed: " + fi_strerror(err.err) + " (provider " + provider +
                     ": " + (ptext ? ptext : "") + ")";
        } else if (err.flags & FI_REMOTE_CQ_DATA) {
          // An RMA write into one of our receives, cut short (its connection failed): the
          // provider has no context of ours for it, only the receive's id in the data.
          auto it = rma_targets.find(static_cast<uint32_t>(wire_data(static_cast<uint32_t>(err.data))));
          if (it != rma_targets.end())
            if (auto r = it->second.lock())
              r->error = "smddp: libfabric RMA write from rank " + std::to_string(r->peer) + " failed: " +
                         fi_strerror(err.err) + " (provider " + provider + ")";
        }
        continue;
      }
      if (n < 0) throw SystemError(fi_error("fi_cq_read", n));
      completions_read += static_cast<size_t>(n);
      for (ssize_t k = 0; k < n; ++k) {
        if (e[k].op_context == &sweep_ctx.ctx) {
          sweep_result(true, e[k].tag, 0);
          continue;
        }
        if (e[k].flags & FI_REMOTE_CQ_DATA) {  // a chunk written into one of our RMA receives
          auto it = rma_targets.find(static_cast<uint32_t>(wire_data(static_cast<uint32_t>(e[k].data))));
          if (it != rma_targets.end())
            if (auto r = it->second.lock()) {
              r->remote_done++;
              count_sign_of_life(r->peer);
            }
          continue;
        }
        auto* c = reinterpret_cast<ChunkCtx*>(e[k].op_context);
        c->req->completed++;
        if (c->req->any_source) {
          c->req->peer = sender_of(wire(e[k].tag));
          c->req->order = p2p_order_of(wire(e[k].tag));
        }
        count_sign_of_life(c->req->peer);
        if ((e[k].flags & FI_RECV) && c->req->error.empty() && !tag_disagrees(*c->req, e[k].tag))
          check_length(*c->req, *c, e[k].len, e[k].tag);
      }
    }
  }
};

}  // namespace smddp::ofi
