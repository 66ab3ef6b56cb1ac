"""The public API: errors, autograd wiring, opcheck, gradcheck, the module, no input mutation."""

import re

import pytest
import torch

import polynorm
from _matrix import DEVICES, make_params, requires_cuda, requires_interpreter, requires_triton, seed_for

OPS = [torch.ops.polynorm.forward.default, torch.ops.polynorm.backward.default]


def _inputs(device, M=4, H=16, dtype=torch.float32, gen_key="api"):
    gen = torch.Generator().manual_seed(seed_for(gen_key, device, M, H, dtype))
    x = torch.randn(M, H, generator=gen).to(dtype).to(device)
    w, b = make_params(torch.float32, device, gen)
    return x, w, b


# ---------------------------------------------------------------------------- errors
FORWARD_ERRORS = [
    ("int x", lambda x, w, b: (x.to(torch.int32), w, b, 1e-6), RuntimeError, "polynorm.forward: expected x to be float32, float64, float16 or bfloat16, got Int"),
    ("0-d x", lambda x, w, b: (x[0, 0], w, b, 1e-6), RuntimeError, "polynorm.forward: expected x to have at least 1 dimension"),
    ("H = 0", lambda x, w, b: (x[:, :0], w, b, 1e-6), RuntimeError, "polynorm.forward: expected x to have a last dimension H >= 1"),
    ("weight numel", lambda x, w, b: (x, w[:2], b, 1e-6), RuntimeError, "polynorm.forward: expected weight of shape [3] ([w0, w1, w2]), got [2]"),
    ("int weight", lambda x, w, b: (x, w.long(), b, 1e-6), RuntimeError, "polynorm.forward: expected weight to be float32, float64, float16 or bfloat16, got Long"),
    ("bias numel", lambda x, w, b: (x, w, torch.cat([b, b]), 1e-6), RuntimeError, "polynorm.forward: expected bias of shape [1] or [] (one number), got [2]"),
    ("negative eps", lambda x, w, b: (x, w, b, -1e-6), ValueError, "polynorm.forward: expected eps to be finite and >= 0, got -1e-06"),
    ("nan eps", lambda x, w, b: (x, w, b, float("nan")), ValueError, "polynorm.forward: expected eps to be finite and >= 0, got nan"),
    ("inf eps", lambda x, w, b: (x, w, b, float("inf")), ValueError, "polynorm.forward: expected eps to be finite and >= 0, got inf"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,exc,message", FORWARD_ERRORS, ids=[e[0] for e in FORWARD_ERRORS])
def test_forward_errors(device, name, make, exc, message):
    x, w, b = _inputs(device)
    with pytest.raises(exc, match=re.escape(message)):
        torch.ops.polynorm.forward(*make(x, w, b))
    if device == "cuda":
        torch.ones(4, device="cuda").sum().item()  # no deferred illegal-address error


def _backward_args(device):
    x, w, b = _inputs(device)
    _, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
    return torch.randn_like(x), x, w, rstd


BACKWARD_ERRORS = [
    ("grad_y shape", lambda g, x, w, r: (g[:, :3], x, w, r), "polynorm.backward: expected grad_y to have x's shape [4, 16], got [4, 3]"),
    ("grad_y dtype", lambda g, x, w, r: (g.double(), x, w, r), "polynorm.backward: expected grad_y to have x's dtype Float, got Double"),
    ("rstd shape", lambda g, x, w, r: (g, x, w, r[:3]), "polynorm.backward: expected rstd of shape [4, 3]"),
    ("rstd dtype", lambda g, x, w, r: (g, x, w, r.double()), "polynorm.backward: expected rstd of dtype Float for x of dtype Float, got Double"),
    ("weight numel", lambda g, x, w, r: (g, x, w[:1], r), "polynorm.backward: expected weight of shape [3] ([w0, w1, w2]), got [1]"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make,message", BACKWARD_ERRORS, ids=[e[0] for e in BACKWARD_ERRORS])
def test_backward_errors(device, name, make, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.ops.polynorm.backward(*make(*_backward_args(device)))
    if device == "cuda":
        torch.ones(4, device="cuda").sum().item()


@requires_cuda
@pytest.mark.parametrize("which", ["weight", "bias", "x"])
def test_device_mismatch(which):
    x, w, b = _inputs("cuda")
    args = {"x": x, "weight": w, "bias": b}
    args[which] = args[which].cpu()
    with pytest.raises(RuntimeError, match=r"polynorm\.forward: expected .* on x's device|polynorm\.forward: expected x on a CUDA device"):
        torch.ops.polynorm.forward(args["x"], args["weight"], args["bias"], 1e-6)
    torch.ones(4, device="cuda").sum().item()


@pytest.mark.parametrize("which", ["weight", "bias"])
def test_device_mismatch_meta(which):
    # Runs without a GPU: a parameter on the meta device sends the call to the fake
    # kernel, which must refuse it rather than return uninitialised CPU tensors.
    x, w, b = _inputs("cpu")
    args = {"weight": w, "bias": b}
    args[which] = args[which].to("meta")
    with pytest.raises(RuntimeError, match=rf"polynorm\.forward: expected {which} on x's device cpu, got meta"):
        torch.ops.polynorm.forward(x, args["weight"], args["bias"], 1e-6)
    g, x2, w2, rstd = _backward_args("cpu")
    with pytest.raises(RuntimeError, match=r"polynorm\.backward: expected weight on x's device cpu, got meta"):
        torch.ops.polynorm.backward(g, x2, w2.to("meta"), rstd)


@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_none_arguments(which):
    x, w, b = _inputs("cpu")
    args = {"x": x, "weight": w, "bias": b}
    args[which] = None
    with pytest.raises(RuntimeError, match=rf"polynorm\.forward: expected {which} to be a Tensor, got None"):
        torch.ops.polynorm.forward(args["x"], args["weight"], args["bias"], 1e-6)


def test_reference_backend_validates():
    x, w, b = _inputs("cpu")
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm: expected x to be float32, float64, float16 or bfloat16, got torch\.int32"):
        polynorm.poly_norm(x.int(), w, b, backend="reference")
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm: expected weight of shape \[3\] \(\[w0, w1, w2\]\), got \[4\]"):
        polynorm.poly_norm(x, torch.ones(4), b, backend="reference")
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm: expected eps to be finite and >= 0, got -1"):
        polynorm.poly_norm(x, w, b, -1.0, backend="reference")


@pytest.mark.parametrize("fullgraph,dynamic", [(False, None), (True, None), (True, True)])
def test_reference_backend_validates_under_compile(fullgraph, dynamic):
    # Dynamo traces the reference path's checks: a bad argument raises (under fullgraph as
    # Dynamo's error carrying the message) instead of computing on it, and a valid eps,
    # which Dynamo may turn into a symbolic float, compiles without a graph break.
    torch._dynamo.reset()  # the lambda's code object, and so Dynamo's cache, is shared by the cases
    x, w, b = _inputs("cpu")
    f = torch.compile(
        lambda x, eps: polynorm.poly_norm(x, w, b, eps, backend="reference"),
        fullgraph=fullgraph, dynamic=dynamic, backend="aot_eager",
    )
    for eps in (1e-6, 1e-5, 0.25):
        torch.testing.assert_close(f(x, eps), polynorm.poly_norm(x, w, b, eps, backend="reference"), rtol=0, atol=0)
    with pytest.raises(RuntimeError if not fullgraph else Exception, match=r"polynorm\.poly_norm: expected x to be float32"):
        f(x.long(), 1e-6)
    with pytest.raises(ValueError if not fullgraph else Exception, match=r"polynorm\.poly_norm: expected eps to be finite and >= 0"):
        f(x, -1.0)
    with pytest.raises(ValueError if not fullgraph else Exception, match=r"polynorm\.poly_norm: expected eps to be finite and >= 0"):
        f(x, float("nan"))


@pytest.mark.parametrize("backend", ["auto", "reference", pytest.param("triton", marks=[requires_triton, requires_interpreter])])
def test_eps_any_real_scalar(backend):
    # eps may be a NumPy scalar or a one-element tensor, as the C++ op's float argument allows.
    np = pytest.importorskip("numpy")
    x, w, b = _inputs("cpu")
    expected = polynorm.poly_norm(x, w, b, 1e-3, backend=backend)
    for eps in (np.float32(1e-3), np.float64(1e-3), torch.tensor(1e-3, dtype=torch.float64)):
        got = polynorm.poly_norm(x, w, b, eps, backend=backend)
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=0)
        module = polynorm.PolyNorm(eps=eps, backend=backend)
        assert type(module.eps) is float


@pytest.mark.parametrize("eps,what", [("1e-6", "str"), (1e-6j, "complex"), (torch.ones(2), "a tensor of shape [2]")])
def test_eps_not_a_real_number(eps, what):
    # The ops' schemas refuse these themselves ("float eps"); the Python paths say so too.
    x, w, b = _inputs("cpu")
    with pytest.raises(TypeError, match=rf"polynorm\.poly_norm: expected eps to be a real number, got {re.escape(what)}"):
        polynorm.poly_norm(x, w, b, eps, backend="reference")
    with pytest.raises(TypeError, match=rf"polynorm\.PolyNorm: expected eps to be a real number, got {re.escape(what)}"):
        polynorm.PolyNorm(eps=eps)


def test_module_validates_arguments():
    with pytest.raises(ValueError, match=r"polynorm\.PolyNorm: expected eps to be finite and >= 0, got nan"):
        polynorm.PolyNorm(eps=float("nan"))
    with pytest.raises(ValueError, match=r"polynorm\.PolyNorm: expected backend to be one of auto, cuda, triton, reference, got 'nope'"):
        polynorm.PolyNorm(backend="nope")


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_is_refused(device):
    # A gradient of the gradient is not implemented; it must raise, not come out as zeros.
    x, w, b = _inputs(device, dtype=torch.float64)
    x = x.requires_grad_()
    (gx,) = torch.autograd.grad(polynorm.poly_norm(x, w, b).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"polynorm\.backward: differentiating PolyNorm's gradient"):
        gx.pow(2).sum().backward()


# The README's shapes, exactly: weight (3,), bias (1,) or (); grouped weight [E, 3], bias [E] or
# [E, 1]. Every other shape of as many elements is refused by every backend, the module's included.
SHAPE_BACKENDS = [
    ("cpu", "auto"), ("cpu", "reference"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter]),
    pytest.param("cuda", "cuda", marks=requires_cuda), pytest.param("cuda", "reference", marks=requires_cuda),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda]),
]


def _shape_case(op, device, backend, w_shape, b_shape):
    """Runs ``op`` (poly_norm, poly_norm_mul or poly_norm_grouped) with weight and bias of the
    given shapes, forward and backward; returns the parameters' gradients."""
    x, w, b = _inputs(device)
    E = 3
    if op == "grouped":
        w = torch.randn(E, 3, device=device)
        b = torch.randn(E, device=device)
    w = w.reshape(w_shape).clone().requires_grad_()
    b = b.reshape(b_shape).clone().requires_grad_()
    x = x.requires_grad_()
    if op == "poly_norm":
        y = polynorm.poly_norm(x, w, b, backend=backend)
    elif op == "poly_norm_mul":
        y = polynorm.poly_norm_mul(x, torch.randn_like(x), w, b, backend=backend)
    else:
        y = polynorm.poly_norm_grouped(x, w, b, torch.tensor([1, 1, 3], device=device), backend=backend)
    y.sum().backward()
    return w.grad, b.grad


@pytest.mark.parametrize(("device", "backend"), SHAPE_BACKENDS)
@pytest.mark.parametrize("op", ["poly_norm", "poly_norm_mul"])
@pytest.mark.parametrize(("w_shape", "b_shape"), [((3,), (1,)), ((3,), ())])
def test_documented_param_shapes_are_accepted(device, backend, op, w_shape, b_shape):
    gw, gb = _shape_case(op, device, backend, w_shape, b_shape)
    assert gw.shape == w_shape and gb.shape == b_shape and gw.abs().sum() > 0


@pytest.mark.parametrize(("device", "backend"), SHAPE_BACKENDS)
@pytest.mark.parametrize("b_shape", [(3,), (3, 1)])
def test_documented_grouped_shapes_are_accepted(device, backend, b_shape):
    gw, gb = _shape_case("grouped", device, backend, (3, 3), b_shape)
    assert gw.shape == (3, 3) and gb.shape == b_shape and gw.abs().sum() > 0


@pytest.mark.parametrize(("device", "backend"), SHAPE_BACKENDS)
@pytest.mark.parametrize("op", ["poly_norm", "poly_norm_mul"])
@pytest.mark.parametrize(("w_shape", "b_shape", "message"), [
    ((3, 1), (1,), "expected weight of shape [3] ([w0, w1, w2]), got [3, 1]"),
    ((1, 3), (1,), "expected weight of shape [3] ([w0, w1, w2]), got [1, 3]"),
    ((3,), (1, 1), "expected bias of shape [1] or [] (one number), got [1, 1]"),
])
def test_other_param_shapes_are_refused(device, backend, op, w_shape, b_shape, message):
    with pytest.raises(RuntimeError, match=r"^polynorm\.\w+: " + re.escape(message)):
        _shape_case(op, device, backend, w_shape, b_shape)


@pytest.mark.parametrize(("device", "backend"), SHAPE_BACKENDS)
@pytest.mark.parametrize(("w_shape", "b_shape", "message"), [
    ((9,), (3,), "expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got [9]"),
    ((3, 3, 1), (3,), "expected weight of shape [E, 3] (one [w0, w1, w2] row per expert), got [3, 3, 1]"),
    ((3, 3), (1, 3), "expected bias of shape [3] or [3, 1] (weight's E experts), got [1, 3]"),
])
def test_other_grouped_shapes_are_refused(device, backend, w_shape, b_shape, message):
    with pytest.raises(RuntimeError, match=r"^polynorm\.\w+: " + re.escape(message)):
        _shape_case("grouped", device, backend, w_shape, b_shape)


def test_module_refuses_a_reshaped_weight():
    act = polynorm.PolyNorm()
    with torch.no_grad():
        act.weight = torch.nn.Parameter(act.weight.reshape(3, 1).clone())
    with pytest.raises(RuntimeError, match=re.escape("expected weight of shape [3] ([w0, w1, w2]), got [3, 1]")):
        act(torch.randn(2, 8))


def test_unknown_backend():
    x, w, b = _inputs("cpu")
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm: expected backend to be one of auto, cuda"):
        polynorm.poly_norm(x, w, b, backend="nope")


def test_cuda_backend_needs_cuda_tensor():
    x, w, b = _inputs("cpu")
    with pytest.raises(RuntimeError, match=r"backend 'cuda' expected x on a CUDA device \(or the meta device\), got cpu"):
        polynorm.poly_norm(x, w, b, backend="cuda")


# ------------------------------------------------------------------- operator checks
def _opcheck_samples(device):
    samples = []
    for i, (shape, dtype, layout) in enumerate(
        [((4, 16), torch.float32, "c"), ((2, 3, 33), torch.bfloat16, "c"), ((5, 8), torch.float16, "t"),
         ((3, 7), torch.float64, "s"), ((1, 1), torch.float32, "c"), ((0, 9), torch.float32, "c")]
    ):
        gen = torch.Generator().manual_seed(seed_for("opcheck", device, i))
        x = torch.randn(*shape, generator=gen).to(dtype).to(device)
        if layout == "t":
            x = x.t().contiguous().t()
        elif layout == "s":
            x = torch.randn(shape[0], shape[1] + 2, generator=gen).to(dtype).to(device)[:, : shape[1]]
        w, b = make_params(torch.float16 if i == 1 else torch.float32, device, gen)
        for requires_grad in (False, True):
            samples.append((x.detach().clone().requires_grad_(requires_grad), w.clone().requires_grad_(requires_grad),
                            b.clone().requires_grad_(requires_grad), 1e-6))
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for x, w, b, eps in _opcheck_samples(device):
        torch.library.opcheck(torch.ops.polynorm.forward.default, (x, w, b, eps))
        y, rstd = torch.ops.polynorm.forward(x.detach(), w.detach(), b.detach(), eps)
        g = torch.randn_like(y)
        torch.library.opcheck(torch.ops.polynorm.backward.default, (g, x.detach(), w.detach(), rstd))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_shape", [(1,), ()])
def test_gradcheck_float64(device, bias_shape):
    gen = torch.Generator().manual_seed(seed_for("gradcheck", device, bias_shape))
    x = torch.randn(3, 2, 6, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(3, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(bias_shape, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: polynorm.poly_norm(*a, 1e-6), (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
def test_needs_input_grad_and_bias_shape(device):
    x, w, b = _inputs(device)
    w = w.requires_grad_()
    b0 = b.reshape(()).to(torch.float64).requires_grad_()  # a 0-d bias in another dtype
    y = polynorm.poly_norm(x, w, b0)  # x does not require grad
    y.sum().backward()
    assert x.grad is None
    assert w.grad.shape == (3,) and w.grad.dtype == torch.float32
    assert b0.grad.shape == () and b0.grad.dtype == torch.float64
    torch.testing.assert_close(b0.grad, torch.tensor(float(x.numel()), dtype=torch.float64, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_unchanged(device):
    x, w, b = _inputs(device, dtype=torch.bfloat16)
    x = x.requires_grad_()
    w = w.requires_grad_()
    b = b.requires_grad_()
    g = torch.randn_like(x)
    copies = [t.detach().clone() for t in (x, w, b, g)]
    y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
    rstd_copy = rstd.clone()
    torch.ops.polynorm.backward(g, x.detach(), w.detach(), rstd)
    polynorm.poly_norm(x, w, b).backward(g)
    for before, after in zip(copies, (x, w, b, g)):
        assert torch.equal(before, after.detach())
    assert torch.equal(rstd_copy, rstd)


# --------------------------------------------------------------------------- module
def test_module_defaults_and_repr():
    m = polynorm.PolyNorm()
    torch.testing.assert_close(m.weight.detach(), torch.full((3,), 1 / 3))
    torch.testing.assert_close(m.bias.detach(), torch.zeros(1))
    with torch.no_grad():
        m.weight.mul_(2)
        m.bias.add_(1)
    m.reset_parameters()
    torch.testing.assert_close(m.weight.detach(), torch.full((3,), 1 / 3))
    assert "eps=1e-06" in repr(m)
    m2 = polynorm.PolyNorm(eps=1e-5, dtype=torch.float64)
    assert m2.weight.dtype == torch.float64 and "eps=1e-05" in repr(m2)


@pytest.mark.parametrize("device", DEVICES)
def test_module_matches_function(device):
    m = polynorm.PolyNorm(device=device)
    x = torch.randn(2, 3, 40, device=device, dtype=torch.bfloat16)
    assert torch.equal(m(x), polynorm.poly_norm(x, m.weight, m.bias, m.eps))


def test_cpu_deterministic_any_thread_count():
    gen = torch.Generator().manual_seed(seed_for("threads"))
    x = torch.randn(300, 777, generator=gen)
    g = torch.randn(300, 777, generator=gen)
    w, b = make_params(torch.float32, "cpu", gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y, rstd = torch.ops.polynorm.forward(x, w, b, 1e-6)
            results.append((y, rstd, *torch.ops.polynorm.backward(g, x, w, rstd)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            assert torch.equal(a, b_)


def test_ops_registered_for_cpu_and_cuda():
    # Without a GPU a CUDA tensor cannot reach the CUDA kernel; what CI can check is that
    # both ops have kernels for both dispatch keys (real ones, or the "not built" stub).
    for op in ("forward", "backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CPU")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"polynorm::{op}", "CUDA")


# ------------------------------------------------------------ eps: bools are no eps
ALL_CASES = [
    ("cpu", "auto"),
    pytest.param("cpu", "triton", marks=[requires_triton, requires_interpreter]),
    ("cpu", "reference"),
    pytest.param("cuda", "auto", marks=requires_cuda),
    pytest.param("cuda", "cuda", marks=requires_cuda),
    pytest.param("cuda", "triton", marks=[requires_triton, requires_cuda]),
    pytest.param("cuda", "reference", marks=requires_cuda),
]


def _bools():
    np = pytest.importorskip("numpy")
    return [(True, "bool"), (False, "bool"), (np.bool_(True), "bool"), (torch.tensor(True), "a tensor of shape [] and dtype torch.bool")]


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_eps_bool_is_refused(device, backend):
    # Issue 16: eps=True was taken as 1.0. Every backend, the module and the reference
    # refuse it with the TypeError of any other non-real eps.
    x, w, b = _inputs(device)
    for eps, what in _bools():
        with pytest.raises(TypeError, match=rf"polynorm\.poly_norm: expected eps to be a real number, got {re.escape(what)}"):
            polynorm.poly_norm(x, w, b, eps, backend=backend)
        with pytest.raises(TypeError, match=rf"polynorm\.PolyNorm: expected eps to be a real number, got {re.escape(what)}"):
            polynorm.PolyNorm(eps=eps, backend=backend)
        with pytest.raises(TypeError, match=r"polynorm\.reference\.poly_norm: expected eps to be a real number"):
            polynorm.reference.poly_norm(x, w, b, eps)


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_eps_real_forms_eager(device, backend):
    # Every real form gives the bits of the Python float it holds.
    np = pytest.importorskip("numpy")
    x, w, b = _inputs(device)
    for eps in (np.float32(0.25), np.float64(0.25), np.int64(1), 1, torch.tensor(0.25), torch.tensor([0.25], dtype=torch.float64), np.array(0.25)):
        expected = polynorm.poly_norm(x, w, b, float(eps), backend=backend)
        assert torch.equal(polynorm.poly_norm(x, w, b, eps, backend=backend), expected), repr(eps)


# ------------------------------------------------- x made under torch.inference_mode()
@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 40)])
@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_inference_mode_x_with_trainable_parameters(device, backend, shape):
    # Issue 16: activations precomputed under inference_mode, then a weight and bias that
    # require grad. torch.nn.functional.layer_norm and linear refuse such an x ("Inference
    # tensors cannot be saved for backward"); polynorm copies x once and gives the
    # reference's parameter gradients.
    gen = torch.Generator().manual_seed(seed_for("inference-x", device, backend, shape))
    with torch.inference_mode():
        x = torch.randn(shape, generator=gen).to(device)
    assert x.is_inference()
    g = torch.randn(shape, generator=gen).to(device)
    w32, b32 = make_params(torch.float32, device, gen)
    for w0, b0 in ((w32, b32), (w32.to(torch.bfloat16), b32)):
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        x_before = x.clone()
        y = polynorm.poly_norm(x, w, b, 1e-6, backend=backend)
        assert not y.is_inference() and y.requires_grad
        y.backward(g)
        assert torch.equal(x, x_before)
        xr = x.clone()  # a normal tensor: the reference on it
        wr, br = w0.double().requires_grad_(), b0.double().requires_grad_()
        polynorm.reference.poly_norm(xr.double(), wr, br, 1e-6, compute_dtype=torch.float64).backward(g.double())
        torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-5 if w0.dtype == torch.float32 else 8e-3, atol=1e-5)
        torch.testing.assert_close(b.grad.double(), br.grad, rtol=1e-5, atol=1e-5)
        # The module too, and without a recorded backward nothing is saved or copied.
        m = polynorm.PolyNorm(backend=backend, device=device)
        m(x).sum().backward()
        assert m.weight.grad is not None and m.bias.grad is not None
        with torch.no_grad():
            torch.testing.assert_close(polynorm.poly_norm(x, w, b, 1e-6, backend=backend), y.detach())


# ------------------------------------------------------------- meta and fake tensors
@pytest.mark.parametrize("backend", ["auto", "cuda", pytest.param("triton", marks=requires_triton), "reference"])
def test_meta_module_every_backend(backend):
    # Issue 16: a module built under torch.device("meta") (deferred initialisation, FSDP)
    # infers shapes, forward and backward, for every backend, as native ops do; no device
    # is needed, not even for backend="cuda".
    with torch.device("meta"):
        m = polynorm.PolyNorm(backend=backend, eps=1e-5)
        x = torch.randn(2, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    y = m(x)
    assert y.is_meta and y.shape == x.shape and y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.is_meta and x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
    assert m.weight.grad.is_meta and m.weight.grad.shape == (3,) and m.weight.grad.dtype == torch.float32
    assert m.bias.grad.is_meta and m.bias.grad.shape == (1,) and m.bias.grad.dtype == torch.float32
    # A 16-bit module: each gradient in its parameter's dtype.
    with torch.device("meta"):
        m16 = polynorm.PolyNorm(backend=backend, dtype=torch.float16)
    m16(x).sum().backward()
    assert m16.weight.grad.dtype == torch.float16 and m16.bias.grad.dtype == torch.float16


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_meta_then_to_empty_and_reset_parameters(device, backend):
    # to_empty(device=...) plus reset_parameters() gives the module a direct construction gives.
    with torch.device("meta"):
        deferred = polynorm.PolyNorm(eps=1e-5, backend=backend, dtype=torch.float64)
    deferred.to_empty(device=device)
    deferred.reset_parameters()
    direct = polynorm.PolyNorm(eps=1e-5, backend=backend, dtype=torch.float64, device=device)
    assert repr(deferred) == repr(direct)
    for (name, p), (_, q) in zip(deferred.named_parameters(), direct.named_parameters()):
        assert p.device == q.device and p.dtype == q.dtype and torch.equal(p, q), name
    gen = torch.Generator().manual_seed(seed_for("to_empty", device, backend))
    x = torch.randn(3, 40, generator=gen).to(device)
    g = torch.randn(3, 40, generator=gen).to(device)
    deferred(x).backward(g)
    direct(x).backward(g)
    for p, q in zip(deferred.parameters(), direct.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("device,backend", ALL_CASES)
def test_fake_tensor_forward_backward(device, backend):
    # Fake tensors (torch.compile's tracing, FSDP's shape inference) on x's own device.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 7, 48, dtype=torch.float16, device=device, requires_grad=True)
        m = polynorm.PolyNorm(backend=backend, device=device, dtype=torch.bfloat16)
        y = m(x)
        y.sum().backward()
        assert y.shape == x.shape and y.dtype == torch.float16 and y.device == x.device
        assert x.grad.shape == x.shape and m.weight.grad.dtype == torch.bfloat16 and m.bias.grad.shape == (1,)
