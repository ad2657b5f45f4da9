"""Paddle's group sharding, stages 2 and 3, on a CPU build.

`paddle.distributed.sharding.group_sharded_parallel` (what PaddleFormers' Trainer calls for
`sharding="stage2"` / `"stage3"` without pipeline parallelism) and the constructors of
GroupShardedOptimizerStage2 and GroupShardedStage3 assert a GPU, XPU or custom device
("group_sharded_parallel only support gpu, xpu and custom_device now"), although the
classes already keep buffers on the host when asked (their offload paths) and talk through
their group's collectives, which gloo has. Measured on 3.3.1 (the same code in 2.6.2),
what else stops a CPU run, and what this module does about each, for the device "cpu"
only (a call Paddle answers is left alone):

- the dispatcher's assert: `group_sharded_parallel_on_host` builds the same classes with
  device "cpu" (the rest of the dispatcher, Paddle's, is short and repeated there);
- the two constructors assert a CUDA/XPU/custom build and the stage-2 optimizer parses
  its device index out of `paddle.get_device()` ("gpu:0"; "cpu" has none): for the
  length of the constructor its module reads a `core` whose `is_compiled_with_cuda()` is
  True and a `paddle` whose `get_device()` is "cpu:0" (`constructed_on_host`);
- ParamStorage.add_rank_params copies each parameter to the host, clears the parameter,
  then reads the copy: on the host the copy is the parameter itself, cleared before it is
  read; on "cpu" storage the parameters are taken as they are (`params_added_on_host`);
- GroupShardedClipGrad moves the squared norm to the GPU (`.cuda(dev_id)`) when the
  current device is "cpu" (its offload case) after parsing an index out of the device:
  on "cpu" it runs with the index 0 and `Tensor.cuda` answering the tensor itself
  (`clipped_on_host`; paddle_ext.host_checkpoint.cuda_stays_on_host).

- sharding stage 1 with split_param (DygraphShardingOptimizerV2, PaddleFormers' default)
  lays its buffers out through fleet's tensor_fusion_helper, whose device table has gpu,
  npu and xpu only ("tensor fusion helper now only support ... but got device unknown"):
  on a CPU build whose current place is the host it answers "cpu", aligned as gpu is
  (256 bytes: the same buffer layout as a GPU run; `fusion_device_on_host`).

Module globals are swapped under one lock, one constructor at a time; another thread
reading those modules' `core` / `paddle` meanwhile sees the facades, which differ from
Paddle's only in the two answers above.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator

from paddle_ext.host_checkpoint import cuda_stays_on_host

HOST = "cpu"
_LOCK = threading.RLock()


class _Facade:
    """`target` with some attributes answered otherwise."""

    def __init__(self, target: Any, **overrides: Any) -> None:
        self._target, self._overrides = target, overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_target"], name)


@contextlib.contextmanager
def _module_globals(module: Any, **values: Any) -> Iterator[None]:
    with _LOCK:
        saved = {name: vars(module)[name] for name in values}
        vars(module).update(values)
        try:
            yield
        finally:
            vars(module).update(saved)


def group_sharded_parallel_on_host(original: Callable[..., Any], classes: Any) -> Callable[..., Any]:
    """Paddle's group_sharded_parallel; on the host (`paddle.get_device()` is "cpu") it builds
    `classes`' GroupShardedOptimizerStage2 + GroupShardedStage2 (levels "os", "os_g") or
    GroupShardedStage3 ("p_g_os") with device "cpu", where Paddle's asserts a device."""

    @functools.wraps(original)
    def group_sharded_parallel(model: Any, optimizer: Any, level: str, scaler: Any = None, group: Any = None,
                               offload: bool = False, sync_buffers: bool = False, buffer_max_size: int = 2**23,
                               segment_size: int = 2**20, sync_comm: bool = False, dp_group: Any = None,
                               exclude_layer: Any = None) -> Any:
        import paddle

        if paddle.get_device().split(":")[0] != HOST:
            return original(model, optimizer, level, scaler, group, offload, sync_buffers, buffer_max_size,
                            segment_size, sync_comm, dp_group, exclude_layer)
        # Paddle's own checks, with its messages and error type
        assert isinstance(model, paddle.nn.Layer), "The model must be the instance of paddle.nn.Layer."
        assert isinstance(optimizer, (classes.MixPrecisionOptimizer, paddle.optimizer.Optimizer)), (
            "The optimizer must be the instance of paddle.optimizer.Optimizer or MixPrecisionOptimizer for main grad.")
        assert level in ["os", "os_g", "p_g_os"], "The level must be os, os_g or p_g_os."
        if level in ("os", "os_g"):
            optimizer = classes.GroupShardedOptimizerStage2(
                params=optimizer._parameter_list, optim=optimizer, group=group, offload=offload,
                dp_group=dp_group, device=HOST)
            model = classes.GroupShardedStage2(model, optimizer, group=group, sync_buffers=sync_buffers,
                                               buffer_max_size=buffer_max_size, dp_group=dp_group, device=HOST)
        else:
            model = classes.GroupShardedStage3(model, optimizer=optimizer, group=group, sync_buffers=sync_buffers,
                                               segment_size=segment_size, offload=offload, sync_comm=sync_comm,
                                               dp_group=dp_group, device=HOST, exclude_layer=exclude_layer)
        if isinstance(scaler, paddle.amp.GradScaler):
            scaler = classes.GroupShardedScaler(scaler)
        return model, optimizer, scaler

    return group_sharded_parallel


def constructed_on_host(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    """A group-sharding class's __init__ (defined in `module`) that, for device "cpu", runs
    with the module's `core` saying CUDA is compiled in and its `paddle` naming the device
    "cpu:0": the assert and the device-index parse that stop it on the host pass; nothing
    else of either changes."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("device") != HOST:
            return original(self, *args, **kwargs)
        core, paddle = vars(module)["core"], vars(module)["paddle"]
        with _module_globals(module, core=_Facade(core, is_compiled_with_cuda=lambda: True),
                             paddle=_Facade(paddle, get_device=lambda: f"{HOST}:0")):
            return original(self, *args, **kwargs)

    return __init__


def params_added_on_host(original: Callable[..., Any]) -> Callable[..., Any]:
    """ParamStorage.add_rank_params that takes a "cpu" storage's parameters as they are
    (convert_gpu=False: Paddle's host round trip clears the parameter before reading it
    when the parameter is already on the host)."""

    @functools.wraps(original)
    def add_rank_params(self: Any, trainable_params: Any, param2align: Any, convert_gpu: bool = True) -> Any:
        return original(self, trainable_params, param2align, convert_gpu and self._device != HOST)

    return add_rank_params


def clipped_on_host(original: Callable[..., Any]) -> Callable[..., Any]:
    """GroupShardedClipGrad._dygraph_clip that, on the host, keeps the norm there."""

    @functools.wraps(original)
    def _dygraph_clip(self: Any, params_grads: Any) -> Any:
        if str(self._device).split(":")[0] != HOST:
            return original(self, params_grads)
        self._device = f"{HOST}:0"  # Paddle parses a device index out of it
        with cuda_stays_on_host():
            return original(self, params_grads)

    return _dygraph_clip


FUSION_ALIGNMENT = 256  # bytes, tensor_fusion_helper's for gpu


def fusion_device_on_host(original: Callable[..., Any]) -> Callable[..., Any]:
    """tensor_fusion_helper.get_current_device_type that answers "cpu" on a CPU build whose
    current place is the host (Paddle's finds no device type there and asserts); pair it
    with `fusion_alignment_on_host` of the module's table."""

    @functools.wraps(original)
    def get_current_device_type() -> str:
        import paddle

        if (not paddle.is_compiled_with_cuda() and not paddle.is_compiled_with_xpu()
                and isinstance(paddle.framework._current_expected_place_(), paddle.CPUPlace)):
            return HOST
        return original()

    return get_current_device_type


def fusion_alignment_on_host(table: dict) -> dict:
    """tensor_fusion_helper's alignment table with a "cpu" entry."""
    return {**table, HOST: FUSION_ALIGNMENT}
