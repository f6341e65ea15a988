#!/usr/bin/env bash
# s14 call: tests/gpu/ranks.sh (pp hand-offs at the receiver slot), then test_fp8 dgrad
set -u
T0=$SECONDS
tar xJf build/gpu-pack.tar.xz
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt; cat build/lib/COMMIT | tee -a $OUT/gpu.txt; date -u | tee -a $OUT/gpu.txt
echo "== ranks.sh"
KEEP=1 timeout 400 bash tests/gpu/ranks.sh > $OUT/ranks.log 2>&1; echo "exit $?"
grep -vE "^\s*$" $OUT/ranks.log | grep -vE "^\[|^---|help|orte" | tail -n 40
d=$(grep -o "work directory: .*" $OUT/ranks.log | cut -d' ' -f3); [ -n "$d" ] && tar czf $OUT/ranks-runs.tgz --exclude='*.safetensors' --exclude='*.bin' -C "$d" . 2>/dev/null
echo "== test_fp8 dgrad ($((SECONDS - T0)) s)"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)"
OMP_NUM_THREADS=16 OMP_WAIT_POLICY=PASSIVE timeout $(( 560 - (SECONDS - T0) )) build/tests/gpu/test_fp8 dgrad > $OUT/test_fp8_dgrad.log 2>&1
echo "exit $?: $(grep -c ^FAIL $OUT/test_fp8_dgrad.log) FAIL; $(tail -n1 $OUT/test_fp8_dgrad.log)"; grep ^FAIL $OUT/test_fp8_dgrad.log | head
echo "done at $((SECONDS - T0)) s"
