#!/usr/bin/env bash
# Sixth session, call 5: the whole GPU suite at the final kernels (16 workers, the slow compile
# tests first), then bench.py's quick side-by-side sweep (Liger from .whl/), alone.
# Run from the repo root, with .whl carried, as: OUT=$OUT bash bench/results/h200-2026-12-01b/call5.sh
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
OUT="$OUT" SUITE_TIMEOUT=300 bash bench/device_run.sh build suite bench
