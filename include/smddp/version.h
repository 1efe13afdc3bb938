#pragma once

namespace smddp {
// The library's version, "MAJOR.MINOR.PATCH".
const char* version();
// Build options, e.g. "libfabric=ON cuda=OFF".
const char* build_info();
}  // namespace smddp
