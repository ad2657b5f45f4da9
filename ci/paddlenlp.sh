#!/usr/bin/env bash
# Leg paddlenlp: PaddleNLP 2.8.1's own Trainer on the plugin's pipeline engine, Paddle 2.6.2:
# tests/multiproc/test_paddlenlp.py (pp2 x dp2 with and without enable_dp_comm_overlap, and
# with enable_delay_scale_loss, against a single process and against each other bit for bit),
# the unit that lifts PaddleNLP's dp-overlap refusal (tests/test_paddlenlp_overlap.py) and
# its import hook (tests/test_paddleformers_overlap.py; its PaddleFormers cases skip here).
# The other legs run these skipped: no PaddleNLP there.
#
# $VENV (default build/ci/paddlenlp/venv) gets Paddle 2.6.2 and the plugin, then PaddleNLP. With
# SEED_VENV set (.ci/run: leg cpu-paddle-2.6.2's venv, once that leg is done), $VENV starts as a
# copy of it, so neither Paddle 2.6.2 nor the op library is installed or built again; its plugin
# is an editable install of that leg's private tree copy, where the op library was built for
# 2.6.2, so the tests run in that tree (asked of the venv itself). Without a seed the leg makes
# its own tree copy and venv (`make setup PADDLE=2.6.2`), as cpu-paddle-2.6.2 does.
set -euo pipefail
cd "$(dirname "$0")/.."
work=build/ci/paddlenlp
VENV=${VENV:-$work/venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
if [ -n "${SEED_VENV:-}" ] && [ -f "$SEED_VENV/.paddle-ext-installed" ] && [ ! -e "$VENV" ]; then
  mkdir -p "$(dirname "$VENV")"
  cp -a "$SEED_VENV" "$VENV.partial"  # the seed's files are complete once its stamp exists
  mv "$VENV.partial" "$VENV"
  echo "[paddlenlp] $VENV: a copy of $SEED_VENV"
fi
if [ -f "$VENV/.paddle-ext-installed" ]; then  # the tree its plugin was installed (and built) from
  src=$(cd / && "$VENV/bin/python" -c "import os, paddle_ext; print(os.path.dirname(os.path.dirname(paddle_ext.__file__)))")
else
  source ci/lib/tree_copy.sh
  src=$work/src
  tree_copy "$src"
fi
echo "[paddlenlp] the plugin's tree: $src"
make -C "$src" setup PADDLE=2.6.2 VENV="$VENV"  # a no-op for a current seed
py="$VENV/bin/python"
# PaddleNLP 2.8.1 on Paddle 2.6.2, measured (../shared/UPSTREAM.md): huggingface_hub<1
# (repo_type_and_id_from_hf_id), aistudio-sdk<0.3 (aistudio_sdk.hub.download), datasets<3;
# protobuf<5 and numpy<2 for Paddle 2.6; pyarrow<26: 26 wants numpy 2 ("pyarrow requires
# NumPy 2.0 or newer" when datasets imports it), and declares no such requirement. scipy,
# aiohttp, scikit-learn and pyarrow need no pin for Paddle 2.6.2's broken zlib (scipy 1.17.1's
# import: "zlib.error ... inconsistent stream state"): importing paddle_ext first repairs it
# (paddle_ext.zlib_binding; measured with their newest releases).
requirements=("paddlenlp==2.8.1" "huggingface_hub<1" "aistudio-sdk<0.3" "datasets<3" "protobuf<5" "numpy<2"
              "pyarrow<26")
echo "[paddlenlp] installing: ${requirements[*]}"
"$py" -m pip install -q --disable-pip-version-check "${requirements[@]}"
"$py" -m pip check
# imported for real here, so that a broken install fails the leg instead of skipping its tests
(cd "$src" && "$py" -c "
import paddle_ext, paddle, paddlenlp.trainer, paddlenlp.transformers
assert paddle.__version__ == '2.6.2', paddle.__version__
print('paddlenlp', paddlenlp.__version__, 'paddle', paddle.__version__)")
cd "$src"
"$py" -m pytest -q -rs tests/multiproc/test_paddlenlp.py tests/test_paddlenlp_overlap.py \
    tests/test_paddleformers_overlap.py
