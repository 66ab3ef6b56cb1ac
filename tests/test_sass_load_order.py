"""The row kernels (every layout) issue every row load before the first instruction that waits for one
(bench/sass_load_order.py): read from the built extension's SASS, so it runs
on the CPU machine and in CI, wherever the extension has its CUDA objects and ``cuobjdump`` is
found with ``nvdisasm`` (the pip packages ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``,
requirements.txt, or the CUDA toolkit's).

A load that ptxas sinks below the row's first wait costs every row a second memory round trip,
with the same registers and no spill; code that never runs on the row path (the backward's
last-block sum) can cause it in the bf16 and fp16 backward kernels. The checker itself is tested
on a made-up listing first."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

import polynorm

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sass_load_order", ROOT / "bench" / "sass_load_order.py")
sass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass)


def _ctrl(write_sb: int = 7, wait: int = 0) -> int:
    """A control word (the second 64-bit word of an sm_90 instruction) with these scoreboards."""
    return ((wait << 11) | (7 << 8) | (write_sb << 5)) << 41


def test_checker_finds_a_sunk_load():
    loads_first = [
        (0x00, "LDG.E.128.CONSTANT R4, desc[UR4][R2.64]", _ctrl(write_sb=2)),
        (0x10, "LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x200]", _ctrl(write_sb=3)),
        (0x20, "FMUL R12, R4, R4", _ctrl(wait=1 << 2 | 1 << 3)),
        (0x30, "STG.E.128 desc[UR4][R6.64], R4", _ctrl()),
        (0x40, "LDG.E.128.STRONG.GPU R16, desc[UR4][R10.64]", _ctrl(write_sb=1)),  # past the stores: not a row load
    ]
    assert sass.late_loads(loads_first) == (2, [])
    sunk = [loads_first[0], (0x10, "FMUL R12, R4, R4", _ctrl(wait=1 << 2)),
            (0x20, loads_first[1][1], _ctrl(write_sb=3)), loads_first[3]]
    early, late = sass.late_loads(sunk)
    assert early == 1 and len(late) == 1 and "R2.64+0x200" in late[0]
    # A wait on a scoreboard no row load set (a parameter's load) does not start the row's math.
    other = [(0x00, "LDG.E R20, desc[UR4][R22.64]", _ctrl(write_sb=5)), loads_first[0],
             (0x10, "FADD R21, R20, R20", _ctrl(wait=1 << 5)), (0x20, loads_first[1][1], _ctrl(write_sb=3)),
             (0x30, "FMUL R12, R4, R4", _ctrl(wait=1 << 2 | 1 << 3)), loads_first[3]]
    assert sass.late_loads(other) == (2, [])


def _extension() -> str:
    binaries = sorted(Path(polynorm.__file__).parent.glob("_C*.so"))
    if not binaries:
        pytest.skip("polynorm's extension (polynorm/_C*.so) is not built in place")
    return str(binaries[0])


def test_row_kernels_issue_their_loads_first():
    binary = _extension()
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt (binutils) not found")
    try:
        tool, env = sass.find_cuobjdump()
    except SystemExit:
        pytest.skip("cuobjdump or nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    listing = subprocess.run([tool, "-lelf", binary], capture_output=True, text=True, env=env)
    if listing.returncode != 0 or "sm_" not in listing.stdout:
        pytest.skip("the extension was built without CUDA objects")
    checked, problems = sass.check([binary])
    if checked == 0:
        pytest.skip(f"the extension has no {sass.ARCH} code (TORCH_CUDA_ARCH_LIST without 9.0)")
    # 159 non-grouped row kernels: the plan's (bench/instantiations.py), every layout.
    assert checked >= 150, f"only {checked} {sass.ARCH} row kernels found in {binary}"
    assert not problems, "\n".join(problems)
