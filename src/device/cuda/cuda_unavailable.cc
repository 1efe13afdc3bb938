// cuda.h in a build without CUDA (SMDDP_WITH_CUDA=OFF or no nvcc): nothing is usable, and
// asking for a device says why instead of failing somewhere deeper.
#include <string>

#include "device/cuda.h"
#include "smddp/errors.h"

namespace smddp::device {

namespace {
[[noreturn]] void unavailable() {
  throw InvalidArgument("smddp: this build has no CUDA support (configured with SMDDP_WITH_CUDA=OFF or without nvcc)");
}
}  // namespace

bool cuda_usable(std::string* why) {
  if (cuda_stand_in()) return true;
  if (why) *why = "smddp was built without CUDA (SMDDP_WITH_CUDA=OFF or no nvcc at build time)";
  return false;
}
int cuda_device_count() { return cuda_stand_in() ? 1 : 0; }
std::unique_ptr<Device> cuda_device(int ordinal) {
  if (cuda_stand_in()) return cuda_stand_in()(ordinal);
  unavailable();
}
std::unique_ptr<PeerWindows> cuda_ipc_windows(Device&) { unavailable(); }
size_t cuda_ipc_opens(const PeerWindows&) { unavailable(); }
std::shared_ptr<void> cuda_event_after(void*, int) { unavailable(); }
void cuda_wait(Device&, const void*) { unavailable(); }
void* cuda_stream(Device&) { unavailable(); }
void* cuda_malloc(size_t) { unavailable(); }
void cuda_free(void*) {}
bool cuda_register_host(void*, size_t) { return false; }
void cuda_unregister_host(void*) {}

}  // namespace smddp::device
