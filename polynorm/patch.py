"""``polynorm.patch_model``: polynorm's PolyNorm in Motif's models, in one call.

Motif's models get PolyNorm from their remote code (``modeling_motif.py``: an eager
``PolyNorm``, the PolyCom reference, as the gated MLP's ``act_fn``), from the kernels hub
(``Motif-Technologies/activation``: ``layers.PolyNorm``, ``layers.FusedMulPolyNorm``) or from
Liger-Kernel (``LigerPolyNorm``). :func:`patch_model` finds these modules by their class
name and their parameters and puts polynorm's modules (:mod:`polynorm.layers`) in their
places, holding the same ``Parameter`` objects.
"""

import warnings

import torch
from torch import nn

from polynorm import layers, module
from polynorm._common import check_eps
from polynorm.ops import BACKENDS

__all__ = ["patch_model"]

# Class names of the PolyNorm modules patch_model swaps: y = poly_norm(x), or out = poly_norm(x) * mul.
_SINGLE = ("PolyNorm", "LigerPolyNorm")
_MUL = ("FusedMulPolyNorm",)
# Names of the attribute that holds eps: Motif's and the hub's modules, then Liger's.
_EPS_NAMES = ("eps", "variance_epsilon")
# Attributes by which a PolyNorm variant computes another function (Motif-3's PolyNorm passes
# its weights through a sigmoid, clamps its bias, scales its output), with the value at which
# it computes PolyNorm. A module with another value is left as it is.
_VARIANTS = {"sigmoid_weight": False, "output_scale": 1.0, "bias_clamp": None, "hidden_clamp": None}
# Motif's gated MLP, down_proj(act_fn(gate_proj(x)) * up_proj(x)): its children's names.
_MLP_CHILDREN = frozenset(("gate_proj", "up_proj", "down_proj", "act_fn"))
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# The module's own hooks, which the new module would not have: forward and backward hooks, and
# state_dict and load_state_dict hooks (the state_dict would otherwise change without a word).
_HOOK_DICTS = (
    "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)  # fmt: skip


class _Skip(Exception):
    """A module named like a PolyNorm that patch_model leaves as it is, and why."""


def _untouched(mod: nn.Module) -> None:
    """Raises _Skip where swapping the module would lose what was attached to it."""
    hooks = sum(len(getattr(mod, name, None) or {}) for name in _HOOK_DICTS)
    if hooks:
        raise _Skip(f"it has {hooks} hook(s), which a new module would not run")
    if "forward" in vars(mod):
        raise _Skip("its forward is replaced on the instance (a wrapper's), which a new module would not run")


def _is_neutral(value, neutral) -> bool:
    """Whether an option attribute holds the value at which the module computes PolyNorm. A value
    that does not compare to one truth value (a tensor of several elements) is not neutral."""
    if neutral is None:
        return value is None
    try:
        return bool(value == neutral)
    except (RuntimeError, TypeError, ValueError):
        return False


def _polynorm_kind(mod: nn.Module):
    """("single" or "mul", eps) for a PolyNorm module patch_model can swap; None for any other module.

    Raises:
        _Skip: the class name is a PolyNorm's, but the module is not one polynorm computes.
    """
    name = type(mod).__name__
    if isinstance(mod, module._PolyNormParameters) or name not in _SINGLE + _MUL:
        return None
    if mod._modules:
        raise _Skip(f"it has submodules ({', '.join(mod._modules)})")
    params = dict(mod.named_parameters(recurse=False))
    if set(params) != {"weight", "bias"} or next(mod.buffers(recurse=False), None) is not None:
        raise _Skip(f"expected the parameters weight and bias and no buffers, got parameters "
                    f"{sorted(params)} and buffers {sorted(n for n, _ in mod.named_buffers(recurse=False))}")
    weight, bias = params["weight"], params["bias"]
    if tuple(weight.shape) != (3,) or tuple(bias.shape) not in ((1,), ()):
        raise _Skip(f"expected weight (3,) and bias (1,) or (), got weight {tuple(weight.shape)} "
                    f"and bias {tuple(bias.shape)}")
    if weight.dtype not in _FLOAT_DTYPES or bias.dtype not in _FLOAT_DTYPES:
        raise _Skip(f"expected float32, float64, float16 or bfloat16 parameters, got {weight.dtype} and {bias.dtype}")
    for attr, neutral in _VARIANTS.items():
        if hasattr(mod, attr) and not _is_neutral(getattr(mod, attr), neutral):
            raise _Skip(f"{attr}={getattr(mod, attr)!r} makes it another function than PolyNorm")
    eps_name = next((n for n in _EPS_NAMES if hasattr(mod, n)), None)
    if eps_name is None:
        raise _Skip(f"expected eps in an attribute {' or '.join(_EPS_NAMES)}, found none")
    try:
        eps = check_eps("polynorm.patch_model", getattr(mod, eps_name))
    except (TypeError, ValueError) as error:
        raise _Skip(str(error)) from None
    _untouched(mod)
    return ("mul" if name in _MUL else "single"), eps


def _ours(old: nn.Module, cls, eps: float, backend: str) -> nn.Module:
    """A polynorm.layers module holding old's weight and bias Parameters (the same objects)."""
    new = cls(eps=eps, dtype=old.weight.dtype, device="meta", backend=backend)  # no memory: its parameters are replaced
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _fusable_mlp(mod: nn.Module):
    """The act_fn's eps if mod is Motif's gated MLP around an eager PolyNorm, else None."""
    if not type(mod).__name__.lower().endswith("mlp") or set(mod._modules) != _MLP_CHILDREN:
        return None
    if any(child is None for child in mod._modules.values()) or next(mod.parameters(recurse=False), None) is not None:
        return None
    try:
        kind = _polynorm_kind(mod.act_fn)
        if kind is None or kind[0] != "single":
            return None
        _untouched(mod)
    except _Skip:
        return None  # the act_fn is reported (or not) when patch_model reaches it
    return kind[1]


def patch_model(model: nn.Module, *, backend: str = "auto", fuse_mlp: bool = True) -> dict:
    """Swaps, in place, every PolyNorm module in ``model`` for polynorm's; returns what it swapped.

    It recognises a module by its class name and its parameters: direct parameters
    ``weight`` ``(3,)`` and ``bias`` ``(1,)`` or ``()``, no buffers, no submodules, eps in
    ``eps`` or ``variance_epsilon``:

    - ``PolyNorm``: the eager PolyNorm of Motif's remote code (``modeling_motif.py``) and
      ``layers.PolyNorm`` of the kernels-hub kernel ``Motif-Technologies/activation``
      become :class:`polynorm.layers.PolyNorm`;
    - ``LigerPolyNorm`` (Liger-Kernel: a ``()`` bias, eps in ``variance_epsilon``) becomes
      :class:`polynorm.layers.PolyNorm`, its bias still ``()``;
    - ``FusedMulPolyNorm`` (the hub's, ``forward(x, mul)``) becomes
      :class:`polynorm.layers.FusedMulPolyNorm`;
    - with ``fuse_mlp``, Motif's gated MLP, a module whose class name ends in ``MLP`` and
      whose children are exactly ``gate_proj``, ``up_proj``, ``down_proj`` and an ``act_fn``
      of the first two kinds (Motif's ``MotifMLP``, whose forward is
      ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``), becomes a
      :class:`polynorm.layers.GatedMLP` over the same projections, whose ``act_fn`` is a
      :class:`polynorm.layers.FusedMulPolyNorm`: one op reads the two projections and writes
      the product (:func:`polynorm.poly_norm_mul`). The forward is not read: an MLP of that
      structure that computes something else needs ``fuse_mlp=False``.

    The new modules hold the old ``weight`` and ``bias`` Parameter objects (so their values,
    devices, dtypes, ``requires_grad`` and an optimizer made before the call are kept) and
    the old projection modules; the state_dict keys do not change. A module reached under
    several names is swapped once, for the same new module everywhere. Call it before
    wrapping the model (DDP, FSDP, ``torch.compile``) or dispatching it over devices
    (accelerate's ``device_map``, whose hooks replace ``forward``).

    A module with a PolyNorm's class name that polynorm cannot stand in for is left as it
    is, with a ``UserWarning`` that says why: another function (a ``sigmoid_weight``,
    ``output_scale``, ``bias_clamp`` or ``hidden_clamp`` of a non-neutral value), other
    parameters or shapes, hooks, or a ``forward`` replaced on the instance.

    Args:
        model: the model, patched in place (its submodules; the model itself is not swapped).
        backend: the new modules' backend (see :func:`polynorm.poly_norm`).
        fuse_mlp: whether to swap Motif's gated MLPs for :class:`polynorm.layers.GatedMLP`;
            ``False`` swaps only their ``act_fn``.

    Returns:
        ``{qualified name: (old class, new class)}`` for every module swapped, in the order
        reached: ``"model.layers.0.mlp": (MotifMLP, GatedMLP)``,
        ``"model.layers.0.mlp.act_fn": (PolyNorm, polynorm.layers.FusedMulPolyNorm)``.

    Raises:
        TypeError: model not an ``nn.Module``.
        ValueError: an unknown backend, or model itself a PolyNorm module (it has no parent
            to be swapped in: patch the module that holds it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"polynorm.patch_model: expected model to be a torch.nn.Module, got {type(model).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"polynorm.patch_model: expected backend to be one of {', '.join(BACKENDS)}, got {backend!r}")
    try:
        root_kind = _polynorm_kind(model)
    except _Skip:
        root_kind = None
    if root_kind is not None:
        raise ValueError(f"polynorm.patch_model: expected a model that holds PolyNorm modules, got a "
                         f"{type(model).__name__} itself, which has no parent to be swapped in; patch the "
                         f"module that holds it")

    swapped: dict = {}
    skipped: dict = {}
    new_of: dict = {}  # id(old module) -> its replacement, for a module reached under several names
    fused_of: dict = {}  # id(old act_fn) -> its FusedMulPolyNorm, for an act_fn shared by several MLPs
    visited: set = set()

    def replacement(old: nn.Module, name: str):
        if id(old) in new_of:
            return new_of[id(old)]
        new = None
        eps = _fusable_mlp(old) if fuse_mlp else None
        if eps is not None:
            act = old.act_fn
            if id(act) not in fused_of:
                fused_of[id(act)] = _ours(act, layers.FusedMulPolyNorm, eps, backend)
            fused = fused_of[id(act)]
            new = layers.GatedMLP(old.gate_proj, old.up_proj, old.down_proj, fused)
            for key in old._modules:  # the old module's order, so the state_dict's order too
                new._modules[key] = new._modules.pop(key)
            new.train(old.training)
            swapped[name] = (type(old), type(new))
            swapped[f"{name}.act_fn"] = (type(act), type(fused))
        else:
            try:
                kind = _polynorm_kind(old)
            except _Skip as why:
                skipped.setdefault(name, str(why))
                return None
            if kind is None:
                return None
            cls = layers.FusedMulPolyNorm if kind[0] == "mul" else layers.PolyNorm
            new = _ours(old, cls, kind[1], backend)
            swapped[name] = (type(old), type(new))
        new_of[id(old)] = new
        visited.add(id(new))
        return new

    def visit(parent: nn.Module, prefix: str) -> None:
        visited.add(id(parent))
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            name = prefix + child_name
            new = replacement(child, name)
            if new is not None:
                setattr(parent, child_name, new)
            elif id(child) not in visited:
                visit(child, name + ".")

    visit(model, "")
    if skipped:
        reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items())
        warnings.warn(f"polynorm.patch_model: left {len(skipped)} module(s) with a PolyNorm's class name as "
                      f"they are: {reasons}", UserWarning, stacklevel=2)
    return swapped
