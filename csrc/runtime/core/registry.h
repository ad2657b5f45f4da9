// Which backends this build carries. Each file in csrc/runtime/backends/
// registers itself with a static Registrar, so the list is exactly what was
// compiled and linked (build_info()["backends"] reads it): the GPU backends
// appear only where their toolkit was found at build time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace paddle_ext::runtime {

struct BackendEntry {
  std::string name;
  int order = 100;  // position in listings: cpu first, then host, then devices
  // Either may be empty: "cpu" has events but no host memory of its own.
  std::function<std::shared_ptr<HostBackend>()> host;
  std::function<std::shared_ptr<EventBackend>()> events;
  // "" when usable here; otherwise why not ("no CUDA device: cudaErrorNoDevice
  // (100) ..."). May call the runtime, so only on an explicit request.
  std::function<std::string()> unavailable;
};

struct Registrar {
  explicit Registrar(BackendEntry entry);
};

// Names in listing order.
std::vector<std::string> registered_backends();
bool has_host_backend(const std::string& name);
bool has_event_backend(const std::string& name);
// Throw std::invalid_argument naming the known backends for an unknown name.
std::shared_ptr<HostBackend> make_host_backend(const std::string& name);
std::shared_ptr<EventBackend> event_backend(const std::string& name);
std::string unavailable_reason(const std::string& name);

}  // namespace paddle_ext::runtime
