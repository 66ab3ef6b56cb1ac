"""Real input: a small PolyNorm language model trained once per backend on the Python stdlib.

``examples/train_lm.py`` trains the same byte-level transformer (PolyNorm MLPs in the PolyCom
and the gated form; Zhuo et al., "Polynomial Composition Activations", arXiv:2411.03884) from
the same weights on the same batches, once per backend. Here:

- CPU (CI): the tiny preset for 40 steps, the C++ kernel (``cpu``) against the reference, in
  fp32 and bf16 autocast: per-step losses and final weights within the bounds
  (``train_lm.TOLERANCES``, raised by the run's rounding floor within ``FLOOR_CAP``), a
  rerun of the reference bit-identical, and the loss falling.
- GPU: ``cuda``, ``triton`` and the reference over a short run of a mid-size model, fp32
  and bf16 (skipped with a reason without CUDA).
"""

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from _matrix import requires_cuda

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
import lm_data  # noqa: E402
import train_lm  # noqa: E402

FORMS = ["polycom", "gated"]
PRECISIONS = ["fp32", "bf16"]


def _runs(report, mlp, dtype):
    return {r["label"]: r for r in report["runs"] if r["mlp"] == mlp and r["dtype"] == dtype}


def _check_agreement(run, ref, dtype):
    """The assertions behind the verdict, spelled out so a failure says which bound broke."""
    assert "error" not in run, run.get("error")
    a = run["agreement"]
    stated = train_lm.TOLERANCES[dtype]
    tol = train_lm.Tolerance(**a["bounds"])
    for name in ("loss_head", "loss_tail", "params"):  # the floor raises a bound at most FLOOR_CAP-fold
        assert getattr(stated, name) <= getattr(tol, name) <= train_lm.FLOOR_CAP * getattr(stated, name), name
    assert len(run["losses"]) == len(ref["losses"])
    assert all(math.isfinite(v) for v in run["losses"]), f"{run['label']}: non-finite loss"
    assert a["loss_head_rel"] <= tol.loss_head, (
        f"{run['label']} {dtype}: per-step loss differs from the reference by {a['loss_head_rel']:.2e} relative "
        f"(bound {tol.loss_head:.0e})"
    )
    assert a["loss_tail_rel"] is None or a["loss_tail_rel"] <= tol.loss_tail
    assert a["params_rel"] <= tol.params, (
        f"{run['label']} {dtype}: final {a['params_worst']} differs by {a['params_rel']:.2e} relative "
        f"(bound {tol.params:.0e})"
    )
    assert a["loss_falls"], f"{run['label']} {dtype}: loss {a['loss_first']:.3f} -> {a['loss_last10']:.3f}"
    assert train_lm.run_ok(run)


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


def test_agreement_flags_a_perturbed_run():
    """The verdict can fail: a 1e-4 relative change in one step's loss breaks the fp32 bound."""
    losses = [5.0 - 0.02 * i for i in range(120)]
    params = {"w": torch.ones(4, 4)}
    ref = {"losses": losses, "val_loss": 3.0, "params": params}
    same = train_lm.agreement(dict(ref), ref, train_lm.TOLERANCES["fp32"])
    assert same["ok"] and same["loss_head_rel"] == 0 and same["params_rel"] == 0
    bumped = dict(ref, losses=losses[:50] + [losses[50] * (1 + 1e-4)] + losses[51:])
    assert not train_lm.agreement(bumped, ref, train_lm.TOLERANCES["fp32"])["agrees"]
    moved = dict(ref, params={"w": torch.ones(4, 4) * (1 + 1e-2)})
    assert not train_lm.agreement(moved, ref, train_lm.TOLERANCES["fp32"])["agrees"]
    flat = dict(ref, losses=[5.0] * 120)
    assert not train_lm.agreement(flat, flat, train_lm.TOLERANCES["fp32"])["loss_falls"]


def test_bounds_follow_the_rounding_floor_within_the_cap():
    stated = train_lm.TOLERANCES["fp32"]
    quiet = {"loss_head_rel": 1e-7, "loss_tail_rel": None, "params_rel": 1e-5}
    assert train_lm.bounds(stated, quiet) == stated  # a small floor leaves the stated bounds
    assert train_lm.bounds(stated, None) == stated
    floor = {"loss_head_rel": 1.5e-5, "loss_tail_rel": 2e-4, "params_rel": 1e-3}
    raised = train_lm.bounds(stated, floor)
    assert raised.loss_head == 3e-5 and raised.loss_tail == 4e-4 and raised.params == 2e-3
    broken = {"loss_head_rel": 1.0, "loss_tail_rel": 1.0, "params_rel": 1.0}  # a floor run gone wrong
    capped = train_lm.bounds(stated, broken)
    assert capped.loss_head == train_lm.FLOOR_CAP * stated.loss_head
    assert capped.params == train_lm.FLOOR_CAP * stated.params
    # Under raised bounds a run 1.5x the floor's drift agrees; 3x does not.
    losses = [5.0 - 0.02 * i for i in range(120)]
    ref = {"losses": losses, "val_loss": 3.0, "params": {"w": torch.ones(4)}}
    for factor, agrees in ((1.5, True), (3.0, False)):
        bumped = dict(ref, losses=losses[:50] + [losses[50] * (1 + factor * 1.5e-5)] + losses[51:])
        assert train_lm.agreement(bumped, ref, raised)["agrees"] is agrees, factor


# ---------------------------------------------------------------------------------------
# CPU: the C++ kernel against the reference, tiny preset, 40 steps
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_report():
    config = replace(train_lm.PRESETS["cpu"], steps=40, warmup_steps=12)
    return train_lm.run_comparison(
        config, torch.device("cpu"), mlps=FORMS, dtypes=PRECISIONS, labels=["cpu"], repeat_reference=True,
        progress=False,
    )


@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("mlp", FORMS)
def test_cpu_kernel_trains_like_the_reference(cpu_report, mlp, dtype):
    runs = _runs(cpu_report, mlp, dtype)
    assert set(runs) == {"reference", "cpu", "reference-2", "reference-fp64"}
    ref = runs["reference"]
    # The loss falls well below its start (ln 256 = 5.55 nats for uniform bytes).
    assert ref["losses"][0] > 5.0 and sum(ref["losses"][-10:]) / 10 <= train_lm.LOSS_DROP * ref["losses"][0]
    # Everything but the PolyNorm kernel is deterministic: the rerun is bit-identical.
    assert runs["reference-2"]["losses"] == ref["losses"]
    assert runs["reference-2"]["agreement"]["params_rel"] == 0
    # The row really ran the C++ kernel: it keeps x and rstd for backward where the
    # reference keeps its intermediates, and in bf16 its losses are not all identical...
    assert runs["cpu"]["saved_mib"] < 0.8 * ref["saved_mib"]
    if dtype == "bf16":
        assert runs["cpu"]["losses"] != ref["losses"]
    # ...that agrees with the reference within the stated tolerances.
    _check_agreement(runs["cpu"], ref, dtype)


def test_report_files(cpu_report, tmp_path):
    paths = train_lm.write_report(cpu_report, tmp_path)
    assert paths["plot"].stat().st_size > 10_000
    text = paths["markdown"].read_text()
    assert "| gated | bf16 | cpu |" in text and "DISAGREES" not in text
    assert "tokens/s" in text


@pytest.mark.parametrize("steps, status", [(40, 0), (6, 1)])
def test_main_job_exit_status(tmp_path, steps, status):
    """``python3 -m polynorm`` (the README's main job) passes on 40 steps; 6 are too few for the loss to fall."""
    out = tmp_path / "train"
    cmd = [sys.executable, "-m", "polynorm", "--preset", "cpu", "--device", "cpu", "--mlp", "gated", "--dtype", "fp32",
           "--steps", str(steps), "--no-progress", "--no-repeat", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"plot: {out / 'loss_curves.png'}" in proc.stdout
    assert (out / "loss_curves.png").is_file() and (out / "summary.json").is_file()
    assert "| gated | fp32 | cpu |" in proc.stdout


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
        config, torch.device("cuda"), mlps=FORMS, dtypes=PRECISIONS, labels=["cuda", "triton"],
        repeat_reference=True, progress=False,
    )


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", PRECISIONS)
@pytest.mark.parametrize("mlp", FORMS)
def test_gpu_backends_train_like_the_reference(gpu_report, mlp, dtype):
    runs = _runs(gpu_report, mlp, dtype)
    assert set(runs) == {"reference", "cuda", "triton", "reference-2", "reference-fp64"}
    for label in ("cuda", "triton", "reference-2"):
        _check_agreement(runs[label], runs["reference"], dtype)
    assert runs["cuda"]["peak_mem_mib"] > 0 and runs["cuda"]["tokens_per_s"] > 0
