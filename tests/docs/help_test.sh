#!/usr/bin/env bash
# Every executable answers --help (issue 44, defect 7): exit 0, a usage text on stdout, nothing written to the
# directory it runs in (h5ddp-example-own-loop --help used to train 300 steps into a folder named --help).
#   usage: help_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?}; bin=${2:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/h5ddp-help.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
for cmd in "$bin/tools/h5ddp-train" "$bin/tools/h5ddp-ckpt" "$bin/tools/h5ddp-ckpt-torch" "$bin/tools/h5ddp-env" \
  "$bin/tools/h5ddp-example-own-loop" "$src/tools/h5ddp-data.py" "$src/tools/plot_run.py"; do
  rc=0
  out=$(cd "$work" && timeout 60 "$cmd" --help 2>"$work.err") || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -qi "usage" <<<"$out"; then
    echo "FAIL: $cmd --help: exit $rc, stdout: ${out:0:200} stderr: $(head -c 300 "$work.err")"
    failures=$((failures + 1))
  fi
  if [ -n "$(ls -A "$work")" ]; then
    echo "FAIL: $cmd --help wrote into its directory: $(ls -A "$work")"
    rm -rf "${work:?}"/* "$work"/.[!.]* 2>/dev/null || true
    failures=$((failures + 1))
  fi
done
rm -f "$work.err"
[ "$failures" -eq 0 ] || exit 1
echo "PASS: every tool answers --help with a usage, exit 0, nothing written"
