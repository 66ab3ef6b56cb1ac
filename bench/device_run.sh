#!/usr/bin/env bash
# GPU runs in stages, each under its own time limit, so that a run fits a device command of at
# most 10 minutes. From the repo root:
#   bash bench/device_run.sh build timing kernels train     # ~8 min on an H100
#   bash bench/device_run.sh build suite bench              # ~8 min
# Stages (logs under $OUT, or ./out):
#   build        pip install -e . --no-build-isolation (sm_90 unless TORCH_CUDA_ARCH_LIST says), ~3 min
#   prebuilt     instead of build: the library of the polynorm wheel carried in .whl/, put into the tree, so
#                that no device time goes on compiling. Build the wheel from the same commit on the CPU machine,
#                for the device's Python (3.12) and torch (2.11.0):
#                  python3.12 -m venv /tmp/v && /tmp/v/bin/pip install torch==2.11.0 numpy setuptools wheel ninja
#                  PATH=/tmp/v/bin:$PATH CUDA_HOME=/usr/local/cuda TORCH_CUDA_ARCH_LIST=9.0 \
#                    python -m pip wheel . --no-build-isolation --no-deps -w .whl
#   timing       bench/ops_timing.py: kernel-only ratios to same-run floors, both ops, three dtypes, ~3 min
#   compare      bench/compare_builds.py --old $OLD_BUILD --new . $COMPARE_ARGS: the guard, ~5 min (OLD_BUILD:
#                the folder holding the old build's polynorm/, built for this GPU; COMPARE_ARGS, e.g.
#                "--no-triton --no-warm --repeat 2": the CUDA ops alone, ~3.5 min)
#   kernels      the CUDA/Triton parity and kernel tests (pytest -k cuda), ~1.5 min
#   smoke        the smoke subset (pytest -m smoke): every backend, dtype and layout once
#   ptx          a build of compute_80 PTX alone (no sm_90 code) in a copy of the tree, which the driver JIT
#                compiles for this GPU: its binary's listing, then the smoke subset against it, ~5 min
#   wheel        the polynorm wheel carried in .whl/ (README "Wheels"), pip-installed without a compiler into a
#                fresh target folder: the smoke subset and the main job against it, from outside the tree, ~6 min
#   profile      bench/profile_steps.py: host time, launches and GPU idle gaps per step, ~1 min
#   ncu          an Nsight Compute profile of the CUDA kernels at H = 5125 (NCU_H), ~1 min
#   train        the main job, python3 -m polynorm (default GPU preset), ~5 min
#   suite        the whole test suite, pytest-xdist workers sized from the GPU's free memory, --durations=15
#   dist         the four torchrun modes of examples/train_distributed.py, cuda and triton, on 2 GPUs
#   bench        bench/bench.py --quick (JSON, PNGs, summary), ~1 min
#   sweep        bench/bench.py's full sweep, warmup 15 ms and rep 50 ms, ~2.5 min (run it alone)
#   mul_bench    bench/bench.py --op poly_norm_mul --quick, ~1.5 min
#   grouped      bench/grouped_timing.py: the grouped op against the loop over experts, ~1.5 min
#   triton_host  bench/triton_host.py: where the Triton backend's host time goes, ~1 min
#   tp           bench/tp_timing.py: the sharded passes of tensor parallelism against their floors and the
#                unsharded op, ~2 min
#   tp_tests     tests/test_tp.py's GPU cases (2 processes on one GPU, gloo); the suite runs them too
#   moe          bench/moe_timing.py: Motif-3's grouped fused-mul PolyNorm against its floors, the loop over
#                experts and torch.compile, ~3 min
# A stage with many output files packs them as one .tgz: the device tool returns a limited number
# of files. liger-kernel, when wanted, comes as a wheel in .whl/ (a polynorm wheel there is the wheel stage's).
set -uo pipefail
OUT="${OUT:-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-16}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
others=$(ls .whl/*.whl 2> /dev/null | grep -v '/polynorm-')
if [ -n "$others" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $others \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build timing kernels train)
for stage in "${stages[@]}"; do
  case "$stage" in
    build)
      python3 -m pip install -e . --no-build-isolation --no-deps > "$OUT/build.log" 2>&1; echo "build rc=$?" ;;
    prebuilt)
      # The wheel's library beside the tree's Python, and the tree importable from bench/ scripts
      # and from the tests' subprocesses, as an editable install would make it.
      rm -rf /tmp/prebuilt
      python3 -m pip install --no-index --no-deps --no-cache-dir --target /tmp/prebuilt .whl/polynorm-*.whl \
        > "$OUT/prebuilt.log" 2>&1 && cp /tmp/prebuilt/polynorm/_C*.so polynorm/; echo "prebuilt rc=$?"
      # A wheel of another commit: its Python differs from the tree's, and its library may too.
      diff -rq -x __pycache__ -x '_C*.so' /tmp/prebuilt/polynorm polynorm > /dev/null \
        || echo "prebuilt: WARNING the wheel's Python differs from the tree's: build the wheel from this commit"
      export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ;;
    timing)
      timeout 300 python3 bench/ops_timing.py > "$OUT/ops_timing.log" 2>&1; echo "timing rc=$?"; tail -3 "$OUT/ops_timing.log" ;;
    compare)
      timeout 560 python3 bench/compare_builds.py --old "${OLD_BUILD:?set OLD_BUILD to the folder holding the old polynorm/}" --new . \
        ${COMPARE_ARGS:-} --out "$OUT/compare" > "$OUT/compare_builds.log" 2>&1; echo "compare rc=$?"
      sed -n '/^worst per column/,$p' "$OUT/compare_builds.log"
      tar czf "$OUT/compare.tgz" -C "$OUT" compare && rm -rf "$OUT/compare" ;;
    kernels)
      timeout 150 python3 -m pytest tests/test_parity.py tests/test_kernels.py -q -ra -p no:cacheprovider -k cuda \
        > "$OUT/tests_kernels.log" 2>&1; echo "pytest kernels rc=$?"; tail -1 "$OUT/tests_kernels.log" ;;
    smoke)
      /usr/bin/time -f "smoke wall %e s" timeout 120 python3 -m pytest tests -q -ra -p no:cacheprovider -m smoke \
        > "$OUT/tests_smoke.log" 2>&1; echo "pytest smoke rc=$?"; tail -2 "$OUT/tests_smoke.log" ;;
    ptx)
      # POLYNORM_NVCC_FLAGS names the GPU code, so torch adds none of TORCH_CUDA_ARCH_LIST's: the binary holds
      # compute_80 PTX and no machine code. On this GPU every kernel is JIT compiled from it (a cache big
      # enough to keep them), and the plan runs no clusters: the code has none (device_launches_clusters).
      rm -rf /tmp/ptx && mkdir -p /tmp/ptx
      tar --exclude=./build --exclude=./out --exclude=./.git --exclude=./.whl --exclude='*.so' -cf - . | tar -xf - -C /tmp/ptx
      (cd /tmp/ptx && POLYNORM_NVCC_FLAGS="-gencode=arch=compute_80,code=compute_80" /usr/bin/time -f "ptx build wall %e s" \
        python3 setup.py build_ext --inplace) > "$OUT/ptx_build.log" 2>&1; echo "ptx build rc=$?"
      grep "^polynorm:" "$OUT/ptx_build.log" | head -3
      so=$(ls /tmp/ptx/polynorm/_C*.so)
      tool=$(PYTHONPATH=bench python3 -c "from sass_load_order import find_tool; print(find_tool('cuobjdump'))")
      { echo "== $tool --list-elf (machine code: none expected)"; "$tool" --list-elf "$so"
        echo "== $tool --list-ptx"; "$tool" --list-ptx "$so"; } > "$OUT/ptx_listing.log" 2>&1
      cat "$OUT/ptx_listing.log"
      (cd /tmp/ptx && CUDA_CACHE_MAXSIZE=4294967296 /usr/bin/time -f "ptx smoke wall %e s" timeout 420 \
        python3 -m pytest tests -q -ra -p no:cacheprovider -m smoke) > "$OUT/ptx_smoke.log" 2>&1
      echo "ptx smoke rc=$?"; tail -3 "$OUT/ptx_smoke.log" ;;
    wheel)
      # No compiler is needed: pip unpacks the wheel into a fresh folder. The tests run from a copy of the tree
      # without polynorm/, so the import is the wheel's, never the source tree's.
      rm -rf /tmp/wheel_site /tmp/wheel_run && mkdir -p /tmp/wheel_run
      python3 -m pip install --no-index --no-deps --no-cache-dir --target /tmp/wheel_site .whl/polynorm-*.whl \
        > "$OUT/wheel_install.log" 2>&1; echo "wheel install rc=$?"; tail -1 "$OUT/wheel_install.log"
      tar --exclude=./polynorm --exclude=./build --exclude=./out --exclude=./.git --exclude=./.whl --exclude=./.old \
        -cf - . | tar -xf - -C /tmp/wheel_run
      (cd /tmp/wheel_run && export PYTHONPATH=/tmp/wheel_site${PYTHONPATH:+:$PYTHONPATH} \
        && python3 -c "import polynorm, torch; print('polynorm from', polynorm.__file__, 'torch', torch.__version__)" \
        && /usr/bin/time -f "wheel smoke wall %e s" timeout 200 python3 -m pytest tests -q -ra -p no:cacheprovider -m smoke \
        && mkdir -p train && /usr/bin/time -f "wheel train wall %e s" timeout "${TRAIN_TIMEOUT:-420}" python3 -m polynorm --no-progress --out train) \
        > "$OUT/wheel.log" 2>&1; echo "wheel rc=$?"
      grep -E "polynorm from|passed|failed|^OK|^FAILED|wall" "$OUT/wheel.log" ;;
    profile)
      timeout 120 python3 bench/profile_steps.py > "$OUT/profile_steps.log" 2>&1; echo "profile rc=$?"
      sed -n '/^| M/,$p' "$OUT/profile_steps.log" ;;
    ncu)
      timeout 60 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        -k regex:poly_norm -c 2 python3 bench/profile_rows.py "${NCU_H:-5125}" > "$OUT/ncu_${NCU_H:-5125}.txt" 2>&1
      echo "ncu rc=$?" ;;
    train)
      mkdir -p "$OUT/train"
      /usr/bin/time -f "train wall %e s" timeout 420 python3 -m polynorm --no-progress --out "$OUT/train" \
        > "$OUT/train/train.log" 2>&1; echo "train rc=$?"; tail -32 "$OUT/train/train.log"
      tar czf "$OUT/train.tgz" -C "$OUT" train && rm -rf "$OUT/train" ;;
    suite)
      # The slow compile tests first: started last, they outlast the rest (231 s of compiling on
      # one H200 at 16 workers; in plain order the run took over 430 s). SIGINT at the limit:
      # pytest still prints its summary. Verbose: each test's outcome and name as it finishes,
      # so a failure is named even when a hung xdist teardown loses the summary.
      # Workers sized from the card's free memory: the heaviest worker holds up to 9 GiB, so an
      # 80 GB card runs 8 and a 141 GB one 15 (16 workers ran out of memory on an H100 80 GB).
      workers=$(python3 -c "import torch; f, _ = torch.cuda.mem_get_info(); print(max(1, min(16, int(f / 2**30 // 9))))")
      echo "suite: $workers workers"
      /usr/bin/time -f "suite wall %e s" timeout -s INT "${SUITE_TIMEOUT:-540}" python3 -m pytest tests/test_pt2.py \
        tests/test_grouped.py tests/test_training.py tests -v -ra -p no:cacheprovider \
        -n "$workers" --dist loadgroup --durations=15 > "$OUT/tests.log" 2>&1; echo "pytest rc=$?"
      grep -E "\] (FAILED|ERROR) |^FAILED|^ERROR|passed|failed|suite wall" "$OUT/tests.log" | head -40 ;;
    dist)
      # The suite's test_distributed.py runs these too; here each one's output is kept.
      for mode in ddp fsdp sp tp; do
        for backend in cuda triton; do
          timeout 120 torchrun --standalone --nproc_per_node 2 examples/train_distributed.py --mode $mode --backend $backend \
            > "$OUT/torchrun_${mode}_${backend}.log" 2>&1 &
        done
        wait
        for backend in cuda triton; do echo "torchrun $mode $backend:"; tail -3 "$OUT/torchrun_${mode}_${backend}.log"; done
      done
      tar czf "$OUT/dist.tgz" -C "$OUT" $(cd "$OUT" && ls torchrun_*.log) && rm -f "$OUT"/torchrun_*.log ;;
    bench)
      timeout 150 python3 bench/bench.py --quick --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
      tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench" ;;
    sweep)
      # The full side-by-side sweep (every provider, Liger when .whl/ holds it), alone on the GPU.
      timeout 280 python3 bench/bench.py --warmup 15 --rep 50 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
      echo "sweep rc=$?"; tar czf "$OUT/sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep" ;;
    mul_bench)
      timeout 150 python3 bench/bench.py --op poly_norm_mul --quick --out "$OUT/bench_mul" > "$OUT/bench_mul.log" 2>&1
      echo "mul_bench rc=$?"; tar czf "$OUT/bench_mul.tgz" -C "$OUT" bench_mul && rm -rf "$OUT/bench_mul" ;;
    grouped)
      timeout 200 python3 bench/grouped_timing.py --out "$OUT/grouped_timing.json" 2>&1 | tee "$OUT/grouped_timing.log" ;;
    tp)
      timeout 240 python3 bench/tp_timing.py --log "$OUT/tp_timing.log" > "$OUT/tp_timing.out" 2>&1
      echo "tp timing rc=$?"; tail -1 "$OUT/tp_timing.out" ;;
    tp_tests)
      timeout 300 python3 -m pytest tests/test_tp.py -q -ra -p no:cacheprovider -k "cuda or gpu" \
        > "$OUT/tests_tp.log" 2>&1; echo "pytest tp rc=$?"; tail -1 "$OUT/tests_tp.log" ;;
    moe)
      timeout 300 python3 bench/moe_timing.py --out "$OUT/moe_timing.json" > "$OUT/moe_timing.log" 2>&1
      echo "moe timing rc=$?"; tail -30 "$OUT/moe_timing.log" ;;
    triton_host)
      timeout 150 python3 bench/triton_host.py > "$OUT/triton_host.log" 2>&1; echo "triton_host rc=$?" ;;
    *)
      echo "unknown stage: $stage" ;;
  esac
  echo "[$stage done at $(( $(date +%s) - t0 )) s]"
done
