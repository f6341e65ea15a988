#!/usr/bin/env bash
# Prepares the small real-text corpus that `make run` trains on, offline,
# from text that Debian's own packages ship, and tokenizes it with
# `moecore tokenize` into OUT_DIR/train.bin and OUT_DIR/eval.bin.
#
#   usage: scripts/prepare-corpus.sh [--bpe N] OUT_DIR   (MOECORE=path overrides build/moecore)
#
# --bpe N: a subword corpus instead. The byte-level corpus is built in
# OUT_DIR/bytes/, then scripts/bpe_corpus.py (Python with the `tokenizers`
# package: PYTHON=path picks the interpreter, default build/pyenv/bin/python3
# when scripts/install-py-deps.sh made it, else python3) trains a byte-level
# BPE of N tokens (258..65536) on its train documents and writes
# OUT_DIR/tokenizer.json, the Olmo-style uint16 token files OUT_DIR/train.bin
# and eval.bin (same documents and split, each ending with EOS = id 0) and
# OUT_DIR/train-args.txt, the overrides that train on them:
#   build/moecore train configs/tiny.yaml $(cat OUT_DIR/train-args.txt)
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
usage() { echo "usage: $0 [--bpe N] OUT_DIR   (N: BPE vocabulary, 258..65536 tokens)" >&2; exit 2; }
bpe=""
case "${1:-}" in
  --bpe) [ $# -ge 2 ] || usage; bpe=$2; shift 2 ;;
  --bpe=*) bpe=${1#--bpe=}; shift ;;
esac
[ $# -eq 1 ] || usage
out=$1
start=$PWD
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "$bpe" ]; then
  [[ "$bpe" =~ ^[0-9]+$ ]] || die "--bpe '$bpe': expected a number of tokens (e.g. 16384)"
  { [ ${#bpe} -le 6 ] && [ "$bpe" -ge 258 ] && [ "$bpe" -le 65536 ]; } \
    || die "--bpe $bpe: the vocabulary must be 258..65536 tokens (256 bytes + EOS + at least one merge; ids must fit uint16 token files)"
  py=${PYTHON:-}
  if [ -z "$py" ]; then
    py=python3
    [ -x "$root/build/pyenv/bin/python3" ] && py=$root/build/pyenv/bin/python3
  fi
  command -v "$py" >/dev/null || die "no Python interpreter '$py' (set PYTHON=path)"
  "$py" -c 'import numpy, tokenizers' 2>/dev/null \
    || die "--bpe needs the Python packages numpy and tokenizers, which $py lacks: $py -m pip install tokenizers numpy, or bash scripts/install-py-deps.sh (a venv in build/pyenv), or PYTHON=a python3 that has them"
fi
moecore=${MOECORE:-$root/build/moecore}
[ -x "$moecore" ] || die "$moecore not found; build it first (make)"
moecore=$(cd "$(dirname "$moecore")" && pwd)/$(basename "$moecore")
final=$out
[ -n "$bpe" ] && out=$out/bytes

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
[ -n "$bpe" ] || exit 0

# ---- --bpe N: the subword corpus from the byte corpus's documents ----
cd "$start"
echo "prepare-corpus: byte-level BPE of $bpe tokens with $py"
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
  "$py" "$root/scripts/bpe_corpus.py" --vocab "$bpe" --bytes "$out" --out "$final" || die "scripts/bpe_corpus.py failed"
cd "$final"
{
  echo "# moecore BPE corpus, written by scripts/prepare-corpus.sh --bpe $bpe"
  echo "# documents and split: bytes/manifest.txt; tokenizer trained on bytes/train.bin's documents"
  echo "tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)')"
  echo "python $("$py" -c 'import sys; print(sys.version.split()[0])')"
  sha256sum tokenizer.json train.bin eval.bin | sed 's/^/output /'
} > manifest.txt.tmp
mv manifest.txt.tmp manifest.txt
echo "prepare-corpus: SHA-256 of the BPE outputs in $final:"
sha256sum tokenizer.json train.bin eval.bin
echo "prepare-corpus: train on them with: build/moecore train configs/tiny.yaml \$(cat $final/train-args.txt)"
