// SMDDP_* values are user input: any string must give a value or InvalidArgument naming it,
// never a crash or undefined behaviour (an overflowing "9999999999999g" was one); a boolean
// is a value only for the words it knows.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.h"
#include "smddp/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string v(reinterpret_cast<const char*>(data), size);
  if (v.find('\0') != std::string::npos) return 0;  // an environment value cannot hold one
  setenv("SMDDP_SHM_CHUNK", v.c_str(), 1);
  try {
    const int64_t n = smddp::config::get_int("SMDDP_SHM_CHUNK");
    // A value came back: the text was digits with at most one k/m/g suffix.
    if (v.empty() && n != 0) std::abort();
  } catch (const smddp::InvalidArgument&) {
  }
  setenv("SMDDP_CHECK_CONSISTENCY", v.c_str(), 1);
  try {
    (void)smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY");
    // A value came back: the text was one of the known words, in any case, or empty.
    std::string w = v;
    for (auto& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const char* const kWords[] = {"", "1", "true", "yes", "on", "0", "false", "no", "off"};
    bool known = false;
    for (const char* k : kWords) known = known || w == k;
    if (!known) std::abort();
  } catch (const smddp::InvalidArgument&) {
  }
  return 0;
}
