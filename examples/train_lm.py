"""Train a small PolyNorm language model once per backend, and check that every backend agrees.

The main job, as ``python3 -m polynorm`` runs it; its code is ``polynorm.lm.train`` (the model:
``polynorm.lm.model``, the text: ``polynorm.lm.data``), which ships with every install::

    python3 examples/train_lm.py --preset cpu --mlp gated --dtype fp32
"""

from polynorm.lm.train import main

if __name__ == "__main__":
    raise SystemExit(main())
