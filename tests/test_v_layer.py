"""paddle_ext.pipeline.v_layer's single-process parts: the V's stage-to-rank map and the
refusals naming their argument (the layers themselves: tests/multiproc/test_vshape.py)."""

import pytest

from paddle_ext import compat, upstream
from paddle_ext.pipeline.v_layer import (
    local_shared_layer_desc_class,
    v_pipeline_layer,
    v_segmented,
    v_stage_of,
)


@pytest.mark.parametrize("pp,want", [(2, [0, 1, 1, 0]), (4, [0, 1, 2, 3, 3, 2, 1, 0])])
def test_rank_r_holds_stages_r_and_2pp_minus_1_minus_r(pp, want):
    assert [v_stage_of(s, pp) for s in range(2 * pp)] == want


def test_stage_out_of_range_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"stage = 4 is out of range: the V has stages 0 \.\. 3 at pp = 2"):
        v_stage_of(4, 2)


def test_v_segmented_takes_only_pipeline_layer_classes():
    with pytest.raises(TypeError, match="v_segmented: cls = <class 'int'> is not a PipelineLayer subclass"):
        v_segmented(int)
    class MyPipe(upstream.pipeline_layer_class()):
        pass

    made = v_segmented(MyPipe)
    assert made.__name__ == "MyPipeV" and issubclass(made, MyPipe) and made._paddle_ext_v
    assert made.__mro__.index(v_segmented(upstream.pipeline_layer_class())) < made.__mro__.index(
        upstream.pipeline_layer_class())  # the V's segmentation comes before Paddle's
    assert v_segmented(made) is made


def test_local_shared_layer_desc_is_paddles_where_it_has_one():
    upstream = compat.upstream_local_shared_layer_desc_class()
    cls = local_shared_layer_desc_class()
    assert cls is upstream if upstream is not None else cls.__name__ == "LocalSharedLayerDesc"


@pytest.mark.skipif(compat.pipeline_layer_supports_v(), reason="this Paddle has use_dualpipev")
def test_native_v_refused_where_paddle_has_none():
    with pytest.raises(ValueError, match="native = True: this Paddle's PipelineLayer has no use_dualpipev"):
        v_pipeline_layer([], native=True)
