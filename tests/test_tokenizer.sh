#!/usr/bin/env bash
# `moecore tokenize` and `moecore detokenize` on small files of known
# contents: the exact uint16 little-endian ids written, EOS after each
# document, the separator and the eval split, byte-exact round trips, and
# errors that name the path and leave existing outputs untouched, and
# outputs that are inputs refused.
# MOECORE=path tests another binary than build/moecore.
set -u
cd "$(dirname "$0")/.."
bin=${MOECORE:-build/moecore}
case $bin in /*) ;; *) bin=$PWD/$bin ;; esac
if ! "$bin" tokenize --help >/dev/null 2>&1 || ! "$bin" detokenize --help >/dev/null 2>&1; then
  echo "FAIL: '$bin tokenize --help' or '$bin detokenize --help' fails: the commands are not"
  echo "      wired into src/main.c (cmd_tokenize, cmd_detokenize from src/data/tokenizer.h)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fails=0
ok()   { echo "ok: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails+1)); }
# The ids of a token file, and the bytes of a file, as one line of numbers.
ids()   { od -An -v -tu2 --endian=little "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
bytes() { od -An -v -tu1 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
expect_ids() { # what, file, expected ids
  local got; got=$(ids "$2")
  if [ "$got" = "$3" ]; then ok "$1"; else fail "$1: got [$got], expected [$3]"; fi
}

printf 'Hello\n%%\nworld\n' > a.txt
printf '\000\377\303\251 caf\303\251\n%%x' > b.txt   # NUL, 0xFF, UTF-8; '%x' is not a separator; no final newline
: > c.txt                                           # empty: no document
printf '%%\n%%\nx\n%%' > d.txt                      # empty documents dropped; separator without newline
for i in $(seq 0 255); do printf "\\$(printf %03o "$i")"; done > all.bin.txt

# Each file one document; ids are the bytes, then EOS.
"$bin" tokenize --out one.bin a.txt > one.log 2>&1 || fail "tokenize a.txt: $(cat one.log)"
expect_ids "one file, one document" one.bin "$(bytes a.txt) 256"
"$bin" tokenize --out two.bin a.txt b.txt >/dev/null 2>&1
expect_ids "two files, EOS after each" two.bin "$(bytes a.txt) 256 $(bytes b.txt) 256"

# --separator and the eval split: documents Hello(1) world(2) b(3) x(4); c.txt
# and the empty ones of d.txt take no number; even numbers go to eval.
"$bin" tokenize --separator % --out train.bin --eval-out eval.bin --eval-every 2 \
  a.txt b.txt c.txt d.txt > split.log 2>&1 || fail "tokenize with split: $(cat split.log)"
expect_ids "separator, train part" train.bin "72 101 108 108 111 10 256 $(bytes b.txt) 256"
expect_ids "separator, eval part" eval.bin "119 111 114 108 100 10 256 120 10 256"
if grep -q "4 documents" split.log && grep -q "train.bin: 2 documents" split.log \
   && grep -q "eval.bin: 2 documents" split.log; then ok "summary counts documents"
else fail "summary: $(cat split.log)"; fi
printf 'p1\n\np2\n' > blank.txt
"$bin" tokenize --separator '' --out blank.bin blank.txt >/dev/null 2>&1
expect_ids "empty separator splits on blank lines" blank.bin "112 49 10 256 112 50 10 256"

# Round trips through detokenize, byte for byte.
"$bin" tokenize --out all.bin all.bin.txt >/dev/null 2>&1
"$bin" detokenize all.bin --count 256 > all.out
if cmp -s all.out all.bin.txt; then ok "all 256 bytes round-trip"; else fail "all 256 bytes do not round-trip"; fi
{ cat a.txt; printf '\n<|eos|>\n'; cat b.txt; printf '\n<|eos|>\n'; } > two.expected
"$bin" detokenize two.bin > two.out
if cmp -s two.out two.expected; then ok "detokenize shows EOS"; else fail "detokenize two.bin: $(od -c two.out | head)"; fi
out=$("$bin" detokenize one.bin --offset 1 --count 3)
if [ "$out" = "ell" ]; then ok "--offset --count"; else fail "--offset 1 --count 3 gave '$out'"; fi
printf '\054\001\101\000' > bad-ids.bin   # ids 300 and 65
out=$("$bin" detokenize bad-ids.bin 2>/dev/null)
if [ "$out" = "?A" ]; then ok "ids out of range show as '?'"; else fail "bad ids gave '$out'"; fi

# Errors: non-zero exit, a message naming the path, existing outputs kept.
echo old-train > keep.bin; echo old-eval > keep-eval.bin
msg=$("$bin" tokenize --out keep.bin --eval-out keep-eval.bin a.txt no-such-file.txt 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "no-such-file.txt" <<<"$msg"; then ok "missing input: rc $rc: $msg"
else fail "missing input: rc $rc, message: $msg"; fi
if [ "$(cat keep.bin)" = old-train ] && [ "$(cat keep-eval.bin)" = old-eval ]; then ok "outputs kept on failure"
else fail "an existing output was clobbered"; fi
if ls ./*.tmp >/dev/null 2>&1; then fail "temporary files left: $(ls ./*.tmp)"; else ok "no temporary file left"; fi
msg=$("$bin" tokenize --out no-such-dir/x.bin a.txt 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "no-such-dir/x.bin" <<<"$msg"; then ok "unwritable output: rc $rc: $msg"
else fail "unwritable output: rc $rc, message: $msg"; fi
msg=$("$bin" tokenize --out x.bin . 2>&1); rc=$?
if [ $rc -ne 0 ] && [ ! -e x.bin ]; then ok "directory as input: rc $rc: $msg"; else fail "directory as input accepted"; fi
# An output that is also an input is refused (rc 2), the input left as it was:
# the same path, another name of it (./, a symlink to it), --eval-out, and an
# input named like the output's temporary PATH.tmp. An output that is itself a
# symlink to an input only has its link replaced: allowed.
cp a.txt in.txt; ln -sf in.txt in-link.txt; cp a.txt out.tmp
for args in "--out in.txt in.txt" "--out ./in.txt b.txt in.txt" "--out in.txt in-link.txt" \
            "--out x.bin --eval-out in.txt in.txt" "--out out out.tmp"; do
  # shellcheck disable=SC2086
  msg=$("$bin" tokenize $args 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q "would overwrite its own input" <<<"$msg" && cmp -s in.txt a.txt && cmp -s out.tmp a.txt
  then ok "output is an input: tokenize $args: $msg"
  else fail "output is an input: tokenize $args: rc $rc, $msg; in.txt now $(od -c in.txt | head -1)"; fi
done
ln -sf a.txt link-out.bin
if "$bin" tokenize --out link-out.bin a.txt >/dev/null 2>&1 && [ ! -L link-out.bin ] && cmp -s a.txt in.txt
then ok "an output that is a symlink to an input replaces the link"; else fail "symlink output"; fi

printf 'abc' > odd.bin
msg=$("$bin" detokenize odd.bin 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "odd.bin" <<<"$msg"; then ok "odd-sized token file: rc $rc: $msg"
else fail "odd-sized token file: rc $rc, message: $msg"; fi
msg=$("$bin" detokenize one.bin --offset 99 2>&1); rc=$?
if [ $rc -ne 0 ]; then ok "offset past the end: rc $rc: $msg"; else fail "offset past the end accepted"; fi
for args in "--out x.bin" "a.txt" "--out x.bin --eval-every 5 a.txt" \
            "--out x.bin --eval-out y.bin --eval-every 1 a.txt" "--out x.bin --eval-out x.bin a.txt" \
            "--bogus --out x.bin a.txt" "--out"; do
  # shellcheck disable=SC2086
  msg=$("$bin" tokenize $args 2>&1); rc=$?
  if [ $rc -eq 2 ]; then ok "usage error: tokenize $args: $msg"; else fail "tokenize $args: rc $rc"; fi
done

echo "$fails failures"
[ $fails -eq 0 ]
