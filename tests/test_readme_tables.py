"""The README's speed tables are what their committed log gives (bench/readme_tables.py), and the
script reads bench/ops_timing.py's format: an inline sample log, as that script writes it."""

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

# bench/ops_timing.py's log: metadata, an extra comment, both ops in bf16 (aligned at M*H = 2^26,
# odd, a view, a seed row of M = 2048 that is not 2^26), PolyNorm in fp16, a stray warning line,
# Triton absent (nan) in places.
HEAD = """\
# gpu: NVIDIA H100 80GB HBM3
# torch: 2.11.0+cu130
# triton: 3.6.0
# commit: 1a2b3c4
# date: 2026-12-07
# command: python3 bench/ops_timing.py --dtype bfloat16
# timing: do_bench median, warmup 25 ms, rep 100 ms
op dtype M H layout fwd_floor_us fwd_cuda fwd_triton bwd_floor_us bwd_cuda bwd_triton
"""
ROWS = """\
poly_norm bfloat16 131072 512 aligned 91.20 1.031 1.210 130.51 1.062 1.480
poly_norm bfloat16 16384 4096 aligned 91.05 1.012 1.060 130.22 1.044 1.370
poly_norm bfloat16 256 262144 aligned 91.40 1.140 nan 130.80 1.190 nan
poly_norm bfloat16 22369 3000 aligned 93.10 1.020 1.400 131.00 1.090 2.200
poly_norm bfloat16 13094 5125 odd 93.30 1.080 2.100 131.20 1.130 3.000
UserWarning: something the run printed
poly_norm bfloat16 16384 4096 view 140.10 0.690 0.950 145.00 1.050 1.600
poly_norm bfloat16 2048 4096 aligned 12.10 1.160 3.500 17.90 1.300 4.500
poly_norm float16 16384 4096 aligned 91.10 1.015 1.061 130.30 1.046 1.371
poly_norm_mul bfloat16 16384 4096 aligned 130.22 1.030 1.040 220.10 1.070 1.290
poly_norm_mul bfloat16 13094 5125 odd 131.20 1.080 nan 222.00 1.120 nan
# wall: 61 s
"""
LOG = HEAD + ROWS
RUN = (
    "on NVIDIA H100 80GB HBM3, 2026-12-07, commit 1a2b3c4, torch 2.11.0+cu130, triton 3.6.0: bf16 at M·H = 2^26{}. "
    "Measured by `python3 bench/ops_timing.py --dtype bfloat16`; rebuilt by `python3 bench/readme_tables.py o.log`."
)


def _regenerate(tmp_path: Path, readme: str, log: str = LOG, source=None) -> str:
    (tmp_path / "o.log").write_text(log)
    return readme_tables.regenerate(readme, tmp_path, source)


# The README itself, against the committed log its markers name.


def test_readme_tables_match_their_committed_log():
    readme = (ROOT / "README.md").read_text()
    markers = re.findall(r"<!-- table:([\w-]+)\s+source=(\S+)", readme)
    assert sorted(kind for kind, _ in markers) == ["poly_norm", "poly_norm_mul"], markers
    for _, source in markers:
        assert (ROOT / source).is_file(), f"the README's tables name {source}, which is not a file"
        if (ROOT / ".git").exists():  # a checkout (the GPU machine gets a copy of the tree, no .git)
            tracked = subprocess.run(["git", "ls-files", "--error-unmatch", source], cwd=ROOT, capture_output=True)
            assert tracked.returncode == 0, f"{source} is not committed"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "readme_tables.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_check_fails_on_a_changed_number_and_a_log_rewrites(tmp_path):
    script = str(ROOT / "bench" / "readme_tables.py")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "new.log").write_text(LOG)
    readme = "# T\n\n<!-- table:poly_norm source=old.log -->\n\nstale\n\n<!-- /table:poly_norm -->\n"
    (tmp_path / "README.md").write_text(readme)
    # A log on the command line: every table from it, the markers then name it (from the README's folder).
    rebuild = [sys.executable, script, "--readme", str(tmp_path / "README.md"), str(tmp_path / "results" / "new.log")]
    assert subprocess.run(rebuild, capture_output=True, cwd=tmp_path).returncode == 0
    written = (tmp_path / "README.md").read_text()
    assert "<!-- table:poly_norm source=results/new.log -->" in written and "stale" not in written
    check = [sys.executable, script, "--check", "--readme", str(tmp_path / "README.md")]
    assert subprocess.run(check, capture_output=True).returncode == 0
    # A number that disagrees with the log: --check exits 1 with the diff.
    (tmp_path / "README.md").write_text(written.replace("| 1.031 |", "| 9.99 |", 1))
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "-| CUDA forward / copy | 9.99 |" in done.stdout
    # A log named by a marker that is not there: exit 2, naming it.
    (tmp_path / "README.md").write_text(readme)
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 2 and "source=old.log is not a file" in done.stderr, done.stderr


# The parser.


def test_parse_log():
    meta, rows = readme_tables.parse_log(LOG)
    assert meta == {
        "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0", "commit": "1a2b3c4",
        "date": "2026-12-07", "command": "python3 bench/ops_timing.py --dtype bfloat16",
    }  # fmt: skip
    assert len(rows) == 10
    assert rows[0] == {
        "op": "poly_norm", "dtype": "bfloat16", "M": "131072", "H": "512", "layout": "aligned", "fwd_floor_us": "91.20",
        "fwd_cuda": "1.031", "fwd_triton": "1.210", "bwd_floor_us": "130.51", "bwd_cuda": "1.062", "bwd_triton": "1.480",
    }  # fmt: skip
    assert rows[2]["fwd_triton"] == "nan"


@pytest.mark.parametrize(
    "text, message",
    [
        ("no log here\n", "for gpu, torch, triton, commit, date, command"),
        (HEAD.replace("# commit: 1a2b3c4\n", ""), "for commit"),
        (HEAD, "expected a header line starting with 'op' and rows, found none"),
        (LOG + HEAD.splitlines()[-1] + "\n", "a second at line"),
        (HEAD.replace("bwd_triton", "bwd_tr"), "expected the header op dtype"),
        (HEAD + "poly_norm bfloat16 2048 1024 aligned 12.0 1.1\n", "expected 11 cells at line 9, got 7"),
        (HEAD + "poly_norm bfloat16 2048 1024 strided 12.0 1.1 1.2 13.0 1.3 1.4\n", "a layout among"),
        (HEAD + "poly_norm bfloat16 2048 1024 aligned 12.0 fast 1.2 13.0 1.3 1.4\n", "numbers at line 9"),
        (ROWS, "expected the header line before the row at line 1"),
    ],
)
def test_parse_log_refuses(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        readme_tables.parse_log(text)


# The tables.


def test_poly_norm_tables():
    assert readme_tables.op_tables("poly_norm", LOG, "o.log") == [
        "PolyNorm " + RUN.format(" (float16 rows: in the log)"),
        "",
        "| H | 512 | 4096 | 262144 |",
        "|---|---|---|---|",
        "| CUDA forward / copy | 1.031 | 1.012 | 1.140 |",
        "| Triton forward / copy | 1.210 | 1.060 | — |",
        "| CUDA backward / add | 1.062 | 1.044 | 1.190 |",
        "| Triton backward / add | 1.480 | 1.370 | — |",
        "",
        "| H | 3000 | 5125 odd | 4096 view |",
        "|---|---|---|---|",
        "| CUDA forward / copy | 1.020 | 1.080 | 0.690 |",
        "| Triton forward / copy | 1.400 | 2.100 | 0.950 |",
        "| CUDA backward / add | 1.090 | 1.130 | 1.050 |",
        "| Triton backward / add | 2.200 | 3.000 | 1.600 |",
    ]


def test_fused_tables_and_options():
    lines = readme_tables.op_tables("poly_norm_mul", LOG, "o.log")
    assert lines[0] == "Fused PolyNorm x mul " + RUN.format("")
    assert lines[2:] == [
        "| H | 4096 |",
        "|---|---|",
        "| CUDA forward / add | 1.030 |",
        "| Triton forward / add | 1.040 |",
        "| CUDA backward / add + copy | 1.070 |",
        "| Triton backward / add + copy | 1.290 |",
        "",
        "| H | 5125 odd |",
        "|---|---|",
        "| CUDA forward / add | 1.080 |",
        "| Triton forward / add | — |",
        "| CUDA backward / add + copy | 1.120 |",
        "| Triton backward / add + copy | — |",
    ]
    picked = readme_tables.op_tables("poly_norm", LOG, "o.log", aligned="4096,512", extra="4096:view")
    assert picked[2] == "| H | 4096 | 512 |" and picked[9] == "| H | 4096 view |"
    with pytest.raises(ValueError, match="names H without an aligned bfloat16 row: \\[1024\\]"):
        readme_tables.op_tables("poly_norm", LOG, "o.log", aligned="512,1024")
    with pytest.raises(ValueError, match="names 4097:odd, which has no bfloat16 row"):
        readme_tables.op_tables("poly_norm", LOG, "o.log", extra="4097:odd")
    with pytest.raises(ValueError, match="expected extra=H:LAYOUT"):
        readme_tables.op_tables("poly_norm", LOG, "o.log", extra="4096")
    with pytest.raises(ValueError, match="no bfloat16 rows of poly_norm_mul"):
        readme_tables.op_tables("poly_norm_mul", LOG.replace("poly_norm_mul bfloat16", "poly_norm_mul float32"), "o.log")


# The markers.


def test_regenerate_rewrites_only_marked_tables_keeping_their_indent(tmp_path):
    readme = (
        "# Title\n\n| hand | typed |\n|---|---|\n| 1 | 2 |\n\n- **Speed**:\n\n"
        "  <!-- table:poly_norm_mul source=o.log -->\n\n  | stale |\n\n  <!-- /table:poly_norm_mul -->\n\nAfter.\n"
    )
    new = _regenerate(tmp_path, readme)
    head = "# Title\n\n| hand | typed |\n|---|---|\n| 1 | 2 |\n\n- **Speed**:\n\n"
    assert new.startswith(head + "  <!-- table:poly_norm_mul source=o.log -->\n\n  Fused PolyNorm x mul on NVIDIA")
    assert "\n\n  | H | 5125 odd |\n" in new  # blank lines stay blank, other lines take the indent
    assert new.endswith("  | Triton backward / add + copy | — |\n\n  <!-- /table:poly_norm_mul -->\n\nAfter.\n")
    assert "stale" not in new
    assert readme_tables.regenerate(new, tmp_path) == new  # a second run changes nothing
    assert readme_tables.regenerate("no markers\n", tmp_path) == "no markers\n"


def test_markers_take_options_over_several_lines_and_a_new_source(tmp_path):
    readme = "<!-- table:poly_norm source=old.log\n     extra=5125:odd -->\n<!-- /table:poly_norm -->\n"
    new = _regenerate(tmp_path, readme, source="o.log")
    assert new.startswith("<!-- table:poly_norm source=o.log\n     extra=5125:odd -->\n\nPolyNorm on NVIDIA")
    assert "| H | 5125 odd |" in new and "| H | 3000 |" not in new
    # A marker without a source takes the new one.
    assert _regenerate(tmp_path, "<!-- table:poly_norm -->\n<!-- /table:poly_norm -->\n", source="o.log").startswith(
        "<!-- table:poly_norm source=o.log -->\n\nPolyNorm on"
    )


@pytest.mark.parametrize(
    "readme, message",
    [
        ("<!-- table:kernels source=o.log -->\n<!-- /table:kernels -->\n", "expected a kind among"),
        ("<!-- table:poly_norm extra=5125:odd -->\n<!-- /table:poly_norm -->\n", "expected a source=PATH option"),
        ("<!-- table:poly_norm source=missing.log -->\n<!-- /table:poly_norm -->\n", "source=missing.log is not a file"),
        ("<!-- table:poly_norm source=o.log rows=bytes -->\n<!-- /table:poly_norm -->\n", "got 'rows=bytes'"),
        ("<!-- table:poly_norm source=o.log -->\n| unclosed |\n", "found 0"),
        ("<!-- table:poly_norm source=o.log -->\n<!-- table:poly_norm_mul source=o.log -->\n<!-- /table:poly_norm -->\n",
         "expected <!-- /table:poly_norm --> before the next table marker"),
    ],
)  # fmt: skip
def test_bad_markers_are_refused(tmp_path, readme, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _regenerate(tmp_path, readme)
