#!/usr/bin/env bash
# Launching without mpirun (src/dist/launch.h), on this machine's loopback:
#  1. four processes with torchrun-style variables (RANK, WORLD_SIZE,
#     LOCAL_RANK, MASTER_ADDR, MASTER_PORT) find their ranks, all-gather over
#     the TCP rendezvous (rank 0's random id reaches all) and agree on the
#     dp x ep mesh;
#  2. the same with Slurm's variables set by hand (SLURM_PROCID, SLURM_NTASKS,
#     SLURM_LOCALID, SLURM_JOB_NODELIST, the port from SLURM_JOB_ID);
#  3. the first host of Slurm node lists;
#  4. errors within their timeout, not hangs: no MASTER_ADDR, nobody at
#     MASTER_ADDR:MASTER_PORT, rank 0 alone (naming the missing ranks), a
#     rank outside the world.
set -u
cd "$(dirname "$0")/.."
tool=build/tests/tool_launch
[ -x "$tool" ] || { echo "FAIL: $tool missing (make $tool)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
clean_env=(env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u RANK -u WORLD_SIZE -u SLURM_PROCID -u SLURM_NTASKS -u MASTER_ADDR -u MASTER_PORT)

# check_job NAME N: every rank printed "agreed" and the same id; rank r printed rank r
check_job() {
  local name=$1 n=$2 ids
  for r in $(seq 0 $((n - 1))); do
    grep -q "rank $r of $n .*: agreed$" "$tmp/$name.$r" || { bad "$name: rank $r: $(cat "$tmp/$name.$r")"; return; }
  done
  ids=$(cat "$tmp/$name".* | sed -n 's/.* id \([0-9a-f]*\) .*/\1/p' | sort -u | wc -l)
  [ "$ids" = 1 ] || { bad "$name: ranks saw $ids different ids"; return; }
  ok "$name: $n ranks agreed: $(head -n 1 "$tmp/$name.0")"
}

# ---- 1. torchrun-style -------------------------------------------------------------------
port=$(free_port)
for r in 3 1 0 2; do # rank 0 need not start first
  "${clean_env[@]}" RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 30 "$tool" 20 4 2 > "$tmp/torchrun.$r" 2>&1 &
done
wait
check_job torchrun 4

# ---- 2. Slurm-style ----------------------------------------------------------------------
# a job id whose default port 29500 + SLURM_JOB_ID % 1000 is free here
job=$(/usr/bin/python3 -c '
import random, socket
for j in random.sample(range(1000), 1000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 29500 + j)); print(4000 + j); break
    except OSError:
        pass
    finally:
        s.close()')
port=$((29500 + job % 1000))
for r in 0 1 2 3; do
  "${clean_env[@]}" SLURM_PROCID=$r SLURM_NTASKS=4 SLURM_LOCALID=$((r % 2)) SLURM_JOB_NODELIST='localhost,other[1-3]' \
    SLURM_JOB_ID=$job timeout 30 "$tool" 20 2 2 > "$tmp/slurm.$r" 2>&1 &
done
wait
if grep -q "rendezvous localhost:$port" "$tmp/slurm.0"; then check_job slurm 4
else bad "slurm: expected the rendezvous at localhost:$port: $(cat "$tmp/slurm.0")"; fi

# ---- 3. Slurm node lists -----------------------------------------------------------------
while read -r list want; do
  got=$("$tool" --first-host "$list")
  [ "$got" = "$want" ] && ok "first host of $list: $got" || bad "first host of $list: got $got, want $want"
done <<'LISTS'
gpu[003-010,012],cpu1 gpu003
node1,node2 node1
rack[1-2]-node[01-04] rack1-node01
n[7] n7
bad[ error
[1-2] error
LISTS

# ---- 4. errors, each within its timeout --------------------------------------------------
# expect NAME PATTERN MAX_S -- ENV... : exit non-zero, PATTERN in the message, in at most MAX_S seconds
expect() {
  local name=$1 pat=$2 max=$3; shift 4
  local t0=$(date +%s) out rc
  out=$("${clean_env[@]}" "$@" timeout 60 "$tool" 2 1 1 2>&1); rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then bad "$name: exit 0: $out"
  elif ! grep -qF -- "$pat" <<<"$out"; then bad "$name: message lacks '$pat': $out"
  elif [ $dt -gt "$max" ]; then bad "$name: took $dt s (at most $max)"
  else ok "$name (rc $rc, $dt s): $out"; fi
}
unused=$(free_port)
expect "no MASTER_ADDR" "without MASTER_ADDR" 5 -- RANK=1 WORLD_SIZE=2 MASTER_PORT=$unused
expect "no MASTER_PORT" "without MASTER_PORT" 5 -- RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
expect "nobody at the rendezvous" "cannot reach rank 0 at 127.0.0.1:$unused" 10 -- RANK=1 WORLD_SIZE=2 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$unused
expect "rank 0 alone" "only 1 of 3 ranks joined" 10 -- RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$unused
expect "rank outside the world" "rank 4 is outside a world of 4" 5 -- RANK=4 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$unused
expect "bad WORLD_SIZE" "WORLD_SIZE='two'" 5 -- RANK=0 WORLD_SIZE=two
expect "unknown MASTER_ADDR" "MASTER_ADDR no-such-host.invalid" 10 -- RANK=1 WORLD_SIZE=2 \
  MASTER_ADDR=no-such-host.invalid MASTER_PORT=$unused

# ---- 5. moecore train under these launchers, without a GPU -------------------------------
# CPU ranks need MPI: torchrun's or Slurm's variables alone are refused (not
# four copies of one run); a bad launcher variable is reported before anything.
run_train() { # NAME PATTERN -- ENV...
  local name=$1 pat=$2; shift 3
  local out rc
  out=$("${clean_env[@]}" "$@" timeout 60 build/moecore train configs/tiny.yaml --train.steps=1 \
        --logging.run_dir="$tmp/run-$name" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "train $name: exit $rc: $out"
  elif ! grep -qF -- "$pat" <<<"$out"; then bad "train $name: message lacks '$pat': $out"
  else ok "train $name (rc $rc): $(grep 'error' <<<"$out" | head -n 1)"; fi
}
run_train "torchrun, cpu" "CPU ranks (device.type: cpu) communicate over MPI" -- RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$unused
run_train "slurm, cpu" "started by srun as rank 0 of 2" -- SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 \
  SLURM_JOB_NODELIST=localhost SLURM_JOB_ID=77
run_train "torchrun, bad RANK" "RANK" -- RANK=x WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$unused
[ -d "$tmp/run-torchrun, cpu" ] && bad "train torchrun, cpu: the refused run made its run directory"

echo "$fails failures"
[ $fails -eq 0 ]
