#!/usr/bin/env bash
# Copies the shared libraries the given programs need, except the C runtime
# and the GPU driver's, into DIR, so that the programs run on a machine that
# lacks this one's packages (LD_LIBRARY_PATH=DIR).
set -euo pipefail
dir=$1; shift
mkdir -p "$dir"
for bin in "$@"; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcuda.so*|libstdc++.so*|libgcc_s.so*|libcublas*) continue ;;
  esac
  cp -L "$lib" "$dir/"
done
echo "bundle: $(ls "$dir" | wc -l) libraries, $(du -sh "$dir" | cut -f1) in $dir"
