#!/bin/bash
# One device call for a change to the MoE decode kernels against a baseline built beside it (.carry/base-src:
# `git archive BASE | tar -x`); the twenty-sixth session's runs 130-132 (docs/perf-notes.md) used it,
# most important first, so that a call cut short still says something:
#   build (new, base, new with -DHY_CUDA_TRACE=ON) -> the CUDA MoE [gpu] cases -> 35B-A3B b=1, new and base in
#   alternation (2 rounds) -> batches 2 and 8 -> every [gpu] case -> hybrid-compare on the MoE test models ->
#   compute-sanitizer on the MoE cases -> Nsight Compute on the gate/up kernels (new and base) -> a b=1 trace.
# Usage (device tool, repository root, carry [".carry"]): bash tools/gpu/moe_ab.sh   (ONLY="a b": those stages)
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, DEPS, CFG, say, step, want
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn B=/tmp/bb
(cmake -S . -B $N "${CFG[@]}" >/tmp/bn.log 2>&1 &&
    cmake --build $N -j8 --target hybrid-tests hybrid-bench hybrid-compare >>/tmp/bn.log 2>&1
 echo "rc=$?" >>/tmp/bn.log) &
(cmake -S .carry/base-src -B $B "${CFG[@]}" >/tmp/bb.log 2>&1 && cmake --build $B -j5 --target hybrid-bench >>/tmp/bb.log 2>&1
 echo "rc=$?" >>/tmp/bb.log) &
want trace && (cmake -S . -B /tmp/bt "${CFG[@]}" -DHY_CUDA_TRACE=ON >/tmp/bt.log 2>&1 &&
    cmake --build /tmp/bt -j3 --target hybrid-bench >>/tmp/bt.log 2>&1; echo "rc=$?" >>/tmp/bt.log) &
wait
step build_new 5 grep -q "rc=0" /tmp/bn.log || { tail -40 /tmp/bn.log | tee -a "$SUM"; exit 1; }
step build_base 5 grep -q "rc=0" /tmp/bb.log || tail -20 /tmp/bb.log >>"$SUM"
mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
if want moe_tests; then
    step tests_moe 200 $N/hybrid-tests "CUDA MoE*"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -12 >>"$SUM"
fi
if want b1; then
    for i in 1 2; do
        for bin in $N $B; do
            [ -x $bin/hybrid-bench ] || continue
            tag=$(basename $bin)_$i
            step "b1_$tag" 200 $bin/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 128 -r 2
            grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [$tag] /" >>"$SUM"
        done
    done
fi
if want batch; then
    for bin in $N $B; do
        [ -x $bin/hybrid-bench ] || continue
        step "batch_$(basename $bin)" 200 $bin/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 \
            -b 2,8 -r 1
        grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [$(basename $bin)] /" >>"$SUM"
    done
fi
if want gpu_tests; then
    step tests_gpu 240 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED" "$LOG" | tail -4 >>"$SUM"
fi
if want compare; then
    for m in moe next; do
        step "compare_${m}_cuda" 60 $N/hybrid-compare -m tests/data/models/$m --device cuda --key greedy_fp32_cpu \
            --tol 0.1 --near-tie 0.05
        grep -E "^(ok|FAIL)|SUMMARY" "$LOG" | tail -6 >>"$SUM"
    done
fi
if want memcheck; then
    step memcheck_moe 240 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "CUDA MoE router*"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
if want ncu; then  # Nsight Compute on the b=1 gate/up kernels, new (streaming) and base (warp per output)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for bin in $N $B; do
        step "ncu_gate_up_$(basename $bin)" 200 $NCU --kernel-name regex:"moe_gate_up" --launch-skip 200 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
            --section WarpStateStats --section SchedulerStats $bin/hybrid-bench -m /tmp/q35 --dummy-weights \
            --device cuda -p 16 -n 8 -r 1 --no-cuda-graphs
        grep -E "moe_gate|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Waves Per|Issued Warp|No Eligible|Eligible Warps|Elapsed Cycles|SM Active|Warp Cycles Per Issued" "$LOG" |
            tail -16 >"$OUT/ncu_gate_up_$(basename $bin).txt"
    done
fi
if want trace && grep -q "rc=0" /tmp/bt.log; then
    step trace_35b 200 /tmp/bt/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 64 -r 1 \
        --cuda-trace /tmp/trace_35b.txt
    python3 tools/gpu/trace_summary.py /tmp/trace_35b.txt --steps 48 >"$OUT/trace_35b.txt" 2>&1
    head -30 "$OUT/trace_35b.txt" >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
