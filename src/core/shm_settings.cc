#include "core/shm_settings.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/config.h"
#include "smddp/errors.h"

namespace smddp::detail {

namespace {

// A size setting of the shared-memory segment, within 1 byte to 1 GiB: the segment's layout
// multiplies it by the ranks (a wrapped product overlaps regions) and rounds it up to pages or
// powers of two (a negative value made 0-byte slots, and a FIFO size whose doubling never ended).
size_t segment_size_setting(const char* name) {
  const int64_t v = config::get_int(name);
  constexpr int64_t kMax = int64_t{1} << 30;
  if (v < 1 || v > kMax)
    throw InvalidArgument(std::string("smddp: ") + name + "=" + config::get_string(name) +
                          " is outside [1, 1g] bytes");
  return static_cast<size_t>(v);
}

// Rounds the staged allreduce may run ahead of a late node-mate; each costs every rank two more
// staging slots. auto: one where the ranks outnumber the cores, where every wait is for a rank
// that may not be running (docs/performance.md); none with a core per rank, where the slack
// measured a few percent and the node's /dev/shm would hold half as many communicators.
int shm_ahead_setting(bool oversubscribed) {
  if (config::get_string("SMDDP_SHM_AHEAD") == "auto") return oversubscribed ? 1 : 0;
  const int64_t v = config::get_int("SMDDP_SHM_AHEAD");
  if (v < 0 || v > 7)
    throw InvalidArgument("smddp: SMDDP_SHM_AHEAD=" + config::get_string("SMDDP_SHM_AHEAD") +
                          " is out of range (0 to 7 rounds)");
  return static_cast<int>(v);
}

}  // namespace

// A rank rewrites its slot two rounds after its node-mates read it; while they still cache those
// lines, every store first takes them back from their caches, 4-5x the cost of a store to a line
// no other core holds (measured on this 2-core EPYC VM, 1 MiB of L2 a core). Rounds that each
// move more than a core's L2 have evicted them by then: with a core per rank, 1 MiB chunks made
// the staged allreduce, reduce_scatter and broadcast 1.4-3.6x faster than 256 KiB at 1-4 MiB,
// w=2. With more ranks than cores fewer, larger rounds pay besides (each a wait for a rank that
// may not be running): 20-45% at w=4 on 2 cores (docs/performance.md, "Rewriting lines a peer
// still caches"). The slots are 2 x ranks x chunk of /dev/shm per communicator, so with a core
// per rank the chunk halves from 1 MiB (down to the former 256 KiB) while ranks x chunk exceeds
// 4 MiB: at most 8 MiB of slots from 4 ranks up (16 with 8 ranks at 1 MiB, of Docker's 64), and
// a rank's round at 8 ranks still moves about a MiB. Where ranks outnumber cores the shared
// cores, not /dev/shm, are what a job runs short of first: 1 MiB.
size_t auto_chunk_bytes(bool oversubscribed, int local_ranks) {
  constexpr size_t KiB = 1024, MiB = 1024 * KiB;
  size_t chunk = MiB;
  if (oversubscribed) return chunk;
  const size_t w = static_cast<size_t>(std::max(local_ranks, 1));
  while (chunk > 256 * KiB && chunk * w > 4 * MiB) chunk /= 2;
  return chunk;
}

shm::GroupConfig shm_group_config(bool oversubscribed, bool let_peers_read, int local_ranks) {
  shm::GroupConfig c;
  c.let_peers_read = let_peers_read;
  c.take_rounds = config::get_bool("SMDDP_SHM_STEAL");
  c.slot_bytes = config::get_string("SMDDP_SHM_CHUNK") == "auto" ? auto_chunk_bytes(oversubscribed, local_ranks)
                                                                 : segment_size_setting("SMDDP_SHM_CHUNK");
  c.slot_parts = shm_ahead_setting(oversubscribed) + 1;
  c.fifo_bytes = segment_size_setting("SMDDP_SHM_FIFO");
  c.spin = static_cast<int>(config::get_int("SMDDP_SPIN"));
  c.move_off_shared_cpu = config::get_bool("SMDDP_MOVE_OFF_SHARED_CPU");
  // More ranks than cores: spinning only steals the time slice of the rank we wait for. That
  // counts the ranks of other nodes on this kernel too (network namespaces, containers): their
  // ranks are the ones a node's rank waits for between hosts, on the same cores.
  if (oversubscribed) {
    c.spin = std::min(c.spin, 64);
    c.yield_to_peers = true;
  }
  return c;
}

}  // namespace smddp::detail
