#!/usr/bin/env bash
# The trainer end to end on a small model:
#  1. resume is bit-exact: 20 steps straight == 10 steps, save, new process, 10 more
#     (same losses in metrics.jsonl, byte-identical model and optimizer files);
#     so is train.recompute=experts (and =gather) against keeping the activations;
#  2. SIGTERM finishes the step, commits a checkpoint and exits 0; a checkpoint
#     directory without COMMITTED is ignored on resume;
#  3. bad checkpoints (truncated, bad header length, overlapping or out-of-file
#     offsets, wrong dtype or shape, incompatible model config) are refused with
#     a clear message and a non-zero exit, and nothing saved is touched;
#  4. moecore bench on synthetic tokens;
#  5. a fresh run where committed checkpoints are is refused (naming --resume
#     and --overwrite) with nothing touched; --overwrite replaces them;
#  6. a second trainer on a run directory in use is refused with the holder's
#     pid, also with --overwrite (nothing deleted); a kill -9 leaves no stale lock;
#  7. divergence: NaN/Inf steps are skipped, max_nonfinite_steps in a row stop
#     the run (exit 2, a message, also with eval on), metrics.jsonl stays strict
#     JSON (null + "nonfinite"), no checkpoint holds a NaN or Inf or follows a
#     non-finite step, and keep never deletes the newest finite one; a NaN
#     eval CE is reported as such;
#  8. outputs are checked before the first step (an unwritable checkpoint.dir or
#     logging.run_dir), and a failed write to metrics.jsonl (/dev/full) ends the run;
#  9. the grad norm from the last backward's weight-grads equals a separate pass.
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

# ---- 1b. train.recompute=experts|gather|layers changes memory, not numbers -----------------------
for mode in experts gather layers; do
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

# ---- 5. a run directory keeps its own checkpoints ------------------------------------------------
ab="$tmp/ab"
train --train.steps=10 --checkpoint.interval=5 --logging.run_dir="$ab" >"$tmp/ab1.log" 2>&1 \
    || { cat "$tmp/ab1.log"; bad "run A failed"; }
before=$(tree_sum "$ab")
out=$(train --train.steps=10 --checkpoint.interval=5 --logging.run_dir="$ab" --optim.lr=1e-2 --train.seed=5 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q -- "--resume" <<<"$out" && grep -q -- "--overwrite" <<<"$out" && ! grep -q "^step" <<<"$out" \
   && [ "$before" = "$(tree_sum "$ab")" ]; then
  ok "fresh run beside committed checkpoints refused (rc $rc), nothing touched: $(grep error <<<"$out")"
else
  echo "$out" | tail -n 3; bad "fresh run beside committed checkpoints: rc $rc, or files changed"
fi
out=$(train --train.steps=10 --logging.run_dir="$ab" --resume --overwrite 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "exclude each other" <<<"$out" && [ "$before" = "$(tree_sum "$ab")" ] \
  && ok "--resume with --overwrite refused" || bad "--resume --overwrite: rc $rc: $out"
cp "$ab/checkpoints/step-00000010/model.safetensors" "$tmp/a10.safetensors"
out=$(train --train.steps=10 --checkpoint.interval=5 --logging.run_dir="$ab" --optim.lr=1e-2 --train.seed=5 --overwrite 2>&1); rc=$?
seed=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["seed"])' "$ab/checkpoints/step-00000010/train_state.json")
if [ $rc -eq 0 ] && grep -q "overwrite: removed 2 checkpoint directories" <<<"$out" && [ "$seed" = 5 ] \
   && ! cmp -s "$tmp/a10.safetensors" "$ab/checkpoints/step-00000010/model.safetensors" \
   && [ "$(wc -l <"$ab/metrics.jsonl")" -eq 10 ] && [ "$(grep -c "checkpoint: saved" <<<"$out")" -eq 2 ]; then
  ok "--overwrite: the old checkpoints removed, steps 5 and 10 are the new run's (seed $seed), metrics.jsonl restarted"
else
  echo "$out" | tail -n 5; bad "--overwrite: rc $rc, seed $seed"
fi

# ---- 6. one trainer per run directory ------------------------------------------------------------
lk="$tmp/lk"
wait_steps() { # run dir, n: until metrics.jsonl has n lines
  for _ in $(seq 300); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l <"$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# the holder saves no checkpoint while the others try (one it pruned could not be loaded)
train --train.steps=4 --checkpoint.interval=2 --logging.run_dir="$lk" >"$tmp/lk0.log" 2>&1 || bad "lock: first run failed"
$bin train configs/tiny.yaml "${small[@]}" --train.steps=100000 --logging.run_dir="$lk" --logging.log_interval=1 \
    --resume >"$tmp/lk1.log" 2>&1 &
holder=$!
wait_steps "$lk" 7 || bad "lock: the first trainer did not start"
out=$(timeout 60 $bin train configs/tiny.yaml "${small[@]}" --train.steps=3 --logging.run_dir="$lk" --resume 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "in use by another trainer (pid $holder on host" <<<"$out"; then
  ok "second trainer (--resume) refused (rc $rc): $(grep error <<<"$out")"
else echo "$out" | tail -n 3; bad "second trainer on $lk: rc $rc"; fi
out=$(timeout 60 $bin train configs/tiny.yaml "${small[@]}" --train.steps=3 --logging.run_dir="$lk" --overwrite 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "pid $holder" <<<"$out" && ! grep -q "overwrite: removed" <<<"$out" \
   && ls "$lk/checkpoints" | grep -q "^step-"; then
  ok "second trainer (--overwrite) refused, the holder's checkpoints kept"
else echo "$out" | tail -n 3; bad "second trainer with --overwrite: rc $rc"; fi
kill -TERM $holder; wait $holder; rc=$?
[ $rc -eq 0 ] && ok "the holder ended normally after the refusals" || { tail -n 3 "$tmp/lk1.log"; bad "holder: exit $rc"; }
# a crash leaves the lock file but no lock: --resume goes on
$bin train configs/tiny.yaml "${small[@]}" --train.steps=100000 --logging.run_dir="$lk" --logging.log_interval=1 \
    --resume >"$tmp/lk2.log" 2>&1 &
victim=$!
wait_steps "$lk" $(( $(wc -l <"$lk/metrics.jsonl") + 3 )) || bad "lock: the resumed trainer did not run"
kill -9 $victim; wait $victim 2>/dev/null
out=$(train --train.steps=100000 --logging.run_dir="$lk" --resume --stop-after=1 2>&1); rc=$?
if [ -f "$lk/moecore.lock" ] && [ $rc -eq 0 ] && grep -q "resume: loaded" <<<"$out"; then
  ok "after kill -9 of the holder, --resume runs (moecore.lock left behind holds no lock)"
else echo "$out" | tail -n 3; bad "resume after kill -9: rc $rc"; fi

# ---- 7. divergence stops the run before it costs checkpoints -----------------------------------------
dv="$tmp/dv"
train --train.steps=10 --checkpoint.interval=5 --logging.run_dir="$dv" >"$tmp/dv1.log" 2>&1 || bad "dv: good run failed"
# the issue's reproduction, from the good step-10, with eval on every step and keep 1
out=$(train --train.steps=40 --checkpoint.interval=2 --checkpoint.keep=1 --optim.lr=1e4 --train.clip_grad=0 \
      --train.skip_window=0 --train.eval_interval=1 --logging.run_dir="$dv" --resume 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "steps in a row with a non-finite loss or grad norm (train.max_nonfinite_steps 5" <<<"$out" \
   && grep -q "the run has diverged" <<<"$out" && ! grep -qE "error: eval: *$" <<<"$out"; then
  ok "divergence: rc 2: $(grep -o 'error: step [0-9]*: [^(]*' <<<"$out")"
else echo "$out" | grep -v "^step" | tail -n 5; bad "divergence: rc $rc"; fi
if r=$($py - "$dv" 2>&1 <<'PY'
import glob, json, math, struct, sys
run = sys.argv[1]
def strict(x): raise ValueError("bare " + x + " in metrics.jsonl")
rows = [json.loads(l, parse_constant=strict) for l in open(run + "/metrics.jsonl")]
bad = [r for r in rows if r["loss"] is None or r["grad_norm"] is None]
assert bad, "no non-finite step recorded"
for r in bad:
    assert r["skipped"] is True, f"step {r['step']}: a non-finite step was applied"
    for k in ("loss", "grad_norm"):
        if r[k] is None: assert k in r["nonfinite"], f"step {r['step']}: {k} null but not flagged"
tail = [r["step"] for r in rows[-5:]]
assert all(r in bad for r in rows[-5:]) and rows[-6] not in bad, f"stopped after other than 5 in a row: {tail}"
ckpts = sorted(glob.glob(run + "/checkpoints/step-*[0-9]"))
assert ckpts and all(glob.glob(c + "/COMMITTED") for c in ckpts), "no committed checkpoint left"
bad_steps = {r["step"] for r in bad}
for c in ckpts:
    assert int(c.split("-")[-1]) not in bad_steps, c + " was saved after a non-finite step"
for c in ckpts:
    for f in ("model.safetensors", "optim.safetensors"):
        raw = open(c + "/" + f, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
        vals = struct.unpack("<%df" % ((len(raw) - 8 - n) // 4), raw[8 + n:])
        assert all(math.isfinite(v) for v in vals), c + "/" + f + " holds a NaN or Inf"
print(f"{len(rows)} strict JSON records, {len(bad)} non-finite steps skipped and flagged, "
      f"stopped at step {rows[-1]['step']}; checkpoints left: {[c.split('/')[-1] for c in ckpts]}, all finite")
PY
); then ok "divergence: $r"; else bad "divergence: $(tail -n 1 <<<"$r")"; fi
# an Inf in a resumed weight: every loss and eval CE is NaN, nothing is saved, a real eval message
inf="$tmp/inf"
mkdir -p "$inf/checkpoints" && cp -r "$tmp/a/checkpoints/step-00000020" "$inf/checkpoints/"
$py - "$inf/checkpoints/step-00000020/model.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read()); n = struct.unpack("<Q", raw[:8])[0]
b = json.loads(raw[8:8 + n])["layers.0.attn.wq"]["data_offsets"][0]
raw[8 + n + b:8 + n + b + 4] = struct.pack("<f", float("inf"))
open(sys.argv[1], "wb").write(raw)
PY
out=$(train --train.steps=40 --checkpoint.interval=1 --train.eval_interval=1 --logging.run_dir="$inf" --resume 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "eval ce .*nan: not finite, the model has diverged" <<<"$out" \
   && grep -q "step 25: 5 steps in a row" <<<"$out" && [ "$(ls "$inf/checkpoints" | grep -c '^step-')" -eq 1 ] \
   && [ "$(grep -c "not saved: its loss or grad norm is not finite" <<<"$out")" -eq 4 ] \
   && $py -c 'import json, sys
def strict(x): raise ValueError(x)
rows = [json.loads(l, parse_constant=strict) for l in open(sys.argv[1])][-5:]
assert all(r["eval_ce"] is None and "eval_ce" in r["nonfinite"] and r["loss"] is None for r in rows)' "$inf/metrics.jsonl"; then
  ok "an Inf weight: eval CE reported as not finite, recorded as null, no checkpoint saved, stopped after 5 steps"
else echo "$out" | grep -v "^step" | tail -n 4; bad "Inf weight: rc $rc"; fi
out=$(train --train.steps=40 --checkpoint.interval=0 --optim.lr=1e4 --train.clip_grad=0 --train.skip_window=0 \
      --train.max_nonfinite_steps=2 --logging.run_dir="$tmp/dv2" 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q "2 steps in a row" <<<"$out" && ! ls "$tmp/dv2/checkpoints" 2>/dev/null | grep -q "^step-"; then
  ok "train.max_nonfinite_steps=2 stops after 2, no final checkpoint of the diverged weights"
else echo "$out" | grep -v "^step" | tail -n 3; bad "max_nonfinite_steps=2: rc $rc"; fi

# ---- 8. outputs checked before the first step --------------------------------------------------------
: >"$tmp/a_file"
out=$(train --train.steps=30 --logging.run_dir="$tmp/o1" --checkpoint.dir="$tmp/a_file/ckpt" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "checkpoint.dir $tmp/a_file/ckpt" <<<"$out" && ! grep -q "^step" <<<"$out" \
   && [ ! -s "$tmp/o1/metrics.jsonl" ]; then
  ok "unwritable checkpoint.dir refused before the first step: $(grep error <<<"$out")"
else echo "$out" | tail -n 2; bad "unwritable checkpoint.dir: rc $rc"; fi
out=$(train --train.steps=30 --logging.run_dir="$tmp/a_file/run" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "logging.run_dir $tmp/a_file/run" <<<"$out" && ! grep -q "^step" <<<"$out" \
  && ok "unwritable logging.run_dir refused before the first step" || { echo "$out" | tail -n 2; bad "unwritable run_dir: rc $rc"; }
if [ -w /dev/full ]; then
  mkdir -p "$tmp/full" && ln -s /dev/full "$tmp/full/metrics.jsonl"
  out=$(train --train.steps=5 --logging.run_dir="$tmp/full" 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "cannot write $tmp/full/metrics.jsonl: No space left on device" <<<"$out" \
    && ok "metrics.jsonl on a full disk ends the run (rc $rc): $(grep error <<<"$out")" \
    || { echo "$out" | tail -n 2; bad "metrics.jsonl on /dev/full: rc $rc"; }
else
  echo "skip: /dev/full is not writable here; the full-disk case is not tested"
fi

# ---- 9. the grad norm's expert share from the last backward's weight-grads ---------------------------
# (the default where the expert grads are final after it) against a pass over
# the grads (MOECORE_GRAD_NORM=separate): the same norms within 1e-12 (two
# FP64 orders) and so the same losses, clipping active (clip_scale < 1)
train --train.steps=8 --checkpoint.interval=0 --logging.run_dir="$tmp/gn1" >"$tmp/gn1.log" 2>&1 || bad "grad norm run failed"
MOECORE_GRAD_NORM=separate train --train.steps=8 --checkpoint.interval=0 --logging.run_dir="$tmp/gn2" >"$tmp/gn2.log" 2>&1 \
  || bad "grad norm run (separate) failed"
if grep -q "grad norm: the expert grads' squares summed by the last backward" "$tmp/gn1.log" &&
   ! grep -q "grad norm:" "$tmp/gn2.log" &&
   $py - "$tmp/gn1/metrics.jsonl" "$tmp/gn2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"grad_norm"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 8, (len(a), len(b))
assert any(r["clip_scale"] < 1 for r in a), "no step clipped"
for x, y in zip(a, b):
    assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-12 * y["grad_norm"], (x["step"], x["grad_norm"], y["grad_norm"])
    assert abs(x["loss"] - y["loss"]) <= 1e-9 * abs(y["loss"]), (x["step"], x["loss"], y["loss"])
PY
then ok "grad norm from the weight-grads' slots = a pass over the grads (8 steps, clipped, within 1e-12)"
else bad "grad norm from the slots differs from the separate pass (or was not used)"; fi

echo "$fails failures"
[ $fails -eq 0 ]
