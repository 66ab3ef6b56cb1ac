"""``python3 -m polynorm``: train a small PolyNorm language model once per backend, and compare.

The main job. A byte-level decoder-only transformer whose MLPs use PolyNorm (Zhuo et al.,
"Polynomial Composition Activations", arXiv:2411.03884): the PolyCom form
``down(PolyNorm(up(x)))`` through :class:`polynorm.PolyNorm`, and Motif's gated form
``down(PolyNorm(gate(x)) * up(x))`` through the fused PolyNorm x mul,
:class:`polynorm.FusedMulPolyNorm` (Liger's row, which has no fused op, runs its PolyNorm then
``*``). It trains on the source of Python's standard library, from the same initial weights
on the same batches, once per PolyNorm backend, in fp32 and in bf16 autocast:

- on a GPU: the ``gpu`` preset (6 layers x 768, T = 512) with the ``cuda``, ``triton`` and
  ``reference`` backends, and Liger-Kernel's PolyNorm where it imports;
- on a CPU-only machine: the ``cpu`` preset (2 layers x 64, T = 64) with the C++ kernel
  (backend ``"auto"`` on CPU tensors, row ``cpu``) and the reference.

Every backend is compared with the reference in lock-step (at every step, the loss and the
gradients on the reference's parameters, within 8 times the deviation of the reference
computed in float64) and free-running (its own run's final validation loss, within 8 times
the spread of the reference against its float64 twin). It prints the throughput/memory
table and both agreement tables (the first two name the op each row's MLPs run), writes
``loss_curves.png``, ``summary.md`` and ``summary.json`` under ``--out`` (default
``out/train``), and exits with status 1 when a backend disagrees, or when the loss does not
fall. ``--help`` lists the options.

The training code is ``polynorm.lm.train`` (the model: ``polynorm.lm.model``; the text:
``polynorm.lm.data``), part of every install.
"""


def main(argv=None) -> int:
    from polynorm.lm.train import main as train_main

    return train_main(argv, prog="python3 -m polynorm")


if __name__ == "__main__":
    raise SystemExit(main())
