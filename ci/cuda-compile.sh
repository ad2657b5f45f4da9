#!/usr/bin/env bash
# CUDA compile leg: compiles every CUDA source under csrc/ with nvcc for sm_80
# and sm_90 (warnings on), then hands the objects to tests/gpu/device_check.sh,
# which builds and runs the GPU checks: without a GPU (CI) it runs the CPU half
# of the kernel checks (CPU kernels against float64), the host probe
# (csrc/tools/device_probe.cc: prints why there is no device and that the
# kernels' entry points fail cleanly) and the ctypes library's self-test, and
# exits 77, which passes this leg; with a GPU it checks the GPU kernels against
# the CPU kernels (docs/gpu_check.md).
#
# CUDA sources: every *.cu under csrc/, and every *.cc / *.cpp that includes
# gpu_runtime.h or cuda_runtime.h (host code over the CUDA runtime).
# Usage, from the repository root: ci/cuda-compile.sh   (outputs in build/ci/cuda/)
# NVCC=/path/to/nvcc overrides the compiler.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/lib/compile_leg.sh
leg_begin cuda-compile build/ci/cuda

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "cuda-compile: $NVCC not found (set NVCC=/path/to/nvcc)" >&2
  exit 1
fi
echo "== cuda-compile: $("$NVCC" --version | tail -n 1)"

common=(-std=c++17 -O2 -DPADDLE_EXT_WITH_GPU -Icsrc/ops -Icsrc/include -Icsrc/runtime)
arch=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
find_kernel_sources
mapfile -t host_sources < <(sources_including 'gpu_runtime\.h|cuda_runtime\.h|cuda_runtime_api\.h')

for src in "${kernel_sources[@]}"; do
  echo "nvcc        $src"
  # The flags tests/gpu/device_check.sh compiles kernels with (-fPIC: one goes into its ctypes library).
  "$NVCC" "${common[@]}" "${arch[@]}" --threads 2 -Xcompiler -Wall,-Wextra,-fPIC -c "$src" -o "$(obj "$src")"
done
for src in "${host_sources[@]}"; do
  echo "nvcc (host) $src"
  "$NVCC" "${common[@]}" -Xcompiler -Wall,-Wextra -c "$src" -o "$(obj "$src")"
done

echo "run         tests/gpu/device_check.sh (reusing these kernel objects)"
rc=0
PADDLE_EXT_GPU_CHECK_DIR=$out PADDLE_EXT_GPU_CHECK_REUSE=1 NVCC=$NVCC bash tests/gpu/device_check.sh || rc=$?
case $rc in
  0) checks="GPU checks passed" ;;
  77) checks="device_check skipped its GPU half (no GPU), CPU half passed" ;;
  *) echo "cuda-compile: tests/gpu/device_check.sh failed (exit $rc)" >&2; exit 1 ;;
esac

leg_end "$((${#kernel_sources[@]} + ${#host_sources[@]})) CUDA sources compiled, $checks"
