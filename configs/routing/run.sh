#!/usr/bin/env bash
# The routing-health runs of issue 22 (configs/routing/README.md): a model
# (e64-top8 or e16-top2, a YAML file here) times a balancing setting (the
# overrides below), each into runs/routing/MODEL-SETTING.
#
#   bash configs/routing/run.sh MODEL SETTING [--key=value ...]   one run (one GPU, device.type cuda)
#   bash configs/routing/run.sh all [--key=value ...]             every run, one after the other
#   bash configs/routing/run.sh --list                            the runs and their overrides
#   bash configs/routing/run.sh --check                           every run validated for the GPU
#       (moecore params --device=cuda) and 2 steps on the CPU at full size with 2 micro-batches
#       of 1 sequence, an eval and no checkpoint: that the config parses and starts
#
# MOECORE=path overrides build/moecore. Needs data/corpus-bpe16k (prepare it with
# bash scripts/prepare-corpus.sh --bpe 16384 data/corpus-bpe16k).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${MOECORE:-build/moecore}
models=(e64-top8 e16-top2)
sig="--model.gating=sigmoid --model.renorm_topk=true"
settings=(softmax-lb softmax-lbglobal sigmoid-lb sigmoid-lbglobal sigmoid-lb-small sigmoid-auxfree softmax-none)
overrides() {
  case $1 in
    softmax-lb)       echo "" ;;
    softmax-lbglobal) echo "--model.lb_global=true" ;;
    sigmoid-lb)       echo "$sig" ;;
    sigmoid-lbglobal) echo "$sig --model.lb_global=true" ;;
    sigmoid-lb-small) echo "$sig --model.lb_coef=0.001" ;;
    sigmoid-auxfree)  echo "$sig --model.lb_coef=0 --model.aux_free_rate=0.001" ;;
    softmax-none)     echo "--model.lb_coef=0" ;;
    *) return 1 ;;
  esac
}
die() { echo "routing: error: $*" >&2; exit 2; }
need_data() {
  [ -f data/corpus-bpe16k/tokenizer.json ] \
    || die "data/corpus-bpe16k is missing: bash scripts/prepare-corpus.sh --bpe 16384 data/corpus-bpe16k"
  [ -x "$bin" ] || die "$bin not found; build it first (make)"
}
run_one() { # model setting extra...
  local m=$1 s=$2; shift 2
  local o
  o=$(overrides "$s") || die "unknown setting '$s' (one of: ${settings[*]})"
  [ -f "configs/routing/$m.yaml" ] || die "unknown model '$m' (one of: ${models[*]})"
  echo "routing: $m $s: $bin train configs/routing/$m.yaml $o --logging.run_dir=runs/routing/$m-$s $*"
  # shellcheck disable=SC2086
  "$bin" train "configs/routing/$m.yaml" $o --logging.run_dir="runs/routing/$m-$s" "$@"
}

case "${1:-}" in
  --list)
    for m in "${models[@]}"; do for s in "${settings[@]}"; do
      printf '%-8s %-17s %s\n' "$m" "$s" "$(overrides "$s")"
    done; done ;;
  --check)
    need_data
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    fails=0
    for m in "${models[@]}"; do
      "$bin" params "configs/routing/$m.yaml" --device=cuda >"$tmp/params.txt" 2>&1 \
        && echo "ok: $m for the GPU: $(grep '^parameters:' "$tmp/params.txt")" \
        || { cat "$tmp/params.txt"; echo "FAIL: $m: moecore params --device=cuda"; fails=$((fails+1)); }
      for s in "${settings[@]}"; do
        t0=$(date +%s)
        # shellcheck disable=SC2046
        if "$bin" train "configs/routing/$m.yaml" $(overrides "$s") --device.type=cpu --train.steps=2 \
             --train.global_batch=2 --train.micro_batch=1 --train.eval_interval=2 --train.eval_batches=1 \
             --train.warmup_steps=1 --logging.log_interval=1 --checkpoint.save_final=false \
             --logging.run_dir="$tmp/$m-$s" >"$tmp/log" 2>&1 && grep -q '"eval_ce"' "$tmp/$m-$s/metrics.jsonl"; then
          echo "ok: $m $s: 2 CPU steps in $(( $(date +%s) - t0 )) s: $(grep -m1 '^step     2' "$tmp/log" | cut -d'|' -f2-4), $(grep -m1 '^eval' "$tmp/log" | cut -d'|' -f2)"
        else tail -5 "$tmp/log"; echo "FAIL: $m $s"; fails=$((fails+1)); fi
      done
    done
    echo "routing --check: $fails failure(s)"
    [ $fails -eq 0 ] ;;
  all)
    shift; need_data
    for m in "${models[@]}"; do for s in "${settings[@]}"; do run_one "$m" "$s" "$@"; done; done ;;
  ""|-h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' ;;
  *)
    [ $# -ge 2 ] || die "usage: $0 MODEL SETTING [--key=value ...] (--list shows them)"
    need_data; run_one "$@" ;;
esac
