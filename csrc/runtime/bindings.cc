// paddle_ext._C: the Python face of the csrc runtime. Thin: argument
// conversion, the GIL released around every call that may block or take the
// allocator's lock, and native errors mapped to DeviceError /
// OutOfMemoryError. The typed API users see is paddle_ext/runtime/.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu_event.h"
#include "backends/fake.h"
#include "backends/posix.h"
#include "core/auto_growth_allocator.h"
#include "core/device_event.h"
#include "core/error.h"
#include "core/registry.h"

namespace py = pybind11;
namespace rt = paddle_ext::runtime;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// A block handed to Python: frees itself when the last reference (numpy
// views included, through the buffer protocol) goes away, and keeps its pool
// alive until then.
class PyBlock {
 public:
  PyBlock(std::shared_ptr<rt::AutoGrowthAllocator> pool, std::size_t nbytes)
      : pool_(std::move(pool)), nbytes_(nbytes) {
    py::gil_scoped_release nogil;
    ptr_ = pool_->allocate(nbytes);
  }
  ~PyBlock() {
    // Runs in the Python object's dealloc, with the GIL: a free may give a
    // chunk back (munmap, cudaFreeHost, which waits for the device), so let
    // other Python threads run meanwhile.
    py::gil_scoped_release nogil;
    try {
      pool_->free(ptr_);
    } catch (...) {  // a destructor cannot report; the pool stays consistent
    }
  }
  PyBlock(const PyBlock&) = delete;
  PyBlock& operator=(const PyBlock&) = delete;

  std::uintptr_t ptr() const { return reinterpret_cast<std::uintptr_t>(ptr_); }
  std::size_t nbytes() const { return nbytes_; }
  void* data() const { return ptr_; }
  const std::shared_ptr<rt::AutoGrowthAllocator>& pool() const { return pool_; }

 private:
  std::shared_ptr<rt::AutoGrowthAllocator> pool_;
  std::size_t nbytes_;
  void* ptr_ = nullptr;
};

void* as_ptr(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

py::dict to_dict(const std::vector<std::pair<std::string, std::int64_t>>& items) {
  py::dict d;
  for (const auto& [k, v] : items) d[py::str(k)] = v;
  return d;
}

py::dict to_dict(const std::map<std::string, std::int64_t>& items) {
  py::dict d;
  for (const auto& [k, v] : items) d[py::str(k)] = v;
  return d;
}

py::dict flags_dict(const rt::DebugFlags& f) {
  py::dict d;
  d["fill_value"] = f.fill_value;
  d["sync_after_alloc"] = f.sync_after_alloc;
  d["dump_chunks"] = f.dump_chunks;
  d["free_idle_chunk"] = f.free_idle_chunk;
  return d;
}

const char* state_name(rt::BlockState s) {
  switch (s) {
    case rt::BlockState::kFree: return "free";
    case rt::BlockState::kAllocated: return "allocated";
    case rt::BlockState::kPending: return "pending";
  }
  return "?";
}

// Raises `type` with the error's message and its backend / code / name as attributes.
void raise_device_error(PyObject* type, const rt::DeviceError& e) {
  py::object instance = py::reinterpret_borrow<py::object>(type)(e.what());
  instance.attr("backend") = e.backend();
  instance.attr("code") = e.code();
  instance.attr("name") = e.name();
  PyErr_SetObject(type, instance.ptr());
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "paddle_ext native runtime";

  // Exception types: one for every native failure, a MemoryError subtype for
  // out-of-memory. Created here so that _C needs no Python package to import.
  static PyObject* device_error = PyErr_NewExceptionWithDoc(
      "paddle_ext._C.DeviceError",
      "A native runtime call failed; .backend, .code (the native error code) and .name (its name).",
      PyExc_RuntimeError, nullptr);
  py::tuple oom_bases = py::make_tuple(py::handle(device_error), py::handle(PyExc_MemoryError));
  static PyObject* oom_error = PyErr_NewExceptionWithDoc(
      "paddle_ext._C.OutOfMemoryError",
      "The backend ran out of memory even after the pool released its idle chunks.", oom_bases.ptr(), nullptr);
  m.attr("DeviceError") = py::handle(device_error);
  m.attr("OutOfMemoryError") = py::handle(oom_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rt::OutOfMemory& e) {
      raise_device_error(oom_error, e);
    } catch (const rt::DeviceError& e) {
      raise_device_error(device_error, e);
    }
  });

  m.def(
      "build_info",
      [] {
        py::dict info;
        info["compiler"] = std::string(PADDLE_EXT_COMPILER_ID);
        info["cplusplus"] = static_cast<long>(__cplusplus);
        // Exactly the backends compiled and linked into this module: the
        // GPU ones only where their toolkit was found at build time.
        info["backends"] = rt::registered_backends();
        info["hardware_threads"] = std::thread::hardware_concurrency();
        return info;
      },
      "How this module was built: compiler, C++ standard, runtime backends.");
  m.def("unavailable_reason", &rt::unavailable_reason, py::arg("backend"), Release(),
        "'' if the backend can be used here, else why not (may call its runtime).");
  m.def("has_host_backend", &rt::has_host_backend, py::arg("backend"));
  m.def("has_event_backend", &rt::has_event_backend, py::arg("backend"));
  m.def(
      "event_backend_calls", [](const std::string& name) { return rt::event_backend(name)->native_calls(); },
      py::arg("backend"), "Native runtime calls the backend's events made so far.");

  // The cpu event state machine's controls, for tests and CPU pipelines.
  m.def(
      "cpu_stream_hold", [](rt::Stream s) { rt::CpuEventBackend::instance()->hold(s); }, py::arg("stream"));
  m.def(
      "cpu_stream_step", [](rt::Stream s, std::uint64_t n) { rt::CpuEventBackend::instance()->step(s, n); },
      py::arg("stream"), py::arg("count"));
  m.def(
      "cpu_stream_release", [](rt::Stream s) { rt::CpuEventBackend::instance()->release(s); }, py::arg("stream"));
  m.def(
      "cpu_stream_outstanding", [](rt::Stream s) { return rt::CpuEventBackend::instance()->outstanding(s); },
      py::arg("stream"));
  m.def("cpu_live_events", [] { return rt::CpuEventBackend::instance()->live_events(); });

  py::class_<rt::HostBackend, std::shared_ptr<rt::HostBackend>>(m, "HostBackend")
      .def_property_readonly("name", &rt::HostBackend::name)
      .def_property_readonly("base_alignment", &rt::HostBackend::base_alignment)
      .def_property_readonly("granularity", &rt::HostBackend::granularity)
      .def("counters", [](const rt::HostBackend& b) { return to_dict(b.counters()); })
      // Direct, uncached calls: what the pool saves (bench/pinned_pool.py).
      .def(
          "raw_allocate", [](rt::HostBackend& b, std::size_t n) { return reinterpret_cast<std::uintptr_t>(b.allocate(n)); },
          py::arg("nbytes"), Release())
      .def(
          "raw_deallocate", [](rt::HostBackend& b, std::uintptr_t p, std::size_t n) { b.deallocate(as_ptr(p), n); },
          py::arg("ptr"), py::arg("nbytes"), Release());
  m.def("make_host_backend", &rt::make_host_backend, py::arg("backend"), Release());

  py::class_<rt::FakeHostBackend, rt::HostBackend, std::shared_ptr<rt::FakeHostBackend>>(m, "FakeBackend")
      .def(py::init([](std::optional<std::size_t> capacity, std::size_t granularity, std::size_t base_alignment) {
             return std::make_shared<rt::FakeHostBackend>(
                 rt::FakeOptions{capacity.value_or(SIZE_MAX), granularity, base_alignment});
           }),
           py::kw_only(), py::arg("capacity") = py::none(), py::arg("granularity") = 4096,
           py::arg("base_alignment") = 4096)
      .def("fail_next", &rt::FakeHostBackend::fail_next, py::arg("count") = 1, py::kw_only(),
           py::arg("out_of_memory") = true, py::arg("code") = 12, py::arg("name") = "ENOMEM")
      .def("set_capacity", &rt::FakeHostBackend::set_capacity, py::arg("nbytes"))
      .def("set_delay", &rt::FakeHostBackend::set_delay, py::arg("seconds"))
      .def_property_readonly("used", &rt::FakeHostBackend::used);

  py::class_<rt::PosixHostBackend, rt::HostBackend, std::shared_ptr<rt::PosixHostBackend>>(m, "PosixBackend")
      .def(py::init([](const std::string& mlock) { return std::make_shared<rt::PosixHostBackend>(rt::parse_lock_mode(mlock)); }),
           py::kw_only(), py::arg("mlock") = "try")
      .def_property_readonly("mlock", [](const rt::PosixHostBackend& b) { return std::string(rt::to_string(b.mode())); });

  py::class_<PyBlock, std::shared_ptr<PyBlock>>(m, "Block", py::buffer_protocol())
      .def_buffer([](PyBlock& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes())}, {1});
      })
      .def_property_readonly("ptr", &PyBlock::ptr)
      .def_property_readonly("nbytes", &PyBlock::nbytes)
      .def_property_readonly("pool", &PyBlock::pool);

  py::class_<rt::AutoGrowthAllocator, std::shared_ptr<rt::AutoGrowthAllocator>>(m, "HostAllocator")
      .def(py::init([](std::shared_ptr<rt::HostBackend> backend, std::size_t alignment, std::size_t chunk_size,
                       std::optional<std::size_t> max_cached_bytes, bool trim_on_growth, double reuse_waste,
                       std::size_t spare_events, int fill_value,
                       bool sync_after_alloc, bool dump_chunks, bool free_idle_chunk) {
             rt::AllocatorOptions o;
             o.alignment = alignment;
             o.chunk_size = chunk_size;
             o.max_cached_bytes = max_cached_bytes.value_or(SIZE_MAX);
             o.trim_on_growth = trim_on_growth;
             o.reuse_waste = reuse_waste;
             o.spare_events = spare_events;
             o.debug = {fill_value, sync_after_alloc, dump_chunks, free_idle_chunk};
             return std::make_shared<rt::AutoGrowthAllocator>(std::move(backend), o);
           }),
           py::arg("backend"), py::kw_only(), py::arg("alignment") = rt::AllocatorOptions{}.alignment,
           py::arg("chunk_size") = rt::AllocatorOptions{}.chunk_size, py::arg("max_cached_bytes") = py::none(),
           py::arg("trim_on_growth") = rt::AllocatorOptions{}.trim_on_growth,
           py::arg("reuse_waste") = rt::AllocatorOptions{}.reuse_waste,
           py::arg("spare_events") = rt::AllocatorOptions{}.spare_events, py::arg("fill_value") = -1,
           py::arg("sync_after_alloc") = false, py::arg("dump_chunks") = false, py::arg("free_idle_chunk") = false)
      .def(
          "allocate",
          [](rt::AutoGrowthAllocator& a, std::size_t n) { return reinterpret_cast<std::uintptr_t>(a.allocate(n)); },
          py::arg("nbytes"), Release())
      .def(
          "free", [](rt::AutoGrowthAllocator& a, std::uintptr_t p) { a.free(as_ptr(p)); }, py::arg("ptr"), Release())
      .def(
          "allocate_block",
          [](const std::shared_ptr<rt::AutoGrowthAllocator>& a, std::size_t n) { return std::make_shared<PyBlock>(a, n); },
          py::arg("nbytes"))
      .def(
          "record_event",
          [](rt::AutoGrowthAllocator& a, std::uintptr_t p, rt::Stream s, int device) {
            return a.record_event(as_ptr(p), s, device);
          },
          py::arg("ptr"), py::arg("stream"), py::arg("device") = -1, Release())
      .def("poll_events", &rt::AutoGrowthAllocator::poll_events, Release())
      .def("empty_cache", &rt::AutoGrowthAllocator::empty_cache, Release())
      .def(
          "stats", [](const rt::AutoGrowthAllocator& a) { return to_dict(a.stats().items()); },
          "A consistent snapshot of the pool's counters.")
      .def("dump", &rt::AutoGrowthAllocator::dump)
      .def("check_invariants", &rt::AutoGrowthAllocator::check_invariants, Release())
      .def(
          "block_size", [](const rt::AutoGrowthAllocator& a, std::uintptr_t p) { return a.block_size(as_ptr(p)); },
          py::arg("ptr"))
      .def("blocks",
           [](const rt::AutoGrowthAllocator& a) {
             py::list out;
             for (const auto& [chunk, ptr, size, state] : a.blocks())
               out.append(py::make_tuple(chunk, ptr, size, state_name(state)));
             return out;
           })
      .def("debug_flags", [](const rt::AutoGrowthAllocator& a) { return flags_dict(a.debug_flags()); })
      .def(
          "set_debug_flags",
          [](rt::AutoGrowthAllocator& a, int fill_value, bool sync_after_alloc, bool dump_chunks, bool free_idle_chunk) {
            a.set_debug_flags({fill_value, sync_after_alloc, dump_chunks, free_idle_chunk});
          },
          py::kw_only(), py::arg("fill_value"), py::arg("sync_after_alloc"), py::arg("dump_chunks"),
          py::arg("free_idle_chunk"))
      .def("options",
           [](const rt::AutoGrowthAllocator& a) {
             const rt::AllocatorOptions& o = a.options();
             py::dict d;
             d["alignment"] = o.alignment;
             d["chunk_size"] = o.chunk_size;
             d["max_cached_bytes"] = o.max_cached_bytes == SIZE_MAX ? py::object(py::none()) : py::int_(o.max_cached_bytes);
             d["trim_on_growth"] = o.trim_on_growth;
             d["reuse_waste"] = o.reuse_waste;
             d["spare_events"] = o.spare_events;
             return d;
           })
      .def_property_readonly("backend",
                             [](const rt::AutoGrowthAllocator& a) { return std::string(a.backend().name()); })
      .def("backend_counters", [](const rt::AutoGrowthAllocator& a) { return to_dict(a.backend().counters()); })
      .def_property_readonly("event_backend",
                             [](const rt::AutoGrowthAllocator& a) { return std::string(a.events().name()); });

  py::class_<rt::DeviceEvent, std::shared_ptr<rt::DeviceEvent>>(m, "DeviceEvent")
      .def(py::init([](const std::string& backend, int device, bool enable_timing, bool blocking, bool interprocess) {
             return std::make_shared<rt::DeviceEvent>(rt::event_backend(backend), device,
                                                      rt::EventOptions{enable_timing, blocking, interprocess});
           }),
           py::arg("backend"), py::kw_only(), py::arg("device") = -1, py::arg("enable_timing") = false,
           py::arg("blocking") = false, py::arg("interprocess") = false)
      .def("record", &rt::DeviceEvent::record, py::arg("stream") = 0, Release())
      .def("query", &rt::DeviceEvent::query, Release())
      .def("synchronize", &rt::DeviceEvent::synchronize, Release())
      .def("wait", &rt::DeviceEvent::wait, py::arg("stream") = 0, Release())
      .def("elapsed_ms", &rt::DeviceEvent::elapsed_ms, py::arg("end"), Release())
      .def_property_readonly("created", &rt::DeviceEvent::created)
      .def_property_readonly("recorded", &rt::DeviceEvent::recorded)
      .def_property_readonly("device", &rt::DeviceEvent::device)
      .def_property_readonly("native_flags", &rt::DeviceEvent::native_flags)
      .def_property_readonly("backend", [](const rt::DeviceEvent& e) { return std::string(e.backend_name()); })
      .def_property_readonly("options", [](const rt::DeviceEvent& e) {
        py::dict d;
        d["enable_timing"] = e.options().enable_timing;
        d["blocking"] = e.options().blocking;
        d["interprocess"] = e.options().interprocess;
        return d;
      });
}
