#!/usr/bin/env bash
# Leg paddleformers: PaddleFormers' own Trainer on the plugin's pipeline engine, Paddle 3.3.1.
# $VENV (default .venv) gets the [paddleformers] extra's requirements, read from pyproject.toml
# (paddleformers 1.2.0 with the pyarrow<26 / numpy<=1.26.4 pins). With SEED_VENV set (.ci/run:
# the main leg's .venv, Paddle 3.3.1 and the plugin installed editable, its op library built
# in place, while that leg's tests still run in it), $VENV starts as a copy of it, so nothing
# is rebuilt and the main leg's venv is not changed under its tests; `make setup` then is a
# no-op, and sets $VENV up from scratch when the leg runs alone. Then the Trainer parity
# tests (tests/multiproc/test_paddleformers.py: configs a-y (a1: gradient_accumulation_steps 1 under pp2, g: use_dualpipev, h: flashmask attention, i: sequence parallel, j: sharding overlap, k: every pipeline switch, l: ERNIE 4.5 with fused ops, m: tensor parallel without a pipeline, with resume; n-z: sharding stages 2 and 3, stage 1 with its switches, split_param with and without sharding overlap; re: its resume with early_comm_buffers), the split-row-sum run, evaluate(),
# resume_from_checkpoint), the unit that lifts PaddleFormers' dp-overlap refusal and
# PaddleFormers' attention functions imported before enable() (tests/test_paddleformers_*.py;
# the main leg runs them skipped: no PaddleFormers there).
# The user's path, `pip install ".[paddleformers]"`, installs the same list plus the plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ -n "${SEED_VENV:-}" ] && [ -f "$SEED_VENV/.paddle-ext-installed" ] && [ ! -e "$VENV" ]; then
  mkdir -p "$(dirname "$VENV")"
  cp -a "$SEED_VENV" "$VENV.partial"  # the seed's files are complete once its stamp exists
  mv "$VENV.partial" "$VENV"
  echo "[paddleformers] $VENV: a copy of $SEED_VENV"
fi
if [ -f "$VENV/.paddle-ext-installed" ] && ! make -q setup PADDLE=3.3.1 VENV="$VENV"; then
  echo "note: $VENV's setup is older than the sources: make setup reinstalls (and rebuilds) the plugin"
fi
make setup PADDLE=3.3.1 VENV="$VENV"
py="$VENV/bin/python"
mapfile -t requirements < <("$py" -c "
import tomllib
with open('pyproject.toml', 'rb') as f:
    print('\n'.join(tomllib.load(f)['project']['optional-dependencies']['paddleformers']))")
echo "[paddleformers] extra: ${requirements[*]}"
"$py" -m pip install -q "${requirements[@]}"
"$py" -m pip check
"$py" -c "
import numpy, paddle, pyarrow, paddleformers.trainer
assert paddle.__version__ == '3.3.1', paddle.__version__
print('paddleformers', paddleformers.__version__, 'paddle', paddle.__version__, 'numpy', numpy.__version__,
      'pyarrow', pyarrow.__version__)"
"$py" -m pytest -q -rs tests/multiproc/test_paddleformers.py tests/test_paddleformers_*.py
