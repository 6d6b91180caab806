#!/bin/bash
# The device checks the thirty-third session could not run (docs/perf-notes.md, thirty-third session): every [gpu]
# case on this tree; tools/gpu/barrier_probe.cu (a software grid barrier against a PDL kernel boundary); 35B-A3B
# decode b=1 and 2 with the MoE gate/up GEMV (gemv_expert_gate_up, up to kMoeGateUpGemvMaxRows rows) against the
# one-warp kernel built beside it (kMoeGateUpGemv = false), two rounds in alternation; b=8, 16 and 64; then
# compute-sanitizer memcheck of the MoE experts case.
# Usage (device tool, repository root, carry [".carry/deps"]): bash tools/gpu/moe_gemv_check.sh  (about 5 minutes)
set -u
. tools/gpu/run_lib.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
step build 300 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench >>/tmp/bn.log 2>&1" ||
    { tail -40 /tmp/bn.log | tee -a "$SUM"; exit 1; }
step barrier_probe 90 bash -c "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) -O2 -arch=sm_90a -o /tmp/barrier_probe tools/gpu/barrier_probe.cu && timeout 60 /tmp/barrier_probe"
sed -n '/^==== barrier_probe/,$p' "$LOG" | grep -E "^\||SMs" >>"$SUM"
step tests_gpu 300 $N/hybrid-tests "[gpu]"
grep -E "test cases|FAILED|assertions" "$LOG" | tail -3 >>"$SUM"
F=kernels/cuda/moe.cu
cp $F /tmp/moe.orig
cp $N/hybrid-bench /tmp/hb_cur
cp /tmp/moe.orig $F && sed -i "s/constexpr bool kMoeGateUpGemv = true;/constexpr bool kMoeGateUpGemv = false;/" $F &&
    grep -q "kMoeGateUpGemv = false" $F && step build_old 200 cmake --build $N -j16 --target hybrid-bench &&
    cp $N/hybrid-bench /tmp/hb_old
cp /tmp/moe.orig $F
mkdir -p /tmp/q35 /tmp/q4b && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json && cp tools/gpu/config_4b.json /tmp/q4b/config.json
for i in 1 2; do
    for name in cur old; do
        step "b12_${name}_$i" 200 /tmp/hb_$name -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 64 -b 1,2 -r 1
        grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [$name $i] /" >>"$SUM"
    done
done
step b35 200 /tmp/hb_cur -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 8,16,64 -r 1
grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [35b] /" >>"$SUM"
step build_tests 200 cmake --build $N -j16 --target hybrid-tests
step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "CUDA MoE router and experts*"
grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
