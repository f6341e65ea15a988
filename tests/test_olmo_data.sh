#!/usr/bin/env bash
# Olmo-core / Dolma token files, made here with numpy, train as they are:
#  (a) dolma2-style headerless little-endian uint32 files named *.npy
#      (vocabulary 100278, EOS 100257), listed by a glob, with EOS-delimited
#      documents: 30 CPU steps, every loss finite and the last below 70% of
#      the first; the resolved config carries data.eos_id;
#  (b) the same tokens written by np.save (a real .npy header) give
#      bit-identical losses to the headerless files, for uint32 and for
#      gpt-neox-olmo-dolma-v1_5-style uint16 (vocabulary 50280, EOS 50279);
#  (c) a file whose width is not data.dtype, an .npy dtype or shape moecore
#      does not read, a damaged header and a vocabulary too small are refused
#      before anything is written, with a message naming the key to change.
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
py=/usr/bin/python3
[ -x "$bin" ] || { echo "FAIL: $bin missing; run make"; exit 1; }
$py -c 'import numpy' 2>/dev/null || { echo "FAIL: $py lacks numpy (Debian package python3-numpy)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok()   { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# Documents of 20..200 tokens from a bigram chain over 64 ids of the
# vocabulary (with 10% noise), each followed by EOS; DIR/part-0000K.npy
# headerless (tofile, as np.memmap writes them) and DIR/saved-0000K.npy by
# np.save, same tokens.
$py - "$tmp" <<'PY'
import numpy as np, sys
tmp = sys.argv[1]
for name, vocab, eos, dtype in [("dolma2", 100278, 100257, np.uint32), ("neox", 50280, 50279, np.uint16)]:
    rng = np.random.default_rng(7)
    ids = np.sort(rng.choice(eos, size=64, replace=False))
    import os
    os.makedirs(f"{tmp}/{name}")
    for part in range(2):
        toks = []
        while len(toks) < 12000:
            k = int(rng.integers(64))
            for _ in range(int(rng.integers(20, 200))):
                k = (5 * k + 3) % 64 if rng.random() > 0.1 else int(rng.integers(64))
                toks.append(ids[k])
            toks.append(eos)
        a = np.array(toks, dtype=dtype)
        a.tofile(f"{tmp}/{name}/part-{part:05d}.npy")
        np.save(f"{tmp}/{name}/saved-{part:05d}.npy", a)
    print(name, "tokens per file:", len(toks), "max id:", int(a.max()))
# files moecore refuses
np.save(f"{tmp}/int64.npy", np.arange(4096, dtype=np.int64))
np.save(f"{tmp}/two_d.npy", np.zeros((64, 64), dtype=np.uint16))
raw = bytearray(open(f"{tmp}/neox/saved-00000.npy", "rb").read())
raw[10:16] = b"[1, 2]"                       # the dict literal, broken
open(f"{tmp}/broken.npy", "wb").write(raw)
PY

# small enough that the 100k-row embedding and LM head cost little
small="--model.d_model=32 --model.n_layers=2 --model.n_heads=2 --model.n_experts=4 --model.top_k=2
       --model.expert_hidden=32 --model.seq_len=32 --train.global_batch=4 --train.micro_batch=4
       --train.warmup_steps=5 --optim.lr=1e-2 --train.eval_interval=0 --checkpoint.save_final=false
       --logging.log_interval=10"
dolma2="--model.vocab_size=100278 --data.dtype=uint32 --data.eos_id=100257"
neox="--model.vocab_size=50280 --data.dtype=uint16 --data.eos_id=50279"
# losses RUN_DIR: every step's loss, one line
losses() { $py -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1/metrics.jsonl"; }

# ---- (a) dolma2-style headerless uint32, by glob ---------------------------------------
# shellcheck disable=SC2086
if out=$("$bin" train configs/tiny.yaml $small $dolma2 --train.steps=30 --data.train="$tmp/dolma2/part-*.npy" \
         --data.eval= --logging.run_dir="$tmp/run_dolma2" 2>&1); then
  grep -q "2 files in 1 sources (uint32)" <<<"$out" && ok "the glob finds both headerless files" ||
    fail "data line: $(grep -m1 files <<<"$out")"
  if $py - "$tmp/run_dolma2/metrics.jsonl" <<'PY'
import json, math, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
assert len(l) == 30 and all(math.isfinite(x) for x in l), l
assert l[-1] < 0.7 * l[0], (l[0], l[-1])
print(f"ok: 30 steps on headerless uint32 .npy files: loss {l[0]:.3f} -> {l[-1]:.3f}, all finite")
PY
  then :; else fail "dolma2 losses not finite or not falling"; fi
  grep -q "eos_id: 100257" "$tmp/run_dolma2/config.yaml" && ok "config.yaml records data.eos_id 100257" ||
    fail "config.yaml lacks eos_id: 100257"
else
  fail "training on dolma2-style files: $out"
fi

# ---- (b) np.save files: the same losses as the headerless ones ------------------------
for set in dolma2 neox; do
  args=$dolma2; [ $set = neox ] && args=$neox
  for kind in part saved; do
    # shellcheck disable=SC2086
    "$bin" train configs/tiny.yaml $small $args --train.steps=3 --data.train="$tmp/$set/$kind-*.npy" --data.eval= \
      --logging.run_dir="$tmp/run_${set}_$kind" > "$tmp/$set-$kind.log" 2>&1 ||
      fail "$set $kind files: $(tail -3 "$tmp/$set-$kind.log")"
  done
  a=$(losses "$tmp/run_${set}_part" 2>/dev/null); b=$(losses "$tmp/run_${set}_saved" 2>/dev/null)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$set: np.save files and headerless files give the same losses ($a)"
  else fail "$set: headerless losses [$a], np.save losses [$b]"; fi
done

# ---- (c) refused before anything is written -------------------------------------------
expect_refused() { # name, pattern, args...
  local name=$1 pattern=$2; shift 2
  rm -rf "$tmp/err_run"
  local out rc
  # shellcheck disable=SC2086
  out=$("$bin" train configs/tiny.yaml $small --train.steps=1 --data.eval= --logging.run_dir="$tmp/err_run" "$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then fail "$name: accepted"
  elif ! grep -qF -- "$pattern" <<<"$out"; then fail "$name: message lacks '$pattern': $out"
  elif [ -e "$tmp/err_run" ]; then fail "$name: the run directory was written"
  else ok "$name -> rc $rc: $out"; fi
}
# shellcheck disable=SC2086
expect_refused "headerless uint32 read as uint16" "set data.dtype: uint32" $dolma2 --data.dtype=uint16 \
  --data.train="$tmp/dolma2/part-*.npy"
# shellcheck disable=SC2086
expect_refused "headerless uint16 read as uint32" "set data.dtype: uint16" $neox --data.dtype=uint32 \
  --model.vocab_size=100278 --data.train="$tmp/neox/part-*.npy"
# shellcheck disable=SC2086
expect_refused "np.save uint32 with data.dtype uint16" "header says dtype '<u4' (uint32) but data.dtype is uint16: set data.dtype: uint32" \
  $dolma2 --data.dtype=uint16 --data.train="$tmp/dolma2/saved-*.npy"
# shellcheck disable=SC2086
expect_refused "vocabulary too small" "set model.vocab_size" $dolma2 --model.vocab_size=50280 \
  --data.train="$tmp/dolma2/part-*.npy"
# shellcheck disable=SC2086
expect_refused "np.save int64" "'<i8' is not a token dtype" $dolma2 --data.train="$tmp/int64.npy"
# shellcheck disable=SC2086
expect_refused "np.save 2-D" "shape (64, 64) is not 1-D" $neox --data.train="$tmp/two_d.npy"
# shellcheck disable=SC2086
expect_refused "broken .npy header" "broken.npy: .npy header" $neox --data.train="$tmp/broken.npy"

echo "$fails failures"
[ $fails -eq 0 ]
