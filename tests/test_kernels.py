"""Kernel behaviour beyond plain parity: numerical robustness, determinism, batch
invariance, huge inputs, CUDA graphs. Each test runs every kernel backend it applies to."""

import pytest
import torch
from _matrix import (
    assert_graph_replay_matches_eager,
    autograd_reference,
    check_against_oracle,
    check_against_oracle_mul,
    make_params,
    make_rows,
    poisoned_outputs,
    rel_l2,
    requires_cuda,
    requires_interpreter,
    requires_triton,
    run_backend,
    run_backend_mul,
    seed_for,
)

# (device, backend) pairs of this project's kernels.
KERNELS = [("cpu", "auto"), pytest.param("cuda", "cuda", marks=requires_cuda)]


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("H", [127, 4096])
def test_fp16_large_values_stay_finite(device, backend, H):
    # |x| up to 60000: x^6 ~ 4.7e28 overflows fp16 by far, not the fp32 accumulators.
    gen = torch.Generator().manual_seed(seed_for("fp16big", device, H))
    x = ((torch.rand(8, H, generator=gen) * 2 - 1) * 60000).to(torch.float16).to(device)
    g = torch.randn(8, H, generator=gen).to(torch.float16).to(device)
    w, b = make_params(torch.float32, device, gen)
    out = run_backend(backend, x, g, w, b, 1e-6)
    check_against_oracle(out, x, g, w, b, 1e-6, what="fp16 +-60000")


MAGNITUDE_KERNELS = [
    ("cpu", "auto"),
    ("cpu", "reference"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter]),
    pytest.param("cuda", "cuda", marks=requires_cuda),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda]),
]


@pytest.mark.parametrize("device,backend", MAGNITUDE_KERNELS)
@pytest.mark.parametrize("dtype,scale,eps", [(torch.float32, 1e5, 1e-6), (torch.bfloat16, 1e5, 1e-6), (torch.float32, 1e-5, 0.0)])
def test_backward_at_extreme_magnitudes(device, backend, dtype, scale, eps):
    # Forward is exact here; dx must be too, although r_3^3 alone leaves fp32's range (the
    # reference backend, plain autograd, too: it divides by the square root).
    gen = torch.Generator().manual_seed(seed_for("magnitude", device, backend, dtype, scale))
    x = make_rows(6, 512, dtype, device, "contiguous", gen, scale=scale)
    g = make_rows(6, 512, dtype, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    out = run_backend(backend, x, g, w, b, eps)
    oracle = autograd_reference(x, g, w, b, eps, torch.float64)
    # An fp32 rsqrt-based autograd reference is 17% off (fp32) or infinite (eps = 0) here,
    # so the bound is the dtype's own: about one rounding of the exact result to x's dtype
    # (docs/MATH.md: 1.7e-3 for bf16 on randn) with margin, and 1e-6 for fp32 arithmetic.
    bound = 2.5e-3 if dtype == torch.bfloat16 else 1e-6
    for name in ("y", "dx"):
        err = rel_l2(getattr(out, name), getattr(oracle, name))
        assert err <= bound, f"{name}: rel L2 error {err:.3e} > {bound:.1e} at |x| ~ {scale}, eps = {eps}"


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_confined_to_its_row(device, backend, bad):
    gen = torch.Generator().manual_seed(seed_for("nonfinite", device, bad))
    x = make_rows(6, 300, torch.bfloat16, device, "contiguous", gen)
    x[2, 17] = bad
    g = make_rows(6, 300, torch.bfloat16, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    out = run_backend(backend, x, g, w, b, 1e-6)
    assert not torch.isfinite(out.y[2]).all()
    others = [0, 1, 3, 4, 5]
    assert torch.isfinite(out.y[others]).all() and torch.isfinite(out.dx[others]).all()
    ref = autograd_reference(x[others], g[others], w, b, 1e-6, torch.float32)
    torch.testing.assert_close(out.y[others], ref.y, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_row(device, backend, dtype):
    gen = torch.Generator().manual_seed(seed_for("zero", device, dtype))
    x = make_rows(4, 64, dtype, device, "contiguous", gen)
    x[1] = 0
    g = make_rows(4, 64, dtype, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    # eps > 0: y = b on the zero row, and every gradient is finite.
    out = run_backend(backend, x, g, w, b, 1e-6)
    assert torch.equal(out.y[1], b.to(dtype).expand(64))
    for t in (out.dx, out.dw, out.db):
        assert torch.isfinite(t).all()
    # eps = 0: 0 * inf = NaN on that row, exactly as the oracle says.
    out0 = run_backend(backend, x, g, w, b, 0.0)
    ref0 = autograd_reference(x, g, w, b, 0.0, torch.float64)
    assert torch.equal(torch.isnan(out0.y), torch.isnan(ref0.y))
    torch.testing.assert_close(out0.y[[0, 2, 3]].double(), ref0.y[[0, 2, 3]], rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("H", [769, 8192, 65536])
def test_backward_deterministic(device, backend, H):
    gen = torch.Generator().manual_seed(seed_for("determinism", device, H))
    M = 300 if device == "cuda" else 20
    x = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    g = make_rows(M, H, torch.bfloat16, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    first = run_backend(backend, x, g, w, b, 1e-6)
    for _ in range(9):
        again = run_backend(backend, x, g, w, b, 1e-6)
        for name in ("y", "dx", "dw", "db"):
            assert torch.equal(getattr(first, name), getattr(again, name)), name


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H", [3, 1024, 5125, 65536])
def test_batch_invariance(device, backend, dtype, H):
    # Launch choices depend on H and dtype only: a row's y is the same in any batch.
    gen = torch.Generator().manual_seed(seed_for("batch", device, dtype, H))
    sizes = [1, 255, 256, 257, 4096] if device == "cuda" else [1, 255, 256, 257]
    if H >= 65536:
        sizes = [1, 255, 256, 257]
    big = make_rows(max(sizes), H, dtype, device, "contiguous", gen)
    row = big[0:1].clone()
    w, b = make_params(torch.float32, device, gen)
    import polynorm

    alone = polynorm.poly_norm(row, w, b, backend=backend)
    for n in sizes:
        batch = torch.cat([row, big[1:n]]) if n > 1 else row.clone()
        perm = torch.randperm(n, generator=gen)  # the row lands anywhere in the batch
        at = int((perm == 0).nonzero())
        y = polynorm.poly_norm(batch[perm], w, b, backend=backend)
        assert torch.equal(y[at : at + 1], alone), f"batch of {n}"


@requires_cuda
def test_more_than_2_pow_31_elements():
    # bf16, numel > 2^31: 64-bit offsets. Checked on the first and last rows.
    H = 16384
    M = 2**31 // H + 3
    gen = torch.Generator(device="cuda").manual_seed(seed_for("huge"))
    x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    w, b = make_params(torch.float32, "cuda", torch.Generator().manual_seed(1))
    y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
    dx, dw, db = torch.ops.polynorm.backward(g, x, w, rstd)
    for rows in (slice(0, 2), slice(M - 2, M)):
        ref = autograd_reference(x[rows], g[rows], w, b, 1e-6, torch.float32)
        torch.testing.assert_close(y[rows], ref.y, rtol=1.6e-2, atol=1e-2)
        torch.testing.assert_close(dx[rows], ref.dx, rtol=1.6e-2, atol=1e-2)
    assert torch.isfinite(dw).all() and torch.isfinite(db).all()
    del x, g, y, dx
    torch.cuda.empty_cache()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_capture(dtype):
    # No host synchronisation and no allocation outside the caching allocator: capturable.
    gen = torch.Generator().manual_seed(seed_for("graph", dtype))
    x = make_rows(64, 4096, dtype, "cuda", "contiguous", gen)
    g = make_rows(64, 4096, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    fresh = lambda: make_rows(64, 4096, dtype, "cuda", "contiguous", gen)  # noqa: E731
    assert_graph_replay_matches_eager(x, g, w, b, fresh, fresh)
    check_against_oracle(run_backend("cuda", x, g, w, b, 1e-6), x, g, w, b, 1e-6, what="after graph")


@pytest.mark.parametrize("device,backend", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [64, 65, 257, 263, 3000, 4096, 4097, 5125, 16385])
@pytest.mark.parametrize("shift", [1, 3, "strided", "x-only", "g-stride0"])
def test_misaligned_rows_give_the_aligned_bits(device, backend, dtype, H, shift):
    # The same rows, once 16-byte aligned and once starting `shift` elements into a buffer
    # (or `strided`: rows H + 3 elements apart, x's and grad_y's each starting at another offset;
    # `x-only`: x one element in, grad_y aligned, as autograd passes a view's gradient;
    # `g-stride0`: x one element in beside a grad_y of one row expanded (row stride 0), as the
    # gradient of a sum is): the kernels realign what they load, so y, dx, dw and db are
    # bitwise the same. H = 65, 257, 4097, 16385: a row one element past whole packs, whose
    # last element its last lane holds apart (launch_plan.h, slot_packs), on 1-4 threads a row
    # (several rows a warp) and on more.
    gen = torch.Generator().manual_seed(seed_for("misaligned-bits", device, dtype, H, shift))
    M = 67 if device == "cuda" else 5
    x = make_rows(M, H, dtype, device, "contiguous", gen)
    g = make_rows(M, H, dtype, device, "contiguous", gen)
    w, b = make_params(torch.float32, device, gen)
    if shift == "strided":
        buf = torch.empty(M, H + 3, dtype=dtype, device=device)
        x_mis, g_mis = buf[:, 1 : H + 1], torch.empty_like(buf)[:, 2 : H + 2]
    elif shift == "x-only":
        x_mis = torch.empty(M * H + 1, dtype=dtype, device=device)[1:].view(M, H)
        g_mis = torch.empty_like(g)
    elif shift == "g-stride0":
        x_mis = torch.empty(M * H + 1, dtype=dtype, device=device)[1:].view(M, H)
        g = g[:1].expand(M, H).contiguous()  # the aligned run's grad_y: the same row in every row
        g_mis = torch.empty(1, H, dtype=dtype, device=device).expand(M, H)
    else:
        x_mis = torch.empty(M * H + shift, dtype=dtype, device=device)[shift:].view(M, H)
        g_mis = torch.empty(M * H + shift, dtype=dtype, device=device)[shift:].view(M, H)
    x_mis.copy_(x)
    if shift == "g-stride0":
        g_mis[:1].copy_(g[:1])
        assert g_mis.stride(0) == 0
    else:
        g_mis.copy_(g)
    assert x_mis.data_ptr() % 16 != 0
    aligned = run_backend(backend, x, g, w, b, 1e-6)
    moved = run_backend(backend, x_mis, g_mis, w, b, 1e-6)
    for name in ("y", "dx", "dw", "db"):
        assert torch.equal(getattr(aligned, name), getattr(moved, name)), name


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,M", [(1024, 8192), (4097, 8192), (65536, 512)])
@pytest.mark.parametrize("op", ["poly_norm", "poly_norm_mul"])
def test_param_grads_of_many_rows_do_not_depend_on_the_layout(op, dtype, H, M):
    # M far above the blocks (clusters at H = 65536, but fp32 mul_backward's rows, which are
    # tiled there) the backward's persistent grid keeps resident, so each block sums many rows
    # into its dW/dB partial: the grid, and so the order of those sums, must be the same
    # whichever build serves the layout (H = 1024 and 65536: the aligned and realigned builds;
    # 4097: the same-phase build for contiguous rows, the realigned one for the views). With
    # today's builds (126-128 registers each) the grids would match even if each build sized its
    # own: this guards the launch's sizing by one build against a build whose occupancy changes.
    gen = torch.Generator().manual_seed(seed_for("param-grads-layout", op, dtype, H))
    x = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    mul = make_rows(M, H, dtype, "cuda", "contiguous", gen)

    def run(x_in):  # every output poisoned first (run_backend, run_backend_mul)
        if op == "poly_norm":
            out = run_backend("cuda", x_in, g, w, b, 1e-6)
            return {name: getattr(out, name) for name in ("y", "dx", "dw", "db")}
        return vars(run_backend_mul("cuda", x_in, mul, g, w, b, 1e-6))

    reference = run(x)
    shifted = torch.empty(M * H + 1, dtype=dtype, device="cuda")[1:].view(M, H)
    strided = torch.empty(M, H + 3, dtype=dtype, device="cuda")[:, 1 : H + 1]
    for name, x_view in (("shifted", shifted), ("strided", strided)):
        x_view.copy_(x)
        moved = run(x_view)
        for out, value in reference.items():
            assert torch.equal(value, moved[out]), f"{name}: {out}"


def _cuda_rows(key, op, M, H, dtype):
    """Fresh random x, grad, weight, bias on the GPU, and mul for the fused op (None otherwise)."""
    gen = torch.Generator().manual_seed(seed_for(key, op, dtype, H))
    x = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    g = make_rows(M, H, dtype, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    mul = make_rows(M, H, dtype, "cuda", "contiguous", gen) if op == "poly_norm_mul" else None
    return x, g, w, b, mul


def _check_cuda_against_oracle(x, g, w, b, mul, what):
    """The CUDA backend through autograd (PolyNorm, or the fused op when mul is given) against
    the float64 oracle."""
    if mul is None:
        check_against_oracle(run_backend("cuda", x, g, w, b, 1e-6), x, g, w, b, 1e-6, what=what)
    else:
        out = run_backend_mul("cuda", x, mul, g, w, b, 1e-6)
        check_against_oracle_mul(out, x, mul, g, w, b, 1e-6, what=what)


def _ops_run(x, g, w, b, mul):
    """forward and backward through the ops (every output poisoned first): PolyNorm's y, rstd, grad_x,
    grad_weight, grad_bias, or the fused op's out, rstd, grad_x, grad_mul, grad_weight, grad_bias."""
    ops = torch.ops.polynorm
    with poisoned_outputs():
        if mul is None:
            y, rstd = ops.forward(x, w, b, 1e-6)
            return (y, rstd, *ops.backward(g, x, w, rstd))
        out, rstd = ops.mul_forward(x, mul, w, b, 1e-6)
        return (out, rstd, *ops.mul_backward(g, x, mul, w, b, rstd))


def fields_of(text: str) -> dict:
    """A launch plan's key=value fields (torch.ops.polynorm._launch_plan)."""
    return dict(part.split("=", 1) for part in text.split()[1:])


def _kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels that ``fn()`` launches (torch.profiler)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@requires_cuda
@pytest.mark.parametrize("H,M,dtype", [(1024, 40000, torch.bfloat16), (65536, 1024, torch.bfloat16),
                                       (4096, 2048, torch.bfloat16), (5125, 600, torch.float32),
                                       (5125, 600, torch.bfloat16)])
@pytest.mark.parametrize("op", ["poly_norm", "poly_norm_mul"])
def test_staggered_grids_give_the_rows_of_short_batches(op, H, M, dtype):
    # A row grid starts in staggered quarters (csrc/launch_plan.h) when it holds rounds of rows or
    # waves of blocks: a persistent grid all of it (row_stagger_cycles: on an H200 both directions'
    # at 65536 x 1024, whose forward runs on clusters, and the fused backward at 1024 x 40000), a
    # grid of a block per R rows its first wave (row_wave_stagger_cycles: the forwards at
    # 1024 x 40000; the fused forward at 4096 x 2048, between one and two waves). The delay only
    # moves when blocks start: each row's outputs (poisoned first) in the staggered grid of M rows
    # equal the same rows' in a batch of 8, whose grid starts whole; dW and dB (summed in another
    # order) meet the float64 oracle at the small shapes. (The large shapes hold ~1 GB a test.)
    x, g, w, b, mul = _cuda_rows("stagger", op, M, H, dtype)
    rows = slice(M // 2, M // 2 + 8)  # rows of a block far from the grid's first wave
    full = _ops_run(x, g, w, b, mul)
    few = _ops_run(x[rows], g[rows], w, b, None if mul is None else mul[rows])
    per_row = (0, 1, 2) if mul is None else (0, 1, 2, 3)  # y / out, rstd, grad_x (, grad_mul)
    for k in per_row:
        assert torch.equal(full[k][rows], few[k]), f"output {k}: a staggered grid's rows differ"
    if M * H <= 2**22:
        _check_cuda_against_oracle(x, g, w, b, mul, f"H={H} M={M}")
    del x, g, mul, full, few
    torch.cuda.empty_cache()


@requires_cuda
@pytest.mark.parametrize("H,M,dtype", [(1024, 40000, torch.bfloat16), (65536, 1024, torch.bfloat16),
                                       (4096, 16384, torch.float32), (5125, 8192, torch.bfloat16)])
@pytest.mark.parametrize("op", ["poly_norm", "poly_norm_mul"])
def test_param_grads_summed_apart(op, H, M, dtype):
    # The backward's dW / dB partials are summed by a kernel of their own where the persistent grid
    # would take 4 rounds of rows or more (csrc/launch_plan.h, row_sum_apart: these shapes on an H100
    # or H200; PolyNorm's one-CTA rows of whole packs that fill their lanes then take a block per R
    # rows), by the row kernel's last block otherwise. Here the launch sums apart (param_sum_kernel
    # runs, where the rows are the row kernels'), its outputs are the same bits on every run, grad_x
    # (and grad_mul) are the bits of the same rows in batches of 64 (each summed by its last block),
    # and dW / dB are within fp32 summation error of those batches' sums (another order: one
    # partial lost or counted twice is off by orders of magnitude more). The largest case, the
    # fused op at 65536 x 1024, holds about 1.8 GB.
    x, g, w, b, mul = _cuda_rows("apart", op, M, H, dtype)
    ops = torch.ops.polynorm
    rstd = (ops.forward(x, w, b, 1e-6) if mul is None else ops.mul_forward(x, mul, w, b, 1e-6))[1]

    def backward(rows=slice(None)):
        with poisoned_outputs():
            if mul is None:
                return ops.backward(g[rows], x[rows], w, rstd[rows])
            return ops.mul_backward(g[rows], x[rows], mul[rows], w, b, rstd[rows])

    op_name = "backward" if mul is None else "mul_backward"
    clusters = torch.cuda.get_device_capability() >= (9, 0)
    if ops._launch_plan(op_name, H, dtype, "", clusters).startswith("row "):
        assert any("param_sum_kernel" in n for n in _kernel_names(backward)), "the partials were not summed apart"
    got, again = backward(), backward()
    for k in range(len(got)):
        assert torch.equal(got[k], again[k]), f"output {k} differs between runs"
    parts = [backward(slice(start, start + 64)) for start in range(0, M, 64)]
    for k in range(len(got) - 2):  # grad_x, grad_mul
        assert torch.equal(got[k], torch.cat([p[k] for p in parts])), f"output {k}"
    tolerance = 4 * M**0.5 * torch.finfo(torch.float32).eps
    for k in (-2, -1):  # grad_weight, grad_bias
        summed = torch.stack([p[k] for p in parts]).double().sum(0)
        rel = float((got[k].double() - summed).abs().max() / summed.abs().max())
        assert rel <= tolerance, f"output {k} off the batches' sum by {rel:.3g} (tolerance {tolerance:.3g})"
    del x, g, mul, got, again, parts
    torch.cuda.empty_cache()


@requires_cuda
@pytest.mark.parametrize("H,M,dtype", [(131072, 32, torch.bfloat16), (65536, 96, torch.float16),
                                       (32768, 128, torch.float32)])
def test_staged_rows_change_no_bit(H, M, dtype):
    # The fused backward's aligned rows of clusters on CTAs of 256 take the staged build (csrc/launch_plan.h,
    # row_staged: on a device with clusters, 16 x 256 at bf16 131072, 8 x 256 at fp16 65536 and fp32
    # 32768). Each cluster of the persistent grid walks several of these M rows, so the next row's copies
    # are issued and read back. The staged rows hold the same packs and sums as the unstaged build that a
    # misaligned view of the same rows takes (pack-realigned): every output of the backward (poisoned
    # first) is the same bits, and the staged build meets the float64 oracle through autograd.
    x, g, w, b, mul = _cuda_rows("staged", "poly_norm_mul", M, H, dtype)
    ops = torch.ops.polynorm
    if torch.cuda.get_device_capability() >= (9, 0):  # a device that launches clusters
        assert fields_of(ops._launch_plan("mul_backward", H, dtype))["build"] == "staged"
        assert fields_of(ops._launch_plan("mul_backward", H, dtype, "pack-realigned"))["build"] == "wide"
    rstd = ops.mul_forward(x, mul, w, b, 1e-6)[1]
    x_view = torch.empty(M * H + 1, dtype=dtype, device="cuda")[1:].view(M, H).copy_(x)

    def backward(x_in):
        with poisoned_outputs():
            return ops.mul_backward(g, x_in, mul, w, b, rstd)

    staged, unstaged = backward(x), backward(x_view)
    for k, (want, got) in enumerate(zip(unstaged, staged)):
        assert torch.equal(want, got), f"output {k}: the staged rows' bits differ from the unstaged build's"
    _check_cuda_against_oracle(x, g, w, b, mul, f"H={H} staged")
    del x, g, mul, x_view, staged, unstaged
    torch.cuda.empty_cache()


@requires_cuda
@pytest.mark.parametrize("M,H", [(512, 4096), (16384, 4096), (64, 65536), (2048, 65536)])
def test_cuda_graph_capture_of_either_param_sum(M, H):
    # The sum apart is a second launch (a programmatic dependent launch on sm_90): captured and
    # replayed like the rest, after a row kernel of one CTA and after one of clusters (65536 on a
    # device with clusters), its results bitwise equal to eager calls. The last block sums the
    # short batches' partials, a kernel of their own the long ones' (4096: on every device of 132
    # SMs or fewer; the profiler says which).
    clusters = torch.cuda.get_device_capability() >= (9, 0)
    if H == 65536 and not clusters:
        pytest.skip("bf16 backward rows of 65536 are tiled without clusters: no partials summed apart")
    gen = torch.Generator().manual_seed(seed_for("graph apart", M, H))
    x = make_rows(M, H, torch.bfloat16, "cuda", "contiguous", gen)
    g = make_rows(M, H, torch.bfloat16, "cuda", "contiguous", gen)
    w, b = make_params(torch.float32, "cuda", gen)
    rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)[1]
    apart = any("param_sum_kernel" in n for n in _kernel_names(lambda: torch.ops.polynorm.backward(g, x, w, rstd)))
    if H == 4096:
        assert apart == (M > 512), (M, apart)
    fresh = lambda: make_rows(M, H, torch.bfloat16, "cuda", "contiguous", gen)  # noqa: E731
    assert_graph_replay_matches_eager(x, g, w, b, fresh, fresh)
    check_against_oracle(run_backend("cuda", x, g, w, b, 1e-6), x, g, w, b, 1e-6, what=f"apart {apart}")
