#!/bin/bash
# The quantized wgmma GEMM (thirty-seventh session; on by default since the thirty-eighth): Q8/Q4/FP8 matrices with
# 9-64 rows on wgmma with the weights turned into bf16 in registers, against the paths it replaces (--wgmma-quant off:
# Q8/Q4 dequantized to bf16 scratch for cuBLASLt, FP8 with --fp8-gemm dequantize the same for the bf16 GEMM) in the
# same binary. Steps, in order of need: its tests; 4B-shaped decode at 16/32/64 rows for int4, int8, fp8 (W8A16: on,
# on with 2 warpgroups, off; block-scaled W8A8: the default) and bf16; every [int] and [fp8] case; every [gpu] case.
# Usage (device tool, repository root, carry [".carry/deps"]): bash tools/gpu/wgmma_quant_check.sh; ONLY="tests
# bench_int4 ..." runs the named steps (the build always runs); B_LIST (default 16,32,64) the batch sizes; MODES
# (default "on on2 off") the bench modes.
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
T=$N/hybrid-tests
B=$N/hybrid-bench
step build 300 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench >>/tmp/bn.log 2>&1" ||
    { grep -E "error|Error" /tmp/bn.log | head -20 | tee -a "$SUM"; tail -20 /tmp/bn.log | tee -a "$SUM"; exit 1; }
if want tests; then
    step tests 300 $T "CUDA quantized wgmma*"
    grep -E "test cases|FAILED|rel err|with expansion|REQUIRE|CHECK" "$LOG" | head -60 >>"$SUM"
fi
BL=${B_LIST:-16,32,64}
NB=$(($(echo "$BL" | tr -cd , | wc -c) + 1))
mkdir -p /tmp/q4b && cp tools/gpu/config_4b.json /tmp/q4b/config.json
rows() { grep -E '^\| +[0-9]' "$LOG" | tail -$1 | sed "s/^/  [$2] /" >>"$SUM"; }
for q in int4 int8 bf16 fp8; do  # (each quantized mode: on, off)
    want bench_$q || continue
    if [ $q = bf16 ]; then
        step bench_bf16 200 $B -m /tmp/q4b --dummy-weights --device cuda -p 128 -n 32 -b $BL -r 1
        rows $NB bf16
        continue
    fi
    extra=()
    [ $q = fp8 ] && extra=(--fp8-gemm dequantize)
    for mode in ${MODES:-on on2 off}; do  # (on2: 2 consumer warpgroups)
        step bench_${q}_$mode 200 $B -m /tmp/q4b --dummy-weights --device cuda --quant $q -p 128 -n 32 -b $BL -r 1 \
            --wgmma-quant ${mode%2} --wgmma-quant-warpgroups $([ $mode = on2 ] && echo 2 || echo 1) "${extra[@]}"
        rows $NB "$q ${extra[*]} wgmma $mode"
    done
    if [ $q = fp8 ]; then
        step bench_fp8_w8a8 200 $B -m /tmp/q4b --dummy-weights --device cuda --quant fp8 -p 128 -n 32 -b $BL -r 1
        rows $NB "fp8 block-scaled"
    fi
done
if want tests_q; then
    step tests_q 400 $T "[int],[fp8]"
    grep -E "test cases|FAILED" "$LOG" | tail -8 >>"$SUM"
fi
if want tests_gpu; then
    step tests_gpu 400 $T "[gpu]"
    grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
