#!/usr/bin/env bash
# Selective recompute of the input norms (train.recompute_norms, issue 20):
# on the CPU, bit-identical to keeping them — every step's loss and the
# final weights equal exactly (tolerance 0) — alone and with each recompute
# mode, under pp 2 (1F1B and interleaved) and ep 2; the arena is smaller
# by the norms' buffers (the memory line); zb1 with it is refused by name.
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$bin tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null
base=(--data.train="$tmp/t.bin" --data.eval= --model.d_model=32 --model.n_layers=4 --model.n_heads=2
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=32 --model.seq_len=16 --model.dense_layers=1
      --model.dense_hidden=48 --train.global_batch=8 --train.micro_batch=2 --train.steps=5 --train.warmup_steps=2
      --train.eval_interval=0 --logging.log_interval=1 --checkpoint.interval=0 --parallel.bucket_mb=0.02 --optim.lr=3e-3)
. tests/lib_ranks.sh
arena() { grep "^rank 0: memory: " "$tmp/$1.log" | grep -m1 -oE "activations [0-9]+ B" | grep -oE "[0-9]+"; }
for spec in "none 1" "experts 1" "gather 1" "layers 1" "none 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
            "gather 2 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
            "experts 2 --parallel.dp=2 --parallel.ep=2 --model.routing=learned"; do
  set -- $spec; rc=$1 np=$2; shift 2
  tag="${rc}_np${np}_$(echo "$*" | tr -dc 'a-z0-9' | cut -c1-24)"
  run "keep_$tag" "$np" --train.recompute=$rc "$@" || { tail -n 5 "$tmp/keep_$tag.log"; bad "$tag: run failed"; continue; }
  run "norms_$tag" "$np" --train.recompute=$rc --train.recompute_norms=true "$@" || { tail -n 5 "$tmp/norms_$tag.log"; bad "$tag norms: run failed"; continue; }
  if out=$(compare "keep_$tag" "norms_$tag" 0 0); then ok "recompute $rc $* + norms bit-identical: $out"
  else bad "recompute $rc $* + norms: $out"; fi
  a=$(arena "keep_$tag"); b=$(arena "norms_$tag")
  [ -n "$a" ] && [ -n "$b" ] && [ "$b" -lt "$a" ] && ok "  arena $a -> $b B" || bad "  arena did not shrink: $a -> $b"
done
out=$($bin train configs/tiny.yaml "${base[@]}" --train.recompute_norms=true --parallel.pp=2 --parallel.pp_schedule=zb1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "train.recompute_norms with parallel.pp_schedule: zb1" <<<"$out" && ok "zb1 refused: exit 2" || bad "zb1: exit $rc, $out"
echo
[ $fails -eq 0 ] && echo "test_recompute_norms: all passed" || echo "test_recompute_norms: $fails failed"
[ $fails -eq 0 ]
