#include "common/parallel.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

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

// GNU OpenMP's entry points, which Intel's runtime provides too.
struct OpenMp {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;
  const char* name = nullptr;
};

// The runtime already in the process, looked for until found (the library may be
// loaded before Paddle's MKL runtime is); never loaded by this library.
const OpenMp* loaded_openmp() {
  static std::mutex mu;
  static OpenMp found;
  std::lock_guard<std::mutex> lock(mu);
  if (found.name != nullptr) return &found;
  for (const char* name : {"libiomp5.so", "libgomp.so.1"}) {
    void* lib = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);  // kept open, as the process keeps the runtime
    if (lib == nullptr) continue;
    OpenMp omp;
    omp.parallel = reinterpret_cast<decltype(omp.parallel)>(dlsym(lib, "GOMP_parallel"));
    omp.thread_num = reinterpret_cast<decltype(omp.thread_num)>(dlsym(lib, "omp_get_thread_num"));
    omp.name = name;
    if (omp.parallel != nullptr && omp.thread_num != nullptr) {
      found = omp;
      return &found;
    }
    dlclose(lib);
  }
  return nullptr;
}

// PADDLE_EXT_THREAD_POOL=std keeps the kernels on their own std::threads (read per call).
const OpenMp* openmp() {
  const char* choice = std::getenv("PADDLE_EXT_THREAD_POOL");
  if (choice != nullptr && std::strcmp(choice, "std") == 0) return nullptr;
  return loaded_openmp();
}

struct Job {
  const std::function<void(int64_t)>* body;
  int (*thread_num)();
  int64_t workers;
  std::mutex mu;
  std::exception_ptr error;

  void run(int64_t w) {
    try {
      (*body)(w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  }
};

void openmp_body(void* data) {
  Job* job = static_cast<Job*>(data);
  const int64_t w = job->thread_num();
  if (w < job->workers) job->run(w);  // a runtime never gives more threads than asked; be sure
}

}  // namespace

int num_threads() { return thread_setting().load(std::memory_order_relaxed); }

void set_num_threads(int n) { thread_setting().store(n > 0 ? n : default_threads()); }

const char* thread_pool() {
  static thread_local char text[64];
  const OpenMp* omp = openmp();
  if (omp == nullptr) return "std::thread";
  std::snprintf(text, sizeof(text), "openmp (%s)", omp->name);
  return text;
}

void run_workers(int64_t workers, const std::function<void(int64_t)>& body) {
  Job job;
  job.body = &body;
  job.workers = workers;
  if (workers <= 1) {
    job.run(0);
  } else if (const OpenMp* omp = openmp()) {
    job.thread_num = omp->thread_num;
    omp->parallel(openmp_body, &job, static_cast<unsigned>(workers), 0);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(workers - 1);
    for (int64_t w = 1; w < workers; ++w) pool.emplace_back([&job, w] { job.run(w); });
    job.run(0);
    for (auto& t : pool) t.join();
  }
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace paddle_ext

// C entry points for ctypes: the op library is a Paddle custom-op library,
// not a Python module, so this is how Python reaches its settings.
extern "C" {
int paddle_ext_get_num_threads() { return paddle_ext::num_threads(); }
void paddle_ext_set_num_threads(int n) { paddle_ext::set_num_threads(n); }
const char* paddle_ext_thread_pool() { return paddle_ext::thread_pool(); }
}
