"""What the trainer rank scripts share (paddleformers_trainer.py, paddlenlp_trainer.py):
PaddleFormers' pipe models and PaddleNLP's, its predecessor's, name their parameters the
same way (PipelinePretrainedModel's single-model mapping), so one set of helpers copies a
single-process reference's weights into a pipe and compares them after training."""

import hashlib

import numpy as np
import paddle


def copy_weights(ref, pipe):
    """The pipe's parameters from the reference, by structure name: the pipe names
    layers embed / decoder i / norm / head after their LayerDescs. Returns the mapping
    pipe key -> reference key."""
    ref_state = ref.state_dict()
    if hasattr(pipe, "_set_pipeline_name_mapping"):
        pipe._set_pipeline_name_mapping()
        mapping = pipe._pp_to_single_mapping
    else:  # no pipeline parallelism: the single-process class, its own names
        mapping = {key: key for key in ref_state}
    pipe_state = paddle.nn.Layer.state_dict(pipe)
    done = {}
    for pipe_key, tensor in pipe_state.items():
        ref_key = mapping.get(pipe_key)
        if ref_key is None or ref_key not in ref_state:
            raise KeyError(f"no reference parameter for {pipe_key} (mapped to {ref_key})")
        src = ref_state[ref_key]
        if tuple(src.shape) != tuple(tensor.shape):  # tensor parallel: this rank's slice
            src = tp_slice(src, tensor, pipe_key)
        tensor.set_value(src)
        done[pipe_key] = ref_key
    return done


def tp_slice(full, part, name):
    """This rank's tensor-parallel slice of `full`, shaped as `part`."""
    from paddle.distributed import fleet

    hcg = fleet.get_hybrid_communicate_group()
    rank, world = hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()
    full = full.numpy()
    for axis in range(full.ndim):
        if full.shape[axis] == part.shape[axis] * world:
            size = part.shape[axis]
            return paddle.to_tensor(np.take(full, range(rank * size, (rank + 1) * size), axis=axis))
    raise ValueError(f"{name}: cannot slice {full.shape} into {part.shape}")


def compare(pipe, ref, mapping, offset=frozenset()):
    """Max relative difference per parameter of this rank (its tensor-parallel slice of
    the reference where it holds one), in float64; the keys in `offset` are weights the
    model uses as `1 + w`, compared as that scale (paddleformers_trainer.unit_offset_weights)."""
    ref_state = ref.state_dict()
    worst = {}
    for pipe_key, tensor in paddle.nn.Layer.state_dict(pipe).items():
        want = ref_state[mapping[pipe_key]]
        if tuple(want.shape) != tuple(tensor.shape):
            want = tp_slice(want, tensor, pipe_key)
        want = want.numpy().astype(np.float64) + (pipe_key in offset)
        got = tensor.numpy().astype(np.float64) + (pipe_key in offset)
        scale = max(np.max(np.abs(want)), 1e-30)
        worst[pipe_key] = float(np.max(np.abs(got - want)) / scale)
    return worst


def digest(pipe):
    """A hash of every parameter's bytes: equal digests, bitwise equal parameters."""
    h = hashlib.sha256()
    for key, tensor in sorted(paddle.nn.Layer.state_dict(pipe).items()):
        h.update(key.encode())
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()
