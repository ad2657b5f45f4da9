// Host probe of the CUDA / HIP build: asks the runtime for its devices, and
//  - with none, prints why (the runtime's error name, number and text), shows
//    that a c_embedding GPU entry point fails with a clean std::runtime_error,
//    and exits 0;
//  - with devices, prints their names and checks the c_embedding GPU kernels
//    against the CPU kernels on device 0 (bytes must match exactly: forward
//    copies, backward sums in the same order and precision), exit 1 on a mismatch.
//
// Built by ci/cuda-compile.sh (nvcc, links cudart) and ci/rocm-compile.sh
// (g++ -D__HIP_PLATFORM_AMD__, links amdhip64) with the objects of
// csrc/ops/gpu/*.cu and of the CPU backend (csrc/ops/cpu/*.cc, csrc/ops/common/*.cc).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "c_embedding.h"
#include "common/gpu_runtime.h"

namespace ce = paddle_ext::c_embedding;
namespace gpu = paddle_ext::gpu;

namespace {

const char* platform_upper() { return std::strcmp(gpu::kPlatform, "hip") == 0 ? "HIP" : "CUDA"; }

// A device copy of a host vector, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    PADDLE_EXT_GPU_CHECK(gpu::malloc_device(&ptr_, bytes_ ? bytes_ : 1));
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    PADDLE_EXT_GPU_CHECK(gpu::memcpy_to_device_async(ptr_, host.data(), bytes_, nullptr));
    PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(nullptr));
  }
  ~DeviceBuffer() { (void)gpu::free_device(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  std::vector<char> to_host() const {
    std::vector<char> host(bytes_);
    PADDLE_EXT_GPU_CHECK(gpu::memcpy_to_host_async(host.data(), ptr_, bytes_, nullptr));
    PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(nullptr));
    return host;
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("  %s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

using paddle_ext::DType;

using paddle_ext::dtype_bytes;

const char* kind_name(DType kind) {
  switch (kind) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
  }
  return "?";
}

// Random values in the element type's bit pattern.
std::vector<char> random_values(DType kind, int64_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<char> bytes(count * dtype_bytes(kind));
  for (int64_t i = 0; i < count; ++i) {
    const float v = dist(rng);
    if (kind == DType::kFloat64) {
      const double d = static_cast<double>(v) / 3.0;  // all 53 bits in use
      std::memcpy(bytes.data() + 8 * i, &d, 8);
    } else if (kind == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = kind == DType::kFloat16 ? paddle_ext::float_to_fp16(v) : paddle_ext::float_to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

template <typename IdT>
void check_case(DType kind, int64_t rows, int64_t width, int64_t start, int64_t vocab, int64_t n,
                std::mt19937_64& rng) {
  const std::string name = std::string(kind_name(kind)) + (sizeof(IdT) == 8 ? " int64" : " int32") +
                           " rows=" + std::to_string(rows) + " width=" + std::to_string(width) +
                           " n=" + std::to_string(n);
  // Ids over the whole vocabulary (most outside this slice), plus a hot id
  // repeated many times, so rows get duplicates.
  std::uniform_int_distribution<int64_t> any_id(0, vocab - 1);
  std::vector<IdT> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<IdT>(i % 5 == 0 ? start : any_id(rng));
  const int64_t row_bytes = width * dtype_bytes(kind);
  const std::vector<char> table = random_values(kind, rows * width, rng);
  const std::vector<char> out_grad = random_values(kind, n * width, rng);

  DeviceBuffer d_ids(ids), d_table(table), d_out_grad(out_grad);
  DeviceBuffer d_out(n * row_bytes), d_grad(rows * row_bytes);

  std::vector<char> out(n * row_bytes);
  ce::forward_cpu(table.data(), rows, row_bytes, ids.data(), n, start, out.data());
  ce::forward_gpu(d_table.get<const char>(), rows, row_bytes, d_ids.get<const IdT>(), n, start,
                  d_out.get<char>(), nullptr);
  expect(d_out.to_host() == out, "forward  " + name);

  std::vector<char> grad(rows * row_bytes);
  ce::backward_cpu(kind, out_grad.data(), ids.data(), n, rows, width, start, grad.data());
  ce::backward_gpu(kind, d_out_grad.get<const void>(), d_ids.get<const IdT>(), n, rows, width, start,
                   d_grad.get<void>(), nullptr);
  expect(d_grad.to_host() == grad, "backward " + name);

  ce::BadId bad = ce::find_out_of_range_gpu(d_ids.get<const IdT>(), n, vocab, nullptr);
  expect(bad.position == -1, "check    " + name + " (all in range)");
  ids[n - 1] = static_cast<IdT>(vocab);
  ids[n / 2] = static_cast<IdT>(-7);
  DeviceBuffer d_bad(ids);
  bad = ce::find_out_of_range_gpu(d_bad.get<const IdT>(), n, vocab, nullptr);
  expect(bad.position == n / 2 && bad.id == -7,
         "check    " + name + " (first bad: position " + std::to_string(bad.position) + ", id " +
             std::to_string(bad.id) + ")");
}

int run_checks() {
  std::mt19937_64 rng(20240605);
  for (DType kind : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    check_case<int64_t>(kind, 37, 8, 5, 60, 1000, rng);
    check_case<int32_t>(kind, 37, 3, 0, 37, 1000, rng);  // odd row bytes, whole vocabulary
  }
  // Several sort tiles and three radix passes (70000 rows: 17 key bits).
  check_case<int64_t>(DType::kFloat32, 70000, 5, 1000, 140000, 6161, rng);
  check_case<int32_t>(DType::kBFloat16, 300, 130, 7, 400, 20000, rng);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main() {
  int count = 0;
  const gpu::Error err = gpu::device_count(&count);
  if (err != gpu::kSuccess || count == 0) {
    if (err != gpu::kSuccess) {
      std::printf("%s: no %s device (%s / error %d: %s)\n", gpu::kPlatform, platform_upper(),
                  gpu::error_name(err), static_cast<int>(err), gpu::error_string(err));
    } else {
      std::printf("%s: no %s device (the runtime reports 0 devices)\n", gpu::kPlatform, platform_upper());
    }
    // The kernels' entry points must fail cleanly too, not crash.
    try {
      const ce::BadId bad = ce::find_out_of_range_gpu<int64_t>(nullptr, 4, 10, nullptr);
      std::printf("%s: c_embedding::find_out_of_range_gpu returned position %lld without a device\n",
                  gpu::kPlatform, static_cast<long long>(bad.position));
      return 1;
    } catch (const std::runtime_error& e) {
      std::printf("%s: c_embedding::find_out_of_range_gpu without a device throws std::runtime_error: %s\n",
                  gpu::kPlatform, e.what());
    }
    return 0;
  }
  for (int d = 0; d < count; ++d) {
    std::string name;
    PADDLE_EXT_GPU_CHECK(gpu::device_name(d, &name));
    std::printf("%s: device %d: %s\n", gpu::kPlatform, d, name.c_str());
  }
  try {
    PADDLE_EXT_GPU_CHECK(gpu::set_device(0));
    std::printf("%s: c_embedding GPU kernels against the CPU kernels on device 0:\n", gpu::kPlatform);
    const int rc = run_checks();
    std::printf("%s: %s\n", gpu::kPlatform, rc == 0 ? "all checks passed" : "CHECKS FAILED");
    return rc;
  } catch (const std::exception& e) {
    std::printf("%s: error: %s\n", gpu::kPlatform, e.what());
    return 1;
  }
}
