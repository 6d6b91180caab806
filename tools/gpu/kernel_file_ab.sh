#!/bin/bash
# One device call that checks a change to one kernel source against its earlier text in the same warm run: builds
# this checkout, runs the [gpu] cases (and compute-sanitizer on SAN, a test-name pattern), benches with the new
# text, then puts the earlier text (BASE_FILE, carried, e.g. `git show COMMIT:FILE > .carry/base/NAME`) in place of
# FILE, rebuilds hybrid-bench, and runs the same benches again.
# Usage (device tool, repository root, carry [".carry/deps", ".carry/base"]):
#   FILE=kernels/cuda/gemm_wgmma.cu BASE_FILE=.carry/base/gemm_wgmma.cu SAN="CUDA quantized wgmma*" \
#   BENCH="int4|--quant int4 ;int8|--quant int8" AB="int4" bash tools/gpu/kernel_file_ab.sh
# BENCH: name|hybrid-bench flags pairs, split by ';', each run on the 4B-shaped random checkpoint with
# -p 128 -n 32 -b ${BATCHES:-16,32,64} -r 1; AB: the names also run with the earlier text. ONLY="tests san bench ab".
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
step build 300 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench hybrid-compare >>/tmp/bn.log 2>&1" ||
    { grep -E "error" /tmp/bn.log | head -20 | tee -a "$SUM"; exit 1; }
M=/tmp/q4b
mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
if want tests; then
    step tests_gpu 300 $N/hybrid-tests "[gpu]" --durations yes
    grep -E "test cases|FAILED|assertions|with expansion|rel err" "$LOG" | tail -12 >>"$SUM"
    step cmp_tiny 60 $N/hybrid-compare -m models/tiny --device cuda
    grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
fi
if want san && [ -n "${SAN:-}" ]; then
    step sanitizer 200 compute-sanitizer --tool memcheck $N/hybrid-tests "$SAN"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
bench() {  # tag binary
    local pairs pair
    IFS=';' read -ra pairs <<<"${BENCH:-}"
    for pair in "${pairs[@]}"; do
        local name=${pair%%|*} flags=${pair#*|}
        [ "$1" = base ] && [[ " ${AB:-} " != *" $name "* ]] && continue
        [ $(($(date +%s) - T0)) -lt 540 ] || { say "(time: $name skipped)"; continue; }
        step "bench_${1}_$name" 90 $2 -m $M --dummy-weights --device cuda $flags -p 128 -n 32 -b ${BATCHES:-16,32,64} -r 1
        grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [$1 $name] /" >>"$SUM"
    done
}
want bench && bench new $N/hybrid-bench
if want ab && [ -n "${AB:-}" ]; then
    cp "$BASE_FILE" "$FILE" && step rebuild_base 200 cmake --build $N -j16 --target hybrid-bench && bench base $N/hybrid-bench
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
