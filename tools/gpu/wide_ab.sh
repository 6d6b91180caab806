#!/bin/bash
# One device call for the tensor-core GEMV in clusters (9-64 rows, CudaOptions::wide_gemv) against cuBLASLt in the
# same binary (hybrid-bench --wide-gemv on|off), most important first:
#   build -> the tensor-core GEMV [gpu] cases -> hybrid-kernel-bench at 16, 32 and 64 rows -> 4B batches 12-64
#   with the kernel off, auto (9-16 rows) and on (9-64) in alternation (2 rounds) -> (modes) b=12/16 with every
#   small-batch routing -> every [gpu] case -> compute-sanitizer on the new case.
# Usage (device tool, repository root, carry [".carry"]): bash tools/gpu/wide_ab.sh   (ONLY="a b": those stages)
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, DEPS, CFG, say, step, want
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
step build 400 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench hybrid-kernel-bench >>/tmp/bn.log 2>&1" ||
    { tail -40 /tmp/bn.log | tee -a "$SUM"; exit 1; }
M=/tmp/q4b
mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
if want tests; then
    step tests_tc_gemv 300 $N/hybrid-tests "CUDA tensor-core GEMV*"
    grep -E "test cases|FAILED|rel err|with expansion" "$LOG" | tail -12 >>"$SUM"
fi
if want kbench; then
    for T in 16 32 64; do
        step "kbench_$T" 200 $N/hybrid-kernel-bench $T
        sed -n '/^| shape/,$p' "$LOG" | grep -E "^\| [a-z]" | tail -7 >"$OUT/kbench_$T.txt"
        cat "$OUT/kbench_$T.txt" | cut -c1-160 >>"$SUM"
    done
fi
if want bench; then
    for i in 1 2; do
        for w in off auto on; do
            step "bench_${w}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-12,16,32,64} -r 1 --wide-gemv $w
            grep -E '^\| +[0-9]' "$LOG" | tail -4 | sed "s/^/  [$w $i] /" >>"$SUM"
        done
    done
fi
if want modes; then  # every small-batch routing of 9-16 rows, in alternation (2 rounds)
    for i in 1 2; do
        for m in "--wide-gemv off" "--wide-gemv auto" "--small-batch-gemv mixed" "--small-batch-gemv all"; do
            tag=$(echo "$m" | tr -d '-' | tr ' ' '_')
            step "modes_${tag}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-12,16} -r 1 $m
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [$tag $i] /" >>"$SUM"
        done
    done
fi
if want gpu_tests; then
    step tests_gpu 300 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED" "$LOG" | tail -4 >>"$SUM"
fi
if want memcheck; then
    step memcheck_wide 300 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests \
        "CUDA tensor-core GEMV in clusters*"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step racecheck_wide 300 compute-sanitizer --tool racecheck --error-exitcode 99 $N/hybrid-tests \
        "CUDA tensor-core GEMV in clusters*"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
