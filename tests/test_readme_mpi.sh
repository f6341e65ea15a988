#!/usr/bin/env bash
# The README's mpirun example works as written: the first `mpirun` line of
# its "Several processes" section runs for two steps. Only what the README
# itself says to add is added: root's permission, --oversubscribe where there
# are fewer cores than ranks, and (not config) a short run on generated
# tokens in a temporary run directory; the optional [--optim.sharded=true]
# is left out.
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
[ -x "$bin" ] || { echo "FAIL: $bin missing; run make"; exit 1; }
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 1; }
line=$(awk '/^## Several processes/ { s = 1 } s && /^mpirun / { print; exit }' README.md)
[ -n "$line" ] || { echo "FAIL: no mpirun line in the README's 'Several processes' section"; exit 1; }
echo "README: $line"
line=${line//\[--optim.sharded=true\]/}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 8192 uint16 tokens < 257, enough for 2 steps of tiny.yaml's 16 x 128
/usr/bin/python3 -c "
import random, struct, sys
r = random.Random(3)
open(sys.argv[1], 'wb').write(struct.pack('<8192H', *[r.randrange(257) for _ in range(8192)]))
" "$tmp/tokens.bin"
extra=()
if [ "$(id -u)" = 0 ]; then extra+=(--allow-run-as-root); fi
np=$(sed -n 's/.*-np \([0-9]*\).*/\1/p' <<<"$line")
if [ "$(nproc)" -lt "${np:-1}" ]; then extra+=(--oversubscribe); fi
read -r -a cmd <<<"$line"
cmd=("${cmd[0]}" "${extra[@]}" "${cmd[@]:1}" --train.steps=2 --train.eval_interval=0
     --data.train="$tmp/tokens.bin" --data.eval= --logging.run_dir="$tmp/run")
echo "running: ${cmd[*]}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if out=$(timeout 300 "${cmd[@]}" 2>&1); then
  if grep -q "step *2/2" <<<"$out" && [ "$(wc -l < "$tmp/run/metrics.jsonl")" = 2 ]; then
    echo "ok: the README's mpirun example ran two steps"
    exit 0
  fi
  echo "FAIL: no step 2/2 or metrics: $out"
else
  echo "FAIL: the README's mpirun example failed: $out"
fi
exit 1
