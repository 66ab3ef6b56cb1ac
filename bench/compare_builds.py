#!/usr/bin/env python3
"""Two builds of the extension timed side by side on one GPU: the guard that a change loses no speed.

Runs ``bench/ops_timing.py`` once per build, dtype and repeat, each in its own process with
``PYTHONPATH=<build folder>`` (two builds register the same ``torch.ops.polynorm`` names, so they
cannot share a process). Each dtype's old and new runs follow each other, and which build goes
first alternates from one (repeat, dtype) to the next, so that a drift of the card's clocks
falls on both builds alike. Before the timed runs, every build and dtype is run once with
``--warm-only``, all at once, to fill Triton's compile cache (``--no-warm`` skips this).

Each figure of ``ops_timing.py`` is an op's time over a floor timed in the same process; times
the floor, it is the op's time in microseconds. The comparison is of those times: for every row
(op, dtype, M, H, layout) and column (cuda and triton, forward and backward), new / old of the
minimum over ``--repeat`` runs (default 2): noise on a GPU only ever adds time. Times, not
ratios: at M = 2048 and H = 1024 the copy that is the floor takes about 8 us and its median
moves by up to 11% from one process to the next while the op's moves by about 2%
(bench/results/h100-build-guard), so a ratio over it measures the floor. The floor's new / old
is printed beside each row as the card's drift. The script prints the table, the worst ratio
of each column with its row, and exits 1 if any CUDA ratio exceeds ``--limit`` (default 1.02),
or if a CUDA op the old build times is absent from the new one. The Triton columns are shown,
not gated.

Under ``--out`` (default ``out/compare_builds``): each run's log (``old_bfloat16_1.log``, ...),
each build's per-cell minimum in ``ops_timing.py``'s format (``old.log``, ``new.log``) and the
comparison (``comparison.txt``).

    python3 bench/compare_builds.py --old /path/to/old --new . [--dtype bfloat16 ...] [--out DIR]
    python3 bench/compare_builds.py --old-log old.log --new-log new.log   # compare logs only, no GPU

With the default budgets (do_bench warmup 10 ms, rep 40 ms) the three dtypes take about
5 minutes on an H100: the plan and each run's wall time are printed as it goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
# ops_timing.py's shapes and log format (it imports torch, not polynorm), loaded by path: this
# process never imports a build.
_spec = importlib.util.spec_from_file_location("ops_timing", HERE / "ops_timing.py")
ops_timing = sys.modules["ops_timing"] = importlib.util.module_from_spec(_spec)  # a dataclass looks itself up
_spec.loader.exec_module(ops_timing)

KEY = ("op", "dtype", "M", "H", "layout")
COMPARED = ("fwd_cuda", "bwd_cuda", "fwd_triton", "bwd_triton")
GATED = ("fwd_cuda", "bwd_cuda")
STARTUP_S = 8  # a run's import of torch, triton and polynorm, and its first CUDA calls


def parse_log(text: str) -> tuple[dict[str, str], dict[tuple, dict[str, float]]]:
    """(comment fields, rows) of an ``ops_timing.py`` log. Comment lines ``# name: value`` give the
    fields (the first of each name); other ``#`` lines are skipped. Rows are keyed by KEY."""
    meta: dict[str, str] = {}
    rows: dict[tuple, dict[str, float]] = {}
    columns = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            name, sep, value = line[1:].partition(":")
            if sep and name.strip() and " " not in name.strip():
                meta.setdefault(name.strip(), value.strip())
            continue
        cells = line.split()
        if cells[0] == "op":
            if tuple(cells) != ops_timing.COLUMNS:
                raise ValueError(f"compare_builds: unexpected header {line!r}; expected {ops_timing.header()!r}")
            columns = cells
            continue
        if columns is None or len(cells) != len(columns):
            raise ValueError(f"compare_builds: a row before the header, or of {len(cells)} cells: {line!r}")
        row = dict(zip(columns, cells))
        key = (row["op"], row["dtype"], int(row["M"]), int(row["H"]), row["layout"])
        if key in rows:
            raise ValueError(f"compare_builds: row {key} occurs twice")
        rows[key] = {c: float(row[c]) for c in columns if c not in KEY}
    return meta, rows


def merge(runs: list[dict[tuple, dict[str, float]]]) -> dict[tuple, dict[str, float]]:
    """Per row and column, the minimum over the runs (nan only where every run has nan)."""
    merged: dict[tuple, dict[str, float]] = {}
    for rows in runs:
        for key, cells in rows.items():
            into = merged.setdefault(key, {c: math.nan for c in cells})
            for c, v in cells.items():
                if not math.isnan(v) and (math.isnan(into[c]) or v < into[c]):
                    into[c] = v
    return merged


FLOOR_OF = {"fwd_cuda": "fwd_floor_us", "fwd_triton": "fwd_floor_us", "bwd_cuda": "bwd_floor_us",
            "bwd_triton": "bwd_floor_us"}


def times_us(rows: dict[tuple, dict[str, float]]) -> dict[tuple, dict[str, float]]:
    """One run's rows with each compared column in microseconds (its ratio times its floor)."""
    return {key: {**cells, **{c: cells[c] * cells[FLOOR_OF[c]] for c in COMPARED}} for key, cells in rows.items()}


def format_log(meta: dict[str, str], rows: dict[tuple, dict[str, float]], note: str) -> str:
    """Rows in ``ops_timing.py``'s format, after its comment fields and a note."""
    lines = [f"# {name}: {meta[name]}" for name in ("gpu", "torch", "triton", "commit", "date", "command", "polynorm")
             if name in meta]  # fmt: skip
    lines += [f"# {note}", ops_timing.header()]
    for key, cells in rows.items():
        values = [f"{cells[c]:.2f}" if c.endswith("_us") else ("nan" if math.isnan(cells[c]) else f"{cells[c]:.3f}")
                  for c in ops_timing.COLUMNS[len(KEY):]]  # fmt: skip
        lines.append(" ".join([key[0], key[1], str(key[2]), str(key[3]), key[4], *values]))
    return "\n".join(lines) + "\n"


def compare(old: dict[tuple, dict[str, float]], new: dict[tuple, dict[str, float]], limit: float):
    """(table lines, failures, worst) of new / old per row and compared column. failures: one
    line per CUDA cell over the limit or lost; worst: column -> (ratio, key)."""
    head = f"{'op':<14}{'dtype':<9}{'M':>8}{'H':>8} {'layout':<8}" + "".join(f"{c:>11}" for c in COMPARED)
    lines = [head + f"{'floor':>8}"]
    failures: list[str] = []
    worst: dict[str, tuple[float, tuple]] = {}
    for key in list(old) + [k for k in new if k not in old]:
        if key not in new or key not in old:
            where = "new" if key not in new else "old"
            lines.append(f"{key[0]:<14}{key[1]:<9}{key[2]:>8}{key[3]:>8} {key[4]:<8}  (absent from the {where} log)")
            if key not in new and any(not math.isnan(old[key][c]) for c in GATED):
                failures.append(f"{' '.join(map(str, key))}: absent from the new build's log")
            continue
        cells, flags = [], []
        for c in COMPARED:
            o, n = old[key][c], new[key][c]
            if math.isnan(o) or math.isnan(n):
                cells.append(f"{'-':>11}")
                if c in GATED and not math.isnan(o):
                    failures.append(f"{' '.join(map(str, key))} {c}: the old build times it, the new one does not")
                continue
            r = n / o
            over = c in GATED and r > limit
            cells.append(f"{r:>10.3f}{'!' if over else ' '}")
            if over:
                failures.append(f"{' '.join(map(str, key))} {c}: {r:.3f} (new {n:.2f} us, old {o:.2f} us)")
            if c not in worst or r > worst[c][0]:
                worst[c] = (r, key)
        floor = new[key]["fwd_floor_us"] / old[key]["fwd_floor_us"]
        lines.append(f"{key[0]:<14}{key[1]:<9}{key[2]:>8}{key[3]:>8} {key[4]:<8}" + "".join(cells) + f"{floor:>8.3f}")
    return lines, failures, worst


def report(old, new, limit: float) -> tuple[str, int]:
    """The comparison's text and the exit status (1 if a gated cell is over the limit or lost)."""
    lines, failures, worst = compare(old, new, limit)
    text = ["new / old of each op's time (us), the minimum of each build's runs",
            f"('!': a CUDA ratio over {limit}; 'floor': new / old of the forward floor, the card's drift)", ""]
    text += lines + ["", "worst per column:"]
    for c in COMPARED:
        if c in worst:
            r, key = worst[c]
            text.append(f"  {c:<11} {r:.3f}  {' '.join(map(str, key))}")
        else:
            text.append(f"  {c:<11} -")
    text.append("")
    if failures:
        text.append(f"FAIL: {len(failures)} CUDA cell(s) over {limit} or lost:")
        text += [f"  {f}" for f in failures]
    else:
        text.append(f"PASS: every CUDA ratio within {limit}")
    return "\n".join(text) + "\n", 1 if failures else 0


def build_env(build: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(build) + (os.pathsep + path if path else "")}


def run_timing(build: Path, args: list[str], log: Path, timeout: float) -> float:
    """Runs ops_timing.py on one build, writes its stdout to log; returns the wall seconds."""
    t0 = time.perf_counter()
    # From the repo root, so the log's command reads bench/ops_timing.py; the script's own folder,
    # not the working directory, is first on its sys.path, so PYTHONPATH alone picks polynorm.
    done = subprocess.run([sys.executable, "bench/ops_timing.py", *args], cwd=HERE.parent, env=build_env(build),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    log.write_text(done.stdout)
    if done.returncode != 0:
        sys.exit(f"compare_builds: {log.name}: ops_timing.py exited {done.returncode}\n{done.stderr[-3000:]}")
    meta, _ = parse_log(done.stdout)
    imported = Path(meta.get("polynorm", "?")).resolve()
    if build.resolve() not in (imported, *imported.parents):
        sys.exit(f"compare_builds: {log.name}: polynorm was imported from {imported}, not from {build}")
    return time.perf_counter() - t0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, help="the folder holding the old build's polynorm/")
    parser.add_argument("--new", type=Path, help="the folder holding the new build's polynorm/")
    parser.add_argument("--old-log", type=Path, nargs="+", help="compare these logs (their minimum) instead of running")
    parser.add_argument("--new-log", type=Path, nargs="+", help="with --old-log")
    parser.add_argument("--dtype", nargs="+", choices=ops_timing.DTYPES, default=list(ops_timing.DTYPES))
    parser.add_argument("--op", nargs="+", choices=ops_timing.OPS, default=list(ops_timing.OPS))
    parser.add_argument("--limit", type=float, default=1.02, help="largest new / old CUDA ratio that passes")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each build and dtype; a cell keeps its minimum")
    parser.add_argument("--warmup", type=float, default=10, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=float, default=40, help="do_bench rep, ms")
    parser.add_argument("--no-triton", action="store_true", help="time the CUDA ops only")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-up runs that fill Triton's cache")
    parser.add_argument("--quick", action="store_true", help="ops_timing.py --quick: a handful of rows (smoke)")
    parser.add_argument("--seed", action="store_true", help="ops_timing.py --seed: the M = 2048 rows alone")
    parser.add_argument("--graph", action="store_true",
                        help="ops_timing.py --graph: each op timed as a CUDA graph's replay, without the host's cost")
    parser.add_argument("--out", type=Path, default=Path("out/compare_builds"))
    args = parser.parse_args(argv)
    if args.old_log or args.new_log:
        if not (args.old_log and args.new_log):
            parser.error("--old-log and --new-log go together")
    elif not (args.old and args.new):
        parser.error("give --old and --new (build folders), or --old-log and --new-log")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.old_log:
        old = merge([times_us(parse_log(p.read_text())[1]) for p in args.old_log])
        new = merge([times_us(parse_log(p.read_text())[1]) for p in args.new_log])
        text, status = report(old, new, args.limit)
        print(text, end="")
        (args.out / "comparison.txt").write_text(text)
        return status

    builds = {"old": args.old, "new": args.new}
    for label, build in builds.items():
        if not (build / "polynorm" / "__init__.py").exists():
            sys.exit(f"compare_builds: --{label} {build} holds no polynorm/ package")
    common = ["--op", *args.op, "--warmup", str(args.warmup), "--rep", str(args.rep)]
    common += ["--no-triton"] if args.no_triton else []
    common += ["--quick"] if args.quick else []
    common += ["--seed"] if args.seed else []
    common += ["--graph"] if args.graph else []
    n_bench = len(ops_timing.shapes(args.quick, args.seed)) * ops_timing.timings_per_shape(tuple(args.op), not args.no_triton)
    run_s = STARTUP_S + n_bench * (args.warmup + args.rep + 10) / 1e3
    runs = args.repeat * len(args.dtype) * 2
    print(f"plan: {runs} runs of ops_timing.py ({n_bench} do_bench calls each, about {run_s:.0f} s a run), "
          f"about {runs * run_s / 60:.1f} min, plus the warm-up runs; logs under {args.out}", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    if not args.no_warm:
        # All at once: Triton compiles on the CPU, one process a core; nothing here is timed.
        jobs = [(label, build, dtype) for label, build in builds.items() for dtype in args.dtype]
        with ThreadPoolExecutor(len(jobs)) as pool:
            walls = list(pool.map(lambda j: run_timing(j[1], [*common, "--dtype", j[2], "--warm-only"],
                                                       args.out / f"warm_{j[0]}_{j[2]}.log", 600), jobs))  # fmt: skip
        print(f"warm-up: {len(jobs)} runs at once, {max(walls):.0f} s", flush=True)
    logs: dict[str, list[dict]] = {"old": [], "new": []}
    metas: dict[str, dict[str, str]] = {}
    step = 0
    for r in range(1, args.repeat + 1):
        for dtype in args.dtype:
            order = ("old", "new") if step % 2 == 0 else ("new", "old")
            step += 1
            for label in order:
                log = args.out / f"{label}_{dtype}_{r}.log"
                wall = run_timing(builds[label], [*common, "--dtype", dtype], log, 600)
                meta, rows = parse_log(log.read_text())
                metas.setdefault(label, meta)
                logs[label].append(rows)
                print(f"  {log.name}: {len(rows)} rows, {wall:.0f} s (at {time.perf_counter() - t0:.0f} s)", flush=True)
    merged = {label: merge(runs) for label, runs in logs.items()}
    for label in builds:
        note = f"each cell the minimum of {args.repeat} runs (bench/compare_builds.py)"
        (args.out / f"{label}.log").write_text(format_log(metas[label], merged[label], note))
    timed = {label: merge([times_us(rows) for rows in runs]) for label, runs in logs.items()}
    text, status = report(timed["old"], timed["new"], args.limit)
    head = [f"old: {builds['old']} (commit {metas['old'].get('commit', 'unknown')})",
            f"new: {builds['new']} (commit {metas['new'].get('commit', 'unknown')})",
            f"gpu: {metas['new'].get('gpu', '?')}; torch {metas['new'].get('torch', '?')}; "
            f"triton {metas['new'].get('triton', '?')}; {time.perf_counter() - t0:.0f} s in all", ""]  # fmt: skip
    text = "\n".join(head) + text
    print(text, end="")
    (args.out / "comparison.txt").write_text(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
