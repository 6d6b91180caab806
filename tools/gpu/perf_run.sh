#!/bin/bash
# One device run for the speed issues (6, 7), from the repository root on the GPU machine, with binaries built
# here and carried in gpu-bin/ (see DEVICE notes in README): GPU correctness first, then the speed figures.
#   1. hybrid-tests "[gpu]" and hybrid-compare on models/tiny (graphs + PDL, and with PDL off)
#   2. hybrid-kernel-bench: GEMV launch shapes vs cuBLASLt on the 4B projection shapes
#   3. a Qwen3.5-4B-shaped random checkpoint (tools/gpu/random_checkpoint.py), hybrid-bench on it: decode b=1,
#      PDL off, prefill 4096, batch sizes 1..128
#   4. Hugging Face transformers on the same folder (tools/gpu/hf_decode_baseline.py)
#   5. ncu per-kernel times of one decode step
#   6. optional stages: trace (per-kernel critical-path costs of a b=1 step, hybrid-bench --cuda-trace: binaries
#      built with -DHY_CUDA_TRACE=ON; TRACE_FLAGS="--no-pdl ..." for the trace, TRACE_BASE=1 also traces the
#      baseline binaries of gpu-bin/base.txz), ab (alternating decode b=1 pairs, AB="--no-pdl ..."), sweep (decode
#      b=1 under each of SWEEP="--no-pdl,--no-cuda-graphs --no-pdl - base"), sanitize (compute-sanitizer
#      memcheck/racecheck/synccheck), ncu64, ncu8 (b=64 / b=8 profiles), cli
# STAGES (default "all") limits the run: e.g. STAGES="tests bench" . Logs: $OUT/all.log, $OUT/summary.txt.
# Usage (device tool): bash tools/gpu/perf_run.sh   with carry [".carry", "gpu-bin"]; gpu-bin/bins.txz holds
# hybrid-tests, hybrid-bench, hybrid-compare, hybrid-kernel-bench and hybrid built here (see tools/gpu/pack_bins.sh).
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, say, step
STAGES=${STAGES:-all}
want() { [ "$STAGES" = all ] || [[ " $STAGES " == *" $1 "* ]]; }
last_table() { grep -E "^\| +[0-9]" "$LOG" | tail -"$1" >>"$SUM"; }
# ncu_profile NAME SKIP COUNT BENCH_ARGS...: per-kernel device time (kernels as graph nodes, serialized) of COUNT
# launches after SKIP of a hybrid-bench run on the 4B model; the per-kernel sums go to $OUT/NAME.txt and the summary.
ncu_profile() {
    local name=$1 skip=$2 count=$3
    shift 3
    step "$name" 150 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
        --launch-skip "$skip" --launch-count "$count" -o "/tmp/$name" $BIN/hybrid-bench -m $M --device cuda "$@"
    ncu --import "/tmp/$name.ncu-rep" --csv >"/tmp/$name.csv" 2>>"$LOG"
    python3 tools/gpu/ncu_summary.py "/tmp/$name.csv" >"$OUT/$name.txt" 2>&1
    head -18 "$OUT/$name.txt" >>"$SUM"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >>"$SUM" 2>&1
BIN=gpu-bin
# the carried binaries travel as one xz tarball (five static-ish binaries share most bytes; the carry limit is 64 MiB)
[ -f $BIN/bins.txz ] && tar -C $BIN -xJf $BIN/bins.txz
# optional baseline binaries (gpu-bin/base.txz, e.g. packed from the previous commit): the setting "base" of SWEEP
# and TRACE_BASE=1 run them in the same warm run as the new ones
[ -f $BIN/base.txz ] && mkdir -p $BIN/base && tar -C $BIN/base -xJf $BIN/base.txz
M=/tmp/q4b
if want tests; then
    step tests_gpu 150 $BIN/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -6 >>"$SUM"
    step compare_tiny 60 $BIN/hybrid-compare -m models/tiny --device cuda --near-tie 0.05
    grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step compare_tiny_nopdl 60 $BIN/hybrid-compare -m models/tiny --device cuda --near-tie 0.05 --no-pdl
    grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
fi
if want sanitize; then  # memcheck over every [gpu] test; racecheck (shared memory) over the mixer kernels' tests
    step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 99 $BIN/hybrid-tests "[gpu]"
    grep -E "ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 99 $BIN/hybrid-tests \
        "CUDA attention*,CUDA Gated DeltaNet*"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step synccheck 240 compute-sanitizer --tool synccheck --error-exitcode 99 $BIN/hybrid-tests \
        "CUDA Gated DeltaNet*"
    grep -E "ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
fi
if want kernels; then
    step kernel_bench 120 $BIN/hybrid-kernel-bench 1
    grep -E "^\| [a-z]" "$LOG" | tail -6 >>"$SUM"
    step kernel_bench8 120 $BIN/hybrid-kernel-bench 8
    grep -E "^\| [a-z]" "$LOG" | tail -6 >>"$SUM"
fi
if want bench || want ab || want sweep || want trace || want hf || want ncu || want ncu64 || want ncu8 || want cli; then
    [ -f $M/config.json ] || step fixture_4b 150 python3 tools/gpu/random_checkpoint.py --out $M  # kept while warm
fi
if want bench; then
    step bench_b1 90 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 256 -r 3 --json "$OUT/bench_b1.json"
    grep -E "^ready|^device memory" "$LOG" | tail -2 >>"$SUM"
    last_table 1
    step bench_b1_nopdl 60 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 128 -r 2 --no-pdl
    last_table 1
    step bench_prefill4096 90 $BIN/hybrid-bench -m $M --device cuda -p 4096 -n 8 -r 2 --ubatch 4096
    last_table 1
    step bench_batch 150 $BIN/hybrid-bench -m $M --device cuda -p 128 -n 128 -b 1,8,32,64,128 -r 2 \
        --json "$OUT/bench_batch.json"
    last_table 5
fi
if want ab; then  # alternating pairs of decode b=1 with and without the hybrid-bench flags in AB (default: PDL
    # off), each pair in one warm run: differences of a few percent beat the run-to-run noise
    AB=${AB:---no-pdl}
    for i in 1 2; do
        step "ab_default_$i" 60 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 128 -r 3
        say "ab default: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        step "ab_with_$i" 60 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 128 -r 3 $AB
        say "ab [$AB]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
    done
fi
if want sweep; then  # decode b=1 under each setting of SWEEP (space-separated; a setting is comma-separated
    # hybrid-bench flags, "-" for none, "base" for the baseline binaries), two rounds in turn in one warm run
    for i in 1 2; do
        for set in ${SWEEP:--}; do
            flags=()
            bin=$BIN
            if [ "$set" = base ]; then bin=$BIN/base; elif [ "$set" != - ]; then IFS=, read -r -a flags <<<"$set"; fi
            step "sweep_${i}_$set" 60 $bin/hybrid-bench -m $M --device cuda -p 512 -n 128 -r 3 "${flags[@]}"
            say "sweep [$set]: $(grep -E '^\| +[0-9]' "$LOG" | tail -1)"
        done
    done
fi
if want trace; then  # each kernel's cost on the critical path of the pipelined b=1 decode step (--cuda-trace, in
    # binaries built with -DHY_CUDA_TRACE=ON), with the hybrid-bench flags of TRACE_FLAGS (default none)
    step trace_b1 90 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 64 -r 1 --cuda-trace /tmp/trace_b1.txt ${TRACE_FLAGS:-}
    python3 tools/gpu/trace_summary.py /tmp/trace_b1.txt --steps 48 >"$OUT/trace_b1.txt" 2>&1
    head -24 "$OUT/trace_b1.txt" >>"$SUM"
    if [ "${TRACE_BASE:-0}" = 1 ]; then  # the same trace of the baseline binaries
        step trace_b1_base 90 $BIN/base/hybrid-bench -m $M --device cuda -p 512 -n 64 -r 1 \
            --cuda-trace /tmp/trace_b1_base.txt
        python3 tools/gpu/trace_summary.py /tmp/trace_b1_base.txt --steps 48 >"$OUT/trace_b1_base.txt" 2>&1
        head -24 "$OUT/trace_b1_base.txt" >>"$SUM"
    fi
fi
if want hf; then
    step hf_baseline 150 python3 tools/gpu/hf_decode_baseline.py --model $M --prompt 512 --new 32
    grep -E "^HF " "$LOG" | tail -1 >>"$SUM"
fi
want ncu && ncu_profile ncu_decode 700 300 -p 1 -n 6 -r 1  # about one b=1 decode step
# b=64 / b=8 decode steps, after 64 / 8 one-token prefills of about 240-330 launches each
want ncu64 && ncu_profile ncu_decode64 22000 700 -p 1 -n 40 -b 64 -r 1
want ncu8 && ncu_profile ncu_decode8 4000 600 -p 1 -n 40 -b 8 -r 1
if want cli; then  # the CLI's own decode rate on the 4B shapes (tiny tokenizer: ids below 4096 only)
    cp models/tiny/tokenizer.json models/tiny/tokenizer_config.json $M/ 2>/dev/null
    step cli_4b 90 $BIN/hybrid -m $M --device cuda -p "def main():" -n 256 --temp 0 --verbose
    grep -iE "tok/s|tokens per second" "$LOG" | tail -2 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
echo "================ summary"
cat "$SUM"
