"""Build polynorm's compiled library, polynorm._C.

The C++ CPU kernel is always built. The CUDA kernels are built too whenever torch is a
CUDA build and nvcc is found; no GPU is needed for that. Environment variables:

- ``POLYNORM_FORCE_CPU=1``: skip the CUDA objects.
- ``TORCH_CUDA_ARCH_LIST``: GPU architectures to compile for (default ``8.0;9.0``).
- ``MAX_JOBS``: parallel compile jobs (read by torch.utils.cpp_extension).
- ``CUDA_HOME``: the CUDA toolkit (default ``/usr/local/cuda`` when that exists).
- ``POLYNORM_NVCC_FLAGS``: extra nvcc flags, space-separated, for a benchmark's build of its
  own (a bench/ script's A/B); the product's build never needs one. ``POLYNORM_PTXAS_VERBOSE=1``:
  ptxas's register and spill report (bench/).

The CUDA objects are two translation units of about the same cost, cuda/forward.cu and
cuda/backward.cu (each about 90 s of nvcc for sm_90 alone on one core), so that two compile jobs
(MAX_JOBS=2) run them side by side; ninja takes the objects in name order, autograd.o first.
"""

import os
from pathlib import Path

# torch.utils.cpp_extension resolves CUDA_HOME when it is imported. Left to itself it can
# take /usr/local from /usr/local/bin/nvcc and then fail to link -lcudart.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ and Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

ROOT = Path(__file__).parent
CSRC = "csrc"


def _build_cuda() -> bool:
    if os.environ.get("POLYNORM_FORCE_CPU", "0") == "1":
        print("polynorm: POLYNORM_FORCE_CPU=1, building the CPU kernel only")
        return False
    if torch.version.cuda is None:
        print("polynorm: torch is not a CUDA build, building the CPU kernel only")
        return False
    if cpp_extension.CUDA_HOME is None or not Path(cpp_extension.CUDA_HOME, "bin", "nvcc").exists():
        print("polynorm: nvcc not found (set CUDA_HOME), building the CPU kernel only")
        return False
    return True


def _cuda_include_dirs() -> list[str]:
    # Some toolkits ship without every library header that torch's CUDA headers may pull
    # in; the nvidia-* wheels that come with a CUDA build of torch carry them.
    dirs = []
    if not Path(cpp_extension.CUDA_HOME, "include", "cusparse.h").exists():
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13", "cu12"):
                inc = Path(base, sub, "include")
                if (inc / "cusparse.h").exists():
                    dirs.append(str(inc))
    return dirs


CUDA_SOURCES = [f"{CSRC}/cuda/forward.cu", f"{CSRC}/cuda/backward.cu", f"{CSRC}/cuda/sharded.cu"]
CPP_SOURCES = [
    f"{CSRC}/ops.cpp",
    f"{CSRC}/plan_ops.cpp",
    f"{CSRC}/autograd.cpp",
    f"{CSRC}/polynorm_cpu.cpp",
    f"{CSRC}/polynorm_grouped_cpu.cpp",
    f"{CSRC}/sharded_cpu.cpp",
    f"{CSRC}/python_module.cpp",
]


def extensions():
    cxx_flags = ["-O3"]
    if _build_cuda():
        sources = CUDA_SOURCES + CPP_SOURCES
        nvcc_flags = ["-O3", "-lineinfo"]
        if os.environ.get("POLYNORM_PTXAS_VERBOSE") == "1":
            nvcc_flags.append("-Xptxas=-v")
        nvcc_flags += os.environ.get("POLYNORM_NVCC_FLAGS", "").split()
        return [
            cpp_extension.CUDAExtension(
                "polynorm._C",
                sources,
                include_dirs=[str(ROOT / CSRC)] + _cuda_include_dirs(),
                extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
            )
        ]
    sources = CPP_SOURCES + [f"{CSRC}/cuda_stub.cpp"]
    return [
        cpp_extension.CppExtension(
            "polynorm._C", sources, include_dirs=[str(ROOT / CSRC)], extra_compile_args={"cxx": cxx_flags}
        )
    ]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
