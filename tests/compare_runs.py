#!/usr/bin/env python3
# Two training runs against each other (tests/lib_ranks.sh): the worst
# relative loss difference over the steps from FIRST (and the eval CE where
# both logged one), and the worst norm-wise relative difference of the final
# checkpoint's FP32 tensors. Exit 0 when both are within their tolerances.
#   compare_runs.py RUN_A RUN_B TOL_LOSS TOL_WEIGHTS FIRST
import json, struct, sys, math, glob
a, b, tl, tw, first = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
la = {r["step"]: r for r in map(json.loads, open(a + "/metrics.jsonl"))}
lb = {r["step"]: r for r in map(json.loads, open(b + "/metrics.jsonl"))}
steps = [s for s in sorted(lb) if s >= first]
worst = max(abs(la[s]["loss"] - lb[s]["loss"]) / abs(la[s]["loss"]) for s in steps)
ev = [abs(la[s]["eval_ce"] - lb[s]["eval_ce"]) / la[s]["eval_ce"] for s in steps if "eval_ce" in la[s]]
if ev: worst = max(worst, max(ev))
def load(d):
    path = sorted(glob.glob(d + "/checkpoints/step-*/model.safetensors"))[-1]
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); out = {}
    for k, v in hdr.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), raw[8 + n + s:8 + n + e])
    return out
wa, wb = load(a), load(b)
assert wa.keys() == wb.keys(), "tensor names differ"
ww = 0
for k in wa:
    d = math.sqrt(sum((x - y) ** 2 for x, y in zip(wa[k], wb[k]))); r = math.sqrt(sum(x * x for x in wa[k])) or 1
    ww = max(ww, d / r)
print(f"steps {steps[0]}..{steps[-1]}: worst loss rel err {worst:.2e} (<= {tl:g}){' (eval too)' if ev else ''}, "
      f"worst weight rel err {ww:.2e} (<= {tw:g})")
sys.exit(0 if worst <= tl and ww <= tw else 1)
