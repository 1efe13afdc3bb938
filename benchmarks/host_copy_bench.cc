// Copy speed by where the destination lies from the source, one core, in cache: glibc's memcpy
// beside each of host_copy's loops (src/device/host_copy.h says why both exist). The destination
// sits 0, 16, 64 or 4080 bytes past the source modulo a page (4080: 16 bytes behind). A staging
// slot is page-aligned and a malloc'd buffer starts 16 bytes into a page, so 16 is met often.
// Only 16 takes the loop: at the other distances every column is memcpy, by design.
//
//   host-copy-bench [sizes in bytes...]     (default 16384 131072 1048576 4194304)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/host_copy.h"

int main(int argc, char** argv) {
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 0));
  if (sizes.empty()) sizes = {16384, 131072, 1 << 20, 4 << 20};
  std::vector<std::string> kinds = {"libc"};
  for (const char* k : {"sse2", "avx2"}) {
    try {
      char a = 0, b = 0;
      smddp::device::host_copy_as(k, &b, &a, 1);
      kinds.push_back(k);
    } catch (const std::exception&) {
    }
  }
  size_t most = 0;
  for (size_t n : sizes) most = std::max(most, n);
  auto* src = static_cast<char*>(std::aligned_alloc(4096, most + 4096));
  auto* dst = static_cast<char*>(std::aligned_alloc(4096, most + 4096));
  std::memset(src, 1, most + 4096);
  std::memset(dst, 2, most + 4096);
  std::printf("# GB/s, best of 5; offset: bytes the destination lies past the source, modulo 4096\n");
  std::printf("%10s %6s", "size(B)", "offset");
  for (const auto& k : kinds) std::printf(" %9s", k.c_str());
  std::printf("\n");
  for (size_t n : sizes)
    for (size_t off : {0, 16, 64, 4080}) {
      std::printf("%10zu %6zu", n, off);
      for (const auto& k : kinds) {
        const int iters = static_cast<int>(std::max<size_t>(4, (256u << 20) / n));
        double best = 1e30;
        for (int r = 0; r < 5; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < iters; ++i) smddp::device::host_copy_as(k, dst + off, src, n);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf(" %9.1f", static_cast<double>(n) * iters / best / 1e9);
      }
      std::printf("\n");
    }
  std::free(src);
  std::free(dst);
}
