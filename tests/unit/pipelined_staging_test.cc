// PipelinedStaging (core/host_staging.h): a collective on device memory across nodes cut into
// pieces, each run in place on a host buffer while the device copies the next piece in and the
// last one out. Here the "device" is LateDevice (its copies land 300 µs late, as on a stream) and
// each piece's collective is played by the test on the piece's host buffer, so what is checked
// is the staging's own part: where each piece's elements come from and go to (rank blocks
// gathered and scattered), that every piece sees its inputs landed, that no buffer is reused
// while a copy still reads it, and that the outputs have all landed when run() returns.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/scratch_pool.h"
#include "collective/late_device.h"
#include "core/host_staging.h"

namespace smddp::detail {
namespace {

using algorithms::CollArgs;
using algorithms::CollKind;

CollArgs args(CollKind kind, const void* send, void* recv, size_t count) {
  CollArgs a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = DataType::f32;
  a.memory = Memory::cuda(0);
  return a;
}

TEST(StagingPieces, OnlyLargeAllreduceAllgatherAndReduceScatterAreCut) {
  // 64 bytes a piece: 16 floats of allreduce, 16 / 4 ranks = 4 of each rank's block otherwise.
  EXPECT_EQ(staging_pieces(args(CollKind::allreduce, nullptr, nullptr, 16), 4, 64), 1u);
  EXPECT_EQ(staging_piece_elements(args(CollKind::allreduce, nullptr, nullptr, 16), 4, 64), 0u);
  EXPECT_EQ(staging_pieces(args(CollKind::allreduce, nullptr, nullptr, 17), 4, 64), 2u);
  EXPECT_EQ(staging_piece_elements(args(CollKind::allreduce, nullptr, nullptr, 17), 4, 64), 16u);
  EXPECT_EQ(staging_pieces(args(CollKind::allreduce, nullptr, nullptr, 160), 4, 64), 10u);
  EXPECT_EQ(staging_pieces(args(CollKind::allgather, nullptr, nullptr, 17), 4, 64), 5u);
  EXPECT_EQ(staging_pieces(args(CollKind::reduce_scatter, nullptr, nullptr, 16), 4, 64), 4u);
  EXPECT_EQ(staging_piece_elements(args(CollKind::reduce_scatter, nullptr, nullptr, 16), 4, 64), 4u);
  // A piece smaller than one element of each block still moves one.
  EXPECT_EQ(staging_pieces(args(CollKind::allgather, nullptr, nullptr, 3), 64, 64), 3u);
  // Not cut: 0 bytes a piece; the other kinds; alltoallv.
  EXPECT_EQ(staging_pieces(args(CollKind::allreduce, nullptr, nullptr, 1000), 4, 0), 1u);
  for (CollKind k : {CollKind::broadcast, CollKind::reduce, CollKind::gather, CollKind::scatter, CollKind::alltoall})
    EXPECT_EQ(staging_pieces(args(k, nullptr, nullptr, 1000), 4, 64), 1u) << algorithms::to_string(k);
  CollArgs v = args(CollKind::allreduce, nullptr, nullptr, 1000);
  v.uniform = false;
  EXPECT_EQ(staging_pieces(v, 4, 64), 1u);
}

struct Piece {
  size_t k, count;
  const void *send, *recv;
};

// Runs `a` through PipelinedStaging on a LateDevice; play(piece, k, first) is the collective
// (first: the index of the piece's first element in each block).
template <class Play>
std::vector<Piece> staged(const CollArgs& a, int rank, int size, size_t piece_bytes, Play play) {
  algorithms::ScratchPool pool;  // first: the device's queued copies use it until the device goes
  testing::LateDevice dev;
  PipelinedStaging staging(pool, dev, a, rank, size, piece_bytes);
  const size_t per = staging_piece_elements(a, size, piece_bytes);
  std::vector<Piece> seen;
  staging.run([&](const CollArgs& p, size_t k) {
    EXPECT_EQ(p.memory.kind, Memory::Kind::host);
    EXPECT_FALSE(p.ready);
    EXPECT_EQ(p.kind, a.kind);
    seen.push_back({k, p.count, p.send, p.recv});
    play(p, k * per);
  });
  return seen;
}

// Element i of rank r's block: what the ranks contribute.
float input(int r, size_t i) {
  return static_cast<float>(1000 * r) + static_cast<float>(i);
}

TEST(PipelinedStaging, AllreducePiecesRunInPlaceAndLandInOrder) {
  for (bool in_place : {false, true}) {
    const size_t n = 16 * 7 + 3;  // 7 whole pieces of 16 floats and one of 3
    std::vector<float> send(n), out(n, -1.0f);
    for (size_t i = 0; i < n; ++i) send[i] = input(0, i);
    float* recv = in_place ? send.data() : out.data();
    const auto pieces =
        staged(args(CollKind::allreduce, send.data(), recv, n), 0, 4, 64, [&](const CollArgs& p, size_t first) {
          EXPECT_EQ(p.send, p.recv) << "a piece runs in place";
          float* h = static_cast<float*>(p.recv);
          for (size_t j = 0; j < p.count; ++j) {
            EXPECT_EQ(h[j], input(0, first + j)) << "piece element " << first + j << " not landed before its piece ran";
            h[j] *= 4;  // four ranks of equal inputs, summed
          }
        });
    ASSERT_EQ(pieces.size(), 8u);
    for (size_t k = 0; k < pieces.size(); ++k) {
      EXPECT_EQ(pieces[k].k, k);
      EXPECT_EQ(pieces[k].count, k < 7 ? 16u : 3u);
      EXPECT_NE(pieces[k].send, send.data()) << "a piece ran on the device buffer";
    }
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(recv[i], 4 * input(0, i)) << "element " << i << (in_place ? " in place" : "");
    if (!in_place) {
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(send[i], input(0, i)) << "the input was written";
    }
  }
}

TEST(PipelinedStaging, AllgatherPiecesGatherEveryRanksBlock) {
  const int w = 3, me = 1;
  const size_t n = 8 * 5 + 1, W = w;  // 96 bytes a piece: 8 floats of each block
  for (bool in_place : {false, true}) {
    std::vector<float> mine(n), out(n * W, -1.0f);
    float* send = in_place ? out.data() + me * n : mine.data();
    for (size_t i = 0; i < n; ++i) send[i] = input(me, i);
    const auto pieces =
        staged(args(CollKind::allgather, send, out.data(), n), me, w, 96, [&](const CollArgs& p, size_t first) {
          float* h = static_cast<float*>(p.recv);
          EXPECT_EQ(p.send, static_cast<const void*>(h + me * p.count))
              << "the piece's send is its own block of its output (in place)";
          for (size_t j = 0; j < p.count; ++j) {
            EXPECT_EQ(h[me * p.count + j], input(me, first + j)) << "not landed";
            for (int r = 0; r < w; ++r)
              if (r != me) h[r * p.count + j] = input(r, first + j);  // the other ranks' blocks arrive
          }
        });
    ASSERT_EQ(pieces.size(), 6u);
    EXPECT_EQ(pieces.back().count, 1u);
    for (size_t i = 0; i < n * W; ++i)
      ASSERT_EQ(out[i], input(static_cast<int>(i / n), i % n)) << "element " << i << (in_place ? " in place" : "");
  }
}

TEST(PipelinedStaging, ReduceScatterPiecesScatterTheirRanksBlocks) {
  const int w = 3, me = 2;
  const size_t n = 8 * 4 + 5, W = w;
  auto sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < w; ++r) s += input(r, i);
    return s;
  };
  for (bool in_place : {false, true}) {
    std::vector<float> all(n * W), out(n, -1.0f);
    for (size_t i = 0; i < n * W; ++i) all[i] = input(static_cast<int>(i / n), i % n);
    float* recv = in_place ? all.data() + me * n : out.data();
    const auto pieces =
        staged(args(CollKind::reduce_scatter, all.data(), recv, n), me, w, 96, [&](const CollArgs& p, size_t first) {
          float* h = const_cast<float*>(static_cast<const float*>(p.send));
          EXPECT_EQ(p.recv, static_cast<void*>(h + me * p.count))
              << "the piece's recv is its own block of its input (in place)";
          for (size_t j = 0; j < p.count; ++j) {
            float s = 0;
            for (int r = 0; r < w; ++r) {
              EXPECT_EQ(h[r * p.count + j], input(r, first + j)) << "block " << r << " not landed";
              s += h[r * p.count + j];
            }
            h[me * p.count + j] = s;  // stands for everyone's contributions to this rank's block
          }
        });
    ASSERT_EQ(pieces.size(), 5u);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[i], sum(i)) << "element " << i << (in_place ? " in place" : "");
  }
}

// A piece that fails: its error comes out of run(), and by then the copies queued meanwhile have
// landed (the output of the pieces before it, copied back; nothing after), so the caller may
// free its buffers and the pool.
TEST(PipelinedStaging, AFailedPieceLeavesNoCopyInFlight) {
  const size_t n = 16 * 6;
  std::vector<float> send(n), out(n, -1.0f);
  for (size_t i = 0; i < n; ++i) send[i] = input(0, i);
  algorithms::ScratchPool pool;
  testing::LateDevice dev;
  PipelinedStaging staging(pool, dev, args(CollKind::allreduce, send.data(), out.data(), n), 0, 2, 64);
  EXPECT_THROW(staging.run([](const CollArgs& p, size_t k) {
    if (k == 2) throw std::runtime_error("piece 2 failed");
    float* h = static_cast<float*>(p.recv);
    for (size_t j = 0; j < p.count; ++j) h[j] *= 2;
  }),
               std::runtime_error);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i], i < 32 ? 2 * input(0, i) : -1.0f) << "element " << i << " right after the error";
}

// The three host buffers in turn: a piece never runs on the buffer a copy of another piece
// still uses (the late copies would have shown it above as well).
TEST(PipelinedStaging, ConsecutivePiecesUseThreeBuffersInTurn) {
  const size_t n = 16 * 6;
  std::vector<float> a(n, 1.0f);
  const auto pieces =
      staged(args(CollKind::allreduce, a.data(), a.data(), n), 0, 2, 64, [](const CollArgs&, size_t) {});
  ASSERT_EQ(pieces.size(), 6u);
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (k >= 1) {
      EXPECT_NE(pieces[k].recv, pieces[k - 1].recv);
    }
    if (k >= 2) {
      EXPECT_NE(pieces[k].recv, pieces[k - 2].recv);
    }
    if (k >= 3) {
      EXPECT_EQ(pieces[k].recv, pieces[k - 3].recv);
    }
  }
}

}  // namespace
}  // namespace smddp::detail
