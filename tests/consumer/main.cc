// Single-rank allreduce through the installed library: exits 0 only if the result is right.
#include <smddp/smddp.h>

#include <cstdio>
#include <filesystem>
#include <unistd.h>

int main() {
  auto dir = std::filesystem::temp_directory_path() / ("smddp-consumer-" + std::to_string(getpid()));
  int rc = 1;
  {
    smddp::Communicator comm(std::make_shared<smddp::FileStore>(dir.string()), 0, 1);
    // Out of place, into zeros, scaled: a call that did nothing or copied would not give this.
    const float in[3] = {1, 2, 3};
    float v[3] = {0, 0, 0};
    comm.allreduce(in, v, 3, smddp::DataType::f32, smddp::Reduction::premul_sum(2.0)).wait();
    std::printf("smddp %s (%s): allreduce gave %g %g %g\n", smddp::version(), smddp::build_info(), v[0], v[1], v[2]);
    rc = (v[0] == 2 && v[1] == 4 && v[2] == 6) ? 0 : 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
