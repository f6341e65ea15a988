#!/usr/bin/env bash
# logging.tensorboard: a short run of configs/tiny.yaml (a dense first layer,
# two MoE layers, an eval, stopped after 3 steps and resumed to 6, so two
# event files) writes TensorBoard event files next to metrics.jsonl, and
#  (a) an independent reader here (TFRecord framing and both masked CRC32Cs
#      checked, protobuf decoded by hand) finds the file_version event and,
#      at every step, exactly the expected tags with the values of that
#      step's metrics.jsonl record (float32);
#  (b) TensorBoard's own reader (EventAccumulator) loads the directory with
#      the same tags and values, each step once; skipped with a message when
#      no python3 has the tensorboard package (pip install tensorboard).
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
py=/usr/bin/python3
[ -x "$bin" ] || { echo "FAIL: $bin missing; run make build/moecore"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

$py -c "
import random, struct, sys
r = random.Random(3)
for name, n in (('train', 8192), ('eval', 1024)):
    open(f'{sys.argv[1]}/{name}.bin', 'wb').write(struct.pack(f'<{n}H', *[r.randrange(257) for _ in range(n)]))
" "$tmp"
args=(train configs/tiny.yaml --data.train="$tmp/train.bin" --data.eval="$tmp/eval.bin" --train.steps=6
      --train.warmup_steps=2 --train.eval_interval=2 --train.eval_batches=1 --train.global_batch=4
      --train.micro_batch=2 --model.seq_len=32 --model.n_layers=3 --model.dense_layers=1 --logging.log_interval=1
      --logging.gerrymander_window=4 --checkpoint.interval=0 --logging.tensorboard=true --logging.run_dir="$tmp/run")
"$bin" "${args[@]}" --stop-after=3 > "$tmp/first.log" 2>&1 || { tail "$tmp/first.log"; fail "first half failed"; }
sleep 1 # the event file's name carries the second it was opened in
"$bin" "${args[@]}" --resume > "$tmp/second.log" 2>&1 || { tail "$tmp/second.log"; fail "resumed half failed"; }
n=$(ls "$tmp/run" | grep -c 'tfevents')
[ "$n" -eq 2 ] && echo "ok: two event files (one per process) next to metrics.jsonl" || fail "$n event files, expected 2"

# the tags expected from a metrics.jsonl record; shared by (a) and (b)
cat > "$tmp/expect.py" <<'PY'
import json, math
def expected(run):
    recs = {}
    for line in open(run + "/metrics.jsonl"):
        r = json.loads(line)
        recs[r["step"]] = r   # a resumed step keeps its last record
    out = {}
    for s, r in recs.items():
        t = {
            "train/CE loss": r["ce"], "train/PPL": math.exp(r["ce"]),
            "train/load balancing loss": r["lb"], "train/load balancing loss unscaled": r["lb_raw"],
            "train/router Z loss": r["z_loss"], "train/router Z loss unscaled": r["z_loss_raw"],
            "optim/LR (group 0)": r["lr"], "optim/total grad norm": r["grad_norm"],
            "optim/step skipped": float(r["skipped"]), "throughput/total tokens": r["tokens"],
            "throughput/device/TPS": r["tokens_per_s_device"], "throughput/device/MFU": 100 * r["mfu"],
            "train/total loss": r["loss"], "optim/clip scale": r["clip_scale"],
            "throughput/device/TFLOPS": r["tflops_per_device"],
            "train/load imbalance": max(l["load_max_over_mean"] for l in r["moe_layers"]),
        }
        if "eval_ce" in r: t["eval/CE loss"] = r["eval_ce"]
        for layer, l in zip((1, 2), r["moe_layers"]):   # layer 0 is dense
            b = f"train/block {layer:02d}/"
            t[b + "load imbalance"] = l["load_max_over_mean"]
            t[b + "load balancing loss"] = 0.01 * l["lb_raw"]     # tiny.yaml's lb_coef
            t[b + "load balancing loss unscaled"] = l["lb_raw"]
            t[b + "router Z loss"] = 0.001 * l["z_raw"]           # and z_coef
            t[b + "router Z loss unscaled"] = l["z_raw"]
            t[b + "dead experts"] = l["dead_experts"]
            t[b + "dropped fraction"] = l["dropped_fraction"]
            t[b + "gerrymander flag"] = float(l["gerrymander_flag"])
        out[s] = t
    return out
def close(got, want):
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))   # float32 scalars
PY

# ---- (a) the independent reader ---------------------------------------------------------
if out=$($py - "$tmp/run" "$tmp" 2>&1 <<'PY'
import glob, struct, sys
sys.path.insert(0, sys.argv[2])
from expect import expected, close
def crc32c(data):
    c = 0xffffffff
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82f63b78 if c & 1 else c >> 1
    return c ^ 0xffffffff
def masked(c):
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
def records(path):
    raw, off = open(path, "rb").read(), 0
    while off < len(raw):
        n, hc = struct.unpack_from("<QI", raw, off)
        assert hc == masked(crc32c(raw[off:off + 8])), f"{path}: bad length CRC at {off}"
        data = raw[off + 12:off + 12 + n]
        (dc,) = struct.unpack_from("<I", raw, off + 12 + n)
        assert dc == masked(crc32c(data)), f"{path}: bad data CRC at {off}"
        yield data
        off += 16 + n
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1; v |= (x & 0x7f) << s; s += 7
        if not x & 0x80: return v, i
def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0: v, i = varint(b, i)
        elif w == 1: v = struct.unpack_from("<d", b, i)[0]; i += 8
        elif w == 5: v = struct.unpack_from("<f", b, i)[0]; i += 4
        elif w == 2: n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise AssertionError(f"wire type {w}")
        yield f, v
want = expected(sys.argv[1])
seen = {}
for path in sorted(glob.glob(sys.argv[1] + "/events.out.tfevents.*")):
    evs = list(records(path))
    first = dict(fields(evs[0]))
    assert first.get(3) == b"brain.Event:2" and first.get(1, 0) > 1.7e9, f"{path}: first event {first}"
    for e in evs[1:]:
        ev = dict(fields(e))
        step, tags = ev[2], {}
        for f, v in fields(ev[5]):
            assert f == 1
            val = dict(fields(v))
            tags[val[1].decode()] = val[2]
        assert step not in seen, f"step {step} written twice"
        seen[step] = tags
assert sorted(seen) == sorted(want) == list(range(1, 7)), f"steps {sorted(seen)}"
n = 0
for s, tags in seen.items():
    assert set(tags) == set(want[s]), f"step {s}: missing {set(want[s]) - set(tags)}, extra {set(tags) - set(want[s])}"
    for t, v in tags.items():
        assert close(v, want[s][t]), f"step {s} {t}: {v} in the event file, {want[s][t]} in metrics.jsonl"
        n += 1
print(f"{len(seen)} steps, {n} scalars, CRCs and values as metrics.jsonl says "
      f"({len(want[6])} tags at step 6, eval/CE loss at steps {[s for s in seen if 'eval/CE loss' in seen[s]]})")
PY
); then echo "ok: independent reader: $out"; else fail "independent reader: $out"; fi

# ---- (b) TensorBoard's EventAccumulator ---------------------------------------------------
tbpy=
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import tensorboard' 2>/dev/null; then tbpy=$p; break; fi
done
if [ -z "$tbpy" ]; then
  echo "SKIP: (b) EventAccumulator: no python3 here has the tensorboard package (pip install tensorboard)"
elif out=$("$tbpy" - "$tmp/run" "$tmp" 2>&1 <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from expect import expected, close
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
want = expected(sys.argv[1])
tags = set(ea.Tags()["scalars"])
all_tags = set().union(*want.values())
assert tags == all_tags, f"missing {all_tags - tags}, extra {tags - all_tags}"
n = 0
for tag in sorted(tags):
    events = ea.Scalars(tag)
    steps = [e.step for e in events]
    assert steps == sorted(s for s in want if tag in want[s]), f"{tag}: steps {steps}"
    for e in events:
        assert close(e.value, want[e.step][tag]), f"{tag} step {e.step}: {e.value} vs {want[e.step][tag]}"
        n += 1
import tensorboard
print(f"tensorboard {tensorboard.__version__}: {len(tags)} tags, {n} scalars equal to metrics.jsonl")
PY
); then echo "ok: EventAccumulator ($tbpy): $out"; else fail "EventAccumulator ($tbpy): $out"; fi

echo "$fails failures"
[ $fails -eq 0 ]
