#!/usr/bin/env bash
# Makes build/pyenv: a venv over Debian's /usr/bin/python3 that sees its
# system packages (python3-torch, numpy) and adds, from PyPI, the two that
# Debian lacks: tokenizers (scripts/prepare-corpus.sh --bpe) and transformers
# (tests/test_bpe.sh loads the export with AutoTokenizer and
# AutoModelForCausalLM). Pinned to versions that work with Debian 12's torch
# 1.13: transformers 4.45.2 and the tokenizers it takes. Does nothing when
# build/pyenv already has them; otherwise, on the 2-core development machine,
# 56 s without a pip cache (10 s with one) for 160 MB in build/pyenv.
#
#   usage: scripts/install-py-deps.sh        (PYENV=dir overrides build/pyenv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
env=${PYENV:-$root/build/pyenv}
want=("tokenizers==0.20.3" "transformers==4.45.2")
check='import tokenizers, transformers, torch, numpy
assert tokenizers.__version__ == "0.20.3" and transformers.__version__ == "4.45.2"'
if [ -x "$env/bin/python3" ] && "$env/bin/python3" -c "$check" 2>/dev/null; then exit 0; fi
[ -x /usr/bin/python3 ] || { echo "install-py-deps: error: no /usr/bin/python3 (scripts/install-deps.sh installs it)" >&2; exit 1; }
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null \
  || { echo "install-py-deps: error: /usr/bin/python3 has no venv module: apt-get install python3-venv (scripts/install-deps.sh does)" >&2; exit 1; }
echo "install-py-deps: making $env with ${want[*]} (pip, from PyPI)"
rm -rf "$env"
/usr/bin/python3 -m venv --system-site-packages "$env"
"$env/bin/python3" -m pip install -q --disable-pip-version-check --no-input "${want[@]}"
"$env/bin/python3" -c "$check" \
  || { echo "install-py-deps: error: $env still lacks one of tokenizers, transformers, torch, numpy" >&2; exit 1; }
echo "install-py-deps: done"
