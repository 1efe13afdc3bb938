#include "transport/ofi/endpoint.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/config.h"
#include "core/failure_record.h"
#include "core/logging.h"
#include "topology/pci.h"
#include "transport/ofi/endpoint_impl.h"
#include "transport/ofi/rails.h"

namespace smddp::ofi {

namespace {

// Where a rank's address record (or the reason it has none) is in the Store.
std::string address_key(int rank) { return "ofi/addr/" + std::to_string(rank); }

// A record another rank publishes at setup, or the reason it failed to.
std::vector<uint8_t> setup_record(Store& store, const std::string& key, int rank, int from,
                                  std::chrono::milliseconds timeout) {
  std::vector<uint8_t> v = store.get(key, timeout);
  if (auto why = failure_in(v))
    throw PeerSetupFailure("smddp: rank " + std::to_string(rank) + ": rank " + std::to_string(from) +
                           " failed to set up: " + *why);
  return v;
}

}  // namespace


namespace {
// The provider's entry for `domain`: where a domain has several addresses (tcp lists an
// interface once per address), the one that reaches furthest (rails.h: IPv4 first, link-local
// last: IPv6 link-local addresses need a scope to be reached, and reach no other host).
fi_info* entry_for(fi_info* list, const std::string& domain) {
  std::vector<fi_info*> entries;
  std::vector<std::string> subnets;
  for (fi_info* i = list; i; i = i->next) {
    if (!i->domain_attr->name || domain != i->domain_attr->name) continue;
    entries.push_back(i);
    subnets.push_back(i->fabric_attr->name ? i->fabric_attr->name : "");
  }
  return entries.empty() ? nullptr : entries[preferred_address(subnets)];
}
}  // namespace

Endpoint::Endpoint(Store& store, int rank, int size, int local_rank, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = rank;
  m.size = size;
  if (size >= (1 << kRankBits)) throw InvalidArgument("smddp: the libfabric transport supports up to 65535 ranks");
  m.heard_from.resize(static_cast<size_t>(size));
  m.cancel_gave_up_on.resize(static_cast<size_t>(size));
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
  if (!config::get_string("SMDDP_OFI_MAX_MESSAGE").empty()) {
    const int64_t want = config::get_int("SMDDP_OFI_MAX_MESSAGE");
    if (want < 4096)
      throw InvalidArgument("smddp: SMDDP_OFI_MAX_MESSAGE=" + config::get_string("SMDDP_OFI_MAX_MESSAGE") +
                            ": at least 4096 bytes");
    m.max_msg = std::min(m.max_msg, static_cast<size_t>(want));
  }
  check("fi_fabric", fi_fabric(info->fabric_attr, m.fabric.out(), nullptr));
  check("fi_domain", fi_domain(m.fabric.get(), info, m.domain.out(), nullptr));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 4096;
  cq_attr.wait_obj = wanted_wait_object(m.provider);
  int cq_rc = fi_cq_open(m.domain.get(), &cq_attr, m.cq.out(), nullptr);
  if (cq_rc != 0 && cq_attr.wait_obj != FI_WAIT_NONE) {  // a provider without wait objects
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
  const WireSettings settings{m.max_msg, m.rma_min};
  std::vector<uint8_t> record = name;
  append_wire_settings(record, settings);
  store.set(address_key(rank), record);
  m.addrs.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::vector<uint8_t> peer = setup_record(store, address_key(r), rank, r, timeout);
    if (auto problem = address_record_problem(peer.size(), record.size()); !problem.empty())
      throw SystemError("smddp: rank " + std::to_string(rank) + " cannot reach rank " + std::to_string(r) +
                        " over libfabric: " + problem);
    if (auto problem = wire_settings_problem(wire_settings_of(peer), settings); !problem.empty())
      throw InvalidArgument("smddp: rank " + std::to_string(rank) + " and rank " + std::to_string(r) +
                            " cannot exchange messages over libfabric: " + problem);
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

void Endpoint::publish_setup_failure(Store& store, int rank, const std::string& why) noexcept {
  const std::string key = address_key(rank);
  try {
    // Past its address the rank failed on a peer's record or setting, which every rank finds
    // for itself: overwriting the address would name this rank as the one that failed.
    if (store.check(key)) return;
    const std::vector<uint8_t> v = failure_record(why);
    if (rank == 0) store.set(kJobTokenKey, v);
    store.set(key, v);
  } catch (...) {  // the store itself failed: the caller's own error is the one to report
  }
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

size_t Endpoint::posts_refused() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->posts_refused;
}

size_t Endpoint::cancels_unreported() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->cancels_unreported;
}

size_t Endpoint::transfer_registrations() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->transfer_regs;
}

}  // namespace smddp::ofi
