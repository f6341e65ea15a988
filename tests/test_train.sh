#!/usr/bin/env bash
# The trainer end to end on a small model:
#  1. resume is bit-exact: 20 steps straight == 10 steps, save, new process, 10 more
#     (same losses in metrics.jsonl, byte-identical model and optimizer files);
#     so is train.recompute=experts (and =gather) against keeping the activations;
#  2. SIGTERM finishes the step, commits a checkpoint and exits 0; a checkpoint
#     directory without COMMITTED is ignored on resume;
#  3. bad checkpoints (truncated, bad header length, overlapping or out-of-file
#     offsets, wrong dtype or shape, incompatible model config) are refused with
#     a clear message and a non-zero exit, and nothing saved is touched.
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }

# data: the license texts every Debian system has, byte-tokenized
$bin tokenize --out "$tmp/train.bin" --eval-out "$tmp/eval.bin" --eval-every 5 \
    /usr/share/common-licenses/* >/dev/null || { echo "tokenize failed"; exit 1; }
small=(--data.train="$tmp/train.bin" --data.eval="$tmp/eval.bin" --model.d_model=64
       --model.n_layers=2 --model.n_heads=4 --model.n_experts=4 --model.top_k=2
       --model.expert_hidden=64 --model.seq_len=32 --train.global_batch=8 --train.micro_batch=4
       --train.warmup_steps=3 --train.eval_interval=0 --logging.log_interval=5
       --train.skip_window=6 --train.skip_sigmas=3)
train() { $bin train configs/tiny.yaml "${small[@]}" "$@"; }
losses() { $py -c 'import json,sys; [print(json.loads(l)["step"], repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
tree_sum() { (cd "$1" && find . -type f | sort | xargs sha256sum); }

# ---- 1. bit-exact resume --------------------------------------------------------
train --train.steps=20 --checkpoint.interval=10 --logging.run_dir="$tmp/a" >"$tmp/a.log" 2>&1 \
    || { cat "$tmp/a.log"; bad "straight run failed"; }
train --train.steps=20 --checkpoint.interval=10 --logging.run_dir="$tmp/b" --stop-after=10 >"$tmp/b1.log" 2>&1 \
    || { cat "$tmp/b1.log"; bad "first half failed"; }
grep -q "stopped (--stop-after): step 10 of 20" "$tmp/b1.log" && ok "first process stopped at step 10" || bad "first process did not stop at 10"
train --train.steps=20 --checkpoint.interval=10 --logging.run_dir="$tmp/b" --resume >"$tmp/b2.log" 2>&1 \
    || { cat "$tmp/b2.log"; bad "resumed run failed"; }
grep -q "resume: loaded .*step-00000010" "$tmp/b2.log" && ok "second process resumed from step 10" || bad "no resume from step 10"
if diff <(losses "$tmp/a/metrics.jsonl") <(losses "$tmp/b/metrics.jsonl") >/dev/null; then
  ok "20 losses identical ($(losses "$tmp/a/metrics.jsonl" | sed -n '1p;$p' | tr '\n' ' '))"
else
  bad "losses differ"; diff <(losses "$tmp/a/metrics.jsonl") <(losses "$tmp/b/metrics.jsonl") | head
fi
for f in model.safetensors optim.safetensors; do
  cmp -s "$tmp/a/checkpoints/step-00000020/$f" "$tmp/b/checkpoints/step-00000020/$f" \
    && ok "step-20 $f byte-identical" || bad "step-20 $f differs"
done

# ---- 1b. train.recompute=experts|gather changes memory, not numbers -----------------------
for mode in experts gather; do
  train --train.steps=20 --checkpoint.interval=10 --logging.run_dir="$tmp/r-$mode" --train.recompute=$mode \
      >"$tmp/r-$mode.log" 2>&1 || { cat "$tmp/r-$mode.log"; bad "recompute=$mode run failed"; }
  if diff <(losses "$tmp/a/metrics.jsonl") <(losses "$tmp/r-$mode/metrics.jsonl") >/dev/null; then
    ok "recompute=$mode: 20 losses identical"
  else
    bad "recompute=$mode: losses differ"
  fi
  cmp -s "$tmp/a/checkpoints/step-00000020/model.safetensors" \
      "$tmp/r-$mode/checkpoints/step-00000020/model.safetensors" \
    && ok "recompute=$mode: step-20 model byte-identical" || bad "recompute=$mode: step-20 model differs"
done

# ---- 2. SIGTERM and uncommitted checkpoints ----------------------------------------
$bin train configs/tiny.yaml "${small[@]}" --train.steps=100000 --logging.run_dir="$tmp/s" --logging.log_interval=1 >"$tmp/s.log" 2>&1 &
pid=$!
for _ in $(seq 200); do
  [ -f "$tmp/s/metrics.jsonl" ] && [ "$(wc -l <"$tmp/s/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -TERM $pid
wait $pid; rc=$?
[ $rc -eq 0 ] && ok "SIGTERM: exit 0" || { cat "$tmp/s.log"; bad "SIGTERM: exit $rc"; }
last=$(tail -n 1 "$tmp/s/metrics.jsonl" | $py -c 'import json,sys; print(json.load(sys.stdin)["step"])')
ck=$(printf "%s/s/checkpoints/step-%08d" "$tmp" "$last")
[ -f "$ck/COMMITTED" ] && ok "SIGTERM: committed checkpoint at the last step ($last)" || bad "SIGTERM: no committed $ck"
grep -q "stopped by signal 15" "$tmp/s.log" && ok "SIGTERM: reported" || bad "SIGTERM: not reported"
# a crash mid-write: a newer directory without COMMITTED, and a .tmp one
crash=$(printf "%s/s/checkpoints/step-%08d" "$tmp" $((last + 5)))
mkdir -p "$crash" "$crash.tmp"; echo garbage >"$crash/model.safetensors"
train --train.steps=$((last + 1)) --logging.run_dir="$tmp/s" --resume >"$tmp/s2.log" 2>&1 \
    || { cat "$tmp/s2.log"; bad "resume after crash failed"; }
grep -q "resume: loaded $ck" "$tmp/s2.log" && ok "uncommitted step-$((last + 5)) ignored, resumed from step $last" \
    || { cat "$tmp/s2.log"; bad "resume did not use the committed checkpoint"; }

# ---- 3. bad checkpoints and configs leave everything as it was ------------------------
src="$tmp/a/checkpoints/step-00000020"
expect_refused() { # name, pattern, checkpoint dir setup function, extra args...
  local name=$1 pattern=$2; shift 2
  local run="$tmp/r_$name"
  rm -rf "$run"; mkdir -p "$run/checkpoints"; cp -r "$src" "$run/checkpoints/"
  "$@" "$run/checkpoints/step-00000020"
  local before after out rc
  before=$(tree_sum "$run")
  out=$(train --train.steps=30 --logging.run_dir="$run" --resume "${extra[@]}" 2>&1); rc=$?
  after=$(tree_sum "$run")
  if [ $rc -eq 0 ]; then bad "$name: accepted"; return; fi
  if ! grep -q -- "$pattern" <<<"$out"; then bad "$name: message lacks '$pattern': $(tail -n 2 <<<"$out")"; return; fi
  [ "$before" = "$after" ] || { bad "$name: files changed"; return; }
  ok "$name: refused (rc $rc), nothing touched: $(grep error <<<"$out" | head -n 1)"
}
mutate() { # python snippet editing the header of model.safetensors; $1 = dir
  local dir=$1
  $py - "$dir/model.safetensors" "$MUT" <<'EOF'
import json, struct, sys
path, mut = sys.argv[1], sys.argv[2]
raw = open(path, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
names = [k for k in hdr if k != '__metadata__']
first, second = names[0], names[1]
if mut == 'badlen':
    out = struct.pack('<Q', len(raw) * 2) + raw[8:]
elif mut == 'truncate':
    out = raw[:len(raw) - 100]
else:
    if mut == 'overlap':
        hdr[second]['data_offsets'][0] -= 4
    elif mut == 'outside':
        hdr[second]['data_offsets'] = [len(data) + 8, len(data) + 8 + hdr[second]['data_offsets'][1] - hdr[second]['data_offsets'][0]]
    elif mut == 'dtype':
        hdr[first]['dtype'] = 'F16'; b, e = hdr[first]['data_offsets']
        # keep the file consistent so that only the dtype is wrong
        hdr[first]['shape'] = [hdr[first]['shape'][0] * 2] + hdr[first]['shape'][1:]
    elif mut == 'shape':
        s = hdr[first]['shape']; hdr[first]['shape'] = [s[1], s[0]] if s[0] != s[1] else [s[0] * s[1]]
    j = json.dumps(hdr).encode()
    j += b' ' * (-len(j) % 8)
    out = struct.pack('<Q', len(j)) + j + data
open(path, 'wb').write(out)
EOF
}
extra=()
MUT=truncate expect_refused truncated "model.safetensors" mutate
MUT=badlen expect_refused bad_header_length "model.safetensors" mutate
MUT=overlap expect_refused overlapping_offsets "model.safetensors" mutate
MUT=outside expect_refused offsets_outside_file "model.safetensors" mutate
MUT=dtype expect_refused wrong_dtype "embed" mutate
MUT=shape expect_refused wrong_shape "embed" mutate
rm_optim() { rm "$1/optim.safetensors"; }
expect_refused missing_optim "optim.safetensors" rm_optim
bad_state() { echo '{"format": 1' >"$1/train_state.json"; }
expect_refused bad_train_state "train_state.json" bad_state
noop() { :; }
extra=(--model.d_model=128)
expect_refused incompatible_config "model.d_model" noop
extra=(--model.gating=sigmoid)
expect_refused incompatible_gating "model.gating" noop
extra=(--data.train="$tmp/missing.bin")
expect_refused missing_data_file "missing.bin" noop
extra=(--model.d_modle=3)
expect_refused unknown_key "did you mean model.d_model" noop

# ---- 4. moecore bench on synthetic tokens ------------------------------------------------------
out=$($bin bench configs/tiny.yaml --steps=4 --warmup=1 --record="$tmp/bench.jsonl" --model.d_model=64 \
      --model.n_layers=2 --model.n_heads=4 --model.n_experts=4 --model.expert_hidden=64 --model.seq_len=32 \
      --train.global_batch=4 --train.micro_batch=2 2>&1); rc=$?
row=$(grep -E "^configs/tiny.yaml +[0-9]+" <<<"$out")
if [ $rc -eq 0 ] && [ -n "$row" ] && $py -c 'import json,sys; r=json.loads(open(sys.argv[1]).read()); assert r["tokens_per_s"] > 0 and r["steps"] == 4' "$tmp/bench.jsonl"; then
  ok "bench: $row"
else echo "$out" | tail; bad "bench failed (rc $rc)"; fi

echo "$fails failures"
[ $fails -eq 0 ]
