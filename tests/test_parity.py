"""Every backend against the float64 oracle, over one shared matrix of shapes, dtypes and layouts."""

import math

import pytest
import torch

import polynorm
from _matrix import (
    BACKENDS,
    DTYPES,
    LAYOUTS,
    check_against_oracle,
    closed_form,
    make_params,
    make_rows,
    requires_cuda,
    requires_triton,
    run_backend,
    seed_for,
)

TRITON_BACKENDS = [p for p in BACKENDS if getattr(p, "values", p)[1] == "triton"]

CPU_H = [1, 2, 3, 8, 127, 769, 4096, 5125]
GPU_M = [1, 7, 83, 4096]
GPU_H = [1, 3, 8, 127, 769, 1024, 4096, 5125, 8192, 16385, 65536, 262145]
# The GPU sweep keeps each case under 2^25 elements (the fp64 oracle and its autograd
# graph hold several float64 copies); the benchmark covers the larger shapes.
GPU_SHAPES = [(M, H) for M in GPU_M for H in GPU_H if M * H <= 2**25]
# The smoke subset (`pytest -m smoke`, for kernel iteration): every backend, dtype and layout
# once at an odd H (test_layouts), and the long-row kernels at two GPU shapes.
SMOKE_GPU_SHAPES = {(83, 8192), (83, 65536)}


def _case(device, backend, M, H, dtype, layout, param_dtype=torch.float32, eps=1e-6):
    gen = torch.Generator().manual_seed(seed_for(device, backend, M, H, dtype, layout, param_dtype))
    x = make_rows(M, H, dtype, device, layout, gen)
    g = make_rows(M, H, dtype, device, layout, gen)
    w, b = make_params(param_dtype, device, gen)
    out = run_backend(backend, x, g, w, b, eps)
    check_against_oracle(out, x, g, w, b, eps, what=f"{backend} {device} M={M} H={H} {dtype} {layout}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", CPU_H)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_contiguous_small(device, backend, H, dtype):
    _case(device, backend, 7, H, dtype, "contiguous")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [3, 127, pytest.param(769, marks=pytest.mark.smoke), 4096])
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_layouts(device, backend, H, dtype, layout):
    _case(device, backend, 5, H, dtype, layout)


@pytest.mark.parametrize("param_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_mixed_param_dtypes(device, backend, dtype, param_dtype):
    _case(device, backend, 9, 769, dtype, "contiguous", param_dtype=param_dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "M,H", [pytest.param(M, H, marks=[pytest.mark.smoke] if (M, H) in SMOKE_GPU_SHAPES else []) for M, H in GPU_SHAPES]
)
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@requires_cuda
def test_gpu_shapes(backend, M, H, dtype):
    _case("cuda", backend, M, H, dtype, "contiguous")


# The Triton kernels walk a row in column blocks, twice, when it does not fit one block.
# H = 32769 passes the real limits (forward 16384 or 32768 columns, backward 4096 or 8192,
# by dtype); a lowered one-block limit (a power of two, in columns) reaches the same code
# with small H, with a partial last block, cheaply under the interpreter.
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H,max_one_block", [(769, 256), (5125, 1024), (32769, None)])
@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_column_blocks(device, backend, H, max_one_block, dtype, layout, monkeypatch):
    from polynorm import triton_kernels

    monkeypatch.setattr(triton_kernels, "_MAX_ONE_BLOCK_OVERRIDE", max_one_block)
    for direction in ("forward", "backward"):
        assert not triton_kernels._launch_config(H, dtype, direction)[2], (H, dtype, direction, "fits one block")
    _case(device, backend, 3, H, dtype, layout)


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_ranks(device, backend, ndim):
    gen = torch.Generator().manual_seed(seed_for("ranks", device, ndim))
    shape = [3, 2, 5, 33][-ndim:]
    x = torch.randn(*shape, generator=gen).to(device)
    g = torch.randn(*shape, generator=gen).to(device)
    w, b = make_params(torch.float32, device, gen)
    out = run_backend(backend, x, g, w, b, 1e-6)
    assert out.y.shape == x.shape and out.dx.shape == x.shape
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"{ndim}-D")


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("grad_layout", ["expand", "sliced"])
def test_grad_y_layouts(device, backend, grad_layout):
    gen = torch.Generator().manual_seed(seed_for("grad_layout", device, grad_layout))
    M, H = 6, 200
    x = make_rows(M, H, torch.float32, device, "contiguous", gen)
    if grad_layout == "expand":
        g = torch.randn(1, H, generator=gen).to(device).expand(M, H)  # row stride 0
    else:
        g = torch.randn(M, 2 * H, generator=gen).to(device)[:, ::2]  # last-dim stride 2: copied
    w, b = make_params(torch.float32, device, gen)
    check_against_oracle(run_backend(backend, x, g, w, b, 1e-6), x, g, w, b, 1e-6, what=grad_layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_empty(device, backend, dtype):
    op = torch.ops.polynorm.forward_triton if backend == "triton" else torch.ops.polynorm.forward
    x = torch.empty(0, 4, 16, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(3, device=device, requires_grad=True)
    b = torch.randn(1, device=device, requires_grad=True)
    y, rstd = op(x, w, b, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype and rstd.shape == (0, 3)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros(3, device=device)) and torch.equal(b.grad, torch.zeros(1, device=device))


# ---------------------------------------------------------------------------------------
# Parameter gradients: accumulated in fp32 and rounded once, each to its own dtype
# ---------------------------------------------------------------------------------------
# Issue 16: an fp32 bias next to an fp16 or bf16 weight had its gradient rounded through
# the weight's dtype (inf past 65504 with an fp16 weight). Every (weight, bias) dtype pair,
# for every backend, the reference included.
ALL_BACKENDS = BACKENDS + [("cpu", "reference"), pytest.param("cuda", "reference", marks=requires_cuda)]


def _param_grads(backend, x, g, w, b):
    w_ = w.detach().clone().requires_grad_(True)
    b_ = b.detach().clone().requires_grad_(True)
    polynorm.poly_norm(x, w_, b_, 1e-6, backend=backend).backward(g)
    return w_.grad, b_.grad


@pytest.mark.parametrize("bias_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_param_grads_rounded_once_to_own_dtype(device, backend, x_dtype, weight_dtype, bias_dtype):
    gen = torch.Generator().manual_seed(seed_for("param-grad-dtypes", device, backend, x_dtype, weight_dtype, bias_dtype))
    M, H = 6, 300
    x = make_rows(M, H, x_dtype, device, "contiguous", gen)
    g = make_rows(M, H, x_dtype, device, "contiguous", gen)
    w32, b32 = make_params(torch.float32, device, gen)
    w, b = w32.to(weight_dtype), b32.to(bias_dtype)
    dw, db = _param_grads(backend, x, g, w, b)
    assert dw.dtype == weight_dtype and dw.shape == w.shape, (dw.dtype, dw.shape)
    assert db.dtype == bias_dtype and db.shape == b.shape, (db.dtype, db.shape)
    exact, scale = closed_form(x, g, w, b, 1e-6)
    n = math.log2(x.numel())
    u = torch.finfo(torch.float32).eps / 2
    for name, got, param, exp, sc in (("dw", dw, w, exact.dw, scale.dw), ("db", db, b, exact.db, scale.db)):
        got, exp, sc = got.double().reshape(-1).cpu(), exp.reshape(-1).cpu(), sc.reshape(-1).cpu()
        # The fp32 sum's own error, then one rounding to the parameter's dtype. Rounding
        # through a narrower dtype first (the bug) misses this by that dtype's unit roundoff.
        accumulated = 4 * u * sc * n
        tol = accumulated + torch.finfo(param.dtype).eps / 2 * (exp.abs() + accumulated)
        assert torch.all((got - exp).abs() <= tol), f"{name}: got {got.tolist()}, expected {exp.tolist()}"


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_fp32_bias_beside_16bit_weight(device, backend):
    # The issue's two inputs, with fresh random x. A bias gradient of 65536 (above fp16's
    # largest finite value, 65504) must not saturate to inf through an fp16 weight, and 2.001
    # must not round to bf16's 2.0.
    gen = torch.Generator().manual_seed(seed_for("fp32-bias-16bit-weight", device, backend))
    x = torch.randn(1, 65536, generator=gen).to(device)
    w = torch.full((3,), 1 / 3, dtype=torch.float16, device=device)
    b = torch.zeros(1, device=device)
    _, db = _param_grads(backend, x, torch.ones_like(x), w, b)
    assert db.dtype == torch.float32 and db.item() == 65536.0, db

    x = torch.randn(1, 3, generator=gen).to(device)
    g = torch.tensor([[1.0, 1.0, 1e-3]], device=device)
    w = torch.full((3,), 1 / 3, dtype=torch.bfloat16, device=device)
    _, db = _param_grads(backend, x, g, w, b)
    torch.testing.assert_close(db, g.sum().reshape(1), rtol=2e-7, atol=0)
    assert db.item() != 2.0

    # And the other way round: an fp32 weight beside an fp16 bias. The weight's gradient
    # keeps fp32's precision; the bias's, 65536, is rounded to its own dtype: inf in fp16,
    # as the reference (and autograd of any op) gives it.
    x = torch.randn(16, 4096, generator=gen).to(device) * 30
    g = torch.randn(16, 4096, generator=gen).abs().to(device) + 1
    w = torch.tensor([0.3, -0.4, 0.9], device=device)
    dw, db = _param_grads(backend, x, g, w, torch.zeros(1, dtype=torch.float16, device=device))
    exact, _ = closed_form(x, g, w, b, 1e-6)
    assert dw.dtype == torch.float32 and db.dtype == torch.float16
    torch.testing.assert_close(dw.double().cpu(), exact.dw.cpu(), rtol=1e-5, atol=0)
    assert torch.isinf(db).all()


@pytest.mark.parametrize("weight_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_backward_op_returns_param_grads_in_accumulation_dtype(device, backend, x_dtype, weight_dtype):
    # The op's schema: grad_weight and grad_bias in fp32 (fp64 for fp64 x), whatever weight's dtype.
    fwd, bwd = (("forward_triton", "backward_triton") if backend == "triton" else ("forward", "backward"))
    gen = torch.Generator().manual_seed(seed_for("bwd-op-acc-dtype", device, backend, x_dtype, weight_dtype))
    x = make_rows(3, 50, x_dtype, device, "contiguous", gen)
    g = make_rows(3, 50, x_dtype, device, "contiguous", gen)
    w, b = make_params(weight_dtype, device, gen)
    _, rstd = getattr(torch.ops.polynorm, fwd)(x, w, b, 1e-6)
    _, dw, db = getattr(torch.ops.polynorm, bwd)(g, x, w, rstd)
    acc = torch.float64 if x_dtype == torch.float64 else torch.float32
    assert dw.dtype == acc and db.dtype == acc and dw.shape == (3,) and db.shape == (1,)
    exact, _ = closed_form(x, g, w, b, 1e-6)
    torch.testing.assert_close(db.double().cpu(), exact.db.cpu(), rtol=1e-5, atol=1e-4)
