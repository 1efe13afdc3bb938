// What the consistency check (docs/reliability.md) costs a small collective end to end, measured
// so that this VM's two core-to-core speeds (docs/performance.md) cannot pass for it: every rank
// holds two communicators, one made with the check on and one with it off, and runs short
// blocks of the same collective on each in turn (on, off, off, on, ...), so both see the same
// machine state within tens of microseconds. Prints, per collective, the median time per call with
// the check on and off and the median of the paired differences (each "on" block against the
// "off" block beside it), with its quartiles. Both communicators' outputs are checked after.
//   consistency-cost-interleaved [-np N] [-b BYTES] [-blocks K] [-per P] [-c allreduce,allgather,reduce_scatter]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "fork_ranks.h"
#include "smddp/smddp.h"

namespace {

using namespace smddp;
using Clock = std::chrono::steady_clock;

struct Args {
  int np = 2;
  size_t bytes = 8;
  int blocks = 2000;  // pairs of blocks
  int per = 100;      // calls per block
  std::vector<std::string> colls{"allreduce", "allgather", "reduce_scatter"};
};

// Linear interpolation between the two nearest ranks (the median of an even count is the mean
// of the middle two).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// What rank r puts at element i: small integers, so every sum is exact in f32.
float value(int r, size_t i) { return static_cast<float>(r * 7 + static_cast<int>(i % 1000)); }

int run_rank(const Args& a, int rank, const std::string& dir) {
  // The setting is read when a communicator is made: one of each.
  setenv("SMDDP_CHECK_CONSISTENCY", "1", 1);
  auto store = std::make_shared<FileStore>(dir + "/store");
  Options on_opts, off_opts;
  on_opts.name = "check-on";
  off_opts.name = "check-off";
  on_opts.timeout = off_opts.timeout = std::chrono::seconds(60);  // a rank that failed stops the rest
  Communicator on(store, rank, a.np, on_opts);
  setenv("SMDDP_CHECK_CONSISTENCY", "0", 1);
  Communicator off(store, rank, a.np, off_opts);
  const size_t w = static_cast<size_t>(a.np);
  const size_t count = std::max<size_t>(1, a.bytes / sizeof(float));
  std::vector<float> in(count * w), out(count * w);
  for (size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
  if (rank == 0) {
    std::printf("# consistency-cost-interleaved: %d ranks, %zu B, %d pairs of %d-call blocks\n", a.np,
                count * sizeof(float), a.blocks, a.per);
    std::printf("| collective | check on: median ns | check off: median ns | paired cost: q1 / median / q3 ns | on/off |\n");
    std::printf("| --- | --- | --- | --- | --- |\n");
  }
  long wrong = 0;
  for (const std::string& coll : a.colls) {
    auto call = [&](Communicator& c) {
      if (coll == "allreduce") c.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum).wait();
      else if (coll == "allgather") c.allgather(in.data(), out.data(), count, DataType::f32).wait();
      else c.reduce_scatter(in.data(), out.data(), count, DataType::f32, ReduceOp::sum).wait();
    };
    auto block = [&](Communicator& c) {
      const auto t0 = Clock::now();
      for (int i = 0; i < a.per; ++i) call(c);
      return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / a.per;
    };
    for (int i = 0; i < 200; ++i) call(on), call(off);
    std::vector<double> t_on, t_off, diff;
    for (int k = 0; k < a.blocks; ++k) {
      double x, y;
      if (k % 2 == 0) x = block(on), y = block(off);
      else y = block(off), x = block(on);
      t_on.push_back(x), t_off.push_back(y), diff.push_back(x - y);
    }
    // Both communicators' results, against a plain loop over what every rank put in.
    for (Communicator* c : {&on, &off}) {
      std::fill(out.begin(), out.end(), -1.0f);
      call(*c);
      const size_t n_out = coll == "allgather" ? count * w : count;
      for (size_t i = 0; i < n_out; ++i) {
        float want = 0;
        if (coll == "allgather") want = value(static_cast<int>(i / count), i % count);
        else
          for (int r = 0; r < a.np; ++r)
            want += value(r, coll == "reduce_scatter" ? static_cast<size_t>(rank) * count + i : i);
        wrong += out[i] != want;
      }
    }
    if (rank == 0) {
      const double mon = quantile(t_on, 0.5), moff = quantile(t_off, 0.5);
      std::printf("| %s | %.1f | %.1f | %+.1f / %+.1f / %+.1f | %.3f |\n", coll.c_str(), mon, moff, quantile(diff, 0.25),
                  quantile(diff, 0.5), quantile(diff, 0.75), mon / moff);
      std::fflush(stdout);
    }
  }
  if (wrong) std::fprintf(stderr, "rank %d: %ld wrong output elements\n", rank, wrong);
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto usage = [] {
    std::fprintf(stderr, "usage: consistency-cost-interleaved [-np N] [-b BYTES] [-blocks K] [-per P] "
                         "[-c allreduce,allgather,reduce_scatter]\n");
    return 2;
  };
  if (argc % 2 == 0) return usage();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "-np") a.np = std::atoi(v.c_str());
    else if (k == "-b") a.bytes = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "-blocks") a.blocks = std::atoi(v.c_str());
    else if (k == "-per") a.per = std::atoi(v.c_str());
    else if (k == "-c") {
      a.colls.clear();
      std::stringstream ss(v);
      for (std::string c; std::getline(ss, c, ',');) a.colls.push_back(c);
    } else {
      return usage();
    }
  }
  bool known = true;
  for (const std::string& c : a.colls) known &= c == "allreduce" || c == "allgather" || c == "reduce_scatter";
  if (a.np < 1 || a.blocks < 1 || a.per < 1 || a.colls.empty() || !known) return usage();
  return bench::run_forked_ranks(a.np, "consistency-cost-interleaved",
                                 [&](int rank, const std::string& dir) { return run_rank(a, rank, dir); });
}
