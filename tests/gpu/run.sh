#!/usr/bin/env bash
# Runs every GPU test program build/tests/gpu/test_*; ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
pass=0; fail=0
for t in build/tests/gpu/test_*; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $(basename "$t")"; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
