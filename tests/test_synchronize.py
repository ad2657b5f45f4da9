"""Unit device_synchronize: synchronize returns for the host on a CPU build; every other
device keeps Paddle's answer, and disable() puts Paddle's functions back."""

import paddle
import pytest

import paddle_ext
from paddle_ext import devices
from paddle_ext.patches import device_synchronize

pytestmark = [pytest.mark.skipif(devices.device_build() != "cpu", reason="the unit applies to CPU builds only"),
              pytest.mark.usefixtures("clean_series")]


def stock_error(call):
    """The exception stock Paddle raises for `call` (None: it returns)."""
    paddle_ext.disable()
    try:
        call()
    except Exception as err:  # noqa: BLE001 - any type is compared below
        return type(err), str(err)
    return None


def test_stock_paddle_refuses_the_host():
    assert stock_error(lambda: paddle.device.synchronize())[0] is TypeError
    assert "device should be gpu, xpu" in stock_error(lambda: paddle.device.synchronize())[1]
    assert stock_error(lambda: paddle.device.cuda.synchronize())[0] is RuntimeError


@pytest.mark.parametrize("device", [None, "cpu", "CPU", paddle.CPUPlace(), "current-place-object"])
def test_device_synchronize_returns_for_the_host(device):
    if device == "current-place-object":
        device = devices.current_expected_place()
    paddle_ext.enable()
    x = paddle.ones([4]) * 3  # work issued just before
    assert paddle.device.synchronize(device) is None
    assert float(x.sum()) == 12.0


def test_cuda_synchronize_returns_for_the_current_host_device():
    paddle_ext.enable()
    assert paddle.device.cuda.synchronize() is None


@pytest.mark.parametrize("module, device", [
    ("device", "gpu:0"), ("device", 0), ("device", "xpu"), ("device", "cpu:0"),
    ("cuda", 0), ("cuda", "gpu"), ("cuda", "cpu"), ("cuda", paddle.CPUPlace()), ("cuda", 1.5),
])
def test_other_devices_keep_paddles_error(module, device):
    owner = paddle.device if module == "device" else paddle.device.cuda
    expected = stock_error(lambda: owner.synchronize(device))
    assert expected is not None
    paddle_ext.enable()
    with pytest.raises(expected[0]) as err:
        owner.synchronize(device)
    assert str(err.value) == expected[1]


def test_paddle_cuda_synchronize_reaches_it_on_3x():
    if not hasattr(paddle, "cuda") or not hasattr(paddle.cuda, "synchronize"):
        pytest.skip("this Paddle has no paddle.cuda.synchronize")
    paddle_ext.enable()
    assert paddle.cuda.synchronize() is None


def test_enable_disable_restores_paddles_functions():
    originals = [owner.synchronize for owner in device_synchronize.owners()]
    paddle_ext.enable()
    table = {unit: status for unit, _, status, _ in paddle_ext.patch_table()}
    assert table["device_synchronize"] == "applied"
    assert all(owner.synchronize is not f for owner, f in zip(device_synchronize.owners(), originals))
    assert paddle.device.synchronize.__name__ == "synchronize"
    assert paddle.device.synchronize.__doc__ == originals[0].__doc__
    paddle_ext.enable({"paddle_ext": {"patches": {"device_synchronize": False}}})
    assert all(owner.synchronize is f for owner, f in zip(device_synchronize.owners(), originals))
    with pytest.raises(TypeError, match="device should be gpu, xpu"):
        paddle.device.synchronize()
    paddle_ext.enable()
    paddle_ext.disable()
    assert all(owner.synchronize is f for owner, f in zip(device_synchronize.owners(), originals))
