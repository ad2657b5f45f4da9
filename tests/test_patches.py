"""The patch series: enable/disable round trips, configuration, the table."""

import importlib
import os
import subprocess
import sys
import types

import numpy as np
import paddle
import pytest

import paddle_ext
from paddle_ext import compat
from paddle_ext.comm.gloo_exchange import EXCHANGE_METHODS
from paddle_ext.patches import (
    device_synchronize,
    flash_attention,
    fused_rms_norm,
    fused_rotary,
    host_checkpoint,
    host_recompute,
    host_sharding,
    read_series,
    series,
)

MISSING = object()
pytestmark = pytest.mark.usefixtures("clean_series")


def patched_attributes():
    """Every attribute the series touches, read from its owner's own dict."""
    mp_ops = compat.mp_ops_module()
    gloo = compat.gloo_process_group_class()
    owners = [(mp_ops, "_c_lookup_table"), (importlib.import_module("paddle.base.core"), "create_or_get_global_tcp_store")]
    owners += [(gloo, name) for name in ("all_reduce_on_calc_stream", "send_on_calc_stream",
                                         "recv_on_calc_stream", "broadcast_on_calc_stream",
                                         "all_gather_into_tensor_on_calc_stream")]
    owners += [(gloo, name) for name in EXCHANGE_METHODS]
    owners += [(importlib.import_module("paddle.distributed.fleet.utils.hybrid_parallel_util"),
                "broadcast_input_data")]
    owners += [(owner, "c_identity") for owner in compat.c_identity_owners()]
    owners += [(owner, "c_concat") for owner in compat.c_concat_owners()]
    owners += [(owner, "c_softmax_with_cross_entropy") for owner, _ in compat.c_softmax_with_cross_entropy_owners()]
    owners += [(compat.collective_module(), "_new_process_group_impl")]
    owners += [(module, "distributed_model") for module in compat.fleet_modules()]
    owners += [(compat.parallel_env_class(), "device_id")]
    owners += [(compat.distributed_strategy_class(), "hybrid_configs")]
    owners += [(owner, "fused_rotary_position_embedding") for owner in fused_rotary.owners()]
    owners += [(flash_attention.owner(), name) for name in flash_attention.NAMES]
    owners += [(compat.pipeline_layer_class(), name) for name in ("get_schedule_chunk", "build_schedule_nodes")]
    if compat.paddle_version() < NATIVE_FROM["shared_comm_sep"]:
        owners += [(compat.pipeline_layer_class(), "_construct_shared_comm")]
    base = compat.process_group_classes()[0]
    owners += [(base, name) for name in ("all_reduce", "broadcast", "send", "recv", "barrier")]
    owners += [(compat.parallel_module(), "_set_default_store")]
    owners += [(compat.hybrid_communicate_group_class(), "__init__")]
    owners += [(gloo, name) for name in ("eager_connect", "eager_connect_ring_exchange")]
    owners += [(owner, "synchronize") for owner in device_synchronize.owners()]
    owners += [(fused_rms_norm.owner(), name) for name in fused_rms_norm.present()]
    if host_checkpoint.UNIT.unavailable() is None:  # 3.2+ on a CPU build
        import paddle.distributed as dist

        owners += [(host_checkpoint.owner(), "load_state_dict"), (dist, "load_state_dict")]
    if host_sharding.UNIT.unavailable() is None:  # CPU builds
        import paddle.distributed.sharding as sharding

        owners += [(host_sharding.dispatcher_module(), "group_sharded_parallel"), (sharding, "group_sharded_parallel")]
        owners += [(owner, name) for owner, name, _ in host_sharding._targets()]
        owners += [(importlib.import_module(f"{host_sharding.PACKAGE}.group_sharded_storage").ParamStorage,
                    "add_rank_params"),
                   (importlib.import_module(f"{host_sharding.PACKAGE}.group_sharded_utils").GroupShardedClipGrad,
                    "_dygraph_clip")]
        fusions = [host_sharding.fusion_module()] if compat.tensor_fusion_device_aware() else []
        fusions += [m for m in (compat.optimizer_fusion_module(),) if m is not None]
        owners += [(m, name) for m in fusions for name in ("alignment", "get_current_device_type")]
    if host_recompute.UNIT.unavailable() is None:  # CPU builds
        owners += [(owner, name) for owner, name, _ in compat.recompute_cpu_refusals()]
        owners += [(compat.hybrid_recompute_layer(), "backward")]
    if compat.paddle_version()[:2] < (3, 1):  # 2.6, 3.0: the unit adds them (3.1+ have Paddle's)
        owners += [(compat.meta_parallel_module(), name) for name in ("ScheduleNode", "ScheduleChunk")]
    return {(id(o), name): vars(o).get(name, MISSING) for o, name in owners}


def statuses():
    return {unit: status for unit, _, status, _ in paddle_ext.patch_table()}


def test_series_file_lists_every_unit_with_its_upstream_pr():
    names = read_series()
    assert names == ["store_latency", "gloo_calc_stream", "c_embedding_check", "parallel_cross_entropy", "pipeline_engine", "shared_comm_sep",
                     "fused_rotary", "fb_overlap",
                     "flash_attention", "comm_debug", "eager_connection", "device_synchronize",
                     "fused_rms_norm", "paddleformers_overlap", "host_checkpoint", "host_sharding", "host_recompute"]
    for state in series().states:
        assert state.unit.upstream, state.unit.name
        assert all(isinstance(n, int) and n > 1000 for n in state.unit.upstream)


def test_enable_disable_round_trip_restores_identical_objects():
    before = patched_attributes()
    paddle_ext.enable()
    during = patched_attributes()
    assert all(during[key] is not before[key] for key in before)
    paddle_ext.enable()  # idempotent: nothing is wrapped twice
    again = patched_attributes()
    assert all(again[key] is during[key] for key in during)
    paddle_ext.disable()
    after = patched_attributes()
    assert all(after[key] is before[key] for key in before)
    # inherited pybind methods came back by deletion, not by a copy
    gloo = compat.gloo_process_group_class()
    assert "all_reduce_on_calc_stream" not in vars(gloo)


@pytest.fixture
def user_modules():
    """Registers modules as a user's code would have them in sys.modules; removed afterwards."""
    added = []

    def add(name: str, **names) -> types.ModuleType:
        module = types.ModuleType(name)
        vars(module).update(names)
        sys.modules[name] = module
        added.append(name)
        return module

    yield add
    for name in added:
        sys.modules.pop(name, None)


def test_a_name_imported_before_enable_reaches_the_plugin_and_gets_paddles_back(user_modules):
    """`from paddle.nn.functional.flash_attention import flash_attn_unpadded` made before
    enable(): the module's name is rebound to the plugin's function and back by disable();
    a module that took the plugin's function while enabled gets Paddle's back too;
    paddle_ext's own modules keep what they hold."""
    module = flash_attention.owner()
    paddles = module.flash_attn_unpadded
    early = user_modules("user_script_imported_early", flash_attn_unpadded=paddles, other=paddles)
    own = user_modules("paddle_ext._test_own_module", flash_attn_unpadded=paddles)

    paddle_ext.enable()
    plugins = module.flash_attn_unpadded
    assert plugins is not paddles
    assert early.flash_attn_unpadded is plugins and early.other is plugins
    assert own.flash_attn_unpadded is paddles
    late = user_modules("user_script_imported_while_enabled", unpadded=plugins)

    rng = np.random.default_rng(0)
    q, k, v = (paddle.to_tensor(rng.standard_normal([6, 2, 8]).astype("float32")) for _ in range(3))
    cu = paddle.to_tensor(np.array([0, 2, 6], np.int32))
    args = (q, k, v, cu, cu, 4, 4, 8 ** -0.5)
    got = early.flash_attn_unpadded(*args)[0].numpy()
    want = paddle_ext.ops.flash_attn_unpadded(*args)[0].numpy()
    np.testing.assert_array_equal(got, want)
    if compat.device_build() == "cpu":  # what the caller had before: no CPU kernel
        with pytest.raises(RuntimeError, match="not registered"):
            paddles(*args)

    paddle_ext.disable()
    assert module.flash_attn_unpadded is paddles
    assert early.flash_attn_unpadded is paddles and early.other is paddles
    assert late.unpadded is paddles


# Units that serve optional packages: skipped (with the reason) where none is installed.
OPTIONAL_PACKAGES = {"paddleformers_overlap": ("paddleformers", "paddlenlp")}
# Units for a part of Paddle some releases lack: skipped (with the reason) there.
RELEASE_PARTS = {"host_checkpoint": "flex_checkpoint"}
# Units whose change Paddle ships from a release on: reported native there, not applied.
NATIVE_FROM = {"shared_comm_sep": (3, 1, 0)}


def test_every_unit_applies_on_this_paddle():
    import importlib.util

    paddle_ext.enable()
    for unit, status in statuses().items():
        packages = OPTIONAL_PACKAGES.get(unit)
        if packages is not None and all(importlib.util.find_spec(p) is None for p in packages):
            assert status.startswith("skipped (") and "not installed" in status, (unit, status)
        elif unit in RELEASE_PARTS and importlib.util.find_spec(f"paddle.distributed.{RELEASE_PARTS[unit]}") is None:
            assert status.startswith("skipped (") and RELEASE_PARTS[unit] in status, (unit, status)
        elif unit in NATIVE_FROM and compat.paddle_version() >= NATIVE_FROM[unit]:
            assert status.startswith("native upstream (Paddle ") and "ships it" in status, (unit, status)
        else:
            assert status == "applied", (unit, status)


def test_a_unit_switched_off_by_config_is_reverted_and_reported():
    mp_ops = compat.mp_ops_module()
    original = mp_ops._c_lookup_table
    paddle_ext.enable()
    assert mp_ops._c_lookup_table is not original
    paddle_ext.enable({"paddle_ext": {"patches": {"c_embedding_check": False}}})
    assert mp_ops._c_lookup_table is original
    assert statuses()["c_embedding_check"] == "disabled by config"
    assert statuses()["gloo_calc_stream"] == "applied"
    paddle_ext.enable()
    assert mp_ops._c_lookup_table is not original


def test_environment_switches_units(monkeypatch):
    monkeypatch.setenv("PADDLE_EXT_PATCHES", "gloo_calc_stream=off")
    paddle_ext.enable()
    assert statuses()["gloo_calc_stream"] == "disabled by config"
    assert "all_reduce_on_calc_stream" not in vars(compat.gloo_process_group_class())


@pytest.mark.parametrize(
    "config, error, pattern",
    [
        ({"paddle_ext": {"patches": {"no_such_unit": True}}}, ValueError, "unknown patch unit 'no_such_unit'"),
        ({"paddle_ext": {"patches": {"c_embedding_check": "yes"}}}, TypeError, "must be True or False"),
        ({"paddle_ext": {"pipeline": {}}}, ValueError, r"unknown paddle_ext config keys \['pipeline'\]"),
        ("c_embedding_check", TypeError, "config must be a mapping"),
    ],
)
def test_bad_config_raises_clearly(config, error, pattern):
    with pytest.raises(error, match=pattern):
        paddle_ext.enable(config)


def test_bad_environment_raises_clearly(monkeypatch):
    monkeypatch.setenv("PADDLE_EXT_PATCHES", "c_embedding_check")
    with pytest.raises(ValueError, match="expected NAME=on|off"):
        paddle_ext.enable()


def test_checked_lookup_used_by_fleet_raises_on_bad_ids():
    import numpy as np

    paddle_ext.enable()
    table = paddle.to_tensor(np.ones((4, 2), dtype="float32"))
    ids = paddle.to_tensor(np.array([1, 12], dtype="int64"))
    with pytest.raises(IndexError, match=r"ids\[1\] = 12 is out of range"):
        compat.mp_ops_module()._c_lookup_table(table, ids, start_index=0, vocab_size=8)


def test_cli_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "paddle_ext", "patches"], capture_output=True,
                         text=True, check=True, env={**os.environ, "PADDLE_EXT_PATCHES": ""}).stdout
    lines = [line for line in out.splitlines() if line.startswith(("gloo_calc_stream", "c_embedding_check"))]
    assert len(lines) == 2
    assert "#55621" in lines[1] and "applied" in lines[1]
    assert "#46761" in lines[0] and "applied" in lines[0]


def test_doctor_reports_versions_backends_and_patches():
    out = subprocess.run([sys.executable, "-m", "paddle_ext", "doctor"], capture_output=True,
                         text=True, check=True).stdout
    assert f"Paddle {paddle.__version__} (cpu build" in out
    assert "runtime paddle_ext._C: " in out and "backends cpu" in out
    assert f"op library: built against Paddle {paddle.__version__}, kernels CPU, ops pe_c_embedding" in out
    assert "c_embedding_check" in out
    assert "Paddle's MKL code path: " in out and "GFLOP/s on this path" in out
    assert "dependencies: ok" in out  # the install's pins hold (paddle_ext._requirements)
    assert "\nzlib: ok; libz.so.1 at " in out  # paddle_ext.zlib_binding


def test_requirements_pin_what_each_release_breaks_with():
    """The pins setup.py installs and the doctor checks: protobuf below 5 and numpy below 2
    for 2.6; protobuf below 7 for 3.0-3.2 (their DistributedStrategy reads
    FieldDescriptor.label); nothing for 3.3."""
    from paddle_ext import _requirements as req

    assert req.install_requirements("2.6.2") == ["protobuf>=3.20,<5", "numpy<2"]
    for version in ("3.0.0", "3.1.1", "3.2.2"):
        assert req.install_requirements(version) == ["protobuf>=3.20,<7"]
    assert req.install_requirements("3.3.1") == []
    assert req.unmet("3.3.1", {"protobuf": "7.36.2", "numpy": "2.4.6"}) == []
    assert req.unmet("3.0.0", {"protobuf": "6.33.6", "numpy": "2.4.6"}) == []
    (message,) = req.unmet("3.0.0", {"protobuf": "7.36.2"})
    assert message.startswith("protobuf 7.36.2 with Paddle 3.0.0: DistributedStrategy reads FieldDescriptor.label")
    assert message.endswith('pip install "protobuf<7"')
    assert len(req.unmet("2.6.2", {"protobuf": "5.29.0", "numpy": "2.0.0"})) == 2


def test_both_refused_joins_the_plugins_error_class_and_paddles():
    from paddle_ext.ops._checks import InvalidArgumentError, UnsupportedDtypeError
    from paddle_ext.patches._unit import both_refused

    refusal = UnsupportedDtypeError("query must have dtype in ('float32',), got float64")
    joint = both_refused(refusal, ValueError("(InvalidArgument) heads differ\n  [Hint: ...]"))
    assert isinstance(joint, UnsupportedDtypeError) and isinstance(joint, ValueError)
    assert type(joint).__name__ == "UnsupportedDtypeError"
    assert str(joint) == ("query must have dtype in ('float32',), got float64\n(Paddle's own function refuses "
                          "the call too: ValueError: (InvalidArgument) heads differ)")
    assert type(both_refused(refusal, KeyError("k"))) is type(both_refused(refusal, KeyError("j")))  # one class
    # already of Paddle's class: the plugin's error as it is
    bad = InvalidArgumentError("head_dim must be > 0, got 0")
    assert both_refused(bad, ValueError("other")) is bad
    # a class that cannot be built from a message: Paddle's own error
    undecodable = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert both_refused(bad, undecodable) is undecodable
