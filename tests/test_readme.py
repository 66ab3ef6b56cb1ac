"""The README's blocks run as pasted (issue 16): the API block in a fresh process on this
machine's device, and CI runs the README's CMake commands character for character."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _cmake_commands() -> list[str]:
    # The indented block after "CMake builds the same op library".
    section = README[README.index("CMake builds the same op library") :]
    block = re.search(r"\n\n((?:    .*\n)+)", section).group(1)
    return [line[4:] for line in block.splitlines()]


def test_readme_api_block_runs_as_pasted(tmp_path):
    (block,) = [b for b in _python_blocks() if "polynorm.poly_norm(" in b]
    # Nothing is defined beforehand: a fresh interpreter in an empty folder, with the
    # installed package (or this checkout's) on the path, as a user pasting it would have.
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5, done.stdout


def test_ci_runs_the_readme_cmake_commands_exactly():
    commands = _cmake_commands()
    assert len(commands) == 3 and commands[0].startswith("cmake -S . -B build/cmake"), commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f".ci/run does not run the README's command as written: {command}"
    # And CMakeLists.txt's own comment names the same build folder and commands.
    cmakelists = (ROOT / "CMakeLists.txt").read_text()
    for command in commands[:2]:
        assert "#   " + command in cmakelists, command
