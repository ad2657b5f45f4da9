#!/usr/bin/env bash
# XPU compile leg. No Kunlun SDK exists here, so the XPU code paths are host
# C++ over the project's own declarations (csrc/include/xpu/runtime_decls.h)
# with the runtime dlopened at run time (csrc/runtime/device/xpu_runtime.cc).
# This leg compiles every such source with g++, links the probe
# (csrc/tools/xpu_probe.cc) and runs it twice: as is (here: "no XPU runtime
# (libxpurt.so not found ...)") and against a stand-in runtime built from
# csrc/tools/fake_xpurt.cc, which exercises the dlopen / dlsym path.
#
# XPU sources: every *.cc / *.cpp under csrc/ that includes xpu/runtime_decls.h
# or xpu_runtime.h. Kunlun device code (*.xpu, *.kps) needs the SDK's compiler:
# this leg fails if any appears rather than skip it.
# Usage, from the repository root: ci/xpu-compile.sh   (outputs in build/ci/xpu/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/lib/compile_leg.sh
leg_begin xpu-compile build/ci/xpu
mkdir -p "$out/fake"
CXX=${CXX:-g++}
echo "== xpu-compile: $("$CXX" --version | head -n 1)"

mapfile -t device_code < <(find csrc -type f \( -name '*.xpu' -o -name '*.kps' \) | LC_ALL=C sort)
if [ "${#device_code[@]}" -gt 0 ]; then
  printf 'xpu-compile: Kunlun device sources need the XPU SDK compiler, absent here: %s\n' "${device_code[@]}" >&2
  exit 1
fi

mapfile -t sources < <(sources_including 'xpu/runtime_decls\.h|xpu_runtime\.h')
if [ "${#sources[@]}" -eq 0 ]; then
  echo "xpu-compile: no XPU source under csrc/" >&2
  exit 1
fi

common=(-std=c++17 -O2 -fPIC -Wall -Wextra -Icsrc/include -Icsrc/runtime -Icsrc/ops)

for src in "${sources[@]}"; do
  echo "g++         $src"
  "$CXX" "${common[@]}" -c "$src" -o "$(obj "$src")"
done

echo "link        $out/xpu_probe"
"$CXX" "$(obj csrc/tools/xpu_probe.cc)" "$(obj csrc/runtime/device/xpu_runtime.cc)" -ldl -o "$out/xpu_probe"
echo "link        $out/fake/libxpurt.so (stand-in runtime)"
"$CXX" -shared "$(obj csrc/tools/fake_xpurt.cc)" -o "$out/fake/libxpurt.so"

echo "run         $out/xpu_probe"
env -u PADDLE_EXT_XPURT "$out/xpu_probe"
echo "run         PADDLE_EXT_XPURT=$out/fake/libxpurt.so $out/xpu_probe"
PADDLE_EXT_XPURT="$out/fake/libxpurt.so" "$out/xpu_probe"

leg_end "${#sources[@]} XPU sources compiled, probe ran twice"
