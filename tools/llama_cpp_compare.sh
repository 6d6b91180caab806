#!/bin/bash
# CPU comparison with llama.cpp on models/tiny (issue 21): hybrid-bench --quant int8/int4/none against llama-bench
# on GGUF conversions of the same checkpoint (q8_0, q4_k_m, bf16), at 2 and 1 threads, in interleaved rounds.
#
# Needs network access to PyPI on the first run (llama.cpp's source comes from the llama-cpp-python sdist, which
# vendors it; the converter needs torch, numpy, transformers, safetensors and llama.cpp's gguf-py: several GB, as
# PyPI's torch wheel brings CUDA libraries) and hybrid-bench built (HYBRID_BENCH, default build/hybrid-bench, else
# build-cpu/hybrid-bench). Not part of the build or the tests.
# Usage: bash tools/llama_cpp_compare.sh [WORKDIR (default /tmp/lcpp)] [ROUNDS (5)]
# Prints one line per configuration and round: prefill 512 and decode 128 tok/s (llama-bench's avg_ts,
# hybrid-bench's medians of 3), and the load average, since a loaded machine distorts llama.cpp's spinning threads
# the most. BENCHMARKS.md "CPU: int8/int4 against llama.cpp" holds the figures.
set -euo pipefail
W=${1:-/tmp/lcpp}
ROUNDS=${2:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
H=${HYBRID_BENCH:-$ROOT/build/hybrid-bench}
[ -x "$H" ] || H=$ROOT/build-cpu/hybrid-bench
[ -x "$H" ] || { echo "llama_cpp_compare.sh: no hybrid-bench in build/ or build-cpu/ (build it, or set HYBRID_BENCH)" >&2; exit 1; }
VER=0.3.36
mkdir -p "$W"
cd "$W"
if [ ! -x venv/bin/python ]; then
    python3 -m venv venv
    venv/bin/pip install -q torch numpy transformers safetensors sentencepiece protobuf
fi
if [ ! -d llama_cpp_python-$VER ]; then
    venv/bin/pip download -q --no-binary :all: --no-deps llama-cpp-python==$VER -d .
    tar xzf llama_cpp_python-$VER.tar.gz
fi
LC=$W/llama_cpp_python-$VER/vendor/llama.cpp
venv/bin/python -c "import gguf" 2>/dev/null || venv/bin/pip install -q "$LC/gguf-py"
if [ ! -x "$LC/build/bin/llama-bench" ]; then
    cmake -S "$LC" -B "$LC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
    cmake --build "$LC/build" -j"$(nproc)" --target llama-bench llama-quantize >/dev/null
fi
# The converter, with its pre-tokenizer check answered "qwen35": models/tiny's trained tokenizer has no hash it
# knows, and the speed does not depend on it. The multi-token-prediction head is left out (--no-mtp).
cat >convert_tiny.py <<'PY'
import runpy, sys
sys.path.insert(0, ".")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
PY
for t in q8_0 bf16; do
    [ -f tiny-$t.gguf ] || (cd "$LC" && "$W/venv/bin/python" "$W/convert_tiny.py" "$ROOT/models/tiny" --no-mtp \
        --outtype $t --outfile "$W/tiny-$t.gguf" >"$W/convert-$t.log" 2>&1) ||
        { echo "llama_cpp_compare.sh: the GGUF conversion failed; see $W/convert-$t.log" >&2; exit 1; }
done
[ -f tiny-q4_k_m.gguf ] || "$LC/build/bin/llama-quantize" tiny-bf16.gguf tiny-q4_k_m.gguf Q4_K_M >"$W/quantize.log" 2>&1 ||
    { echo "llama_cpp_compare.sh: llama-quantize failed; see $W/quantize.log" >&2; exit 1; }
L=$LC/build/bin/llama-bench
cd "$ROOT"
for round in $(seq "$ROUNDS"); do
    for t in 2 1; do
        for g in q8_0 bf16 q4_k_m; do
            echo "R$round t$t llama $g: $($L -m "$W/tiny-$g.gguf" -p 512 -n 128 -t $t -r 3 -o csv 2>/dev/null |
                tail -2 | awk -F, '{gsub(/"/, "", $(NF-1)); printf "%s ", $(NF-1)}')load $(cut -d' ' -f1 /proc/loadavg)"
        done
        # (int8+lm_head: --quant-lm-head, as llama.cpp's q8_0 quantizes the output matrix too)
        for q in int8 int8+lm_head none int4; do
            flags="--quant ${q%+lm_head}"
            [ "$q" = "${q%+lm_head}" ] || flags="$flags --quant-lm-head"
            echo "R$round t$t hybrid $q: $($H -m models/tiny -p 512 -n 128 -r 3 --device cpu -t $t $flags 2>/dev/null |
                grep -E '^\| +[0-9]' | awk -F'|' '{printf "%s %s ", $6, $7}')load $(cut -d' ' -f1 /proc/loadavg)"
        done
    done
done
