# Sourced by the script tests here and in tests/cluster: failure counting, keeping the logs of a failed run,
# and reading a field of h5ddp-env's `key=value ...` lines.
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
# field LINE KEY: the value of KEY=... in LINE ("" when absent).
field() {
  local w
  for w in $1; do [[ $w == "$2="* ]] && { echo "${w#*=}"; return 0; }; done
  return 0
}
