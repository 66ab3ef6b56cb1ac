"""The CUDA launch plan (csrc/launch_plan.h), computed on the host: no GPU needed.

``torch.ops.polynorm._launch_plan(op, H, dtype, layout, clusters, family)`` says which kernel serves
rows of H elements: the family (row or tiled), the build (wide, narrow, staged, tail), the layout
(aligned, pack-realigned, same-phase, realigned), packs, threads, cluster and the kernel template.
These tests pin the table's boundaries and that the choice never depends on the batch (the op has
no M). ``_plan_space`` gives the plan's whole space (the first H of every run of rows served alike):
the CPU tests check it against the row kernels compiled (``_row_kernels``) and the binary
(bench/instantiations.py); on a GPU, every configuration in it runs through the private ops that
take the configuration explicitly (``_forward_config``, ... with ``family`` and ``clusters``)
against the float64 oracle, as does every family on short rows.
"""

import importlib.util
import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import polynorm  # noqa: F401  (registers the ops)

plan = torch.ops.polynorm._launch_plan
ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("instantiations", ROOT / "bench" / "instantiations.py")
instantiations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(instantiations)

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
    """A plan's key=value fields, numbers as int."""
    return {k: int(v) if v.isdigit() else v for k, v in re.findall(r"(\w+)=(\S+)", text)}


def layouts_of(dtype: torch.dtype, H: int) -> tuple[str, str]:
    """The layouts rows of H may take: whole packs aligned or pack-realigned, odd ones same-phase or realigned."""
    return ("aligned", "pack-realigned") if H * elem_size(dtype) % 16 == 0 else ("same-phase", "realigned")


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



# csrc/launch_plan.h's table, bf16 rows of whole packs (fp32 rows hold half as many elements,
# fp64 a quarter): (op, a row of one CTA, the next longer row of whole warps (one CTA of 160:
# fewer threads than two of 96, in the backward and the fused forward), the shortest and the
# longest row on CTAs of 128, the longest row of a cluster, the longest of one CTA without
# clusters). Past the last rows the table gives, the tiled kernels.
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
    for layout in ("aligned", "pack-realigned"):  # the layout never moves a boundary
        def kind(H, clusters=True):
            text = plan(op, H, dtype, layout, clusters)
            return text.split()[0] + ("" if text.startswith("tiled") else f"x{fields(text)['cluster']}")

        vec = 16 // elem_size(dtype)  # the next row of whole packs
        assert kind(one_cta) == "rowx1" and kind(longer) == "rowx1", (op, dtype)
        # The first rows on CTAs of at most 128 threads: 2 x 96 in the backward and the fused
        # forward, 4 x 128 in PolyNorm's forward.
        first = fields(plan(op, first_small, dtype, layout))
        expected = (2, 96) if direction(op) == "backward" or op == "mul_forward" else (4, 128)
        assert (first["cluster"], first["G"]) == expected, (op, dtype, first)
        C = SMALL_CLUSTER[direction(op)]
        assert fields(plan(op, small, dtype, layout))["G"] == 128 and kind(small) == f"rowx{C}", (op, dtype)
        assert fields(plan(op, small + vec, dtype, layout))["G"] > 128, (op, dtype)
        assert kind(cluster) == "rowx16" and kind(cluster + vec) == "tiled", (op, dtype)
        assert kind(no_clusters, False) == "rowx1" and kind(no_clusters + vec, False) == "tiled", (op, dtype)


@pytest.mark.parametrize("family", ["row", "tiled"])
def test_a_family_is_taken_where_it_serves_the_row(family):
    for op in OPS:
        for dtype in (torch.bfloat16, torch.float32):
            assert plan(op, 4096, dtype, family=family).startswith(family + " "), (op, dtype)
    # The tiled kernels serve every row; the row kernels not rows past a cluster's (or, without
    # clusters, one CTA's) threads: "row" is then refused, by name.
    assert plan("backward", 524289, torch.bfloat16, family="tiled").startswith("tiled ")
    with pytest.raises(ValueError, match="polynorm._launch_plan: the row kernels do not serve forward rows of 65545 "
                                         "elements of 2 bytes without clusters"):
        plan("forward", 65545, torch.bfloat16, clusters=False, family="row")
    assert plan("forward", 65545, torch.bfloat16, clusters=False).startswith("tiled ")  # auto: the table's


def test_the_plan_names_its_kernel_build_and_layout():
    # The rows of the issue that asked for it, and one of each build.
    expected = {
        ("forward", 5125, torch.bfloat16, "same-phase"):
            "row build=narrow layout=same-phase packs=7 G=96 threads=96 cluster=1 "
            "kernel=poly_norm_fwd_row_kernel<c10::BFloat16,7,kSamePhase,256,false,false,true>",
        ("forward", 4096, torch.float32, "pack-realigned"):
            "row build=wide layout=pack-realigned packs=16 G=64 threads=128 cluster=1 "
            "kernel=poly_norm_fwd_row_kernel<float,16,kPackRealigned,256,false,false,true>",
        ("mul_backward", 131072, torch.bfloat16, "aligned"):
            "row build=staged layout=aligned packs=4 G=256 threads=256 cluster=16 policy=load-balancing "
            "kernel=poly_norm_bwd_row_kernel<c10::BFloat16,4,kAlignedStaged,256,true,false,false> "
            "sized_by=poly_norm_bwd_row_kernel<c10::BFloat16,4,kAligned,256,true,false,false>",
        ("mul_backward", 5125, torch.bfloat16, "realigned"):
            "row build=tail layout=realigned packs=4 G=160 threads=160 cluster=1 tail=5 "
            "kernel=poly_norm_bwd_row_kernel<c10::BFloat16,4,kRealignedTail,256,true,false,true> "
            "sized_by=poly_norm_bwd_row_kernel<c10::BFloat16,4,kAligned,256,true,false,false>",
        ("grouped_forward", 30001, torch.float16, "same-phase"):  # without clusters below
            "row build=narrow layout=same-phase packs=8 G=480 threads=480 cluster=1 "
            "kernel=poly_norm_fwd_row_kernel<c10::Half,8,kSamePhase,1024,false,true,false> "
            "fallback=poly_norm_fwd_row_kernel<c10::Half,8,kPackRealigned,1024,false,true,false>",
        ("backward", 600000, torch.float64, "aligned"):
            "tiled threads=1024 rows=1 passes=2 kernel=poly_norm_bwd_tiled_kernel<double,false>",
    }
    for (op, H, dtype, layout), text in expected.items():
        assert plan(op, H, dtype, layout, op != "grouped_forward") == text, (op, H, dtype, layout)
    # "" is the layout of contiguous rows: aligned for whole packs, same-phase for odd rows.
    assert plan("forward", 4096, torch.bfloat16) == plan("forward", 4096, torch.bfloat16, "aligned")
    assert plan("forward", 4097, torch.bfloat16) == plan("forward", 4097, torch.bfloat16, "same-phase")


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="polynorm._launch_plan: expected family to be one of auto, row, tiled, "
                                         "got 'fast'"):
        plan("forward", 4096, torch.bfloat16, family="fast")
    with pytest.raises(ValueError, match="polynorm._launch_plan: expected op"):
        plan("sideways", 8, torch.float32)
    with pytest.raises(ValueError, match="expected H >= 1, got 0"):
        plan("forward", 0, torch.float32)
    with pytest.raises(ValueError, match="expected dtype to be float32, float64, float16 or bfloat16"):
        plan("forward", 8, torch.int32)
    with pytest.raises(ValueError, match="expected layout to be aligned, same-phase, realigned or pack-realigned, "
                                         "got 'sideways'"):
        plan("forward", 8, torch.float32, "sideways")
    # Rows of whole packs are never same-phase or realigned, odd ones never aligned or pack-realigned.
    with pytest.raises(ValueError, match="rows of 4096 elements of 2 bytes are never realigned"):
        plan("forward", 4096, torch.bfloat16, "realigned")
    with pytest.raises(ValueError, match="rows of 4097 elements of 2 bytes are never aligned"):
        plan("backward", 4097, torch.bfloat16, "aligned")
    with pytest.raises(ValueError, match="polynorm._plan_space: expected op"):
        torch.ops.polynorm._plan_space("sideways", torch.float32, "aligned")
    with pytest.raises(ValueError, match="polynorm._row_kernels: expected dtype"):
        torch.ops.polynorm._row_kernels("forward", torch.int64)


# csrc/launch_plan.h, realign_phase: which tensor's phase a realigned row works in (classes:
# tensors of one class share every row's phase). Each pattern with the choice that runs faster
# on an H200, which the costs (an input realigned in 4, an output out 7) reproduce.
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


# ---- The plan's whole space ----------------------------------------------------------------------
# _plan_space gives the first H of every run of rows (of a layout, with clusters or without) that the
# plan serves alike, up to the rows only the tiled kernels serve; bench/instantiations.py walks it
# for every op and dtype. The configurations: what makes a launch distinct (config_key: the kernel,
# its cluster, several rows a block or one, a tail or none, one pass or two), each with its
# shortest row.
SPACE = instantiations.plan_space()
CONFIGS = instantiations.configs(SPACE)
ALL_OPS = instantiations.OPS


def run_key(text: str) -> tuple:
    """What _plan_space compares between rows: the plan but the tail's exact length."""
    f = instantiations.fields(text)
    return tuple(f.get(k) for k in ("family", "packs", "G", "threads", "cluster", "passes", "kernel"))


def test_the_plan_space_is_its_runs():
    # Every run start reproduces its plan; the row before it (of its layout) is planned otherwise,
    # or is past the start of the space. Every op and dtype has rows of one CTA and of clusters, and
    # tiled rows with clusters and without.
    by_case = {}
    for entry in SPACE:
        by_case.setdefault((entry["op"], entry["dtype"], entry["layout"], entry["clusters"]), []).append(entry)
    assert len(by_case) == len(ALL_OPS) * len(FLOAT_DTYPES) * 4 * 2
    for (op, dtype, layout, clusters), runs in by_case.items():
        starts = [e["H"] for e in runs]
        assert starts == sorted(starts) and len(set(starts)) == len(starts), (op, dtype, layout, clusters)
        assert runs[-1]["fields"]["family"] == "tiled", (op, dtype, layout, clusters, runs[-1])
        clusters_seen = {e["fields"].get("cluster", 0) for e in runs}
        assert 1 in clusters_seen and (max(clusters_seen) == 16) == clusters, (op, dtype, layout, clusters)
        for e in runs[1 :: max(1, len(runs) // 25)]:  # a sample: the start repeats, the row before differs
            assert plan(op, e["H"], dtype, layout, clusters) == e["plan"]
            before = e["H"] - 1
            while (before * elem_size(dtype) % 16 == 0) != (layout in ("aligned", "pack-realigned")):
                before -= 1
            assert run_key(plan(op, before, dtype, layout, clusters)) != run_key(e["plan"]), (op, dtype, layout, e)
    for key, entry in CONFIGS.items():
        assert instantiations.config_key(entry) == key


def test_the_compiled_row_kernels_are_those_the_plan_takes():
    # csrc/launch_plan.h, row_kernel_compiled (the kernels instantiated) against the kernels of the
    # plan's whole space, its stage fallbacks and the grids' sizing builds: equal, for every op and dtype.
    for op in ALL_OPS:
        for dtype in FLOAT_DTYPES:
            compiled = set(torch.ops.polynorm._row_kernels(op, dtype))
            taken = set()
            for entry in SPACE:
                if entry["op"] == op and entry["dtype"] == dtype:
                    taken |= {entry["fields"][k] for k in ("kernel", "fallback", "sized_by") if k in entry["fields"]}
            taken = {name for name in taken if "_row_kernel<" in name}
            assert compiled == taken, (op, dtype, sorted(compiled - taken), sorted(taken - compiled))


def test_the_binarys_kernels_are_the_plans():
    # bench/instantiations.py on the built extension: every kernel compiled, per architecture, is one
    # the plan launches (or a backward helper), and every one it launches is compiled.
    binaries = sorted((ROOT / "polynorm").glob("_C*.so"))
    if not binaries:
        pytest.skip("polynorm's extension (polynorm/_C*.so) is not built in place")
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt (binutils) not found")
    try:
        from sass_load_order import find_cuobjdump  # bench/, on sys.path through instantiations

        tool, env = find_cuobjdump()
    except SystemExit:
        pytest.skip("cuobjdump or nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    listing = subprocess.run([tool, "-lelf", str(binaries[0])], capture_output=True, text=True, env=env)
    if listing.returncode != 0 or "sm_" not in listing.stdout:
        pytest.skip("the extension was built without CUDA objects (POLYNORM_FORCE_CPU=1, or no nvcc)")
    problems = instantiations.check(str(binaries[0]))
    assert not problems, "\n".join(problems)



def test_packs_a_thread():
    # Rows of whole packs: PolyNorm 16 packs of x a thread forward, 8 each of x and grad_y
    # backward; the fused op 8 each of x and mul forward, 4 each of x, grad_out and mul
    # backward. Odd rows: the same but for PolyNorm's forward of 2-byte rows (8, the narrow
    # build; at most 64 elements a thread; H = 64 vec + 1 fills its lanes, so no pack fewer).
    # For every dtype, in every layout.
    for dtype in FLOAT_DTYPES:
        vec = 16 // elem_size(dtype)
        for op, packs in PACKS.items():
            odd = packs // 2 if op == "forward" and elem_size(dtype) == 2 else packs
            for H, want in ((64 * vec, packs), (64 * vec + 1, odd)):
                for layout in layouts_of(dtype, H):
                    assert fields(plan(op, H, dtype, layout))["packs"] == want, (op, dtype, H, layout)


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
    # 96 lanes hold 384 (launch_plan.h, row_packs; bench/results/h200-pack-counts/exp_packs.log).
    # fp32 1500 and bf16 2304 alike; 3072 (384 packs: a quarter idle at 8, not more), the powers
    # of two, rows of a warp or less (bf16 H = 8: 1 pack) and rows that 4 packs would spread over
    # more than 128 lanes (bf16 4200: 160) keep 8, odd 3001 its pack fewer; the other ops keep
    # their counts. (packs, G.)
    expected = {(torch.bfloat16, 3000): (4, 96), (torch.float16, 3000): (4, 96), (torch.float32, 1500): (4, 96),
                (torch.bfloat16, 2304): (4, 96), (torch.bfloat16, 3072): (8, 64), (torch.bfloat16, 4096): (8, 64),
                (torch.float32, 3000): (8, 96), (torch.bfloat16, 3001): (7, 64), (torch.bfloat16, 8): (8, 1),
                (torch.bfloat16, 1280): (8, 32), (torch.bfloat16, 4200): (8, 96), (torch.float64, 750): (4, 96)}
    for (dtype, H), packs_g in expected.items():
        f = fields(plan("mul_forward", H, dtype))
        assert (f["packs"], f["G"], f["cluster"]) == (*packs_g, 1), (dtype, H, f)
    for op in ("forward", "backward", "mul_backward"):
        assert fields(plan(op, 3000, torch.bfloat16))["packs"] == PACKS[op], op


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



def test_clusters_of_16_take_load_balancing():
    # csrc/launch_plan.h, row_cluster_policy: a row's clusters of 16 CTAs launch with load
    # balancing, smaller clusters with the default; one CTA a row has no policy. H over each op's
    # cluster range, every dtype: the policy follows the cluster size alone, never H.
    seen = set()
    for op in ALL_OPS:
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            for H in [2**k for k in range(9, 20)] + [2**k + 1 for k in range(9, 20)]:
                text = plan(op, H, dtype)
                if not text.startswith("row "):
                    continue
                f = fields(text)
                if f["cluster"] == 1:
                    assert "policy" not in f, (op, dtype, H, text)
                    continue
                assert f["policy"] == ("load-balancing" if f["cluster"] == 16 else "default"), (op, dtype, H, text)
                seen.add(f["policy"])
    assert seen == {"default", "load-balancing"}, seen  # both reached


def test_fused_backward_rows_of_clusters_on_ctas_of_256_are_staged():
    # csrc/launch_plan.h, row_staged: the fused backward's aligned rows of whole packs on clusters of
    # CTAs of 256 threads, in 2- and 4-byte dtypes, whose every slot is in the row, take the staged
    # build; their misaligned views (pack-realigned) and every other row do not (odd rows, 65537
    # among the sizes, never). H over every op's cluster range (122880 bf16: 16 x 256 threads, 3840
    # lanes of 4096 at work), every dtype: the choice follows the op, the dtype's size and the row's
    # geometry alone.
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
                assert (f.get("build") == "staged") == want, (op, dtype, H, text)
                if want:
                    staged.add((dtype, H))
                    assert "kAlignedStaged" in f["kernel"], text
                    assert fields(plan(op, H, dtype, "pack-realigned"))["build"] == "wide"
                    assert "staged" not in plan(op, H, dtype, clusters=False)  # no clusters: none
    assert (torch.bfloat16, 131072) in staged and (torch.float32, 32768) in staged, staged
    text = plan("mul_backward", 122880, torch.bfloat16)  # every slot not in the row: not staged
    assert fields(text)["threads"] == 256 and "staged" not in text, text



# ---- The fused PolyNorm x mul: its two families -------------------------------------------------
# mul_forward and mul_backward have a row build and a tiled build, as PolyNorm's ops do: forcing
# mul_forward and mul_backward have a row build and a tiled build, as PolyNorm's ops do: asking
# for "row" past the row kernels' register budget is refused, "tiled" serves every row.

def mul_family(op: str, H: int, dtype: torch.dtype, family: str, clusters: bool = True) -> str:
    """The family csrc/launch_plan.h's table gives a row of the fused op for ``family``: the row
    build while the row's threads fit one CTA, or with clusters a cluster (cluster_of), unless
    tiled is asked for; the tiled build otherwise."""
    return "row" if cluster_of(op, dtype, H, clusters) is not None and family != "tiled" else "tiled"


@pytest.mark.parametrize("op", ["mul_forward", "mul_backward"])
@pytest.mark.parametrize("family", ["auto", "row", "tiled"])
def test_mul_ops_families(op, family):
    # On the host: what the GPU tests below rely on, for every H they use and the boundaries.
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        vec = 16 // elem_size(dtype)
        wide_limit = one_cta_limit(op, dtype, True)
        odd_limit = one_cta_limit(op, dtype, False)
        for H in (1, 127, 769, 4096, 5125, wide_limit, wide_limit + vec, odd_limit, odd_limit + 2 * vec, 40000,
                  wide_limit * MAX_CLUSTER, wide_limit * MAX_CLUSTER + vec, 8 * odd_limit, 8 * odd_limit + 2):
            for clusters in (True, False):
                expected = mul_family(op, H, dtype, "auto" if family == "row" else family, clusters)
                for layout in layouts_of(dtype, H):  # the layout never changes the fused op's family
                    if family == "row" and expected == "tiled":
                        with pytest.raises(ValueError, match="the row kernels do not serve"):
                            plan(op, H, dtype, layout, clusters, family)
                        continue
                    text = plan(op, H, dtype, layout, clusters, family)
                    assert text.startswith(expected + " "), (op, family, dtype, H, clusters, layout, text)


# ---- On a GPU: every configuration, explicitly, against the float64 oracle ----------------------

from _matrix import (  # noqa: E402
    Grads,
    MulGrads,
    check_against_oracle,
    check_against_oracle_mul,
    make_params,
    make_rows,
    poisoned_outputs,
    requires_cuda,
    seed_for,
)

EPS = 1e-6
requires_clusters = pytest.mark.skipif(
    not HAS_CLUSTERS, reason="thread-block clusters need a CUDA device of compute capability 9.0 or later"
)


def run_config(op: str, x, g, w, b, family: str, clusters: bool, mul=None, offsets=None):
    """The op's forward and backward through the private ops that take the configuration (``family``,
    ``clusters``) explicitly, every buffer they allocate poisoned first: Grads (PolyNorm, grouped) or
    MulGrads (the fused op, ``mul`` given)."""
    ops = torch.ops.polynorm
    with poisoned_outputs():
        if offsets is not None:
            y, rstd = ops._grouped_forward_config(x, w, b, offsets, EPS, family, clusters)
            dx, dw, db = ops._grouped_backward_config(g, x, w, offsets, rstd, family, clusters)
            # The op returns dW and dB in rstd's dtype (fp64 for fp64 x); autograd rounds each to
            # its parameter's dtype, as here.
            return Grads(y, dx, dw.to(w.dtype), db.to(b.dtype))
        if mul is not None:
            out, rstd = ops._mul_forward_config(x, mul, w, b, EPS, family, clusters)
            return MulGrads(out, *ops._mul_backward_config(g, x, mul, w, b, rstd, family, clusters))
        y, rstd = ops._forward_config(x, w, b, EPS, family, clusters)
        return Grads(y, *ops._backward_config(g, x, w, rstd, family, clusters))


def config_inputs(entry: dict, M: int, gen: torch.Generator):
    """Fresh random x, grad, mul (the fused op), weight, bias (per expert for the grouped op) and, for
    the grouped op, counts and offsets, for rows of the entry's H in its layout: contiguous rows are
    aligned (whole packs) or same-phase (odd H); x one element into its buffer makes them
    pack-realigned or realigned (the outputs are new tensors, aligned)."""
    op, dtype, H = entry["op"], entry["dtype"], entry["H"]
    moved = entry["layout"] in ("pack-realigned", "realigned")
    x = make_rows(M, H, dtype, "cuda", "misaligned" if moved else "contiguous", gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    mul = make_rows(M, H, dtype, "cuda", "contiguous", gen) if op.startswith("mul_") else None
    if op.startswith("grouped_"):
        from test_grouped import make_experts, offsets_of

        counts = [M // 2, 0, M - M // 2 - 1]  # an empty expert, and a last row of no expert
        w, b = make_experts(len(counts), torch.float32, "cuda", gen)
        return x, g, mul, w, b, counts, offsets_of(counts, "cuda")
    w, b = make_params(torch.float32, "cuda", gen)
    return x, g, mul, w, b, None, None


def check_config(entry: dict) -> None:
    """The entry's configuration (its op at its H, layout and clusters) against the float64 oracle,
    on 2 R + 1 rows (R: rows a block), so that a block of several rows has a partial one after it."""
    f = entry["fields"]
    R = f["threads"] // f["G"] if f["family"] == "row" else 1
    M = 2 * R + 1
    what = (f"{entry['op']} H={entry['H']} {entry['dtype']} {entry['layout']} clusters={entry['clusters']}: "
            f"{entry['plan']}")
    gen = torch.Generator().manual_seed(seed_for("config", what))
    x, g, mul, w, b, counts, offsets = config_inputs(entry, M, gen)
    assert x.data_ptr() % 16 == (0 if entry["layout"] in ("aligned", "same-phase") else x.element_size()), what
    out = run_config(entry["op"], x, g, w, b, "auto", entry["clusters"], mul, offsets)
    if offsets is not None:
        from test_grouped import check_grouped

        check_grouped(out, x, g, w, b, counts, EPS, what=what)
    elif mul is not None:
        check_against_oracle_mul(out, x, mul, g, w, b, EPS, what=what)
    else:
        check_against_oracle(out, x, g, w, b, EPS, what=what)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("op", ALL_OPS)
def test_every_configuration_of_the_plan_matches_the_oracle(op, dtype):
    # Every distinct configuration the plan can give this op and dtype (CONFIGS: kernel, layout,
    # cluster, rows a block, tail, passes; with clusters and without), each at its shortest row,
    # explicitly (the private ops' `clusters`: false takes a device without clusters' plan, as sm_80
    # would, on this device too). A device without clusters cannot take the plans with them: those
    # are left to a device that has them.
    entries = [e for e in CONFIGS.values() if e["op"] == op and e["dtype"] == dtype]
    assert len(entries) >= 10, (op, dtype, len(entries))
    failures = []
    for entry in entries:
        if entry["clusters"] and not HAS_CLUSTERS:
            continue
        try:
            check_config(entry)
        except AssertionError as failure:
            failures.append(str(failure).split("\n")[0])
    torch.cuda.empty_cache()
    assert not failures, f"{len(failures)} of {len(entries)} configurations:\n" + "\n".join(failures)


def _kernels_run(fn) -> list[str]:
    """The polynorm CUDA kernels that fn() launches (torch.profiler), named as _launch_plan names them."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "poly_norm" in e.name or "param_sum" in e.name]
    mangled = [n for n in names if n.startswith("_Z")]
    if mangled and shutil.which("c++filt"):
        demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout
        names = [n for n in names if not n.startswith("_Z")] + demangled.split("\n")[: len(mangled)]
    return [instantiations.normalised(n) for n in names]


@requires_cuda
def test_the_plan_names_the_kernel_that_runs():
    # One configuration of each op, build and layout (bf16 and fp32; with clusters where the device
    # has them): the kernel the private op launches is the one _launch_plan names.
    seen, checked = set(), 0
    for entry in CONFIGS.values():
        f = entry["fields"]
        key = (entry["op"], f.get("build", "tiled"), entry["layout"], entry["clusters"])
        if entry["dtype"] not in (torch.bfloat16, torch.float32) or key in seen:
            continue
        if entry["clusters"] and not HAS_CLUSTERS:
            continue
        seen.add(key)
        op, backward = entry["op"], entry["op"].endswith("backward")
        gen = torch.Generator().manual_seed(seed_for("names", entry["plan"]))
        x, g, mul, w, b, counts, offsets = config_inputs(entry, 3, gen)
        ops, clusters = torch.ops.polynorm, entry["clusters"]
        if offsets is not None:
            rstd = ops._grouped_forward_config(x, w, b, offsets, EPS, "auto", clusters)[1]
            fn = (lambda: ops._grouped_backward_config(g, x, w, offsets, rstd, "auto", clusters)) if backward else (
                lambda: ops._grouped_forward_config(x, w, b, offsets, EPS, "auto", clusters))
        elif mul is not None:
            rstd = ops._mul_forward_config(x, mul, w, b, EPS, "auto", clusters)[1]
            fn = (lambda: ops._mul_backward_config(g, x, mul, w, b, rstd, "auto", clusters)) if backward else (
                lambda: ops._mul_forward_config(x, mul, w, b, EPS, "auto", clusters))
        else:
            rstd = ops._forward_config(x, w, b, EPS, "auto", clusters)[1]
            fn = (lambda: ops._backward_config(g, x, w, rstd, "auto", clusters)) if backward else (
                lambda: ops._forward_config(x, w, b, EPS, "auto", clusters))
        ran = _kernels_run(fn)
        assert f["kernel"] in ran, (op, entry["H"], entry["layout"], clusters, f["kernel"], ran)
        checked += 1
    assert checked >= (40 if HAS_CLUSTERS else 20), checked  # 57 with clusters, 24 without


@requires_cuda
@pytest.mark.parametrize("family", ["auto", "tiled"])
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("H", [1, 127, 769, 1024, 5125])
def test_every_family_matches_the_oracle(family, layout, dtype, H):
    # Each family serves these rows when asked, so the tiled kernels, which the table takes only
    # for long rows, are checked at small H too; 1024 (whole packs) reaches the aligned and
    # pack-realigned wide builds, the odd H the same-phase and realigned ones (the narrow build in
    # the bf16 forward).
    assert plan("forward", H, dtype, family=family).startswith("tiled " if family == "tiled" else "row ")
    gen = torch.Generator().manual_seed(seed_for("family", family, H, dtype, layout))
    x = make_rows(37, H, dtype, "cuda", layout, gen)
    g = make_rows(37, H, dtype, "cuda", layout, gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_config("forward", x, g, w, b, family, True)
    check_against_oracle(out, x, g, w, b, EPS, what=f"{family} H={H} {dtype} {layout}")


@requires_cuda
@pytest.mark.parametrize("family", ["auto", "tiled"])
def test_every_family_gives_the_same_bits_on_every_run(family):
    gen = torch.Generator().manual_seed(seed_for("family-bits", family))
    x = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    first = run_config("forward", x, g, w, b, family, True)
    again = run_config("forward", x, g, w, b, family, True)
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name


@requires_cuda
def test_the_row_family_is_refused_where_it_cannot_serve():
    # bf16 forward rows of 65545 elements need more than one CTA: without clusters only the tiled
    # kernels serve them, and asking for the row kernels says so.
    gen = torch.Generator().manual_seed(seed_for("row-refused"))
    x = make_rows(2, 65545, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    with pytest.raises(RuntimeError, match="polynorm._forward_config: the row kernels do not serve rows of 65545"):
        torch.ops.polynorm._forward_config(x, w, b, EPS, "row", False)
    with pytest.raises(ValueError, match="polynorm._forward_config: expected family to be one of auto, row, tiled"):
        torch.ops.polynorm._forward_config(x, w, b, EPS, "fast", False)
    y, _ = torch.ops.polynorm._forward_config(x, w, b, EPS, "auto", False)  # the tiled kernel
    assert torch.equal(y, torch.ops.polynorm._forward_config(x, w, b, EPS, "tiled", True)[0])


# (H, x layout, mul layout, grad_out layout). Beside the matrix of test_every_family_matches_the_oracle:
# - H = 4096, x and grad_out aligned with a misaligned mul (a view one element into a buffer):
#   the realigning row build, which realigns mul's rows and not x's (and the reverse);
# - H = 40000, past every row build's budget without clusters: the tiled build with misaligned inputs.
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
@pytest.mark.parametrize("family", ["auto", "tiled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "H,x_layout,mul_layout,g_layout", MUL_LAYOUT_CASES, ids=["-".join(map(str, case)) for case in MUL_LAYOUT_CASES]
)
def test_every_mul_family_matches_the_oracle(family, dtype, H, x_layout, mul_layout, g_layout):
    # The plan says which family runs: the tiled build where asked, or past the row builds'
    # budget (without clusters: 40000 in every dtype).
    for op in ("mul_forward", "mul_backward"):
        expected = mul_family(op, H, dtype, family, False)
        assert plan(op, H, dtype, clusters=False, family=family).startswith(expected + " "), (op, family, H, dtype)
    key = ("family-mul", family, H, dtype, x_layout, mul_layout, g_layout)
    gen = torch.Generator().manual_seed(seed_for(*key))
    x = make_rows(37, H, dtype, "cuda", x_layout, gen)
    mul = make_rows(37, H, dtype, "cuda", mul_layout, gen)
    g = make_rows(37, H, dtype, "cuda", g_layout, gen)
    w, b = make_params(torch.float32, "cuda", gen)
    out = run_config("mul_forward", x, g, w, b, family, False, mul=mul)
    what = f"{family} H={H} {dtype} x {x_layout}, mul {mul_layout}, grad_out {g_layout}"
    check_against_oracle_mul(out, x, mul, g, w, b, EPS, what=what)


@requires_cuda
@pytest.mark.parametrize("family", ["auto", "tiled"])
def test_every_mul_family_gives_the_same_bits_on_every_run(family):
    gen = torch.Generator().manual_seed(seed_for("family-mul-bits", family))
    x, mul, g = (make_rows(1000, 769, torch.bfloat16, "cuda", "contiguous", gen) for _ in range(3))
    w, b = make_params(torch.float32, "cuda", gen)
    first = run_config("mul_forward", x, g, w, b, family, True, mul=mul)
    again = run_config("mul_forward", x, g, w, b, family, True, mul=mul)
    for name in ("out", "dx", "dmul", "dw", "db"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
