#!/usr/bin/env bash
# s14: dp2 / ep2 weight drift on one GPU (staged MPI): per-tensor differences after 1 and 12 steps
set -u
tar xJf build/gpu-pack.tar.xz
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 MOECORE_COMM=mpi OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=2
cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64${cublas:+:$cublas}"
t=$(mktemp -d); build/moecore tokenize --out $t/t.bin /usr/share/common-licenses/* >/dev/null
base=(--device.type=cuda --data.train=$t/t.bin --data.eval= --train.global_batch=16 --train.micro_batch=4 --train.warmup_steps=3 --train.eval_interval=0 --logging.log_interval=1 --checkpoint.interval=0 --parallel.bucket_mb=0.25 --parallel.ep_backend=a2a --model.routing=learned)
r() { n=$1; np=$2; shift 2; if [ $np -gt 1 ]; then mpirun --oversubscribe -np $np build/moecore train configs/tiny.yaml "${base[@]}" --logging.run_dir=$t/$n "$@" > $t/$n.log 2>&1; else build/moecore train configs/tiny.yaml "${base[@]}" --logging.run_dir=$t/$n "$@" > $t/$n.log 2>&1; fi; echo "$n exit $?"; }
for s in 1 12; do
  r s$s 1 --train.steps=$s; r s${s}b 1 --train.steps=$s; r dp$s 2 --parallel.dp=2 --train.steps=$s; r ep$s 2 --parallel.dp=2 --parallel.ep=2 --train.steps=$s
  r s${s}_f32 1 --train.steps=$s --train.precision=fp32; r dp${s}_f32 2 --parallel.dp=2 --train.steps=$s --train.precision=fp32
done
python3 - $t <<'PY'
import sys,glob,json,struct,math
d=sys.argv[1]
def load(x):
    ps=sorted(glob.glob(d+"/"+x+"/checkpoints/step-*/model.safetensors"))
    if not ps: return None
    raw=open(ps[-1],"rb").read(); n=struct.unpack("<Q",raw[:8])[0]; hdr=json.loads(raw[8:8+n]); out={}
    for k,v in hdr.items():
        if k=="__metadata__": continue
        s,e=v["data_offsets"]; out[k]=struct.unpack("<%df"%((e-s)//4),raw[8+n+s:8+n+e])
    return out
def losses(x):
    try: return [json.loads(l)["loss"] for l in open(d+"/"+x+"/metrics.jsonl") if '"loss"' in l]
    except Exception as e: return str(e)
for s in (1,12):
  a=load("s%d"%s)
  for b in ("s%db"%s,"dp%d"%s,"ep%d"%s):
    w=load(b)
    if a is None or w is None: print(b,"missing"); continue
    rows=sorted(((math.sqrt(sum((x-y)**2 for x,y in zip(a[k],w[k])))/(math.sqrt(sum(x*x for x in a[k])) or 1),k) for k in a),reverse=True)
    print("s%d vs %s: worst"%(s,b), ["%s %.2e"%(k,r) for r,k in rows[:4]], "losses", losses("s%d"%s)[-2:], losses(b)[-2:])
  a=load("s%d_f32"%s); w=load("dp%d_f32"%s)
  if a and w:
    rows=sorted(((math.sqrt(sum((x-y)**2 for x,y in zip(a[k],w[k])))/(math.sqrt(sum(x*x for x in a[k])) or 1),k) for k in a),reverse=True)
    print("fp32 s%d vs dp: worst"%s, ["%s %.2e"%(k,r) for r,k in rows[:4]])
PY
grep -h "precision\|error" $t/*.log | sort | uniq -c | head
