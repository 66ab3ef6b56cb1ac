"""The oracle itself: polynorm.reference (with autograd) against docs/MATH.md's closed form."""

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
