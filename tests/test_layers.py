"""polynorm.layers and polynorm.patch_model: Motif's PolyNorm modules swapped for polynorm's.

The PolyNorm modules Motif's users run today are written out here as their public sources
have them (nothing is downloaded):

- ``motif``: the remote code of Motif's models (``modeling_motif.py``): ``PolyNorm``, the
  PolyCom reference, eager in x's dtype with fp32 parameters promoting through the bias,
  eps in ``.eps``; and ``MotifMLP``: ``gate_proj``, ``up_proj``, ``down_proj`` (bias as
  ``config.use_bias``) and ``act_fn``, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``.
- ``hub``: ``layers.PolyNorm`` and ``layers.FusedMulPolyNorm`` of the kernels-hub kernel
  ``Motif-Technologies/activation``: ``(eps=1e-6, dtype=torch.float32)``, ``weight``
  ``ones(3) / 3``, ``bias`` ``zeros(1)``, ``forward(x)`` and ``forward(x, mul)``, in fp32
  and rounded once to x's dtype, as the kernel's benchmarks write them in PyTorch; and
  the MLP that calls the fused module, ``down_proj(act_fn(gate_proj(x), up_proj(x)))``.
- ``liger``: Liger-Kernel's ``LigerPolyNorm``: ``weight`` ``(3,)``, a 0-d ``bias``, eps in
  ``variance_epsilon``.

A small model of Motif's decoder MLPs holds them; patched, its output and every gradient
(input, projections, norms, PolyNorm parameters) match the unpatched model's within the
rounding of the dtype, eagerly and under ``torch.compile(fullgraph=True)``, on the CPU (the
C++ kernel) and on a GPU (the CUDA kernels).
"""

import contextlib
import copy
import inspect
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._inductor.compile_fx import compile_fx

import polynorm
from polynorm import layers
from _matrix import DEVICES, rel_l2, seed_for

HIDDEN, INTERMEDIATE = 64, 96
ROWS = (2, 5)  # batch, sequence


# ---------------------------------------------------------------------------------------
# The modules as their public sources have them
# ---------------------------------------------------------------------------------------


def _norm(u: torch.Tensor, eps: float) -> torch.Tensor:
    return u / torch.sqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def _poly_fp32(x, weight, bias, eps):
    xf = x.float()
    return weight[0] * _norm(xf**3, eps) + weight[1] * _norm(xf**2, eps) + weight[2] * _norm(xf, eps) + bias


class motif:  # noqa: N801  (a namespace: the class names must be the sources')
    class PolyNorm(nn.Module):
        def __init__(self, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3) / 3)
            self.bias = nn.Parameter(torch.zeros(1))
            self.eps = eps

        def _norm(self, x):
            return _norm(x, self.eps)

        def forward(self, x):
            return (self.weight[0] * self._norm(x**3) + self.weight[1] * self._norm(x**2)
                    + self.weight[2] * self._norm(x) + self.bias)

    class MotifMLP(nn.Module):
        def __init__(self, act_fn: nn.Module, use_bias: bool = False):
            super().__init__()
            self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=use_bias)
            self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=use_bias)
            self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=use_bias)
            self.act_fn = act_fn

        def forward(self, hidden_state):
            return self.down_proj(self.act_fn(self.gate_proj(hidden_state)) * self.up_proj(hidden_state))


class hub:  # noqa: N801
    class PolyNorm(nn.Module):
        def __init__(self, eps=1e-6, dtype: torch.dtype = torch.float32):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3, dtype=dtype) / 3)
            self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
            self.eps = eps

        def forward(self, x):
            return _poly_fp32(x, self.weight, self.bias, self.eps).to(x.dtype)

    class FusedMulPolyNorm(nn.Module):
        def __init__(self, eps=1e-6, dtype: torch.dtype = torch.float32):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3, dtype=dtype) / 3)
            self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
            self.eps = eps

        def forward(self, x, mul):
            return (_poly_fp32(x, self.weight, self.bias, self.eps) * mul.float()).to(x.dtype)

    class MotifMLP(motif.MotifMLP):
        def forward(self, hidden_state):
            return self.down_proj(self.act_fn(self.gate_proj(hidden_state), self.up_proj(hidden_state)))


class liger:  # noqa: N801
    class LigerPolyNorm(nn.Module):
        def __init__(self, eps=1e-6, in_place=True):
            super().__init__()
            self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0))
            self.bias = nn.Parameter(torch.tensor(1.0))
            self.variance_epsilon = eps
            self.in_place = in_place

        def forward(self, hidden_states):
            return _poly_fp32(hidden_states, self.weight, self.bias, self.variance_epsilon).to(hidden_states.dtype)


POLYNORM_CLASS_NAMES = ("PolyNorm", "FusedMulPolyNorm", "LigerPolyNorm")


class Block(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.post_attention_layernorm = nn.RMSNorm(HIDDEN, eps=1e-6)
        self.mlp = mlp

    def forward(self, h):
        return h + self.mlp(self.post_attention_layernorm(h))


class TinyMotif(nn.Module):
    """Two decoder MLP blocks, then a PolyNorm on its own (not in an MLP) and a head."""

    def __init__(self, mlps, head_act: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList(Block(mlp) for mlp in mlps)
        self.head_act = head_act
        self.lm_head = nn.Linear(HIDDEN, HIDDEN // 2, bias=False)

    def forward(self, h):
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.head_act(h))


# Each module's eps differs from the default 1e-6, so a swap that dropped it would show
# (eps 1e-3 beside mean squares of about 1 moves y by about 5e-4, thousands of fp32 ulps).
def _motif_model():
    mlps = [motif.MotifMLP(motif.PolyNorm(1e-5)), motif.MotifMLP(motif.PolyNorm(1e-3), use_bias=True)]
    return TinyMotif(mlps, motif.PolyNorm(1e-2))


def _hub_model():  # an MLP that calls the hub's fused module, and Motif's MLP around the hub's PolyNorm
    mlps = [hub.MotifMLP(hub.FusedMulPolyNorm(1e-5)), motif.MotifMLP(hub.PolyNorm(1e-3), use_bias=True)]
    return TinyMotif(mlps, hub.PolyNorm(1e-2))


def _liger_model():
    mlps = [motif.MotifMLP(liger.LigerPolyNorm(1e-5)), motif.MotifMLP(liger.LigerPolyNorm(1e-3), use_bias=True)]
    return TinyMotif(mlps, liger.LigerPolyNorm(1e-2))


def _expected_swaps(family: str) -> dict:
    fused, single, mlp = layers.FusedMulPolyNorm, layers.PolyNorm, layers.GatedMLP
    if family == "hub":
        return {
            "layers.0.mlp.act_fn": (hub.FusedMulPolyNorm, fused),
            "layers.1.mlp": (motif.MotifMLP, mlp),
            "layers.1.mlp.act_fn": (hub.PolyNorm, fused),
            "head_act": (hub.PolyNorm, single),
        }
    act = motif.PolyNorm if family == "motif" else liger.LigerPolyNorm
    return {
        "layers.0.mlp": (motif.MotifMLP, mlp),
        "layers.0.mlp.act_fn": (act, fused),
        "layers.1.mlp": (motif.MotifMLP, mlp),
        "layers.1.mlp.act_fn": (act, fused),
        "head_act": (act, single),
    }


FAMILIES = {"motif": _motif_model, "hub": _hub_model, "liger": _liger_model}


def _is_polynorm(mod: nn.Module) -> bool:
    return type(mod).__name__ in POLYNORM_CLASS_NAMES


def build(family: str, gen: torch.Generator) -> TinyMotif:
    """The family's model, every parameter fresh and random (PolyNorm's away from its initial values)."""
    model = FAMILIES[family]()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) / math.sqrt(mod.in_features))
                if mod.bias is not None:
                    mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=gen))
            elif isinstance(mod, nn.RMSNorm):
                mod.weight.copy_(1 + 0.1 * torch.randn(mod.weight.shape, generator=gen))
            elif _is_polynorm(mod):
                mod.weight.copy_(torch.tensor([0.5, -0.3, 1.0]) + 0.1 * torch.randn(3, generator=gen))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=gen))
    return model


# ---------------------------------------------------------------------------------------
# Running a model, and the float64 oracle's scales
# ---------------------------------------------------------------------------------------

# How a model runs: its activations' dtype, its PolyNorm parameters' dtype, and autocast.
# "bf16": the whole model in bf16, as a checkpoint loaded with .to(torch.bfloat16);
# "bf16-fp32-params": bf16 projections and activations beside fp32 PolyNorm parameters,
# under autocast (Motif's eager PolyNorm then returns fp32: its fp32 bias promotes).
PRECISIONS = {
    "fp32": (torch.float32, torch.float32, False),
    "bf16": (torch.bfloat16, torch.bfloat16, False),
    "bf16-fp32-params": (torch.bfloat16, torch.float32, True),
}


def cast(model: nn.Module, precision: str, device) -> nn.Module:
    dtype, param_dtype, _ = PRECISIONS[precision]
    model.to(device=device, dtype=dtype)
    for mod in model.modules():
        if _is_polynorm(mod):
            mod.to(param_dtype)
    return model


def run(model: nn.Module, x: torch.Tensor, g: torch.Tensor, autocast: bool, fn=None) -> dict:
    """{"out": output, "x": its gradient, then every parameter's gradient by name}; fn runs model (compiled)."""
    fn = model if fn is None else fn
    x = x.detach().clone().requires_grad_(True)
    named = list(model.named_parameters())
    context = torch.autocast(x.device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        out = fn(x)
    grads = torch.autograd.grad(out, [x] + [p for _, p in named], g.to(out.dtype))
    return dict(zip(["out", "x"] + [name for name, _ in named], [out.detach()] + list(grads)))


def polynorm_gradient_scales(oracle: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    """{name: float64 scale} for every PolyNorm weight and bias of the float64 model.

    A PolyNorm parameter's gradient is a sum over every element the module saw:
    ``dL/dw_k = sum(dy * norm_k(x))``, ``dL/db = sum(dy)`` (dy: the gradient of PolyNorm's
    y, times mul in the fused module). Its sum of absolute terms scales the error the
    rounding of dy and x leaves in it, where the sum itself may nearly cancel.
    """
    scales, handles = {}, []
    names = {mod: name for name, mod in oracle.named_modules()}

    def record(mod, args, out):
        x_in, mul = args[0].detach(), (args[1].detach() if len(args) > 1 else None)
        eps = getattr(mod, "eps", getattr(mod, "variance_epsilon", None))

        def on_grad(grad):
            dy = grad * mul if mul is not None else grad
            n = [_norm(x_in**p, eps) for p in (3, 2, 1)]
            name = names[mod]
            scales[f"{name}.weight"] = torch.stack([(dy * n_k).abs().sum() for n_k in n])
            scales[f"{name}.bias"] = dy.abs().sum().reshape(mod.bias.shape)

        out.register_hook(on_grad)

    for mod in oracle.modules():
        if _is_polynorm(mod):
            handles.append(mod.register_forward_hook(record))
    run(oracle, x, g, autocast=False)
    for handle in handles:
        handle.remove()
    return scales


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


# Tolerances in units of the activations' unit roundoff u. Both models round at every op of
# a chain of about 12 (RMSNorm, two projections, PolyNorm's powers, sums and division, the
# product, the down projection, the residual, twice, then the head), each in its own places,
# and sum the parameters' gradients over up to 960 fp32 terms. Measured on the CPU over 6
# seeds, every family and precision, eager and compiled: out and the input's, projections'
# and norms' gradients differ by at most 12 u (relative L2; fp32) and 4.5 u (bf16), each
# about what the unpatched model's own error against float64 is (at most 15 u and 5.4 u); a
# PolyNorm parameter's gradient by at most 1.8 u of its scale (polynorm_gradient_scales).
# The bounds leave a margin above those of more than 2.
RELATIVE_TOLERANCE_U = 32
PARAMETER_TOLERANCE_U = 4


def assert_matches(got: dict, expected: dict, scales: dict, dtype: torch.dtype, what: str) -> None:
    u = unit_roundoff(dtype)
    assert list(got) == list(expected), what
    for name, exp in expected.items():
        val = got[name]
        assert (val.shape, val.dtype) == (exp.shape, exp.dtype), (what, name)
        assert torch.isfinite(val).all(), (what, name)
        if name in scales:
            diff = (val.double() - exp.double()).abs().cpu()
            bound = PARAMETER_TOLERANCE_U * u * scales[name].cpu()
            assert torch.all(diff <= bound), f"{what}: {name}: |got - expected| {diff.tolist()} > {bound.tolist()}"
        else:
            err = rel_l2(val, exp)
            assert err <= RELATIVE_TOLERANCE_U * u, f"{what}: {name}: relative L2 difference {err:.3g}, {err / u:.1f} u"


# ---------------------------------------------------------------------------------------
# patch_model: the patched model computes what the unpatched one does
# ---------------------------------------------------------------------------------------


@pytest.fixture
def _compile_from_scratch():
    # A fresh Dynamo state for each compiled model: no cached graph may stand in for this one.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("_compile_from_scratch")
@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("device", DEVICES)
def test_patched_model_matches_unpatched(device, family, precision, mode):
    gen = torch.Generator().manual_seed(seed_for("layers", family, precision, mode, device))
    base = build(family, gen)
    x = torch.randn(*ROWS, HIDDEN, generator=gen)
    g = torch.randn(*ROWS, HIDDEN // 2, generator=gen)
    scales = polynorm_gradient_scales(copy.deepcopy(base).to(device=device, dtype=torch.float64),
                                      x.to(device, torch.float64), g.to(device, torch.float64))

    dtype, _, autocast = PRECISIONS[precision]
    unpatched = cast(base, precision, device)
    patched = copy.deepcopy(unpatched)
    swapped = polynorm.patch_model(patched)
    assert swapped == _expected_swaps(family)
    graphs = []

    def inductor(gm, example_inputs):  # keeps Dynamo's graph, then compiles it as torch.compile does
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    fn = torch.compile(patched, backend=inductor, fullgraph=True) if mode == "compile" else patched

    x, g = x.to(device, dtype), g.to(device, dtype)
    expected = run(unpatched, x, g, autocast)
    got = run(patched, x, g, autocast, fn)
    if mode == "compile":  # one graph, calling the fused op once per MLP and PolyNorm's op for the head
        assert len(graphs) == 1
        nodes = graphs[0].graph.nodes
        targets = [str(node.target).removesuffix(".default") for node in nodes if node.op == "call_function"]
        assert targets.count("polynorm.mul_forward") == 2 and targets.count("polynorm.forward") == 1, targets
    assert_matches(got, expected, scales, dtype, f"{family} {precision} {mode} on {device}")


def test_tolerances_catch_a_wrong_eps():
    # The comparison fails when the patched model computes another function: here each
    # PolyNorm's eps back at the default 1e-6.
    gen = torch.Generator().manual_seed(seed_for("layers", "wrong eps"))
    base = build("motif", gen)
    x, g = torch.randn(*ROWS, HIDDEN, generator=gen), torch.randn(*ROWS, HIDDEN // 2, generator=gen)
    scales = polynorm_gradient_scales(copy.deepcopy(base).double(), x.double(), g.double())
    patched = copy.deepcopy(base)
    polynorm.patch_model(patched)
    for mod in patched.modules():
        if isinstance(mod, (polynorm.PolyNorm, polynorm.FusedMulPolyNorm)):
            mod.eps = 1e-6
    with pytest.raises(AssertionError):
        assert_matches(run(patched, x, g, False), run(base, x, g, False), scales, torch.float32, "wrong eps")


# ---------------------------------------------------------------------------------------
# patch_model: what it keeps, what it reports, what it leaves
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patch_keeps_parameters_and_state_dict(family):
    gen = torch.Generator().manual_seed(seed_for("layers", "keeps", family))
    model = cast(build(family, gen), "bf16-fp32-params", "cpu")
    before = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    polynorm_params = {id(p) for mod in model.modules() if _is_polynorm(mod) for p in mod.parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # made before the patch: it steps the model's parameters

    swapped = polynorm.patch_model(model)

    assert swapped == _expected_swaps(family)
    after = dict(model.named_parameters())
    assert list(after) == list(before)
    for name, p in after.items():
        assert p is before[name], name  # the same Parameter objects: values, device, dtype, requires_grad
    ours = (polynorm.PolyNorm, polynorm.FusedMulPolyNorm)
    assert {id(p) for mod in model.modules() if isinstance(mod, ours) for p in mod.parameters()} == polynorm_params
    assert list(model.state_dict()) == list(state)
    for key, value in model.state_dict().items():
        assert value.dtype == state[key].dtype and torch.equal(value, state[key]), key
    for name, (_, new) in swapped.items():
        assert type(model.get_submodule(name)) is new, name
    x = torch.randn(3, HIDDEN, generator=gen).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().square().sum().backward()
    optimizer.step()
    assert not torch.equal(model.head_act.weight.detach(), state["head_act.weight"])
    assert polynorm.patch_model(model) == {}  # nothing left to swap


def test_patch_keeps_eps_bias_shape_and_training_flag():
    model = _liger_model().eval()
    polynorm.patch_model(model)
    act = model.layers[1].mlp.act_fn
    assert isinstance(act, layers.FusedMulPolyNorm) and act.eps == 1e-3
    assert model.head_act.eps == 1e-2 and model.head_act.bias.shape == ()  # Liger's 0-d bias, as it was
    assert not any(mod.training for mod in model.modules())


def test_patch_on_the_meta_device():
    # A model built without memory (before its checkpoint is loaded) is patched in place.
    with torch.device("meta"):
        model = _motif_model()
    swapped = polynorm.patch_model(model, backend="reference")
    assert swapped == _expected_swaps("motif")
    assert all(p.is_meta for p in model.parameters())
    assert model.layers[0].mlp.act_fn.backend == "reference"
    out = model(torch.empty(*ROWS, HIDDEN, device="meta"))
    assert out.shape == (*ROWS, HIDDEN // 2) and out.is_meta


def test_shared_module_swapped_once():
    act = motif.PolyNorm(1e-4)
    model = nn.ModuleDict({"a": act, "b": nn.Sequential(act)})
    swapped = polynorm.patch_model(model)
    assert list(swapped) == ["a"]
    assert model["a"] is model["b"][0] and isinstance(model["a"], layers.PolyNorm)


def test_fuse_mlp_false_swaps_only_the_activation():
    gen = torch.Generator().manual_seed(seed_for("layers", "fuse_mlp"))
    base = build("motif", gen)
    patched = copy.deepcopy(base)
    swapped = polynorm.patch_model(patched, fuse_mlp=False)
    assert swapped == {"layers.0.mlp.act_fn": (motif.PolyNorm, layers.PolyNorm),
                       "layers.1.mlp.act_fn": (motif.PolyNorm, layers.PolyNorm),
                       "head_act": (motif.PolyNorm, layers.PolyNorm)}
    assert type(patched.layers[0].mlp) is motif.MotifMLP
    x = torch.randn(*ROWS, HIDDEN, generator=gen)
    torch.testing.assert_close(patched(x), base(x))


def test_mlp_of_another_structure_is_not_fused():
    # An MLP with a child besides Motif's four computes something else around act_fn: only
    # its PolyNorm is swapped, and its own forward still runs.
    class DropoutMLP(motif.MotifMLP):
        def __init__(self):
            super().__init__(motif.PolyNorm())
            self.dropout = nn.Dropout(0.0)

        def forward(self, hidden_state):
            return self.dropout(super().forward(hidden_state))

    model = nn.Sequential(DropoutMLP())
    assert polynorm.patch_model(model) == {"0.act_fn": (motif.PolyNorm, layers.PolyNorm)}
    assert type(model[0]) is DropoutMLP


def _sigmoid_polynorm():  # Motif-3's: sigmoid(weight) scales the terms
    act = hub.PolyNorm()
    act.sigmoid_weight = True
    return act


def _hooked_polynorm():
    act = motif.PolyNorm()
    act.register_forward_hook(lambda mod, args, out: None)
    return act


def _wrapped_polynorm():
    act = motif.PolyNorm()
    act.forward = lambda x: x  # a wrapper's forward, set on the instance
    return act


def _four_weights():
    act = motif.PolyNorm()
    act.weight = nn.Parameter(torch.ones(4) / 4)
    return act


def _buffer_polynorm():
    act = motif.PolyNorm()
    act.register_buffer("cache", torch.zeros(3))
    return act


def _no_eps():
    act = motif.PolyNorm()
    del act.eps
    return act


@pytest.mark.parametrize(
    "make,reason",
    [
        (_sigmoid_polynorm, "sigmoid_weight=True"),
        (_hooked_polynorm, "1 hook"),
        (_wrapped_polynorm, "forward is replaced on the instance"),
        (_four_weights, "weight (4,)"),
        (_buffer_polynorm, "buffers ['cache']"),
        (_no_eps, "expected eps in an attribute eps or variance_epsilon"),
    ],
)
def test_other_modules_named_polynorm_are_left_with_a_warning(make, reason):
    model = motif.MotifMLP(make())
    old = model.act_fn
    with pytest.warns(UserWarning, match=r"polynorm\.patch_model: left 1 module\(s\).*act_fn: .*" + re.escape(reason)):
        assert polynorm.patch_model(nn.Sequential(model)) == {}
    assert model.act_fn is old and type(model) is motif.MotifMLP


def _state_dict_hooked_polynorm():
    act = motif.PolyNorm()
    act.register_state_dict_post_hook(lambda mod, state, prefix, local_metadata: None)
    return act


def _array_output_scale():  # an option that compares to no single truth value
    act = motif.PolyNorm()
    act.output_scale = torch.tensor([1.0, 0.5])
    return act


@pytest.mark.parametrize(
    "make,reason",
    [(_state_dict_hooked_polynorm, "1 hook"), (_array_output_scale, "output_scale=tensor")],
)
def test_patch_leaves_state_dict_hooks_and_unclear_options(make, reason):
    """A state_dict hook would be lost with the module (the state_dict would change without a
    word), and an option that is a tensor of several values used to crash patch_model
    ("Boolean value of Tensor ... is ambiguous"): both are left as they are, with the reason."""
    model = motif.MotifMLP(make())
    old = model.act_fn
    with pytest.warns(UserWarning, match=r"polynorm\.patch_model: left 1 module\(s\).*act_fn: .*" + re.escape(reason)):
        assert polynorm.patch_model(nn.Sequential(model)) == {}
    assert model.act_fn is old


def test_patch_model_errors():
    with pytest.raises(ValueError, match=r"polynorm\.patch_model: expected a model that holds PolyNorm modules, got"):
        polynorm.patch_model(motif.PolyNorm())
    with pytest.raises(ValueError, match=r"polynorm\.patch_model: expected backend to be one of .*, got 'cudnn'"):
        polynorm.patch_model(_motif_model(), backend="cudnn")
    with pytest.raises(TypeError, match=r"polynorm\.patch_model: expected model to be a torch\.nn\.Module, got dict"):
        polynorm.patch_model({})


# ---------------------------------------------------------------------------------------
# polynorm.layers: the hub's modules
# ---------------------------------------------------------------------------------------

PAIRS = [(hub.PolyNorm, layers.PolyNorm), (hub.FusedMulPolyNorm, layers.FusedMulPolyNorm)]


@pytest.mark.parametrize("theirs,ours", PAIRS, ids=["PolyNorm", "FusedMulPolyNorm"])
def test_layers_construct_as_the_hub(theirs, ours):
    # The hub's arguments lead, with its defaults; ours add device and backend after them.
    hub_params = list(inspect.signature(theirs).parameters.values())
    our_params = list(inspect.signature(ours).parameters.values())
    assert [(p.name, p.default) for p in our_params[: len(hub_params)]] == [(p.name, p.default) for p in hub_params]
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the hub's dtype default is float32, not torch's default dtype
    try:
        a, b = theirs(), ours()
    finally:
        torch.set_default_dtype(saved)
    for name in ("weight", "bias"):
        assert getattr(b, name).dtype == getattr(a, name).dtype == torch.float32
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=0, atol=0)
    c, d = theirs(1e-5, dtype=torch.bfloat16), ours(1e-5, dtype=torch.bfloat16)
    assert d.eps == c.eps == 1e-5 and d.weight.dtype == c.weight.dtype == torch.bfloat16
    assert isinstance(d, polynorm.PolyNorm if ours is layers.PolyNorm else polynorm.FusedMulPolyNorm)


@pytest.mark.parametrize("ours", [layers.PolyNorm, layers.FusedMulPolyNorm, polynorm.PolyNorm, polynorm.FusedMulPolyNorm])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64], ids=str)
def test_layers_refuse_a_parameter_dtype_the_ops_refuse(ours, dtype):
    # A complex module used to be built, and fail only at its first forward; an integer one
    # failed with torch's message about gradients, naming no module.
    name = re.escape(f"polynorm.{'layers.' if ours.__module__ == 'polynorm.layers' else ''}{ours.__name__}")
    with pytest.raises(TypeError, match=f"{name}: expected dtype to be None, float32, float64, float16 or bfloat16, got {dtype}"):
        ours(dtype=dtype)


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("theirs,ours", PAIRS, ids=["PolyNorm", "FusedMulPolyNorm"])
def test_layers_state_dict_round_trip(theirs, ours, param_dtype):
    gen = torch.Generator().manual_seed(seed_for("layers", "state_dict", theirs.__name__, param_dtype))
    a = theirs(1e-4, dtype=param_dtype)
    with torch.no_grad():
        a.weight.copy_(torch.randn(3, generator=gen))
        a.bias.copy_(torch.randn(1, generator=gen))
    b = ours(1e-4, dtype=param_dtype)
    b.load_state_dict(a.state_dict(), strict=True)
    c = theirs(1e-4, dtype=param_dtype)
    c.load_state_dict(b.state_dict(), strict=True)
    for sd in (b.state_dict(), c.state_dict()):
        assert list(sd) == list(a.state_dict()) == ["weight", "bias"]
        for key, value in sd.items():
            assert value.shape == a.state_dict()[key].shape and value.dtype == param_dtype
            assert torch.equal(value, a.state_dict()[key]), key


@pytest.mark.parametrize("theirs,ours", PAIRS, ids=["PolyNorm", "FusedMulPolyNorm"])
@pytest.mark.parametrize("device", DEVICES)
def test_layers_fp32_parameters_beside_bf16_activations(device, theirs, ours):
    # The hub's default: fp32 weight and bias, bf16 x (and mul). y comes back in bf16, within
    # one bf16 rounding of the float64 result; the gradients come back in each tensor's dtype.
    gen = torch.Generator().manual_seed(seed_for("layers", "fp32 params", theirs.__name__, device))
    module = ours(device=device)
    with torch.no_grad():
        module.weight.copy_(torch.randn(3, generator=gen))
        module.bias.copy_(torch.randn(1, generator=gen))
    inputs = [torch.randn(7, 96, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
              for _ in range(1 if ours is layers.PolyNorm else 2)]
    y = module(*inputs)
    grad_y = torch.randn(y.shape, generator=gen).to(device, y.dtype)
    grads = torch.autograd.grad(y, [*inputs, module.weight, module.bias], grad_y)
    assert y.dtype == torch.bfloat16
    assert [t.dtype for t in grads] == [torch.bfloat16] * len(inputs) + [torch.float32] * 2
    oracle = polynorm.reference.poly_norm if ours is layers.PolyNorm else polynorm.reference.poly_norm_mul
    expected = oracle(*inputs, module.weight, module.bias, module.eps, compute_dtype=torch.float64)
    assert rel_l2(y, expected) <= unit_roundoff(torch.bfloat16)


def test_readme_shows_the_two_lines():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "`import polynorm`" in readme and "`polynorm.patch_model(model)`" in readme
