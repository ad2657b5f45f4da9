from __future__ import annotations

import pytest

from paddle_ext.pipeline.schedule import (
    B,
    F,
    Schedule,
    ScheduleArgumentError,
    computes,
    generate,
    lower,
    microbatch_groups,
    validate,
)
from paddle_ext.pipeline.schedule.generate import interleaved_warmup

# Pinned: any change to the generators or to lowering shows up here as a diff.
PINNED_INTERLEAVED_2_2_5 = """\
schedule pp=2 vpp=2 microbatches=5 kind=interleaved
0: F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 B1.0 F0.3 B1.1 F0.4 B1.2 F1.3 B0.0 F1.4 B0.1 B0.2 B1.3 B1.4 B0.3 B0.4
1: F0.0 F0.1 F0.2 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F0.3 B0.0 F0.4 B0.1 F1.3 B0.2 F1.4 B1.3 B1.4 B0.3 B0.4
"""

PINNED_LOWERED_2_2_5 = """\
schedule pp=2 vpp=2 microbatches=5 kind=interleaved
0: F0.0 SA0.0>1 F0.1 RA1.0<1 SA0.1>1 F0.2 RA1.1<1 SA0.2>1 F1.0 SA1.0>1 RA1.2<1 F1.1 SA1.1>1 F1.2 SA1.2>1 RG1.0<1 B1.0 F0.3 SG1.0>1 SA0.3>1 RG1.1<1 B1.1 F0.4 SG1.1>1 SA0.4>1 RG1.2<1 B1.2 RA1.3<1 SG1.2>1 RG0.0<1 F1.3 SA1.3>1 RA1.4<1 B0.0 RG0.1<1 F1.4 SA1.4>1 B0.1 RG0.2<1 B0.2 RG1.3<1 B1.3 SG1.3>1 RG1.4<1 B1.4 RG0.3<1 SG1.4>1 B0.3 RG0.4<1 B0.4
1: RA0.0<0 F0.0 SA0.0>0 RA0.1<0 F0.1 SA0.1>0 RA0.2<0 F0.2 RA1.0<0 SA0.2>0 F1.0 RA1.1<0 B1.0 RA1.2<0 SG1.0>0 F1.1 B1.1 RG0.0<0 RA0.3<0 SG1.1>0 F1.2 B1.2 RG0.1<0 RA0.4<0 SG1.2>0 F0.3 B0.0 SA0.3>0 RG0.2<0 SG0.0>0 F0.4 RA1.3<0 SA0.4>0 B0.1 SG0.1>0 F1.3 RA1.4<0 B0.2 SG0.2>0 F1.4 B1.3 SG1.3>0 B1.4 RG0.3<0 SG1.4>0 B0.3 SG0.3>0 RG0.4<0 B0.4 SG0.4>0
"""


def test_pinned_interleaved_schedule():
    s = generate(2, 2, 5, "interleaved")
    assert s.to_text() == PINNED_INTERLEAVED_2_2_5
    assert lower(s).to_text() == PINNED_LOWERED_2_2_5
    assert Schedule.from_text(PINNED_LOWERED_2_2_5) == lower(s)


def test_classic_1f1b_shape():
    pp, m = 4, 7
    s = generate(pp, 1, m, "1f1b")
    for r, acts in enumerate(s.ranks):
        warm = pp - r - 1
        assert acts[:warm] == tuple(F(0, i) for i in range(warm))
        steady = acts[warm: warm + 2 * (m - warm)]
        assert steady[0::2] == tuple(F(0, i) for i in range(warm, m))
        assert steady[1::2] == tuple(B(0, i) for i in range(m - warm))
        assert acts[warm + 2 * (m - warm):] == tuple(B(0, i) for i in range(m - warm, m))


def test_interleaved_with_one_virtual_stage_is_1f1b():
    for pp, m in [(2, 2), (3, 7), (8, 20)]:
        assert generate(pp, 1, m, "interleaved").ranks == generate(pp, 1, m, "1f1b").ranks


def test_fthenb_runs_all_forwards_first():
    s = generate(3, 2, 4, "fthenb")
    for acts in s.ranks:
        kinds = "".join(type(a).__name__ for a in acts)
        assert kinds == "F" * 8 + "B" * 8
        assert acts[8:12] == tuple(B(1, m) for m in range(4))  # last chunk's B first


@pytest.mark.parametrize("pp, m, sizes", [
    (4, 4, [4]), (4, 8, [4, 4]), (4, 5, [5]), (4, 7, [7]), (4, 10, [6, 4]), (2, 7, [3, 2, 2]),
    (3, 100, [4] + [3] * 32),
])
def test_microbatch_groups_follow_upstream_58383(pp, m, sizes):
    groups = microbatch_groups(pp, m)
    assert [len(g) for g in groups] == sizes
    assert [i for g in groups for i in g] == list(range(m))


def test_interleaved_group_order():
    # pp=4, M=10: the first group is 6 micro-batches, then 4; chunks walk together.
    s = generate(4, 2, 10, "interleaved")
    fwd = [a for a in s.ranks[3] if isinstance(a, F)]
    expected = ([F(0, m) for m in range(6)] + [F(1, m) for m in range(6)]
                + [F(0, m) for m in range(6, 10)] + [F(1, m) for m in range(6, 10)])
    assert fwd == expected
    bwd = [a for a in s.ranks[3] if isinstance(a, B)]
    assert bwd[:6] == [B(1, m) for m in range(6)] and bwd[6:12] == [B(0, m) for m in range(6)]


def test_interleaved_warmup_counts():
    # Megatron: 2*(pp-r-1) + (vpp-1)*first_group, capped at vpp*M.
    assert [interleaved_warmup(4, 2, 8, r) for r in range(4)] == [10, 8, 6, 4]
    assert [interleaved_warmup(4, 2, 10, r) for r in range(4)] == [12, 10, 8, 6]
    assert [interleaved_warmup(4, 2, 4, r) for r in range(4)] == [8, 8, 6, 4]
    s = generate(4, 2, 8, "interleaved")
    for r, acts in enumerate(s.ranks):
        first_b = next(i for i, a in enumerate(acts) if isinstance(a, B))
        assert first_b == interleaved_warmup(4, 2, 8, r) + 1  # warm-up, then one F first


@pytest.mark.parametrize("args, name, text", [
    ((1, 1, 4, "1f1b"), "pp", "pp = 1 is not allowed: must be an integer >= 2"),
    ((4, 0, 4, "interleaved"), "vpp", "vpp = 0 is not allowed: must be an integer >= 1"),
    ((4, 2, 3, "interleaved"), "microbatches",
     "microbatches = 3 is not allowed: must be an integer >= pp (= 4) with virtual stages"),
    ((4, 1, 0, "1f1b"), "microbatches", "microbatches = 0 is not allowed: must be an integer >= 1"),
    ((4, 2, 8, "gpipe"), "kind", "kind = 'gpipe' is not allowed: must be one of fthenb, 1f1b"),
    ((4, 2, 8, "1f1b"), "vpp", "vpp = 2 is not allowed: kind 1f1b needs 1"),
    ((4, 2.0, 8, "interleaved"), "vpp", "vpp = 2.0 is not allowed"),
])
def test_argument_errors_name_the_argument(args, name, text):
    with pytest.raises(ScheduleArgumentError) as info:
        generate(*args)
    assert info.value.name == name
    assert text in str(info.value)


def test_kind_spellings():
    assert generate(2, 1, 2, "1F1B").kind == "1f1b"
    assert generate(2, 1, 2, "FThenB").kind == "fthenb"
    assert generate(2, 2, 2, "VPP").kind == "interleaved"


@pytest.mark.parametrize("kind", ["1f1b", "fthenb", "1f1b-overlap", "zb-h1", "zb-h1-w1"])
@pytest.mark.parametrize("pp, m", [(2, 1), (4, 1), (4, 3)])
def test_one_virtual_stage_takes_fewer_micro_batches_than_stages(kind, pp, m):
    """fleet's PipelineParallel runs 1F1B with any accumulate_steps >= 1 (its warm-up is
    min(pp - r - 1, M)); so does every one-chunk kind here."""
    s = generate(pp, 1, m, kind)
    result = validate(lower(s))
    for acts in s.ranks:
        done = sorted((type(p).__name__, p.mb) for a in acts for p in computes(a))
        want = sorted((name, mb) for mb in range(m)
                      for name in (("F", "I", "W") if kind.startswith("zb") else ("F", "B")))
        assert done == want, (kind, acts)
    if kind == "1f1b":  # rank r's warm-up: min(pp - r - 1, M) forwards, then one more F if any is left
        for r, acts in enumerate(s.ranks):
            first_b = next(i for i, a in enumerate(acts) if isinstance(a, B))
            assert first_b == min(m, pp - r), (r, acts)
    assert result.makespan > 0
