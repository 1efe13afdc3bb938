// smddp_link_shaper: loss, delay and reordering on a namespace host's link where the kernel has
// no tc netem (this project's CI kernel has none: CONFIG_NET_SCH_NETEM is off, NFQUEUE is on).
// The fault tests route the host's outgoing packets to a netfilter queue
//   iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num N --queue-bypass
// and run this program in the host's namespace; it decides each packet as netem's
// "loss L% delay D J reorder R%" would: L% dropped, R% sent at once (ahead of the held ones),
// the rest held D +- J (uniform) and released in due order, so jittered packets also overtake
// each other. Verdicts are given out of order, which nfnetlink_queue allows.
//
//   smddp_link_shaper --queue N [--loss PCT] [--delay-us D] [--jitter-us J] [--reorder PCT]
//                     [--seconds S] [--stats FILE] [--seed X]
//
// It stops on SIGTERM/SIGINT or after S seconds (default 300: never outlives its test), accepts
// every packet it still holds, and writes one line of counts to FILE (and stdout):
//   seen=... dropped=... delayed=... sent_at_once=... overtaken=... unnotified=...
// `overtaken` counts packets released while one queued earlier was still held: reordering that
// really happened. The queue is fail-open (a full queue passes packets) and the rule bypasses
// the queue when no program listens, so a dead shaper never cuts the link.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

struct Settings {
  int queue = -1;
  double loss_pct = 0, reorder_pct = 0;
  long delay_us = 0, jitter_us = 0;
  long seconds = 300;
  unsigned seed = 1;
  std::string stats_path;
};

struct Counts {
  unsigned long seen = 0, dropped = 0, delayed = 0, sent_at_once = 0, overtaken = 0, unnotified = 0;
};

struct Held {
  Clock::time_point due;
  uint64_t arrival;  // order of arrival, to tell a release that overtakes an earlier packet
  uint32_t id;
  bool operator>(const Held& o) const { return due > o.due || (due == o.due && arrival > o.arrival); }
};

struct Shaper {
  Settings s;
  Counts n;
  std::mt19937_64 rng;
  std::uniform_real_distribution<double> pct{0.0, 100.0};
  nfq_q_handle* qh = nullptr;
  std::priority_queue<Held, std::vector<Held>, std::greater<>> held;
  std::set<uint64_t> held_arrivals;  // arrival numbers still held, oldest first
  uint64_t arrivals = 0;
  uint32_t next_id_ = 0;  // the id the next notification should carry (0: none seen yet)

  void accept(uint32_t id, uint64_t arrival) {
    if (!held_arrivals.empty() && *held_arrivals.begin() < arrival) ++n.overtaken;
    nfq_set_verdict(qh, id, NF_ACCEPT, 0, nullptr);
  }

  void on_packet(uint32_t id) {
    // The kernel numbers a queue's packets 1, 2, 3, ...: a gap is packets whose notification
    // was lost (ENOBUFS). They wait in the kernel until they get a verdict, and TCP does not
    // resend a segment still queued on its host: accept them now, or the connection stalls.
    if (next_id_ != 0 && id - next_id_ < 65536)  // else not a gap (ids wrapped, or a stray)
      for (uint32_t lost = next_id_; lost != id; ++lost) {
        ++n.unnotified;
        nfq_set_verdict(qh, lost, NF_ACCEPT, 0, nullptr);
      }
    next_id_ = id + 1;
    ++n.seen;
    const uint64_t arrival = arrivals++;
    if (pct(rng) < s.loss_pct) {
      ++n.dropped;
      nfq_set_verdict(qh, id, NF_DROP, 0, nullptr);
      return;
    }
    if (s.delay_us == 0 || pct(rng) < s.reorder_pct) {
      ++n.sent_at_once;
      accept(id, arrival);
      return;
    }
    long us = s.delay_us;
    if (s.jitter_us > 0) us += std::uniform_int_distribution<long>(-s.jitter_us, s.jitter_us)(rng);
    ++n.delayed;
    held.push({Clock::now() + std::chrono::microseconds(us < 0 ? 0 : us), arrival, id});
    held_arrivals.insert(arrival);
  }

  void release_due(Clock::time_point now, bool all) {
    while (!held.empty() && (all || held.top().due <= now)) {
      const Held h = held.top();
      held.pop();
      held_arrivals.erase(h.arrival);
      accept(h.id, h.arrival);
    }
  }
};

int on_queued(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph != nullptr) static_cast<Shaper*>(data)->on_packet(ntohl(ph->packet_id));
  return 0;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "smddp_link_shaper: %s\nusage: smddp_link_shaper --queue N [--loss PCT] [--delay-us D] "
               "[--jitter-us J] [--reorder PCT] [--seconds S] [--stats FILE] [--seed X]\n",
               why);
  std::exit(2);
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || d < 0) {
      if (a != "--stats") usage(("bad value for " + a + ": " + v).c_str());
    }
    if (a == "--queue") s.queue = static_cast<int>(d);
    else if (a == "--loss") s.loss_pct = d;
    else if (a == "--reorder") s.reorder_pct = d;
    else if (a == "--delay-us") s.delay_us = static_cast<long>(d);
    else if (a == "--jitter-us") s.jitter_us = static_cast<long>(d);
    else if (a == "--seconds") s.seconds = static_cast<long>(d);
    else if (a == "--seed") s.seed = static_cast<unsigned>(d);
    else if (a == "--stats") s.stats_path = v;
    else usage(("unknown option " + a).c_str());
  }
  if (s.queue < 0 || s.queue > 65535) usage("--queue N (0-65535) is required");
  if (s.loss_pct > 100 || s.reorder_pct > 100) usage("percentages are 0-100");
  if (s.jitter_us > s.delay_us) usage("--jitter-us cannot exceed --delay-us");
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Shaper sh;
  sh.s = parse(argc, argv);
  sh.rng.seed(sh.s.seed);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  nfq_handle* h = nfq_open();
  if (h == nullptr) { std::perror("smddp_link_shaper: nfq_open"); return 1; }
  sh.qh = nfq_create_queue(h, static_cast<uint16_t>(sh.s.queue), &on_queued, &sh);
  if (sh.qh == nullptr) { std::perror("smddp_link_shaper: nfq_create_queue"); nfq_close(h); return 1; }
  // Metadata only (a verdict needs the id, not the bytes); GSO packets whole (no segmentation
  // cost); fail-open so a full queue passes packets rather than dropping them.
  if (nfq_set_mode(sh.qh, NFQNL_COPY_META, 0) < 0) { std::perror("smddp_link_shaper: nfq_set_mode"); return 1; }
  nfq_set_queue_maxlen(sh.qh, 8192);
  const uint32_t flags = NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN;
  nfq_set_queue_flags(sh.qh, flags, flags);
  const int fd = nfq_fd(h);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
  std::printf("smddp_link_shaper: queue %d ready\n", sh.s.queue);
  std::fflush(stdout);

  const auto deadline = Clock::now() + std::chrono::seconds(sh.s.seconds);
  std::vector<char> buf(1 << 16);
  while (!g_stop && Clock::now() < deadline) {
    auto now = Clock::now();
    sh.release_due(now, false);
    // Sleep until the next release or a new packet, at most 50 ms (to see the deadline).
    long long wait_ns = 50'000'000;
    if (!sh.held.empty())
      wait_ns = std::clamp<long long>(std::chrono::nanoseconds(sh.held.top().due - now).count(), 0, wait_ns);
    timespec ts{};
    ts.tv_sec = wait_ns / 1'000'000'000;
    ts.tv_nsec = wait_ns % 1'000'000'000;
    pollfd p{fd, POLLIN, 0};
    if (ppoll(&p, 1, &ts, nullptr) > 0) {
      const ssize_t got = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
      if (got > 0) nfq_handle_packet(h, buf.data(), static_cast<int>(got));
      // ENOBUFS: notifications were lost; on_packet accepts those packets at the next id.
    }
  }
  sh.release_due(Clock::now(), true);
  nfq_destroy_queue(sh.qh);
  nfq_close(h);

  char line[256];
  std::snprintf(line, sizeof line, "seen=%lu dropped=%lu delayed=%lu sent_at_once=%lu overtaken=%lu unnotified=%lu\n",
                sh.n.seen, sh.n.dropped, sh.n.delayed, sh.n.sent_at_once, sh.n.overtaken, sh.n.unnotified);
  std::fputs(line, stdout);
  if (!sh.s.stats_path.empty()) {
    if (FILE* f = std::fopen(sh.s.stats_path.c_str(), "w")) {
      std::fputs(line, f);
      std::fclose(f);
    }
  }
  return 0;
}
