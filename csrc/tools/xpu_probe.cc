// Host probe of the XPU runtime loader (csrc/runtime/device/xpu_runtime.cc):
//  - without libxpurt.so it prints "xpu: no XPU runtime (libxpurt.so not
//    found: ...)" and exits 0;
//  - with a runtime it prints the version and device count and, with a
//    device, round-trips 4 KiB through device memory and waits on an event;
//    exit 1 if any of that fails.
// Built and run by ci/xpu-compile.sh, once as is and once against
// csrc/tools/fake_xpurt.cc (a stand-in runtime) to exercise the loaded path.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <vector>

#include "device/xpu_runtime.h"

namespace xpu = paddle_ext::runtime::xpu;

int main() {
  const xpu::Api* rt = xpu::api();
  if (rt == nullptr) {
    std::printf("xpu: %s\n", xpu::unavailable_reason().c_str());
    try {
      xpu::require();
      std::printf("xpu: require() returned without a runtime\n");
      return 1;
    } catch (const std::runtime_error& e) {
      std::printf("xpu: require() throws std::runtime_error: %s\n", e.what());
    }
    return 0;
  }
  try {
    uint32_t major = 0, minor = 0;
    if (rt->get_runtime_version != nullptr) xpu::check(rt->get_runtime_version(&major, &minor), "xpu_get_runtime_version");
    const int count = xpu::device_count();
    std::printf("xpu: runtime %s (version %u.%u), %d device(s); optional symbols: host_alloc %s, stream_wait_event %s\n",
                rt->library.c_str(), major, minor, count, rt->host_alloc ? "yes" : "no",
                rt->stream_wait_event ? "yes" : "no");
    if (count == 0) return 0;
    xpu::check(rt->set_device(0), "xpu_set_device");
    std::vector<uint8_t> host(4096), back(4096);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
    void* device = nullptr;
    xpu::check(rt->malloc(&device, host.size(), XPU_MEM_MAIN), "xpu_malloc");
    xpu::check(rt->memcpy(device, host.data(), host.size(), XPU_HOST_TO_DEVICE), "xpu_memcpy");
    XPUEvent event = nullptr;
    xpu::check(rt->event_create(&event), "xpu_event_create");
    xpu::check(rt->event_record(event, nullptr), "xpu_event_record");
    xpu::check(rt->event_wait(event), "xpu_event_wait");
    xpu::check(rt->event_destroy(event), "xpu_event_destroy");
    xpu::check(rt->wait(nullptr), "xpu_wait");
    xpu::check(rt->memcpy(back.data(), device, back.size(), XPU_DEVICE_TO_HOST), "xpu_memcpy");
    xpu::check(rt->free(device), "xpu_free");
    const bool same = back == host;
    std::printf("xpu: device 0: 4 KiB round trip %s\n", same ? "ok" : "MISMATCH");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("xpu: error: %s\n", e.what());
    return 1;
  }
}
