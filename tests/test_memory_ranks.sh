#!/usr/bin/env bash
# The one memory model (train/memory.h: memory_plan, whose activations are
# the arena's own measuring carve, model_arena_plan) against what CPU ranks
# under Open MPI allocate: every rank prints its plan's peak at start and,
# at the end, the peak of the CPU backend's allocation counters (ops.h
# ops_cpu_alloc_stats: every ops_cpu.alloc and the symmetric memory's
# shared window). For each layout (one rank; dp 2; dp 2 sharded; dp 2 x
# ep 2 with the symmetric dispatch; ep 2 with the all-to-all; pp 2 1F1B;
# pp 2 zb1 x dp 2 sharded; pp 2 interleaved x ep 2; recompute layers; gather
# + recompute_norms under pp 2; recompute_attention + recompute_swiglu on
# one rank (a dense block too) and with all three selective keys under
# dp 2 x ep 2 symmetric; FP8 experts; FP8 experts and dense GEMMs; FP8 under
# ep 2, whose copies are made after the whole model is freed) every rank's measured
# peak must be within 5% of its plan, and the plan must not be the
# measure's copy: a second check requires each rank's plan to move with
# micro_batch the way the allocation does.
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$bin tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null
base=(--data.train="$tmp/t.bin" --data.eval= --model.d_model=64 --model.n_layers=4 --model.n_heads=2
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=64 --model.seq_len=32 --train.global_batch=8
      --train.micro_batch=2 --train.steps=2 --train.warmup_steps=1 --train.eval_interval=0
      --logging.log_interval=1 --checkpoint.interval=0 --checkpoint.save_final=false --parallel.bucket_mb=0.02)
. tests/lib_ranks.sh

check() { # name np: every rank's measured peak within 5% of its plan
  $py - "$tmp/$1.log" "$2" <<'PY'
import re, sys
text, np = open(sys.argv[1]).read(), int(sys.argv[2])
assert "memory: warning" not in text and "no accounting" not in text, "the plan differs from the arena allocated"
plan = {int(r): float(p) for r, p in re.findall(r"rank (\d+): memory plan \(MiB\):.*, peak ([\d.]+)\n", text)}
meas = {int(r): (float(m), float(p)) for r, m, p in
        re.findall(r"rank (\d+): memory measured: ([\d.]+) MiB \(CPU backend allocations, peak\); plan ([\d.]+) MiB", text)}
assert len(plan) == np and len(meas) == np, f"{len(plan)} plan and {len(meas)} measured lines of {np} ranks"
worst = 0
for r, (m, p) in meas.items():
    assert abs(p - plan[r]) <= 0.051, (r, p, plan[r])  # the plan line has 0.1 MiB
    err = p / m - 1
    assert abs(err) <= 0.05, f"rank {r}: plan {p:.3f} MiB, measured {m:.3f} MiB ({100 * err:+.2f}%)"
    worst = max(worst, abs(err))
print(f"{np} ranks, peaks {min(m for m, _ in meas.values()):.2f}..{max(m for m, _ in meas.values()):.2f} MiB, "
      f"worst plan error {100 * worst:.3f}%")
PY
}
layouts=(
  "one 1"
  "dp2 2 --parallel.dp=2"
  "dp2_sharded 2 --parallel.dp=2 --optim.sharded=true"
  "dp2xep2_sym 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=symmetric"
  "ep2_a2a 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=a2a"
  "pp2_1f1b 2 --parallel.pp=2 --parallel.pp_schedule=1f1b"
  "pp2_zb1xdp2_sharded 4 --parallel.pp=2 --parallel.dp=2 --optim.sharded=true --parallel.pp_schedule=zb1"
  "pp2_interleavedxep2 4 --parallel.pp=2 --parallel.dp=2 --parallel.ep=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2"
  "one_recompute_layers 1 --train.recompute=layers"
  "pp2_norms 2 --parallel.pp=2 --train.recompute=gather --train.recompute_norms=true"
  "one_attn_swiglu 1 --train.recompute_attention=true --train.recompute_swiglu=true --model.dense_layers=1 --model.dense_hidden=96"
  "dp2xep2_sym_selective 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=symmetric --train.recompute_attention=true --train.recompute_swiglu=true --train.recompute_norms=true"
  "one_fp8_experts 1 --train.precision=fp8 --train.recompute=experts --model.d_model=256 --model.expert_hidden=256"
  "one_fp8_dense 1 --train.precision=fp8 --fp8.gemms=experts_dense --model.d_model=256 --model.expert_hidden=256 --model.n_shared=1 --model.shared_hidden=128"
  "ep2_fp8 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=a2a --train.precision=fp8 --model.d_model=256 --model.expert_hidden=256"
)
for layout in "${layouts[@]}"; do
  set -- $layout; name=$1 np=$2; shift 2
  if ! run "$name" "$np" "$@"; then tail -n 5 "$tmp/$name.log"; bad "$name: run failed"; continue; fi
  if out=$(check "$name" "$np"); then ok "memory $name: $out"; else bad "memory $name: $out"; fi
done

# the plan is not the counter's echo: micro_batch 4 grows the activations,
# and both the plan and the measure must grow by the same bytes (within 5%)
if run mb4 2 --parallel.dp=2 --train.micro_batch=4 && out=$($py - "$tmp/dp2.log" "$tmp/mb4.log" <<'PY'
import re, sys
def get(f):
    t = open(f).read()
    m = re.search(r"rank 0: memory measured: ([\d.]+) MiB .*; plan ([\d.]+) MiB", t)
    return float(m.group(1)), float(m.group(2))
(m2, p2), (m4, p4) = get(sys.argv[1]), get(sys.argv[2])
dm, dp = m4 - m2, p4 - p2
assert dm > 0.1 and abs(dp / dm - 1) <= 0.05, (dm, dp)
print(f"micro-batch 2 -> 4: measured +{dm:.3f} MiB, plan +{dp:.3f} MiB")
PY
); then ok "memory scales: $out"; else bad "memory scales: ${out:-run failed}"; fi

echo
[ $fails -eq 0 ] && echo "test_memory_ranks: all passed" || echo "test_memory_ranks: $fails failed"
[ $fails -eq 0 ]
