// Backend splitting: the subgroups of torch's split_group and of a device mesh over a default
// group bound to a device (init_process_group(device_id=...)), where torch asks the parent's
// backend for each subgroup instead of making one from the creator (docs/pytorch.md).
//
// torch calls split() on every rank of the parent, each with the same list of the new group's
// ranks (their ranks in the parent; a rank's place in it is its rank in the new group) and a
// store of the new group's own (a prefix of the group's unique name). The members make a
// communicator among themselves from that store, as new_group's members do from theirs; nothing
// of the parent's is shared, so the parent and the child run independently and may be destroyed
// in either order. A rank outside the new group
// has nothing to do (no collective over the parent, unlike ncclCommSplit's no-colour split).
#include "backend.h"

#include <algorithm>
#include <string>
#include <vector>

namespace smddp::torch_backend {

#ifdef SMDDP_TORCH_SPLIT

c10::intrusive_ptr<::c10d::Backend::Options> ProcessGroupSmddp::getBackendOptions() {
  auto opts = c10::make_intrusive<::c10d::Backend::Options>(getBackendName(), comm_->options().timeout);
  opts->group_name = getGroupUid();
  return opts;
}

c10::intrusive_ptr<::c10d::Backend> ProcessGroupSmddp::split(const c10::intrusive_ptr<::c10d::Store>& store,
                                                             const std::vector<int>& ranks,
                                                             const c10::intrusive_ptr<::c10d::Backend::Options>& opts) {
  const std::string me = "smddp: rank " + std::to_string(getRank()) + ": split of a group of " +
                         std::to_string(getSize()) + " ranks: ";
  std::vector<bool> named(static_cast<size_t>(getSize()), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    TORCH_CHECK(ranks[i] >= 0 && ranks[i] < getSize(), me, "rank ", ranks[i], " (position ", i,
                " of the new group's ranks) is not in this group");
    TORCH_CHECK(!named[static_cast<size_t>(ranks[i])], me, "rank ", ranks[i],
                " is named more than once among the new group's ranks");
    named[static_cast<size_t>(ranks[i])] = true;
  }
  const auto mine = std::find(ranks.begin(), ranks.end(), getRank());
  if (mine == ranks.end()) return {};  // not a member: torch makes it a non-member of the new group
  const std::string name = opts ? opts->group_name : std::string();
  if (!name.empty() && name == last_split_name_)
    if (auto again = last_split_.lock()) return again;  // the same split, for another device type
  std::chrono::milliseconds timeout = comm_->options().timeout;
  if (opts && opts->timeout.count() > 0) timeout = opts->timeout;
  // What the communicator throws (a TimeoutError naming the members that never came, ...)
  // reaches torch's caller as it is, as from the creator of any other group.
  c10::intrusive_ptr<::c10d::Backend> child = c10::make_intrusive<ProcessGroupSmddp>(
      store, static_cast<int>(mine - ranks.begin()), static_cast<int>(ranks.size()), timeout,
      comm_->process_local_rank());
  last_split_name_ = name;
  last_split_ = c10::weak_intrusive_ptr<::c10d::Backend>(child);
  return child;
}

#endif  // SMDDP_TORCH_SPLIT

}  // namespace smddp::torch_backend
