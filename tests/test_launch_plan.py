"""The CUDA launch plan (csrc/launch_plan.h), computed on the host: no GPU needed.

``torch.ops.polynorm._launch_plan(op, H, dtype)`` says which kernel family (row or tiled)
serves a row and with what geometry; ``_force_kernel(kind)`` makes every later CUDA launch
take the other family where it can (the benchmarks' and the GPU tests' switch). These tests
pin the table's boundaries, that the choice never depends on the batch (the op has no M), and
the switch. On a GPU, each family, forced, runs PolyNorm's ops and the fused PolyNorm x mul's
(``mul_forward``/``mul_backward``) against the float64 oracle, over layouts that reach each
build's alignment paths.
"""

import itertools
import re

import pytest
import torch

import polynorm  # noqa: F401  (registers the ops)

plan = torch.ops.polynorm._launch_plan
force = torch.ops.polynorm._force_kernel

# csrc/launch_plan.h: every row takes the wide builds, but PolyNorm's forward of 2-byte rows not
# of whole 16-byte packs ("odd"), which takes the narrow build (half the packs): rows not of whole
# packs hold at most 64 elements a thread (row_packs); odd rows whose last warp would be half idle
# hold one pack fewer, in every op but mul_backward (packs_of below). By op: the wide packs a thread and the
# tensors a thread holds (a build holding 12 packs or more is wide), and each class's (most
# threads of one CTA, split, CTA size of rows of clusters): wide CTAs hold up to 256 threads and
# split past them; the narrow forward's hold up to 1024 without clusters, and with clusters split
# past 512 threads over CTAs of up to 512. On devices that launch clusters (sm_90 and later;
# `clusters=False`: older ones) a split row takes the fewest CTAs of the class's size, up to
# MAX_CLUSTER; but a row of more threads than the forward's split or SMALL_SPLIT (backward) takes
# the fewest CTAs of at most SMALL_CTA threads, up to SMALL_CLUSTER, where they hold no more
# threads than that (cluster_of below).
PACKS = {"forward": 16, "backward": 8, "mul_forward": 8, "mul_backward": 4}  # kRow*Packs
HELD = {"forward": 1, "backward": 2, "mul_forward": 2, "mul_backward": 3}  # tensors held a thread
WIDE = (256, 256, 256)  # kRowWideThreads
NARROW = (1024, 512, 512)  # the narrow forward: kRowMaxThreads, kRowFwdSplit, kRowClusterCtaThreads
SMALL_CTA = 128  # kRowSmallCtaThreads
SMALL_SPLIT_BWD = 128  # kRowBwdSmallSplit
SMALL_SPLIT_MUL_FWD = 128  # kRowMulFwdSmallSplit
SMALL_CLUSTER = {"forward": 16, "backward": 8}  # kRowFwdSmallCluster, kRowBwdSmallCluster
MAX_CLUSTER = 16  # kRowMaxCluster (past 8, where the device places it: else the launcher goes tiled)
HAS_CLUSTERS = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
OPS = tuple(PACKS)
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def elem_size(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def slot_packs(dtype: torch.dtype, H: int) -> int:
    """Packs a row's lanes hold: its packs; for odd rows those of its first H - 1 elements (the
    last element of a row one element past whole packs is held apart, launch_plan.h's slot_packs)."""
    elem = elem_size(dtype)
    return H * elem // 16 if H * elem % 16 == 0 else -(-(H - 1) * elem // 16)


def held_slots(dtype: torch.dtype, H: int, text: str) -> int:
    """Packs the lanes of a planned row hold: slot_packs, or, for the fused backward's tail rows
    ("tail=N", launch_plan.h's row_tail_plan), the row's whole packs (its last lane holds the rest)."""
    return H * elem_size(dtype) // 16 if "tail=" in text else slot_packs(dtype, H)


def lanes(need: int) -> int:
    """Threads of a row that needs `need`: a power of two up to 32, then whole warps (row_lanes)."""
    return min(1 << max(need - 1, 0).bit_length(), 32) if need <= 32 else -(-need // 32) * 32


def packs_of(op: str, dtype: torch.dtype, H: int) -> int:
    """Packs a thread: the wide count, at most 64 elements (4 x the element size in packs) for odd
    rows; odd rows of more than a warp (every op but mul_backward) one fewer where that takes
    fewer slots on at most 256 threads; the fused forward's rows of whole packs, of more than a
    warp, half the wide count where more than a quarter of their slots would idle (launch_plan.h's
    row_packs)."""
    if H * elem_size(dtype) % 16 == 0:
        if op != "mul_forward":
            return PACKS[op]
        # The fused forward: half as many where its lanes at 8, more than a warp, leave more than a
        # quarter of their slots idle and 4 take fewer slots on at most 128 threads.
        slots, wide = slot_packs(dtype, H), PACKS[op]
        at, halved = lanes(-(-slots // wide)), lanes(-(-slots // (wide // 2)))
        idle = at > 32 and 4 * slots < 3 * at * wide
        return wide // 2 if idle and halved <= 128 and halved * (wide // 2) < at * wide else wide
    packs = min(PACKS[op], 4 * elem_size(dtype))
    if op == "mul_backward":
        return packs
    slots = slot_packs(dtype, H)
    at, fewer = lanes(-(-slots // packs)), lanes(-(-slots // (packs - 1)))
    return packs - 1 if at > 32 and fewer <= 256 and fewer * (packs - 1) < at * packs else packs


def direction(op: str) -> str:
    return "backward" if op.endswith("backward") else "forward"


def geometry(op: str, dtype: torch.dtype, H: int) -> tuple[int, int, int, int]:
    """(packs a thread, most threads of one CTA, split, CTA size of the longest cluster rows) of a row of H."""
    packs = packs_of(op, dtype, H)
    return (packs, *(WIDE if packs * HELD[op] >= 12 else NARROW))


def cluster_of(op: str, dtype: torch.dtype, H: int, clusters: bool = True):
    """(CTAs, threads a CTA) of a row of H (launch_plan.h's row_plan, and row_tail_plan for the fused
    backward's odd rows in 2- and 4-byte dtypes: the row's whole packs in slots where that takes fewer
    lanes, whole warps on CTAs of at most 256), or None: the tiled kernels."""
    plan_ = _cluster_of(op, dtype, H, clusters, slot_packs(dtype, H))
    elem = elem_size(dtype)
    if op != "mul_backward" or elem > 4 or H * elem % 16 == 0 or plan_ is None:
        return plan_
    tail = _cluster_of(op, dtype, H, clusters, H * elem // 16)
    if tail is not None and tail[1] <= 256 and 32 <= tail[0] * tail[1] < plan_[0] * plan_[1]:
        return tail
    return plan_


def _cluster_of(op: str, dtype: torch.dtype, H: int, clusters: bool, slots: int):
    packs, most, split, cta_threads = geometry(op, dtype, H)
    need = -(-slots // packs)  # threads that cover the row
    if not clusters or lanes(need) <= split:
        one_tier = (1, lanes(need)) if lanes(need) <= most else None
    else:
        C = 2
        while C < MAX_CLUSTER and -(-need // C) > cta_threads:
            C *= 2
        per_cta = -(-(-(-need // C)) // 32) * 32
        one_tier = (C, per_cta) if per_cta <= cta_threads else None
    small_split = (SMALL_SPLIT_BWD if direction(op) == "backward" else
                   min(split, SMALL_SPLIT_MUL_FWD) if op == "mul_forward" else split)
    if not clusters or lanes(need) <= small_split:
        return one_tier
    C = 2
    while C <= SMALL_CLUSTER[direction(op)]:  # the first tier: the fewest CTAs of at most SMALL_CTA
        if -(-need // C) <= SMALL_CTA:
            per_cta = -(-(-(-need // C)) // 32) * 32
            if one_tier is None or C * per_cta <= one_tier[0] * one_tier[1]:  # no more threads
                return C, per_cta
            return one_tier
        C *= 2
    return one_tier


def one_cta_limit(op: str, dtype: torch.dtype, wide: bool) -> int:
    """The longest row of one CTA without clusters, in elements: whole packs (wide) or odd."""
    vec = 16 // elem_size(dtype)
    packs, most = geometry(op, dtype, vec if wide else vec + 1)[:2]
    return most * packs * vec + (0 if wide else 1)


def fields(text: str) -> dict:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("wide", [True, False], ids=["whole-packs", "odd"])
def test_row_kernels_hold_rows_up_to_their_register_budget(op, dtype, wide):
    # Without clusters (devices before sm_90): one CTA a row, up to the class's threads.
    elem, vec = elem_size(dtype), 16 // elem_size(dtype)
    limit = one_cta_limit(op, dtype, wide)
    sizes = (vec, 3 * vec, 96 * vec, limit // 3 // vec * vec, limit - vec, limit) if wide else (
        1, 3, 769, limit // 3 // vec * vec + 1, limit - 2 * vec, limit)
    for H in sizes:
        assert (H * elem % 16 == 0) == wide, (H, elem)
        text = plan(op, H, dtype, clusters=False)
        assert text.startswith("row "), (op, dtype, H, text)
        f = fields(text)
        assert f["packs"] == geometry(op, dtype, H)[0], (H, text)
        G = f["G"]
        need = -(-held_slots(dtype, H, text) // f["packs"])  # threads that cover the row
        assert G >= need, (H, text)
        if need <= 32:  # the smallest power of two: several rows a warp
            assert G & (G - 1) == 0 and (G == 1 or G // 2 < need), (H, text)
        else:  # the smallest multiple of 32
            assert G % 32 == 0 and G - 32 < need, (H, text)
        # 128-thread blocks of several rows where G divides 128, else one row a block
        assert f["threads"] == (128 if 128 % G == 0 else G), (H, text)
        assert f["cluster"] == 1, text
    # Longer rows of the class: the tiled kernels (no cluster to split them over on these devices).
    longer = plan(op, limit + (vec if wide else 2 * vec), dtype, clusters=False)
    assert longer.startswith("tiled "), (op, dtype, longer)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_odd_rows_hold_their_first_h_minus_1_elements_in_slots(op, dtype):
    # slot_packs rounds the packs of H - 1 elements up: a row two or more elements past whole
    # packs needs a slot for its partial pack (H = 66 bf16 forward: 9 packs, G = 2, where
    # rounding down would give G = 1 and drop element 64); only a row one element past whole
    # packs keeps that element apart (H = 65: 8 packs, G = 1). The fused backward's tail rows
    # ("tail=N") hold their whole packs and N elements apart (test_fused_backward_tail_rows).
    elem, vec = elem_size(dtype), 16 // elem_size(dtype)
    tails = 0
    for H in (vec + 1, vec + 2, 8 * vec + 1, 8 * vec + 2, 8 * vec + vec - 1, 512 * vec + 1, 512 * vec + 2):
        text = plan(op, H, dtype, clusters=False)
        f = fields(text)
        need = -(-held_slots(dtype, H, text) // f["packs"])  # threads for the packs the lanes hold
        assert f["G"] >= need and (f["G"] == 1 or f["G"] // 2 < need or f["G"] - 32 < need), (op, dtype, H, f)
        if "tail=" in text:
            tails += 1
            assert 1 < f["tail"] == H - f["G"] * f["packs"] * vec < vec, (op, dtype, H, f)
        elif H % vec != 1:  # the partial pack in a slot: the row's packs, not one fewer
            assert f["G"] * f["packs"] >= -(-H * elem // 16), (op, dtype, H, f)
    # The fused backward's 512 vec + 2 (bf16 4098, fp32 2050) is a tail row (128 lanes, not 160); no other op has one.
    assert (tails > 0) == (op == "mul_backward"), (op, dtype, tails)


def test_fused_backward_tail_rows():
    # csrc/launch_plan.h, row_tail_plan: the fused backward's odd rows in 2- and 4-byte dtypes take the plan of
    # their whole packs, the 2 to vec - 1 elements past them on the last lane ("tail=N"), where that takes fewer
    # lanes, whole warps on CTAs of at most 256; every other row, op and dtype keeps slot_packs' plan.
    # bf16 5125 (640 packs and 5 elements): one CTA of 160, not two of 96; 4103 (512 and 7): 128, not 160;
    # 4097 (one element past): 128 either way, no tail; 3003 (375 and 3): 96 either way, no tail.
    expected = {5125: (160, 1, 5), 4103: (128, 1, 7), 4097: (128, 1, 0), 3003: (96, 1, 0), 16387: (128, 4, 3)}
    for H, (G, C, tail) in expected.items():
        f = fields(plan("mul_backward", H, torch.bfloat16))
        assert (f["G"], f["cluster"], f.get("tail", 0)) == (G, C, tail), (H, f)
    taken = set()
    for dtype in FLOAT_DTYPES:
        elem, vec = elem_size(dtype), 16 // elem_size(dtype)
        for H in [*range(vec + 1, 40 * vec, 7), *range(4090, 4200, 3), 5125, 16387, 65539, 131075]:
            for op in OPS:
                text = plan(op, H, dtype)
                if "tail=" not in text:
                    continue
                f = fields(text)
                taken.add((dtype, H))
                assert op == "mul_backward" and elem <= 4 and H % vec > 1, (op, dtype, H, text)
                assert f["tail"] == H - f["G"] * f["cluster"] * f["packs"] * vec, (op, dtype, H, text)
                assert f["G"] * f["cluster"] >= 32 and f["threads"] <= 256, (op, dtype, H, text)
                old = -(-(-(-(H - 1) * elem // 16)) // f["packs"])  # lanes for the packs of H - 1 elements
                assert f["G"] * f["cluster"] < lanes(old), (op, dtype, H, text)
    assert (torch.bfloat16, 5125) in taken and any(d == torch.float32 for d, _ in taken), taken
    # _tune_rows(tail_rows=False): never (the plans of before); the same for every other row.
    try:
        torch.ops.polynorm._tune_rows(tail_rows=False)
        f = fields(plan("mul_backward", 5125, torch.bfloat16))
        assert (f["G"], f["cluster"], f.get("tail", 0)) == (96, 2, 0), f
        assert all("tail=" not in plan("mul_backward", H, dtype) for dtype, H in taken)
    finally:
        torch.ops.polynorm._tune_rows()


def test_narrow_forward_switch_moves_only_polynorm_forward_of_2_byte_whole_packs():
    # _tune_rows(narrow_forward=True), a bench's A/B (csrc/launch_plan.h, row_packs; bench/tune_rows.py --narrow):
    # PolyNorm's forward of 2-byte rows of whole packs takes the narrow build's 8 packs a thread (its odd rows'
    # build); every other op, dtype and row keeps its plan, and _tune_rows() restores the table.
    sizes = [256, 512, 4096, 3000, 4097, 5125, 32768, 65536, 262144]
    table = {(op, dtype, H): plan(op, H, dtype) for op in OPS for dtype in FLOAT_DTYPES for H in sizes}
    try:
        torch.ops.polynorm._tune_rows(narrow_forward=True)
        moved = set()
        for (op, dtype, H), text in table.items():
            now = plan(op, H, dtype)
            if op == "forward" and elem_size(dtype) == 2 and H * 2 % 16 == 0:
                f = fields(now)
                assert now.startswith("row ") and f["packs"] == 8, (dtype, H, now)
                assert f["G"] * f["cluster"] * 8 >= H * 2 // 16, (dtype, H, now)  # the row's packs, all held
                moved.add((dtype, H))
            else:
                assert now == text, (op, dtype, H, now, text)
        assert (torch.bfloat16, 65536) in moved and (torch.float16, 512) in moved, moved
    finally:
        torch.ops.polynorm._tune_rows()
    assert all(plan(op, H, dtype) == text for (op, dtype, H), text in table.items())


def test_forward_regs_switch_changes_no_plan():
    # _tune_rows(forward_regs=96 or 80), a bench's A/B (csrc/cuda/launch.cuh, launch_forward_row;
    # bench/tune_rows.py --regs): PolyNorm's aligned forward of the wide build on a build capped at that many
    # registers a thread. The switch is accepted and moves no plan of any op (rows, threads, packs, clusters), which
    # the bitwise comparison on a GPU relies on (tests/test_kernels.py::test_capped_forward_changes_no_bit).
    sizes = [256, 512, 4096, 3000, 5125, 32768, 65536, 262144]
    table = {(op, dtype, H): plan(op, H, dtype) for op in OPS for dtype in FLOAT_DTYPES for H in sizes}
    assert any(fields(text)["packs"] == 16 for (op, _, _), text in table.items() if op == "forward"), table
    for regs in (96, 80):
        try:
            torch.ops.polynorm._tune_rows(forward_regs=regs)
            assert all(plan(op, H, dtype) == text for (op, dtype, H), text in table.items()), regs
        finally:
            torch.ops.polynorm._tune_rows()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("wide", [True, False], ids=["whole-packs", "odd"])
def test_long_rows_split_over_clusters(op, dtype, wide):
    # With clusters: rows of up to `split` threads as without (but the backward's first tier);
    # longer ones on the fewest CTAs (a power of two from 2) of at most `cta_threads` threads each,
    # up to MAX_CLUSTER, or of at most SMALL_CTA threads each, up to SMALL_CLUSTER CTAs, where
    # those hold no more threads (a multiple of 32 threads a CTA), one row a block, together
    # covering the row; longer still, tiled.
    elem, vec = elem_size(dtype), 16 // elem_size(dtype)
    odd = 0 if wide else 1  # an odd H: one element past whole packs
    packs, most, split, cta_threads = geometry(op, dtype, vec + odd)
    small = SMALL_CLUSTER[direction(op)]
    per_thread = packs * vec  # elements a thread holds
    longest = per_thread * cta_threads * MAX_CLUSTER + odd  # the class's longest row
    sizes = {96 * vec + odd, per_thread * split - vec + odd, per_thread * split + odd, per_thread * split + vec + odd,
             3 * per_thread * most + 5 * vec + odd, per_thread * SMALL_CTA * small + odd,
             per_thread * SMALL_CTA * small + vec + odd, longest}
    sizes |= set(range(vec + odd, longest, max(vec, longest // 1500 // vec * vec)))
    for H in sorted(sizes):
        text = plan(op, H, dtype)
        assert text.startswith("row "), (op, dtype, H, text)
        f = fields(text)
        assert f["packs"] == packs_of(op, dtype, H), (H, text)
        need = -(-held_slots(dtype, H, text) // f["packs"])  # threads that cover the row
        C = f["cluster"]
        assert (C, f["G"]) == cluster_of(op, dtype, H), (H, text)
        if C == 1:
            assert text == plan(op, H, dtype, clusters=False) and lanes(need) <= split, (H, text)
            continue
        assert C in (2, 4, 8, 16) and C <= MAX_CLUSTER, (H, text)
        assert f["threads"] == f["G"] and f["G"] % 32 == 0 and C * f["G"] >= need, (H, text)
        assert C * (f["G"] - 32) < need, (H, text)  # the fewest warps a CTA for C CTAs
        tier = SMALL_CTA if f["G"] <= SMALL_CTA and C <= small else cta_threads
        assert C == 2 or -(-need // (C // 2)) > tier, (H, text)  # the fewest CTAs of its tier
    assert plan(op, longest + 8 * vec, dtype).startswith("tiled "), (op, dtype)
    # Tuning: smaller CTAs, larger clusters (the benchmarks' and tests' switch).
    try:
        torch.ops.polynorm._tune_rows(cta_threads=64, max_cluster=16)
        f = fields(plan(op, 4 * per_thread * 64 + odd, dtype))  # 4 x 64 threads' worth
        assert (f["cluster"], f["G"]) == (4, 64), f
    finally:
        torch.ops.polynorm._tune_rows()


# csrc/launch_plan.h's table, bf16 rows of whole packs (fp32 rows hold half as many elements,
# fp64 a quarter): (op, a row of one CTA, the next longer row of whole warps (one CTA of 160:
# fewer threads than two of 96, in the backward and the fused forward), the shortest and the longest row on CTAs of 128, the
# longest row of a cluster, the longest of one CTA without clusters). Past the last rows the
# table gives, the tiled kernels.
TABLE_BF16 = [
    ("forward", 32768, 32768, 65536, 262144, 524288, 32768),
    ("backward", 8192, 9216, 12288, 65536, 262144, 16384),
    ("mul_forward", 8192, 9216, 12288, 131072, 262144, 16384),
    ("mul_backward", 4096, 4608, 6144, 32768, 131072, 8192),
]


@pytest.mark.parametrize("op,one_cta,longer,first_small,small,cluster,no_clusters", TABLE_BF16)
@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, 1), (torch.float16, 1), (torch.float32, 2), (torch.float64, 4)],
                         ids=str)
def test_the_tables_boundaries(op, one_cta, longer, first_small, small, cluster, no_clusters, dtype, scale):
    # The boundaries written in csrc/launch_plan.h's table comment, for every dtype.
    one_cta, longer, first_small = one_cta // scale, longer // scale, first_small // scale
    small, cluster, no_clusters = small // scale, cluster // scale, no_clusters // scale
    for misaligned in (False, True):  # the output's alignment never moves a boundary
        def kind(H, clusters=True):
            text = plan(op, H, dtype, out_misaligned=misaligned, clusters=clusters)
            return text.split()[0] + ("" if text.startswith("tiled") else f"x{fields(text)['cluster']}")

        vec = 16 // elem_size(dtype)  # the next row of whole packs
        assert kind(one_cta) == "rowx1" and kind(longer) == "rowx1", (op, dtype)
        # The first rows on CTAs of at most 128 threads: 2 x 96 in the backward and the fused
        # forward, 4 x 128 in PolyNorm's forward.
        first = fields(plan(op, first_small, dtype, out_misaligned=misaligned))
        expected = (2, 96) if direction(op) == "backward" or op == "mul_forward" else (4, 128)
        assert (first["cluster"], first["G"]) == expected, (op, dtype, first)
        C = SMALL_CLUSTER[direction(op)]
        assert fields(plan(op, small, dtype))["G"] == 128 and kind(small) == f"rowx{C}", (op, dtype)
        assert fields(plan(op, small + vec, dtype))["G"] > 128, (op, dtype)
        assert kind(cluster) == "rowx16" and kind(cluster + vec) == "tiled", (op, dtype)
        assert kind(no_clusters, False) == "rowx1" and kind(no_clusters + vec, False) == "tiled", (op, dtype)


@pytest.mark.parametrize("kind", ["row", "tiled"])
def test_force_kernel_picks_a_family_where_it_can_serve(kind):
    try:
        force(kind)
        for op in ("forward", "backward", "mul_forward", "mul_backward"):
            assert plan(op, 4096, torch.bfloat16).startswith(kind + " "), op
            assert plan(op, 4096, torch.float32).startswith(kind + " "), op
        # Where the forced family cannot serve the row, the table's choice stands (the tiled
        # kernels serve every row).
        assert plan("forward", 65545, torch.bfloat16, clusters=False).startswith("tiled ")
        assert plan("backward", 524289, torch.bfloat16).startswith("tiled ")
    finally:
        force("auto")
    assert plan("forward", 4096, torch.bfloat16).startswith("row ")


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="polynorm._force_kernel: expected kind to be one of auto, row, tiled, got 'fast'"):
        force("fast")
    # The staged kernels are gone (bench/NOTES.md, v6: clusters serve their rows, faster).
    with pytest.raises(ValueError, match="expected kind to be one of auto, row, tiled, got 'staged'"):
        force("staged")
    assert plan("forward", 4096, torch.bfloat16).startswith("row ")  # a refused kind changes nothing
    with pytest.raises(ValueError, match="polynorm._launch_plan: expected op"):
        plan("sideways", 8, torch.float32)
    with pytest.raises(ValueError, match="expected H >= 1, got 0"):
        plan("forward", 0, torch.float32)
    with pytest.raises(ValueError, match="expected a float dtype"):
        plan("forward", 8, torch.int32)


# csrc/launch_plan.h, realign_phase: which tensor's phase a realigned row works in (classes:
# tensors of one class share every row's phase). The rows measured in bench/NOTES.md v28 (calls
# 1 and 4), each with the choice that ran faster there.
@pytest.mark.parametrize(
    "op,classes,phase,why",
    [
        ("forward", [0, 1], 1, "PolyNorm: x realigned into y's phase"),
        ("mul_forward", [0, 1, 1], 1, "mul in y's phase, x not: x alone realigned in"),
        ("mul_forward", [0, 1, 0], 0, "x and mul moved: y realigned out"),
        ("mul_forward", [0, 1, 2], 0, "three phases: x's"),
        ("backward", [0, 0, 1], 0, "x and grad_y moved: grad_x out (7) rather than both in (8)"),
        ("backward", [0, 1, 1], 1, "x alone moved: x in, grad_y's phase"),
        ("backward", [0, 1, 0], 0, "grad_y alone moved: grad_y in"),
        ("mul_backward", [0, 0, 1, 0, 1], 2, "x, grad_out and mul moved: three in (12) rather than two out (14)"),
        ("mul_backward", [0, 1, 1, 1, 1], 1, "x alone moved"),
        ("mul_backward", [0, 1, 1, 0, 1], 1, "x and mul moved: both in (8) rather than grad_y in and two out"),
        ("mul_backward", [0, 0, 0, 1, 0], 0, "mul alone moved: mul in"),
    ],
)
def test_realigned_rows_take_the_phase_of_least_cost(op, classes, phase, why):
    assert torch.ops.polynorm._realign_phase(op, classes) == phase, why


@pytest.mark.parametrize("op", ["backward", "mul_backward"])
def test_realign_phase_minimises_the_cost_in_every_class_pattern(op):
    # Every assignment of phase classes: the chosen tensor's cost (an input realigned in 4, an
    # output realigned out 7) is the least of x's, grad_y's and grad_x's, and the first on a tie.
    n = 5 if op == "mul_backward" else 3
    outputs = {2, 4}
    for classes in itertools.product(range(n), repeat=n):
        costs = [sum((7 if t in outputs else 4) for t in range(n) if classes[t] != classes[ref]) for ref in range(3)]
        assert torch.ops.polynorm._realign_phase(op, list(classes)) == costs.index(min(costs)), classes


def test_realign_phase_refuses_bad_arguments_by_name():
    with pytest.raises(ValueError, match="polynorm._realign_phase: expected op"):
        torch.ops.polynorm._realign_phase("sideways", [0, 1])
    with pytest.raises(ValueError, match="expected 3 classes for backward, got 2"):
        torch.ops.polynorm._realign_phase("backward", [0, 1])


# ---- On a GPU: every kernel family, forced, against the float64 oracle ------------------------

from _matrix import (  # noqa: E402
    check_against_oracle,
    check_against_oracle_mul,
    make_params,
    make_rows,
    requires_cuda,
    run_backend,
    run_backend_mul,
    seed_for,
)


@pytest.fixture
def forced_kernel(request):
    force(request.param)
    yield request.param
    force("auto")


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "tiled"], indirect=True)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("H", [1, 127, 769, 1024, 5125])
def test_every_family_matches_the_oracle(forced_kernel, layout, dtype, H):
    # Each family serves these rows when forced, so the tiled kernels, which the table picks
    # only for long rows, are checked at small H too; 1024 (whole packs) reaches the aligned
    # and realigned wide builds, the odd H the same-phase and realigned ones (the narrow build
    # in the bf16 forward).
    assert plan("forward", H, dtype).startswith(forced_kernel + " ")
    gen = torch.Generator().manual_seed(seed_for("forced", forced_kernel, H, dtype, layout))
    x = make_rows(37, H, dtype, "cuda", layout, gen)
    g = make_rows(37, H, dtype, "cuda", layout, gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend("cuda", x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what=f"forced {forced_kernel} H={H} {dtype} {layout}")


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "tiled"], indirect=True)
def test_every_family_gives_the_same_bits_on_every_run(forced_kernel):
    gen = torch.Generator().manual_seed(seed_for("forced-bits", forced_kernel))
    x = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    first = run_backend("cuda", x, g, w, b, 1e-6)
    again = run_backend("cuda", x, g, w, b, 1e-6)
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name


def test_packs_a_thread():
    # Rows of whole packs: PolyNorm 16 packs of x a thread forward, 8 each of x and grad_y
    # backward; the fused op 8 each of x and mul forward, 4 each of x, grad_out and mul
    # backward. Odd rows: the same but for PolyNorm's forward of 2-byte rows (8, the narrow
    # build; at most 64 elements a thread; H = 64 vec + 1 fills its lanes, so no pack fewer).
    # For every dtype, whatever the output's alignment.
    for dtype in FLOAT_DTYPES:
        vec = 16 // elem_size(dtype)
        for op, packs in PACKS.items():
            odd = packs // 2 if op == "forward" and elem_size(dtype) == 2 else packs
            for misaligned in (False, True):
                assert fields(plan(op, 64 * vec, dtype, out_misaligned=misaligned))["packs"] == packs, (op, dtype)
                assert fields(plan(op, 64 * vec + 1, dtype, out_misaligned=misaligned))["packs"] == odd, (op, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_odd_rows_with_half_idle_warps_take_a_pack_fewer(dtype):
    # bf16 H = 5125 holds 641 slot packs: at 8 packs a thread 96 threads (768 slots, the last
    # warp's half idle), at 7 packs 96 threads and 672 slots; 3001 (375) 64 threads either way,
    # 448 slots against 512. 4097 and 16385 fill whole warps at 8 (512 and 2048 slot packs).
    # fp32 5125 (1281 slot packs): forward 15 packs on 96 threads (1440 slots against 1536),
    # backward 7 on 192 (two CTAs of 96). Every op but the fused backward (3 packs would not be a
    # wide build). (packs, threads of the row.)
    expected = {
        (torch.bfloat16, "forward"): {5125: (7, 96), 3001: (7, 64), 4097: (8, 64), 16385: (8, 256)},
        (torch.bfloat16, "backward"): {5125: (7, 96), 3001: (7, 64), 4097: (8, 64), 16385: (8, 256)},
        (torch.bfloat16, "mul_forward"): {5125: (7, 96), 4097: (8, 64)},
        (torch.bfloat16, "mul_backward"): {5125: (4, 160)},  # its tail plan (row_tail_plan)
        (torch.float32, "forward"): {5125: (15, 96)},
        (torch.float32, "backward"): {5125: (7, 192)},
    }
    for op in OPS:
        for H in (5125, 3001, 4097, 16385, 5129, 2051, 1025):
            f = fields(plan(op, H, dtype))
            assert f["packs"] == packs_of(op, dtype, H), (op, dtype, H, f)
            if H in expected.get((dtype, op), {}):
                assert (f["packs"], f["G"] * f["cluster"]) == expected[(dtype, op)][H], (op, dtype, H, f)


def test_fused_forward_halves_the_packs_of_rows_a_quarter_idle():
    # bf16 H = 3000 (375 whole packs): 8 packs a thread on 64 lanes hold 512 slots, 27% idle; 4 on
    # 96 lanes hold 384 (launch_plan.h, row_packs; bench/NOTES.md v21). fp32 1500 and bf16 2304 alike;
    # 3072 (384 packs: a quarter idle at 8, not more), the powers of two, rows of a warp or less
    # (bf16 H = 8: 1 pack) and rows that 4 packs would spread over more than 128 lanes (bf16 4200:
    # 160) keep 8, odd 3001 its
    # pack fewer; the other ops keep their counts; untrimmed (_tune_rows), 8. (packs, G.)
    expected = {(torch.bfloat16, 3000): (4, 96), (torch.float16, 3000): (4, 96), (torch.float32, 1500): (4, 96),
                (torch.bfloat16, 2304): (4, 96), (torch.bfloat16, 3072): (8, 64), (torch.bfloat16, 4096): (8, 64),
                (torch.float32, 3000): (8, 96), (torch.bfloat16, 3001): (7, 64), (torch.bfloat16, 8): (8, 1),
                (torch.bfloat16, 1280): (8, 32), (torch.bfloat16, 4200): (8, 96), (torch.float64, 750): (4, 96)}
    for (dtype, H), packs_g in expected.items():
        f = fields(plan("mul_forward", H, dtype))
        assert (f["packs"], f["G"], f["cluster"]) == (*packs_g, 1), (dtype, H, f)
    for op in ("forward", "backward", "mul_backward"):
        assert fields(plan(op, 3000, torch.bfloat16))["packs"] == PACKS[op], op
    tune = torch.ops.polynorm._tune_rows
    try:
        tune(trim_packs=False)
        assert fields(plan("mul_forward", 3000, torch.bfloat16))["packs"] == 8
    finally:
        tune()


def test_a_pack_fewer_only_where_it_takes_fewer_slots():
    # Over a range of H: a pack fewer never takes more slots, and is taken wherever the rule
    # (packs_of) says so; such rows fit 256 threads (one CTA, or a cluster of two in the backward).
    for dtype in (torch.bfloat16, torch.float32):
        for H in range(1, 20000, 7):
            for op in ("forward", "backward", "mul_forward"):
                f = fields(plan(op, H, dtype))  # rows of one CTA or of clusters, never tiled here
                full = min(PACKS[op], 4 * elem_size(dtype))
                if H * elem_size(dtype) % 16 and f["packs"] == full - 1:
                    assert f["G"] * f["packs"] < lanes(-(-slot_packs(dtype, H) // full)) * full, (op, H, f)
                    assert f["cluster"] * f["G"] <= 256, (op, H, f)
                assert f["packs"] == packs_of(op, dtype, H), (op, dtype, H, f)


def test_tuned_max_cluster_caps_the_first_tier():
    # _tune_rows(max_cluster=k) with the table's CTA sizes: neither tier passes k CTAs. bf16
    # forward 262144 (16 x 128 in the table) takes 8 x 256 under k = 8; odd 90115 (narrow, 1409
    # threads) 4 x 384; the backward at 65536 (8 x 128) 4 x 256 under k = 4.
    tune = torch.ops.polynorm._tune_rows
    try:
        for k, op, H, expected in [(8, "forward", 262144, (8, 256)), (8, "forward", 90115, (4, 384)),
                                   (4, "backward", 65536, (4, 256)), (16, "forward", 262144, (16, 128))]:
            tune(max_cluster=k)
            f = fields(plan(op, H, torch.bfloat16))
            assert (f["cluster"], f["G"]) == expected, (k, op, H, f)
    finally:
        tune()


def test_clusters_of_16_take_load_balancing():
    # csrc/launch_plan.h, row_cluster_policy: a row's clusters of 16 CTAs launch with load
    # balancing (2), smaller clusters with the default (0); one CTA a row has no policy. H over
    # each op's cluster range, every dtype: the policy follows the cluster size alone, never H.
    # _tune_rows(cluster_policy=p) sets p for every row of clusters.
    tune = torch.ops.polynorm._tune_rows
    seen = set()
    for op in OPS:
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            for H in [2**k for k in range(9, 20)] + [2**k + 1 for k in range(9, 20)]:
                text = plan(op, H, dtype)
                if not text.startswith("row "):
                    continue
                f = fields(text)
                if f["cluster"] == 1:
                    assert "policy" not in f, (op, dtype, H, text)
                    continue
                assert f["policy"] == (2 if f["cluster"] == 16 else 0), (op, dtype, H, text)
                seen.add(f["policy"])
    assert seen == {0, 2}, seen  # both reached
    try:
        for p in (0, 1, 2):
            tune(cluster_policy=p)
            assert fields(plan("backward", 262144, torch.bfloat16))["policy"] == p
            assert fields(plan("forward", 65536, torch.bfloat16))["policy"] == p
            assert "policy" not in fields(plan("forward", 4096, torch.bfloat16))  # one CTA a row: none
    finally:
        tune()
    assert fields(plan("backward", 262144, torch.bfloat16))["policy"] == 2


def test_fused_backward_rows_of_clusters_on_ctas_of_256_are_staged():
    # csrc/launch_plan.h, row_staged: the fused backward's rows of whole packs on clusters of CTAs of 256
    # threads, in 2- and 4-byte dtypes, whose every slot is in the row, are staged a row ahead ("staged=1");
    # no other row is (odd rows, 65537 among the sizes, never). H over every op's cluster range (122880 bf16: 16 x 256 threads, 3840 lanes of 4096 at work),
    # every dtype: the choice follows the op, the dtype's size and the row's geometry alone.
    # _tune_rows(stage_rows=0) stages none; 1 (or the table's, -1) the same rows.
    tune = torch.ops.polynorm._tune_rows
    sizes = ([2**k for k in range(9, 20)] + [2**k + 1 for k in range(9, 20)] + [3 * 2**k for k in range(9, 18)]
             + [122880])
    staged = set()
    for op in OPS:
        for dtype in FLOAT_DTYPES:
            for H in sizes:
                text = plan(op, H, dtype)
                f = fields(text)
                want = (op == "mul_backward" and elem_size(dtype) <= 4 and text.startswith("row ")
                        and f["cluster"] > 1 and f["threads"] == 256
                        and H * elem_size(dtype) % 16 == 0 and f["G"] * f["cluster"] * f["packs"] == slot_packs(dtype, H))
                assert ("staged=1" in text) == want, (op, dtype, H, text)
                if want:
                    staged.add((dtype, H))
                    assert plan(op, H, dtype, clusters=False).find("staged") < 0  # no clusters: none
    assert (torch.bfloat16, 131072) in staged and (torch.float32, 32768) in staged, staged
    text = plan("mul_backward", 122880, torch.bfloat16)  # every slot not in the row: not staged
    assert fields(text)["threads"] == 256 and "staged" not in text, text
    try:
        tune(stage_rows=0)
        assert all("staged" not in plan("mul_backward", H, dtype) for dtype, H in staged)
        tune(stage_rows=1)
        assert all("staged=1" in plan("mul_backward", H, dtype) for dtype, H in staged)
    finally:
        tune()


def test_tune_rows_splits_rows_never_changes_packs():
    tune = torch.ops.polynorm._tune_rows
    default = {op: fields(plan(op, 8192, torch.bfloat16)) for op in OPS}
    try:
        tune(0, False, 64, 16)
        for op in OPS:
            f = fields(plan(op, 8192, torch.bfloat16))
            assert f["packs"] == default[op]["packs"] and f["G"] <= 64, (op, f)
        # The backward at 8192 takes 128 threads of 8 packs: two CTAs of 64 under the tuning.
        f = fields(plan("backward", 8192, torch.bfloat16))
        assert (f["G"], f["cluster"]) == (64, 2) and default["backward"]["cluster"] == 1, f
        # The wide builds' CTAs hold at most 256 threads, whatever cta_threads says.
        tune(-1, True, 1024, 8)
        f = fields(plan("forward", 65536, torch.bfloat16))
        assert (f["G"], f["cluster"]) == (256, 2), f
    finally:
        tune()
    assert {op: fields(plan(op, 8192, torch.bfloat16)) for op in OPS} == default
    for args, message in TUNE_ROWS_ERRORS:
        with pytest.raises(ValueError) as raised:
            tune(*args)
        assert str(raised.value) == message
    # A rejected call changes nothing: every check comes before any setting is stored.
    assert {op: fields(plan(op, 8192, torch.bfloat16)) for op in OPS} == default


# _tune_rows' bad calls and their whole messages: every number in a message, the bounds too,
# is formatted by num() (csrc/polynorm.h, std::to_string), never streamed into a std::ostream:
# an int streamed into the cta_threads message crashed the H200 suite's worker (torch 2.11),
# where a second copy of libstdc++'s facet ids had been numbered first (csrc/polynorm.cpp).
TUNE_ROWS_ERRORS = [
    ((-2,), "polynorm._tune_rows: expected -1 <= grid_waves <= 64, got -2"),
    ((-1, True, 48), "polynorm._tune_rows: expected cta_threads to be 0 or a multiple of 32 in [32, 1024], got 48"),
    ((-1, True, 0, 3), "polynorm._tune_rows: expected max_cluster to be 0, 1, 2, 4, 8 or 16, got 3"),
    ((-1, True, 32, 2, True, -2), "polynorm._tune_rows: expected -1 <= stagger <= 100000, got -2"),
    ((-1, True, 0, 0, True, 100001), "polynorm._tune_rows: expected -1 <= stagger <= 100000, got 100001"),
    ((-1, True, 0, 0, True, -1, 2), "polynorm._tune_rows: expected -1 <= sum_apart <= 1, got 2"),
    ((-1, True, 0, 0, True, -1, -2), "polynorm._tune_rows: expected -1 <= sum_apart <= 1, got -2"),
    ((-1, True, 0, 0, True, -1, -1, 3), "polynorm._tune_rows: expected -1 <= cluster_policy <= 2, got 3"),
    ((-1, True, 0, 0, True, -1, -1, -2), "polynorm._tune_rows: expected -1 <= cluster_policy <= 2, got -2"),
    ((-1, True, 0, 0, True, -1, -1, -1, 2), "polynorm._tune_rows: expected -1 <= stage_rows <= 1, got 2"),
    ((-1, True, 0, 0, True, -1, -1, -1, -2), "polynorm._tune_rows: expected -1 <= stage_rows <= 1, got -2"),
    ((-1, True, 0, 0, True, -1, -1, -1, -1, True, False, 64),
     "polynorm._tune_rows: expected forward_regs to be 0, 80 or 96, got 64"),
    ((-1, True, 0, 0, True, -1, -1, -1, -1, True, False, 128),
     "polynorm._tune_rows: expected forward_regs to be 0, 80 or 96, got 128"),
]

# ---- The fused PolyNorm x mul: its two families, forced --------------------------------------
# mul_forward and mul_backward have a row build and a tiled build, as PolyNorm's ops do: forcing
# "row" past the row kernels' register budget gives the tiled build.

def mul_family(op: str, H: int, dtype: torch.dtype, forced: str, clusters: bool = True) -> str:
    """The family csrc/launch_plan.h's table gives a row of the fused op with ``forced`` set:
    the row build while the row's threads fit one CTA, or with clusters a cluster (cluster_of),
    unless tiled is forced; the tiled build otherwise."""
    return "row" if cluster_of(op, dtype, H, clusters) is not None and forced != "tiled" else "tiled"


@pytest.mark.parametrize("op", ["mul_forward", "mul_backward"])
@pytest.mark.parametrize("kind", ["auto", "row", "tiled"])
def test_mul_ops_forced_families(op, kind):
    # On the host: what the GPU tests below rely on, for every H they use and the boundaries.
    try:
        force(kind)
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            vec = 16 // elem_size(dtype)
            wide_limit = one_cta_limit(op, dtype, True)
            odd_limit = one_cta_limit(op, dtype, False)
            for H in (1, 127, 769, 4096, 5125, wide_limit, wide_limit + vec, odd_limit, odd_limit + 2 * vec, 40000,
                      wide_limit * MAX_CLUSTER, wide_limit * MAX_CLUSTER + vec, 8 * odd_limit, 8 * odd_limit + 2):
                for clusters in (True, False):
                    expected = mul_family(op, H, dtype, kind, clusters)
                    text = plan(op, H, dtype, clusters=clusters)
                    assert text.startswith(expected + " "), (op, kind, dtype, H, clusters, text)
                    # The output's alignment never changes the fused op's family.
                    text = plan(op, H, dtype, out_misaligned=True, clusters=clusters)
                    assert text.startswith(expected + " "), (op, kind, dtype, H, clusters, text)
    finally:
        force("auto")


# (H, x layout, mul layout, grad_out layout). Beside the matrix of test_every_family_matches_the_oracle:
# - H = 4096, x and grad_out aligned with a misaligned mul (a view one element into a buffer):
#   the realigning row build, which realigns mul's rows and not x's (and the reverse);
# - H = 40000, past every row build's budget: the tiled build with misaligned inputs.
MUL_LAYOUT_CASES = [
    *[(H, layout, layout, layout) for H in (1, 127, 769, 3000, 5125) for layout in ("contiguous", "misaligned")],
    (4096, "contiguous", "misaligned", "contiguous"),
    (4096, "contiguous", "misaligned", "misaligned"),
    (4096, "misaligned", "contiguous", "contiguous"),
    (40000, "misaligned", "misaligned", "misaligned"),
    (40000, "contiguous", "misaligned", "contiguous"),
    (40000, "misaligned", "contiguous", "misaligned"),
]


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "tiled"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "H,x_layout,mul_layout,g_layout", MUL_LAYOUT_CASES, ids=["-".join(map(str, case)) for case in MUL_LAYOUT_CASES]
)
def test_every_mul_family_matches_the_oracle(forced_kernel, dtype, H, x_layout, mul_layout, g_layout):
    # The plan says which family ran (forcing "row" past its budget runs the tiled build).
    for op in ("mul_forward", "mul_backward"):
        expected = mul_family(op, H, dtype, forced_kernel, HAS_CLUSTERS)
        text = plan(op, H, dtype, clusters=HAS_CLUSTERS)
        assert text.startswith(expected + " "), (op, forced_kernel, H, dtype, text)
    key = ("forced-mul", forced_kernel, H, dtype, x_layout, mul_layout, g_layout)
    gen = torch.Generator().manual_seed(seed_for(*key))
    x = make_rows(37, H, dtype, "cuda", x_layout, gen)
    mul = make_rows(37, H, dtype, "cuda", mul_layout, gen)
    g = make_rows(37, H, dtype, "cuda", g_layout, gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)  # every buffer poisoned with NaN first
    what = f"forced {forced_kernel} H={H} {dtype} x {x_layout}, mul {mul_layout}, grad_out {g_layout}"
    check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=what)


@requires_cuda
@pytest.mark.parametrize("forced_kernel", ["row", "tiled"], indirect=True)
def test_every_mul_family_gives_the_same_bits_on_every_run(forced_kernel):
    gen = torch.Generator().manual_seed(seed_for("forced-mul-bits", forced_kernel))
    x, mul, g = (make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    first = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    again = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
    for name in ("out", "dx", "dmul", "dw", "db"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
