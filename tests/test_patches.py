"""The patch series: enable/disable round trips, configuration, the table, the generic
verify (every swap a unit made still holds), and the upstream PR numbers agreeing across
patches/series, each UNIT.upstream, README.md's unit table and CHANGELOG.md."""

import importlib
import os
import re
import subprocess
import sys
import types

import numpy as np
import paddle
import pytest

import paddle_ext
from paddle_ext import compat, devices, upstream
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
    mp_ops = upstream.mp_ops_module()
    gloo = upstream.gloo_process_group_class()
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
    owners += [(upstream.collective_module(), "_new_process_group_impl")]
    owners += [(module, "distributed_model") for module in upstream.fleet_modules()]
    owners += [(upstream.parallel_env_class(), "device_id")]
    owners += [(upstream.distributed_strategy_class(), "hybrid_configs")]
    owners += [(owner, "fused_rotary_position_embedding") for owner in fused_rotary.owners()]
    owners += [(flash_attention.owner(), name) for name in flash_attention.NAMES]
    owners += [(upstream.pipeline_layer_class(), name) for name in ("get_schedule_chunk", "build_schedule_nodes")]
    if compat.paddle_before(*NATIVE_FROM["shared_comm_sep"]):
        owners += [(upstream.pipeline_layer_class(), "_construct_shared_comm")]
    base = upstream.process_group_classes()[0]
    owners += [(base, name) for name in ("all_reduce", "broadcast", "send", "recv", "barrier")]
    owners += [(upstream.parallel_module(), "_set_default_store")]
    owners += [(upstream.hybrid_communicate_group_class(), "__init__")]
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
        owners += [(upstream.hybrid_recompute_layer(), "backward")]
    if compat.paddle_before(3, 1):  # 2.6, 3.0: the unit adds them (3.1+ have Paddle's)
        owners += [(upstream.meta_parallel_module(), name) for name in ("ScheduleNode", "ScheduleChunk")]
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
    gloo = upstream.gloo_process_group_class()
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
    if devices.device_build() == "cpu":  # what the caller had before: no CPU kernel
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
NATIVE_FROM = {"shared_comm_sep": (3, 1)}


def test_every_unit_applies_on_this_paddle():
    import importlib.util

    paddle_ext.enable()
    for unit, status in statuses().items():
        packages = OPTIONAL_PACKAGES.get(unit)
        if packages is not None and all(importlib.util.find_spec(p) is None for p in packages):
            assert status.startswith("skipped (") and "not installed" in status, (unit, status)
        elif unit in RELEASE_PARTS and importlib.util.find_spec(f"paddle.distributed.{RELEASE_PARTS[unit]}") is None:
            assert status.startswith("skipped (") and RELEASE_PARTS[unit] in status, (unit, status)
        elif unit in NATIVE_FROM and not compat.paddle_before(*NATIVE_FROM[unit]):
            assert status.startswith("native upstream (Paddle ") and "ships it" in status, (unit, status)
        else:
            assert status == "applied", (unit, status)


def test_a_unit_switched_off_by_config_is_reverted_and_reported():
    mp_ops = upstream.mp_ops_module()
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
    assert "all_reduce_on_calc_stream" not in vars(upstream.gloo_process_group_class())


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
        upstream.mp_ops_module()._c_lookup_table(table, ids, start_index=0, vocab_size=8)


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
    from paddle_ext.ops.routes import both_refused

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


# ------------------------------------------------- verify: every swap still holds

def _put_back(owner, attr, original):
    """What a user's code (or another plugin) does that undoes one swap: the original
    object back on owner.attr."""
    from paddle_ext.patches._unit import MISSING

    if original is MISSING:
        delattr(owner, attr)
    else:
        setattr(owner, attr, original)


def test_verify_names_the_unit_and_the_attribute_of_each_swap_undone():
    """Every unit that applies here: each swap it recorded (and each module global an
    imported=True swap rebound) is undone alone, and verify() reports that unit and that
    attribute, and nothing else; put back, verify() is clean again."""
    from paddle_ext.patches._unit import describe

    paddle_ext.enable()
    s = series()
    assert s.verify() == []
    applied = [state for state in s.states if state.patcher is not None]
    assert {state.unit.name for state in applied} >= {"gloo_calc_stream", "pipeline_engine", "fused_rotary",
                                                      "flash_attention", "c_embedding_check"}
    for state in applied:
        assert state.patcher.swaps, state.unit.name
        for swap in list(state.patcher.swaps):
            breaks = [(swap.owner, swap.attr, describe(swap.owner, swap.attr))]
            breaks += [(module, name, f"{module.__name__}.{name} (bound where") for module, name in swap.bindings]
            for owner, attr, named in breaks:
                installed = vars(owner).get(attr)  # swap.new, or a later unit's wrapper of it
                _put_back(owner, attr, swap.original)
                try:
                    problems = s.verify()
                finally:
                    setattr(owner, attr, installed)
                # this unit names the attribute; a later unit that wrapped the same one (comm_debug
                # traces what gloo_calc_stream installed) may name it too, nothing else does
                assert any(p.startswith(f"unit {state.unit.name}: {named}") for p in problems), (named, problems)
                assert all(re.match(rf"unit \w+: {re.escape(named)}", p) for p in problems), (named, problems)
            assert s.verify() == []


def test_pipeline_engine_verifies_all_four_names_it_swaps():
    """pipeline_engine swaps fleet.distributed_model, fleet's model module's, the strategy's
    hybrid_configs property and ParallelEnv.device_id: each one undone is reported."""
    paddle_ext.enable()
    (state,) = [st for st in series().states if st.unit.name == "pipeline_engine"]
    fleet, fleet_model = upstream.fleet_modules()
    targets = [(upstream.distributed_strategy_class(), "hybrid_configs"), (fleet_model, "distributed_model"),
               (fleet, "distributed_model"), (upstream.parallel_env_class(), "device_id")]
    assert [(swap.owner, swap.attr) for swap in state.patcher.swaps] == targets
    for swap in state.patcher.swaps:
        _put_back(swap.owner, swap.attr, swap.original)
        try:
            (problem,) = series().verify()
        finally:
            setattr(swap.owner, swap.attr, swap.new)
        assert problem.startswith("unit pipeline_engine: ") and f".{swap.attr} is not the object" in problem


def test_the_engine_serves_fleet_only_while_pipeline_engine_is_applied():
    """What the Trainers' dp overlap (paddle_ext.trainer_overlap) asks before lifting its refusal."""
    from paddle_ext.pipeline.fleet_entry import engine_serves

    assert not engine_serves()
    paddle_ext.enable()
    assert engine_serves()
    paddle_ext.enable({"paddle_ext": {"patches": {"pipeline_engine": False}}})
    assert not engine_serves()


def test_a_unit_whose_swap_does_not_hold_after_apply_is_refused_and_reverted(monkeypatch):
    """Series.apply verifies each unit right after its apply(): a unit whose swap is
    undone at once (a property that refuses the assignment, say) raises naming the unit
    and the attribute, and leaves nothing behind."""
    from paddle_ext.patches import Series
    from paddle_ext.patches._unit import Patcher, PatchUnit

    class Owner:
        value = "original"

    class Config:
        @staticmethod
        def unit_enabled(name):
            return True

    def apply(patcher: Patcher) -> None:
        patcher.swap(Owner, "value", "installed")
        Owner.value = "someone else's"

    unit = PatchUnit(name="undone", upstream=(1001,), title="t", summary="s", apply=apply)
    with pytest.raises(RuntimeError, match=r"verify failed after apply\(\): unit undone: "
                                           r"tests\.test_patches\..*Owner\.value is not the object"):
        Series([unit]).apply(Config())
    assert vars(Owner)["value"] == "original"


def test_an_import_hook_gone_before_its_module_loads_is_reported():
    """The check a unit that patches modules on import adds beyond identity
    (paddleformers_overlap): its hook waits in sys.meta_path until the module loads."""
    from paddle_ext.patches._unit import Patcher, import_hook_problems, on_import

    patcher = Patcher()
    on_import(patcher, "paddle_ext_test_module_never_imported", lambda p, m: None)
    try:
        assert patcher.problems() == [] and import_hook_problems(patcher) == []
        (hook,) = [swap.owner for swap in patcher.swaps]
        sys.meta_path.remove(hook)
        assert import_hook_problems(patcher) == [
            "the import hook for paddle_ext_test_module_never_imported is not in sys.meta_path, and "
            "paddle_ext_test_module_never_imported is not loaded"]
    finally:
        patcher.revert()
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)


def test_unavailable_comes_from_the_declared_ops_and_modules(monkeypatch):
    from paddle_ext.ops import _library
    from paddle_ext.patches._unit import PatchUnit

    def unit(**fields):
        return PatchUnit(name="u", upstream=(1001,), title="t", summary="s", apply=lambda p: None, **fields)

    assert unit(requires_ops=("pe_rotary",), requires_modules=("paddle.nn",)).unavailable() is None
    reason = unit(requires_modules=("paddle.no_such_module",)).unavailable()
    assert reason.startswith("paddle.no_such_module cannot be imported here (No module named 'paddle.no_such_module'")
    assert unit(requires_ops=("pe_no_such_op",)).unavailable() == (
        "paddle_ext's op library lacks pe_no_such_op: reinstall paddle-ext")
    # the library's own loading, with its "built for this Paddle" check
    monkeypatch.setattr(_library, "load", lambda: (_ for _ in ()).throw(_library.OpLibraryError("built for 2.6.2")))
    assert unit(requires_ops=("pe_rotary",)).unavailable() == "built for 2.6.2"
    assert unit(requires=lambda: "a cuda build", requires_ops=("pe_rotary",)).unavailable() == "a cuda build"


def test_native_from_is_read_through_compat(monkeypatch):
    from paddle_ext.patches._unit import PatchUnit

    unit = PatchUnit(name="u", upstream=(1001,), title="t", summary="s", apply=lambda p: None, native_from=(3, 1))
    asked = []
    monkeypatch.setattr(compat, "paddle_before", lambda major, minor: asked.append((major, minor)) or True)
    assert not unit.native() and asked == [(3, 1)]
    monkeypatch.setattr(compat, "paddle_before", lambda major, minor: False)
    assert unit.native()


# ------------------------------------------------- the PR numbers, in one place each

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prs(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"#(\d+)", text)]


def _series_prs() -> dict[str, list[int]]:
    """unit -> the PRs of its patches/series line, in order (the authority)."""
    from paddle_ext.patches import SERIES_FILE

    found = {}
    with open(SERIES_FILE) as f:
        for line in f:
            name = line.split("#", 1)[0].strip()
            if name:
                found[name] = _prs(line)
    return found


def _readme_prs() -> dict[str, list[int]]:
    """unit -> the PRs of its row in README.md's unit table."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    table = text[text.index("| unit | upstream | what it does |"):].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:] if line.startswith("|")]
    return {name.strip(): _prs(upstream) for name, upstream in rows}


def _changelog_entries() -> list[str]:
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        return re.split(r"\n- ", f.read())[1:]


def test_series_and_each_units_upstream_agree():
    series_prs = _series_prs()
    assert list(series_prs) == read_series()
    for state in series().states:
        assert list(state.unit.upstream) == series_prs[state.unit.name], state.unit.name


def test_readme_unit_table_agrees_with_the_series():
    """One row per unit, in series order, with the series line's PRs. (Fails until the lead
    adds the rows of comm_debug and eager_connection: issue 40's report gives their text.)"""
    assert _readme_prs() == _series_prs()
    assert list(_readme_prs()) == list(_series_prs())


def test_changelog_entries_carry_each_units_prs():
    """Each PR of a unit's series line is in a CHANGELOG entry naming the unit, and the
    entry that introduces a unit ("cherry from: ... (#N) — unit `name`") names no PR the
    series line lacks."""
    entries = _changelog_entries()
    for name, prs in _series_prs().items():
        mentioning = [e for e in entries if re.search(rf"units?\s+`{name}`", e)]
        for pr in prs:
            assert any(f"#{pr}" in e for e in mentioning), f"CHANGELOG: no entry of unit {name} names #{pr}"
        introducing = [e for e in mentioning if re.search(rf"cherry[^`]*—\s+unit\s+`{name}`", e)]
        assert introducing, f"CHANGELOG: no entry introduces unit {name}"
        for entry in introducing:
            head = entry[:re.search(rf"—\s+unit\s+`{name}`", entry).start()]
            assert set(_prs(head)) <= set(prs), (name, head)
