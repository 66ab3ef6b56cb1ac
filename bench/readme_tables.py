#!/usr/bin/env python3
"""The README's speed tables, generated from a committed kernel-timing log of bench/ops_timing.py.

    python3 bench/readme_tables.py bench/results/<folder>/ops_timing.log   # rewrite README.md's tables from that log
    python3 bench/readme_tables.py --check                                 # exit 1 where README.md differs from its log

The log (bench/ops_timing.py writes it) starts with comment lines ``# gpu: ...``, ``# torch:``,
``# triton:``, ``# commit:``, ``# date:`` and ``# command:`` (other ``#`` lines are ignored), then
one header line and one whitespace-separated row per (op, dtype, M, H, layout)::

    op dtype M H layout fwd_floor_us fwd_cuda fwd_triton bwd_floor_us bwd_cuda bwd_triton

op is ``poly_norm`` or ``poly_norm_mul``; layout ``aligned``, ``odd`` (H * element size not a
multiple of 16 bytes) or ``view`` (rows that start 2 bytes past a 16-byte boundary); the floors
are microseconds of a torch op that moves the same bytes in the same run (PolyNorm: a copy
forward, an add backward; the fused op: an add forward, an add plus a copy backward); each op
column is the op's time over its floor, ``nan`` where absent. Lines that are neither (a warning
the run printed) are skipped.

Each table sits between two marker comments in the README, which name the op and the log (a path
from the README's folder), and may pick the columns::

    <!-- table:poly_norm source=bench/results/<folder>/ops_timing.log -->
    ...generated...
    <!-- /table:poly_norm -->

Options, ``key=value`` after ``source``: ``aligned=512,1024,...`` (the first table's H; default
every power of two from 512 to 262144 in the log) and ``extra=3000:aligned,5125:odd,...`` (the
second table's rows; default every other bf16 row at M * H = 2^26). What is generated: a line
naming the op, the GPU, the date, the commit, the software and the commands (the measurement and
this rebuild), a table of bf16 rows of aligned H at M * H = 2^26, and one of the extra rows; the
fp16 and fp32 rows stay in the log. Every number is copied from the log as written (never
recomputed or rounded again); ``nan`` shows as ``—``.
"""

import argparse
import difflib
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["op", "dtype", "M", "H", "layout", "fwd_floor_us", "fwd_cuda", "fwd_triton", "bwd_floor_us", "bwd_cuda",
           "bwd_triton"]  # fmt: skip
META = ("gpu", "torch", "triton", "commit", "date", "command")
OPS = ("poly_norm", "poly_norm_mul")
LAYOUTS = ("aligned", "odd", "view")
ELEMENTS = 2**26  # M * H of the tables' rows
ALIGNED_H = [2**k for k in range(9, 19)]  # 512 ... 262144
MISSING = "—"
# Each op's floors: what moves the same bytes as its forward and its backward.
FLOORS = {"poly_norm": ("copy", "add"), "poly_norm_mul": ("add", "add + copy")}
NAMES = {"poly_norm": "PolyNorm", "poly_norm_mul": "Fused PolyNorm x mul"}
MARKER = re.compile(
    r"^(?P<indent>[ \t]*)<!-- table:(?P<kind>[\w-]+)(?P<options>[^>]*?) -->\n"
    r"(?P<body>.*?)^(?P=indent)<!-- /table:(?P=kind) -->$",
    flags=re.M | re.S,
)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def parse_log(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """bench/ops_timing.py's log: ({key: value} of its ``# key: value`` lines, [{column: cell}] of its rows).

    Raises ValueError on a missing metadata line or header, a second header, a row of the wrong
    width or with a cell out of place (an unknown layout, a ratio that is not a number), or no rows."""
    meta, head, rows = {}, None, []
    for number, line in enumerate(text.splitlines(), 1):
        cells = line.split()
        if not cells:
            continue
        if cells[0].startswith("#"):
            key, colon, value = line.lstrip("# \t").partition(":")
            if colon and key.strip() in META and key.strip() not in meta:
                meta[key.strip()] = value.strip()
            continue
        if cells[0] == "op":
            if head is not None:
                raise ValueError(f"ops_timing log: expected one header line, got a second at line {number}")
            if cells != COLUMNS:
                raise ValueError(f"ops_timing log: expected the header {' '.join(COLUMNS)}, got {line.strip()!r}")
            head = cells
        elif cells[0] in OPS:
            if head is None:
                raise ValueError(f"ops_timing log: expected the header line before the row at line {number}")
            if len(cells) != len(COLUMNS):
                raise ValueError(f"ops_timing log: expected {len(COLUMNS)} cells at line {number}, got {len(cells)}")
            row = dict(zip(COLUMNS, cells))
            if row["layout"] not in LAYOUTS or not all(map(_is_number, cells[2:4] + cells[5:])):
                raise ValueError(f"ops_timing log: expected M, H, a layout among {LAYOUTS} and numbers at line "
                                 f"{number}, got {line.strip()!r}")  # fmt: skip
            rows.append(row)
    missing = [key for key in META if key not in meta]
    if missing:
        raise ValueError(f"ops_timing log: expected lines '# KEY: value' for {', '.join(missing)}, found none")
    if not rows:
        raise ValueError("ops_timing log: expected a header line starting with 'op' and rows, found none")
    return meta, rows


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return [line(head), "|" + "---|" * len(head), *map(line, rows)]


def _shown(cell: str) -> str:
    return MISSING if cell == "nan" else cell


def _cells(op: str, rows: list[dict[str, str]]) -> list[list[str]]:
    fwd_floor, bwd_floor = FLOORS[op]
    return [
        [f"CUDA forward / {fwd_floor}", *(_shown(r["fwd_cuda"]) for r in rows)],
        [f"Triton forward / {fwd_floor}", *(_shown(r["fwd_triton"]) for r in rows)],
        [f"CUDA backward / {bwd_floor}", *(_shown(r["bwd_cuda"]) for r in rows)],
        [f"Triton backward / {bwd_floor}", *(_shown(r["bwd_triton"]) for r in rows)],
    ]


def _h_list(option: str, value: str) -> list[int]:
    try:
        return [int(h) for h in value.split(",")]
    except ValueError:
        raise ValueError(f"expected {option}=H,H,... (integers), got {option}={value}") from None


def op_tables(op: str, text: str, source: str, aligned: str = "", extra: str = "") -> list[str]:
    """The markdown lines for one op: the heading line, the aligned table, the extra table, the pointer."""
    meta, rows = parse_log(text)
    table_rows = [r for r in rows if r["op"] == op and r["dtype"] == "bfloat16" and int(r["M"]) == ELEMENTS // int(r["H"])]
    if not table_rows:
        raise ValueError(f"table:{op}: the source has no bfloat16 rows of {op} at M * H = 2^26")
    by_key = {(int(r["H"]), r["layout"]): r for r in table_rows}
    if aligned:
        wanted = _h_list("aligned", aligned)
        absent = [H for H in wanted if (H, "aligned") not in by_key]
        if absent:
            raise ValueError(f"table:{op}: aligned={aligned} names H without an aligned bfloat16 row: {absent}")
    else:
        wanted = [H for H in ALIGNED_H if (H, "aligned") in by_key]
        if not wanted:
            raise ValueError(f"table:{op}: the source has no aligned bfloat16 row at H = 512 ... 262144")
    first = [by_key[(H, "aligned")] for H in wanted]
    if extra:
        keys = []
        for term in extra.split(","):
            H, colon, layout = term.partition(":")
            if not (colon and H.isdigit() and layout in LAYOUTS):
                raise ValueError(f"table:{op}: expected extra=H:LAYOUT,... with a layout among {LAYOUTS}, got {term!r}")
            if (int(H), layout) not in by_key:
                raise ValueError(f"table:{op}: extra={extra} names {term}, which has no bfloat16 row at M * H = 2^26")
            keys.append((int(H), layout))
    else:
        shown = set((H, "aligned") for H in wanted)
        keys = [(int(r["H"]), r["layout"]) for r in table_rows if (int(r["H"]), r["layout"]) not in shown]
    others = sorted({r["dtype"] for r in rows if r["op"] == op} - {"bfloat16"})
    in_log = f" ({' and '.join(others)} rows: in the log)" if others else ""
    lines = [
        f"{NAMES[op]} on {meta['gpu']}, {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton "
        f"{meta['triton']}: bf16 at M·H = 2^26{in_log}. Measured by `{meta['command']}`; rebuilt by "
        f"`python3 bench/readme_tables.py {source}`.",
        "",
        *markdown_table(["H", *map(str, wanted)], _cells(op, first)),
    ]
    if keys:
        second = [by_key[key] for key in keys]
        head = [str(H) if layout == "aligned" else f"{H} {layout}" for H, layout in keys]
        lines += ["", *markdown_table(["H", *head], _cells(op, second))]
    return lines


def render(kind: str, options: str, root: Path) -> tuple[str, list[str]]:
    """One marker's (source, markdown lines): its op, its options string, files read from root."""
    if kind not in OPS:
        raise ValueError(f"table:{kind}: expected a kind among {list(OPS)}")
    pairs = {}
    for option in options.split():
        key, is_pair, value = option.partition("=")
        if not is_pair or key not in ("source", "aligned", "extra"):
            raise ValueError(f"table:{kind}: expected options source=PATH, aligned=... and extra=... as key=value, "
                             f"got {option!r}")  # fmt: skip
        pairs[key] = value
    source = pairs.pop("source", None)
    if source is None:
        raise ValueError(f"table:{kind}: expected a source=PATH option, got {options.strip()!r}")
    path = root / source
    if not path.is_file():
        raise ValueError(f"table:{kind}: source={source} is not a file under {root}")
    return source, op_tables(kind, path.read_text(), source, **pairs)


def regenerate(readme: str, root: Path = ROOT, source: str | None = None) -> str:
    """readme with every marked table rewritten from its source (paths relative to root), or from
    ``source`` for every marker when given (the markers then name it)."""

    def replace(match: re.Match) -> str:
        indent, kind, options = match["indent"], match["kind"], match["options"]
        if "<!-- table:" in match["body"]:
            raise ValueError(f"table:{kind}: expected <!-- /table:{kind} --> before the next table marker")
        if source is not None:
            options = re.sub(r"source=\S+", "source=" + source, options) if "source=" in options else f" source={source}{options}"
        _, lines = render(kind, options, root)
        body = "\n".join((indent + line).rstrip() for line in lines)
        return f"{indent}<!-- table:{kind}{options} -->\n\n{body}\n\n{indent}<!-- /table:{kind} -->"

    opened = len(re.findall(r"<!-- table:", readme))
    new, closed = MARKER.subn(replace, readme)
    if closed != opened:
        raise ValueError(f"expected a closing <!-- /table:KIND --> for each of the {opened} table markers, found {closed}")
    return new


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", type=Path, help="the ops_timing.py log to rewrite every table from")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to update (default: README.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs from its log")
    args = parser.parse_args(argv)
    if args.check and args.log is not None:
        parser.error("--check reads the logs the README names; give no log")
    old = args.readme.read_text()
    root = args.readme.resolve().parent
    source = None if args.log is None else Path(os.path.relpath(args.log.resolve(), root)).as_posix()
    try:
        new = regenerate(old, root, source)
    except ValueError as error:
        print(f"readme_tables: {error}", file=sys.stderr)
        return 2
    tables = len(MARKER.findall(old))
    if args.check:
        if new == old:
            print(f"readme_tables: {args.readme}'s {tables} tables match their logs")
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(args.readme), "generated"))
        print(f"readme_tables: {args.readme} differs from its logs; rebuild it with python3 bench/readme_tables.py LOG",
              file=sys.stderr)  # fmt: skip
        return 1
    args.readme.write_text(new)
    print(f"readme_tables: wrote {tables} tables to {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
