"""Real input: a small PolyNorm language model trained on the Python stdlib, every backend against the reference.

``polynorm.lm.train`` (the main job, ``python3 -m polynorm``) trains the same byte-level transformer (PolyNorm MLPs in the PolyCom
and the gated form; Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884) and
compares the backends in lock-step (every step's loss and gradients on the reference's
parameters, bounded by the float64 reference's deviation) and free-running (each backend's
own run, final validation loss against the float64 twin's spread). Here:

- the bounds and verdicts on made-up numbers, so each way to fail is seen failing;
- CPU (CI): the tiny preset for 40 steps, the C++ kernel (``cpu``) against the reference, in
  fp32 and bf16 autocast; the lock-step driver's trajectory is a plain training run's;
- the gated MLP runs the fused PolyNorm x mul (``polynorm::mul_forward`` / ``mul_backward``,
  or their Triton twins) for every polynorm backend, and every row keeps the same parameter
  names;
- fault injection: the C++ kernel wrapped in an autograd.Function (``polynorm::forward`` /
  ``backward`` in the PolyCom form, the fused ``mul_forward`` / ``mul_backward`` in the gated
  form) that scales grad_weight by (1 + 1e-4) (fp32), scales grad_mul by (1 + 1e-4) (fp32,
  the fused op) or moves y (the fused op: out) by one bf16 ulp in one column (bf16) fails
  lock-step, while the unmodified kernel and the fault-free wrapper pass in the same run;
- the main job's exit status;
- GPU: ``cuda``, ``triton`` and the reference over a short run of a mid-size model, fp32 and
  bf16, the gated rows through the fused op (skipped with a reason without CUDA).
"""

import contextlib
import functools
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import polynorm
from _matrix import HAS_TRITON, INTERPRET, requires_cuda

from polynorm.lm import data as lm_data
from polynorm.lm import model as lm_model
from polynorm.lm import train as train_lm

REPO = Path(__file__).resolve().parent.parent

FORMS = ["polycom", "gated"]
PRECISIONS = ["fp32", "bf16"]
FLOOR = train_lm.FLOOR_LABEL
CPU_CONFIG = replace(train_lm.PRESETS["cpu"], steps=40, warmup_steps=12)


def _runs(report, mlp, dtype):
    return {r["label"]: r for r in report["runs"] if r["mlp"] == mlp and r["dtype"] == dtype}


# ---------------------------------------------------------------------------------------
# The corpus and the batches are deterministic
# ---------------------------------------------------------------------------------------


def test_corpus_is_deterministic_and_split_by_file():
    files = lm_data.stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert not any(part in lm_data.SKIP_DIRS for f in files for part in f.split("/")[:-1])
    a = lm_data.build_corpus(1 << 18, seed=0)
    b = lm_data.build_corpus(1 << 18, seed=0)
    assert a.sha256 == b.sha256 and torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    assert a.train.numel() > 0.8 * (1 << 18) and a.val.numel() > 0.08 * (1 << 18)
    assert lm_data.build_corpus(1 << 18, seed=1).sha256 != a.sha256
    starts = lm_data.batch_starts(a.train.numel(), 64, 8, 5, seed=3)
    assert torch.equal(starts, lm_data.batch_starts(a.train.numel(), 64, 8, 5, seed=3))
    x, y = lm_data.get_batch(a.train, starts[0], 64)
    assert x.shape == y.shape == (8, 64) and torch.equal(x[:, 1:], y[:, :-1])


# ---------------------------------------------------------------------------------------
# Bounds and verdicts on made-up numbers
# ---------------------------------------------------------------------------------------


def _lock_result(floor_dev, row_dev):
    """A ``lock_step`` result with one backend row; deviations (steps, 1 + modules), loss first."""
    steps = floor_dev.shape[0]
    dev = torch.stack([torch.zeros_like(floor_dev), row_dev, floor_dev])
    return {"labels": ["reference", "kernel", FLOOR], "modules": [f"m{k}" for k in range(floor_dev.shape[1] - 1)],
            "loss_dev": dev[:, :, 0], "grad_dev": dev[:, :, 1:], "losses": torch.ones(3, steps)}


def test_lock_step_floors_and_verdicts():
    factor, minimum = train_lm.FLOOR_FACTOR, train_lm.FLOOR_MIN
    floor = torch.tensor([[1e-6, 0.0, 3e-4], [4e-6, 0.0, 0.0], [1e-6, 0.0, 3e-4]], dtype=torch.float64)
    floors = train_lm.lock_step_floors(floor)
    # The largest and the mean over the steps, a step where the floor is 0 notwithstanding; a
    # floor that is 0 at every step (column 1) still gives a floor, hence a bound, above 0.
    assert floors[0].tolist() == pytest.approx([4e-6, minimum, 3e-4])
    assert floors[1].tolist() == pytest.approx([2e-6, minimum, 2e-4])
    assert minimum == torch.finfo(torch.float32).eps
    assert train_lm.lock_step_floors(torch.tensor([[math.nan], [1.0]])).isnan().all()  # a broken floor fails
    # The floor row is 1 floor; a row at 0.99 x FLOOR_FACTOR floors on every step agrees, 1.01 does not.
    assert train_lm.lock_step_verdicts(_lock_result(floor, floor))[FLOOR]["floors"] == pytest.approx(1)
    for scale, agrees in ((0.99, True), (1.01, False)):
        verdict = train_lm.lock_step_verdicts(_lock_result(floor, scale * factor * floor))["kernel"]
        assert verdict["agrees"] is agrees and verdict["floors"] == pytest.approx(scale * factor), scale
    # The largest deviation, on its own: over 40 steps whose floor is 1e-6 on each, one step
    # at 20x the floor's largest (the mean then 1.5 floors) is rounding's heavy tail and
    # agrees; one at 65x (the mean 2.6 floors) breaks SPIKE_FACTOR, and the module is named.
    spike = train_lm.SPIKE_FACTOR
    flat = torch.full((40, 3), 1e-6, dtype=torch.float64)
    for height, agrees in ((20, True), (spike + 1, False)):
        row = flat.clone()
        row[17, 2] = height * 1e-6
        verdict = train_lm.lock_step_verdicts(_lock_result(flat, row))["kernel"]
        assert verdict["agrees"] is agrees, height
        assert verdict["floors"] == pytest.approx(max((39 + height) / 40, height * factor / spike)), height
        if not agrees:
            assert verdict["worst_module"] == "m1"
            assert (39 + height) / 40 < factor  # the mean alone would have passed it
    # An infinite floor (the float64 row overflowed) is no bound: every row fails.
    broken = flat.clone()
    broken[3, 1] = math.inf
    assert train_lm.lock_step_floors(broken).isnan().any()
    assert not train_lm.lock_step_verdicts(_lock_result(broken, flat))["kernel"]["agrees"]
    # A small deviation on every step whose mean exceeds FLOOR_FACTOR x the floor's mean fails,
    # though no step exceeds FLOOR_FACTOR x the floor's largest.
    row = floor.clone()
    row[:, 2] = 0.9 * factor * 3e-4
    verdict = train_lm.lock_step_verdicts(_lock_result(floor, row))["kernel"]
    assert max(row[:, 2]) < factor * floors[0, 2] and not verdict["agrees"]
    assert verdict["floors"] == pytest.approx(0.9 * factor * 3e-4 / 2e-4)
    # A step that failed (NaN) fails; so does every row when the floor row failed.
    row = floor.clone()
    row[1, 0] = math.nan
    assert not train_lm.lock_step_verdicts(_lock_result(floor, row))["kernel"]["agrees"]
    broken = _lock_result(torch.full_like(floor, math.nan), 0 * floor)
    assert not train_lm.lock_step_verdicts(broken)["kernel"]["agrees"]


def test_free_running_verdict_against_the_twin_spread():
    ref = torch.linspace(2.0, 3.0, 64, dtype=torch.float64)
    change = 1e-3 * torch.tensor([1.0, -1.0] * 32, dtype=torch.float64)  # the twin: RMS 1e-3, mean 0
    spread = 1e-3 / ref.mean().item()
    same = train_lm.free_running_verdict(ref.clone(), ref, ref + change)
    assert same["val_dev"] == 0 and same["spread"] == pytest.approx(spread) and same["agrees"]
    for shift, agrees in ((0.95, True), (1.05, False)):  # in units of FREE_FACTOR spreads
        run = ref + shift * train_lm.FREE_FACTOR * 1e-3
        assert train_lm.free_running_verdict(run, ref, ref + change)["agrees"] is agrees, shift
    # A twin identical to the reference (an RMS of 0) leaves a bound of FREE_FACTOR x FLOOR_MIN, not 0.
    tiny = train_lm.free_running_verdict(ref * (1 + 1e-7), ref, ref.clone())
    assert tiny["spread"] == train_lm.FLOOR_MIN and tiny["agrees"]
    assert not train_lm.free_running_verdict(ref * (1 + 1e-5), ref, ref.clone())["agrees"]
    assert not train_lm.free_running_verdict(ref, ref, torch.full_like(ref, math.nan))["agrees"]  # no twin
    falls = train_lm.loss_falls([5.0] + [3.0] * 19)
    assert falls["loss_falls"] and falls["loss_last10"] == 3.0
    assert not train_lm.loss_falls([5.0] * 20)["loss_falls"]
    assert not train_lm.loss_falls([5.0] + [math.nan] * 19)["loss_falls"]


# ---------------------------------------------------------------------------------------
# CPU: the C++ kernel against the reference, tiny preset, 40 steps
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_report():
    return train_lm.run_comparison(
        CPU_CONFIG, torch.device("cpu"), mlps=FORMS, dtypes=PRECISIONS, labels=["cpu"], progress=False,
    )


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("mlp", FORMS)
def test_cpu_kernel_agrees_with_the_reference(cpu_report, mlp, dtype):
    runs = _runs(cpu_report, mlp, dtype)
    assert set(runs) == {"reference", "cpu", FLOOR}
    ref, cpu, floor = runs["reference"], runs["cpu"], runs[FLOOR]
    # The loss falls well below its start (ln 256 = 5.55 nats for uniform bytes).
    assert ref["free"]["loss_first"] > 5.0 and ref["free"]["loss_falls"]
    # The row really ran the C++ kernel: it keeps x and rstd for backward where the
    # reference keeps its intermediates.
    assert cpu["perf"]["saved_mib"] < 0.8 * ref["perf"]["saved_mib"]
    # The floor measured something (a bound of FLOOR_FACTOR x FLOOR_MIN everywhere would
    # mean the float64 row computed what the reference did), and so did the kernel.
    assert max(m["max"] for m in floor["lock"]["modules"].values()) > train_lm.FLOOR_MIN
    assert max(m["max"] for m in cpu["lock"]["modules"].values()) > 0
    # Lock-step: every step's loss and every module's gradient within the bounds.
    assert cpu["lock"]["agrees"], (
        f"cpu {mlp} {dtype}: {cpu['lock']['worst_module']} deviates {cpu['lock']['floors']:.2f} floors"
    )
    # Free-running: the final validation loss within the float64 twin's spread, the loss falling.
    free = cpu["free"]
    assert len(free["losses"]) == CPU_CONFIG.steps and all(math.isfinite(v) for v in free["losses"])
    assert free["agrees"], f"val loss moved {free['val_dev']:.2e}, bound {free['bound']:.2e}"
    assert free["loss_falls"]
    assert train_lm.run_ok(cpu) and train_lm.run_ok(ref)


def test_lock_step_driver_trains_like_a_plain_run():
    """The other rows' passes leave the reference's trajectory alone: the lock-step driver's
    losses and validation losses are bit-identical to a free-running reference run's."""
    device = torch.device("cpu")
    config = replace(CPU_CONFIG, steps=12, warmup_steps=3)
    corpus = lm_data.build_corpus(config.corpus_bytes, seed=config.seed)
    data = train_lm.Data(
        train=corpus.train, val=corpus.val,
        starts=lm_data.batch_starts(corpus.train.numel(), config.seq_len, config.batch_size, config.steps, seed=1),
        val_starts=lm_data.batch_starts(corpus.val.numel(), config.seq_len, config.batch_size, 2, seed=2),
    )
    model_config = lm_model.ModelConfig(n_layer=config.n_layer, hidden_size=config.hidden_size,
                                        n_head=config.n_head, seq_len=config.seq_len, mlp="gated")
    torch.manual_seed(0)
    init_state = lm_model.TinyLM(model_config).state_dict()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the preset does: this model gains nothing from more
    with train_lm.reproducible_numerics(), contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        lock = train_lm.lock_step(["reference", "cpu", FLOOR], model_config, init_state, config, "bf16", data, device,
                                  progress=False)
        plain = train_lm.train_one("reference", model_config, init_state, config, "bf16", data, device, progress=False)
    assert torch.equal(lock["losses"][0], plain["losses"])
    assert torch.equal(lock["val"], plain["val"])
    assert lock["loss_dev"][1].max() > 0  # the cpu row did compute something else


# ---------------------------------------------------------------------------------------
# The gated MLP runs the fused op
# ---------------------------------------------------------------------------------------


class PolyNormOps(TorchDispatchMode):
    """Records the ``polynorm::*`` ops that reach the dispatcher below autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "polynorm":
            self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


TRITON_ON_CPU = pytest.mark.skipif(
    not (HAS_TRITON and INTERPRET), reason="Triton on CPU tensors needs the triton package and TRITON_INTERPRET=1"
)


@pytest.mark.parametrize("mlp", FORMS)
@pytest.mark.parametrize("label, device, ops", [
    ("cpu", "cpu", {"polycom": ["polynorm::forward", "polynorm::backward"],
                    "gated": ["polynorm::mul_forward", "polynorm::mul_backward"]}),
    pytest.param("triton", "cpu", {"polycom": ["polynorm::forward_triton", "polynorm::backward_triton"],
                                   "gated": ["polynorm::mul_forward_triton", "polynorm::mul_backward_triton"]},
                 marks=TRITON_ON_CPU),
    pytest.param("cuda", "cuda", {"polycom": ["polynorm::forward", "polynorm::backward"],
                                  "gated": ["polynorm::mul_forward", "polynorm::mul_backward"]}, marks=requires_cuda),
    pytest.param("triton", "cuda", {"polycom": ["polynorm::forward_triton", "polynorm::backward_triton"],
                                    "gated": ["polynorm::mul_forward_triton", "polynorm::mul_backward_triton"]},
                 marks=[requires_cuda, pytest.mark.skipif(not HAS_TRITON, reason="needs the triton package")]),
])
def test_each_mlp_form_runs_its_op(label, device, ops, mlp):
    """The gated MLP's activation is the fused op, one forward and one backward per block, and
    no PolyNorm op of its own; the PolyCom MLP's is PolyNorm's."""
    config = lm_model.ModelConfig(n_layer=2, hidden_size=64, n_head=4, seq_len=16, mlp=mlp)
    torch.manual_seed(0)
    model = lm_model.TinyLM(config, backend=train_lm.backend_of(label)).to(device)
    act = model.blocks[0].mlp.act
    assert isinstance(act, polynorm.FusedMulPolyNorm if mlp == "gated" else polynorm.PolyNorm)
    assert lm_model.activation_op(act) == ("fused " if mlp == "gated" else "") + ops[mlp][0]
    idx = torch.randint(0, 256, (2, 16), device=device)
    with PolyNormOps() as seen:
        model(idx, idx).backward()
    assert sorted(seen.ops) == sorted(ops[mlp] * config.n_layer), seen.ops
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if ".act." in n)


class StubLigerPolyNormFunction:
    """Stands in for Liger-Kernel's ``LigerPolyNormFunction`` where liger_kernel is not installed
    (``apply(x, weight, bias, eps, in_place)``, bias 0-d): the reference PolyNorm, y rounded to
    x's dtype, as Liger's is."""

    @staticmethod
    def apply(x, weight, bias, eps, in_place=True):
        assert bias.dim() == 0 and in_place is False  # as LigerBacked*PolyNorm call it
        return polynorm.reference.poly_norm(x, weight, bias, eps)


@pytest.fixture
def liger(monkeypatch):
    """Liger's PolyNorm: the installed one, else the stub."""
    if not lm_model.liger_available()[0]:
        monkeypatch.setattr(lm_model, "_liger_function", lambda: (StubLigerPolyNormFunction, True, ""))


def test_every_row_builds_the_same_parameters(liger):
    """Lock-step shares the parameters between the rows by name: every row's model, whichever
    activation it runs (the fused op, the float64 twin, Liger's PolyNorm then ``*``), has the
    same parameter names and shapes, and loads the reference's state bitwise."""
    labels = ["reference", "cpu", FLOOR, "liger"]
    for mlp in FORMS:
        config = lm_model.ModelConfig(mlp=mlp)
        torch.manual_seed(0)
        ref = lm_model.TinyLM(config, backend="reference")
        shapes = {n: p.shape for n, p in ref.named_parameters()}
        for label in labels:
            model = lm_model.TinyLM(config, backend=train_lm.backend_of(label))
            assert {n: p.shape for n, p in model.named_parameters()} == shapes, (mlp, label)
            model.load_state_dict(ref.state_dict())
            assert all(torch.equal(p, shapes_p) for p, shapes_p in zip(model.parameters(), ref.parameters()))
            act = model.blocks[0].mlp.act
            assert isinstance(act, polynorm.FusedMulPolyNorm if mlp == "gated" else polynorm.PolyNorm), (mlp, label)


@pytest.fixture
def liger_stub(monkeypatch):
    """The stub in place of Liger's PolyNorm, installed or not: CPU tensors, on any machine
    (the installed Liger runs on CUDA tensors only; the main job runs it on a GPU)."""
    monkeypatch.setattr(lm_model, "_liger_function", lambda: (StubLigerPolyNormFunction, True, ""))


def test_liger_gated_rows_run_polynorm_then_mul(liger_stub):
    """Liger has no fused op: its gated row runs its PolyNorm, y rounded to x's dtype, then
    ``*``; the lock-step comparison runs it beside the fused rows, reports it and does not
    enforce it."""
    gen = torch.Generator().manual_seed(7)
    x, mul = torch.randn(2, 8, 96, generator=gen).to(torch.bfloat16).unbind(0)
    act = lm_model.make_mul_poly_norm("liger", 1e-6)
    assert isinstance(act, polynorm.FusedMulPolyNorm) and lm_model.activation_op(act) == "Liger PolyNorm, then *"
    y = act._fn.apply(x, act.weight, act.bias.view(()), act.eps, False)
    assert y.dtype == torch.bfloat16 and torch.equal(act(x, mul), y * mul)
    report = train_lm.run_comparison(CPU_CONFIG, torch.device("cpu"), mlps=["gated"], dtypes=["bf16"],
                                     labels=["cpu", "liger"], free_running=False, progress=False)
    runs = _runs(report, "gated", "bf16")
    assert runs["liger"]["op"] == "Liger PolyNorm, then *" and "error" not in runs["liger"]
    assert runs["cpu"]["op"] == "fused polynorm::mul_forward" and runs["cpu"]["lock"]["agrees"]
    assert "| gated | bf16 | liger | Liger PolyNorm, then * |" in train_lm.lock_step_table(report)
    assert not train_lm.enforced("liger")
    # The stub is the exact PolyNorm rounded to bf16, then the multiply rounded again: the
    # double rounding a public fork of the fused kernel had. Lock-step sees it (130 floors
    # on a CPU; the fused kernel 1.4).
    assert not runs["liger"]["lock"]["agrees"], runs["liger"]["lock"]["floors"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float64_twin_of_the_fused_op(dtype):
    """The gated form's floor row computes ``reference.poly_norm_mul`` in float64, PolyNorm and
    the product, rounded once: bitwise the float64 oracle rounded to x's dtype. (The fp32
    reference differs from it in fp32, PolyNorm's y rounded before the multiply in bf16.)"""
    gen = torch.Generator().manual_seed(5)
    x, mul = torch.randn(2, 8, 96, generator=gen).to(dtype).unbind(0)
    act = lm_model.make_mul_poly_norm(FLOOR, 1e-6)
    with torch.no_grad():
        act.weight.copy_(torch.tensor([0.3, -0.4, 0.9]))
        act.bias.fill_(0.1)
        out = act(x, mul)
    exact = polynorm.reference.poly_norm(x.double(), act.weight.double(), act.bias.double(), 1e-6) * mul.double()
    assert out.dtype == dtype and lm_model.activation_op(act) == "reference.poly_norm_mul in float64"
    assert torch.equal(out, exact.to(dtype))


# ---------------------------------------------------------------------------------------
# Fault injection: lock-step catches a kernel that is slightly wrong
# ---------------------------------------------------------------------------------------


def _one_ulp_up_in_column_0(t):
    """t with column 0 moved by one ulp of its dtype, towards +inf."""
    t = t.clone()
    t[..., 0] = torch.nextafter(t[..., 0], torch.tensor(math.inf, dtype=t.dtype))
    return t


class FaultyPolyNormFunction(torch.autograd.Function):
    """``torch.ops.polynorm.forward`` / ``backward`` (the C++ kernel on the CPU) with one fault:

    - ``"grad_weight"``: grad_weight scaled by (1 + 1e-4);
    - ``"out_ulp"``: y moved by one ulp of its dtype (towards +inf) in column 0;
    - ``None``: no fault (the wrapper alone must change nothing).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps, fault):
        y, rstd = torch.ops.polynorm.forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.fault = fault
        return _one_ulp_up_in_column_0(y) if fault == "out_ulp" else y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_weight, grad_bias = torch.ops.polynorm.backward(grad_y.contiguous(), x, weight, rstd)
        if ctx.fault == "grad_weight":
            grad_weight = grad_weight * (1 + 1e-4)
        return grad_x, grad_weight, grad_bias, None, None


class FaultyMulPolyNormFunction(torch.autograd.Function):
    """The fused ``torch.ops.polynorm.mul_forward`` / ``mul_backward`` (the C++ kernel on the
    CPU) with one fault:

    - ``"grad_weight"``: grad_weight scaled by (1 + 1e-4);
    - ``"grad_mul"``: grad_mul scaled by (1 + 1e-4);
    - ``"out_ulp"``: out moved by one ulp of its dtype (towards +inf) in column 0;
    - ``None``: no fault (the wrapper alone must change nothing).
    """

    @staticmethod
    def forward(ctx, x, mul, weight, bias, eps, fault):
        out, rstd = torch.ops.polynorm.mul_forward(x, mul, weight, bias, eps)
        ctx.save_for_backward(x, mul, weight, bias, rstd)
        ctx.fault = fault
        return _one_ulp_up_in_column_0(out) if fault == "out_ulp" else out

    @staticmethod
    def backward(ctx, grad_out):
        x, mul, weight, bias, rstd = ctx.saved_tensors
        grad_x, grad_mul, grad_weight, grad_bias = torch.ops.polynorm.mul_backward(
            grad_out.contiguous(), x, mul, weight, bias, rstd
        )
        if ctx.fault == "grad_weight":
            grad_weight = grad_weight * (1 + 1e-4)
        if ctx.fault == "grad_mul":
            grad_mul = grad_mul * (1 + 1e-4)
        return grad_x, grad_mul, grad_weight, grad_bias, None, None


class FaultyPolyNorm(polynorm.PolyNorm):
    """``polynorm.PolyNorm`` through ``FaultyPolyNormFunction``."""

    def __init__(self, eps: float = 1e-6, fault: str | None = None) -> None:
        super().__init__(eps=eps, backend="auto")
        self.fault = fault
        self.op = f"polynorm::forward, fault {fault}"

    def forward(self, x):
        return FaultyPolyNormFunction.apply(x, self.weight, self.bias, self.eps, self.fault)


class FaultyMulPolyNorm(polynorm.FusedMulPolyNorm):
    """``polynorm.FusedMulPolyNorm`` through ``FaultyMulPolyNormFunction``."""

    def __init__(self, eps: float = 1e-6, fault: str | None = None) -> None:
        super().__init__(eps=eps, backend="auto")
        self.fault = fault
        self.op = f"fused polynorm::mul_forward, fault {fault}"

    def forward(self, x, mul):
        return FaultyMulPolyNormFunction.apply(x, mul, self.weight, self.bias, self.eps, self.fault)


@pytest.mark.parametrize("fault, dtype, mlps", [
    # 1e-4 is far above fp32 rounding and far below bf16's, where it would be no fault at all.
    ("grad_weight", "fp32", FORMS),
    # One bf16 ulp is bf16 rounding's own step; in fp32 one bf16 ulp is a gross error. In the
    # gated form the fused op's output, PolyNorm times mul, is off.
    ("out_ulp", "bf16", FORMS),
    # The fused op's gradient of mul (up(x)'s), which no PolyNorm parameter sees.
    ("grad_mul", "fp32", ["gated"]),
])
def test_lock_step_catches_a_faulty_kernel(monkeypatch, fault, dtype, mlps):
    for registry, module in ((lm_model.POLY_NORMS, FaultyPolyNorm), (lm_model.MUL_POLY_NORMS, FaultyMulPolyNorm)):
        monkeypatch.setitem(registry, "cpu-wrapped", module)
        monkeypatch.setitem(registry, f"cpu-{fault}", functools.partial(module, fault=fault))
    report = train_lm.run_comparison(CPU_CONFIG, torch.device("cpu"), mlps=mlps, dtypes=[dtype],
                                     labels=["cpu", "cpu-wrapped", f"cpu-{fault}"], free_running=False,
                                     progress=False)
    for run in report["runs"]:  # the margins, shown with -s or on a failure
        if run["lock"] is not None:
            lock = run["lock"]
            print(f"{run['mlp']} {dtype} {run['label']}: {lock['floors']:.2f} floors "
                  f"(bound {train_lm.FLOOR_FACTOR:g}; {lock['worst_module']})")
    for mlp in mlps:
        runs = _runs(report, mlp, dtype)
        # Each row ran its form's op: the gated rows the fused PolyNorm x mul, faulty one included.
        fused = mlp == "gated"
        for label in ("cpu", "cpu-wrapped", f"cpu-{fault}"):
            assert runs[label]["op"].startswith("fused polynorm::mul_forward" if fused else "polynorm::forward")
        # The correct kernel passes, and so does the wrapper without a fault (bit for bit the kernel)...
        assert runs["cpu"]["lock"]["agrees"] and runs["cpu-wrapped"]["lock"]["agrees"]
        assert runs["cpu-wrapped"]["lock"]["modules"] == runs["cpu"]["lock"]["modules"]
        # ...and the faulty kernel fails, and fails the main job.
        faulty = runs[f"cpu-{fault}"]
        assert not faulty["lock"]["agrees"], f"{mlp}: {fault} within the bounds ({faulty['lock']['floors']:.2f} floors)"
        assert not train_lm.run_ok(faulty) and train_lm.enforced(faulty["label"])
        # A wrong gradient is caught where it lands, while the loss stays within its bound:
        # PolyNorm's weight gradient on its own parameters, mul's on up's weight.
        if fault in ("grad_weight", "grad_mul"):
            assert faulty["lock"]["worst_module"].endswith("mlp.act" if fault == "grad_weight" else "mlp.up")
            assert faulty["lock"]["modules"]["loss"]["floors"] <= train_lm.FLOOR_FACTOR


# ---------------------------------------------------------------------------------------
# Reports and the main job
# ---------------------------------------------------------------------------------------


def test_report_files(cpu_report, tmp_path):
    paths = train_lm.write_report(cpu_report, tmp_path)
    assert paths["plot"].stat().st_size > 10_000
    text = paths["markdown"].read_text()
    assert "DISAGREES" not in text
    # The agreement and performance tables say what each row runs: the gated rows the fused op.
    assert text.count("| gated | bf16 | cpu | fused polynorm::mul_forward |") == 2
    assert text.count("| polycom | bf16 | cpu | polynorm::forward |") == 2
    assert "| gated | fp32 | reference-fp64 | reference.poly_norm_mul in float64 |" in text
    assert "## Lock-step" in text and "## Free-running" in text and "tokens/s" in text


@pytest.mark.parametrize("steps, status", [(40, 0), (6, 1)])
def test_main_job_exit_status(tmp_path, steps, status):
    """``python3 -m polynorm`` (the README's main job) passes on 40 steps; 6 are too few for the loss to fall."""
    out = tmp_path / "train"
    cmd = [sys.executable, "-m", "polynorm", "--preset", "cpu", "--device", "cpu", "--mlp", "gated", "--dtype", "fp32",
           "--steps", str(steps), "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"plot: {out / 'loss_curves.png'}" in proc.stdout
    assert (out / "loss_curves.png").is_file() and (out / "summary.json").is_file()
    assert "| gated | fp32 | cpu | fused polynorm::mul_forward |" in proc.stdout
    if status:
        assert "FAILED" in proc.stdout and "loss does NOT fall" in proc.stdout


# ---------------------------------------------------------------------------------------
# GPU: cuda, triton and the reference
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_report():
    config = train_lm.TrainConfig(
        n_layer=2, hidden_size=256, n_head=4, seq_len=256, batch_size=8, steps=60, lr=1e-3, warmup_steps=18,
        corpus_bytes=4 << 20, timing_warmup=3,
    )
    return train_lm.run_comparison(
        config, torch.device("cuda"), mlps=FORMS, dtypes=PRECISIONS, labels=["cuda", "triton"], progress=False,
    )


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("mlp", FORMS)
def test_gpu_backends_agree_with_the_reference(gpu_report, mlp, dtype):
    runs = _runs(gpu_report, mlp, dtype)
    assert set(runs) == {"reference", "cuda", "triton", FLOOR}
    for label in ("cuda", "triton"):
        run = runs[label]
        assert "error" not in run, run.get("error")
        op = "forward_triton" if label == "triton" else "forward"
        assert run["op"] == (f"fused polynorm::mul_{op}" if mlp == "gated" else f"polynorm::{op}")
        assert run["lock"]["agrees"], f"{label}: {run['lock']['worst_module']} at {run['lock']['floors']:.2f} floors"
        assert run["free"]["agrees"] and run["free"]["loss_falls"], run["free"]
        assert train_lm.run_ok(run)
    assert runs["cuda"]["perf"]["peak_mib"] > 0 and runs["cuda"]["perf"]["tokens_per_s"] > 0
