// paddle_ext._C: the Python face of the csrc runtime.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <thread>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "paddle_ext native runtime";
  m.def(
      "build_info",
      [] {
        py::dict info;
        info["compiler"] = std::string(PADDLE_EXT_COMPILER_ID);
        info["cplusplus"] = static_cast<long>(__cplusplus);
        // Device backends of the runtime compiled into this module; the GPU
        // ones are built by the compat legs (ci/) and on GPU machines.
        info["backends"] = std::vector<std::string>{"cpu"};
        info["hardware_threads"] = std::thread::hardware_concurrency();
        return info;
      },
      "How this module was built: compiler, C++ standard, runtime backends.");
}
