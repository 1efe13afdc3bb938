// Adapts PyTorch's c10d::Store (the rendezvous store torchrun/init_process_group made) to the
// smddp::Store interface the core library uses.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "smddp/store.h"

namespace smddp::torch_backend {

class C10dStore final : public smddp::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    store_->wait({key}, timeout);
    return store_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    store_->wait(keys, timeout);
  }
  bool check(const std::string& key) override { return store_->check({key}); }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace smddp::torch_backend
