#!/bin/bash
# FP8 and Q8/Q4 MoE experts on CUDA (thirty-fourth session), in order of need (a run cut short keeps what it did):
# the experts op on every path and the MoE test models with --quant fp8 and int8/int4; 35B-A3B shapes with
# --dummy-weights, decode b=1/2/8/16/64 with --quant fp8 and b=1/16/64 in bf16 (the grouped GEMM's bf16 path after
# the weight-type template); every [gpu] case; compute-sanitizer memcheck of the experts op; prefill 4096 fp8 and
# bf16; --quant int4 decode b=1/8/64; racecheck of the experts op.
# Usage (device tool, repository root, carry [".carry/deps"]): bash tools/gpu/moe_fp8_check.sh  (about 10 minutes);
# ONLY="build tests_gpu ..." runs the named steps (the build always runs).
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
T=$N/hybrid-tests
B=$N/hybrid-bench
step build 300 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench >>/tmp/bn.log 2>&1" ||
    { grep -E "error|Error" /tmp/bn.log | head -20 | tee -a "$SUM"; tail -20 /tmp/bn.log | tee -a "$SUM"; exit 1; }
OP="CUDA MoE FP8 and Q8*"
want tests_moe_quant && step tests_moe_quant 300 $T "$OP","CUDA MoE models*","int quant: int8 / int4 MoE*"
want tests_moe_quant && grep -E "CUDA MoE experts|CUDA MoE model|CUDA MoE Q|test cases|FAILED|rel err" "$LOG" | grep -v "^  " | tail -120 >>"$SUM"
mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
rows() { grep -E '^\| +[0-9]' "$LOG" | tail -$1 | sed "s/^/  [$2] /" >>"$SUM"; }
if want fp8_dec; then
    step fp8_dec 200 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 32 -b 1,2,8,16,64 -r 1
    grep -E "ready|arena" "$LOG" | tail -2 | sed "s/^/  [fp8] /" >>"$SUM"
    rows 5 fp8
fi
if [[ " $ONLY " == *" fp8_rows "* ]]; then  # (only when named) FP8 at FP8_ROWS_B rows (default 16,24: 2 sizes), grouped from
    # FP8_ROWS_GROUPED rows (default 16) against grouped from FP8_ROWS_PERROW (default 64: per row up to 63)
    FB=${FP8_ROWS_B:-16,24}
    NB=$(($(echo "$FB" | tr -cd , | wc -c) + 1))
    step fp8_rows 240 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 32 -b $FB -r 1 --moe-grouped-rows ${FP8_ROWS_GROUPED:-16}
    rows $NB "fp8 grouped from ${FP8_ROWS_GROUPED:-16}"
    step fp8_rows32 240 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 16 -n 32 -b $FB -r 1 --moe-grouped-rows ${FP8_ROWS_PERROW:-64}
    rows $NB "fp8 grouped from ${FP8_ROWS_PERROW:-64}"
fi
if want bf16_dec; then
    step bf16_dec 200 $B -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 1,16,64 -r 1
    rows 3 bf16
fi
if want tests_gpu; then
    step tests_gpu 300 $T "[gpu]"
    grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
fi
if want memcheck; then
    step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 99 $T "$OP"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
if want fp8_prefill; then
    step fp8_prefill 200 $B -m /tmp/q35 --dummy-weights --device cuda --quant fp8 -p 4096 -n 8 -r 1 --ubatch 4096
    rows 1 "fp8 prefill"
fi
if want bf16_prefill; then
    step bf16_prefill 200 $B -m /tmp/q35 --dummy-weights --device cuda -p 4096 -n 8 -r 1 --ubatch 4096
    rows 1 "bf16 prefill"
fi
if want int4_dec; then
    step int4_dec 400 $B -m /tmp/q35 --dummy-weights --device cuda --quant int4 -p 16 -n 32 -b 1,8,64 -r 1
    grep -E "ready|arena" "$LOG" | tail -2 | sed "s/^/  [int4] /" >>"$SUM"
    rows 3 int4
fi
if want racecheck; then
    step racecheck 200 compute-sanitizer --tool racecheck --error-exitcode 99 $T "$OP"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
