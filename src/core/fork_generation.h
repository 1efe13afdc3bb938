// How many forks lie between this process and the one that loaded smddp: a communicator made in
// one process cannot be used in a child forked from it (a torch DataLoader worker, multiprocessing
// with the fork start method). The child has no engine thread, and shares the parent's shared
// memory and sockets: a collective it issued would run as the parent's rank (its peers paired it
// with their next collective and reduced the child's data), and tearing the communicator down
// there would tell the peers that the parent's rank left. So a communicator remembers the
// generation it was made in: its operations refuse to run in another, and its destructor there
// leaves everything as it is (CommunicatorImpl::forked_away).
#pragma once

#include <cstdint>

namespace smddp::detail {

// 0 in the process that first called it; one more in each child forked after that (counted by a
// pthread_atfork handler, registered at the first call; a relaxed load after that).
uint64_t fork_generation();

// Whether this process is a child forked since `generation` was this process's.
inline bool forked_since(uint64_t generation) { return fork_generation() != generation; }

}  // namespace smddp::detail
