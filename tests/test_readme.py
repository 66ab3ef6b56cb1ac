"""The README's code runs as pasted: every Python block in a fresh process on this machine's device,
and CI (.ci/run) runs the README's install, CMake and test commands."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text().splitlines()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _commands_after(heading: str) -> list[str]:
    """The lines of the first ```bash block after ``heading`` in the README."""
    section = README[README.index(heading) :]
    return re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).splitlines()


PYTHON_BLOCKS = _blocks("python")


def test_readme_has_the_api_blocks():
    # PolyNorm, the fused op and the grouped op each have a block.
    for call in ("polynorm.poly_norm(", "polynorm.poly_norm_mul(", "polynorm.poly_norm_grouped("):
        assert any(call in block for block in PYTHON_BLOCKS), call


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))])
def test_readme_python_block_runs_as_pasted(tmp_path, block):
    # Nothing is defined beforehand: a fresh interpreter in an empty folder, with this checkout on
    # the path, as a user pasting it would have. Each block ends by printing its largest deviation
    # from the float64 reference.
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5, done.stdout


def test_ci_runs_the_readme_install_commands():
    # .ci/run adds -q to the requirements' install (and --no-deps to the build, the requirements
    # being installed first); otherwise as written, the build with -v: its progress in the log.
    commands = _commands_after("## Install")
    assert commands == [
        "python3 -m pip install -r requirements.txt",
        "python3 -m pip install -v -e . --no-build-isolation",
    ], commands
    quiet = [line.replace(" -q", "").replace(" --no-deps", "").strip() for line in CI]
    for command in commands:
        assert command in quiet, f".ci/run does not run the README's install command: {command}"
    # The CPU-only form is the same command with POLYNORM_FORCE_CPU=1.
    assert _commands_after("build the CPU kernel alone") == ["POLYNORM_FORCE_CPU=1 " + commands[1]]


def test_ci_runs_the_readme_cmake_commands_exactly():
    commands = _commands_after("CMake builds the same op library")
    assert len(commands) == 3 and commands[0].startswith("cmake -S . -B build/cmake"), commands
    for command in commands:
        assert command in CI, f".ci/run does not run the README's command as written: {command}"
    # And CMakeLists.txt's own comment names the same build folder and commands.
    cmakelists = (ROOT / "CMakeLists.txt").read_text()
    for command in commands[:2]:
        assert "#   " + command in cmakelists, command


def test_ci_runs_the_readme_test_command():
    (command,) = _commands_after("Run the tests")
    assert command in CI, f".ci/run does not run the README's test command as written: {command}"
