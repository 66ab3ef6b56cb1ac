"""A non-editable install in a fresh venv: the main job, its help and a warning-free import.

``pip install .`` of a copy of the source tree (its tracked and untracked, not ignored files:
no build outputs, no in-place ``_C``), the CPU kernel only, into a venv that takes torch,
numpy and the other dependencies from this interpreter (``--system-site-packages``: nothing
is downloaded). Then, from a directory outside both trees, so that neither source tree can be
imported:

- ``python3 -m polynorm --help`` and ``python3 -m polynorm`` (the CPU preset, about a minute on
  2 cores) exit 0, and run the installed package;
- pip -v shows the build's progress lines (setup.py);
- ``python3 -W error -c "import polynorm"`` exits 0 with nothing on stderr (a missing numpy
  makes torch warn "Failed to initialize NumPy").

About 2.5 minutes on 2 cores (the build, 1 minute; the main job, 1 minute). Marked
``install``: ``-m "not install"`` leaves it out.
"""

import os
import re
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.install, pytest.mark.xdist_group("install")]


def _source_files() -> list[Path]:
    """The files a fresh clone would have, plus untracked ones not ignored (work in progress)."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout
        return [Path(p) for p in listed.decode().split("\0") if p and (ROOT / p).is_file()]
    skip = {".git", "build", "dist", "out", "__pycache__", ".pytest_cache"}
    return [p.relative_to(ROOT) for p in ROOT.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts) and p.suffix not in (".so", ".pyc")]


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, env, cwd, venv, build output): a fresh venv holding a non-editable install of
    polynorm, installed with pip -v."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    for rel in _source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    assert not list(src.rglob("*.so")), "the copied tree holds a built library"
    # No pip of its own: ensurepip's setuptools (65 on Python 3.11) would shadow this
    # interpreter's, and pip and setuptools come from the system site-packages like torch.
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(base / "venv")
    # Where this interpreter is itself a venv (torch installed in it, not in the system's
    # site-packages), the new venv sees its packages through a .pth file: after its own.
    (purelib,) = (base / "venv" / "lib").glob("python*/site-packages")
    (purelib / "parent_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = str(base / "venv" / "bin" / "python3")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # The CPU kernel only, and no GPU for the installed package: python3 -m polynorm runs the CPU
    # preset, as on a machine without one, on the GPU machine too.
    env.update(POLYNORM_FORCE_CPU="1", CUDA_VISIBLE_DEVICES="", MAX_JOBS=env.get("MAX_JOBS", "2"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = _run([python, "-m", "pip", "install", "-v", ".", "--no-build-isolation", "--no-deps", "--no-index"],
                src, env, 900)
    build = done.stdout + done.stderr  # pip -v relays the build's output on stderr
    cwd = base / "elsewhere"
    cwd.mkdir()
    return python, env, cwd, base / "venv", build


def test_build_talks_through_pip(installed):
    """pip -v relays the build as it goes: what it compiles and, every 20 s (setup.py's
    HEARTBEAT_S), which source is compiling."""
    build = installed[-1]
    assert "polynorm: POLYNORM_FORCE_CPU=1, building the CPU kernel only" in build
    assert re.search(r"polynorm: compiling \d+ sources into polynorm\._C: csrc/ops\.cpp, ", build), build[-3000:]
    seconds = int(re.search(r"polynorm: built polynorm\._C in (\d+) s", build)[1])
    beats = re.findall(r"polynorm: compiling csrc/\S+ \(\d+ s; (\d+) s in all\)", build)
    # One line per source compiling at each beat: beats at 20, 40, ... s, until the link.
    assert len(beats) >= min(1, seconds // 25), build[-3000:]


def test_installed_package_is_the_venv_copy(installed):
    python, env, cwd, prefix, _ = installed
    where = _run([python, "-c", "import polynorm, polynorm.lm.train, polynorm._C; print(polynorm.__file__)"],
                 cwd, env, 120).stdout.strip()
    assert Path(where).resolve().is_relative_to(prefix.resolve()), where


def test_import_prints_no_warning(installed):
    python, env, cwd, _, _ = installed
    done = _run([python, "-W", "error", "-c", "import polynorm"], cwd, env, 120)
    assert done.stderr == "" and done.stdout == "", done.stderr


def test_main_job_help(installed):
    python, env, cwd, _, _ = installed
    done = _run([python, "-m", "polynorm", "--help"], cwd, env, 120)
    assert done.stdout.startswith("usage: python3 -m polynorm") and "--preset" in done.stdout


def test_main_job_runs_from_any_directory(installed):
    """The README's check of an install: the CPU preset trains, every backend agrees, exit 0."""
    python, env, cwd, _, _ = installed
    done = _run([python, "-m", "polynorm", "--no-progress", "--out", str(cwd / "train")], cwd, env, 900)
    assert "OK (" in done.stdout.splitlines()[-1], done.stdout[-2000:]
    assert (cwd / "train" / "summary.json").is_file()
