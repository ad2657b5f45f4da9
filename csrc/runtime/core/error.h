// One error type for every native runtime failure: the backend that failed,
// its native error code and that code's name (cudaErrorNoDevice,
// hipErrorInvalidDevice, XPUERR_NOCPUMEM, ENOMEM, ...). The bindings turn it
// into paddle_ext.runtime.DeviceError with .backend, .code and .name, so that
// callers can branch on the code instead of parsing messages.
//
// OutOfMemory is the subtype the allocator reacts to: it frees idle chunks
// and retries before letting it reach the caller (as MemoryError in Python).
#pragma once

#include <stdexcept>
#include <string>

namespace paddle_ext::runtime {

class DeviceError : public std::runtime_error {
 public:
  // "<backend> error <name> (<code>): <text> [<during>]"
  DeviceError(std::string backend, int code, std::string name, const std::string& text, const std::string& during);

  const std::string& backend() const noexcept { return backend_; }
  int code() const noexcept { return code_; }
  const std::string& name() const noexcept { return name_; }

 private:
  std::string backend_;
  int code_;
  std::string name_;
};

class OutOfMemory : public DeviceError {
 public:
  using DeviceError::DeviceError;
  // The same native error with the pool's own account appended to the message.
  OutOfMemory(const OutOfMemory& native, const std::string& context);
};

// The name of a POSIX errno value ("ENOMEM"), or "E<number>" for one not listed.
std::string errno_name(int err);

}  // namespace paddle_ext::runtime
