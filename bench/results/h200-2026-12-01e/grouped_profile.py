#!/usr/bin/env python3
"""A short workload for ncu: the single-expert forward and backward, then the grouped ones, on
grouped_timing.py's inputs at one (M, H, E) (default 16384 4096 64), each once after a warm-up.

    ncu -k regex:row_kernel -c 4 python3 grouped_profile.py 16384 4096 64
profiles, in order: single forward, single backward, grouped forward, grouped backward.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from grouped_timing import EPS, make_case  # noqa: E402

import polynorm  # noqa: E402,F401

ops = torch.ops.polynorm


def main():
    M, H, E = (int(v) for v in (sys.argv[1:4] if len(sys.argv) > 3 else (16384, 4096, 64)))
    c = make_case(M, H, E, torch.device("cuda"), seed=0)
    x, g, w, b, off = c["x"], c["g"], c["w"], c["b"], c["offsets"]
    _, r1 = ops.forward(x, w[0], b[0:1], EPS)
    ops.backward(g, x, w[0], r1)
    _, rg = ops.grouped_forward(x, w, b, off, EPS)
    ops.grouped_backward(g, x, w, off, rg)
    torch.cuda.synchronize()
    # Profiled (after the warm-up's four row kernels: ncu --launch-skip 4).
    ops.forward(x, w[0], b[0:1], EPS)
    ops.backward(g, x, w[0], r1)
    ops.grouped_forward(x, w, b, off, EPS)
    ops.grouped_backward(g, x, w, off, rg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
