#!/bin/bash
# Builds hybrid-server and hybrid-server-bench here for the GPU (sm_90a, static PCRE2/utf8proc, as pack_bins.sh) and
# packs them stripped, with the shared libraries cpp-httplib brings (the device machine starts bare), into
# gpu-bin/server.txz for the device tool's carry (tools/gpu/server_run.sh unpacks them there).
# Usage: bash tools/gpu/pack_server.sh [build-dir]
set -eu
B=${1:-build-gpu}
[ -f $B/CMakeCache.txt ] || cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DHY_NATIVE=OFF \
    -DHY_PCRE2_LIB=/usr/lib/x86_64-linux-gnu/libpcre2-8.a -DHY_UTF8PROC_LIB=/usr/lib/x86_64-linux-gnu/libutf8proc.a
cmake --build $B -j2 --target hybrid-server hybrid-server-bench
T=$(mktemp -d)
mkdir -p $T/lib
for b in hybrid-server hybrid-server-bench; do strip -o $T/$b $B/$b; done
for l in $(ldd $B/hybrid-server | awk '/httplib|ssl|crypto|brotli|libz\./ {print $3}'); do cp -L "$l" $T/lib/; done
mkdir -p gpu-bin
tar -C $T -cf - . | xz -9e -T2 >gpu-bin/server.txz
rm -rf "$T"
ls -la gpu-bin/server.txz
