#!/usr/bin/env bash
# Pipeline parallelism (issue 17) on CPU ranks through Open MPI, against the
# single-rank run on the same global batch and seed (a tiny 8-layer MoE):
#  1. pp 2 and pp 4 with every schedule (gpipe, 1f1b, interleaved with 2
#     chunks per rank, zb1), an explicit split, pp 2 x ep 2, pp 2 x dp 2 with
#     the sharded optimizer, pp 2 x dp 2 x ep 2 (8 ranks; dp 4 = ep 2 x
#     ep_dp 2), random routing, pp 2 (and x dp 2) with aux-loss-free
#     balancing, pp 2 with model.lb_global:
#     5 steps of losses within 1e-5 relative, final weights within 1e-5;
#  2. a checkpoint written with pp 2 resumes with pp 1 and with pp 4
#     (interleaved) with the next losses within 1e-6 of the uninterrupted run;
#  3. eval through the stages equals the single rank's eval CE;
#  4. the measured bubble is logged beside the theory of the schedule;
#  5. bad pipeline keys are refused with the key named;
#  6. (in 1) the GPU ranks' hand-off order, MOECORE_PP_HANDOFF=receiver, on CPU ranks,
#     with MOECORE_COMM_CHECK (no buffer of a non-blocking call touched before its wait).
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$bin tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null
$bin tokenize --out "$tmp/e.bin" /usr/share/common-licenses/GPL-3 >/dev/null
base=(--data.train="$tmp/t.bin" --data.eval= --model.d_model=32 --model.n_layers=8 --model.n_heads=2
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=32 --model.seq_len=16 --train.global_batch=8
      --train.micro_batch=2 --train.steps=5 --train.warmup_steps=2 --train.eval_interval=0
      --logging.log_interval=1 --checkpoint.interval=0 --parallel.bucket_mb=0.02 --optim.lr=3e-3)
. tests/lib_ranks.sh

# ---- 1. layouts against one rank ------------------------------------------------------------
against_one_rank learned learned "--model.routing=learned" "" \
  "pp2_gpipe 2 --parallel.pp=2 --parallel.pp_schedule=gpipe" \
  "pp2_1f1b 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
  "pp2_interleaved 2 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
  "pp2_zb1 2 --parallel.pp=2 --parallel.pp_schedule=zb1" \
  "pp4_gpipe 4 --parallel.pp=4 --parallel.pp_schedule=gpipe" \
  "pp4_1f1b 4 --parallel.pp=4 --parallel.pp_schedule=1f1b --parallel.pp_layers=1,3,3,1" \
  "pp4_interleaved 4 --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
  "pp4_zb1 4 --parallel.pp=4 --parallel.pp_schedule=zb1" \
  "pp2xep2 4 --parallel.pp=2 --parallel.dp=2 --parallel.ep=2" \
  "pp2xdp2_sharded 4 --parallel.pp=2 --parallel.dp=2 --optim.sharded=true --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
  "pp2xdp2xep2 8 --parallel.pp=2 --parallel.dp=4 --parallel.ep=2 --optim.sharded=true"
against_one_rank random random "--model.routing=random" "" "pp4_1f1b 4 --parallel.pp=4"
# GPU ranks' hand-off order (each send in the slot where its receiver takes
# it, one group with that slot's receive: what keeps NCCL from deadlocking),
# here on CPU ranks over MPI, under MOECORE_COMM_CHECK (src/dist/comm_mpi.c:
# a hand-off buffer written, or a received one read, before its wait fails)
MOECORE_COMM_CHECK=1 MOECORE_PP_HANDOFF=receiver against_one_rank recv learned "--model.routing=learned" "" \
  "pp2_1f1b 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
  "pp4_interleaved 4 --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
  "pp4_zb1 4 --parallel.pp=4 --parallel.pp_schedule=zb1" \
  "pp2xdp2xep2 8 --parallel.pp=2 --parallel.dp=4 --parallel.ep=2 --optim.sharded=true"
if grep -q "pipeline hand-offs: each send in the slot where its receiver takes it" "$tmp/pp2_1f1b_recv.log" &&
   grep -q "pipeline hand-offs: each send after its action" "$tmp/pp2_1f1b_learned.log"
then ok "the receiver-slot runs said so, the default runs did not"; else bad "hand-off mode not logged as expected"; fi
# the aux-free bias moves by the counts of every stage's layers (reduced over
# the world), and lb_global sums each micro-batch's counts over the stage's dp group
against_one_rank aux aux "--model.routing=learned --model.aux_free_rate=0.02" "" \
  "pp2_1f1b 2 --parallel.pp=2" "pp2xdp2 4 --parallel.pp=2 --parallel.dp=2 --parallel.pp_schedule=zb1"
against_one_rank lbg lbg "--model.routing=learned --model.lb_global=true --model.lb_coef=1" "" "pp2_1f1b 2 --parallel.pp=2"

# ---- 2. a pp 2 checkpoint resumes with pp 1 and pp 4 ------------------------------------------
long=(--train.steps=8 --checkpoint.interval=4 --model.routing=learned)
run straight 1 "${long[@]}" || bad "straight run failed"
run from2 2 "${long[@]}" --parallel.pp=2 --stop-after=4 || { tail "$tmp/from2.log"; bad "pp 2 first half failed"; }
for to in "to1 1" "to4 4 --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2"; do
  set -- $to
  name=$1 np=$2; shift 2
  mkdir -p "$tmp/$name/checkpoints" && cp -r "$tmp/from2/checkpoints/step-00000004" "$tmp/$name/checkpoints/"
  run "$name" "$np" "${long[@]}" "$@" --resume || { tail "$tmp/$name.log"; bad "$name: resume failed"; continue; }
  grep -q "resume: loaded .*step-00000004" "$tmp/$name.log" || bad "$name did not resume from step 4"
  if out=$(compare straight "$name" 1e-6 1e-5 5); then ok "pp 2 -> $name: $out"; else bad "pp 2 -> $name: $out"; fi
done

# ---- 3. eval through the stages ---------------------------------------------------------------
ev=(--data.eval="$tmp/e.bin" --train.eval_interval=2 --train.eval_batches=3)
run eval1 1 "${ev[@]}" || bad "eval one rank failed"
run eval_pp4 4 "${ev[@]}" --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 \
  || { tail "$tmp/eval_pp4.log"; bad "eval pp 4 failed"; }
if out=$(compare eval1 eval_pp4 1e-5 1e-5); then ok "eval pp 4: $out"; else bad "eval pp 4: $out"; fi

# ---- 4. the bubble beside the theory; the schedule printed ------------------------------------
if out=$($py - "$tmp/pp4_1f1b_learned/metrics.jsonl" "$tmp/pp4_interleaved_learned/metrics.jsonl" <<'PY'
import json, sys
for path, theory in zip(sys.argv[1:], [3 / 7, 3 / 11]):
    rows = [json.loads(l) for l in open(path)]
    for r in rows:
        assert abs(r["pp_bubble_theory"] - theory) < 1e-12, (path, r["pp_bubble_theory"], theory)
        assert 0 <= r["pp_bubble"] < 1 and len(r["pp_idle_in_span"]) == 4, r
        # each rank's idle share splits into waiting in receives and the rest
        for i, w, o in zip(r["pp_idle_in_span"], r["pp_wait_in_span"], r["pp_other_in_span"]):
            assert 0 <= w <= i + 1e-12 and abs(w + o - i) < 1e-9, (path, i, w, o)
print("pp 4 m 4: theory 1f1b 3/7, interleaved v 2 3/11 logged, measured bubbles in [0, 1)")
PY
); then ok "$out"; else bad "bubble records: $out"; fi
run printed 2 --parallel.pp=2 --parallel.pp_schedule=zb1 --train.steps=1 --print-schedule || bad "--print-schedule run failed"
if grep -q "^rank 0 .*Bi0.*W0" "$tmp/printed.log" && grep -q "rank 1: pipeline stage 1: layers 4-7, final norm + LM head" "$tmp/printed.log"
then ok "--print-schedule prints the table, every rank its stage"; else tail "$tmp/printed.log"; bad "--print-schedule"; fi

# ---- 5. bad keys ------------------------------------------------------------------------------
refuse() { # expected message, np, args...
  local want=$1 np=$2; shift 2
  run refused "$np" "$@"
  if [ $? -ne 0 ] && grep -q -- "$want" "$tmp/refused.log"; then ok "refused: $want"
  else tail -n 3 "$tmp/refused.log"; bad "not refused as expected: $want"; fi
}
refuse "parallel.pp_schedule: 'zb2' is not one of gpipe 1f1b interleaved zb1" 1 --parallel.pp_schedule=zb2
refuse "parallel.pp_schedule interleaved needs parallel.pp_virtual >= 2" 2 --parallel.pp=2 --parallel.pp_schedule=interleaved
refuse "parallel.pp_virtual (2) > 1 needs parallel.pp_schedule: interleaved" 2 --parallel.pp=2 --parallel.pp_virtual=2
refuse "parallel.pp_layers has 3 entries" 2 --parallel.pp=2 --parallel.pp_layers=4,2,2
refuse "parallel.pp_layers\[1\]: expected a layer count of at least 1" 2 --parallel.pp=2 --parallel.pp_layers=8,0
refuse "parallel.pp_layers sums to 7 layers; model.n_layers is 8" 2 --parallel.pp=2 --parallel.pp_layers=4,3
refuse "every stage needs at least one layer" 4 --parallel.pp=4 --model.n_layers=3
refuse "to be a multiple of parallel.pp (4)" 4 --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --train.micro_batch=4
refuse "parallel.pp_virtual (2) needs parallel.pp > 1" 1 --parallel.pp_virtual=2
refuse "pipeline parallelism runs on CPU ranks for now" 2 --parallel.pp=2 --device.type=cuda

echo
[ $fails -eq 0 ] && echo "test_pp: all passed" || echo "test_pp: $fails failed"
[ $fails -eq 0 ]
