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
    ("weight numel", lambda x, w, b: (x, w[:2], b, 1e-6), RuntimeError, "polynorm.forward: expected weight to have 3 elements [w0, w1, w2], got 2"),
    ("int weight", lambda x, w, b: (x, w.long(), b, 1e-6), RuntimeError, "polynorm.forward: expected weight to be float32, float64, float16 or bfloat16, got Long"),
    ("bias numel", lambda x, w, b: (x, w, torch.cat([b, b]), 1e-6), RuntimeError, "polynorm.forward: expected bias to have 1 element (shape (1,) or ()), got 2"),
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
    ("weight numel", lambda g, x, w, r: (g, x, w[:1], r), "polynorm.backward: expected weight to have 3 elements"),
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
    with pytest.raises(RuntimeError, match=r"polynorm\.poly_norm: expected weight to have 3 elements \[w0, w1, w2\], got 4"):
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3,), (1, 3), (3, 1)])
def test_weight_of_any_shape_with_3_elements(device, shape):
    x, w, b = _inputs(device)
    w = w.reshape(shape).clone().requires_grad_()
    polynorm.poly_norm(x, w, b).sum().backward()
    assert w.grad.shape == shape


def test_unknown_backend():
    x, w, b = _inputs("cpu")
    with pytest.raises(ValueError, match=r"polynorm\.poly_norm: expected backend to be one of auto, cuda"):
        polynorm.poly_norm(x, w, b, backend="nope")


def test_cuda_backend_needs_cuda_tensor():
    x, w, b = _inputs("cpu")
    with pytest.raises(RuntimeError, match=r"backend 'cuda' expected x on a CUDA device, got cpu"):
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
        w, b = make_params(torch.float32, device, gen)
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
