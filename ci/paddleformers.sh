#!/usr/bin/env bash
# Leg paddleformers: PaddleFormers' own Trainer on the plugin's pipeline engine, Paddle 3.3.1.
# Installs the [paddleformers] extra (paddleformers 1.2.0 with the pyarrow<26 pin) into a
# venv of its own through the Makefile's setup, then runs the Trainer parity tests
# (tests/multiproc/test_paddleformers.py: configs a-f, evaluate(), resume_from_checkpoint) and
# the unit that lifts PaddleFormers' dp-overlap refusal (the main leg runs both skipped: no
# PaddleFormers there).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$PWD/build/ci/paddleformers/venv"
make setup PADDLE=3.3.1 VENV="$venv" EXTRAS=paddleformers
"$venv/bin/python" -c "
import numpy, pyarrow, paddleformers.trainer
print('paddleformers', paddleformers.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__)"
"$venv/bin/python" -m pytest -q -rs tests/multiproc/test_paddleformers.py tests/test_paddleformers_overlap.py
