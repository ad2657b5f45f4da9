// A stand-in libxpurt.so for the XPU compile leg, which has no Kunlun SDK: it
// defines the functions of csrc/include/xpu/runtime_decls.h (so the compiler
// checks them against those prototypes) over host memory, with one "device"
// ($FAKE_XPU_DEVICES overrides the count). ci/xpu-compile.sh builds it as a
// shared library named libxpurt.so and runs csrc/tools/xpu_probe.cc against it
// to exercise the loader's dlopen / dlsym path. Never shipped.
#include <cstdlib>
#include <cstring>

#include "xpu/runtime_decls.h"

namespace {
thread_local int current = 0;

int devices() {
  const char* env = std::getenv("FAKE_XPU_DEVICES");
  return env != nullptr ? std::atoi(env) : 1;
}
}  // namespace

extern "C" {

int xpu_get_runtime_version(uint32_t* major, uint32_t* minor) {
  *major = 0;
  *minor = 0;
  return XPU_SUCCESS;
}

int xpu_device_count(int* count) {
  *count = devices();
  return XPU_SUCCESS;
}

int xpu_current_device(int* device) {
  *device = current;
  return XPU_SUCCESS;
}

int xpu_set_device(int device) {
  if (device < 0 || device >= devices()) return XPUERR_INVALID_DEVICE;
  current = device;
  return XPU_SUCCESS;
}

int xpu_malloc(void** device_ptr, uint64_t bytes, XPUMemoryKind) {
  *device_ptr = std::malloc(bytes);
  return *device_ptr != nullptr ? XPU_SUCCESS : XPUERR_NOMEM;
}

int xpu_free(void* device_ptr) {
  std::free(device_ptr);
  return XPU_SUCCESS;
}

int xpu_memcpy(void* dst, const void* src, uint64_t bytes, XPUMemcpyKind) {
  std::memcpy(dst, src, bytes);
  return XPU_SUCCESS;
}

int xpu_host_alloc(void** host_ptr, uint64_t bytes, unsigned int flags) {
  if (flags != 0) return XPUERR_INVALID_PARAM;
  *host_ptr = std::malloc(bytes);
  return *host_ptr != nullptr ? XPU_SUCCESS : XPUERR_NOCPUMEM;
}

int xpu_host_free(void* host_ptr) {
  std::free(host_ptr);
  return XPU_SUCCESS;
}

int xpu_wait(XPUStream) { return XPU_SUCCESS; }

int xpu_event_create(XPUEvent* event) {
  *event = std::malloc(1);
  return XPU_SUCCESS;
}

int xpu_event_record(XPUEvent, XPUStream) { return XPU_SUCCESS; }

int xpu_event_wait(XPUEvent) { return XPU_SUCCESS; }

int xpu_event_destroy(XPUEvent event) {
  std::free(event);
  return XPU_SUCCESS;
}

int xpu_stream_wait_event(XPUStream, XPUEvent) { return XPU_SUCCESS; }

}  // extern "C"
