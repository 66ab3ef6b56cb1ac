"""EXPERIMENT (eighteenth session, call 2; needs call2_experiment.patch): a grid of a block per R
rows with its first wave started in quarters (POLYNORM_EXP_WAVE_STAGGER=cycles), forward and
backward; and the backward's sum kernel (POLYNORM_EXP_SUM: 0 the table's, 1 the batched loads of
next_sum_loads.patch on 1024 threads, 2 the same on 256), against the last block's sum on the
persistent grid (`a0`, _tune_rows(sum_apart=0)). bf16 at M·H = 2^26 (and 2^25 for two forward
rows); kernel time over a copy (forward), an add (backward) or an add (the fused forward: read
two, write one) of the same bytes, medians of triton.testing.do_bench in one run. `bits`: every
variant's outputs equal the table's bitwise (dW / dB only where the sum's order is the table's:
not for `sum2` nor `a0`, whose dW / dB are another order's).

    python3 bench/results/h200-2026-12-03/exp2.py
"""

import os

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401

KEYS = ("POLYNORM_EXP_WAVE_STAGGER", "POLYNORM_EXP_SUM")
FWD = {"f": {}, "s750": {"POLYNORM_EXP_WAVE_STAGGER": "750"}, "s1500": {"POLYNORM_EXP_WAVE_STAGGER": "1500"},
       "s3000": {"POLYNORM_EXP_WAVE_STAGGER": "3000"}}
BWD = {"b": {}, "sum1": {"POLYNORM_EXP_SUM": "1"}, "sum2": {"POLYNORM_EXP_SUM": "2"}, "a0": None,
       "s750": {"POLYNORM_EXP_WAVE_STAGGER": "750"}, "s1500": {"POLYNORM_EXP_WAVE_STAGGER": "1500"},
       "s3000": {"POLYNORM_EXP_WAVE_STAGGER": "3000"}}
SAME_DW = {"b", "sum1", "s750", "s1500", "s3000"}


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def setenv(env) -> None:
    for k in KEYS:
        os.environ.pop(k, None)
    os.environ.update(env or {})


def main() -> None:
    dev = "cuda"
    w = torch.tensor([0.3, -0.5, 0.8], device=dev)
    b = torch.tensor([0.1], device=dev)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bfloat16")
    print("# forward over a copy (mf: the fused forward over an add)")
    print(f"{'op':>4} {'M*H':>10} {'H':>6} {'floor':>7} " + " ".join(f"{v:>7}" for v in FWD) + "  bits")
    shapes = [("f", 2**26, H) for H in (512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [("f", 2**25, 4096), ("f", 2**25, 16384), ("mf", 2**26, 4096), ("mf", 2**26, 8192)]
    for op, elements, H in shapes:
        x = torch.randn(elements // H, H, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(x)
        if op == "f":
            floor = bench(lambda: out.copy_(x))
            run = lambda: torch.ops.polynorm.forward(x, w, b, 1e-6)  # noqa: E731
        else:
            m = torch.randn_like(x)
            floor = bench(lambda: torch.add(x, m, out=out))
            run = lambda: torch.ops.polynorm.mul_forward(x, m, w, b, 1e-6)  # noqa: E731
        setenv(None)
        ref = run()
        ratios, same = [], True
        for env in FWD.values():
            setenv(env)
            got = run()
            same = same and all(torch.equal(a, r) for a, r in zip(got, ref))
            del got
            ratios.append(bench(run) / floor)
        setenv(None)
        print(f"{op:>4} {elements:>10} {H:>6} {floor * 1e3:>7.1f} " + " ".join(f"{r:>7.3f}" for r in ratios)
              + f"  {'same' if same else 'DIFFER'}", flush=True)
        del x, out, ref
        torch.cuda.empty_cache()
    print("# backward over an add")
    print(f"{'M*H':>10} {'H':>6} {'floor':>7} " + " ".join(f"{v:>7}" for v in BWD) + "  bits")
    for H in (512, 1024, 2048, 4096, 8192, 16384, 65536):
        x = torch.randn(2**26 // H, H, device=dev, dtype=torch.bfloat16)
        g = torch.randn_like(x)
        out = torch.empty_like(x)
        floor = bench(lambda: torch.add(x, g, out=out))
        _, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        run = lambda: torch.ops.polynorm.backward(g, x, w, rstd)  # noqa: E731
        setenv(None)
        ref = run()
        ratios, same = [], True
        for name, env in BWD.items():
            setenv(env)
            if env is None:
                torch.ops.polynorm._tune_rows(sum_apart=0)
            got = run()
            same = same and torch.equal(got[0], ref[0])
            if name in SAME_DW:
                same = same and torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
            else:
                same = same and all(torch.allclose(a, r, rtol=1e-3, atol=1e-3 * float(r.abs().max())) for a, r in zip(got[1:], ref[1:]))
            del got
            ratios.append(bench(run) / floor)
            torch.ops.polynorm._tune_rows()
        setenv(None)
        print(f"{2**26:>10} {H:>6} {floor * 1e3:>7.1f} " + " ".join(f"{r:>7.3f}" for r in ratios)
              + f"  {'same' if same else 'DIFFER'}", flush=True)
        del x, g, out, ref, rstd
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
