#!/bin/bash
# Builds the GPU binaries here (sm_90a, static PCRE2/utf8proc, as ../shared/docs/DEVICE.md advises) and packs them
# stripped into gpu-bin/bins.txz for the device tool's carry (tools/gpu/perf_run.sh unpacks them there).
# Usage: bash tools/gpu/pack_bins.sh [build-dir]
set -eu
B=${1:-build-gpu-carry2}
[ -f $B/CMakeCache.txt ] || cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DHY_NATIVE=OFF \
    -DHY_PCRE2_LIB=/usr/lib/x86_64-linux-gnu/libpcre2-8.a -DHY_UTF8PROC_LIB=/usr/lib/x86_64-linux-gnu/libutf8proc.a
cmake --build $B -j2 --target hybrid-tests hybrid-bench hybrid-compare hybrid-kernel-bench hybrid
T=$(mktemp -d)
for b in hybrid-tests hybrid-bench hybrid-compare hybrid-kernel-bench hybrid; do strip -o $T/$b $B/$b; done
mkdir -p gpu-bin
tar -C $T -cf - . | xz -9e -T2 >gpu-bin/bins.txz
rm -rf "$T"
ls -la gpu-bin/bins.txz
