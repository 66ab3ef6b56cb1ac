#!/usr/bin/env bash
# The build's cost: the wall time of `pip install -e . --no-build-isolation --no-deps` on a fresh
# clone of REF (default HEAD), first with the CUDA kernels, then with POLYNORM_FORCE_CPU=1.
#
#   bash bench/build_time.sh [--cpu-only] [REF]
#
# Each build runs in its own fresh clone (no object of one build serves the other) and installs
# into a throwaway virtual environment that sees this Python's packages (--system-site-packages,
# --without-pip: this Python's pip and setuptools run there, and a venv's own older setuptools,
# which lacks bdist_wheel, never does). The caller's environment is left as it was; the clones
# and environments are deleted at the end. Settings, each taken from the environment if set:
#   CUDA_HOME             default /usr/local/cuda
#   MAX_JOBS              default 2 (parallel compile jobs)
#   TORCH_CUDA_ARCH_LIST  default unset: setup.py's own default (8.0;9.0;10.0+PTX)
#   BUILD_TIME_LOGS       a folder to keep each build's pip log in (default: not kept)
# Prints the commit, nproc, the CPU model, torch and nvcc versions, then the wall seconds of each
# build and whether its import registers the CUDA kernels.
set -euo pipefail

modes=(cuda cpu)
if [ "${1:-}" = "--cpu-only" ]; then modes=(cpu); shift; fi
ref="${1:-HEAD}"
repo="$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
commit="$(git -C "$repo" rev-parse --verify "$ref^{commit}")"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS="${MAX_JOBS:-2}"
python="$(command -v python3)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/polynorm-build-time.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

cpu_model="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
nvcc_version="absent"
[ -x "$CUDA_HOME/bin/nvcc" ] && nvcc_version="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([^,]*\),.*/\1/p')"
echo "# commit: $(git -C "$repo" rev-parse --short "$commit") ($ref)"
echo "# date: $(date +%F)"
echo "# nproc: $(nproc)"
echo "# cpu: ${cpu_model:-unknown}"
"$python" -c "import sys, torch, setuptools; print(f'# python: {sys.version.split()[0]}, torch: {torch.__version__} (CUDA {torch.version.cuda}), setuptools: {setuptools.__version__}')"
echo "# nvcc: $nvcc_version ($CUDA_HOME)"
arch="${TORCH_CUDA_ARCH_LIST:-unset, setup.py default}"
echo "# MAX_JOBS=$MAX_JOBS TORCH_CUDA_ARCH_LIST=$arch"

status=0
for mode in "${modes[@]}"; do
  src="$tmp/src-$mode" venv="$tmp/venv-$mode" log="$tmp/pip-$mode.log"
  git clone -q --shared --no-checkout "$repo" "$src"
  git -C "$src" checkout -q --detach "$commit"
  "$python" -m venv --system-site-packages --without-pip "$venv"
  if [ "$mode" = cpu ]; then force=(env POLYNORM_FORCE_CPU=1); else force=(env -u POLYNORM_FORCE_CPU); fi
  start="$(date +%s.%N)"
  rc=0
  (cd "$src" && "${force[@]}" "$venv/bin/python" -m pip install -e . --no-build-isolation --no-deps) > "$log" 2>&1 || rc=$?
  wall="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')"
  if [ -n "${BUILD_TIME_LOGS:-}" ]; then mkdir -p "$BUILD_TIME_LOGS" && cp "$log" "$BUILD_TIME_LOGS/"; fi
  if [ "$rc" -ne 0 ]; then
    echo "$mode build: FAILED (pip rc=$rc) after $wall s"; tail -30 "$log"; status=1; continue
  fi
  # The installed package imports from its clone; its library holds GPU code (a .nv_fatbin
  # section) only when the CUDA kernels were built.
  check="import polynorm, polynorm._C as C, sys; assert polynorm.__file__.startswith(sys.argv[1]), polynorm.__file__; "
  check+="print('yes' if b'.nv_fatbin' in open(C.__file__, 'rb').read() else 'no')"
  if ! kernels="$(cd "$tmp" && "$venv/bin/python" -c "$check" "$src/")"; then
    echo "$mode build: installed, but its import failed"; status=1; continue
  fi
  echo "$mode build: $wall s (CUDA kernels: $kernels)"
done
exit "$status"
