"""The README's GPU speed tables are what their committed result files give (bench/readme_tables.py,
issues 13-15), and the script's parsers read each benchmark's output format: inline samples
written as bench/ops_timing.py, bench/bench.py and bench/grouped_timing.py print them."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_tables)

# bench/ops_timing.py (--op poly_norm): M*H = 2^26 rows (2048 x 32768 among them), then the
# seed rows (M = 2048, 2048 x 32768 again); a stray warning line; one Triton cell nan.
OPS_TIMING = """\
# NVIDIA H200, torch 2.11.0+cu130, bfloat16
      M      H    copy  fwd/x trfwd/x     add  bwd/x trbwd/x
 131072    512    68.5   1.08    1.28    98.7   1.10    1.59
UserWarning: something the logger printed
   2048  32768    68.2   1.22    1.20    98.0   1.59    1.68
  22369   3000    70.7   1.25     nan    97.9   1.20    2.29
   2048   1024     6.5   1.37    3.57     8.6   1.51    4.88
   2048  32768    68.5   1.21    1.19    97.4   1.60    1.69
"""
# The same script before the Triton columns existed (bench/results/h200-2026-11-29/ops_timing_v1.log).
OPS_TIMING_V1 = """\
      M      H     copy      fwd  fwd/x      add      bwd  bwd/x
 131072    512     67.8     80.4   1.19     98.8    169.7   1.72
  65536   1024     68.1     81.0   1.19     98.2    179.3   1.83
"""
# bench/ops_timing.py --op poly_norm_mul, without the Triton ops registered (nan).
OPS_TIMING_MUL = """\
      M      H     add mfwd/x trmfwd/x add+copy mbwd/x trmbwd/x
 131072    512    99.0   1.09      nan    168.2   1.04      nan
   4095  16385    98.7   2.15      nan    170.2   5.35      nan
"""
# bench/bench.py's summary.md: two sweeps (16384 x 4096 in both), a missing cell, the memory table.
BENCH_SUMMARY = """\
# polynorm benchmark

- floors, same run, same bytes: forward = copy; backward = add; full = their sum

## sweep `seed` (M=2048, bfloat16, x = H)

| M | H | mode | floor ms | floor GB/s | polynorm_cuda × (ms) | liger × (ms) | polynorm_cuda_graph × (ms) | polynorm_cuda GB/s |
|---|---|---|---|---|---|---|---|---|
| 2048 | 1024 | forward | 0.0070 | 1192 | 1.25 (0.0088) | 7.52 (0.0529) | 1.29 (0.0091) | 957 |
| 2048 | 1024 | backward | 0.0079 | 1586 | 9.44 (0.0749) | 15.34 (0.1217) | — | 168 |
| 2048 | 1024 | full | 0.0150 | 1400 | 10.88 (0.1629) | 18.44 (0.2762) | 1.16 (0.0173) | 129 |

## sweep `bytes` (M*H=67108864, bfloat16, x = H)

| M | H | mode | floor ms | floor GB/s | polynorm_cuda × (ms) | liger × (ms) | polynorm_cuda_graph × (ms) | polynorm_cuda GB/s |
|---|---|---|---|---|---|---|---|---|
| 16384 | 4096 | forward | 0.0684 | 3922 | 1.15 (0.0784) | 1.38 (0.0946) | 1.16 (0.0791) | 3423 |
| 16384 | 4096 | full | 0.1668 | 4023 | 1.13 (0.1890) | 3.67 (0.6123) | 1.13 (0.1883) | 3550 |

## sweep `tokens` (H=4096, bfloat16, x = M)

| M | H | mode | floor ms | floor GB/s | polynorm_cuda × (ms) | liger × (ms) | polynorm_cuda_graph × (ms) | polynorm_cuda GB/s |
|---|---|---|---|---|---|---|---|---|
| 16384 | 4096 | full | 0.1665 | 4031 | 1.14 (0.1892) | 2.46 (0.4102) | 1.13 (0.1882) | 3547 |

## Peak extra memory of one full pass (forward + backward), MiB

| sweep | M | H | one tensor | polynorm_cuda | liger |
|---|---|---|---|---|---|
| seed | 2048 | 1024 | 4 | 8 | 8 |
"""
# bench/grouped_timing.py's log, loop_triton skipped.
GROUPED_TIMING = """\
grouped_timing on NVIDIA H200: torch 2.11.0+cu130, triton 3.6.0, bf16, eps 1e-06
M=65536 H=1024 E=8: 6 timings
| M | H | E | empty | dir | floor us | single x | grouped x | /single | grouped_triton x | /single | loop x | /single | ok |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| 65536 | 1024 | 8 | 1 | forward | 69.1 | 1.10 | 1.14 | 1.03 | 1.54 | 1.40 | 1.53 | 1.39 | yes |
| 65536 | 1024 | 8 | 1 | backward | 98.5 | 1.10 | 1.33 | 1.21 | 1.88 | 1.71 | 1.58 | 1.44 | NO |
skipped loop_triton: AttributeError: no op
wrote /root/out/grouped_timing.json
"""


def _regenerate(tmp_path: Path, readme: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return readme_tables.regenerate(readme, tmp_path)


# The README itself, against the committed files its markers name.


def test_readme_tables_match_their_committed_sources():
    readme = (ROOT / "README.md").read_text()
    markers = re.findall(r"<!-- table:([\w-]+)\s+source=(\S+)", readme)
    # The tables under "Status on the GPU" are generated: at least the kernel-only and the
    # through-autograd tables, from files that are committed.
    assert {"kernels", "autograd"} <= {kind for kind, _ in markers}, markers
    for _, source in markers:
        assert (ROOT / source).is_file(), source
        if (ROOT / ".git").exists():  # a checkout (the GPU machine gets a copy of the tree, no .git)
            tracked = subprocess.run(["git", "ls-files", "--error-unmatch", source], cwd=ROOT, capture_output=True)
            assert tracked.returncode == 0, f"{source} is not committed"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "readme_tables.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_check_fails_on_a_changed_number(tmp_path):
    # A README whose table disagrees with its source makes --check exit 1 (and the test above fail).
    readme = (ROOT / "README.md").read_text()
    marker = re.search(r"<!-- table:kernels[^>]*-->\n\n.*?\n(  \| cuda forward \| )([\d.]+)", readme, flags=re.S)
    changed = readme[: marker.start(2)] + "9.99" + readme[marker.end(2) :]
    # The sources are read relative to the README's folder: a copy beside the real bench/.
    (tmp_path / "bench").symlink_to(ROOT / "bench")
    (tmp_path / "README.md").write_text(changed)
    script = str(ROOT / "bench" / "readme_tables.py")
    check = [sys.executable, script, "--check", "--readme", str(tmp_path / "README.md")]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "-  | cuda forward | 9.99" in done.stdout
    # Without --check it rewrites the table in place, and then the check holds.
    assert subprocess.run([sys.executable, script, "--readme", str(tmp_path / "README.md")], capture_output=True).returncode == 0
    assert (tmp_path / "README.md").read_text() == readme


# The parsers, on inline samples of each format.


def test_parse_ops_timing():
    rows = readme_tables.parse_ops_timing(OPS_TIMING)
    shapes = [(r["M"], r["H"]) for r in rows]
    assert shapes == [("131072", "512"), ("2048", "32768"), ("22369", "3000"), ("2048", "1024"), ("2048", "32768")]
    assert rows[0] == {
        "M": "131072", "H": "512", "copy": "68.5", "fwd/x": "1.08", "trfwd/x": "1.28",
        "add": "98.7", "bwd/x": "1.10", "trbwd/x": "1.59",
    }  # fmt: skip
    assert rows[2]["trfwd/x"] == "nan"
    assert readme_tables.parse_ops_timing(OPS_TIMING_V1)[1]["bwd/x"] == "1.83"
    assert readme_tables.parse_ops_timing(OPS_TIMING_MUL)[1]["mbwd/x"] == "5.35"


@pytest.mark.parametrize(
    "text, message",
    [
        ("no table here\n", "found none"),
        (OPS_TIMING + OPS_TIMING, "a second at line"),
        (OPS_TIMING_V1 + "   1024  65536  68.2  1.63\n", "expected 8 cells at line 4, got 4"),
    ],
)
def test_parse_ops_timing_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        readme_tables.parse_ops_timing(text)


def test_parse_bench_summary():
    rows = readme_tables.parse_bench_summary(BENCH_SUMMARY)
    assert [(r["sweep"], r["M"], r["H"], r["mode"]) for r in rows] == [
        ("seed", "2048", "1024", "forward"), ("seed", "2048", "1024", "backward"), ("seed", "2048", "1024", "full"),
        ("bytes", "16384", "4096", "forward"), ("bytes", "16384", "4096", "full"), ("tokens", "16384", "4096", "full"),
    ]  # fmt: skip
    assert rows[1]["ratios"] == {"polynorm_cuda": "9.44", "liger": "15.34", "polynorm_cuda_graph": "—"}
    with pytest.raises(ValueError, match="sweep"):
        readme_tables.parse_bench_summary("# polynorm benchmark\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")


def test_parse_grouped_timing():
    rows = readme_tables.parse_grouped_timing(GROUPED_TIMING)
    assert len(rows) == 2
    assert rows[1] == {
        "M": "65536", "H": "1024", "E": "8", "dir": "backward", "single": "1.10",
        "ratio": {"grouped": "1.33", "grouped_triton": "1.88", "loop": "1.58"},
        "vs_single": {"grouped": "1.21", "grouped_triton": "1.71", "loop": "1.44"}, "ok": "NO",
    }  # fmt: skip
    with pytest.raises(ValueError, match="expected one table"):
        readme_tables.parse_grouped_timing("grouped_timing on cpu\n")


# The tables, as the markers ask for them.


def test_kernels_table_splits_the_2_26_rows_from_the_seed_rows():
    assert readme_tables.kernels_table("kernels", OPS_TIMING) == [
        "| H | 512 | 32768 | 3000 |",
        "|---|---|---|---|",
        "| cuda forward | 1.08 | 1.22 | 1.25 |",
        "| cuda backward | 1.10 | 1.59 | 1.20 |",
        "| triton forward | 1.28 | 1.20 | — |",
        "| triton backward | 1.59 | 1.68 | 2.29 |",
    ]
    assert readme_tables.kernels_table("kernels", OPS_TIMING, shapes="seed") == [
        "| H | 1024 | 32768 |",
        "|---|---|---|",
        "| cuda forward | 1.37 | 1.21 |",
        "| cuda backward | 1.51 | 1.60 |",
        "| triton forward | 3.57 | 1.19 |",
        "| triton backward | 4.88 | 1.69 |",
    ]
    # No Triton columns (an old log) or no Triton numbers (ops not registered): CUDA rows only.
    old_log = readme_tables.kernels_table("kernels", OPS_TIMING_V1)
    assert old_log[2:] == ["| cuda forward | 1.19 | 1.19 |", "| cuda backward | 1.72 | 1.83 |"]
    assert readme_tables.kernels_table("mul-kernels", OPS_TIMING_MUL) == [
        "| H | 512 | 16385 |",
        "|---|---|---|",
        "| cuda forward | 1.09 | 2.15 |",
        "| cuda backward | 1.04 | 5.35 |",
    ]
    with pytest.raises(ValueError, match="no rows for shapes=seed"):
        readme_tables.kernels_table("kernels", OPS_TIMING_V1, shapes="seed")
    with pytest.raises(ValueError, match="expected shapes=2\\^26 or shapes=seed, got shapes=all"):
        readme_tables.kernels_table("kernels", OPS_TIMING, shapes="all")
    with pytest.raises(ValueError, match="expected a mfwd/x column"):
        readme_tables.kernels_table("mul-kernels", OPS_TIMING)


def test_autograd_table_picks_providers_and_rows():
    assert readme_tables.autograd_table(BENCH_SUMMARY) == [
        "| M x H | mode | polynorm_cuda | liger | polynorm_cuda_graph |",
        "|---|---|---|---|---|",
        "| 2048 x 1024 | forward | 1.25 | 7.52 | 1.29 |",
        "| 2048 x 1024 | backward | 9.44 | 15.34 | — |",
        "| 2048 x 1024 | full | 10.88 | 18.44 | 1.16 |",
        "| 16384 x 4096 | forward | 1.15 | 1.38 | 1.16 |",
        "| 16384 x 4096 | full | 1.13 | 3.67 | 1.13 |",
        "| 16384 x 4096 | full | 1.14 | 2.46 | 1.13 |",
    ]
    # Rows in the terms' order, each row once; columns in the providers' order.
    rows = "bytes:full,seed/2048x1024:full+forward,bytes"
    table = readme_tables.autograd_table(BENCH_SUMMARY, providers="liger,polynorm_cuda", rows=rows)
    assert table == [
        "| M x H | mode | liger | polynorm_cuda |",
        "|---|---|---|---|",
        "| 16384 x 4096 | full | 3.67 | 1.13 |",
        "| 2048 x 1024 | forward | 7.52 | 1.25 |",
        "| 2048 x 1024 | full | 18.44 | 10.88 |",
        "| 16384 x 4096 | forward | 1.38 | 1.15 |",
    ]
    with pytest.raises(ValueError, match="expected providers among .* got 'eager'"):
        readme_tables.autograd_table(BENCH_SUMMARY, providers="polynorm_cuda,eager")
    with pytest.raises(ValueError, match="matches no row"):
        readme_tables.autograd_table(BENCH_SUMMARY, rows="seed/2048x4096")
    with pytest.raises(ValueError, match="expected rows terms"):
        readme_tables.autograd_table(BENCH_SUMMARY, rows="seed 2048")


def test_grouped_table():
    assert readme_tables.grouped_table(GROUPED_TIMING) == [
        "| M x H | E | grouped forward | / single-expert | grouped backward | / single-expert | loop over experts, forward / backward |",
        "|---|---|---|---|---|---|---|",
        "| 65536 x 1024 | 8 | 1.14 | 1.03 | 1.33 | 1.21 | 1.53 / 1.58 |",
    ]


# The markers.


def test_regenerate_rewrites_only_marked_tables_keeping_their_indent(tmp_path):
    readme = (
        "# Title\n\n| hand | typed |\n|---|---|\n| 1 | 2 |\n\n"
        "- **Grouped**:\n\n  <!-- table:grouped source=g.log -->\n\n  | stale |\n\n  <!-- /table:grouped -->\n\nAfter.\n"
    )
    new = _regenerate(tmp_path, readme, {"g.log": GROUPED_TIMING})
    head = "# Title\n\n| hand | typed |\n|---|---|\n| 1 | 2 |\n\n- **Grouped**:\n\n"
    assert new.startswith(head + "  <!-- table:grouped source=g.log -->\n\n  | M x H | E |")
    assert "  | 65536 x 1024 | 8 | 1.14 | 1.03 | 1.33 | 1.21 | 1.53 / 1.58 |\n\n  <!-- /table:grouped -->\n\nAfter.\n" in new
    assert "stale" not in new
    assert readme_tables.regenerate(new, tmp_path) == new  # a second run changes nothing
    assert readme_tables.regenerate("no markers\n", tmp_path) == "no markers\n"


def test_markers_take_options_over_several_lines(tmp_path):
    readme = "<!-- table:kernels source=o.log\n     shapes=seed -->\n<!-- /table:kernels -->\n"
    new = _regenerate(tmp_path, readme, {"o.log": OPS_TIMING})
    assert new.startswith("<!-- table:kernels source=o.log\n     shapes=seed -->\n\n| H | 1024 | 32768 |\n")


@pytest.mark.parametrize(
    "readme, message",
    [
        ("<!-- table:speed source=o.log -->\n<!-- /table:speed -->\n", "expected a kind among"),
        ("<!-- table:kernels shapes=seed -->\n<!-- /table:kernels -->\n", "expected a source=PATH option"),
        ("<!-- table:kernels source=missing.log -->\n<!-- /table:kernels -->\n", "source=missing.log is not a file"),
        ("<!-- table:kernels source=o.log rows=bytes -->\n<!-- /table:kernels -->\n", "got 'rows=bytes'"),
        ("<!-- table:kernels source=o.log -->\n| unclosed |\n", "found 0"),
        ("<!-- table:kernels source=o.log -->\n<!-- table:grouped source=o.log -->\n<!-- /table:kernels -->\n",
         "expected <!-- /table:kernels --> before the next table marker"),
    ],
)  # fmt: skip
def test_bad_markers_are_refused(tmp_path, readme, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _regenerate(tmp_path, readme, {"o.log": OPS_TIMING})
