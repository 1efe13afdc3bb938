// smddp-perf: collective bandwidth/latency sweep with nccl-tests' columns.
//
//   smddp-perf -np 4 -c allreduce -b 8 -e 64M -f 2 -w 5 -n 20 -d f32 -o sum [-m cuda]
//
// `-m cuda` puts the buffers in GPU memory (rank r on GPU r % count; ranks may share one): the
// CUDA device layer and IPC windows of docs/gpu.md. Compare with nccl-tests' all_reduce_perf etc.
// on the same machine (same columns), or with torch_collectives.py --device cuda (nccl beside).
//
// Ranks: `-np N` forks N local processes; without it the torchrun-style variables RANK and
// WORLD_SIZE (or OMPI_COMM_WORLD_RANK/SIZE) are read and SMDDP_PERF_STORE names a shared
// directory for the FileStore. Every result is checked (#wrong must be 0). Sizes follow
// nccl-tests: the bytes of the collective's largest buffer; busbw applies nccl-tests' factors.

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/registry.h"
#include "core_to_core.h"
#include "fork_ranks.h"
#include "device/cuda.h"
#include "reduce/element_io.h"
#include "smddp/smddp.h"

namespace {

using namespace smddp;

struct Args {
  int np = 0;
  std::string coll = "allreduce";
  size_t min_bytes = 8, max_bytes = 64 << 20;
  double factor = 2;
  int warmup = 5, iters = 20;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  std::string algo;  // forced algorithm name for this collective
  bool check = true;
  bool cuda = false;  // -m cuda: buffers in GPU memory
  bool hog = false;   // -H 1: one busy process per CPU beside the ranks (with -np)
  // -i 1: allreduce in place, as torch's all_reduce and DDP's buckets run it: the output is the
  // input, rewritten by every call, so peers read lines another core just wrote.
  bool in_place = false;
};

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

DataType parse_dtype(const std::string& s) {
  for (int t = 0; t < kNumDataTypes; ++t)
    if (s == to_string(static_cast<DataType>(t))) return static_cast<DataType>(t);
  std::fprintf(stderr, "smddp-perf: unknown dtype %s\n", s.c_str());
  std::exit(2);
}

ReduceOp parse_op(const std::string& s) {
  for (int o = 0; o < kNumReduceOps; ++o)
    if (s == to_string(static_cast<ReduceOp>(o))) return static_cast<ReduceOp>(o);
  std::fprintf(stderr, "smddp-perf: unknown op %s\n", s.c_str());
  std::exit(2);
}

void usage() {
  std::puts(
      "smddp-perf [-np N] [-c allreduce|allgather|reduce_scatter|broadcast|alltoall] [-b MIN] [-e MAX]\n"
      "           [-f FACTOR] [-w WARMUP] [-n ITERS] [-d f32|f64|f16|bf16|i8|u8|i32|i64|bool] [-o sum|prod|min|max|avg]\n"
      "           [-a ALGORITHM] [-k 0|1 (check results)] [-m host|cuda (where the buffers are)]\n"
      "           [-H 0|1 (with -np: one busy process per CPU beside the ranks, as dataloader workers)]\n"
      "           [-i 0|1 (allreduce in place, as torch runs it)]");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) { usage(); std::exit(2); }
      return argv[++i];
    };
    if (k == "-np") a.np = std::atoi(val());
    else if (k == "-c") a.coll = val();
    else if (k == "-b") a.min_bytes = parse_size(val());
    else if (k == "-e") a.max_bytes = parse_size(val());
    else if (k == "-f") a.factor = std::atof(val());
    else if (k == "-w") a.warmup = std::atoi(val());
    else if (k == "-n") a.iters = std::atoi(val());
    else if (k == "-d") a.dtype = parse_dtype(val());
    else if (k == "-o") a.op = parse_op(val());
    else if (k == "-a") a.algo = val();
    else if (k == "-k") a.check = std::atoi(val()) != 0;
    else if (k == "-H") a.hog = std::atoi(val()) != 0;
    else if (k == "-i") a.in_place = std::atoi(val()) != 0;
    else if (k == "-m") {
      const std::string m = val();
      if (m != "host" && m != "cuda") { usage(); std::exit(2); }
      a.cuda = m == "cuda";
    }
    else { usage(); std::exit(k == "-h" || k == "--help" ? 0 : 2); }
  }
  if (a.in_place && a.coll != "allreduce") {
    std::fprintf(stderr, "smddp-perf: -i 1 (in place) is for allreduce, not %s\n", a.coll.c_str());
    std::exit(2);
  }
  return a;
}

// Value rank r puts at element i: small integers, exact in every dtype for sums up to 64 ranks.
double value(int r, size_t i) { return static_cast<double>((r * 3 + i) % 7) - 3; }

void put(void* p, size_t i, DataType t, double v);

// The CPUs this process may run on (a container's or a job's cpuset); ranks it forks inherit them.
int usable_cpus() {
  cpu_set_t usable;
  return sched_getaffinity(0, sizeof usable, &usable) == 0 ? CPU_COUNT(&usable) : 1;
}
double get(const void* p, size_t i, DataType t);

struct Shape {
  size_t count;      // elements per rank-buffer unit (nccl-tests "count")
  size_t in_elems, out_elems;
  double bus_factor;
};

Shape shape_of(const std::string& coll, size_t bytes, size_t es, int w) {
  const auto W = static_cast<size_t>(w);
  const double n = w;
  if (coll == "allreduce") { size_t c = bytes / es; return {c, c, c, 2 * (n - 1) / n}; }
  if (coll == "broadcast") { size_t c = bytes / es; return {c, c, c, 1}; }
  size_t c = bytes / es / W;  // per-rank block
  if (coll == "allgather") return {c, c, c * W, (n - 1) / n};
  if (coll == "reduce_scatter") return {c, c * W, c, (n - 1) / n};
  if (coll == "alltoall") return {c, c * W, c * W, (n - 1) / n};
  std::fprintf(stderr, "smddp-perf: unknown collective %s\n", coll.c_str());
  std::exit(2);
}

int run_rank(const Args& a, int rank, int world, std::shared_ptr<Store> store) {
  Options o;
  if (!a.algo.empty()) o.algorithms = a.coll + ":" + a.algo;
  o.timeout = std::chrono::minutes(5);
  Communicator comm(store, rank, world, o);
  const size_t es = dtype_size(a.dtype);
  // -m cuda: device buffers beside the host images the values are written to and checked in.
  std::unique_ptr<device::Device> gpu;
  Memory where;
  if (a.cuda) {
    std::string why;
    if (!device::cuda_usable(&why)) {
      std::fprintf(stderr, "smddp-perf: -m cuda: %s\n", why.c_str());
      return 2;
    }
    const int ordinal = rank % device::cuda_device_count();
    gpu = device::cuda_device(ordinal);
    where = Memory::cuda(ordinal);
  }
  struct DeviceBuffer {
    void* p = nullptr;
    ~DeviceBuffer() { device::cuda_free(p); }
  };
  if (rank == 0) {
    std::printf("# smddp-perf %s: %s, %d ranks, dtype %s, op %s, warmup %d, iters %d, %s memory%s%s%s%s\n", version(),
                a.coll.c_str(), world, to_string(a.dtype), to_string(a.op), a.warmup, a.iters,
                a.cuda ? "cuda" : "host", a.algo.empty() ? "" : ", algorithm ", a.algo.c_str(),
                a.hog ? ", one busy process per CPU beside the ranks" : "", a.in_place ? ", in place" : "");
    std::printf("#%12s %12s %6s %6s %6s %12s %10s %10s %7s  %-12s %s\n", "size(B)", "count", "type", "redop", "root",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "algorithm", "c2c(ns)");
  }
  long total_wrong = 0;
  long mine_wrong = 0;  // this rank's own, counted without the library
  // min, min*f, ... and always max itself (so a sweep "to 64M" ends at 64 MiB).
  for (size_t bytes = a.min_bytes; bytes <= a.max_bytes;
       bytes = bytes == a.max_bytes ? a.max_bytes + 1
                                    : std::min(a.max_bytes, std::max(bytes + 1, static_cast<size_t>(
                                                                                    static_cast<double>(bytes) * a.factor)))) {
    Shape s = shape_of(a.coll, bytes, es, world);
    if (s.count == 0) continue;
    std::vector<uint64_t> in((s.in_elems * es + 7) / 8 + 1), out((s.out_elems * es + 7) / 8 + 1);
    DeviceBuffer din, dout;
    if (gpu) din.p = device::cuda_malloc(in.size() * 8), dout.p = device::cuda_malloc(out.size() * 8);
    void* pin = gpu ? din.p : in.data();
    void* pout = a.in_place ? pin : gpu ? dout.p : out.data();
    auto fill = [&] {
      for (size_t i = 0; i < s.in_elems; ++i) put(in.data(), i, a.dtype, value(rank, i));
      if (gpu) gpu->copy(din.p, in.data(), in.size() * 8), gpu->fence();
    };
    auto run_once = [&]() -> Work {
      if (a.coll == "allreduce") return comm.allreduce(pin, pout, s.count, a.dtype, a.op, where);
      if (a.coll == "allgather") return comm.allgather(pin, pout, s.count, a.dtype, where);
      if (a.coll == "reduce_scatter") return comm.reduce_scatter(pin, pout, s.count, a.dtype, a.op, where);
      if (a.coll == "broadcast") return comm.broadcast(rank == 0 ? pin : pout, s.count, a.dtype, 0, where);
      return comm.alltoall(pin, pout, s.count, a.dtype, where);
    };
    fill();
    for (int i = 0; i < a.warmup; ++i) run_once().wait();
    comm.barrier().wait();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a.iters; ++i) run_once().wait();
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / a.iters;
    // The machine's state during this row (core_to_core.h); the others wait meanwhile.
    const double c2c = rank == 0 ? bench::core_to_core_ns() : 0;
    // Slowest rank's time, as the reported time.
    double t_max = us;
    comm.allreduce(&us, &t_max, 1, DataType::f64, ReduceOp::max).wait();
    long wrong = 0;
    if (a.check) {
      fill();
      std::fill(out.begin(), out.end(), 0);
      if (gpu) gpu->copy(dout.p, out.data(), out.size() * 8), gpu->fence();
      run_once().wait();
      if (gpu) {  // the result back into the host image it is checked in
        const bool root_buf = a.in_place || (a.coll == "broadcast" && rank == 0);
        gpu->copy(root_buf ? in.data() : out.data(), root_buf ? din.p : dout.p, (root_buf ? in : out).size() * 8);
        gpu->fence();
      }
      const void* res = a.in_place || (a.coll == "broadcast" && rank == 0) ? in.data() : out.data();
      for (size_t i = 0; i < s.out_elems; ++i) {
        double want = 0;
        if (a.coll == "allreduce" || a.coll == "reduce_scatter") {
          const size_t idx = a.coll == "reduce_scatter" ? static_cast<size_t>(rank) * s.count + i : i;
          for (int r = 0; r < world; ++r) {
            double v = value(r, idx);
            if (r == 0) want = v;
            else if (a.op == ReduceOp::max) want = std::max(want, v);
            else if (a.op == ReduceOp::min) want = std::min(want, v);
            else if (a.op == ReduceOp::prod) want *= v;
            else want += v;
          }
          if (a.op == ReduceOp::avg) want = is_floating(a.dtype) ? want / world : std::trunc(want / world);
        } else if (a.coll == "allgather") {
          want = value(static_cast<int>(i / s.count), i % s.count);
        } else if (a.coll == "broadcast") {
          want = value(0, i);
        } else {  // alltoall: block j came from rank j's block `rank`
          want = value(static_cast<int>(i / s.count), static_cast<size_t>(rank) * s.count + i % s.count);
        }
        double tmp_store[2] = {0, 0};
        put(tmp_store, 0, a.dtype, want);  // compare in the dtype's own precision
        const double got = get(res, i, a.dtype), exp = get(tmp_store, 0, a.dtype);
        if (std::fabs(got - exp) > (is_floating(a.dtype) ? 1e-2 * std::max(1.0, std::fabs(exp)) : 0)) ++wrong;
      }
      // Every rank's own count decides its exit status (fork_ranks.h fails the run on any rank's);
      // the sum, through the library under test, is only what rank 0 prints.
      mine_wrong += wrong;
      long wrong_all = 0;
      comm.allreduce(&wrong, &wrong_all, 1, DataType::i64, ReduceOp::sum).wait();
      wrong = wrong_all;
    }
    total_wrong += wrong;
    if (rank == 0) {
      const double algbw = static_cast<double>(bytes) / t_max / 1e3;
      const auto kind = a.coll == "allreduce" ? algorithms::CollKind::allreduce
                        : a.coll == "allgather" ? algorithms::CollKind::allgather
                        : a.coll == "reduce_scatter" ? algorithms::CollKind::reduce_scatter
                        : a.coll == "broadcast" ? algorithms::CollKind::broadcast : algorithms::CollKind::alltoall;
      // The selector's choice for ranks this program forked (-np) on one node: the communicator
      // asks it with own_cpus when the ranks have a CPU each (algorithm_for), and forked ranks
      // share this process's CPUs. A launcher's ranks (bound to cores, maybe) and ranks across
      // nodes (SMDDP_NODE_ID) depend on the topology, which SMDDP_DEBUG=TRACE logs per collective.
      const char* algo = !a.algo.empty() ? a.algo.c_str()
                         : std::getenv("SMDDP_NODE_ID") || a.np == 0
                             ? "per-topology"
                             : algorithms::select(kind, bytes, world, {}, nullptr, a.cuda, world <= usable_cpus()).name;
      std::printf(" %12zu %12zu %6s %6s %6d %12.3f %10.3f %10.3f %7ld  %-12s %.0f\n", bytes, s.count,
                  to_string(a.dtype), a.coll == "allreduce" || a.coll == "reduce_scatter" ? to_string(a.op) : "none",
                  a.coll == "broadcast" ? 0 : -1, t_max, algbw, algbw * s.bus_factor, wrong, algo, c2c);
      std::fflush(stdout);
    }
  }
  if (rank == 0) std::printf("# total #wrong: %ld\n", total_wrong);
  if (mine_wrong != 0) std::fprintf(stderr, "smddp-perf: rank %d: %ld wrong elements\n", rank, mine_wrong);
  return total_wrong == 0 && mine_wrong == 0 ? 0 : 1;
}

void put(void* p, size_t i, DataType t, double v) { reduce::store_element(p, i, t, v); }
double get(const void* p, size_t i, DataType t) { return reduce::load_element(p, i, t); }

int env_int(const char* a, const char* b, int def) {
  if (const char* v = std::getenv(a)) return std::atoi(v);
  if (const char* v = std::getenv(b)) return std::atoi(v);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (a.np > 0) {
    bench::BusyProcesses hogs(a.hog ? usable_cpus() : 0);
    return bench::run_forked_ranks(a.np, "smddp-perf", [&](int rank, const std::string& dir) {
      return run_rank(a, rank, a.np, std::make_shared<FileStore>(dir + "/store"));
    });
  }
  if (a.hog) {
    std::fprintf(stderr, "smddp-perf: -H needs -np (the launcher's ranks are not ours to sit beside)\n");
    return 2;
  }
  const int rank = env_int("RANK", "OMPI_COMM_WORLD_RANK", 0);
  const int world = env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
  const char* dir = std::getenv("SMDDP_PERF_STORE");
  if (world > 1 && !dir) {
    std::fprintf(stderr, "smddp-perf: set SMDDP_PERF_STORE to a directory shared by all ranks, or use -np N\n");
    return 2;
  }
  try {
    return run_rank(a, rank, world, std::make_shared<FileStore>(dir ? dir : "/tmp/smddp-perf-single"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smddp-perf rank %d: %s\n", rank, e.what());
    return 1;
  }
}
