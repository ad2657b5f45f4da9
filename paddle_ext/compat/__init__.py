"""Every difference between the supported Paddle releases (2.6.2, 3.0-3.3.x), and nothing else.

Each function lives in the module of the Paddle subsystem it reads:

- ``version``: which release runs (``paddle_version``, ``version_string``, ``is_supported``,
  ``dependency_problems``, the doctor's ``release_description``) and ``paddle_before(major,
  minor)``, the one version comparison the other modules are written with;
- ``distributed``: fleet's model-parallel op modules, the sep axis, eager communicator
  connection, sharding's tensor fusion, recompute's CPU refusals;
- ``pipeline``: PipelineLayer's loss functions, tied weights and V placement, upstream
  schedule nodes, the dataset preprocessor and micro-step hooks;
- ``ops``: the eager custom-op runner, c_embedding of empty ids, fused_rms_norm's op name;
- ``host_memory``: tensors over host memory without a copy (3.x's from_dlpack);
- ``native_libs``: what the releases' native libraries differ in (2.6.2's zlib).

This package re-exports them: callers write ``from paddle_ext import compat`` and
``compat.name(...)``. Every Paddle-version difference lives in this package and nowhere
else: its modules compare versions only through ``paddle_before`` (or a named predicate
built on it, such as ``tensors_share_host_memory``), and no module outside it reads
Paddle's version (tests/test_version_reads.py). When a new difference turns up, it gets a
function in the module of its subsystem, re-exported here. What is the same in every
supported release does not belong here: paddle_ext.upstream (where Paddle keeps the
modules and classes paddle_ext reads or replaces), paddle_ext.devices (build, places,
streams), paddle_ext.ops._modes (eager / PIR / legacy static op calls),
paddle_ext.paddle_files (files of the installed package), and the modules that use them.
"""

from paddle_ext.compat.distributed import (
    c_concat_owners,
    c_identity_owners,
    c_softmax_with_cross_entropy_owners,
    eager_connect,
    eager_connection_flag,
    optimizer_fusion_module,
    recompute_cpu_refusals,
    sep_degree,
    tensor_fusion_device_aware,
)
from paddle_ext.compat.host_memory import tensor_sharing_host_memory, tensors_share_host_memory
from paddle_ext.compat.native_libs import paddle_links_system_zlib
from paddle_ext.compat.ops import empty_embedding_lookup, fused_rms_norm_op_name, run_custom_op
from paddle_ext.compat.pipeline import (
    pipeline_dataset_preprocessor_classes,
    pipeline_is_v,
    pipeline_layer_supports_v,
    pipeline_loss_fns,
    pipeline_micro_step_hook_api,
    pipeline_shared_weights,
    upstream_local_shared_layer_desc_class,
    upstream_schedule_node_classes,
)
from paddle_ext.compat.version import (
    SUPPORTED,
    dependency_problems,
    is_running_release,
    is_supported,
    paddle_before,
    paddle_version,
    release_description,
    version_string,
)

__all__ = [
    # version
    "SUPPORTED", "dependency_problems", "is_running_release", "is_supported", "paddle_before",
    "paddle_version", "release_description", "version_string",
    # distributed
    "c_concat_owners", "c_identity_owners", "c_softmax_with_cross_entropy_owners", "eager_connect",
    "eager_connection_flag", "optimizer_fusion_module", "recompute_cpu_refusals", "sep_degree",
    "tensor_fusion_device_aware",
    # pipeline
    "pipeline_dataset_preprocessor_classes", "pipeline_is_v", "pipeline_layer_supports_v", "pipeline_loss_fns",
    "pipeline_micro_step_hook_api", "pipeline_shared_weights", "upstream_local_shared_layer_desc_class",
    "upstream_schedule_node_classes",
    # ops, host memory, native libraries
    "empty_embedding_lookup", "fused_rms_norm_op_name", "run_custom_op", "tensor_sharing_host_memory",
    "tensors_share_host_memory", "paddle_links_system_zlib",
]
