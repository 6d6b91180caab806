#!/bin/bash
# hybrid-server load figures on the GPU with Qwen3.5-4B shapes (tools/gpu/config_4b.json, random weights made on the
# device: --dummy-weights) and the Qwen3 tokenizer of tests/data: aggregate tok/s and time to first token at 1, 4, 8,
# 16 and 64 concurrent clients (512-token prompts, 128 new tokens), then a multi-turn chat's per-turn latency with the
# conversation-state cache off and on (hybrid-server-bench).
# Usage (device tool): bash tools/gpu/server_run.sh  with carry ["gpu-bin"]; gpu-bin/server.txz comes from
# tools/gpu/pack_server.sh. Logs: $OUT/all.log, $OUT/server.log, $OUT/summary.txt.
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, say, step
BIN=/tmp/server-bin
mkdir -p $BIN && tar -C $BIN -xJf gpu-bin/server.txz
export LD_LIBRARY_PATH=$BIN/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
M=/tmp/q4b-dummy
mkdir -p $M
cp tools/gpu/config_4b.json $M/config.json
cp tests/data/tokenizers/qwen3/tokenizer.json tests/data/tokenizers/qwen3/tokenizer_config.json $M/
NP=${NP:-64}
$BIN/hybrid-server -m $M --dummy-weights --device cuda -np $NP -c 4096 -b 2048 --port 0 --cache-mb 4096 \
    >"$OUT/server.log" 2>&1 &
SRV=$!
for i in $(seq 1 300); do grep -q "listening on" "$OUT/server.log" && break; sleep 0.5; done
PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/server.log" | grep -o '[0-9]*$')
cat "$OUT/server.log" >>"$SUM"
if [ -n "$PORT" ]; then
    step warmup 120 $BIN/hybrid-server-bench --port $PORT -c 8 -p 64 -n 16
    step load 240 $BIN/hybrid-server-bench --port $PORT -c ${CLIENTS:-1,4,8,16,64} -p 512 -n 128
    grep -E "^\|" "$LOG" | tail -7 >>"$SUM"
    step turns 240 $BIN/hybrid-server-bench --port $PORT --turns 8 -n 64 --turn-text 150
    grep -E "^\|" "$LOG" | tail -10 >>"$SUM"
    curl -s localhost:$PORT/metrics | grep -v "^#" >>"$SUM" 2>/dev/null || true
fi
kill $SRV
wait $SRV
say "total $(($(date +%s) - T0)) s"
cp "$SUM" /tmp/server_summary.txt  # (a later command on the still-warm machine can read it)
echo "================ summary"
cat "$SUM"
