"""Zero-bubble schedules (I/W split backward) on gloo against single-process runs.

Four launches, each looping over its configs inside one job (start-up dominates on
2 cores): pp2 and pp4 pipeline_parity over zb-h1 and interleaved-zb (vpp 2), with
M in {pp, pp+1, 2pp+1} and a capped kind (-w<k>) at pp4, the first config through
fleet.distributed_model with pp_configs.schedule_mode; and pp2 x dp2 / pp2 x
sharding2 grad_overlap_parity with the zero-bubble kind (overlap on == off, the
single-process reference, delay_scale_loss, overlap_p2p_comm, a GradScaler, and no
bucket of Linear weights handed over before its chunk's last W). Every config
compares losses, grads and parameters after 3 Adam steps bit for bit, with
tiny_gpt's lm head tied to the embedding.
"""

import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

PAIRS = {2: "1:2:zb-h1,1:3:zb-h1,1:5:zb-h1,2:2:interleaved-zb,2:3:interleaved-zb,2:5:interleaved-zb",
         4: "1:4:zb-h1,1:5:zb-h1,1:9:zb-h1-w2,2:4:interleaved-zb,2:5:interleaved-zb-w1,2:9:interleaved-zb"}
# VPP:M:DELAY:BUCKET_KB:HIDDEN:OPTS (grad_overlap_parity.py); z: zero bubble, p: overlap_p2p_comm
DP2 = "1:2:0:0:16:z,1:3:1:2:16:z,1:5:0:2:16:zp,2:2:1:2:16:z,2:5:0:0:16:z"
SHARDING2 = "1:2:0:0:16:z,1:5:1:2:16:z,2:3:0:2:16:z,2:5:1:0:16:z"


@pytest.mark.parametrize("pp", [2, 4])
def test_zero_bubble_equals_single_process_bitwise(pp):
    result = launch("pipeline_parity.py", str(pp), PAIRS[pp], nproc=pp, timeout=240)
    assert result.returncode == 0, result.describe()
    for rank in range(pp):
        log = result.logs[rank]
        assert f"rank {rank}: all pairs passed" in log, result.describe()
        found = re.findall(rf"rank {rank}: pp={pp} vpp=\d M=\d+ .*: bitwise equal \(kind ([^,]+), .*I's apart from their W",
                           log)
        assert found == [p.split(":")[2] for p in PAIRS[pp].split(",")], result.describe()


@pytest.mark.parametrize("dp, sharding, configs, flags", [(2, 1, DP2, ()), (1, 2, SHARDING2, ("scaler",))])
def test_zero_bubble_with_dp_or_sharding_overlap_equals_reference(dp, sharding, configs, flags):
    result = launch("grad_overlap_parity.py", str(dp), str(sharding), configs, *flags, nproc=4, timeout=200)
    assert result.returncode == 0, result.describe()
    for rank in range(4):
        log = result.logs[rank]
        assert f"rank {rank}: all configs passed" in log, result.describe()
        found = re.findall(rf"rank {rank}: dp={dp} sharding={sharding} .*zero_bubble=True: on == off bitwise; "
                           r"max abs diff to reference 0", log)
        assert len(found) == len(configs.split(",")), result.describe()
