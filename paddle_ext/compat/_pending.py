"""The version-dependent functions not yet sorted into their subsystem's module."""

from __future__ import annotations

import functools
from typing import Any, Optional

from paddle_ext.compat.version import paddle_before, version_string


def device_build() -> str:
    """'cuda', 'rocm', 'xpu' or 'cpu': what the installed Paddle was compiled for."""
    import paddle

    if paddle.is_compiled_with_rocm():
        return "rocm"
    if paddle.is_compiled_with_cuda():
        return "cuda"
    if paddle.is_compiled_with_xpu():
        return "xpu"
    return "cpu"


def in_dynamic_mode() -> bool:
    import paddle

    return paddle.in_dynamic_mode()


@functools.cache
def _custom_op_runner():
    # 3.x exposes the eager custom-op entry as _C_ops._run_custom_op; 2.6 as core.eager's.
    from paddle import _C_ops

    runner = getattr(_C_ops, "_run_custom_op", None)
    if runner is None:
        from paddle.base import core

        runner = core.eager._run_custom_op
    return runner


def run_custom_op(op_name: str, *args: Any) -> list:
    """Runs a registered custom op eagerly; always returns the list of outputs.

    Under `paddle.no_grad()` the tensor arguments go in detached. Paddle's custom-op
    runner (2.6.2 and 3.x) builds the op's grad node whenever an input wants a
    gradient, whatever the grad mode: its outputs came back wanting gradients and
    holding the saved inputs, and a later backward through them reached tensors
    computed under no_grad (a frozen reference model's parameters, say). Paddle's own
    ops record nothing there, and the plugin serves Paddle's names."""
    import paddle

    if paddle.in_dynamic_mode() and not paddle.is_grad_enabled():
        args = tuple(_without_grad(a) for a in args)
    outs = _custom_op_runner()(op_name, *args)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def empty_embedding_lookup(weight: Any, ids: Any, start_index: int, vocab_size: int) -> Any:
    """c_embedding of ids with no element: an empty ids.shape + [width] output of weight's
    dtype, its gradient in weight zero. The custom-op runner of Paddle 2.6 and 3.0 refuses an
    op's empty output ("not initialized"), where stock's c_embedding answers. 3.x: zeros plus
    an empty broadcast of a weight row (any dtype); 2.6, whose elementwise ops refuse
    zero-size tensors, gets Paddle's own c_embedding op."""
    import paddle
    from paddle import _C_ops

    if paddle_before(3, 0):
        return _C_ops.c_embedding(weight, ids, start_index, vocab_size)
    return paddle.zeros(list(ids.shape) + [weight.shape[1]], dtype=weight.dtype) + weight[0:1] * 0


def _without_grad(arg: Any) -> Any:
    """A tensor argument (or a list of them) detached; anything else as it is."""
    import paddle

    if isinstance(arg, paddle.Tensor):
        return arg.detach() if not arg.stop_gradient else arg
    if isinstance(arg, (list, tuple)) and any(isinstance(a, paddle.Tensor) for a in arg):
        return type(arg)(_without_grad(a) for a in arg)
    return arg


def register_custom_op_library(path: str) -> None:
    import warnings

    with warnings.catch_warnings():  # importing cpp_extension warns that ccache is missing
        warnings.simplefilter("ignore")
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

    load_op_meta_info_and_register_op(path)


def mp_ops_module():
    """The module whose _c_lookup_table fleet's VocabParallelEmbedding calls."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops


def gloo_process_group_class():
    """The pybind class of gloo process groups, or None in builds without gloo."""
    from paddle.base import core

    return getattr(core, "ProcessGroupGloo", None)


def c_identity_owners() -> list:
    """Modules whose `c_identity` fleet's model-parallel code calls: 3.x uses
    _C_ops (and _legacy_C_ops in places), 2.6 only _legacy_C_ops."""
    import paddle

    return [m for m in (getattr(paddle, "_C_ops", None), getattr(paddle, "_legacy_C_ops", None))
            if m is not None and hasattr(m, "c_identity")]


def pipeline_loss_fns(layers: Any) -> list:
    """A PipelineLayer's loss functions: 3.x keeps a list, 2.6 a single callable."""
    loss = layers._loss_fn
    return list(loss) if isinstance(loss, (list, tuple)) else [loss]


def fleet_modules() -> tuple:
    """(paddle.distributed.fleet, paddle.distributed.fleet.model): both expose distributed_model."""
    import paddle.distributed.fleet as fleet
    import paddle.distributed.fleet.model as fleet_model

    return fleet, fleet_model


def parallel_env_class():
    from paddle.distributed.parallel import ParallelEnv

    return ParallelEnv


def pipeline_layer_class():
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    return PipelineLayer


def fleet_hcg():
    """The HybridCommunicateGroup fleet.init built, or None."""
    import paddle.distributed.fleet as fleet

    return getattr(fleet.fleet, "_hcg", None)


def fleet_strategy():
    import paddle.distributed.fleet as fleet

    return fleet.fleet._user_defined_strategy


def collective_module():
    """paddle.distributed.collective: where new_group lives (paddle.distributed re-exports it)."""
    import paddle.distributed.collective as collective

    return collective


def distributed_strategy_class():
    from paddle.distributed.fleet import DistributedStrategy

    return DistributedStrategy


def pp_config_message(strategy: Any) -> Any:
    """The protobuf message behind strategy.hybrid_configs['pp_configs']."""
    return strategy.strategy.hybrid_configs.pp_configs


def upstream_schedule_node_classes():
    """(ScheduleNode, ScheduleChunk) from fleet.meta_parallel where Paddle's backward has
    3.3's contract, or None: 2.6 and 3.0 have no such classes, and 3.1 and 3.2's
    ScheduleNode.backward wants a gradient for every output (a node returning position ids
    beside its hidden states fails: "2 of Tensor vs 1 of Tensor", measured with 3.1.0 and
    3.2.0) and returns a lone input's gradient bare; 3.3 skips the outputs that need none
    and always returns a tuple, as paddle_ext's own classes do."""
    if paddle_before(3, 3):
        return None
    try:
        from paddle.distributed.fleet.meta_parallel.pp_utils.forward_backward_overlap_utils import (
            ScheduleChunk,
            ScheduleNode,
        )
    except ImportError:
        return None
    return ScheduleNode, ScheduleChunk


def meta_parallel_module():
    """paddle.distributed.fleet.meta_parallel: where upstream exports ScheduleNode."""
    import paddle.distributed.fleet.meta_parallel as meta_parallel

    return meta_parallel


def pipeline_run_function(layers: Any, chunk_id: Any = None) -> list:
    """The callables a PipelineLayer runs for `chunk_id` (None: the only chunk). Both
    2.6 and 3.x keep VPP chunks in `_model_chunks[i].get_run_function()`."""
    if chunk_id is None or (layers.get_num_virtual_stages() <= 1 and not pipeline_is_v(layers)):
        return list(layers.run_function)
    return list(layers._model_chunks[chunk_id].get_run_function())


def pipeline_recompute_interval(layers: Any) -> int:
    return int(getattr(layers, "_recompute_interval", 0) or 0)


# --- gradient reduction of the pipeline engine (pipeline/grad_sync.py) ------------------

def pipeline_model_chunks(layers: Any) -> list:
    """A PipelineLayer's model chunks on this rank: its virtual-stage chunks with VPP,
    else the layer itself (2.6 and 3.x: get_model_chunks() is None without VPP)."""
    if pipeline_is_v(layers):  # get_model_chunks() is None there: one "virtual stage"
        return list(layers._model_chunks)
    chunks = layers.get_model_chunks() if layers.get_num_virtual_stages() > 1 else None
    return list(chunks) if chunks else [layers]


def pipeline_shared_layer_params(layers: Any) -> list:
    """Parameters of the PipelineLayer's shared (tied) layers on this rank: both
    releases keep those layers in `shared_layers` (3.x also in shared_comm[key]['layer'])."""
    shared = getattr(layers, "shared_layers", None) or {}
    params, seen = [], set()
    for layer in shared.values():
        for p in layer.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def pipeline_shared_weights(layers: Any) -> list[tuple[Any, list[int]]]:
    """(weight, the global ranks of the stages that hold it) for each weight a PipelineLayer
    ties across stages on this rank (its shared_comm: 3.x names the weight attributes in a
    list, 2.6 names one)."""
    out = []
    for comm in (getattr(layers, "shared_comm", None) or {}).values():
        attrs = comm["weight_attr"]
        for attr in ([attrs] if isinstance(attrs, str) else attrs):
            out.append((getattr(comm["layer"], attr), list(comm["ranks"])))
    return out


def global_rank() -> int:
    import paddle.distributed as dist

    return dist.get_rank()


def tensor_device_kind() -> str:
    """'cpu' when new tensors go to the CPU, 'gpu' for CUDA/ROCm places, else the
    device type Paddle reports (xpu, npu, ...)."""
    import paddle

    device = paddle.get_device()
    kind = device.split(":", 1)[0]
    return "gpu" if kind in ("gpu", "cuda") else kind


def new_stream() -> Any:
    """A new stream on the current device (paddle.device.Stream on 2.6 and 3.x)."""
    import paddle

    return paddle.device.Stream()


def current_stream() -> Any:
    import paddle

    return paddle.device.current_stream()


def stream_guard(stream: Any) -> Any:
    """Context in which ops (and calc-stream collectives) run on `stream`."""
    import paddle

    return paddle.device.stream_guard(stream)


def raw_stream(stream: Any) -> Any:
    """What paddle_ext.runtime.Event takes for a Paddle stream: its stream_base, which
    carries the native handle (.cuda_stream) on 2.6 and 3.x."""
    return getattr(stream, "stream_base", stream)


class _PaddleEvent:
    """Paddle's device event with record(stream) / wait(stream) (a stream waits on it)."""

    def __init__(self, enable_timing: bool) -> None:
        import paddle

        # 2.6: Event(device=None, enable_timing=...); 3.x: Event(enable_timing=...)
        self.event = paddle.device.Event(enable_timing=enable_timing)

    def record(self, stream: Any) -> None:
        self.event.record(stream)

    def wait(self, stream: Any) -> None:
        stream.wait_event(self.event)


def paddle_device_event(enable_timing: bool = False) -> Any:
    return _PaddleEvent(enable_timing)


def tensor_sharing_host_memory(array: Any) -> Any:
    """A CPU Tensor over a numpy array's memory, without a copy.

    3.x: through DLPack. Paddle 2.6's from_dlpack copies (measured: the tensor
    did not see later writes), so there is no zero-copy path and it raises.
    """
    if paddle_before(3, 0):
        raise NotImplementedError(
            f"Paddle {version_string()} has no zero-copy path from host memory to a Tensor "
            "(its from_dlpack copies); use the buffer's numpy() view, or Paddle >= 3.0")
    import paddle

    return paddle.utils.dlpack.from_dlpack(array.__dlpack__())


def sep_degree(hcg: Any) -> int:
    """The sep (sequence) parallel degree: 3.x's HybridCommunicateGroup has the axis, 2.6's not."""
    getter = getattr(hcg, "get_sep_parallel_world_size", None)
    return int(getter()) if getter is not None else 1


# --- communication debugging (paddle_ext.comm) -----------------------------------------
def group_map() -> dict:
    """gid -> Group for every group paddle.distributed made so far (0: the global one),
    read without creating anything (collective._group_map on 2.6 and 3.x)."""
    from paddle.distributed import collective

    return dict(getattr(collective, "_group_map", {}))


def current_host() -> str:
    """This rank's host as the launcher gave it (PADDLE_CURRENT_ENDPOINT), else loopback."""
    import os

    return os.getenv("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0] or "127.0.0.1"


def job_store() -> Any:
    """The job's TCPStore once init_parallel_env made it, else None."""
    from paddle.distributed import collective

    return getattr(collective, "_default_store", None)


def parallel_module():
    """paddle.distributed.parallel: init_parallel_env calls its own _set_default_store."""
    import paddle.distributed.parallel as parallel

    return parallel


def process_group_classes() -> list:
    """The pybind ProcessGroup base and every backend subclass this build has."""
    from paddle.base import core

    names = ("ProcessGroup", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupBKCL", "ProcessGroupCustom")
    return [getattr(core, n) for n in names if hasattr(core, n)]


def eager_connection_flag() -> bool:
    """FLAGS_eager_communication_connection (#57517): a Paddle flag on 3.x; 2.6 has no
    such flag, there the environment variable of the same name is read."""
    import os

    name = "FLAGS_eager_communication_connection"
    try:
        import paddle

        return bool(paddle.get_flags([name])[name])
    except (ValueError, KeyError, RuntimeError):
        return os.environ.get(name, "").strip().lower() in ("1", "true", "on", "yes")


def eager_connect(process_group: Any, p2p: bool) -> str:
    """Creates a group's communicators now instead of at its first operation; returns
    how ('' when there is nothing to do). Gloo connects its full mesh when the group is
    constructed. NCCL: 3.x has eager_connect / eager_connect_ring_exchange (p2p
    communicators); 2.6 has neither, and a first all-reduce creates the communicator."""
    if "Gloo" in type(process_group).__name__:
        return ""
    if hasattr(process_group, "eager_connect"):
        process_group.eager_connect()
        if p2p:
            process_group.eager_connect_ring_exchange()
        return "eager_connect" + ("+ring_exchange" if p2p else "")
    import paddle
    from paddle.base import core

    process_group.all_reduce(paddle.zeros([1], dtype="float32"), core.ReduceOp.SUM, True).wait()
    return "first all_reduce"


def hybrid_communicate_group_class():
    from paddle.distributed.fleet.base.topology import HybridCommunicateGroup

    return HybridCommunicateGroup


def pipeline_dataset_preprocessor_classes() -> tuple:
    """(PipelineDatasetPreprocessor,) where Paddle has it (3.x: the callable a trainer
    passes as forward_backward_pipeline's data), () on 2.6."""
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel

    cls = getattr(pipeline_parallel, "PipelineDatasetPreprocessor", None)
    return (cls,) if cls is not None else ()


def pipeline_micro_step_hook_api() -> Optional[tuple]:
    """(PipelineHook, the global PipelineParallelMicroStepCallback, PipelineParallelMicro-
    StepLocations) of Paddle's PipelineParallel (3.0+), or None (2.6 has no user hooks)."""
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel

    callbacks = getattr(pipeline_parallel, "pipeline_parallel_callbacks_", None)
    hook_cls = getattr(pipeline_parallel, "PipelineHook", None)
    if callbacks is None or hook_cls is None:
        return None
    return hook_cls, callbacks, pipeline_parallel.PipelineParallelMicroStepLocations


def grad_enabled() -> bool:
    """Whether the dygraph tracer records gradients (paddle.no_grad() switches it off)."""
    from paddle.base import framework

    return bool(framework._dygraph_tracer()._has_grad)


def current_expected_place() -> Any:
    """The place new tensors go to (paddle.set_device's): _current_expected_place_
    on 3.x, _current_expected_place on 2.6."""
    from paddle import framework

    getter = getattr(framework, "_current_expected_place_", None) or framework._current_expected_place
    return getter()


def place_from_string(device: str) -> Any:
    """A device string ("cpu", "gpu:0") as the place paddle.device.synchronize reads it."""
    import paddle

    return paddle.device._convert_to_place(device)


def is_cpu_place(place: Any) -> bool:
    """CPUPlace, or a generic Place that holds the CPU (both releases have both)."""
    from paddle.base import core

    if isinstance(place, core.CPUPlace):
        return True
    return isinstance(place, core.Place) and place.is_cpu_place()


def fused_rms_norm_op_name() -> str | None:
    """The paddle._C_ops function behind paddle.incubate.nn.functional.fused_rms_norm
    (x, bias, residual, norm_weight, norm_bias, epsilon, begin_norm_axis, quant...):
    fused_rms_norm_quant on 3.3, which gave the name rms_norm to the op of the new
    paddle.nn.functional.rms_norm (#76920, #76930); rms_norm before (2.6)."""
    import paddle

    for name in ("fused_rms_norm_quant", "rms_norm"):
        if hasattr(paddle._C_ops, name):
            if name == "rms_norm" and hasattr(paddle.nn.functional, "rms_norm"):
                return None  # the new op only: this release's fused_rms_norm calls something else
            return name
    return None
def cpu_kernel_dtypes(kernel: str) -> frozenset[str]:
    """The dtypes phi's kernel registry has a CPU kernel of `kernel` for ("float32", ...),
    read without running anything: both releases keep the registry as strings such as
    "(CPU, Undefined(AnyLayout), float32)". A kernel that crashes this CPU (built for an
    instruction set it lacks) can be told from a missing one only this way."""
    from paddle.base import core

    entries = core._get_registered_phi_kernels("function").get(kernel) or []
    dtypes = set()
    for entry in entries:
        parts = [p.strip() for p in entry.strip("()").split(",")]
        if parts and parts[0] == "CPU":
            dtypes.add(parts[-1])
    return frozenset(dtypes)


def c_concat_owners() -> list:
    """Modules whose `c_concat` (3.x signature: x, rank, nranks, ring_id, use_calc_stream,
    use_model_parallel) fleet's mp_ops._c_concat calls in dygraph: 3.x's _C_ops; 2.6
    calls _legacy_C_ops with attribute pairs, left alone."""
    import paddle

    ops = getattr(paddle, "_C_ops", None)
    return [ops] if not paddle_before(3, 0) and ops is not None and hasattr(ops, "c_concat") else []

def c_softmax_with_cross_entropy_owners() -> list[tuple[Any, str]]:
    """(module, calling convention) for each op module with c_softmax_with_cross_entropy,
    the op of fleet's ParallelCrossEntropy: 3.x's mp_ops calls _C_ops positionally
    (logits, label, ignore_index, ring_id, rank, nranks); 2.6's calls _legacy_C_ops with
    attribute pairs (logits, label, 'ring_id', r, 'rank', k, 'nranks', n, 'ignore_index', i),
    which 3.x still exports."""
    import paddle

    found = []
    for name, convention in (("_C_ops", "positional"), ("_legacy_C_ops", "attributes")):
        ops = getattr(paddle, name, None)
        if ops is not None and hasattr(ops, "c_softmax_with_cross_entropy"):
            found.append((ops, convention))
    return found


def tensor_fusion_device_aware() -> bool:
    """Whether fleet's tensor_fusion_helper picks its alignment by device type
    (get_current_device_type, 3.x: it knows gpu, npu and xpu only); 2.6's aligns every
    buffer as for "gpu", whatever the device."""
    import importlib

    module = importlib.import_module("paddle.distributed.fleet.utils.tensor_fusion_helper")
    return hasattr(module, "get_current_device_type")


def optimizer_fusion_module() -> Any:
    """paddle.optimizer.fusion_utils (3.x: the optimizer's fused state storage, used by
    sharding's enable_fuse_optimizer_states), which keeps its own copy of the device-type
    lookup and alignment table; None where Paddle has none (2.6)."""
    import importlib

    try:
        return importlib.import_module("paddle.optimizer.fusion_utils")
    except ImportError:
        return None


def linear_is_matmul_then_add() -> bool:
    """Whether paddle.nn.functional.linear in dygraph computes a matmul, then adds the bias
    (Paddle's `linear` op on CPU, 2.6 and 3.x; tested bit for bit against a split matmul).
    On CUDA builds 3.x may run a fused GEMM with the bias in its epilogue (linear_v2,
    cublasLt), whose rounding a separate matmul and add need not reproduce."""
    return tensor_device_kind() == "cpu"
# --- static graphs (the ops' custom ops in paddle.static / to_static programs) ----------

def in_pir_mode() -> bool:
    """Whether a static program is being built in PIR (3.x's default; 2.6 has none)."""
    import paddle

    fn = getattr(getattr(paddle, "framework", None), "in_pir_mode", None)
    return bool(fn()) if fn is not None else False


def is_tensor(value: Any) -> bool:
    """A paddle.Tensor, or a static program's variable (a legacy Variable or a PIR
    Value): what an op function may take in each mode."""
    import paddle

    if isinstance(value, paddle.Tensor):
        return True
    from paddle.base.framework import Variable

    if isinstance(value, Variable):
        return True
    value_class = getattr(getattr(paddle, "pir", None), "Value", None)
    return value_class is not None and isinstance(value, value_class)


def _append_custom_op(op_name: str, args: tuple) -> list:
    """A custom op appended to the legacy static program being built (2.6, or 3.x
    with FLAGS_enable_pir_api off), as Paddle's generated op functions do: inputs
    and attributes by the names the op registered; None leaves an optional input out."""
    from paddle.base.layer_helper import LayerHelper
    from paddle.utils.cpp_extension.extension_utils import parse_op_info

    in_names, attr_names, out_names = parse_op_info(op_name)
    if len(args) != len(in_names) + len(attr_names):
        raise TypeError(f"{op_name} takes {len(in_names)} inputs and {len(attr_names)} attributes, "
                        f"got {len(args)} arguments")
    inputs = {name: arg for name, arg in zip(in_names, args) if arg is not None}
    attrs = dict(zip(attr_names, args[len(in_names):]))
    helper = LayerHelper(op_name)
    # The dtype is a placeholder: the op's InferDtype sets each output's when appended.
    outputs = {name: helper.create_variable(dtype="float32") for name in out_names}
    helper.append_op(type=op_name, inputs=inputs, outputs=outputs, attrs=attrs)
    return [outputs[name] for name in out_names]


def run_custom_op_any_mode(op_name: str, *args: Any) -> list:
    """run_custom_op in every mode: eagerly, into a PIR program (3.x's runner takes
    PIR values as its generated op functions do) or into a legacy static program."""
    if in_dynamic_mode() or in_pir_mode():
        return run_custom_op(op_name, *args)
    return _append_custom_op(op_name, args)
def _paddle_package_file(*parts: str) -> str | None:
    """The file paddle/<parts...> of the installed Paddle, found without importing Paddle;
    None where it has none."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("paddle")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, *parts)
        if os.path.isfile(path):
            return path
    return None


def mkl_library_path() -> str | None:
    """The MKL that Paddle's x86-64 CPU wheels (2.6.2, 3.x) ship as paddle/libs/libmklml_intel.so
    (2019.0.5 in both), found without importing Paddle; None for builds without it."""
    return _paddle_package_file("libs", "libmklml_intel.so")


def mkl_code_path(decide: bool = True) -> int | None:
    """The code path Paddle's MKL dispatches to (its mkl_serv_get_cpu_type, numbered as
    MKL_DEBUG_CPU_TYPE: 0 generic, 5 AVX2 ...). MKL decides at its first computation,
    from MKL_DEBUG_CPU_TYPE as it is then; decide=True decides now if it has not
    (argument 1: measured: 0 answers -1 while undecided), decide=False answers None
    then. None too without that MKL, or before `import paddle` loaded it (it needs
    the libiomp5 that Paddle loads first)."""
    import ctypes

    path = mkl_library_path()
    fn = getattr(ctypes.CDLL(path), "mkl_serv_get_cpu_type", None) if path and mkl_loaded() else None
    if fn is None:
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    code = int(fn(1 if decide else 0))
    return None if code < 0 else code


def mkl_loaded() -> bool:
    """Whether this process has loaded Paddle's MKL (an `import paddle` does)."""
    try:
        with open("/proc/self/maps") as f:
            return "libmklml_intel.so" in f.read()
    except OSError:
        return False


def paddle_core_library() -> str | None:
    """Paddle's core extension module, paddle/base/libpaddle.so (2.6.2 and 3.x), found
    without importing Paddle; None where there is none."""
    return _paddle_package_file("base", "libpaddle.so")


@functools.cache
def paddle_links_system_zlib() -> bool:
    """Whether Paddle's core library needs the system's libz.so.1 (DT_NEEDED), read from the
    file without importing Paddle. 2.6.2's does, and also carries and exports a zlib 1.2.8 of
    its own (nm -D: inflate, inflateReset2, deflateInit2_ ...; upstream issue #70538; PR
    #64447 moved that copy to 1.2.11 after 2.6): libz.so.1, loaded in libpaddle.so's scope,
    binds its calls into itself to that copy (paddle_ext.zlib_binding). 3.3.1's links no
    libz and exports no zlib (measured)."""
    from paddle_ext import _elf

    path = paddle_core_library()
    if path is None:
        return False
    try:
        return "libz.so.1" in _elf.ElfFile(path).needed()
    except (OSError, _elf.ElfError):
        return False


# --- V placement (pipeline/schedule/vshape.py: zb-v, dualpipev) --------------------------

def pipeline_is_v(layers: Any) -> bool:
    """True for a PipelineLayer segmented for the V placement: Paddle 3.3's
    PipelineLayer(use_dualpipev=True) holds stages r and 2*pp-1-r in _model_chunks[0]
    and [1] (get_num_virtual_stages() stays 1); the plugin's VPipelineLayer
    (pipeline/v_layer.py, any release) the same, with get_num_virtual_stages() 2 (its
    class attribute _paddle_ext_v marks it and every class made with v_segmented)."""
    return bool(getattr(layers, "_use_dualpipev", False) or getattr(layers, "_paddle_ext_v", False))


def pipeline_layer_supports_v() -> bool:
    """Whether this Paddle's PipelineLayer can build the V segmentation
    (use_dualpipev=, Paddle 3.3+; 2.6 - 3.2 have none)."""
    import inspect

    return "use_dualpipev" in inspect.signature(pipeline_layer_class().__init__).parameters


# --- custom ops' gradients in legacy static programs ------------------------------------

def legacy_static_grad_inputs(*tensors: Any) -> tuple:
    """The tensors a custom op with one gradient per input (flash attention's q, k, v)
    should take. In a legacy static program (2.6, or 3.x with FLAGS_enable_pir_api off),
    when some of them have stop_gradient=True and others not, Paddle's backward leaves the
    frozen ones' gradients out of the grad op, and its custom-op shape inference (our
    InferShapeFn or its default) fails on the missing output ("The iutput(Q@GRAD) should
    hold only one element, but now it holds 0 elements"). So each frozen one goes in
    as a copy (paddle.assign) that wants a gradient: the grad op then has all its outputs,
    and the copy's gradient stops there, since the copied variable wants none. Eager mode,
    PIR programs and calls with no mix: the tensors as they are."""
    if in_dynamic_mode() or in_pir_mode():
        return tensors
    flags = [bool(t.stop_gradient) for t in tensors]
    if all(flags) or not any(flags):
        return tensors
    import paddle

    out = []
    for t, frozen in zip(tensors, flags):
        if frozen:
            t = paddle.assign(t)
            t.stop_gradient = False
        out.append(t)
    return tuple(out)


# --- V-segmented pipeline layers --------------------------------------------------------

def upstream_local_shared_layer_desc_class() -> Any:
    """Paddle's LocalSharedLayerDesc (3.3+: a weight tied within one rank of a V layer),
    or None on releases without it (pipeline/v_layer.py has the plugin's)."""
    try:
        from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import (
            LocalSharedLayerDesc,
        )
    except ImportError:
        return None
    return LocalSharedLayerDesc


# --- recompute on CPU builds (host_recompute) -------------------------------------------

def recompute_modules() -> tuple[Any, Any]:
    """(recompute, recompute_hybrid): the modules of paddle.distributed.fleet.recompute
    (the package's names `recompute` / `recompute_hybrid` are the functions)."""
    import importlib

    package = "paddle.distributed.fleet.recompute"
    return importlib.import_module(f"{package}.recompute"), importlib.import_module(f"{package}.recompute_hybrid")


def _refuses_cpu(function: Any) -> bool:
    """Whether Paddle's function has an RNG device check ("... not support current device")
    with no branch for the CPU (a 'cpu' string beside it, as 3.x's non-reentrant recompute)."""
    consts = [c for c in function.__code__.co_consts if isinstance(c, str)]
    return any("not support current device" in c for c in consts) and "cpu" not in consts


def recompute_cpu_refusals() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, function) of Paddle's recompute functions whose RNG device check
    refuses the CPU: recompute_hybrid's _HPRecomputeFunction.forward (a staticmethod;
    2.6 to 3.3 all assert) and 2.6's _recompute_without_reentrant (3.x's saves the CPU
    generator's state itself)."""
    recompute, hybrid = recompute_modules()
    layer = hybrid._HPRecomputeFunction
    candidates = [(layer, "forward", vars(layer)["forward"].__func__),
                  (recompute, "_recompute_without_reentrant", recompute._recompute_without_reentrant)]
    return [(owner, name, f) for owner, name, f in candidates if _refuses_cpu(f)]


def hybrid_recompute_layer() -> Any:
    """recompute_hybrid's PyLayer (_HPRecomputeFunction): its backward brings offloaded /
    partitioned inputs back with Tensor.cuda() on every release."""
    return recompute_modules()[1]._HPRecomputeFunction
