#!/usr/bin/env bash
# Selective recompute (train.recompute_norms, train.recompute_attention,
# train.recompute_swiglu; issue 20): on the CPU, bit-identical to keeping
# the activations — every step's loss and the final weights equal exactly
# (tolerance 0) — each key alone and all three together, beside each
# recompute mode, with QK-norm per head and none, doc masking, a shared
# expert, FP8 experts, under pp 2 (1F1B and interleaved) and dp 2 x ep 2
# (symmetric dispatch); the arena is smaller (the memory line); zb1 with
# norms or attention is refused by name, zb1 with SwiGLU runs bit-identical.
# The planner's arena for these keys against the allocation:
# tests/test_memory.c and tests/test_memory_ranks.sh.
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$bin tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null
base=(--data.train="$tmp/t.bin" --data.eval= --model.d_model=32 --model.n_layers=4 --model.n_heads=2
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=32 --model.seq_len=16 --model.dense_layers=2
      --model.dense_hidden=48 --train.global_batch=8 --train.micro_batch=2 --train.steps=5 --train.warmup_steps=2
      --train.eval_interval=0 --logging.log_interval=1 --checkpoint.interval=0 --parallel.bucket_mb=0.02 --optim.lr=3e-3)
. tests/lib_ranks.sh
arena() { grep "^rank 0: memory: " "$tmp/$1.log" | grep -m1 -oE "activations [0-9]+ B" | grep -oE "[0-9]+"; }
all3="--train.recompute_norms=true --train.recompute_attention=true --train.recompute_swiglu=true"
for spec in "none 1" "experts 1" "gather 1" "layers 1" "none 1 --model.qk_norm=head --model.n_shared=1 --model.shared_hidden=24" \
            "gather 1 --model.qk_norm=none --data.doc_mask=true" \
            "none 1 --train.precision=fp8 --model.d_model=128 --model.expert_hidden=128" \
            "none 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
            "gather 2 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
            "experts 2 --parallel.dp=2 --parallel.ep=2 --model.routing=learned"; do
  set -- $spec; rc=$1 np=$2; shift 2
  tag="${rc}_np${np}_$(echo "$*" | tr -dc 'a-z0-9' | cut -c1-24)"
  run "keep_$tag" "$np" --train.recompute=$rc "$@" || { tail -n 5 "$tmp/keep_$tag.log"; bad "$tag: run failed"; continue; }
  a=$(arena "keep_$tag")
  for sel in norms attention swiglu all; do
    keys="--train.recompute_$sel=true"; [ $sel = all ] && keys=$all3
    run "${sel}_$tag" "$np" --train.recompute=$rc $keys "$@" || { tail -n 5 "$tmp/${sel}_$tag.log"; bad "$tag $sel: run failed"; continue; }
    if out=$(compare "keep_$tag" "${sel}_$tag" 0 0); then ok "recompute $rc $* + $sel bit-identical: $out"
    else bad "recompute $rc $* + $sel: $out"; fi
    b=$(arena "${sel}_$tag")
    # (two dense blocks: swiglu beside experts, which recomputes the
    # experts' SwiGLU already, still shares the dense MLPs' outputs; rank 0
    # of the interleaved pp 2 holds one block of each kind: nothing to share)
    if [ $sel = swiglu ] && [[ "$*" == *interleaved* ]]; then
      [ -n "$b" ] && [ "$b" -eq "$a" ] && ok "  $sel: arena $a -> $b B (one block of each kind)" || bad "  $sel: arena $a -> $b"
    else
      [ -n "$a" ] && [ -n "$b" ] && [ "$b" -lt "$a" ] && ok "  $sel: arena $a -> $b B" || bad "  $sel: arena did not shrink: $a -> $b"
    fi
  done
done
for sel in norms attention; do
  out=$($bin train configs/tiny.yaml "${base[@]}" --train.recompute_$sel=true --parallel.pp=2 --parallel.pp_schedule=zb1 2>&1); rc=$?
  [ $rc -eq 2 ] && grep -q "train.recompute_$sel with parallel.pp_schedule: zb1" <<<"$out" && ok "zb1 with $sel refused: exit 2" \
    || bad "zb1 with $sel: exit $rc, $out"
done
run "zb1_swiglu" 2 --parallel.pp=2 --parallel.pp_schedule=zb1 --train.recompute_swiglu=true && run "zb1_keep" 2 --parallel.pp=2 --parallel.pp_schedule=zb1 \
  && out=$(compare zb1_keep zb1_swiglu 0 0) && ok "zb1 + swiglu bit-identical: $out" || bad "zb1 + swiglu: $out"
echo
[ $fails -eq 0 ] && echo "test_recompute_selective: all passed" || echo "test_recompute_selective: $fails failed"
[ $fails -eq 0 ]
