"""Tensor parallelism (``polynorm.tp``, docs/MATH.md (12)-(15)): the hidden dimension sharded
over a process group, one all-reduce of ``[M, 3]`` sums a direction.

- The sharded passes of each backend (the C++ CPU kernel, Triton under the interpreter or on a
  GPU, the CUDA kernels) against the float64 oracles of :mod:`polynorm.reference`, one process.
- gloo with 2 and 4 processes (torch.multiprocessing): every rank holds its columns of the same
  global tensors; forward and every gradient against the unsharded op on those tensors, for
  every dtype, PolyNorm and the fused PolyNorm x mul, an odd H split unevenly, a shard of width
  1 and an empty shard; through ``polynorm.tp`` and through a DTensor sharded on its last
  dimension. On a GPU the same path runs 2 processes on one GPU (gloo carries CUDA tensors),
  for the CUDA and Triton kernels.
"""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _matrix import DTYPES, HAS_CUDA, INTERPRET, poisoned_outputs, requires_cuda, requires_triton

import polynorm
from polynorm import reference

HAS_GLOO = dist.is_available() and dist.is_gloo_available()
requires_gloo = pytest.mark.skipif(not HAS_GLOO, reason="needs torch.distributed with the gloo backend")

# (backend of polynorm.tp, device): the C++ CPU kernel; Triton where it runs (the interpreter on
# the CPU, or a GPU); the CUDA kernels on a GPU.
KERNEL_BACKENDS = [
    pytest.param("auto", "cpu", id="cpu"),
    pytest.param("triton", "cpu", id="triton-interpreter", marks=[
        requires_triton, pytest.mark.skipif(not INTERPRET, reason="Triton on CPU tensors needs TRITON_INTERPRET=1")]),
    pytest.param("triton", "cuda", id="triton-cuda", marks=[requires_triton, requires_cuda]),
    pytest.param("auto", "cuda", id="cuda", marks=requires_cuda),
]  # fmt: skip


def unit_roundoff(dtype: torch.dtype) -> float:
    return {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def tolerance(dtype: torch.dtype, H: int, ranks: int = 1) -> float:
    """Relative to the largest magnitude: the output's rounding (two ulps: the two results may
    round either way of a boundary) plus MATH.md (15)'s accumulation bound, (log2 H + R) units of
    the accumulation dtype, times 4 for the powers and products each term passes through."""
    acc_u = unit_roundoff(acc_dtype(dtype))
    out_u = unit_roundoff(dtype) if dtype in (torch.float16, torch.bfloat16) else 0.0
    return 4 * out_u + 4 * (math.log2(max(H, 2)) + ranks) * acc_u * 4


def assert_close_scaled(got: torch.Tensor, want: torch.Tensor, tol: float, what: str, scale: float = 0.0) -> None:
    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)} against {list(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: not finite"
    if want.numel() == 0:  # an empty shard
        return
    scale = max(want.abs().max().item(), scale, 1e-30)
    err = (got - want).abs().max().item() / scale
    assert err <= tol, f"{what}: max error {err:.3g} of the largest magnitude {scale:.3g}, above {tol:.3g}"


def _passes(backend: str):
    if backend == "triton":
        from polynorm import triton_sharded  # noqa: F401

        ops = torch.ops.polynorm
        return (ops.sharded_forward_stats_triton, ops.sharded_forward_apply_triton,
                ops.sharded_backward_stats_triton, ops.sharded_backward_apply_triton)  # fmt: skip
    ops = torch.ops.polynorm
    return ops.sharded_forward_stats, ops.sharded_forward_apply, ops.sharded_backward_stats, ops.sharded_backward_apply


# ---------------------------------------------------------------------------------------
# The sharded passes of one backend against the float64 oracles
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend,device", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H_shard,hidden_size", [(0, 24), (1, 9), (37, 129), (64, 64), (1000, 4096)])
@pytest.mark.parametrize("with_mul", [False, True], ids=["poly_norm", "mul"])
def test_sharded_passes_match_reference(backend, device, dtype, H_shard, hidden_size, with_mul):
    if backend == "triton" and device == "cpu" and H_shard > 64 and dtype != torch.bfloat16:
        pytest.skip("the interpreter is slow: wide shards in bf16 only")
    gen = torch.Generator().manual_seed(hash((str(dtype), H_shard, hidden_size, with_mul)) % 2**31)
    M = 6
    x = torch.randn(2, M // 2, H_shard, generator=gen).to(dtype).to(device)
    mul = torch.randn(x.shape, generator=gen).to(dtype).to(device) if with_mul else None
    g = torch.randn(x.shape, generator=gen).to(dtype).to(device)
    w = torch.tensor([0.7, -0.4, 0.9], device=device)
    b = torch.tensor([0.1], device=device)
    # The other shards' sums: the row's total is this shard's plus a positive remainder.
    rest = (torch.rand(M, 3, generator=gen, dtype=torch.float64) + 0.5) * (hidden_size - H_shard + 1)
    acc = acc_dtype(dtype)
    fwd_stats, fwd_apply, bwd_stats, bwd_apply = _passes(backend)
    tol = tolerance(dtype, hidden_size)

    with poisoned_outputs():
        sums = fwd_stats(x)
    assert sums.dtype == acc and sums.shape == (M, 3)
    want_sums = reference.sharded_forward_stats(x)
    assert_close_scaled(sums, want_sums, tolerance(torch.float32 if acc == torch.float32 else dtype, H_shard),
                        "forward sums")  # fmt: skip

    total = (want_sums.cpu() + rest).to(acc).to(device)
    with poisoned_outputs():
        out, rstd = fwd_apply(x, mul, total, w, b, hidden_size, 1e-6)
    want_out, want_rstd = reference.sharded_forward_apply(x, mul, total, w, b, hidden_size, 1e-6)
    assert out.dtype == dtype and rstd.dtype == acc
    assert_close_scaled(rstd, want_rstd, tolerance(torch.float32 if acc == torch.float32 else dtype, 1), "rstd")
    if H_shard:
        assert_close_scaled(out, want_out, tol, "out")

    with poisoned_outputs():
        gsums, gw, gb = bwd_stats(g, x, mul, rstd)
    want_gsums, want_gw, want_gb = reference.sharded_backward_stats(g, x, mul, rstd)
    assert gsums.dtype == gw.dtype == gb.dtype == acc and gw.shape == (3,) and gb.shape == (1,)
    # Signed terms: MATH.md (15) bounds the error against the sum of magnitudes, here <= H_shard
    # times the largest term; an empty shard's sums are exactly 0.
    for got, want, what in ((gsums, want_gsums, "backward sums"), (gw, want_gw, "grad_weight"), (gb, want_gb, "grad_bias")):
        if H_shard == 0:
            assert (got == 0).all(), f"{what}: an empty shard's sums must be 0"
        else:
            assert_close_scaled(got, want, tol * max(H_shard, 1), what)

    gtotal = (want_gsums.cpu() + rest - 1.0).to(acc).to(device)
    with poisoned_outputs():
        dx, dmul = bwd_apply(g, x, mul, w, b, rstd, gtotal, hidden_size)
    want_dx, want_dmul = reference.sharded_backward_apply(g, x, mul, w, b, rstd, gtotal, hidden_size)
    assert dx.shape == x.shape and dx.dtype == dtype
    if H_shard:
        assert_close_scaled(dx, want_dx, tol, "grad_x")
    if with_mul:
        assert dmul.shape == x.shape
        if H_shard:
            assert_close_scaled(dmul, want_dmul, tol, "grad_mul")
    else:
        assert dmul.numel() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_shard_is_the_unsharded_cpu_op_bitwise(dtype):
    # The C++ CPU kernel sums a shard as the unsharded op sums a row: one shard of the whole row
    # gives polynorm::forward's and backward's bits (and mul_forward's, mul_backward's).
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 3, 129, generator=gen).to(dtype)
    mul, g = torch.randn(x.shape, generator=gen).to(dtype), torch.randn(x.shape, generator=gen).to(dtype)
    w, b = torch.tensor([0.7, -0.4, 0.9]), torch.tensor([0.1])
    ops = torch.ops.polynorm
    sums = ops.sharded_forward_stats(x)
    for m in (None, mul):
        out, rstd = ops.sharded_forward_apply(x, m, sums, w, b, 129, 1e-6)
        want = ops.forward(x, w, b, 1e-6) if m is None else ops.mul_forward(x, m, w, b, 1e-6)
        assert torch.equal(out, want[0]) and torch.equal(rstd, want[1])
        gsums, gw, gb = ops.sharded_backward_stats(g, x, m, rstd)
        dx, dmul = ops.sharded_backward_apply(g, x, m, w, b, rstd, gsums, 129)
        if m is None:
            want_dx, want_gw, want_gb = ops.backward(g, x, w, rstd)
        else:
            want_dx, want_dmul, want_gw, want_gb = ops.mul_backward(g, x, m, w, b, rstd)
            assert torch.equal(dmul, want_dmul)
        assert torch.equal(dx, want_dx) and torch.equal(gw, want_gw) and torch.equal(gb, want_gb)


@pytest.mark.parametrize("backend,device", KERNEL_BACKENDS)
@pytest.mark.parametrize("H_shard", [0, 37])
def test_opcheck(backend, device, H_shard):
    # Schemas, fake kernels (shape inference under torch.compile) and, for the C++ ops, AOT
    # dispatch with dynamic shapes. The interpreter cannot run on fake tensors: its ops are opaque
    # custom ops, checked without the AOT test, as the other Triton ops are under it.
    gen = torch.Generator().manual_seed(H_shard)
    x = torch.randn(3, 2, H_shard, generator=gen).to(device)
    mul, g = torch.randn(x.shape, generator=gen).to(device), torch.randn(x.shape, generator=gen).to(device)
    w, b = torch.tensor([0.7, -0.4, 0.9], device=device), torch.tensor([0.1], device=device)
    fwd_stats, fwd_apply, bwd_stats, bwd_apply = _passes(backend)
    utils = ("test_schema", "test_faketensor") if backend == "triton" and device == "cpu" else None
    kwargs = {} if utils is None else {"test_utils": utils}
    sums = fwd_stats(x) + 1.0
    torch.library.opcheck(fwd_stats.default, (x,), **kwargs)
    for m in (None, mul):
        torch.library.opcheck(fwd_apply.default, (x, m, sums, w, b, 64, 1e-6), **kwargs)
        rstd = fwd_apply(x, m, sums, w, b, 64, 1e-6)[1]
        torch.library.opcheck(bwd_stats.default, (g, x, m, rstd), **kwargs)
        torch.library.opcheck(bwd_apply.default, (g, x, m, w, b, rstd, sums, 64), **kwargs)


def test_errors_name_the_op():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match=r"polynorm.sharded_forward_apply: expected sums of shape \[4, 3\]"):
        torch.ops.polynorm.sharded_forward_apply(x, None, torch.zeros(3, 3), torch.ones(3), torch.zeros(1), 16, 1e-6)
    with pytest.raises(RuntimeError, match="polynorm.sharded_forward_apply: expected hidden_size .* >= x's shard width 8, got 4"):
        torch.ops.polynorm.sharded_forward_apply(x, None, torch.zeros(4, 3), torch.ones(3), torch.zeros(1), 4, 1e-6)
    with pytest.raises(ValueError, match="polynorm.tp.poly_norm: expected hidden_size .* got 0"):
        polynorm.tp.poly_norm(x, torch.ones(3), torch.zeros(1), hidden_size=0)
    with pytest.raises(ValueError, match="polynorm.tp.poly_norm: expected backend to be one of"):
        polynorm.tp.poly_norm(x, torch.ones(3), torch.zeros(1), hidden_size=8, backend="cuda-graph")
    # "cuda" is the CUDA kernels, as in polynorm.poly_norm: CPU tensors are refused, before any collective.
    for fn, args in ((polynorm.tp.poly_norm, (x,)), (polynorm.tp.poly_norm_mul, (x, torch.randn_like(x)))):
        with pytest.raises(RuntimeError, match=f"polynorm.tp.{fn.__name__}: backend 'cuda' expected x on a CUDA device"):
            fn(*args, torch.ones(3), torch.zeros(1), hidden_size=8, backend="cuda")


TP_BACKENDS = [
    "auto",
    pytest.param("triton", marks=[requires_triton, pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")]),
    "reference",
]


@pytest.mark.parametrize("backend", TP_BACKENDS)
def test_public_checks_on_every_backend(backend):
    """polynorm.tp checks x, mul, weight and bias for every backend, before any collective (so
    no process group is needed), naming the function: the float64 oracles of backend
    "reference" used to take an int, bool or complex x and return it in that dtype."""
    x, w, b = torch.randn(4, 8), torch.ones(3), torch.zeros(1)
    op = "polynorm.tp.poly_norm: expected"
    for bad in (x.int(), x > 0, x.to(torch.complex64)):
        with pytest.raises(RuntimeError, match=f"{op} x to be float32, float64, float16 or bfloat16, got {bad.dtype}"):
            polynorm.tp.poly_norm(bad, w, b, hidden_size=8, backend=backend)
    with pytest.raises(RuntimeError, match=f"{op} x to have at least 1 dimension"):
        polynorm.tp.poly_norm(x[0, 0], w, b, hidden_size=8, backend=backend)
    with pytest.raises(TypeError, match=f"{op} x to be a Tensor, got list"):
        polynorm.tp.poly_norm(x.tolist(), w, b, hidden_size=8, backend=backend)
    with pytest.raises(RuntimeError, match=rf"{op} weight of shape \[3\] .*got \[3, 1\]"):
        polynorm.tp.poly_norm(x, w[:, None], b, hidden_size=8, backend=backend)
    with pytest.raises(RuntimeError, match=f"{op} bias to be float32, float64, float16 or bfloat16, got torch.int64"):
        polynorm.tp.poly_norm(x, w, b.long(), hidden_size=8, backend=backend)
    with pytest.raises(RuntimeError, match=f"{op} weight on x's device cpu, got meta"):
        polynorm.tp.poly_norm(x, w.to("meta"), b, hidden_size=8, backend=backend)
    with pytest.raises(RuntimeError, match="polynorm.tp.poly_norm_mul: expected mul to have x's dtype torch.float32, got torch.float64"):
        polynorm.tp.poly_norm_mul(x, x.double(), w, b, hidden_size=8, backend=backend)


def test_sharded_ops_check_like_the_cpu_kernels():
    """A meta argument beside CPU ones sends the C++ ops to their fake kernels, which check as
    the kernels do (they used to return empty CPU tensors: garbage out); the Triton ops refuse
    what the C++ ops refuse (a [3, 1] weight, an int bias, a NaN eps)."""
    x, w, b = torch.randn(4, 8), torch.ones(3), torch.zeros(1)
    ops = torch.ops.polynorm
    sums = ops.sharded_forward_stats(x)
    with pytest.raises(RuntimeError, match="polynorm.sharded_forward_apply: expected weight on x's device cpu, got meta"):
        ops.sharded_forward_apply(x, None, sums, w.to("meta"), b, 8, 1e-6)
    with pytest.raises(RuntimeError, match="polynorm.sharded_backward_stats: expected rstd on x's device cpu, got meta"):
        ops.sharded_backward_stats(x, x, None, sums.to("meta"))
    if INTERPRET and polynorm.ops._triton_kernels is not None:
        from polynorm import triton_sharded  # noqa: F401  (registers the *_triton ops)

        op = "polynorm.sharded_forward_apply_triton: expected"
        with pytest.raises(RuntimeError, match=rf"{op} weight of shape \[3\] .*got \[3, 1\]"):
            ops.sharded_forward_apply_triton(x, None, sums, w[:, None], b, 8, 1e-6)
        with pytest.raises(RuntimeError, match=f"{op} bias to be float32, float64, float16 or bfloat16, got torch.int64"):
            ops.sharded_forward_apply_triton(x, None, sums, w, b.long(), 8, 1e-6)
        with pytest.raises(ValueError, match=f"{op} eps to be finite and >= 0, got nan"):
            ops.sharded_forward_apply_triton(x, None, sums, w, b, 8, float("nan"))


# ---------------------------------------------------------------------------------------
# Several processes: every rank's columns against the unsharded op
# ---------------------------------------------------------------------------------------

# (H, widths of the ranks' shards) for each world size: odd H split unevenly, a shard of width
# 1, an empty shard.
SPLITS = {
    2: [(129, (100, 29)), (129, (128, 1)), (64, (64, 0))],
    4: [(7, (3, 1, 0, 3)), (129, (40, 1, 57, 31))],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unsharded(x, mul, g, w, b, backend: str):
    """The unsharded op's outputs and gradients on the global tensors: (out, dx, dmul, dw, db)."""
    leaves = [t.clone().requires_grad_() for t in (x, mul, w, b) if t is not None]
    if mul is None:
        out = polynorm.poly_norm(leaves[0], leaves[1], leaves[2], backend=backend)
    else:
        out = polynorm.poly_norm_mul(*leaves, backend=backend)
    grads = torch.autograd.grad(out, leaves, g)
    if mul is None:
        return out, grads[0], None, grads[1], grads[2]
    return (out, *grads)


def _check_rank(rank, world, device, backend, dtype, H, widths, with_mul, results):
    gen = torch.Generator().manual_seed(1000 * H + 10 * world + with_mul)
    x = (torch.randn(3, 5, H, generator=gen) * 1.5).to(dtype).to(device)
    mul = torch.randn(x.shape, generator=gen).to(dtype).to(device) if with_mul else None
    g = torch.randn(x.shape, generator=gen).to(dtype).to(device)
    w = torch.tensor([0.7, -0.4, 0.9], device=device)
    b = torch.tensor([0.1], device=device)
    unsharded_backend = {"auto": "auto", "cuda": "cuda", "triton": "triton", "reference": "reference"}[backend]
    want = _unsharded(x, mul, g, w, b, unsharded_backend)
    lo = sum(widths[:rank])
    cols = slice(lo, lo + widths[rank])
    leaves = [t[..., cols].clone().requires_grad_() for t in ((x, mul) if with_mul else (x,))]
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    if with_mul:
        out = polynorm.tp.poly_norm_mul(leaves[0], leaves[1], wl, bl, hidden_size=H, backend=backend)
    else:
        out = polynorm.tp.poly_norm(leaves[0], wl, bl, hidden_size=H, backend=backend)
    grads = torch.autograd.grad(out, [*leaves, wl, bl], g[..., cols].contiguous())
    dw, db = grads[-2].clone(), grads[-1].clone()
    dist.all_reduce(dw)  # each rank's share (MATH.md (14))
    dist.all_reduce(db)
    # Each share is rounded to the parameter's dtype before the sum: that rounding scales with
    # the shares, which may exceed their sum.
    shares = torch.cat([grads[-2], grads[-1]]).abs().double()
    dist.all_reduce(shares)
    share_scale = shares.max().item()
    tol = tolerance(dtype, H, world)
    where = f"{backend} {dtype} H={H} widths={widths} rank {rank}{' mul' if with_mul else ''}"
    assert out.shape == x[..., cols].shape and out.dtype == dtype, where
    assert_close_scaled(out, want[0][..., cols], tol, f"{where}: out")
    assert_close_scaled(grads[0], want[1][..., cols], tol, f"{where}: dx")
    if with_mul:
        assert_close_scaled(grads[1], want[2][..., cols], tol, f"{where}: dmul")
    # dw, db: each rank's share is rounded to the parameter's dtype (fp32 here) before the sum.
    assert_close_scaled(dw, want[3], tol * 4 + 8 * unit_roundoff(torch.float32), f"{where}: dw", share_scale)
    assert_close_scaled(db, want[4], tol * 4 + 8 * unit_roundoff(torch.float32), f"{where}: db", share_scale)
    results.append(where)


def _check_dtensor(rank, world, device, backend, dtype):
    # A DTensor sharded on its last dimension (torch.chunk's split: H = 7 over 4 ranks is
    # 2, 2, 2, 1; H = 3 is 1, 1, 1, 0): polynorm.poly_norm and poly_norm_mul take polynorm.tp.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh(device, (world,))
    for H in (7, 3):
        gen = torch.Generator().manual_seed(H)
        x_full = torch.randn(4, H, generator=gen).to(dtype).to(device)
        mul_full = torch.randn(x_full.shape, generator=gen).to(dtype).to(device)
        g_full = torch.randn(x_full.shape, generator=gen).to(dtype).to(device)
        w_full, b_full = torch.tensor([0.7, -0.4, 0.9], device=device), torch.tensor([0.1], device=device)
        for with_mul in (False, True):
            want = _unsharded(x_full, mul_full if with_mul else None, g_full, w_full, b_full, backend)
            x = distribute_tensor(x_full, mesh, [Shard(1)]).requires_grad_()
            mul = distribute_tensor(mul_full, mesh, [Shard(1)]).requires_grad_()
            w = distribute_tensor(w_full, mesh, [Replicate()]).requires_grad_()
            b = distribute_tensor(b_full, mesh, [Replicate()]).requires_grad_()
            inputs = (x, mul, w, b) if with_mul else (x, w, b)
            fn = polynorm.poly_norm_mul if with_mul else polynorm.poly_norm
            g = distribute_tensor(g_full, mesh, [Shard(1)])
            with CommDebugMode() as comm_fwd:
                out = fn(*inputs, backend=backend)
            with CommDebugMode() as comm_bwd:
                grads = torch.autograd.grad(out, inputs, g)
            where = f"DTensor {backend} {dtype} H={H}{' mul' if with_mul else ''}"
            # One all-reduce of the [M, 3] sums each way, and no gather of x.
            for what, comm in (("forward", comm_fwd), ("backward", comm_bwd)):
                counts = {str(op): n for op, n in comm.get_comm_counts().items()}
                assert comm.get_total_counts() == 1 and "allreduce" in next(iter(counts)), f"{where}: {what} {counts}"
            assert out.placements == (Shard(1),) and grads[0].placements == (Shard(1),), where
            assert grads[-2].placements == (Partial(),) and grads[-1].placements == (Partial(),), where
            tol = tolerance(dtype, H, world)
            assert_close_scaled(out.full_tensor(), want[0], tol, f"{where}: out")
            assert_close_scaled(grads[0].full_tensor(), want[1], tol, f"{where}: dx")
            if with_mul:
                assert_close_scaled(grads[1].full_tensor(), want[2], tol, f"{where}: dmul")
            assert_close_scaled(grads[-2].full_tensor(), want[3], tol * 4 + 8 * unit_roundoff(torch.float32), f"{where}: dw")
            assert_close_scaled(grads[-1].full_tensor(), want[4], tol * 4 + 8 * unit_roundoff(torch.float32), f"{where}: db")


def _worker(rank, world, port, device, backends, dtypes, dtensor):
    if device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU: gloo carries the CUDA tensors
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = []
        for backend in backends:
            for dtype in dtypes:
                for H, widths in SPLITS[world]:
                    for with_mul in (False, True):
                        _check_rank(rank, world, device, backend, dtype, H, widths, with_mul, results)
                if dtensor:
                    _check_dtensor(rank, world, device, backend, dtype)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, device: str, backends, dtypes, dtensor: bool = True) -> None:
    mp.spawn(_worker, args=(world, _free_port(), device, backends, dtypes, dtensor), nprocs=world, join=True)


@requires_gloo
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_on_cpu_matches_unsharded(world):
    _spawn(world, "cpu", ["auto", "reference"], DTYPES)


@requires_gloo
@requires_triton
@pytest.mark.skipif(not INTERPRET or HAS_CUDA, reason="Triton on CPU tensors: the interpreter, where no GPU runs it")
def test_gloo_triton_interpreter_on_cpu():
    _spawn(2, "cpu", ["triton"], [torch.bfloat16, torch.float32], dtensor=False)


@requires_gloo
@requires_cuda
@pytest.mark.parametrize("backend", ["auto", "cuda", pytest.param("triton", marks=requires_triton)])
def test_gloo_two_processes_on_one_gpu(backend):
    # The kernels through polynorm.tp; the DTensor route is the same Python on every device (its
    # CPU test above; over NCCL: the two-GPU tests of test_distributed.py).
    _spawn(2, "cuda", [backend], DTYPES, dtensor=False)
