"""The fused PolyNorm x mul: ``out = poly_norm(x) * mul``.

Every backend (the C++ CPU kernel, CUDA, Triton, the reference) against the float64 oracle
(``polynorm.reference.poly_norm_mul`` differentiated by autograd) over the shared matrix of
tests/_matrix.py: dtypes, odd H, layouts of x and mul independently, empty input; then the
numerics (y is never rounded before the multiply), determinism, batch invariance and a second
GPU (on a GPU), errors, opcheck, gradcheck, parameter dtypes, inference-mode inputs, meta and
fake tensors, and the module.
torch.compile and export of the fused op are in test_pt2.py.
"""

import doctest
import math
import re

import pytest
import torch

import polynorm
from _matrix import (
    BACKENDS,
    DEVICES,
    DTYPES,
    LAYOUTS,
    assert_python_checks_match_cpp,
    assert_second_device_matches_first,
    check_against_oracle_mul,
    closed_form_mul,
    floor_errors_mul,
    make_params,
    make_rows,
    requires_cuda,
    requires_interpreter,
    requires_triton,
    run_backend_mul,
    run_readme_block,
    seed_for,
)

# Every backend, the reference included.
ALL_BACKENDS = BACKENDS + [("cpu", "reference"), pytest.param("cuda", "reference", marks=requires_cuda)]
# The op pair each kernel backend runs.
OPS = {"auto": ("mul_forward", "mul_backward"), "cuda": ("mul_forward", "mul_backward"),
       "triton": ("mul_forward_triton", "mul_backward_triton")}
LAYOUTS_2D = ["contiguous", "sliced", "misaligned", "transposed"]


def _ops(backend):
    return tuple(getattr(torch.ops.polynorm, name) for name in OPS[backend])


def _case(device, backend, M, H, dtype, x_layout, mul_layout=None, g_layout=None, param_dtype=torch.float32):
    mul_layout, g_layout = mul_layout or x_layout, g_layout or x_layout
    gen = torch.Generator().manual_seed(seed_for("mul", device, backend, M, H, dtype, x_layout, mul_layout, g_layout, param_dtype))
    x = make_rows(M, H, dtype, device, x_layout, gen)
    mul = make_rows(M, H, dtype, device, mul_layout, gen)
    g = make_rows(M, H, dtype, device, g_layout, gen)
    w, b = make_params(param_dtype, device, gen)
    out = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
    what = f"{backend} {device} M={M} H={H} {dtype} x {x_layout}, mul {mul_layout}, grad {g_layout}"
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=what)


# ------------------------------------------------------------------ parity: the matrix
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [1, 2, 3, 8, 127, 750, 769, 1500, 3000, 5125])
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_contiguous_small(device, backend, H, dtype):
    # 3000 (2-byte), 1500 (fp32) and 750 (fp64): 375 whole packs, which the CUDA forward holds at 4
    # packs a thread on 96 lanes (launch_plan.h, row_packs: 8 would leave 27% of its slots idle).
    _case(device, backend, 7, H, dtype, "contiguous")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [3, pytest.param(769, marks=pytest.mark.smoke), 4096])
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_layouts(device, backend, H, dtype, layout):
    # x, mul and grad_out in the same layout (3d, 4d: leading dims that collapse).
    _case(device, backend, 5, H, dtype, layout)


@pytest.mark.parametrize(
    "x_layout,mul_layout,g_layout",
    [(a, b, c) for a in LAYOUTS_2D for b in LAYOUTS_2D if a != b for c in ("contiguous", b)],
)
@pytest.mark.parametrize("H", [769, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_independent_layouts(device, backend, dtype, H, x_layout, mul_layout, g_layout):
    # Each input is read in its own layout: misaligned x with aligned mul and the reverse,
    # a transposed (copied) one beside a row-strided (in place) one. H = 1024: whole packs, so an
    # aligned x with mul misaligned beside it takes the CUDA ops' realigning builds for mul alone
    # (mul's rows realigned as x's would be; 769 realigns every tensor's rows).
    _case(device, backend, 6, H, dtype, x_layout, mul_layout, g_layout)


def _strided(kind, M, H, dtype, device, gen):
    if kind == "expand":  # row stride 0: every row the same memory, read in place
        return torch.randn(1, H, generator=gen).to(dtype).to(device).expand(M, H)
    if kind == "step2":  # last-dim stride 2: copied once
        return torch.randn(M, 2 * H, generator=gen).to(dtype).to(device)[:, ::2]
    if kind == "rows-reversed":  # a negative row stride: copied once
        return torch.randn(M, H, generator=gen).to(dtype).to(device).flip(0)
    raise ValueError(kind)


@pytest.mark.parametrize("which", ["mul", "grad_out", "both"])
@pytest.mark.parametrize("kind", ["expand", "step2", "rows-reversed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_strided_mul_and_grad(device, backend, dtype, kind, which):
    gen = torch.Generator().manual_seed(seed_for("mul-strided", device, backend, dtype, kind, which))
    M, H = 6, 200
    x = make_rows(M, H, dtype, device, "contiguous", gen)
    mul = _strided(kind, M, H, dtype, device, gen) if which != "grad_out" else make_rows(M, H, dtype, device, "contiguous", gen)
    g = _strided(kind, M, H, dtype, device, gen) if which != "mul" else make_rows(M, H, dtype, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    out = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=f"{kind} {which}")


# Up to 2^24 elements (the float64 oracle holds several copies of x, mul and grad_out).
GPU_CASES = [
    pytest.param(M, H, marks=[pytest.mark.smoke] if (M, H) in {(83, 8192), (83, 65536)} else [])
    for M in (1, 7, 83, 4096)
    for H in (1, 3, 769, 1024, 4096, 5125, 8192, 16385, 65536, 262145)
    if M * H <= 2**24
]


@requires_cuda
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@pytest.mark.parametrize("M,H", GPU_CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_shapes(dtype, M, H, backend):
    _case("cuda", backend, M, H, dtype, "contiguous")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_empty(device, backend, dtype):
    x = torch.empty(0, 4, 16, dtype=dtype, device=device, requires_grad=True)
    mul = torch.empty(0, 4, 16, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(3, device=device, requires_grad=True)
    b = torch.randn(1, device=device, requires_grad=True)
    if backend != "reference":
        forward, backward = _ops(backend)
        out, rstd = forward(x.detach(), mul.detach(), w.detach(), b.detach(), 1e-6)
        assert out.shape == x.shape and out.dtype == dtype and rstd.shape == (0, 3)
        dx, dmul, dw, db = backward(torch.empty_like(out), x.detach(), mul.detach(), w.detach(), b.detach(), rstd)
        assert dx.shape == x.shape and dmul.shape == x.shape and dw.shape == (3,) and db.shape == (1,)
        assert torch.equal(dw, torch.zeros_like(dw)) and torch.equal(db, torch.zeros_like(db))
    out = polynorm.poly_norm_mul(x, mul, w, b, backend=backend)
    assert out.shape == x.shape and out.dtype == dtype
    out.sum().backward()
    assert x.grad.shape == x.shape and mul.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros(3, device=device)) and torch.equal(b.grad, torch.zeros(1, device=device))


# ------------------------------------------------------------------------- numerics
def _misaligned_view(t: torch.Tensor, shift: int) -> torch.Tensor:
    M, H = t.shape
    view = torch.empty(M * H + shift, dtype=t.dtype, device=t.device)[shift:].view(M, H)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


@requires_cuda
@pytest.mark.parametrize("moved", ["all", "mul", "x", "g", "x,mul"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("H", [1500, 2051, 3000, 4096, 4097, 4103, 5125, 16387])
def test_cuda_misaligned_rows_give_the_aligned_bits(dtype, H, moved):
    # The same rows, aligned and one element into a buffer (x, mul and grad_out each; mul, x or
    # grad_out alone; or x and mul, beside aligned grad_out and outputs): the row kernels realign what they load (a misaligned mul beside aligned
    # x and outputs takes the realigning build, which realigns mul's rows as x's), and a row's
    # packs and lanes depend on H and the dtype only, so out, dx, dmul, dw and db are bitwise the
    # same. bf16 3000 / fp32 1500: the forward's 4-pack rows (launch_plan.h, row_packs), aligned
    # ones on the realigning build. 2051 / 4103 / 5125 / 16387: the backward's tail plans in 2- and
    # 4-byte dtypes (launch_plan.h, row_tail_plan; bf16: 64 lanes, two rows a block / 128 / 160 / a
    # cluster of 4 x 128), checked against the float64 oracle too.
    gen = torch.Generator().manual_seed(seed_for("mul-misaligned-bits", dtype, H))
    x, mul, g = (make_rows(67, H, dtype, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    aligned = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    shifted = {name: _misaligned_view(t, 1) if moved == "all" or name in moved.split(",") else t for name, t in (("x", x), ("mul", mul), ("g", g))}
    got = run_backend_mul("cuda", shifted["x"], shifted["mul"], shifted["g"], w, b, 1e-6)
    for name in ("out", "dx", "dmul", "dw", "db"):
        assert torch.equal(getattr(aligned, name), getattr(got, name)), f"{name}, {moved} moved"
    check_against_oracle_mul(aligned, x, mul, g, w, b, 1e-6, what=f"H={H} {dtype}")


@requires_cuda
@pytest.mark.parametrize("H", [1024, 4097])
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
def test_cuda_graph_capture(backend, H):
    # mul_forward and mul_backward (or their Triton twins) captured in a torch.cuda.CUDAGraph,
    # after a warm-up on a side stream (Triton compiles there), replay on new x, mul and grad_out
    # copied into the captured inputs, bitwise equal to eager calls on them: no host
    # synchronisation, no allocation outside the caching allocator, nothing frozen but the
    # pointers. H = 4097: the odd rows' builds.
    forward, backward = _ops(backend)
    gen = torch.Generator().manual_seed(seed_for("mul-graph", backend, H))
    x, mul, g = (make_rows(96, H, torch.bfloat16, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture
            out, rstd = forward(x, mul, w, b, 1e-6)
            backward(g, x, mul, w, b, rstd)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, rstd = forward(x, mul, w, b, 1e-6)
        grads = backward(g, x, mul, w, b, rstd)
    for t in (x, mul, g):
        t.copy_(make_rows(96, H, torch.bfloat16, "cuda", "contiguous", gen))
    graph.replay()
    out_e, rstd_e = forward(x, mul, w, b, 1e-6)
    grads_e = backward(g, x, mul, w, b, rstd_e)
    names = ("out", "rstd", "grad_x", "grad_mul", "grad_weight", "grad_bias")
    for name, got, eager in zip(names, (out, rstd, *grads), (out_e, rstd_e, *grads_e), strict=True):
        assert torch.equal(got, eager), f"{name}: the graph's replay differs from eager calls"
    check_against_oracle_mul(run_backend_mul(backend, x, mul, g, w, b, 1e-6), x, mul, g, w, b, 1e-6,
                             what=f"{backend} H={H} after the replay")


@pytest.mark.parametrize("H", [769, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_y_never_rounded_before_the_multiply(device, backend, dtype, H):
    # Issue 15: a public fork rounded PolyNorm's y to bf16 before the multiply and lost
    # parity. Rounding y first (here: poly_norm, then torch.mul, whose backward rounds
    # grad_out * mul too) gives about 1.4x the output-rounding floor for out, grad_x and
    # grad_mul, and fails the 1.05x bound; the fused op meets it for all three.
    gen = torch.Generator().manual_seed(seed_for("mul-numerics", device, backend, dtype, H))
    M = 64
    x, mul, g = (make_rows(M, H, dtype, device, "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, device, gen)
    ours = floor_errors_mul(run_backend_mul(backend, x, mul, g, w, b, 1e-6), x, mul, g, w, b, 1e-6)

    def rounded_first(x, mul, w, b, eps):
        return polynorm.poly_norm(x, w, b, eps, backend=backend) * mul

    fork = floor_errors_mul(run_backend_mul(backend, x, mul, g, w, b, 1e-6, fn=rounded_first), x, mul, g, w, b, 1e-6)
    for name in ("out", "dx", "dmul"):
        err, bound, floor = ours[name]
        assert err <= bound, f"fused {name}: {err:.3e} > bound {bound:.3e} (floor {floor:.3e})"
        err, bound, floor = fork[name]
        assert err > bound and err > 1.2 * floor, f"y rounded first, {name}: {err:.3e} within bound {bound:.3e}"


KERNELS = [("cpu", "auto"), pytest.param("cuda", "cuda", marks=requires_cuda)]


@pytest.mark.parametrize("H", [769, 8192])
@pytest.mark.parametrize("device,backend", KERNELS + [p for p in BACKENDS if getattr(p, "values", p)[1] == "triton"])
def test_backward_deterministic(device, backend, H):
    # Bitwise the same out, dx, dmul, dW and dB on every run (no atomics), and on the CPU
    # with any thread count (each sum's order depends only on its length).
    gen = torch.Generator().manual_seed(seed_for("mul-determinism", device, backend, H))
    M = 300 if device == "cuda" else 20
    x, mul, g = (make_rows(M, H, torch.bfloat16, device, "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, device, gen)
    first = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3, threads):
            torch.set_num_threads(n if device == "cpu" else threads)
            again = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
            for name in ("out", "dx", "dmul", "dw", "db"):
                assert torch.equal(getattr(first, name), getattr(again, name)), (name, n)
    finally:
        torch.set_num_threads(threads)


# (H, CUDA kernel family, passed explicitly): the row build at every row length it serves (40000:
# a row of a cluster of CTAs on sm_90), the tiled build asked for there and at short rows.
BATCH_CASES = [
    (3, "auto"), (1024, "auto"), (5125, "auto"), (16385, "auto"), (40000, "auto"), (40000, "tiled"), (3, "tiled"),
    (769, "tiled"),
]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("H,kind", BATCH_CASES, ids=[f"{H}-{kind}" for H, kind in BATCH_CASES])
def test_cuda_batch_invariance(H, kind, dtype):
    # The launch choices depend on H and the dtype only (csrc/launch_plan.h): a row's out,
    # grad_x and grad_mul are bitwise the same alone and anywhere in a batch of any size.
    # As tests/test_kernels.py's test_batch_invariance does for PolyNorm: the row first in a
    # batch of n rows, the batch shuffled, so that the row lands anywhere.
    gen = torch.Generator().manual_seed(seed_for("mul-batch", H, kind, dtype))
    sizes = [1, 255, 256, 257] + ([4096] if H <= 5125 else [])
    big = [make_rows(max(sizes), H, dtype, "cuda", "contiguous", gen) for _ in range(3)]  # x, mul, grad_out
    row = [t[0:1].clone() for t in big]
    w, b = make_params(torch.float32, "cuda", gen)
    ops = torch.ops.polynorm  # the private ops with the family explicit (kind), on this device's plan
    alone_out, alone_rstd = ops._mul_forward_config(row[0], row[1], w, b, 1e-6, kind, True)
    alone_dx, alone_dmul, _, _ = ops._mul_backward_config(row[2], row[0], row[1], w, b, alone_rstd, kind, True)
    for n in sizes:
        perm = torch.randperm(n, generator=gen)
        at = int((perm == 0).nonzero())
        x, mul, g = (torch.cat([r, t[1:n]])[perm] for r, t in zip(row, big))
        out, rstd = ops._mul_forward_config(x, mul, w, b, 1e-6, kind, True)
        dx, dmul, _, _ = ops._mul_backward_config(g, x, mul, w, b, rstd, kind, True)
        assert torch.equal(out[at : at + 1], alone_out), f"out, batch of {n}"
        assert torch.equal(rstd[at : at + 1], alone_rstd), f"rstd, batch of {n}"
        assert torch.equal(dx[at : at + 1], alone_dx), f"grad_x, batch of {n}"
        assert torch.equal(dmul[at : at + 1], alone_dmul), f"grad_mul, batch of {n}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_mul_of_ones_is_polynorm(device, backend, dtype):
    # With mul = 1 the fused op is PolyNorm: its rstd, out = y, and dx, dW, dB from grad_out
    # itself; in fp32 (where y_acc is representable) grad_mul is grad_out * y exactly. The
    # C++ kernel runs PolyNorm's own row code: bit for bit; other kernels within a few
    # units of roundoff (their reduction orders may differ).
    fwd, bwd = _ops(backend)
    plain_fwd, plain_bwd = ("forward_triton", "backward_triton") if backend == "triton" else ("forward", "backward")
    gen = torch.Generator().manual_seed(seed_for("mul-of-ones", device, backend, dtype))
    x, g = (make_rows(5, 300, dtype, device, "contiguous", gen) for _ in range(2))
    w, b = make_params(torch.float32, device, gen)
    ones = torch.ones_like(x)
    out, rstd = fwd(x, ones, w, b, 1e-6)
    dx, dmul, dw, db = bwd(g, x, ones, w, b, rstd)
    y, rstd_plain = getattr(torch.ops.polynorm, plain_fwd)(x, w, b, 1e-6)
    dx_plain, dw_plain, db_plain = getattr(torch.ops.polynorm, plain_bwd)(g, x, w, rstd_plain)
    pairs = [(rstd, rstd_plain), (out, y), (dx, dx_plain), (dw, dw_plain), (db, db_plain)]
    if dtype == torch.float32:
        pairs.append((dmul, g * out))
    for i, (got, expected) in enumerate(pairs):
        if (device, backend) == ("cpu", "auto"):
            assert torch.equal(got, expected), i
        else:
            torch.testing.assert_close(got, expected, msg=lambda m: f"output {i}: {m}")


# ------------------------------------------------------------- parameter dtypes
PARAM_DTYPES = [pytest.param(w, b, id=f"w-{w}-b-{b}".replace("torch.", "")) for w in DTYPES for b in DTYPES]


@pytest.mark.parametrize("weight_dtype,bias_dtype", PARAM_DTYPES)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_param_grads_rounded_once_to_own_dtype(device, backend, x_dtype, weight_dtype, bias_dtype):
    # Each parameter's gradient is summed in fp32 and rounded once to its own dtype and
    # shape, whatever the other's (an fp32 bias beside a bf16 weight keeps fp32's precision).
    gen = torch.Generator().manual_seed(seed_for("mul-param-dtypes", device, backend, x_dtype, weight_dtype, bias_dtype))
    M, H = 6, 300
    x, mul, g = (make_rows(M, H, x_dtype, device, "contiguous", gen) for _ in range(3))
    w32, b32 = make_params(torch.float32, device, gen)
    w, b = w32.to(weight_dtype), b32.to(bias_dtype).reshape(())  # a 0-d bias too
    got = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
    assert got.dw.dtype == weight_dtype and got.dw.shape == w.shape, (got.dw.dtype, got.dw.shape)
    assert got.db.dtype == bias_dtype and got.db.shape == b.shape, (got.db.dtype, got.db.shape)
    exact, scale = closed_form_mul(x, mul, g, w, b, 1e-6)
    n = math.log2(x.numel())
    u = torch.finfo(torch.float32).eps / 2
    for name, param in (("dw", w), ("db", b)):
        value = getattr(got, name).double().reshape(-1).cpu()
        exp, sc = getattr(exact, name).reshape(-1).cpu(), getattr(scale, name).reshape(-1).cpu()
        # The fp32 sum's own error, then one rounding to the parameter's dtype.
        accumulated = 4 * u * sc * n
        tol = accumulated + torch.finfo(param.dtype).eps / 2 * (exp.abs() + accumulated)
        assert torch.all((value - exp).abs() <= tol), f"{name}: got {value.tolist()}, expected {exp.tolist()}"


@pytest.mark.parametrize("weight_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,backend", BACKENDS)
def test_backward_op_returns_param_grads_in_accumulation_dtype(device, backend, x_dtype, weight_dtype):
    # The schema: grad_x and grad_mul in x's dtype, grad_weight (3,) and grad_bias (1,) in
    # fp32 (fp64 for fp64 x), whatever the parameters' dtypes.
    fwd, bwd = _ops(backend)
    gen = torch.Generator().manual_seed(seed_for("mul-bwd-acc-dtype", device, backend, x_dtype, weight_dtype))
    x, mul, g = (make_rows(3, 50, x_dtype, device, "contiguous", gen) for _ in range(3))
    w, b = make_params(weight_dtype, device, gen)
    _, rstd = fwd(x, mul, w, b, 1e-6)
    dx, dmul, dw, db = bwd(g, x, mul, w, b, rstd)
    acc = torch.float64 if x_dtype == torch.float64 else torch.float32
    assert dx.dtype == x_dtype and dmul.dtype == x_dtype
    assert dw.dtype == acc and db.dtype == acc and dw.shape == (3,) and db.shape == (1,)
    exact, _ = closed_form_mul(x, mul, g, w, b, 1e-6)
    torch.testing.assert_close(db.double().cpu(), exact.db.cpu(), rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------- errors
def _inputs(device, M=4, H=16, dtype=torch.float32, key="mul-api"):
    gen = torch.Generator().manual_seed(seed_for(key, device, M, H, dtype))
    x = torch.randn(M, H, generator=gen).to(dtype).to(device)
    mul = torch.randn(M, H, generator=gen).to(dtype).to(device)
    w, b = make_params(torch.float32, device, gen)
    return x, mul, w, b


FORWARD_ERRORS = [
    ("mul shape", lambda x, m, w, b: (x, m[:, :3], w, b, 1e-6), RuntimeError, "expected mul to have x's shape [4, 16], got [4, 3]"),
    ("mul 3-D", lambda x, m, w, b: (x, m.reshape(2, 2, 16), w, b, 1e-6), RuntimeError, "expected mul to have x's shape [4, 16], got [2, 2, 16]"),
    ("mul dtype", lambda x, m, w, b: (x, m.double(), w, b, 1e-6), RuntimeError, "expected mul to have x's dtype"),
    ("int x", lambda x, m, w, b: (x.int(), m.int(), w, b, 1e-6), RuntimeError, "expected x to be float32, float64, float16 or bfloat16, got"),
    ("H = 0", lambda x, m, w, b: (x[:, :0], m[:, :0], w, b, 1e-6), RuntimeError, "expected x to have a last dimension H >= 1"),
    ("weight numel", lambda x, m, w, b: (x, m, w[:2], b, 1e-6), RuntimeError, "expected weight of shape [3] ([w0, w1, w2]), got [2]"),
    ("bias numel", lambda x, m, w, b: (x, m, w, torch.cat([b, b]), 1e-6), RuntimeError, "expected bias of shape [1] or [] (one number), got [2]"),
    ("negative eps", lambda x, m, w, b: (x, m, w, b, -1e-6), ValueError, "expected eps to be finite and >= 0, got -1e-06"),
    ("nan eps", lambda x, m, w, b: (x, m, w, b, float("nan")), ValueError, "expected eps to be finite and >= 0, got nan"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,exc,message", FORWARD_ERRORS, ids=[e[0] for e in FORWARD_ERRORS])
def test_mul_forward_op_errors(device, name, make, exc, message):
    with pytest.raises(exc, match="polynorm\\.mul_forward: " + re.escape(message)):
        torch.ops.polynorm.mul_forward(*make(*_inputs(device)))
    if device == "cuda":
        torch.ones(4, device="cuda").sum().item()  # no deferred illegal-address error


# Through the public function, every backend: each names its op (the kernels' or
# polynorm.poly_norm_mul for the reference) and the argument, with both values.
API_OPS = r"polynorm\.(mul_forward|mul_forward_triton|poly_norm_mul): "


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
@pytest.mark.parametrize("name,make,exc,message", FORWARD_ERRORS, ids=[e[0] for e in FORWARD_ERRORS])
def test_poly_norm_mul_errors(device, backend, name, make, exc, message):
    with pytest.raises(exc, match=API_OPS + re.escape(message)):
        polynorm.poly_norm_mul(*make(*_inputs(device)), backend=backend)


def _backward_args(device):
    x, mul, w, b = _inputs(device)
    _, rstd = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
    return torch.randn_like(x), x, mul, w, b, rstd


BACKWARD_ERRORS = [
    ("grad_out shape", lambda g, x, m, w, b, r: (g[:, :3], x, m, w, b, r), "expected grad_out to have x's shape [4, 16], got [4, 3]"),
    ("grad_out dtype", lambda g, x, m, w, b, r: (g.double(), x, m, w, b, r), "expected grad_out to have x's dtype"),
    ("mul shape", lambda g, x, m, w, b, r: (g, x, m[:2], w, b, r), "expected mul to have x's shape [4, 16], got [2, 16]"),
    ("mul dtype", lambda g, x, m, w, b, r: (g, x, m.half(), w, b, r), "expected mul to have x's dtype"),
    ("rstd shape", lambda g, x, m, w, b, r: (g, x, m, w, b, r[:3]), "expected rstd of shape [4, 3]"),
    ("rstd dtype", lambda g, x, m, w, b, r: (g, x, m, w, b, r.double()), "expected rstd of dtype"),
    ("weight numel", lambda g, x, m, w, b, r: (g, x, m, w[:1], b, r), "expected weight of shape [3] ([w0, w1, w2]), got [1]"),
    ("bias numel", lambda g, x, m, w, b, r: (g, x, m, w, torch.zeros(2), r), "expected bias of shape [1] or [] (one number), got [2]"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,message", BACKWARD_ERRORS, ids=[e[0] for e in BACKWARD_ERRORS])
def test_mul_backward_op_errors(device, name, make, message):
    args = make(*_backward_args(device))
    with pytest.raises(RuntimeError, match=r"polynorm\.mul_backward: " + re.escape(message)):
        torch.ops.polynorm.mul_backward(*args)
    if device == "cuda":
        torch.ones(4, device="cuda").sum().item()


# The Python checks (polynorm/_common.py: the fake kernels, the Triton ops) give the C++
# checks' messages, in the C++ order (x, weight, bias, grad_out, mul, rstd): each case below
# has one bad argument, or two, where the first in that order must be the one named.
BACKWARD_MESSAGE_CASES = BACKWARD_ERRORS + [
    ("int x", lambda g, x, m, w, b, r: (g.int(), x.int(), m.int(), w, b, r)),
    ("0-d x", lambda g, x, m, w, b, r: (g[0, 0], x[0, 0], m[0, 0], w, b, r)),
    ("H = 0", lambda g, x, m, w, b, r: (g[:, :0], x[:, :0], m[:, :0], w, b, r)),
    ("int weight", lambda g, x, m, w, b, r: (g, x, m, w.int(), b, r)),
    ("int bias", lambda g, x, m, w, b, r: (g, x, m, w, b.int(), r)),
    ("bias before grad_out", lambda g, x, m, w, b, r: (g[:, :3], x, m, w, torch.zeros(2), r)),
    ("grad_out before mul", lambda g, x, m, w, b, r: (g.double(), x, m[:2], w, b, r)),
    ("mul before rstd", lambda g, x, m, w, b, r: (g, x, m.half(), w, b, r[:3])),
]
@pytest.mark.parametrize("name,make", [c[:2] for c in BACKWARD_MESSAGE_CASES], ids=[c[0] for c in BACKWARD_MESSAGE_CASES])
def test_mul_backward_python_checks_match_cpp(name, make):
    assert_python_checks_match_cpp(torch.ops.polynorm.mul_backward, make(*_backward_args("cpu")))


@pytest.mark.parametrize("which", ["x", "mul", "weight", "bias"])
def test_none_arguments(which):
    args = dict(zip(("x", "mul", "weight", "bias"), _inputs("cpu")))
    args[which] = None
    with pytest.raises(RuntimeError, match=rf"polynorm\.mul_forward: expected {which} to be a Tensor, got None"):
        torch.ops.polynorm.mul_forward(*args.values(), 1e-6)


@pytest.mark.parametrize("backend", ["reference", "auto", "cuda", "triton"])
@pytest.mark.parametrize("which", ["x", "mul"])
def test_mul_not_a_tensor(which, backend):
    # Every backend, the kernel ones included, refuses a non-tensor with the same TypeError.
    args = dict(zip(("x", "mul", "weight", "bias"), _inputs("cpu")))
    args[which] = args[which].tolist()
    with pytest.raises(TypeError, match=rf"polynorm\.poly_norm_mul: expected {which} to be a Tensor, got list"):
        polynorm.poly_norm_mul(*args.values(), backend=backend)


@pytest.mark.parametrize("which", ["mul", "weight", "bias"])
def test_device_mismatch_meta(which):
    # Runs without a GPU: an argument on the meta device sends the call to the fake kernel,
    # which must refuse it rather than return uninitialised CPU tensors.
    args = dict(zip(("x", "mul", "weight", "bias"), _inputs("cpu")))
    args[which] = args[which].to("meta")
    with pytest.raises(RuntimeError, match=rf"polynorm\.mul_forward: expected {which} on x's device cpu, got meta"):
        torch.ops.polynorm.mul_forward(*args.values(), 1e-6)
    g, x, mul, w, b, rstd = _backward_args("cpu")
    with pytest.raises(RuntimeError, match=r"polynorm\.mul_backward: expected mul on x's device cpu, got meta"):
        torch.ops.polynorm.mul_backward(g, x, mul.to("meta"), w, b, rstd)


@requires_cuda
@pytest.mark.parametrize("backend", ["auto", "cuda", pytest.param("triton", marks=requires_triton), "reference"])
def test_device_mismatch_cuda(backend):
    x, mul, w, b = _inputs("cuda")
    with pytest.raises(RuntimeError, match=API_OPS + r"expected mul on x's device cuda:0, got cpu"):
        polynorm.poly_norm_mul(x, mul.cpu(), w, b, backend=backend)
    torch.ones(4, device="cuda").sum().item()


TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
requires_two_gpus = pytest.mark.skipif(
    not TWO_GPUS, reason=f"needs 2 CUDA devices, found {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
)


@requires_two_gpus
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton), "reference"])
@pytest.mark.parametrize("H", [127, 4096])
def test_second_device_matches_first_bitwise(backend, H):
    # Tensors on cuda:1 while cuda:0 is current: the launchers' device guard puts every
    # kernel and allocation on cuda:1 (nothing allocated on cuda:0), with the same bits as on
    # cuda:0. (tests/test_distributed.py does the same for PolyNorm.)
    gen = torch.Generator().manual_seed(seed_for("mul-second-device", backend, H))
    x, mul, g = (make_rows(33, H, torch.bfloat16, "cpu", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cpu", gen)
    assert_second_device_matches_first(
        lambda dev: run_backend_mul(backend, *(t.to(dev) for t in (x, mul, g, w, b)), 1e-6)
    )


@requires_two_gpus
@pytest.mark.parametrize("backend", ["cuda", pytest.param("triton", marks=requires_triton)])
@pytest.mark.parametrize("moved", ["mul", "weight", "bias"])
def test_mixed_devices_are_refused(backend, moved):
    x, mul, w, b = _inputs("cuda:0")
    args = {"mul": mul, "weight": w, "bias": b}
    args[moved] = args[moved].to("cuda:1")
    with pytest.raises(RuntimeError, match=API_OPS + f"expected {moved} on x's device cuda:0, got cuda:1"):
        polynorm.poly_norm_mul(x, args["mul"], args["weight"], args["bias"], backend=backend)
    g, x, mul, w, b, rstd = _backward_args("cuda:0")
    with pytest.raises(RuntimeError, match=r"polynorm\.mul_backward(_triton)?: expected mul on x's device cuda:0, got cuda:1"):
        _ops(backend)[1](g, x, mul.to("cuda:1"), w, b, rstd)


def test_backend_errors():
    x, mul, w, b = _inputs("cpu")
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm_mul: expected backend to be one of auto, cuda, triton, reference, got 'nope'"):
        polynorm.poly_norm_mul(x, mul, w, b, backend="nope")
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm_mul: backend 'cuda' expected x on a CUDA device \(or the meta device\), got cpu"):
        polynorm.poly_norm_mul(x, mul, w, b, backend="cuda")


ALL_CASES = ALL_BACKENDS + [pytest.param("cuda", "auto", marks=requires_cuda)]


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_eps_forms(device, backend):
    # eps as poly_norm takes it: any real scalar gives its float's bits; a bool, a string or
    # a tensor of two elements is no eps (TypeError).
    np = pytest.importorskip("numpy")
    x, mul, w, b = _inputs(device)
    expected = polynorm.poly_norm_mul(x, mul, w, b, 0.25, backend=backend)
    for eps in (np.float32(0.25), np.float64(0.25), torch.tensor(0.25), torch.tensor([0.25], dtype=torch.float64)):
        assert torch.equal(polynorm.poly_norm_mul(x, mul, w, b, eps, backend=backend), expected), repr(eps)
    for eps, what in ((True, "bool"), (np.bool_(False), "bool"), ("1e-6", "str"), (torch.ones(2), "a tensor of shape [2]")):
        with pytest.raises(TypeError, match=rf"polynorm\.poly_norm_mul: expected eps to be a real number, got {re.escape(what)}"):
            polynorm.poly_norm_mul(x, mul, w, b, eps, backend=backend)


# -------------------------------------------------------------- operator checks
def _opcheck_samples(device):
    cases = [((4, 16), torch.float32, "c", "c"), ((2, 3, 33), torch.bfloat16, "c", "c"), ((5, 8), torch.float16, "t", "c"),
             ((3, 7), torch.float64, "s", "t"), ((6, 9), torch.float32, "c", "s"), ((1, 1), torch.float32, "c", "c"),
             ((0, 9), torch.float32, "c", "c")]
    samples = []
    for i, (shape, dtype, x_layout, mul_layout) in enumerate(cases):
        gen = torch.Generator().manual_seed(seed_for("mul-opcheck", device, i))

        def make(layout):
            t = torch.randn(*shape, generator=gen).to(dtype).to(device)
            if layout == "t":
                return t.t().contiguous().t()
            if layout == "s":
                return torch.randn(shape[0], shape[1] + 2, generator=gen).to(dtype).to(device)[:, : shape[1]]
            return t

        x, mul = make(x_layout), make(mul_layout)
        w, b = make_params(torch.float16 if i == 1 else torch.float32, device, gen)
        for requires_grad in (False, True):
            samples.append(tuple(t.detach().clone().requires_grad_(requires_grad) for t in (x, mul, w, b)) + (1e-6,))
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    # Schema, fake kernel, autograd registration and AOT dispatch (dynamic shapes too).
    for x, mul, w, b, eps in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.polynorm.mul_forward.default, (x, mul, w, b, eps))
        out, rstd = torch.ops.polynorm.mul_forward(x.detach(), mul.detach(), w.detach(), b.detach(), eps)
        g = torch.randn_like(out)
        torch.library.opcheck(torch.ops.polynorm.mul_backward.default, (g, x.detach(), mul.detach(), w.detach(), b.detach(), rstd))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_tensor_eps(device):
    # The op torch.compile calls for a tensor or NumPy eps.
    x, mul, w, b = _inputs(device)
    for requires_grad in (False, True):
        args = [t.clone().requires_grad_(requires_grad) for t in (x, mul, w, b)]
        torch.library.opcheck(torch.ops.polynorm.mul_forward_tensor_eps.default, (*args, torch.tensor(1e-5), "auto"))


@pytest.mark.parametrize("bias_shape", [(1,), ()])
@pytest.mark.parametrize("device,backend", [("cpu", "auto"), ("cpu", "reference"), pytest.param("cuda", "cuda", marks=requires_cuda)])
def test_gradcheck_float64(device, backend, bias_shape):
    gen = torch.Generator().manual_seed(seed_for("mul-gradcheck", device, backend, bias_shape))
    x, mul = (torch.randn(3, 2, 6, generator=gen, dtype=torch.float64).to(device).requires_grad_() for _ in range(2))
    w = torch.randn(3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(bias_shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: polynorm.poly_norm_mul(*a, 1e-6, backend=backend), (x, mul, w, b))


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
@pytest.mark.parametrize("needs", ["x", "mul", "weight", "bias", "mul+bias"])
def test_needs_input_grad(device, backend, needs):
    # Only what requires grad gets a gradient; each the one the oracle gives.
    x, mul, w, b = _inputs(device)
    g = torch.randn_like(x)
    leaves = dict(zip(("x", "mul", "weight", "bias"), (x, mul, w, b)))
    for name in needs.split("+"):
        leaves[name] = leaves[name].clone().requires_grad_()
    polynorm.poly_norm_mul(*leaves.values(), backend=backend).backward(g)
    full = run_backend_mul(backend, x, mul, g, w, b, 1e-6)
    for (name, t), expected in zip(leaves.items(), (full.dx, full.dmul, full.dw, full.db)):
        if name in needs.split("+"):
            assert torch.equal(t.grad, expected), name
        else:
            assert t.grad is None, name


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_is_refused(device):
    x, mul, w, b = _inputs(device, dtype=torch.float64)
    x, mul = x.requires_grad_(), mul.requires_grad_()
    gx, gm = torch.autograd.grad(polynorm.poly_norm_mul(x, mul, w, b).pow(2).sum(), (x, mul), create_graph=True)
    with pytest.raises(RuntimeError, match=r"polynorm\.mul_backward: differentiating PolyNorm's gradient"):
        (gx.pow(2).sum() + gm.pow(2).sum()).backward()


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_unchanged(device):
    x, mul, w, b = (t.requires_grad_() for t in _inputs(device, dtype=torch.bfloat16))
    g = torch.randn_like(x)
    copies = [t.detach().clone() for t in (x, mul, w, b, g)]
    out, rstd = torch.ops.polynorm.mul_forward(x, mul, w, b, 1e-6)
    rstd_copy = rstd.clone()
    torch.ops.polynorm.mul_backward(g, x.detach(), mul.detach(), w.detach(), b.detach(), rstd)
    polynorm.poly_norm_mul(x, mul, w, b).backward(g)
    for before, after in zip(copies, (x, mul, w, b, g)):
        assert torch.equal(before, after.detach())
    assert torch.equal(rstd_copy, rstd)


def test_ops_registered_for_cpu_and_cuda():
    # Without a GPU a CUDA tensor cannot reach the CUDA kernel; what CI can check is that
    # both ops have kernels for both dispatch keys (real ones, or the "not built" stub).
    for op in ("mul_forward", "mul_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CPU")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("polynorm::mul_forward", "Autograd")


# --------------------------------------------------- inputs made under inference_mode
@pytest.mark.parametrize("inference", ["x", "mul", "both"])
@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_inference_mode_inputs(device, backend, inference):
    # Activations precomputed under torch.inference_mode(), trainable parameters: the
    # inference input is copied once for the backward, and the gradients are the oracle's.
    gen = torch.Generator().manual_seed(seed_for("mul-inference", device, backend, inference))
    shape = (3, 5, 40)
    x, mul, g = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
    if inference in ("x", "both"):
        with torch.inference_mode():
            x = x.clone()
    if inference in ("mul", "both"):
        with torch.inference_mode():
            mul = mul.clone()
    w32, b32 = make_params(torch.float32, device, gen)
    for w0, b0 in ((w32, b32), (w32.to(torch.bfloat16), b32)):
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        mul_ = mul if mul.is_inference() else mul.clone().requires_grad_()
        x_before, mul_before = x.clone(), mul.clone()
        out = polynorm.poly_norm_mul(x, mul_, w, b, 1e-6, backend=backend)
        assert not out.is_inference() and out.requires_grad
        out.backward(g)
        assert torch.equal(x, x_before) and torch.equal(mul, mul_before)
        ref = [t.clone().double().requires_grad_() for t in (x, mul, w0, b0)]
        polynorm.reference.poly_norm_mul(*ref, 1e-6, compute_dtype=torch.float64).backward(g.double())
        torch.testing.assert_close(w.grad.double(), ref[2].grad, rtol=1e-5 if w0.dtype == torch.float32 else 8e-3, atol=1e-5)
        torch.testing.assert_close(b.grad.double(), ref[3].grad, rtol=1e-5, atol=1e-5)
        if mul_.requires_grad:
            torch.testing.assert_close(mul_.grad.double(), ref[1].grad, rtol=1e-5, atol=1e-5)
        # The module too; without a recorded backward the same values.
        m = polynorm.FusedMulPolyNorm(backend=backend, device=device)
        m(x, mul).sum().backward()
        assert m.weight.grad is not None and m.bias.grad is not None
        with torch.no_grad():
            assert torch.equal(polynorm.poly_norm_mul(x, mul, w, b, 1e-6, backend=backend), out.detach())


# -------------------------------------------------------------- meta and fake tensors
@pytest.mark.parametrize("backend", ["auto", "cuda", pytest.param("triton", marks=requires_triton), "reference"])
def test_meta_module_every_backend(backend):
    # Built under torch.device("meta") (deferred initialisation, FSDP), the module infers
    # shapes, forward and backward, for every backend; no device is needed.
    with torch.device("meta"):
        m = polynorm.FusedMulPolyNorm(1e-5, backend=backend)
        x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
        mul = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    out = m(x, mul)
    assert out.is_meta and out.shape == x.shape and out.dtype == torch.bfloat16
    out.sum().backward()
    for t in (x, mul):
        assert t.grad.is_meta and t.grad.shape == x.shape and t.grad.dtype == torch.bfloat16
    assert m.weight.grad.is_meta and m.weight.grad.shape == (3,) and m.weight.grad.dtype == torch.float32
    assert m.bias.grad.is_meta and m.bias.grad.shape == (1,) and m.bias.grad.dtype == torch.float32
    with torch.device("meta"):
        m16 = polynorm.FusedMulPolyNorm(dtype=torch.float16, backend=backend)
    m16(x, mul).sum().backward()
    assert m16.weight.grad.dtype == torch.float16 and m16.bias.grad.dtype == torch.float16


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_meta_then_to_empty_and_reset_parameters(device, backend):
    # to_empty(device=...) plus reset_parameters() gives the module a direct construction
    # gives: the same repr, parameters and gradients.
    with torch.device("meta"):
        deferred = polynorm.FusedMulPolyNorm(1e-5, torch.float64, backend=backend)
    deferred.to_empty(device=device).reset_parameters()
    direct = polynorm.FusedMulPolyNorm(1e-5, torch.float64, device=device, backend=backend)
    gen = torch.Generator().manual_seed(seed_for("mul-to_empty", device, backend))
    x, mul, g = (torch.randn(3, 40, generator=gen).to(device) for _ in range(3))
    for m in (deferred, direct):
        m(x, mul).backward(g)
    assert repr(deferred) == repr(direct)
    state = {name: (p, p.grad) for name, p in direct.named_parameters()}
    for name, p in deferred.named_parameters():
        q, q_grad = state[name]
        assert (p.device, p.dtype) == (q.device, q.dtype) and torch.equal(p, q) and torch.equal(p.grad, q_grad), name


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_fake_tensor_forward_backward(device, backend):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 7, 48, dtype=torch.float16, device=device, requires_grad=True)
        mul = torch.randn(4, 7, 48, dtype=torch.float16, device=device, requires_grad=True)
        m = polynorm.FusedMulPolyNorm(dtype=torch.bfloat16, device=device, backend=backend)
        out = m(x, mul)
        out.sum().backward()
        assert out.shape == x.shape and out.dtype == torch.float16 and out.device == x.device
        assert x.grad.shape == x.shape and mul.grad.shape == x.shape
        assert m.weight.grad.dtype == torch.bfloat16 and m.bias.grad.shape == (1,)


# --------------------------------------------------------------------------- module
def test_module_defaults_repr_and_motif_signature():
    # Motif's FusedMulPolyNorm(eps=1e-6, dtype=...): weight ones(3) / 3, bias zeros(1).
    m = polynorm.FusedMulPolyNorm()
    assert m.weight.dtype == torch.float32 and m.weight.shape == (3,) and m.bias.shape == (1,)
    torch.testing.assert_close(m.weight.detach(), torch.ones(3) / 3, rtol=0, atol=0)
    assert torch.equal(m.bias.detach(), torch.zeros(1))
    assert repr(m) == "FusedMulPolyNorm(eps=1e-06, backend='auto')"
    m2 = polynorm.FusedMulPolyNorm(1e-5, torch.bfloat16)  # positional, as Motif's
    assert m2.eps == 1e-5 and m2.weight.dtype == torch.bfloat16 and m2.bias.dtype == torch.bfloat16
    with torch.no_grad():
        m2.weight.mul_(2)
        m2.bias.add_(1)
    m2.reset_parameters()
    assert torch.equal(m2.weight.detach(), torch.full((3,), 1 / 3, dtype=torch.bfloat16))
    assert not isinstance(m, polynorm.PolyNorm)
    with pytest.raises(ValueError, match=r"polynorm\.FusedMulPolyNorm: expected eps to be finite and >= 0, got nan"):
        polynorm.FusedMulPolyNorm(eps=float("nan"))
    with pytest.raises(TypeError, match=r"polynorm\.FusedMulPolyNorm: expected eps to be a real number, got bool"):
        polynorm.FusedMulPolyNorm(eps=True)
    with pytest.raises(ValueError, match=r"polynorm\.FusedMulPolyNorm: expected backend to be one of auto, cuda, triton, reference, got 'nope'"):
        polynorm.FusedMulPolyNorm(backend="nope")


@pytest.mark.parametrize("device,backend", ALL_BACKENDS)
def test_module_matches_function_and_motif_formula(device, backend):
    # forward(x, mul) is poly_norm_mul, bit for bit; and Motif's formula (poly_norm in fp32,
    # times mul in fp32, rounded once) within the output-rounding floor.
    m = polynorm.FusedMulPolyNorm(device=device, backend=backend)
    gen = torch.Generator().manual_seed(seed_for("mul-module", device, backend))
    x, mul = (torch.randn(2, 3, 40, generator=gen).to(torch.bfloat16).to(device) for _ in range(2))
    out = m(x, mul)
    assert torch.equal(out, polynorm.poly_norm_mul(x, mul, m.weight, m.bias, m.eps, backend=backend))
    expected = polynorm.reference.poly_norm_mul(x, mul, m.weight, m.bias, m.eps)
    torch.testing.assert_close(out, expected, rtol=2**-8, atol=0)


def test_docstring_example_runs():
    # The gated MLP example in poly_norm_mul's docstring, as doctest runs it.
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    (test,) = [t for t in finder.find(polynorm.poly_norm_mul, "poly_norm_mul") if t.examples]
    runner.run(test)
    assert runner.failures == 0 and runner.tries == len(test.examples) >= 3


@requires_triton
@requires_interpreter
def test_triton_ops_registered():
    # The Triton backend's ops (polynorm/triton_kernels.py), as poly_norm_mul calls them.
    for op in ("mul_forward_triton", "mul_backward_triton"):
        assert hasattr(torch.ops.polynorm, op), op


def test_readme_block_runs_as_pasted(tmp_path):
    # The README's fused PolyNorm x mul block, in a fresh interpreter in an empty folder.
    run_readme_block("FusedMulPolyNorm(", tmp_path)
