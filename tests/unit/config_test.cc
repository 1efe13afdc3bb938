// The parameter registry and docs/env-vars.md must agree: every registered SMDDP_* parameter is
// documented, and the document names no parameter the code does not have.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/config.h"
#include "smddp/errors.h"

TEST(Config, EveryParameterIsDocumentedAndViceVersa) {
  std::ifstream f(std::string(SMDDP_SOURCE_DIR) + "/docs/env-vars.md");
  ASSERT_TRUE(f) << "docs/env-vars.md missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  std::set<std::string> documented;
  std::regex row(R"(^\| `(SMDDP_[A-Z0-9_]+)`)");
  std::istringstream lines(doc);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  std::set<std::string> registered;
  for (const auto& p : smddp::config::params()) registered.insert(p.name);
  for (const auto& n : registered) EXPECT_TRUE(documented.count(n)) << n << " is not in docs/env-vars.md";
  for (const auto& n : documented) EXPECT_TRUE(registered.count(n)) << n << " is documented but not registered";
}

TEST(Config, ParsesSizesAndBooleans) {
  setenv("SMDDP_SHM_CHUNK", "64k", 1);
  EXPECT_EQ(smddp::config::get_int("SMDDP_SHM_CHUNK"), 65536);
  setenv("SMDDP_SHM_CHUNK", "2m", 1);
  EXPECT_EQ(smddp::config::get_int("SMDDP_SHM_CHUNK"), 2 << 20);
  setenv("SMDDP_SHM_CHUNK", "0x10", 1);
  EXPECT_EQ(smddp::config::get_int("SMDDP_SHM_CHUNK"), 16);
  // What the fuzzer found (tests/fuzz/regressions/config_value): a suffix that overflows was
  // undefined behaviour; it, text after the suffix, a bare suffix and out-of-range digits are
  // errors naming the value.
  for (const char* bad : {"0x4444444444444410M", "99999999999999999999", "4kb", "k", "", " 4", "4 k"}) {
    setenv("SMDDP_SHM_CHUNK", bad, 1);
    if (*bad == 0) {
      EXPECT_EQ(smddp::config::get_int("SMDDP_SHM_CHUNK"), 0);  // empty: the registry's "unset"
      continue;
    }
    try {
      smddp::config::get_int("SMDDP_SHM_CHUNK");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const smddp::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SMDDP_SHM_CHUNK='") + bad + "'"), std::string::npos) << e.what();
    }
  }
  unsetenv("SMDDP_SHM_CHUNK");
  setenv("SMDDP_CHECK_CONSISTENCY", "no", 1);
  EXPECT_FALSE(smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY"));
  setenv("SMDDP_CHECK_CONSISTENCY", "yes", 1);
  EXPECT_TRUE(smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY"));
  // A word it does not know is an error naming it, not false (=enable turned the check off).
  for (const char* bad : {"enable", "2", "y", "disabled"}) {
    setenv("SMDDP_CHECK_CONSISTENCY", bad, 1);
    try {
      smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const smddp::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SMDDP_CHECK_CONSISTENCY='") + bad + "' is not a boolean"),
                std::string::npos)
          << e.what();
    }
  }
  setenv("SMDDP_CHECK_CONSISTENCY", "OFF", 1);
  EXPECT_FALSE(smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY"));
  unsetenv("SMDDP_CHECK_CONSISTENCY");
  EXPECT_TRUE(smddp::config::get_bool("SMDDP_CHECK_CONSISTENCY"));  // on by default
  EXPECT_THROW(smddp::config::get_string("SMDDP_NOT_A_PARAM"), std::logic_error);
  EXPECT_FALSE(smddp::config::is_set("SMDDP_CHECK_CONSISTENCY"));
  setenv("SMDDP_CHECK_CONSISTENCY", "", 1);
  EXPECT_TRUE(smddp::config::is_set("SMDDP_CHECK_CONSISTENCY"));  // set, if empty
  unsetenv("SMDDP_CHECK_CONSISTENCY");
  EXPECT_THROW(smddp::config::is_set("SMDDP_NOT_A_PARAM"), std::logic_error);
}
