#!/usr/bin/env bash
# Leg cpu-paddle-2.6.2: the full suite against Paddle 2.6.2 in its own venv.
# The package builds its op library in place (editable install), so the leg
# works on a private copy of the tree and leaves the main one to Paddle 3.3.1.
set -euo pipefail
cd "$(dirname "$0")/.."
work=build/ci/cpu-paddle-2.6.2
source ci/lib/tree_copy.sh
tree_copy "$work/src"
# A declared subset: everything that touches Paddle. Left to the 3.3.1 leg, because they
# import no Paddle and so cannot differ between releases: tests/pipeline (the pure-Python
# schedule layer) and the allocator's sanitizer builds (C++ only).
echo "cpu-paddle-2.6.2: make test PADDLE=2.6.2 in $work/src (without tests/pipeline and the sanitizer builds: Paddle-independent)"
PADDLE_EXT_SKIP_SANITIZERS=1 PADDLE_EXT_TEST_MULTIHOST_JOBS=3 make -C "$work/src" test PADDLE=2.6.2 VENV="$PWD/$work/venv" \
    PYTEST_ARGS="--ignore=tests/pipeline"
# The install must have pinned protobuf below 5 and numpy below 2 for Paddle 2.6 by itself.
"$work/venv/bin/python" -c "
import google.protobuf as p, numpy as n
print('protobuf', p.__version__, 'numpy', n.__version__)
assert int(p.__version__.split('.')[0]) < 5 and int(n.__version__.split('.')[0]) < 2"
