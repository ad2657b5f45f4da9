#!/usr/bin/env bash
# Builds tests/runtime/native/stress.cc with the allocator core under one
# sanitizer and runs it:
#   run_sanitized.sh tsan|asan [BUILD_DIR] [threads sizes per_size]
# tsan: ThreadSanitizer; asan: AddressSanitizer + UndefinedBehaviorSanitizer.
# The one place that builds, runs and judges the sanitized stress: the pytest
# test (tests/runtime/test_sanitizers.py) and the CI leg (ci/sanitizers.sh)
# both call it. Exit 0: clean; 77: the compiler cannot link this sanitizer
# here (pytest skips, the CI leg fails); anything else: a report, a failed
# check or a failed build. The binary is rebuilt only when a source, a
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
if ! echo 'int main() { return 0; }' | "$cxx" "${flags[0]}" -x c++ - -o /dev/null 2>/dev/null; then
  echo "$kind: $cxx cannot link ${flags[0]} here" >&2
  exit 77
fi
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
log=$dir/last.log
set +e
"$bin" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# halt_on_error already turns a report into exit 66; the log is checked too,
# so a report that did not halt (or a stress that ended early) still fails.
for report in "WARNING: ThreadSanitizer" "ERROR: AddressSanitizer" "ERROR: LeakSanitizer" "runtime error:"; do
  if grep -qF "$report" "$log"; then echo "$kind: sanitizer report ($report) in $log" >&2; [ "$rc" -ne 0 ] || rc=1; fi
done
if ! grep -qF "pattern errors 0, stats consistent" "$log"; then
  echo "$kind: the stress did not report 'pattern errors 0, stats consistent'" >&2
  [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
