#!/bin/bash
# The staged Q8/Q4 decode GEMV (CudaOptions::int_gemv_staged, hybrid-bench --int-gemv-staged: the codes copied into
# shared memory in cp.async stages instead of registers; by default for 2-4 rows) in one device call: its tests, then 4B decode at 1, 2 and
# 8 rows with it on and off in the same binary, in alternation (R rounds, default 2), then compute-sanitizer over its
# test and every [gpu] case. Usage: the device tool, repository root, carry [".carry/deps"]; ONLY="tests bench san
# gpu" picks steps (the build always runs).
#   tests  the integer GEMV cases ([int]), among them the staged kernel against the register one, bit for bit
#   bench  hybrid-bench 4B (--dummy-weights) -p 128 -n 64 -b 1,2,8 -r 1: int4 and int8 staged always then never, and
#          int4 with --quant-lm-head (the 248k-row lm_head on the GEMV)
#   san    compute-sanitizer memcheck over the staged-against-register case
#   gpu    every [gpu] case (the defaults)
set -u
. tools/gpu/run_lib.sh
N=/tmp/bn
T=$N/hybrid-tests
build_in $N hybrid-tests hybrid-bench
if want tests; then
step tests_int 150 $T "[int]" --durations yes
grep -E "test cases|FAILED|assertions|with expansion|REQUIRE|CHECK| s: " "$LOG" | tail -14 >>"$SUM"
fi
mkdir -p /tmp/m4b && cp tools/gpu/config_4b.json /tmp/m4b/config.json
if want bench; then
B="$N/hybrid-bench -m /tmp/m4b --dummy-weights --device cuda -p 128 -n 64 -b 1,2,8 -r 1"
run() {  # name, flags...
  local name=$1; shift
  [ $(($(date +%s) - T0)) -lt ${BENCH_UNTIL:-480} ] || { say "skipped $name (time)"; return; }
  step "bench_$name" 90 $B "$@"
  grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [$name] /" >>"$SUM"
}
for round in $(seq ${R:-2}); do
  run int4_on --quant int4 --int-gemv-staged always
  run int4_off --quant int4 --int-gemv-staged never
  run int8_on --quant int8 --int-gemv-staged always
  run int8_off --quant int8 --int-gemv-staged never
  run int4_lm_on --quant int4 --quant-lm-head --int-gemv-staged always
  run int4_lm_off --quant int4 --quant-lm-head --int-gemv-staged never
done
fi
if want san && [ $(($(date +%s) - T0)) -lt ${SAN_UNTIL:-500} ]; then
step san_mem 120 compute-sanitizer --tool memcheck $T "*codes staged in shared memory*"
grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
if want gpu && [ $(($(date +%s) - T0)) -lt ${GPU_UNTIL:-520} ]; then
step tests_gpu 150 $T "[gpu]"
grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
fi
cp /tmp/bn.log "$OUT/build.log" 2>/dev/null
