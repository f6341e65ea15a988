#!/usr/bin/env bash
# The distributed runtime on CPU through Open MPI, against the single-rank
# run on the same global batch and seed:
#  1. layouts dp2, ep2, ep2 x ep_dp2, ep4, dp2 + sharded optimizer and
#     ep2 x ep_dp2 + sharded, with learned (under MOECORE_COMM_CHECK: no
#     buffer of a non-blocking call touched before its wait) and with random routing: 5 steps of
#     losses within 1e-5 relative, final weights within 1e-5 (norm-wise per tensor);
#     dp2 and ep2 x ep_dp2 also with aux-loss-free balancing, and with
#     model.lb_global (one micro-batch per rank) against one rank running
#     the global batch as one micro-batch;
#  2. a checkpoint saved in one layout resumes in another (ep2 x ep_dp2 -> one
#     rank; one rank -> ep4 + sharded) with the next loss within 1e-6 of the
#     uninterrupted run's;
#  3. with a capacity factor below 1 the reported dropped fraction equals an
#     independent count, for both expert dispatches (symmetric and a2a), and
#     so does symmetric's receive bound (parallel.ep_recv_factor below 1);
#     (ep2 also with train.recompute: layers, both dispatches: the recomputed
#     blocks exchange their rows again in the backward; and with experts and
#     gather, whose re-gather must not touch the symmetric receive buffers);
#  1b. the symmetric dispatch (the default where the ranks share memory, ops/ep_sym.h)
#     on buffers of one size on every rank (tool_symmem: the least of the
#     ranks' own measures; sizes that differ refused on every rank)
#     and the all-to-all (ep_backend: a2a) give bit-identical losses and weights
#     (the experts see the same rows in the same order), and the symmetric path
#     forced on one rank is bit-identical to no dispatch at all;
#  4. a rank that fails ends the whole job with a clear error, not a hang;
#  5. the per-rank memory line (train/memory.h) matches 8 + 8/D bytes per
#     parameter held on CPU (FP32 weights, which are the main weights, + FP32
#     grads + the Adam moments of the rank's 1/D shard), with D and the
#     expert share of the layout, and agrees with what was allocated;
#  6. rank 0 locks the run directory (the ranks of one job never refuse each
#     other: every run above has several), and a second job on a run directory
#     in use ends with the holder's pid, not a hang;
#  7. moecore bench under mpirun runs one job of all the ranks and prints one table.
set -u
cd "$(dirname "$0")/.."
bin=$PWD/build/moecore
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$bin tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null
base=(--data.train="$tmp/t.bin" --data.eval= --model.d_model=32 --model.n_layers=2 --model.n_heads=2
      --model.n_experts=8 --model.top_k=2 --model.expert_hidden=32 --model.seq_len=16 --train.global_batch=8
      --train.micro_batch=2 --train.steps=5 --train.warmup_steps=2 --train.eval_interval=0
      --logging.log_interval=1 --checkpoint.interval=0 --parallel.bucket_mb=0.02 --optim.lr=3e-3)
. tests/lib_ranks.sh

# ---- 1. layouts against the single rank -------------------------------------------------

# learned routing with MOECORE_COMM_CHECK (src/dist/comm_mpi.c): the grad
# buckets' reductions work on copies taken at the call and their buffers hold
# 0xFF until comm_wait, as over NCCL, where a grad written after its bucket
# started would race the reduction; a write in that window ends the run
for routing in learned random; do
  check=0; [ $routing = learned ] && check=1
  MOECORE_COMM_CHECK=$check against_one_rank "$routing" "$routing" "--model.routing=$routing" "" \
    "dp2 2 --parallel.dp=2" "ep2 2 --parallel.dp=2 --parallel.ep=2" \
    "ep2_a2a 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=a2a" \
    "one_sym 1 --parallel.ep_backend=symmetric" \
    "ep2_layers 2 --parallel.dp=2 --parallel.ep=2 --train.recompute=layers" \
    "ep2_a2a_layers 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_backend=a2a --train.recompute=layers" \
    "ep2_gather 2 --parallel.dp=2 --parallel.ep=2 --train.recompute=gather" \
    "ep2_experts 2 --parallel.dp=2 --parallel.ep=2 --train.recompute=experts" \
    "ep2xep_dp2 4 --parallel.dp=4 --parallel.ep=2" "ep4 4 --parallel.dp=4 --parallel.ep=4" \
    "dp2_sharded 2 --parallel.dp=2 --optim.sharded=true" \
    "ep2xep_dp2_sharded 4 --parallel.dp=4 --parallel.ep=2 --optim.sharded=true"
done

grep -q "expert dispatch: symmetric.*mpi-shared" "$tmp/ep2_learned.log" || bad "ep2 did not pick the symmetric dispatch"
grep -q "expert dispatch: a2a" "$tmp/ep2_a2a_learned.log" || bad "ep2_a2a did not run the all-to-all"
for routing in learned random; do
  if out=$(compare "ep2_a2a_$routing" "ep2_$routing" 0 0); then ok "ep2 symmetric = a2a bit for bit ($routing): $out"
  else bad "ep2 symmetric against a2a ($routing): $out"; fi
  if out=$(compare "single_$routing" "one_sym_$routing" 0 0); then ok "symmetric on one rank = no dispatch bit for bit ($routing)"
  else bad "symmetric on one rank against no dispatch ($routing): $out"; fi
done
# the ranks agree on their symmetric buffers' size (tests/tool_symmem.c: the
# least of the ranks' values; different sizes refused on every rank, no hang)
out=$(timeout 120 mpirun --oversubscribe -np 3 build/tests/tool_symmem 2>&1); rc=$?
n=$(grep -c "^ok:" <<<"$out")
if [ $rc -eq 0 ] && [ "$n" -eq 15 ] && ! grep -q "^FAIL" <<<"$out"; then ok "symmetric memory size agreement, 3 ranks: $n checks"
else bad "symmetric memory size agreement: exit $rc, $n ok"; echo "$out" | grep -v "^ok" | tail -n 8; fi

# aux-loss-free balancing: the bias moves by the expert counts of the whole
# dp group (reduced where they live), so every layout picks the same experts
against_one_rank aux aux-free "--model.routing=learned --model.aux_free_rate=0.02" "" \
  "dp2 2 --parallel.dp=2" "ep2xep_dp2 4 --parallel.dp=4 --parallel.ep=2"

# model.lb_global: the LB loss of the global batch. Each micro-batch's expert
# counts are summed over the dp group (and over the step's earlier
# micro-batches), so with one micro-batch per rank they are the counts of
# the whole global batch: every layout must equal one rank that runs the
# global batch as one micro-batch (lb_coef 1 makes the LB's share visible)
against_one_rank lbg lb_global "--model.routing=learned --model.lb_global=true --model.lb_coef=1" \
  "--train.micro_batch=8" "dp2 2 --parallel.dp=2 --train.micro_batch=4" \
  "ep2xep_dp2 4 --parallel.dp=4 --parallel.ep=2 --train.micro_batch=2"

# ---- 2. save in one layout, resume in another -------------------------------------------------
long=(--train.steps=8 --checkpoint.interval=4 --model.routing=learned)
run straight 1 "${long[@]}" || bad "straight run failed"
run from4 4 "${long[@]}" --parallel.dp=4 --parallel.ep=2 --stop-after=4 || bad "ep2 x ep_dp2 first half failed"
mkdir -p "$tmp/to1/checkpoints" && cp -r "$tmp/from4/checkpoints/step-00000004" "$tmp/to1/checkpoints/"
run to1 1 "${long[@]}" --resume || { tail "$tmp/to1.log"; bad "resume on one rank failed"; }
grep -q "resume: loaded .*step-00000004" "$tmp/to1.log" || bad "to1 did not resume from step 4"
if out=$(compare straight to1 1e-6 1e-5 5); then ok "ep2 x ep_dp2 -> one rank: $out"; else bad "ep2 x ep_dp2 -> one rank: $out"; fi
run from1 1 "${long[@]}" --stop-after=4 || bad "one-rank first half failed"
mkdir -p "$tmp/to4/checkpoints" && cp -r "$tmp/from1/checkpoints/step-00000004" "$tmp/to4/checkpoints/"
run to4 4 "${long[@]}" --parallel.dp=4 --parallel.ep=4 --optim.sharded=true --resume || { tail "$tmp/to4.log"; bad "resume on ep4 sharded failed"; }
if out=$(compare straight to4 1e-6 1e-5 5); then ok "one rank -> ep4 + sharded: $out"; else bad "one rank -> ep4 + sharded: $out"; fi

# ---- 3. capacity factor: dropped fraction against an independent count ------------------------
# The test recomputes random routing from its definition (docs/model.md and
# the generator in src/ops/cpu/cpu_kernels.h), the capacity from the config,
# and the tail drop per micro-batch of the ep group, then compares.
recount() { # metrics capacity_factor max_rows: the drops of every step and layer, recounted
  $py - "$@" <<'PY'
import json, math, sys
M64 = (1 << 64) - 1
def splitmix(s):
    s = (s + 0x9e3779b97f4a7c15) & M64
    z = s
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return s, z ^ (z >> 31)
def mix(a, b):
    z = ((a * 0x9e3779b97f4a7c15) & M64) ^ ((b + 0x632be59bd9b4e019 + ((a << 6) & M64) + (a >> 2)) & M64)
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)
def layer_seed(seed, l):
    return splitmix(seed ^ ((0xd1b54a32d192ed03 * (l + 1)) & M64))[1]
def random_topk(seed, n, E, k):
    st = seed ^ ((0x632be59bd9b4e019 * (n + 1)) & M64)
    perm = list(range(E)); out = []
    for s in range(k):
        st, r = splitmix(st)
        j = s + r % (E - s)
        perm[s], perm[j] = perm[j], perm[s]
        out.append(perm[s])
    return out
def bound(cut, max_rows):
    # the receive bound of ops/ep_sym.h: the largest c with sum min(cut, c) <= max_rows
    if max_rows <= 0 or sum(cut) <= max_rows: return cut
    c = max(x for x in range(max(cut) + 1) if sum(min(v, x) for v in cut) <= max_rows)
    return [min(v, c) for v in cut]
cf, max_rows = float(sys.argv[2]), int(sys.argv[3])
seed, E, k, layers, dp, ep, MB, T, G = 1, 8, 2, 2, 2, 2, 2, 16, 8
M = G // dp // MB; N = MB * T; El = E // ep
cap = math.ceil(cf * N * ep * k / E) if cf > 0 else 0
rows = [json.loads(l) for l in open(sys.argv[1])]
worst = 0
for r in rows:
    step = r["step"] - 1
    for l in range(layers):
        dropped = 0
        for mi in range(M):   # the ranks of the ep group run micro-batch mi together
            counts = [0] * E
            for rank in range(dp):
                s = layer_seed(mix(seed, step * 1024 + rank * M + mi), l)
                for n in range(N):
                    for e in random_topk(s, n, E, k): counts[e] += 1
            cut = [min(c, cap) if cap else c for c in counts]
            for q in range(ep):
                kept = bound(cut[q * El:(q + 1) * El], max_rows)
                dropped += sum(counts[q * El:(q + 1) * El]) - sum(kept)
        got = r["moe_layers"][l]
        expect = dropped / (G * T * k)
        if got["dropped_rows"] != dropped or abs(got["dropped_fraction"] - expect) > 1e-12:
            print(f"step {step + 1} layer {l}: reported {got['dropped_rows']} rows ({got['dropped_fraction']:.4f}), counted {dropped} ({expect:.4f})")
            sys.exit(1)
        worst = max(worst, expect)
if worst == 0: print("nothing was dropped: the test would not see a wrong count"); sys.exit(1)
what = f"capacity {cap} rows per expert per micro-batch" if cap else "no capacity"
if max_rows: what += f", receive buffers of {max_rows} rows"
print(f"{what}; dropped fractions match the recount (up to {worst:.3f})")
PY
}
for be in symmetric a2a; do
  run "cap_$be" 2 --parallel.dp=2 --parallel.ep=2 --model.capacity_factor=0.6 --model.routing=random --train.steps=2 \
    --parallel.ep_backend=$be || { tail "$tmp/cap_$be.log"; bad "capacity run ($be) failed"; }
  if out=$(recount "$tmp/cap_$be/metrics.jsonl" 0.6 0); then ok "capacity 0.6 ($be): $out"; else bad "capacity ($be): $out"; fi
done
# dropless with receive buffers of 0.75 x the 64 rows a rank routes (48 rows): the
# largest experts' tails are dropped and counted instead of overflowing
run bound 2 --parallel.dp=2 --parallel.ep=2 --parallel.ep_recv_factor=0.75 --model.routing=random --train.steps=2 \
  || { tail "$tmp/bound.log"; bad "receive-bound run failed"; }
if out=$(recount "$tmp/bound/metrics.jsonl" 0 48); then ok "receive bound: $out"; else bad "receive bound: $out"; fi

# ---- 4. a failing rank ends the job -------------------------------------------------------------
cp "$tmp/t.bin" "$tmp/data0.bin"   # rank 1's file, data1.bin, does not exist
start=$(date +%s)
timeout 120 mpirun --oversubscribe -np 2 sh -c 'exec "$0" "$@" --data.train='"$tmp"'/data$OMPI_COMM_WORLD_RANK.bin' \
  "$bin" train configs/tiny.yaml "${base[@]}" --parallel.dp=2 --logging.run_dir="$tmp/fail" >"$tmp/fail.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "data1.bin" "$tmp/fail.log" && grep -q "rank 1 failed" "$tmp/fail.log"; then
  ok "failing rank: job ended in $(( $(date +%s) - start )) s with exit $rc: $(grep -m1 'error' "$tmp/fail.log")"
else
  tail "$tmp/fail.log"; bad "failing rank: exit $rc (124 = hang)"
fi

# ---- 5. memory accounting -------------------------------------------------------------------------
# each: run name, its dense and expert optimizer divisors (dp, ep_dp when
# sharded; 1 otherwise) and its ep, from the layout the run was given
for spec in "ep2xep_dp2_sharded_learned 4 2 2" "dp2_learned 1 1 1"; do
  set -- $spec; name=$1
  if out=$($py - "$tmp/$name.log" "$2" "$3" "$4" <<'PY'
import re, sys
log, dd_want, de_want, ep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n = 0
text = open(log).read()
assert "memory: warning" not in text and "no accounting" not in text, "the accounting differs from the allocation"
for line in text.splitlines():
    m = re.match(r"rank (\d+): memory: (\d+) dense \+ (\d+) expert parameters; compute weights (\d+) B, grads (\d+) B, "
                 r"main weights (\d+) B[^,]*, moments (\d+) B \(1/(\d+) of dense, 1/(\d+) of expert\).*; ([\d.]+) B/param", line)
    if not m: continue
    r, pd, pe, w, g, mw, o, dd, de = (int(x) for x in m.groups()[:9]); per = float(m.group(10))
    assert (dd, de) == (dd_want, de_want), (line, dd_want, de_want)
    # the model of test_dist: 2 MoE layers of 8 experts [32 -> 32]: 3 matrices each
    assert pe * ep == 2 * 8 * 3 * 32 * 32, (line, ep)
    # CPU: the FP32 compute weights are the main weights
    assert w == 4 * (pd + pe) and g == 4 * (pd + pe) and mw == 0, line
    expect_o = 8 * (pd / dd + pe / de)
    assert abs(o - expect_o) <= 16, (line, expect_o)   # shard sizes round to whole elements
    expect_per = 8 + 8 * (pd / dd + pe / de) / (pd + pe)
    assert abs(per - expect_per) < 1e-3, (per, expect_per)
    n += 1
assert n >= 2, "no accounting lines"
print(f"{n} ranks: {per:.4f} B/param = 8 + 8/D as expected")
PY
); then ok "memory accounting $name: $out"; else bad "memory accounting $name: $out"; fi
done

# ---- 6. one job per run directory ----------------------------------------------------------------
"$bin" train configs/tiny.yaml "${base[@]}" --train.steps=100000 --logging.run_dir="$tmp/locked" >"$tmp/locked.log" 2>&1 &
holder=$!
for _ in $(seq 300); do [ -s "$tmp/locked/metrics.jsonl" ] && break; sleep 0.1; done
run second 2 --parallel.dp=2 --logging.run_dir="$tmp/locked" --resume; rc=$?
kill -TERM $holder; wait $holder
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "is in use by another trainer (pid $holder on host" "$tmp/second.log"; then
  ok "a 2-rank job on a run directory in use: exit $rc, $(grep -m1 'moecore: error' "$tmp/second.log")"
else
  tail -n 5 "$tmp/second.log"; bad "2-rank job on a locked run directory: exit $rc (124 = hang)"
fi

# ---- 7. moecore bench under mpirun ------------------------------------------------------------------
# every rank runs the config as one job (2 ranks in the run header), rank 0
# alone prints the table, once (before, bench did not start MPI: each
# process was a job of one and refused parallel.dp 2)
out=$(timeout 120 mpirun --oversubscribe -np 2 "$bin" bench configs/tiny.yaml --steps=3 --warmup=1 \
      --parallel.dp=2 --train.micro_batch=4 --model.seq_len=32 --device.type=cpu 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "^parallel: 2 ranks, dp 2" <<<"$out" && [ "$(grep -c '^config ' <<<"$out")" = 1 ] \
   && [ "$(grep -c '^== bench' <<<"$out")" = 1 ] && grep -qE "^configs/tiny.yaml +[0-9]+" <<<"$out"; then
  ok "bench under mpirun -np 2: one 2-rank job, one table ($(grep -E '^configs/tiny.yaml' <<<"$out" | tr -s ' '))"
else
  echo "$out" | tail -n 8; bad "bench under mpirun -np 2: exit $rc"
fi

echo "$fails failures"
[ $fails -eq 0 ]
