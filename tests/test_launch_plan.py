"""The CUDA launch plan (csrc/launch_plan.h), computed on the host: no GPU needed.

``torch.ops.polynorm._launch_plan(op, H, dtype)`` says which kernel family serves a row and
with what geometry; ``_force_kernel(kind)`` makes every later CUDA launch take another family
where it can (the benchmarks' and the GPU tests' switch). These tests pin the table's
boundaries, that the choice never depends on the batch (the op has no M), and the switch.
"""

import re

import pytest
import torch

import polynorm  # noqa: F401  (registers the ops)

plan = torch.ops.polynorm._launch_plan
force = torch.ops.polynorm._force_kernel

# (op, dtype, the longest row the row kernels hold): 1024 threads x packs x elements a pack.
ROW_LIMITS = [
    ("forward", torch.bfloat16, 1024 * 8 * 8),
    ("forward", torch.float32, 1024 * 8 * 4),
    ("forward", torch.float64, 1024 * 8 * 2),
    ("backward", torch.bfloat16, 1024 * 4 * 8),
    ("backward", torch.float16, 1024 * 4 * 8),
    ("backward", torch.float32, 1024 * 4 * 4),
    ("mul_forward", torch.bfloat16, 1024 * 4 * 8),
    ("mul_backward", torch.bfloat16, 1024 * 2 * 8),
    ("mul_backward", torch.float64, 1024 * 2 * 2),
]


def fields(text: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}


@pytest.mark.parametrize("op,dtype,limit", ROW_LIMITS)
def test_row_kernels_hold_rows_up_to_their_register_budget(op, dtype, limit):
    elem = torch.finfo(dtype).bits // 8
    for H in (1, 3, 769, limit // 3, limit - 1, limit):
        text = plan(op, H, dtype)
        assert text.startswith("row "), (op, dtype, H, text)
        f = fields(text)
        packs = -(-H * elem // 16)
        G = f["G"]
        need = -(-packs // f["packs"])  # threads that cover the row
        assert G >= need, (H, text)
        if need <= 32:  # the smallest power of two: several rows a warp
            assert G & (G - 1) == 0 and (G == 1 or G // 2 < need), (H, text)
        else:  # the smallest multiple of 32
            assert G % 32 == 0 and G - 32 < need, (H, text)
        # 128-thread blocks of several rows where G divides 128, else one row a block
        assert f["threads"] == (128 if 128 % G == 0 else G), (H, text)
    longer = plan(op, limit + 1, dtype)
    assert not longer.startswith("row "), (op, dtype, longer)
    if op.startswith("mul_"):
        assert longer.startswith("tiled "), longer  # the fused op has no staged build


def test_long_rows_go_staged_while_a_stage_fits_then_tiled():
    assert plan("forward", 65537, torch.bfloat16).startswith("staged ")
    # A one-row stage of two inputs with H = 2^20 bf16 needs 4 MB: no shared memory holds it.
    assert plan("backward", 1 << 20, torch.bfloat16).startswith("tiled ")
    # With no shared memory at all, nothing is staged.
    assert plan("forward", 65537, torch.bfloat16, smem_limit=0).startswith("tiled ")
    f = fields(plan("forward", 65537, torch.bfloat16))
    assert f["smem"] <= 207872 and 1 <= f["buffers"] <= 3


@pytest.mark.parametrize("kind", ["row", "staged", "tiled"])
def test_force_kernel_picks_a_family_where_it_can_serve(kind):
    try:
        force(kind)
        assert plan("forward", 4096, torch.bfloat16).startswith(kind + " ")
        assert plan("backward", 4096, torch.float32).startswith(kind + " ")
        # Where the forced family cannot serve the row, the table's choice stands.
        if kind == "row":
            assert plan("forward", 65537, torch.bfloat16).startswith("staged ")
        if kind == "staged":
            assert plan("mul_forward", 4096, torch.bfloat16).startswith("row ")
    finally:
        force("auto")
    assert plan("forward", 4096, torch.bfloat16).startswith("row ")


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="polynorm._force_kernel: expected kind to be one of auto, row, staged, tiled, got 'fast'"):
        force("fast")
    with pytest.raises(ValueError, match="polynorm._launch_plan: expected op"):
        plan("sideways", 8, torch.float32)
    with pytest.raises(ValueError, match="expected H >= 1, got 0"):
        plan("forward", 0, torch.float32)
    with pytest.raises(ValueError, match="expected a float dtype"):
        plan("forward", 8, torch.int32)


# ---- On a GPU: every kernel family, forced, against the float64 oracle ------------------------

from _matrix import check_against_oracle, make_params, make_rows, requires_cuda, run_backend, seed_for  # noqa: E402


@pytest.fixture
def forced_kernel(request):
    force(request.param)
    yield request.param
    force("auto")


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "staged", "tiled"], indirect=True)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("H", [1, 127, 769, 5125])
def test_every_family_matches_the_oracle(forced_kernel, layout, dtype, H):
    # Each family serves these rows when forced (staged: a stage of one row fits), so the
    # families the table picks only for long rows are checked at small H too.
    assert plan("forward", H, dtype).startswith(forced_kernel + " ")
    gen = torch.Generator().manual_seed(seed_for("forced", forced_kernel, H, dtype, layout))
    x = make_rows(37, H, dtype, "cuda", layout, gen)
    g = make_rows(37, H, dtype, "cuda", layout, gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend("cuda", x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"forced {forced_kernel} H={H} {dtype} {layout}")


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "staged", "tiled"], indirect=True)
def test_every_family_gives_the_same_bits_on_every_run(forced_kernel):
    gen = torch.Generator().manual_seed(seed_for("forced-bits", forced_kernel))
    x = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    first = run_backend("cuda", x, g, w, b, 1e-6)
    again = run_backend("cuda", x, g, w, b, 1e-6)
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name


def test_forward_packs_by_row_size():
    # 2-byte rows of up to 8 KB: 4 packs a thread; longer rows and other dtypes: 8.
    assert fields(plan("forward", 4096, torch.bfloat16))["packs"] == 4
    assert fields(plan("forward", 4104, torch.float16))["packs"] == 8
    assert fields(plan("forward", 2048, torch.float32))["packs"] == 8
    assert fields(plan("backward", 512, torch.bfloat16))["packs"] == 4


def test_tune_rows_sets_the_packs_of_polynorms_2_byte_builds_only():
    tune = torch.ops.polynorm._tune_rows
    default = fields(plan("forward", 4096, torch.bfloat16))
    try:
        tune(8, 2, 0, True)
        assert fields(plan("forward", 4096, torch.bfloat16))["packs"] == 8
        assert fields(plan("forward", 4096, torch.bfloat16))["G"] == default["G"] // 2
        assert fields(plan("backward", 4096, torch.float16))["packs"] == 2
        assert fields(plan("forward", 4096, torch.float32))["packs"] == 8  # no other build
        assert fields(plan("mul_forward", 4096, torch.bfloat16))["packs"] == 4
        assert fields(plan("mul_backward", 4096, torch.bfloat16))["packs"] == 2
    finally:
        tune()
    assert fields(plan("forward", 4096, torch.bfloat16)) == default
    for args, name in [((3, 0, 1), "fwd_packs"), ((0, 8, 1), "bwd_packs"), ((0, 0, -2), "grid_waves")]:
        with pytest.raises(ValueError, match=f"polynorm._tune_rows: expected .*{name}"):
            tune(*args)
