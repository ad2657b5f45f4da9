"""The plugin's one typed configuration.

It is read from the same place as the rest of the training set-up: a mapping
shaped like the fleet strategy's config dicts, whose plugin part sits under
the key "paddle_ext", e.g.

    paddle_ext.enable({"paddle_ext": {"patches": {"c_embedding_check": False}}})

The environment variable PADDLE_EXT_PATCHES ("name=off,other=on") overrides
single units without touching code. Unknown keys and wrong types raise.

The section "pp_configs" gives the plugin's own pp_configs keys (PLUGIN_PP_CONFIG_DEFAULTS:
the schedule, its W cap, count_shared_weights_once, early_comm_buffers) for every strategy of the process, as
PADDLE_EXT_PP_CONFIGS ("schedule_mode=ZBH1,zb_max_pending_w=2") does, the environment
winning. It is how a trainer that builds its strategy itself (PaddleFormers' Trainer) gets
them; a key the strategy itself sets wins over both.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

SECTION = "paddle_ext"
# runtime: paddle_ext.runtime.config; comm: paddle_ext.comm.settings; pp_configs: configure_pp_configs
PLUGIN_KEYS = ("patches", "runtime", "comm", "pp_configs")
ENV_PATCHES = "PADDLE_EXT_PATCHES"
ENV_PP_CONFIGS = "PADDLE_EXT_PP_CONFIGS"
_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class PluginConfig:
    # unit name -> switched on; units not named keep their default (on)
    patches: Mapping[str, bool] = field(default_factory=dict)

    def unit_enabled(self, name: str) -> bool:
        return self.patches.get(name, True)


def plugin_section(source: Any) -> Mapping[str, Any]:
    """The plugin's part of a strategy-style mapping (checked, possibly empty)."""
    return _section(source)


def _section(source: Any) -> Mapping[str, Any]:
    if source is None:
        return {}
    if not isinstance(source, Mapping):
        raise TypeError(
            f"config must be a mapping (the strategy-style dict) or None, got {type(source).__name__}")
    if SECTION in source:
        section = source[SECTION]
        if not isinstance(section, Mapping):
            raise TypeError(f"config[{SECTION!r}] must be a mapping, got {type(section).__name__}")
        return section
    return source


def _parse_env(text: str, known_units: tuple[str, ...]) -> dict[str, bool]:
    switches: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        value = value.strip().lower()
        if not sep or value not in _TRUE | _FALSE:
            raise ValueError(f"{ENV_PATCHES}: expected NAME=on|off items, got {item!r}")
        switches[name.strip()] = value in _TRUE
    _check_units(switches, known_units, ENV_PATCHES)
    return switches


def _check_units(switches: Mapping[str, Any], known_units: tuple[str, ...], where: str) -> None:
    for name, on in switches.items():
        if name not in known_units:
            raise ValueError(f"{where}: unknown patch unit {name!r}; known units: {list(known_units)}")
        if not isinstance(on, bool):
            raise TypeError(f"{where}[{name!r}] must be True or False, got {on!r}")


def from_source(source: Any, known_units: tuple[str, ...]) -> PluginConfig:
    """Builds the config from a strategy-style mapping and the environment."""
    section = _section(source)
    unknown = [k for k in section if k not in PLUGIN_KEYS]
    if unknown:
        raise ValueError(f"unknown paddle_ext config keys {unknown}; allowed: {list(PLUGIN_KEYS)}")
    patches = dict(section.get("patches", {}))
    _check_units(patches, known_units, "paddle_ext.patches")
    patches.update(_parse_env(os.environ.get(ENV_PATCHES, ""), known_units))
    return PluginConfig(patches=patches)


# --- the pipeline's strategy keys ---------------------------------------------------

# Paddle 3.3's hybrid_configs["pp_configs"] keys (scalar ones) and their defaults. On
# releases whose protobuf lacks some of them (2.6 has the first five) the plugin keeps
# them beside the strategy, so the same training script runs on every release.
PP_CONFIG_DEFAULTS: dict[str, Any] = {
    "dp_comm_overlap": False,
    "delay_scale_loss": False,
    "enable_timer": False,
    "sharding_comm_overlap": False,
    "profiling": False,
    "release_gradients": False,
    "overlap_p2p_comm": False,
    "clear_every_step_cache": False,
    "best_unbalanced_scheduler": False,
    "enable_offload_queue": False,
    "use_batch_p2p_comm": True,
    "enable_dynamic_shape": False,
    "forward_backward_overlap_scheduler": False,
    "use_dualpipev": False,
    "sync_param": False,
    "sync_moment": False,
    "sync_mode": "broadcast",
}

# pp_configs keys of the plugin itself (no Paddle release has them; they live beside
# the strategy on every release, 2.6 included). schedule_mode takes the names of
# Paddle's static auto-parallel `strategy.pipeline.schedule_mode` ("1F1B", "VPP",
# "ZBH1", "ZBVPP"); "" leaves the engine's choice (1F1B, or VPP with virtual
# stages). Not fleet's pipeline_configs["schedule_mode"] ("1F1B" / "F-then-B" of the
# static fleet pipeline), which the dygraph engines ignore.
# zb_max_pending_w: with a zero-bubble schedule_mode, at most that many W's (weight
# gradients) wait per rank (0: the schedule's own, up to the rank's lag).
# count_shared_weights_once: a weight tied across stages (SharedLayerDesc: the embedding
# and the head) enters the global gradient norm of fleet's HybridParallelClipGrad once, from
# its first stage. Paddle counts it on every stage that holds it (PipelineLayer marks the
# copies `is_firstly_shared` only where a parameter's name equals the weight attribute's,
# which generated names never do), so pipelines clip harder than one process; off by
# default: with it the clipped gradients are no longer Paddle's.
# early_comm_buffers: under sharding_comm_overlap with split_param, the engine hands its
# sharding buckets (Paddle's FusedCommBuffers) to DygraphShardingOptimizerV2 when the optimizer
# is first shown to it (register_sharding_comm_overlap_hook), not at the optimizer's first
# step, and PaddleFormers' Trainer shows it the optimizer right after wrapping it for every
# checkpoint format (its own code does so for unified_checkpoint only). A FlexCheckpoint
# (PaddleFormers' default format) loaded before the first step then restores the optimizer's
# states, which V2 otherwise cannot name yet (resume silently restarts AdamW's moments; fleet
# the same by its code). Off by default: it changes what a resumed run computes.
PLUGIN_PP_CONFIG_DEFAULTS: dict[str, Any] = {
    "schedule_mode": "",
    "zb_max_pending_w": 0,
    "count_shared_weights_once": False,
    "early_comm_buffers": False,
}

# the plugin's pp_configs keys for every strategy of the process (configure_pp_configs)
_PROCESS_PP_CONFIGS: dict[str, Any] = {}

# schedule_mode -> the generator kind (paddle_ext.pipeline.schedule.generate), None:
# the engine's default. "1F1B" / "ZBH1" need one virtual stage; "VPP" / "ZBVPP" take
# any number (with one they are 1F1B / ZBH1).
SCHEDULE_MODES: dict[str, str | None] = {
    "": None,
    "1F1B": "1f1b",
    "VPP": "interleaved",
    "ZBH1": "zb-h1",
    "ZBVPP": "interleaved-zb",
    "ZBV": "zb-v",  # the V placement: a PipelineLayer built with use_dualpipev=True
}

# The attribute of a DistributedStrategy that holds the keys its protobuf lacks. An
# attribute (set past the strategy's attribute lock) because fleet.init deep-copies
# the strategy: a side table keyed by the object lost them on the way to the engine.
_EXTRA_ATTR = "_paddle_ext_pp_configs"


def _extra_pp_configs(strategy: Any) -> dict[str, Any]:
    extra = getattr(strategy, _EXTRA_ATTR, None)
    if extra is None:
        extra = {}
        object.__setattr__(strategy, _EXTRA_ATTR, extra)
    return extra


class PpConfigsView:
    """strategy.hybrid_configs["pp_configs"] where this Paddle's protobuf lacks some of
    Paddle 3.3's keys (2.6). Paddle's getter returns a fresh dict whose "pp_configs" is the
    strategy's live protobuf message; code written for 3.x sets keys on it as attributes
    (`strategy.hybrid_configs["pp_configs"].clear_every_step_cache = True`), which sticks on
    3.3.1 and raised AttributeError on 2.6.2. The view reads and writes those keys where the
    dict form keeps them (beside the strategy, so pp_config() sees them and fleet.init's
    deepcopy keeps them), checked as the dict form checks them, and hands everything else
    to the message: the message's own fields, its methods, and the AttributeError of a
    name it lacks (the plugin's own keys included, as on 3.3.1)."""

    __slots__ = ("_message", "_owner")

    def __init__(self, message: Any, owner: Any) -> None:
        object.__setattr__(self, "_message", message)
        object.__setattr__(self, "_owner", owner)  # the strategy: the dict form's keys live on it

    def _missing(self, name: str) -> bool:
        return name in PP_CONFIG_DEFAULTS and name not in self._message.DESCRIPTOR.fields_by_name

    def __getattr__(self, name: str) -> Any:
        if name in PpConfigsView.__slots__:  # not set yet (an unpickled or half-made copy)
            raise AttributeError(name)
        if self._missing(name):
            return (getattr(self._owner, _EXTRA_ATTR, None) or {}).get(name, PP_CONFIG_DEFAULTS[name])
        return getattr(self._message, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._missing(name):
            _extra_pp_configs(self._owner)[name] = _paddle_value(name, value)
        else:
            setattr(self._message, name, value)

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf's name)
        if self._missing(name):
            return name in (getattr(self._owner, _EXTRA_ATTR, None) or {})
        return self._message.HasField(name)

    def ClearField(self, name: str) -> None:  # noqa: N802
        if self._missing(name):
            (getattr(self._owner, _EXTRA_ATTR, None) or {}).pop(name, None)
        else:
            self._message.ClearField(name)

    def __deepcopy__(self, memo: dict) -> PpConfigsView:
        """A detached copy, as a deep copy of 3.3.1's message is."""
        import copy
        import types

        owner = types.SimpleNamespace()
        object.__setattr__(owner, _EXTRA_ATTR, dict(getattr(self._owner, _EXTRA_ATTR, None) or {}))
        return PpConfigsView(copy.deepcopy(self._message, memo), owner)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PpConfigsView):
            return self._message == other._message and self._values() == other._values()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (as the protobuf message's)

    def _values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in PP_CONFIG_DEFAULTS if self._missing(k)}

    def __repr__(self) -> str:
        kept = getattr(self._owner, _EXTRA_ATTR, None) or {}
        extra = "".join(f"{k}: {v!r}\n" for k, v in kept.items() if self._missing(k))
        return f"{self._message}{extra}"


def with_pp_configs_view(strategy: Any, configs: dict) -> dict:
    """Paddle's hybrid_configs getter's dict, its "pp_configs" message behind a
    PpConfigsView where the protobuf lacks some of PP_CONFIG_DEFAULTS' keys; as it is
    elsewhere (3.3: the message itself)."""
    message = configs.get("pp_configs")
    fields = getattr(getattr(message, "DESCRIPTOR", None), "fields_by_name", None)
    if fields is not None and not set(PP_CONFIG_DEFAULTS) <= set(fields):
        configs["pp_configs"] = PpConfigsView(message, strategy)
    return configs


# PaddleNLP's TrainingArguments.pipeline_parallel_config: words (space- or comma-
# separated) -> the pp_configs key each sets and the value it gives it. Words that
# configure pipeline_configs, not pp_configs, are accepted and have no pp_configs key.
PIPELINE_PARALLEL_CONFIG_WORDS: dict[str, tuple[str, Any] | None] = {
    "enable_delay_scale_loss": ("delay_scale_loss", True),
    "enable_dp_comm_overlap": ("dp_comm_overlap", True),
    "enable_sharding_comm_overlap": ("sharding_comm_overlap", True),
    "enable_timer": ("enable_timer", True),
    "enable_release_grads": ("release_gradients", True),
    "enable_overlap_p2p_comm": ("overlap_p2p_comm", True),
    "enable_clear_every_step_cache": ("clear_every_step_cache", True),
    "disable_batch_p2p_comm": ("use_batch_p2p_comm", False),
    "best_unbalanced_scheduler": ("best_unbalanced_scheduler", True),
    "enable_offload_queue": ("enable_offload_queue", True),
    "enable_dynamic_shape": ("enable_dynamic_shape", True),
    "use_dualpipev": ("use_dualpipev", True),
    "forward_backward_overlap_scheduler": ("forward_backward_overlap_scheduler", True),
    "disable_p2p_cache_shape": None,      # pipeline_configs.p2p_cache_shape
    "disable_partial_send_recv": None,    # pipeline_configs.enable_partial_send_recv
}


def parse_pipeline_parallel_config(text: str) -> dict[str, Any]:
    """pp_configs from a PaddleNLP-style pipeline_parallel_config string, e.g.
    "forward_backward_overlap_scheduler enable_overlap_p2p_comm" ->
    {"forward_backward_overlap_scheduler": True, "overlap_p2p_comm": True}.
    Words are separated by commas or spaces; an unknown word raises ValueError."""
    out, unknown = _pipeline_parallel_words(text)
    if unknown:
        raise ValueError(f"unknown pipeline_parallel_config words {unknown}; known: "
                         f"{sorted(PIPELINE_PARALLEL_CONFIG_WORDS)}")
    return out


def _pipeline_parallel_words(text: str) -> tuple[dict[str, Any], list[str]]:
    """(pp_configs of the known words, the unknown words) of a pipeline_parallel_config string."""
    if not isinstance(text, str):
        raise TypeError(f"pipeline_parallel_config must be a str, got {type(text).__name__}")
    words = [w.strip() for w in text.replace(",", " ").split()]
    out: dict[str, Any] = {}
    for w in words:
        target = PIPELINE_PARALLEL_CONFIG_WORDS.get(w)
        if target is not None:
            out[target[0]] = target[1]
    return out, [w for w in words if w not in PIPELINE_PARALLEL_CONFIG_WORDS]


def split_pp_configs(strategy: Any, pp_configs: Mapping[str, Any] | str,
                     native_keys: set[str]) -> dict[str, Any]:
    """Checks user pp_configs; keeps the keys this Paddle's protobuf lacks beside
    `strategy` and returns the ones it can store itself. A str is read as a PaddleNLP
    pipeline_parallel_config string (its unknown words ignored with a warning).

    As Paddle 3.x: a key no release and not the plugin knows is ignored (with a warning
    naming it), and a bool key takes what the protobuf takes (True / False, or an integer:
    1 is True), refusing the rest with a TypeError. The plugin's own keys are checked
    strictly (_check_plugin_pp_configs)."""
    if isinstance(pp_configs, str):
        # Paddle iterates a str's characters, none a key: it ignores the string. The
        # plugin reads its PaddleNLP words and, as Paddle, ignores the others (warning).
        pp_configs, unknown_words = _pipeline_parallel_words(pp_configs)
        if unknown_words:
            warnings.warn(f"hybrid_configs['pp_configs'] words {unknown_words} are not PaddleNLP "
                          f"pipeline_parallel_config words: ignored, as Paddle ignores a str there (known: "
                          f"{sorted(PIPELINE_PARALLEL_CONFIG_WORDS)})", UserWarning, stacklevel=4)
    if not isinstance(pp_configs, Mapping):
        raise TypeError(f"hybrid_configs['pp_configs'] must be a dict (or a pipeline_parallel_config "
                        f"string), got {type(pp_configs).__name__}")
    allowed = set(PP_CONFIG_DEFAULTS) | set(PLUGIN_PP_CONFIG_DEFAULTS) | native_keys
    unknown = sorted(k for k in pp_configs if k not in allowed)
    if unknown:
        warnings.warn(f"hybrid_configs['pp_configs'] keys {unknown} are not keys of this Paddle's pp_configs nor "
                      f"paddle_ext's: ignored, as Paddle ignores them (known: {sorted(allowed)})", UserWarning,
                      stacklevel=4)  # the user line (through the strategy's __setattr__)
    pp_configs = {k: _paddle_value(k, v) for k, v in pp_configs.items() if k not in unknown}
    _check_plugin_pp_configs(pp_configs, "hybrid_configs['pp_configs']")
    extra = {k: v for k, v in pp_configs.items() if k not in native_keys}
    if extra:
        _extra_pp_configs(strategy).update(extra)
    return {k: v for k, v in pp_configs.items() if k in native_keys}


def _paddle_value(key: str, value: Any) -> Any:
    """A value of Paddle's own pp_configs key as its protobuf stores it, or the error it
    raises (its type, the message naming the key). The protobuf runtime of this process
    decides, through a wrapper message of the same field type: what a bool field takes
    differs between runtimes and numpy releases (integers and numpy integers everywhere;
    numpy 2's np.bool_ has no __index__, which upb takes by name and the pure-Python
    runtime refuses); a str field also takes UTF-8 bytes. The plugin's keys pass."""
    from google.protobuf import wrappers_pb2

    default = PP_CONFIG_DEFAULTS.get(key)
    if isinstance(default, bool):
        wrapper, wanted = wrappers_pb2.BoolValue, "True or False (or an integer, as Paddle's protobuf takes it)"
    elif isinstance(default, str):
        wrapper, wanted = wrappers_pb2.StringValue, "a str"
    else:
        return value
    message = wrapper()
    try:
        message.value = value  # as Paddle's assign_configs_value sets it (a None in the constructor is unset)
        return message.value
    except (TypeError, ValueError) as err:
        raise (ValueError if isinstance(err, ValueError) else TypeError)(f"hybrid_configs['pp_configs'][{key!r}] must be {wanted}, got {value!r}") from None


def _check_plugin_pp_configs(values: Mapping[str, Any], where: str) -> None:
    """The plugin's own pp_configs keys among `values`, checked (`where` names the mapping)."""
    if "schedule_mode" in values:
        check_schedule_mode(values["schedule_mode"], where)
    cap = values.get("zb_max_pending_w", 0)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        raise ValueError(f"{where}['zb_max_pending_w'] = {cap!r} is not allowed: must be an integer >= 0 "
                         "(0: no cap)")
    for key, default in PLUGIN_PP_CONFIG_DEFAULTS.items():
        if isinstance(default, bool) and not isinstance(values.get(key, default), bool):
            raise TypeError(f"{where}[{key!r}] must be True or False, got {values[key]!r}")


def _parse_pp_env(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or name not in PLUGIN_PP_CONFIG_DEFAULTS:
            raise ValueError(f"{ENV_PP_CONFIGS}: expected KEY=VALUE items with KEY one of "
                             f"{sorted(PLUGIN_PP_CONFIG_DEFAULTS)}, got {item!r}")
        default = PLUGIN_PP_CONFIG_DEFAULTS[name]
        if isinstance(default, bool):
            if value.lower() not in _TRUE | _FALSE:
                raise ValueError(f"{ENV_PP_CONFIGS}: {name} = {value!r} is not allowed: on or off")
            values[name] = value.lower() in _TRUE
        elif isinstance(default, int):
            try:
                values[name] = int(value)
            except ValueError:
                raise ValueError(f"{ENV_PP_CONFIGS}: {name} = {value!r} is not an integer") from None
        else:
            values[name] = value
    _check_plugin_pp_configs(values, ENV_PP_CONFIGS)
    return values


def configure_pp_configs(source: Any = None) -> dict[str, Any]:
    """Sets the plugin's pp_configs keys for every strategy of this process from the
    config's "pp_configs" section, then PADDLE_EXT_PP_CONFIGS (see the module docstring);
    returns them. Paddle's own pp_configs keys are refused there: they belong to the
    strategy, which every trainer writes."""
    section = _section(source).get("pp_configs", {})
    if not isinstance(section, Mapping):
        raise TypeError(f"config[{SECTION!r}]['pp_configs'] must be a mapping, got {type(section).__name__}")
    foreign = sorted(k for k in section if k not in PLUGIN_PP_CONFIG_DEFAULTS)
    if foreign:
        raise ValueError(f"paddle_ext.pp_configs keys {foreign} are not the plugin's: it takes "
                         f"{sorted(PLUGIN_PP_CONFIG_DEFAULTS)}; Paddle's keys go into the strategy's "
                         "hybrid_configs['pp_configs']")
    _check_plugin_pp_configs(section, "paddle_ext.pp_configs")
    values = {**section, **_parse_pp_env(os.environ.get(ENV_PP_CONFIGS, ""))}
    _PROCESS_PP_CONFIGS.clear()
    _PROCESS_PP_CONFIGS.update(values)
    return dict(values)


def pp_config(strategy: Any, key: str) -> Any:
    """A pp_configs value from wherever this Paddle release keeps it (the plugin's own
    keys: the strategy's, else the process's, else the default)."""
    extra = getattr(strategy, _EXTRA_ATTR, None) or {}
    if key in extra:
        return extra[key]
    message = strategy.hybrid_configs["pp_configs"]
    if key in {f.name for f in message.DESCRIPTOR.fields}:
        return getattr(message, key)
    if key in PLUGIN_PP_CONFIG_DEFAULTS:
        return _PROCESS_PP_CONFIGS.get(key, PLUGIN_PP_CONFIG_DEFAULTS[key])
    return PP_CONFIG_DEFAULTS[key]


def pp_config_is_set(strategy: Any, key: str) -> bool:
    """Whether the user gave pp_configs[key] (on any release), as opposed to its default:
    for keys whose default the engine chooses per backend (overlap_p2p_comm)."""
    extra = getattr(strategy, _EXTRA_ATTR, None) or {}
    if key in extra:
        return True
    message = strategy.hybrid_configs["pp_configs"]
    return key in {f.name for f in message.DESCRIPTOR.fields} and message.HasField(key)


def check_schedule_mode(value: Any, where: str = "hybrid_configs['pp_configs']") -> str:
    """pp_configs["schedule_mode"], checked: one of SCHEDULE_MODES."""
    if not isinstance(value, str) or value not in SCHEDULE_MODES:
        raise ValueError(f"{where}['schedule_mode'] = {value!r} is not supported; allowed: "
                         f"{sorted(SCHEDULE_MODES)}")
    return value


def schedule_kind(strategy: Any) -> str | None:
    """The generator kind pp_configs' schedule_mode and zb_max_pending_w select (None: the
    engine's default)."""
    mode = check_schedule_mode(pp_config(strategy, "schedule_mode"))
    kind, cap = SCHEDULE_MODES[mode], pp_config(strategy, "zb_max_pending_w")
    if cap:
        if kind not in ("zb-h1", "interleaved-zb"):
            raise ValueError(f"pp_configs.zb_max_pending_w = {cap} needs a zero-bubble pp_configs.schedule_mode "
                             f"('ZBH1' or 'ZBVPP'), got {mode!r}")
        kind += f"-w{cap}"
    return kind
