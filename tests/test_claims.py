"""Rows claimed at run time (csrc/cuda/args.cuh ``RowClaims``): the CUDA row kernels' blocks of a
persistent grid taking their next rows from a counter, ``torch.ops.polynorm._tune_rows(claims=True)``.

A claim must never change a row's bits: y, rstd and grad_x equal the table's grid bitwise; dW
and dB are summed one partial a claimed chunk in a fixed order, so they are bitwise the same
run after run (another order than the table's grid: within the oracle's tolerance of it). The
counter goes back to zero after every launch, or the next launch would skip rows (poisoned
outputs show it). Every output checked against the float64 oracle with _matrix's
dtype-derived tolerances.
"""

import pytest
import torch
from _matrix import (
    assert_graph_replay_matches_eager,
    check_against_oracle,
    check_against_oracle_mul,
    make_params,
    make_rows,
    poisoned_outputs,
    requires_cuda,
    run_backend,
    run_backend_mul,
    seed_for,
)

pytestmark = requires_cuda


@pytest.fixture
def claims():
    """Rows claimed at run time on a grid of `waves` blocks a resident slot, for one test."""

    def tune(waves: int = 1) -> None:
        torch.ops.polynorm._tune_rows(grid_waves=waves, claims=True)

    yield tune
    torch.ops.polynorm._tune_rows()


# (M, H): rows of 16 threads (16 a block) and of 64 (4 a block), odd H (the realigning and
# narrow builds), and M past 8 claims a block of an H200 (K > 1 row groups a claim).
SHAPES = [(1, 4096), (37, 1024), (999, 4096), (20000, 4096), (3001, 5125), (4099, 3000), (70000, 512)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M,H", SHAPES)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
def test_polynorm_with_claims(claims, dtype, M, H, layout):
    gen = torch.Generator().manual_seed(seed_for("claims", dtype, M, H, layout))
    x = make_rows(M, H, dtype, "cuda", layout, gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    table = run_backend("cuda", x, g, w, b, 1e-6)
    for waves in (1, 2):
        claims(waves)
        out = run_backend("cuda", x, g, w, b, 1e-6)
        again = run_backend("cuda", x, g, w, b, 1e-6)
        check_against_oracle(out, x, g, w, b, 1e-6, what=f"claims, {waves} waves, {layout}")
        for name in ("y", "dx"):
            assert torch.equal(getattr(out, name), getattr(table, name)), f"{name}: a claim changed a row's bits"
        for name in ("dw", "db"):
            assert torch.equal(getattr(out, name), getattr(again, name)), f"{name}: not deterministic"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("M,H", [(37, 1024), (20000, 4096), (3001, 5125)])
def test_fused_mul_with_claims(claims, dtype, M, H):
    gen = torch.Generator().manual_seed(seed_for("claims-mul", dtype, M, H))
    x = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    mul = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    table = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    claims()
    out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    again = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what="claims")
    for name in ("out", "dx", "dmul"):
        assert torch.equal(getattr(out, name), getattr(table, name)), f"{name}: a claim changed a row's bits"
    for name in ("dw", "db"):
        assert torch.equal(getattr(out, name), getattr(again, name)), f"{name}: not deterministic"


def test_grouped_with_claims(claims):
    # The grouped op's dW and dB come from its rows' terms, not the partials: every output
    # equals the table's grid bitwise.
    from test_grouped import check_grouped, make_experts, offsets_of, run_grouped

    counts = [700, 0, 1500, 3, 900]
    gen = torch.Generator().manual_seed(seed_for("claims-grouped"))
    x = make_rows(sum(counts) + 5, 2048, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(sum(counts) + 5, 2048, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_experts(len(counts), torch.float32, "cuda", gen)
    table = run_grouped("cuda", x, g, w, b, offsets_of(counts, "cuda"))
    claims()
    out = run_grouped("cuda", x, g, w, b, offsets_of(counts, "cuda"))
    check_grouped(out, x, g, w, b, counts, what="claims")
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(out, name), getattr(table, name)), name


def test_counter_back_to_zero_after_every_launch(claims):
    # Launches of other sizes one after another on one stream: each must see its counter at
    # zero (a claim left over would skip rows of the next launch; its outputs start as NaN).
    gen = torch.Generator().manual_seed(seed_for("claims-counter"))
    w, b = make_params(torch.float32, "cuda", gen)
    cases = []
    for M in (3, 5000, 1, 777, 20000, 64):
        x = make_rows(M, 2048, torch.bfloat16, "cuda", "contiguous", gen)
        g = make_rows(M, 2048, torch.bfloat16, "cuda", "contiguous", gen)
        y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
        cases.append((x, g, y, torch.ops.polynorm.backward(g, x, w, rstd)))
    claims()
    with poisoned_outputs():
        for _ in range(3):
            for x, g, y, grads in cases:
                y_c, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
                dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
                assert torch.equal(y_c, y) and torch.equal(dx, grads[0])
                torch.testing.assert_close(dw, grads[1], rtol=1e-3, atol=1e-3)
                torch.testing.assert_close(db, grads[2], rtol=1e-3, atol=1e-3)


def test_claims_capture_in_cuda_graph(claims):
    # A captured launch takes a counter of its own; replay gives the eager bits.
    claims()
    gen = torch.Generator().manual_seed(seed_for("claims-graph"))
    x = make_rows(3000, 4096, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(3000, 4096, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    assert_graph_replay_matches_eager(x, g, w, b, lambda: make_rows(3000, 4096, torch.bfloat16, "cuda", "contiguous", gen))
