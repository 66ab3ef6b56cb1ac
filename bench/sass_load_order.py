"""Checks, from the built extension's SASS, that the row kernels issue every row load before the
first instruction that waits for one (CPU only: no GPU needed).

A row kernel holds its row in registers: it issues all of a row's 16-byte loads (LDG.E.128), then
waits for them and computes. Where ptxas sinks one of those loads below an instruction that
waits on the earlier ones, every row costs a second memory round trip, with the same registers
and no spill reported by ptxas. Code that never runs on the row path can cause it: more live
registers in the backward's inlined last-block sum (reduce.cuh, finish_param_grads) can move the
row loop's last grad_y load below the first math of the bf16 and fp16 backward kernels.

For every non-grouped row kernel of the sm_90 code (ARCH; ``poly_norm_fwd_row_kernel`` and
``poly_norm_bwd_row_kernel`` of every layout: aligned, realigned, same-phase, pack-realigned, as a
view's rows run the realigning builds), in address order: the scoreboards that 16-byte loads set
are tracked from the first such load; the first later instruction that waits on one of them starts
the row's math; any further 16-byte load before the row's first 16-byte store (STG.E.128) is a late
load. (The last block's partial sums load after the stores, with .STRONG.GPU: not row loads, and
past the window anyway.) Exit status 1 when a kernel not in KNOWN_LATE has a late load, or when a
kernel in KNOWN_LATE no longer has one (then the list is to be trimmed).
tests/test_sass_load_order.py runs this check wherever the extension is built with its CUDA
objects (CI too).

Needs ``cuobjdump`` and ``nvdisasm`` (the CUDA toolkit's, or the pip packages
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``: this script also looks in
site-packages/nvidia/cu*/bin) and ``c++filt``.

    python3 bench/sass_load_order.py [polynorm/_C*.so or a .o ...] [--verbose]
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

# The architecture checked: the H200's, where the kernels are measured and tuned (bench/results/).
# A build for sm_80 as well (the default TORCH_CUDA_ARCH_LIST, 8.0;9.0) has sm_80 code that is
# never timed: its bf16 and fp16 backward (8 and 7 packs) have 1-4 late loads there.
ARCH = "sm_90"

# Kernels with late row loads, as (direction, scalar type, packs, layout, fused): fp64 PolyNorm
# backward at 8 packs, aligned, issues the last pack of x and of grad_y after the sums of the first
# pack begin (fp64 speed is not a target; the 7-pack fp64 build has none).
KNOWN_LATE = {("bwd", "double", "8", "0", "false")}

KERNEL = re.compile(r"poly_norm_(fwd|bwd)_row_kernel<(.*)>\(")
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/\s*$")
CTRL = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/\s*$")


def find_tool(name: str) -> str | None:
    """A CUDA binary tool: on PATH, in CUDA_HOME/bin, or from its pip package (site-packages/nvidia/cu*/bin)."""
    path = shutil.which(name)
    if path:
        return path
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)]
    candidates += sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*", "bin", name)))
    return next((c for c in candidates if os.path.exists(c)), None)


def find_cuobjdump() -> tuple[str, dict]:
    """cuobjdump, and the environment to run it in: cuobjdump -sass runs nvdisasm, found on PATH."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        sys.exit("sass_load_order: cuobjdump and nvdisasm not found (pip install nvidia-cuda-cuobjdump "
                 "nvidia-cuda-nvdisasm, or the CUDA toolkit's)")
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    return cuobjdump, env


def functions(binary: str, arch: str = ARCH):
    """(demangled name, [(address, instruction, control word)]) for each function of the binary's
    ``arch`` code (its cubins for that architecture)."""
    cuobjdump, env = find_cuobjdump()
    text = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True, check=True, env=env).stdout
    sections = re.split(r"\n\s*code for (sm_\w+)\s*\n", text)
    names, bodies = [], []
    for code_arch, section in zip(sections[1::2], sections[2::2]):
        if code_arch != arch:
            continue
        chunks = re.split(r"\n\s+Function : (\S+)\n", section)
        names += chunks[1::2]
        bodies += chunks[2::2]
    if not names:
        return
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    for name, body in zip(demangled, bodies):
        lines = body.split("\n")
        code = []
        for i, line in enumerate(lines):
            m = INSTR.match(line)
            if m and i + 1 < len(lines):
                c = CTRL.match(lines[i + 1])
                if c:
                    code.append((int(m.group(1), 16), m.group(2), int(c.group(1), 16)))
        yield name, code


def scoreboards(ctrl: int) -> tuple[int, int]:
    """(the scoreboard an instruction's result sets, 7 for none; the mask of scoreboards it waits on),
    from the control bits of the instruction's second 64-bit word (Volta and later)."""
    bits = ctrl >> 41
    return (bits >> 5) & 7, (bits >> 11) & 0x3F


def late_loads(code) -> tuple[int, list[str]]:
    """Row loads issued before the first wait on them, and the late ones (as text)."""
    row_sbs = 0
    started = False
    early, late = 0, []
    for addr, ins, ctrl in code:
        write_sb, wait_mask = scoreboards(ctrl)
        is_row_load = "LDG.E.128" in ins and ".STRONG" not in ins
        if started and "STG.E.128" in ins:
            break
        if not started and row_sbs and (wait_mask & row_sbs):
            started = True
        if is_row_load:
            if started:
                late.append(f"{addr:05x} {ins}")
            else:
                early += 1
                if write_sb != 7:
                    row_sbs |= 1 << write_sb
    return early, late


def check(binaries, verbose: bool = False) -> tuple[int, list[str]]:
    """(row kernels checked, problems): a kernel with late row loads not in KNOWN_LATE, or one in
    KNOWN_LATE without them."""
    checked, problems = 0, []
    for binary in binaries:
        for name, code in functions(binary):
            m = KERNEL.search(name)
            if not m:
                continue
            targs = [a.strip() for a in m.group(2).split(",")]
            layout, grouped = targs[2], targs[5]
            if grouped != "false":
                continue
            early, late = late_loads(code)
            checked += 1
            key = (m.group(1), targs[0], targs[1], layout, targs[4])
            what = f"{m.group(1)} <{', '.join(targs)}>: {early} row loads before the first wait"
            if late and key not in KNOWN_LATE:
                problems.append(f"LATE  {what}, {len(late)} after it: " + "; ".join(late))
            elif not late and key in KNOWN_LATE:
                problems.append(f"NOW EARLY  {what}: in KNOWN_LATE, no late load any more")
            if verbose:
                print(f"{'late' if late else 'ok'}    {what}" + (f", {len(late)} after it (known)" if late else ""))
    return checked, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binaries", nargs="*", help="default: polynorm/_C*.so")
    parser.add_argument("--verbose", action="store_true", help="every kernel, not only those with late loads")
    args = parser.parse_args()
    binaries = args.binaries or sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "polynorm", "_C*.so")))
    if not binaries:
        sys.exit("sass_load_order: no binary given and no polynorm/_C*.so built")
    checked, problems = check(binaries, args.verbose)
    if checked == 0:
        sys.exit("sass_load_order: no row kernel found")
    for p in problems:
        print(p)
    print(f"sass_load_order: {checked} row kernels, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
