"""Which kernels' SASS differs between two builds of the extension (CPU only: no GPU needed).

A change meant for one build (a bench's A/B, a new template parameter) can move instructions in
others: bench/NOTES.md v34 saw two unused lambdas reorder the fused forward's loads in four builds.
This compares every function of the two binaries' sm_90 code (``bench/sass_load_order.py``'s
``functions``), matched by demangled name. Template arguments that a change appends with a default
(``--drop-arg 0`` drops a trailing ``, 0`` from every template argument list) and the anonymous
namespace's per-file hash are normalised away. Prints the counts of functions that are equal, that
differ, and that are only in one binary (with their names), and exits 1 if any matched function differs.

    python3 bench/sass_diff.py OLD.so|OLD.cubin NEW.so|NEW.cubin [--drop-arg 0] [--verbose]
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from sass_load_order import functions  # noqa: E402


def normalised(binary: str, drop_arg: str | None) -> dict[str, list[tuple[str, int]]]:
    """Demangled name -> [(instruction, control word)], addresses left out (a function's code is
    compared, not where it sits)."""
    out = {}
    for name, code in functions(binary):
        name = re.sub(r"_GLOBAL__N__[0-9a-f_]+", "", name)
        if drop_arg is not None:
            name = re.sub(rf", {re.escape(drop_arg)}>\(", ">(", name)
        out[name] = [(re.sub(r"\.text\.\S+", "", ins), ctrl) for _, ins, ctrl in code]
    return out


def short(name: str) -> str:
    """The kernel and its template arguments, without the parameter list or the anonymous namespace."""
    name = name.replace("(anonymous namespace)::", "")
    return name[: name.find(">(") + 1] if ">(" in name else name.split("(")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--drop-arg", help="drop this trailing template argument from every name (a new default)")
    parser.add_argument("--verbose", action="store_true", help="name every function that differs")
    args = parser.parse_args()
    old, new = normalised(args.old, args.drop_arg), normalised(args.new, args.drop_arg)
    both = [n for n in old if n in new]
    differ = [n for n in both if old[n] != new[n]]
    print(f"sass_diff: {len(both) - len(differ)} equal, {len(differ)} differ, {len(old) - len(both)} only in old, "
          f"{len(new) - len(both)} only in new")
    for n in differ if args.verbose else differ[:20]:
        print("DIFFER  ", short(n))
    for n in [n for n in new if n not in old]:
        print("NEW     ", short(n))
    for n in [n for n in old if n not in new]:
        print("GONE    ", short(n))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
