#!/bin/bash
# One device run that checks a change against a baseline commit in the same warm run: builds this checkout and the
# baseline's sources (.carry/base-src, e.g. `git archive BASE | tar -x -C .carry/base-src`, without models/ and
# tests/data) side by side on the GPU machine, runs the [gpu] tests and hybrid-compare on models/tiny with both, then
# hybrid-bench on a Qwen3.5-4B-shaped random checkpoint: decode b=1, prefill 4096 and batched decode, new and base
# in alternation (ROUNDS rounds, default 2), so that a difference of about 1% stands out of the run-to-run noise.
# Usage (device tool, from the repository root): bash tools/gpu/ab_run.sh   with carry [".carry"]
# (.carry from ../shared/tools/device_prep.sh). STAGES (default "all"): build gpu_tests tests bench fp8_kernels fp8 int int_trace moe moe_trace moe_ncu moe_trained w4a16 depth depth_trace attn int_ab small_batch
# (NOBASE=1: no baseline build; FP8_QUICK=1: the fp8 stage's benches with FP8 weights and block-scaled alone; MOE_AB=0, MOE_LONG=0: shorter moe stage; TRACE=1: also builds hybrid-bench with -DHY_CUDA_TRACE=ON for moe_trace).
# Logs: $OUT/all.log, summary last.
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, DEPS, CFG, say, step
STAGES=${STAGES:-all}
want() { [ "$STAGES" = all ] || [[ " $STAGES " == *" $1 "* ]]; }
TARGETS=(--target hybrid-tests hybrid-bench hybrid-compare hybrid hybrid-kernel-bench hybrid-perplexity)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
if want build; then
    (cmake -S . -B /tmp/bn "${CFG[@]}" >/tmp/bn.log 2>&1 && cmake --build /tmp/bn -j10 "${TARGETS[@]}" >>/tmp/bn.log 2>&1
     echo "rc=$?" >>/tmp/bn.log) &
    [ "${TRACE:-0}" = 1 ] && (cmake -S . -B /tmp/bt "${CFG[@]}" -DHY_CUDA_TRACE=ON >/tmp/bt.log 2>&1 &&
        cmake --build /tmp/bt -j4 --target hybrid-bench >>/tmp/bt.log 2>&1; echo "rc=$?" >>/tmp/bt.log) &
    [ "${NOBASE:-0}" = 1 ] || step build_base 300 bash -c "cmake -S .carry/base-src -B /tmp/bb ${CFG[*]} \
        -DHY_TESTS_ONLY=OFF >/tmp/bb.log 2>&1 && cmake --build /tmp/bb -j6 --target hybrid-bench hybrid-compare >>/tmp/bb.log 2>&1"
    wait
    step build_new 5 grep -q "rc=0" /tmp/bn.log || { tail -40 /tmp/bn.log; tail -20 /tmp/bb.log; exit 1; }
fi
N=/tmp/bn
B=/tmp/bb
if want gpu_tests && ! want tests; then  # the [gpu] test cases alone
    step tests_gpu 200 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -6 >>"$SUM"
fi
if want tests; then
    step tests_gpu 200 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -6 >>"$SUM"
    for bin in $N $([ "${NOBASE:-0}" = 1 ] || echo $B); do
        step "compare_tiny_$(basename $bin)" 60 $bin/hybrid-compare -m models/tiny --device cuda --near-tie 0.05
        grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
    done
    for flag in --no-cuda-graphs --no-pdl; do  # (the new binaries' flags; the same kernels, so the same results)
        step "compare_tiny_bn_$flag" 60 $N/hybrid-compare -m models/tiny --device cuda --near-tie 0.05 $flag
        grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
    done
    for m in moe next; do  # the MoE test models against HF fp32 (their goldens have no bf16 run: tokens may part)
        step "compare_${m}_cuda" 60 $N/hybrid-compare -m tests/data/models/$m --device cuda --key greedy_fp32_cpu \
            --tol 0.1 --near-tie 0.05
        grep -E "^(ok|FAIL)|SUMMARY" "$LOG" | tail -6 >>"$SUM"
        # calibration: HF's own bf16 forward's distance to its fp32 logits, and ours to HF bf16's
        G=tests/data/models/$m
        step "hf_bf16_$m" 120 python3 tools/gpu/hf_bf16_logits.py --model $G --golden $G/golden.json \
            --fp32 $G/golden_logits.safetensors --out /tmp/${m}_bf16.safetensors
        grep -E "^HF bf16" "$LOG" | tail -5 >>"$SUM"
        step "compare_${m}_vs_hf_bf16" 60 $N/hybrid-compare -m $G --device cuda --key greedy_fp32_cpu \
            --logits /tmp/${m}_bf16.safetensors --tol 1 --near-tie 0.05
        grep -E "^(ok|FAIL)|SUMMARY" "$LOG" | tail -6 >>"$SUM"
    done
    step memcheck_moe 200 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "CUDA MoE*"
    grep -E "ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step cli_tiny 60 $N/hybrid -m models/tiny --device cuda -p 'def fibonacci(n):\n    ' -n 32 --temp 0 --verbose
    tail -6 "$LOG" >>"$SUM"
fi
M=/tmp/q4b
if want bench; then
    [ -f $M/config.json ] || step fixture_4b 150 python3 tools/gpu/random_checkpoint.py --out $M
    for i in $(seq 1 "${ROUNDS:-2}"); do
        for bin in $N $B; do
            tag=$(basename $bin)_$i
            step "b1_$tag" 60 $bin/hybrid-bench -m $M --device cuda -p 512 -n 256 -r 3
            say "  decode b=1 [$tag]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
            step "prefill4096_$tag" 90 $bin/hybrid-bench -m $M --device cuda -p 4096 -n 8 -r 2 --ubatch 4096
            say "  prefill 4096 [$tag]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
            step "batch_$tag" 150 $bin/hybrid-bench -m $M --device cuda -p 128 -n 128 -b 8,64 -r 2
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  batch [$tag]: /" >>"$SUM"
        done
    done
fi
if want fp8_kernels; then  # every FP8 GEMV launch shape on the 4B projection shapes (1, 2, 6 rows); the cuBLASLt probe
    for t in 1 2 6; do
        step "kernel_bench_fp8_$t" 120 $N/hybrid-kernel-bench $t fp8
        sed -n "/^==== kernel_bench_fp8_$t/,\$p" "$LOG" | sed -n '/^FP8 weights/,$p' | grep -E "^\||arrangement" |
            sed "s/^/  [T=$t] /" >>"$SUM"
    done
fi
if want fp8; then  # FP8 weights: the [fp8] tests, then 4B shapes with --quant fp8 against bf16 (the same checkpoint)
    step fp8_tests 200 $N/hybrid-tests "[fp8]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -8 >>"$SUM"
    # quality on the GPU: models/tiny's held-out perplexity, --quant fp8 (both GEMM modes) against 16-bit
    TXT=tests/data/text/heldout.py
    rm -f /tmp/ppl_base.bin
    step ppl_base 60 $N/hybrid-perplexity -m models/tiny --device cuda -f $TXT --save-logits /tmp/ppl_base.bin
    for g in block-scaled dequantize; do
        step "ppl_fp8_$g" 60 $N/hybrid-perplexity -m models/tiny --device cuda --quant fp8 --fp8-gemm $g -f $TXT \
            --kl-base /tmp/ppl_base.bin
        grep -iE "perplexity|KL|top-1" "$LOG" | tail -5 | sed "s/^/  [$g] /" >>"$SUM"
    done
    # (4B shapes with dummy weights made at load: no checkpoint to write, the same speed as random ones)
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for q in fp8 $([ "${FP8_QUICK:-0}" = 1 ] || echo none); do
        step "fp8_b1_$q" 120 $N/hybrid-bench -m $M $DW --device cuda --quant $q -p 512 -n 256 -r 3
        say "  decode b=1 [quant $q]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        for g in block-scaled $([ "${FP8_QUICK:-0}" = 1 ] || echo dequantize); do
            [ $q = none ] && [ $g = dequantize ] && continue
            step "fp8_prefill_${q}_$g" 120 $N/hybrid-bench -m $M $DW --device cuda --quant $q --fp8-gemm $g -p 4096 \
                -n 8 -r 2 --ubatch 4096
            say "  prefill 4096 [quant $q, $g]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
            step "fp8_batch_${q}_$g" 150 $N/hybrid-bench -m $M $DW --device cuda --quant $q --fp8-gemm $g -p 128 \
                -n 64 -b 2,4,8,64 -r 2
            grep -E '^\| +[0-9]' "$LOG" | tail -4 | sed "s/^/  batch [quant $q, $g]: /" >>"$SUM"
        done
    done
    [ "${TRACE:-0}" = 1 ] && grep -q "rc=0" /tmp/bt.log && {
        step fp8_trace 120 /tmp/bt/hybrid-bench -m $M $DW --device cuda --quant fp8 -p 16 -n 64 -r 1 \
            --cuda-trace /tmp/fp8_trace.txt
        python3 tools/gpu/trace_summary.py /tmp/fp8_trace.txt >"$OUT/fp8_trace.txt" 2>&1
        head -40 "$OUT/fp8_trace.txt" >>"$SUM"
    }
fi
if want int; then  # int8/int4 weights (--quant int8 / int4): the [int] tests, models/tiny's quality, 4B-shaped speed
    step int_tests 200 $N/hybrid-tests "[int]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -8 >>"$SUM"
    TXT=tests/data/text/heldout.py
    rm -f /tmp/ppl_base_i.bin
    step ppl_base_int 60 $N/hybrid-perplexity -m models/tiny --device cuda -f $TXT --save-logits /tmp/ppl_base_i.bin
    for q in int8 int4; do
        step "ppl_$q" 60 $N/hybrid-perplexity -m models/tiny --device cuda --quant $q -f $TXT --kl-base /tmp/ppl_base_i.bin
        grep -iE "perplexity|KL|top-1" "$LOG" | tail -5 | sed "s/^/  [$q] /" >>"$SUM"
    done
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for q in int4 int8 $([ "${INT_QUICK:-0}" = 1 ] || echo none); do
        step "int_b1_$q" 150 $N/hybrid-bench -m $M $DW --device cuda --quant $q -p 512 -n 256 -r 3
        say "  decode b=1 [quant $q]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        if [ -x $B/hybrid-bench ] && [ $q != none ]; then  # the baseline's b=1 in the same job
            step "int_b1_base_$q" 150 $B/hybrid-bench -m $M $DW --device cuda --quant $q -p 512 -n 256 -r 3
            say "  decode b=1 [quant $q, BASE]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        fi
        grep -E "^weights|arena" "$LOG" | tail -2 | sed "s/^/  [$q] /" >>"$SUM"
        step "int_prefill_$q" 150 $N/hybrid-bench -m $M $DW --device cuda --quant $q -p 4096 -n 8 -r 2 --ubatch 4096
        say "  prefill 4096 [quant $q]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        step "int_batch_$q" 150 $N/hybrid-bench -m $M $DW --device cuda --quant $q -p 128 -n 64 -b 2,8,64 -r 2
        grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  batch [quant $q]: /" >>"$SUM"
    done
    # lm_head quantized too (--quant-lm-head): b=1 speed and the quality on models/tiny
    step int_b1_int4_lm_head 150 $N/hybrid-bench -m $M $DW --device cuda --quant int4 --quant-lm-head -p 512 -n 256 -r 3
    say "  decode b=1 [quant int4, --quant-lm-head]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
    grep -E "^weights|arena" "$LOG" | tail -2 | sed "s/^/  [int4 lm_head] /" >>"$SUM"
    for q in int8 int4; do
        step "ppl_${q}_lm_head" 60 $N/hybrid-perplexity -m models/tiny --device cuda --quant $q --quant-lm-head -f $TXT \
            --kl-base /tmp/ppl_base_i.bin
        grep -iE "perplexity ratio|KL|top-1" "$LOG" | tail -3 | sed "s/^/  [$q lm_head] /" >>"$SUM"
    done
fi
if want int_trace; then  # where an int4 b=1 decode step's time goes (TRACE=1 build), and Nsight Compute on the GEMVs
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    grep -q "rc=0" /tmp/bt.log 2>/dev/null && for q in int4 none; do
        step "int_trace_$q" 120 /tmp/bt/hybrid-bench -m $M $DW --device cuda --quant $q -p 16 -n 64 -r 1 \
            --cuda-trace /tmp/int_trace_$q.txt
        python3 tools/gpu/trace_summary.py /tmp/int_trace_$q.txt >"$OUT/int_trace_$q.txt" 2>&1
        gzip -c /tmp/int_trace_$q.txt >"$OUT/int_trace_raw_$q.txt.gz"  # (the stamps, for a closer look)
        head -30 "$OUT/int_trace_$q.txt" | sed "s/^/  [$q] /" >>"$SUM"
    done
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_int4 300 $NCU --kernel-name regex:"gemv_int" --launch-skip 300 --launch-count 8 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats $N/hybrid-bench -m $M $DW --device cuda --quant int4 -p 16 \
        -n 8 -r 1 --no-cuda-graphs
    grep -E "gemv_int|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Issued|Eligible|Grid Size|No Eligible" "$LOG" | tail -160 >"$OUT/ncu_int4.txt"
fi
if want moe; then  # Qwen3.5-35B-A3B shapes (tools/gpu/config_35b_a3b.json) with dummy weights made on the device
    mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    for bin in $N $([ "${NOBASE:-0}" = 1 ] || echo $B); do
        tag=$(basename $bin)
        step "bench_35b_b1_$tag" 300 $bin/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 128 -r 2
        grep -E "^ready|^device memory|^model" "$LOG" | tail -3 >>"$SUM"
        grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [$tag] /" >>"$SUM"
        step "bench_35b_batch_$tag" 300 $bin/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 \
            -b 8,16,32,64 -r 1
        grep -E '^\| +[0-9]' "$LOG" | tail -4 | sed "s/^/  [$tag] /" >>"$SUM"
    done
    # the batched decode with the grouped path from 32 rows and never (the threshold's A/B; MOE_AB=0 skips it)
    for g in $([ "${MOE_AB:-1}" = 1 ] && echo 32 100000); do
        step "bench_35b_grouped_$g" 300 $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 \
            -b 32,48,64,128 -r 1 --moe-grouped-rows $g
        grep -E '^\| +[0-9]' "$LOG" | tail -4 | sed "s/^/  [grouped from $g] /" >>"$SUM"
    done
    step bench_35b_prefill 300 $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 4096 -n 8 -r 2 \
        --ubatch 4096
    grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [prefill 4096] /" >>"$SUM"
    [ "${MOE_LONG:-1}" = 1 ] && step bench_35b_32k 300 $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 32768 -n 16 -r 1 \
        --ubatch 4096
    grep -E "^device memory" "$LOG" | tail -1 >>"$SUM"
    grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [prefill 32768] /" >>"$SUM"
fi
if want moe_trace; then  # each kernel's cost on the critical path of a 35B-A3B b=1 decode step
    step build_trace 5 grep -q "rc=0" /tmp/bt.log || tail -20 /tmp/bt.log
    mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    step trace_35b 300 /tmp/bt/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 64 -r 1 \
        --cuda-trace /tmp/trace_35b.txt
    python3 tools/gpu/trace_summary.py /tmp/trace_35b.txt --steps 48 >"$OUT/trace_35b.txt" 2>&1
    head -40 "$OUT/trace_35b.txt" >>"$SUM"
fi
if want moe_ncu; then  # Nsight Compute on the MoE decode kernels of a 35B-A3B b=1 step (after the prefill's)
    mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_moe 300 $NCU --kernel-name regex:"moe_(gate_up|down|route)" --launch-skip 400 --launch-count 6 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        --section WarpStateStats $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 8 -r 1 \
        --no-cuda-graphs
    grep -E "moe_|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Local" "$LOG" | tail -90 >"$OUT/ncu_moe.txt"
    # the grouped GEMMs of a batch-64 decode step (the prefill's 2 x 40 x 2 launches skipped)
    step ncu_moe_b64 300 $NCU --kernel-name regex:"moe_(grouped|group_|combine)" --launch-skip 300 --launch-count 8 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        --section WarpStateStats $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 8 -b 64 -r 1 \
        --no-cuda-graphs
    grep -E "moe_|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Local" "$LOG" | tail -120 >"$OUT/ncu_moe_b64.txt"
fi
if want moe_trained; then  # trained MoE models made here as the fixtures were (tiny-moe, tiny-next; 24 MB each, too big
    # to travel): CUDA against HF's fp32 and bf16 greedy and logits, routing near-ties counted by hybrid-compare
    for p in tiny-moe tiny-next; do
        step "fixture_$p" 300 python3 .carry/tools/make_fixture.py --preset $p --out /tmp/$p --train-steps 900 \
            --tokenizer models/tiny/tokenizer.json
        for key in greedy_fp32_cuda greedy_bf16_cuda; do
            step "compare_${p}_$key" 60 $N/hybrid-compare -m /tmp/$p --device cuda --key $key --tol 0.1 --near-tie 0.05
            grep -E "^(ok|FAIL)|SUMMARY" "$LOG" | tail -9 >>"$SUM"
        done
        step "compare_${p}_cpu" 120 $N/hybrid-compare -m /tmp/$p --device cpu --key greedy_fp32_cuda --tol 1e-3
        grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
    done
fi
if want w4a16; then  # the compressed-tensors W4A16 fixture on CUDA: the [w4a16] tests, its tokens against the CPU's
    step w4a16_tests 120 $N/hybrid-tests "[w4a16]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -4 >>"$SUM"
    for dev in cuda cpu; do
        step "w4a16_cli_$dev" 60 $N/hybrid -m tests/data/models/tiny-w4a16 --device $dev -p 'def fibonacci(n):\n    ' \
            -n 48 --temp 0 --verbose
        tail -5 "$LOG" | sed "s/^/  [w4a16 $dev] /" >>"$SUM"
    done
fi
if want depth; then  # issue 22: decode at depth (b=1 after 4k and 16k context tokens), long prefills (16k, 131,072)
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for d in 4096 16384; do
        for bin in $N $([ "${NOBASE:-0}" = 1 ] || echo $B); do
            step "depth${d}_$(basename $bin)" 200 $bin/hybrid-bench -m $M $DW --device cuda --depth $d -p 16 -n 256 -r 2
            say "  decode b=1 at depth $d [$(basename $bin)]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        done
    done
    step prefill16384 200 $N/hybrid-bench -m $M $DW --device cuda -p 16384 -n 8 -r 2 --ubatch 4096
    say "  prefill 16384: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
    step prefill131072 400 $N/hybrid-bench -m $M $DW --device cuda -p 131072 -n 32 -r 1 --ubatch 4096
    say "  prefill 131072: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
    grep -iE "arena|device memory|kv" "$LOG" | tail -3 | sed "s/^/  [131072] /" >>"$SUM"
fi
if want depth_trace; then  # issue 22: where a b=1 decode step at 16k context goes (TRACE=1 build), ncu on attention
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for d in 0 16384; do
        grep -q "rc=0" /tmp/bt.log 2>/dev/null && step "depth_trace_$d" 200 /tmp/bt/hybrid-bench -m $M $DW --device cuda \
            --depth $d -p 16 -n 64 -r 1 --cuda-trace /tmp/depth_trace_$d.txt
        python3 tools/gpu/trace_summary.py /tmp/depth_trace_$d.txt >"$OUT/depth_trace_$d.txt" 2>&1
        head -24 "$OUT/depth_trace_$d.txt" | sed "s/^/  [depth $d] /" >>"$SUM"
    done
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_attn 300 $NCU --kernel-name regex:"attn_(core|merge)" --launch-skip 40 --launch-count 4 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        --section WarpStateStats --section SchedulerStats $N/hybrid-bench -m $M $DW --device cuda --depth 16384 -p 16 \
        -n 8 -r 1 --no-cuda-graphs
    grep -E "attn_|Duration|Memory Throughput|DRAM Throughput|L2 Hit|L1/TEX Hit|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Issued|Eligible|Grid Size|No Eligible" "$LOG" | tail -120 >"$OUT/ncu_attn.txt"
fi
if want attn; then  # decode attention at depth: q heads per block and split counts, new against the baseline
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    step attn_tests 200 $N/hybrid-tests "CUDA*attention*"
    grep -E "test cases|FAILED" "$LOG" | tail -2 >>"$SUM"
    for i in 1 2; do
        for v in "base" "new" "new --attn-heads-per-block 4" "new --attn-splits 128"; do
            set -- $v
            bin=$([ $1 = base ] && echo $B || echo $N)
            shift
            [ -x $bin/hybrid-bench ] || continue
            step "attn_d16k_${v// /_}_$i" 200 $bin/hybrid-bench -m $M $DW --device cuda --depth 16384 -p 16 -n 256 -r 2 "$@"
            say "  b=1 depth 16384 [$v]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        done
    done
    for bin in $N $B; do
        step "attn_d4k_$(basename $bin)" 200 $bin/hybrid-bench -m $M $DW --device cuda --depth 4096 -p 16 -n 256 -r 2
        say "  b=1 depth 4096 [$(basename $bin)]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        step "attn_d128k_$(basename $bin)" 300 $bin/hybrid-bench -m $M $DW --device cuda --depth 131072 -p 16 -n 64 -r 1
        say "  b=1 depth 131072 [$(basename $bin)]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        step "attn_b1_$(basename $bin)" 200 $bin/hybrid-bench -m $M $DW --device cuda -p 512 -n 256 -r 3
        say "  b=1 -p 512 [$(basename $bin)]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        step "attn_batch_$(basename $bin)" 200 $bin/hybrid-bench -m $M $DW --device cuda -p 128 -n 128 -b 8,64 -r 2
        grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  batch [$(basename $bin)]: /" >>"$SUM"
    done
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_attn_new 300 $NCU --kernel-name regex:"attn_(core|merge)" --launch-skip 40 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
        --section WarpStateStats $N/hybrid-bench -m $M $DW --device cuda --depth 16384 -p 16 -n 8 -r 1 --no-cuda-graphs
    grep -E "attn_|Duration|DRAM Throughput|L2 Hit|Registers Per|Achieved Occupancy|Eligible Warps|Grid Size" "$LOG" | \
        tail -24 >"$OUT/ncu_attn_new.txt"
fi
if want int_ab; then  # int4/int8 decode b=1 (and small batches): new (K split by shape), new without it, the baseline
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for i in 1 2; do
        for q in int4 int8; do
            for v in "new" "new --int-split-k never" "base"; do
                set -- $v
                bin=$([ $1 = base ] && echo $B || echo $N)
                shift
                [ -x $bin/hybrid-bench ] || continue
                step "int_ab_${q}_${v// /_}_$i" 150 $bin/hybrid-bench -m $M $DW --device cuda --quant $q -p 512 -n 256 -r 3 "$@"
                say "  decode b=1 [$q, $v]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
            done
        done
    done
    for bin in $N $B; do
        step "int_ab_batch_$(basename $bin)" 150 $bin/hybrid-bench -m $M $DW --device cuda --quant int4 -p 128 -n 64 -b 2,8 -r 2
        grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  batch int4 [$(basename $bin)]: /" >>"$SUM"
    done
fi
if want small_batch; then  # bf16 3-8 rows: the tensor-core GEMV's launch shapes, then batches of 4 and 8: new (every
    # matrix on the tensor-core GEMV), new with --small-batch-gemv groups, the baseline
    for t in 8 4; do
        step "kernel_bench_$t" 120 $N/hybrid-kernel-bench $t
        sed -n "/^==== kernel_bench_$t/,\$p" "$LOG" | grep -E "^\| [a-z]" | sed "s/^/  [T=$t] /" >>"$SUM"
    done
    M=/tmp/q4d DW=--dummy-weights
    mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
    for i in 1 2; do
        for v in "new" "new --small-batch-gemv groups" "base"; do
            set -- $v
            bin=$([ $1 = base ] && echo $B || echo $N)
            shift
            [ -x $bin/hybrid-bench ] || continue
            step "small_batch_${v// /_}_$i" 150 $bin/hybrid-bench -m $M $DW --device cuda -p 128 -n 128 -b 4,8 -r 2 "$@"
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  batch [$v]: /" >>"$SUM"
        done
    done
    step small_batch_big 200 $N/hybrid-bench -m $M $DW --device cuda -p 128 -n 64 -b 16,32,64,128,256 -r 1
    grep -E '^\| +[0-9]' "$LOG" | tail -5 | sed "s/^/  batch [new]: /" >>"$SUM"
    [ "${TRACE:-0}" = 1 ] && grep -q "rc=0" /tmp/bt.log && {
        step small_batch_trace 120 /tmp/bt/hybrid-bench -m $M $DW --device cuda -p 16 -n 32 -b 8 -r 1 \
            --cuda-trace /tmp/b8_trace.txt
        python3 tools/gpu/trace_summary.py /tmp/b8_trace.txt >"$OUT/b8_trace.txt" 2>&1
        head -40 "$OUT/b8_trace.txt" >>"$SUM"
    }
fi
say "total $(($(date +%s) - T0)) s"
echo "================ summary"
cat "$SUM"
