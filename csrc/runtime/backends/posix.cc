#include "backends/posix.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "backends/cpu_event.h"
#include "core/error.h"
#include "core/registry.h"

namespace paddle_ext::runtime {
namespace {

std::int64_t memlock_limit() {
  struct rlimit r {};
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<std::int64_t>(r.rlim_cur);
}

std::string limit_text() {
  const std::int64_t limit = memlock_limit();
  return "RLIMIT_MEMLOCK " + (limit < 0 ? std::string("unlimited") : std::to_string(limit) + " B");
}

}  // namespace

LockMode parse_lock_mode(const std::string& text) {
  if (text == "try") return LockMode::kTry;
  if (text == "require") return LockMode::kRequire;
  if (text == "off") return LockMode::kOff;
  throw std::invalid_argument("mlock must be one of 'try', 'require', 'off', got '" + text + "'");
}

const char* to_string(LockMode mode) {
  switch (mode) {
    case LockMode::kTry: return "try";
    case LockMode::kRequire: return "require";
    case LockMode::kOff: return "off";
  }
  return "?";
}

PosixHostBackend::PosixHostBackend(LockMode mode)
    : mode_(mode), page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {}

void* PosixHostBackend::allocate(std::size_t bytes) {
  const std::string during = "mmap of " + std::to_string(bytes) + " B";
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) throw OutOfMemory("posix", err, errno_name(err), std::strerror(err), during);
    throw DeviceError("posix", err, errno_name(err), std::strerror(err), during);
  }
  bool locked = false;
  int err = 0;
  if (mode_ != LockMode::kOff) {
    locked = mlock(p, bytes) == 0;
    if (!locked) err = errno;
  }
  if (!locked && mode_ == LockMode::kRequire) {
    munmap(p, bytes);
    const std::string what = "mlock of " + std::to_string(bytes) + " B, " + limit_text();
    if (err == ENOMEM || err == EAGAIN) throw OutOfMemory("posix", err, errno_name(err), std::strerror(err), what);
    throw DeviceError("posix", err, errno_name(err), std::strerror(err), what);
  }
  bool warn = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    locked_.emplace(p, locked);
    (locked ? locked_bytes_ : unlocked_bytes_) += static_cast<std::int64_t>(bytes);
    if (err != 0) {
      ++mlock_failures_;
      last_errno_ = err;
      warn = !warned_;
      warned_ = true;
    }
  }
  if (warn)
    std::fprintf(stderr,
                 "paddle_ext: mlock of %zu B refused (%s: %s; %s); the pinned pool continues with pageable "
                 "memory. Grant CAP_IPC_LOCK or raise the limit to pin, or set PADDLE_EXT_PINNED_MLOCK=require "
                 "to fail instead.\n",
                 bytes, errno_name(err).c_str(), std::strerror(err), limit_text().c_str());
  return p;
}

void PosixHostBackend::deallocate(void* ptr, std::size_t bytes) {
  bool locked = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = locked_.find(ptr);
    if (it == locked_.end()) throw std::logic_error("posix backend: deallocate of a pointer it did not map");
    locked = it->second;
    locked_.erase(it);
    (locked ? locked_bytes_ : unlocked_bytes_) -= static_cast<std::int64_t>(bytes);
  }
  // munmap drops the lock with the mapping.
  if (munmap(ptr, bytes) != 0) {
    const int err = errno;
    throw DeviceError("posix", err, errno_name(err), std::strerror(err), "munmap of " + std::to_string(bytes) + " B");
  }
}

std::shared_ptr<EventBackend> PosixHostBackend::events() { return CpuEventBackend::instance(); }

std::map<std::string, std::int64_t> PosixHostBackend::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"locked_bytes", locked_bytes_},
          {"unlocked_bytes", unlocked_bytes_},
          {"mlock_failures", mlock_failures_},
          {"last_mlock_errno", last_errno_},
          {"rlimit_memlock", memlock_limit()}};
}

namespace {
const Registrar registrar({"posix", 1, [] { return std::static_pointer_cast<HostBackend>(std::make_shared<PosixHostBackend>()); },
                           nullptr, nullptr});
}  // namespace

}  // namespace paddle_ext::runtime
