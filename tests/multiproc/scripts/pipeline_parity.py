"""Rank script: the pipeline engine against a single-process run of the same model.

For each (vpp, accumulate_steps) pair: 3 train_batch steps with Adam; at every
step the loss and this rank's parameter grads must equal the single-process
reference bit for bit, and after the steps the parameters too. The first pair
goes through fleet.distributed_model / distributed_optimizer (the fleet glue).

After the steps, eval_batch's loss must equal the reference's forward.

Usage: pipeline_parity.py PP VPP:M[:KIND][,VPP:M[:KIND]...] [delay_scale|scaler]
(KIND: a schedule kind, default the engine's; a zero-bubble kind through
pp_configs.schedule_mode on the fleet path, and its I/W split must have deferred
weight gradients wherever an I is apart from its W, without splitting any sum)
(scaler: an AMP GradScaler with loss scaling 2**10, fleet.distributed_scaler on
the pipeline side, a plain one on the reference side)
"""

import os
import sys
import threading

import paddle
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import GradRecorder, ReferenceRun, assert_equal, check_split, stage_params  # noqa: E402

import paddle_ext  # noqa: E402
from examples.tiny_gpt import Embedding, Reference, batch, pipeline_model  # noqa: E402
from paddle_ext import upstream  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings  # noqa: E402
from paddle_ext.pipeline.schedule import simulate  # noqa: E402

VOCAB, HIDDEN, SEQ, MBS, STEPS = 32, 16, 8, 2, 3


def run_pair(hcg, vpp, m, delay, via_fleet, use_scaler=False, kind=None):
    pp, stage = hcg.get_pipe_parallel_world_size(), hcg.get_stage_id()
    way = os.environ.get("PADDLE_EXT_PP_TRANSFERS", "streams")
    paddle.seed(0)
    model = pipeline_model(VOCAB, HIDDEN, SEQ, blocks=pp * vpp, pp=pp, vpp=vpp)
    ref = Reference(VOCAB, HIDDEN, SEQ, blocks=pp * vpp)
    mine = stage_params(model, stage, Embedding)
    groups_before = len(upstream.group_map())
    if via_fleet:
        engine = fleet.distributed_model(model)
        # over TCP streams the engine makes no process group (no pair or one-way link groups)
        if way == "streams":
            assert len(upstream.group_map()) == groups_before, (groups_before, upstream.group_map())
        assert isinstance(engine, PipelineEngine), type(engine)
        # overlap_p2p_comm unset on gloo: overlapped, over TCP streams (runtime/transfer_paths.py),
        # or on communication threads under PADDLE_EXT_PP_TRANSFERS=threads
        assert engine._overlap_p2p_comm is True and engine._transfers.name == way, (way, engine.settings)
        opt = fleet.distributed_optimizer(paddle.optimizer.Adam(1e-2, parameters=model.parameters()))
    else:
        engine = PipelineEngine(model, hcg, PipelineSettings(m, MBS, delay_scale_loss=delay, kind=kind))
        assert engine._transfers.name == "blocking"  # overlap_p2p=False given: the compute thread's transfers
        opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
    recorder = GradRecorder(opt, mine)
    oracle = ReferenceRun(ref, mine, m, MBS, delay, scaler=use_scaler)
    scaler = fleet.distributed_scaler(paddle.amp.GradScaler(init_loss_scaling=1024.0)) if use_scaler else None
    threads = None
    for step in range(STEPS):
        ids, labels = batch(step, m * MBS, SEQ, VOCAB)
        loss = engine.train_batch([ids, labels], recorder, scaler=scaler)
        if via_fleet:  # no thread starts or stays behind per step (streams: none at all)
            names = sorted(t.name for t in threading.enumerate())
            assert threads is None or names == threads, (threads, names)
            assert way == "threads" or not any(n.startswith("paddle_ext-p2p") for n in names), names
            threads = names
        ref_loss, ref_grads = oracle.step(ids, labels)
        tag = f"pp={pp} vpp={vpp} M={m} step {step}"
        assert_equal(f"{tag} loss", loss.numpy(), ref_loss)
        for key, grad in ref_grads.items():
            assert_equal(f"{tag} grad of {key}", recorder.grads[key], grad)
    for key, value in oracle.params().items():
        assert_equal(f"pp={pp} vpp={vpp} M={m} param {key} after {STEPS} steps", mine[key].numpy(), value)
    ids, labels = batch(STEPS, m * MBS, SEQ, VOCAB)
    eval_loss = engine.eval_batch([ids, labels], compute_loss=True)
    assert_equal(f"pp={pp} vpp={vpp} M={m} eval_batch loss", eval_loss.numpy(), oracle.eval_loss(ids, labels))
    predicted = simulate(engine.schedule(m)).peak_in_flight[stage]
    assert engine.last_step.peak_in_flight <= predicted, (engine.last_step.peak_in_flight, predicted)
    note = ""
    if kind is not None and "zb" in kind:
        note = check_split(engine, stage, m)
    print(f"rank {stage}: pp={pp} vpp={vpp} M={m} delay_scale_loss={delay} scaler={use_scaler}: bitwise equal "
          f"(kind {engine.schedule(m).kind}, peak in flight {engine.last_step.peak_in_flight}, simulated "
          f"{predicted}{note})", flush=True)


def main():
    pp = int(sys.argv[1])
    pairs = []
    for item in sys.argv[2].split(","):
        parts = item.split(":")
        pairs.append((int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else None))
    delay = len(sys.argv) > 3 and sys.argv[3] == "delay_scale"
    use_scaler = len(sys.argv) > 3 and sys.argv[3] == "scaler"
    strategy = fleet.DistributedStrategy()
    pp_configs = {"delay_scale_loss": delay}
    first_kind = pairs[0][2]
    if first_kind is not None:  # the fleet path selects it through the strategy
        mode = {"zb-h1": "ZBH1", "interleaved-zb": "ZBVPP", "1f1b": "1F1B", "interleaved": "VPP"}[first_kind]
        pp_configs["schedule_mode"] = mode
    strategy.pipeline_configs = {"accumulate_steps": pairs[0][1], "micro_batch_size": MBS}
    paddle_ext.enable()  # before fleet.init: the gloo fixes cover its group creation
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": pp, "pp_configs": pp_configs}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    for i, (vpp, m, kind) in enumerate(pairs):
        run_pair(hcg, vpp, m, delay, via_fleet=(i == 0), use_scaler=use_scaler, kind=kind)
    print(f"rank {hcg.get_stage_id()}: all pairs passed", flush=True)


if __name__ == "__main__":
    main()
