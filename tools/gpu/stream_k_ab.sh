#!/bin/bash
# The stream-K split of the wgmma GEMMs (CudaOptions::wgmma_stream_k for bf16, off by default; wgmma_stream_k_quant for
# int8/int4/fp8, on by default; hybrid-bench --wgmma-stream-k, --wgmma-stream-k-quant) in one device call: its tests,
# then 4B decode at 16/32/64 rows with it on and off in the same binary, in alternation (R rounds, default 2), then
# compute-sanitizer over its tests. Usage: the device tool, repository root, carry [".carry/deps"];
# ONLY="tests bench san gpu" picks steps (the build always runs).
#   tests  the wgmma GEMM cases (bf16 and quantized), which run the stream-K split too
#   bench  hybrid-bench 4B (--dummy-weights) -p 128 -n 32 -b 16,32,64 -r 1: int8, int4, fp8 (--fp8-gemm dequantize,
#          the W8A16 path on this GEMM) quantized stream-K on then off; bf16 off then on
#   san    compute-sanitizer memcheck over the quantized case with the stream-K mode
#   gpu    every [gpu] case (the defaults)
set -u
. tools/gpu/run_lib.sh
N=/tmp/bn
T=$N/hybrid-tests
build_in $N hybrid-tests hybrid-bench hybrid-compare
if want tests; then
step tests_wgmma 150 $T "CUDA wgmma GEMM*,CUDA quantized wgmma*" --durations yes
grep -E "test cases|FAILED|assertions|with expansion|REQUIRE|CHECK" "$LOG" | tail -12 >>"$SUM"
fi
if want gpu && [ $(($(date +%s) - T0)) -lt 250 ]; then
step tests_gpu 150 $T "[gpu]"
grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
fi
if want san && [ $(($(date +%s) - T0)) -lt 400 ]; then
step san_mem 150 compute-sanitizer --tool memcheck $T "*9-64 rows: matches the dequantized reference*"
grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
mkdir -p /tmp/m4b && cp tools/gpu/config_4b.json /tmp/m4b/config.json
if want bench; then
B="$N/hybrid-bench -m /tmp/m4b --dummy-weights --device cuda -p 128 -n 32 -b 16,32,64 -r 1"
run() {  # name, flags...
  local name=$1; shift
  [ $(($(date +%s) - T0)) -lt ${BENCH_UNTIL:-540} ] || { say "skipped $name (time)"; return; }
  step "bench_$name" 60 $B "$@"
  grep -E '^ready after' "$LOG" | tail -1 | sed "s/^/  [$name] /" >>"$SUM"  # (the load: --quant quantizes on the host)
  grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [$name] /" >>"$SUM"
}
for round in $(seq ${R:-2}); do
  run int8_on --quant int8
  run int8_off --quant int8 --wgmma-stream-k-quant off
  run int4_on --quant int4
  run int4_off --quant int4 --wgmma-stream-k-quant off
  run fp8_on --quant fp8 --fp8-gemm dequantize
  run fp8_off --quant fp8 --fp8-gemm dequantize --wgmma-stream-k-quant off
  run bf16_off
  run bf16_on --wgmma-stream-k on
done
fi
cp /tmp/bn.log "$OUT/build.log" 2>/dev/null
