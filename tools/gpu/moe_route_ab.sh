#!/bin/bash
# The fused MoE router and top-k of 1-2 rows (moe_route_fused: one kernel in a cluster instead of the router GEMV
# and the top-k kernel) against the tree before it, in one job. Builds this tree (hybrid-tests, hybrid-bench) and
# BASE (a source tree of the previous commit, default .device/base, carried) in parallel; runs the router and MoE
# cases, compute-sanitizer memcheck and racecheck of the router cases; then 35B-A3B shapes with --dummy-weights,
# bf16 b=1/2 with the fused kernel (new), the new binary with --moe-route split (split) and base in alternation
# (ROUNDS, default 2), --quant fp8 b=1/2 new and split; then every [gpu] case.
# Usage (device tool, repository root, carry [".carry/deps", ".device/base"]): bash tools/gpu/moe_route_ab.sh;
# ONLY="build tests ..." runs the named stages (build tests sanitize ab fp8 gpu).
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
BASE=${BASE:-.device/base}
N=/tmp/bn
O=/tmp/bo
build_new() { cmake -S . -B $N "${CFG[@]}" >/tmp/bn.log 2>&1 && cmake --build $N -j10 --target hybrid-tests hybrid-bench >>/tmp/bn.log 2>&1; }
build_base() { cmake -S $BASE -B $O "${CFG[@]}" >/tmp/bo.log 2>&1 && cmake --build $O -j6 --target hybrid-bench >>/tmp/bo.log 2>&1; }
if want build; then
    t=$(date +%s)
    build_new & p1=$!
    build_base & p2=$!
    wait $p1; r1=$?
    wait $p2; r2=$?
    say "build new rc=$r1 base rc=$r2 $(($(date +%s) - t))s"
    [ $r1 = 0 ] || { grep -E "error" /tmp/bn.log | head -20 | tee -a "$SUM"; exit 1; }
    [ $r2 = 0 ] || grep -E "error" /tmp/bo.log | head -5 | tee -a "$SUM"
fi
T=$N/hybrid-tests
CASES="CUDA MoE router and experts*","CUDA MoE top-k*"
if want tests; then
    step tests_route 240 $T "$CASES","CUDA MoE models*","CUDA MoE FP8 and Q8*"
    grep -E "test cases|FAILED|assertions|median" "$LOG" | grep -v "^  " | tail -40 >>"$SUM"
fi
if want sanitize; then
    step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 99 $T "$CASES"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 99 $T "CUDA MoE top-k*"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
rows() { grep -E '^\| +[0-9]' "$LOG" | tail -$1 | sed "s/^/  [$2] /" >>"$SUM"; }
bench() { [ "$1" = base ] && echo $O/hybrid-bench || echo $N/hybrid-bench; }
flag() { [ "$1" = split ] && echo "--moe-route split"; }  # (the new binary with the router GEMV and top-k kernel)
if want ab; then
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for v in new split base; do
            [ -x "$(bench $v)" ] || continue
            step "bf16_${v}_$round" 150 "$(bench $v)" -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 64 -b 1,2 -r 1 $(flag $v)
            rows 2 "bf16 $v $round"
        done
    done
fi
if want fp8; then
    for v in new split; do
        step "fp8_$v" 200 "$(bench $v)" -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 64 -b 1,2 -r 1 $(flag $v)
        rows 2 "fp8 $v"
    done
fi
if want gpu; then
    step tests_gpu 300 $T "[gpu]"
    grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
