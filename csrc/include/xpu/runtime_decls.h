// The project's own declarations of the few Kunlun XPU runtime (XRE,
// libxpurt.so) functions and types that paddle-ext uses. No Kunlun SDK can be
// installed here, so nothing links against libxpurt: csrc/runtime/device/
// xpu_runtime.cc dlopens it and resolves these names, and these prototypes
// exist to give its function pointers their exact types (decltype(&xpu_malloc)).
//
// Signatures, enum values and error codes follow the SDK's xpu/runtime.h and
// xpu/defs.h, the headers PaddlePaddle's XPU backend (paddle/phi/backends/xpu)
// compiles against. Every function returns 0 (XPU_SUCCESS) or an error code;
// the SDK's xpu_strerror is a static inline function of its header, not a
// symbol of the library, so the loader carries its own descriptions.
//
// Do not include this together with the SDK's <xpu/runtime.h>.
#pragma once

#include <stdint.h>

#if defined(__cplusplus)
extern "C" {
#endif

typedef void* XPUStream;  // an XPU stream; NULL is the default stream
typedef void* XPUEvent;

typedef enum {
  XPU_MEM_MAIN = 0,  // HBM / GDDR
  XPU_MEM_L3 = 1,
} XPUMemoryKind;

typedef enum {
  XPU_DEVICE_TO_HOST = 0,
  XPU_HOST_TO_DEVICE = 1,
  XPU_DEVICE_TO_DEVICE = 2,
} XPUMemcpyKind;

// Error codes: XPU_ERRNO_BASE (700) + n. Calls may return them negated.
enum {
  XPU_SUCCESS = 0,
  XPUERR_INVALID_DEVICE = 701,
  XPUERR_UNINIT = 702,
  XPUERR_NODEV = 703,
  XPUERR_VERSION = 704,
  XPUERR_NOMEM = 705,
  XPUERR_NOCPUMEM = 706,
  XPUERR_INVALID_PARAM = 707,
  XPUERR_NOSUPPORT = 712,
  XPUERR_ABNORMAL = 713,
  XPUERR_TIMEOUT = 715,
  XPUERR_BUSY = 716,
};

// Versions and devices.
int xpu_get_runtime_version(uint32_t* major, uint32_t* minor);
int xpu_device_count(int* count);
int xpu_current_device(int* device);
int xpu_set_device(int device);

// Device memory (on the current device) and synchronous copies.
int xpu_malloc(void** device_ptr, uint64_t bytes, XPUMemoryKind kind);
int xpu_free(void* device_ptr);
int xpu_memcpy(void* dst, const void* src, uint64_t bytes, XPUMemcpyKind kind);

// Page-locked host memory, usable to speed up xpu_memcpy (flags must be 0).
int xpu_host_alloc(void** host_ptr, uint64_t bytes, unsigned int flags);
int xpu_host_free(void* host_ptr);

// Streams and events. xpu_wait blocks until the stream's work is done.
int xpu_wait(XPUStream stream);
int xpu_event_create(XPUEvent* event);
int xpu_event_record(XPUEvent event, XPUStream stream);
int xpu_event_wait(XPUEvent event);
int xpu_event_destroy(XPUEvent event);
int xpu_stream_wait_event(XPUStream stream, XPUEvent event);

#if defined(__cplusplus)
}  // extern "C"
#endif
