// The direct-exchange algorithms over the network, one per collective, for communicators that
// span nodes: every rank talks to every other over libfabric (ranks of one node over loopback).
// Correct for any topology and any rank counts; the hierarchical allreduce (allreduce_hier.cc)
// is what makes the common case fast. Reductions combine in rank order (0..G-1) at a single
// owner, so every rank gets the same bits. allreduce's scratch is bounded (messages go in
// slices); reduce_scatter's is not: its owner receives every rank's block at once (G x count),
// as alltoall in place copies its whole send extent aside.
#include <algorithm>
#include <array>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/net_exchange.h"
#include "algorithms/scratch_pool.h"
#include "core/config.h"
#include "patterns/partition.h"
#include "smddp/errors.h"

namespace smddp::algorithms {

namespace {

constexpr size_t kSliceBytes = size_t{4} << 20;  // per block and slice

struct Ranks {
  int me, size;
};
Ranks global(const Context& ctx) { return {ctx.topo->rank, ctx.topo->size}; }

// Rank `me` owns block `mine` (elements [mine.begin, mine.end()) of each rank's `send`); the
// others send it their copy, the owner reduces all of them in rank order into `dst`. The copies
// land in the communicator's scratch (scratch_pool.h), not in a buffer of this call: on an
// asynchronous device the reduction reads them after this returns.
void reduce_at_owner(Context& ctx, NetExchange& x, const void* send, void* dst, const std::vector<patterns::Range>& blocks,
                     DataType t, Reduction op, int divisor, uint32_t step) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(t);
  const auto& mine = blocks[static_cast<size_t>(me)];
  std::byte* scratch = scratch_buffer(ctx, 0, mine.count * es * static_cast<size_t>(G));
  std::vector<const void*> srcs(static_cast<size_t>(G));
  for (int j = 0; j < G; ++j) {
    if (j == me) {
      srcs[static_cast<size_t>(j)] = at(send, mine.begin, es);
      continue;
    }
    std::byte* tmp = scratch + static_cast<size_t>(j) * mine.count * es;
    x.recv(j, tmp, mine.count * es, step);
    srcs[static_cast<size_t>(j)] = tmp;
    const auto& theirs = blocks[static_cast<size_t>(j)];
    x.send(j, at(send, theirs.begin, es), theirs.count * es, step);
  }
  x.wait();
  ctx.dev.reduce({dst, srcs.data(), G, mine.count, t, op, divisor});
}

}  // namespace

void allreduce_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  const size_t slice = std::max<size_t>(1, kSliceBytes / es) * static_cast<size_t>(G);
  NetExchange x(ctx);
  uint32_t step = 0;
  for (size_t c = 0; c < patterns::num_chunks(a.count, slice); ++c) {
    const auto s = patterns::chunk_at(a.count, slice, c);
    std::vector<patterns::Range> blocks;
    for (int j = 0; j < G; ++j) {
      auto b = patterns::block(s.count, G, j);
      blocks.push_back({s.begin + b.begin, b.count});
    }
    const auto& mine = blocks[static_cast<size_t>(me)];
    reduce_at_owner(ctx, x, a.send, at(a.recv, mine.begin, es), blocks, a.dtype, a.op, G, step++);
    for (int j = 0; j < G; ++j) {  // every owner sends its reduced block to everyone
      if (j == me) continue;
      x.send(j, at(a.recv, mine.begin, es), mine.count * es, step);
      x.recv(j, at(a.recv, blocks[static_cast<size_t>(j)].begin, es), blocks[static_cast<size_t>(j)].count * es, step);
    }
    x.wait();
    ++step;
  }
}

void reduce_scatter_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  NetExchange x(ctx);
  std::vector<patterns::Range> blocks;
  for (int j = 0; j < G; ++j) blocks.push_back({static_cast<size_t>(j) * a.count, a.count});
  reduce_at_owner(ctx, x, a.send, a.recv, blocks, a.dtype, a.op, G, 0);
}

void reduce_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  const size_t slice = std::max<size_t>(1, kSliceBytes / es);
  NetExchange x(ctx);
  std::vector<const void*> srcs(static_cast<size_t>(G));
  uint32_t step = 0;
  for (size_t c = 0; c < patterns::num_chunks(a.count, slice); ++c, ++step) {
    const auto s = patterns::chunk_at(a.count, slice, c);
    if (me != a.root) {
      if (c == 0) x.await_ready(a.root);  // the root is in this reduce (flow control)
      x.wait();
      x.send(a.root, at(a.send, s.begin, es), s.count * es, step);
      x.wait();
      continue;
    }
    std::byte* scratch = scratch_buffer(ctx, 0, s.count * es * static_cast<size_t>(G));
    for (int j = 0; j < G; ++j) {
      if (j == me) {
        srcs[static_cast<size_t>(j)] = at(a.send, s.begin, es);
        continue;
      }
      std::byte* tmp = scratch + static_cast<size_t>(j) * s.count * es;
      x.recv(j, tmp, s.count * es, step);
      if (c == 0) x.ready(j);
      srcs[static_cast<size_t>(j)] = tmp;
    }
    x.wait();
    ctx.dev.reduce({at(a.recv, s.begin, es), srcs.data(), G, s.count, a.dtype, a.op, G});
  }
}

void allgather_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  NetExchange x(ctx);
  for (int j = 0; j < G; ++j) {
    if (j == me) continue;
    x.send(j, a.send, a.count * es, 0);
    x.recv(j, at(a.recv, static_cast<size_t>(j) * a.count, es), a.count * es, 0);
  }
  ctx.dev.copy(at(a.recv, static_cast<size_t>(me) * a.count, es), a.send, a.count * es);
  x.wait();
}

// The one-way collectives (broadcast, scatter, reduce, gather) start with the receivers' ready
// tokens (NetExchange::ready): the sending side waits for them before its data goes out.
void await_all_ready(NetExchange& x, int me, int G) {
  for (int j = 0; j < G; ++j)
    if (j != me) x.await_ready(j);
  x.wait();
}

void broadcast_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  NetExchange x(ctx);
  const size_t bytes = a.count * dtype_size(a.dtype);
  if (me == a.root) {
    await_all_ready(x, me, G);
    for (int j = 0; j < G; ++j)
      if (j != me) x.send(j, a.recv, bytes, 0);
  } else {
    x.recv(a.root, a.recv, bytes, 0);
    x.ready(a.root);
  }
  x.wait();
}

void gather_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  NetExchange x(ctx);
  if (me != a.root) {
    x.await_ready(a.root);
    x.wait();
    x.send(a.root, a.send, a.count * es, 0);
  } else {
    for (int j = 0; j < G; ++j) {
      if (j == me) {
        ctx.dev.copy(at(a.recv, static_cast<size_t>(j) * a.count, es), a.send, a.count * es);
        continue;
      }
      x.recv(j, at(a.recv, static_cast<size_t>(j) * a.count, es), a.count * es, 0);
      x.ready(j);
    }
  }
  x.wait();
}

void scatter_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  NetExchange x(ctx);
  if (me != a.root) {
    x.recv(a.root, a.recv, a.count * es, 0);
    x.ready(a.root);
  } else {
    await_all_ready(x, me, G);
    for (int j = 0; j < G; ++j) {
      if (j == me) ctx.dev.copy(a.recv, at(a.send, static_cast<size_t>(j) * a.count, es), a.count * es);
      else x.send(j, at(a.send, static_cast<size_t>(j) * a.count, es), a.count * es, 0);
    }
  }
  x.wait();
}

// Per-peer counts (alltoallv) are not in the fingerprint: before any data moves, every pair of
// ranks swaps what each sends the other and expects from it, so both ranks of a pair that
// disagree raise the same error (the others learn of it through the abort).
void check_alltoall_counts(Context& ctx, NetExchange& x, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  std::vector<std::array<uint64_t, 2>> mine(static_cast<size_t>(G)), theirs(static_cast<size_t>(G));
  for (int j = 0; j < G; ++j) {
    if (j == me) continue;
    const auto J = static_cast<size_t>(j);
    mine[J] = {a.send_counts[J], a.recv_counts[J]};
    x.recv(j, theirs[J].data(), sizeof theirs[J], 1);
    x.send(j, mine[J].data(), sizeof mine[J], 1);
  }
  x.wait();
  for (int j = 0; j < G; ++j) {
    if (j == me) continue;
    const auto J = static_cast<size_t>(j);
    // The pair's two directions, lower sender first, so both ranks name the same one.
    const uint64_t to_j[2] = {mine[J][0], theirs[J][1]}, from_j[2] = {theirs[J][0], mine[J][1]};
    const bool me_first = me < j;
    for (const uint64_t* d : me_first ? std::array{to_j, from_j} : std::array{from_j, to_j}) {
      if (d[0] == d[1]) continue;
      const int sender = d == to_j ? me : j, receiver = d == to_j ? j : me;
      throw MismatchError("smddp: " + ctx.op.describe() + ": ranks disagree on alltoall counts: rank " +
                          std::to_string(sender) + " sends " + std::to_string(d[0]) + " elements to rank " +
                          std::to_string(receiver) + ", which expects " + std::to_string(d[1]) +
                          std::string(kNothingWritten));
    }
  }
}

void alltoall_net_direct(Context& ctx, const CollArgs& a) {
  const auto [me, G] = global(ctx);
  const size_t es = dtype_size(a.dtype);
  NetExchange x(ctx);
  if (!a.uniform && config::get_bool("SMDDP_CHECK_CONSISTENCY")) check_alltoall_counts(ctx, x, a);
  // In place (send == recv), a block's send and the receive into the same bytes are in flight
  // together: a peer's data (an RMA write, a rendezvous) could land before the send read the
  // block. The blocks to send are copied aside first.
  const void* send = a.send;
  if (a.send == a.recv) {
    const size_t extent = alltoall_extent(a.send_counts, a.send_displs);
    std::byte* aside = scratch_buffer(ctx, 0, extent * es);
    ctx.dev.copy(aside, a.send, extent * es);
    send = aside;
  }
  for (int j = 0; j < G; ++j) {
    const auto J = static_cast<size_t>(j);
    if (j == me) {
      ctx.dev.copy(at(a.recv, a.recv_displs[J], es), at(send, a.send_displs[J], es), a.send_counts[J] * es);
      continue;
    }
    x.send(j, at(send, a.send_displs[J], es), a.send_counts[J] * es, 0);
    x.recv(j, at(a.recv, a.recv_displs[J], es), a.recv_counts[J] * es, 0);
  }
  x.wait();
}

void barrier_net_direct(Context& ctx, const CollArgs&) {
  const auto [me, G] = global(ctx);
  NetExchange x(ctx);
  static const char token = 0;
  char sink[64] = {};
  for (int j = 0; j < G; ++j) {
    if (j == me) continue;
    x.send(j, &token, 0, 0);
    x.recv(j, sink, 0, 0);
  }
  x.wait();
}

}  // namespace smddp::algorithms
