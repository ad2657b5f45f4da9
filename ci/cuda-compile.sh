#!/usr/bin/env bash
# CUDA compile leg: compiles every CUDA source under csrc/ with nvcc for sm_80
# and sm_90, links the host probe (csrc/tools/device_probe.cc) against cudart
# and runs it. Needs nvcc, not a GPU: without one the probe prints why (the
# runtime's error) and that the kernels' entry points fail cleanly; with one it
# checks the GPU kernels against the CPU kernels.
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
  "$NVCC" "${common[@]}" "${arch[@]}" --threads 2 -Xcompiler -Wall,-Wextra -c "$src" -o "$(obj "$src")"
done
for src in "${host_sources[@]}"; do
  echo "nvcc (host) $src"
  "$NVCC" "${common[@]}" -Xcompiler -Wall,-Wextra -c "$src" -o "$(obj "$src")"
done

compile_probe_objects "${common[@]}" -Wall -Wextra
echo "link        $out/device_probe"
"$NVCC" "${probe_objs[@]}" -o "$out/device_probe"
echo "run         $out/device_probe"
"$out/device_probe"

leg_end "$((${#kernel_sources[@]} + ${#host_sources[@]})) CUDA sources compiled, probe ran"
