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

started=$SECONDS
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=build/ci/cuda
rm -rf "$out"
mkdir -p "$out/obj"

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "cuda-compile: $NVCC not found (set NVCC=/path/to/nvcc)" >&2
  exit 1
fi
echo "== cuda-compile: $("$NVCC" --version | tail -n 1)"

common=(-std=c++17 -O2 -DPADDLE_EXT_WITH_GPU -Icsrc/ops -Icsrc/include -Icsrc/runtime)
arch=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
obj() { local rel=${1#csrc/}; echo "$out/obj/${rel//\//__}.o"; }

mapfile -t cu_sources < <(find csrc -type f -name '*.cu' | LC_ALL=C sort)
mapfile -t host_sources < <(grep -rlE --include='*.cc' --include='*.cpp' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?(gpu_runtime|cuda_runtime|cuda_runtime_api)\.h[">]' csrc |
  LC_ALL=C sort)
if [ "${#cu_sources[@]}" -eq 0 ]; then
  echo "cuda-compile: no .cu source under csrc/" >&2
  exit 1
fi

compiled=0
for src in "${cu_sources[@]}"; do
  echo "nvcc        $src"
  "$NVCC" "${common[@]}" "${arch[@]}" --threads 2 -Xcompiler -Wall,-Wextra -c "$src" -o "$(obj "$src")"
  compiled=$((compiled + 1))
done
for src in "${host_sources[@]}"; do
  echo "nvcc (host) $src"
  "$NVCC" "${common[@]}" -Xcompiler -Wall,-Wextra -c "$src" -o "$(obj "$src")"
  compiled=$((compiled + 1))
done

# The probe compares the GPU kernels with the CPU ones: build the CPU backend
# too (the sources tools/build_ops.py takes besides the Paddle registrations).
mapfile -t probe_refs < <(find csrc/ops/cpu csrc/ops/common -maxdepth 1 -type f -name '*.cc' | LC_ALL=C sort)
for src in "${probe_refs[@]}"; do
  echo "g++ (probe) $src"
  g++ "${common[@]}" -Wall -Wextra -c "$src" -o "$(obj "$src")"
done

probe=csrc/tools/device_probe.cc
probe_objs=("$(obj "$probe")")
for src in "${cu_sources[@]}" "${probe_refs[@]}"; do probe_objs+=("$(obj "$src")"); done
echo "link        $out/device_probe"
"$NVCC" "${probe_objs[@]}" -o "$out/device_probe"

echo "run         $out/device_probe"
"$out/device_probe"

echo "== cuda-compile: ok, ${compiled} CUDA sources compiled, probe ran, $((SECONDS - started)) s"
