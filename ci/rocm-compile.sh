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

started=$SECONDS
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=build/ci/rocm
rm -rf "$out"
mkdir -p "$out/obj"

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
obj() { local rel=${1#csrc/}; echo "$out/obj/${rel//\//__}.o"; }

mapfile -t hip_sources < <(find csrc -type f -name '*.cu' | LC_ALL=C sort)
mapfile -t host_sources < <(grep -rlE --include='*.cc' --include='*.cpp' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?(gpu_runtime\.h|hip/hip_runtime\.h|hip/hip_runtime_api\.h)[">]' csrc |
  LC_ALL=C sort)
if [ "${#hip_sources[@]}" -eq 0 ]; then
  echo "rocm-compile: no .cu source under csrc/" >&2
  exit 1
fi

compiled=0
for src in "${hip_sources[@]}"; do
  echo "hipcc       $src"
  hipcc "${common[@]}" --offload-arch=gfx90a -Wall -Wextra -x hip -c "$src" -o "$(obj "$src")"
  compiled=$((compiled + 1))
done
for src in "${host_sources[@]}"; do
  echo "g++ (host)  $src"
  g++ "${common[@]}" -D__HIP_PLATFORM_AMD__ -Wall -Wextra -c "$src" -o "$(obj "$src")"
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
for src in "${hip_sources[@]}" "${probe_refs[@]}"; do probe_objs+=("$(obj "$src")"); done
echo "link        $out/device_probe"
g++ "${probe_objs[@]}" -lamdhip64 -pthread -o "$out/device_probe"

echo "run         $out/device_probe"
"$out/device_probe"

echo "== rocm-compile: ok, ${compiled} HIP sources compiled, probe ran, $((SECONDS - started)) s"
