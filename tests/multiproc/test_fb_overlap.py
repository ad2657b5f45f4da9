"""The forward/backward overlap scheduler and asynchronous p2p on gloo.

Each launch loops over its configurations inside the ranks (scripts/fb_overlap_parity.py):
pp in {2, 4} x vpp in {1, 2} x balanced and unbalanced M, without and with a GradScaler
(and delay_scale_loss for pp=2): the overlap scheduler's losses, grads and parameters
equal the plain engine's and a single-process run's bit for bit; a model without
overlapped_forward_backward gives the same with one warning; with overlap_p2p_comm the
recorded events show the activation receives posted before the compute ahead of their
consumer finished.
"""

import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

CASES = {
    2: ("1:4,1:5,2:4,2:5,2:5d", "plain,overlap,async,nomethod"),
    4: ("1:8,1:5,2:8,2:5,1:3", "plain,overlap,async"),  # 1:3: M < pp, as fleet's 1F1B takes it
}


@pytest.mark.parametrize("pp", [2, 4])
def test_overlap_scheduler_equals_plain_and_single_process_bitwise(pp):
    pairs, modes = CASES[pp]
    result = launch("fb_overlap_parity.py", str(pp), pairs, modes, nproc=pp, timeout=240)
    assert result.returncode == 0, result.describe()
    for rank in range(pp):
        log = result.logs[rank]
        assert f"rank {rank}: all configurations passed" in log, result.describe()
        for item in pairs.split(","):
            vpp, m = item.split(":")
            tag = f"pp={pp} vpp={vpp} M={m.rstrip('d')}"
            for scaler in ("False", "True"):
                assert f"{tag} scaler={scaler}" in log and "overlap bitwise equal to plain" in log
            assert len(re.findall(rf"{re.escape(tag)} scaler=False.* async.*: bitwise equal", log)) >= 1
        # async: the trace check ran for every pair (rank 0 of 1F1B receives no activations)
        traces = re.findall(r"async trace: (\d+) of (\d+) activation receives posted before", log)
        one_chunk = sum(item.startswith("1:") for item in pairs.split(","))
        assert len(traces) >= (len(pairs.split(",")) - (one_chunk if rank == 0 else 0)), log[-3000:]
        assert all(2 * int(a) >= int(b) for a, b in traces), traces
    log0 = result.logs[0]
    assert "(via fleet, pp_configs 'forward_backward_overlap_scheduler enable_overlap_p2p_comm')" in log0
    if "nomethod" in modes:
        assert "nomethod: one warning: pp_configs.forward_backward_overlap_scheduler is on but PipelineLayer" in log0


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_failing_rank_with_overlapped_transfers_ends_every_rank(where):
    result = launch("pipeline_failure.py", "2", "1", where, "async", nproc=2, timeout=120)
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert result.elapsed < 60, result.describe()
    assert f"injected failure in {where}" in result.logs[1]
    match = re.search(r"pipeline rank 1: action (F0\.\d(?:&B0\.\d)?|B0\.\d) \(position (\d+) of (\d+)",
                      result.logs[1])
    assert match, result.describe()
    # rank 0 ends either on its own broken transfer or, first, through the comm watchdog,
    # which names rank 1's failure and the transfer rank 0 waits in
    own = re.search(r"pipeline rank 0: action \S+ \(position \d+ of \d+", result.logs[0])
    told = re.search(r"\[rank 0\]   rank 0: waits in recv(?: #\d+)? from rank 1 .*\n\[rank 0\]   rank 1: failed: "
                     rf"PipelineStepError: .*injected failure in {where}", result.logs[0])
    assert own or told, result.describe()
    assert "finished without failure" not in result.all_text()
