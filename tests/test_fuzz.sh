#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted bytes, with libFuzzer under ASan
# and UBSan, for a short while each:
#   fuzz_safetensors  a whole file -> st_parse_header and st_open (memfd)
#   fuzz_config       YAML -> run_config_load_yaml_string + validate, and the
#                     same bytes -> model_config_from_json
# Fails if either finds a crash, leak, timeout or undefined behaviour (the
# reproducer is left in build/fuzz/artifacts-NAME/ and printed in hex). Seeds:
# tests/fuzz/corpus/{safetensors,config} and configs/*.yaml; what the fuzzer
# adds goes to build/fuzz/corpus-*, so later runs start from there.
#   FUZZ_TIME=seconds per target (default 20)
set -u
cd "$(dirname "$0")/.."
time_s=${FUZZ_TIME:-20}
work=build/fuzz
mkdir -p "$work"

command -v clang >/dev/null ||
  { echo "FAIL: clang not found; install the Debian packages clang and libclang-rt-14-dev (scripts/install-deps.sh)"; exit 1; }
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' > "$work/probe.c"
if ! clang -fsanitize=fuzzer,address,undefined "$work/probe.c" -o "$work/probe" 2>"$work/probe.log"; then
  cat "$work/probe.log"
  echo "FAIL: clang cannot link a libFuzzer program; install the Debian package libclang-rt-14-dev" \
       "(the compiler-rt fuzzer and sanitizer runtimes; scripts/install-deps.sh installs it)"
  exit 1
fi
for p in yaml-0.1 json-c; do
  pkg-config --exists $p || { echo "FAIL: pkg-config does not know $p (scripts/install-deps.sh)"; exit 1; }
done

# Sources compiled with the sanitizers (not libmoecore.a, built by gcc without them).
CFLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 -D_GNU_SOURCE -Isrc
        $(pkg-config --cflags yaml-0.1 json-c)"
build() { # name, sources..., -- libs...
  local name=$1; shift
  echo "building $work/$name"
  clang $CFLAGS "$@" -o "$work/$name" || { echo "FAIL: cannot build $name"; exit 1; }
}
build fuzz_safetensors tests/fuzz/fuzz_safetensors.c src/ckpt/safetensors.c $(pkg-config --libs json-c)
build fuzz_config tests/fuzz/fuzz_config.c src/config/config.c src/config/model_config.c \
      src/util/text.c $(pkg-config --libs yaml-0.1 json-c) -lm

fails=0
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1
fuzz() { # name, seed dirs...
  local name=$1; shift
  local corpus=$work/corpus-${name#fuzz_} log=$work/$name.log art=$work/artifacts-$name
  mkdir -p "$corpus"
  rm -rf "$art"; mkdir -p "$art"
  echo "fuzzing $name for ${time_s}s"
  "$work/$name" -max_total_time="$time_s" -rss_limit_mb=2048 -timeout=10 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$art/" "$corpus" "$@" >"$log" 2>&1
  local rc=$?
  local execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  local cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
  echo "$name: ${execs:-?} executions in ${time_s}s, $cov, corpus $(ls "$corpus" | wc -l) files, exit $rc"
  local crash=$(ls "$art/"* 2>/dev/null | head -1)
  if [ $rc -ne 0 ] || [ -n "$crash" ]; then
    fails=$((fails+1))
    echo "FAIL: $name found a problem (log: $log)"
    grep -E -A25 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" | head -60
    if [ -n "$crash" ]; then
      echo "reproducer $crash ($(stat -c %s "$crash") bytes), hex:"
      xxd -p "$crash" | head -40
      echo "rerun: $work/$name $crash"
    fi
  fi
}
fuzz fuzz_safetensors tests/fuzz/corpus/safetensors
fuzz fuzz_config tests/fuzz/corpus/config configs

echo "$fails failures"
[ $fails -eq 0 ]
