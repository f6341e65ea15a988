#!/usr/bin/env python3
"""Byte-level BPE for the embedded corpus (scripts/prepare-corpus.sh --bpe N).

Reads the byte-level token files that prepare-corpus.sh writes (ids 0..255
are bytes, 256 ends a document), so the documents and the train / eval split
are exactly the byte corpus's. Trains a byte-level BPE tokenizer of N tokens
on the train documents with the `tokenizers` library (GPT-2's byte-to-unicode
alphabet and pre-tokenizer regex, all 256 bytes in the initial alphabet, one
special token <|endoftext|> as id 0 = EOS), then writes into OUT_DIR:

  tokenizer.json    the tokenizer, as tokenizers saves it (AutoTokenizer reads it)
  train.bin         Olmo-style token file: headerless little-endian uint16,
  eval.bin          each document followed by EOS (id 0)
  train-args.txt    the moecore overrides that train on them, one per line

Every document is checked to decode back to its bytes. The outputs depend
only on the byte corpus, N and the tokenizers version (training runs
single-threaded, RAYON_NUM_THREADS=1, as a precaution: runs with and without
it gave byte-identical files).

    python3 scripts/bpe_corpus.py --vocab N --bytes BYTE_DIR --out OUT_DIR
"""
import argparse
import os
import sys
import time

EOS_TOKEN = "<|endoftext|>"
BYTE_EOS = 256
MIN_VOCAB = 258     # 256 byte tokens, EOS and at least one merge
MAX_VOCAB = 65536   # ids must fit uint16 token files
PIP = "pip install 'tokenizers>=0.19'"


def die(msg):
    sys.exit("bpe_corpus: error: " + msg)


def say(msg):
    print("bpe_corpus: " + msg, flush=True)


def read_documents(path, np):
    ids = np.fromfile(path, dtype="<u2")
    if ids.size == 0:
        die("%s is empty" % path)
    if int(ids.max()) > BYTE_EOS:
        die("%s holds id %d: not a byte-level token file (ids 0..256)" % (path, int(ids.max())))
    ends = np.flatnonzero(ids == BYTE_EOS)
    if ends.size == 0 or ends[-1] != ids.size - 1:
        die("%s does not end with EOS (256): not written by moecore tokenize" % path)
    raw = ids.astype(np.uint8).tobytes()
    docs, start = [], 0
    for n, e in enumerate(ends):
        try:
            docs.append(raw[start:e].decode("utf-8"))
        except UnicodeDecodeError as x:
            die("%s: document %d (bytes %d..%d) is not UTF-8 (%s); byte-level BPE here trains on text"
                % (path, n, start, e, x))
        start = e + 1
    return docs, len(raw) - len(ends)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, required=True, help="tokens in the vocabulary, EOS included")
    ap.add_argument("--bytes", required=True, help="directory with the byte-level train.bin and eval.bin")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args()
    if not MIN_VOCAB <= a.vocab <= MAX_VOCAB:
        die("--bpe %d: the vocabulary must be %d..%d tokens (256 bytes + EOS + at least one merge; "
            "ids must fit the uint16 token files)" % (a.vocab, MIN_VOCAB, MAX_VOCAB))
    try:
        import numpy as np
    except ImportError:
        die("this Python (%s) has no numpy: pip install numpy (or apt-get install python3-numpy)" % sys.executable)
    try:
        import tokenizers
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        die("this Python (%s) has no 'tokenizers' package: %s (or run with PYTHON=a python3 that has it; "
            "bash scripts/install-py-deps.sh makes build/pyenv with it)" % (sys.executable, PIP))

    os.environ["RAYON_NUM_THREADS"] = "1"  # before the first parallel call: deterministic merges
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    t0 = time.time()
    train_docs, train_bytes = read_documents(os.path.join(a.bytes, "train.bin"), np)
    eval_docs, eval_bytes = read_documents(os.path.join(a.bytes, "eval.bin"), np)
    say("tokenizers %s; %d train documents (%d bytes), %d eval documents (%d bytes)"
        % (tokenizers.__version__, len(train_docs), train_bytes, len(eval_docs), eval_bytes))

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    say("training a byte-level BPE of %d tokens on the train documents ..." % a.vocab)
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    got = tok.get_vocab_size(with_added_tokens=True)
    if got != a.vocab:
        die("the corpus supports only %d tokens (no pair left that occurs twice); ask for --bpe %d or fewer"
            % (got, got))
    eos = tok.token_to_id(EOS_TOKEN)
    say("trained in %.1f s: %d tokens, EOS %s = id %d" % (time.time() - t0, got, EOS_TOKEN, eos))

    os.makedirs(a.out, exist_ok=True)
    written = []

    def commit(name, write):
        path = os.path.join(a.out, name)
        write(path + ".tmp")
        os.replace(path + ".tmp", path)
        written.append(name)

    for name, docs, nbytes in (("train.bin", train_docs, train_bytes), ("eval.bin", eval_docs, eval_bytes)):
        t1 = time.time()
        enc = tok.encode_batch(docs, add_special_tokens=False)
        ids = [e.ids for e in enc]
        back = tok.decode_batch(ids, skip_special_tokens=False)
        for n, (d, b) in enumerate(zip(docs, back)):
            if d != b:
                die("%s: document %d does not decode back to its text" % (name, n))
        flat = np.fromiter((t for doc in ids for t in doc + [eos]), dtype=np.int64,
                           count=sum(len(x) + 1 for x in ids))
        assert flat.max() < a.vocab
        arr = flat.astype("<u2")
        commit(name, arr.tofile)
        say("%s: %d documents, %d tokens (%d text + %d EOS), %.2f bytes of text per token, %d bytes on disk, "
            "%.1f s" % (name, len(docs), arr.size, arr.size - len(docs), len(docs), nbytes / (arr.size - len(docs)),
                        arr.size * 2, time.time() - t1))
    commit("tokenizer.json", lambda p: tok.save(p, pretty=True))

    prefix = a.out  # as given: relative paths work from where the script was run, as moecore is
    args = ["--model.vocab_size=%d" % a.vocab, "--data.dtype=uint16", "--data.eos_id=%d" % eos,
            "--data.train=%s" % os.path.join(prefix, "train.bin"), "--data.eval=%s" % os.path.join(prefix, "eval.bin"),
            "--data.tokenizer=%s" % os.path.join(prefix, "tokenizer.json")]

    def write_args(p):
        with open(p, "w") as f:
            f.write("\n".join(args) + "\n")
    commit("train-args.txt", write_args)
    say("wrote %s in %s (%.1f s in all)" % (", ".join(written), a.out, time.time() - t0))


if __name__ == "__main__":
    main()
