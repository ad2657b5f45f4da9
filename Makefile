# Two commands for a newcomer (see README.md):
#   make demo   set up .venv (Paddle + this plugin, built) and run the main job:
#               the doctor report, then a pipeline-parallel training demo on 2 CPU ranks
#   make test   set up .venv the same way and run the test suite
# PADDLE selects the Paddle release, VENV the environment folder, EXTRAS more of
# pyproject's extras to install (e.g. EXTRAS=paddleformers), PYTEST_ARGS extra pytest
# arguments.

PADDLE ?= 3.3.1
EXTRAS ?=
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.paddle-ext-installed
comma := ,
NATIVE_SOURCES := $(shell find csrc tools -type f 2>/dev/null) setup.py pyproject.toml

.PHONY: setup demo test lint clean bench-torch

setup: $(STAMP)

$(STAMP): $(NATIVE_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "paddlepaddle==$(PADDLE)"
	$(PY) -m pip install -q -e ".[test,plot$(if $(EXTRAS),$(comma)$(EXTRAS))]"
	$(PY) -c "import paddle; assert paddle.__version__ == '$(PADDLE)', paddle.__version__"
	touch $@

demo: $(STAMP)
	$(PY) -m paddle_ext doctor
	$(PY) examples/pipeline_demo.py

test: $(STAMP)
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check paddle_ext patches tests bench tools setup.py

# The torch environment of bench/pipeline_vs_torch.py (never .venv: Paddle's
# environment stays torch-free). `make bench-torch` then see docs/overhead.md.
TORCH_VENV ?= .venv-torch
TORCH_STAMP := $(TORCH_VENV)/.bench-torch-installed

bench-torch: $(TORCH_STAMP)

$(TORCH_STAMP): bench/requirements-torch.txt
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install -q -r bench/requirements-torch.txt
	$(TORCH_VENV)/bin/python -c "import torch, torch.distributed.pipelining; print('torch', torch.__version__)"
	touch $@

clean:
	rm -rf build $(VENV) paddle_ext/lib paddle_ext/_C*.so
