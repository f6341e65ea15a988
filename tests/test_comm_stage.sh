#!/usr/bin/env bash
# comm.h's staging of device buffers through the host (comm_stage_device:
# GPU ranks over MPI, MOECORE_COMM=mpi, the one-GPU check of the multi-rank
# runtimes) on CPU ranks: tests/tool_comm_stage.c under mpirun with 3 ranks
# runs every comm.h call on "device" memory that the process cannot touch
# outside the copy hooks (mprotect), with uneven counts, against values it
# computes itself; then the same without the hooks must die at the first
# collective, which shows that the trap catches an MPI call handed device
# memory. Then MOECORE_COMM_CHECK (comm_mpi.c): the non-blocking calls work on
# copies taken at the call, their receive buffers hold 0xFF until completion,
# and a buffer written before the wait ends the job naming it (five cases).
set -u
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 1; }
tool=build/tests/tool_comm_stage
fails=0
out=$(timeout 120 mpirun --oversubscribe -np 3 $tool 2>&1); rc=$?
echo "$out" | grep -E "^(ok|FAIL)" | sort | uniq -c | sort -rn | head -40
nok=$(echo "$out" | grep -c "^ok:")
nfail=$(echo "$out" | grep -c "^FAIL")
# 14 checks on each rank, then the split: 2 on the last rank (alone), 1 on the others
if [ $rc -eq 0 ] && [ "$nfail" -eq 0 ] && [ "$nok" -eq 46 ]; then echo "ok: staged comm, 3 ranks: $nok checks"
else echo "FAIL: staged comm, 3 ranks: exit $rc, $nok ok, $nfail FAIL"; echo "$out" | tail -n 20; fails=$((fails+1)); fi
out=$(timeout 120 mpirun --oversubscribe -np 2 $tool nostage 2>&1); rc=$?
if [ $rc -ne 0 ] && ! echo "$out" | grep -q "0 failed"; then echo "ok: without the hooks the first collective dies on device memory (exit $rc)"
else echo "FAIL: without the hooks the run did not die (exit $rc)"; echo "$out" | tail -n 10; fails=$((fails+1)); fi
# MOECORE_COMM_CHECK: the checked semantics on host and device buffers (12
# checks a rank), then a buffer written before its wait must end the job with
# the message naming the buffer and the call
out=$(timeout 120 mpirun --oversubscribe -np 3 $tool check 2>&1); rc=$?
nok=$(echo "$out" | grep -c "^ok:"); nfail=$(echo "$out" | grep -c "^FAIL")
if [ $rc -eq 0 ] && [ "$nfail" -eq 0 ] && [ "$nok" -eq 36 ]; then echo "ok: MOECORE_COMM_CHECK, 3 ranks: $nok checks"
else echo "FAIL: MOECORE_COMM_CHECK, 3 ranks: exit $rc, $nok ok, $nfail FAIL"; echo "$out" | tail -n 20; fails=$((fails+1)); fi
for w in "allreduce:in-place buffer of a non-blocking all-reduce" "rs-send:send buffer of a non-blocking reduce-scatter" \
         "rs-recv:receive buffer of a non-blocking reduce-scatter" "send:send buffer of a non-blocking send" \
         "recv:receive buffer of a non-blocking receive"; do
  out=$(timeout 120 mpirun --oversubscribe -np 2 $tool check "${w%%:*}" 2>&1); rc=$?
  if [ $rc -ne 0 ] && echo "$out" | grep -q "MOECORE_COMM_CHECK: the ${w#*:} (.*) was written between the call"; then
    echo "ok: MOECORE_COMM_CHECK catches a write into the ${w#*:} (exit $rc)"
  else echo "FAIL: MOECORE_COMM_CHECK missed a write into the ${w#*:} (exit $rc)"; echo "$out" | tail -n 5; fails=$((fails+1)); fi
done
echo "$fails failed"
[ $fails -eq 0 ]
