"""The guard's logic without a GPU: bench/ops_timing.py's rows and log format, and
bench/compare_builds.py's parsing, per-cell minimum and threshold, on small synthetic logs."""

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("compare_builds", ROOT / "bench" / "compare_builds.py")
compare_builds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_builds)
ops_timing = compare_builds.ops_timing
nan = math.nan


def log_text(rows: dict[tuple, tuple[float, float, float, float]], commit: str = "abc1234",
             floors: tuple[float, float] = (0.1, 0.15)) -> str:
    """A log as ops_timing.py writes it: rows maps (op, dtype, M, H, layout) to the op times in ms
    (fwd cuda, fwd triton, bwd cuda, bwd triton) over floors of 0.1 ms (forward) and 0.15 ms."""
    lines = ["# gpu: NVIDIA H100 80GB HBM3", "# torch: 2.11.0", "# triton: 3.6.0", f"# commit: {commit}",
             "# date: 2026-01-01", "# command: python3 bench/ops_timing.py", "# polynorm: /x/polynorm",
             "# skipped forward_triton/backward_triton: no kernel", ops_timing.header()]  # fmt: skip
    for (op, dtype, M, H, layout), (fc, ft, bc, bt) in rows.items():
        shape = ops_timing.Shape(M, H, layout)
        lines.append(ops_timing.format_row(op, dtype, shape, floors, (fc, ft), (bc, bt)))
    return "\n".join(lines) + "\n"


A = ("poly_norm", "bfloat16", 16384, 4096, "aligned")
B = ("poly_norm_mul", "float16", 13094, 5125, "odd")
C = ("poly_norm", "float32", 16384, 4096, "view")
OLD = {A: (0.105, 0.11, 0.16, 0.17), B: (0.104, nan, 0.16, nan), C: (0.12, 0.13, 0.18, 0.19)}


def test_rows_cover_every_layout_once():
    shapes = ops_timing.shapes()
    keys = [(s.M, s.H, s.layout) for s in shapes]
    assert len(set(keys)) == len(keys)
    assert {s.layout for s in shapes} == {"aligned", "odd", "view"}
    for s in shapes:
        if s.M != ops_timing.SEED_M:
            assert s.M == ops_timing.ELEMENTS // s.H
        if s.layout == "odd":  # odd in every dtype: no row starts on a 16-byte boundary but the first
            assert all(s.H * size % 16 for size in (2, 4)), s
    assert max(s.H for s in shapes) == 262144 and min(s.H for s in shapes) == 512
    assert set(ops_timing.shapes(quick=True)) <= set(shapes)
    assert {s.layout for s in ops_timing.shapes(quick=True)} == {"aligned", "odd", "view"}


def test_log_round_trip():
    meta, rows = compare_builds.parse_log(log_text(OLD))
    assert meta["commit"] == "abc1234" and meta["gpu"].startswith("NVIDIA") and "skipped" not in meta
    assert list(rows) == [A, B, C]
    assert rows[A]["fwd_floor_us"] == 100.0 and rows[A]["bwd_floor_us"] == 150.0
    assert rows[A]["fwd_cuda"] == 1.05 and rows[A]["bwd_triton"] == pytest.approx(1.133)
    assert math.isnan(rows[B]["fwd_triton"])
    # The merged log is in the same format, so it parses to the same rows.
    again = compare_builds.parse_log(compare_builds.format_log(meta, rows, "merged"))[1]
    assert again.keys() == rows.keys()
    for key in rows:
        for c, v in rows[key].items():
            assert (math.isnan(v) and math.isnan(again[key][c])) or v == again[key][c], (key, c)


def test_parse_rejects_other_columns():
    text = log_text(OLD).replace("fwd_floor_us", "copy_us")
    with pytest.raises(ValueError, match="header"):
        compare_builds.parse_log(text)


def test_merge_keeps_each_cells_minimum():
    _, one = compare_builds.parse_log(log_text({A: (0.105, nan, 0.16, 0.2)}))
    _, two = compare_builds.parse_log(log_text({A: (0.11, 0.12, 0.155, 0.19)}))
    merged = compare_builds.merge([one, two])[A]
    assert merged["fwd_cuda"] == 1.05 and merged["fwd_triton"] == 1.2
    assert merged["bwd_cuda"] == pytest.approx(1.033) and merged["bwd_triton"] == pytest.approx(1.267)


def parsed(rows):
    return compare_builds.parse_log(log_text(rows))[1]


def test_equal_builds_pass():
    text, status = compare_builds.report(parsed(OLD), parsed(OLD), 1.02)
    assert status == 0 and "PASS" in text


def test_a_slower_cuda_cell_fails():
    new = dict(OLD)
    new[B] = (0.104, nan, 0.16 * 1.05, nan)  # the fused backward 5% slower
    text, status = compare_builds.report(parsed(OLD), parsed(new), 1.02)
    assert status == 1 and "FAIL: 1 " in text
    assert "poly_norm_mul float16 13094 5125 odd bwd_cuda: 1.050" in text
    _, status = compare_builds.report(parsed(OLD), parsed(new), 1.06)
    assert status == 0  # within a looser limit


def test_builds_compare_by_time_not_by_the_floor(tmp_path):
    # The same op times over a floor 10% faster in the new build's run: its ratios read 1.1, its
    # times are the old ones, and the guard passes; the same ratios over the old floor fail.
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text(log_text(OLD))
    new.write_text(log_text(OLD, floors=(0.09, 0.135)))
    args = ["--old-log", str(old), "--new-log", str(new), "--out", str(tmp_path / "cmp")]
    assert compare_builds.main(args) == 0
    new.write_text(log_text({k: tuple(v * 1.1 for v in cells) for k, cells in OLD.items()}, floors=(0.1, 0.15)))
    assert compare_builds.main(args) == 1
    assert "1.100" in (tmp_path / "cmp" / "comparison.txt").read_text()


def test_triton_is_shown_not_gated():
    new = dict(OLD)
    new[A] = (0.105, 0.11 * 1.3, 0.16, 0.17)
    text, status = compare_builds.report(parsed(OLD), parsed(new), 1.02)
    assert status == 0 and "fwd_triton  1.300" in text


def test_a_lost_cuda_op_or_row_fails():
    new = dict(OLD)
    new[C] = (nan, 0.13, 0.18, 0.19)
    text, status = compare_builds.report(parsed(OLD), parsed(new), 1.02)
    assert status == 1 and "the new one does not" in text
    del new[C]
    text, status = compare_builds.report(parsed(OLD), parsed(new), 1.02)
    assert status == 1 and "absent from the new build's log" in text


def test_command_line_exit_status(tmp_path):
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text(log_text(OLD))
    slower = dict(OLD)
    slower[A] = (0.105 * 1.03, 0.11, 0.16, 0.17)
    for rows, expected in ((OLD, 0), (slower, 1)):
        new.write_text(log_text(rows))
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "compare_builds.py"), "--old-log", str(old),
                               "--new-log", str(new), "--out", str(tmp_path / "cmp")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == expected, done.stdout + done.stderr
        assert (tmp_path / "cmp" / "comparison.txt").read_text() == done.stdout


@pytest.mark.parametrize("triton", [False, True])
def test_ops_timing_calls_the_public_ops(monkeypatch, triton):
    # Every row's calls, on tiny CPU tensors (the C++ kernels; Triton's under its interpreter), with a
    # stand-in timer: the rows parse, and each op that ran has a number. Both layouts of odd H.
    pytest.importorskip("polynorm._C")
    if triton and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton ops take CPU tensors only under TRITON_INTERPRET=1 (tests/conftest.py sets it "
                    "where there is no CUDA device)")
    monkeypatch.setattr(ops_timing, "DEVICE", "cpu")
    weight, bias = ops_timing.torch.tensor([0.3, -0.4, 0.9]), ops_timing.torch.tensor([0.1])
    calls = []

    def timer(fn, floor=False):
        fn()
        calls.append(floor)
        return 0.002 if floor else 0.003

    lines = [ops_timing.header()]
    for shape in (ops_timing.Shape(3, 40, "aligned"), ops_timing.Shape(3, 33, "odd"), ops_timing.Shape(3, 33, "view")):
        lines += ops_timing.time_shape(timer, shape, "bfloat16", ops_timing.OPS, triton, weight, bias)
    rows = compare_builds.parse_log("\n".join(lines))[1]
    assert len(rows) == 6 and len(calls) == 3 * ops_timing.timings_per_shape(ops_timing.OPS, triton)
    for key, cells in rows.items():
        assert cells["fwd_cuda"] == 1.5 and cells["bwd_cuda"] == (1.5 if key[0] == "poly_norm" else 0.75), key
        assert math.isnan(cells["fwd_triton"]) != triton, key
