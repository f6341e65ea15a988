#!/usr/bin/env bash
# The multi-rank runtimes on ONE GPU: several ranks share it, talking over
# MPI with their device buffers staged through the host (MOECORE_COMM=mpi,
# comm.h; NCCL refuses two ranks on one GPU), so the GPU code of data,
# expert and pipeline parallelism -- DDP's buckets and the sharded
# optimizer on device grads, the all-to-all dispatch of device rows, the
# pipeline's device hand-offs at the receiver's slot (MOECORE_PP_GPU=1) -- runs with real CUDA
# kernels before a machine with several GPUs is lent. Not checked here:
# NCCL itself (tests/gpu/test_comm_nccl, test_nccl at world 1), the
# symmetric dispatch across processes, overlap and speed. Every run has
# MOECORE_COMM_CHECK=1 (src/dist/comm_mpi.c): the staged non-blocking calls
# then complete at comm_wait on copies taken at the call, with their device
# buffers 0xFF until then, as a NCCL call on the communication stream would
# leave them, so a GPU kernel that writes a grad bucket or a hand-off buffer
# before its wait, or reads a result too early, fails here (CHECK=0: off).
#
# Each layout against one GPU rank on the same global batch and seed
# (configs/tiny.yaml, micro-batches of 4 sequences in every layout, 12
# steps, a2a dispatch, learned routing; dp2 and ep2 also with
# train.precision: fp8): losses within 5e-3 relative (BF16's
# 2^-8: the layouts sum the same micro-batches' grads in another order and
# the BF16 compute copies may round differently from there) and final FP32
# weights within 1e-2 norm-wise per tensor; the measured differences are
# printed, so a run shows how far inside the bounds they are. Then a
# checkpoint written by ep2 x ep_dp2 (sharded) resumes on one rank, and one
# written by one rank resumes with pp2, each within the same bounds of the
# uninterrupted run at steps 5-8.
#
#   bash tests/gpu/ranks.sh     on a GPU machine, from the repository root after make gpu-bundle
# Ends with "N passed, N failed"; exits 1 on any failure.
set -u
cd "$(dirname "$0")/../.."
bin=$PWD/build/moecore
py=python3
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 MOECORE_COMM=mpi MOECORE_PP_GPU=1 MOECORE_COMM_CHECK=${CHECK:-1}
cublas=$($py -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tmp=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "work directory: $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
"$bin" tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null || { echo "FAIL: tokenize"; exit 1; }
base=(--device.type=cuda --data.train="$tmp/t.bin" --data.eval= --train.global_batch=16 --train.micro_batch=4
      --train.steps="${STEPS:-12}" --train.warmup_steps=3 --train.eval_interval=0 --logging.log_interval=1
      --checkpoint.interval=0 --parallel.bucket_mb=0.25 --parallel.ep_backend=a2a)
. tests/lib_ranks.sh
export OMP_NUM_THREADS=2
passes=0
ok() { echo "ok: $*"; passes=$((passes+1)); }
# One step with optim.eps = 1, lr 1 and no weight decay, w - g / (|g| + 1):
# the weights follow the step's gradient itself, not its sign, so they
# compare the layouts' gradients (a lost or doubled reduction moves them by
# percents): within 1e-4 (measured on an H100, 2026-12-07: dp2 2.8e-8, ep2
# 1.3e-7 with the default optimizer).
tol_loss=1e-6 tol_weights=1e-4
against_one_rank grad "one step, gradients" "--model.routing=learned --train.steps=1 --train.warmup_steps=0 --optim.lr=1 --optim.eps=1 --optim.weight_decay=0" "" \
  "dp2 2 --parallel.dp=2" \
  "dp2_sharded 2 --parallel.dp=2 --optim.sharded=true" \
  "ep2 2 --parallel.dp=2 --parallel.ep=2" \
  "ep2xep_dp2_sharded 4 --parallel.dp=4 --parallel.ep=2 --optim.sharded=true" \
  "pp2_1f1b 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
  "pp2xep2 4 --parallel.pp=2 --parallel.dp=2 --parallel.ep=2"
# Then 12 steps: weights within 5e-2, not 1e-2. With learned routing in BF16
# the layouts' last-bit differences flip top-k choices near ties, and the
# experts that then see other tokens drift: on an H100 (2026-12-07) dp2's
# worst tensor after 12 steps, layer 2's w_down, was 2.9e-2 off (ep2 1.5e-2),
# losses within 6.4e-4, while one step agreed to 2.8e-8 (above). CPU ranks in
# FP32 keep 7e-7 over the same 12 steps (no flips).
tol_loss=5e-3 tol_weights=5e-2
against_one_rank gpu "on one GPU" "--model.routing=learned" "" \
  "dp2 2 --parallel.dp=2" \
  "dp2_sharded 2 --parallel.dp=2 --optim.sharded=true" \
  "ep2 2 --parallel.dp=2 --parallel.ep=2" \
  "ep2xep_dp2_sharded 4 --parallel.dp=4 --parallel.ep=2 --optim.sharded=true" \
  "pp2_1f1b 2 --parallel.pp=2 --parallel.pp_schedule=1f1b" \
  "pp2_gpipe 2 --parallel.pp=2 --parallel.pp_schedule=gpipe" \
  "pp2_interleaved 2 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2" \
  "pp2xdp2 4 --parallel.pp=2 --parallel.dp=2" \
  "pp2xep2 4 --parallel.pp=2 --parallel.dp=2 --parallel.ep=2"
# train.precision: fp8 (its FP8 dispatch: rows travel as E4M3 codes + scales),
# d_model 256 for the FP8 GEMMs' widths
# Weights within 1e-1 here, not 1e-2: reductions in another order move FP32
# values across E4M3 rounding boundaries (a flipped code moves a value by up
# to 1/16; tests/test_fp8_ep.sh), and Adam turns the changed grads of the
# later MoE layers into changed steps. This script with device.type: cpu
# (2026-12-07, 12 steps) measured the worst tensor, layer 3's w_down, 1.1e-2
# off for dp2 (which dispatches nothing) and 3.5e-2 for ep2, losses within
# 1.6e-4 / 3.4e-4; the losses keep the 5e-3 bound.
tol_weights=1e-1
against_one_rank fp8 "fp8 on one GPU" "--model.routing=learned --train.precision=fp8 --model.d_model=256" "" \
  "dp2 2 --parallel.dp=2" "ep2 2 --parallel.dp=2 --parallel.ep=2"
tol_weights=5e-2
# a checkpoint saved by GPU ranks in one layout resumes in another (the
# two-GPU issue's item 7, here on one GPU): ep2 x ep_dp2 sharded -> one rank,
# one rank -> pp2; steps 5-8 against the uninterrupted one-rank run
long=(--model.routing=learned --train.steps=8 --checkpoint.interval=4)
run ck_straight 1 "${long[@]}" || bad "checkpoint: straight run failed"
resume_check() { # from-name from-np to-name to-np, then "from args" "to args"
  local from=$1 fnp=$2 to=$3 tnp=$4 fargs=($5) targs=($6)
  run "$from" "$fnp" "${long[@]}" "${fargs[@]}" --stop-after=4 || { tail -n 5 "$tmp/$from.log"; bad "$from: first half failed"; return; }
  mkdir -p "$tmp/$to/checkpoints" && cp -r "$tmp/$from/checkpoints/step-00000004" "$tmp/$to/checkpoints/" ||
    { bad "$from wrote no step-4 checkpoint"; return; }
  run "$to" "$tnp" "${long[@]}" "${targs[@]}" --resume || { tail -n 5 "$tmp/$to.log"; bad "$to: resume failed"; return; }
  grep -q "resume: loaded .*step-00000004" "$tmp/$to.log" || { bad "$to did not resume from step 4"; return; }
  if out=$(compare ck_straight "$to" "$tol_loss" "$tol_weights" 5); then ok "$from -> $to: $out"; else bad "$from -> $to: $out"; fi
}
resume_check ck_from_ep2 4 ck_to_1 1 "--parallel.dp=4 --parallel.ep=2 --optim.sharded=true" ""
resume_check ck_from_1 1 ck_to_pp2 2 "" "--parallel.pp=2"
for l in dp2 ep2 pp2_1f1b; do
  grep -q "communicator: MPI, device buffers staged" "$tmp/${l}_gpu.log" || bad "$l: the ranks did not run over staged MPI"
done
grep -q "pipeline hand-offs: each send in the slot where its receiver takes it" "$tmp/pp2_1f1b_gpu.log" ||
  bad "pp2_1f1b: GPU ranks did not hand off at the receiver's slot"
grep -E "bubble" "$tmp/pp2_1f1b_gpu.log" | tail -n 2
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
