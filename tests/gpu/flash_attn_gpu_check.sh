#!/usr/bin/env bash
# Prepared GPU check of the FlashAttention kernels (issue 6), for a machine
# with an NVIDIA or AMD GPU: builds tests/gpu/flash_attn_gpu_check.cc with the
# CUDA / HIP kernels and the CPU kernels (no Paddle needed), runs it (GPU
# against CPU on padded, varlen, causal, GQA, dropout, half cases, plus a
# timing at S=2048), then, when a GPU build of Paddle with paddle_ext is
# importable, the pytest module tests/gpu/test_flash_attention_gpu.py.
#
# Usage, from anywhere: tests/gpu/flash_attn_gpu_check.sh   (build in build/gpu-check/)
# PREBUILT=path/to/flash_attn_gpu_check skips the build (a binary made elsewhere).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=build/gpu-check
mkdir -p "$out"
bin=${PREBUILT:-$out/flash_attn_gpu_check}
common=(-std=c++17 -O2 -DPADDLE_EXT_WITH_GPU -Icsrc/ops)
cpu_sources=(csrc/ops/cpu/flash_attn_cpu.cc csrc/ops/common/parallel.cc)

if [ -z "${PREBUILT:-}" ]; then
  objs=()
  for src in "${cpu_sources[@]}"; do
    obj="$out/$(basename "$src").o"
    g++ "${common[@]}" -c "$src" -o "$obj"
    objs+=("$obj")
  done
  if command -v nvcc >/dev/null 2>&1 && [ "${GPU_PLATFORM:-cuda}" = cuda ]; then
    arch=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
    nvcc "${common[@]}" "${arch[@]}" -c csrc/ops/gpu/flash_attn.cu -o "$out/flash_attn.cu.o"
    nvcc "${common[@]}" -x cu -c tests/gpu/flash_attn_gpu_check.cc -o "$out/check.o"
    nvcc "$out/check.o" "$out/flash_attn.cu.o" "${objs[@]}" -o "$bin"
  elif command -v hipcc >/dev/null 2>&1; then
    export HIP_PLATFORM=amd
    hipcc "${common[@]}" --offload-arch="${HIP_ARCH:-gfx90a}" -x hip -c csrc/ops/gpu/flash_attn.cu -o "$out/flash_attn.cu.o"
    g++ "${common[@]}" -D__HIP_PLATFORM_AMD__ -c tests/gpu/flash_attn_gpu_check.cc -o "$out/check.o"
    g++ "$out/check.o" "$out/flash_attn.cu.o" "${objs[@]}" -lamdhip64 -pthread -o "$bin"
  else
    echo "flash_attn_gpu_check: neither nvcc nor hipcc found" >&2
    exit 1
  fi
fi

"$bin"

if python -c "import paddle, paddle_ext.ops; assert paddle.device.cuda.device_count() > 0" 2>/dev/null; then
  python -m pytest -q tests/gpu/test_flash_attention_gpu.py
else
  echo "flash_attn_gpu_check: no GPU build of Paddle with paddle_ext here; skipped tests/gpu/test_flash_attention_gpu.py"
fi
