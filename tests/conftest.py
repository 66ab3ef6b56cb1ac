"""pytest setup for every test module.

Without a CUDA device, Triton's interpreter runs the Triton kernels on CPU tensors, so CI
on a CPU-only machine tests them too. triton.jit reads TRITON_INTERPRET when it decorates
a kernel, so it is set here, before any test module imports polynorm.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker is a process with torch's default intra-op pool (one thread
# per core): 8 workers on a 16-core machine ran 128 threads on 16 cores, and the CPU cases
# crawled (on the H200 machine a CPU test of 5 x 4096 elements took 14 s). Each worker
# takes its share of the cores instead.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))
