"""EXPERIMENT (eighteenth session, call 1; needs call1_experiment.patch): the forward's fixed
cost and its block geometry. PolyNorm's forward (bf16, one-CTA rows) over a copy of the same
bytes, medians of triton.testing.do_bench in one run, under the experiment build's environment
switches (read at every launch): POLYNORM_EXP_FWD_BLOCK (block threads of one-CTA rows),
POLYNORM_EXP_FWD_SLOTS (at most that many blocks an SM, by padding shared memory). Each variant's y and rstd
must equal the table's bitwise (printed as `bits`).

    python3 bench/results/h200-2026-12-03/exp_fwd.py
"""

import os
import sys

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401

VARIANTS = {
    "f": {},
    "blk32": {"POLYNORM_EXP_FWD_BLOCK": "32"},
    "blk64": {"POLYNORM_EXP_FWD_BLOCK": "64"},
    "blk256": {"POLYNORM_EXP_FWD_BLOCK": "256"},
    "slot3": {"POLYNORM_EXP_FWD_SLOTS": "3"},
    "slot2": {"POLYNORM_EXP_FWD_SLOTS": "2"},
    "b64s6": {"POLYNORM_EXP_FWD_BLOCK": "64", "POLYNORM_EXP_FWD_SLOTS": "6"},
}
KEYS = ("POLYNORM_EXP_FWD_BLOCK", "POLYNORM_EXP_FWD_SLOTS")


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def setenv(env: dict) -> None:
    for k in KEYS:
        os.environ.pop(k, None)
    os.environ.update(env)


def main() -> None:
    dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.bfloat16
    shapes = [(e, H) for e in (2**24, 2**25, 2**26, 2**27, 2**28) for H in (512, 4096, 16384)]
    shapes += [(2**26, H) for H in (1024, 2048, 8192)]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype}; forward over a same-run copy")
    print(f"{'M*H':>10} {'M':>7} {'H':>6} {'copy':>7} " + " ".join(f"{v:>8}" for v in VARIANTS) + "  bits")
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    for elements, H in shapes:
        M = elements // H
        x = torch.randn(M, H, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        t_copy = bench(lambda: out.copy_(x))
        setenv({})
        y0, r0 = torch.ops.polynorm.forward(x, w, b, 1e-6)
        ratios, same = [], True
        for env in VARIANTS.values():
            setenv(env)
            y, r = torch.ops.polynorm.forward(x, w, b, 1e-6)
            same = same and torch.equal(y, y0) and torch.equal(r, r0)
            del y, r
            ratios.append(bench(lambda: torch.ops.polynorm.forward(x, w, b, 1e-6)) / t_copy)
        setenv({})
        print(f"{elements:>10} {M:>7} {H:>6} {t_copy * 1e3:>7.1f} " + " ".join(f"{r:>8.3f}" for r in ratios)
              + f"  {'same' if same else 'DIFFER'}", flush=True)
        del x, out, y0, r0
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
