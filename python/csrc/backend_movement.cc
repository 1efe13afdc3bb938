// Data-movement collectives: broadcast, allgather (all forms), gather, scatter, alltoall,
// send/recv, barriers.
#include "backend.h"
#include "tensor_args.h"
#include "torch_compat.h"
#ifdef SMDDP_TORCH_CUDA
#include "cuda_glue.h"
#endif

namespace smddp::torch_backend {

namespace {
std::string who(int rank) { return "smddp: rank " + std::to_string(rank) + ": "; }

// Flattens tensors into one contiguous buffer (a copy), for list-of-tensors collectives.
at::Tensor flatten(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (auto& t : ts) parts.push_back(t.reshape({-1}));
  return at::cat(parts);
}

// Copies consecutive pieces of `flat` into `outs`.
void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  int64_t off = 0;
  for (auto& t : outs) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}
}  // namespace

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::broadcast(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::BroadcastOptions& opts) {
  return guarded("broadcast", opts, [&] {
    check_single(tensors, "broadcast", getRank());
    const at::Tensor& t = tensors[0];
    Elems e = movement_elems(t);
    Staged s = stage(t);
    Pending p;
    p.ops.push_back(comm_->broadcast(s.data(), e.count, e.dtype, static_cast<int>(opts.rootRank), memory_of(s.tensor)));
    p.outputs.push_back(t);
    p.keep_alive.push_back(s.tensor);
    if (s.copied && getRank() != opts.rootRank) p.finalizers.push_back([s] { s.copy_back(); });
    return finish(::c10d::OpType::BROADCAST, std::move(p));
  });
}

Elems ProcessGroupSmddp::check_allgather(const at::Tensor& out_flat, const at::Tensor& in, const char* coll) const {
  check_tensor(in, coll, getRank());
  check_tensor(out_flat, coll, getRank());
  check_same_type(out_flat, in, coll, getRank());
  check_same_device(out_flat, in, coll, getRank());
  if (out_flat.numel() != in.numel() * getSize())
    throw InvalidArgument(who(getRank()) + coll + ": output has " + std::to_string(out_flat.numel()) +
                          " elements, expected input's " + std::to_string(in.numel()) + " x world size " +
                          std::to_string(getSize()));
  return movement_elems(in);
}

Pending ProcessGroupSmddp::allgather_one(const at::Tensor& out_flat, const at::Tensor& in, const char* coll) {
  const Elems e = check_allgather(out_flat, in, coll);
  Staged i = stage(in);
  Staged o = stage(out_flat);
  Pending p;
  p.ops.push_back(comm_->allgather(i.data(), o.data(), e.count, e.dtype, memory_of(o.tensor)));
  p.outputs.push_back(out_flat);
  p.keep_alive = {i.tensor, o.tensor};
  if (o.copied) p.finalizers.push_back([o] { o.copy_back(); });
  return p;
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const ::c10d::AllgatherOptions& opts) {
  return guarded("allgather", opts, [&] {
    check_single(inputs, "allgather", getRank());
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
      throw InvalidArgument(who(getRank()) + "allgather needs one list of world-size output tensors");
    for (auto& t : outputs[0]) {
      check_tensor(t, "allgather", getRank());
      check_same_type(t, inputs[0], "allgather", getRank());
      check_same_device(t, inputs[0], "allgather", getRank());
      if (t.numel() != inputs[0].numel())
        throw InvalidArgument(who(getRank()) + "allgather: every output must have the input's size (" +
                              std::to_string(inputs[0].numel()) + " elements), one has " + std::to_string(t.numel()) +
                              " (smddp gathers equal sizes)");
    }
    at::Tensor flat = at::empty({inputs[0].numel() * getSize()}, inputs[0].options());
    Pending p = allgather_one(flat, inputs[0], "allgather");
    std::vector<at::Tensor> outs = outputs[0];
    p.outputs = outs;
    p.finalizers.push_back([flat, outs] { unflatten_into(flat, outs); });
    return finish(::c10d::OpType::ALLGATHER, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const ::c10d::AllgatherOptions& opts) {
  return guarded("all_gather_into_tensor", opts, [&] {
    return finish(::c10d::OpType::_ALLGATHER_BASE, allgather_one(output, input, "all_gather_into_tensor"));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const ::c10d::AllgatherOptions& opts) {
  // torch's layout: outputs[r][k] receives rank r's inputs[k] (one list per rank).
  return guarded("allgather_coalesced", opts, [&] {
    if (static_cast<int>(outputs.size()) != getSize())
      throw InvalidArgument(who(getRank()) + "allgather_coalesced: needs one output list per rank (" +
                            std::to_string(getSize()) + "), got " + std::to_string(outputs.size()));
    for (size_t r = 0; r < outputs.size(); ++r) {
      if (outputs[r].size() != inputs.size())
        throw InvalidArgument(who(getRank()) + "allgather_coalesced: output list " + std::to_string(r) + " has " +
                              std::to_string(outputs[r].size()) + " tensors, one per input (" +
                              std::to_string(inputs.size()) + ") needed");
      for (size_t k = 0; k < inputs.size(); ++k) {
        check_tensor(outputs[r][k], "allgather_coalesced", getRank());
        check_same_type(outputs[r][k], inputs[k], "allgather_coalesced", getRank());
        check_same_device(outputs[r][k], inputs[k], "allgather_coalesced", getRank());
        if (outputs[r][k].numel() != inputs[k].numel())
          throw InvalidArgument(who(getRank()) + "allgather_coalesced: output [" + std::to_string(r) + "][" +
                                std::to_string(k) + "] has " + std::to_string(outputs[r][k].numel()) +
                                " elements, input " + std::to_string(k) + " has " + std::to_string(inputs[k].numel()));
      }
    }
    // Every input checked before the first gather is submitted (a sparse third input must not
    // fail the call after the first two went), as the other coalesced calls do.
    for (auto& t : inputs) {
      check_tensor(t, "allgather_coalesced", getRank());
      check_same_device(t, inputs[0], "allgather_coalesced", getRank());
    }
    Pending all;
    for (size_t k = 0; k < inputs.size(); ++k) {
      at::Tensor flat = at::empty({inputs[k].numel() * getSize()}, inputs[k].options());
      Pending p = allgather_one(flat, inputs[k], "allgather_coalesced");
      std::vector<at::Tensor> outs;
      for (auto& list : outputs) outs.push_back(list[k]);
      p.outputs = outs;
      p.finalizers.push_back([flat, outs] { unflatten_into(flat, outs); });
      all.merge(std::move(p));
    }
    return finish(::c10d::OpType::ALLGATHER_COALESCED, std::move(all));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                   std::vector<at::Tensor>& inputs,
                                                                                   const ::c10d::AllgatherOptions& opts) {
  return guarded("allgather_into_tensor_coalesced", opts, [&] {
    if (outputs.size() != inputs.size())
      throw InvalidArgument(who(getRank()) + "allgather_into_tensor_coalesced: as many outputs as inputs needed");
    for (size_t k = 0; k < inputs.size(); ++k) {
      check_allgather(outputs[k], inputs[k], "allgather_into_tensor_coalesced");
      check_same_device(inputs[k], inputs[0], "allgather_into_tensor_coalesced", getRank());
    }
    Pending all;
    for (size_t k = 0; k < inputs.size(); ++k)
      all.merge(allgather_one(outputs[k], inputs[k], "allgather_into_tensor_coalesced"));
    return finish(::c10d::OpType::COALESCED, std::move(all));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::GatherOptions& opts) {
  return guarded("gather", opts, [&] {
    check_single(inputs, "gather", getRank());
    const int root = static_cast<int>(opts.rootRank);
    const at::Tensor& in = inputs[0];
    Elems e = movement_elems(in);
    Staged i = stage(in);
    Pending p;
    p.keep_alive.push_back(i.tensor);
    if (getRank() == root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize())
        throw InvalidArgument(who(getRank()) + "gather: the root needs one list of world-size output tensors");
      for (auto& t : outputs[0]) {
        check_tensor(t, "gather", getRank());
        check_same_type(t, in, "gather", getRank());
        check_same_device(t, in, "gather", getRank());
        if (t.numel() != in.numel())
          throw InvalidArgument(who(getRank()) + "gather: every output must have the input's size");
      }
      at::Tensor flat = at::empty({in.numel() * getSize()}, in.options());
      p.ops.push_back(comm_->gather(i.data(), flat.data_ptr(), e.count, e.dtype, root, memory_of(i.tensor)));
      std::vector<at::Tensor> outs = outputs[0];
      p.outputs = outs;
      p.keep_alive.push_back(flat);
      p.finalizers.push_back([flat, outs] { unflatten_into(flat, outs); });
    } else {
      p.ops.push_back(comm_->gather(i.data(), nullptr, e.count, e.dtype, root, memory_of(i.tensor)));
    }
    return finish(::c10d::OpType::GATHER, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const ::c10d::ScatterOptions& opts) {
  return guarded("scatter", opts, [&] {
    check_single(outputs, "scatter", getRank());
    const int root = static_cast<int>(opts.rootRank);
    const at::Tensor& out = outputs[0];
    Elems e = movement_elems(out);
    Staged o = stage(out);
    Pending p;
    p.outputs.push_back(out);
    p.keep_alive.push_back(o.tensor);
    if (getRank() == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize())
        throw InvalidArgument(who(getRank()) + "scatter: the root needs one list of world-size input tensors");
      for (auto& t : inputs[0]) {
        check_tensor(t, "scatter", getRank());
        check_same_type(out, t, "scatter", getRank());
        check_same_device(t, out, "scatter", getRank());
        if (t.numel() != out.numel()) throw InvalidArgument(who(getRank()) + "scatter: every input must have the output's size");
      }
      at::Tensor flat = flatten(inputs[0]);
      p.keep_alive.push_back(flat);
      p.ops.push_back(comm_->scatter(flat.data_ptr(), o.data(), e.count, e.dtype, root, memory_of(o.tensor)));
    } else {
      p.ops.push_back(comm_->scatter(nullptr, o.data(), e.count, e.dtype, root, memory_of(o.tensor)));
    }
    if (o.copied) p.finalizers.push_back([o] { o.copy_back(); });
    return finish(::c10d::OpType::SCATTER, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const ::c10d::AllToAllOptions& opts) {
  return guarded("all_to_all_single", opts, [&] {
    check_tensor(input, "all_to_all_single", getRank());
    check_tensor(output, "all_to_all_single", getRank());
    check_same_type(output, input, "all_to_all_single", getRank());
    check_same_device(output, input, "all_to_all_single", getRank());
    const auto W = static_cast<size_t>(getSize());
    Elems ein = movement_elems(input);
    // Elements (in smddp's unit) per row of dim 0, and per tensor element (bytes for odd dtypes).
    const size_t per_elem = units_per_element(input);
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      std::vector<size_t> c(W);
      if (splits.empty()) {
        // Rows of dim 0 go whole to one rank, as gloo and NCCL require (a [3, 4] tensor over 2
        // ranks used to be cut mid-row, 6 elements each).
        const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
        if (rows % getSize() != 0)
          throw InvalidArgument(who(getRank()) + "all_to_all_single: " + which + "'s dim 0 of size " +
                                std::to_string(rows) + " does not split evenly over " + std::to_string(W) + " ranks");
        std::fill(c.begin(), c.end(), static_cast<size_t>(t.numel()) / W * per_elem);
        return c;
      }
      if (splits.size() != W) throw InvalidArgument(who(getRank()) + "all_to_all_single: splits need one entry per rank");
      const size_t row = t.dim() > 0 && t.size(0) > 0 ? static_cast<size_t>(t.numel() / t.size(0)) : 0;
      int64_t total = 0;
      for (size_t j = 0; j < W; ++j) {
        if (splits[j] < 0)  // it would wrap to about 2^64 elements, refused as an overflow not naming it
          throw InvalidArgument(who(getRank()) + "all_to_all_single: " + which + " split " + std::to_string(j) +
                                " is " + std::to_string(splits[j]) + " rows (negative)");
        c[j] = static_cast<size_t>(splits[j]) * row * per_elem;
        total += splits[j];
      }
      if (t.dim() == 0 || total != t.size(0))
        throw InvalidArgument(who(getRank()) + "all_to_all_single: " + which + " splits add up to " +
                              std::to_string(total) + " rows, tensor has " + std::to_string(t.dim() ? t.size(0) : 0));
      return c;
    };
    std::vector<size_t> sc = counts(input, input_splits, "input"), rc = counts(output, output_splits, "output");
    std::vector<size_t> sd(W), rd(W);
    for (size_t j = 1; j < W; ++j) {
      sd[j] = sd[j - 1] + sc[j - 1];
      rd[j] = rd[j - 1] + rc[j - 1];
    }
    Staged i = stage(input), o = stage(output);
    Pending p;
    p.ops.push_back(comm_->alltoallv(i.data(), sc, sd, o.data(), rc, rd, ein.dtype, memory_of(o.tensor)));
    p.outputs.push_back(output);
    p.keep_alive = {i.tensor, o.tensor};
    if (o.copied) p.finalizers.push_back([o] { o.copy_back(); });
    return finish(::c10d::OpType::ALLTOALL_BASE, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const ::c10d::AllToAllOptions& opts) {
  return guarded("all_to_all", opts, [&] {
    const auto W = static_cast<size_t>(getSize());
    if (outputs.size() != W || inputs.size() != W)
      throw InvalidArgument(who(getRank()) + "all_to_all needs world-size input and output lists");
    for (size_t j = 0; j < W; ++j) {
      check_tensor(inputs[j], "all_to_all", getRank());
      check_tensor(outputs[j], "all_to_all", getRank());
      check_same_type(outputs[j], inputs[0], "all_to_all", getRank());
      check_same_type(inputs[j], inputs[0], "all_to_all", getRank());
      check_same_device(outputs[j], inputs[0], "all_to_all", getRank());
      check_same_device(inputs[j], inputs[0], "all_to_all", getRank());
    }
    at::Tensor in = flatten(inputs);
    at::Tensor out = at::empty({0}, inputs[0].options());
    int64_t out_total = 0;
    for (auto& t : outputs) out_total += t.numel();
    out = at::empty({out_total}, inputs[0].options());
    const size_t per_elem = units_per_element(inputs[0]);
    std::vector<size_t> sc(W), sd(W), rc(W), rd(W);
    for (size_t j = 0; j < W; ++j) {
      sc[j] = static_cast<size_t>(inputs[j].numel()) * per_elem;
      rc[j] = static_cast<size_t>(outputs[j].numel()) * per_elem;
      if (j) {
        sd[j] = sd[j - 1] + sc[j - 1];
        rd[j] = rd[j - 1] + rc[j - 1];
      }
    }
    Pending p;
    p.ops.push_back(
        comm_->alltoallv(in.data_ptr(), sc, sd, out.data_ptr(), rc, rd, movement_elems(in).dtype, memory_of(out)));
    std::vector<at::Tensor> outs = outputs;
    p.outputs = outs;
    p.keep_alive = {in, out};
    p.finalizers.push_back([out, outs] { unflatten_into(out, outs); });
    return finish(::c10d::OpType::ALLTOALL, std::move(p));
  });
}

// Point to point on CUDA tensors: the core stages them through host memory, on its own stream
// after the caller's current one (p2p_staging.h), so neither call blocks the host.
c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return guarded("send", [&] {
    check_single(tensors, "send", getRank());
    Elems e = movement_elems(tensors[0]);
    Staged s = stage(tensors[0]);
    Pending p;
    p.ops.push_back(comm_->send(s.data(), e.count, e.dtype, dst, static_cast<uint32_t>(tag), memory_of(s.tensor)));
    p.keep_alive.push_back(s.tensor);
    return finish(::c10d::OpType::SEND, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return guarded("recv", [&] {
    check_single(tensors, "recv", getRank());
    Elems e = movement_elems(tensors[0]);
    Staged s = stage(tensors[0]);
    Pending p;
    p.ops.push_back(comm_->recv(s.data(), e.count, e.dtype, src, static_cast<uint32_t>(tag), memory_of(s.tensor)));
    p.outputs.push_back(tensors[0]);
    p.keep_alive.push_back(s.tensor);
    if (s.copied) p.finalizers.push_back([s] { s.copy_back(); });
    return finish(::c10d::OpType::RECV, std::move(p));
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return guarded("recv", [&] {
    check_single(tensors, "recv", getRank());
    Elems e = movement_elems(tensors[0]);
    Staged s = stage(tensors[0]);
    Pending p;
    smddp::Work w = comm_->recv_any(s.data(), e.count, e.dtype, static_cast<uint32_t>(tag), memory_of(s.tensor));
    p.ops.push_back(w);
    p.outputs.push_back(tensors[0]);
    p.keep_alive.push_back(s.tensor);
    if (s.copied) p.finalizers.push_back([s] { s.copy_back(); });
    auto work = finish(::c10d::OpType::RECVANYSOURCE, std::move(p));
    static_cast<SmddpWork*>(work.get())->set_source([w] { return w.source(); });
    return work;
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupSmddp::barrier(const ::c10d::BarrierOptions& opts) {
  return guarded("barrier", opts, [&] {
#ifdef SMDDP_TORCH_CUDA
    // On the caller's thread, before the host barrier (cuda_glue.h): async_op=True blocks here
    // for the GPU's queued work, where NCCL's would block in wait().
#if SMDDP_TORCH_AT_LEAST(2, 6)
    drain_streams_before_barrier(opts.device_ids, getBoundDeviceId());
#else  // (Backend's bound device, a std::optional, is known here from 2.6, the oldest torch built)
    drain_streams_before_barrier(opts.device_ids, std::nullopt);
#endif
#endif
    Pending p;
    p.ops.push_back(comm_->barrier(opts.timeout.count() > 0 ? opts.timeout : std::chrono::milliseconds(0)));
    return finish(::c10d::OpType::BARRIER, std::move(p));
  });
}

void ProcessGroupSmddp::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Every rank waits for all others; failures are worded as gloo words them (torch's tests and
  // users' scripts look for these phrases). As in gloo, rank 0's deadline is the one that
  // counts: the other ranks wait longer, so rank 0 times out first and names the missing ranks
  // (the first, or all of them with wait_all_ranks), and the others learn of it from its abort.
  // opts.timeout: negative = unset (the group's timeout); 0 = give up at once.
  std::chrono::milliseconds timeout = opts.timeout;
  if (timeout.count() == 0) timeout = std::chrono::milliseconds(1);
  else if (timeout.count() < 0) timeout = std::chrono::milliseconds(0);
  if (getRank() != 0 && timeout.count() > 0) timeout = timeout * 2 + std::chrono::milliseconds(1000);
  const std::string within = opts.timeout.count() >= 0 ? std::to_string(opts.timeout.count()) + " ms"
                                                         : std::string("the group's timeout");
  try {
    comm_->barrier(timeout).wait();
  } catch (const smddp::TimeoutError& e) {
    std::vector<int> missing = e.missing_ranks();
    if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
    TORCH_CHECK(false, "Rank ", getRank(), " timed out in monitoredBarrier after ", within, ". ",
                missing.size() == 1 ? "Rank " : "Ranks ", list.empty() ? std::string("?") : list,
                " failed to pass monitoredBarrier in ", within, " (", e.what(), ")");
  } catch (const smddp::PeerError& e) {
    TORCH_CHECK(false, "[Rank ", getRank(), "]: Rank ", e.peer(), " failed to pass monitoredBarrier (", e.what(), ")");
  } catch (const smddp::AbortedError& e) {
    TORCH_CHECK(false, "Rank ", getRank(),
                " successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank "
                "0. Please check rank 0 logs for faulty rank. (",
                e.what(), ")");
  } catch (const smddp::Error& e) {
    TORCH_CHECK(false, "smddp: monitored_barrier failed: ", e.what());
  }
}

}  // namespace smddp::torch_backend
