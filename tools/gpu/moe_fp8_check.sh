#!/bin/bash
# FP8 and Q8/Q4 MoE experts on CUDA (thirty-fourth session): every [gpu] case (the experts op on every path, the
# MoE test models with --quant fp8 and int8/int4), compute-sanitizer memcheck and racecheck of the experts op, then
# 35B-A3B shapes with --dummy-weights: bf16 decode b=1/16/64 (the grouped GEMM's bf16 path after the weight-type
# template), --quant fp8 decode b=1/2/8/16/64 and prefill 4096 against bf16, --quant int4 decode b=1/8/64.
# Usage (device tool, repository root, carry [".carry/deps"]): bash tools/gpu/moe_fp8_check.sh  (about 6 minutes)
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
step build 300 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench >>/tmp/bn.log 2>&1" ||
    { grep -E "error|Error" /tmp/bn.log | head -20 | tee -a "$SUM"; tail -20 /tmp/bn.log | tee -a "$SUM"; exit 1; }
want tests && {
    step tests_moe_quant 300 $N/hybrid-tests "CUDA MoE FP8 and Q8*","CUDA MoE models*","int quant: int8 / int4 MoE*"
    grep -E "CUDA MoE experts|CUDA MoE model|CUDA MoE Q|test cases|FAILED|rel err" "$LOG" | grep -v "^  " | tail -120 >>"$SUM"
}
mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
B=$N/hybrid-bench
want bench && {
    step bf16_dec 200 $B -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 1,16,64 -r 1
    grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [bf16] /" >>"$SUM"
    step fp8_dec 300 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 32 -b 1,2,8,16,64 -r 1
    grep -E "ready|arena" "$LOG" | tail -2 | sed "s/^/  [fp8] /" >>"$SUM"
    grep -E '^\| +[0-9]' "$LOG" | tail -5 | sed "s/^/  [fp8] /" >>"$SUM"
    step fp8_prefill 300 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 4096 -n 8 -r 1 --ubatch 4096
    grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [fp8 prefill] /" >>"$SUM"
    step bf16_prefill 200 $B -m /tmp/q35 --dummy-weights --device cuda -p 4096 -n 8 -r 1 --ubatch 4096
    grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [bf16 prefill] /" >>"$SUM"
}
want tests && {
    step tests_gpu 300 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
    step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "CUDA MoE FP8 and Q8*"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 99 $N/hybrid-tests "CUDA MoE FP8 and Q8*"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
}
want bench && {
    step int4_dec 400 $B -m /tmp/q35 --dummy-weights --device cuda --quant int4 -p 16 -n 32 -b 1,8,64 -r 1
    grep -E "ready|arena" "$LOG" | tail -2 | sed "s/^/  [int4] /" >>"$SUM"
    grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [int4] /" >>"$SUM"
}
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
