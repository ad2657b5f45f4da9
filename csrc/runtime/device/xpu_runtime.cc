#include "device/xpu_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace paddle_ext::runtime::xpu {
namespace {

struct Loaded {
  Api api;
  bool ok = false;
  std::string reason;
};

template <typename Fn>
bool resolve(void* handle, const char* name, Fn* slot, std::string* missing) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    if (missing != nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(name);
    return false;
  }
  *slot = reinterpret_cast<Fn>(symbol);
  return true;
}

Loaded load() {
  Loaded out;
  const char* override_path = std::getenv("PADDLE_EXT_XPURT");
  const std::string library = override_path != nullptr && *override_path != '\0' ? override_path : "libxpurt.so";
  dlerror();
  // RTLD_LOCAL: the symbols stay out of the global namespace; when Paddle's
  // XPU build already loaded the runtime, this returns that same copy.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    out.reason = "no XPU runtime (" + library + " not found" + (why != nullptr ? std::string(": ") + why : "") + ")";
    return out;
  }
  Api& a = out.api;
  a.library = library;
  std::string missing;
  resolve(handle, "xpu_device_count", &a.device_count, &missing);
  resolve(handle, "xpu_current_device", &a.current_device, &missing);
  resolve(handle, "xpu_set_device", &a.set_device, &missing);
  resolve(handle, "xpu_malloc", &a.malloc, &missing);
  resolve(handle, "xpu_free", &a.free, &missing);
  resolve(handle, "xpu_memcpy", &a.memcpy, &missing);
  resolve(handle, "xpu_wait", &a.wait, &missing);
  resolve(handle, "xpu_event_create", &a.event_create, &missing);
  resolve(handle, "xpu_event_record", &a.event_record, &missing);
  resolve(handle, "xpu_event_wait", &a.event_wait, &missing);
  resolve(handle, "xpu_event_destroy", &a.event_destroy, &missing);
  resolve(handle, "xpu_get_runtime_version", &a.get_runtime_version, nullptr);
  resolve(handle, "xpu_host_alloc", &a.host_alloc, nullptr);
  resolve(handle, "xpu_host_free", &a.host_free, nullptr);
  resolve(handle, "xpu_stream_wait_event", &a.stream_wait_event, nullptr);
  if (!missing.empty()) {
    out.reason = "unusable XPU runtime (" + library + " lacks " + missing + ")";
    dlclose(handle);
    out.api = Api{};
    return out;
  }
  // The handle stays open for the life of the process.
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  static const Loaded instance = load();  // thread-safe one-time initialisation
  return instance;
}

const char* error_name(int code) {
  switch (code) {
    case XPU_SUCCESS:
      return "XPU_SUCCESS";
    case XPUERR_INVALID_DEVICE:
      return "XPUERR_INVALID_DEVICE";
    case XPUERR_UNINIT:
      return "XPUERR_UNINIT";
    case XPUERR_NODEV:
      return "XPUERR_NODEV";
    case XPUERR_VERSION:
      return "XPUERR_VERSION";
    case XPUERR_NOMEM:
      return "XPUERR_NOMEM";
    case XPUERR_NOCPUMEM:
      return "XPUERR_NOCPUMEM";
    case XPUERR_INVALID_PARAM:
      return "XPUERR_INVALID_PARAM";
    case XPUERR_NOSUPPORT:
      return "XPUERR_NOSUPPORT";
    case XPUERR_ABNORMAL:
      return "XPUERR_ABNORMAL";
    case XPUERR_TIMEOUT:
      return "XPUERR_TIMEOUT";
    case XPUERR_BUSY:
      return "XPUERR_BUSY";
    default:
      return nullptr;
  }
}

const char* error_text(int code) {
  switch (code) {
    case XPU_SUCCESS:
      return "success";
    case XPUERR_INVALID_DEVICE:
      return "invalid XPU device";
    case XPUERR_UNINIT:
      return "XPU runtime not initialised";
    case XPUERR_NODEV:
      return "no XPU device";
    case XPUERR_VERSION:
      return "driver and runtime versions do not match";
    case XPUERR_NOMEM:
      return "device memory not enough";
    case XPUERR_NOCPUMEM:
      return "host memory not enough";
    case XPUERR_INVALID_PARAM:
      return "invalid parameter";
    case XPUERR_NOSUPPORT:
      return "operation not supported";
    case XPUERR_ABNORMAL:
      return "device abnormal after an earlier error";
    case XPUERR_TIMEOUT:
      return "kernel execution timed out";
    case XPUERR_BUSY:
      return "resource busy";
    default:
      return "unknown XPU runtime error";
  }
}

}  // namespace

const Api* api() { return loaded().ok ? &loaded().api : nullptr; }

const std::string& unavailable_reason() { return loaded().reason; }

const Api& require() {
  const Api* a = api();
  if (a == nullptr) throw std::runtime_error(unavailable_reason());
  return *a;
}

std::string describe(int code) {
  const int magnitude = code < 0 ? -code : code;  // the runtime may return codes negated
  const char* name = error_name(magnitude);
  return std::string(name != nullptr ? name : "XPU error") + " (" + std::to_string(code) +
         "): " + error_text(magnitude);
}

void check(int code, const char* what) {
  if (code != XPU_SUCCESS) throw std::runtime_error(std::string(what) + " failed: " + describe(code));
}

int device_count() {
  const Api* a = api();
  if (a == nullptr) return 0;
  int count = 0;
  check(a->device_count(&count), "xpu_device_count");
  return count;
}

}  // namespace paddle_ext::runtime::xpu
