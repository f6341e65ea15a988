#!/usr/bin/env bash
# Prepares the small real-text corpus that `make run` trains on, offline,
# from text that Debian's own packages ship, and tokenizes it with
# `moecore tokenize` into OUT_DIR/train.bin and OUT_DIR/eval.bin.
#
#   usage: scripts/prepare-corpus.sh OUT_DIR      (MOECORE=path overrides build/moecore)
#
# Sources, about 2.8 MB of English text in some 15,000 documents:
#   - /usr/share/common-licenses (base-files, on every Debian system): the
#     license texts, one document per file;
#   - /usr/share/games/fortunes (fortunes, fortunes-min): quotations, jokes,
#     poems and definitions, one document per '%'-separated entry; all files
#     but ascii-art, which is drawings, not text.
# Every 20th document (5%) is held out in eval.bin.
#
# Reproducible: the input list below is fixed and in order, the bytes are
# taken as they are (no locale, no normalisation), so the same package
# versions give byte-identical outputs. OUT_DIR/manifest.txt records the
# package versions and the SHA-256 of every input and output.
set -euo pipefail
export LC_ALL=C

die() { echo "prepare-corpus: error: $*" >&2; exit 1; }
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
moecore=${MOECORE:-$root/build/moecore}
[ -x "$moecore" ] || die "$moecore not found; build it first (make)"
moecore=$(cd "$(dirname "$moecore")" && pwd)/$(basename "$moecore")

licenses=(Apache-2.0 Artistic BSD CC0-1.0 GFDL-1.2 GFDL-1.3 GPL-1 GPL-2 GPL-3
          LGPL-2 LGPL-2.1 LGPL-3 MPL-1.1 MPL-2.0)
fortunes=(art computers cookie debian definitions disclaimer drugs education ethnic food
          fortunes goedel humorists kids knghtbrd law linux linuxcookie literature love
          magic medicine men-women miscellaneous news paradoxum people perl pets
          platitudes politics pratchett riddles science songs-poems sports startrek tao
          translate-me wisdom work zippy)
packages=(base-files fortunes fortunes-min)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# fortunes (which pulls in fortunes-min) is data only; install it if missing,
# from Debian's repositories, as scripts/install-deps.sh does.
if ! installed fortunes; then
  command -v apt-get >/dev/null || die "needs the Debian package 'fortunes' and there is no apt-get"
  echo "prepare-corpus: installing the Debian package fortunes"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends fortunes >/dev/null
fi

inputs=()
for f in "${licenses[@]}"; do inputs+=("/usr/share/common-licenses/$f"); done
for f in "${fortunes[@]}"; do inputs+=("/usr/share/games/fortunes/$f"); done
for f in "${inputs[@]}"; do
  [ -f "$f" ] && [ -r "$f" ] || die "missing input $f (Debian packages base-files, fortunes)"
done

mkdir -p "$out"
cd "$out"  # relative output names keep the summary and manifest free of OUT_DIR
summary=$("$moecore" tokenize --separator % --out train.bin --eval-out eval.bin --eval-every 20 \
          "${inputs[@]}") || die "moecore tokenize failed"
echo "$summary"

{
  echo "# moecore corpus, written by scripts/prepare-corpus.sh"
  echo "# tokenize --separator % --eval-every 20, inputs in this order"
  for p in "${packages[@]}"; do echo "package $p $(dpkg-query -W -f='${Version}' "$p")"; done
  for f in "${inputs[@]}"; do echo "input $(sha256sum < "$f" | cut -d' ' -f1) $f"; done
  echo "$summary" | sed 's/^/# /'
  sha256sum train.bin eval.bin | sed 's/^/output /'
} > manifest.txt.tmp
mv manifest.txt.tmp manifest.txt

echo "prepare-corpus: SHA-256 of the outputs in $out:"
sha256sum train.bin eval.bin
