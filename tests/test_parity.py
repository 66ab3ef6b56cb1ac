"""Every backend against the float64 oracle, over one shared matrix of shapes, dtypes and layouts."""

import pytest
import torch

from _matrix import (
    BACKENDS,
    DTYPES,
    LAYOUTS,
    check_against_oracle,
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
