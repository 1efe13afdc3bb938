// SMDDP_* values are user input: any string must give a value or InvalidArgument naming it,
// never a crash or undefined behaviour (an overflowing "9999999999999g" was one); a boolean
// is a value only for the words it knows.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/config.h"
#include "smddp/errors.h"

namespace {
// What an accepted integer looks like: a sign, then 0x and hex digits or decimal (octal) digits,
// then at most one k, m or g in any case, and nothing else.
bool integer_shaped(const std::string& v) {
  size_t i = 0;
  if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
  const bool hex = v.size() > i + 2 && v[i] == '0' && (v[i + 1] == 'x' || v[i + 1] == 'X') &&
                   std::isxdigit(static_cast<unsigned char>(v[i + 2]));
  if (hex) i += 2;
  const size_t first = i;
  while (i < v.size() && (hex ? std::isxdigit(static_cast<unsigned char>(v[i]))
                              : std::isdigit(static_cast<unsigned char>(v[i]))))
    ++i;
  if (i == first) return false;
  if (i < v.size() && v[i] != '\0' && std::strchr("kKmMgG", v[i])) ++i;
  return i == v.size();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string v(reinterpret_cast<const char*>(data), size);
  if (v.find('\0') != std::string::npos) return 0;  // an environment value cannot hold one
  setenv("SMDDP_SHM_CHUNK", v.c_str(), 1);
  try {
    const int64_t n = smddp::config::get_int("SMDDP_SHM_CHUNK");
    // A value came back: the text was empty (0), or digits with at most one k/m/g suffix.
    if (v.empty() ? n != 0 : !integer_shaped(v)) std::abort();
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
