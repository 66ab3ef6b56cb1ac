"""Rows split over thread-block clusters (sm_90): the CUDA row kernels' long-row path.

A row that needs more threads than one CTA of its build takes runs on a cluster of 2-16 CTAs
whose partial sums meet in distributed shared memory through mbarriers (csrc/launch_plan.h
``row_plan``, csrc/cuda/reduce.cuh ``cluster_row_reduce``). The plan's own cluster rows start at a
few thousand elements (bf16: the backward's 2 x 96 at 12288, the fused backward's at 6144, the
forward's 4 x 128 at 65536), so these tests run every op (PolyNorm, the fused PolyNorm x mul, the
grouped PolyNorm) and every layout (aligned, pack-realigned, same-phase, realigned) on clusters of
every size at those rows, against the float64 oracle with _matrix's dtype-derived tolerances,
every output poisoned first. tests/test_launch_plan.py runs every configuration of the plan.
"""

import dataclasses

import pytest
import torch
from _matrix import (
    assert_graph_replay_matches_eager,
    check_against_oracle,
    check_against_oracle_mul,
    make_params,
    make_rows,
    requires_cuda,
    run_backend,
    run_backend_mul,
    seed_for,
)

import polynorm

HAS_CLUSTERS = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
requires_clusters = pytest.mark.skipif(
    not HAS_CLUSTERS, reason="thread-block clusters need a CUDA device of compute capability 9.0 or later"
)
pytestmark = [requires_cuda, requires_clusters]

# bf16 rows (fp32 rows of half as many elements: the same packs; fp16 as bf16) that the plan puts
# on clusters, with the CTAs each op's row takes there (backward / forward), and whole packs or odd:
# 12288 2 x 96 / one CTA; 16385 (odd, same-phase) 2 x 128 / one CTA (narrow); 32768 4 x 128 / one
# CTA; 65536 8 x 128 / 4 x 128; 65537 (odd) 8 x 128 / 8 x 128 (narrow).
CLUSTER_ROWS = [12288, 16385, 32768, 65536, 65537]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rows_of(H: int, dtype) -> int:
    """The bf16 row H in dtype: the same packs (fp32: half the elements), odd rows kept odd."""
    return H if dtype != torch.float32 else H // 2 + H % 2


def plan_cluster(op: str, H: int, dtype) -> int:
    """The CTAs a row of the op takes (the plan must be the row kernels')."""
    text = torch.ops.polynorm._launch_plan(op, H, dtype)
    assert text.startswith("row "), (op, H, dtype, text)
    return int(dict(part.split("=", 1) for part in text.split()[1:])["cluster"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", CLUSTER_ROWS)
def test_polynorm_on_clusters(dtype, H):
    H = rows_of(H, dtype)
    assert plan_cluster("backward", H, dtype) > 1
    gen = torch.Generator().manual_seed(seed_for("clusters", dtype, H))
    x = make_rows(37, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(37, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend("cuda", x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"H={H}")
    # Deterministic, and the same bits for the same rows starting one element into a buffer
    # (the pack-realigned or realigned build on clusters).
    again = run_backend("cuda", x, g, w, b, 1e-6)
    x_mis = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view_as(x).copy_(x)
    moved = run_backend("cuda", x_mis, g, w, b, 1e-6)
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(out, name), getattr(again, name)), f"{name}: not deterministic"
        assert torch.equal(getattr(out, name), getattr(moved, name)), f"{name}: misaligned rows differ"


@pytest.mark.parametrize("H", CLUSTER_ROWS[:4])
def test_batch_invariance_on_clusters(H):
    gen = torch.Generator().manual_seed(seed_for("clusters-batch", H))
    big = make_rows(300, H, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    alone = polynorm.poly_norm(big[:1].clone(), w, b)
    for n in (2, 131, 300):
        assert torch.equal(polynorm.poly_norm(big[:n], w, b)[:1], alone), f"batch of {n}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H", [6144, 12288, 16387, 32768])
def test_fused_mul_on_clusters(dtype, H):
    # The fused backward's rows of clusters from bf16 6144 (2 x 96; 16387: its odd rows' tail plan,
    # 4 x 128), the fused forward's from 12288.
    H = rows_of(H, dtype)
    assert plan_cluster("mul_backward", H, dtype) > 1
    gen = torch.Generator().manual_seed(seed_for("clusters-mul", dtype, H))
    x = make_rows(21, H, dtype, "cuda", "contiguous", gen)
    mul = make_rows(21, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(21, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=f"H={H}")


@pytest.mark.parametrize("H,M", [(16384, 1024), (16385, 512), (65536, 1024), (131072, 512), (262144, 128)])
def test_the_tables_long_rows(H, M):
    # The table's own clusters (2-16 CTAs of 128 threads, longer rows' of 256; the backward at
    # 16384 and 16385 (same-phase) on 2 of 128, at 262144 on 16 of 256, where the device places
    # them, as an H200 does): each persistent cluster walks several rows, so both mbarriers of
    # cluster_row_reduce turn their phases over many times. Against the oracle, and the same bits
    # again.
    assert plan_cluster("backward", H, torch.bfloat16) > 1  # and the forward from 65536
    assert (plan_cluster("forward", H, torch.bfloat16) > 1) == (H > 32768)
    gen = torch.Generator().manual_seed(seed_for("clusters-long", H, M))
    x, g = (make_rows(M, H, torch.bfloat16, "cuda", "contiguous", gen) for _ in range(2))
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend("cuda", x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"H={H}")
    again = run_backend("cuda", x, g, w, b, 1e-6)
    for name in (f.name for f in dataclasses.fields(out)):
        assert torch.equal(getattr(out, name), getattr(again, name)), f"{name}: not deterministic"


def test_the_fused_ops_long_rows():
    # mul_backward at 131072 on the table's clusters of 16 CTAs of 256, mul_forward on 16 of 128:
    # against the oracle.
    H = 131072
    assert plan_cluster("mul_backward", H, torch.bfloat16) == 16 and plan_cluster("mul_forward", H, torch.bfloat16) == 16
    gen = torch.Generator().manual_seed(seed_for("clusters-long-mul", H))
    x, mul, g = (make_rows(96, H, torch.bfloat16, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=f"H={H}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("H", [12288, 16384])
def test_the_fused_forwards_rows_of_two_ctas(dtype, H):
    # The table's fused forward past 128 threads: two CTAs of at most 128 where they hold no more
    # threads than one (bf16 12288 / 16384: 2 x 96 / 2 x 128; fp32, half the elements a pack, past
    # 256 threads: 4 x 96 / 4 x 128), in a batch of rows that the persistent grid walks in several
    # rounds, against the oracle.
    text = torch.ops.polynorm._launch_plan("mul_forward", H, dtype)
    fields = dict(part.split("=", 1) for part in text.split()[1:])
    cluster, G = int(fields["cluster"]), int(fields["G"])
    assert (cluster, G) == ((2 if dtype == torch.bfloat16 else 4), H // 128 if H == 12288 else 128), text
    gen = torch.Generator().manual_seed(seed_for("clusters-mul-two", dtype, H))
    x, mul, g = (make_rows(1500, H, dtype, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=f"H={H} {dtype}")


@pytest.mark.parametrize("H", [16384, 65537])
def test_grouped_on_clusters(H):
    # Per-expert parameters on clusters (bf16 16384: the backward on 2 x 128; 65537: both directions),
    # an empty expert and rows of no expert included: the grouped op must equal the loop of
    # single-expert ops on the same clusters bitwise (the same reduction tree), and the oracle.
    from test_grouped import check_grouped, make_experts, offsets_of, run_grouped, run_loop

    assert plan_cluster("grouped_backward", H, torch.bfloat16) > 1
    counts = [5, 0, 9, 3]
    gen = torch.Generator().manual_seed(seed_for("clusters-grouped", H))
    x = make_rows(sum(counts) + 2, H, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(sum(counts) + 2, H, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_experts(len(counts), torch.float32, "cuda", gen)
    out = run_grouped("cuda", x, g, w, b, offsets_of(counts, "cuda"))
    check_grouped(out, x, g, w, b, counts, what=f"H={H}")
    loop = run_loop("cuda", x, g, w, b, counts)
    for name in ("y", "dx"):
        assert torch.equal(getattr(out, name), getattr(loop, name)), name


def test_cluster_capture_in_cuda_graph():
    # Cluster launches (cudaLaunchKernelEx) are capturable, and replay gives the eager bits.
    H = 65536
    gen = torch.Generator().manual_seed(seed_for("clusters-graph"))
    x = make_rows(64, H, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(64, H, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    assert plan_cluster("forward", H, torch.bfloat16) > 1 and plan_cluster("backward", H, torch.bfloat16) > 1
    assert_graph_replay_matches_eager(x, g, w, b, lambda: make_rows(64, H, torch.bfloat16, "cuda", "contiguous", gen))
