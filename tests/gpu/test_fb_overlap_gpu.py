"""The forward/backward overlap scheduler on GPUs: the prepared device check (not run in CI).

- one GPU: the F&B step itself. For M micro-batch pairs of examples/overlap_gpt.py's
  chunk (attention and MLP nodes), time "F, then B" against the model's
  overlapped_forward_backward (nodes interleaved) and check both leave the same
  gradients. With one stream the interleaving cannot make kernels run concurrently, so
  expect about equal times: the gain comes from communication (an MoE all-to-all, a
  p2p) hidden behind the other half, which this model does not have.
- two or more GPUs: bench/fb_overlap.py with NCCL (pp=2): one step's time for plain,
  overlap and overlap+async, next to the simulator's prediction, and the three runs'
  losses, which must be equal.

The whole module is skipped unless Paddle is a CUDA build that sees a device.
    python -m pytest -q -s tests/gpu/test_fb_overlap_gpu.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gpu_count() -> tuple[int, str]:
    try:
        import paddle
    except ImportError as err:
        return 0, f"paddle is not importable ({err})"
    if not paddle.is_compiled_with_cuda():
        return 0, f"Paddle {paddle.__version__} is not a CUDA build"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as err:  # a GPU build on a machine without a driver
        return 0, f"no GPU device ({err})"
    return count, "no GPU device"


GPUS, _REASON = _gpu_count()
if GPUS < 1:
    pytest.skip(f"GPU check of the overlap scheduler: {_REASON}", allow_module_level=True)

pytestmark = pytest.mark.gpu


def _sync():
    import paddle

    paddle.device.cuda.synchronize()


def test_one_overlapped_pair_against_forward_then_backward_on_one_gpu():
    import paddle

    from examples.overlap_gpt import OverlapGPT, Reference
    from examples.tiny_gpt import pattern_batch
    from paddle_ext.pipeline.nodes import ScheduleChunk

    paddle.set_device("gpu:0")
    vocab, hidden, seq, mbs, m, blocks = 4096, 1024, 512, 4, 8, 4
    results = {}
    for mode in ("sequential", "overlapped"):
        paddle.seed(0)
        model = Reference(vocab, hidden, seq, blocks=blocks, heads=8)
        ids, labels = pattern_batch(0, m * mbs, seq, vocab)

        def chunk(model=model):
            return ScheduleChunk([model.embed.build_schedule_node()]
                                 + [b.build_schedule_node() for b in model.blocks]
                                 + [model.head.build_schedule_node()])

        def loss_node(i, model=model, labels=labels):
            node = model.loss_fn.build_schedule_node()
            node.labels, node.scale_loss_factor = labels[i * mbs:(i + 1) * mbs], m
            return node

        times = []
        for _ in range(3):
            model.clear_gradients()
            _sync()
            start = time.perf_counter()
            c0, l0 = chunk(), loss_node(0)  # micro-batch 0's forward opens the pipe
            l0.forward(c0.forward(ids[:mbs]))
            prev = (c0, l0)
            for i in range(1, m):
                c, ln = chunk(), loss_node(i)
                x = ids[i * mbs:(i + 1) * mbs]
                if mode == "sequential":
                    ln.forward(c.forward(x))
                    prev[0].backward(prev[1].backward())
                else:
                    OverlapGPT.overlapped_forward_backward(None, c, x, ln, prev[0], prev[1], None, None)
                prev = (c, ln)
            prev[0].backward(prev[1].backward())
            _sync()
            times.append(time.perf_counter() - start)
        results[mode] = (statistics.median(times[1:]),
                         {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None})
    (t_seq, g_seq), (t_ovl, g_ovl) = results["sequential"], results["overlapped"]
    worst = max(float(np.max(np.abs(g_seq[k] - g_ovl[k]))) for k in g_seq)
    print(f"\none GPU, {m} micro-batches x {blocks} blocks (hidden {hidden}, seq {seq}): "
          f"F then B {t_seq * 1e3:.1f} ms, overlapped F&B {t_ovl * 1e3:.1f} ms "
          f"(ratio {t_ovl / t_seq:.2f}); grads max abs diff {worst:.3g}")
    assert g_seq.keys() == g_ovl.keys()
    for k in g_seq:
        np.testing.assert_allclose(g_ovl[k], g_seq[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.skipif(GPUS < 2, reason="the NCCL pipeline check needs two GPUs (pp=2)")
def test_pipeline_step_with_and_without_overlap_on_nccl():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fb_overlap.py"), "--gpus", "0,1",
                          "--hidden", "1024", "--seq", "512", "--heads", "8", "--steps", "5"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(out.stdout[-3000:], out.stderr[-3000:])
    assert out.returncode == 0
    assert "GPUs 0,1, NCCL" in out.stdout and "(equal)" in out.stdout
    assert "overlap+async" in out.stdout
