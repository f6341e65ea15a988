#!/usr/bin/env bash
# A/B measurements for issue #6 on one GPU, in one device call. Each
# argument is a step:
#   gemm                 test_backend_ops --perf on the products: checks and timings under every
#                        kernel choice (device.cuda.* through CudaSettings, one line per choice)
#   attn                 test_backend_ops --perf on attention likewise
#   model                test_cuda_model
#   kernels              the kernel table (build/tests/gpu/bench_kernels)
#   bench:NAME:ENV=V,..:CONFIG[:--key=value...]   moecore bench of one config
# Logs go to $OUT (or build/gpu-logs); a summary is printed at the end.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the bundle's commit (make gpu-bundle writes it; the lent machine's .git may be stale)
export MOECORE_COMMIT=${MOECORE_COMMIT:-$(cat build/lib/COMMIT 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
echo "commit $MOECORE_COMMIT" | tee -a "$out/gpu.txt"
summary="$out/summary.txt"
: > "$summary"
envs() { echo "$1" | tr ',' ' '; }
n=0
for step in "$@"; do
  n=$((n + 1))
  t0=$(date +%s)
  case $step in
    gemm)
      log="$out/gemm$n.log"
      timeout 150 build/tests/gpu/test_backend_ops --perf -o matmul,router_logits,grouped > "$log" 2>&1
      rc=$?
      echo "== gemm exit $rc ($(( $(date +%s) - t0 )) s): $(grep -c '^FAIL' "$log") FAIL, $(tail -n 1 "$log")" >> "$summary"
      if [ $rc = 124 ]; then echo "   timed out (a hang?): stopping here" >> "$summary"; tail -n 5 "$log" >> "$summary"; break; fi
      grep -E "^FAIL" "$log" | head -n 5 >> "$summary"
      grep -E "^perf " "$log" >> "$summary" ;;
    attn)
      log="$out/attn$n.log"
      timeout 200 build/tests/gpu/test_backend_ops --perf -o attention > "$log" 2>&1
      echo "== attention exit $? ($(( $(date +%s) - t0 )) s): $(grep -c '^FAIL' "$log") FAIL, $(tail -n 1 "$log")" >> "$summary"
      grep -E "^FAIL" "$log" | head -n 5 >> "$summary"
      grep -E "^perf |T=4096.* vs \[" "$log" | head -n 30 >> "$summary" ;;
    model)
      log="$out/model.log"
      timeout 300 build/tests/gpu/test_cuda_model > "$log" 2>&1
      echo "== model exit $? ($(( $(date +%s) - t0 )) s): $(tail -n 1 "$log")" >> "$summary"
      grep -E "^FAIL|recompute|written" "$log" >> "$summary" ;;
    kernels)
      log="$out/kernels.log"
      timeout 400 build/tests/gpu/bench_kernels "$out/kernel_table.md" > "$log" 2>&1
      echo "== kernels exit $? ($(( $(date +%s) - t0 )) s)" >> "$summary"
      grep -E "FAIL" "$log" | head -n 10 >> "$summary"
      cat "$out/kernel_table.md" >> "$summary" 2>/dev/null ;;
    bench:*)
      IFS=: read -r _ name e cfg rest <<< "$step"
      log="$out/bench-$name.log"
      env $(envs "$e") timeout 400 build/moecore bench "$cfg" --steps=10 --warmup=3 $(echo "${rest:-}" | tr ':' ' ') \
        --record="$out/bench.jsonl" > "$log" 2>&1
      echo "== bench $name [$e] ${rest:-} exit $? ($(( $(date +%s) - t0 )) s): $(tail -n 1 "$log")" >> "$summary"
      grep -E "^ *(op|class|expert|dense|attention|optimizer|MoE|other|sum|remainder)|error" "$log" | head -n 40 >> "$summary" ;;
    *) echo "unknown step $step" >> "$summary" ;;
  esac
done
# few files come back from a lent machine: the logs travel as one archive
(cd "$out" && tar czf logs.tgz --remove-files *.log 2>/dev/null)
cat "$summary"
