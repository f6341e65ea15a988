#!/usr/bin/env bash
# Runs every test: the C test programs build/tests/test_* (each a Check
# suite) and the scripts tests/test_*.sh. One test = one program or script;
# its output is kept in build/tests/logs/ and shown when it fails.
# Ends with the line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
mkdir -p build/tests/logs
pass=0; fail=0; failed=()
run_one() {
  local name=$1; shift
  local log=build/tests/logs/$name.log
  local t0=$(date +%s)
  if "$@" >"$log" 2>&1; then
    pass=$((pass+1)); printf 'PASS  %-28s %4ss\n' "$name" $(( $(date +%s) - t0 ))
  else
    fail=$((fail+1)); failed+=("$name")
    printf 'FAIL  %-28s %4ss   (log: %s)\n' "$name" $(( $(date +%s) - t0 )) "$log"
    tail -n 40 "$log" | sed 's/^/      | /'
  fi
}
for t in build/tests/test_*; do
  [ -x "$t" ] || continue
  run_one "$(basename "$t")" "$t"
done
for t in tests/test_*.sh; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t" .sh)" bash "$t"
done
echo
[ $fail -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
