"""The CUDA kernels compiled into the extension, per architecture, against those the launch plan can
reach (CPU only: no GPU needed).

The plan's whole space comes from ``torch.ops.polynorm._plan_space`` (the first H of every run of
rows that the plan serves alike) and ``_launch_plan`` (the kernel, the stage's fallback kernel and
the grid's sizing kernel of each), over every op (PolyNorm's, the fused op's, the grouped op's),
dtype, layout (aligned, pack-realigned, same-phase, realigned) and device (with clusters and
without), up to the rows that only the tiled kernels serve; beside them, the backward's helper
kernels (the dW / dB partials' sum, the grouped op's per-expert sums). Prints each architecture's
kernels (with ``--verbose``, every name) and exits 1 if a compiled kernel is not reachable, or if a
reachable one is not compiled (a launch would fail). tests/test_launch_plan.py runs it wherever the
extension has its CUDA objects.

Needs ``cuobjdump`` and ``nvdisasm`` (bench/sass_load_order.py says where they are found) and
``c++filt``.

    python3 bench/instantiations.py [polynorm/_C*.so] [--verbose]
"""

import argparse
import collections
import glob
import os
import re
import subprocess
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this tree's polynorm (an in-place build) before an installed one

OPS = ("forward", "backward", "mul_forward", "mul_backward", "grouped_forward", "grouped_backward")
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
LAYOUTS = ("aligned", "pack-realigned", "same-phase", "realigned")
# row_lanes.cuh's RowLayout, as the row kernels' third template argument prints in a demangled name.
ROW_BUILDS = ("kAligned", "kRealigned", "kSamePhase", "kPackRealigned", "kAlignedStaged", "kSamePhaseTail",
              "kRealignedTail")
# Kernels beside the plan's: the backward's dW / dB sum apart (reduce.cuh, param_sum_kernel) and
# grouped_backward's per-expert sums (cuda/backward.cu), for float and double accumulators; the
# empty kernel whose attributes tell which architecture's code runs (launch_common.cuh).
HELPERS = {f"{k}<{t}>" for k in ("param_sum_kernel", "poly_norm_grouped_param_kernel") for t in ("float", "double")}
HELPERS.add("arch_probe_kernel")
# Tensor parallelism's sharded passes (cuda/sharded.cu), outside the row plan: each dtype with
# its accumulator, 16-byte packs where every row is aligned (kVec = 16 / element size) or one
# element a lane, and the fused op's mul (kMul) where a pass reads it.
SHARDED_TYPES = (("c10::BFloat16", "float", 8), ("c10::Half", "float", 8), ("float", "float", 4), ("double", "double", 2))
SHARDED = set()
for _s, _a, _vec in SHARDED_TYPES:
    for _v in (1, _vec):
        SHARDED.add(f"poly_norm_sharded_fwd_stats_kernel<{_s},{_a},{_v}>")
        for _k in ("fwd_apply", "bwd_stats", "bwd_apply"):
            SHARDED.update(f"poly_norm_sharded_{_k}_kernel<{_s},{_a},{_v},{_m}>" for _m in ("false", "true"))


def fields(text: str) -> dict:
    """A plan's ``key=value`` fields (numbers as int), and its family under ``family``."""
    out = {k: int(v) if v.isdigit() else v for k, v in re.findall(r"(\w+)=(\S+)", text)}
    out["family"] = text.split()[0]
    return out


def plan_space(ops=OPS, dtypes=DTYPES, layouts=LAYOUTS, clusters=(True, False)):
    """Every run of rows the plan serves alike: dicts of op, dtype, layout, clusters, its first H
    and the plan's words (``plan``) and fields."""
    space = []
    for op in ops:
        for dtype in dtypes:
            for layout in layouts:
                for with_clusters in clusters:
                    for H in torch.ops.polynorm._plan_space(op, dtype, layout, with_clusters):
                        text = torch.ops.polynorm._launch_plan(op, H, dtype, layout, with_clusters)
                        space.append(dict(op=op, dtype=dtype, layout=layout, clusters=with_clusters, H=H, plan=text,
                                          fields=fields(text)))
    return space


def config_key(entry: dict) -> tuple:
    """What makes a configuration distinct: the op, dtype and layout, the kernel (its family, build,
    packs and template), the cluster, several rows a block or one, a tail or none, one pass or two
    (tiled). Not the exact threads or tail length, which only scale the same code."""
    f = entry["fields"]
    several_rows = f["family"] == "row" and f["threads"] > f["G"]
    return (entry["op"], str(entry["dtype"]), entry["layout"], f["family"], f.get("build"), f.get("packs"),
            f["kernel"], f.get("cluster"), several_rows, "tail" in f, f.get("passes"))


def configs(space=None) -> dict:
    """config_key -> the entry of its shortest row (its representative)."""
    out = {}
    for entry in sorted(space if space is not None else plan_space(), key=lambda e: e["H"]):
        out.setdefault(config_key(entry), entry)
    return out


def reachable(space=None) -> set:
    """The kernels the plan launches or sizes grids by, and the helpers, as normalised names."""
    names = set(HELPERS) | SHARDED
    for entry in space if space is not None else plan_space():
        for key in ("kernel", "fallback", "sized_by"):
            if key in entry["fields"]:
                names.add(entry["fields"][key])
    return names


def normalised(demangled: str) -> str:
    """A demangled kernel name as _launch_plan writes it: no namespace, no spaces, no parameter
    list, the row kernels' build by name (``poly_norm_fwd_row_kernel<c10::BFloat16,7,kSamePhase,...>``)."""
    name = demangled.replace("(anonymous namespace)::", "").replace("polynorm::", "")
    name = name.split(">(")[0] + ">" if ">(" in name else name.split("(")[0]
    name = re.sub(r"^void ", "", name).replace(" ", "")
    m = re.match(r"(poly_norm_(?:fwd|bwd)_row_kernel)<([^,]+),(\d+),(\d+),(.*)>$", name)
    if m:
        name = f"{m.group(1)}<{m.group(2)},{m.group(3)},{ROW_BUILDS[int(m.group(4))]},{m.group(5)}>"
    return name


def compiled(binary: str) -> dict:
    """{architecture: [normalised kernel names]} of the binary's CUDA code."""
    from sass_load_order import find_cuobjdump

    cuobjdump, env = find_cuobjdump()
    text = subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True, check=True, env=env).stdout
    sections = re.split(r"\n\s*code for (sm_\w+)\s*\n", text)
    mangled = collections.defaultdict(list)
    for arch, section in zip(sections[1::2], sections[2::2]):
        mangled[arch] += re.findall(r"\n\s+Function : (\S+)\n", section)
    out = {}
    for arch, names in sorted(mangled.items()):
        demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                                   check=True).stdout.split("\n")
        out[arch] = sorted(normalised(n) for n in demangled[: len(names)])
    return out


def check(binary: str, verbose: bool = False) -> list[str]:
    """Problems: a compiled kernel the plan does not reach, a reachable one not compiled."""
    want = reachable()
    problems = []
    for arch, names in compiled(binary).items():
        have = set(names)
        kinds = collections.Counter(n.split("<")[0] for n in names)
        print(f"{arch}: {len(names)} kernels ({len(have)} distinct): "
              + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        if verbose:
            for n in names:
                print(f"  {n}")
        problems += [f"{arch}: not reachable from the plan: {n}" for n in sorted(have - want)]
        problems += [f"{arch}: reachable but not compiled: {n}" for n in sorted(want - have)]
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", help="default: polynorm/_C*.so")
    parser.add_argument("--verbose", action="store_true", help="every kernel's name")
    args = parser.parse_args()
    binary = args.binary or next(iter(sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "polynorm",
                                                                      "_C*.so")))), None)
    if binary is None:
        sys.exit("instantiations: no binary given and no polynorm/_C*.so built")
    import polynorm  # noqa: F401  (registers the ops)

    problems = check(binary, args.verbose)
    for p in problems:
        print(p)
    print(f"instantiations: {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
