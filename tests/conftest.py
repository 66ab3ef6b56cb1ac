"""pytest setup for every test module.

Without a CUDA device, Triton's interpreter runs the Triton kernels on CPU tensors, so CI
on a CPU-only machine tests them too. triton.jit reads TRITON_INTERPRET when it decorates
a kernel, so it is set here, before any test module imports polynorm.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
