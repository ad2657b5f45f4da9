// The Kunlun XPU runtime, loaded at run time: dlopen("libxpurt.so") and its
// symbols resolved once, so paddle-ext builds and runs without the Kunlun SDK
// and uses the runtime that Paddle's XPU wheel already brought into the
// process. Backs the XPU pinned-memory allocator and DeviceEvent.
//
//   const auto* rt = paddle_ext::runtime::xpu::api();   // nullptr: no runtime
//   if (!rt) log(paddle_ext::runtime::xpu::unavailable_reason());
//   paddle_ext::runtime::xpu::check(rt->malloc(&p, n, XPU_MEM_MAIN), "xpu_malloc");
#pragma once

#include <string>

#include "xpu/runtime_decls.h"

namespace paddle_ext::runtime::xpu {

struct Api {
  std::string library;  // the path or name that was loaded
  // Required: loading fails without any of these.
  decltype(&::xpu_device_count) device_count = nullptr;
  decltype(&::xpu_current_device) current_device = nullptr;
  decltype(&::xpu_set_device) set_device = nullptr;
  decltype(&::xpu_malloc) malloc = nullptr;
  decltype(&::xpu_free) free = nullptr;
  decltype(&::xpu_memcpy) memcpy = nullptr;
  decltype(&::xpu_wait) wait = nullptr;
  decltype(&::xpu_event_create) event_create = nullptr;
  decltype(&::xpu_event_record) event_record = nullptr;
  decltype(&::xpu_event_wait) event_wait = nullptr;
  decltype(&::xpu_event_destroy) event_destroy = nullptr;
  // Optional: nullptr when this runtime version lacks them.
  decltype(&::xpu_get_runtime_version) get_runtime_version = nullptr;
  decltype(&::xpu_host_alloc) host_alloc = nullptr;
  decltype(&::xpu_host_free) host_free = nullptr;
  decltype(&::xpu_stream_wait_event) stream_wait_event = nullptr;
};

// The runtime, loaded on first use (thread-safe), or nullptr when it cannot
// be loaded. Looks at $PADDLE_EXT_XPURT (a path) first, then "libxpurt.so" on
// the loader's search path.
const Api* api();

// Why api() is nullptr, e.g. "no XPU runtime (libxpurt.so not found: ...)";
// empty when the runtime is loaded.
const std::string& unavailable_reason();

// The runtime, or throws std::runtime_error with unavailable_reason().
const Api& require();

// A description of an XRE error code: "XPUERR_NOMEM (705): device memory not enough".
std::string describe(int code);

// Throws std::runtime_error("<what> failed: <describe(code)>") unless code is 0.
void check(int code, const char* what);

// Devices visible to the runtime; 0 when there is no runtime.
int device_count();

}  // namespace paddle_ext::runtime::xpu
