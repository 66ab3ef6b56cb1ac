#!/usr/bin/env bash
# Seventh session, call 3 (issues 13, 15): main with rows not of whole packs at most 64 elements a
# thread (PolyNorm's 2-byte forward narrow, every other op and dtype wide). The whole GPU suite,
# then the kernel-only ratios (ops_timing, bf16), each alone on the GPU.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-01c/call3.sh
set -uo pipefail
OUT="${OUT:-out}"
SUITE_TIMEOUT=330 OUT="$OUT" bash bench/device_run.sh build suite timing
