"""The forward's and backward's ratios against the grid's last wave (eighteenth session, call 5;
the committed table, no patch). A grid of a block per R rows holds `resident` blocks at once (132
SMs x 4 blocks of 128 threads for the wide builds on an H200); its last wave is full when the
blocks are a multiple of that. Each H is timed at M giving 7.5 to 8.5 waves, so that a cost that
follows the last wave's fill (the drain) shows as a saw, and one that does not as a flat line.
Kernel over a same-run copy (forward) / add (backward), medians of triton.testing.do_bench.

    python3 bench/results/h200-2026-12-03/exp_waves.py
"""

import torch
from triton.testing import do_bench

import polynorm  # noqa: F401


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def main() -> None:
    w = torch.tensor([0.3, -0.5, 0.8], device="cuda")
    b = torch.tensor([0.1], device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    wave_rows = {512: 4 * sms * 32, 4096: 4 * sms * 4, 16384: 4 * sms}  # rows a full wave: 4 blocks an SM
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; {sms} SMs")
    print(f"{'H':>6} {'M':>7} {'waves':>6} {'copy':>7} {'fwd/x':>6} {'add':>7} {'bwd/x':>6}")
    for H, rows in wave_rows.items():
        for waves in (7.5, 7.75, 8.0, 8.05, 8.25, 8.5):
            M = int(rows * waves)
            x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
            g = torch.randn_like(x)
            out = torch.empty_like(x)
            t_copy = bench(lambda: out.copy_(x))
            t_add = bench(lambda: torch.add(x, g, out=out))
            _, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
            t_f = bench(lambda: torch.ops.polynorm.forward(x, w, b, 1e-6))
            t_b = bench(lambda: torch.ops.polynorm.backward(g, x, w, rstd))
            print(f"{H:>6} {M:>7} {waves:>6.2f} {t_copy * 1e3:>7.1f} {t_f / t_copy:>6.3f} {t_add * 1e3:>7.1f} "
                  f"{t_b / t_add:>6.3f}", flush=True)
            del x, g, out, rstd
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
