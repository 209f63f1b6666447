# Shared helpers of the h5ddp-train script tests. Source it; needs H5DDP_BINARY_DIR (set by ctest).
set -euo pipefail
: "${H5DDP_BINARY_DIR:?run under ctest (H5DDP_BINARY_DIR unset)}"
TRAIN="$H5DDP_BINARY_DIR/tools/h5ddp-train"
PY="${H5DDP_PYTHON:-/usr/bin/python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
# Small, fast runs: tiny global batch (BATCH_SIZE, set before sourcing, changes it), no evaluation, no fsync (the tests do not pull the power plug).
COMMON=(--batch-size "${BATCH_SIZE:-16}" --no-eval --no-fsync --keep-last 0 --log-every 1)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-train-test-XXXXXX")"
JOB_PID=""
cleanup() {
  if [ -n "$JOB_PID" ] && kill -0 "$JOB_PID" 2>/dev/null; then kill_job "$JOB_PID"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# run_train NP LOG ARGS...: runs h5ddp-train in the foreground, output to LOG; returns its exit code.
run_train() {
  local np=$1 log=$2
  shift 2
  local rc=0
  timeout -k 5 "${RUN_TIMEOUT:-120}" "${MPIRUN[@]}" -np "$np" "$TRAIN" "${COMMON[@]}" "$@" >"$log" 2>&1 || rc=$?
  return $rc
}

# start_train NP LOG ARGS...: same in the background; sets JOB_PID (mpirun's pid).
start_train() {
  local np=$1 log=$2
  shift 2
  "${MPIRUN[@]}" -np "$np" "$TRAIN" "${COMMON[@]}" "$@" >"$log" 2>&1 &
  JOB_PID=$!
}

# rank_pids MPIRUN_PID: the pids of the ranks (mpirun's h5ddp-train children), one per line.
rank_pids() { pgrep -P "$1" -f h5ddp-train || true; }

# kill_job MPIRUN_PID: SIGKILL every rank, then mpirun: what a node failure or scancel -9 looks like.
kill_job() {
  local pids
  pids=$(rank_pids "$1")
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# wait_for SECONDS COMMAND...: polls every 50 ms until COMMAND succeeds; fails the test on timeout.
wait_for() {
  local limit=$1
  shift
  local deadline=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || fail "timed out after ${limit}s waiting for: $*"
    sleep 0.05
  done
}

latest_is() { [ "$(cat "$1/latest" 2>/dev/null)" = "$2" ]; }

compare() { "$PY" "$HERE/../support/h5ddp_test.py" compare "$@"; }

# A small copy of Fashion-MNIST (4096 training images, the same file format and reader; made once per build
# tree by tests/support/h5ddp_test.py) for runs whose promise does not depend on the data set: decompressing
# the whole set costs every rank about a second of each start-up.
SMALL_DATA="$("$PY" "$HERE/../support/h5ddp_test.py" small-data)"
