#!/bin/bash
# Device calls for the batched-decode work written without a device in the twenty-eighth session: the wgmma GEMM
# (9-128 rows, CudaOptions::wgmma_gemm) and the streamed Gated DeltaNet decode (CudaOptions::gdn_decode_stream),
# each against what runs by default in the same binary, most important first:
#   build -> (tests) the wgmma and Gated DeltaNet decode [gpu] cases -> (kbench) hybrid-kernel-bench at 16, 32, 64
#   and 128 rows (GB/s per K split) -> (bench) 4B batches 16-128 with --wgmma-gemm off and on in alternation (2
#   rounds) -> (gdn) b=64/128/256 with --gdn-decode-stream off and on (2 rounds) -> (both) both on against both off
#   -> (moe) 35B-A3B shapes b=16/64, both off and on -> (mixed) b=12/16 with --small-batch-gemv auto and mixed
#   -> (gpu_tests) every [gpu] case -> (memcheck) compute-sanitizer memcheck and racecheck on the new cases ->
#   (prefill) prefill 4096 with the conv's new rows a thread against one (--gdn-conv-rows 1) -> (conv_ncu) Nsight
#   Compute on the Gated DeltaNet conv and recurrence kernels of a 4096-token prefill -> (compare) hybrid-compare on
#   CUDA over the repository's models -> (shaped) b=12-64 with --wgmma-gemm auto (by shape) and uniform (every matrix
#   of 17-64 rows, 9-16 in clusters) in alternation, and the wgmma [gpu] case -> (gdn3) the Gated DeltaNet decode
#   case, then b=32-256 with --gdn-decode-blocks 2 (the default) and 3 in alternation -> (ncu_step) each kernel's
#   time in about two decode steps at b=64 and 256 (TRACE_BATCHES) under ncu -> (attn_pack) the prefill-attention
#   heads-per-block case, then prefill 16384 and 4096 with --attn-prefill-heads 1 and 4 in alternation ->
#   (attn_ncu) ncu of the flash kernel at 16384 positions with 1 and 4 heads a block -> (base_ab) hybrid-bench of
#   this tree against a base tree (BASE_PATCH, default base.patch: a diff that patch -R undoes) in alternation.
# Usage (device tool, repository root, carry [".carry"]): bash tools/gpu/batch_ab.sh   (ONLY="a b": those stages;
# PARTS=N adds hybrid-bench runs with --wgmma-parts N). A device call has 10 minutes and each call builds anew
# (about 2 minutes), so run it in parts, most important first: ONLY="tests kbench", then ONLY="bench gdn", then
# ONLY="both moe mixed", then ONLY="prefill conv_ncu gpu_tests memcheck". MODES: the --wgmma-gemm values of bench.
set -u
. tools/gpu/run_lib.sh  # OUT, LOG, SUM, T0, DEPS, CFG, say, step, want
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
N=/tmp/bn
step build 400 bash -c "cmake -S . -B $N ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $N -j16 --target hybrid-tests hybrid-bench hybrid-kernel-bench hybrid-compare >>/tmp/bn.log 2>&1" ||
    { tail -40 /tmp/bn.log | tee -a "$SUM"; exit 1; }
M=/tmp/q4b
mkdir -p $M && cp tools/gpu/config_4b.json $M/config.json
CASE="CUDA wgmma GEMM*"
GDN_CASE="CUDA Gated DeltaNet decode with the conv inside*"
if want tests; then
    step tests_wgmma 300 $N/hybrid-tests "$CASE"
    grep -E "test cases|FAILED|rel err|with expansion|skipped|wgmma_gemm_parts|K=" "$LOG" | tail -16 >>"$SUM"
    step tests_gdn_stream 200 $N/hybrid-tests "$GDN_CASE"
    grep -E "test case|FAILED|differ|with expansion" "$LOG" | tail -8 >>"$SUM"
fi
if want kbench; then
    for T in 16 32 64 128; do
        step "kbench_$T" 200 $N/hybrid-kernel-bench $T
        sed -n '/^| shape/,$p' "$LOG" | grep -E "^\| [a-z]" | tail -7 >"$OUT/kbench_$T.txt"
        cut -c1-200 "$OUT/kbench_$T.txt" >>"$SUM"
    done
fi
if want bench; then
    NB=$(echo "${BATCHES:-16,32,64,128}" | tr ',' '\n' | wc -l)
    for i in 1 2; do
        for g in ${MODES:-off auto on}; do
            step "bench_${g}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-16,32,64,128} -r 1 --wgmma-gemm $g
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [$g $i] /" >>"$SUM"
        done
        if [ -n "${PARTS:-}" ]; then
            step "bench_parts${PARTS}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-16,32,64,128} -r 1 --wgmma-gemm on --wgmma-parts "$PARTS"
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [parts $PARTS $i] /" >>"$SUM"
        fi
    done
fi
if want gdn; then  # the streamed Gated DeltaNet decode, 2 rounds
    for i in 1 2; do
        for v in off on; do
            step "gdn_${v}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 -b 64,128,256 -r 1 \
                --gdn-decode-stream $v
            grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [gdn $v $i] /" >>"$SUM"
        done
    done
fi
if want both; then  # both new paths on against both off, 2 rounds
    for i in 1 2; do
        for v in off on; do
            step "both_${v}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b 16,32,64,128,256 -r 1 --gdn-decode-stream $v --wgmma-gemm $v
            grep -E '^\| +[0-9]' "$LOG" | tail -5 | sed "s/^/  [both $v $i] /" >>"$SUM"
        done
    done
fi
if want moe; then  # issue 19's b=64 (35B-A3B shapes): its dense projections and GDN layers take both new paths
    mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    for i in 1 2; do
        for v in off on; do
            step "moe_${v}_$i" 300 $N/hybrid-bench -m /tmp/q35 --dummy-weights --device cuda -p 16 -n 32 -b 16,32,64 \
                -r 1 --wgmma-gemm $([ $v = on ] && echo auto || echo off)
            grep -E '^\| +[0-9]' "$LOG" | tail -3 | sed "s/^/  [moe $v $i] /" >>"$SUM"
        done
    done
fi
if want mixed; then  # the 9-16-row routings still unmeasured (--small-batch-gemv mixed, c717797), 2 rounds
    for i in 1 2; do
        for m in auto mixed; do
            step "mixed_${m}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 -b 12,16 -r 1 \
                --small-batch-gemv $m
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [$m $i] /" >>"$SUM"
        done
    done
fi
if want gpu_tests; then
    step tests_gpu 400 $N/hybrid-tests "[gpu]"
    grep -E "test cases|FAILED" "$LOG" | tail -4 >>"$SUM"
fi
if want memcheck_cases; then  # compute-sanitizer memcheck and racecheck on MC_CASES (Catch2 names, ';' between)
    IFS=';' read -ra MCS <<<"${MC_CASES:-$CASE}"
    for c in "${MCS[@]}"; do
        step memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "$c"
        grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
        step racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 99 $N/hybrid-tests "$c"
        grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    done
fi
if want memcheck; then
    step memcheck_wgmma 300 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "$CASE"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step racecheck_wgmma 300 compute-sanitizer --tool racecheck --error-exitcode 99 $N/hybrid-tests "$CASE"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step memcheck_gdn 300 compute-sanitizer --tool memcheck --error-exitcode 99 $N/hybrid-tests "$GDN_CASE"
    grep -E "ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
    step racecheck_gdn 300 compute-sanitizer --tool racecheck --error-exitcode 99 $N/hybrid-tests "$GDN_CASE"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$LOG" | tail -2 >>"$SUM"
fi
if want prefill; then  # the conv's rows a thread (the new default against 1, the old form), 2 rounds
    for i in 1 2; do
        for r in 1 0; do
            step "prefill_rows${r}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 4096 -n 8 -r 2 \
                --ubatch 4096 --gdn-conv-rows $r
            grep -E '^\| +[0-9]' "$LOG" | tail -1 | sed "s/^/  [conv rows $r $i] /" >>"$SUM"
        done
    done
fi
if want attn_pack; then  # prefill attention with 4 q heads a flash block (the default) against 1, 2 rounds
    step tests_attn_pack 300 $N/hybrid-tests "CUDA prefill attention: q heads per block*"
    grep -E "test case|FAILED|differ|with expansion" "$LOG" | tail -8 >>"$SUM"
    for i in 1 2; do
        for hb in 1 4; do
            step "attn_pack_${hb}_16k_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 16384 -n 4 -r 1 \
                --ubatch 4096 --attn-prefill-heads $hb
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [prefill heads $hb, 16384, $i] /" >>"$SUM"
            step "attn_pack_${hb}_4k_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 4096 -n 8 -r 2 \
                --ubatch 4096 --attn-prefill-heads $hb
            grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [prefill heads $hb, 4096, $i] /" >>"$SUM"
        done
    done
fi
if want attn_ncu; then  # the flash kernel at the last 4096-row chunk of a 16384-token prompt, 1 and 4 heads a block
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for hb in 1 4; do
        step ncu_attn_$hb 300 $NCU --kernel-name regex:"attn_flash_kernel" --launch-skip 31 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section ComputeWorkloadAnalysis $N/hybrid-bench -m $M --dummy-weights --device cuda -p 16384 -n 1 -r 1 \
            --ubatch 4096 --no-cuda-graphs --attn-prefill-heads $hb
        sed -n "/^==== ncu_attn_$hb:/,\$p" "$LOG" >"$OUT/ncu_attn_$hb.txt"
        grep -E "attn_flash|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Achieved Occupancy|No Eligible|Issue Slots|Tensor" "$OUT/ncu_attn_$hb.txt" |
            tail -14 | sed "s/^/  [heads $hb] /" >>"$SUM"
    done
fi
if want shaped; then  # the wgmma GEMM by shape (auto, the default) against every matrix up to 64 rows (uniform)
    NB=$(echo "${BATCHES:-12,16,24,32,48,64}" | tr ',' '\n' | wc -l)
    for i in 1 2; do
        for g in uniform auto; do
            step "shaped_${g}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-12,16,24,32,48,64} -r 1 --wgmma-gemm $g
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [$g $i] /" >>"$SUM"
        done
    done
    step tests_wgmma_shaped 300 $N/hybrid-tests "$CASE"
    grep -E "test cases|FAILED|with expansion" "$LOG" | tail -6 >>"$SUM"
fi
if want conv_ncu; then  # prefill 4096: the run 126 trace gave the conv 615 us a layer (about 40 expected): measure it
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step ncu_conv 240 $NCU --kernel-name regex:"conv_kernel|prefill_kernel" --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        $N/hybrid-bench -m $M --dummy-weights --device cuda -p 4096 -n 1 -r 1 --ubatch 4096 --no-cuda-graphs
    sed -n '/^==== ncu_conv:/,$p' "$LOG" >"$OUT/ncu_conv_full.txt"
    grep -E "conv_kernel|prefill_kernel|Duration|DRAM Throughput|Memory Throughput|Grid Size|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Shared" "$LOG" |
        tail -40 | tee "$OUT/ncu_conv.txt" >>"$SUM"
fi
if want gdn3; then  # the Gated DeltaNet decode with three blocks an SM against two (the default), 2 rounds
    NB=$(echo "${BATCHES:-32,64,128,256}" | tr ',' '\n' | wc -l)
    step tests_gdn3 200 $N/hybrid-tests "$GDN_CASE"
    grep -E "test case|FAILED|differ|with expansion" "$LOG" | tail -8 >>"$SUM"
    for i in 1 2; do
        for v in 2 3; do
            step "gdn3_${v}_$i" 300 $N/hybrid-bench -m $M --dummy-weights --device cuda -p 128 -n 64 \
                -b ${BATCHES:-32,64,128,256} -r 1 --gdn-decode-blocks $v
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [gdn blocks $v $i] /" >>"$SUM"
        done
    done
fi
if want gdn_ncu; then  # the Gated DeltaNet decode kernel at b=256 (59% of the step in run 126): what bounds it,
    # with three blocks an SM (the staged kernel) and two (GDN_NCU_BLOCKS)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for v in ${GDN_NCU_BLOCKS:-3}; do
        step ncu_gdn_$v 300 $NCU --kernel-name regex:"decode_(staged_)?kernel" --launch-skip 48 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
            --section MemoryWorkloadAnalysis --section LaunchStats \
            $N/hybrid-bench -m $M --dummy-weights --device cuda -p 16 -n 4 -b 256 -r 1 --no-cuda-graphs \
            --gdn-decode-blocks $v
        sed -n "/^==== ncu_gdn_$v:/,\$p" "$LOG" >"$OUT/ncu_gdn_$v.txt"
        grep -E "decode_(staged_)?kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|Registers Per|Block Limit (Reg|Sha)|dram__bytes|L2.*Hit|Local" "$OUT/ncu_gdn_$v.txt" |
            tail -24 | sed "s/^/  [blocks $v] /" >>"$SUM"
    done
    CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    $CUOBJ -sass $N/CMakeFiles/hybrid_core.dir/kernels/cuda/gated_delta_net.cu.o >"$OUT/gdn_sass.txt" 2>&1
    awk '/Function : .*decode_staged_kernelILi128/{f=1} /Function : /&&!/decode_staged_kernelILi128/{f=0} f' \
        "$OUT/gdn_sass.txt" >"$OUT/gdn_staged128_sass.txt"
    say "staged kernel SASS: $(wc -l <"$OUT/gdn_staged128_sass.txt") lines, $(grep -c 'STL' "$OUT/gdn_staged128_sass.txt") STL, $(grep -c 'LDL' "$OUT/gdn_staged128_sass.txt") LDL"
    rm -f "$OUT/gdn_sass.txt"
fi
if want base_ab; then  # this tree against a base: the tree with BASE_PATCH (a diff of this tree's change) reversed,
    # built beside it; hybrid-bench b=BATCHES on both in alternation, 2 rounds
    B=/tmp/bbase
    rm -rf /tmp/basetree && mkdir -p /tmp/basetree && tar --exclude=./.carry --exclude=./.git -cf - . | tar -xf - -C /tmp/basetree &&
        ln -s "$PWD/.carry" /tmp/basetree/.carry
    step patch_base 30 bash -c "cd /tmp/basetree && patch -R -p1 <'$PWD/${BASE_PATCH:-base.patch}'" &&
        step build_base 400 bash -c "cmake -S /tmp/basetree -B $B ${CFG[*]} >/tmp/bbase.log 2>&1 && cmake --build $B -j16 --target hybrid-bench >>/tmp/bbase.log 2>&1" ||
        tail -20 /tmp/bbase.log >>"$SUM"
    # (AB_MODEL=35b: the 35B-A3B shapes at -p 16 -n 32; AB_PREFILL=1: also prefill 4096 in one chunk)
    NB=$(echo "${BATCHES:-64,256}" | tr ',' '\n' | wc -l)
    AM=$M
    AP="-p 128 -n 64"
    [ "${AB_MODEL:-4b}" = 35b ] && AM=/tmp/q35 && AP="-p 16 -n 32" && mkdir -p /tmp/q35 &&
        cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    for i in 1 2; do
        for v in base new; do
            BIN=$N/hybrid-bench
            [ $v = base ] && BIN=$B/hybrid-bench
            step "base_ab_${v}_$i" 300 $BIN -m $AM --dummy-weights --device cuda $AP -b ${BATCHES:-64,256} -r 1
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [$v $i] /" >>"$SUM"
            if [ -n "${AB_PREFILL:-}" ]; then
                step "base_ab_prefill_${v}_$i" 300 $BIN -m $AM --dummy-weights --device cuda -p 4096 -n 8 \
                    --ubatch 4096 -r 1
                grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [prefill $v $i] /" >>"$SUM"
            fi
        done
    done
fi
if want variants; then  # builds of hybrid-bench with VARIANT_FILE edited by sed (VARIANTS="name:sed script|..."),
    # then each and the tree as it is (cur) in alternation, 2 rounds: b=BATCHES with BENCH_FLAGS on AB_MODEL (4b or
    # 35b), and with AB_PREFILL prefill 4096 in one chunk
    F=${VARIANT_FILE:-kernels/cuda/moe.cu}
    cp "$F" /tmp/variant.orig
    IFS='|' read -ra VS <<<"${VARIANTS:-}"
    NAMES=""
    for v in "${VS[@]}"; do
        name=${v%%:*}
        cp /tmp/variant.orig "$F" && sed -i "${v#*:}" "$F"
        step "build_$name" 300 cmake --build $N -j16 --target hybrid-bench && cp $N/hybrid-bench /tmp/hb_$name &&
            NAMES="$NAMES $name"
    done
    cp /tmp/variant.orig "$F"
    step build_cur 300 cmake --build $N -j16 --target hybrid-bench && cp $N/hybrid-bench /tmp/hb_cur
    AM=$M
    AP="-p 128 -n 64"
    [ "${AB_MODEL:-4b}" = 35b ] && AM=/tmp/q35 && AP="-p 16 -n 32" && mkdir -p /tmp/q35 &&
        cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    NB=$(echo "${BATCHES:-64,256}" | tr ',' '\n' | wc -l)
    for i in 1 2; do
        for name in cur $NAMES; do
            step "var_${name}_$i" 300 /tmp/hb_$name -m $AM --dummy-weights --device cuda $AP -b ${BATCHES:-64,256} \
                -r 1 ${BENCH_FLAGS:-}
            grep -E '^\| +[0-9]' "$LOG" | tail -"$NB" | sed "s/^/  [$name $i] /" >>"$SUM"
            if [ -n "${AB_PREFILL:-}" ]; then
                step "var_prefill_${name}_$i" 300 /tmp/hb_$name -m $AM --dummy-weights --device cuda -p 4096 -n 8 \
                    --ubatch 4096 -r 1
                grep -E '^\| +[0-9]' "$LOG" | tail -2 | sed "s/^/  [prefill $name $i] /" >>"$SUM"
            fi
        done
    done
fi
if want ncu_step; then  # each kernel's time in about two decode steps (ncu serializes kernels: no PDL overlap)
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    # (hybrid-bench first prefills each of the b sequences alone: about 313 kernels each at -p 16 on the 4B shapes;
    # NCU_MODEL=35b: the 35B-A3B shapes, NCU_SKIP kernels a sequence, NCU_COUNT kernels profiled)
    NM=$M
    [ "${NCU_MODEL:-4b}" = 35b ] && NM=/tmp/q35 && mkdir -p /tmp/q35 && cp tools/gpu/config_35b_a3b.json /tmp/q35/config.json
    for b in ${TRACE_BATCHES:-64 256}; do
        step "ncu_step_b$b" 300 $NCU --csv --metrics gpu__time_duration.sum,dram__bytes.sum \
            --launch-skip $((b * ${NCU_SKIP:-320} + 1500)) --launch-count ${NCU_COUNT:-680} $N/hybrid-bench -m $NM \
            --dummy-weights --device cuda -p 16 -n 32 -b $b -r 1 --no-cuda-graphs
        sed -n "/^==== ncu_step_b$b:/,\$p" "$LOG" >"$OUT/ncu_step_b$b.csv"
        python3 tools/gpu/ncu_summary.py "$OUT/ncu_step_b$b.csv" | sed "s/^/  [b=$b] /" >>"$SUM"
    done
fi
if want compare; then  # hybrid-compare on CUDA against the repository's models' HF goldens
    for d in models/tiny tests/data/models/tiny-b tests/data/models/moe tests/data/models/next; do
        [ -d "$d" ] || { say "compare: $d missing"; continue; }
        # (models/tiny has bf16 CUDA goldens; the others are compared with the CPU's fp32 greedy, as ab_run.sh does)
        KEY=(--key greedy_fp32_cpu --tol 0.1)
        [ "$d" = models/tiny ] && KEY=()
        step "compare_$(basename $d)" 200 $N/hybrid-compare -m $d --device cuda "${KEY[@]}" --near-tie 0.05
        sed -n "/^==== compare_$(basename $d):/,\$p" "$LOG" | grep -vE "^ok |^====" | tail -6 |
            sed "s|^|  [$(basename $d)] |" >>"$SUM"
    done
fi
say "total $(($(date +%s) - T0)) s"
cat "$SUM"
