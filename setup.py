"""Build polynorm's compiled library, polynorm._C.

The C++ CPU kernel is always built. The CUDA kernels are built too whenever torch is a
CUDA build and nvcc is found; no GPU is needed for that. Environment variables:

- ``POLYNORM_FORCE_CPU=1``: skip the CUDA objects.
- ``TORCH_CUDA_ARCH_LIST``: GPU architectures to compile for. Default ``8.0;9.0;10.0+PTX``:
  machine code for sm_80 (A100), sm_90 (H100, H200) and sm_100 (B200, GB200), and compute_100
  PTX that the driver compiles for any later GPU. A toolkit older than CUDA 12.8 (no sm_100)
  gets ``8.0;9.0+PTX``.
- ``MAX_JOBS``: parallel compile jobs (read by torch.utils.cpp_extension).
- ``CUDA_HOME``: the CUDA toolkit (default ``/usr/local/cuda`` when that exists).
- ``POLYNORM_NVCC_FLAGS``: extra nvcc flags, space-separated, for a benchmark's build of its
  own (a bench/ script's A/B); the product's build never needs one. ``POLYNORM_PTXAS_VERBOSE=1``:
  ptxas's register and spill report (bench/).

The build says what it compiles, for which architectures, and, every 20 s while a compiler
runs, which sources are still compiling and for how long (pip shows a build's output with
``-v`` only). A build for ``POLYNORM_NVCC_FLAGS="-gencode=arch=compute_80,code=compute_80"``
holds compute_80 PTX alone (torch adds no architecture flags of its own when one is given).

The CUDA objects are two translation units of about the same cost, cuda/forward.cu and
cuda/backward.cu (each about 90 s of nvcc for sm_90 alone on one core), so that two compile jobs
(MAX_JOBS=2) run them side by side; ninja takes the objects in name order, autograd.o first.
"""

import os
import re
import subprocess
import threading
import time
from pathlib import Path

# torch.utils.cpp_extension resolves CUDA_HOME when it is imported. Left to itself it can
# take /usr/local from /usr/local/bin/nvcc and then fail to link -lcudart.
if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ and Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from setuptools import setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

DEFAULT_ARCHS = "8.0;9.0;10.0+PTX"
HEARTBEAT_S = 20  # a line at least this often while a compiler runs


def say(message: str) -> None:
    # Flushed at once: pip -v relays the build's output as it comes, and a pipe would hold it.
    print(f"polynorm: {message}", flush=True)

ROOT = Path(__file__).parent
CSRC = "csrc"


def _build_cuda() -> bool:
    if os.environ.get("POLYNORM_FORCE_CPU", "0") == "1":
        say("POLYNORM_FORCE_CPU=1, building the CPU kernel only")
        return False
    if torch.version.cuda is None:
        say("torch is not a CUDA build, building the CPU kernel only")
        return False
    if cpp_extension.CUDA_HOME is None or not Path(cpp_extension.CUDA_HOME, "bin", "nvcc").exists():
        say("nvcc not found (set CUDA_HOME), building the CPU kernel only")
        return False
    say(f"building the CUDA kernels with {cpp_extension.CUDA_HOME}/bin/nvcc, torch {torch.__version__}")
    return True


def _cuda_include_dirs() -> list[str]:
    # Some toolkits ship without every library header that torch's CUDA headers may pull
    # in; the nvidia-* wheels that come with a CUDA build of torch carry them.
    dirs = []
    if not Path(cpp_extension.CUDA_HOME, "include", "cusparse.h").exists():
        try:
            import nvidia
        except ImportError:  # the headers may still come from CPATH or the compiler's defaults
            return dirs
        for base in nvidia.__path__:
            for sub in ("cu13", "cu12"):
                inc = Path(base, sub, "include")
                if (inc / "cusparse.h").exists():
                    dirs.append(str(inc))
    return dirs


def _nvcc_release() -> tuple[int, int] | None:
    try:
        out = subprocess.run([str(Path(cpp_extension.CUDA_HOME, "bin", "nvcc")), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except OSError:
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else None


def _default_archs() -> None:
    if "TORCH_CUDA_ARCH_LIST" in os.environ:
        return
    release = _nvcc_release()
    if release is not None and release < (12, 8):  # sm_100 came with CUDA 12.8
        os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
        say(f"nvcc {release[0]}.{release[1]} has no sm_100: TORCH_CUDA_ARCH_LIST=8.0;9.0+PTX")
    else:
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS


def _arch_words(nvcc_flags: list[str]) -> tuple[str, str]:
    """The GPU code the CUDA objects hold, from the -gencode flags nvcc gets (torch's for
    TORCH_CUDA_ARCH_LIST, or those given in POLYNORM_NVCC_FLAGS: then torch adds none), and where
    they come from: ("sm_80, sm_90, sm_100, compute_100 (PTX)", "TORCH_CUDA_ARCH_LIST=...")."""
    given = [f for f in nvcc_flags if "arch" in f]
    flags = given or cpp_extension._get_cuda_arch_flags()
    words = set()
    for flag in flags:
        for code in re.findall(r"arch=compute_\w+,code=\[?([\w,]+)", flag):
            words.update(code.split(","))

    def order(word: str):
        return int(re.sub(r"\D", "", word)), word.startswith("compute_")

    text = ", ".join(f"{w} (PTX)" if w.startswith("compute_") else w for w in sorted(words, key=order))
    source = "POLYNORM_NVCC_FLAGS" if given else f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST')}"
    return text, source


def _compiling(sources: dict[str, str]) -> dict[str, float]:
    """Our sources that a compiler is compiling now, each with the seconds it has run: those
    named on a running process's command line (Linux /proc; elsewhere none are named)."""
    busy: dict[str, float] = {}
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return busy
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            named = [sources[a] for a in args if a in sources]
            if not named:
                continue
            started = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19]) / tick  # field 22
        except (OSError, ValueError, IndexError):
            continue
        for src in named:
            busy[src] = max(busy.get(src, 0.0), uptime - started)
    return busy


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build, which says what it compiles and, while it compiles, which sources and for how
    long: nvcc takes minutes per object, and ninja prints an object's line only once it is done."""

    def build_extensions(self) -> None:
        ext = self.extensions[0]
        archs = ""
        if isinstance(ext.extra_compile_args, dict) and "nvcc" in ext.extra_compile_args:
            archs, source = _arch_words(ext.extra_compile_args["nvcc"])
            say(f"CUDA code for {archs} ({source})")
        say(f"compiling {len(ext.sources)} sources into {ext.name}: {', '.join(ext.sources)}")
        sources = {str((ROOT / src).resolve()): src for src in ext.sources}
        sources.update({src: src for src in ext.sources})
        done = threading.Event()

        def heartbeat() -> None:
            start = time.monotonic()
            while not done.wait(HEARTBEAT_S):
                busy = _compiling(sources)
                total = time.monotonic() - start
                if not busy:
                    say(f"building ({total:.0f} s)")
                for src, seconds in sorted(busy.items()):
                    target = f" for {archs}" if src.endswith(".cu") else ""
                    say(f"compiling {src}{target} ({seconds:.0f} s; {total:.0f} s in all)")

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        started = time.monotonic()
        try:
            super().build_extensions()
        finally:
            done.set()
            thread.join()
        say(f"built {ext.name} in {time.monotonic() - started:.0f} s")


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
        _default_archs()
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


def requirements() -> list[str]:
    """torch at the version this build compiles against: a C++ extension loads only with the torch
    whose headers and ABI it was built with (its public version: ``torch==2.11.0`` also takes
    2.11.0+cu130; the CUDA flavour is the wheel's to state, README "Wheels")."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        public = version("torch").split("+")[0]
    except PackageNotFoundError:  # a torch on the path without its metadata
        public = torch.__version__.split("+")[0]
    return [f"torch=={public}", "numpy"]


setup(
    install_requires=requirements(),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension},
)
