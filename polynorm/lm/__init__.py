"""The main job's language model: byte-level text (``data``), a small transformer with PolyNorm
MLPs (``model``) and the training comparison of every backend against the reference
(``train``, run by ``python3 -m polynorm``). Shipped inside the package so that the main job
runs from any install; ``import polynorm`` does not import it."""
