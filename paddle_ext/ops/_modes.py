"""An op call in each mode Paddle runs it in: eagerly, into a PIR program, or into a legacy
static program (2.6, or 3.x with FLAGS_enable_pir_api off), and what each mode needs.
The same in every supported release."""

from __future__ import annotations

from typing import Any

from paddle_ext import compat


def in_dynamic_mode() -> bool:
    import paddle

    return paddle.in_dynamic_mode()


def in_pir_mode() -> bool:
    """Whether a static program is being built in PIR (3.x's default; 2.6.2 has the same
    paddle.framework.in_pir_mode, true only with FLAGS_enable_pir_api on)."""
    import paddle

    return bool(paddle.framework.in_pir_mode())


def is_tensor(value: Any) -> bool:
    """A paddle.Tensor, or a static program's variable (a legacy Variable or a PIR
    Value): what an op function may take in each mode."""
    import paddle

    if isinstance(value, paddle.Tensor):
        return True
    from paddle.base.framework import Variable

    if isinstance(value, Variable):
        return True
    return isinstance(value, paddle.pir.Value)  # paddle.pir.Value: 2.6.2 and 3.x


def _append_custom_op(op_name: str, args: tuple) -> list:
    """A custom op appended to the legacy static program being built (2.6, or 3.x
    with FLAGS_enable_pir_api off), as Paddle's generated op functions do: inputs
    and attributes by the names the op registered; None leaves an optional input out."""
    from paddle.base.layer_helper import LayerHelper
    from paddle.utils.cpp_extension.extension_utils import parse_op_info

    in_names, attr_names, out_names = parse_op_info(op_name)
    if len(args) != len(in_names) + len(attr_names):
        raise TypeError(f"{op_name} takes {len(in_names)} inputs and {len(attr_names)} attributes, "
                        f"got {len(args)} arguments")
    inputs = {name: arg for name, arg in zip(in_names, args) if arg is not None}
    attrs = dict(zip(attr_names, args[len(in_names):]))
    helper = LayerHelper(op_name)
    # The dtype is a placeholder: the op's InferDtype sets each output's when appended.
    outputs = {name: helper.create_variable(dtype="float32") for name in out_names}
    helper.append_op(type=op_name, inputs=inputs, outputs=outputs, attrs=attrs)
    return [outputs[name] for name in out_names]


def run_custom_op_any_mode(op_name: str, *args: Any) -> list:
    """run_custom_op in every mode: eagerly, into a PIR program (3.x's runner takes
    PIR values as its generated op functions do) or into a legacy static program."""
    if in_dynamic_mode() or in_pir_mode():
        return compat.run_custom_op(op_name, *args)
    return _append_custom_op(op_name, args)


def legacy_static_grad_inputs(*tensors: Any) -> tuple:
    """The tensors a custom op with one gradient per input (flash attention's q, k, v)
    should take. In a legacy static program (2.6, or 3.x with FLAGS_enable_pir_api off),
    when some of them have stop_gradient=True and others not, Paddle's backward leaves the
    frozen ones' gradients out of the grad op, and its custom-op shape inference (our
    InferShapeFn or its default) fails on the missing output ("The iutput(Q@GRAD) should
    hold only one element, but now it holds 0 elements"). So each frozen one goes in
    as a copy (paddle.assign) that wants a gradient: the grad op then has all its outputs,
    and the copy's gradient stops there, since the copied variable wants none. Eager mode,
    PIR programs and calls with no mix: the tensors as they are."""
    if in_dynamic_mode() or in_pir_mode():
        return tensors
    flags = [bool(t.stop_gradient) for t in tensors]
    if all(flags) or not any(flags):
        return tensors
    import paddle

    out = []
    for t, frozen in zip(tensors, flags):
        if frozen:
            t = paddle.assign(t)
            t.stop_gradient = False
        out.append(t)
    return tuple(out)
