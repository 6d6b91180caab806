#!/bin/bash
# The thirty-fifth session's FP8 MoE decode changes against the tree before them, in one job: the FP8 gate/up on
# the GEMV's loop (1-2 rows), the FP8 prefetching down kernel (1-2 rows) and the FP8/Q8/Q4 shared expert fused
# into the per-row kernels. Builds this tree
# (hybrid-tests, hybrid-bench) and BASE (a source tree of the previous commit, default .device/base, carried) in
# parallel; runs the FP8/Q8/Q4 experts op test and the MoE model tests; then 35B-A3B shapes with --dummy-weights
# --quant fp8, b=1/2/8, and bf16 b=1/2 (the bf16 prefetching down kernel is now a template), new and base in
# alternation (ROUNDS, default 2); ONLY="... bf16": bf16 b=1/16/64 of the new tree.
# Usage (device tool, repository root, carry [".carry/deps", ".device/base"]): bash tools/gpu/moe_fp8_ab.sh
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
OP="CUDA MoE FP8 and Q8*"
if want tests; then
    step tests_moe_quant 240 $T "$OP","CUDA MoE models*","int quant: int8 / int4 MoE*"
    grep -E "CUDA MoE experts.*(shared|rows [12],)|test cases|FAILED|assertions|model.*rel|median" "$LOG" | grep -v "^  " | tail -80 >>"$SUM"
fi
mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
rows() { grep -E '^\| +[0-9]' "$LOG" | tail -$1 | sed "s/^/  [$2] /" >>"$SUM"; }
if want ab; then
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for v in new base; do
            B=$N/hybrid-bench
            [ $v = base ] && B=$O/hybrid-bench
            [ -x $B ] || continue
            step "fp8_${v}_$round" 200 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 32 -b 1,2,8 -r 1
            grep -E "ready|arena" "$LOG" | tail -2 | sed "s/^/  [fp8 $v] /" >>"$SUM"
            rows 3 "fp8 $v $round"
            step "bf16_${v}_$round" 120 $B -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 1,2 -r 1
            rows 2 "bf16 $v $round"
        done
    done
fi
if [[ " $ONLY " == *" bf16 "* ]]; then  # (only when named: moe_fp8_check.sh's bf16_dec does it)
    step bf16_dec 200 $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 1,16,64 -r 1
    rows 3 bf16
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
