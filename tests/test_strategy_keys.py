"""pp_configs keys of Paddle 3.3 work on every release; unknown ones are ignored with a
warning and values are taken as Paddle's protobuf takes them."""

import re

import numpy as np
import paddle.distributed.fleet as fleet
import pytest

import paddle_ext
from paddle_ext import compat
from paddle_ext.config import PP_CONFIG_DEFAULTS, pp_config
from paddle_ext.pipeline.engine import PipelineSettings


@pytest.fixture(autouse=True)
def enabled():
    paddle_ext.enable()
    yield
    paddle_ext.disable()


def strategy_with(pp_configs, **pipeline):
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2, "pp_configs": pp_configs}
    strategy.pipeline_configs = {"accumulate_steps": 5, "micro_batch_size": 2, **pipeline}
    return strategy


def test_every_3x_key_is_accepted_and_read_back():
    keys = {"delay_scale_loss": True, "overlap_p2p_comm": True, "forward_backward_overlap_scheduler": True,
            "use_batch_p2p_comm": False, "release_gradients": True}
    user_dict = {"pp_configs": dict(keys)}
    strategy = strategy_with(user_dict["pp_configs"])
    for key, value in keys.items():
        assert pp_config(strategy, key) == value, key
    assert pp_config(strategy, "dp_comm_overlap") is False
    assert user_dict == {"pp_configs": keys}  # the user's dict is not modified
    settings = PipelineSettings.from_strategy(strategy)
    assert (settings.accumulate_steps, settings.micro_batch_size, settings.delay_scale_loss) == (5, 2, True)


def test_defaults_match_paddle_3_3():
    strategy = strategy_with({})
    for key, default in PP_CONFIG_DEFAULTS.items():
        assert pp_config(strategy, key) == default, key


def test_unknown_key_is_ignored_as_paddle_ignores_it_with_a_warning_naming_it():
    """Paddle 3.x's assign_configs_value skips a key its protobuf lacks, silently: the plugin
    takes the same strategy (never refuses what Paddle accepts) and says what it ignored."""
    with pytest.warns(UserWarning, match=r"pp_configs'\] keys \['overlap_p2p'\] are not keys of this Paddle's "
                      r"pp_configs nor paddle_ext's: ignored") as caught:
        strategy = strategy_with({"overlap_p2p": True, "delay_scale_loss": True})
    assert "paddle_ext" not in caught[0].filename  # points at the caller, not the plugin
    assert pp_config(strategy, "delay_scale_loss") is True and pp_config(strategy, "overlap_p2p_comm") is False


def test_a_pipeline_parallel_config_string_takes_its_words_and_ignores_unknown_ones_with_a_warning():
    """A str is the plugin's reading (PaddleNLP words); Paddle ignores a str there, so an
    unknown word is ignored too (a warning naming it), never refused."""
    with pytest.warns(UserWarning, match=r"words \['enable_overlap'\] are not PaddleNLP pipeline_parallel_config "
                      r"words: ignored") as caught:
        strategy = strategy_with("enable_delay_scale_loss enable_overlap")
    assert "paddle_ext" not in caught[0].filename
    assert pp_config(strategy, "delay_scale_loss") is True and pp_config(strategy, "overlap_p2p_comm") is False
    paddle_ext.disable()
    try:  # stock Paddle takes the same string (and changes nothing)
        stock = strategy_with("enable_delay_scale_loss enable_overlap")
        assert stock.hybrid_configs["pp_configs"].delay_scale_loss is False
    finally:
        paddle_ext.enable()


@pytest.mark.parametrize("value", [1, 0, np.int64(1), np.bool_(False), np.bool_(True), True])
def test_a_bool_key_takes_what_paddles_protobuf_takes(value):
    for key in ("delay_scale_loss", "release_gradients"):  # release_gradients: beside the strategy on 2.6
        assert pp_config(strategy_with({key: value}), key) is bool(value), key
    paddle_ext.disable()
    try:  # stock Paddle, where its protobuf has the key
        stock = fleet.DistributedStrategy()
        stock.hybrid_configs = {"pp_configs": {"delay_scale_loss": value}}
        assert stock.hybrid_configs["pp_configs"].delay_scale_loss is bool(value)
    finally:
        paddle_ext.enable()


def test_a_str_key_takes_what_paddles_protobuf_takes():
    """sync_mode: a str, or UTF-8 bytes (stored as their str); bytes that are not UTF-8 are the
    protobuf's ValueError, anything else its TypeError, each naming the key."""
    assert pp_config(strategy_with({"sync_mode": b"average"}), "sync_mode") == "average"
    with pytest.raises(ValueError, match=r"\['sync_mode'\] must be a str, got b'\\xff'"):
        strategy_with({"sync_mode": b"\xff"})
    with pytest.raises(TypeError, match=r"\['sync_mode'\] must be a str, got 1"):
        strategy_with({"sync_mode": 1})
    paddle_ext.disable()
    try:
        stock = fleet.DistributedStrategy()
        if not hasattr(stock.strategy.hybrid_configs.pp_configs, "sync_mode"):
            return  # 2.6: the plugin keeps the key beside the strategy
        stock.hybrid_configs = {"pp_configs": {"sync_mode": b"average"}}
        assert stock.hybrid_configs["pp_configs"].sync_mode == "average"
        for bad, error in ((b"\xff", ValueError), (1, TypeError)):
            with pytest.raises(error):
                fleet.DistributedStrategy().hybrid_configs = {"pp_configs": {"sync_mode": bad}}
    finally:
        paddle_ext.enable()


@pytest.mark.parametrize("value", ["yes", 1.0, None, [1]])
def test_a_value_paddles_protobuf_refuses_raises_its_type_error(value):
    with pytest.raises(TypeError, match=rf"\['delay_scale_loss'\] must be True or False \(or an integer, as "
                       rf"Paddle's protobuf takes it\), got {re.escape(repr(value))}"):
        strategy_with({"delay_scale_loss": value})
    paddle_ext.disable()
    try:
        with pytest.raises(TypeError):
            fleet.DistributedStrategy().hybrid_configs = {"pp_configs": {"delay_scale_loss": value}}
    finally:
        paddle_ext.enable()


def test_dualpipev_selects_the_v_schedule_and_names_conflicts():
    from paddle_ext.pipeline.engine import check_schedule_kind

    settings = PipelineSettings.from_strategy(strategy_with({"use_dualpipev": True}))
    assert (settings.kind, settings.dualpipev) == ("dualpipev", True)
    assert PipelineSettings.from_strategy(strategy_with({"schedule_mode": "ZBV"})).kind == "zb-v"
    with pytest.raises(ValueError, match=r"use_dualpipev = True and pp_configs.schedule_mode = 'ZBH1' cannot be "
                       "combined"):
        PipelineSettings.from_strategy(strategy_with({"use_dualpipev": True, "schedule_mode": "ZBH1"}))
    # the V kinds need a V-segmented PipelineLayer, and such a layer a V kind
    with pytest.raises(ValueError, match="runs on the V placement: build the PipelineLayer with use_dualpipev=True"):
        check_schedule_kind(settings, vpp=2, placement="interleaved")
    with pytest.raises(ValueError, match="schedule_mode = 'ZBH1' needs the interleaved placement"):
        check_schedule_kind(PipelineSettings(4, 1, kind="zb-h1"), vpp=2, placement="v")
    check_schedule_kind(settings, vpp=2, placement="v")


def test_dynamic_shape_from_either_key():
    """Shapes that change between steps: pp_configs.enable_dynamic_shape (Paddle 3.x's key)
    or pipeline_configs.p2p_cache_shape = False; neither: the first step's shapes hold."""
    assert not PipelineSettings.from_strategy(strategy_with({})).dynamic_shape
    assert PipelineSettings.from_strategy(strategy_with({"enable_dynamic_shape": True})).dynamic_shape
    assert PipelineSettings.from_strategy(strategy_with({}, p2p_cache_shape=False)).dynamic_shape
    assert not PipelineSettings.from_strategy(strategy_with({}, p2p_cache_shape=True)).dynamic_shape


def test_disable_restores_paddle_behaviour():
    cls = fleet.DistributedStrategy
    patched = vars(cls)["hybrid_configs"]
    paddle_ext.disable()
    assert vars(cls)["hybrid_configs"] is not patched


def test_schedule_mode_selects_the_zero_bubble_kinds_on_every_release():
    from paddle_ext.config import SCHEDULE_MODES

    for mode, kind in SCHEDULE_MODES.items():
        assert PipelineSettings.from_strategy(strategy_with({"schedule_mode": mode})).kind == kind
    settings = PipelineSettings.from_strategy(strategy_with({"schedule_mode": "ZBH1", "zb_max_pending_w": 2}))
    assert settings.kind == "zb-h1-w2"
    assert pp_config(strategy_with({}), "schedule_mode") == ""


def test_bad_schedule_mode_and_cap_are_refused_naming_key_value_and_range():
    with pytest.raises(ValueError, match=r"\['schedule_mode'\] = 'zbh1' is not supported; allowed: "
                                         r"\['', '1F1B', 'VPP', 'ZBH1', 'ZBV', 'ZBVPP'\]"):
        strategy_with({"schedule_mode": "zbh1"})
    with pytest.raises(ValueError, match=r"\['zb_max_pending_w'\] = -1 is not allowed: must be an integer >= 0"):
        strategy_with({"schedule_mode": "ZBH1", "zb_max_pending_w": -1})
    with pytest.raises(ValueError, match="zb_max_pending_w = 2 needs a zero-bubble pp_configs.schedule_mode"):
        PipelineSettings.from_strategy(strategy_with({"schedule_mode": "VPP", "zb_max_pending_w": 2}))


def test_zero_bubble_with_the_overlap_scheduler_or_the_wrong_vpp_is_refused():
    from paddle_ext.pipeline.engine import check_schedule_kind

    fb = PipelineSettings.from_strategy(strategy_with({"schedule_mode": "ZBVPP",
                                                       "forward_backward_overlap_scheduler": True}))
    with pytest.raises(ValueError, match=r"schedule_mode = 'ZBVPP' and pp_configs.forward_backward_overlap_scheduler"):
        check_schedule_kind(fb, vpp=2)
    zb = PipelineSettings.from_strategy(strategy_with({"schedule_mode": "ZBH1", "overlap_p2p_comm": True}))
    check_schedule_kind(zb, vpp=1)  # overlap_p2p_comm works with it
    with pytest.raises(ValueError, match="schedule_mode = 'ZBH1' needs one virtual stage; this model has 2 .*'ZBVPP'"):
        check_schedule_kind(zb, vpp=2)


@pytest.mark.parametrize("pp_configs, expected", [({}, None), ({"delay_scale_loss": True}, None),
                                                  ({"overlap_p2p_comm": False}, False),
                                                  ({"overlap_p2p_comm": True}, True),
                                                  ("enable_overlap_p2p_comm", True)])
def test_overlap_p2p_comm_left_unset_is_told_apart_from_false(pp_configs, expected):
    # None: the engine picks per backend (runtime/transport.py); a value given either way is kept
    assert PipelineSettings.from_strategy(strategy_with(pp_configs)).overlap_p2p is expected


def test_unset_overlap_p2p_comm_is_threads_on_gloo_and_off_elsewhere():
    from paddle_ext.pipeline.runtime.transport import default_overlap_p2p

    class ProcessGroupGloo:
        pass

    class ProcessGroupNCCL:
        pass

    class Group:
        def __init__(self, pg):
            self.process_group = pg

    assert default_overlap_p2p({1: Group(ProcessGroupGloo())}) is True
    assert default_overlap_p2p({0: Group(ProcessGroupGloo()), 2: Group(ProcessGroupGloo())}) is True
    assert default_overlap_p2p({1: Group(ProcessGroupNCCL())}) is False
    assert default_overlap_p2p({0: Group(ProcessGroupGloo()), 2: Group(ProcessGroupNCCL())}) is False


def test_unset_overlap_p2p_comm_keeps_the_v_placement_on_the_compute_thread():
    from paddle_ext.pipeline.runtime.transport import default_overlap_p2p

    class ProcessGroupGloo:
        process_group = None

    group = ProcessGroupGloo()
    group.process_group = ProcessGroupGloo()
    assert default_overlap_p2p({1: group}, "interleaved") is True
    assert default_overlap_p2p({1: group}, "v") is False


def test_plugin_keys_for_the_process_through_enable_and_the_environment(monkeypatch):
    """A trainer that builds its strategy itself (PaddleFormers) gets the plugin's keys from
    enable()'s config or PADDLE_EXT_PP_CONFIGS (the environment wins); a key the strategy
    sets wins over both; Paddle's own keys and bad values are refused naming them."""
    from paddle_ext.config import ENV_PP_CONFIGS

    monkeypatch.delenv(ENV_PP_CONFIGS, raising=False)
    paddle_ext.enable({"paddle_ext": {"pp_configs": {"schedule_mode": "ZBH1", "count_shared_weights_once": True}}})
    plain = strategy_with({})
    assert PipelineSettings.from_strategy(plain).kind == "zb-h1"
    assert PipelineSettings.from_strategy(plain).count_shared_weights_once is True
    assert PipelineSettings.from_strategy(strategy_with({"schedule_mode": "1F1B"})).kind == "1f1b"
    assert PipelineSettings.from_strategy(plain).grad_sync.early_comm_buffers is False
    monkeypatch.setenv(ENV_PP_CONFIGS, "zb_max_pending_w=2, count_shared_weights_once=off, early_comm_buffers=on")
    paddle_ext.enable({"paddle_ext": {"pp_configs": {"schedule_mode": "ZBH1", "count_shared_weights_once": True}}})
    settings = PipelineSettings.from_strategy(strategy_with({}))
    assert (settings.kind, settings.count_shared_weights_once) == ("zb-h1-w2", False)
    assert settings.grad_sync.early_comm_buffers is True
    monkeypatch.delenv(ENV_PP_CONFIGS)
    paddle_ext.enable()  # no section: back to the defaults
    assert PipelineSettings.from_strategy(strategy_with({})).kind is None
    with pytest.raises(ValueError, match=r"paddle_ext.pp_configs keys \['dp_comm_overlap'\] are not the plugin's"):
        paddle_ext.enable({"paddle_ext": {"pp_configs": {"dp_comm_overlap": True}}})
    with pytest.raises(ValueError, match=r"paddle_ext.pp_configs\['schedule_mode'\] = 'ZB' is not supported"):
        paddle_ext.enable({"paddle_ext": {"pp_configs": {"schedule_mode": "ZB"}}})
    with pytest.raises(TypeError, match=r"\['count_shared_weights_once'\] must be True or False, got 1"):
        paddle_ext.enable({"paddle_ext": {"pp_configs": {"count_shared_weights_once": 1}}})
    with pytest.raises(TypeError, match=r"\['early_comm_buffers'\] must be True or False, got 'yes'"):
        paddle_ext.enable({"paddle_ext": {"pp_configs": {"early_comm_buffers": "yes"}}})
    monkeypatch.setenv(ENV_PP_CONFIGS, "zb_max_pending_w=two")
    with pytest.raises(ValueError, match=r"PADDLE_EXT_PP_CONFIGS: zb_max_pending_w = 'two' is not an integer"):
        paddle_ext.enable()
    monkeypatch.setenv(ENV_PP_CONFIGS, "delay_scale_loss=on")
    with pytest.raises(ValueError, match=r"expected KEY=VALUE items with KEY one of"):
        paddle_ext.enable()


def _non_default(key):
    default = PP_CONFIG_DEFAULTS[key]
    return (not default) if isinstance(default, bool) else "average"


def test_3x_keys_as_attributes_of_pp_configs_read_back_and_reach_the_engine_as_the_dict_form():
    """3.x code sets pp_configs keys on strategy.hybrid_configs["pp_configs"] (the strategy's
    protobuf message on 3.3.1, where that sticks). Every key, set that way, reads back through
    a fresh getter, reaches pp_config() as the dict form's value does, and survives the deep
    copy fleet.init makes (fleet.py: self._user_defined_strategy = copy.deepcopy(strategy));
    an unset key reads its default."""
    import copy

    from paddle_ext.config import pp_config_is_set

    for key, default in PP_CONFIG_DEFAULTS.items():
        strategy = strategy_with({})
        assert getattr(strategy.hybrid_configs["pp_configs"], key) == default, key
        assert not pp_config_is_set(strategy, key)
        value = _non_default(key)
        setattr(strategy.hybrid_configs["pp_configs"], key, value)
        dict_form = strategy_with({key: value})
        for s in (strategy, copy.deepcopy(strategy)):
            assert getattr(s.hybrid_configs["pp_configs"], key) == value, key
            assert pp_config(s, key) == pp_config(dict_form, key) == value, key
            assert pp_config_is_set(s, key) and pp_config_is_set(dict_form, key), key
            for other in PP_CONFIG_DEFAULTS.keys() - {key}:
                assert pp_config(s, other) == pp_config(dict_form, other) == PP_CONFIG_DEFAULTS[other], (key, other)
    attributes = strategy_with({})
    for key in ("delay_scale_loss", "release_gradients", "use_batch_p2p_comm", "overlap_p2p_comm"):
        setattr(attributes.hybrid_configs["pp_configs"], key, _non_default(key))
    dict_form = strategy_with({k: _non_default(k) for k in ("delay_scale_loss", "release_gradients",
                                                            "use_batch_p2p_comm", "overlap_p2p_comm")})
    assert PipelineSettings.from_strategy(attributes) == PipelineSettings.from_strategy(dict_form)


def test_3x_keys_as_attributes_reach_fleets_copy_of_the_strategy_through_fleet_init():
    """fleet.init itself (one process, no pipeline): the strategy it keeps is its deep copy."""
    from paddle_ext import upstream

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1}
    for key in PP_CONFIG_DEFAULTS:
        setattr(strategy.hybrid_configs["pp_configs"], key, _non_default(key))
    fleet.init(is_collective=True, strategy=strategy)
    kept = upstream.fleet_strategy()
    assert kept is not strategy
    for key in PP_CONFIG_DEFAULTS:
        assert pp_config(kept, key) == getattr(kept.hybrid_configs["pp_configs"], key) == _non_default(key), key


def test_attributes_and_the_dict_form_write_the_same_place():
    """The dict form merges into what attributes set and the reverse, as Paddle's
    assign_configs_value merges into the message; a copy of the getter's view is detached,
    as a deep copy of the message is."""
    import copy

    strategy = strategy_with({"release_gradients": True})
    view = strategy.hybrid_configs["pp_configs"]
    assert view.release_gradients is True and view.HasField("release_gradients")
    view.clear_every_step_cache = 1  # the protobuf's bool takes 1
    strategy.hybrid_configs = {"pp_configs": {"use_dualpipev": True, "delay_scale_loss": True}}
    view = strategy.hybrid_configs["pp_configs"]
    assert (view.clear_every_step_cache, view.use_dualpipev, view.delay_scale_loss, view.release_gradients) == (
        True, True, True, True)
    detached = copy.deepcopy(strategy.hybrid_configs)["pp_configs"]
    detached.release_gradients = False
    detached.delay_scale_loss = False
    assert pp_config(strategy, "release_gradients") is True and pp_config(strategy, "delay_scale_loss") is True
    assert (detached.release_gradients, detached.delay_scale_loss, detached.use_dualpipev) == (False, False, True)
    view.ClearField("clear_every_step_cache")
    assert not view.HasField("clear_every_step_cache") and pp_config(strategy, "clear_every_step_cache") is False


@pytest.mark.parametrize("name", ["overlap_p2p", "schedule_mode", "accumulate_steps"])
def test_a_name_pp_configs_lacks_raises_attribute_error_as_the_protobuf_does(name):
    """Names that are no pp_configs key of Paddle 3.3 (the plugin's own keys included: they
    are no attribute of 3.3.1's message either; they go in the dict form) raise the protobuf's
    AttributeError, reading and writing."""
    view = strategy_with({}).hybrid_configs["pp_configs"]
    with pytest.raises(AttributeError, match=rf'PpConfig has no "{name}" field'):
        setattr(view, name, True)
    with pytest.raises(AttributeError, match=name):
        getattr(view, name)


def test_a_value_the_protobuf_refuses_as_an_attribute_raises_type_error():
    view = strategy_with({}).hybrid_configs["pp_configs"]
    for key in ("delay_scale_loss", "clear_every_step_cache"):  # clear_every_step_cache: beside the strategy on 2.6
        with pytest.raises(TypeError):
            setattr(view, key, "yes")
        assert getattr(view, key) is False


def test_stock_paddle_attribute_form():
    """The reference: stock 3.3.1 takes every 3.x key as an attribute of its message; stock
    2.6.2's message lacks the keys 3.0 added (AttributeError), which the plugin serves."""
    paddle_ext.disable()
    try:
        stock = fleet.DistributedStrategy()
        message = stock.hybrid_configs["pp_configs"]
        lacking = [k for k in PP_CONFIG_DEFAULTS if k not in message.DESCRIPTOR.fields_by_name]
        for key in PP_CONFIG_DEFAULTS:
            if key in lacking:
                with pytest.raises(AttributeError, match=rf'has no "{key}" field'):
                    setattr(stock.hybrid_configs["pp_configs"], key, _non_default(key))
            else:
                setattr(stock.hybrid_configs["pp_configs"], key, _non_default(key))
                assert getattr(stock.hybrid_configs["pp_configs"], key) == _non_default(key)
        # 3.3: none; 3.0: the keys 3.1 added (forward_backward_overlap_scheduler, ...); 2.6.2:
        # every key 3.0 added; the five 2.6 keys everywhere
        assert not set(lacking) & {"dp_comm_overlap", "delay_scale_loss", "enable_timer", "sharding_comm_overlap",
                                   "profiling"}, lacking
        assert lacking == [] or compat.paddle_version() < (3, 3, 0), lacking
    finally:
        paddle_ext.enable()
