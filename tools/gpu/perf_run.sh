#!/bin/bash
# One device run for the speed issues (6, 7), from the repository root on the GPU machine, with binaries built
# here and carried in gpu-bin/ (see DEVICE notes in README): GPU correctness first, then the speed figures.
#   1. hybrid-tests "[gpu]" and hybrid-compare on models/tiny (graphs + PDL, and with PDL off)
#   2. hybrid-kernel-bench: GEMV launch shapes vs cuBLASLt on the 4B projection shapes
#   3. a Qwen3.5-4B-shaped random checkpoint (tools/gpu/random_checkpoint.py), hybrid-bench on it: decode b=1,
#      PDL off, prefill 4096, batch sizes 1..128
#   4. Hugging Face transformers on the same folder (tools/gpu/hf_decode_baseline.py)
#   5. ncu per-kernel times of one decode step
#   6. optional stages: sanitize (compute-sanitizer memcheck/racecheck), ncu64, ncu8 (b=64 / b=8 profiles), cli
# STAGES (default "all") limits the run: e.g. STAGES="tests bench" . Logs: $OUT/all.log, $OUT/summary.txt.
# Usage (device tool): bash tools/gpu/perf_run.sh   with carry [".carry", "gpu-bin"]; gpu-bin/bins.txz holds
# hybrid-tests, hybrid-bench, hybrid-compare, hybrid-kernel-bench and hybrid built here (see tools/gpu/pack_bins.sh).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/all.log
SUM=$OUT/summary.txt
: >"$LOG"
: >"$SUM"
T0=$(date +%s)
STAGES=${STAGES:-all}
want() { [ "$STAGES" = all ] || [[ " $STAGES " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$SUM"; }
step() {  # step NAME TIMEOUT_S CMD...
    local name=$1 limit=$2
    shift 2
    local t=$(date +%s)
    echo "==== $name: $*" >>"$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "$(printf '%-24s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - t))")"
    return $rc
}
last_table() { grep -E "^\| +[0-9]" "$LOG" | tail -"$1" >>"$SUM"; }
export PYTHONUNBUFFERED=1
[ -d /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader >>"$SUM" 2>&1
BIN=gpu-bin
# the carried binaries travel as one xz tarball (five static-ish binaries share most bytes; the carry limit is 64 MiB)
[ -f $BIN/bins.txz ] && tar -C $BIN -xJf $BIN/bins.txz
M=/tmp/q4b
if want tests; then
    step tests_gpu 150 $BIN/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED|rel err" "$LOG" | tail -6 >>"$SUM"
    step compare_tiny 60 $BIN/hybrid-compare -m models/tiny --device cuda --near-tie 0.05
    grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step compare_tiny_nopdl 60 env HY_CUDA_PDL=0 $BIN/hybrid-compare -m models/tiny --device cuda --near-tie 0.05
    grep -E "SUMMARY" "$LOG" | tail -1 >>"$SUM"
fi
if want sanitize; then  # memcheck over every [gpu] test; racecheck (shared memory) over the mixer kernels' tests
    step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 99 $BIN/hybrid-tests "[gpu]"
    grep -E "ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
    step racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 99 $BIN/hybrid-tests \
        "CUDA attention*,CUDA Gated DeltaNet*"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$LOG" | tail -1 >>"$SUM"
fi
if want kernels; then
    step kernel_bench 120 $BIN/hybrid-kernel-bench 1
    grep -E "^\| [a-z]" "$LOG" | tail -6 >>"$SUM"
    step kernel_bench8 120 $BIN/hybrid-kernel-bench 8
    grep -E "^\| [a-z]" "$LOG" | tail -6 >>"$SUM"
fi
if want bench || want hf || want ncu || want ncu64 || want ncu8 || want cli; then
    step fixture_4b 150 python3 tools/gpu/random_checkpoint.py --out $M
fi
if want bench; then
    step bench_b1 90 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 256 -r 3 --json "$OUT/bench_b1.json"
    grep -E "^ready|^device memory" "$LOG" | tail -2 >>"$SUM"
    last_table 1
    step bench_b1_nopdl 60 env HY_CUDA_PDL=0 $BIN/hybrid-bench -m $M --device cuda -p 512 -n 128 -r 2
    last_table 1
    step bench_prefill4096 90 $BIN/hybrid-bench -m $M --device cuda -p 4096 -n 8 -r 2 --ubatch 4096
    last_table 1
    step bench_batch 150 $BIN/hybrid-bench -m $M --device cuda -p 128 -n 128 -b 1,8,32,64,128 -r 2 \
        --json "$OUT/bench_batch.json"
    last_table 5
fi
if want hf; then
    step hf_baseline 150 python3 tools/gpu/hf_decode_baseline.py --model $M --prompt 512 --new 32
    grep -E "^HF " "$LOG" | tail -1 >>"$SUM"
fi
if want ncu; then
    step ncu_decode 150 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
        --launch-skip 700 --launch-count 300 -o /tmp/ncu_decode $BIN/hybrid-bench -m $M --device cuda -p 1 -n 6 -r 1
    ncu --import /tmp/ncu_decode.ncu-rep --csv >/tmp/ncu.csv 2>>"$LOG"
    python3 tools/gpu/ncu_summary.py /tmp/ncu.csv >"$OUT/ncu_decode.txt" 2>&1
    head -18 "$OUT/ncu_decode.txt" >>"$SUM"
fi
if want ncu64; then  # b=64 decode steps (after 64 one-token prefills of about 240-330 launches each)
    step ncu_decode64 150 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
        --launch-skip 22000 --launch-count 700 -o /tmp/ncu_decode64 $BIN/hybrid-bench -m $M --device cuda -p 1 -n 40 \
        -b 64 -r 1
    ncu --import /tmp/ncu_decode64.ncu-rep --csv >/tmp/ncu64.csv 2>>"$LOG"
    python3 tools/gpu/ncu_summary.py /tmp/ncu64.csv >"$OUT/ncu_decode64.txt" 2>&1
    head -18 "$OUT/ncu_decode64.txt" >>"$SUM"
fi
if want ncu8; then  # b=8 decode steps (after 8 one-token prefills)
    step ncu_decode8 150 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
        --launch-skip 4000 --launch-count 600 -o /tmp/ncu_decode8 $BIN/hybrid-bench -m $M --device cuda -p 1 -n 40 \
        -b 8 -r 1
    ncu --import /tmp/ncu_decode8.ncu-rep --csv >/tmp/ncu8.csv 2>>"$LOG"
    python3 tools/gpu/ncu_summary.py /tmp/ncu8.csv >"$OUT/ncu_decode8.txt" 2>&1
    head -18 "$OUT/ncu_decode8.txt" >>"$SUM"
fi
if want cli; then  # the CLI's own decode rate on the 4B shapes (tiny tokenizer: ids below 4096 only)
    cp models/tiny/tokenizer.json models/tiny/tokenizer_config.json $M/ 2>/dev/null
    step cli_4b 90 $BIN/hybrid -m $M --device cuda -p "def main():" -n 256 --temp 0 --verbose
    grep -iE "tok/s|tokens per second" "$LOG" | tail -2 >>"$SUM"
fi
say "total $(($(date +%s) - T0)) s"
echo "================ summary"
cat "$SUM"
