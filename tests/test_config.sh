#!/usr/bin/env bash
# configs/reference.yaml documents every run-config key, and the config
# errors of `moecore train` are caught before anything is written:
#  (a) the keys the binary knows (run_config_keys(), printed by a small C
#      program built here against build/libmoecore.a) all appear in
#      reference.yaml, and its values are the built-in defaults except the
#      data paths and model.vocab_size;
#  (b) reference.yaml loads, validates and trains one step;
#  (c) each bad config, override or data file gives a non-zero exit, a
#      message naming the key (YAML errors also FILE:LINE; errors an override
#      causes "command line: --key=value"), and no run_dir: among them keys,
#      sections and documents given twice, integers out of range and
#      products that overflow.
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
ref=configs/reference.yaml
for f in "$bin" build/libmoecore.a; do
  [ -f "$f" ] || { echo "FAIL: $f missing; run make build/moecore build/libmoecore.a"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# ---- (a) every key is documented, with its default ------------------------------------
cat > "$tmp/keys.c" <<'EOF'
// keys: every "section.key"; dump [FILE]: the defaults, or FILE loaded over
// them, as the run's resolved YAML (unvalidated, so nothing is derived).
#include <stdio.h>
#include <string.h>
#include "config/config.h"
int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "keys")) {
        for (const char *const *k = run_config_keys(); *k; k++) puts(*k);
        return 0;
    }
    RunConfig c;
    char err[1024];
    run_config_defaults(&c);
    if (argc == 3 && run_config_load_yaml(&c, argv[2], err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    run_config_write_yaml(&c, stdout);
    run_config_free(&c);
    return 0;
}
EOF
if ! gcc -std=c11 -D_GNU_SOURCE -Isrc $(pkg-config --cflags openblas yaml-0.1 json-c) "$tmp/keys.c" \
     build/libmoecore.a $(pkg-config --libs openblas yaml-0.1 json-c) -fopenmp -lm -o "$tmp/keys"; then
  echo "FAIL: cannot build the key-listing program"; exit 1
fi
"$tmp/keys" keys > "$tmp/keys.txt"
nkeys=$(wc -l < "$tmp/keys.txt")
[ "$nkeys" -gt 40 ] || fail "run_config_keys() gave only $nkeys keys"
# reference.yaml's keys as section.key, from its two-level layout
# (and section.mapping.key for a mapping inside a section: device.cuda.*)
awk '/^[a-z0-9_]+:/ { sub(":.*", ""); sec = $0; subsec = ""; next }
     /^  [a-z0-9_]+: *(#.*)?$/ { subsec = $1; sub(":.*", "", subsec); next }
     /^  [a-z0-9_]+:/ { k = $1; sub(":.*", "", k); subsec = ""; print sec "." k }
     /^    [a-z0-9_]+:/ { k = $1; sub(":.*", "", k); print sec "." subsec "." k }' "$ref" > "$tmp/ref_keys.txt"
missing=$(grep -vxF -f "$tmp/ref_keys.txt" "$tmp/keys.txt")
[ -z "$missing" ] || fail "keys missing from $ref: $(echo $missing)"
extra=$(grep -vxF -f "$tmp/keys.txt" "$tmp/ref_keys.txt")
[ -z "$extra" ] || fail "keys in $ref that the binary does not know: $(echo $extra)"
dups=$(sort "$tmp/ref_keys.txt" | uniq -d)
[ -z "$dups" ] || fail "keys given twice in $ref: $(echo $dups)"
# each key line carries a comment
nocomment=$(grep -E '^ +[a-z0-9_]+:' "$ref" | grep -v '#' || true)
[ -z "$nocomment" ] || fail "keys without a comment in $ref: $nocomment"
echo "ok: $nkeys keys known to the binary, all in $ref"
# values: only these may differ from the defaults
"$tmp/keys" dump > "$tmp/defaults.yaml"
if ! "$tmp/keys" dump "$ref" > "$tmp/ref.yaml"; then
  fail "$ref does not load"
else
  changed=$(diff "$tmp/defaults.yaml" "$tmp/ref.yaml" | grep '^>' |
            grep -vE '^>   (vocab_size|train|eval):' || true)
  [ -z "$changed" ] || fail "values in $ref that are not the defaults: $changed"
  echo "ok: $ref holds the default of every key but the data paths and model.vocab_size"
fi

# ---- (b) it loads, validates and runs --------------------------------------------------
# 4096 uint16 tokens < 256: 16 instances of the default seq_len
python3 -c "
import random, struct, sys
r = random.Random(1)
open(sys.argv[1], 'wb').write(struct.pack('<4096H', *[r.randrange(256) for _ in range(4096)]))
" "$tmp/tokens.bin"
if out=$("$bin" train "$ref" --train.steps=1 --logging.run_dir="$tmp/ref_run" \
         --data.train="$tmp/tokens.bin" --data.eval="$tmp/tokens.bin" 2>&1); then
  grep -q 'step *1/1' <<<"$out" || fail "reference run printed no step 1/1: $out"
  [ "$(wc -l < "$tmp/ref_run/metrics.jsonl" 2>/dev/null)" = 1 ] || fail "reference run: metrics.jsonl is not one line"
  echo "ok: $ref trains one step"
else
  fail "reference run exited non-zero: $out"
fi

# ---- (c) errors: non-zero exit, the key (and FILE:LINE) named, nothing written --------
# A small valid config; each case appends to it or overrides it.
cat > "$tmp/base.yaml" <<EOF
model:
  vocab_size: 257
  d_model: 32
  n_layers: 1
  n_heads: 2
  n_experts: 4
  top_k: 2
  expert_hidden: 32
  seq_len: 32
data:
  train: [$tmp/tokens.bin]
train:
  global_batch: 4
  micro_batch: 4
  steps: 1
EOF
base_lines=$(wc -l < "$tmp/base.yaml")
run_dir=$tmp/err_run
# expect_error NAME CONFIG PATTERN... -- ARGS...: every PATTERN (fixed string) in stderr,
# except that a PATTERN !TEXT must not be there.
expect_error() {
  local name=$1 config=$2; shift 2
  local patterns=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do patterns+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  rm -rf "$run_dir"
  local out rc
  out=$("$bin" train "$config" --logging.run_dir="$run_dir" "$@" 2>&1 >/dev/null); rc=$?
  local ok=1
  if [ $rc -eq 0 ]; then fail "$name: exit 0"; ok=0; fi
  for p in "${patterns[@]}"; do
    case $p in
      !*) ! grep -qF -- "${p#!}" <<<"$out" || { fail "$name: message has '${p#!}': $out"; ok=0; } ;;
      *) grep -qF -- "$p" <<<"$out" || { fail "$name: message lacks '$p': $out"; ok=0; } ;;
    esac
  done
  if [ -e "$run_dir" ]; then fail "$name: $run_dir was written: $(ls -A "$run_dir" | tr '\n' ' ')"; ok=0; fi
  [ $ok = 1 ] && echo "ok: $name -> rc $rc: $out"
}
# bad_yaml NAME LINE TEXT PATTERN...: base.yaml plus TEXT, whose LINE-th line (from 1)
# the message must name. TEXT opens with a section: one that base.yaml has
# gets TEXT's keys at the end of its own block (a section may appear only once).
bad_yaml() {
  local name=$1 line=$2 text=$3; shift 3
  local at
  at=$(python3 - "$tmp/base.yaml" "$tmp/bad.yaml" "$text" <<'PY'
import sys
base = open(sys.argv[1]).read().splitlines()
text = sys.argv[3].split("\n")
head = text[0]
if head in base:
    end = base.index(head) + 1
    while end < len(base) and base[end].startswith(" "): end += 1
    out, at = base[:end] + text[1:] + base[end:], end - 1   # TEXT's line 2 lands at line end + 1
else:
    out, at = base + text, len(base)
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print(at)
PY
)
  expect_error "$name" "$tmp/bad.yaml" "$tmp/bad.yaml:$((at + line)):" "$@"
}

# the base config itself is valid: it fails only on an invalid override
expect_error "train.steps and train.tokens both 0" "$tmp/base.yaml" train.steps train.tokens -- --train.steps=0

bad_yaml "unknown key" 2 $'model:\n  d_modle: 64' model.d_modle "did you mean model.d_model"
bad_yaml "unknown key (train)" 2 $'train:\n  stpes: 3' train.stpes "did you mean train.steps"
bad_yaml "unknown section" 1 $'modle:\n  d_model: 64' "unknown section 'modle'" "did you mean model"
bad_yaml "wrong type int" 2 $'model:\n  n_kv_heads: abc' model.n_kv_heads abc
bad_yaml "wrong type i64" 2 $'train:\n  tokens: 1.5' train.tokens 1.5
bad_yaml "wrong type float" 2 $'optim:\n  lr: fast' optim.lr fast
bad_yaml "wrong type bool" 2 $'optim:\n  decay_norms: maybe' optim.decay_norms maybe
bad_yaml "list for scalar" 2 $'train:\n  eval_batches: [1, 2]' train.eval_batches "expected a single value"
bad_yaml "list for model scalar" 2 $'model:\n  head_dim: [64]' model.head_dim "expected a single value"
bad_yaml "bad enum" 2 $'train:\n  lr_schedule: exponential' train.lr_schedule exponential cosine
bad_yaml "bad model enum" 2 $'model:\n  norm: middle' model.norm middle pre
bad_yaml "mapping for scalar" 2 $'train:\n  eval_batches: {a: 1}' train.eval_batches nested
bad_yaml "bad device.cuda enum" 3 $'device:\n  cuda:\n    grouped_gemm: cublas' device.cuda.grouped_gemm cublas mma_sync
bad_yaml "unknown device.cuda key" 3 $'device:\n  cuda:\n    gemm_tme: false' device.cuda.gemm_tme "did you mean device.cuda.gemm_tma"
bad_yaml "mapping three levels down" 3 $'device:\n  cuda:\n    gemm_tma: {a: 1}' device.cuda.gemm_tma nested
expect_error "negative device.cuda.attention_ds_mib" "$tmp/base.yaml" device.cuda.attention_ds_mib ">= 0" \
  -- --device.cuda.attention_ds_mib=-1
expect_error "bad device.cuda override" "$tmp/base.yaml" device.cuda.gemm_tma maybe -- --device.cuda.gemm_tma=maybe
expect_error "bad device.cuda.attention_fwd override" "$tmp/base.yaml" device.cuda.attention_fwd fa3 mma_sync \
  -- --device.cuda.attention_fwd=fa3
bad_yaml "YAML syntax error" 3 $'optim:\n  lr: 1\n  beta1: 0.9: 3' "YAML syntax error"
expect_error "unknown override key" "$tmp/base.yaml" train.stpes "did you mean train.steps" -- --train.stpes=5
expect_error "unknown override section" "$tmp/base.yaml" trian.steps -- --trian.steps=5
expect_error "bad override value" "$tmp/base.yaml" "command line: --train.steps=ten: train.steps" ten \
  -- --train.steps=ten
expect_error "bad override enum" "$tmp/base.yaml" data.dtype int8 -- --data.dtype=int8
expect_error "bad override model value" "$tmp/base.yaml" model.top_k x -- --model.top_k=x
expect_error "missing config file" "$tmp/nope.yaml" "$tmp/nope.yaml"
expect_error "missing data file" "$tmp/base.yaml" data.train "$tmp/missing.bin" -- --data.train="$tmp/missing.bin"
expect_error "missing eval file" "$tmp/base.yaml" data.eval "$tmp/missing.bin" -- --data.eval="$tmp/missing.bin"
expect_error "no data" "$tmp/base.yaml" data.train -- --data.train=
expect_error "invalid value" "$tmp/base.yaml" train.global_batch -- --train.global_batch=6

# Strict YAML: a key, a list key, a section or a mapping given twice, and a
# second document, are refused at the line of the second one.
bad_yaml "duplicate key" 2 $'train:\n  steps: 3' "train.steps is given twice (first at line 15)"
bad_yaml "duplicate list key" 2 $'data:\n  train: [a.bin]' "data.train is given twice (first at line 11)"
bad_yaml "duplicate model key" 2 $'model:\n  d_model: 64' "model.d_model is given twice (first at line 3)"
raw_yaml() { # NAME TEXT LINE PATTERN...: base.yaml with TEXT appended as it is
  local name=$1 text=$2 line=$3; shift 3
  { cat "$tmp/base.yaml"; printf '%s\n' "$text"; } > "$tmp/raw.yaml"
  expect_error "$name" "$tmp/raw.yaml" "$tmp/raw.yaml:$((base_lines + line)):" "$@"
}
raw_yaml "duplicate section" $'train:\n  seed: 3' 1 "section 'train' is given twice (first at line 12)"
raw_yaml "duplicate empty section" $'optim:\noptim:\n  lr: 1' 2 "section 'optim' is given twice"
raw_yaml "second document" $'---\noptim:\n  lr: 0.1' 1 "a second YAML document"
raw_yaml "duplicate device.cuda" $'device:\n  cuda:\n    gemm_tma: false\n  cuda:\n    grouped_gemm: wgmma' 4 \
  "device.cuda is given twice (first at line $((base_lines + 2)))"
# one document with its explicit markers is fine: the error is the override's
{ echo ---; cat "$tmp/base.yaml"; echo ...; } > "$tmp/doc.yaml"
expect_error "explicit document markers" "$tmp/doc.yaml" "command line: --train.seed=-1" -- --train.seed=-1

# Where a validation error comes from: the override that set a key it names
# (not the YAML file), else the YAML line of the key.
expect_error "validation error of an override" "$tmp/base.yaml" \
  "command line: --train.global_batch=6: train.global_batch (6) must be a multiple of train.micro_batch (4)" \
  "!$tmp/base.yaml" -- --train.global_batch=6
expect_error "validation error of an override and a YAML key" "$tmp/base.yaml" \
  "command line: --train.micro_batch=3: train.global_batch (4) must be a multiple of train.micro_batch (3)" \
  "or --train.micro_batch=2" "!$tmp/base.yaml" -- --train.micro_batch=3
expect_error "validation error of a model override" "$tmp/base.yaml" \
  "command line: --model.n_heads=3: model.d_model (32) must be divisible by model.n_heads (3)" "!$tmp/base.yaml" \
  -- --model.n_heads=3
bad_yaml "validation error of a YAML key" 2 $'train:\n  warmup_steps: -1' "train.warmup_steps must be >= 0"
printf 'train:\n  steps: 1\n' > "$tmp/nodata.yaml"
expect_error "validation error of a default" "$tmp/nodata.yaml" "$tmp/nodata.yaml: data.train: no training data"
# integers out of range, and products that overflow
expect_error "seq_len above 2^31 (override)" "$tmp/base.yaml" \
  "command line: --model.seq_len=3000000000: model.seq_len: 3000000000 is out of range (a 32-bit integer" \
  -- --model.seq_len=3000000000
expect_error "int above 2^31 (override)" "$tmp/base.yaml" \
  "command line: --train.eval_batches=3000000000: train.eval_batches: 3000000000 is out of range (a 32-bit integer" \
  -- --train.eval_batches=3000000000
bad_yaml "int above 2^31 (YAML)" 2 $'model:\n  head_dim: 2147483648' "model.head_dim: 2147483648 is out of range"
bad_yaml "int64 out of range (YAML)" 2 $'train:\n  tokens: 99999999999999999999' \
  "train.tokens: 99999999999999999999 is out of range (a 64-bit integer"
expect_error "uint64 out of range" "$tmp/base.yaml" "train.seed: 99999999999999999999 is out of range" \
  -- --train.seed=99999999999999999999
expect_error "tokens per micro-batch above 2^31" "$tmp/base.yaml" \
  "train.micro_batch (100000) x model.seq_len (100000) = 10000000000 tokens per micro-batch" \
  -- --train.micro_batch=100000 --train.global_batch=100000 --model.seq_len=100000
expect_error "negative data.eos_id" "$tmp/base.yaml" "command line: --data.eos_id=-1: data.eos_id must be >= 0" \
  -- --data.eos_id=-1
expect_error "parallel.dp on one process" "$tmp/base.yaml" parallel.dp -- --parallel.dp=2
# what the CUDA kernels cannot run is refused at validation, before anything
# is allocated or written, with the keys and the limit named (no GPU needed)
if "$bin" --version | grep -q cuda; then
  expect_error "cuda: head dim 256" "$tmp/base.yaml" model.head_dim "16, 32, 64 or 128" \
    -- --device.type=cuda --model.head_dim=256
  expect_error "cuda: 2048 experts" "$tmp/base.yaml" model.n_experts "at most 1536 experts" \
    -- --device.type=cuda --model.n_experts=2048
  expect_error "cuda: expert_hidden not a multiple of 8" "$tmp/base.yaml" model.expert_hidden "multiples of 8" \
    -- --device.type=cuda --model.expert_hidden=36
  for args in "--model.head_dim=256" "--model.n_experts=4096 --model.top_k=8"; do
    if out=$("$bin" params --device=cuda $args 2>&1); then fail "params --device=cuda $args: exit 0"
    else grep -q "the cuda backend cannot run" <<<"$out" && echo "ok: params --device=cuda $args refused: $out" ||
      fail "params --device=cuda $args: $out"; fi
  done
  "$bin" params configs/olmoe-1b-7b.yaml --device=cuda > /dev/null || fail "params: OLMoE-1B-7B refused for cuda"
else
  echo "skip: this build has no CUDA backend (the cuda limit checks)"
fi

# token 300 >= vocab_size 257 at token 5 (byte offset 10) of a file of one instance
python3 -c "
import struct, sys
t = [1] * 32; t[5] = 300
open(sys.argv[1], 'wb').write(struct.pack('<32H', *t))
" "$tmp/bad_token.bin"
expect_error "token out of range (data.validate)" "$tmp/base.yaml" "$tmp/bad_token.bin" "byte offset 10" 300 \
  -- --data.train="$tmp/bad_token.bin" --data.validate=true
# Without data.validate the token is only seen by the first step's read, which
# must also come before run_dir is created.
expect_error "token out of range" "$tmp/base.yaml" "$tmp/bad_token.bin" "byte offset 10" 300 \
  -- --data.train="$tmp/bad_token.bin"

echo "$fails failures"
[ $fails -eq 0 ]
