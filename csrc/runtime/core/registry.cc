#include "core/registry.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace paddle_ext::runtime {
namespace {

struct Table {
  std::mutex mutex;
  std::vector<BackendEntry> entries;
};

// Function-local so that registrars in other translation units, which run
// during static initialisation in any order, always find it constructed.
Table& table() {
  static Table* instance = new Table();  // never destroyed: registrars may outlive main
  return *instance;
}

// The names with a host (or event) part, for error messages.
std::string known(bool host) {
  std::lock_guard<std::mutex> lock(table().mutex);
  std::string out;
  for (const auto& e : table().entries)
    if (host ? static_cast<bool>(e.host) : static_cast<bool>(e.events)) out += (out.empty() ? "" : ", ") + e.name;
  return out;
}

const BackendEntry* find(const std::string& name) {
  for (const auto& e : table().entries)
    if (e.name == name) return &e;
  return nullptr;
}

}  // namespace

Registrar::Registrar(BackendEntry entry) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.entries.push_back(std::move(entry));
  std::stable_sort(t.entries.begin(), t.entries.end(),
                   [](const BackendEntry& a, const BackendEntry& b) { return a.order < b.order; });
}

std::vector<std::string> registered_backends() {
  std::lock_guard<std::mutex> lock(table().mutex);
  std::vector<std::string> names;
  for (const auto& e : table().entries) names.push_back(e.name);
  return names;
}

bool has_host_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(table().mutex);
  const BackendEntry* e = find(name);
  return e != nullptr && static_cast<bool>(e->host);
}

bool has_event_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(table().mutex);
  const BackendEntry* e = find(name);
  return e != nullptr && static_cast<bool>(e->events);
}

std::shared_ptr<HostBackend> make_host_backend(const std::string& name) {
  std::function<std::shared_ptr<HostBackend>()> factory;
  {
    std::lock_guard<std::mutex> lock(table().mutex);
    if (const BackendEntry* e = find(name)) factory = e->host;
  }
  if (!factory)
    throw std::invalid_argument("host memory backend '" + name + "' is not in this build; built: " +
                                known(true));
  return factory();
}

std::shared_ptr<EventBackend> event_backend(const std::string& name) {
  std::function<std::shared_ptr<EventBackend>()> factory;
  {
    std::lock_guard<std::mutex> lock(table().mutex);
    if (const BackendEntry* e = find(name)) factory = e->events;
  }
  if (!factory)
    throw std::invalid_argument("event backend '" + name + "' is not in this build; built: " +
                                known(false));
  return factory();
}

std::string unavailable_reason(const std::string& name) {
  std::function<std::string()> probe;
  {
    std::lock_guard<std::mutex> lock(table().mutex);
    const BackendEntry* e = find(name);
    if (e == nullptr) return "backend '" + name + "' is not in this build";
    probe = e->unavailable;
  }
  return probe ? probe() : std::string();
}

}  // namespace paddle_ext::runtime
