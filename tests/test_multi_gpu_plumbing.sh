#!/usr/bin/env bash
# bench/multi-gpu.sh (issues 16 and 21: the script of the first calls on
# several GPUs) on 2 CPU ranks, its plumbing: every step runs its trainings
# under mpirun, parses them and prints one verdict line per must-show; none
# may be ERROR or MISS (timings are INFO on CPU ranks), the correctness,
# pipeline, resume, kill and big lines PASS; $OUT holds only summary.txt and
# the archive (the runs' directory lives elsewhere and is removed), whose
# work/ has every run's log; with DEADLINE_S spent, every step is SKIPPED
# ("not run") rather than started.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }

out=$(OUT="$tmp/out" TMPDIR="$tmp" timeout 600 bash bench/multi-gpu.sh --device cpu --gpus 2 all 2>&1); rc=$?
sum="$tmp/out/summary.txt"
[ $rc -eq 0 ] && [ -s "$sum" ] || { echo "$out" | tail -n 20; bad "multi-gpu.sh all: exit $rc"; }
if grep -qE '^(ERROR|MISS) ' "$sum"; then bad "ERROR / MISS lines:"; grep -E '^(ERROR|MISS) ' "$sum"; else ok "no ERROR or MISS line"; fi
for step in correct pp resume kill big; do
  n=$(grep -cE "^PASS +$step " "$sum")
  [ "$n" -ge 1 ] && ok "$step: $n PASS" || bad "$step: no PASS line"
done
n=$(grep -cE "^PASS +correct " "$sum")
[ "$n" -ge 8 ] && ok "correct: the 5 layouts and 3 one-step gradient checks pass ($n)" || bad "correct: $n PASS lines, 8 expected"
[ "$(ls "$tmp/out" | tr '\n' ' ')" = "multi-gpu-logs.tgz summary.txt " ] && ok "\$OUT holds summary.txt and the archive only" \
  || bad "\$OUT holds: $(ls "$tmp/out" | tr '\n' ' ')"
nlog=$(tar tzf "$tmp/out/multi-gpu-logs.tgz" 2>/dev/null | grep -c '^work/.*\.log$')
[ "$nlog" -ge 20 ] && ok "the archive has $nlog run logs under work/" || bad "the archive has $nlog logs under work/"
left=$(find "$tmp" -maxdepth 1 -name 'multi-gpu.*' | wc -l)
[ "$left" -eq 0 ] && ok "the runs' directory is removed at the end" || bad "$left runs' directories left in TMPDIR"

out=$(OUT="$tmp/out2" TMPDIR="$tmp" DEADLINE_S=1 timeout 120 bash bench/multi-gpu.sh --device cpu --gpus 2 correct pp 2>&1); rc=$?
n=$(grep -c "^SKIPPED .*not run: less than 30 s left of DEADLINE_S 1" "$tmp/out2/summary.txt" 2>/dev/null)
[ $rc -eq 0 ] && [ "$n" -eq 2 ] && ok "DEADLINE_S spent: both steps SKIPPED, not run" || bad "DEADLINE_S=1: exit $rc, $n steps skipped"
echo "$fails failed"
[ $fails -eq 0 ]
