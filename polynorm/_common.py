"""Argument checks and autograd wiring shared by every polynorm op (C++/CUDA and Triton).

PolyNorm: Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884.
"""

import math
import numbers

import torch
from torch import Tensor

try:
    import numpy as np
except ImportError:  # NumPy is optional: without it, eps is a Python number or a tensor
    np = None

__all__ = [
    "check_backward_args",
    "check_eps",
    "check_forward_args",
    "check_grouped_backward_args",
    "check_grouped_forward_args",
    "check_mul_backward_args",
    "check_mul_forward_args",
    "check_hidden_size",
    "check_sharded_backward_apply_args",
    "check_sharded_backward_stats_args",
    "check_sharded_forward_apply_args",
    "check_sharded_forward_stats_args",
    "check_sharded_params",
    "eps_operand",
    "param_grads",
    "refuse_double_backward",
    "register_autograd",
    "register_mul_autograd",
    "rstd_dtype",
    "save_param_meta",
    "saveable",
]


def rstd_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """dtype of the rstd cache and of every accumulator: fp64 for fp64 x, fp32 otherwise."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_OFFSET_DTYPES = (torch.int32, torch.int64)


def _check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: expected {name} to be a Tensor, got {type(t).__name__}")


def _check_float(op: str, name: str, t: Tensor) -> None:
    _check_tensor(op, name, t)
    if t.dtype not in _FLOATS:
        raise RuntimeError(f"{op}: expected {name} to be float32, float64, float16 or bfloat16, got {t.dtype}")


def _check_same_device(op: str, x: Tensor, **others: Tensor) -> None:
    # The fake kernels also run when one argument is on the meta device and x is not
    # (the dispatcher picks Meta); without this check that returned garbage CPU tensors.
    for name, t in others.items():
        if t.device != x.device:
            raise RuntimeError(f"{op}: expected {name} on x's device {x.device}, got {t.device}")


def _describe(eps) -> str:
    if isinstance(eps, Tensor):
        return f"a tensor of shape {list(eps.shape)} and dtype {eps.dtype}"
    if np is not None and isinstance(eps, np.ndarray):
        return f"a NumPy array of shape {list(eps.shape)} and dtype {eps.dtype}"
    return type(eps).__name__


def _is_real_scalar(eps) -> bool:
    """A real number: a Python or NumPy int or float, a symbolic one, or a one-element real
    tensor or NumPy array. Never a bool (Python, NumPy or tensor), which is no eps."""
    if isinstance(eps, (bool, torch.SymBool)):
        return False
    if isinstance(eps, Tensor):
        return eps.numel() == 1 and not eps.is_complex() and eps.dtype != torch.bool
    if np is not None and isinstance(eps, np.ndarray):
        return eps.size == 1 and eps.dtype.kind in "iuf"
    # NumPy's bool_ is not a numbers.Real; its ints and floats are.
    return isinstance(eps, (numbers.Real, torch.SymFloat, torch.SymInt))


def _check_eps_value(op: str, value) -> None:
    # Comparisons rather than math.isfinite, which Dynamo cannot trace on a symbolic float
    # (an eps argument of a compiled function); NaN fails both. A symbolic float with a hint
    # (dynamic=True) gets a guard. A tensor eps under torch.compile never comes here: its
    # value is checked when the graph runs (polynorm::forward_tensor_eps, checked_eps).
    if not (value >= 0 and value < math.inf):
        raise ValueError(f"{op}: expected eps to be finite and >= 0, got {value}")


def check_eps(op: str, eps) -> float:
    """eps as a Python float, checked as the C++ op checks it.

    Accepts any real scalar: a Python or NumPy int or float, or a one-element real tensor
    or NumPy array. (Under torch.compile, poly_norm keeps a tensor eps a tensor and checks
    it when the graph runs: :func:`eps_operand`.)

    Raises:
        TypeError: eps not a real number (a bool, a string, a complex number, a tensor of
            several elements or of dtype bool).
        ValueError: eps negative, NaN or infinite.
    """
    if not _is_real_scalar(eps):
        raise TypeError(f"{op}: expected eps to be a real number, got {_describe(eps)}")
    value = eps if isinstance(eps, torch.SymFloat) else float(eps)
    _check_eps_value(op, value)
    return value


def eps_operand(op: str, eps):
    """eps as the kernel backends take it: a Python float, or a 0-d tensor under torch.compile.

    Eagerly every real scalar becomes a float (:func:`check_eps`). Under torch.compile a
    tensor eps, or a NumPy scalar, which Dynamo turns into a 0-d tensor, is a graph input
    whose value the trace cannot see: it stays a tensor, for an op that reads and checks it
    when the graph runs (``polynorm::forward_tensor_eps``). Python floats are unchanged.

    Raises:
        TypeError, ValueError: as :func:`check_eps` (a tensor eps's value under
            torch.compile: when the graph runs).
    """
    is_array = isinstance(eps, Tensor) or (np is not None and isinstance(eps, np.ndarray))
    if is_array and torch.compiler.is_compiling():
        t = torch.as_tensor(eps)
        if not _is_real_scalar(t):
            raise TypeError(f"{op}: expected eps to be a real number, got {_describe(t)}")
        return t.reshape(())
    return check_eps(op, eps)


def _require(cond, message, traced: bool) -> None:
    # torch._check keeps symbolic shapes unspecialised in the fake kernels; Dynamo cannot
    # trace its message closures, so code it traces branches instead (a guard at most). A
    # plain True (every concrete check that holds) needs neither: ~3 us saved per call.
    if cond is True:
        return
    if traced:
        if not cond:
            raise RuntimeError(message())
    else:
        torch._check(cond, message)


# The checks below are those of csrc/ops.cpp, with its messages, in its order: x, then
# the parameters, then the tensors that must be like x (grad_y / grad_out, mul), then rstd. Each
# names the op and the argument, with the expected and the actual value.


def _check_x(op: str, x: Tensor, traced: bool) -> None:
    # x: (..., H) of a float dtype, H >= 1.
    _check_float(op, "x", x)
    _require(x.dim() >= 1, lambda: f"{op}: expected x to have at least 1 dimension (..., H), got a 0-d tensor", traced)
    _require(x.shape[-1] >= 1, lambda: f"{op}: expected x to have a last dimension H >= 1, got shape {list(x.shape)}", traced)


def _check_weight(op: str, x: Tensor, weight: Tensor, traced: bool) -> None:
    _check_float(op, "weight", weight)
    _require(
        weight.dim() == 1 and weight.shape[0] == 3,
        lambda: f"{op}: expected weight of shape [3] ([w0, w1, w2]), got {list(weight.shape)}",
        traced,
    )
    _check_same_device(op, x, weight=weight)


def _check_bias(op: str, x: Tensor, bias: Tensor, traced: bool) -> None:
    _check_float(op, "bias", bias)
    _require(
        bias.dim() == 0 or (bias.dim() == 1 and bias.shape[0] == 1),
        lambda: f"{op}: expected bias of shape [1] or [] (one number), got {list(bias.shape)}",
        traced,
    )
    _check_same_device(op, x, bias=bias)


def _check_like_x(op: str, name: str, other: Tensor, x: Tensor, traced: bool = False) -> None:
    # other (grad_y, grad_out, mul) has x's shape, dtype and device.
    _check_tensor(op, name, other)
    _require(
        other.shape == x.shape,
        lambda: f"{op}: expected {name} to have x's shape {list(x.shape)}, got {list(other.shape)}",
        traced,
    )
    if other.dtype != x.dtype:
        raise RuntimeError(f"{op}: expected {name} to have x's dtype {x.dtype}, got {other.dtype}")
    _check_same_device(op, x, **{name: other})


def _check_rstd(op: str, x: Tensor, rstd: Tensor) -> None:
    # rstd: [M, 3] (rows of x) of the accumulation dtype, on x's device.
    _check_tensor(op, "rstd", rstd)
    M = x.numel() // x.shape[-1]
    torch._check(
        rstd.dim() == 2 and rstd.shape[0] == M and rstd.shape[1] == 3,
        lambda: f"{op}: expected rstd of shape [{M}, 3] (rows of x, then r_3, r_2, r_1), got {list(rstd.shape)}",
    )
    if rstd.dtype != rstd_dtype(x.dtype):
        raise RuntimeError(f"{op}: expected rstd of dtype {rstd_dtype(x.dtype)} for x of dtype {x.dtype}, got {rstd.dtype}")
    _check_same_device(op, x, rstd=rstd)


def check_forward_args(op: str, x: Tensor, weight: Tensor, bias: Tensor, eps, *, traced: bool = False) -> float:
    """The C++ argument checks of ``polynorm::forward``, in Python: for the fake kernels, the
    Triton and reference paths.

    x ``(..., H)`` of float32, float64, float16 or bfloat16 with H >= 1; weight ``(3,)`` and
    bias ``(1,)`` or ``()``, of those dtypes; all on x's device; eps finite and >= 0.

    Args:
        traced: the caller is being traced by Dynamo (the reference path under
            torch.compile): shape conditions are plain branches rather than ``torch._check``.

    Returns:
        eps as a Python float (see :func:`check_eps`).

    Raises:
        TypeError: an argument of the wrong type (see :func:`check_eps` for eps).
        RuntimeError: naming ``op`` and the argument, with the expected and the actual
            value. Shape conditions go through ``torch._check`` so that symbolic shapes
            (torch.compile with dynamic=True) pass through unspecialised.
        ValueError: eps negative, NaN or infinite.
    """
    _check_x(op, x, traced)
    _check_weight(op, x, weight, traced)
    _check_bias(op, x, bias, traced)
    return check_eps(op, eps)


def check_backward_args(op: str, grad_y: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> None:
    """The C++ checks of ``polynorm::backward``, in Python (see :func:`check_forward_args`):
    grad_y has x's shape, dtype and device; rstd is ``[M, 3]`` of the accumulation dtype on
    x's device."""
    _check_x(op, x, False)
    _check_weight(op, x, weight, False)
    _check_like_x(op, "grad_y", grad_y, x)
    _check_rstd(op, x, rstd)


def check_mul_forward_args(op: str, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, eps, *, traced: bool = False) -> float:
    """The C++ checks of ``polynorm::mul_forward``, in Python: :func:`check_forward_args`, and
    mul with x's shape, dtype and device.

    Returns:
        eps as a Python float (see :func:`check_eps`).
    """
    _check_x(op, x, traced)
    _check_like_x(op, "mul", mul, x, traced)
    _check_weight(op, x, weight, traced)
    _check_bias(op, x, bias, traced)
    return check_eps(op, eps)


def check_mul_backward_args(op: str, grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, rstd: Tensor) -> None:
    """The C++ checks of ``polynorm::mul_backward``, in Python, with its messages: as
    :func:`check_backward_args` with the gradient named ``grad_out``, plus bias (as in the
    forward) and mul with x's shape, dtype and device."""
    _check_x(op, x, False)
    _check_weight(op, x, weight, False)
    _check_bias(op, x, bias, False)
    _check_like_x(op, "grad_out", grad_out, x)
    _check_like_x(op, "mul", mul, x)
    _check_rstd(op, x, rstd)


# Grouped PolyNorm (mixture of experts): weight [E, 3], bias [E] or [E, 1], offsets [E].


def _check_grouped_params(op: str, x: Tensor, weight: Tensor, offsets: Tensor, traced: bool) -> int:
    # weight [E, 3] with E >= 1 and offsets [E] of int32 or int64, on x's device. Returns E.
    _check_float(op, "weight", weight)
    _require(
        weight.dim() == 2 and weight.shape[1] == 3,
        lambda: f"{op}: expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got {list(weight.shape)}",
        traced,
    )
    E = weight.shape[0]
    _require(E >= 1, lambda: f"{op}: expected weight to have at least one expert (E >= 1), got shape {list(weight.shape)}", traced)
    _check_same_device(op, x, weight=weight)
    _check_tensor(op, "offsets", offsets)
    if offsets.dtype not in _OFFSET_DTYPES:
        raise RuntimeError(f"{op}: expected offsets to be int32 or int64, got {offsets.dtype}")
    _require(
        offsets.dim() == 1 and offsets.shape[0] == E,
        lambda: f"{op}: expected offsets of shape [{E}] (one cumulative end offset per expert of weight), "
        f"got {list(offsets.shape)}",
        traced,
    )
    _check_same_device(op, x, offsets=offsets)
    return E


def check_grouped_forward_args(
    op: str, x: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps, *, traced: bool = False
) -> float:
    """The C++ checks of ``polynorm::grouped_forward``, in Python: for its fake kernel, the
    Triton op and the reference.

    x ``(..., H)`` of a float dtype with H >= 1; weight ``[E, 3]`` with E >= 1; bias ``[E]`` or
    ``[E, 1]``; offsets ``[E]`` of int32 or int64; all on x's device; eps finite and >= 0.

    Args:
        traced: as in :func:`check_forward_args`.

    Returns:
        eps as a Python float.

    Raises:
        TypeError: an argument of the wrong type, or eps not a real number.
        RuntimeError: naming ``op`` and the argument, with the expected and the actual value.
        ValueError: eps negative, NaN or infinite.
    """
    _check_x(op, x, traced)
    E = _check_grouped_params(op, x, weight, offsets, traced)
    _check_float(op, "bias", bias)
    _require(
        tuple(bias.shape) in ((E,), (E, 1)),
        lambda: f"{op}: expected bias of shape [{E}] or [{E}, 1] (weight's E experts), got {list(bias.shape)}",
        traced,
    )
    _check_same_device(op, x, bias=bias)
    return check_eps(op, eps)


def check_grouped_backward_args(op: str, grad_y: Tensor, x: Tensor, weight: Tensor, offsets: Tensor, rstd: Tensor) -> None:
    """The C++ checks of ``polynorm::grouped_backward``, in Python (see
    :func:`check_grouped_forward_args`); grad_y has x's shape, dtype and device, and rstd is
    ``[M, 3]`` of the accumulation dtype on x's device."""
    _check_x(op, x, False)
    _check_grouped_params(op, x, weight, offsets, False)
    _check_like_x(op, "grad_y", grad_y, x)
    _check_rstd(op, x, rstd)


def _check_option(op: str, name: str, value, *, positive: bool) -> None:
    # hidden_clamp, bias_clamp (None or a real number, > 0 / >= 0, +inf allowed), output_scale
    # (a finite real number).
    if value is None and name != "output_scale":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: expected {name} to be a real number{'' if name == 'output_scale' else ' or None'}, got {value!r}")
    if value != value or (name == "output_scale" and value in (float("inf"), float("-inf"))):
        raise ValueError(f"{op}: expected {name} to be {'finite' if name == 'output_scale' else 'a number'}, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{op}: expected {name} > 0, got {value!r}")
    if name == "bias_clamp" and not value >= 0:
        raise ValueError(f"{op}: expected {name} >= 0, got {value!r}")


def check_grouped_mul_options(op: str, hidden_clamp, bias_clamp, output_scale) -> None:
    """Motif-3's options (docs/MATH.md (16)-(19)): hidden_clamp None or > 0, bias_clamp None or
    >= 0, output_scale finite. TypeError for a non-number, ValueError for a value out of range."""
    _check_option(op, "hidden_clamp", hidden_clamp, positive=True)
    _check_option(op, "bias_clamp", bias_clamp, positive=False)
    _check_option(op, "output_scale", output_scale, positive=False)


def check_grouped_mul_forward_args(
    op: str, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, eps,
    hidden_clamp=None, bias_clamp=None, output_scale=1.0, *, traced: bool = False,
) -> float:  # fmt: skip
    """The checks of ``polynorm::grouped_mul_forward``: :func:`check_grouped_forward_args`, mul
    with x's shape, dtype and device (any strides), and the options
    (:func:`check_grouped_mul_options`).

    Returns:
        eps as a Python float.
    """
    eps = check_grouped_forward_args(op, x, weight, bias, offsets, eps, traced=traced)
    _check_like_x(op, "mul", mul, x, traced)
    check_grouped_mul_options(op, hidden_clamp, bias_clamp, output_scale)
    return eps


def check_grouped_mul_backward_args(
    op: str, grad_out: Tensor, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, offsets: Tensor, rstd: Tensor
) -> None:
    """The checks of ``polynorm::grouped_mul_backward``: as the forward's for x, mul, weight,
    bias and offsets; grad_out with x's shape, dtype and device; rstd ``[M, 3]`` of the
    accumulation dtype."""
    check_grouped_forward_args(op, x, weight, bias, offsets, 0.0)
    _check_like_x(op, "grad_out", grad_out, x)
    _check_like_x(op, "mul", mul, x)
    _check_rstd(op, x, rstd)


def check_grouped_mul_topk_args(
    op: str, x: Tensor, mul: Tensor, weight: Tensor, bias: Tensor, topk_ids: Tensor, expert_map, eps,
    hidden_clamp, output_scale, out: Tensor,
) -> float:  # fmt: skip
    """The checks of ``polynorm::grouped_mul_topk_forward`` (the token-major layout): x, mul,
    weight and bias as for the grouped op; topk_ids ``[T, K]`` int32/int64 with T * K = M (x's
    rows); expert_map None or 1-D int32/int64; all on x's device; out of x's shape, dtype and
    device, with a unit last-dim stride and one row stride (written in place).

    Returns:
        eps as a Python float.
    """
    _check_x(op, x, False)
    _check_float(op, "weight", weight)
    if weight.dim() != 2 or weight.shape[1] != 3 or weight.shape[0] < 1:
        raise RuntimeError(f"{op}: expected weight of shape [E, 3] with E >= 1 (local experts), got {list(weight.shape)}")
    E = weight.shape[0]
    _check_float(op, "bias", bias)
    if tuple(bias.shape) not in ((E,), (E, 1)):
        raise RuntimeError(f"{op}: expected bias of shape [{E}] or [{E}, 1] (weight's E experts), got {list(bias.shape)}")
    _check_same_device(op, x, weight=weight, bias=bias)
    eps = check_eps(op, eps)
    _check_like_x(op, "mul", mul, x)
    _check_like_x(op, "out", out, x)
    # out is written row by row in place: two of its elements at one address (an expanded
    # tensor) would be written by several rows at once, a race with an arbitrary winner.
    if torch._debug_has_internal_overlap(out) == 1:
        raise RuntimeError(
            f"{op}: expected out without internal overlap (it is written in place, each element at its own "
            f"address), got strides {list(out.stride())}"
        )
    check_grouped_mul_options(op, hidden_clamp, None, output_scale)
    _check_tensor(op, "topk_ids", topk_ids)
    if topk_ids.dtype not in _OFFSET_DTYPES:
        raise RuntimeError(f"{op}: expected topk_ids to be int32 or int64, got {topk_ids.dtype}")
    M = x.numel() // x.shape[-1]
    if topk_ids.dim() != 2 or topk_ids.shape[0] * topk_ids.shape[1] != M:
        raise RuntimeError(
            f"{op}: expected topk_ids of shape [T, K] with T * K = {M} (x's rows), got {list(topk_ids.shape)}"
        )
    _check_same_device(op, x, topk_ids=topk_ids)
    if expert_map is not None:
        _check_tensor(op, "expert_map", expert_map)
        if expert_map.dtype not in _OFFSET_DTYPES or expert_map.dim() != 1:
            raise RuntimeError(
                f"{op}: expected expert_map to be a 1-D int32 or int64 tensor, got {expert_map.dtype} of shape "
                f"{list(expert_map.shape)}"
            )
        _check_same_device(op, x, expert_map=expert_map)
    return eps


# Tensor parallelism's sharded passes (csrc/ops.cpp, "Sharded ops"): x ``(..., H_shard)`` holds a
# shard of each row's columns, H_shard = 0 included; M counts the leading dimensions.


def _shard_rows(x: Tensor) -> int:
    M = 1
    for n in x.shape[:-1]:
        M *= n
    return M


def _check_shard_x(op: str, x: Tensor) -> int:
    # x: (..., H_shard) of a float dtype, H_shard >= 0. Returns M.
    _check_float(op, "x", x)
    if x.dim() < 1:
        raise RuntimeError(f"{op}: expected x to have at least 1 dimension (..., H_shard), got a 0-d tensor")
    return _shard_rows(x)


def _check_row_triples(op: str, name: str, what: str, t: Tensor, x: Tensor, M) -> None:
    # sums or rstd: [M, 3] of the accumulation dtype, on x's device.
    _check_tensor(op, name, t)
    torch._check(
        t.dim() == 2 and t.shape[0] == M and t.shape[1] == 3,
        lambda: f"{op}: expected {name} of shape [{M}, 3] ({what}), got {list(t.shape)}",
    )
    if t.dtype != rstd_dtype(x.dtype):
        raise RuntimeError(f"{op}: expected {name} of dtype {rstd_dtype(x.dtype)} for x of dtype {x.dtype}, got {t.dtype}")
    _check_same_device(op, x, **{name: t})


def _check_sums(op: str, sums: Tensor, x: Tensor, M) -> None:
    _check_row_triples(op, "sums", "rows of x, then the three row sums", sums, x, M)


def _check_shard_rstd(op: str, rstd: Tensor, x: Tensor, M) -> None:
    _check_row_triples(op, "rstd", "rows of x, then r_3, r_2, r_1", rstd, x, M)


def check_hidden_size(op: str, x: Tensor, hidden_size) -> None:
    """hidden_size, the unsharded H: an int >= 1 and >= x's shard width (csrc/ops.cpp's check)."""
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, (int, torch.SymInt)):
        raise TypeError(f"{op}: expected hidden_size to be an int (the unsharded H), got {type(hidden_size).__name__}")
    torch._check(
        hidden_size >= 1 and hidden_size >= x.shape[-1],
        lambda: f"{op}: expected hidden_size (the unsharded H) >= 1 and >= x's shard width {x.shape[-1]}, "
        f"got {hidden_size}",
    )


def check_sharded_params(op: str, x: Tensor, mul, weight: Tensor, bias: Tensor) -> int:
    """x a shard ``(..., H_shard)`` of a float dtype (H_shard may be 0); mul None or of x's shape,
    dtype and device; weight ``(3,)`` and bias ``(1,)`` or ``()`` of a float dtype on x's device.
    Returns M. The checks every sharded pass and :mod:`polynorm.tp` share."""
    M = _check_shard_x(op, x)
    if mul is not None:
        _check_like_x(op, "mul", mul, x)
    _check_weight(op, x, weight, False)
    _check_bias(op, x, bias, False)
    return M


def check_sharded_forward_stats_args(op: str, x: Tensor) -> int:
    """The C++ checks of ``polynorm::sharded_forward_stats``: x a float shard. Returns M."""
    return _check_shard_x(op, x)


def check_sharded_forward_apply_args(op: str, x: Tensor, mul, sums: Tensor, weight: Tensor, bias: Tensor,
                                     hidden_size, eps) -> int:  # fmt: skip
    """The C++ checks of ``polynorm::sharded_forward_apply``, in its order. Returns M."""
    M = _check_shard_x(op, x)
    if mul is not None:
        _check_like_x(op, "mul", mul, x)
    _check_sums(op, sums, x, M)
    _check_weight(op, x, weight, False)
    _check_bias(op, x, bias, False)
    check_hidden_size(op, x, hidden_size)
    check_eps(op, eps)
    return M


def check_sharded_backward_stats_args(op: str, grad_out: Tensor, x: Tensor, mul, rstd: Tensor) -> int:
    """The C++ checks of ``polynorm::sharded_backward_stats``, in its order. Returns M."""
    M = _check_shard_x(op, x)
    _check_like_x(op, "grad_out", grad_out, x)
    if mul is not None:
        _check_like_x(op, "mul", mul, x)
    _check_shard_rstd(op, rstd, x, M)
    return M


def check_sharded_backward_apply_args(op: str, grad_out: Tensor, x: Tensor, mul, weight: Tensor, bias: Tensor,
                                      rstd: Tensor, sums: Tensor, hidden_size) -> int:  # fmt: skip
    """The C++ checks of ``polynorm::sharded_backward_apply``, in its order. Returns M."""
    M = _check_shard_x(op, x)
    _check_like_x(op, "grad_out", grad_out, x)
    if mul is not None:
        _check_like_x(op, "mul", mul, x)
    _check_weight(op, x, weight, False)
    _check_bias(op, x, bias, False)
    _check_shard_rstd(op, rstd, x, M)
    _check_sums(op, sums, x, M)
    check_hidden_size(op, x, hidden_size)
    return M


def saveable(t: Tensor) -> Tensor:
    """t as autograd can save it for backward: a tensor made under ``torch.inference_mode()``
    (which has no version counter, so autograd refuses to save it) is copied once, the clone
    PyTorch's own message asks for; any other tensor is returned as is. Called from
    ``setup_context``, which runs only when a backward is recorded."""
    return t.clone() if t.is_inference() else t


def save_param_meta(ctx, weight: Tensor, bias: Tensor) -> None:
    """Records weight's and bias's shapes and dtypes on ``ctx`` for :func:`param_grads`."""
    ctx.weight_shape, ctx.weight_dtype = weight.shape, weight.dtype
    ctx.bias_shape, ctx.bias_dtype = bias.shape, bias.dtype


def param_grads(ctx, grad_weight: Tensor, grad_bias: Tensor, need_weight: bool, need_bias: bool) -> tuple:
    """(grad_weight, grad_bias) as autograd returns them: from the backward op's accumulation
    dtype (fp32, fp64 for fp64 x), rounded once to each parameter's own dtype and reshaped to
    its shape (recorded by :func:`save_param_meta`); None where the gradient is not needed."""
    return (
        grad_weight.to(ctx.weight_dtype).reshape(ctx.weight_shape) if need_weight else None,
        grad_bias.to(ctx.bias_dtype).reshape(ctx.bias_shape) if need_bias else None,
    )


def register_autograd(forward_op: str, backward_op=None, *, by_backend: dict | None = None) -> None:
    """Makes ``forward_op`` differentiable through ``backward_op`` (same schemas as the C++ ops).

    The backward honours ``needs_input_grad`` and returns each parameter's gradient in that
    parameter's own dtype and shape (weight ``(3,)``, bias ``(1,)`` or ``()``):
    ``backward_op`` gives both in the accumulation dtype (fp32, fp64 for fp64 x), rounded
    here once to each parameter's dtype. An x made under ``torch.inference_mode()`` cannot
    be saved for backward: it is copied once (see ``setup_context``).

    Args:
        backward_op: the backward op; it is given an autograd kernel that refuses to be
            differentiated (a gradient of the gradient would otherwise come out as zeros
            with only a warning).
        by_backend: instead of ``backward_op``, for a forward whose fifth input is a
            backend name: the name of each backend's backward op under ``torch.ops.polynorm``.
    """

    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs[:3]
        _y, rstd = output
        ctx.mark_non_differentiable(rstd)
        # The parameter gradients need x's rows: an inference-mode x is copied once (saveable).
        ctx.save_for_backward(saveable(x), weight, rstd)
        save_param_meta(ctx, weight, bias)
        ctx.backward_op = backward_op if by_backend is None else getattr(torch.ops.polynorm, by_backend[inputs[4]])

    def backward(ctx, grad_y: Tensor, _grad_rstd: Tensor):
        need_x, need_weight, need_bias = ctx.needs_input_grad[:3]
        rest = (None,) * (len(ctx.needs_input_grad) - 3)
        if not (need_x or need_weight or need_bias):
            return (None, None, None) + rest
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_weight, grad_bias = ctx.backward_op(grad_y, x, weight, rstd)
        return (grad_x if need_x else None,) + param_grads(ctx, grad_weight, grad_bias, need_weight, need_bias) + rest

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    if by_backend is None:
        refuse_double_backward(backward_op)


def refuse_double_backward(backward_op) -> None:
    """Gives ``backward_op`` an autograd kernel that raises: differentiating PolyNorm's
    gradient (``create_graph=True``) would otherwise come out as zeros with only a warning.
    (``polynorm::forward``'s own autograd is C++, ``csrc/autograd.cpp``.)"""

    def no_double_backward(ctx, *grads):
        raise RuntimeError(
            f"{backward_op._schema.name.replace('::', '.')}: differentiating PolyNorm's gradient "
            "(double backward, create_graph=True) is not supported"
        )

    torch.library.register_autograd(
        backward_op._schema.name, no_double_backward, setup_context=lambda ctx, inputs, output: None
    )


def register_mul_autograd(forward_op: str, backward_op=None, *, by_backend: dict | None = None) -> None:
    """Makes ``forward_op`` (``polynorm::mul_forward``'s schema: ``x, mul, weight, bias, eps``)
    differentiable through ``backward_op`` (``mul_backward``'s schema), as
    :func:`register_autograd` does for PolyNorm: ``needs_input_grad`` is honoured, each
    parameter's gradient comes back rounded once to its own dtype and shape, and an
    inference-mode x or mul is copied once when a backward is recorded.

    Args:
        backward_op: the backward op (given an autograd kernel that refuses double backward).
        by_backend: instead, for a forward whose sixth input is a backend name: each
            backend's backward op name under ``torch.ops.polynorm``.
    """

    def setup_context(ctx, inputs, output) -> None:
        x, mul, weight, bias = inputs[:4]
        _out, rstd = output
        ctx.mark_non_differentiable(rstd)
        # As in register_autograd: an inference-mode x or mul is copied once (saveable).
        ctx.save_for_backward(saveable(x), saveable(mul), weight, bias, rstd)
        save_param_meta(ctx, weight, bias)
        ctx.backward_op = backward_op if by_backend is None else getattr(torch.ops.polynorm, by_backend[inputs[5]])

    def backward(ctx, grad_out: Tensor, _grad_rstd: Tensor):
        need_x, need_mul, need_weight, need_bias = ctx.needs_input_grad[:4]
        rest = (None,) * (len(ctx.needs_input_grad) - 4)
        if not (need_x or need_mul or need_weight or need_bias):
            return (None, None, None, None) + rest
        x, mul, weight, bias, rstd = ctx.saved_tensors
        grad_x, grad_mul, grad_weight, grad_bias = ctx.backward_op(grad_out, x, mul, weight, bias, rstd)
        grads = (grad_x if need_x else None, grad_mul if need_mul else None)
        return grads + param_grads(ctx, grad_weight, grad_bias, need_weight, need_bias) + rest

    torch.library.register_autograd(forward_op, backward, setup_context=setup_context)
    if by_backend is None:
        refuse_double_backward(backward_op)
