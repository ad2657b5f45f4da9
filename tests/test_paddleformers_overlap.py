"""Unit paddleformers_overlap: PaddleFormers' refusal of dp_comm_overlap with pipeline
parallelism is lifted only while paddle_ext's engine serves fleet's models, the Trainer's
_wrap_model is wrapped (early_comm_buffers), and the unit patches PaddleFormers (and
PaddleNLP: tests/test_paddlenlp_overlap.py for its refusal) whether it is imported before
or after enable(); it applies where either package is installed."""

import importlib
import sys

import pytest

import paddle_ext
from paddle_ext import trainer_overlap as impl
from paddle_ext.patches import paddleformers_overlap as unit
from paddle_ext.patches import series
from paddle_ext.patches._unit import ImportHook


@pytest.fixture(autouse=True)
def clean():
    paddle_ext.disable()
    yield
    paddle_ext.disable()


def _status():
    return {name: status for name, _, status, _ in paddle_ext.patch_table()}["paddleformers_overlap"]


def test_skipped_without_paddleformers_and_paddlenlp(monkeypatch):
    monkeypatch.setattr(unit.importlib.util, "find_spec", lambda name, *a: None)
    assert unit._unavailable() == "PaddleFormers is not installed, and PaddleNLP is not installed"


@pytest.mark.parametrize("package", ["paddleformers", "paddlenlp"])
def test_applies_with_either_trainer_package(monkeypatch, package):
    monkeypatch.setattr(unit.importlib.util, "find_spec", lambda name, *a: object() if name == package else None)
    assert unit._unavailable() is None


@pytest.mark.parametrize("module, cls_name, attr", [(impl.ARGS_MODULE, "TrainingArguments", "__post_init__"),
                                                     (impl.TRAINER_MODULE, "Trainer", "_wrap_model"),
                                                     (impl.NLP_ARGS_MODULE, "TrainingArguments", "__post_init__")])
def test_patches_the_trainers_on_import_and_restores_them(module, cls_name, attr):
    package = module.split(".", 1)[0]
    pytest.importorskip(package, reason=f"{package} is not installed")
    if module in sys.modules:  # imported already: patched at once
        cls = getattr(sys.modules[module], cls_name)
        original = vars(cls)[attr]
        paddle_ext.enable()
    else:  # patched by the import hook when the module loads
        paddle_ext.enable()
        assert _status() == "applied"
        assert any(isinstance(f, ImportHook) and f.active and f.module == module for f in sys.meta_path)
        cls = getattr(importlib.import_module(module), cls_name)
        original = vars(cls)[attr].__wrapped__
    assert series().installed_by(getattr(cls, attr)) == "paddleformers_overlap"
    paddle_ext.disable()
    assert vars(cls)[attr] is original
    assert not any(isinstance(f, ImportHook) and f.active for f in sys.meta_path)


def test_refusal_kept_when_the_engine_does_not_serve(monkeypatch):
    pytest.importorskip("paddleformers", reason="PaddleFormers is not installed")
    monkeypatch.setenv("PADDLE_EXT_PATCHES", "pipeline_engine=off")
    paddle_ext.enable()
    assert not impl.engine_serves()
