// The endpoint's progress: reading completions for callers, the waits of collectives and of the
// engine (completion_wait.h), and cancelling what a failed operation posted.
#include <algorithm>
#include <thread>

#include "core/fd_limit.h"
#include "core/logging.h"
#include "transport/ofi/endpoint_impl.h"

namespace smddp::ofi {

bool Endpoint::progress() {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->drive();
  return !impl_->inflight.empty();
}

bool Endpoint::waits_block() const { return impl_->cq_wait->blocks(); }

void Endpoint::sleep_until_news(const std::function<bool()>& ready, std::chrono::microseconds timeout) {
  Impl& m = *impl_;
  size_t read_before = 0;
  {
    std::lock_guard<std::mutex> g(m.mu);
    read_before = m.completions_read;
  }
  m.cq_wait->sleep(ready,
                   [&m, read_before] {
                     std::lock_guard<std::mutex> g(m.mu);
                     // ready() read completions: one may have finished an op it had polled
                     // already (several ops, each test() reading the whole queue), which no fd
                     // would announce; the caller polls again instead. The sweep's next look is
                     // due within its period (100 ms): at most a sleep's timeout late.
                     return m.completions_read == read_before && !m.posts_waiting() && m.cq_wait->trywait();
                   },
                   timeout);
}

void Endpoint::wake_sleeper() { impl_->cq_wait->wake(); }

bool Endpoint::Impl::done_now(const Handle& h) {
  std::lock_guard<std::mutex> g(mu);
  drive();
  return h->done();  // (its error, if any, is thrown by the caller's next test())
}

bool Endpoint::test(const Handle& h) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->drive();
  if (h->disagrees) throw MismatchError(h->error);
  if (!h->error.empty()) throw SystemError(h->error);
  return h->done();
}

void Endpoint::cancel(const Handle& h) { cancel(std::vector<Handle>{h}, Clock::now() + std::chrono::seconds(1)); }

void Endpoint::cancel(const std::vector<Handle>& hs, Clock::time_point give_up) {
  std::unique_lock<std::mutex> g(impl_->mu);
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
  // Once a cancel gave up so on a peer's transfers, the next cancels whose every unreported
  // transfer is with such a peer, made before that give-up, wait 10 ms at most while nothing was
  // heard from the peer since (no data, no error but a cancellation's report): ops that fail one
  // after another (a destruction or an abort failing each send and receive in flight, each
  // cancelling its own) would otherwise wait a budget each for reports that most likely will not
  // come either, N seconds for N of them. A transfer with a peer heard from meanwhile, with any
  // rank, or made since, keeps the whole budget, and so does the wait once such a peer is heard
  // from during it. (A live peer's one slow chunk, as large as SMDDP_OFI_MAX_MESSAGE, is not
  // heard from until it ends: made before the give-up, its cancel gets the 10 ms too.)
  constexpr auto kAfterGivingUp = std::chrono::milliseconds(10);
  Impl& m = *impl_;
  auto unreported_of = [](const Request* r) { return r->posted - r->completed - r->failed; };
  auto silent_since_giving_up = [&] {
    for (const Request* r : out) {
      if (unreported_of(r) == 0) continue;
      if (r->peer < 0 || r->peer >= m.size) return false;
      const auto p = static_cast<size_t>(r->peer);
      const auto& mark = m.cancel_gave_up_on[p];
      if (!mark || r->made > mark->made || m.heard_from[p] != mark->heard) return false;
    }
    return true;
  };
  auto unreported = [&] {
    size_t n = 0;
    for (const Request* r : out) n += unreported_of(r);
    return n;
  };
  const Clock::time_point short_give_up = std::min(give_up, Clock::now() + kAfterGivingUp);
  auto deadline = [&] { return silent_since_giving_up() ? short_give_up : give_up; };
  // The lock is let go for the sleeps: another thread's transfers on this endpoint (a send or
  // receive beside the failing collective) must not stall for the whole budget. `hs` holds the
  // requests meanwhile; whoever drives may complete them, which the next look counts.
  for (m.drive(); unreported() > 0 && Clock::now() < deadline(); m.drive()) {
    g.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    g.lock();
  }
  if (const size_t n = unreported(); n > 0) {
    m.cancels_unreported += n;
    const uint64_t made = requests_made().load(std::memory_order_relaxed);
    for (const Request* r : out)
      if (unreported_of(r) > 0 && r->peer >= 0 && r->peer < m.size)
        m.cancel_gave_up_on[static_cast<size_t>(r->peer)] = Impl::GaveUp{m.heard_from[static_cast<size_t>(r->peer)], made};
    SMDDP_LOG(WARN, impl_->rank) << "libfabric (" << impl_->provider << ") did not report " << n
                                 << " cancelled operation(s) in time; their buffers may still be written";
  }
  impl_->drive();  // forgets the requests that have all reported
}

void Endpoint::wait(const Handle& h, const OpInfo& op, const std::function<void()>* watch,
                    const std::function<bool()>* beside) {
  // Spin, then yield: most transfers of a collective land within that. A longer wait (a peer
  // that is late: a straggler, a rank still computing) blocks on the completion queue where it
  // has a wait object, until news, the next watch or the deadline, instead of yielding a core
  // away for as long as it lasts. Without one it yields on (efa: not measured with sleeps).
  constexpr int kSpins = 64, kYields = 256;
  int idle = 0;
  auto next_watch = Clock::now() + std::chrono::milliseconds(20);
  while (!test(h)) {
    auto now = Clock::now();
    if (now >= next_watch) {
      if (watch && *watch) {
        (*watch)();
        now = Clock::now();
      }
      next_watch = now + std::chrono::milliseconds(20);
    }
    throw_if_late(h, op);
    if (idle < kSpins + kYields) {
      if (++idle > kSpins) std::this_thread::yield();
      continue;
    }
    if (beside && *beside && (*beside)()) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    if (!waits_block()) {
      std::this_thread::yield();
      continue;
    }
    const auto until = std::min(next_watch, op.deadline);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(until - now);
    // Polled once more, with the sleeper counted: a send submitted beside the collective after
    // the poll above woke no one yet (wake_sleeper() writes only to a counted sleeper), and
    // would otherwise wait out the whole sleep (up to the next watch, 20 ms).
    sleep_until_news([&] { return impl_->done_now(h) || (beside && *beside && (*beside)()); },
                     std::max(us, std::chrono::microseconds(1)));
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
