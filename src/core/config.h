// The one registry of SMDDP_* environment parameters. Every parameter the library reads is
// declared in config.cc's table (name, default, meaning) and documented in docs/env-vars.md; a
// test checks the two agree. Read values through these functions only, never getenv directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace smddp::config {

struct Param {
  const char* name;
  const char* default_value;
  const char* help;
};

// All registered parameters, in table order.
const std::vector<Param>& params();

// The effective value: the environment's, else the default. Unknown names are a programming
// error and throw std::logic_error.
std::string get_string(const char* name);
int64_t get_int(const char* name);  // accepts suffixes k, m, g (KiB, MiB, GiB)
bool get_bool(const char* name);    // 1/true/yes/on
// Whether the environment sets the parameter at all (a caller whose default differs from the
// table's: the PyTorch backend's SMDDP_INLINE).
bool is_set(const char* name);

}  // namespace smddp::config
