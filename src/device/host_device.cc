#include "device/device.h"
#include "device/host_copy.h"

namespace smddp::device {

namespace {
class HostDevice final : public Device {
 public:
  const char* name() const override { return "host"; }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes) host_copy(dst, src, bytes);
  }
  void reduce(const reduce::ReduceArgs& args) override { reduce::reduce(args); }
  bool network_addressable() const override { return true; }
};
}  // namespace

Device& host() {
  static HostDevice d;
  return d;
}

}  // namespace smddp::device
