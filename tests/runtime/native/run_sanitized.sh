#!/usr/bin/env bash
# Builds tests/runtime/native/stress.cc with the allocator core under one
# sanitizer and runs it:
#   run_sanitized.sh tsan|asan [BUILD_DIR] [threads sizes per_size]
# tsan: ThreadSanitizer; asan: AddressSanitizer + UndefinedBehaviorSanitizer.
# Any report fails the run. The binary is rebuilt only when a source, a
# header or the flags changed (a stamp of their hash), and its sources are
# compiled in parallel, so the suite pays the build once.
set -euo pipefail
kind=${1:?usage: run_sanitized.sh tsan|asan [BUILD_DIR] [threads sizes per_size]}
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${2:-$root/build/sanitizers}
shift $(( $# >= 2 ? 2 : 1 ))
case $kind in
  tsan) flags=(-fsanitize=thread) ;;
  asan) flags=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer) ;;
  *) echo "unknown sanitizer $kind (tsan or asan)" >&2; exit 2 ;;
esac
cxx=${CXX:-g++}
# -O0 -g1: about half the build time of -O1 -g; the stress still runs in seconds.
flags=(-std=c++17 -O0 -g1 "${flags[@]}" -I"$root/csrc/runtime")
src=(
  "$root"/csrc/runtime/core/*.cc
  "$root"/csrc/runtime/backends/cpu_event.cc
  "$root"/csrc/runtime/backends/fake.cc
  "$root"/tests/runtime/native/stress.cc
)
dir=$out/$kind
bin=$dir/stress
mkdir -p "$dir"
stamp=$( { echo "$cxx ${flags[*]}"; cat "${src[@]}" "$root"/csrc/runtime/core/*.h "$root"/csrc/runtime/backends/*.h; } | sha256sum | cut -c1-16)
if [ -x "$bin" ] && [ "$(cat "$dir/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$kind: $bin is up to date"
else
  echo "$kind: building $bin (${#src[@]} sources)"
  jobs_max=$(nproc)
  objs=()
  for s in "${src[@]}"; do
    o=$dir/$(basename "$(dirname "$s")")_$(basename "$s" .cc).o
    objs+=("$o")
    "$cxx" "${flags[@]}" -c "$s" -o "$o" &
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  done
  while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n; done
  "$cxx" "${flags[@]}" "${objs[@]}" -o "$bin" -pthread
  echo "$stamp" > "$dir/stamp"
fi
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 halt_on_error=1 exitcode=66 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1 ${UBSAN_OPTIONS:-}"
"$bin" "$@"
