# Sourced by the script tests in this folder: failure counting and keeping the logs of a failed run.
# The caller sets `work` (its scratch folder) and `status` (0 once every check passed).
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# For the EXIT trap: remove $work after a pass, else say where the logs are.
keep_logs_on_failure() {
  if [ "$status" -eq 0 ]; then rm -rf "$work"; else echo "logs kept in $work" >&2; fi
}
