#!/usr/bin/env bash
# Invalid model configs are refused with a message naming the field and a
# non-zero exit; valid ones are accepted.
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
fails=0
expect_error() { # field, args...
  local field=$1; shift
  local out rc
  out=$("$bin" params "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 0 ]; then echo "FAIL: accepted $*"; fails=$((fails+1)); return; fi
  if ! grep -q -- "$field" <<<"$out"; then
    echo "FAIL: $* -> message does not name $field: $out"; fails=$((fails+1)); return
  fi
  echo "ok: $* -> rc $rc: $out"
}
expect_ok() {
  if "$bin" params "$@" >/dev/null 2>&1; then echo "ok: accepted $*"; else echo "FAIL: refused $*"; fails=$((fails+1)); fi
}
expect_error model.d_model --model.d_model=65 --model.n_heads=4
expect_error model.n_kv_heads --model.n_heads=4 --model.n_kv_heads=3
expect_error model.top_k --model.n_experts=4 --model.top_k=5
expect_error model.d_model --model.d_model=0
expect_error model.n_layers --model.n_layers=-1
expect_error model.n_heads --model.n_heads=0
expect_error model.vocab_size --model.vocab_size=-5
expect_error model.expert_hidden --model.expert_hidden=0
expect_error model.top_k --model.top_k=0
expect_error model.seq_len --model.seq_len=0
expect_error model.shared_hidden --model.n_shared=1 --model.shared_hidden=0
expect_error model.head_dim --model.head_dim=7
expect_error model.norm --model.norm=middle
expect_error model.d_model --model.d_model=abc
expect_error model.rope_theta --model.rope_theta=-1
expect_error model.dense_layers --model.dense_layers=9 --model.n_layers=4
expect_error "did you mean model.d_model" --model.d_modle=64
expect_ok --model.d_model=64 --model.n_heads=4 --model.n_kv_heads=2
expect_ok --model.n_experts=8 --model.top_k=8
expect_ok --model.d_model=96 --model.n_heads=4 --model.head_dim=32
# a run config's model section, then overrides on top of it
expect_ok configs/olmoe-1b-7b.yaml
out=$("$bin" params configs/olmoe-1b-7b.yaml --model.n_layers=2 | tail -n 1)
# 2 x 64 x 3 x 2048 x 1024 expert + 2 x 50304 x 2048 embeddings + 2 x (4 x 2048^2
# attention + 64 x 2048 router + 4 x 2048 norms) + 2048 final norm
case $out in *"parameters: 1045186560 total"*) echo "ok: config + override: $out" ;;
  *) echo "FAIL: params of OLMoE-1B-7B with 2 layers: $out"; fails=$((fails+1)) ;; esac
"$bin" params /nonexistent.yaml > /dev/null 2>&1 && { echo "FAIL: accepted a missing config"; fails=$((fails+1)); }

# Shapes whose products overflow: each field within its bound, the table's
# counts and the layout's int widths not, refused with the keys named; an
# integer beyond 32 bits is out of range, not "not an integer".
expect_error "more than the 2^48" --model.d_model=1048576 --model.n_layers=65536 --model.n_experts=65536 \
  --model.expert_hidden=4194304
expect_error "model.n_heads (65536) x model.head_dim (65536) = 4294967296 is more than 2147483647" \
  --model.n_heads=65536 --model.head_dim=65536 --model.n_kv_heads=1
expect_error "model.n_shared (1024) x model.shared_hidden (4194304) = 4294967296 is more than 2147483647" \
  --model.n_shared=1024 --model.shared_hidden=4194304
expect_error "model.seq_len: 3000000000 is out of range (a 32-bit integer: at most 2147483647)" --model.seq_len=3000000000
# errors name the argument that set the key, or the config file and line
expect_error "command line: --model.d_model=65, --model.n_heads=4: model.d_model (65)" --model.d_model=65 --model.n_heads=4
expect_error "command line: --model.d_model=x: model.d_model: expected an integer" --model.d_model=x
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'model:\n  d_model: 1048576\n  n_layers: 65536\n  vocab_size: 1073741824\n' > "$tmp/huge.yaml"
expect_error "$tmp/huge.yaml:4: model: these shapes give" "$tmp/huge.yaml"   # vocab_size is named first
expect_error "command line: --model.n_layers=65536: model: these shapes give" "$tmp/huge.yaml" --model.n_layers=65536
printf 'model:\n  d_model: 64\n  d_model: 32\n' > "$tmp/dup.yaml"
expect_error "$tmp/dup.yaml:3: model.d_model is given twice" "$tmp/dup.yaml"
echo "$fails failures"
[ $fails -eq 0 ]
