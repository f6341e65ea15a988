#!/usr/bin/env bash
# The BPE path (issue 22): scripts/prepare-corpus.sh --bpe N, data.tokenizer,
# export-hf with the tokenizer, and transformers on the export.
#  A. (no Python packages) data.tokenizer and export-hf's tokenizer files with
#     a hand-written tokenizer.json: a run starts only when its vocabulary is
#     model.vocab_size; the export carries it byte for byte with
#     tokenizer_config.json / special_tokens_map.json and config.json's
#     eos_token_id; a missing file or another vocabulary is refused with
#     nothing written; --no-tokenizer, --tokenizer=PATH; configs/routing's
#     14 runs validate for the GPU (moecore params --device=cuda).
#  B. prepare-corpus.sh --bpe refuses a vocabulary outside 258..65536, a
#     non-number, and a Python without tokenizers (naming the pip command),
#     before writing anything.
#  C. (needs a Python with tokenizers, transformers and torch: build/pyenv
#     from scripts/install-py-deps.sh, which `make test` runs, or
#     MOECORE_PYTHON; skipped with a message otherwise) the whole path:
#     prepare a 2048-token BPE of the embedded corpus (twice: byte-identical),
#     train a tiny MoE 20 steps on it on the CPU with eval at 10 and 20, export
#     it with the tokenizer, and tests/bpe_hf_check.py: AutoTokenizer loads it
#     and encodes the eval text into the ids moecore read, and
#     AutoModelForCausalLM's loss on those instances equals moecore's eval CE
#     within 1e-5 relative (both FP32 on the CPU: measured about 1e-7 for
#     transformers' float32 loss, 1e-10 for a float64 CE of its logits).
set -u
cd "$(dirname "$0")/.."
root=$PWD
bin=${MOECORE:-$root/build/moecore}
py=${MOECORE_PYTHON:-$root/build/pyenv/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
expect_fail() { # name, pattern, path that must not appear, command...
  local name=$1 pattern=$2 dest=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then bad "$name: accepted"; return; fi
  if ! grep -q -- "$pattern" <<<"$out"; then bad "$name: message does not say '$pattern': $out"; return; fi
  if [ -n "$dest" ] && { [ -e "$dest" ] || [ -e "$dest.tmp" ]; }; then bad "$name: left $dest behind"; return; fi
  ok "$name: exit $rc: $(grep -m1 -- "$pattern" <<<"$out")"
}
json() { /usr/bin/python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(json.dumps(v))' "$@"; }

# ---- A. data.tokenizer and export-hf, with hand-written tokenizer.json files ----
# V tokens: ids 0..V-2 in model.vocab, the last an added special <|eos|>.
/usr/bin/python3 - "$tmp" <<'EOF'
import json, sys
for v in (257, 300):
    j = {"version": "1.0", "added_tokens": [{"id": v - 1, "content": "<|eos|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}],
         "model": {"type": "BPE", "vocab": {"t%d" % i: i for i in range(v - 1)}, "merges": []}}
    json.dump(j, open("%s/tok%d.json" % (sys.argv[1], v), "w"), indent=1)
EOF
"$bin" tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null || { echo "FAIL: tokenize"; exit 1; }
small=(--data.train="$tmp/t.bin" --data.eval="$tmp/t.bin" --model.d_model=64 --model.n_layers=2
       --model.n_experts=4 --model.expert_hidden=64 --model.seq_len=32 --train.global_batch=4
       --train.micro_batch=4 --train.eval_interval=0 --train.steps=2)
if out=$("$bin" train configs/tiny.yaml "${small[@]}" --data.tokenizer="$tmp/tok257.json" \
         --logging.run_dir="$tmp/run257" 2>&1) && grep -q "tokenizer: $tmp/tok257.json, 257 tokens, EOS 256 <|eos|>" <<<"$out"; then
  ok "a run with data.tokenizer of model.vocab_size tokens starts and says so"
else echo "$out" | tail -5; bad "run with a 257-token data.tokenizer"; fi
grep -q "tokenizer: \"$tmp/tok257.json\"" "$tmp/run257/config.yaml" && ok "config.yaml records data.tokenizer" \
  || bad "config.yaml lacks data.tokenizer"
expect_fail "data.tokenizer of another vocabulary" "data.tokenizer: $tmp/tok300.json has 300 tokens but model.vocab_size is 257" \
  "$tmp/run300/metrics.jsonl" "$bin" train configs/tiny.yaml "${small[@]}" --data.tokenizer="$tmp/tok300.json" --logging.run_dir="$tmp/run300"
expect_fail "missing data.tokenizer" "data.tokenizer: $tmp/none.json: cannot open: No such file" \
  "$tmp/run_none/metrics.jsonl" "$bin" train configs/tiny.yaml "${small[@]}" --data.tokenizer="$tmp/none.json" --logging.run_dir="$tmp/run_none"
echo '{"model": {"vocab": []}}' >"$tmp/notok.json"
expect_fail "a JSON file that is no tokenizer" "no model.vocab mapping" "$tmp/run_bad/metrics.jsonl" \
  "$bin" train configs/tiny.yaml "${small[@]}" --data.tokenizer="$tmp/notok.json" --logging.run_dir="$tmp/run_bad"

ck="$tmp/run257/checkpoints"
if out=$("$bin" export-hf "$ck" "$tmp/hf257" 2>&1); then
  grep -q "+ $tmp/tok257.json as tokenizer.json (257 tokens, eos_token <|eos|> = id 256)" <<<"$out" \
    && ok "export-hf takes the run's data.tokenizer: $(tail -1 <<<"$out")" || bad "export-hf summary: $out"
  cmp -s "$tmp/tok257.json" "$tmp/hf257/tokenizer.json" && ok "tokenizer.json copied byte for byte" || bad "tokenizer.json differs"
  [ "$(json "$tmp/hf257/tokenizer_config.json" tokenizer_class)" = '"PreTrainedTokenizerFast"' ] \
    && [ "$(json "$tmp/hf257/tokenizer_config.json" eos_token)" = '"<|eos|>"' ] \
    && [ "$(json "$tmp/hf257/tokenizer_config.json" model_max_length)" = 32 ] \
    && [ "$(json "$tmp/hf257/special_tokens_map.json" eos_token)" = '"<|eos|>"' ] \
    && ok "tokenizer_config.json: PreTrainedTokenizerFast, eos_token <|eos|>, model_max_length = seq_len 32; special_tokens_map.json" \
    || bad "tokenizer_config.json / special_tokens_map.json"
  [ "$(json "$tmp/hf257/config.json" eos_token_id)" = 256 ] && ok "config.json eos_token_id 256 (data.eos_id)" \
    || bad "config.json eos_token_id: $(json "$tmp/hf257/config.json" eos_token_id)"
else echo "$out"; bad "export-hf with the run's tokenizer"; fi
"$bin" export-hf "$ck" "$tmp/hf_plain" --no-tokenizer >/dev/null 2>&1 && [ ! -e "$tmp/hf_plain/tokenizer.json" ] \
  && [ ! -e "$tmp/hf_plain/tokenizer_config.json" ] && [ "$(json "$tmp/hf_plain/config.json" eos_token_id)" = null ] \
  && ok "--no-tokenizer: the model only, eos_token_id null" || bad "--no-tokenizer"
expect_fail "--tokenizer of another vocabulary" "has 300 tokens but model.vocab_size is 257" "$tmp/hf300" \
  "$bin" export-hf "$ck" "$tmp/hf300" --tokenizer="$tmp/tok300.json"
expect_fail "--tokenizer with --no-tokenizer" "exclude each other" "$tmp/hf_both" \
  "$bin" export-hf "$ck" "$tmp/hf_both" --tokenizer="$tmp/tok257.json" --no-tokenizer
mv "$tmp/tok257.json" "$tmp/moved.json"
expect_fail "the run's tokenizer is gone" "tokenizer (data.tokenizer of the run, .*config.yaml): $tmp/tok257.json: cannot open.*--tokenizer=PATH.*--no-tokenizer" \
  "$tmp/hf_gone" "$bin" export-hf "$ck" "$tmp/hf_gone"
"$bin" export-hf "$ck" "$tmp/hf_moved" --tokenizer="$tmp/moved.json" >/dev/null 2>&1 \
  && cmp -s "$tmp/moved.json" "$tmp/hf_moved/tokenizer.json" && ok "--tokenizer=PATH names it where it now is" \
  || bad "--tokenizer=PATH"
"$bin" train configs/tiny.yaml "${small[@]}" --logging.run_dir="$tmp/run_bytes" >/dev/null 2>&1 \
  && "$bin" export-hf "$tmp/run_bytes/checkpoints" "$tmp/hf_bytes" >/dev/null 2>&1 && [ ! -e "$tmp/hf_bytes/tokenizer.json" ] \
  && ok "a run without data.tokenizer exports no tokenizer files" || bad "export of a run without data.tokenizer"

# configs/routing: every model x setting validates for the GPU (its data need not exist here)
n=0
while read -r m s o; do
  # shellcheck disable=SC2086
  if "$bin" params "configs/routing/$m.yaml" --device=cuda $o >/dev/null 2>"$tmp/params.err"; then n=$((n+1))
  else bad "configs/routing $m $s: $(cat "$tmp/params.err")"; fi
done < <(bash configs/routing/run.sh --list)
[ $n -eq 14 ] && ok "configs/routing: all $n runs (2 models x 7 settings) validate for the GPU" || bad "configs/routing: $n of 14 validate"

# ---- B. prepare-corpus.sh --bpe: refusals before anything is written ----
prep() { MOECORE="$bin" bash scripts/prepare-corpus.sh "$@"; }
expect_fail "--bpe 100" "the vocabulary must be 258..65536 tokens" "$tmp/c100" prep --bpe 100 "$tmp/c100"
expect_fail "--bpe 70000" "the vocabulary must be 258..65536 tokens" "$tmp/c70k" prep --bpe 70000 "$tmp/c70k"
expect_fail "--bpe abc" "expected a number of tokens" "$tmp/cabc" prep --bpe abc "$tmp/cabc"
expect_fail "--bpe without N" "usage:" "" prep --bpe
printf '#!/bin/sh\nexec /usr/bin/python3 -I -S "$@"\n' >"$tmp/bare-python"; chmod +x "$tmp/bare-python"
expect_fail "a Python without tokenizers" "pip install tokenizers" "$tmp/cbare" env PYTHON="$tmp/bare-python" \
  MOECORE="$bin" bash scripts/prepare-corpus.sh --bpe 2048 "$tmp/cbare"
expect_fail "bpe_corpus.py itself, N out of range" "must be 258..65536" "$tmp/cpy" \
  /usr/bin/python3 scripts/bpe_corpus.py --vocab 65537 --bytes "$tmp" --out "$tmp/cpy"

# ---- C. the whole path, with tokenizers, transformers and torch ----
if ! { [ -x "$py" ] && "$py" -c 'import tokenizers, transformers, torch, numpy' 2>/dev/null; }; then
  echo "SKIP: C (prepare --bpe, train, eval, export-hf, AutoTokenizer + AutoModelForCausalLM): $py has not got" \
       "tokenizers, transformers, torch and numpy (bash scripts/install-py-deps.sh makes build/pyenv with them;" \
       "make test runs it; or set MOECORE_PYTHON)"
else
  echo "C: with $py ($("$py" -c 'import tokenizers, transformers, torch; print("tokenizers", tokenizers.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'))"
  c="$tmp/bpe"
  if out=$(PYTHON="$py" prep --bpe 2048 "$c" 2>&1); then
    ok "prepare-corpus.sh --bpe 2048: $(grep -m1 '^bpe_corpus: eval.bin:' <<<"$out" | sed 's/^bpe_corpus: //')"
  else echo "$out" | tail -20; bad "prepare-corpus.sh --bpe 2048"; fi
  RAYON_NUM_THREADS=1 "$py" scripts/bpe_corpus.py --vocab 2048 --bytes "$c/bytes" --out "$tmp/bpe2" >/dev/null 2>&1 \
    && cmp -s "$c/tokenizer.json" "$tmp/bpe2/tokenizer.json" && cmp -s "$c/train.bin" "$tmp/bpe2/train.bin" \
    && cmp -s "$c/eval.bin" "$tmp/bpe2/eval.bin" && ok "a second run gives byte-identical tokenizer.json, train.bin, eval.bin" \
    || bad "BPE corpus is not reproducible"
  grep -qx -- "--model.vocab_size=2048" "$c/train-args.txt" && grep -qx -- "--data.eos_id=0" "$c/train-args.txt" \
    && grep -qx -- "--data.tokenizer=$c/tokenizer.json" "$c/train-args.txt" && ok "train-args.txt: $(tr '\n' ' ' <"$c/train-args.txt")" \
    || bad "train-args.txt: $(cat "$c/train-args.txt")"
  mapfile -t args <"$c/train-args.txt"
  tiny=(--model.d_model=64 --model.n_layers=2 --model.n_heads=4 --model.n_experts=8 --model.top_k=2
        --model.expert_hidden=64 --model.seq_len=64 --train.global_batch=8 --train.micro_batch=4 --train.steps=20
        --train.warmup_steps=2 --train.eval_interval=10 --train.eval_batches=4 --logging.log_interval=10)
  if out=$("$bin" train configs/tiny.yaml "${args[@]}" "${tiny[@]}" --logging.run_dir="$tmp/run_bpe" 2>&1); then
    ce=($(grep -o '"eval_ce":[^,}]*' "$tmp/run_bpe/metrics.jsonl" | cut -d: -f2))
    if [ ${#ce[@]} -eq 2 ] && "$py" -c "import math, sys; a, b = map(float, sys.argv[1:]); sys.exit(not (b < a < math.log(2048)))" "${ce[@]}"; then
      ok "20 CPU steps on the BPE corpus: eval ce ${ce[0]} at step 10, ${ce[1]} at step 20 (ln 2048 = 7.62)"
    else bad "eval ce not falling below ln(2048): ${ce[*]}"; fi
  else echo "$out" | tail -10; bad "training on the BPE corpus"; fi
  if out=$("$bin" export-hf "$tmp/run_bpe/checkpoints" "$tmp/hf_bpe" 2>&1); then
    ok "export-hf: $(tail -1 <<<"$out")"
    # eval_batches 4 x micro_batch 4 = the first 16 instances of the eval file
    "$py" tests/bpe_hf_check.py "$tmp/hf_bpe" "$c" 64 16 "${ce[1]:-nan}" || bad "transformers on the export (above)"
  else echo "$out"; bad "export-hf of the BPE run"; fi
fi

echo
[ $fails -eq 0 ] && echo "test_bpe: all checks passed" || echo "test_bpe: $fails check(s) failed"
[ $fails -eq 0 ]
