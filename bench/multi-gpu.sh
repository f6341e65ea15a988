#!/usr/bin/env bash
# Issues 16 (2 GPUs) and 21 (8 GPUs) in as few device calls as possible: each
# STEP runs the trainings one must-show needs, one rank per GPU, reads their
# metrics.jsonl (or bench --breakdown's table) and prints ONE summary line
# per must-show: the numbers, the threshold and a verdict, with the elapsed
# seconds after each step so that a session can split the steps over its
# 10-minute calls.
#
# Usage: bash bench/multi-gpu.sh [--gpus N] [--device cuda|cpu] STEP...
#   correct   dp N, dp N + optim.sharded, ep N symmetric, ep N a2a, ep N + sharded against one rank
#             (20 steps of configs/tiny.yaml, learned routing, same global batch): losses within
#             TOL_LOSS (BF16: 1e-2; cpu 1e-5); one step with optim.eps 1, lr 1 (weights follow the
#             gradient) of dp N, ep N symmetric and ep N a2a sharded: weights within 1e-4; and the
#             ep N symmetric step captured as a CUDA graph
#   olmoe     OLMoE-1B-7B bench config on 1 GPU, ep N (dp N = ep N) and dp N, 8 x 4096 tokens per GPU
#             per step: tokens/s per GPU >= 95% of one GPU's (N <= 2; 90% beyond); dp N retries with
#             optim.sharded when it runs out of memory; GPUs under 120 GB run 8 of its 16 layers
#   sweep     configs/bench/sweep-e{8,32,128}.yaml (and E=256 from sweep-e128 when N >= 8) with ep N,
#             16 x 4096 tokens per GPU per step: tokens/s per GPU at E=128 >= 85% of E=8 (90% for N >= 8)
#   dispatch  sweep-e128 with ep N: symmetric dispatch and combine GB/s (bench --breakdown's op times)
#             against cudaMemcpyPeer of the same bytes, and the MoE-layer time a2a / symmetric >= 1.3
#   overlap   sweep-e32 (OVERLAP_CONFIG) on 1 GPU and dp N: share of the gradient reduction hidden
#             behind the backward (>= 80%) and the overlapped kernels' slowdown (bench --breakdown)
#   pp        pp 2 1f1b losses against one rank (tiny), and the bubble of sweep-e8 (PP_CONFIG,
#             micro-batches of 2) against the schedule's theory; N >= 4 also pp 2 x ep N/2
#   resume    a checkpoint of N ranks (dp N = ep N, sharded) resumes on one rank and the reverse:
#             the next loss within TOL_LOSS (cpu: 1e-6)
#   kill      kill -9 of one rank: under mpirun, and (GPU) with torchrun-style variables where only
#             moecore's watchdog can end the others: the job ends within parallel.timeout_s, with a message;
#             (GPU) also kill -STOP of one rank under mpirun (stuck, not dead: no launcher notices, the
#             survivors' watchdog must end the job within parallel.timeout_s + the abort's 20 s grace)
#   big       configs/seed/small.yaml (BIG_CONFIG, 40.6B parameters) with ep N + sharded, 20 steps:
#             GPU memory against `moecore plan`'s prediction (issue 21; in `all` only for N >= 8)
#   all       all of the above
# --device cpu runs the same steps on N CPU ranks with tiny shapes and step counts (the plumbing:
# mpirun lines, overrides, parsing, summary, packing); GPU-only parts say "skipped on cpu", and
# timings are INFO there (2 cores time-shared by N ranks judge nothing).
# Verdicts: PASS, MISS (measured, below the threshold), ERROR (a run failed: its log is named),
# INFO (a number without a threshold), NOT MEASURED (the reason), SKIPPED.
# Output: ${OUT:-build/multi-gpu}/summary.txt (the lines) and multi-gpu-logs.tgz (every log,
# metrics.jsonl and config.yaml; no checkpoints), packed after each step and at exit.
# env: STEPS=12 WARMUP=3 (timed runs; cpu 5 / 2), CORRECT_STEPS=20, TOL_LOSS, KILL_TIMEOUT_S=30,
# OVERLAP_CONFIG, PP_CONFIG, DISPATCH_CONFIG, BIG_CONFIG, SWEEP_E="8 32 128", KEEP=1 (keep the work dir,
# a new directory under $TMPDIR or /tmp unless WORK names one; never under $OUT), DEADLINE_S (the
# script's own time limit: each run's timeout is cut to what is left, and a step that starts with less
# than 30 s left is SKIPPED; set it a little under the device call's limit, e.g. 560).
set -u
cd "$(dirname "$0")/.." || exit 2
usage() { awk '/^set -u/ { exit } NR >= 9 { sub(/^# ?/, ""); print }' "$0"; exit "${1:-2}"; }
ngpu=2 device=cuda steps=()
while [ $# -gt 0 ]; do
  case $1 in
    --gpus) ngpu=${2:-}; shift 2 ;;
    --gpus=*) ngpu=${1#*=}; shift ;;
    --device) device=${2:-}; shift 2 ;;
    --device=*) device=${1#*=}; shift ;;
    -h|--help) usage 0 ;;
    all) steps+=(correct olmoe sweep dispatch overlap pp resume kill big-if-8); shift ;;
    correct|olmoe|sweep|dispatch|overlap|pp|resume|kill|big) steps+=("$1"); shift ;;
    *) echo "multi-gpu.sh: unknown argument '$1'"; usage ;;
  esac
done
case $ngpu in ''|*[!0-9]*) echo "multi-gpu.sh: --gpus takes a number, got '$ngpu'"; exit 2 ;; esac
[ "$ngpu" -ge 2 ] || { echo "multi-gpu.sh: --gpus must be at least 2"; exit 2; }
case $device in cuda|cpu) ;; *) echo "multi-gpu.sh: --device is cuda or cpu, got '$device'"; exit 2 ;; esac
[ ${#steps[@]} -gt 0 ] || usage
N=$ngpu
bin=$PWD/build/moecore
[ -x "$bin" ] || { echo "multi-gpu.sh: $bin is not built (make -j2 build/moecore)"; exit 2; }
command -v mpirun >/dev/null || { echo "multi-gpu.sh: mpirun not found (apt-get install openmpi-bin)"; exit 2; }
py=$(command -v python3) || { echo "multi-gpu.sh: python3 not found"; exit 2; }

out=${OUT:-build/multi-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# the runs' directory outside $OUT, so that a call cut off by its time limit brings back summary.txt
# and the archive (packed after each step), not hundreds of files
if [ -n "${WORK:-}" ]; then work=$WORK; else work_tmp=$(mktemp -d "${TMPDIR:-/tmp}/multi-gpu.XXXXXX"); work=$work_tmp/work; fi
rm -rf "$work"
mkdir -p "$work"
summary=$out/summary.txt
: > "$summary"
tgz=$out/multi-gpu-logs.tgz
pack() { # the logs, metrics and configs of every run: one archive (few files come back from a lent machine)
  tar czf "$tgz.tmp" --exclude='checkpoints' --exclude='ckpt' --exclude='*.bin' --exclude='*.safetensors' \
    -C "$out" summary.txt -C "$(dirname "$work")" "$(basename "$work")" 2>/dev/null && mv "$tgz.tmp" "$tgz"
}
# fd 3: the script's own stdout (a trap can run inside a command's redirection to its log)
exec 3>&1
finish() {
  local b
  b=$(grep -h -o -m1 'moecore train: .*(moecore [^)]*)' "$work"/*.log 2>/dev/null | head -n 1 | sed 's/.*(//; s/)$//')
  [ -n "$b" ] && echo "binary: $b (the runs' headers)" >> "$summary"
  pack
  if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $work" >&3; else rm -rf "$work" ${work_tmp:+"$work_tmp"}; fi
  {
    echo
    echo "== summary ($N ${device} ranks, $(( $(date +%s) - t_start )) s; $summary; logs $tgz)"
    cat "$summary"
  } >&3
}
t_start=$(date +%s)
trap finish EXIT
trap 'echo "multi-gpu.sh: stopped by a signal" | tee -a "$summary" >&3; exit 143' TERM INT   # EXIT still packs

# ---- environment (as scripts/gpu-check.sh) -----------------------------------------------------
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # containers without ptrace rights
cublas=$($py -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
nccl=$($py -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
[ -n "$nccl" ] && export NCCL_HOME=$nccl
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64${cublas:+:$cublas}${nccl:+:$nccl/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the commit: the bundle's (make gpu-bundle writes build/lib/COMMIT; a lent machine's .git may be
# stale) and git's here; the binary's own comes from the runs' headers at the end
commits="git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
[ -f build/lib/COMMIT ] && commits="$commits, bundle $(cat build/lib/COMMIT)"
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mpi=(mpirun --bind-to none -np)   # -np N follows
if [ "$device" = cpu ]; then
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  mpi=(mpirun --oversubscribe --bind-to none -np)
else
  threads=$((cores / N)); [ "$threads" -ge 1 ] || threads=1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
fi
# the GPU pipeline has never run: the pp step tries it (config.c refuses it without this)
[ "$device" = cuda ] && export MOECORE_PP_GPU=${MOECORE_PP_GPU:-1}
xs=()
for v in LD_LIBRARY_PATH NCCL_HOME NCCL_NVLS_ENABLE NVSHMEM_DISABLE_NVLS OMP_NUM_THREADS OPENBLAS_NUM_THREADS MOECORE_PP_GPU; do
  [ -n "${!v:-}" ] && xs+=(-x "$v")
done

{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ); commit: $commits; $("$bin" --version | head -n 1); $N $device ranks; steps ${steps[*]}"
  if [ "$device" = cuda ]; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1
    nvidia-smi topo -m 2>/dev/null | head -n $((N + 2))
  else
    echo "cpu: $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  fi
  echo "NCCL_HOME=${NCCL_HOME:-unset}; OMP_NUM_THREADS=$OMP_NUM_THREADS"
} > "$work/device.txt" 2>&1
head -n 1 "$work/device.txt" | tee -a "$summary"
gpu_mib=0 gpu_kind=h200
if [ "$device" = cuda ]; then
  have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  echo "device: ${have:-0} x ${name:-?} (${gpu_mib:-?} MiB)" | tee -a "$summary"
  case $name in *H100*) gpu_kind=h100 ;; *B200*) gpu_kind=b200 ;; *B300*) gpu_kind=b300 ;; esac
  if [ "${have:-0}" -lt "$N" ]; then
    printf '%-12s %-8s %s\n' ERROR setup "--gpus $N but nvidia-smi lists ${have:-0} GPUs" | tee -a "$summary"
    exit 1
  fi
fi

# ---- numbers per device ---------------------------------------------------------------------------
if [ "$device" = cpu ]; then
  S=${STEPS:-5} W=${WARMUP:-2} CS=${CORRECT_STEPS:-20} RS=3 BS=4 tol=${TOL_LOSS:-1e-5} tol_resume=${TOL_LOSS:-1e-6}
  tmo=180 tmo_big=180
  # tiny shapes for every config (the experts' count and top-k stay: the sweep is about E)
  shape=(--model.d_model=32 --model.n_heads=2 --model.expert_hidden=32 --model.seq_len=16 --model.vocab_size=257
         --model.n_layers=2)
  shrink=(--device.type=cpu "${shape[@]}" --parallel.bucket_mb=0.02)
else
  S=${STEPS:-12} W=${WARMUP:-3} CS=${CORRECT_STEPS:-20} RS=10 BS=20 tol=${TOL_LOSS:-1e-2} tol_resume=${TOL_LOSS:-1e-2}
  tmo=240 tmo_big=540
  shape=()
  shrink=(--device.type=cuda)
fi
KT=${KILL_TIMEOUT_S:-30}
# the timed runs: the bench's settings (synthetic tokens, no checkpoints, no eval)
bflags=(--data.synthetic=true --checkpoint.save_final=false --checkpoint.interval=0 --train.eval_interval=0
        --logging.log_interval=1 --train.steps="$S")
# the correctness config: tiny.yaml (an OLMoE-style MoE: pre-norm, QK-norm, softmax top-2 of 8, learned
# routing) on the byte-level tokens of the machine's license texts; micro-batches of 2 everywhere, so
# that every layout runs the same micro-batches of the same global batch
G=$(( 2 * N * (8 / N > 1 ? 8 / N : 1) ))
E_tiny=$(( N * ((8 + N - 1) / N) ))   # 8, or the next multiple of N
data=(--data.synthetic=true)
if "$bin" tokenize --out "$work/tokens.bin" /usr/share/common-licenses/* > "$work/tokenize.log" 2>&1; then
  data=(--data.train="$work/tokens.bin")
fi
cflags=("${data[@]}" --data.eval= --train.eval_interval=0 --logging.log_interval=1 --checkpoint.interval=0
        --checkpoint.save_final=false --train.global_batch="$G" --train.micro_batch=2 --model.n_experts="$E_tiny")
if [ "$device" = cpu ]; then
  cflags+=("${shrink[@]}" --train.warmup_steps=2 --optim.lr=3e-3)
else
  cflags+=(--device.type=cuda)
fi

# ---- helpers ----------------------------------------------------------------------------------------
# report STEP KIND RC TEXT: one summary line. RC 0 PASS, 1 MISS, 2 ERROR, 3 INFO, 4 NOT MEASURED,
# else SKIPPED; KIND timing turns PASS / MISS into INFO on cpu
report() {
  local step=$1 kind=$2 rc=$3 text=${4//$'\n'/ | } v
  case $rc in 0) v=PASS ;; 1) v=MISS ;; 2) v=ERROR ;; 3) v=INFO ;; 4) v="NOT MEASURED" ;; *) v=SKIPPED ;; esac
  if [ "$kind" = timing ] && [ "$device" = cpu ] && [ "$rc" -le 1 ]; then
    v=INFO text="$text [cpu ranks time-share $cores cores: the threshold is judged on GPUs only]"
  fi
  printf '%-12s %-8s %s\n' "$v" "$step" "$text" | tee -a "$summary"
}
# why NAME: where a failed run's log is, and its first error line
why() {
  local l="$work/$1.log" e
  e=$(grep -v '^+ ' "$l" 2>/dev/null | grep -m1 'moecore: error' | cut -c1-220)
  [ -n "$e" ] || e=$(grep -v '^+ ' "$l" 2>/dev/null | grep -m1 -iE 'error|out of memory|fail' | cut -c1-220)
  [ -n "$e" ] || e=$(tail -n 1 "$l" 2>/dev/null | cut -c1-220)
  echo "run $1 failed (log work/$1.log in $(basename "$tgz")): ${e:-no log}"
}
# the timeout of a run: ${T:-$tmo}, cut to what DEADLINE_S leaves of the script's time
tlim() {
  local t=${T:-$tmo} left
  if [ -n "${DEADLINE_S:-}" ]; then
    left=$((DEADLINE_S - ($(date +%s) - t_start) - 5))
    [ "$left" -ge 1 ] || left=1
    [ "$left" -lt "$t" ] && t=$left
  fi
  echo "$t"
}
# run NAME NP CONFIG ARGS...: moecore train, under mpirun for NP > 1; run dir work/NAME, log work/NAME.log
run() {
  local name=$1 np=$2 cfg=$3; shift 3
  local cmd=("$bin" train "$cfg" --logging.run_dir="$work/$name" "$@")
  [ "$np" -gt 1 ] && cmd=("${mpi[@]}" "$np" "${xs[@]}" "${cmd[@]}")
  echo "+ ${cmd[*]}" > "$work/$name.log"
  timeout --kill-after=20 "$(tlim)" "${cmd[@]}" >> "$work/$name.log" 2>&1
}
# bench NAME NP CONFIG ARGS...: moecore bench --breakdown (GPU), under mpirun for NP > 1 (rank 0
# prints the table)
bench() {
  local name=$1 np=$2 cfg=$3; shift 3
  local cmd=("$bin" bench "$cfg" --steps="$S" --warmup="$W" --breakdown --device.type=cuda "$@")
  [ "$np" -gt 1 ] && cmd=("${mpi[@]}" "$np" "${xs[@]}" "${cmd[@]}" --parallel.timeout_s=120)
  echo "+ ${cmd[*]}" > "$work/$name.log"
  timeout --kill-after=20 "$(tlim)" "${cmd[@]}" >> "$work/$name.log" 2>&1
}
pyc() { "$py" "$work/mg.py" "$@"; }   # the parsers below
cfgval() { awk -v k="$2:" '$1 == k { print $2; exit }' "$1"; }   # a top-level-looking key of a config
graph_ok() { grep -q "cuda graph: captured" "$work/$1.log" && ! grep -q "running uncaptured" "$work/$1.log"; }

cat > "$work/mg.py" <<'PY'
# Parsers of multi-gpu.sh: each command prints one summary text and exits with the verdict
# (0 PASS, 1 MISS, 2 ERROR, 3 INFO, 4 NOT MEASURED).
import json, math, os, re, statistics, sys

def rows(run):
    try:
        return [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    except (OSError, ValueError) as e:
        raise SystemExit(say(2, f"no metrics of {os.path.basename(run)}: {e}"))

def mib(x):
    return f"{x / 1024:.2f} GiB" if x >= 1024 else f"{x:.1f} MiB"

def say(rc, text):
    print(text)
    return rc

def timed(run, warmup, key):
    v = [r[key] for r in rows(run) if r["step"] > warmup and r.get(key) is not None]
    if not v:
        raise SystemExit(say(2, f"{os.path.basename(run)}: no steps after {warmup} with {key}"))
    return statistics.median(v)

def first_error(log):
    try:
        for l in open(log, errors="replace"):
            if not l.startswith("+ ") and re.search(r"error|out of memory", l, re.I):
                return l.strip()[:200]
    except OSError:
        pass
    return "no error line"

def breakdown(log):
    """bench --breakdown's table (rank 0): wall ms per step, {op: (calls/step, ms/step)}, {class: ms/step}."""
    wall, ops, cls, section = None, {}, {}, None
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return None
    for l in lines:
        m = re.match(r"GPU time per op .* over (\d+) steps, mean wall time ([\d.]+) ms", l)
        if m:
            wall, section, ops, cls = float(m.group(2)), "op", {}, {}
            continue
        if section is None:
            continue
        if l.startswith("class "):
            section = "class"
            continue
        m = re.match(r"^(\S+)\s+([\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)%$", l)
        if section == "op" and m:
            ops[m.group(1)] = (float(m.group(2)), float(m.group(3)))
            continue
        m = re.match(r"^(sum of ops)\s+(-?[\d.]+)\s+(-?[\d.]+)%$", l)
        if section == "op" and m:
            ops["sum of ops"] = (0.0, float(m.group(2)))
            continue
        m = re.match(r"^(.+?)\s+(-?[\d.]+)\s+(-?[\d.]+)%$", l)
        if section == "class" and m:
            cls[m.group(1).strip()] = float(m.group(2))
    return (wall, ops, cls) if wall is not None else None

def cmd_losses(ref, run, tol):
    """every step's loss of RUN against REF (one rank, the same global batch)"""
    a = {r["step"]: r["loss"] for r in rows(ref)}
    b = {r["step"]: r["loss"] for r in rows(run)}
    steps = sorted(b)
    if not steps or sorted(a) != steps:
        return say(2, f"steps differ: reference {sorted(a)[:3]}..{len(a)}, run {steps[:3]}..{len(b)}")
    bad = [s for s in steps if a[s] is None or b[s] is None]
    if bad:
        return say(1, f"non-finite loss at steps {bad[:5]}")
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
    at = max(steps, key=lambda s: abs(a[s] - b[s]) / abs(a[s]))
    return say(0 if worst <= float(tol) else 1,
               f"worst loss rel diff {worst:.2e} (step {at}) over steps {steps[0]}-{steps[-1]}, "
               f"loss {a[steps[0]]:.4f} -> {a[steps[-1]]:.4f} (tol {float(tol):.0e})")

def cmd_point(run, warmup):
    """tokens/s per GPU, MFU, step time and memory of one timed run"""
    w = int(warmup)
    tps = timed(run, w, "tokens_per_s_device")
    st = timed(run, w, "step_time_s")
    rr = rows(run)
    mfu = [r["mfu"] for r in rr if r["step"] > w and r.get("mfu") is not None]
    den = rr[-1].get("mfu_denominator_tflops")
    mem = max((r.get("device_mem_mib") or r.get("peak_mem_mib") or 0) for r in rr)
    m = f"MFU {100 * statistics.median(mfu):.1f}% of {den:.4g} TFLOP/s" if mfu and den else "MFU n/a"
    return say(3, f"{tps:,.0f} tokens/s per GPU, {m}, step {1e3 * st:.1f} ms, memory {mib(mem)} "
                  f"(median of steps {w + 1}-{rr[-1]['step']})")

def cmd_scale(one, run, warmup, thr):
    """per-GPU tokens/s of RUN against the one-GPU run"""
    w = int(warmup)
    a, b = timed(one, w, "tokens_per_s_device"), timed(run, w, "tokens_per_s_device")
    r = b / a
    return say(0 if r >= float(thr) else 1,
               f"{b:,.0f} tokens/s per GPU = {100 * r:.1f}% of one GPU's {a:,.0f} (>= {100 * float(thr):.0f}%)")

def cmd_ratio(base, run, warmup, thr, what):
    w = int(warmup)
    a, b = timed(base, w, "tokens_per_s_device"), timed(run, w, "tokens_per_s_device")
    r = b / a
    return say(0 if r >= float(thr) else 1, f"{what}: {b:,.0f} / {a:,.0f} tokens/s per GPU = {100 * r:.1f}% "
                                            f"(>= {100 * float(thr):.0f}%)")

def cmd_bubble(run, warmup):
    w = int(warmup)
    b, t = timed(run, w, "pp_bubble"), timed(run, w, "pp_bubble_theory")
    sim = timed(run, w, "pp_bubble_sim")
    st = timed(run, w, "step_time_s")
    return say(3, f"measured bubble {100 * b:.1f}% (median of steps > {w}), theory {100 * t:.1f}%, "
                  f"replayed with the measured action times {100 * sim:.1f}%, step {1e3 * st:.1f} ms")

def cmd_nextloss(writer, reader, step, tol):
    step = int(step)
    w = {r["step"]: r["loss"] for r in rows(writer)}
    rr = rows(reader)
    if [r["step"] for r in rr] != [step] or step not in w:
        return say(2, f"the resumed run recorded steps {[r['step'] for r in rr]}, expected [{step}]")
    a, b = w[step], rr[0]["loss"]
    rel = abs(a - b) / abs(a)
    return say(0 if rel <= float(tol) else 1, f"step {step} loss: writer {a:.6f}, resumed {b:.6f}, rel diff "
                                              f"{rel:.2e} (tol {float(tol):.0e})")

def cmd_dispbytes(run, ranks):
    """bytes of rows one rank dispatches per MoE layer and micro-batch (its own rows included),
    from the all-to-all run's ep_dispatch_bytes (all ranks, the step's forwards)"""
    rr = [r for r in rows(run) if r.get("ep_dispatch_bytes")]
    if not rr:
        return say(2, "no ep_dispatch_bytes in the a2a run's metrics")
    cfg = open(os.path.join(run, "config.yaml")).read()
    g = int(re.search(r"^\s*global_batch:\s*(\d+)", cfg, re.M).group(1))
    mb = int(re.search(r"^\s*micro_batch:\s*(\d+)", cfg, re.M).group(1))
    n, L = int(ranks), len(rr[-1]["moe_layers"])
    M = g // (mb * n)
    print(int(statistics.median(r["ep_dispatch_bytes"] for r in rr) / (n * L * M)))
    return 0

def cmd_peer(nbytes):
    """cudaMemcpyPeerAsync GPU 0 -> GPU 1 of NBYTES through libcudart (ctypes), CUDA events, median of 20"""
    import ctypes, glob
    nbytes = int(nbytes)
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"] + sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    try:
        import nvidia.cuda_runtime as m
        names += sorted(glob.glob(os.path.join(list(m.__path__)[0], "lib", "libcudart.so*")))
    except Exception:
        pass
    lib = None
    for n in names:
        try:
            lib = ctypes.CDLL(n)
            break
        except OSError:
            pass
    if lib is None:
        return say(4, "no libcudart found for cudaMemcpyPeer")
    def ck(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUDA error {r}")
    try:
        cnt, can = ctypes.c_int(), ctypes.c_int()
        ck(lib.cudaGetDeviceCount(ctypes.byref(cnt)), "cudaGetDeviceCount")
        if cnt.value < 2:
            return say(4, f"{cnt.value} CUDA device(s) visible")
        ck(lib.cudaDeviceCanAccessPeer(ctypes.byref(can), 0, 1), "cudaDeviceCanAccessPeer")
        buf = {}
        for d in (0, 1):
            ck(lib.cudaSetDevice(d), "cudaSetDevice")
            p = ctypes.c_void_p()
            ck(lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)), "cudaMalloc")
            buf[d] = p
            if can.value:
                lib.cudaDeviceEnablePeerAccess(1 - d, 0)  # 704: already enabled
        ck(lib.cudaSetDevice(0), "cudaSetDevice")
        s, a, b = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        ck(lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        ck(lib.cudaEventCreate(ctypes.byref(a)), "cudaEventCreate")
        ck(lib.cudaEventCreate(ctypes.byref(b)), "cudaEventCreate")
        times = []
        for i in range(25):
            ck(lib.cudaEventRecord(a, s), "cudaEventRecord")
            ck(lib.cudaMemcpyPeerAsync(buf[1], 1, buf[0], 0, ctypes.c_size_t(nbytes), s), "cudaMemcpyPeerAsync")
            ck(lib.cudaEventRecord(b, s), "cudaEventRecord")
            ck(lib.cudaEventSynchronize(b), "cudaEventSynchronize")
            ms = ctypes.c_float()
            ck(lib.cudaEventElapsedTime(ctypes.byref(ms), a, b), "cudaEventElapsedTime")
            if i >= 5:
                times.append(ms.value)
        for d in (0, 1):
            lib.cudaSetDevice(d)
            lib.cudaFree(buf[d])
    except Exception as e:  # a CUDA error, or a libcudart without these entry points
        return say(4, f"cudaMemcpyPeer probe failed: {e}")
    t = statistics.median(times)
    print(f"{nbytes / t / 1e6:.1f} {t:.4f} {'p2p' if can.value else 'no-p2p'}")
    return 0

def cmd_dispbw(symlog, nbytes, copy_gbs, ranks):
    """the symmetric dispatch's and combine's GB/s from bench --breakdown's op times"""
    bd = breakdown(symlog)
    if not bd:
        return say(2, f"no op breakdown in work/{os.path.basename(symlog)} (multi-gpu-logs.tgz): {first_error(symlog)}")
    wall, ops, _ = bd
    nbytes, n = int(nbytes), int(ranks)
    parts = []
    for op in ("ep_sym_dispatch", "ep_sym_combine"):
        if op not in ops or ops[op][0] <= 0:
            return say(2, f"{op} not in the breakdown (did the symmetric backend run?)")
        calls, ms = ops[op]
        per = ms / calls
        gbs = nbytes / (per * 1e-3) / 1e9
        rel = f" = {100 * gbs / float(copy_gbs):.0f}% of the peer copy" if float(copy_gbs) > 0 else ""
        parts.append(f"{op[7:]} {gbs:.0f} GB/s ({per:.3f} ms per call, {calls:.0f} calls/step){rel}")
    copy = (f"cudaMemcpyPeer GPU0->GPU1 of the same bytes {float(copy_gbs):.0f} GB/s" if float(copy_gbs) > 0
            else "cudaMemcpyPeer: NOT MEASURED (see its line)")
    anchor = "; DeepEP's intranode anchor: 153-158 GB/s per GPU on H800" if n >= 8 else ""
    return say(3, f"per GPU, {nbytes / 2**20:.1f} MiB of rows per call (~{n - 1}/{n} of them to peers): "
                  + ", ".join(parts) + f"; {copy}{anchor}; the a2a backend's own dispatch bandwidth: NOT "
                  "MEASURED (its NCCL all-to-all is outside the timed op table)")

NON_MOE_CLASSES = ("dense GEMMs", "attention", "optimizer")
NON_MOE_OPS = re.compile(r"^(embedding_|rmsnorm|rope_|crossentropy|loss_sum|cast_to_act)")

def moe_ms(bd):
    wall, ops, cls = bd
    other = sum(ms for op, (c, ms) in ops.items() if NON_MOE_OPS.match(op))
    return wall - sum(cls.get(c, 0) for c in NON_MOE_CLASSES) - other

def cmd_moetime(symlog, a2alog, thr, symrun, a2arun, warmup):
    """MoE-layer time per step of each backend: breakdown wall time less the ops outside the MoE layers"""
    w = int(warmup)
    ts, ta = timed(symrun, w, "step_time_s"), timed(a2arun, w, "step_time_s")
    whole = f"whole step without events: a2a {1e3 * ta:.1f} ms / symmetric {1e3 * ts:.1f} ms = {ta / ts:.2f}"
    if not os.path.exists(symlog):
        return say(1 if ta / ts < float(thr) else 0, whole + f" (>= {float(thr)}; no breakdown)")
    bs, ba = breakdown(symlog), breakdown(a2alog)
    if not bs or not ba:
        bad = symlog if not bs else a2alog
        return say(2, f"no op breakdown in work/{os.path.basename(bad)} (multi-gpu-logs.tgz): {first_error(bad)}; {whole}")
    ms, ma = moe_ms(bs), moe_ms(ba)
    r = ma / ms
    return say(0 if r >= float(thr) else 1,
               f"MoE-layer time (breakdown wall less dense GEMMs, attention, optimizer, norms, RoPE, embedding, "
               f"CE): a2a {ma:.1f} ms / symmetric {ms:.1f} ms = {r:.2f} (>= {float(thr)}); {whole}")

def cmd_overlap(one_g, dp_g, one_bd, dp_bd, warmup, thr, graphs_ok):
    """hidden share = 1 - exposed / total reduction: total = step(dp N, CUDA graph: buckets after the
    last backward) - step(1 GPU, graph); exposed = breakdown wall(dp N, hooks overlap) - wall(1 GPU)"""
    w = int(warmup)
    b1, bn = breakdown(one_bd), breakdown(dp_bd)
    if not b1 or not bn:
        bad = one_bd if not b1 else dp_bd
        return say(2, f"no op breakdown in work/{os.path.basename(bad)} (multi-gpu-logs.tgz): {first_error(bad)}")
    exposed = bn[0] - b1[0]
    if graphs_ok != "1":
        return say(4, f"exposed reduction {exposed:.1f} ms/step (breakdown walls dp N {bn[0]:.1f} - 1 GPU "
                      f"{b1[0]:.1f}); the whole reduction: NOT MEASURED (a CUDA-graph run did not capture, so no "
                      f"run reduced after the backward)")
    red = 1e3 * (timed(dp_g, w, "step_time_s") - timed(one_g, w, "step_time_s"))
    if red <= 0:
        return say(4, f"the graph runs show no reduction time ({red:.1f} ms): cannot divide; exposed {exposed:.1f} ms")
    hidden = 1 - exposed / red
    return say(0 if hidden >= float(thr) - 1e-9 else 1,
               f"hidden share {100 * hidden:.0f}% (>= {100 * float(thr):.0f}%): reduction {red:.1f} ms/step "
               f"unoverlapped (CUDA-graph steps dp N - 1 GPU), exposed {exposed:.1f} ms with the backward's hooks "
               f"(breakdown walls {bn[0]:.1f} - {b1[0]:.1f} ms)")

def cmd_slow(one_bd, dp_bd):
    b1, bn = breakdown(one_bd), breakdown(dp_bd)
    if not b1 or not bn:
        bad = one_bd if not b1 else dp_bd
        return say(2, f"no op breakdown in work/{os.path.basename(bad)} (multi-gpu-logs.tgz): {first_error(bad)}")
    s1, sn = b1[1].get("sum of ops", (0, 0))[1], bn[1].get("sum of ops", (0, 0))[1]
    g1 = sum(b1[2].get(c, 0) for c in ("expert GEMMs", "dense GEMMs", "attention"))
    gn = sum(bn[2].get(c, 0) for c in ("expert GEMMs", "dense GEMMs", "attention"))
    return say(3, f"overlapped kernels: sum of ops {sn:.1f} ms/step with the reduction beside them against "
                  f"{s1:.1f} alone ({100 * (sn / s1 - 1):+.1f}%); GEMMs + attention {gn:.1f} against {g1:.1f} "
                  f"({100 * (gn / g1 - 1):+.1f}%): the slowdown costs {sn - s1:.1f} ms")

def cmd_steptime(one, dp, warmup):
    w = int(warmup)
    a, b = timed(one, w, "step_time_s"), timed(dp, w, "step_time_s")
    return say(3, f"step time dp N {1e3 * b:.1f} ms against one rank {1e3 * a:.1f} ms: {1e3 * (b - a):.1f} ms "
                  f"of exposed reduction (and waits)")

def cmd_big(run, log, planlog, steps):
    rr = rows(run)
    if len(rr) < int(steps):
        return say(2, f"{len(rr)} of {steps} steps recorded")
    losses = [r["loss"] for r in rr]
    if any(l is None for l in losses):
        return say(1, "a non-finite loss")
    text = open(log, errors="replace").read()
    m = re.search(r"model: (\d+) parameters", text)
    params = (f"{int(m.group(1)) / 1e9:.1f}B parameters" if int(m.group(1)) >= 1e8 else f"{int(m.group(1)):,} parameters") if m else "? parameters"
    meas = [float(x) for x in re.findall(r"rank \d+: memory measured: ([\d.]+) MiB", text)]
    own = [float(x) for x in re.findall(r"memory measured: [\d.]+ MiB \(.*\); plan ([\d.]+) MiB peak", text)]
    mem = max((r.get("device_mem_mib") or 0) for r in rr)
    plan = open(planlog, errors="replace").read() if os.path.exists(planlog) else ""
    pm = re.search(r"-> peak ([\d.]+) GiB of ([\d.]+) GiB", plan)
    ms = f"measured {mib(max(meas))} (the largest rank; " if meas else "measured ? ("
    ms += f"GPU memory in use at the steps {mib(mem)})" if mem else "CPU allocations)"
    ps = (f"moecore plan predicts {pm.group(1)} GiB of {pm.group(2)} GiB ({100 * (float(pm.group(1)) * 1024 / max(meas) - 1):+.1f}%)"
          if pm and meas else "moecore plan: no prediction parsed (work/big_plan.log)")
    own_s = f"; the trainer's own plan {mib(max(own))}" if own else ""
    return say(0, f"{params}, {len(rr)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; memory per GPU {ms}; "
                  f"{ps}{own_s}")

if __name__ == "__main__":
    cmd = globals().get("cmd_" + sys.argv[1])
    if not cmd:
        sys.exit(say(2, f"mg.py: unknown command {sys.argv[1]}"))
    sys.exit(cmd(*sys.argv[2:]))
PY

# ---- the steps --------------------------------------------------------------------------------------
thr_scale=0.95 thr_sweep=0.85
[ "$N" -gt 2 ] && thr_scale=0.90
[ "$N" -ge 8 ] && thr_sweep=0.90

step_correct() {
  local T=$tmo name rc text
  run one 1 configs/tiny.yaml "${cflags[@]}" --train.steps="$CS" ||
    { report correct exact 2 "one rank: $(why one)"; return; }
  for spec in "dp$N --parallel.dp=$N" "dp${N}_sharded --parallel.dp=$N --optim.sharded=true" \
              "ep${N}_sym --parallel.dp=$N --parallel.ep=$N --parallel.ep_backend=symmetric" \
              "ep${N}_a2a --parallel.dp=$N --parallel.ep=$N --parallel.ep_backend=a2a" \
              "ep${N}_sharded --parallel.dp=$N --parallel.ep=$N --optim.sharded=true"; do
    set -- $spec
    name=$1; shift
    if ! run "$name" "$N" configs/tiny.yaml "${cflags[@]}" --train.steps="$CS" "$@"; then
      report correct exact 2 "$name: $(why "$name")"; continue
    fi
    text=$(pyc losses "$work/one" "$work/$name" "$tol"); rc=$?
    local note=""
    case $name in
      *_sym) grep -q "expert dispatch: symmetric" "$work/$name.log" || { note=" [but the symmetric dispatch did not run]"; rc=1; } ;;
      *_a2a) grep -q "expert dispatch: a2a" "$work/$name.log" || { note=" [but the a2a dispatch did not run]"; rc=1; } ;;
    esac
    report correct exact $rc "$name ($*) = one rank: $text$note"
  done
  # one step whose weights follow the gradient itself (optim.eps 1, lr 1, no weight decay:
  # w - g / (|g| + 1)): each layout's gradients against one rank's, weights within 1e-4 (one GPU
  # with several ranks measured 1.4e-8, bench/results/2026-12-07-s14.md; a step 10% larger,
  # lr 1.1, is 1.3e-2 off on CPU); the losses over 20 steps drift by BF16's top-k flips, which
  # one step does not
  local g=(--train.steps=1 --train.warmup_steps=0 --optim.lr=1 --optim.eps=1 --optim.weight_decay=0
           --checkpoint.save_final=true)
  if run grad_one 1 configs/tiny.yaml "${cflags[@]}" "${g[@]}"; then
    for spec in "dp$N --parallel.dp=$N" "ep${N}_sym --parallel.dp=$N --parallel.ep=$N --parallel.ep_backend=symmetric" \
                "ep${N}_a2a_sharded --parallel.dp=$N --parallel.ep=$N --parallel.ep_backend=a2a --optim.sharded=true"; do
      set -- $spec
      name=$1; shift
      if ! run "grad_$name" "$N" configs/tiny.yaml "${cflags[@]}" "${g[@]}" "$@"; then
        report correct exact 2 "$name one step: $(why "grad_$name")"; continue
      fi
      text=$("$py" tests/compare_runs.py "$work/grad_one" "$work/grad_$name" 1e-5 1e-4 1 2>&1); rc=$?
      [ $rc -gt 1 ] && rc=2
      report correct exact $rc "$name ($*) one step, gradients (optim.eps 1, lr 1) = one rank: $text"
    done
  else
    report correct exact 2 "one rank, one step: $(why grad_one)"
  fi
  if [ "$device" = cpu ]; then
    report correct exact 5 "ep$N symmetric captured as a CUDA graph: skipped on cpu (no CUDA graphs on CPU ranks)"
  elif [ -f "$work/ep${N}_sym/metrics.jsonl" ]; then
    if graph_ok "ep${N}_sym"; then
      report correct exact 0 "ep$N symmetric captured as a CUDA graph: the log says 'cuda graph: captured' and no capture failed over $CS steps"
    else
      report correct exact 1 "ep$N symmetric captured as a CUDA graph: $(grep -m1 'cuda graph' "$work/ep${N}_sym.log" || echo 'no cuda graph line')"
    fi
  else
    report correct exact 2 "ep$N symmetric captured as a CUDA graph: $(why "ep${N}_sym")"
  fi
}

step_olmoe() {
  local T=$tmo cfg=configs/bench/olmoe-1b-7b.yaml gb name rc text extra=()
  gb=$(cfgval "$cfg" global_batch)
  if [ "$device" = cuda ] && [ "${gpu_mib:-0}" -lt 120000 ]; then extra=(--model.n_layers=8); fi  # 80 GB cards: half the layers
  local what="OLMoE-1B-7B bench config${extra:+ with ${extra[*]} (the whole model needs an H200)}, $gb x 4096 tokens per GPU per step"
  [ "$device" = cpu ] && what="OLMoE-1B-7B bench config with tiny shapes (E=64 top-8 kept)"
  run olmoe_1 1 "$cfg" "${bflags[@]}" "${shrink[@]}" "${extra[@]}" ||
    { report olmoe timing 2 "one GPU: $(why olmoe_1)"; return; }
  text=$(pyc point "$work/olmoe_1" "$W"); rc=$?
  report olmoe timing $rc "one GPU ($what): $text"
  for spec in "ep$N --parallel.dp=$N --parallel.ep=$N" "dp$N --parallel.dp=$N"; do
    set -- $spec
    name=olmoe_$1; shift
    local layout="$*" note=""
    if ! run "$name" "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" "${extra[@]}" --train.global_batch=$((gb * N)) "$@"; then
      if grep -qi "out of memory" "$work/$name.log" && [[ $name = *dp* ]]; then
        mv "$work/$name.log" "$work/$name-oom.log"
        run "$name" "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" "${extra[@]}" --train.global_batch=$((gb * N)) "$@" \
          --optim.sharded=true && note=" [with optim.sharded=true: unsharded ran out of memory, work/$name-oom.log]"
      fi
      [ -f "$work/$name/metrics.jsonl" ] || { report olmoe timing 2 "${name#olmoe_} ($layout): $(why "$name")"; continue; }
      [ -n "$note" ] || note=" [but the run exited non-zero: $(why "$name")]"
    fi
    text=$(pyc scale "$work/olmoe_1" "$work/$name" "$W" "$thr_scale"); rc=$?
    report olmoe timing $rc "${name#olmoe_} ($layout): $text$note"
  done
}

# 80 GB cards: sweep-e128's micro-batches of 16 x 4096 do not fit beside ep 2's buffers (moecore plan:
# 94 GiB with a2a, 77 of 79 with symmetric and its receive buffers cut to 1.0x), so the sweep and the
# dispatch runs take micro-batches of 8 there, the same tokens per GPU per step, and say so
small_mb=()
if [ "$device" = cuda ] && [ "${gpu_mib:-0}" -lt 120000 ]; then small_mb=(--train.micro_batch=8); fi

step_sweep() {
  local T=$tmo e cfg name rc text list=${SWEEP_E:-8 32 128}
  [ "$N" -ge 8 ] && [ -z "${SWEEP_E:-}" ] && list="8 32 128 256"
  for e in $list; do
    cfg=configs/bench/sweep-e$e.yaml
    local extra=()
    [ -f "$cfg" ] || { cfg=configs/bench/sweep-e128.yaml extra=(--model.n_experts="$e"); }
    if [ $((e % N)) != 0 ]; then report sweep timing 5 "E=$e: not a multiple of ep $N"; continue; fi
    name=sweep_e$e
    local gb; gb=$(cfgval "$cfg" global_batch)
    if ! run "$name" "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" "${extra[@]}" "${small_mb[@]}" --parallel.dp="$N" \
         --parallel.ep="$N" --train.global_batch=$((gb * N)); then
      report sweep timing 2 "E=$e ep$N: $(why "$name")"; continue
    fi
    text=$(pyc point "$work/$name" "$W"); rc=$?
    report sweep timing $rc "E=$e ep$N ($((e / N)) experts per GPU, $(basename "$cfg")${extra:+ ${extra[*]}}${small_mb:+ ${small_mb[*]}, an 80 GB card}): $text"
  done
  if [ -f "$work/sweep_e8/metrics.jsonl" ] && [ -f "$work/sweep_e128/metrics.jsonl" ]; then
    text=$(pyc ratio "$work/sweep_e8" "$work/sweep_e128" "$W" "$thr_sweep" "E=128 / E=8 at ep$N"); rc=$?
    report sweep timing $rc "$text"
  else
    report sweep timing 2 "E=128 / E=8 at ep$N: a run is missing (above)"
  fi
  if [ -f "$work/sweep_e256/metrics.jsonl" ] && [ -f "$work/sweep_e8/metrics.jsonl" ]; then
    text=$(pyc ratio "$work/sweep_e8" "$work/sweep_e256" "$W" "$thr_sweep" "E=256 / E=8 at ep$N"); rc=$?
    report sweep timing $rc "$text"
  fi
}

step_dispatch() {
  local T=$tmo cfg=${DISPATCH_CONFIG:-configs/bench/sweep-e128.yaml} gb bytes copy="0" rc text
  gb=$(cfgval "$cfg" global_batch)
  local lay=(--parallel.dp="$N" --parallel.ep="$N" --train.global_batch=$((gb * N)) "${small_mb[@]}")
  run disp_a2a "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" "${lay[@]}" --parallel.ep_backend=a2a ||
    { report dispatch timing 2 "a2a: $(why disp_a2a)"; return; }
  run disp_sym "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" "${lay[@]}" --parallel.ep_backend=symmetric ||
    { report dispatch timing 2 "symmetric: $(why disp_sym)"; return; }
  bytes=$(pyc dispbytes "$work/disp_a2a" "$N") || { report dispatch timing 2 "dispatch bytes: $bytes"; return; }
  if [ "$device" = cpu ]; then
    report dispatch timing 5 "dispatch + combine GB/s against cudaMemcpyPeer: skipped on cpu (bench --breakdown and cudaMemcpyPeer need GPUs); rows per dispatch call $bytes B per rank per MoE layer (from the a2a run's ep_dispatch_bytes)"
    text=$(pyc moetime "$work/none" "$work/none" 1.3 "$work/disp_sym" "$work/disp_a2a" "$W"); rc=$?
    report dispatch timing $rc "$(basename "$cfg") ep$N, symmetric against a2a: $text [the breakdown's MoE-layer time: skipped on cpu]"
    return
  fi
  local p
  p=$(pyc peer "$bytes" 2>&1); rc=$?
  echo "$p" > "$work/peer_copy.txt"
  if [ $rc = 0 ]; then
    copy=${p%% *}
    report dispatch timing 3 "NVLink copy rate: cudaMemcpyPeerAsync GPU0->GPU1 of $bytes B: $copy GB/s (median of 20, CUDA events; $(echo "$p" | cut -d' ' -f3))"
  else
    report dispatch timing 4 "NVLink copy rate (cudaMemcpyPeer): $p"
  fi
  # a failed breakdown shows in the lines below (no table: ERROR with its log's first error)
  bench disp_sym_bd "$N" "$cfg" "${lay[@]}" --parallel.ep_backend=symmetric
  bench disp_a2a_bd "$N" "$cfg" "${lay[@]}" --parallel.ep_backend=a2a
  text=$(pyc dispbw "$work/disp_sym_bd.log" "$bytes" "$copy" "$N"); rc=$?
  report dispatch timing $rc "symmetric dispatch + combine, $(basename "$cfg") ep$N${small_mb:+ ${small_mb[*]} (an 80 GB card)}: $text"
  text=$(pyc moetime "$work/disp_sym_bd.log" "$work/disp_a2a_bd.log" 1.3 "$work/disp_sym" "$work/disp_a2a" "$W"); rc=$?
  report dispatch timing $rc "$(basename "$cfg") ep$N, symmetric against a2a: $text"
}

step_overlap() {
  local T=$tmo cfg=${OVERLAP_CONFIG:-configs/bench/sweep-e32.yaml} gb rc text
  gb=$(cfgval "$cfg" global_batch)
  run ov_one 1 "$cfg" "${bflags[@]}" "${shrink[@]}" || { report overlap timing 2 "one GPU: $(why ov_one)"; return; }
  run ov_dp "$N" "$cfg" "${bflags[@]}" "${shrink[@]}" --parallel.dp="$N" --train.global_batch=$((gb * N)) ||
    { report overlap timing 2 "dp$N: $(why ov_dp)"; return; }
  if [ "$device" = cpu ]; then
    text=$(pyc steptime "$work/ov_one" "$work/ov_dp" "$W"); rc=$?
    report overlap timing $rc "$(basename "$cfg") dp$N: $text"
    report overlap timing 5 "hidden share of the gradient reduction and the overlapped kernels' slowdown: skipped on cpu (bench --breakdown and the CUDA graph's unoverlapped reduction need GPUs)"
    return
  fi
  local g=0
  graph_ok ov_one && graph_ok ov_dp && g=1
  bench ov_one_bd 1 "$cfg"
  bench ov_dp_bd "$N" "$cfg" --parallel.dp="$N" --train.global_batch=$((gb * N))
  text=$(pyc overlap "$work/ov_one" "$work/ov_dp" "$work/ov_one_bd.log" "$work/ov_dp_bd.log" "$W" 0.8 "$g"); rc=$?
  report overlap timing $rc "$(basename "$cfg") dp$N: $text"
  text=$(pyc slow "$work/ov_one_bd.log" "$work/ov_dp_bd.log"); rc=$?
  report overlap timing $rc "$(basename "$cfg") dp$N: $text"
}

step_pp() {
  local T=$tmo rc text name np cfg=${PP_CONFIG:-configs/bench/sweep-e8.yaml} gb
  local pl=(--model.n_layers=4)
  local specs=("pp2 2 --parallel.pp=2 --parallel.pp_schedule=1f1b")
  [ "$N" -ge 4 ] && specs+=("pp2xep$((N / 2)) $N --parallel.pp=2 --parallel.dp=$((N / 2)) --parallel.ep=$((N / 2)) --parallel.pp_schedule=1f1b")
  for spec in "${specs[@]}"; do
    set -- $spec
    name=$1 np=$2; shift 2
    if ! run "$name" "$np" configs/tiny.yaml "${cflags[@]}" "${pl[@]}" --train.steps="$CS" "$@"; then
      if grep -q "pipeline parallelism runs on CPU ranks for now" "$work/$name.log"; then
        report pp exact 4 "$name 1f1b losses and bubble: this binary refuses parallel.pp > 1 on cuda ('$(grep -m1 -o 'pipeline parallelism runs on CPU ranks for now[^;]*' "$work/$name.log")')"
        return
      fi
      report pp exact 2 "$name: $(why "$name")"; continue
    fi
    # the one-rank reference, once the pipeline has run (a binary that refuses it costs no reference)
    if [ ! -f "$work/pp_one/metrics.jsonl" ] && ! run pp_one 1 configs/tiny.yaml "${cflags[@]}" "${pl[@]}" --train.steps="$CS"; then
      report pp exact 2 "one rank: $(why pp_one)"; return
    fi
    text=$(pyc losses "$work/pp_one" "$work/$name" "$tol"); rc=$?
    report pp exact $rc "$name 1f1b ($*) = one rank: $text"
  done
  # the bubble on a bench config: micro-batches of 2, so that a step has several per pipeline
  gb=$(cfgval "$cfg" global_batch)
  local mb=2
  specs=("ppb_pp2 2 --parallel.pp=2 --train.global_batch=$gb")
  [ "$N" -ge 4 ] && specs+=("ppb_pp2xep$((N / 2)) $N --parallel.pp=2 --parallel.dp=$((N / 2)) --parallel.ep=$((N / 2)) --train.global_batch=$((gb * N / 2))")
  for spec in "${specs[@]}"; do
    set -- $spec
    name=$1 np=$2; shift 2
    if ! run "$name" "$np" "$cfg" "${bflags[@]}" "${shrink[@]}" --train.micro_batch=$mb --parallel.pp_schedule=1f1b "$@"; then
      report pp timing 2 "$name bubble: $(why "$name")"; continue
    fi
    text=$(pyc bubble "$work/$name" "$W"); rc=$?
    report pp timing $rc "${name#ppb_} 1f1b on $(basename "$cfg"), micro-batches of $mb ($*): $text"
  done
}

step_resume() {
  local T=$tmo rc text ck step_dir
  step_dir=$(printf 'step-%08d' "$RS")
  local multi=(--parallel.dp="$N" --parallel.ep="$N" --optim.sharded=true)
  local rf=("${cflags[@]}" --train.steps=$((RS + 1)) --checkpoint.interval="$RS" --checkpoint.keep=0)
  # writer: N+1 steps with a checkpoint at N; reader: resumes step N elsewhere and runs step N+1
  for case_ in "multi one" "one multi"; do
    set -- $case_
    local wr=$1 rd=$2 wname="res_w_$1" rname="res_$1_to_$2"
    local wargs=() rargs=() wnp=1 rnp=1
    [ "$wr" = multi ] && wargs=("${multi[@]}") wnp=$N
    [ "$rd" = multi ] && rargs=("${multi[@]}") rnp=$N
    local label="$wnp -> $rnp"
    [ "$wr" = multi ] && label="$N ranks (dp $N = ep $N, sharded) -> one rank" || label="one rank -> $N ranks (dp $N = ep $N, sharded)"
    if ! run "$wname" "$wnp" configs/tiny.yaml "${rf[@]}" "${wargs[@]}"; then
      report resume exact 2 "$label: writer: $(why "$wname")"; continue
    fi
    [ -f "$work/$wname/checkpoints/$step_dir/COMMITTED" ] || { report resume exact 2 "$label: no committed $step_dir"; continue; }
    ck=$work/$rname-ckpt
    mkdir -p "$ck" && cp -r "$work/$wname/checkpoints/$step_dir" "$ck/"
    if ! run "$rname" "$rnp" configs/tiny.yaml "${rf[@]}" "${rargs[@]}" --checkpoint.dir="$ck" --resume; then
      report resume exact 2 "$label: reader: $(why "$rname")"; continue
    fi
    if ! grep -q "resume: loaded .*$step_dir" "$work/$rname.log"; then
      report resume exact 1 "$label: the reader did not say it loaded $step_dir"; continue
    fi
    text=$(pyc nextloss "$work/$wname" "$work/$rname" $((RS + 1)) "$tol_resume"); rc=$?
    report resume exact $rc "$label: $text"
  done
}

# kill_case NAME LAUNCHER [SIG]: start a long run of N ranks, kill -SIG (KILL) the last rank after 2 steps,
# time the end (SIG STOP: of the survivors; the stopped rank is killed after)
kill_case() {
  local name=$1 how=$2 sig=${3:-KILL} t0 t1 rc pids=() r last msg st i
  local args=(train configs/tiny.yaml "${cflags[@]}" --train.steps=1000000 --parallel.dp="$N" --parallel.ep="$N"
              --parallel.timeout_s="$KT" --logging.run_dir="$work/$name")
  rm -f "$work/$name".pid.*
  if [ "$how" = mpirun ]; then
    echo "+ ${mpi[*]} $N ... $bin ${args[*]}" > "$work/$name.log"
    timeout --kill-after=10 $((KT + 120)) "${mpi[@]}" "$N" "${xs[@]}" sh -c \
      'echo $$ > "'"$work/$name"'.pid.$OMPI_COMM_WORLD_RANK"; exec "$0" "$@"' "$bin" "${args[@]}" >> "$work/$name.log" 2>&1 &
    pids=($!)
  else
    local port=$((29500 + RANDOM % 2000))
    echo "+ RANK=0..$((N - 1)) WORLD_SIZE=$N MASTER_PORT=$port $bin ${args[*]}" > "$work/$name.log"
    for ((r = 0; r < N; r++)); do
      RANK=$r WORLD_SIZE=$N LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        timeout --kill-after=10 $((KT + 120)) "$bin" "${args[@]}" >> "$work/$name.r$r.log" 2>&1 &
      pids+=($!)
      echo $! > "$work/$name.pid.$r"   # timeout's pid: the rank is its child
    done
  fi
  for _ in $(seq 600); do
    [ "$(wc -l < "$work/$name/metrics.jsonl" 2>/dev/null || echo 0)" -ge 2 ] && break
    sleep 0.5
  done
  last=$((N - 1))
  if [ "$(wc -l < "$work/$name/metrics.jsonl" 2>/dev/null || echo 0)" -lt 2 ] || [ ! -s "$work/$name.pid.$last" ]; then
    for r in "${pids[@]}"; do kill -TERM "$r" 2>/dev/null; done
    wait "${pids[@]}" 2>/dev/null
    report kill exact 2 "$how: the run did not reach step 2 (log work/$name.log): $(grep -m1 -i error "$work/$name.log" "$work/$name".r*.log 2>/dev/null | cut -c1-200)"
    return
  fi
  local victim; victim=$(cat "$work/$name.pid.$last")
  [ "$how" != mpirun ] && victim=$(pgrep -P "$victim" | head -n 1)   # the rank under its timeout
  t0=$(date +%s.%N)
  kill -"$sig" "$victim"
  # the job's status: mpirun's, or (no launcher) rank 0's; every survivor must end too (a stopped
  # rank's own wrapper only after it is killed below)
  rc=0 i=0
  for r in "${pids[@]}"; do
    if [ "$sig" = STOP ] && [ "$how" != mpirun ] && [ $i = "$last" ]; then i=$((i + 1)); continue; fi
    wait "$r"; st=$?; [ $i = 0 ] && rc=$st; i=$((i + 1))
  done
  t1=$(date +%s.%N)
  if [ "$sig" = STOP ]; then kill -KILL "$victim" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; fi
  [ "$how" != mpirun ] && for ((r = 0; r < N; r++)); do [ $r = "$last" ] || cat "$work/$name.r$r.log" >> "$work/$name.log"; done
  local el; el=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  msg=$(grep -m1 -E 'did not complete within|exited on signal|NCCL.*(error|abort)|moecore: error|rank [0-9]+ failed' "$work/$name.log" | cut -c1-200)
  local lim=$((KT + 15)) v
  # without mpirun's own ending, the survivors' watchdog: its timeout, then an abort that may take its 20 s grace
  [ "$sig" = STOP ] || [ "$how" != mpirun ] && lim=$((KT + 30))
  if [ "$rc" = 124 ]; then v=1; msg="a hang: still running $((KT + 120)) s after start, ended by the script's timeout"
  elif awk -v e="$el" -v l="$lim" 'BEGIN { exit !(e <= l) }' && [ -n "$msg" ]; then v=0
  else v=1; fi
  report kill exact $v "$how, kill -$sig of rank $last of $N after step 2: the job ended ${el} s later, exit $rc (parallel.timeout_s $KT; limit $KT + $((lim - KT)) s grace): ${msg:-no message}"
}

step_kill() {
  kill_case kill_mpirun mpirun
  if [ "$device" = cpu ]; then
    report kill exact 5 "without a launcher to end it (torchrun-style variables), and kill -STOP (a stuck rank): moecore's NCCL watchdog alone, skipped on cpu (CPU ranks need MPI, which has no timeout)"
  else
    kill_case kill_torchrun torchrun
    kill_case stop_mpirun mpirun STOP
  fi
}

step_big() {
  local T=$tmo_big cfg=${BIG_CONFIG:-configs/seed/small.yaml} rc text
  local lay=(--parallel.dp="$N" --parallel.ep="$N" --optim.sharded=true --train.micro_batch=1 --train.recompute=none
             --train.global_batch=$((8 * N)) --train.steps="$BS")
  local sflags=(--data.synthetic=true --checkpoint.save_final=false --checkpoint.interval=0 --train.eval_interval=0 --logging.log_interval=1)
  "$bin" plan "$cfg" --gpus "$N" --gpu "$gpu_kind" --explain "dp$N/ep$N/sharded/none/mb1/bf16" "${shape[@]}" \
    --train.global_batch=$((8 * N)) > "$work/big_plan.log" 2>&1 || echo "(plan failed: exit $?)" >> "$work/big_plan.log"
  if [ "$device" = cuda ] && grep -q "DOES NOT FIT" "$work/big_plan.log"; then
    report big exact 4 "$(basename "$cfg") ep$N + sharded on $N x $gpu_kind: moecore plan says it does not fit ($(grep -m1 -o 'peak [0-9.]* GiB of [0-9.]* GiB' "$work/big_plan.log")); not run"
    return
  fi
  if ! run big "$N" "$cfg" "${sflags[@]}" "${shrink[@]}" "${lay[@]}"; then
    report big exact 2 "$(basename "$cfg") ep$N + sharded: $(why big)"; return
  fi
  text=$(pyc big "$work/big" "$work/big.log" "$work/big_plan.log" "$BS"); rc=$?
  [ "$device" = cpu ] && text="$text [cpu: tiny shapes; the plan models the $gpu_kind's memory]"
  report big exact $rc "$(basename "$cfg") ep$N + sharded optimizer: $text"
}

for s in "${steps[@]}"; do
  if [ "$s" = big-if-8 ]; then
    if [ "$N" -ge 8 ] || [ "$device" = cpu ]; then s=big
    else report big exact 5 "issue 21's ~40B model: not in 'all' below 8 GPUs (run the step 'big' to force it)"; continue; fi
  fi
  if [ -n "${DEADLINE_S:-}" ] && [ $((DEADLINE_S - ($(date +%s) - t_start))) -lt 30 ]; then
    report "$s" exact 5 "not run: less than 30 s left of DEADLINE_S $DEADLINE_S"; continue
  fi
  t0=$(date +%s)
  echo "== $s ($N $device ranks)"
  "step_$s"
  pack
  echo "== $s: $(( $(date +%s) - t0 )) s (total $(( $(date +%s) - t_start )) s)" | tee -a "$summary"
done
