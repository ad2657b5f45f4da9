"""Rank script: the forward/backward overlap scheduler against plain runs, bit for bit.

For each VPP:M pair, without and with an AMP GradScaler, every rank trains
examples/overlap_gpt.py for STEPS Adam steps in several ways and compares this
rank's losses, parameter grads (every step) and parameters (at the end):

  ref      the same model in this one process (micro-batches in order)
  plain    the pipeline engine without the overlap scheduler
  overlap  forward_backward_overlap_scheduler: F&B steps through the model's
           overlapped_forward_backward (attention/MLP nodes interleaved)
  async    overlap + overlap_p2p_comm: transfers on a communication thread; the
           step's recorded events must show activation receives posted before the
           compute ahead of their consumer had finished
  nomethod the flag on, a PipelineLayer without overlapped_forward_backward: one
           warning, each F&B as F then B

plain and overlap must equal ref, and overlap must equal plain directly. The first
run of the launch goes through fleet.distributed_model with pp_configs given as a
PaddleNLP pipeline_parallel_config string.

Usage: fb_overlap_parity.py PP VPP:M[,VPP:M...] MODE[,MODE...]
       (VPP:Md: with delay_scale_loss; MODE: plain, overlap, async, nomethod; the
       GradScaler runs only plain and overlap)
"""

import sys
import warnings

import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from _parity import GradRecorder, ReferenceRun, assert_equal, stage_params  # noqa: E402

import paddle_ext  # noqa: E402
from examples.overlap_gpt import Reference, TiedEmbedding, overlap_model  # noqa: E402
from examples.tiny_gpt import batch  # noqa: E402
from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings  # noqa: E402
from paddle_ext.pipeline.runtime.async_p2p import received_before  # noqa: E402
from paddle_ext.pipeline.schedule import FB, overlap_pairs, simulate  # noqa: E402

VOCAB, HIDDEN, SEQ, MBS, STEPS = 32, 16, 8, 2, 2
NLP_CONFIG = "forward_backward_overlap_scheduler enable_overlap_p2p_comm"


def reference_run(keys, blocks, m, delay, use_scaler):
    """Per step (loss, {key: grad}) and the final {key: param} of the single-process run."""
    paddle.seed(0)
    oracle = ReferenceRun(Reference(VOCAB, HIDDEN, SEQ, blocks=blocks), keys, m, MBS, delay, scaler=use_scaler)
    steps = [oracle.step(*batch(step, m * MBS, SEQ, VOCAB)) for step in range(STEPS)]
    return steps, oracle.params()


def pipeline_run(hcg, vpp, m, mode, delay, use_scaler, via_fleet):
    """Trains STEPS steps; returns (steps like reference_run, final params, engine, warnings)."""
    pp, stage = hcg.get_pipe_parallel_world_size(), hcg.get_stage_id()
    paddle.seed(0)
    model = overlap_model(VOCAB, HIDDEN, SEQ, blocks=pp * vpp, pp=pp, vpp=vpp, overlapped=mode != "nomethod")
    mine = stage_params(model, stage, TiedEmbedding)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if via_fleet:
            engine = fleet.distributed_model(model)
            assert isinstance(engine, PipelineEngine), type(engine)
            assert engine.settings.fb_overlap and engine.settings.overlap_p2p, engine.settings
            opt = fleet.distributed_optimizer(paddle.optimizer.Adam(1e-2, parameters=model.parameters()))
        else:
            settings = PipelineSettings(m, MBS, delay_scale_loss=delay, fb_overlap=mode != "plain",
                                        overlap_p2p=mode == "async")
            engine = PipelineEngine(model, hcg, settings)
            opt = paddle.optimizer.Adam(1e-2, parameters=model.parameters())
        recorder = GradRecorder(opt, mine)
        scaler = fleet.distributed_scaler(paddle.amp.GradScaler(init_loss_scaling=1024.0)) if use_scaler else None
        # Paddle's numbered user hooks: once per forward and backward, an F&B step's included
        fired = {"f": [], "b": []}
        for k in range(vpp * m):
            engine.register_forward_pipeline_parallel_hook(k, fired["f"].append)
            engine.register_backward_pipeline_parallel_hook(k, fired["b"].append)
        steps = []
        for step in range(STEPS):
            ids, labels = batch(step, m * MBS, SEQ, VOCAB)
            loss = engine.train_batch([ids, labels], recorder, scaler=scaler)
            steps.append((loss.numpy(), recorder.grads))
            assert fired == {"f": list(range(vpp * m)), "b": list(range(vpp * m))}, (mode, fired)
            fired["f"].clear()
            fired["b"].clear()
    ours = [w for w in caught if "forward_backward_overlap_scheduler" in str(w.message)]
    return steps, {k: p.numpy().copy() for k, p in mine.items()}, engine, ours


def compare(tag, a, b):
    (steps_a, params_a), (steps_b, params_b) = a, b
    for step, ((loss_a, grads_a), (loss_b, grads_b)) in enumerate(zip(steps_a, steps_b)):
        assert_equal(f"{tag} step {step} loss", loss_a, loss_b, "differs")
        for key in grads_b:
            assert_equal(f"{tag} step {step} grad of {key}", grads_a[key], grads_b[key], "differs")
    for key in params_b:
        assert_equal(f"{tag} param {key} after {STEPS} steps", params_a[key], params_b[key], "differs")


def check_async_trace(engine, stage, say):
    """The step's events: activation receives posted before the compute ahead of their
    consumer ended (the receive overlapped that compute)."""
    rows = received_before(engine.last_step.spans)
    early = [r for r in rows if r[1] < r[2]]
    if stage == 0 and engine.vpp == 1:
        assert not rows, rows  # the first stage of 1F1B receives no activations
        return
    assert rows, "no activation receives recorded"
    # Each receive is posted once its link's previous transfer is done, normally well
    # before: at least half of them (on a loaded machine a thread can be late).
    assert early and 2 * len(early) >= len(rows), \
        f"only {len(early)} of {len(rows)} receives were posted before the compute ahead of their consumer ended: {rows}"
    lead = sorted(r[2] - r[1] for r in early)
    say(f"async trace: {len(early)} of {len(rows)} activation receives posted before the compute "
        f"ahead of their consumer ended (median lead {lead[len(lead) // 2] * 1e3:.2f} ms), "
        f"e.g. {early[0][0]} posted {(early[0][2] - early[0][1]) * 1e3:.2f} ms before")


def main():
    pp = int(sys.argv[1])
    pairs = []
    for item in sys.argv[2].split(","):  # "V:M", or "V:Md" for delay_scale_loss
        vpp, m = item.split(":")
        pairs.append((int(vpp), int(m.rstrip("d")), m.endswith("d")))
    modes = sys.argv[3].split(",")
    strategy = fleet.DistributedStrategy()
    paddle_ext.enable()  # before fleet.init; also makes the PaddleNLP string a valid pp_configs
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": pp, "pp_configs": NLP_CONFIG}
    strategy.pipeline_configs = {"accumulate_steps": pairs[0][1], "micro_batch_size": MBS}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    stage = hcg.get_stage_id()

    def say(text):
        print(f"rank {stage}: {text}", flush=True)

    first = True
    for vpp, m, delay in pairs:
        for use_scaler in (False, True):
            tag = f"pp={pp} vpp={vpp} M={m} scaler={use_scaler}" + (" delay_scale_loss" if delay else "")
            runs = {}
            keys = None
            for mode in modes:
                if use_scaler and mode not in ("plain", "overlap"):
                    continue
                via_fleet = first and mode == "async" and not delay
                steps, params, engine, ours = pipeline_run(hcg, vpp, m, mode, delay, use_scaler, via_fleet)
                first = first and not via_fleet
                if keys is None:
                    keys = list(params)
                    ref = reference_run(keys, pp * vpp, m, delay, use_scaler)
                compare(f"{tag} {mode} vs single process", (steps, params), ref)
                runs[mode] = (steps, params)
                sched = engine.schedule(m)
                pairs_here = overlap_pairs(sched)[stage]
                if mode == "plain":
                    assert not any(isinstance(a, FB) for a in sched.ranks[stage]), sched.kind
                else:
                    assert sched.kind.endswith("-overlap"), sched.kind
                    predicted = simulate(sched).peak_in_flight[stage]
                    assert engine.last_step.peak_in_flight <= predicted, (engine.last_step.peak_in_flight, predicted)
                if mode == "nomethod":
                    assert len(ours) == 1, [str(w.message) for w in ours]
                    say(f"{tag} nomethod: one warning: {ours[0].message}")
                else:
                    assert not ours, [str(w.message) for w in ours]
                if mode == "async":
                    check_async_trace(engine, stage, say)
                say(f"{tag} {mode}{' (via fleet, pp_configs ' + repr(NLP_CONFIG) + ')' if via_fleet else ''}: "
                    f"bitwise equal to the single-process run ({pairs_here} F&B steps on this rank)")
            if "plain" in runs and "overlap" in runs:
                compare(f"{tag} overlap vs plain", runs["overlap"], runs["plain"])
                say(f"{tag}: overlap bitwise equal to plain")
    dist.barrier()
    say("all configurations passed")


if __name__ == "__main__":
    main()
