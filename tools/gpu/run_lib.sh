# Shared by the one-command device runs (cuda_checks.sh, perf_run.sh, the *_ab.sh scripts): sourced from the
# repository root. Sets OUT (default /tmp/out), LOG=$OUT/all.log and SUM=$OUT/summary.txt (both emptied), T0,
# DEPS and CFG (the CMake flags of a device build against the carried .carry/deps: sm_90a, no server), and defines
#   say TEXT...            prints TEXT and appends it to the summary
#   step NAME LIMIT CMD... runs CMD under `timeout LIMIT` with its output in the log; records rc and seconds
#   want STAGE             true when ONLY (default all) names STAGE
#   build_in DIR TARGET... the device build of TARGETS (defined at the end)
# It also makes /work/main point at the checkout (the tests name their source folder) and unbuffers Python.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/all.log
SUM=$OUT/summary.txt
: >"$LOG"
: >"$SUM"
T0=$(date +%s)
say() { echo "$*" | tee -a "$SUM"; }
step() {
    local name=$1 limit=$2
    shift 2
    local t=$(date +%s)
    echo "==== $name: $*" >>"$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - t))")"
    return $rc
}
export PYTHONUNBUFFERED=1
[ -d /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
DEPS=$PWD/.carry/deps
CFG=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DHY_NATIVE=OFF -DHY_SERVER=OFF -DHY_DEPS_PREFIX=$DEPS
    -DHY_PCRE2_LIB=$DEPS/lib/libpcre2-8.a -DHY_UTF8PROC_LIB=$DEPS/lib/libutf8proc.a)
ONLY=${ONLY:-all}
want() { [ "$ONLY" = all ] || [[ " $ONLY " == *" $1 "* ]]; }
# build_in DIR TARGET...: the device build (CFG) of TARGETS in DIR as the step "build" (300 s); on failure the build
# log's errors go to the summary and the script exits 1. Also prints the GPU's name and driver to the summary.
build_in() {
    local dir=$1
    shift
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$SUM" 2>&1
    step build 300 bash -c "cmake -S . -B $dir ${CFG[*]} >/tmp/bn.log 2>&1 && cmake --build $dir -j16 --target $* >>/tmp/bn.log 2>&1" ||
        { grep -E "error|Error" /tmp/bn.log | head -20 | tee -a "$SUM"; exit 1; }
}
