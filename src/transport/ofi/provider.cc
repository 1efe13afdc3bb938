#include "transport/ofi/provider.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/config.h"
#include "smddp/errors.h"
#include "transport/ofi/endpoint.h"
#include "transport/ofi/wire.h"

// libfabric 1.x and 2.x differ in a few spellings; they are settled here and nowhere else.
#define SMDDP_FI_API FI_VERSION(1, 9)
#ifdef FI_CONTEXT2
#define SMDDP_FI_MODE (FI_CONTEXT | FI_CONTEXT2)
#else
#define SMDDP_FI_MODE FI_CONTEXT
#endif

namespace smddp::ofi {

namespace {

InfoOwner hints_for(const char* provider, bool rma) {
  InfoOwner hints(fi_allocinfo());
  if (!hints.get()) throw SystemError("smddp: fi_allocinfo failed");
  fi_info* h = hints.get();
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_TAGGED | (rma ? FI_RMA : 0);
  h->mode = SMDDP_FI_MODE;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  if (provider) h->fabric_attr->prov_name = strdup(provider);  // freed with the hints
  return hints;
}

// Settings of libfabric's own that its providers read when they open an endpoint; a value the
// user set wins. rxm over tcp (tcp;ofi_rxm) has three ways to send a message: eager (up to its
// eager limit, 16 KiB), segmentation and reassembly (SAR, up to 8x that) and rendezvous (the
// receiver reads the sender's buffer by RMA).
// - SAR is off: libfabric 2.1's rxm loses a SAR message that arrives before its receive is
//   posted, now and then (a collective hangs until its timeout; 2 runs of 3 of a 3-rank
//   subgroup allgather of 64 KiB across two hosts, docs/reliability.md). Any limit at most the
//   eager limit turns it off; libfabric 1.17's rxm over tcp never uses SAR.
// - Eager as far as it goes: libfabric 1.17's tcp reports a rendezvous read that a failing
//   connection cuts short twice, the second time after freeing it (fixed upstream in 1.18:
//   "prov/tcp: Suspicion of bug where RX entry is freed twice"), and rxm dereferences that
//   report's null context: a link going down mid-message crashed the process as it closed its
//   endpoint (CrossNodeFaults.LinkDown..., about 1 run in 3). rxm's rendezvous by RMA write
//   (FI_OFI_RXM_USE_RNDV_WRITE) hung under our traffic. So the eager limit is the largest chunk:
//   1.17's tcp places every message straight into its posted receive (rxm's dynamic receive
//   buffers; an unexpected one is held whole until its receive is posted), no RMA read runs.
//   rxm from libfabric 1.20 on no longer reads that setting (its eager limit is its buffer
//   size), so there messages above 16 KiB go by rendezvous read, which 1.18 fixed.
// Measured on namespace hosts in docs/transport-between-nodes.md.
void configure_providers_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    ::setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(kMaxChunk).c_str(), /*overwrite=*/0);
    ::setenv("FI_OFI_RXM_SAR_LIMIT", "0", /*overwrite=*/0);
  });
}

}  // namespace

// The providers tried, in order, when none is forced. Over TCP: libfabric 1.17's tcp has
// reliable-datagram endpoints only as rxm layered on it (tcp;ofi_rxm). tcp has its own from
// 1.18 (the former "net" provider, merged into tcp); preferred from 2.x, the versions tested
// (2.1), where rxm is the worse choice: 2.1's rxm loses SAR messages (configure_providers_once)
// and keeps a domain open, with three fds of its progress, after a connection was cut
// mid-transfer (docs/reliability.md), neither of which the native endpoints do.
std::vector<std::string> default_providers() {
  if (FI_MAJOR(fi_version()) >= 2) return {"efa", "tcp", "tcp;ofi_rxm", "sockets"};
  return {"efa", "tcp;ofi_rxm", "tcp", "sockets"};
}

// rma: also RMA writes with remote completion data (at least 4 bytes of it), and injects big
// enough for a ticket.
InfoOwner getinfo(const char* provider, bool rma) {
  configure_providers_once();
  InfoOwner hints = hints_for(provider, rma);
  InfoOwner info;
  if (fi_getinfo(SMDDP_FI_API, nullptr, nullptr, 0, hints.get(), info.out()) != 0) return InfoOwner();
  if (rma && info.get() &&
      (info.get()->domain_attr->cq_data_size < 4 || info.get()->tx_attr->inject_size < sizeof(RmaTicket)))
    return InfoOwner();
  return info;
}

// libfabric's rxm over tcp msg endpoints (1.17 here, and its rxm to this day) crashes the
// receiving process when a connection fails while an RMA write into it is under way: tcp
// reports the cut write as a cancelled completion with no context, and rxm's error handler
// (rxm_handle_comp_error) reads a protocol state through that null pointer. A peer that dies,
// or a link that goes down, mid-write would take the receiver with it (SIGSEGV in fi_close or
// in progress), where tagged messages give an error naming the rank. docs/reliability.md.
bool rma_write_cut_crashes(const std::string& provider) {
  return provider.rfind("tcp", 0) == 0 && provider.find("ofi_rxm") != std::string::npos;
}

// Collective messages of at least this size go by RMA write (SMDDP_OFI_RMA; 0: never). "auto"
// is the measured setting per provider (docs/transport-between-nodes.md): 1 MiB over the native
// tcp provider; off over tcp;ofi_rxm (rma_write_cut_crashes) and elsewhere until measured there.
size_t rma_threshold(const std::string& provider) {
  const std::string v = config::get_string("SMDDP_OFI_RMA");
  if (v == "auto") return provider.rfind("tcp", 0) == 0 && !rma_write_cut_crashes(provider) ? size_t{1} << 20 : 0;
  if (v.empty() || v == "off" || v == "0") return 0;
  return static_cast<size_t>(std::max<int64_t>(1, config::get_int("SMDDP_OFI_RMA")));
}

std::string runtime_version() {
  uint32_t v = fi_version();
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

std::vector<std::string> rdm_providers() {
  std::vector<std::string> out;
  InfoOwner info = getinfo(nullptr);
  for (fi_info* i = info.get(); i; i = i->next) {
    std::string n = i->fabric_attr->prov_name;
    bool seen = false;
    for (auto& o : out) seen = seen || o == n;
    if (!seen) out.push_back(n);
  }
  return out;
}

}  // namespace smddp::ofi
