#!/usr/bin/env bash
# One command that builds and runs every CUDA path of the plugin that needs no
# Paddle, for a machine with an NVIDIA GPU (docs/gpu_check.md: how to run it
# with the device tool, what it prints, how long it takes):
#
#   kernels     tests/gpu/kernels_check.cc: flash attention forward / backward
#               (padded, varlen, causal in both alignments, GQA / MQA, dropout
#               mask and replay, f32 / f16 / bf16), fused rotary, c_embedding, each GPU kernel
#               against the CPU kernel built from this tree, and the CPU kernel
#               against a float64 reference; the tensor-core flash-attention
#               kernels also run under the CPU warp emulator
#               (tests/gpu/warp_emulator.h) against the CPU kernels, GPU or not;
#   c_embedding csrc/tools/device_probe.cc: GPU against CPU bytes, id check;
#   runtime     paddle_ext._C built here with CMake + pybind11 for this Python:
#               the pinned pool's cuda backend with stream-ordered reuse (a copy
#               held on a stream, the block freed and asked for again, the
#               bytes checked) and the timing-free DeviceEvent
#               (tests/runtime/gpu_check.py stream-reuse);
#   timing      bench/flash_attn_gpu.py: the flash-attention kernels
#               against PyTorch's flash SDPA in the same run, B=4 H=16 D=128
#               bf16, S in {1024, 4096, 8192}, causal and not, TFLOP/s.
#
# Then a table of the steps. Exit status 1 on any mismatch or build failure,
# 0 when all passed on a GPU, 77 (skipped) on a machine without one: there it
# compiles everything (nvcc, sm_80 + sm_90), runs the CPU half of the kernel
# checks, the probe's no-device path and the ctypes library's self-test, and
# syntax-checks the Python that needs torch or a GPU.
#
# Usage, from anywhere: bash tests/gpu/device_check.sh     (build in build/gpu-check/)
# Environment:
#   NVCC, PYTHON              compilers / interpreter (nvcc, python3)
#   CUDA_ARCHS                "80 90" without a GPU, the card's own with one
#   PADDLE_EXT_GPU_CHECK_DIR  build folder (build/gpu-check)
#   PADDLE_EXT_GPU_CHECK_REUSE=1  keep objects already in the build folder (a
#                             ci leg that compiled them with the same flags)
#   PADDLE_EXT_GPU_CHECK_CMAKE=1  build paddle_ext._C with CMake without a GPU too
#   TIMING_BUDGET_S           seconds for the kernels' timings (200)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source ci/lib/compile_leg.sh
leg=device_check
out=${PADDLE_EXT_GPU_CHECK_DIR:-build/gpu-check}
NVCC=${NVCC:-nvcc}
PYTHON=${PYTHON:-python3}
started=$SECONDS
[ "${PADDLE_EXT_GPU_CHECK_REUSE:-0}" = 1 ] || rm -rf "$out"
mkdir -p "$out/obj" "$out/logs"

if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "device_check: $NVCC not found (set NVCC=/path/to/nvcc)" >&2
  exit 1
fi
gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
if [ -n "$gpu" ]; then
  archs=${CUDA_ARCHS:-$(echo "${gpu##*, }" | tr -d .)}
else
  archs=${CUDA_ARCHS:-80 90}
fi
arch=()
for a in $archs; do arch+=(-gencode "arch=compute_$a,code=sm_$a"); done
echo "== device_check: GPU: ${gpu:-none (nvidia-smi found none)}; $("$NVCC" --version | tail -n 1); archs: $archs"

common=(-std=c++17 -O2 -DPADDLE_EXT_WITH_GPU -Icsrc/ops -Icsrc/include -Icsrc/runtime)
steps=() results=() times=()
step_done() {  # NAME RESULT SECONDS
  steps+=("$1") results+=("$2") times+=("$3")
}

# ---- build ---------------------------------------------------------------------
build_started=$SECONDS
find_kernel_sources
find_cpu_sources
pids=() what=()
compile() {  # LOG-NAME COMMAND...: in the background, output to a log
  local name=$1
  shift
  "$@" >"$out/logs/$name.log" 2>&1 &
  pids+=($!) what+=("$name")
}
fresh() { [ "${PADDLE_EXT_GPU_CHECK_REUSE:-0}" != 1 ] || [ ! -f "$1" ]; }
for src in "${kernel_sources[@]}"; do
  # -fPIC: flash_attn.cu's object also goes into the ctypes library.
  fresh "$(obj "$src")" && compile "$(basename "$src")" "$NVCC" "${common[@]}" "${arch[@]}" \
    -Xcompiler -Wall,-Wextra,-fPIC -c "$src" -o "$(obj "$src")"
done
for src in "${cpu_sources[@]}"; do
  fresh "$(obj "$src")" && compile "$(basename "$src")" g++ "${common[@]}" -Wall -Wextra -c "$src" -o "$(obj "$src")"
done
# The tensor-core kernels under the CPU warp emulator: plain C++ (g++), no CUDA header.
compile flash_attn_tc_emulated.cc g++ -std=c++17 -O2 -Wall -Wextra -Icsrc/ops -Itests/gpu -c \
  tests/gpu/flash_attn_tc_emulated.cc -o "$(obj tests/gpu/flash_attn_tc_emulated.cc)"
for src in tests/gpu/kernels_check.cc tests/gpu/kernels_capi.cc csrc/tools/device_probe.cc; do
  [ "$src" = tests/gpu/kernels_check.cc ] || [ "$src" = tests/gpu/kernels_capi.cc ] || fresh "$(obj "$src")" || continue
  compile "$(basename "$src")" "$NVCC" "${common[@]}" -Itests/gpu -Xcompiler -Wall,-Wextra,-fPIC -c "$src" \
    -o "$(obj "$src")"
done
native_dir=""
if [ -n "$gpu" ] || [ "${PADDLE_EXT_GPU_CHECK_CMAKE:-0}" = 1 ]; then
  # paddle_ext._C as setup.py builds it (BuildNative._build_cmake), for $PYTHON, cuda backend required.
  native_dir=$out/native
  compile runtime-cmake bash -c "cmake -S csrc -B '$out/runtime' -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY='$PWD/$native_dir' -DPython_EXECUTABLE='$(command -v "$PYTHON")' \
    -Dpybind11_DIR=\"\$('$PYTHON' -m pybind11 --cmakedir)\" -DPADDLE_EXT_WITH_CUDA=ON \
    && cmake --build '$out/runtime' --parallel"
fi
declare -A broken=()  # what failed to compile (log name) or link (program name)
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "device_check: build of ${what[$i]} FAILED:" >&2
    cat "$out/logs/${what[$i]}.log" >&2
    broken[${what[$i]}]=1
  fi
done
# built NAME... : whether none of these failed
built() {
  local n
  for n in "$@"; do [ -z "${broken[$n]:-}" ] || return 1; done
}
kernel_objs=() object_logs=()
for src in "${kernel_sources[@]}"; do kernel_objs+=("$(obj "$src")") object_logs+=("$(basename "$src")"); done
cpu_objs=()
for src in "${cpu_sources[@]}"; do cpu_objs+=("$(obj "$src")") object_logs+=("$(basename "$src")"); done
link() {  # PROGRAM-NAME OBJECT-LOG-NAMES... -- NVCC-ARGS...
  local name=$1
  shift
  local needs=()
  while [ "$1" != -- ]; do needs+=("$1"); shift; done
  shift
  if ! built "${needs[@]}"; then
    broken[$name]=1
  elif ! "$NVCC" "$@" >"$out/logs/link-$name.log" 2>&1; then
    echo "device_check: link of $name FAILED:" >&2
    cat "$out/logs/link-$name.log" >&2
    broken[$name]=1
  fi
}
link kernels_check "${object_logs[@]}" kernels_check.cc flash_attn_tc_emulated.cc -- \
  "$(obj tests/gpu/kernels_check.cc)" "$(obj tests/gpu/flash_attn_tc_emulated.cc)" "${kernel_objs[@]}" "${cpu_objs[@]}" -ldl -lpthread -o "$out/kernels_check"
link device_probe "${object_logs[@]}" device_probe.cc -- \
  "$(obj csrc/tools/device_probe.cc)" "${kernel_objs[@]}" "${cpu_objs[@]}" -ldl -lpthread -o "$out/device_probe"
link libpaddle_ext_gpu_kernels.so flash_attn.cu flash_attn_tc.cu kernels_capi.cc -- \
  -shared "$(obj tests/gpu/kernels_capi.cc)" "$(obj csrc/ops/gpu/flash_attn.cu)" "$(obj csrc/ops/gpu/flash_attn_tc.cu)" -o "$out/libpaddle_ext_gpu_kernels.so"
if [ "${#broken[@]}" = 0 ]; then
  echo "device_check: built ${#kernel_sources[@]} CUDA sources, ${#cpu_sources[@]} CPU sources, kernels_check, device_probe, libpaddle_ext_gpu_kernels.so${native_dir:+, paddle_ext._C}"
  step_done build ok $((SECONDS - build_started))
else
  step_done build "FAIL (${!broken[*]})" $((SECONDS - build_started))
fi

# ---- run -----------------------------------------------------------------------
# NAME COMMAND...: exit 0 ok, 77 skipped (or $skip_label; a failure where nvidia-smi saw a GPU), else FAIL
run_step() {
  local name=$1 t=$SECONDS rc
  shift
  echo "== device_check: $name: $*"
  "$@"
  rc=$?
  if [ "$rc" = 77 ] && [ -n "$gpu" ]; then rc=177; fi
  case $rc in
    0) step_done "$name" ok $((SECONDS - t)) ;;
    77) step_done "$name" "${skip_label:-skipped}" $((SECONDS - t)) ;;
    177) step_done "$name" "FAIL (skipped)" $((SECONDS - t)) ;;
    *) step_done "$name" "FAIL (exit $rc)" $((SECONDS - t)) ;;
  esac
}

# NAME ARTIFACT COMMAND...: run_step when ARTIFACT (a name of the build) was built, else a failed step.
run_built() {
  local name=$1 artifact=$2
  shift 2
  if built "$artifact"; then
    run_step "$name" "$@"
  else
    echo "== device_check: $name: not run: $artifact did not build"
    step_done "$name" "FAIL (not built)" 0
  fi
}

skip_label="cpu half ok" run_built kernels kernels_check "$out/kernels_check"
run_built c_embedding-probe device_probe "$out/device_probe"
# Shared-memory races and out-of-bounds accesses of the flash-attention kernels
# (tensor-core and simple), which the warp emulator cannot show: small cases
# under compute-sanitizer, where the toolkit has it.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -n "$gpu" ] && [ -n "$sanitizer" ]; then
  for tool in racecheck memcheck; do
    run_built "sanitizer-$tool" kernels_check "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$out/kernels_check" --flash "bf16 S130 H2 D32,bf16 causal-br Sq64 Sk192 D128"
  done
elif [ -n "$gpu" ]; then
  echo "== device_check: sanitizer-racecheck, sanitizer-memcheck: not run: no compute-sanitizer here"
fi
if [ -n "$native_dir" ]; then
  run_built runtime-pool-event runtime-cmake env PYTHONUNBUFFERED=1 "$PYTHON" tests/runtime/gpu_check.py \
    stream-reuse --native-dir "$native_dir"
else  # no GPU, no CMake build here: the interpreter's own paddle_ext._C (make setup's .venv) shows the skip path
  py=$PYTHON
  [ -x .venv/bin/python ] && py=.venv/bin/python
  if "$py" -c "import paddle_ext._C" 2>/dev/null; then
    run_step runtime-pool-event "$py" tests/runtime/gpu_check.py stream-reuse
  else
    echo "== device_check: runtime-pool-event: skipped: no GPU, and $py has no paddle_ext._C (make setup builds one)"
    step_done runtime-pool-event skipped 0
  fi
fi
if [ -n "$gpu" ]; then
  run_built flash-timing libpaddle_ext_gpu_kernels.so env PYTHONUNBUFFERED=1 "$PYTHON" bench/flash_attn_gpu.py \
    --lib "$out/libpaddle_ext_gpu_kernels.so" --budget-s "${TIMING_BUDGET_S:-200}"
  if "$PYTHON" -c "import paddle, paddle_ext.ops; assert paddle.device.cuda.device_count() > 0" 2>/dev/null; then
    run_step paddle-gpu-tests "$PYTHON" -m pytest -q tests/gpu
  else
    echo "== device_check: no GPU build of Paddle with paddle_ext here: tests/gpu/test_*_gpu.py not run"
  fi
else
  run_built ctypes-selftest libpaddle_ext_gpu_kernels.so "$PYTHON" bench/flash_attn_gpu.py \
    --lib "$out/libpaddle_ext_gpu_kernels.so" --selftest
  run_step python-syntax "$PYTHON" -m py_compile bench/flash_attn_gpu.py tests/runtime/gpu_check.py
  echo "== device_check: flash-timing: skipped: no GPU (it needs torch with CUDA; torch is $("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable') here)"
  step_done flash-timing skipped 0
fi

echo
echo "== device_check summary (GPU: ${gpu:-none})"
printf '%-22s %-16s %8s\n' step result seconds
failed=0 skipped=0
for i in "${!steps[@]}"; do
  printf '%-22s %-16s %8s\n' "${steps[$i]}" "${results[$i]}" "${times[$i]}"
  case ${results[$i]} in ok) ;; skipped | "cpu half ok") skipped=1 ;; *) failed=1 ;; esac
done
total=$((SECONDS - started))
if [ "$failed" = 1 ]; then
  echo "== device_check: FAILED, ${total} s"
  exit 1
fi
if [ -z "$gpu" ]; then
  echo "== device_check: skipped (exit 77): no GPU here; everything compiled and the CPU half passed, ${total} s"
  exit 77
fi
[ "$skipped" = 1 ] && note=" (steps marked skipped did not run)" || note=""
echo "== device_check: passed$note, ${total} s"
exit 0
