#!/usr/bin/env bash
# Twenty-seventh session, call 5 (bench/NOTES.md v29), on call 4's warm machine and build (0a2411e's
# csrc, as 3db2261): compute-sanitizer racecheck over the cluster launches (the twelfth session's
# cluster_check.py, whose rows include 262144 on 16 CTAs, now launched with load balancing), then
# tune_rows' table against --cta 128 at the backward's 8 x 256 rows (131072: 16 x 128 under --cta 128).
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-04b/call5.sh
# (The device call ran these lines as two commands of the `run` tool, in this order.)
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONPATH=$(pwd)
ls polynorm/_C*.so > /dev/null 2>&1 || MAX_JOBS=$(nproc) TORCH_CUDA_ARCH_LIST=9.0 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
timeout 220 compute-sanitizer --tool racecheck --racecheck-report hazard python3 bench/results/h200-2026-12-02b/cluster_check.py \
  > $OUT/racecheck.log 2>&1; echo rc=$?; tail -6 $OUT/racecheck.log
python3 -c "import torch,polynorm;print(torch.ops.polynorm._launch_plan('backward',262144,torch.bfloat16))"
(timeout 60 python3 bench/tune_rows.py --table-only --aligned-only --cta 128 --H 65536 131072
 timeout 60 python3 bench/tune_rows.py --op poly_norm_mul --table-only --aligned-only --cta 128 --H 65536 131072) 2>&1 | tee $OUT/tune_c128.log
