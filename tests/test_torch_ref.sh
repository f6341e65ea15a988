#!/usr/bin/env bash
# The whole model against the PyTorch reference (tests/torch_ref.py, run with
# Debian's python3-torch): logits, losses, every gradient and 10 AdamW steps,
# for the OLMoE-style and Olmo3-style configs of the issue and two more.
set -eu
cd "$(dirname "$0")/.."
py=/usr/bin/python3
dump=build/tests/tool_model_dump
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small="--model.vocab_size=200 --model.d_model=64 --model.n_heads=4 --model.n_experts=8
       --model.top_k=2 --model.expert_hidden=32 --batch=2 --seq=16 --steps=10"
# OLMoE: pre-norm, full QK-norm, softmax gating, no renormalisation, 8 experts top-2
$dump "$dir/olmoe.st" $small --model.n_layers=2 --model.norm=pre --model.qk_norm=full \
      --model.gating=softmax --model.renorm_topk=false
# Olmo3: peri-norm, per-head QK-norm, dense first layer, a shared expert, renormalised top-k, GQA
$dump "$dir/olmo3.st" $small --model.n_layers=3 --model.norm=peri --model.qk_norm=head \
      --model.dense_layers=1 --model.dense_hidden=96 --model.n_shared=1 --model.shared_hidden=32 \
      --model.renorm_topk=true --model.n_kv_heads=2
# Olmo-core reordered norm, sigmoid gating, no QK-norm, multi-query attention, top-3
$dump "$dir/post_sigmoid.st" $small --model.n_layers=2 --model.norm=post --model.qk_norm=none \
      --model.gating=sigmoid --model.renorm_topk=true --model.n_kv_heads=1 --model.top_k=3 --seed=7
# dense only
$dump "$dir/dense.st" $small --model.n_layers=2 --model.n_experts=0 --model.dense_hidden=128 --seed=3
$py tests/torch_ref.py "$dir"/*.st
