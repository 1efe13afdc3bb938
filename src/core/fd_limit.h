// Whether the process is at its limit of open file descriptors (ulimit -n). Over tcp every
// communicator that spans nodes opens a libfabric domain and endpoint of its own, and a socket
// per peer it talks to; a connection that cannot get one is not reported to the endpoint, whose
// transfer then waits for its deadline. So the timeout's message says so where the process is at
// its limit (Endpoint::throw_if_late).
#pragma once

#include <string>

namespace smddp {

// " (this process has 63 file descriptors open and its limit (ulimit -n) is 64: ...)" where
// fewer than a few are left; "" otherwise. Reads /proc/self/fd: for error paths only.
std::string fd_exhaustion_note();

}  // namespace smddp
