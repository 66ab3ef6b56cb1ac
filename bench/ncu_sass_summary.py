"""A short text summary of an Nsight Compute SASS table, so that a profile's evidence fits in
the repository (the table itself is ~5 MB a kernel).

    ncu --import rep.ncu-rep --page source --print-source sass --csv > rep.sass.csv
    python3 bench/ncu_sass_summary.py rep.sass.csv > rep.sass.txt

Prints, for each kernel of the table: warp instructions executed and warp stall samples in all,
then per opcode (instructions, samples, and the opcode's three largest stall reasons), then the
instructions with the most samples (address offset from the kernel's first instruction, the
instruction, its samples and executions).
"""

import collections
import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(name: str, header: list[str], rows: list[list[str]], top: int) -> None:
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_")]
    base = int(rows[0][col["Address"]], 16) if rows else 0
    by_op: dict[str, list] = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    total_instr = total_samples = 0.0
    for r in rows:
        words = [w for w in r[col["Source"]].split() if not w.startswith("@")]
        op = words[0].split(".")[0] if words else "?"
        instr = number(r[col["Instructions Executed"]])
        samples = number(r[col["Warp Stall Sampling (All Samples)"]])
        total_instr += instr
        total_samples += samples
        entry = by_op[op]
        entry[0] += instr
        entry[1] += samples
        for s in stalls:
            entry[2][s[6:]] += number(r[col[s]])
    print(f"## {name}")
    print(f"warp instructions executed {total_instr:.0f}, warp stall samples {total_samples:.0f}, "
          f"{len(rows)} SASS lines")
    print("| opcode | instructions | share | samples | share | top stalls |")
    print("|---|---|---|---|---|---|")
    for op, (instr, samples, reasons) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
        if instr == 0 and samples == 0:
            continue
        why = ", ".join(f"{k} {v:.0f}" for k, v in reasons.most_common(3) if v)
        print(f"| {op} | {instr:.0f} | {instr / max(total_instr, 1):.1%} | {samples:.0f} | "
              f"{samples / max(total_samples, 1):.1%} | {why} |")
    print(f"\ntop {top} instructions by samples (offset, instruction, samples, executed):")
    ranked = sorted(rows, key=lambda r: -number(r[col["Warp Stall Sampling (All Samples)"]]))[:top]
    for r in ranked:
        off = int(r[col["Address"]], 16) - base
        print(f"  {off:#07x}  {r[col['Source']].strip():60s} {number(r[col['Warp Stall Sampling (All Samples)']]):8.0f}"
              f" {number(r[col['Instructions Executed']]):10.0f}")
    print()


def main() -> None:
    top = 40
    with open(sys.argv[1], newline="") as f:
        reader = csv.reader(f)
        name, header, rows = None, None, []
        for line in reader:
            if not line:
                continue
            if line[0] == "Kernel Name":
                if name is not None and header is not None:
                    summarize(name, header, rows, top)
                name, header, rows = line[1], None, []
            elif line[0] == "Address":
                header = line
            elif header is not None:
                rows.append(line)
        if name is not None and header is not None:
            summarize(name, header, rows, top)


if __name__ == "__main__":
    main()
