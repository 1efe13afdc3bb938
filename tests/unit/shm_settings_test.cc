// SMDDP_SHM_CHUNK=auto (core/shm_settings.cc): 1 MiB, halved down to 256 KiB while a node's
// ranks with a core each would hold more than 4 MiB of chunks, so that a communicator's slots
// stay within 8 MiB of /dev/shm; 1 MiB wherever the ranks outnumber the cores.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/shm_settings.h"

namespace {
constexpr size_t KiB = 1024, MiB = 1024 * KiB;
}

TEST(ShmSettings, AutoChunkIsOneMiBUntilTheSlotsWouldPassEightMiB) {
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 1), MiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 2), MiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 4), MiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 5), 512 * KiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 8), 512 * KiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 16), 256 * KiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(false, 64), 256 * KiB);
  for (int w : {1, 2, 4, 8, 16})
    EXPECT_LE(2 * static_cast<size_t>(w) * smddp::detail::auto_chunk_bytes(false, w), 8 * MiB) << w << " ranks";
  // Ranks that outnumber the cores: fewer, larger rounds, whatever their number.
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(true, 2), MiB);
  EXPECT_EQ(smddp::detail::auto_chunk_bytes(true, 16), MiB);
}

TEST(ShmSettings, TheGroupTakesTheAutoChunkUnlessTheSettingNamesOne) {
  unsetenv("SMDDP_SHM_CHUNK");
  EXPECT_EQ(smddp::detail::shm_group_config(false, false, 8).slot_bytes, 512 * KiB);
  EXPECT_EQ(smddp::detail::shm_group_config(true, false, 8).slot_bytes, MiB);
  setenv("SMDDP_SHM_CHUNK", "64k", 1);
  EXPECT_EQ(smddp::detail::shm_group_config(false, false, 8).slot_bytes, 64 * KiB);
  unsetenv("SMDDP_SHM_CHUNK");
}
