"""PolyNorm under data and sequence parallelism, checked against one process.

Run with one process per device (``torchrun``); NCCL on CUDA, gloo on CPU::

    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --mode ddp
    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --mode fsdp
    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --mode sp
    torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --mode tp

- ``ddp``: the byte-level LM of ``polynorm.lm.model`` (PolyNorm MLPs; by default the
  gated form, whose activation is the fused PolyNorm x mul, ``polynorm.FusedMulPolyNorm``) trained with
  ``DistributedDataParallel``, each rank on its share of the global batch, against the
  same model trained in one process on the whole global batch (every rank computes that
  run itself). After ``--steps`` AdamW steps the parameters must agree within ``PARAM_TOL``,
  and at the first step the PolyNorm weight and bias gradients within ``GRAD_TOL``: they
  are all-reduced like every other parameter's.
- ``fsdp``: the same with FSDP2 (``torch.distributed.fsdp.fully_shard`` on every block and
  on the model); parameters are gathered with ``full_tensor()`` to compare.
- ``sp``: PolyNorm on a DTensor sharded on the batch (``Shard(0)``) or the sequence
  (``Shard(1)``) dimension, through ``polynorm.poly_norm`` and autograd, against the
  unsharded tensors: no communication in forward or backward, y and dx bitwise equal (a
  row's result does not depend on its batch), weight and bias gradients ``Partial`` and,
  once reduced, within ``GRAD_TOL``. The same for the fused PolyNorm x mul
  (``polynorm.poly_norm_mul``, the gated MLP's activation) with x and mul sharded alike:
  out, dx and dmul bitwise and sharded like x. And the grouped PolyNorm
  (``polynorm.poly_norm_grouped``), whose only rule is ``Replicate()`` (its offsets index
  the global rows; ``polynorm/_sharding.py``): on replicated tensors no communication and
  every output bitwise; with x sharded on its rows DTensor gathers it first, and the
  results are still bitwise those of one process.

- ``tp``: a gated MLP ``down(PolyNorm(gate(x)) * up(x))`` trained tensor-parallel, Megatron
  style: gate and up column-parallel (each rank holds an uneven share of the F intermediate
  columns), down row-parallel (its output summed over the ranks), the activation
  ``polynorm.tp.poly_norm_mul`` over the ranks' columns (one all-reduce of ``[M, 3]`` sums a
  direction), and the PolyNorm weight and bias gradients, each rank's share, summed before
  the step. Against the same MLP trained in one process: the same bounds as ``ddp``.

Tolerances are relative, ``||a - b|| / ||b||`` per tensor, in fp32. Data parallelism changes
only the order of the gradient sums (each rank's mean, then the all-reduce's mean), a few
fp32 ulps a step; AdamW then carries that through the steps. Measured with gloo on a CPU
(tiny preset, 20 steps): parameters within ~1e-6, first-step gradients within ~1e-7.

Exit status 0 when every check holds; rank 0 prints one line per check.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import polynorm
from polynorm.lm.data import batch_starts, build_corpus, get_batch
from polynorm.lm.model import ModelConfig, TinyLM

PARAM_TOL = 1e-4  # parameters after the run
GRAD_TOL = 1e-5  # gradients of one step


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are 0)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def setup() -> torch.device:
    """Initialises the process group from torchrun's environment: NCCL and one GPU a rank when
    there are enough GPUs, else gloo on the CPU."""
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return torch.device("cuda", local)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def make_model(args, device: torch.device) -> TinyLM:
    """The same initial weights on every rank and for every run (a fixed seed)."""
    torch.manual_seed(args.seed)
    config = ModelConfig(n_layer=2, hidden_size=64, n_head=4, seq_len=args.seq_len, mlp=args.mlp)
    return TinyLM(config, backend=args.backend).to(device)


def train(model, args, data, starts, device, shard: slice, on_first_grads=None) -> list[float]:
    """AdamW steps on rows ``shard`` of each global batch; the loss is the mean over those
    rows, so averaging it (and its gradients) over equal shards gives the global batch's."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        x, y = get_batch(data, starts[step][shard], args.seq_len)
        loss = model(x.to(device), y.to(device))
        loss.backward()
        if step == 0 and on_first_grads is not None:
            on_first_grads(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def poly_norm_params(model) -> dict:
    return {n: p for n, p in model.named_parameters() if ".act." in n}


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_data_parallel(args, device) -> list[tuple[str, float, float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise ValueError(f"train_distributed: --global-batch {args.global_batch} must divide among {world} ranks")
    corpus = build_corpus(1 << 20)
    starts = batch_starts(corpus.train.numel(), args.seq_len, args.global_batch, args.steps, seed=args.seed)

    # One process, the whole global batch: the run to match.
    single = make_model(args, device)
    single_grads = {}
    train(single, args, corpus.train, starts, device, slice(None),
          lambda m: single_grads.update({n: p.grad.detach().clone() for n, p in poly_norm_params(m).items()}))

    model = make_model(args, device)
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        wrapped = fully_shard(model)
    per_rank = args.global_batch // world
    grads = {}
    train(wrapped, args, corpus.train, starts, device, slice(rank * per_rank, (rank + 1) * per_rank),
          lambda m: grads.update({n: full(p.grad).detach().clone() for n, p in poly_norm_params(model).items()}))

    results = []
    for name, g in grads.items():
        results.append((f"first-step grad {name}", rel(g, single_grads[name]), GRAD_TOL))
    reference = dict(single.named_parameters())
    worst = max(((rel(full(p), reference[n]), n) for n, p in model.named_parameters()), default=(0.0, "-"))
    results.append((f"parameters after {args.steps} steps (worst: {worst[1]})", worst[0], PARAM_TOL))
    return results


def _sharded_results(what: str, comm: int, placements_ok: bool, exact: dict, reduced: dict) -> list:
    """Check lines for one sharded call: the number of collectives in forward and backward
    (bound 0; ``comm`` None: not checked here), the placements, the tensors that must equal
    one process's bitwise, and those within GRAD_TOL once reduced. ``exact`` and
    ``reduced``: {name: (DTensor, plain tensor)}."""
    results = [] if comm is None else [(f"{what}: collectives in forward + backward", comm, 0)]
    results.append((f"{what}: placements", 0.0 if placements_ok else 1.0, 0))
    for name, (got, want) in exact.items():
        results.append((f"{what}: {name} bitwise", 0.0 if torch.equal(got.full_tensor(), want.detach()) else 1.0, 0))
    for name, (got, want) in reduced.items():
        results.append((f"{what}: {name} reduced", rel(got.full_tensor(), want), GRAD_TOL))
    return results


def check_sequence_parallel(args, device) -> list[tuple[str, float, float]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(args.seed)
    x_full = torch.randn(4, 2 * args.seq_len, 96, generator=gen).to(device)
    g_full = torch.randn(x_full.shape, generator=gen).to(device)
    mul_full = torch.randn(x_full.shape, generator=gen).to(device)
    w_full = torch.tensor([0.3, -0.4, 0.9], device=device)
    b_full = torch.tensor([0.1], device=device)

    def shard(t, *placements):
        return distribute_tensor(t, mesh, list(placements)).requires_grad_(t.is_floating_point())

    results = []
    # PolyNorm and the fused PolyNorm x mul, x (and mul) sharded on the batch or the sequence.
    leaves = [t.clone().requires_grad_() for t in (x_full, w_full, b_full)]
    y_ref = polynorm.poly_norm(*leaves, backend=args.backend)
    grads_ref = torch.autograd.grad(y_ref, leaves, g_full)
    mul_leaves = [t.clone().requires_grad_() for t in (x_full, mul_full, w_full, b_full)]
    out_ref = polynorm.poly_norm_mul(*mul_leaves, backend=args.backend)
    mul_grads_ref = torch.autograd.grad(out_ref, mul_leaves, g_full)
    for d in (0, 1):
        x, w, b = shard(x_full, Shard(d)), shard(w_full, Replicate()), shard(b_full, Replicate())
        g = distribute_tensor(g_full, mesh, [Shard(d)])
        with CommDebugMode() as comm_fwd:
            y = polynorm.poly_norm(x, w, b, backend=args.backend)
        with CommDebugMode() as comm_bwd:
            gx, gw, gb = torch.autograd.grad(y, (x, w, b), g)
        placements_ok = (
            y.placements == (Shard(d),) and gx.placements == (Shard(d),)
            and gw.placements == (Partial(),) and gb.placements == (Partial(),)
        )
        results += _sharded_results(
            f"poly_norm Shard({d})", comm_fwd.get_total_counts() + comm_bwd.get_total_counts(), placements_ok,
            exact={"y": (y, y_ref), "dx": (gx, grads_ref[0])},
            reduced={"dw": (gw, grads_ref[1]), "db": (gb, grads_ref[2])},
        )

        x, mul = shard(x_full, Shard(d)), shard(mul_full, Shard(d))
        w, b = shard(w_full, Replicate()), shard(b_full, Replicate())
        with CommDebugMode() as comm_fwd:
            out = polynorm.poly_norm_mul(x, mul, w, b, backend=args.backend)
        with CommDebugMode() as comm_bwd:
            gx, gmul, gw, gb = torch.autograd.grad(out, (x, mul, w, b), g)
        placements_ok = (
            out.placements == gx.placements == gmul.placements == (Shard(d),)
            and gw.placements == gb.placements == (Partial(),)
        )
        results += _sharded_results(
            f"poly_norm_mul Shard({d})", comm_fwd.get_total_counts() + comm_bwd.get_total_counts(), placements_ok,
            exact={"out": (out, out_ref), "dx": (gx, mul_grads_ref[0]), "dmul": (gmul, mul_grads_ref[1])},
            reduced={"dw": (gw, mul_grads_ref[2]), "db": (gb, mul_grads_ref[3])},
        )

    # The grouped PolyNorm: Replicate() only. Three experts over the 2-D rows of x, uneven,
    # one empty, and rows past the last offset that belong to no expert.
    x2_full = x_full.reshape(-1, x_full.shape[-1])
    g2_full = g_full.reshape(x2_full.shape)
    rows = x2_full.shape[0]
    offsets_full = torch.tensor([rows // 5, rows // 5, rows - 7], device=device)
    gw_full = torch.tensor([[0.3, -0.4, 0.9], [0.5, 0.5, 0.5], [-0.2, 0.8, 0.1]], device=device)
    gb_full = torch.tensor([0.1, 0.0, -0.3], device=device)
    leaves = [t.clone().requires_grad_() for t in (x2_full, gw_full, gb_full)]
    y_ref = polynorm.poly_norm_grouped(leaves[0], leaves[1], leaves[2], offsets_full, backend=args.backend)
    grads_ref = torch.autograd.grad(y_ref, leaves, g2_full)
    for placement in (Replicate(), Shard(0)):
        x = shard(x2_full, placement)
        w, b = shard(gw_full, Replicate()), shard(gb_full, Replicate())
        offsets = shard(offsets_full, Replicate())
        with CommDebugMode() as comm_fwd:
            y = polynorm.poly_norm_grouped(x, w, b, offsets, backend=args.backend)
        g = distribute_tensor(g2_full, mesh, [Replicate()])
        with CommDebugMode() as comm_bwd:
            gx, gw, gb = torch.autograd.grad(y, (x, w, b), g)
        # Each rank computes every row: every output, the gradients included, is whole on every
        # rank. (With x sharded, the op saved x's shard for backward, which is gathered again.)
        placements_ok = all(t.placements == (Replicate(),) for t in (y, gx, gw, gb))
        exact = {"y": (y, y_ref), "dx": (gx, grads_ref[0]), "dw": (gw, grads_ref[1]), "db": (gb, grads_ref[2])}
        if placement == Replicate():
            comm = comm_fwd.get_total_counts() + comm_bwd.get_total_counts()
            results += _sharded_results("poly_norm_grouped Replicate", comm, placements_ok, exact, {})
        else:  # x's rows are gathered first: communication, and still one process's results
            results += _sharded_results("poly_norm_grouped Shard(0), gathered", None, placements_ok, exact, {})
            gathered = comm_fwd.get_total_counts() > 0 and comm_bwd.get_total_counts() > 0
            results.append(("poly_norm_grouped Shard(0): x gathered in forward and backward (0: yes)",
                            0.0 if gathered else 1.0, 0))
    return results


class _SumOverRanks(torch.autograd.Function):
    """The row-parallel layer's output: summed over the ranks in forward; in backward each
    rank's share receives the whole gradient (Megatron's g operator)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def check_tensor_parallel(args, device) -> list[tuple[str, float, float]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    D, F = 64, 4 * 64 + 1  # F odd: an uneven split of the intermediate columns
    gen = torch.Generator().manual_seed(args.seed)
    full = {
        "gate": torch.randn(F, D, generator=gen) / D**0.5,
        "up": torch.randn(F, D, generator=gen) / D**0.5,
        "down": torch.randn(D, F, generator=gen) / F**0.5,
        "act.weight": torch.full((3,), 1 / 3),
        "act.bias": torch.zeros(1),
    }
    data = [(torch.randn(args.global_batch, args.seq_len, D, generator=gen),
             torch.randn(args.global_batch, args.seq_len, D, generator=gen)) for _ in range(args.steps)]  # fmt: skip
    cols = torch.tensor_split(torch.arange(F), world)[rank]  # this rank's intermediate columns
    lo, hi = int(cols[0]), int(cols[-1]) + 1

    def run(params: dict, tensor_parallel: bool) -> dict:
        opt = torch.optim.AdamW(params.values(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        first = {}
        for step, (x, target) in enumerate(data):
            x, target = x.to(device), target.to(device)
            gate, up = x @ params["gate"].T, x @ params["up"].T
            w, b = params["act.weight"], params["act.bias"]
            if tensor_parallel:
                act = polynorm.tp.poly_norm_mul(gate, up, w, b, hidden_size=F, backend=args.backend)
                out = _SumOverRanks.apply(act @ params["down"].T)
            else:
                out = polynorm.poly_norm_mul(gate, up, w, b, backend=args.backend) @ params["down"].T
            loss = torch.nn.functional.mse_loss(out, target)
            loss.backward()
            if tensor_parallel:  # the PolyNorm parameters' gradients: each rank's share (MATH.md (14))
                dist.all_reduce(w.grad)
                dist.all_reduce(b.grad)
            if step == 0:
                first = {n: p.grad.detach().clone() for n, p in params.items()}
            opt.step()
            opt.zero_grad(set_to_none=True)
        return first

    single = {n: t.clone().to(device).requires_grad_() for n, t in full.items()}
    single_grads = run(single, False)
    shard = {"gate": full["gate"][lo:hi], "up": full["up"][lo:hi], "down": full["down"][:, lo:hi]}
    local = {n: shard.get(n, t).clone().to(device).requires_grad_() for n, t in full.items()}
    grads = run(local, True)

    def sharded(name: str, t: torch.Tensor) -> torch.Tensor:  # the single run's share of a parameter
        return t[lo:hi] if name in ("gate", "up") else t[:, lo:hi] if name == "down" else t

    results = [(f"first-step grad {n}", rel(g, sharded(n, single_grads[n])), GRAD_TOL) for n, g in grads.items()]
    worst = max((rel(p, sharded(n, single[n])), n) for n, p in local.items())
    results.append((f"parameters after {args.steps} steps (worst: {worst[1]})", worst[0], PARAM_TOL))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ddp", "fsdp", "sp", "tp"], required=True)
    parser.add_argument("--backend", default="auto", choices=list(polynorm.BACKENDS), help="PolyNorm backend")
    parser.add_argument("--mlp", choices=["polycom", "gated"], default="gated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    device = setup()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        check = {"sp": check_sequence_parallel, "tp": check_tensor_parallel}.get(args.mode, check_data_parallel)
        results = check(args, device)
        # No rank leaves while a peer still has a collective in flight. Not after a failure:
        # the peers may be waiting in another collective, and the barrier would hang.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    ok = all(value <= bound for _, value, bound in results)
    if int(os.environ.get("RANK", "0")) == 0:
        where = f"{os.environ['WORLD_SIZE']} ranks on {device.type}, backend {args.backend}"
        print(f"train_distributed --mode {args.mode}: {where}")
        for what, value, bound in results:
            print(f"  {'ok  ' if value <= bound else 'FAIL'} {what}: {value:.3g} (<= {bound:g})")
        print("all checks hold" if ok else "SOME CHECKS FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    status = main()
    # Skip interpreter shutdown. In the sp and fsdp modes DTensor's caches keep the device
    # mesh, and with it the gloo process group, alive after destroy_process_group(), so
    # gloo's worker threads are never joined. Such a thread frees a finished collective's
    # work object (and its Python tensors, which takes the GIL) a moment after the
    # collective completes; if the interpreter is being finalised by then, the process
    # aborts ("terminate called without an active exception", SIGABRT): about 1 run in 6 on
    # a 2-core CPU under torch 2.14. Every check has completed and printed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
