"""The oracle itself: polynorm.reference (with autograd) against docs/MATH.md's closed form."""

import re

import pytest
import torch

from _matrix import autograd_reference, closed_form, make_params, seed_for
from polynorm import reference


@pytest.mark.parametrize("M,H", [(1, 1), (3, 2), (5, 127), (4, 769), (2, 4096)])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.5])
def test_reference_matches_closed_form(M, H, eps):
    gen = torch.Generator().manual_seed(seed_for("reference", M, H, eps))
    x = torch.randn(M, H, generator=gen, dtype=torch.float64)
    g = torch.randn(M, H, generator=gen, dtype=torch.float64)
    w, b = make_params(torch.float64, "cpu", gen)
    got = autograd_reference(x, g, w, b, eps, torch.float64)
    exp, _ = closed_form(x, g, w, b, eps)
    for name in ("y", "dx", "dw", "db"):
        torch.testing.assert_close(
            getattr(got, name).reshape(-1), getattr(exp, name).reshape(-1), rtol=1e-12, atol=1e-12, msg=name
        )


def test_reference_rstd_order_and_dtype():
    x = torch.randn(6, 10, dtype=torch.bfloat16)
    r = reference.rstd(x, 1e-6)
    assert r.shape == (6, 3) and r.dtype == torch.float32
    xd = x.double()
    for col, p in enumerate((3, 2, 1)):
        exp = 1 / torch.sqrt((xd**p).pow(2).mean(-1) + 1e-6)
        torch.testing.assert_close(r[:, col].double(), exp, rtol=1e-6, atol=0)
    assert reference.rstd(x.double()).dtype == torch.float64


def test_reference_keeps_dtype_and_upcasts():
    x = torch.randn(4, 64, dtype=torch.float16)
    w = torch.tensor([0.3, -0.4, 0.9])
    b = torch.tensor(0.1)
    y = reference.poly_norm(x, w, b)
    assert y.dtype == torch.float16 and y.shape == x.shape
    y64 = reference.poly_norm(x.double(), w.double(), b.double(), compute_dtype=torch.float64)
    assert (y.double() - y64).abs().max() <= 2 * torch.finfo(torch.float16).eps * y64.abs().max()


@pytest.mark.parametrize("layout", ["transposed", "channels_last"])
def test_reference_output_is_contiguous(layout):
    # poly_norm promises a contiguous y whatever x's strides, like the kernels.
    gen = torch.Generator().manual_seed(seed_for("reference-layout", layout))
    if layout == "transposed":
        x = torch.randn(6, 8, generator=gen).t()
    else:
        x = torch.randn(2, 5, 3, 4, generator=gen).to(memory_format=torch.channels_last)
    w, b = make_params(torch.float32, "cpu", gen)
    y = reference.poly_norm(x, w, b)
    assert y.is_contiguous() and y.shape == x.shape
    torch.testing.assert_close(y, reference.poly_norm(x.contiguous(), w, b), rtol=0, atol=0)


# The oracle runs the ops' argument checks, with their messages: unchecked, an int64 x gave an
# int64 y, eps = -5 gave NaN, and a 2-element weight a reshape error.
_GOOD = dict(x=torch.randn(3, 8), weight=torch.tensor([0.3, -0.4, 0.9]), bias=torch.tensor([0.1]), eps=1e-6)
REFERENCE_ERRORS = [
    ("int64 x", dict(x=torch.arange(24).reshape(3, 8)), RuntimeError, "expected x to be float32, float64, float16 or bfloat16, got torch.int64"),
    ("0-d x", dict(x=torch.tensor(1.0)), RuntimeError, "expected x to have at least 1 dimension (..., H), got a 0-d tensor"),
    ("H = 0", dict(x=torch.randn(3, 0)), RuntimeError, "expected x to have a last dimension H >= 1, got shape [3, 0]"),
    ("2-element weight", dict(weight=torch.ones(2)), RuntimeError, "expected weight of shape [3] ([w0, w1, w2]), got [2]"),
    ("int weight", dict(weight=torch.ones(3, dtype=torch.long)), RuntimeError, "expected weight to be float32, float64, float16 or bfloat16, got torch.int64"),
    ("2-element bias", dict(bias=torch.ones(2)), RuntimeError, "expected bias of shape [1] or [] (one number), got [2]"),
    ("weight on meta", dict(weight=torch.ones(3, device="meta")), RuntimeError, "expected weight on x's device cpu, got meta"),
    ("None bias", dict(bias=None), TypeError, "expected bias to be a Tensor, got NoneType"),
    ("eps = -5", dict(eps=-5), ValueError, "expected eps to be finite and >= 0, got -5.0"),
    ("nan eps", dict(eps=float("nan")), ValueError, "expected eps to be finite and >= 0, got nan"),
    ("str eps", dict(eps="1e-6"), TypeError, "expected eps to be a real number, got str"),
    ("bool eps", dict(eps=True), TypeError, "expected eps to be a real number, got bool"),
]


@pytest.mark.parametrize("name,change,exc,message", REFERENCE_ERRORS, ids=[e[0] for e in REFERENCE_ERRORS])
def test_reference_checks_arguments_as_the_ops(name, change, exc, message):
    args = {**_GOOD, **change}
    with pytest.raises(exc, match=re.escape("polynorm.reference.poly_norm: " + message)):
        reference.poly_norm(args["x"], args["weight"], args["bias"], args["eps"])
    # The same check, with the same words, in the ops (the Triton op's checks are the
    # reference's Python ones; the C++ op names dtypes its own way: Long for torch.int64).
    if exc is not TypeError and "meta" not in name:
        cpp_message = message.replace("torch.int64", "Long").replace("-5.0", "-5")
        with pytest.raises(exc, match=re.escape("polynorm.forward: " + cpp_message)):
            torch.ops.polynorm.forward(args["x"], args["weight"], args["bias"], args["eps"])


def test_reference_accepts_every_real_eps():
    np = pytest.importorskip("numpy")
    x, w, b = _GOOD["x"], _GOOD["weight"], _GOOD["bias"]
    expected = reference.poly_norm(x, w, b, 0.25)
    for eps in (np.float32(0.25), np.float64(0.25), torch.tensor(0.25), torch.tensor([0.25]), 1):
        value = float(eps)
        assert torch.equal(reference.poly_norm(x, w, b, eps), reference.poly_norm(x, w, b, value)), repr(eps)
    assert torch.equal(reference.poly_norm(x, w, b, np.float64(0.25)), expected)
