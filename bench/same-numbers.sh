#!/usr/bin/env bash
# Same numbers before and after a refactor, in one device call: runs the
# training loop of two moecore binaries on the bench settings (synthetic
# tokens, no checkpoints or eval, STEPS steps) for each config, in the order
# A B B A so that drift during the call hits both alike, and prints per
# config whether every step's loss is bit-identical, the loss at step 10,
# and each binary's median tokens/s over the steps after WARMUP (the median
# of its two runs' medians), with B / A.
# Usage: bench/same-numbers.sh A_BIN B_BIN CONFIG... (env: STEPS=12 WARMUP=3, OUT=dir for logs,
# ARGS="--key=value ..." overrides for every run, e.g. ARGS=--data.doc_mask=true;
# A_ENV / B_ENV="NAME=value ..." environment for A's / B's runs alone, so that
# one binary can be compared with itself, e.g. A_ENV=MOECORE_GLU=0 B_ENV=MOECORE_GLU=1;
# A_ARGS / B_ARGS="--key=value ..." overrides for A's / B's runs alone, e.g.
# A_ARGS=--train.recompute=gather B_ARGS=--train.recompute=none;
# SMI=1: nvidia-smi samples each run's SM clock, power and clock-event
# reasons every 250 ms, and the summary adds each side's median clock and
# power over the busy samples and how many of them the power cap held
# (the 700 W cap slows a training step's kernels: bench/results/2026-12-07-s9.md));
# C_BIN=path: a third side C (with C_ENV / C_ARGS like B's), the order then
# A B C C B A, each of B and C reported against A, e.g. a base binary as A,
# the new one as B and the new one with --train.recompute=none as C)
set -u
a=$1 b=$2; shift 2
c=${C_BIN:-}
steps=${STEPS:-12} warmup=${WARMUP:-3}
out=${OUT:-build/same-numbers}
mkdir -p "$out"
run() { # BIN NAME CONFIG
  local dir="$out/$2-$(basename "$3" .yaml)-$4" vars
  rm -rf "$dir"
  local args
  case $2 in
    A) vars=${A_ENV:-} args=${A_ARGS:-} ;;
    B) vars=${B_ENV:-} args=${B_ARGS:-} ;;
    *) vars=${C_ENV:-} args=${C_ARGS:-} ;;
  esac
  local smi=""
  if [ "${SMI:-0}" = 1 ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active,utilization.gpu --format=csv,noheader,nounits \
      -lms 250 > "$dir.smi.csv" 2>/dev/null &
    smi=$!
  fi
  # shellcheck disable=SC2086 # NAME=value words
  env $vars timeout 300 "$1" train "$3" --data.synthetic=true --checkpoint.save_final=false --checkpoint.interval=0 \
    --train.eval_interval=0 --train.steps="$steps" --logging.run_dir="$dir" ${ARGS:-} $args > "$dir.log" 2>&1 ||
    echo "   $2 on $3: exit $? (log $dir.log): $(tail -n 2 "$dir.log" | tr '\n' ' ')"
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
}
for cfg in "$@"; do
  if [ -n "$c" ]; then
    sides=ABC
    run "$a" A "$cfg" 1; run "$b" B "$cfg" 1; run "$c" C "$cfg" 1; run "$c" C "$cfg" 2; run "$b" B "$cfg" 2; run "$a" A "$cfg" 2
  else
    sides=AB
    run "$a" A "$cfg" 1; run "$b" B "$cfg" 1; run "$b" B "$cfg" 2; run "$a" A "$cfg" 2
  fi
  python3 - "$out" "$(basename "$cfg" .yaml)" "$warmup" "$cfg" "$sides" <<'EOF'
import json, statistics, sys
out, name, warmup, cfg, sides = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
def load(who, i):
    try:
        return [json.loads(l) for l in open(f"{out}/{who}-{name}-{i}/metrics.jsonl")]
    except OSError:
        return []
def med(run):
    return statistics.median([r["tokens_per_s"] for r in run if r["step"] > warmup] or [0])
runs = {w: [load(w, 1), load(w, 2)] for w in sides}
losses = {w: [[r["loss"] for r in run] for run in runs[w]] for w in sides}
same = all(l == losses["A"][0] and l for w in sides for l in losses[w])
tps = {w: statistics.median([med(run) for run in runs[w]]) for w in sides}
l10 = {w: (losses[w][0][9] if len(losses[w][0]) >= 10 else None) for w in sides}
print(f"{cfg}: losses bit-identical in all {2 * len(sides)} runs: {same}; loss at step 10 "
      + " ".join(f"{w} {l10[w]!r}" for w in sides) + "; tokens/s "
      + " ".join(f"{w} {tps[w]:.0f}" for w in sides) + " ("
      + ", ".join(f"{w}/A {tps[w] / tps['A'] if tps['A'] else 0:.4f}" for w in sides[1:]) + "); per run "
      + " ".join(f"{w} " + " ".join(f"{med(run):.0f}" for run in runs[w]) for w in sides))
def smi(who):  # busy samples (utilisation > 50%) of both runs: (SM MHz, W, power-capped)
    got = []
    for i in (1, 2):
        try:
            for line in open(f"{out}/{who}-{name}-{i}.smi.csv"):
                f = [x.strip() for x in line.split(",")]
                try:
                    if float(f[3]) > 50: got.append((float(f[0]), float(f[1]), int(f[2], 16) & 0x4 != 0))
                except (ValueError, IndexError):
                    pass
        except OSError:
            pass
    return got
busy = {w: smi(w) for w in sides}
if any(busy.values()):
    print("   nvidia-smi, busy samples: " + "; ".join(
        f"{w} {len(g)}: SM clock median {statistics.median(x[0] for x in g):.0f} MHz, power {statistics.median(x[1] for x in g):.0f} W, "
        f"power-capped {sum(x[2] for x in g)}" for w, g in busy.items() if g))
EOF
done
# few files come back from a lent machine: the runs travel as one archive,
# one per invocation (a second call into the same OUT adds its own)
n=1
while [ -e "$out/runs-$n.tgz" ]; do n=$((n + 1)); done
(cd "$out" && tar czf "runs-$n.tgz" --remove-files A-* B-* C-* 2>/dev/null)
echo "runs: $out/runs-$n.tgz"
