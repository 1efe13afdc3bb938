#include "core/config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include "smddp/errors.h"

namespace smddp::config {

const std::vector<Param>& params() {
  static const std::vector<Param> table = {
      {"SMDDP_DEBUG", "WARN", "Log level: WARN, INFO or TRACE (TRACE logs every collective)."},
      {"SMDDP_CHECK_CONSISTENCY", "1", "1: ranks compare each collective's kind, count, dtype, op and root before any data moves (in its first round inside a node; across nodes after one network exchange) and raise MismatchError on every rank when they differ. 0 only to measure its cost."},
      {"SMDDP_ALGO", "", "Force algorithms, e.g. 'allreduce:one_shot,allgather:direct'."},
      {"SMDDP_SHM_CHUNK", "auto", "Bytes each rank stages per pipeline step in shared memory; auto: 1m, halved down to 256k while a node's ranks, each with a CPU of its own, would stage more than 4m in all (1m up to 4 ranks, 512k for 5-8); 1m wherever the ranks on this kernel outnumber their CPUs. Smaller chunks rewrite slots while the peers still cache them, which costs more than the copy. Shared memory per communicator: 2 x ranks x this x (SMDDP_SHM_AHEAD + 1)."},
      {"SMDDP_SHM_AHEAD", "auto", "auto: 1 where the communicator's ranks on this kernel (of any node) outnumber the CPUs they may run on, else 0. Rounds (0-7) a rank's staged allreduce and reduce may run ahead of its slowest node-mate: a rank another process displaced from its core then delays its peers only once it is that many rounds behind. Each round costs every rank two more SMDDP_SHM_CHUNK slots of shared memory; 0: lock-step, one wait per chunk. Must be equal on a node's ranks."},
      {"SMDDP_SHM_STEAL", "1", "1: in a staged allreduce or reduce on host memory inside one node, a rank that has waited 50 us for a late node-mate does that rank's next round for it (its copies and reduction, through cross-memory attach), so a rank displaced from its core delays its peers less. 0: every rank does its own rounds. Ranks may differ."},
      {"SMDDP_SHM_FIFO", "256k", "Bytes of each point-to-point shared-memory FIFO (one per ordered rank pair)."},
      {"SMDDP_CUDA_WINDOW_MIN", "1M", "Smallest allreduce, allgather or reduce_scatter on GPU memory (bytes, all ranks' data) read from the peers' buffers through CUDA IPC instead of staged through shared memory."},
      {"SMDDP_HOST_WINDOW", "auto", "auto: on host memory inside one node of 2 ranks, each with a CPU of its own, allreduce of 1-16 MiB and allgather of 256 KiB-32 MiB (all ranks' data; off x86-64 also reduce_scatter of 1-16 MiB) read the peer's buffers by cross-memory attach (process_vm_readv: one copy, no staging), where that measured faster (docs/algorithms.md); ranks that cannot read each other's memory (seccomp, Yama, PID namespaces) stage instead. off: never (SMDDP_ALGO still can). any: the same sizes at any number of ranks with a CPU each (measured at 2 only)."},
      {"SMDDP_ONE_SHOT_MAX", "32k", "Largest allreduce (bytes) sent by the one-shot algorithm when not forced."},
      {"SMDDP_HIER_SLICE", "4m", "Bytes of the message per pipelined slice of the hierarchical algorithms across nodes. Must be equal on every rank (compared with each collective's arguments when SMDDP_CHECK_CONSISTENCY is on)."},
      {"SMDDP_HIER_SMALL_MAX", "64k", "Largest allreduce (bytes) across nodes sent by the two-round hier_small algorithm when not forced."},
      {"SMDDP_INLINE", "1", "1: run a collective on the calling thread when the engine is idle (lower latency). The PyTorch backend: 0 unless set."},
      {"SMDDP_ENGINE_DOZE_US", "1000", "For SMDDP_ENGINE_DOZE_WINDOW_US after an operation was queued, the idle engine thread sleeps this long at a time, and a collective queued meanwhile does not wake it: the engine leaves it to its caller's wait() until it is this old, then starts it, and later ones wake the engine again until a caller's wait() runs one. Point-to-point ops, CUDA collectives, expedite()/getFuture(), timed waits and waits that cannot run their collective themselves always wake it. 0: every queued operation wakes the engine thread."},
      {"SMDDP_ENGINE_DOZE_WINDOW_US", "20000", "How long after the last queued operation the idle engine thread dozes (SMDDP_ENGINE_DOZE_US) before it sleeps until woken (an idle communicator then uses no CPU)."},
      {"SMDDP_SHM_STORES", "auto", "How a rank stores into its staging slots (copies and reductions of 16 KiB or more). plain: ordinary stores. streaming: non-temporal stores (x86-64 only; an error elsewhere): they skip taking each line back from a peer core that still caches it (4-10x a copy where that core sits behind another last-level cache), and the peers then read the lines from memory. auto: per class of collective (allreduce, allgather, reduce_scatter, broadcast, reduce x message size 1-4 MiB, 4-16 MiB, ...), the 7th and 8th of every 32 of its collectives of 1 MiB or more run plain and streaming on every rank, each rank times its copies and reductions that write or read the slots, and the class takes streaming once plain costs 1.15x as much (the least of the last four probes of each), plain again below 1x; smaller collectives take their family's 1-4 MiB choice, the others plain; plain off x86-64. Ranks need not agree."},
      {"SMDDP_HOST_COPY", "auto", "auto: where memcpy is measured 3x slower with its destination 16 bytes past its source than 64 bytes past (glibc's rep movsb on AMD EPYC: 20x), a host-memory copy of 512 bytes to 4 MiB whose destination lies 1-63 bytes past its source modulo 4096 goes through a vector loop (AVX2, else SSE2), every other copy through memcpy; elsewhere (Intel, whose rep movsb has no such penalty and beats the loop) memcpy for every copy. libc: memcpy for every copy. avx2, sse2: the same copies through that loop (an error where the CPU lacks it, or off x86-64, when a communicator is made)."},
      {"SMDDP_REDUCE_ISA", "", "Force the CPU reduction kernels: avx512, avx2 or scalar (default: best the CPU has; scalar is the only one off x86-64). A value this build or CPU cannot run is an error at communicator creation."},
      {"SMDDP_NODE_ID", "", "Overrides which node this rank is on (default: host name + kernel boot id); ranks with equal ids share memory."},
      {"SMDDP_OFI_PROVIDER", "", "libfabric provider for traffic between nodes (default: efa, then tcp, tcp;ofi_rxm, sockets; with libfabric 1.x tcp;ofi_rxm before tcp; FI_PROVIDER also works)."},
      {"SMDDP_OFI_RAILS", "", "Domains (NICs) the ranks of a node spread over: comma-separated names, or all (default: every NIC for efa/verbs, the first interface for tcp)."},
      {"SMDDP_OFI_REGISTER", "auto", "auto: register buffers with libfabric where the provider asks (FI_MR_LOCAL); always: everywhere (tests the registration paths)."},
      {"SMDDP_OFI_WAIT", "auto", "How a wait on the network that outlasts a short spin waits (the engine's for sends and receives, a collective's for a late rank): fd: blocks on the completion queue's wait object where the provider has one; poll: polls (the engine every 50 us, a collective by yielding); auto: fd on tcp and tcp;ofi_rxm, poll elsewhere (efa, verbs: untried)."},
      {"SMDDP_OFI_MAX_MESSAGE", "", "Most bytes in one libfabric message; a transfer above it goes as several (chunks). Default: the provider's max_msg_size, at most 1 GiB; a value above that is lowered to it, one below 4k is an error. Smaller only to test the chunked path, or for a provider that overstates its limit. Must be equal on every rank (compared when the communicator is made)."},
      {"SMDDP_OFI_RMA", "auto", "Collective messages of at least this many bytes go between nodes by RMA write where the provider has it; off: tagged only; auto: 1m over native tcp, off over tcp;ofi_rxm (a failing connection mid-write crashes rxm) and elsewhere. Must be equal on every rank (compared when the communicator is made)."},
      {"SMDDP_CUDA_STAGING_PIECE", "16m", "Across nodes, an allreduce, allgather or reduce_scatter on GPU memory runs on page-locked host copies in pieces of at most this many bytes (all ranks' data): while one piece crosses the network the GPU copies the next in and the last out. Each piece is pipelined in SMDDP_HIER_SLICE slices of its own, so a piece of few slices loses that overlap. 0: the whole buffer at once, copies not overlapped; else at least 64k. Must be equal on every rank (how it cuts a collective is compared with its arguments when SMDDP_CHECK_CONSISTENCY is on)."},
      {"SMDDP_CUDA_NET_BOUNCE", "0", "1: across nodes, a collective on GPU memory the network cannot reach (no FI_HMEM) runs on the GPU (its copies and reduction kernels, the node's stages through the shared-memory slots), and only the messages between nodes pass through page-locked host buffers, copied on the GPU's stream (not yet run on a GPU, docs/gpu.md). 0: the whole collective runs on host copies of its buffers (SMDDP_CUDA_STAGING_PIECE). Must be equal on every rank (compared with each collective's arguments when SMDDP_CHECK_CONSISTENCY is on)."},
      {"SMDDP_CUDA_SMS", "8", "Most SMs (thread blocks) a reduction kernel of a CUDA collective launches with; the rest stay with the model's kernels. Logged per device at SMDDP_DEBUG=INFO."},
      {"SMDDP_CUDA_VECTOR_REDUCE", "0", "1: the CUDA reduction kernels load and store 16 bytes per thread where every operand sits at the same offset within 16 bytes (more bytes in flight on few SMs; not yet run on a GPU, docs/gpu.md); 0: one element per load, the kernel verified on an H100."},
      {"SMDDP_INTRA_OP_THREADS", "auto", "Python: torch's intra-op threads, set when the backend is created. auto: where OMP_NUM_THREADS is unset, LOCAL_WORLD_SIZE > 1 and torch's count is what it was at import smddp, a rank with more threads than its share of the node's CPUs (the union of its ranks' affinities) gets its share (torch's OpenMP pool otherwise spins on the cores the collectives need); keep: unchanged; N: N threads."},
      {"SMDDP_MOVE_OFF_SHARED_CPU", "1", "1: a waiting rank that finds the rank it waits for last ran on its own CPU moves its thread to another CPU of its affinity (narrowed, then restored at once) instead of spinning on; 0: it never changes a thread's affinity and sleeps instead."},
      {"SMDDP_SPIN", "20000", "Polls of a shared flag before a waiting rank sleeps until a peer arrives (with more of the communicator's ranks on this kernel than CPUs: 64 at most, then brief yields)."},
  };
  return table;
}

static const Param& find(const char* name) {
  for (const auto& p : params())
    if (std::string(p.name) == name) return p;
  throw std::logic_error(std::string("smddp: unregistered parameter ") + name);
}

std::string get_string(const char* name) {
  const Param& p = find(name);
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(p.default_value);
}

bool is_set(const char* name) {
  find(name);
  return std::getenv(name) != nullptr;
}

int64_t get_int(const char* name) {
  const std::string s = get_string(name);
  if (s.empty()) return 0;
  auto bad = [&](const char* why) {
    return InvalidArgument(std::string("smddp: ") + name + "='" + s + "' is not an integer" + why);
  };
  // Digits (decimal, 0x hex, 0 octal), then at most one k/m/g and nothing else; no overflow.
  if (!std::isdigit(static_cast<unsigned char>(s[0])) && s[0] != '-' && s[0] != '+') throw bad("");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (end == s.c_str()) throw bad("");
  if (errno == ERANGE) throw bad(" in range");
  int64_t mul = 1;
  if (*end) {
    switch (std::tolower(static_cast<unsigned char>(*end))) {
      case 'k': mul = int64_t{1} << 10; break;
      case 'm': mul = int64_t{1} << 20; break;
      case 'g': mul = int64_t{1} << 30; break;
      default: throw bad("");
    }
    if (end[1]) throw bad(" (one k, m or g may follow the number, nothing else)");
  }
  int64_t out = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(v), mul, &out)) throw bad(" in range");
  return out;
}

bool get_bool(const char* name) {
  std::string s = get_string(name);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s.empty() || s == "0" || s == "false" || s == "no" || s == "off") return false;
  // Anything else read as false: SMDDP_CHECK_CONSISTENCY=enable turned the check off.
  throw InvalidArgument(std::string("smddp: ") + name + "='" + get_string(name) +
                        "' is not a boolean (1, true, yes, on; 0, false, no, off)");
}

}  // namespace smddp::config
