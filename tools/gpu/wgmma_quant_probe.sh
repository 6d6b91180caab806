#!/bin/bash
# The thirty-ninth session's diagnosis of the quantized wgmma GEMM in one device call (its run on an H100 did gpu, q4
# and parts: docs/perf-notes.md), steps in order of need, each time-boxed. Usage: the device tool, repository root,
# carry [".carry/deps"]; ONLY="gpu q4 ..." picks steps; the build always runs.
#   gpu    every [gpu] case with the tree's defaults, and
#          hybrid-compare --device cuda on models/tiny (the test models' goldens have no CUDA keys: they stop at once)
#   q4     the Q4 form of the 2-warpgroup quantized wgmma GEMM: the source's Q8-only guard lifted in the device's
#          copy, hybrid-tests rebuilt, its tests under compute-sanitizer (the faulting kernel and PC), and that
#          kernel's SASS in $OUT/q4_2wg.sass (on branch wip/q4-two-warpgroups, where the guard is gone, it tests the fix)
#   parts  int8 4B decode at 16 and 64 rows with the K split by shape (0), and forced to 2 and 4 parts (are 1-1.5
#          blocks an SM too few for the conversion's latency?)
#   wg     4B decode at 16, 32 and 64 rows: int4, int8 and fp8 (--fp8-gemm dequantize) with 1 and 2 warpgroups, and bf16
#   ncu    Nsight Compute: the time of every kernel of int8 4B decode steps at 16 rows ($OUT/ncu_int8_b16.txt)
#   ncu2   ... and the quantized GEMM's occupancy, issue and warp-state sections ($OUT/ncu_quant_detail.txt)
#   ncu3   at 64 rows: those sections and the memory workload for int8's and int4's quantized GEMM and bf16's wgmma
#          GEMM ($OUT/ncu64_{int8,int4,none}.txt)
#   ncu4   at 64 rows: the warps' stall reasons (cycles a warp waits per issued instruction, by reason) of int8's
#          quantized GEMM and bf16's wgmma GEMM ($OUT/stalls_{int8,none}.txt)
set -u
. tools/gpu/run_lib.sh
N=/tmp/bn
T=$N/hybrid-tests
build_in $N hybrid-tests hybrid-bench hybrid-compare
if want gpu; then
step tests_gpu 200 $T "[gpu]" --durations yes
grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
grep -E "^[0-9.]+ s: " "$LOG" | sort -rn | head -8 >>"$SUM"
for m in models/tiny; do
  step "cmp_$(basename $m)" 60 $N/hybrid-compare -m $m --device cuda
  grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
done
fi
if want q4; then
python3 - <<'P'
p='kernels/cuda/gemm_wgmma.cu'; s=open(p).read()
s=s.replace("    if constexpr (kW == kWgQ8)\n        if (ctx.wgmma_quant_warpgroups == 2)","    if (ctx.wgmma_quant_warpgroups == 2)")
open(p,'w').write(s)
P
step rebuild 200 cmake --build $N -j16 --target hybrid-tests
step q4_2wg_san 90 compute-sanitizer --tool memcheck --show-backtrace device $T "CUDA quantized wgmma*"
grep -E "Illegal|illegal|at 0x|pc|Error|=========" "$LOG" | head -40 >>"$SUM"
cuobjdump -sass $T 2>>"$LOG" | awk '/Function : /{p = ($0 ~ /gemm_wgmma_quant_kernelILi16ELb0ELi2ELi2E/)} p' >"$OUT/q4_2wg.sass"
ls -la $OUT/q4_2wg.sass >>"$SUM"
fi
mkdir -p /tmp/q4b && cp tools/gpu/config_4b.json /tmp/q4b/config.json
if want parts; then
for p in 0 2 4; do
  [ $(($(date +%s) - T0)) -lt 420 ] || break
  step bench_i8_parts$p 60 $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant int8 -p 128 -n 32 -b 16,64 -r 1 --wgmma-parts $p
  grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [parts $p] /" >>"$SUM"
done
fi
if want wg; then
for q in int4 int8 fp8; do
  extra=""; [ $q = fp8 ] && extra="--fp8-gemm dequantize"
  for w in 1 2; do
    [ $(($(date +%s) - T0)) -lt 480 ] || break
    step bench_${q}_wg$w 60 $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant $q $extra -p 128 -n 32 -b 16,32,64 -r 1 --wgmma-quant-warpgroups $w
    grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [$q wg$w] /" >>"$SUM"
  done
done
step bench_bf16 60 $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda -p 128 -n 32 -b 16,32,64 -r 1
grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [bf16] /" >>"$SUM"
fi
if want ncu && [ $(($(date +%s) - T0)) -lt 440 ]; then
step ncu_int8_b16 150 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
  --launch-skip 3000 --launch-count 700 -o /tmp/ncu_i8 $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant int8 -p 16 -n 12 -b 16 -r 1
ncu --import /tmp/ncu_i8.ncu-rep --csv >/tmp/ncu.csv 2>>"$LOG"
python3 tools/gpu/ncu_summary.py /tmp/ncu.csv >"$OUT/ncu_int8_b16.txt" 2>&1
head -24 "$OUT/ncu_int8_b16.txt" >>"$SUM"
fi
if want ncu2 && [ $(($(date +%s) - T0)) -lt 480 ]; then
step ncu_quant_detail 120 ncu --graph-profiling node -k regex:gemm_wgmma_quant --launch-skip 40 --launch-count 4 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats \
  $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant int8 -p 16 -n 12 -b 16 -r 1
tail -400 "$LOG" > "$OUT/ncu_quant_detail.txt"
grep -E "gemm_wgmma_quant|Duration|Memory Throughput|DRAM Throughput|Issue Slots|Eligible Warps|Active Warps|Achieved Occupancy|Registers|Grid Size|Block Size|No Eligible|Theoretical Occ" "$LOG" | tail -60 >>"$SUM"
fi
if want ncu3; then
for q in int8 int4 none; do
  [ $(($(date +%s) - T0)) -lt 450 ] || break
  # (the demangled name with its template arguments: the n-tile of 64 rows, so decode steps, not the prompts)
  k='gemm_wgmma_quant_kernel<\(int\)64'; [ $q = none ] && k='gemm_wgmma_kernel<__nv_bfloat16, \(int\)64'
  step ncu64_$q 120 ncu --graph-profiling node --kernel-name-base demangled -k "regex:$k" --launch-skip 8 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
    $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant $q -p 4 -n 12 -b 64 -r 1
  awk -v s="==== ncu64_$q:" 'index($0, s) == 1 {p = 1} p' "$LOG" >"$OUT/ncu64_$q.txt"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Achieved Occupancy|Registers Per|Grid Size|No Eligible|Warp Cycles Per Issued" "$OUT/ncu64_$q.txt" | head -12 | sed "s/^/  [$q] /" >>"$SUM"
done
fi
if want ncu4; then
for q in int8 none; do
  [ $(($(date +%s) - T0)) -lt 450 ] || break
  k='gemm_wgmma_quant_kernel<\(int\)64'; [ $q = none ] && k='gemm_wgmma_kernel<__nv_bfloat16, \(int\)64'
  step stalls_$q 120 ncu --graph-profiling node --kernel-name-base demangled -k "regex:$k" --launch-skip 8 --launch-count 3 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum,smsp__inst_executed.sum" \
    $N/hybrid-bench -m /tmp/q4b --dummy-weights --device cuda --quant $q -p 4 -n 12 -b 64 -r 1
  awk -v s="==== stalls_$q:" 'index($0, s) == 1 {p = 1} p' "$LOG" >"$OUT/stalls_$q.txt"
done
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
