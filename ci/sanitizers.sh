#!/usr/bin/env bash
# Leg sanitizers: the allocator's multithread stress (50 threads x 50 random
# sizes x 10 allocations, tests/runtime/native/stress.cc) built and run under
# ThreadSanitizer, then under AddressSanitizer + UBSan. Needs only a C++17
# compiler. tests/runtime/native/run_sanitized.sh builds, runs and judges
# each (the pytest test calls the same script); .ci/run skips the pytest copy
# in `make test` so the builds run once. A compiler that cannot link a
# sanitizer fails the leg (exit 77 from the script), it does not skip.
set -euo pipefail
cd "$(dirname "$0")/.."
for kind in tsan asan; do
  echo "sanitizers: $kind"
  bash tests/runtime/native/run_sanitized.sh "$kind" build/sanitizers
done
echo "sanitizers: tsan and asan+ubsan clean"
