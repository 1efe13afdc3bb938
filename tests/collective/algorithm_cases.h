// One case of a node algorithm, on any Device and memory: the inputs are written through the
// device (so "device memory" may be a GPU's), the algorithm runs, the outputs are read back the
// same way and every element is checked against a plain loop over the ranks' known inputs.
// Shared by the asynchronous test device (async_device_test.cc) and the GPU suite (tests/gpu), so
// both run the very same cases. `Arena` gives the buffers: alloc<T>(n) and reset().
#pragma once

#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/registry.h"
#include "algorithms/scratch_pool.h"
#include "collective/harness.h"

namespace smddp::testing {

inline float case_value(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 991)); }

// Runs `algo` once with `count` (elements per block, f32 sum) and checks every output element.
template <class Arena>
void run_algorithm_case(algorithms::Context& ctx, Arena& arena, const algorithms::Algorithm& algo, size_t count,
                        Report& rep) {
  using algorithms::CollKind;
  const int w = ctx.size(), me = ctx.rank(), root = 1 % w;
  const auto W = static_cast<size_t>(w);
  const std::string name = std::string(algorithms::to_string(algo.kind)) + ":" + algo.name + " on " +
                           ctx.dev.name() + " count " + std::to_string(count) + ": ";
  arena.reset();
  algorithms::CollArgs a;
  a.kind = algo.kind, a.count = count, a.dtype = DataType::f32, a.op = Reduction{ReduceOp::sum}, a.root = root;
  size_t in_n = count, out_n = count;
  switch (algo.kind) {
    case CollKind::allgather: case CollKind::gather: out_n = count * W; break;
    case CollKind::reduce_scatter: case CollKind::scatter: case CollKind::alltoall: in_n = count * W; break;
    default: break;
  }
  if (algo.kind == CollKind::alltoall) out_n = count * W;
  float* in = arena.template alloc<float>(in_n);
  float* out = arena.template alloc<float>(out_n);
  std::vector<float> host_in(in_n), host_out(out_n, -1);
  for (size_t i = 0; i < in_n; ++i) host_in[i] = case_value(me, i);
  if (algo.kind == CollKind::broadcast && me == root) std::copy(host_in.begin(), host_in.begin() + count, host_out.begin());
  ctx.dev.copy(in, host_in.data(), in_n * sizeof(float));
  ctx.dev.copy(out, host_out.data(), out_n * sizeof(float));
  ctx.dev.fence();
  for (int j = 0; j < w; ++j) {
    a.send_counts.push_back(count), a.recv_counts.push_back(count);
    a.send_displs.push_back(static_cast<size_t>(j) * count), a.recv_displs.push_back(static_cast<size_t>(j) * count);
  }
  a.send = in, a.recv = out;
  algo.run(ctx, a);
  ctx.dev.fence();  // what run_collective does before it reports completion
  ctx.dev.copy(host_out.data(), out, out_n * sizeof(float));
  ctx.dev.fence();
  auto sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < w; ++r) s += case_value(r, i);
    return s;
  };
  auto want = [&](size_t k) -> float {
    switch (algo.kind) {
      case CollKind::allreduce: return sum(k);
      case CollKind::reduce: return me == root ? sum(k) : -1;
      case CollKind::reduce_scatter: return sum(static_cast<size_t>(me) * count + k);
      case CollKind::allgather: return case_value(static_cast<int>(k / count), k % count);
      case CollKind::gather: return me == root ? case_value(static_cast<int>(k / count), k % count) : -1;
      case CollKind::broadcast: return case_value(root, k);
      case CollKind::scatter: return case_value(root, static_cast<size_t>(me) * count + k);
      case CollKind::alltoall:
        return case_value(static_cast<int>(k / count), static_cast<size_t>(me) * count + k % count);
      case CollKind::barrier: return -1;
    }
    return -1;
  };
  for (size_t k = 0; k < out_n; ++k) {
    // reduce: only the root's output is defined (the others' may be used as scratch).
    if (algo.kind == CollKind::reduce && me != root) break;
    if (host_out[k] != want(k)) {
      rep.fail(name + "element " + std::to_string(k) + " is " + std::to_string(host_out[k]) + ", expected " +
               std::to_string(want(k)));
      return;
    }
  }
}

// Every node algorithm of the registry at a few counts (by default one element; under a chunk;
// several chunks of a 4 KiB slot). Returns how many algorithms ran.
template <class Arena>
int run_every_node_algorithm(shm::Group& g, device::Device& dev, Arena& arena, device::PeerWindows* windows,
                             Report& rep, std::vector<size_t> counts = {1, 300, 2500}) {
  algorithms::ScratchPool scratch;
  int ran = 0;
  for (const auto& algo : algorithms::all()) {
    if (algo.scope != algorithms::Scope::node) continue;
    for (size_t count : counts) {
      OpInfo op;
      op.name = algorithms::to_string(algo.kind);
      op.rank = g.rank(), op.size = g.size(), op.timeout = std::chrono::seconds(60);
      op.deadline = Clock::now() + op.timeout;
      algorithms::Context ctx{g, dev, op, nullptr, nullptr, nullptr, &scratch, windows};
      run_algorithm_case(ctx, arena, algo, count, rep);
    }
    ++ran;
  }
  return ran;
}

}  // namespace smddp::testing
