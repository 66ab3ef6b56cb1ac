"""Grouped PolyNorm (mixture of experts): every backend against a loop over experts of the
single-expert op and against the float64 oracle, per expert, over the shared matrix's dtypes
and layouts; empty experts, rows of no expert, M = 0, bad input, determinism, opcheck,
torch.compile (every eps form), batch invariance and a second GPU (on a GPU), and a smoke run
of bench/grouped_timing.py.

Expert e owns rows [offsets[e-1], offsets[e]) of x (flattened to (M, H)); rows at or past
offsets[E-1] belong to no expert (y = 0, grad_x = 0, never read).
"""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo.testing

import polynorm
from polynorm import reference
from _matrix import (
    BACKENDS,
    DEVICES,
    DTYPES,
    EPS_FORMS,
    INTERPRET,
    LAYOUTS,
    ROOT,
    Grads,
    assert_python_checks_match_cpp,
    assert_second_device_matches_first,
    check_against_oracle,
    closed_form,
    compare_compiled_eps,
    compute_eps,
    make_params,
    make_rows,
    poisoned_outputs,
    rel_l2,
    requires_cuda,
    requires_interpreter,
    requires_triton,
    run_readme_block,
    _same_layout_leaf,
    seed_for,
)

ALL_BACKENDS = BACKENDS + [("cpu", "reference"), pytest.param("cuda", "reference", marks=requires_cuda)]
TRITON_BACKENDS = [p for p in BACKENDS if getattr(p, "values", p)[1] == "triton"]
# The ops of each kernel backend.
OPS = {
    "auto": ("grouped_forward", "grouped_backward"),
    "cuda": ("grouped_forward", "grouped_backward"),
    "triton": ("grouped_forward_triton", "grouped_backward_triton"),
}
EPS = 1e-6


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def make_experts(E: int, dtype, device, gen: torch.Generator):
    """weight [E, 3] and bias [E]: each expert's from _matrix.make_params (both signs)."""
    ws, bs = zip(*(make_params(torch.float32, "cpu", gen) for _ in range(E)))
    return torch.stack(ws).to(dtype).to(device), torch.cat(bs).to(dtype).to(device)


def offsets_of(counts, device, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(dtype).to(device)


def run_grouped(backend, x, g, w, b, offsets=None, counts=None, eps=EPS) -> Grads:
    """y, dx, dw, db from poly_norm_grouped and autograd (x keeps its layout), with every
    buffer the ops allocate poisoned first."""
    x_ = _same_layout_leaf(x)  # keeps the layout, storage offset (alignment) included
    w_ = w.detach().clone().requires_grad_(True)
    b_ = b.detach().clone().requires_grad_(True)
    with poisoned_outputs():
        y = polynorm.poly_norm_grouped(x_, w_, b_, offsets, counts=counts, eps=eps, backend=backend)
        dx, dw, db = torch.autograd.grad(y, (x_, w_, b_), g)
    return Grads(y.detach(), dx, dw, db)


def run_loop(backend, x, g, w, b, counts, eps=EPS) -> Grads:
    """The same through a loop over experts of the single-expert polynorm.poly_norm; rows of
    no expert get 0."""
    H = x.shape[-1]
    xr, gr = x.reshape(-1, H), g.reshape(-1, H)
    y, dx = torch.zeros_like(xr), torch.zeros_like(xr)
    dw, db = torch.zeros_like(w), torch.zeros_like(b)
    start = 0
    for e, n in enumerate(counts):
        if n:
            xs = xr[start : start + n].detach().clone().requires_grad_(True)
            ws = w[e].detach().clone().requires_grad_(True)
            bs = b[e].reshape(1).detach().clone().requires_grad_(True)
            ys = polynorm.poly_norm(xs, ws, bs, eps, backend=backend)
            dxs, dws, dbs = torch.autograd.grad(ys, (xs, ws, bs), gr[start : start + n])
            y[start : start + n], dx[start : start + n] = ys.detach(), dxs
            dw[e], db[e] = dws, dbs.reshape(b[e].shape)
        start += n
    return Grads(y.reshape(x.shape), dx.reshape(x.shape), dw, db)


def _segments(counts):
    start = 0
    for e, n in enumerate(counts):
        yield e, slice(start, start + n)
        start += n


def check_grouped(out: Grads, x, g, w, b, counts, eps=EPS, what=""):
    """Each expert's rows and parameter gradients against the float64 oracle (_matrix's
    check_against_oracle, run on that expert's rows with its parameters); an empty expert's
    gradients, and y and dx on rows of no expert, exactly 0."""
    H = x.shape[-1]
    assert out.y.shape == x.shape and out.dx.shape == x.shape, (what, out.y.shape, out.dx.shape)
    assert out.dw.shape == w.shape and out.dw.dtype == w.dtype, (what, out.dw.shape, out.dw.dtype)
    assert out.db.shape == b.shape and out.db.dtype == b.dtype, (what, out.db.shape, out.db.dtype)
    xr, gr = x.reshape(-1, H), g.reshape(-1, H)
    yr, dxr = out.y.reshape(-1, H), out.dx.reshape(-1, H)
    end = 0
    for e, rows in _segments(counts):
        end = rows.stop
        if rows.stop == rows.start:
            assert not out.dw[e].any() and not out.db[e].any(), f"{what} empty expert {e}: {out.dw[e]}, {out.db[e]}"
            continue
        got = Grads(yr[rows], dxr[rows], out.dw[e], out.db[e].reshape(1))
        check_against_oracle(got, xr[rows], gr[rows], w[e], b[e].reshape(1), eps, what=f"{what} expert {e}")
    assert not yr[end:].any() and not dxr[end:].any(), f"{what}: nonzero y or dx on rows of no expert"


def check_matches_loop(out: Grads, loop: Grads, x, g, w, b, counts, exact: bool, eps=EPS, what=""):
    """The grouped op against the loop of single-expert ops. exact: bitwise (the C++ CPU
    kernels share the row code and the order of every sum). Otherwise both are fp32 (fp64)
    computations rounded once, in other orders: y and dx within two output roundings plus
    32 accumulation roundoffs of the terms' scale (relative L2, as _matrix's oracle bound),
    dw and db within the accumulated roundoff of an n-row sum plus two parameter roundings."""
    if exact:
        for name in ("y", "dx", "dw", "db"):
            got, exp = getattr(out, name), getattr(loop, name)
            assert torch.equal(got, exp), f"{what} {name}: not bitwise the loop's (max diff {(got - exp).abs().max()})"
        return
    H = x.shape[-1]
    u, u_out = compute_eps(x.dtype), torch.finfo(x.dtype).eps / 2
    xr, gr = x.reshape(-1, H), g.reshape(-1, H)
    for e, rows in _segments(counts):
        if rows.stop == rows.start:
            continue
        _, scale = closed_form(xr[rows], gr[rows], w[e], b[e], eps)
        for name in ("y", "dx"):
            got = getattr(out, name).reshape(-1, H)[rows]
            exp = getattr(loop, name).reshape(-1, H)[rows]
            norm = max(exp.double().norm().item(), 1e-300)
            bound = 2 * u_out + 32 * u * getattr(scale, name).norm().item() / norm
            assert rel_l2(got, exp) <= bound, f"{what} expert {e} {name}: {rel_l2(got, exp):.3e} > {bound:.3e}"
        n = rows.stop - rows.start
        for name, sc in (("dw", scale.dw), ("db", scale.db)):
            got = getattr(out, name)[e].double().reshape(-1)
            exp = getattr(loop, name)[e].double().reshape(-1)
            u_param = torch.finfo(getattr(out, name).dtype).eps / 2
            tol = 32 * u * sc.double().reshape(-1).to(exp.device) * math.log2(max(2, n * H)) + 2 * u_param * exp.abs()
            assert torch.all((got - exp).abs() <= tol), f"{what} expert {e} {name}: {got.tolist()} vs {exp.tolist()}"


def _case(device, backend, counts, H, dtype, layout="contiguous", pad=0, param_dtype=torch.float32, offsets_dtype=torch.int64):
    """counts rows per expert, then pad rows of no expert; the layouts' row counts are
    fitted by scaling the last expert's count."""
    gen = torch.Generator().manual_seed(seed_for("grouped", device, backend, tuple(counts), H, dtype, layout, pad, param_dtype))
    M = sum(counts) + pad
    x = make_rows(M, H, dtype, device, layout, gen)
    rows = x.numel() // H
    counts = list(counts[:-1]) + [counts[-1] + rows - M] if counts else counts  # 3d / 4d layouts have more rows
    g = make_rows(M, H, dtype, device, layout, gen)
    w, b = make_experts(len(counts), param_dtype, device, gen)
    offsets = offsets_of(counts, device, offsets_dtype)
    out = run_grouped(backend, x, g, w, b, offsets)
    what = f"{backend} {device} counts={counts} pad={pad} H={H} {dtype} {layout}"
    check_grouped(out, x, g, w, b, counts, what=what)
    if backend != "reference":
        loop = run_loop(backend, x, g, w, b, counts)
        check_matches_loop(out, loop, x, g, w, b, counts, exact=device == "cpu" and backend == "auto", what=what)
    return out


# ---------------------------------------------------------------------------------------
# Parity: the float64 oracle and the loop over experts
# ---------------------------------------------------------------------------------------

COUNTS = [3, 0, 5, 1]  # an empty expert in the middle


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [1, 3, 127, pytest.param(769, marks=pytest.mark.smoke), 4096])
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_matches_oracle_and_loop(device, backend, H, dtype):
    _case(device, backend, COUNTS, H, dtype, pad=2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_layouts(device, backend, dtype, layout):
    # Strided, misaligned (rows off a 16-byte boundary), transposed (copied once), 3-D, 4-D.
    _case(device, backend, [2, 0, 3], 33, dtype, layout, pad=1)


@pytest.mark.parametrize(
    "counts,pad",
    [
        ([0, 4, 3], 0),  # first expert empty
        ([4, 3, 0], 0),  # last expert empty
        ([0, 0, 5, 0], 2),  # all but one empty, rows of no expert after
        ([0, 0, 0], 3),  # every expert empty: every row belongs to none
        ([7], 0),  # E = 1
        ([7], 3),  # E = 1, rows of no expert
    ],
    ids=["first-empty", "last-empty", "one-nonempty", "all-empty", "E1", "E1-padded"],
)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_empty_experts_and_padding(device, backend, counts, pad):
    _case(device, backend, counts, 40, torch.float32, pad=pad)


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_param_dtypes(device, backend, param_dtype):
    # Each parameter's gradient comes back in its own dtype and shape.
    _case(device, backend, [2, 3], 65, torch.bfloat16, param_dtype=param_dtype)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_many_uneven_experts(device, backend):
    # E = 64 with uneven sizes (empty ones too), int32 offsets: the MoE shape.
    gen = torch.Generator().manual_seed(seed_for("many", device, backend))
    counts = [int(c) for c in (torch.rand(64, generator=gen) ** 3 * 12).long()]
    _case(device, backend, counts, 96, torch.bfloat16, pad=5, offsets_dtype=torch.int32)


VOTE_BACKENDS = [("cpu", "auto"), pytest.param("cuda", "cuda", marks=requires_cuda)]


@pytest.mark.parametrize("E", [33, 64, 70])
@pytest.mark.parametrize("H", [2048, 4096])
@pytest.mark.parametrize("device,backend", VOTE_BACKENDS)
def test_warp_vote_search(device, backend, H, E):
    # The CUDA kernels' aligned rows of 32 threads or more find their expert by a warp vote over
    # the offsets, 32 at a time (bf16: the backward at H = 2048, both directions at 4096): more
    # than one round (E > 32), a last round not full (33, 70), empty experts and padding rows.
    gen = torch.Generator().manual_seed(seed_for("vote", device, backend, H, E))
    counts = [int(c) for c in (torch.rand(E, generator=gen) ** 3 * 9).long()]
    counts[E - 1] = max(counts[E - 1], 1)  # an expert past the first round owns rows
    _case(device, backend, counts, H, torch.bfloat16, pad=7, offsets_dtype=torch.int32)


@pytest.mark.parametrize("bad", ["decreasing", "huge"])
@pytest.mark.parametrize("device,backend", VOTE_BACKENDS)
def test_warp_vote_bad_offsets_stay_in_bounds(device, backend, bad):
    # As test_bad_offsets_stay_in_bounds, on the vote's path (bf16, H = 4096; E = 40): offsets
    # sorted for the first round, bad in the second.
    gen = torch.Generator().manual_seed(seed_for("vote-bad", device, backend, bad))
    M, H, E = 48, 4096, 40
    x = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    w, b = make_experts(E, torch.float32, device, gen)
    offsets = list(range(1, 33)) + ([30, 20, 10, 5, 40, 3, 2, 1] if bad == "decreasing" else [2**40, -1] * 4)
    off = torch.tensor(offsets, dtype=torch.int64, device=device)
    first = run_grouped(backend, x, g, w, b, off)
    second = run_grouped(backend, x, g, w, b, off)
    if device == "cuda":
        torch.cuda.synchronize()
    for name in ("y", "dx", "dw", "db"):
        assert torch.isfinite(getattr(first, name)).all(), name
        assert torch.equal(getattr(first, name), getattr(second, name)), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [8, 1024, 5125, 16385, 40000])
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@requires_cuda
def test_gpu_shapes(backend, H, dtype):
    # Rows longer than the registers hold (the CUDA kernels read the rest again past 512 x 4
    # packs forward, 512 x 2 backward; Triton walks column blocks) and hostile H.
    _case("cuda", backend, [37, 0, 90, 1], H, dtype, pad=3)


# The Triton kernels walk a row in column blocks when it does not fit one block; a lowered
# one-block limit reaches that code with small H, cheaply under the interpreter.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device,backend", TRITON_BACKENDS)
def test_triton_column_blocks(device, backend, dtype, monkeypatch):
    from polynorm import triton_kernels

    monkeypatch.setattr(triton_kernels, "_MAX_ONE_BLOCK_OVERRIDE", 256)
    for direction in ("forward", "backward"):
        assert not triton_kernels._launch_config(769, dtype, direction)[2], direction
    _case(device, backend, [2, 0, 3], 769, dtype, "sliced", pad=1)


def test_cpu_op_bitwise_single_expert_op_per_expert():
    # The C++ CPU kernel shares the single-expert op's row code and sum orders: y, rstd, grad_x,
    # and each expert's grad_weight and grad_bias are bitwise polynorm::forward / backward on
    # that expert's rows. (On CUDA the two ops' kernels differ: the oracle and the loop bound apply.)
    device = "cpu"
    gen = torch.Generator().manual_seed(seed_for("bitwise-ops", device))
    counts = [5, 0, 200, 1, 130]
    x = make_rows(sum(counts) + 4, 300, torch.bfloat16, device, "sliced", gen)
    g = make_rows(sum(counts) + 4, 300, torch.bfloat16, device, "sliced", gen)
    w, b = make_experts(len(counts), torch.float32, device, gen)
    offsets = offsets_of(counts, device)
    with poisoned_outputs():
        y, rstd = torch.ops.polynorm.grouped_forward(x, w, b, offsets, EPS)
        dx, dw, db = torch.ops.polynorm.grouped_backward(g, x, w, offsets, rstd)
    for e, rows in _segments(counts):
        y_e, rstd_e = torch.ops.polynorm.forward(x[rows], w[e], b[e].reshape(1), EPS)
        dx_e, dw_e, db_e = torch.ops.polynorm.backward(g[rows], x[rows], w[e], rstd_e)
        assert torch.equal(y[rows], y_e) and torch.equal(rstd[rows], rstd_e), e
        assert torch.equal(dx[rows], dx_e), e
        assert torch.equal(dw[e], dw_e) and torch.equal(db[e].reshape(1), db_e), e


# ---------------------------------------------------------------------------------------
# Rows of no expert, M = 0, offsets forms
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_rows_of_no_expert_are_not_read(device, backend):
    # NaN in the padding rows of x and grad_y: y and grad_x are exactly 0 there, and nothing
    # else sees the NaN (every other value finite, parameter gradients included).
    gen = torch.Generator().manual_seed(seed_for("padding-nan", device, backend))
    counts, pad, H = [3, 0, 4], 5, 64
    x = make_rows(sum(counts) + pad, H, torch.float32, device, "contiguous", gen)
    g = make_rows(sum(counts) + pad, H, torch.float32, device, "contiguous", gen)
    x[sum(counts) :] = float("nan")
    g[sum(counts) :] = float("nan")
    w, b = make_experts(3, torch.float32, device, gen)
    out = run_grouped(backend, x, g, w, b, offsets_of(counts, device))
    assert not out.y[sum(counts) :].any() and not out.dx[sum(counts) :].any()
    for name in ("y", "dx", "dw", "db"):
        assert torch.isfinite(getattr(out, name)).all(), name
    xv, gv = x[: sum(counts)], g[: sum(counts)]
    inner = Grads(out.y[: sum(counts)], out.dx[: sum(counts)], out.dw, out.db)
    check_grouped(inner, xv, gv, w, b, counts, what=f"{backend} padding")
    if backend in OPS:  # the rstd cache: 0 on rows of no expert, finite elsewhere
        with poisoned_outputs():
            _, rstd = getattr(torch.ops.polynorm, OPS[backend][0])(x, w, b, offsets_of(counts, device), EPS)
        assert not rstd[sum(counts) :].any() and torch.isfinite(rstd).all()


@pytest.mark.parametrize("shape", [(0, 16), (0, 3, 16)])
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_empty_input(device, backend, shape):
    x = torch.empty(shape, device=device, requires_grad=True)
    w = torch.randn(3, 3, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True)
    y = polynorm.poly_norm_grouped(x, w, b, torch.zeros(3, dtype=torch.int64, device=device), backend=backend)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))
    if backend != "reference":
        fwd, bwd = OPS[backend]
        _, rstd = getattr(torch.ops.polynorm, fwd)(x.detach(), w.detach(), b.detach(), torch.zeros(3, dtype=torch.int32, device=device), EPS)
        assert rstd.shape == (0, 3)
        _, dw, db = getattr(torch.ops.polynorm, bwd)(torch.zeros_like(x), x.detach(), w.detach(), torch.zeros(3, dtype=torch.int64, device=device), rstd)
        assert dw.shape == (3, 3) and db.shape == (3,) and not dw.any() and not db.any()


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_offsets_forms_agree_bitwise(device, backend):
    # int64 offsets, int32 offsets, a strided offsets view, int32 and int64 counts: one result.
    gen = torch.Generator().manual_seed(seed_for("offsets-forms", device, backend))
    counts = [4, 0, 6, 2]
    x = make_rows(14, 48, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(14, 48, torch.bfloat16, device, "contiguous", gen)
    w, b = make_experts(4, torch.float32, device, gen)
    base = run_grouped(backend, x, g, w, b, offsets_of(counts, device))
    strided = torch.stack([offsets_of(counts, device), torch.full((4,), 10**6, device=device)], 1)[:, 0]
    assert strided.stride(0) == 2
    forms = {
        "int32": dict(offsets=offsets_of(counts, device, torch.int32)),
        "strided": dict(offsets=strided),
        "counts-int32": dict(counts=torch.tensor(counts, dtype=torch.int32, device=device)),
        "counts-int64": dict(counts=torch.tensor(counts, dtype=torch.int64, device=device)),
    }
    for name, kwargs in forms.items():
        out = run_grouped(backend, x, g, w, b, **kwargs)
        for field in ("y", "dx", "dw", "db"):
            assert torch.equal(getattr(out, field), getattr(base, field)), (name, field)


@pytest.mark.parametrize(
    "offsets",
    [[3, 1, 8], [-5, 4, 8], [3, 6, 1000], [2**40, 2**40 + 1, -1]],
    ids=["decreasing", "negative", "past-M", "huge"],
)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_bad_offsets_stay_in_bounds(device, backend, offsets):
    # Offsets that decrease, are negative or exceed M give undefined results, but the kernels
    # read and write only inside their tensors: outputs finite, of the right shapes, and the
    # same bits on a second run. (On CUDA an out-of-bounds access would surface at the sync.)
    gen = torch.Generator().manual_seed(seed_for("bad-offsets", device, backend, tuple(offsets)))
    x = make_rows(8, 40, torch.float32, device, "contiguous", gen)
    g = make_rows(8, 40, torch.float32, device, "contiguous", gen)
    w, b = make_experts(3, torch.float32, device, gen)
    off = torch.tensor(offsets, dtype=torch.int64, device=device)
    first = run_grouped(backend, x, g, w, b, off)
    second = run_grouped(backend, x, g, w, b, off)
    if device == "cuda":
        torch.cuda.synchronize()
    for name in ("y", "dx", "dw", "db"):
        assert torch.isfinite(getattr(first, name)).all(), name
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    if offsets == [3, 6, 1000]:  # sorted: values past M act as M
        clamped = run_grouped(backend, x, g, w, b, offsets_of([3, 3, 2], device))
        for name in ("y", "dx", "dw", "db"):
            assert torch.equal(getattr(first, name), getattr(clamped, name)), name


# ---------------------------------------------------------------------------------------
# Determinism of the parameter gradients
# ---------------------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_param_grads_deterministic_and_independent_of_other_experts(device, backend):
    # Bitwise the same on every run, and each expert's grad_weight / grad_bias bitwise what the
    # same op gives for that expert's rows alone (E = 1): the segment's sum order depends only
    # on its length, not on where it starts or what the other experts hold.
    gen = torch.Generator().manual_seed(seed_for("determinism", device, backend))
    interpreted = device == "cpu" and backend == "triton"  # slow: fewer rows, still segments past 256
    counts = [75, 0, 130, 9, 300] if interpreted else [300, 0, 517, 9, 1200]
    M, H = sum(counts) + 7, 64 if interpreted else 256
    fwd, bwd = (getattr(torch.ops.polynorm, name) for name in OPS[backend])
    x = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    w, b = make_experts(len(counts), torch.float32, device, gen)
    offsets = offsets_of(counts, device)
    with poisoned_outputs():
        _, rstd = fwd(x, w, b, offsets, EPS)
        runs = [bwd(g, x, w, offsets, rstd) for _ in range(3)]
    for other in runs[1:]:
        for got, exp in zip(other, runs[0]):
            assert torch.equal(got, exp)
    _, dw, db = runs[0]
    for e, rows in _segments(counts):
        if rows.stop == rows.start:
            continue
        one = offsets_of([rows.stop - rows.start], device)
        _, rstd_e = fwd(x[rows], w[e : e + 1], b[e : e + 1], one, EPS)
        dx_e, dw_e, db_e = bwd(g[rows], x[rows], w[e : e + 1], one, rstd_e)
        assert torch.equal(dw[e], dw_e[0]) and torch.equal(db[e], db_e[0]), e
        assert torch.equal(runs[0][0][rows], dx_e), e


def test_cpu_deterministic_any_thread_count():
    gen = torch.Generator().manual_seed(seed_for("grouped-threads"))
    counts = [100, 0, 250, 3]
    x = torch.randn(sum(counts) + 2, 333, generator=gen)
    g = torch.randn(sum(counts) + 2, 333, generator=gen)
    w, b = make_experts(4, torch.float32, "cpu", gen)
    offsets = offsets_of(counts, "cpu")
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y, rstd = torch.ops.polynorm.grouped_forward(x, w, b, offsets, EPS)
            results.append((y, rstd, *torch.ops.polynorm.grouped_backward(g, x, w, offsets, rstd)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for got, exp in zip(other, results[0]):
            assert torch.equal(got, exp)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def _inputs(device, E=3, M=6, H=16):
    gen = torch.Generator().manual_seed(seed_for("grouped-errors", device, E, M, H))
    x = torch.randn(M, H, generator=gen).to(device)
    w, b = make_experts(E, torch.float32, device, gen)
    return x, w, b, offsets_of([2, 1, 3][:E], device)


FORWARD_ERRORS = [
    ("weight 1-D", lambda x, w, b, o: (x, w[0], b, o), "expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got [3]"),
    ("weight [E, 2]", lambda x, w, b, o: (x, w[:, :2], b, o), "expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got [3, 2]"),
    ("weight [0, 3]", lambda x, w, b, o: (x, w[:0], b[:0], o[:0]), "expected weight to have at least one expert (E >= 1), got shape [0, 3]"),
    ("int weight", lambda x, w, b, o: (x, w.long(), b, o), "expected weight to be float32, float64, float16 or bfloat16"),
    ("bias [E+1]", lambda x, w, b, o: (x, w, torch.cat([b, b[:1]]), o), "expected bias of shape [3] or [3, 1] (weight's E experts), got [4]"),
    ("bias [E, 2]", lambda x, w, b, o: (x, w, torch.stack([b, b], 1), o), "expected bias of shape [3] or [3, 1] (weight's E experts), got [3, 2]"),
    ("float offsets", lambda x, w, b, o: (x, w, b, o.float()), "expected offsets to be int32 or int64, got"),
    ("int16 offsets", lambda x, w, b, o: (x, w, b, o.to(torch.int16)), "expected offsets to be int32 or int64, got"),
    ("offsets 2-D", lambda x, w, b, o: (x, w, b, o[None]), "expected offsets of shape [3] (one cumulative end offset per expert of weight), got [1, 3]"),
    ("offsets [E-1]", lambda x, w, b, o: (x, w, b, o[:2]), "expected offsets of shape [3] (one cumulative end offset per expert of weight), got [2]"),
    ("H = 0", lambda x, w, b, o: (x[:, :0], w, b, o), "expected x to have a last dimension H >= 1"),
    ("int x", lambda x, w, b, o: (x.int(), w, b, o), "expected x to be float32, float64, float16 or bfloat16"),
]
_FWD_OPS = ["grouped_forward", pytest.param("grouped_forward_triton", marks=[requires_triton])]


def _triton_runs_on(device):
    return device == "cuda" or INTERPRET


@pytest.mark.parametrize("op", _FWD_OPS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,message", FORWARD_ERRORS, ids=[e[0] for e in FORWARD_ERRORS])
def test_forward_errors(device, op, name, make, message):
    if op.endswith("triton") and not _triton_runs_on(device):
        pytest.skip("the Triton op runs CPU tensors only under TRITON_INTERPRET=1")
    x, w, b, o = _inputs(device)
    op_name = op if op.endswith("triton") else "grouped_forward"
    with pytest.raises(RuntimeError, match=re.escape(f"polynorm.{op_name}: {message}")):
        getattr(torch.ops.polynorm, op)(*make(x, w, b, o), EPS)
    if device == "cuda":
        torch.ones(4, device="cuda").sum().item()  # no deferred illegal-address error


BACKWARD_ERRORS = [
    ("grad_y shape", lambda g, x, w, o, r: (g[:, :3], x, w, o, r), "expected grad_y to have x's shape [6, 16], got [6, 3]"),
    ("rstd shape", lambda g, x, w, o, r: (g, x, w, o, r[:3]), "expected rstd of shape [6, 3]"),
    ("weight shape", lambda g, x, w, o, r: (g, x, w[:, :1], o, r), "expected weight of shape [E, 3]"),
    ("offsets dtype", lambda g, x, w, o, r: (g, x, w, o.double(), r), "expected offsets to be int32 or int64"),
    ("offsets length", lambda g, x, w, o, r: (g, x, w, o[1:], r), "expected offsets of shape [3]"),
]
_BWD_OPS = [("grouped_forward", "grouped_backward"), pytest.param("grouped_forward_triton", "grouped_backward_triton", marks=[requires_triton])]


@pytest.mark.parametrize("fwd,bwd", _BWD_OPS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,message", BACKWARD_ERRORS, ids=[e[0] for e in BACKWARD_ERRORS])
def test_backward_errors(device, fwd, bwd, name, make, message):
    if bwd.endswith("triton") and not _triton_runs_on(device):
        pytest.skip("the Triton op runs CPU tensors only under TRITON_INTERPRET=1")
    x, w, b, o = _inputs(device)
    _, rstd = getattr(torch.ops.polynorm, fwd)(x, w, b, o, EPS)
    with pytest.raises(RuntimeError, match=re.escape(f"polynorm.{bwd}: {message}")):
        getattr(torch.ops.polynorm, bwd)(*make(torch.randn_like(x), x, w, o, rstd))


# The Python checks (the fake kernels, the Triton ops) against the C++ ones: the same
# messages (polynorm/_common.py keeps csrc/ops.cpp's words and order).
@pytest.mark.parametrize("name,make", [e[:2] for e in FORWARD_ERRORS], ids=[e[0] for e in FORWARD_ERRORS])
def test_forward_python_checks_match_cpp(name, make):
    assert_python_checks_match_cpp(torch.ops.polynorm.grouped_forward, (*make(*_inputs("cpu")), EPS))


@pytest.mark.parametrize("name,make", [e[:2] for e in BACKWARD_ERRORS], ids=[e[0] for e in BACKWARD_ERRORS])
def test_backward_python_checks_match_cpp(name, make):
    x, w, b, o = _inputs("cpu")
    _, rstd = torch.ops.polynorm.grouped_forward(x, w, b, o, EPS)
    assert_python_checks_match_cpp(torch.ops.polynorm.grouped_backward, make(torch.randn_like(x), x, w, o, rstd))


@pytest.mark.parametrize("which", ["weight", "bias", "offsets"])
def test_device_mismatch_meta(which):
    # Runs without a GPU: an argument on the meta device sends the call to the fake kernel,
    # which must refuse it, naming the argument.
    x, w, b, o = _inputs("cpu")
    args = {"weight": w, "bias": b, "offsets": o}
    args[which] = args[which].to("meta")
    with pytest.raises(RuntimeError, match=rf"polynorm\.grouped_forward: expected {which} on x's device cpu, got meta"):
        torch.ops.polynorm.grouped_forward(x, args["weight"], args["bias"], args["offsets"], EPS)


@requires_cuda
@pytest.mark.parametrize("which", ["weight", "bias", "offsets"])
def test_device_mismatch_cuda(which):
    x, w, b, o = _inputs("cuda")
    args = {"weight": w, "bias": b, "offsets": o}
    args[which] = args[which].cpu()
    with pytest.raises(RuntimeError, match=rf"polynorm\.grouped_forward: expected {which} on x's device cuda:0, got cpu"):
        torch.ops.polynorm.grouped_forward(x, args["weight"], args["bias"], args["offsets"], EPS)
    torch.ones(4, device="cuda").sum().item()


def test_api_errors():
    x, w, b, o = _inputs("cpu")
    f = polynorm.poly_norm_grouped
    with pytest.raises(TypeError, match=r"polynorm\.poly_norm_grouped: expected exactly one of offsets and counts, got neither"):
        f(x, w, b)
    with pytest.raises(TypeError, match=r"polynorm\.poly_norm_grouped: expected exactly one of offsets and counts, got both"):
        f(x, w, b, o, counts=torch.tensor([2, 1, 3]))
    with pytest.raises(TypeError, match=r"polynorm\.poly_norm_grouped: expected offsets to be a Tensor, got list"):
        f(x, w, b, [2, 3, 6])
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected counts to be int32 or int64, got torch\.float32"):
        f(x, w, b, counts=torch.tensor([2.0, 1.0, 3.0]))
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected counts of shape \[3\] \(rows per expert of weight\), got \[1, 3\]"):
        f(x, w, b, counts=torch.tensor([[2, 1, 3]]))
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected counts of shape \[3\] \(rows per expert of weight\), got \[2\]"):
        f(x, w, b, counts=torch.tensor([2, 1]))
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected counts on x's device cpu, got meta"):
        f(x, w, b, counts=torch.tensor([2, 1, 3], device="meta"))
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm_grouped: expected backend to be one of auto, cuda, triton, reference, got 'nope'"):
        f(x, w, b, o, backend="nope")
    with pytest.raises(RuntimeError, match=r"backend 'cuda' expected x on a CUDA device \(or the meta device\), got cpu"):
        f(x, w, b, o, backend="cuda")
    with pytest.raises(ValueError, match=r"polynorm\.grouped_forward: expected eps to be finite and >= 0, got -1"):
        f(x, w, b, o, eps=-1.0)
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected weight of shape \[E, 3\]"):
        f(x, w[:, :2], b, o, backend="reference")
    with pytest.raises(RuntimeError, match=r"polynorm\.reference\.poly_norm_grouped: expected bias of shape \[3\] or \[3, 1\]"):
        reference.poly_norm_grouped(x, w, b[:2], o)


def test_double_backward_is_refused():
    x, w, b, o = _inputs("cpu")
    x.requires_grad_(True)
    y = polynorm.poly_norm_grouped(x, w, b, o)
    (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"polynorm\.grouped_backward: differentiating PolyNorm's gradient"):
        dx.sum().backward()


def test_ops_registered_for_cpu_and_cuda():
    # Without a GPU a CUDA tensor cannot reach the CUDA kernel; both dispatch keys must have a
    # kernel (the real one, or the "not built" stub).
    for op in ("grouped_forward", "grouped_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CPU")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CUDA")


# ---------------------------------------------------------------------------------------
# Operator checks, gradcheck, the module
# ---------------------------------------------------------------------------------------


def _opcheck_samples(device):
    samples = []
    for i, (shape, dtype, counts, param_dtype) in enumerate(
        [
            ((6, 16), torch.float32, [2, 0, 3], torch.float32),
            ((2, 3, 33), torch.bfloat16, [4, 2], torch.float16),
            ((5, 8), torch.float64, [5], torch.float64),
            ((0, 9), torch.float32, [0, 0], torch.float32),
        ]
    ):
        gen = torch.Generator().manual_seed(seed_for("grouped-opcheck", device, i))
        x = torch.randn(*shape, generator=gen).to(dtype).to(device)
        w, b = make_experts(len(counts), param_dtype, device, gen)
        if i == 1:
            b = b.reshape(-1, 1)  # [E, 1] bias
        samples.append((x, w, b, offsets_of(counts, device, torch.int32 if i % 2 else torch.int64)))
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for x, w, b, o in _opcheck_samples(device):
        for requires_grad in (False, True):
            args = (x.detach().requires_grad_(requires_grad), w.detach().requires_grad_(requires_grad),
                    b.detach().requires_grad_(requires_grad), o, EPS)  # fmt: skip
            torch.library.opcheck(torch.ops.polynorm.grouped_forward.default, args)
        _, rstd = torch.ops.polynorm.grouped_forward(x, w, b, o, EPS)
        torch.library.opcheck(torch.ops.polynorm.grouped_backward.default, (torch.randn_like(x), x, w, o, rstd))


# Under the interpreter the Triton ops are opaque custom ops whose kernels run eagerly: AOT
# dispatch cannot record them (tests/test_triton.py does the same); the GPU run covers it.
_TRITON_OPCHECK = {
    "cpu": ("test_schema", "test_autograd_registration", "test_faketensor"),
    "cuda": ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
}


@requires_triton
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=requires_interpreter), pytest.param("cuda", marks=requires_cuda)])
def test_opcheck_triton(device):
    tests = _TRITON_OPCHECK[device]
    for x, w, b, o in _opcheck_samples(device):
        for requires_grad in (False, True):
            args = (x.detach().requires_grad_(requires_grad), w.detach().requires_grad_(requires_grad),
                    b.detach().requires_grad_(requires_grad), o, EPS)  # fmt: skip
            torch.library.opcheck(torch.ops.polynorm.grouped_forward_triton.default, args, test_utils=tests)
        _, rstd = torch.ops.polynorm.grouped_forward_triton(x, w, b, o, EPS)
        torch.library.opcheck(
            torch.ops.polynorm.grouped_backward_triton.default, (torch.randn_like(x), x, w, o, rstd), test_utils=tests
        )


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_gradcheck_float64(device, backend):
    gen = torch.Generator().manual_seed(seed_for("grouped-gradcheck", device, backend))
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(3, 3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(3, 1, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    offsets = offsets_of([2, 0, 4], device)  # and one row of no expert
    assert torch.autograd.gradcheck(lambda *a: polynorm.poly_norm_grouped(*a, offsets, backend=backend), (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    m = polynorm.GroupedPolyNorm(4, device=device)
    assert m.weight.shape == (4, 3) and m.bias.shape == (4,)
    assert torch.equal(m.weight.detach().cpu(), torch.full((4, 3), 1 / 3))
    assert torch.equal(m.bias.detach().cpu(), torch.zeros(4))
    assert repr(m) == "GroupedPolyNorm(num_experts=4, eps=1e-06, backend='auto')"
    gen = torch.Generator().manual_seed(seed_for("grouped-module", device))
    with torch.no_grad():
        m.weight.copy_(make_experts(4, torch.float32, device, gen)[0])
    x = torch.randn(2, 5, 40, generator=gen).to(torch.bfloat16).to(device)
    counts = torch.tensor([3, 0, 6, 1], device=device)
    y = m(x, counts=counts)
    assert torch.equal(y, m(x, offsets=counts.cumsum(0)))
    assert torch.equal(y, polynorm.poly_norm_grouped(x, m.weight, m.bias, counts.cumsum(0), eps=m.eps))
    with torch.no_grad():
        m.weight.mul_(2)
        m.bias.add_(1)
    m.reset_parameters()
    assert torch.equal(m.weight.detach().cpu(), torch.full((4, 3), 1 / 3)) and not m.bias.any()
    m64 = polynorm.GroupedPolyNorm(2, eps=1e-5, dtype=torch.float64, backend="reference")
    assert m64.weight.dtype == torch.float64 and "eps=1e-05" in repr(m64)


def test_module_validates_arguments():
    with pytest.raises(ValueError, match=r"polynorm\.GroupedPolyNorm: expected num_experts >= 1, got 0"):
        polynorm.GroupedPolyNorm(0)
    with pytest.raises(TypeError, match=r"polynorm\.GroupedPolyNorm: expected num_experts to be an int, got float"):
        polynorm.GroupedPolyNorm(2.0)
    with pytest.raises(ValueError, match=r"polynorm\.GroupedPolyNorm: expected backend to be one of"):
        polynorm.GroupedPolyNorm(2, backend="nope")
    with pytest.raises(ValueError, match=r"polynorm\.GroupedPolyNorm: expected eps to be finite and >= 0"):
        polynorm.GroupedPolyNorm(2, eps=float("nan"))


@pytest.mark.parametrize("backend", ["auto", "cuda", "reference", pytest.param("triton", marks=requires_triton)])
def test_meta_tensors(backend):
    # Shape inference, forward and backward, on the meta device (fake kernels).
    x = torch.empty(4, 6, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    m = polynorm.GroupedPolyNorm(3, device="meta", backend=backend)
    y = m(x, counts=torch.empty(3, dtype=torch.int64, device="meta"))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "meta"
    y.sum().backward()
    assert x.grad.shape == x.shape and m.weight.grad.shape == (3, 3) and m.bias.grad.shape == (3,)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_inference_mode_x(device, backend):
    # Activations made under inference_mode, trainable parameters: x is copied once for backward.
    with torch.inference_mode():
        x = torch.randn(6, 24, device=device)
        offsets = offsets_of([2, 4], device)
    m = polynorm.GroupedPolyNorm(2, device=device, backend=backend)
    m(x, offsets).sum().backward()
    assert m.weight.grad is not None and torch.isfinite(m.weight.grad).all()


def test_reference_matches_loop_of_reference():
    # The grouped oracle is the single-expert oracle on each expert's rows.
    gen = torch.Generator().manual_seed(seed_for("reference-loop"))
    counts = [3, 0, 4]
    x = torch.randn(9, 50, generator=gen, dtype=torch.float64)
    w, b = make_experts(3, torch.float64, "cpu", gen)
    y = reference.poly_norm_grouped(x, w, b, offsets_of(counts, "cpu"), compute_dtype=torch.float64)
    for e, rows in _segments(counts):
        torch.testing.assert_close(y[rows], reference.poly_norm(x[rows], w[e], b[e], compute_dtype=torch.float64))
    assert not y[7:].any()


# ---------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, no host synchronisation
# ---------------------------------------------------------------------------------------

COMPILE_CASES = [
    pytest.param("cpu", "auto", id="cpu-auto"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter], id="cpu-triton"),
    pytest.param("cpu", "reference", id="cpu-reference"),
    pytest.param("cuda", "cuda", marks=requires_cuda, id="cuda-cuda"),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda], id="cuda-triton"),
    pytest.param("cuda", "reference", marks=requires_cuda, id="cuda-reference"),
]


@pytest.mark.smoke
@pytest.mark.parametrize("use_counts", [False, True], ids=["offsets", "counts"])
@pytest.mark.parametrize("device,backend", COMPILE_CASES)
def test_compile_fullgraph_matches_eager(device, backend, use_counts):
    # One graph (fullgraph=True raises at a graph break); forward and backward as eager: the
    # kernels' y bitwise (the same kernel runs), gradients within tolerance.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(seed_for("grouped-compile", device, backend, use_counts))
    module = polynorm.GroupedPolyNorm(4, device=device, backend=backend)
    with torch.no_grad():
        w, b = make_experts(4, torch.float32, device, gen)
        module.weight.copy_(w)
        module.bias.copy_(b)
    x = make_rows(12, 64, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(12, 64, torch.bfloat16, device, "contiguous", gen)
    counts = torch.tensor([3, 0, 6, 1], device=device)
    arg = {"counts": counts} if use_counts else {"offsets": counts.cumsum(0)}
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(module, backend=counter, fullgraph=True)

    def run(fn):
        x_ = x.detach().clone().requires_grad_(True)
        y = fn(x_, **arg)
        dx, dw, db = torch.autograd.grad(y, (x_, module.weight, module.bias), g)
        return Grads(y.detach().clone(), dx, dw, db)

    eager, comp = run(module), run(compiled)
    assert counter.frame_count == 1
    if backend == "reference":
        torch.testing.assert_close(comp.y, eager.y)  # Inductor fuses the reference in its own order
    else:
        assert torch.equal(comp.y, eager.y)
    for name in ("dx", "dw", "db"):
        torch.testing.assert_close(getattr(comp, name), getattr(eager, name), msg=lambda m: f"{name}: {m}")
    check_grouped(comp, x, g, w, b, [3, 0, 6, 1], eps=module.eps, what=f"compiled {device} {backend}")
    torch._dynamo.reset()


@pytest.mark.parametrize("device,backend", COMPILE_CASES)
def test_compile_dynamic_rows_no_recompile(device, backend):
    # With a dynamic number of rows (and new group sizes) the compiled graph is reused: the
    # fake kernels take symbolic shapes, and nothing guards on M or on the offsets' values.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(seed_for("grouped-dynamic", device, backend))
    module = polynorm.GroupedPolyNorm(3, device=device, backend=backend)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for counts in ([2, 0, 3], [5, 4, 0], [1, 9, 7]):
            M = sum(counts) + 1
            x = make_rows(M, 48, torch.float32, device, "contiguous", gen).requires_grad_(True)
            counts = torch.tensor(counts, device=device)
            y = compiled(x, counts=counts)
            y_e = module(x, counts=counts)
            torch.testing.assert_close(y, y_e)
            (dx,) = torch.autograd.grad(y.sum(), x)
            (dx_e,) = torch.autograd.grad(y_e.sum(), x)
            torch.testing.assert_close(dx, dx_e)
    torch._dynamo.reset()


# eps in every form eager mode takes, compiled. Dynamo turns a NumPy scalar into a 0-d tensor,
# and a tensor's value is data the trace cannot see: the kernel backends then call
# polynorm::grouped_forward_tensor_eps, the reference polynorm::checked_eps, each of which reads
# and checks eps when the graph runs (as poly_norm and poly_norm_mul do: tests/test_pt2.py).

# (device, backend, torch.compile backend). On the CPU aot_eager (Dynamo and AOTAutograd,
# whose graphs are recorded and inspected); on a GPU Inductor too.
EPS_COMPILE_CASES = [
    pytest.param("cpu", "auto", "aot_eager", id="cpu-auto-aot_eager"),
    pytest.param("cpu", "triton", "aot_eager", marks=[requires_triton, requires_interpreter], id="cpu-triton-aot_eager"),
    pytest.param("cpu", "reference", "aot_eager", id="cpu-reference-aot_eager"),
    *(
        pytest.param("cuda", backend, compiler, marks=[requires_cuda] + ([requires_triton] if backend == "triton" else []),
                     id=f"cuda-{backend}-{compiler}")
        for backend in ("cuda", "triton", "reference")
        for compiler in ("aot_eager", "inductor")
    ),
]
# The op a compiled graph calls for a tensor or NumPy eps, by backend.
TENSOR_EPS_OPS = {backend: "polynorm.grouped_forward_tensor_eps.default" for backend in ("auto", "cuda", "triton")}
TENSOR_EPS_OPS["reference"] = "polynorm.checked_eps.default"


def _compile_backend(compiler: str):
    return torch._dynamo.testing.AotEagerAndRecordGraphs() if compiler == "aot_eager" else compiler


@pytest.mark.parametrize("form", list(EPS_FORMS))
@pytest.mark.parametrize("device,backend,compiler", EPS_COMPILE_CASES)
def test_compile_eps_forms(device, backend, compiler, form):
    # One graph, forward and backward as eager, and, for a second eps value, the oracle at that
    # value: a tensor or NumPy eps is an input of the graph, never a constant of the trace.
    pytest.importorskip("numpy")
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(seed_for("grouped-eps-forms", device, backend, compiler, form))
    counts, pad = [3, 0, 6, 1], 2
    x = make_rows(sum(counts) + pad, 64, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(sum(counts) + pad, 64, torch.bfloat16, device, "contiguous", gen)
    w, b = make_experts(len(counts), torch.float32, device, gen)
    offsets = offsets_of(counts, device)

    def fn(x, w, b, eps):
        return polynorm.poly_norm_grouped(x, w, b, offsets, eps=eps, backend=backend)

    def run(f, eps) -> Grads:
        args = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
        with poisoned_outputs():
            y = f(*args, eps)
            return Grads(y.detach(), *torch.autograd.grad(y, args, g))

    compile_backend = _compile_backend(compiler)
    compiled = torch.compile(fn, backend=compile_backend, fullgraph=True)
    compare_compiled_eps(run, fn, compiled, form, exact_first=backend != "reference",
                         check=lambda out, eps, what: check_grouped(out, x, g, w, b, counts, eps=eps,
                                                                    what=f"{device} {backend} {what}"))
    if compiler == "aot_eager" and form != "float":
        targets = {str(node.target) for gm in compile_backend.fw_graphs for node in gm.graph.nodes}
        assert TENSOR_EPS_OPS[backend] in targets, sorted(targets)
    torch._dynamo.reset()


@pytest.mark.parametrize("form", ["numpy.float64", "tensor-0d"])
@pytest.mark.parametrize("device,backend,compiler", EPS_COMPILE_CASES)
def test_compile_eps_checked_when_graph_runs(device, backend, compiler, form):
    # A bad eps in a form whose value the trace cannot see is refused when the graph runs, with
    # poly_norm_grouped's ValueError, by every backend.
    pytest.importorskip("numpy")
    torch._dynamo.reset()
    x, w, b, o = _inputs(device)
    compiled = torch.compile(
        lambda x, eps: polynorm.poly_norm_grouped(x, w, b, o, eps=eps, backend=backend),
        backend=_compile_backend(compiler),
        fullgraph=True,
    )
    compiled(x, EPS_FORMS[form](1e-6))
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=re.escape("polynorm.poly_norm_grouped: expected eps to be finite and >= 0")):
            compiled(x, EPS_FORMS[form](bad))
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_tensor_eps(device):
    # The op torch.compile calls for a tensor or NumPy eps: schema, fake kernel, autograd
    # registration and AOT dispatch; and its fake kernel's refusals.
    for x, w, b, o in _opcheck_samples(device):
        for requires_grad in (False, True):
            args = [t.detach().clone().requires_grad_(requires_grad) for t in (x, w, b)]
            torch.library.opcheck(
                torch.ops.polynorm.grouped_forward_tensor_eps.default, (*args, o, torch.tensor(1e-5), "auto")
            )
    x, w, b, o = _inputs(device)
    op = torch.ops.polynorm.grouped_forward_tensor_eps
    y, rstd = op(x, w, b, o, torch.tensor(0.25, dtype=torch.float64), "auto")
    y_float, rstd_float = torch.ops.polynorm.grouped_forward(x, w, b, o, 0.25)
    assert torch.equal(y, y_float) and torch.equal(rstd, rstd_float)
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm_grouped: expected eps to be finite and >= 0, got -1"):
        op(x, w, b, o, torch.tensor(-1.0), "auto")
    with pytest.raises(TypeError, match=r"polynorm\.poly_norm_grouped: expected eps to be a real number, got a tensor of shape \[2\]"):
        op(x.to("meta"), w.to("meta"), b.to("meta"), o.to("meta"), torch.ones(2, device="meta"), "auto")
    with pytest.raises(ValueError, match=r"polynorm\.grouped_forward_tensor_eps: expected backend to be one of auto, cuda, triton, got 'reference'"):
        op(x.to("meta"), w.to("meta"), b.to("meta"), o.to("meta"), torch.ones((), device="meta"), "reference")


@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@requires_cuda
def test_no_host_sync(backend):
    # Offsets and counts are read on the device: forward and backward never synchronise.
    gen = torch.Generator().manual_seed(seed_for("grouped-no-sync", backend))
    x = make_rows(40, 256, torch.bfloat16, "cuda", "contiguous", gen).requires_grad_(True)
    g = make_rows(40, 256, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_experts(4, torch.float32, "cuda", gen)
    w.requires_grad_(True)
    b.requires_grad_(True)
    counts = torch.tensor([10, 0, 25, 3], device="cuda")
    polynorm.poly_norm_grouped(x, w, b, counts=counts, backend=backend).backward(g)  # warm-up (Triton compiles)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        polynorm.poly_norm_grouped(x, w, b, counts=counts, backend=backend).backward(g)
        polynorm.poly_norm_grouped(x, w, b, counts.cumsum(0), backend=backend).backward(g)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@requires_cuda
def test_cuda_graph_capture(backend):
    # The module's forward and backward captured in a CUDA graph replay on new data and new
    # group sizes copied into the static counts.
    gen = torch.Generator().manual_seed(seed_for("grouped-graph", backend))
    module = polynorm.GroupedPolyNorm(4, device="cuda", backend=backend)
    w, b = make_experts(4, torch.float32, "cuda", gen)
    with torch.no_grad():
        module.weight.copy_(w)
        module.bias.copy_(b)
    static_x = make_rows(64, 1024, torch.bfloat16, "cuda", "contiguous", gen).requires_grad_(True)
    static_g = make_rows(64, 1024, torch.bfloat16, "cuda", "contiguous", gen)
    static_counts = torch.tensor([16, 0, 40, 8], device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            module(static_x, counts=static_counts).backward(static_g)
    torch.cuda.current_stream().wait_stream(stream)
    static_x.grad = module.weight.grad = module.bias.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = module(static_x, counts=static_counts)
        static_y.backward(static_g)
    for counts in ([1, 30, 0, 20], [0, 0, 64, 0]):
        x_new = make_rows(64, 1024, torch.bfloat16, "cuda", "contiguous", gen)
        g_new = make_rows(64, 1024, torch.bfloat16, "cuda", "contiguous", gen)
        with torch.no_grad():
            static_x.copy_(x_new)
            static_g.copy_(g_new)
            static_counts.copy_(torch.tensor(counts))
        graph.replay()
        eager = run_grouped(backend, x_new, g_new, w, b, counts=torch.tensor(counts, device="cuda"), eps=module.eps)
        assert torch.equal(static_y, eager.y) and torch.equal(static_x.grad, eager.dx)
        assert torch.equal(module.weight.grad, eager.dw) and torch.equal(module.bias.grad, eager.db)


# ---------------------------------------------------------------------------------------
# Batch invariance, and tensors on a second GPU
# ---------------------------------------------------------------------------------------

GPU_KERNELS = ["cuda", pytest.param("triton", marks=requires_triton)]


def _uneven_counts(n: int, E: int, e: int, gen: torch.Generator) -> list[int]:
    """n rows over E experts at random cut points (so some experts are empty), expert e with at
    least one row."""
    cuts = sorted(torch.randint(0, n + 1, (E - 1,), generator=gen).tolist())
    counts = [hi - lo for lo, hi in zip([0] + cuts, cuts + [n])]
    if counts[e] == 0:
        donor = max(range(E), key=lambda i: counts[i])
        counts[donor] -= 1
        counts[e] += 1
    return counts


@requires_cuda
@pytest.mark.parametrize("backend", GPU_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("H", [3, 1024, 5125, 16385, 40000])
def test_batch_invariance(backend, dtype, H):
    # The launch shape depends on H and the dtype only: a row's y, rstd and grad_x are bitwise
    # the same as its expert's only row (every other expert empty) and anywhere in its expert's
    # segment of a batch of any size, the other rows split unevenly over the experts (some
    # empty), with rows of no expert after. As tests/test_kernels.py's test_batch_invariance
    # does for PolyNorm, the row lands at a random place.
    fwd, bwd = (getattr(torch.ops.polynorm, name) for name in OPS[backend])
    gen = torch.Generator().manual_seed(seed_for("grouped-batch", backend, dtype, H))
    E, e = 4, 2
    sizes = [1, 255, 256, 257] + ([4096] if H <= 5125 else [])
    big_x = make_rows(max(sizes) + 2, H, dtype, "cuda", "contiguous", gen)
    big_g = make_rows(max(sizes) + 2, H, dtype, "cuda", "contiguous", gen)
    w, b = make_experts(E, torch.float32, "cuda", gen)
    row_x, row_g = big_x[0:1].clone(), big_g[0:1].clone()
    alone = offsets_of([1 if i == e else 0 for i in range(E)], "cuda")
    y_alone, rstd_alone = fwd(row_x, w, b, alone, EPS)
    dx_alone, _, _ = bwd(row_g, row_x, w, alone, rstd_alone)
    for n in sizes:
        counts = _uneven_counts(n, E, e, gen)
        at = sum(counts[:e]) + int(torch.randint(0, counts[e], (1,), generator=gen))
        pad = 2 if n > 1 else 0  # rows of no expert
        x = torch.cat([big_x[1 : at + 1], row_x, big_x[at + 1 : n + pad]])
        g = torch.cat([big_g[1 : at + 1], row_g, big_g[at + 1 : n + pad]])
        offsets = offsets_of(counts, "cuda")
        with poisoned_outputs():
            y, rstd = fwd(x, w, b, offsets, EPS)
            dx, _, _ = bwd(g, x, w, offsets, rstd)
        what = f"batch of {n} rows, counts {counts}, row at {at}"
        assert torch.equal(y[at : at + 1], y_alone), f"y, {what}"
        assert torch.equal(rstd[at : at + 1], rstd_alone), f"rstd, {what}"
        assert torch.equal(dx[at : at + 1], dx_alone), f"grad_x, {what}"


TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
requires_two_gpus = pytest.mark.skipif(
    not TWO_GPUS, reason=f"needs 2 CUDA devices, found {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
)


@requires_two_gpus
@pytest.mark.parametrize("form", ["offsets", "counts"])
@pytest.mark.parametrize("backend", GPU_KERNELS + ["reference"])
@pytest.mark.parametrize("H", [127, 4096])
def test_second_device_matches_first_bitwise(backend, H, form):
    # Tensors on cuda:1 while cuda:0 is current: every kernel and allocation on cuda:1 (nothing
    # allocated on cuda:0), with the same bits as on cuda:0. (tests/test_distributed.py does
    # the same for PolyNorm.)
    gen = torch.Generator().manual_seed(seed_for("grouped-second-device", backend, H, form))
    counts = [5, 0, 20, 8]
    x = make_rows(sum(counts) + 2, H, torch.bfloat16, "cpu", "contiguous", gen)
    g = make_rows(sum(counts) + 2, H, torch.bfloat16, "cpu", "contiguous", gen)
    w, b = make_experts(len(counts), torch.float32, "cpu", gen)

    def run(device):
        groups = {"counts": torch.tensor(counts, device=device)} if form == "counts" else {"offsets": offsets_of(counts, device)}
        return run_grouped(backend, x.to(device), g.to(device), w.to(device), b.to(device), **groups)

    out1 = assert_second_device_matches_first(run)
    on_cpu = Grads(*(getattr(out1, name).cpu() for name in ("y", "dx", "dw", "db")))
    check_grouped(on_cpu, x, g, w, b, counts, what=f"{backend} on cuda:1")


@requires_two_gpus
@pytest.mark.parametrize("backend", GPU_KERNELS)
@pytest.mark.parametrize("moved", ["weight", "bias", "offsets", "counts"])
def test_mixed_devices_are_refused(backend, moved):
    x, w, b, o = _inputs("cuda:0")
    args = {"weight": w, "bias": b, "offsets": o}
    if moved == "counts":
        with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_grouped: expected counts on x's device cuda:0, got cuda:1"):
            polynorm.poly_norm_grouped(x, w, b, counts=torch.tensor([2, 1, 3], device="cuda:1"), backend=backend)
        return
    args[moved] = args[moved].to("cuda:1")
    with pytest.raises(RuntimeError, match=rf"polynorm\.grouped_forward(_triton)?: expected {moved} on x's device cuda:0, got cuda:1"):
        polynorm.poly_norm_grouped(x, args["weight"], args["bias"], args["offsets"], backend=backend)
    if moved != "bias":  # the backward has no bias
        fwd, bwd = OPS[backend]
        _, rstd = getattr(torch.ops.polynorm, fwd)(x, w, b, o, EPS)
        bwd_args = {"weight": w, "offsets": o}
        bwd_args[moved] = bwd_args[moved].to("cuda:1")
        with pytest.raises(RuntimeError, match=rf"polynorm\.grouped_backward(_triton)?: expected {moved} on x's device cuda:0, got cuda:1"):
            getattr(torch.ops.polynorm, bwd)(torch.randn_like(x), x, bwd_args["weight"], bwd_args["offsets"], rstd)


# ---------------------------------------------------------------------------------------
# The README's block
# ---------------------------------------------------------------------------------------


def test_readme_grouped_block_runs_as_pasted(tmp_path):
    run_readme_block("polynorm.poly_norm_grouped(", tmp_path)


# ---------------------------------------------------------------------------------------
# bench/grouped_timing.py (the grouped op's benchmark), as a smoke test
# ---------------------------------------------------------------------------------------


def test_grouped_timing_smoke(tmp_path):
    # --smoke: tiny CPU tensors, every provider's code path once, each checked against the
    # grouped op before it is timed (the script fails on a mismatch); the JSON holds a forward
    # and a backward record per provider, shape and E, or the reason a provider was skipped
    # (the Triton ones run CPU tensors only under the interpreter). Ratios mean nothing here.
    out = tmp_path / "grouped_timing.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grouped_timing.py"), "--smoke", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    records, skipped = result["records"], result["skipped"]
    assert result["meta"]["smoke"] and result["meta"]["anchors_approach"] == "loop"
    expected = {"grouped", "loop"} | ({"grouped_triton", "loop_triton"} if INTERPRET else set())
    timed = {r["provider"] for r in records}
    assert expected <= timed and timed | set(skipped) == {"grouped", "grouped_triton", "loop", "loop_triton"}, (timed, skipped)
    for name in set(skipped):
        assert "TRITON_INTERPRET" in skipped[name], skipped
    keys = {(r["M"], r["H"], r["E"], r["direction"], r["provider"]) for r in records}
    assert {E for _, _, E, _, _ in keys} == {8, 64} and len(keys) == len(records) == 2 * 2 * len(timed)
    for r in records:
        assert sum(r["counts"]) == r["M"] and len(r["counts"]) == r["E"] and r["empty_experts"] >= 1, r
        for field in ("ms", "floor_ms", "ratio", "single_ratio", "vs_single"):
            assert math.isfinite(r[field]) and r[field] > 0, (field, r)
        assert (r["within_target"] is None) == (r["provider"] not in ("grouped", "grouped_triton")), r
    assert "| M | H | E |" in done.stdout
