// Rendezvous key-value store: how the ranks of a communicator find each other.
// PyTorch's c10d::Store is adapted to this interface by the Python extension; FileStore is the
// standalone implementation for C++ programs and tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smddp {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until the key exists (or the timeout passes: TimeoutError), then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer stored at key (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; TimeoutError naming the missing keys otherwise.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Whether the key exists, without waiting.
  virtual bool check(const std::string& key) = 0;
};

// Store kept as files in a directory shared by all ranks (a local or network filesystem).
class FileStore : public Store {
 public:
  explicit FileStore(std::string directory);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::string& key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Prepends a prefix to every key: lets several communicators share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(prefix_ + key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> k;
    k.reserve(keys.size());
    for (auto& s : keys) k.push_back(prefix_ + s);
    inner_->wait(k, timeout);
  }
  bool check(const std::string& key) override { return inner_->check(prefix_ + key); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace smddp
