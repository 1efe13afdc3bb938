#include "transport/ofi/endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/config.h"
#include "core/failure_record.h"
#include "core/fd_limit.h"
#include "core/logging.h"
#include "smddp/errors.h"
#include "topology/pci.h"
#include "transport/ofi/completion_wait.h"
#include "transport/ofi/fid.h"
#include "transport/ofi/job_key.h"
#include "transport/ofi/provider.h"
#include "transport/ofi/rails.h"
#include "transport/ofi/region_cache.h"
#include "transport/ofi/wire.h"

namespace smddp::ofi {

namespace {

// A record another rank publishes at setup, or the reason it failed to.
std::vector<uint8_t> setup_record(Store& store, const std::string& key, int rank, int from,
                                  std::chrono::milliseconds timeout) {
  std::vector<uint8_t> v = store.get(key, timeout);
  if (auto why = failure_in(v))
    throw SystemError("smddp: rank " + std::to_string(rank) + ": rank " + std::to_string(from) +
                      " failed to set up: " + *why);
  return v;
}

std::string fi_error(const char* what, ssize_t rc) {
  return std::string("smddp: libfabric ") + what + " failed: " + fi_strerror(static_cast<int>(-rc)) + " (" +
         std::to_string(rc) + ")";
}

void check(const char* what, ssize_t rc) {
  if (rc != 0) throw SystemError(fi_error(what, rc));
}

}  // namespace

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

static std::shared_ptr<Endpoint::Request> make_request(Endpoint::Request proto, size_t max_msg) {
  auto r = std::make_shared<Endpoint::Request>(std::move(proto));
  r->nchunks = std::max<size_t>(1, (r->bytes + max_msg - 1) / max_msg);
  if (r->nchunks >= kTicketChunk) throw InvalidArgument("smddp: message too large for the libfabric transport");
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

  // A receive completion's length against the chunk it was posted for (wire.h).
  void check_length(Request& r, const ChunkCtx& c, size_t len) {
    const std::string theirs =
        r.is_send ? ticket_length_disagreement(len)  // an RMA sender's ticket
                  : chunk_length_disagreement(r.bytes, max_msg, static_cast<size_t>(&c - r.ctx.data()), len);
    if (!theirs.empty()) size_mismatch(r, theirs);
  }

  void post(const std::shared_ptr<Request>& r) {
    if (r->rma) return post_rma(*r);
    while (r->posted < r->nchunks && r->error.empty()) {
      const size_t i = r->posted;
      const size_t off = i * max_msg;
      const size_t len = std::min(max_msg, r->bytes - std::min(r->bytes, off));
      ChunkCtx& c = r->ctx[i];
      c.req = r.get();
      const uint64_t tag = wire(r->first_tag + i);
      // A receive from any rank takes any sender's message under its tag, whatever its number.
      const uint64_t ignore = r->any_source ? kSenderBits | kP2pOrderBits : r->check_tag ? kP2pFoldBits : 0;
      ssize_t rc = r->is_send
                       ? fi_tsend(ep.get(), r->sbuf + off, len, r->desc, addrs[static_cast<size_t>(r->peer)], tag, &c.ctx)
                       : fi_trecv(ep.get(), r->rbuf + off, len, r->desc, FI_ADDR_UNSPEC, tag, ignore, &c.ctx);
      if (rc == -FI_EAGAIN) {
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
        char prov[256] = {};
        const char* ptext = fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, prov, sizeof prov);
        if (err.op_context == &sweep_ctx.ctx) {
          sweep_result(false, 0, err.err);
        } else if (err.op_context) {
          Request* r = reinterpret_cast<ChunkCtx*>(err.op_context)->req;
          r->failed++;
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
      for (ssize_t k = 0; k < n; ++k) {
        if (e[k].op_context == &sweep_ctx.ctx) {
          sweep_result(true, e[k].tag, 0);
          continue;
        }
        if (e[k].flags & FI_REMOTE_CQ_DATA) {  // a chunk written into one of our RMA receives
          auto it = rma_targets.find(static_cast<uint32_t>(wire_data(static_cast<uint32_t>(e[k].data))));
          if (it != rma_targets.end())
            if (auto r = it->second.lock()) r->remote_done++;
          continue;
        }
        auto* c = reinterpret_cast<ChunkCtx*>(e[k].op_context);
        c->req->completed++;
        if (c->req->any_source) {
          c->req->peer = sender_of(wire(e[k].tag));
          c->req->order = p2p_order_of(wire(e[k].tag));
        }
        if ((e[k].flags & FI_RECV) && c->req->error.empty() && !tag_disagrees(*c->req, e[k].tag))
          check_length(*c->req, *c, e[k].len);
      }
    }
  }
};

namespace {
// The provider's entry for `domain`: IPv4 first where a domain has several addresses (tcp lists
// an interface once per address family; IPv6 link-local addresses need a scope to be reached).
fi_info* entry_for(fi_info* list, const std::string& domain) {
  fi_info* first = nullptr;
  for (fi_info* i = list; i; i = i->next) {
    if (!i->domain_attr->name || domain != i->domain_attr->name) continue;
    if (i->addr_format == FI_SOCKADDR_IN) return i;
    if (!first) first = i;
  }
  return first;
}
}  // namespace

Endpoint::Endpoint(Store& store, int rank, int size, int local_rank, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = rank;
  m.size = size;
  if (size >= (1 << kRankBits)) throw InvalidArgument("smddp: the libfabric transport supports up to 65535 ranks");
  std::vector<std::string> candidates;
  std::string forced = config::get_string("SMDDP_OFI_PROVIDER");
  if (forced.empty() && std::getenv("FI_PROVIDER")) forced = std::getenv("FI_PROVIDER");
  if (!forced.empty()) candidates = {forced};
  else candidates = default_providers();
  for (const auto& c : candidates) {
    // Where RMA is wanted, a provider with RMA writes (and remote completion data) first; one
    // without them still serves, tagged only.
    const size_t rma_wanted = rma_threshold(c);
    m.rma_min = rma_wanted;
    if (rma_wanted) m.info = getinfo(c.c_str(), true);
    if (!m.info.get()) {
      m.rma_min = 0;
      m.info = getinfo(c.c_str());
      if (rma_wanted && m.info.get()) {
        SMDDP_LOG(INFO, rank) << "libfabric provider " << c << ": no RMA writes with remote data here, tagged only";
      }
    }
    if (m.info.get()) {
      m.provider = c;
      break;
    }
  }
  if (m.rma_min && rma_write_cut_crashes(m.provider)) {
    SMDDP_LOG(WARN, rank) << "SMDDP_OFI_RMA asks for RMA writes over " << m.provider
                          << ": libfabric's rxm crashes the receiver if a connection fails mid-write "
                             "(a peer's death or a link down); tagged messages (SMDDP_OFI_RMA=auto) do not";
  }
  if (!m.info.get())
    throw SystemError("smddp: rank " + std::to_string(rank) + ": no libfabric provider offers reliable tagged "
                      "messages (tried " + [&] {
                        std::string s;
                        for (auto& c : candidates) s += (s.empty() ? "" : ", ") + c;
                        return s;
                      }() + ")");
  // Rails: one per domain (NIC) the provider offers; this rank drives the one its local rank
  // picks, so a node's ranks spread over all of them.
  std::vector<RailCandidate> offered;
  for (fi_info* i = m.info.get(); i; i = i->next)
    offered.push_back({i->domain_attr->name ? i->domain_attr->name : "", i->fabric_attr->name ? i->fabric_attr->name : ""});
  const bool nics_only = m.provider.rfind("efa", 0) == 0 || m.provider.rfind("verbs", 0) == 0;
  std::string rail_error;
  const auto rails = choose_rails(offered, config::get_string("SMDDP_OFI_RAILS"), nics_only, &rail_error);
  if (rails.empty()) throw InvalidArgument("smddp: rank " + std::to_string(rank) + ": " + rail_error);
  m.num_rails = rails.size();
  // On a GPU node with several NICs, the NIC nearest the rank's GPU in the PCI tree (sysfs);
  // round-robin by local rank where that cannot be told.
  size_t rail_index = rail_for(local_rank, rails.size());
  const char* rail_how = "by local rank";
  if (nics_only && rails.size() > 1) {
    const int nearest = topology::nearest_rail("/sys", local_rank, rails);
    if (nearest >= 0) {
      rail_index = static_cast<size_t>(nearest);
      rail_how = "nearest its GPU";
    }
  }
  m.rail = rails[rail_index];
  fi_info* info = entry_for(m.info.get(), m.rail);
  m.need_mr = (info->domain_attr->mr_mode & FI_MR_LOCAL) != 0 || config::get_string("SMDDP_OFI_REGISTER") == "always";
  m.hmem = (info->caps & FI_HMEM) != 0;
  m.prov_key = (info->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
  m.virt_addr = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  m.max_msg = info->ep_attr->max_msg_size ? std::min(info->ep_attr->max_msg_size, kMaxChunk) : kMaxChunk;
  check("fi_fabric", fi_fabric(info->fabric_attr, m.fabric.out(), nullptr));
  check("fi_domain", fi_domain(m.fabric.get(), info, m.domain.out(), nullptr));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 4096;
  cq_attr.wait_obj = wanted_wait_object();
  int cq_rc = fi_cq_open(m.domain.get(), &cq_attr, m.cq.out(), nullptr);
  if (cq_rc != 0 && cq_attr.wait_obj != FI_WAIT_NONE) {  // a provider without wait objects (efa)
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_rc = fi_cq_open(m.domain.get(), &cq_attr, m.cq.out(), nullptr);
  }
  check("fi_cq_open", cq_rc);
  m.cq_wait = std::make_unique<CompletionWait>(m.fabric.get(), m.cq.get(), cq_attr.wait_obj);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check("fi_av_open", fi_av_open(m.domain.get(), &av_attr, m.av.out(), nullptr));
  check("fi_endpoint", fi_endpoint(m.domain.get(), info, m.ep.out(), nullptr));
  check("fi_ep_bind(cq)", fi_ep_bind(m.ep.get(), &m.cq.get()->fid, FI_TRANSMIT | FI_RECV));
  check("fi_ep_bind(av)", fi_ep_bind(m.ep.get(), &m.av.get()->fid, 0));
  check("fi_enable", fi_enable(m.ep.get()));

  // The communicator's key, before any address is known to anyone (job_key.h).
  if (rank == 0) store.set(kJobTokenKey, new_job_token());
  m.key = job_key(setup_record(store, kJobTokenKey, rank, 0, timeout));
  m.sweep = std::make_unique<ForeignSweep>(m.key, constant_tag_bits(size, kRankBits), std::chrono::milliseconds(100));

  std::vector<uint8_t> name(256);
  size_t len = name.size();
  check("fi_getname", fi_getname(&m.ep.get()->fid, name.data(), &len));
  name.resize(len);
  store.set("ofi/addr/" + std::to_string(rank), name);
  m.addrs.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::vector<uint8_t> peer = setup_record(store, "ofi/addr/" + std::to_string(r), rank, r, timeout);
    if (auto problem = address_record_problem(peer.size(), name.size()); !problem.empty())
      throw SystemError("smddp: rank " + std::to_string(rank) + " cannot reach rank " + std::to_string(r) +
                        " over libfabric: " + problem);
    int n = fi_av_insert(m.av.get(), peer.data(), 1, &m.addrs[static_cast<size_t>(r)], 0, nullptr);
    if (n != 1) throw SystemError("smddp: fi_av_insert of rank " + std::to_string(r) + "'s address failed");
  }
  SMDDP_LOG(INFO, rank) << "libfabric " << runtime_version() << ": provider " << m.provider << " ("
                        << info->fabric_attr->name << "), rail " << m.rail << " (" << rail_how << ", " << m.num_rails
                        << (m.num_rails == 1 ? " rail" : " rails") << " on this node)"
                        << (m.rma_min ? ", RMA writes from " + std::to_string(m.rma_min) + " B" : std::string())
                        << (m.cq_wait->blocks() ? ", waits block on the completion queue" : ", waits poll")
                        << ", max message "
                        << m.max_msg << " B" << (m.need_mr ? ", local memory registration" : "")
                        << ", job key from the Store's token (foreign messages swept over " << m.sweep->bits().size()
                        << " tag bits)";
}

void Endpoint::publish_setup_failure(Store& store, int rank, const std::string& why) {
  const std::vector<uint8_t> v = failure_record(why);
  if (rank == 0) store.set(kJobTokenKey, v);
  store.set("ofi/addr/" + std::to_string(rank), v);
}

Endpoint::~Endpoint() = default;

const std::string& Endpoint::provider() const { return impl_->provider; }
size_t Endpoint::max_message() const { return impl_->max_msg; }


// RMA only for collective traffic (tag bit 31), where both sides post the same size.
static bool use_rma(size_t rma_min, size_t bytes, uint32_t tag) {
  return rma_min && bytes >= rma_min && (tag & 0x80000000u);
}

Endpoint::Handle Endpoint::send(int peer, const void* buf, size_t bytes, uint32_t tag) {
  Impl& m = *impl_;
  Request proto;
  proto.is_send = true;
  proto.rma = use_rma(m.rma_min, bytes, tag);
  proto.peer = peer;
  proto.sbuf = static_cast<const std::byte*>(buf);
  proto.bytes = bytes;
  proto.first_tag = make_tag(m.rank, tag, 0);
  proto.ticket_tag = make_tag(peer, tag, kTicketChunk);  // the receiver sends the ticket
  auto r = make_request(std::move(proto), m.max_msg);
  std::lock_guard<std::mutex> g(m.mu);
  m.describe(*r, buf, bytes, r->rma ? FI_WRITE : FI_SEND);
  if (r->rma && m.need_mr) {
    check("fi_mr_reg (RMA ticket)", fi_mr_reg(m.domain.get(), &r->ticket, sizeof r->ticket, FI_RECV, 0, m.mr_key(), 0,
                                              r->ticket_mr.out(), nullptr));
    r->ticket_desc = fi_mr_desc(r->ticket_mr.get());
  }
  m.inflight.insert(r);
  m.post(r);
  return r;
}

Endpoint::Handle Endpoint::recv(int peer, void* buf, size_t bytes, uint32_t tag) {
  Impl& m = *impl_;
  Request proto;
  proto.is_send = false;
  proto.rma = use_rma(m.rma_min, bytes, tag);
  proto.peer = peer;
  proto.rbuf = static_cast<std::byte*>(buf);
  proto.bytes = bytes;
  proto.first_tag = make_tag(peer, tag, 0);
  proto.ticket_tag = make_tag(m.rank, tag, kTicketChunk);
  auto r = make_request(std::move(proto), m.max_msg);
  std::lock_guard<std::mutex> g(m.mu);
  if (r->rma) {
    // The sender writes straight into buf: it is registered for remote writes whatever the
    // provider's local registration needs, and named in the ticket.
    check("fi_mr_reg (RMA target)",
          fi_mr_reg(m.domain.get(), buf, bytes, FI_REMOTE_WRITE, 0, m.mr_key(), 0, r->mr.out(), nullptr));
    if (m.next_rma_id == 0) ++m.next_rma_id;
    r->ticket.id = m.next_rma_id++;
    r->ticket.addr = m.virt_addr ? reinterpret_cast<uint64_t>(buf) : 0;
    r->ticket.key = fi_mr_key(r->mr.get());
    r->ticket.bytes_low = static_cast<uint32_t>(bytes);
    m.rma_targets[r->ticket.id] = r;
  } else {
    m.describe(*r, buf, bytes, FI_RECV);
  }
  m.inflight.insert(r);
  m.post(r);
  return r;
}

void Endpoint::Impl::drive() {
  progress();
  sweep_foreign();
  for (auto it = inflight.begin(); it != inflight.end();) {
    const auto& r = *it;
    if (r->error.empty() && (r->rma ? !r->done() : r->posted < r->ops)) post(r);
    // Forget a request only once libfabric holds none of its contexts any more.
    if (!r->quiet()) {
      ++it;
      continue;
    }
    if (r->rma && !r->is_send) rma_targets.erase(r->ticket.id);
    it = inflight.erase(it);
  }
}

void Endpoint::Impl::sweep_foreign() {
  uint64_t tag = 0, ignore = 0;
  if (!sweep || !sweep->next(Clock::now(), &tag, &ignore)) return;
  fi_msg_tagged msg{};
  msg.addr = FI_ADDR_UNSPEC;
  msg.tag = tag;
  msg.ignore = ignore;
  msg.context = &sweep_ctx.ctx;
  // Looks at the queue of unexpected messages only: one that matches is discarded there, never
  // placed anywhere of ours; its completion carries its tag.
  const ssize_t rc = fi_trecvmsg(ep.get(), &msg, FI_PEEK | FI_DISCARD);
  if (rc == -FI_EAGAIN) return sweep->found_none(Clock::now());  // looked at again next round
  if (rc != 0) {
    sweep->disable();
    SMDDP_LOG(INFO, rank) << "libfabric provider " << provider << " cannot look for queued messages (FI_PEEK: "
                          << fi_strerror(static_cast<int>(-rc)) << "): messages from outside this communicator "
                          << "still match none of its receives, but stay queued and are not counted";
  }
}

void Endpoint::Impl::sweep_result(bool found, uint64_t wire_tag, int err) {
  if (found) {
    const size_t n = sweep->discarded(wire_tag);
    if (n <= 8 || (n & (n - 1)) == 0) {  // the first few, then at powers of two
      SMDDP_LOG(INFO, rank) << "libfabric: dropped a message from outside this communicator (tag " << hex_tag(wire_tag)
                            << " on the wire: its key is not this communicator's, so it is another job's or a "
                               "stale rank's of a finished one; docs/security.md); "
                            << n << " dropped so far";
    }
    return;
  }
  if (err == FI_ENOMSG) return sweep->found_none(Clock::now());
  sweep->disable();
  SMDDP_LOG(INFO, rank) << "libfabric provider " << provider << " failed a look for queued messages ("
                        << fi_strerror(err) << "): no more sweeps for messages from outside this communicator";
}

Endpoint::Handle Endpoint::recv_any(void* buf, size_t bytes, uint32_t tag) {
  Impl& m = *impl_;
  if (bytes > m.max_msg)
    throw InvalidArgument("smddp: a receive from any rank across nodes takes at most one libfabric message (" +
                          std::to_string(m.max_msg) + " bytes with " + m.provider + "), got " + std::to_string(bytes));
  Request proto;
  proto.is_send = false;
  proto.any_source = true;
  proto.rbuf = static_cast<std::byte*>(buf);
  proto.bytes = bytes;
  proto.first_tag = make_tag(0, p2p_field(0, tag), 0);
  return m.start(std::move(proto), buf, FI_RECV);
}

Endpoint::Handle Endpoint::send_p2p(int peer, const void* buf, size_t bytes, uint32_t tag, uint32_t order) {
  Request proto;
  proto.is_send = true;
  proto.peer = peer;
  proto.sbuf = static_cast<const std::byte*>(buf);
  proto.bytes = bytes;
  proto.first_tag = make_tag(impl_->rank, p2p_field(order, tag), 0);
  return impl_->start(std::move(proto), buf, FI_SEND);
}

Endpoint::Handle Endpoint::recv_p2p(int peer, void* buf, size_t bytes, uint32_t tag, uint32_t order) {
  Request proto;
  proto.is_send = false;
  proto.peer = peer;
  proto.rbuf = static_cast<std::byte*>(buf);
  proto.bytes = bytes;
  proto.first_tag = make_tag(peer, p2p_field(order, tag), 0);
  proto.check_tag = true;
  proto.caller_tag = tag;
  return impl_->start(std::move(proto), buf, FI_RECV);
}

int Endpoint::source(const Handle& h) const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return h->done() && h->error.empty() ? h->peer : -1;
}

uint32_t Endpoint::order(const Handle& h) const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return h->order;
}

bool Endpoint::withdraw(const Handle& h) {
  std::lock_guard<std::mutex> g(impl_->mu);
  Request& r = *h;
  if (r.done()) {
    if (!r.error.empty()) throw SystemError(r.error);
    return true;
  }
  for (size_t i = 0; i < r.posted; ++i) fi_cancel(&impl_->ep.get()->fid, &r.ctx[i].ctx);
  // libfabric reports each posted operation once more: done, or cancelled (an error entry).
  // Which one decides whether a message landed in the buffer. Bounded: a provider that never
  // reports would otherwise hold this thread forever.
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (r.completed + r.failed < r.posted) {
    impl_->progress();
    if (Clock::now() > give_up)
      throw SystemError("smddp: libfabric (" + impl_->provider +
                        ") did not report a cancelled receive within 30 s; its buffer may still be written");
  }
  if (r.disagrees) throw MismatchError(r.error);
  if (r.completed == r.ops && r.failed == 0) return true;
  r.error = "smddp: transfer cancelled";
  return false;
}

void Endpoint::register_region(const void* buf, size_t bytes, MemoryKind kind, int device) {
  std::lock_guard<std::mutex> g(impl_->mu);
  Impl& m = *impl_;
  if (kind == MemoryKind::cuda && !m.hmem)
    throw InvalidArgument("smddp: libfabric provider " + m.provider + " (rail " + m.rail +
                          ") was not opened with FI_HMEM: it cannot register GPU memory (device " +
                          std::to_string(device) + ")");
  if (bytes == 0 || (kind == MemoryKind::host && !m.need_mr)) return;
  iovec iov{const_cast<void*>(buf), bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV | (m.rma_min ? FI_WRITE : 0);
  attr.requested_key = m.mr_key();
  attr.iface = kind == MemoryKind::cuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  if (kind == MemoryKind::cuda) attr.device.cuda = device;
  FidOwner<fid_mr> mr;
  check("fi_mr_regattr", fi_mr_regattr(m.domain.get(), &attr, 0, mr.out()));
  m.regions.add(buf, bytes, std::move(mr));  // a replaced registration closes here
}

void Endpoint::unregister_region(const void* buf) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->regions.remove(buf);  // closes it
}

bool Endpoint::registers_memory() const { return impl_->need_mr; }

size_t Endpoint::foreign_messages_dropped() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->sweep ? impl_->sweep->dropped() : 0;
}

size_t Endpoint::transfer_registrations() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->transfer_regs;
}

void Endpoint::progress() {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->drive();
}

bool Endpoint::waits_block() const { return impl_->cq_wait->blocks(); }

void Endpoint::sleep_until_news(const std::function<bool()>& ready, std::chrono::microseconds timeout) {
  Impl& m = *impl_;
  m.cq_wait->sleep(ready,
                   [&m] {
                     std::lock_guard<std::mutex> g(m.mu);
                     // The sweep's next look is due within its period (100 ms): at most a
                     // timeout late, as the caller's sleeps are short (20 ms).
                     return !m.posts_waiting() && m.cq_wait->trywait();
                   },
                   timeout);
}

void Endpoint::wake_sleeper() { impl_->cq_wait->wake(); }

size_t Endpoint::blocking_sleeps() const { return impl_->cq_wait->blocking_sleeps(); }

bool Endpoint::test(const Handle& h) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->drive();
  if (h->disagrees) throw MismatchError(h->error);
  if (!h->error.empty()) throw SystemError(h->error);
  return h->done();
}

void Endpoint::cancel(const Handle& h) { cancel(std::vector<Handle>{h}, Clock::now() + std::chrono::seconds(1)); }

void Endpoint::cancel(const std::vector<Handle>& hs, Clock::time_point give_up) {
  std::lock_guard<std::mutex> g(impl_->mu);
  std::vector<Request*> out;
  for (const Handle& h : hs) {
    Request& r = *h;
    if (r.done() && r.error.empty()) continue;
    for (size_t i = 0; i < r.posted; ++i) fi_cancel(&impl_->ep.get()->fid, &r.ctx[i].ctx);  // not found: completed
    if (r.rma && !r.is_send) {
      impl_->rma_targets.erase(r.ticket.id);
      r.mr.reset();  // closing the registration revokes the sender's remote access
    }
    if (r.error.empty()) r.error = "smddp: transfer cancelled";
    out.push_back(&r);
  }
  // libfabric cancels asynchronously, and an operation already matched (a message partly in, a
  // send partly out) cannot be cancelled at all: it goes on with the buffer until it reports. The
  // caller frees the buffers once this returns, so wait for every posted operation's report
  // (done, or an FI_ECANCELED error entry), as withdraw() does. Bounded, once for all of them:
  // over a link that went down a matched operation never reports, and the error the caller is
  // about to raise must not wait for it long; that is said, since its buffer may be written if
  // the link comes back while the endpoint lives. Between reads it sleeps a little: ranks that
  // failed together must not spin each other off the cores they need to say why.
  auto unreported = [&] {
    size_t n = 0;
    for (const Request* r : out) n += r->posted - r->completed - r->failed;
    return n;
  };
  for (impl_->drive(); unreported() > 0 && Clock::now() < give_up; impl_->drive())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (const size_t n = unreported(); n > 0) {
    SMDDP_LOG(WARN, impl_->rank) << "libfabric (" << impl_->provider << ") did not report " << n
                                 << " cancelled operation(s) in time; their buffers may still be written";
  }
  impl_->drive();  // forgets the requests that have all reported
}

void Endpoint::wait(const Handle& h, const OpInfo& op, const std::function<void()>* watch) {
  int idle = 0;
  auto next_watch = Clock::now() + std::chrono::milliseconds(20);
  while (!test(h)) {
    if (watch && *watch && Clock::now() >= next_watch) {
      (*watch)();
      next_watch = Clock::now() + std::chrono::milliseconds(20);
    }
    throw_if_late(h, op);
    if (++idle > 64) std::this_thread::yield();
  }
}

void Endpoint::throw_if_late(const Handle& h, const OpInfo& op) const {
  if (Clock::now() < op.deadline) return;
  const std::string peer = h->peer >= 0 ? "rank " + std::to_string(h->peer) : std::string("any rank");
  throw TimeoutError("smddp: " + op.describe() + ": timeout after " + std::to_string(op.timeout.count()) +
                         " ms waiting to " + (h->is_send ? "send to " : "receive from ") + peer + " over libfabric (" +
                         impl_->provider + ")" + fd_exhaustion_note(),
                     h->peer >= 0 ? std::vector<int>{h->peer} : std::vector<int>{});
}

}  // namespace smddp::ofi
