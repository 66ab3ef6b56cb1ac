"""Train a small PolyNorm language model once per backend, and check that every backend agrees.

PolyNorm is the activation of Zhuo et al., "Polynomial Composition Activations: Unleashing
the Dynamics of Large Language Models", arXiv:2411.03884. The model (``polynorm.lm.model``) is a
byte-level decoder-only transformer whose MLPs use PolyNorm, in the PolyCom form
``down(PolyNorm(up(x)))`` (``polynorm.PolyNorm``) and in Motif's gated form
``down(PolyNorm(gate(x)) * up(x))``, where PolyNorm and the multiply are the fused op
(``polynorm.FusedMulPolyNorm``, ``polynorm.poly_norm_mul``). The text (``polynorm.lm.data``) is the
source of Python's own standard library.

Rows (one PolyNorm implementation each; everything else in the model is the same code; the
lock-step and throughput tables' "activation" column says what each row's MLPs run):

- ``reference``: ``polynorm.reference.poly_norm`` / ``poly_norm_mul`` (plain PyTorch, fp32
  compute, the product rounded once); the baseline;
- ``cuda`` / ``triton`` on a GPU; ``cpu`` (the C++ kernel, backend ``"auto"`` on CPU tensors)
  on the CPU: ``poly_norm`` in the PolyCom form, the fused ``poly_norm_mul``
  (``polynorm::mul_forward`` / ``mul_backward``, or ``mul_forward_triton`` /
  ``mul_backward_triton``) in the gated form;
- ``liger`` (Liger-Kernel's ``LigerPolyNormFunction``) where it imports: Liger has no fused
  op, so in the gated form its PolyNorm, then ``*``;
- ``reference-fp64``: the reference computed in float64 and rounded once (in the gated form
  ``reference.poly_norm_mul`` in float64, the fused op's exact twin): a correct PolyNorm that
  only rounds differently (more exactly), which measures the rounding floor.

For each MLP form and each precision (fp32; bf16 autocast with fp32 parameters) the model is
built once from a fixed seed, and two comparisons run, reported separately:

1. Lock-step (the kernel check, ``lock_step``). One model and one AdamW, driven by the
   reference. At every step, on the same parameters and the same batch, every row computes
   the loss and the gradients with its own PolyNorm (the model's PolyNorm modules are swapped
   for the row's, sharing their parameters); the optimizer then steps on the reference's
   gradients. A row's deviation from the reference is therefore one step's rounding carried
   through one forward and backward, never compounded along a trajectory. Compared at every
   step: the loss, ``|L - L_ref| / |L_ref|``, and each module's gradient (all of the module's
   parameters as one vector), ``||g - g_ref|| / ||g_ref||``. Bounds (``lock_step_floors``,
   ``lock_step_verdicts``): per quantity, a row's mean deviation over the steps may reach
   ``FLOOR_FACTOR`` times the ``reference-fp64`` row's mean, measured the same way in the
   same run, and its largest ``SPIKE_FACTOR`` times that row's largest (each floor at least
   ``FLOOR_MIN``).
2. Free-running (the outcome, ``train_one``). Every row but the reference trains its own copy
   from the same initial weights on the same batches (the reference's own trajectory is the
   lock-step's). Its final validation loss must lie within ``FREE_FACTOR x`` the spread of
   the reference against its float64 twin: the RMS, over the validation sequences, of the
   ``reference-fp64`` run's per-sequence loss change (``free_running_verdict``).

The loss must fall (mean of the last 10 steps at most ``LOSS_DROP`` of step 0's) for the
reference and for every free-running backend. Why the factors are what they are:
``README_TOLERANCES`` (also written into summary.md).

Reproducibility: TF32 is off (``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``), ``torch.use_deterministic_algorithms(True,
warn_only=True)`` is on, and attention runs through SDPA's math path, because the backward
of the fused (flash / memory-efficient) attention kernels is not deterministic unless
deterministic mode is strict. ``--attention auto`` lifts that, for throughput numbers only.

Outputs (``--out``, default ``out/train``): ``loss_curves.png`` (lock-step deviations against
the floor, free-running loss curves), ``summary.md``, ``summary.json`` (every step's numbers).
Exit status 1 when a polynorm backend disagrees in lock-step or in the free-running outcome,
or a loss does not fall (Liger's verdicts are reported, not enforced: it is not ours to fix).

Usage, from any directory once polynorm is installed::

    python3 -m polynorm                      # GPU preset on CUDA, CPU preset otherwise
    python3 -m polynorm --preset cpu --mlp gated --dtype fp32
"""

import os

# Deterministic cuBLAS workspaces; must be set before the first cuBLAS call.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.deterministic  # noqa: E402
from torch import Tensor, nn  # noqa: E402

import polynorm  # noqa: E402

from polynorm.lm.data import batch_starts, build_corpus, get_batch  # noqa: E402
from polynorm.lm.model import ModelConfig, TinyLM, activation_op, liger_available, make_activation  # noqa: E402

__all__ = [
    "FLOOR_FACTOR", "FLOOR_MIN", "FREE_FACTOR", "PRESETS", "SPIKE_FACTOR", "TrainConfig", "free_running_verdict", "lock_step",
    "lock_step_floors", "lock_step_verdicts", "main", "run_comparison", "train_one",
]


@dataclass
class TrainConfig:
    """Model size, data and optimizer for one comparison; ``PRESETS`` holds the named ones."""

    n_layer: int = 2
    hidden_size: int = 64
    n_head: int = 4
    seq_len: int = 64
    batch_size: int = 8
    steps: int = 100
    lr: float = 2e-3  # peak; linear warmup over warmup_steps, cosine to lr / 10
    warmup_steps: int = 30  # at most 30% of the steps (config_from_args)
    weight_decay: float = 0.1  # on the 2-D weights only
    grad_clip: float = 1.0
    corpus_bytes: int = 2 << 20
    val_batches: int = 4
    seed: int = 0
    timing_warmup: int = 3  # steps left out of tokens/s (Triton compiles, cuBLAS warms up)
    threads: int | None = None  # torch.set_num_threads for the run; None leaves torch's default


PRESETS = {
    # ~0.12 M parameters, 512 tokens a step: seconds per run. One thread: matrices this small
    # gain nothing from a second one, and an oversubscribed CI machine slows many-thread
    # OpenMP regions down by 10x and more.
    "cpu": TrainConfig(threads=1),
    # ~43 M parameters (6 x 768, T = 512), 4096 tokens a step, 200 steps. Batch 8, not 16: every
    # row runs a forward and backward per step twice (lock-step, then its own free-running
    # run), so batch 8 halves the five rows' time on a GPU.
    # 16 validation batches: 128 sequences for the free-running spread.
    "gpu": TrainConfig(
        n_layer=6, hidden_size=768, n_head=12, seq_len=512, batch_size=8, steps=200, lr=1e-3, warmup_steps=50,
        corpus_bytes=16 << 20, val_batches=16, timing_warmup=5,
    ),
}

LOSS_DROP = 0.7  # mean of the last 10 losses <= LOSS_DROP * loss at step 0
FLOOR_LABEL = "reference-fp64"  # the rounding-floor row (lock-step) and the float64 twin (free-running)
# Why these numbers: README_TOLERANCES below (also written into summary.md).
FLOOR_FACTOR = 8.0  # a row's mean lock-step deviation may reach this many times the floor's mean...
SPIKE_FACTOR = 64.0  # ...and its largest this many times the floor's largest...
FLOOR_MIN = torch.finfo(torch.float32).eps  # ...each floor at least one fp32 ulp (2^-23), so a bound is never 0
FREE_FACTOR = 8.0  # the free-running val loss may move this many times the float64 twin's spread

README_TOLERANCES = """\
- Lock-step. Every row computes each step's loss and gradients on the reference's
  parameters and batch (one AdamW steps on the reference's gradients), so its deviation is
  one step's rounding carried through one forward and backward, not a trajectory's chaos.
  Quantities: the loss, |L - L_ref| / |L_ref|, and each module's gradient, all its
  parameters as one vector, ||g - g_ref|| / ||g_ref||.
- The floor of a quantity is the same deviation of the float64 reference (a correct
  PolyNorm, rounded once from float64), measured in the same run: its largest over the
  steps and its mean, each at least FLOOR_MIN, one fp32 ulp (2^-23 ~ 1.2e-7), so that no
  bound is 0 where the floor is. Over the steps, not step by step: one step's floor can be
  ~0 by chance (in bf16, fp32 rounding differences flip the bf16 rounding of ~1e-4 of the
  elements, on some steps none that reach a given module; an fp32 loss differs by 0 or 1
  ulp). A row agrees when, for every quantity, its mean deviation is at most FLOOR_FACTOR
  (8) times the floor's mean and its largest at most SPIKE_FACTOR (64) times the floor's
  largest: the mean catches a small fault on every step, the largest a gross fault on a few
  steps. The largest gets the wider factor because the ratio of two maxima over the steps
  is heavy-tailed: on the H200 image's CPU the C++ kernel's largest loss deviation once
  reached 9.8 times the floor's largest while its mean stayed at 2.2 floors, and over three
  seeds on the CPU machine the largest ratio reached 30 where no mean exceeded 3.8. In
  floors, as tables report them, a row's figure is the larger of its mean ratio and its
  largest ratio times FLOOR_FACTOR / SPIKE_FACTOR, so that 8 is the bound of both. The
  bounds are not capped; a floor that is not finite fails every row of its run. What this
  lets through: a fault on a single step that stays under 64 times the floor's largest,
  which in bf16 can be a large relative error (the floor's largest PolyNorm gradient
  deviation was ~9e-3 on the H200); an intermittent fault is the test suite's to catch
  (determinism, batch invariance and the parity matrix), not this job's.
- Why 8: the float64 reference carries almost no rounding error of its own, so the floor
  is the fp32 reference's error. A correct kernel deviates from the reference by its own
  error and the reference's, sqrt(1 + k^2) floors for independent roundings when its error
  is k times the reference's. The kernels round differently, not worse (rsqrt, fp32 sums
  in another order, a closed-form backward instead of autograd's): k of 1 to 3. 8 admits k
  up to ~8 and stays far below the faults below. Measured on a CPU (the C++ kernel): at
  most 1.6 floors in fp32 and 2.2 in bf16 over the tiny preset's 100 steps; 2.4 and 3.4 in
  CI's 40 steps (fewer steps to take the floor's largest over).
- Faults it catches (tests/test_training.py, an autograd.Function around the C++ kernel:
  polynorm::forward / backward in the PolyCom form, the fused mul_forward / mul_backward in
  the gated form; tiny preset, seed 0, 40 steps, PolyCom / gated; 100 steps in brackets;
  measured on a CPU): grad_weight scaled by (1 + 1e-4) in fp32, 201 / 451 floors
  (295 / 310), on PolyNorm's own parameters, while the loss stays within its bound; the
  fused op's grad_mul scaled by (1 + 1e-4) in fp32, 619 floors (479), on up's weight, the
  loss within its bound; y (the fused op's out) one bf16 ulp off in one column in bf16,
  27 / 134 floors (43 / 73). Each in the other precision is no fault at that resolution:
  1e-4 on grad_weight is 3-4 floors in bf16, one fp32 ulp in a column of y 1.5 floors in
  fp32.
- Free-running. Each backend also trains its own trajectory. Rounding differences compound
  there (AdamW divides by sqrt(v) and amplifies them: on an H200, 200 steps of the 6 x 768
  model at batch 16 moved the float64 twin's fp32 losses by 4e-3 relative and a module's
  parameters by 20%), so only the outcome is compared: the final validation loss. Its
  spread is that of the reference against its float64 twin (the reference-fp64 row
  trained on its own): the RMS over the validation sequences of the twin's per-sequence
  loss change, relative to the reference's validation loss, at least FLOOR_MIN. A
  backend's |val - val_ref| / val_ref must be at most FREE_FACTOR (8) spreads. The RMS over
  the sequences, not the twin's change of the mean: that is a single draw of a chaotic
  process, and the ratio of two such draws is heavy-tailed (for two Gaussian draws it
  exceeds 8 one time in 13), so a bound from it would be flaky; the RMS is never below the
  change of the mean and does not cancel. 8 as in lock-step: a kernel whose steps deviate
  up to 8 floors may perturb its trajectory up to ~8 times as much as the twin. The twin
  and not reference runs over other seeds: a seed changes the initial weights and the data
  order, a spread far wider than rounding's (a loose bound) that takes several more runs
  to estimate; the twin takes one run and measures what a kernel changes, the rounding.
  Measured on a CPU (100 steps): spreads of 1.2e-7 in fp32 (the minimum) and 1.6-6.8e-4
  in bf16; the C++ kernel's validation loss moved 7-9e-9 and 3.7-4.9e-5, at most 0.3
  spreads.
- The loss must fall: the mean of the last 10 steps at most LOSS_DROP (0.7) x step 0, for
  the reference and every free-running backend."""

DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def default_backends(device: torch.device) -> list[str]:
    """Labels to run besides the reference: the kernels of this device, and Liger if present."""
    if device.type == "cuda":
        labels = ["cuda", "triton"]
        ok, why = liger_available()
        if ok:
            labels.append("liger")
        else:
            print(f"liger: skipped ({why})")
        return labels
    return ["cpu"]


def backend_of(label: str) -> str:
    """The PolyNorm behind a row label: a ``polynorm.PolyNorm`` backend or an ``polynorm.lm.model.POLY_NORMS`` name."""
    return {"cpu": "auto"}.get(label, label)


def enforced(label: str) -> bool:
    """Rows whose verdict decides the exit status: polynorm's backends and the reference, not
    Liger's (not ours to fix) nor the float64 reference (it sets the bounds)."""
    return label not in ("liger", FLOOR_LABEL)


# ---------------------------------------------------------------------------------------
# Numerics, timing, memory
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def reproducible_numerics(attention: str = "math"):
    """TF32 off, deterministic algorithms on (warn only), SDPA's math path; restored on exit.

    Deterministic mode's NaN fill of fresh allocations is turned off: it changes no result
    of a correct program, and it would tax every allocation, the reference's many
    intermediates most, skewing the throughput comparison.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fill = torch.utils.deterministic
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        fill.fill_uninitialized_memory,
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    fill.fill_uninitialized_memory = False
    try:
        with sdpa_kernel([SDPBackend.MATH]) if attention == "math" else contextlib.nullcontext():
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
        fill.fill_uninitialized_memory = saved[4]


@contextlib.contextmanager
def count_saved_bytes(params, totals: dict):
    """Adds to ``totals["bytes"]`` the storage autograd keeps for backward (parameters excluded)."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    seen = set()

    def pack(t: Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in seen and key not in param_storages:
            seen.add(key)
            totals["bytes"] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


class PassTimer:
    """Time and peak memory of timed regions, without synchronizing the device inside the loop.

    On CUDA each region records a pair of events, read once at the end (``seconds``); on the
    CPU, wall time. ``peak_bytes`` is the largest allocation a region made above what was
    allocated when it began (CUDA only; the allocator's counters are host-side, no sync).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: list = []
        self.cpu_seconds = 0.0
        self.peak_bytes = 0

    @contextlib.contextmanager
    def region(self, timed: bool = True):
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        if timed and cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        yield
        if timed and cuda:
            end.record()
            self.events.append((start, end))
        elif timed:
            self.cpu_seconds += time.perf_counter() - t0
        if cuda:
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device) - base)

    def seconds(self) -> float:
        if self.events:
            torch.cuda.synchronize(self.device)
        return self.cpu_seconds + sum(start.elapsed_time(end) for start, end in self.events) / 1e3


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------


@dataclass
class Data:
    """The token streams on the device and the batch starts every row uses."""

    train: Tensor
    val: Tensor
    starts: Tensor  # (steps, batch_size)
    val_starts: Tensor  # (val_batches, batch_size)


def _lr_at(step: int, config: TrainConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW, weight decay on the 2-D weights only."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.95), eps=1e-8,
    )


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, config: TrainConfig) -> None:
    """Clip the gradients, set the step's learning rate, step, clear the gradients."""
    for group in opt.param_groups:
        group["lr"] = _lr_at(step, config)
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def autocast_for(device: torch.device, dtype: str):
    """The forward's autocast context for ``dtype`` ("fp32": none)."""
    if DTYPES[dtype] is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


@torch.no_grad()
def sequence_losses(model: TinyLM, data: Data, config: TrainConfig, dtype: str) -> Tensor:
    """Mean next-byte loss of each validation sequence, ``(val_batches * batch_size,)`` float64 on the CPU."""
    model.eval()
    losses = []
    for starts in data.val_starts:
        x, y = get_batch(data.val, starts, config.seq_len)
        with autocast_for(x.device, dtype):
            logits = model(x)
        token = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
        losses.append(token.view(y.shape).mean(dim=1))
    model.train()
    return torch.cat(losses).double().cpu()


def poly_norm_modules(model: TinyLM, label: str) -> list[nn.Module]:
    """Row ``label``'s activation for each block (``polynorm.lm.model.make_activation``: its PolyNorm, or
    in the gated form its fused PolyNorm x mul), sharing the parameters of the block's."""
    modules = []
    for block in model.blocks:
        act = make_activation(model.config.mlp, backend_of(label), model.config.eps)
        act.weight, act.bias = block.mlp.act.weight, block.mlp.act.bias
        modules.append(act)
    return modules


def use_poly_norm(model: TinyLM, modules: list[nn.Module]) -> None:
    """Put ``modules`` (one per block, from ``poly_norm_modules``) into the model's MLPs."""
    for block, act in zip(model.blocks, modules):
        block.mlp.act = act


def by_module(names) -> dict[str, list[int]]:
    """Indices of the parameter ``names`` grouped by the module that owns them
    (``blocks.0.mlp.act`` -> its weight and bias).

    Gradients are compared per module, not per tensor: a bias whose gradient is tiny next to
    its module's weight's (LayerNorm's, PolyNorm's) carries a relative difference that alone
    means little.
    """
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(name.rpartition(".")[0], []).append(i)
    return groups


class _NoBar:
    def set_postfix(self, **kwargs) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, progress: bool):
    """A tqdm bar of ``total`` steps; without tqdm (an optional dependency, ``polynorm[train]``)
    a bar that shows nothing, so that the main job runs on a bare install."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="step", disable=not progress, leave=True, mininterval=0.5,
                dynamic_ncols=True)


def lock_step(
    labels: list[str],
    model_config: ModelConfig,
    init_state: dict,
    config: TrainConfig,
    dtype: str,
    data: Data,
    device: torch.device,
    progress: bool = True,
) -> dict:
    """Trains the reference; at every step every row of ``labels`` computes the loss and the
    gradients on the reference's parameters.

    ``labels[0]`` drives: the optimizer steps on its gradients (clipped), so its trajectory is
    exactly that of a free-running run of it. Each other row gets, per step, its relative loss
    deviation and per module its relative gradient deviation (``by_module``) from the
    driver's, before clipping. A row that raises is dropped and reported with the error; the
    driver raising ends the run.

    Returns ``{"labels", "modules", "losses" (rows, steps), "loss_dev" (rows, steps),
    "grad_dev" (rows, steps, modules), "val" (the driver's per-sequence validation losses),
    "errors" {label: message}, "perf" {label: {tokens_per_s, peak_mib, saved_mib}},
    "ops" {label: what its activation computes (``polynorm.lm.model.activation_op``)}}``, tensors
    float64 on the CPU.
    """
    model = TinyLM(model_config, backend=backend_of(labels[0]))
    model.load_state_dict(init_state)
    model.to(device)
    names, params = zip(*model.named_parameters())
    modules = by_module(names)
    module_of = torch.empty(len(params), dtype=torch.long, device=device)
    for m, indices in enumerate(modules.values()):
        module_of[indices] = m
    errors: dict[str, str] = {}
    acts = {}
    for label in labels:
        try:
            acts[label] = [act.to(device) for act in poly_norm_modules(model, label)]
        except Exception as error:  # an unavailable backend is a failed row, not a crash
            errors[label] = f"{type(error).__name__}: {error}"
    rows = [label for label in labels if label in acts]
    if rows[:1] != labels[:1]:
        raise RuntimeError(f"lock_step: the driving row {labels[0]} failed to build: {errors[labels[0]]}")
    opt = make_optimizer(model, config)
    steps = config.steps
    losses = torch.full((len(rows), steps), math.nan, dtype=torch.float64, device=device)
    grad_dev = torch.full((len(rows), steps, len(modules)), math.nan, dtype=torch.float64, device=device)
    timers = {label: PassTimer(device) for label in rows}
    saved = {label: {"bytes": 0} for label in rows}
    timed_from = config.timing_warmup if steps > config.timing_warmup else 0

    def module_norms(tensors) -> Tensor:
        """Per module: the 2-norm of its tensors as one vector."""
        squares = torch.stack([torch.linalg.vector_norm(t, dtype=torch.float64) for t in tensors]).square()
        return torch.zeros(len(modules), dtype=torch.float64, device=device).index_add_(0, module_of, squares).sqrt()

    bar = progress_bar(steps, f"{model_config.mlp:>7} {dtype} lock-step {len(rows)} rows", progress)
    model.train()
    for step in range(steps):
        x, y = get_batch(data.train, data.starts[step], config.seq_len)
        for i, label in enumerate(rows):
            if label in errors:
                continue
            use_poly_norm(model, acts[label])
            counting = count_saved_bytes(params, saved[label]) if step == 0 else contextlib.nullcontext()
            try:
                with timers[label].region(timed=step >= timed_from):
                    with counting, autocast_for(device, dtype):
                        loss = model(x, y)
                    grads = torch.autograd.grad(loss, params)
            except Exception as error:
                if i == 0:
                    raise
                print(f"{model_config.mlp} {dtype} {label}: FAILED at step {step}: {type(error).__name__}: {error}")
                errors[label] = f"{type(error).__name__}: {error}"
                continue
            losses[i, step] = loss.detach()
            if i == 0:
                ref_grads, ref_norms = grads, module_norms(grads)
            else:
                diff = module_norms([g - r for g, r in zip(grads, ref_grads)])
                # A module whose reference gradient is exactly 0: deviation 0 if equal, else huge.
                grad_dev[i, step] = diff / ref_norms.clamp_min(torch.finfo(torch.float64).tiny)
            del grads
        use_poly_norm(model, acts[rows[0]])
        for p, g in zip(params, ref_grads):
            p.grad = g
        del ref_grads
        optimizer_step(model, opt, step, config)
        if progress and (step % 10 == 0 or step == steps - 1):
            bar.set_postfix(loss=f"{losses[0, step].item():.4f}", refresh=False)
        bar.update(1)
    bar.close()

    losses, grad_dev = losses.cpu(), grad_dev.cpu()
    loss_dev = (losses - losses[:1]).abs() / losses[:1].abs()
    tokens = config.batch_size * config.seq_len * (steps - timed_from)
    perf = {}
    for label in rows:
        seconds = timers[label].seconds()
        perf[label] = {
            "tokens_per_s": tokens / seconds if seconds > 0 and label not in errors else None,
            "peak_mib": timers[label].peak_bytes / 2**20 if device.type == "cuda" else None,
            "saved_mib": saved[label]["bytes"] / 2**20,
        }
    return {
        "labels": rows,
        "modules": list(modules),
        "losses": losses,
        "loss_dev": loss_dev,
        "grad_dev": grad_dev,
        "val": sequence_losses(model, data, config, dtype),
        "errors": errors,
        "perf": perf,
        "ops": {label: activation_op(acts[label][0]) for label in rows},
    }


def train_one(
    label: str,
    model_config: ModelConfig,
    init_state: dict,
    config: TrainConfig,
    dtype: str,
    data: Data,
    device: torch.device,
    progress: bool = True,
) -> dict:
    """Trains one copy of the model with row ``label``'s PolyNorm on its own (free-running).

    Returns its per-step losses and its per-sequence validation losses (float64).
    """
    model = TinyLM(model_config, backend=backend_of(label))
    model.load_state_dict(init_state)
    model.to(device)
    opt = make_optimizer(model, config)
    losses = torch.empty(config.steps, dtype=torch.float64, device=device)

    bar = progress_bar(config.steps, f"{model_config.mlp:>7} {dtype} free {label:>14}", progress)
    model.train()
    for step in range(config.steps):
        x, y = get_batch(data.train, data.starts[step], config.seq_len)
        with autocast_for(device, dtype):
            loss = model(x, y)
        loss.backward()
        optimizer_step(model, opt, step, config)
        losses[step] = loss.detach()
        if progress and (step % 10 == 0 or step == config.steps - 1):
            bar.set_postfix(loss=f"{losses[step].item():.4f}", refresh=False)
        bar.update(1)
    bar.close()
    return {"losses": losses.cpu(), "val": sequence_losses(model, data, config, dtype)}


# ---------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------


def lock_step_floors(floor_dev: Tensor) -> Tensor:
    """The rounding floor of each quantity, from the float64 row's lock-step deviations
    ``floor_dev`` (steps, quantities): ``(2, quantities)``, the largest and the mean deviation
    over the steps, each at least FLOOR_MIN. A row's bounds are SPIKE_FACTOR times the
    largest and FLOOR_FACTOR times the mean.

    Over the steps, not step by step: one step's floor can be ~0 by chance (in bf16 most
    steps' fp32 rounding differences flip no bf16 rounding that reaches a given module).
    FLOOR_MIN (one fp32 ulp) keeps a bound above 0 where the floor is 0 at every step. A
    float64 row that failed (NaN or infinite deviations) gives NaN floors, which no
    deviation meets.
    """
    floors = torch.stack([floor_dev.amax(dim=0), floor_dev.mean(dim=0)]).clamp_min(FLOOR_MIN)
    return floors.masked_fill(~floors.isfinite(), math.nan)


def loss_falls(losses) -> dict:
    """Step 0's loss, the mean of the last 10, and whether that mean is at most LOSS_DROP of step 0's."""
    losses = torch.as_tensor(losses, dtype=torch.float64)
    first, last = losses[0].item(), losses[-10:].mean().item()
    falls = bool(math.isfinite(last) and last <= LOSS_DROP * first)
    return {"loss_first": first, "loss_last10": last, "loss_falls": falls}


def free_running_verdict(val: Tensor, val_ref: Tensor, val_twin: Tensor) -> dict:
    """The free-running outcome of one run against the reference's.

    ``val``, ``val_ref``, ``val_twin``: per-sequence validation losses of the run, the
    reference and its float64 twin, on the same sequences. The spread is the RMS over the
    sequences of the twin's change, relative to the reference's validation loss, at least
    FLOOR_MIN; the run's validation loss may move at most FREE_FACTOR spreads. Without a
    twin (NaN: it failed, or did not run) there is no bound, and the run does not agree.
    """
    mean_ref = val_ref.mean()
    val_dev = ((val.mean() - mean_ref).abs() / mean_ref).item()
    spread = ((val_twin - val_ref).square().mean().sqrt() / mean_ref).item()
    if not math.isfinite(spread):
        return {"val_loss": val.mean().item(), "val_dev": val_dev, "spread": None, "bound": None, "agrees": False}
    spread = max(spread, FLOOR_MIN)
    bound = FREE_FACTOR * spread
    return {"val_loss": val.mean().item(), "val_dev": val_dev, "spread": spread, "bound": bound,
            "agrees": bool(val_dev <= bound)}  # False for a NaN val_dev


def lock_step_verdicts(lock: dict) -> dict[str, dict]:
    """Per row of a ``lock_step`` result but the driver: its deviations, in floors, and its verdict.

    Quantities are the loss and each module's gradient. A row's deviation in floors is, per
    quantity, the larger of (its mean / the floor's mean) and (its largest deviation over
    the steps / the floor's largest) x FLOOR_FACTOR / SPIKE_FACTOR (``lock_step_floors``):
    the mean catches a small fault on every step, the largest a gross fault on some steps,
    with a wider factor because a ratio of maxima is heavy-tailed. The row agrees when that
    is at most FLOOR_FACTOR for every quantity. The floor row is listed too (1 floor on the
    mean, by definition).
    """
    labels = lock["labels"]
    dev = torch.cat([lock["loss_dev"][:, :, None], lock["grad_dev"]], dim=2)  # (rows, steps, 1 + modules)
    names = ["loss", *lock["modules"]]
    if FLOOR_LABEL in labels:
        floors = lock_step_floors(dev[labels.index(FLOOR_LABEL)])
    else:  # no floor row: no bound a correct kernel can be held to
        floors = torch.full((2, dev.shape[2]), math.nan, dtype=dev.dtype)
    verdicts = {}
    for i, label in enumerate(labels[1:], start=1):
        stats = torch.stack([dev[i].amax(dim=0), dev[i].mean(dim=0)])  # (largest, mean) x quantities
        weights = torch.tensor([FLOOR_FACTOR / SPIKE_FACTOR, 1.0], dtype=stats.dtype)[:, None]
        in_floors = (stats / floors * weights).nan_to_num(nan=math.inf).amax(dim=0)
        # The worst module; for the floor row (1 floor everywhere), the one that deviates most.
        q = int((stats[0] if label == FLOOR_LABEL else in_floors)[1:].argmax()) + 1
        verdicts[label] = {
            "loss_dev": dev[i, :, 0].tolist(),
            "loss_dev_max": stats[0, 0].item(),
            "loss_dev_mean": stats[1, 0].item(),
            "loss_bound": SPIKE_FACTOR * floors[0, 0].item(),  # on each step's loss
            "worst_module": names[q],
            "grad_dev_max": stats[0, q].item(),
            "grad_dev_mean": stats[1, q].item(),
            # Per step, the worst module's deviation over its floor's largest.
            "grad_floor_units": (dev[i, :, 1:] / floors[0, 1:]).amax(dim=1).tolist(),
            "floors": in_floors.max().item(),
            "modules": {
                name: {"max": stats[0, k].item(), "mean": stats[1, k].item(), "floor_max": floors[0, k].item(),
                       "floor_mean": floors[1, k].item(), "floors": in_floors[k].item()}
                for k, name in enumerate(names)
            },
            "agrees": bool(in_floors.max() <= FLOOR_FACTOR),
        }
    return verdicts


def run_comparison(
    config: TrainConfig,
    device: torch.device,
    mlps=("polycom", "gated"),
    dtypes=("fp32", "bf16"),
    labels=None,
    free_running: bool = True,
    attention: str = "math",
    progress: bool = True,
) -> dict:
    """Lock-step and (unless ``free_running`` is False) free-running runs of the reference,
    the backends in ``labels`` (default: this device's) and the float64 reference, for each
    MLP form and dtype.

    Returns ``{"runs": [...], "corpus": ..., ...}``: one run per form, dtype and row, with its
    ``lock`` verdict (``lock_step_verdicts``; None for the reference, which drives), its
    ``free`` outcome (losses, ``loss_falls``, ``free_running_verdict``) and its ``perf``.
    """
    labels = list(labels if labels is not None else default_backends(device))
    rows = ["reference", *[label for label in labels if label not in ("reference", FLOOR_LABEL)], FLOOR_LABEL]

    corpus = build_corpus(config.corpus_bytes, seed=config.seed)
    data = Data(
        train=corpus.train.to(device),
        val=corpus.val.to(device),
        starts=batch_starts(corpus.train.numel(), config.seq_len, config.batch_size, config.steps,
                            seed=config.seed + 1),
        val_starts=batch_starts(corpus.val.numel(), config.seq_len, config.batch_size, config.val_batches,
                                seed=config.seed + 2),
    )
    print(f"corpus: {corpus.describe()}")

    runs = []
    with reproducible_numerics(attention), contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, torch.get_num_threads())
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        device_name = _device_name(device)
        print(f"device: {device_name}")
        for mlp in mlps:
            model_config = ModelConfig(
                n_layer=config.n_layer, hidden_size=config.hidden_size, n_head=config.n_head,
                seq_len=config.seq_len, mlp=mlp,
            )
            with torch.random.fork_rng(devices=[]):  # the caller's RNG state is left as it was
                torch.manual_seed(config.seed)
                init_state = {k: v.clone() for k, v in TinyLM(model_config).state_dict().items()}
            n_params = sum(v.numel() for k, v in init_state.items() if k != "head.weight")
            print(f"model: {mlp} MLP, {config.n_layer} x {config.hidden_size}, intermediate "
                  f"{model_config.intermediate_size}, T = {config.seq_len}, {n_params / 1e6:.2f} M parameters")
            for dtype in dtypes:
                runs.extend(_compare_group(rows, model_config, init_state, config, dtype, data, device,
                                           free_running, progress))
    return {
        "runs": runs,
        "corpus": {"root": corpus.root, "sha256": corpus.sha256, "train_bytes": corpus.train.numel(),
                   "val_bytes": corpus.val.numel(), "files_train": corpus.files_train, "files_val": corpus.files_val},
        "config": asdict(config),
        "criteria": {"floor_factor": FLOOR_FACTOR, "floor_min": FLOOR_MIN, "free_factor": FREE_FACTOR,
                     "loss_drop": LOSS_DROP},
        "free_running": free_running,
        "attention": attention,
        "device": device_name,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "polynorm": polynorm.__version__},
    }


def _compare_group(rows, model_config, init_state, config, dtype, data, device, free_running, progress) -> list[dict]:
    """One MLP form and dtype: the lock-step run of all rows, then each row's free-running run."""
    mlp = model_config.mlp
    lock = lock_step(rows, model_config, init_state, config, dtype, data, device, progress)
    verdicts = lock_step_verdicts(lock)
    free = {"reference": {"losses": lock["losses"][0], "val": lock["val"]}}  # the driver ran freely
    free_errors = {}
    if free_running:
        for label in rows[1:]:
            if label in lock["errors"]:
                continue
            try:
                free[label] = train_one(label, model_config, init_state, config, dtype, data, device, progress)
            except Exception as error:  # reported as the row's failure
                print(f"{mlp} {dtype} {label} (free-running): FAILED: {type(error).__name__}: {error}")
                free_errors[label] = f"{type(error).__name__}: {error}"
    twin = free.get(FLOOR_LABEL, {"val": torch.full_like(lock["val"], math.nan)})["val"]
    group = []
    for label in rows:
        run = {"label": label, "backend": backend_of(label), "mlp": mlp, "dtype": dtype,
               "op": lock["ops"].get(label, "-")}
        if label in lock["errors"]:
            run["error"] = lock["errors"][label]
        run["lock"] = verdicts.get(label)
        run["perf"] = lock["perf"].get(label)
        if label in free_errors:
            run["free"] = {"error": free_errors[label]}
        elif label in free:
            f = free[label]
            run["free"] = {"losses": f["losses"].tolist(), **loss_falls(f["losses"]),
                           **free_running_verdict(f["val"], lock["val"], twin)}
            if label == "reference":  # the baseline: nothing to agree with
                run["free"].update(bound=None, agrees=True)
        group.append(run)
    return group


def run_ok(run: dict) -> bool:
    """A row passes when it ran, agrees in lock-step, and (where it ran freely) agrees in the
    free-running outcome with a falling loss. The reference: its loss falls."""
    if "error" in run:
        return False
    free = run.get("free")
    free_ok = free is None or ("error" not in free and free["agrees"] and free["loss_falls"])
    return (run["lock"] is None or run["lock"]["agrees"]) and free_ok


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{'s' if threads > 1 else ''})"


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------


def _fmt(v, spec=".1e") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v == 0.0:
        return "0"
    return format(v, spec)


def lock_step_table(report: dict) -> str:
    rows = [
        "| MLP | dtype | backend | activation | rel dloss: largest / mean | worst module: rel dgrad, largest / mean "
        f"| in floors (bound {FLOOR_FACTOR:g}) | verdict |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for run in report["runs"]:
        head = f"| {run['mlp']} | {run['dtype']} | {run['label']} | {run.get('op', '-')} "
        lock = run["lock"]
        if lock is None:
            verdict = f"FAILED: {run['error'][:80]}" if "error" in run else "drives (the baseline)"
            rows.append(head + f"| - | - | - | {verdict} |")
            continue
        if "error" in run:
            verdict = f"FAILED: {run['error'][:80]}"
        elif run["label"] == FLOOR_LABEL:
            verdict = "rounding floor (sets the bounds)"
        else:
            verdict = "ok" if lock["agrees"] else "DISAGREES"
            if run["label"] == "liger" and not lock["agrees"]:
                verdict += " (third party, not enforced)"
        rows.append(
            head + f"| {_fmt(lock['loss_dev_max'])} / {_fmt(lock['loss_dev_mean'])} "
            f"| {lock['worst_module']}: {_fmt(lock['grad_dev_max'])} / {_fmt(lock['grad_dev_mean'])} "
            f"| {lock['floors']:.2f} | {verdict} |"
        )
    return "\n".join(rows)


def free_running_table(report: dict) -> str:
    rows = [
        "| MLP | dtype | backend | loss step 0 | loss last 10 | val loss | rel dval (bound) | verdict |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for run in report["runs"]:
        free = run.get("free")
        if free is None:
            continue
        head = f"| {run['mlp']} | {run['dtype']} | {run['label']} "
        if "error" in free:
            rows.append(head + f"| - | - | - | - | FAILED: {free['error'][:80]} |")
            continue
        if not free["loss_falls"]:
            verdict = f"loss does NOT fall below {LOSS_DROP} x step 0"
        elif run["label"] == "reference":
            verdict = "baseline"
        elif run["label"] == FLOOR_LABEL:
            verdict = f"float64 twin (spread {_fmt(free['spread'])})"
        else:
            verdict = "ok" if free["agrees"] else "DISAGREES"
        if run["label"] == "liger" and not (free["agrees"] and free["loss_falls"]):
            verdict += " (third party, not enforced)"
        bound = "" if run["label"] in ("reference", FLOOR_LABEL) else f" (<= {_fmt(free['bound'])})"
        rows.append(
            head + f"| {free['loss_first']:.4f} | {free['loss_last10']:.4f} | {free['val_loss']:.4f} "
            f"| {_fmt(free['val_dev'])}{bound} | {verdict} |"
        )
    return "\n".join(rows)


def performance_table(report: dict) -> str:
    rows = [
        "| MLP | dtype | backend | activation | tokens/s (forward + backward) | vs reference "
        "| peak memory of a step (MiB) | saved for backward (MiB) |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    refs = {(r["mlp"], r["dtype"]): r["perf"] for r in report["runs"] if r["label"] == "reference"}
    for run in report["runs"]:
        perf = run["perf"]
        if perf is None or perf["tokens_per_s"] is None:
            continue
        ref = refs.get((run["mlp"], run["dtype"]))
        speedup = f"{perf['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ref and ref["tokens_per_s"] else "-"
        peak = "-" if perf["peak_mib"] is None else f"{perf['peak_mib']:.0f}"
        rows.append(
            f"| {run['mlp']} | {run['dtype']} | {run['label']} | {run.get('op', '-')} "
            f"| {perf['tokens_per_s']:,.0f} | {speedup} | {peak} | {perf['saved_mib']:.1f} |"
        )
    return "\n".join(rows)


def criteria_line() -> str:
    return (
        f"lock-step bound: {FLOOR_FACTOR:g} floors per quantity (the loss; each module's gradient) for the mean "
        f"deviation over the steps, {SPIKE_FACTOR:g} for the largest, "
        f"largest deviation over the steps and for the mean, a floor being the {FLOOR_LABEL} row's largest "
        f"or mean deviation (at least {FLOOR_MIN:.1e}); free-running bound: "
        f"{FREE_FACTOR:g} x the RMS per-sequence validation-loss change of {FLOOR_LABEL}; "
        f"the loss must fall to {LOSS_DROP} x step 0 (mean of the last 10 steps)"
    )


def plot(report: dict, path: Path) -> None:
    """One column per form x dtype. Top: each row's per-step lock-step loss deviation, with the
    float64 row (the floor) and the bound on a step's loss. Middle: per step, the worst module's
    gradient deviation over that module's largest floor, with the bound (SPIKE_FACTOR); the
    legend gives each row's deviation in floors (the verdict's number, mean included).
    Bottom: free-running loss curves, with each run's final validation loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["mlp"], r["dtype"]) for r in report["runs"]))
    fig, axes = plt.subplots(3, len(groups), figsize=(4.8 * len(groups), 10.5), squeeze=False, sharex="col")
    styles = {"reference": ("k", "-", 2.0), FLOOR_LABEL: ("0.45", "--", 1.6)}
    palette = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
    colors = {}
    zero = 1e-10  # where a deviation of exactly 0 is drawn
    for col, (mlp, dtype) in enumerate(groups):
        loss_ax, grad_ax, free_ax = (axes[r][col] for r in range(3))
        runs = [r for r in report["runs"] if r["mlp"] == mlp and r["dtype"] == dtype]
        for run in runs:
            label = run["label"]
            if label not in styles and label not in colors:
                colors[label] = next(palette)
            color, ls, lw = styles.get(label, (colors.get(label), "-", 1.2))
            lock = run["lock"]
            if lock is not None:
                steps = range(len(lock["loss_dev"]))
                shown = f"{label} (floor)" if label == FLOOR_LABEL else label
                loss_ax.plot(steps, [max(v, zero) for v in lock["loss_dev"]], color=color, ls=ls, lw=lw, label=shown)
                grad_ax.plot(steps, [max(v, zero) for v in lock["grad_floor_units"]], color=color, ls=ls, lw=lw,
                             label=f"{shown}: {lock['floors']:.2f} floors")
            free = run.get("free")
            if free is not None and "losses" in free:
                free_ax.plot(range(len(free["losses"])), free["losses"], color=color, ls=ls, lw=lw,
                             label=f"{label} (val {free['val_loss']:.4f})")
        floor = next((r["lock"] for r in runs if r["label"] == FLOOR_LABEL and r["lock"]), None)
        if floor is not None:
            loss_ax.axhline(floor["loss_bound"], color="r", ls=":", lw=1.2, label="bound")
        grad_ax.axhline(SPIKE_FACTOR, color="r", ls=":", lw=1.2, label=f"bound on any step ({SPIKE_FACTOR:g} floors)")
        loss_ax.set_title(f"{mlp} MLP, {dtype}")
        loss_ax.set_ylabel(f"lock-step |loss - reference| / reference\n(0 drawn at {zero:.0e})")
        grad_ax.set_ylabel("lock-step gradient deviation, worst module,\nover its floor's largest")
        free_ax.set_ylabel("free-running training loss (nats / byte)")
        free_ax.set_xlabel("step")
        for ax in (loss_ax, grad_ax):
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
        free_ax.grid(alpha=0.3)
        for ax in (loss_ax, grad_ax, free_ax):
            ax.legend(fontsize=7)
    fig.suptitle(f"PolyNorm backends on a byte-level LM of the Python stdlib ({report['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"plot": out / "loss_curves.png", "markdown": out / "summary.md", "json": out / "summary.json"}
    try:
        plot(report, paths["plot"])
    except ImportError:  # matplotlib is optional (polynorm[train]); the tables carry every verdict
        paths["plot"] = None
    c = report["config"]
    md = [
        "# PolyNorm training comparison",
        "",
        f"Device: {report['device']}; torch {report['versions']['torch']}, Python {report['versions']['python']}, "
        f"polynorm {report['versions']['polynorm']}.",
        f"Model: {c['n_layer']} layers x {c['hidden_size']} ({c['n_head']} heads), T = {c['seq_len']}, "
        f"batch {c['batch_size']}, {c['steps']} steps of AdamW (lr {c['lr']}, warmup {c['warmup_steps']}, cosine).",
        f"Corpus: {report['corpus']['train_bytes']:,} train / {report['corpus']['val_bytes']:,} val bytes of "
        f"{report['corpus']['root']} (sha256 {report['corpus']['sha256'][:16]}).",
        f"Numerics: TF32 off, deterministic algorithms on (warn only), attention via SDPA "
        f"{'math path' if report['attention'] == 'math' else 'default kernels'}.",
        "",
        "## Lock-step: every row's loss and gradients on the reference's parameters, every step",
        "",
        lock_step_table(report),
        "",
        "## Free-running: every row trains its own trajectory; final validation loss",
        "",
        *([] if report["free_running"] else [
            "Skipped (--no-free-running) but for the reference, whose lock-step run is its own.", ""]),
        free_running_table(report),
        "",
        f"Criteria: {criteria_line()}.",
        "",
        README_TOLERANCES,
        "",
        "## Throughput and memory (lock-step passes: same parameters, same batch)",
        "",
        performance_table(report),
        "",
        f"tokens/s is one step's forward and backward (no optimizer), leaving out the first "
        f"{c['timing_warmup']} steps. Peak memory is the most a step's forward and backward allocated above "
        "what was allocated before it (`torch.cuda.max_memory_allocated`, GPU only); 'saved for backward' "
        "is the storage autograd holds after step 0's forward (parameters excluded).",
        "",
        f"![loss curves]({paths['plot'].name})" if paths["plot"] else "(no plot: matplotlib is not installed)",
        "",
    ]
    paths["markdown"].write_text("\n".join(md))
    paths["json"].write_text(json.dumps(report, indent=1))
    return paths


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a small PolyNorm language model on the Python stdlib and check every PolyNorm backend "
        "against the reference: in lock-step (each step's loss and gradients on the reference's parameters, "
        "bounded by the float64 reference's deviation) and free-running (each backend's own run, final "
        "validation loss). Exit status 1 on a disagreement, or when the loss does not fall.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cuda = torch.cuda.is_available()
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu" if cuda else "cpu",
                        help="model/data size: 'gpu' (6 x 768, T 512) or 'cpu' (2 x 64, T 64)")
    parser.add_argument("--device", default="cuda" if cuda else "cpu", help="torch device of the runs")
    parser.add_argument("--mlp", nargs="+", choices=["polycom", "gated"], default=["polycom", "gated"],
                        help="MLP forms: PolyCom down(PolyNorm(up(x))), gated down(PolyNorm(gate(x)) * up(x))")
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                        help="fp32, and/or bf16 autocast with fp32 parameters")
    parser.add_argument("--backends", nargs="+", default=None, choices=["cpu", "cuda", "triton", "liger"],
                        help="rows besides the reference and the float64 reference: cuda, triton, cpu, liger "
                        "(default: this device's kernels, and liger where it imports)")
    parser.add_argument("--no-free-running", action="store_true",
                        help="lock-step only: skip every row's own training run (about half the time)")
    parser.add_argument("--attention", choices=["math", "auto"], default="math",
                        help="SDPA path: 'math' is deterministic; 'auto' lets torch pick fused kernels "
                        "(faster, but their backward is not run-to-run deterministic)")
    for name, kind in (("steps", int), ("batch_size", int), ("seq_len", int), ("n_layer", int),
                       ("hidden_size", int), ("n_head", int), ("lr", float), ("seed", int), ("threads", int)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help="override the preset")
    parser.add_argument("--corpus-mib", type=float, default=None, help="override the preset's corpus size")
    parser.add_argument("--out", type=Path, default=Path("out/train"), help="output folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    config = PRESETS[args.preset]
    names = ("steps", "batch_size", "seq_len", "n_layer", "hidden_size", "n_head", "lr", "seed", "threads")
    overrides = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    if args.corpus_mib is not None:
        overrides["corpus_bytes"] = int(args.corpus_mib * 2**20)
    config = replace(config, **overrides)
    return replace(config, warmup_steps=min(config.warmup_steps, max(1, int(0.3 * config.steps))))


def main(argv=None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    config = config_from_args(args)
    device = torch.device(args.device)
    started = time.perf_counter()
    print(f"polynorm {polynorm.__version__}: training comparison, preset '{args.preset}' on {device}"
          f" (torch {torch.__version__})")
    if device.type == "cpu" and args.backends is None:
        print("triton: skipped on the CPU (its kernels run on CPU tensors only in the interpreter, under "
              "TRITON_INTERPRET=1); liger: skipped on the CPU (Triton kernels)")
    report = run_comparison(
        config, device, mlps=args.mlp, dtypes=args.dtype, labels=args.backends,
        free_running=not args.no_free_running, attention=args.attention, progress=not args.no_progress,
    )
    paths = write_report(report, args.out)
    failed = [r for r in report["runs"] if not run_ok(r) and enforced(r["label"])]
    print()
    print(performance_table(report))
    print()
    print("lock-step:")
    print(lock_step_table(report))
    print()
    print("free-running:" if report["free_running"] else "free-running: the reference only (--no-free-running)")
    print(free_running_table(report))
    print()
    print(criteria_line())
    print(f"plot: {paths['plot'] or 'skipped (matplotlib is not installed; pip install polynorm[train])'}")
    print(f"summary: {paths['markdown']} and {paths['json'].name}")
    elapsed = time.perf_counter() - started
    if failed:
        names = ", ".join(f"{r['mlp']}/{r['dtype']}/{r['label']}" for r in failed)
        print(f"FAILED ({elapsed:.0f} s): {names}")
        return 1
    third_party = sorted({r["label"] for r in report["runs"] if not run_ok(r) and r["label"] == "liger"})
    note = f"; {', '.join(third_party)} does not (reported, not enforced)" if third_party else ""
    print(f"OK ({elapsed:.0f} s): every polynorm backend agrees with the reference and the loss falls{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
