#!/usr/bin/env bash
# The whole model against the PyTorch reference (tests/torch_ref.py, run with
# Debian's python3-torch): logits, losses, every gradient and 10 AdamW steps,
# for the OLMoE-style and Olmo3-style configs of the issue and two more, and
# both styles again with intra-document masking on a batch read from an
# Olmo-style token file (headerless uint32, EOS-delimited documents).
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
# Intra-document masking (EOS 256, the byte tokenizer's; vocabulary 300). Three
# instances of 16 tokens: documents of 3, 1, 5, 1 and 6 tokens (the last EOS
# ends the sequence); one without EOS; one opening with two length-1
# documents. Written as Olmo-core writes its token files (np.memmap, uint32).
$py - "$dir/olmo.npy" <<'EOF'
import sys
import numpy as np
E = 256
docs = [[7, 299, E], [E], [1, 2, 257, 4, E], [E], [9, 8, 7, 6, 5, E],
        [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26],
        [E], [E], [30, 31, E], [290, 32, 33, 34, 35, 36, 37, E], [40, 41, 42]]
ids = [t for d in docs for t in d]
assert len(ids) == 48
m = np.memmap(sys.argv[1], mode="w+", dtype=np.uint32, shape=(len(ids),))
m[:] = ids
m.flush()
EOF
docs="--tokens=$dir/olmo.npy --dtype=uint32 --doc_mask=256 --model.vocab_size=300 --batch=3"
$dump "$dir/olmoe_docs.st" $small $docs --model.n_layers=2 --model.norm=pre --model.qk_norm=full \
      --model.gating=softmax --model.renorm_topk=false
$dump "$dir/olmo3_docs.st" $small $docs --model.n_layers=3 --model.norm=peri --model.qk_norm=head \
      --model.dense_layers=1 --model.dense_hidden=96 --model.n_shared=1 --model.shared_hidden=32 \
      --model.renorm_topk=true --model.n_kv_heads=2 --seed=5
$py tests/torch_ref.py "$dir"/*.st
