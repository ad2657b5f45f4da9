#include "core/error.h"

#include <cerrno>
#include <cstring>
#include <utility>

namespace paddle_ext::runtime {
namespace {

std::string compose(const std::string& backend, int code, const std::string& name, const std::string& text,
                    const std::string& during) {
  std::string out = backend + " error " + name + " (" + std::to_string(code) + "): " + text;
  if (!during.empty()) out += " [" + during + "]";
  return out;
}

}  // namespace

DeviceError::DeviceError(std::string backend, int code, std::string name, const std::string& text,
                         const std::string& during)
    : std::runtime_error(compose(backend, code, name, text, during)),
      backend_(std::move(backend)),
      code_(code),
      name_(std::move(name)) {}

OutOfMemory::OutOfMemory(const OutOfMemory& native, const std::string& context)
    : DeviceError(native) {
  // std::runtime_error has no setter: rebuild with the longer message.
  static_cast<std::runtime_error&>(*this) = std::runtime_error(std::string(native.what()) + "; " + context);
}

std::string errno_name(int err) {
  switch (err) {
    case ENOMEM: return "ENOMEM";
    case EPERM: return "EPERM";
    case EAGAIN: return "EAGAIN";
    case EINVAL: return "EINVAL";
    case EACCES: return "EACCES";
    case ENFILE: return "ENFILE";
    case EMFILE: return "EMFILE";
    case EOVERFLOW: return "EOVERFLOW";
    default: return "E" + std::to_string(err);
  }
}

}  // namespace paddle_ext::runtime
