// Allreduce of sparse COO tensors (DDP with nn.Embedding(sparse=True) relies on it), the way
// gloo does it so the results are the same bits: every rank's indices and values are gathered
// to every rank, which adds the G sparse tensors in rank order and coalesces.
//
// The gathers' sizes depend on every rank's nnz, so a first, small allgather of (nnz, sizes)
// runs to completion inside the call; the two data allgathers (padded to the largest nnz, so
// they run on the regular allgather algorithms) are then submitted in the same call, which keeps
// this rank's sequence of collectives the same as every other rank's whatever the caller
// submits next. The sum runs when both have completed, before the Work completes.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <vector>

#include "backend.h"
#include "tensor_args.h"

namespace smddp::torch_backend {

namespace {

std::string sizes_str(const int64_t* s, int64_t n) {
  std::string out = "[";
  for (int64_t i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

Pending ProcessGroupSmddp::sparse_allreduce_one(const at::Tensor& t, const Reduction& red) {
  const std::string who = "smddp: rank " + std::to_string(getRank()) + ": allreduce of a sparse tensor: ";
  if (red.op != ReduceOp::sum)
    throw InvalidArgument(who + "only SUM is defined for sparse tensors (as in gloo), got " + to_string(red.op));
  if (!t.device().is_cpu())
    throw InvalidArgument(who + "got a tensor on " + t.device().str() + "; this build moves CPU tensors only");
  // As gloo: ATen below autograd (the tensors made here are not variables).
  at::AutoDispatchBelowAutograd below_autograd;
  const at::Tensor input = t.coalesce();
  const int G = getSize();
  const int64_t ndim = input.dim(), sparse_dim = input.sparse_dim();

  // (nnz, sparse_dim, sizes...) of every rank; a rank whose tensor has another number of
  // dimensions announces another count, which the consistency check reports on every rank.
  const int64_t meta_len = 2 + ndim;
  at::Tensor mine = at::empty({meta_len}, at::kLong), meta = at::empty({G, meta_len}, at::kLong);
  mine[0] = input._nnz();
  mine[1] = sparse_dim;
  for (int64_t d = 0; d < ndim; ++d) mine[2 + d] = input.size(d);
  comm_->allgather(mine.data_ptr(), meta.data_ptr(), static_cast<size_t>(meta_len), DataType::i64).wait();
  const int64_t* m = meta.data_ptr<int64_t>();
  int64_t max_nnz = 0;
  std::vector<int64_t> nnz(static_cast<size_t>(G));
  for (int r = 0; r < G; ++r) {
    const int64_t* theirs = m + r * meta_len;
    if (!std::equal(theirs + 1, theirs + meta_len, m + getRank() * meta_len + 1))
      throw InvalidArgument(who + "rank " + std::to_string(r) + "'s tensor has sparse_dim " + std::to_string(theirs[1]) +
                            " and sizes " + sizes_str(theirs + 2, ndim) + ", this rank's sparse_dim " +
                            std::to_string(sparse_dim) + " and sizes " + sizes_str(input.sizes().data(), ndim));
    nnz[static_cast<size_t>(r)] = theirs[0];
    max_nnz = std::max(max_nnz, theirs[0]);
  }

  // Indices [sparse_dim, nnz] and values [nnz, dense...], each padded to max_nnz and gathered.
  const at::Tensor values = input._values();
  std::vector<int64_t> vshape = values.sizes().vec(), gshape = vshape;
  vshape[0] = max_nnz;
  gshape.insert(gshape.begin(), G);
  gshape[1] = max_nnz;
  at::Tensor idx_in = at::zeros({sparse_dim, max_nnz}, at::kLong);
  idx_in.narrow(1, 0, input._nnz()).copy_(input._indices());
  at::Tensor val_in = at::zeros(vshape, values.options());
  val_in.narrow(0, 0, input._nnz()).copy_(values);
  at::Tensor idx_all = at::empty({G, sparse_dim, max_nnz}, at::kLong), val_all = at::empty(gshape, values.options());
  const Elems ie = movement_elems(idx_in), ve = movement_elems(val_in);
  Pending p;
  p.ops.push_back(comm_->allgather(idx_in.data_ptr(), idx_all.data_ptr(), ie.count, ie.dtype));
  p.ops.push_back(comm_->allgather(val_in.data_ptr(), val_all.data_ptr(), ve.count, ve.dtype));
  p.outputs.push_back(t);
  p.keep_alive = {idx_in, val_in, idx_all, val_all};
  p.finalizers.push_back([t, idx_all, val_all, nnz, sizes = input.sizes().vec(), options = input.options()]() mutable {
    at::AutoDispatchBelowAutograd guard;
    auto part = [&](size_t r) {
      return at::sparse_coo_tensor(idx_all[static_cast<int64_t>(r)].narrow(1, 0, nnz[r]),
                                   val_all[static_cast<int64_t>(r)].narrow(0, 0, nnz[r]), sizes, options);
    };
    at::Tensor out = part(0);
    for (size_t r = 1; r < nnz.size(); ++r) out += part(r);
    t.copy_(out.coalesce());
  });
  return p;
}

}  // namespace smddp::torch_backend
