"""Which kernels' SASS differs between two builds of the extension (CPU only: no GPU needed).

A change meant for one build (a new template parameter, a host-side refactor) can move instructions
in others: two unused lambdas once reordered the fused forward's loads in four builds.
This compares every function of the two binaries' sm_90 code (``bench/sass_load_order.py``'s
``functions``), matched by demangled name and, where a name occurs more than once (a kernel
instantiated in several translation units of one .so), by its occurrence in order.
``--drop-arg 0`` drops a last template argument ``0`` (``, 0>(``, the one before the parameter list),
so that a template parameter appended with a default matches the names of before. Prints the counts of
functions that are equal, that differ, and that are only in one binary (with their names), and exits 1
if any matched function differs or if either binary has no sm_90 function.

    python3 bench/sass_diff.py OLD.so|OLD.cubin NEW.so|NEW.cubin [--drop-arg 0] [--verbose]
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from sass_load_order import functions  # noqa: E402

SHOWN = 20  # differing functions named without --verbose


def normalised(binary: str, drop_arg: str | None) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(demangled name, occurrence) -> [(instruction, control word)], addresses left out (a function's
    code is compared, not where it sits)."""
    out, seen = {}, {}
    for name, code in functions(binary):
        if drop_arg is not None:
            name = re.sub(rf", {re.escape(drop_arg)}>\(", ">(", name)
        k = seen[name] = seen.get(name, -1) + 1
        out[(name, k)] = [(re.sub(r"\.text\.\S+", "", ins), ctrl) for _, ins, ctrl in code]
    return out


def short(key: tuple[str, int]) -> str:
    """The kernel and its template arguments, without the parameter list or the anonymous namespace."""
    name = key[0].replace("(anonymous namespace)::", "")
    name = name[: name.find(">(") + 1] if ">(" in name else name.split("(")[0]
    return name + (f" (#{key[1] + 1})" if key[1] else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--drop-arg", help="drop this last template argument from every name (a new default)")
    parser.add_argument("--verbose", action="store_true", help="name every function that differs")
    args = parser.parse_args()
    old, new = normalised(args.old, args.drop_arg), normalised(args.new, args.drop_arg)
    if not old or not new:
        sys.exit(f"sass_diff: no sm_90 function in {args.old if not old else args.new}")
    both = [n for n in old if n in new]
    differ = [n for n in both if old[n] != new[n]]
    print(f"sass_diff: {len(both) - len(differ)} equal, {len(differ)} differ, {len(old) - len(both)} only in old, "
          f"{len(new) - len(both)} only in new")
    for n in differ if args.verbose else differ[:SHOWN]:
        print("DIFFER  ", short(n))
    if not args.verbose and len(differ) > SHOWN:
        print(f"DIFFER   ... and {len(differ) - SHOWN} more (--verbose names them)")
    for n in [n for n in new if n not in old]:
        print("NEW     ", short(n))
    for n in [n for n in old if n not in new]:
        print("GONE    ", short(n))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
