"""Staged rows: the CUDA row kernels with the next row copied to shared memory (kStage).

PolyNorm's row kernels of aligned rows in CTAs of up to 256 threads copy the next row's packs to shared memory (``cp.async``, two
buffers) while the current row is reduced and stored (csrc/cuda/packs.cuh ``stage_row``);
``torch.ops.polynorm._tune_rows(stage=False)`` keeps the rows in registers only.
Each thread holds the same packs in the same order as without staging, so the results must
be the unstaged kernels' bits, and the float64 oracle's within _matrix's tolerances. The
shapes reach one CTA a row (several rows a block, one row a block) and a cluster of two
(the backward at H = 16384), with M past one wave of the persistent grid.
"""

import pytest
import torch
from _matrix import check_against_oracle, make_params, make_rows, requires_cuda, run_backend, seed_for

pytestmark = requires_cuda

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (M, H): short rows of 8-16 rows a block, rows of one block, 256-thread rows, a cluster row
# (backward, 2-byte), and M = 1.
SHAPES = [(4099, 64), (3001, 1024), (2500, 4096), (700, 8192), (130, 16384), (1, 4096)]


def fields(op: str, H: int, dtype) -> str:
    return torch.ops.polynorm._launch_plan(op, H, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,H", SHAPES)
def test_staged_rows_give_the_unstaged_bits(dtype, M, H):
    gen = torch.Generator().manual_seed(seed_for("staged", dtype, M, H))
    x = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    staged_ops = [op for op in ("forward", "backward") if "stage=1" in fields(op, H, dtype)]
    out = run_backend("cuda", x, g, w, b, 1e-6)  # the table's plan: staged where it can be
    torch.ops.polynorm._tune_rows(stage=False)
    try:
        assert not any("stage=1" in fields(op, H, dtype) for op in ("forward", "backward"))
        plain = run_backend("cuda", x, g, w, b, 1e-6)
    finally:
        torch.ops.polynorm._tune_rows()
    # Staging reaches every plan of up to 256 threads a CTA (so some op at every shape here).
    for op in ("forward", "backward"):
        threads = int(fields(op, H, dtype).split("threads=")[1].split()[0])
        assert (op in staged_ops) == (threads <= 256), (op, fields(op, H, dtype))
    assert staged_ops, (fields("forward", H, dtype), fields("backward", H, dtype))
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"staged M={M} H={H}")
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(out, name), getattr(plain, name)), f"{name}: staged rows differ from unstaged"


def test_staged_rows_skip_what_they_cannot_serve():
    # Misaligned rows and the fused op keep their own builds; the plan says so.
    assert "stage=1" not in fields("mul_forward", 4096, torch.bfloat16)
    assert "stage=1" not in fields("mul_backward", 4096, torch.bfloat16)
    assert "stage=1" not in fields("forward", 65536, torch.bfloat16)  # clusters of 512-thread CTAs
    gen = torch.Generator().manual_seed(seed_for("staged-misaligned"))
    x = make_rows(300, 4096, torch.bfloat16, "cuda", "misaligned", gen)
    g = make_rows(300, 4096, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend("cuda", x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what="staged tuning, misaligned rows")
