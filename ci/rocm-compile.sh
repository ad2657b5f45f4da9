#!/usr/bin/env bash
# ROCm compile leg: compiles every HIP source under csrc/ with hipcc for
# gfx90a, links the host probe (csrc/tools/device_probe.cc) against amdhip64
# and runs it. Installs hipcc and libamdhip64-dev with apt when they are
# missing (Debian bookworm ships HIP 5.2). Needs no GPU: without one the
# probe prints hipGetDeviceCount's error and that the kernels' entry points
# fail cleanly.
#
# HIP sources: every *.cu under csrc/ (one source serves CUDA and HIP; hipcc
# compiles it with -x hip), and every *.cc / *.cpp that includes gpu_runtime.h
# or hip/hip_runtime.h (host code, built with g++ -D__HIP_PLATFORM_AMD__).
# Usage, from the repository root: ci/rocm-compile.sh   (outputs in build/ci/rocm/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/lib/compile_leg.sh
leg_begin rocm-compile build/ci/rocm

if ! command -v hipcc >/dev/null 2>&1 || [ ! -f /usr/include/hip/hip_runtime.h ]; then
  echo "== rocm-compile: installing hipcc libamdhip64-dev with apt-get"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q hipcc libamdhip64-dev
  echo "== rocm-compile: installed in $((SECONDS - started)) s"
fi

# Debian's hipcc targets NVIDIA when it finds nvcc, unless told otherwise.
export HIP_PLATFORM=amd
echo "== rocm-compile: $(hipcc --version 2>&1 | grep -m1 'HIP version')"

common=(-std=c++17 -O2 -DPADDLE_EXT_WITH_GPU -Icsrc/ops -Icsrc/include -Icsrc/runtime)
find_kernel_sources
mapfile -t host_sources < <(sources_including 'gpu_runtime\.h|hip/hip_runtime\.h|hip/hip_runtime_api\.h')

for src in "${kernel_sources[@]}"; do
  echo "hipcc       $src"
  hipcc "${common[@]}" --offload-arch=gfx90a -Wall -Wextra -x hip -c "$src" -o "$(obj "$src")"
done
for src in "${host_sources[@]}"; do
  echo "g++ (host)  $src"
  g++ "${common[@]}" -D__HIP_PLATFORM_AMD__ -Wall -Wextra -c "$src" -o "$(obj "$src")"
done

compile_probe_objects "${common[@]}" -Wall -Wextra
echo "link        $out/device_probe"
g++ "${probe_objs[@]}" -lamdhip64 -pthread -o "$out/device_probe"
echo "run         $out/device_probe"
"$out/device_probe"

leg_end "$((${#kernel_sources[@]} + ${#host_sources[@]})) HIP sources compiled, probe ran"
