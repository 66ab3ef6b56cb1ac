"""Motif-3's MoE activation (polynorm.poly_norm_grouped_mul, GroupedMulPolyNorm): every backend
against the float64 oracle (polynorm.reference.poly_norm_grouped_mul) over dtypes, Motif-3's
options on and off, expert counts (empty experts, one expert, E not a multiple of 4, 32 or
128), int32 and int64 offsets, rows of no expert, gradients at the clamp boundary, strided
gate_up views read in place, a NaN kept in its row, determinism, opcheck, and the module's
checkpoint layout and configuration.

docs/MATH.md (16)-(23): out = round(s * clamp_c(PolyNorm_e(clamp_c(x)) * clamp_c(mul))).
"""

import types

import pytest
import torch

import polynorm
from polynorm import reference
from _matrix import (
    DTYPES,
    compute_eps,
    poisoned_outputs,
    rel_l2,
    requires_cuda,
    requires_interpreter,
    requires_triton,
    seed_for,
)

# (device, backend) pairs that run a kernel of this project. On CUDA, "auto" is Triton.
BACKENDS = [
    ("cpu", "auto"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter]),
    pytest.param("cuda", "auto", marks=[requires_triton, requires_cuda]),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda]),
]
# Motif-3's configuration, each option alone, and none.
MOTIF3 = dict(sigmoid_weight=True, bias_clamp=0.5, hidden_clamp=1e6, output_scale=0.5)
OPTIONS = {
    "none": {},
    "motif3": MOTIF3,
    "sigmoid": dict(sigmoid_weight=True),
    "bias_clamp": dict(bias_clamp=0.05),
    "hidden_clamp": dict(hidden_clamp=1.0),  # clamps about a third of randn's values
    "output_scale": dict(output_scale=0.5),
    "all_tight": dict(sigmoid_weight=True, bias_clamp=0.05, hidden_clamp=1.0, output_scale=-0.75),
}
EPS = 1e-6


def tolerance(dtype) -> float:
    """Relative L2 bound of a result rounded once to ``dtype`` from an fp32 (fp64) computation:
    two units of the dtype's rounding plus 2**10 units of the accumulation's (the row sums)."""
    return 2 * torch.finfo(dtype).eps + 1024 * compute_eps(dtype)


def param_tolerance(dtype, param_dtype) -> float:
    # The parameter gradients are sums in fp32 (fp64 for fp64 x), rounded once to the
    # parameter's dtype; never to x's.
    return 2 * torch.finfo(param_dtype).eps + 4096 * compute_eps(dtype)


def make_case(counts, H, dtype, device, gen, pad=0, param_dtype=torch.float32):
    """x, mul, grad_out [M + pad, H] (randn, never zero), weight [E, 3] and bias [E, 1] of
    both signs (bias beyond ±0.5 for some experts, so the clamp acts), offsets int64."""
    M = sum(counts) + pad
    E = len(counts)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    x, mul, g = randn(M, H), randn(M, H), randn(M, H)
    weight = (torch.randn(E, 3, generator=gen) + torch.tensor([0.3, -0.4, 0.9])).to(param_dtype).to(device)
    bias = (torch.randn(E, 1, generator=gen) * 0.5).to(param_dtype).to(device)
    offsets = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device)
    return x, mul, g, weight, bias, offsets


def run(backend, x, mul, g, weight, bias, offsets, options, **kw):
    """(out, dx, dmul, dweight, dbias) from poly_norm_grouped_mul and autograd, every buffer the
    ops allocate poisoned first."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, mul, weight, bias)]
    with poisoned_outputs():
        out = polynorm.poly_norm_grouped_mul(*leaves[:2], *leaves[2:], offsets, eps=EPS, backend=backend, **options, **kw)
        grads = torch.autograd.grad(out, leaves, g)
    return (out.detach(),) + grads


def oracle(x, mul, g, weight, bias, offsets, options):
    leaves = [t.detach().double().requires_grad_(True) for t in (x, mul, weight, bias)]
    out = reference.poly_norm_grouped_mul(*leaves, offsets, EPS, compute_dtype=torch.float64, **options)
    grads = torch.autograd.grad(out, leaves, g.double())
    return (out.detach(),) + grads


def check(got, want, dtype, what):
    names = ("out", "dx", "dmul", "dweight", "dbias")
    for name, a, b in zip(names, got, want):
        assert not a.isnan().any(), f"{what}: NaN in {name} (an element left unwritten?)"
        tol = param_tolerance(dtype, a.dtype) if name in ("dweight", "dbias") else tolerance(dtype)
        err = rel_l2(a, b)
        assert err <= tol, f"{what}: {name} relative L2 error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("option", list(OPTIONS))
def test_matches_oracle(device, backend, dtype, option):
    """Every option on and off, every dtype with fp32 parameters, against the float64 oracle;
    an empty expert, rows of no expert (out, dx, dmul exactly 0 there)."""
    gen = torch.Generator().manual_seed(seed_for("moe", backend, dtype, option))
    counts = [5, 0, 7, 1, 3]
    x, mul, g, w, b, offsets = make_case(counts, 72, dtype, device, gen, pad=3)
    got = run(backend, x, mul, g, w, b, offsets, OPTIONS[option])
    check(got, oracle(x, mul, g, w, b, offsets, OPTIONS[option]), dtype, f"{backend} {dtype} {option}")
    end = sum(counts)
    for name, t in zip(("out", "dx", "dmul"), got[:3]):
        assert not t[end:].any(), f"{name} nonzero on rows of no expert"
    assert not got[3][1].any() and not got[4][1].any(), "an empty expert's parameter gradients are not 0"
    assert got[3].dtype == w.dtype and got[4].shape == b.shape


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("E", [1, 5, 33, 129])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64], ids=str)
def test_expert_counts(device, backend, E, offsets_dtype):
    """One expert, E not a multiple of 4, 32 or 128, with empty experts, int32 and int64
    offsets, and counts instead of offsets: the same bits."""
    gen = torch.Generator().manual_seed(seed_for("moe-E", backend, E, offsets_dtype))
    counts = torch.randint(0, 3, (E,), generator=gen).tolist()
    counts[0] = max(counts[0], 1)
    x, mul, g, w, b, offsets = make_case(counts, 24, torch.float32, device, gen)
    got = run(backend, x, mul, g, w, b, offsets.to(offsets_dtype), MOTIF3)
    check(got, oracle(x, mul, g, w, b, offsets, MOTIF3), torch.float32, f"{backend} E={E}")
    by_counts = run(backend, x, mul, g, w, b, None, MOTIF3, counts=torch.tensor(counts, device=device))
    for a, c in zip(got, by_counts):
        assert torch.equal(a, c)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_long_rows(device, backend, monkeypatch):
    """Rows longer than one block (the Triton kernels' column loop), Motif-3's options."""
    from polynorm import triton_kernels

    monkeypatch.setattr(triton_kernels, "_MAX_ONE_BLOCK_OVERRIDE", 64)
    gen = torch.Generator().manual_seed(seed_for("moe-long", backend))
    x, mul, g, w, b, offsets = make_case([3, 2], 300, torch.bfloat16, device, gen)
    got = run(backend, x, mul, g, w, b, offsets, OPTIONS["all_tight"])
    check(got, oracle(x, mul, g, w, b, offsets, OPTIONS["all_tight"]), torch.bfloat16, f"{backend} looped")


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_clamp_boundary(device, backend):
    """At the clamp's boundary: x and mul exactly ±c pass their gradient, beyond ±c none; the
    product clamped to ±c passes none to x, mul or the parameters; bias exactly ±bias_clamp
    passes its gradient, beyond none."""
    c, k = 2.0, 0.25
    gen = torch.Generator().manual_seed(seed_for("moe-boundary", backend))
    x, mul, g, w, b, offsets = make_case([4, 4], 16, torch.float64, device, gen)
    x[0, :4] = torch.tensor([c, -c, 3 * c, -3 * c])
    mul[1, :4] = torch.tensor([c, -c, 3 * c, -3 * c])
    mul[5] = 1.9  # inside the clamp: where |y| > 2 / 1.9 the output clamp acts
    b[0, 0], b[1, 0] = k, -3 * k
    w[0] = 0.01  # expert 0's |y| < 0.5: its products with mul = ±c stay inside ±c
    w[1] = 1.0  # expert 1's y = norm(x^3) + norm(x^2) + norm(x) - k: often beyond ±1
    options = dict(bias_clamp=k, hidden_clamp=c)
    got = run(backend, x, mul, g, w, b, offsets, options)
    check(got, oracle(x, mul, g, w, b, offsets, options), torch.float64, backend)
    _, dx, dmul, _, db = got
    assert dx[0, 0] != 0 and dx[0, 1] != 0 and dx[0, 2] == 0 and dx[0, 3] == 0
    assert dmul[1, 0] != 0 and dmul[1, 1] != 0 and dmul[1, 2] == 0 and dmul[1, 3] == 0
    assert db[0, 0] != 0 and db[1, 0] == 0
    out = got[0]
    moved = out[5].abs() == c  # output_scale 1: the clamped product itself
    assert moved.sum() >= 3 and not dmul[5][moved].any() and dmul[5][~moved].all()


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("layout", ["chunk", "interleave"])
def test_gate_up_views(device, backend, layout):
    """x and mul as views of one gate_up projection give the bits of contiguous copies (read in
    place: the ops take a row and a column stride each)."""
    gen = torch.Generator().manual_seed(seed_for("moe-views", backend, layout))
    counts, H = [3, 0, 4], 40
    gate_up = torch.randn(sum(counts), 2 * H, generator=gen).to(torch.bfloat16).to(device)
    x, mul = gate_up.chunk(2, dim=-1) if layout == "chunk" else (gate_up[:, 0::2], gate_up[:, 1::2])
    assert not x.is_contiguous()
    _, _, g, w, b, offsets = make_case(counts, H, torch.bfloat16, device, gen)
    strided = run(backend, x, mul, g, w, b, offsets, MOTIF3)
    dense = run(backend, x.contiguous(), mul.contiguous(), g, w, b, offsets, MOTIF3)
    for a, c in zip(strided, dense):
        assert torch.equal(a, c)


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_nan_stays_in_its_row(device, backend):
    gen = torch.Generator().manual_seed(seed_for("moe-nan", backend))
    x, mul, g, w, b, offsets = make_case([3, 3], 32, torch.float32, device, gen)
    x[1, 5] = float("nan")
    out, dx, dmul, dw, db = run(backend, x, mul, g, w, b, offsets, MOTIF3)
    assert out[1].isnan().any() and dx[1].isnan().any()
    for t in (out, dx, dmul):
        assert not t[[0, 2, 3, 4, 5]].isnan().any(), "a NaN left its row"
    assert dw[0].isnan().any() and not dw[1].isnan().any() and not db[1].isnan().any()


@pytest.mark.parametrize("device,backend", BACKENDS)
def test_deterministic(device, backend):
    gen = torch.Generator().manual_seed(seed_for("moe-det", backend))
    x, mul, g, w, b, offsets = make_case([40, 3, 0, 17], 48, torch.bfloat16, device, gen)
    first = run(backend, x, mul, g, w, b, offsets, MOTIF3)
    second = run(backend, x, mul, g, w, b, offsets, MOTIF3)
    for a, c in zip(first, second):
        assert torch.equal(a, c)


def test_cpu_kernel_matches_triton_bits():
    """The C++ and Triton kernels follow the same order of operations: the same bits on fp64."""
    pytest.importorskip("triton")
    if not polynorm.moe._triton_grouped or not __import__("os").environ.get("TRITON_INTERPRET"):
        pytest.skip("Triton runs CPU tensors only under TRITON_INTERPRET=1")
    gen = torch.Generator().manual_seed(seed_for("moe-bits"))
    x, mul, g, w, b, offsets = make_case([3, 4], 24, torch.float64, "cpu", gen)
    cpu = run("auto", x, mul, g, w, b, offsets, OPTIONS["all_tight"])
    tri = run("triton", x, mul, g, w, b, offsets, OPTIONS["all_tight"])
    for a, c in zip(cpu, tri):
        torch.testing.assert_close(a, c, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(
    "device,ops",
    [
        ("cpu", ("grouped_mul_forward", "grouped_mul_backward")),
        pytest.param("cpu", ("grouped_mul_forward_triton", "grouped_mul_backward_triton"), marks=[requires_triton, requires_interpreter]),
        pytest.param("cuda", ("grouped_mul_forward_triton", "grouped_mul_backward_triton"), marks=[requires_triton, requires_cuda]),
    ],
)
def test_opcheck(device, ops):
    gen = torch.Generator().manual_seed(seed_for("moe-opcheck", ops))
    x, mul, g, w, b, offsets = make_case([2, 0, 3], 16, torch.float32, device, gen, pad=1)
    fwd, bwd = (getattr(torch.ops.polynorm, name) for name in ops)
    x_, mul_, w_, b_ = (t.clone().requires_grad_(True) for t in (x, mul, w, b.reshape(-1)))
    torch.library.opcheck(fwd, (x_, mul_, w_, b_, offsets, EPS, 1.5, 0.5))
    _, rstd = fwd(x, mul, w, b, offsets, EPS, 1.5, 0.5)
    torch.library.opcheck(bwd, (g, x, mul, w, b, offsets, rstd, 1.5, 0.5))


@requires_cuda
def test_cuda_cpp_op_says_not_implemented():
    """The C++ op has no CUDA kernel: it says so, naming the op (never a copy to the CPU)."""
    x = torch.randn(4, 8, device="cuda")
    w, b, off = torch.ones(2, 3, device="cuda"), torch.zeros(2, device="cuda"), torch.tensor([2, 4], device="cuda")
    with pytest.raises(NotImplementedError, match="polynorm.grouped_mul_forward"):
        torch.ops.polynorm.grouped_mul_forward(x, x, w, b, off)


def test_backend_cuda_refused():
    x = torch.randn(4, 8)
    with pytest.raises(NotImplementedError, match="polynorm.poly_norm_grouped_mul: backend 'cuda'"):
        polynorm.poly_norm_grouped_mul(x, x, torch.ones(2, 3), torch.zeros(2), torch.tensor([2, 4]), backend="cuda")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(hidden_clamp=0.0), ValueError, "hidden_clamp > 0"),
        (dict(hidden_clamp="1"), TypeError, "hidden_clamp to be a real number"),
        (dict(bias_clamp=-1.0), ValueError, "bias_clamp >= 0"),
        (dict(output_scale=float("inf")), ValueError, "output_scale to be finite"),
    ],
)
def test_bad_options(kwargs, error, match):
    x = torch.randn(4, 8)
    with pytest.raises(error, match=f"polynorm.poly_norm_grouped_mul: expected {match}"):
        polynorm.poly_norm_grouped_mul(x, x, torch.ones(2, 3), torch.zeros(2), torch.tensor([2, 4]), **kwargs)


def test_bad_mul():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="polynorm.poly_norm_grouped_mul: expected mul to have x's dtype"):
        polynorm.poly_norm_grouped_mul(x, x.double(), torch.ones(2, 3), torch.zeros(2), torch.tensor([2, 4]))
    with pytest.raises(RuntimeError, match="polynorm.grouped_mul_forward: expected mul to have x's shape"):
        torch.ops.polynorm.grouped_mul_forward(x, x[:, :4], torch.ones(2, 3), torch.zeros(2), torch.tensor([2, 4]))


def test_counts_errors_name_the_function():
    x = torch.randn(4, 8)
    for fn, name in ((polynorm.poly_norm_grouped_mul, "poly_norm_grouped_mul"),
                     (polynorm.poly_norm_grouped_mul_fp8, "poly_norm_grouped_mul_fp8")):  # fmt: skip
        with pytest.raises(RuntimeError, match=f"polynorm.{name}: expected counts to be int32 or int64, got torch.float32"):
            fn(x, x, torch.ones(2, 3), torch.zeros(2), counts=torch.tensor([2.0, 2.0]), backend="reference")


# ---------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------


def test_module_from_config_and_checkpoint():
    """GroupedMulPolyNorm.from_config reads Motif-3's keys; a checkpoint's act_fn state
    (weight [E, 3], bias [E, 1]) loads as it is; the forward is the function's."""
    config = types.SimpleNamespace(
        num_experts=6, polynorm_sigmoid_weight=True, polynorm_output_scale=0.5, polynorm_bias_clamp=0.5, hidden_clamp=1e6
    )
    act = polynorm.GroupedMulPolyNorm.from_config(config)
    assert (act.sigmoid_weight, act.bias_clamp, act.hidden_clamp, act.output_scale) == (True, 0.5, 1e6, 0.5)
    shared = polynorm.GroupedMulPolyNorm.from_config(vars(config), routed=False)
    assert shared.bias_clamp is None
    gen = torch.Generator().manual_seed(seed_for("moe-module"))
    state = {"weight": torch.randn(6, 3, generator=gen), "bias": torch.randn(6, 1, generator=gen)}
    act.load_state_dict(state)
    x, mul = torch.randn(10, 16, generator=gen), torch.randn(10, 16, generator=gen)
    counts = torch.tensor([2, 0, 3, 1, 4, 0])
    want = polynorm.poly_norm_grouped_mul(x, mul, state["weight"], state["bias"], counts=counts, **MOTIF3)
    assert torch.equal(act(x, mul, counts=counts), want)
    assert "sigmoid_weight=True" in repr(act)


def test_grouped_poly_norm_loads_bias_of_e_by_1():
    """Plain GroupedPolyNorm accepts Motif-3's [E, 1] bias state."""
    mod = polynorm.GroupedPolyNorm(4)
    bias = torch.randn(4, 1)
    mod.load_state_dict({"weight": torch.randn(4, 3), "bias": bias})
    assert mod.bias.shape == (4,) and torch.equal(mod.bias.detach(), bias.reshape(4))


# ---------------------------------------------------------------------------------------
# The token-major layout (forward only)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("device,backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mapped", [True, False], ids=["expert_map", "no_map"])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64], ids=str)
def test_topk_layout(device, backend, dtype, mapped, ids_dtype):
    """Rows of a local expert against the float64 oracle; rows of another rank's expert (map
    entry -1) and ids outside the map keep out's values, bit for bit. x and mul are the halves
    of a [T, K, 2H] gate_up, read in place."""
    gen = torch.Generator().manual_seed(seed_for("moe-topk", backend, dtype, mapped, ids_dtype))
    T, K, H, E_global = 6, 3, 40, 7
    local = [1, 3, 4, 6]  # this rank's experts
    expert_map = torch.full((E_global,), -1, dtype=ids_dtype)
    expert_map[local] = torch.arange(len(local), dtype=ids_dtype)
    n_ids = E_global if mapped else len(local)
    topk_ids = torch.randint(0, n_ids, (T, K), generator=gen)
    topk_ids[0, 0] = n_ids + 5  # outside the map: no row's
    topk_ids = topk_ids.to(ids_dtype).to(device)
    gate_up = torch.randn(T, K, 2 * H, generator=gen).to(dtype).to(device)
    x, mul = gate_up.chunk(2, dim=-1)
    w = (torch.randn(len(local), 3, generator=gen) + 0.3).to(device)
    b = (torch.randn(len(local), 1, generator=gen) * 0.5).to(device)
    emap = expert_map.to(device) if mapped else None
    out = torch.full((T, K, H), 7.0, dtype=dtype, device=device)  # the workspace's old values
    options = dict(sigmoid_weight=True, bias_clamp=0.5, hidden_clamp=1.5, output_scale=0.5)
    got = polynorm.poly_norm_grouped_mul_topk(x, mul, w, b, topk_ids, emap, out=out, backend=backend, **options)
    assert got is out
    want = reference.poly_norm_grouped_mul_topk(
        x.double(), mul.double(), w, b, topk_ids, emap, out=torch.full((T, K, H), 7.0, dtype=torch.float64, device=device),
        compute_dtype=torch.float64, **options,
    )  # fmt: skip
    ids = topk_ids.reshape(-1).long().cpu()
    owned = torch.tensor([0 <= i < n_ids and (expert_map[i] >= 0 if mapped else True) for i in ids.tolist()])
    assert 0 < owned.sum() < T * K
    rows, want_rows = out.reshape(-1, H).cpu(), want.reshape(-1, H).cpu()
    assert (rows[~owned] == 7.0).all(), "a row of no local expert was written"
    err = rel_l2(rows[owned], want_rows[owned])
    assert err <= tolerance(dtype), f"{backend}: relative L2 error {err:.3g}"


def test_topk_matches_sorted_layout():
    """The token-major forward gives the expert-sorted op's bits for the same rows."""
    gen = torch.Generator().manual_seed(seed_for("moe-topk-sorted"))
    T, K, H, E = 5, 2, 24, 3
    topk_ids = torch.randint(0, E, (T, K), generator=gen)
    x, mul = torch.randn(T * K, H, generator=gen), torch.randn(T * K, H, generator=gen)
    w, b = torch.randn(E, 3, generator=gen), torch.randn(E, 1, generator=gen)
    got = polynorm.poly_norm_grouped_mul_topk(x, mul, w, b, topk_ids, **MOTIF3)
    order = torch.argsort(topk_ids.reshape(-1), stable=True)
    counts = torch.bincount(topk_ids.reshape(-1), minlength=E)
    sorted_out = polynorm.poly_norm_grouped_mul(x[order], mul[order], w, b, counts=counts, **MOTIF3)
    assert torch.equal(got[order], sorted_out)


TOPK_BACKENDS = [
    "auto",
    pytest.param("triton", marks=[requires_triton, requires_interpreter]),
    "reference",
]


@pytest.mark.parametrize("backend", TOPK_BACKENDS)
def test_topk_checks_on_every_backend(backend):
    """Every backend checks the arguments first, naming the function: a bias of the wrong shape
    (not a reshape's error), arguments that are not tensors, and an out whose rows share memory
    (an expanded tensor, which the kernels would write from several rows at once)."""
    T, K, H, E = 3, 2, 8, 3
    x = torch.randn(T * K, H)
    w, b, ids = torch.randn(E, 3), torch.randn(E), torch.randint(0, E, (T, K))
    op = "polynorm.poly_norm_grouped_mul_topk: expected"
    with pytest.raises(RuntimeError, match=rf"{op} bias of shape \[3\] or \[3, 1\] .*got \[3, 2\]"):
        polynorm.poly_norm_grouped_mul_topk(x, x, w, torch.randn(E, 2), ids, backend=backend)
    with pytest.raises(TypeError, match=f"{op} topk_ids to be a Tensor, got list"):
        polynorm.poly_norm_grouped_mul_topk(x, x, w, b, ids.tolist(), backend=backend)
    with pytest.raises(TypeError, match=f"{op} expert_map to be a Tensor, got list"):
        polynorm.poly_norm_grouped_mul_topk(x, x, w, b, ids, [0, 1, 2], backend=backend)
    with pytest.raises(ValueError, match=f"{op} eps to be finite and >= 0, got nan"):
        polynorm.poly_norm_grouped_mul_topk(x, x, w, b, ids, eps=float("nan"), backend=backend)
    expanded = torch.zeros(1, H).expand(T * K, H)
    with pytest.raises(RuntimeError, match=rf"{op} out without internal overlap .*got strides \[0, 1\]"):
        polynorm.poly_norm_grouped_mul_topk(x, x, w, b, ids, out=expanded, backend=backend)
    assert not expanded.any()


def test_topk_op_refuses_an_out_with_internal_overlap():
    x = torch.randn(4, 8)
    out = torch.zeros(1, 8).expand(4, 8)
    with pytest.raises(RuntimeError, match="polynorm.grouped_mul_topk_forward: expected out without internal overlap"):
        torch.ops.polynorm.grouped_mul_topk_forward(
            x, x, torch.ones(2, 3), torch.zeros(2), torch.zeros(4, 1, dtype=torch.long), None, 1e-6, None, 1.0, out
        )


# ---------------------------------------------------------------------------------------
# FP8 output
# ---------------------------------------------------------------------------------------

TRITON_DEVICES = [
    pytest.param("cpu", marks=[requires_triton, requires_interpreter]),
    pytest.param("cuda", marks=[requires_triton, requires_cuda]),
]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("scale_format", ["fp32", "ue8m0", "ue8m0_packed"])
@pytest.mark.parametrize("with_mul", [True, False], ids=["mul", "grouped"])
@pytest.mark.parametrize("H", [128, 300, 1280])
def test_fp8_is_the_bf16_path_quantised(device, dtype, scale_format, with_mul, H):
    """Dequantised, the FP8 forward is the non-FP8 op's output quantised by torch's float8
    conversion with the same scales: q and the scales bit for bit (a partial last group, rows of
    no expert, an empty expert)."""
    gen = torch.Generator().manual_seed(seed_for("moe-fp8", dtype, scale_format, with_mul, H))
    counts = [3, 0, 4]
    x, mul, _, w, b, offsets = make_case(counts, H, dtype, device, gen, pad=2)
    mul = mul * 4  # values up to ~40: the scales differ from group to group
    mul[1] *= 500  # scales >= 2 on this row: UE8M0 codes >= 128, the packed word's sign bit set
    with poisoned_outputs():
        if with_mul:
            v = polynorm.poly_norm_grouped_mul(x, mul, w, b, offsets, backend="triton", **MOTIF3)
            q, scale = polynorm.poly_norm_grouped_mul_fp8(x, mul, w, b, offsets, scale_format=scale_format, **MOTIF3)
        else:
            v = polynorm.poly_norm_grouped(x, w, b, offsets, backend="triton")
            q, scale = polynorm.poly_norm_grouped_mul_fp8(x, None, w, b, offsets, scale_format=scale_format)
    want_q, want_scale = reference.quantize_fp8_groups(v, scale_format)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (x.shape[0], H)
    assert scale.shape == want_scale.shape and scale.t().is_contiguous()  # M-major
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)
    assert not q[sum(counts):].float().any()
    if scale_format == "fp32":  # e4m3's precision: half an ulp, 2^-4 relative, of each value
        deq = q.float().reshape(-1, H) * scale.repeat_interleave(128, dim=1)[:, :H]
        assert ((deq - v.float()).abs() <= v.float().abs() / 16 + scale.max() * 2**-9).all()


def test_fp8_packed_scales_decode():
    """The packed UE8M0 words decode to the unpacked power-of-two scales."""
    gen = torch.Generator().manual_seed(seed_for("moe-fp8-packed"))
    v = torch.randn(5, 128 * 6 + 7, generator=gen) * torch.logspace(-3, 3, 5)[:, None]
    _, pow2 = reference.quantize_fp8_groups(v, "ue8m0")
    _, packed = reference.quantize_fp8_groups(v, "ue8m0_packed")
    codes = torch.stack([(packed.long() >> (8 * k)) & 0xFF for k in range(4)], dim=-1).reshape(5, -1)[:, : pow2.shape[1]]
    assert torch.equal(torch.ldexp(torch.ones_like(pow2), codes - 127), pow2)
    mant, _ = torch.frexp(pow2)
    assert (mant == 0.5).all()


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_fp8_checks_on_every_backend(backend):
    """The reference backend refuses what the kernel refuses (it used to quantise a float64 x,
    and take any scale_format for "ue8m0"), and the parameters are checked before the
    coefficients are formed from them; all before any kernel runs, naming the function."""
    x = torch.randn(4, 128)
    w, b, offsets = torch.ones(2, 3), torch.zeros(2), torch.tensor([2, 4])
    op = "polynorm.poly_norm_grouped_mul_fp8: expected"
    fp8 = polynorm.poly_norm_grouped_mul_fp8
    with pytest.raises(RuntimeError, match=rf"{op} bias of shape \[2\] or \[2, 1\] .*got \[2, 2\]"):
        fp8(x, x, w, torch.zeros(2, 2), offsets, backend=backend)
    with pytest.raises(RuntimeError, match=rf"{op} bias of shape \[2\] or \[2, 1\] .*got \[\]"):
        fp8(x, None, w, torch.tensor(0.0), offsets, backend=backend)
    with pytest.raises(RuntimeError, match=f"{op} x to be float16, bfloat16 or float32 .*got torch.float64"):
        fp8(x.double(), x.double(), w, b, offsets, backend=backend)
    with pytest.raises(ValueError, match=f"{op} scale_format to be one of fp32, ue8m0, ue8m0_packed, got 'ue8m1'"):
        fp8(x, x, w, b, offsets, scale_format="ue8m1", backend=backend)
    with pytest.raises(ValueError, match=f"{op} output_scale 1.0 with mul None .*got 0.5"):
        fp8(x, None, w, b, offsets, output_scale=0.5, backend=backend)
    with pytest.raises(TypeError, match=f"{op} offsets to be a Tensor, got list"):
        fp8(x, x, w, b, [2, 4], backend=backend)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=[requires_triton, requires_interpreter]), "reference"])
def test_fp8_without_mul_clamps_x(backend):
    """With mul None, v is MATH.md (18)'s y: PolyNorm of clamp_c(x), on every backend (the
    reference used to leave x unclamped). Dequantised, q is the float64 oracle's within e4m3's
    precision."""
    gen = torch.Generator().manual_seed(seed_for("moe-fp8-clamp", backend))
    counts, H, c = [3, 2], 160, 0.5
    x, _, _, w, b, offsets = make_case(counts, H, torch.float32, "cpu", gen)
    x = x * 3  # most values beyond ±c
    q, scale = polynorm.poly_norm_grouped_mul_fp8(x, None, w, b, offsets, hidden_clamp=c, backend=backend)
    want = reference.poly_norm_grouped(x.double().clamp(-c, c), w.double(), b.double(), offsets, EPS,
                                       compute_dtype=torch.float64)  # fmt: skip
    deq = q.double() * scale.double().repeat_interleave(128, dim=1)[:, :H]
    assert ((deq - want).abs() <= want.abs() / 16 + scale.max().item() * 2**-9).all()


def test_moe_timing_smoke(tmp_path):
    """bench/moe_timing.py --smoke: tiny CPU tensors, each provider that runs here checked
    against the kernel before it is timed; the GPU-only ones skipped with the reason."""
    import json
    import math
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "moe_timing.json"
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(root / "bench" / "moe_timing.py"), "--smoke", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    timed = {r["provider"] for r in result["records"]}
    assert timed == {"triton", "loop"} and set(result["skipped"]) == {"fp8", "compiled"}, (timed, result["skipped"])
    assert all("GPU only" in why for why in result["skipped"].values())
    for r in result["records"]:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r
    assert "| H | E | empty |" in done.stdout


@pytest.mark.parametrize("device,backend", [("cpu", "auto"), pytest.param("cuda", "auto", marks=[requires_triton, requires_cuda])])
def test_compile_fullgraph(device, backend):
    """torch.compile(fullgraph=True) of the function, forward and backward: the same kernels run,
    so out, dx and dmul are eager's bits on the CPU. On CUDA, Inductor generates its own sigmoid
    for the coefficients, MATH.md (17), which may round an ulp away from eager's, so there they
    agree within fp32 roundoff; so do the parameter gradients everywhere (Inductor fuses the
    sigmoid's and the clamp's derivatives, MATH.md (23), in its own order)."""
    gen = torch.Generator().manual_seed(seed_for("moe-compile", device))
    x, mul, g, w, b, offsets = make_case([3, 0, 4], 32, torch.float32, device, gen, pad=1)

    def f(x, mul, w, b):
        return polynorm.poly_norm_grouped_mul(x, mul, w, b, offsets, backend=backend, **OPTIONS["all_tight"])

    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, mul, w, b)]
        out = fn(*leaves)
        results.append((out.detach(),) + torch.autograd.grad(out, leaves, g))
    for a, c in zip(results[0][:3], results[1][:3]):
        if device == "cpu":
            assert torch.equal(a, c)
        else:
            torch.testing.assert_close(a, c, rtol=4 * torch.finfo(torch.float32).eps, atol=1e-7)
    for a, c in zip(results[0][3:], results[1][3:]):
        torch.testing.assert_close(a, c, rtol=4 * torch.finfo(torch.float32).eps, atol=1e-7)
