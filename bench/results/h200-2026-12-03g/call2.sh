#!/usr/bin/env bash
# Twenty-fourth session, call 2 (issues 15 and 13; bench/NOTES.md v26). Two builds in parallel:
# n (the tree: the fused ops' mul rows realigned in the realigning builds, and F's fold for the
# same-phase fused backward) and m (call2_csrc.patch reversed: main before it). build_compare.py
# m n n m at 2^26, views included; tune_rows --cta 256 for the fused backward (one CTA up to 256
# threads against the table's clusters of 128) at aligned and odd rows, bf16 and fp32; the fused
# op's GPU tests and every misaligned-equals-aligned test on n; sass_load_order on n.
# Run from the repo root as: OUT=$OUT bash bench/results/h200-2026-12-03g/call2.sh
set -uo pipefail
OUT="${OUT:-out}"
D=bench/results/h200-2026-12-03g
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
ROOT=$(pwd)
t0=$(date +%s)
stamp() { echo "[$1 at $(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rm -rf /tmp/m && mkdir /tmp/m && cp -r csrc polynorm setup.py pyproject.toml /tmp/m/
(cd /tmp/m && patch -R -p1 -s < "$ROOT/$D/call2_csrc.patch") || echo "patch m failed"
(MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_n.log 2>&1; echo "n rc=$?") &
(cd /tmp/m && MAX_JOBS=8 python3 setup.py build_ext --inplace > /tmp/build_m.log 2>&1; echo "m rc=$?") &
wait
stamp builds
tar czf "$OUT/builds.tgz" -C /tmp build_n.log build_m.log
path_of() { if [ $1 = n ]; then echo $ROOT; else echo /tmp/$1; fi; }
(python3 bench/sass_load_order.py $(ls polynorm/_C*.so) > "$OUT/sass_load_order_n.log" 2>&1; echo "sass n rc=$?") &
{
  for v in m n n m; do
    (cd /tmp && PYTHONPATH=$(path_of $v) timeout 60 python3 "$ROOT/bench/build_compare.py" $v \
      4096 65536 4097 5125 16385 65537 1001 4096v 4097v 5125v 16385v 2001v)
  done
} 2>&1 | tee "$OUT/compare_mn.log"
stamp compare
export PYTHONPATH=$ROOT
for dt in bfloat16 float32; do
  timeout 100 python3 bench/tune_rows.py --op poly_norm_mul --dtype $dt --aligned-only --table-only --cta 256 \
    --H 4096 6144 8192 12288 16384 32768 3000 4097 5125 9000 16385 24577 2>&1 | grep -v "^W"
done 2>&1 | tee "$OUT/tune_mul_cta.txt"
stamp tune
timeout 200 python3 -m pytest tests/test_mul.py tests/test_kernels.py -k "cuda or misaligned or gpu" -q -ra \
  -p no:cacheprovider -n 16 > "$OUT/tests_mul.log" 2>&1; echo "pytest rc=$?"
tail -4 "$OUT/tests_mul.log"
gzip -f "$OUT/tests_mul.log"
stamp tests
wait
tail -2 "$OUT/sass_load_order_n.log"
stamp end
