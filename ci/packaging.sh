#!/usr/bin/env bash
# Leg packaging: a new user's installs, each into a fresh venv, on a clean copy of the tree
# (tracked and untracked-but-not-ignored files: nothing a build left), in turn:
#   1. pip wheel .        Paddle 3.3.1 (venv 1), the wheel then installed into venv 1
#   2. pip install .      Paddle 2.6.2 (venv 2), from the same tree after 1 (a second
#                         environment once failed on the first one's CMake cache, which named
#                         a deleted ninja)
#   3. the 3.3.1 wheel put into venv 2 must say it was built for Paddle 3.3.1.
# Each install ends with `python -m paddle_ext doctor` listing every unit of patches/series
# applied (or native upstream), run outside the tree and from the tree's root: there an
# install that is not editable must stop at once with the "source tree" message (exit 2, no
# traceback). The editable install, `pip install -e .` of a clean clone into a fresh venv,
# is the main leg's `make setup` (cpu-paddle-3.3.1), whose doctor test runs from the tree's
# root (tests/test_patches.py). `pip install .` is `pip wheel .` and an install of that
# wheel in one command (the same PEP 517 build): until 2026-12-07 this leg also ran
# `pip install .` into a third venv with Paddle 3.3.1, beside the wheel built there, one more
# build of the same sources in the same environment (~110 core-seconds of CI's 2-core
# budget: the op library, the _C module, pip's isolated build env) that checked nothing the
# wheel's build and install do not. Venv 2 is made (venv + Paddle from the pip cache) in the
# background while the first build compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
work=$PWD/build/ci/packaging
src=$work/src
rm -rf "$work"
mkdir -p "$work/logs"
source ci/lib/tree_copy.sh
tree_copy "$src"
python=${PYTHON:-python3}

say() { echo "packaging [$((SECONDS - started)) s]: $*"; }

new_venv() {  # DIR PADDLE_VERSION
  "$python" -m venv "$1"
  "$1/bin/pip" install -q --disable-pip-version-check "paddlepaddle==$2"
}

# doctor VENV NAME: the doctor from outside the tree must pass and list every unit.
doctor() {
  local log="$work/logs/$2-doctor.txt" unit status
  (cd "$work" && "$1/bin/python" -m paddle_ext doctor) > "$log" 2>&1 || { cat "$log"; say "$2: doctor failed"; exit 1; }
  while read -r unit _; do
    status=$(awk -v u="$unit" '$1 == u { print $0 }' "$log")
    case "$status" in
      *" applied "* | *" native upstream "*) ;;
      *" skipped ("*" is not installed)"*) ;;  # a unit for an optional package (paddleformers_overlap)
      *" skipped (this Paddle has no FlexCheckpoint "*) ;;  # host_checkpoint: Paddle 3.2+ only (2.6.2 here)
      *) cat "$log"; say "$2: unit $unit not applied: '$status'"; exit 1 ;;
    esac
  done < <(sed 's/#.*//' "$src/patches/series" | awk 'NF')
  say "$2: doctor ok ($(grep -c ' applied ' "$log") units applied; $(grep "MKL code path" "$log" | sed 's/.*code path: //'))"
}

# doctor_at_root VENV NAME: from the tree's root a non-editable install must refuse, saying
# what to run.
doctor_at_root() {
  local log="$work/logs/$2-doctor-root.txt" rc=0
  (cd "$src" && "$1/bin/python" -m paddle_ext doctor) > "$log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q 'from its source tree' "$log" && grep -q 'pip install -e \.' "$log" \
    && ! grep -q Traceback "$log" || { cat "$log"; say "$2: doctor at the root: rc $rc"; exit 1; }
  say "$2: doctor at the tree's root refuses (exit $rc)"
}

install() {  # VENV NAME ARGS...: a pip install of the tree, logged
  local venv=$1 name=$2
  shift 2
  local t=$SECONDS
  (cd "$src" && "$venv/bin/pip" install --disable-pip-version-check "$@") > "$work/logs/$name-install.txt" 2>&1 \
    || { tail -40 "$work/logs/$name-install.txt"; say "$name: pip install $* failed"; exit 1; }
  say "$name: pip install $* ($((SECONDS - t)) s)"
}

new_venv "$work/venv1" 3.3.1
say "venv1 ready"
new_venv "$work/venv2" 2.6.2 > "$work/logs/venvs.txt" 2>&1 &
venvs=$!

t=$SECONDS
(cd "$src" && "$work/venv1/bin/pip" wheel --disable-pip-version-check --no-deps -w "$work/dist" .) \
  > "$work/logs/wheel.txt" 2>&1 || { tail -40 "$work/logs/wheel.txt"; say "pip wheel failed"; exit 1; }
wheel=$(ls "$work"/dist/paddle_ext-*.whl)
say "wheel $(basename "$wheel") ($((SECONDS - t)) s)"
"$work/venv1/bin/pip" install -q --disable-pip-version-check "$wheel"
doctor "$work/venv1" venv1
doctor_at_root "$work/venv1" venv1

wait "$venvs" || { cat "$work/logs/venvs.txt"; say "making venv 2 failed"; exit 1; }
say "venv2 ready"
install "$work/venv2" venv2 .
doctor "$work/venv2" venv2
doctor_at_root "$work/venv2" venv2
"$work/venv2/bin/python" -c "
import google.protobuf as p, numpy as n
assert int(p.__version__.split('.')[0]) < 5 and int(n.__version__.split('.')[0]) < 2, (p.__version__, n.__version__)"

# The 3.3.1 wheel beside Paddle 2.6.2: the doctor must name the release it was built for.
"$work/venv2/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
rc=0
(cd "$work" && "$work/venv2/bin/python" -m paddle_ext doctor) > "$work/logs/venv2-wheel-doctor.txt" 2>&1 || rc=$?
grep -q "built against Paddle 3.3.1, but Paddle 2.6.2 is installed" "$work/logs/venv2-wheel-doctor.txt" \
  && [ "$rc" -eq 1 ] || { cat "$work/logs/venv2-wheel-doctor.txt"; say "wheel beside Paddle 2.6.2: rc $rc"; exit 1; }
say "3.3.1 wheel beside Paddle 2.6.2: doctor says so (exit $rc)"
rm -rf "$work"/venv? "$work/src" "$work/dist"  # GBs; the logs stay in $work/logs
say "ok"
