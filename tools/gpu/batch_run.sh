#!/bin/bash
# One device run for batched generation (issue 7) and a re-check of the [gpu] tests at HEAD, from the repository
# root on the GPU machine, with carried binaries in gpu-bin/ (built here: -DHY_NATIVE=OFF, sm_90a, stripped):
#   1. hybrid-tests "[gpu]" (every CUDA op vs the CPU reference; continuous batching vs solo runs on the GPU)
#   2. hybrid-compare -m models/tiny --device cuda (committed goldens)
#   3. hybrid --batch-file on the GPU (JSONL)
#   4. a Qwen3.5-4B-shaped random model (make_fixture.py --preset 4b --no-golden) and
#      hybrid-bench -b 1,8,32,64,128 -p 128 -n 128 (the peer's setting: llama.cpp 229 / 1,160 / 2,556 / 3,213 tok/s
#      at b = 1 / 8 / 32 / 64)
# Usage: bash ../shared/tools/device_prep.sh --no-fixtures; device run `bash tools/gpu/batch_run.sh` with
# carry [".carry", "gpu-bin"].
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=gpu-bin
export PYTHONUNBUFFERED=1
[ -d /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }  # the tests name the source dir of the build
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/summary.txt"
t() { echo "== $1 ($(date +%T))" | tee -a "$OUT/summary.txt"; }
t tests_gpu
timeout 180 $BIN/hybrid-tests "[gpu]" 2>&1 | tee "$OUT/tests.log" | grep -E "gpu batch|passed|failed|FAILED" | tee -a "$OUT/summary.txt"
t compare_tiny
timeout 60 $BIN/hybrid-compare -m models/tiny --device cuda --near-tie 0.05 2>&1 | tee "$OUT/compare.log" | tail -9 | tee -a "$OUT/summary.txt"
t batch_file
printf 'def main():\\n    \nclass Foo:\nimport os\nfor i in range(10):\\n    \n' > /tmp/prompts.txt
timeout 60 $BIN/hybrid -m models/tiny --device cuda --batch-file /tmp/prompts.txt -np 4 -n 32 --temp 0 --verbose \
    > "$OUT/batch.jsonl" 2>> "$OUT/summary.txt"
echo "batch-file rc=$? lines=$(wc -l < "$OUT/batch.jsonl")" | tee -a "$OUT/summary.txt"
t fixture_4b
timeout 240 python3 .carry/tools/make_fixture.py --preset 4b --out /tmp/q4b --ssm-fp32 --no-golden > "$OUT/fixture.log" 2>&1
echo "fixture rc=$?" | tee -a "$OUT/summary.txt"
t bench_4b
timeout 240 $BIN/hybrid-bench -m /tmp/q4b --device cuda -p 128 -n 128 -b 1,8,32,64,128 -r 2 --json "$OUT/bench.json" 2>&1 \
    | tee "$OUT/bench.log" | tee -a "$OUT/summary.txt"
t done
