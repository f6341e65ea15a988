#!/usr/bin/env bash
# The measured pipeline bubble of each schedule on CPU ranks (issue 17),
# beside its theory: mean of the metrics' pp_bubble over steps 3..STEPS (the
# first two warm up), one rank per pipeline stage, one thread per rank.
#   bash bench/pp-bubble.sh [PP] [MICRO_BATCHES] [STEPS]
#   PP_SCHEDULES="1f1b,interleaved 2" ...   a subset (default: gpipe,1f1b,interleaved 2,zb1)
# The model is synthetic-data MoE sized so that compute dominates the
# hand-offs on a small machine (d 256, 8 layers, 8 experts top-2, 2 x 64
# tokens per micro-batch). The bubble is 1 - sum(busy) / (pp x makespan)
# from a barrier at the step's start (src/train/pipeline.c); "replayed" is
# the table replayed with the step's mean measured action times and free
# hand-offs (pp_bubble_sim): what the schedule alone gives with those costs.
set -u
cd "$(dirname "$0")/.."
pp=${1:-2} m=${2:-8} steps=${3:-8}
bin=$PWD/build/moecore
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
# PP_SINGLE_COPY=none|cma: Open MPI's shared-memory single-copy mechanism
# (unset: Open MPI's default, cma where the kernel allows it; the tests use
# none, which containers without ptrace rights need, and where a large
# message moves only while its sender is inside an MPI call)
[ -n "${PP_SINGLE_COPY:-}" ] && export OMPI_MCA_btl_vader_single_copy_mechanism=$PP_SINGLE_COPY
args=(--data.synthetic=true --data.eval= --train.eval_interval=0 --model.d_model=256 --model.n_layers=8 --model.n_heads=4
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=256 --model.seq_len=64
      --train.micro_batch=2 --train.global_batch=$((2 * m)) --train.steps=$steps --train.warmup_steps=1
      --logging.log_interval=100 --checkpoint.save_final=false --parallel.pp=$pp)
echo "pp $pp, $m micro-batches of 2 x 64 tokens, $steps steps, single copy ${PP_SINGLE_COPY:-default}, commit $(git describe --always --dirty), $(date -u +%F)"
printf '%-16s %10s %10s %10s %12s   %s\n' schedule measured replayed theory "step time" "idle per rank = waiting in receives + other (share of its span)"
IFS=, read -ra scheds <<< "${PP_SCHEDULES:-gpipe,1f1b,interleaved 2,zb1}"
for sched in "${scheds[@]}"; do
  set -- $sched
  kind=$1 v=${2:-1}
  out=$tmp/$kind
  if ! timeout 600 mpirun --oversubscribe -np "$pp" "$bin" train configs/tiny.yaml "${args[@]}" \
       --parallel.pp_schedule=$kind --parallel.pp_virtual=$v --logging.run_dir="$out" >"$out.log" 2>&1; then
    tail -n 5 "$out.log"; echo "$kind: run failed"; continue
  fi
  /usr/bin/python3 - "$out/metrics.jsonl" "$kind${2:+ v $v}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
b = sum(r["pp_bubble"] for r in rows) / len(rows)
sim = sum(r["pp_bubble_sim"] for r in rows) / len(rows)
t = sum(r["step_time_s"] for r in rows) / len(rows)
pp = len(rows[0]["pp_idle_in_span"])
mean = lambda k, p: 100 * sum(r[k][p] for r in rows) / len(rows)
split = "  ".join(f"r{p} {mean('pp_idle_in_span', p):.1f}% = {mean('pp_wait_in_span', p):.1f} + {mean('pp_other_in_span', p):.1f}"
                  for p in range(pp))
print(f"{sys.argv[2]:<16} {100 * b:9.1f}% {100 * sim:9.1f}% {100 * rows[0]['pp_bubble_theory']:9.1f}% {1000 * t:9.1f} ms   {split}")
PY
done
