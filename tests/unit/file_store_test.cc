#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "smddp/errors.h"
#include "smddp/store.h"

using namespace std::chrono_literals;

TEST(FileStore, SetGetAddWaitAndTimeout) {
  char tmpl[] = "/tmp/smddp-store-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  {
    smddp::FileStore s(dir + "/s");
    s.set("a/b c", {1, 2, 3});
    EXPECT_EQ(s.get("a/b c", 1s), (std::vector<uint8_t>{1, 2, 3}));
    // add from several processes at once is atomic
    std::vector<pid_t> kids;
    for (int k = 0; k < 4; ++k) {
      pid_t p = fork();
      if (p == 0) {
        smddp::FileStore c(dir + "/s");
        for (int i = 0; i < 50; ++i) c.add("counter", 1);
        _exit(0);
      }
      kids.push_back(p);
    }
    for (pid_t p : kids) waitpid(p, nullptr, 0);
    EXPECT_EQ(s.add("counter", 0), 200);
    EXPECT_THROW(s.get("never", 50ms), smddp::TimeoutError);
    smddp::PrefixStore ps("x/", std::make_shared<smddp::FileStore>(dir + "/s"));
    ps.set("k", {9});
    EXPECT_EQ(s.get("x/k", 1s), std::vector<uint8_t>{9});
  }
  std::filesystem::remove_all(dir);
}
