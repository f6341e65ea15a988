#!/usr/bin/env bash
# scripts/plot_metrics.py draws a run's metrics.jsonl: on a short real run of
# configs/tiny.yaml (6 steps, with an eval), and on a hand-written file with
# flagged, skipped and eval steps, a missing key and a truncated last line
# (skipped with a warning); and run as a program while the python3 first on
# PATH lacks matplotlib. Each PNG must exist, start with the PNG
# signature and not be trivially small; a file with no records is an error.
set -u
cd "$(dirname "$0")/.."
bin=build/moecore
py=/usr/bin/python3
[ -x "$bin" ] || { echo "FAIL: $bin missing; run make build/moecore"; exit 1; }
$py -c 'import matplotlib, numpy' 2>/dev/null ||
  { echo "FAIL: $py lacks matplotlib or numpy (Debian packages python3-matplotlib python3-numpy)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

check_png() { # path, what
  local f=$1
  if [ ! -f "$f" ]; then fail "$2: $f not written"; return; fi
  local magic size
  magic=$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')
  size=$(stat -c %s "$f")
  [ "$magic" = 89504e470d0a1a0a ] || fail "$2: $f is not a PNG (starts with $magic)"
  [ "$size" -gt 20000 ] || fail "$2: $f is only $size bytes"
  [ "$magic" = 89504e470d0a1a0a ] && [ "$size" -gt 20000 ] && echo "ok: $2: $f, PNG, $size bytes"
}

# ---- a short real run --------------------------------------------------------------
$py -c "
import random, struct, sys
r = random.Random(2)
for name, n in (('train', 8192), ('eval', 1024)):
    open(f'{sys.argv[1]}/{name}.bin', 'wb').write(struct.pack(f'<{n}H', *[r.randrange(257) for _ in range(n)]))
" "$tmp"
if "$bin" train configs/tiny.yaml --data.train="$tmp/train.bin" --data.eval="$tmp/eval.bin" \
     --train.steps=6 --train.warmup_steps=2 --train.eval_interval=3 --train.eval_batches=1 \
     --train.global_batch=4 --train.micro_batch=2 --model.seq_len=32 --model.n_layers=2 \
     --logging.log_interval=2 --logging.gerrymander_window=4 --checkpoint.interval=0 \
     --logging.run_dir="$tmp/run" > "$tmp/train.log" 2>&1; then
  n=$(wc -l < "$tmp/run/metrics.jsonl")
  [ "$n" = 6 ] || fail "the run logged $n metrics lines, expected 6"
  if $py scripts/plot_metrics.py "$tmp/run/metrics.jsonl" > "$tmp/plot.log" 2>&1; then
    cat "$tmp/plot.log"
    check_png "$tmp/run/metrics.png" "real run (default output)"
  else
    fail "plot_metrics.py failed on the real run: $(cat "$tmp/plot.log")"
  fi
  $py scripts/plot_metrics.py "$tmp/run" -o "$tmp/dir.png" >/dev/null 2>&1 || fail "plot_metrics.py RUN_DIR -o failed"
  check_png "$tmp/dir.png" "real run (RUN_DIR, -o)"
else
  fail "training run failed: $(tail -5 "$tmp/train.log")"
fi

# ---- a hand-written file ----------------------------------------------------------------
# step 3 lacks grad_norm and lr, step 4 is flagged in layer 1 and skipped, step 5 has
# an eval, step 2 is logged twice (a resume), and the last line is cut off.
layer() { # max/mean, flag
  printf '{"lb_raw":1.02,"z_raw":3.5,"load_max_over_mean":%s,"load_min_over_mean":0.5,"gerrymander_flag":%s}' "$1" "$2"
}
rec() { # step, loss, lb, lr, gnorm, layer0, layer1, extra
  printf '{"step":%s,"loss":%s,"ce":%s,"lb_raw":%s,"z_loss_raw":7.1,%s%s"moe_layers":[%s,%s]%s}\n' \
    "$1" "$2" "$2" "$3" "${4:+\"lr\":$4,}" "${5:+\"grad_norm\":$5,}" "$6" "$7" "$8"
}
{
  rec 1 5.6 2.10 1e-4 3.2 "$(layer 1.9 false)" "$(layer 2.3 false)" ""
  rec 2 5.9 2.08 2e-4 2.9 "$(layer 1.8 false)" "$(layer 2.4 false)" ""
  rec 2 5.4 2.08 2e-4 2.9 "$(layer 1.8 false)" "$(layer 2.4 false)" ""
  rec 3 5.2 2.05 "" "" "$(layer 1.7 false)" "$(layer 2.6 false)" ""
  rec 4 5.0 2.02 3e-4 9.5 "$(layer 1.7 false)" "$(layer 2.9 true)" ',"skipped":true,"gerrymander_flag":true'
  rec 5 4.8 2.01 3e-4 1.7 "$(layer 1.6 false)" "$(layer 3.1 true)" ',"eval_ce":4.9,"gerrymander_flag":true'
  rec 6 4.7 2.00 2e-4 1.5 "$(layer 1.5 false)" "$(layer 3.0 false)" "" | head -c 60
} > "$tmp/hand.jsonl"
if $py scripts/plot_metrics.py "$tmp/hand.jsonl" -o "$tmp/hand.png" > "$tmp/hand.log" 2>&1; then
  cat "$tmp/hand.log"
  grep -q "hand.jsonl:7: skipping last line" "$tmp/hand.log" || fail "no warning for the truncated last line: $(cat "$tmp/hand.log")"
  grep -q "5 steps" "$tmp/hand.log" || fail "expected 5 steps plotted: $(cat "$tmp/hand.log")"
  check_png "$tmp/hand.png" "hand-written jsonl"
else
  fail "plot_metrics.py failed on the hand-written file: $(cat "$tmp/hand.log")"
fi

# ---- run as a program, with a python3 first on PATH that lacks matplotlib ---------------
# (as pyenv's or a venv's may): the shebang names the Python that install-deps.sh
# gave numpy and matplotlib
mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\necho "python3 from PATH, without matplotlib" >&2\nexit 3\n' > "$tmp/fakebin/python3"
chmod +x "$tmp/fakebin/python3"
if [ -f "$tmp/run/metrics.jsonl" ]; then
  if PATH="$tmp/fakebin:$PATH" scripts/plot_metrics.py "$tmp/run" -o "$tmp/exec.png" > "$tmp/exec.log" 2>&1; then
    check_png "$tmp/exec.png" "scripts/plot_metrics.py run as a program"
  else
    fail "scripts/plot_metrics.py as a program: $(cat "$tmp/exec.log")"
  fi
fi

# ---- configs/routing/report.py: the routing-health table of the real run ----------------
# (its row: 6 steps, the best eval CE as the metrics hold it; a plot and a CSV per run)
if [ -f "$tmp/run/metrics.jsonl" ]; then
  mkdir -p "$tmp/routing/tiny-m-softmax-lb" && cp "$tmp/run/metrics.jsonl" "$tmp/routing/tiny-m-softmax-lb/"
  if $py configs/routing/report.py "$tmp/routing" -o "$tmp/rout" > "$tmp/report.md" 2> "$tmp/report.err"; then
    best=$($py -c "
import json, sys
e = [(json.loads(l)['eval_ce'], json.loads(l)['step']) for l in open(sys.argv[1]) if 'eval_ce' in json.loads(l)]
print('%.3f (%d)' % min(e))" "$tmp/run/metrics.jsonl")
    row=$(grep '^| tiny-m-softmax-lb | 6 |' "$tmp/report.md")
    [ -n "$row" ] || fail "report.py: no row for the run with 6 steps: $(cat "$tmp/report.md")"
    case "$row" in *"| $best |"*) echo "ok: report.py row, best eval CE $best";; *) fail "report.py: best eval CE $best not in: $row";; esac
    check_png "$tmp/rout/routing-tiny-m.png" "report.py plot"
    [ "$(head -1 "$tmp/rout/summary-tiny-m-softmax-lb.csv" | cut -d, -f1-3)" = "step,ce,eval_ce" ] ||
      fail "report.py: summary CSV header: $(head -1 "$tmp/rout/summary-tiny-m-softmax-lb.csv")"
  else
    fail "report.py failed: $(cat "$tmp/report.err")"
  fi
  mkdir -p "$tmp/norun"
  $py configs/routing/report.py "$tmp/norun" > /dev/null 2>&1 && fail "report.py accepted a directory without runs"
fi

# ---- nothing to plot: an error, no PNG ---------------------------------------------------
printf '{"step": 1, "loss' > "$tmp/empty.jsonl"
if $py scripts/plot_metrics.py "$tmp/empty.jsonl" -o "$tmp/empty.png" > "$tmp/empty.log" 2>&1; then
  fail "a file with no complete record was accepted"
elif [ -e "$tmp/empty.png" ]; then
  fail "a file with no complete record wrote a PNG"
else
  echo "ok: no records -> $(tail -1 "$tmp/empty.log")"
fi
$py scripts/plot_metrics.py "$tmp/none.jsonl" > /dev/null 2>&1 && fail "a missing file was accepted"

echo "$fails failures"
[ $fails -eq 0 ]
