#!/usr/bin/env python3
"""The README's GPU speed tables, generated from the committed result files they cite.

Each generated table sits between two marker comments. The opening one names the table's kind
and its source file (a path from the README's folder), and may add options, space- or
line-separated:

    <!-- table:KIND source=PATH [key=value ...] -->

    | generated ... |

    <!-- /table:KIND -->

Only the tables whose markers are present are rewritten; the rest of the README is left alone.
Every cell is copied from the source file as the benchmark wrote it (never recomputed or
rounded again); a value the file marks missing (``nan``, ``—``) shows as ``—``. Kinds:

- ``kernels``: ``bench/ops_timing.py``'s log (the kernels alone, no autograd). One column per H,
  rows ``cuda forward`` (fwd/x, time / a same-run copy), ``cuda backward`` (bwd/x, over an add),
  and ``triton forward`` / ``triton backward`` when the log has those columns with numbers.
  ``shapes=2^26`` (the default) takes the rows at M*H = 2^26, ``shapes=seed`` the seed rows,
  M = 2048 (ops_timing.py prints them last: the trailing run of rows with M = 2048).
- ``mul-kernels``: the same for ``bench/ops_timing.py --op poly_norm_mul`` (the fused
  PolyNorm x mul): mfwd/x over an add, mbwd/x over an add plus a copy, and the Triton twins.
- ``autograd``: ``bench/bench.py``'s ``summary.md`` (through autograd). One row per shape and
  mode, one column per provider: its time over the mode's floor. ``providers=a,b,...`` picks
  and orders the columns (default: every provider, in the file's order); ``rows=TERM,...``
  picks the rows, in the terms' order, each ``SWEEP[/MxH][:MODE+MODE...]`` (e.g.
  ``bytes:forward+full``, ``seed/2048x1024:full``); default: every row of every sweep.
- ``grouped``: ``bench/grouped_timing.py``'s log (grouped PolyNorm, mixture of experts). One
  row per shape and E: the grouped op's forward and backward ratios to their floors, each over
  the single-expert kernel's (``/single``), and the loop over experts' forward / backward.

Usage::

    python3 bench/readme_tables.py                 # rewrite README.md's tables in place
    python3 bench/readme_tables.py --check         # exit 1 with a diff where README.md differs
    python3 bench/readme_tables.py --readme OTHER.md
"""

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MISSING = "—"
SEED_M = 2048  # the seed benchmark's rows (bench.py's SEED_M)
# The rows of a kernels table: (label, the ops_timing.py column it copies).
KERNEL_ROWS = {
    "kernels": [("cuda forward", "fwd/x"), ("cuda backward", "bwd/x"),
                ("triton forward", "trfwd/x"), ("triton backward", "trbwd/x")],
    "mul-kernels": [("cuda forward", "mfwd/x"), ("cuda backward", "mbwd/x"),
                    ("triton forward", "trmfwd/x"), ("triton backward", "trmbwd/x")],
}  # fmt: skip
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


def _shown(cell: str) -> str:
    return MISSING if cell in ("nan", "-", MISSING) else cell


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [markdown_row(head), "|" + "---|" * len(head), *map(markdown_row, rows)]


# Parsers: each takes a result file's text and returns its rows, cells as the file has them.


def parse_ops_timing(text: str) -> list[dict[str, str]]:
    """bench/ops_timing.py's log (either --op): one dict per data line, {column: cell}.

    The header line starts with ``M``; data lines are all numbers (``nan`` included); ``#``
    lines and any other text (warnings) are skipped. Raises ValueError on a second header, a
    data line of the wrong width, or no data."""
    head, rows = None, []
    for number, line in enumerate(text.splitlines(), 1):
        cells = line.split()
        if not cells or cells[0].startswith("#"):
            continue
        if cells[0] == "M":
            if head is not None:
                raise ValueError(f"ops_timing log: expected one header line, got a second at line {number}")
            head = cells
        elif head is not None and all(map(_is_number, cells)):
            if len(cells) != len(head):
                raise ValueError(f"ops_timing log: expected {len(head)} cells at line {number}, got {len(cells)}")
            rows.append(dict(zip(head, cells)))
    if not rows:
        raise ValueError("ops_timing log: expected a header line starting with M and data lines, found none")
    return rows


def markdown_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """Every markdown table in text as (the last ``#`` heading above it, its rows of cells,
    the header first, the ``|---|`` line dropped)."""
    tables, heading, current = [], "", None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("|") and line.endswith("|"):
            cells = [cell.strip() for cell in line[1:-1].split("|")]
            if current is None:
                current = []
                tables.append((heading, current))
            if not all(set(cell) <= set("-:") for cell in cells):
                current.append(cells)
            continue
        current = None
        if line.startswith("#"):
            heading = line
    return tables


def parse_bench_summary(text: str) -> list[dict]:
    """bench/bench.py's summary.md: one dict per row of each ``## sweep `NAME``` table,
    {sweep, M, H, mode, ratios: {provider: time / floor}} (the ms in brackets dropped)."""
    rows = []
    for heading, (head, *lines) in markdown_tables(text):
        sweep = re.match(r"## sweep `([^`]+)`", heading)
        if not sweep:
            continue  # the memory table
        providers = {i: name[: -len(" × (ms)")] for i, name in enumerate(head) if name.endswith(" × (ms)")}
        for cells in lines:
            row = dict(zip(head, cells))
            ratios = {name: cells[i].split()[0] for i, name in providers.items()}
            rows.append({"sweep": sweep.group(1), "M": row["M"], "H": row["H"], "mode": row["mode"], "ratios": ratios})
    if not rows:
        raise ValueError("bench summary: expected tables under '## sweep `NAME`' headings, found none")
    return rows


def parse_grouped_timing(text: str) -> list[dict]:
    """bench/grouped_timing.py's log: one dict per row of its table, {M, H, E, dir, single,
    ratio: {provider: its time / floor}, vs_single: {provider: that over single's}, ok}."""
    tables = [rows for _, rows in markdown_tables(text) if rows[0][:5] == ["M", "H", "E", "empty", "dir"]]
    if len(tables) != 1:
        raise ValueError(f"grouped_timing log: expected one table headed M | H | E | empty | dir, got {len(tables)}")
    head, *lines = tables[0]
    # After "single x": pairs of "<provider> x" and "/single", then "ok".
    providers = [(i, name[:-2]) for i, name in enumerate(head) if name.endswith(" x") and name != "single x"]
    rows = []
    for cells in lines:
        row = dict(zip(head, cells))
        rows.append({
            "M": row["M"], "H": row["H"], "E": row["E"], "dir": row["dir"], "single": row["single x"],
            "ratio": {name: cells[i] for i, name in providers},
            "vs_single": {name: cells[i + 1] for i, name in providers},
            "ok": row["ok"],
        })  # fmt: skip
    return rows


# Tables: each takes the source file's text and the marker's options, returns markdown lines.


def kernels_table(kind: str, text: str, shapes: str = "2^26") -> list[str]:
    rows = parse_ops_timing(text)
    seed_start = len(rows)
    while seed_start and int(rows[seed_start - 1]["M"]) == SEED_M:
        seed_start -= 1
    if shapes == "seed":
        rows = rows[seed_start:]
    elif shapes == "2^26":
        rows = [r for r in rows[:seed_start] if int(r["M"]) == 2**26 // int(r["H"])]
    else:
        raise ValueError(f"table:{kind}: expected shapes=2^26 or shapes=seed, got shapes={shapes}")
    if not rows:
        raise ValueError(f"table:{kind}: the source has no rows for shapes={shapes}")
    lines = []
    for label, column in KERNEL_ROWS[kind]:
        cells = [r.get(column, "nan") for r in rows]
        if label.startswith("cuda") and column not in rows[0]:
            raise ValueError(f"table:{kind}: expected a {column} column in the source, got {list(rows[0])}")
        if any(cell != "nan" for cell in cells):  # the Triton rows only where the log has them
            lines.append([label, *map(_shown, cells)])
    return markdown_table(["H", *(r["H"] for r in rows)], lines)


def _row_terms(rows: str) -> list[tuple[str, str | None, set[str] | None]]:
    """``SWEEP[/MxH][:MODE+MODE]`` terms as (sweep, "MxH" or None, modes or None)."""
    terms = []
    for term in rows.split(","):
        match = re.fullmatch(r"([\w-]+)(?:/(\d+x\d+))?(?::([\w+]+))?", term)
        if not match:
            raise ValueError(f"table:autograd: expected rows terms SWEEP[/MxH][:MODE+MODE], got {term!r}")
        sweep, shape, modes = match.groups()
        terms.append((sweep, shape, set(modes.split("+")) if modes else None))
    return terms


def autograd_table(text: str, providers: str = "", rows: str = "") -> list[str]:
    parsed = parse_bench_summary(text)
    available = list(parsed[0]["ratios"])
    names = providers.split(",") if providers else available
    for name in names:
        if name not in available:
            raise ValueError(f"table:autograd: expected providers among {available}, got {name!r}")
    chosen = []
    for sweep, shape, modes in _row_terms(rows) if rows else [(None, None, None)]:
        matched = [
            r for r in parsed
            if sweep in (None, r["sweep"]) and shape in (None, f"{r['M']}x{r['H']}") and (modes is None or r["mode"] in modes)
        ]  # fmt: skip
        if not matched:
            raise ValueError(f"table:autograd: the rows term {sweep}/{shape}:{modes} matches no row of the source")
        chosen += [r for r in matched if r not in chosen]
    lines = [[f"{r['M']} x {r['H']}", r["mode"], *(_shown(r["ratios"][name]) for name in names)] for r in chosen]
    return markdown_table(["M x H", "mode", *names], lines)


def grouped_table(text: str) -> list[str]:
    by_case = {}
    for r in parse_grouped_timing(text):
        by_case.setdefault((r["M"], r["H"], r["E"]), {})[r["dir"]] = r
    lines = []
    for (M, H, E), by_dir in by_case.items():
        fwd, bwd = by_dir["forward"], by_dir["backward"]
        if "grouped" not in fwd["ratio"]:
            raise ValueError(f"table:grouped: expected a 'grouped x' column, got {list(fwd['ratio'])}")
        lines.append([
            f"{M} x {H}", E, fwd["ratio"]["grouped"], fwd["vs_single"]["grouped"],
            bwd["ratio"]["grouped"], bwd["vs_single"]["grouped"],
            f"{_shown(fwd['ratio'].get('loop', '-'))} / {_shown(bwd['ratio'].get('loop', '-'))}",
        ])  # fmt: skip
    head = ["M x H", "E", "grouped forward", "/ single-expert", "grouped backward", "/ single-expert",
            "loop over experts, forward / backward"]  # fmt: skip
    return markdown_table(head, lines)


# kind: (the function that makes its table from the source's text, the options it takes).
TABLES = {
    "kernels": (lambda text, **options: kernels_table("kernels", text, **options), {"shapes"}),
    "mul-kernels": (lambda text, **options: kernels_table("mul-kernels", text, **options), {"shapes"}),
    "autograd": (autograd_table, {"providers", "rows"}),
    "grouped": (grouped_table, set()),
}


def render(kind: str, options: str, root: Path) -> list[str]:
    """The markdown lines of one marker's table: its kind, its options string, read from root."""
    if kind not in TABLES:
        raise ValueError(f"table:{kind}: expected a kind among {sorted(TABLES)}")
    make, known = TABLES[kind]
    pairs = {}
    for option in options.split():
        key, is_pair, value = option.partition("=")
        if not is_pair or key not in known | {"source"}:
            raise ValueError(f"table:{kind}: expected options source=PATH and {sorted(known)} as key=value, got {option!r}")
        pairs[key] = value
    source = pairs.pop("source", None)
    if source is None:
        raise ValueError(f"table:{kind}: expected a source=PATH option, got {options.strip()!r}")
    path = root / source
    if not path.is_file():
        raise ValueError(f"table:{kind}: source={source} is not a file under {root}")
    return make(path.read_text(), **pairs)


def regenerate(readme: str, root: Path = ROOT) -> str:
    """readme with every marked table rewritten from its source (paths relative to root)."""

    def replace(match: re.Match) -> str:
        indent, kind = match["indent"], match["kind"]
        if "<!-- table:" in match["body"]:
            raise ValueError(f"table:{kind}: expected <!-- /table:{kind} --> before the next table marker")
        table = "\n".join(indent + line for line in render(kind, match["options"], root))
        return f"{indent}<!-- table:{kind}{match['options']} -->\n\n{table}\n\n{indent}<!-- /table:{kind} -->"

    opened = len(re.findall(r"<!-- table:", readme))
    new, closed = MARKER.subn(replace, readme)
    if closed != opened:
        raise ValueError(f"expected a closing <!-- /table:KIND --> for each of the {opened} table markers, found {closed}")
    return new


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to update (default: README.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs from its source")
    args = parser.parse_args(argv)
    old = args.readme.read_text()
    try:
        new = regenerate(old, args.readme.resolve().parent)
    except ValueError as error:
        print(f"readme_tables: {error}", file=sys.stderr)
        return 2
    tables = len(MARKER.findall(old))
    if args.check:
        if new == old:
            print(f"readme_tables: {args.readme}'s {tables} tables match their sources")
            return 0
        diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(args.readme), "generated")
        sys.stdout.writelines(diff)
        print(f"readme_tables: {args.readme} differs from its sources; run python3 bench/readme_tables.py", file=sys.stderr)
        return 1
    args.readme.write_text(new)
    print(f"readme_tables: wrote {tables} tables to {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
