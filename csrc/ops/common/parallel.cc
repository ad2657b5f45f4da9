#include "common/parallel.h"

#include <atomic>
#include <cstdlib>

namespace paddle_ext {
namespace {

int default_threads() {
  // Not OMP_NUM_THREADS: `import paddle` forces it to 1 for its own reasons.
  if (const char* env = std::getenv("PADDLE_EXT_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> n{default_threads()};
  return n;
}

}  // namespace

int num_threads() { return thread_setting().load(std::memory_order_relaxed); }

void set_num_threads(int n) { thread_setting().store(n > 0 ? n : default_threads()); }

}  // namespace paddle_ext

// C entry points for ctypes: the op library is a Paddle custom-op library,
// not a Python module, so this is how Python reaches its settings.
extern "C" {
int paddle_ext_get_num_threads() { return paddle_ext::num_threads(); }
void paddle_ext_set_num_threads(int n) { paddle_ext::set_num_threads(n); }
}
