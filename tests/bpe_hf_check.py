#!/usr/bin/env python3
"""The BPE path seen from transformers (tests/test_bpe.sh).

Given a moecore export that carries the run's tokenizer, the BPE corpus it
was trained on and moecore's eval CE of the exported step:

 1. AutoTokenizer loads the export; its vocabulary is the model's
    (unpadded) vocab_size and its eos_token_id is config.json's;
 2. it encodes the eval documents' text (from the byte corpus, each document
    followed by EOS) into exactly the ids of the BPE eval.bin that moecore
    read, and decodes them back to the text;
 3. AutoModelForCausalLM (FP32, eager attention) scores the instances
    moecore's eval scored (the first EVAL_BATCHES x MICRO_BATCH instances of
    SEQ_LEN tokens, targets shifted by one), and its mean CE, both as
    transformers' own `labels=` loss and as a float64 log-softmax of its
    logits, agrees with moecore's eval CE within --tol (relative).

    bpe_hf_check.py EXPORT_DIR CORPUS_DIR SEQ_LEN INSTANCES MOECORE_EVAL_CE [--tol 1e-5]
"""
import argparse
import json
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export")
    ap.add_argument("corpus", help="prepare-corpus.sh --bpe OUT_DIR (eval.bin, bytes/eval.bin)")
    ap.add_argument("seq_len", type=int)
    ap.add_argument("instances", type=int)
    ap.add_argument("moecore_ce", type=float)
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.logging.set_verbosity_error()  # not the warning that the eval text is longer than seq_len
    print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    cfg = json.load(open(os.path.join(a.export, "config.json")))
    vocab = cfg["moecore_model_config"]["vocab_size"]
    fails = []

    def check(ok, msg):
        print(("ok: " if ok else "FAIL: ") + msg)
        if not ok:
            fails.append(msg)

    # 1. the tokenizer
    tok = AutoTokenizer.from_pretrained(a.export)
    check(tok.is_fast and len(tok) == vocab,
          "AutoTokenizer loads %s (fast: %s), %d tokens, model vocab_size %d (config.json's padded %d)"
          % (type(tok).__name__, tok.is_fast, len(tok), vocab, cfg["vocab_size"]))
    check(tok.eos_token_id is not None and tok.eos_token_id == cfg["eos_token_id"],
          "eos_token %r = id %s, config.json eos_token_id %s" % (tok.eos_token, tok.eos_token_id, cfg["eos_token_id"]))

    # 2. the eval text -> moecore's eval ids
    raw = np.fromfile(os.path.join(a.corpus, "bytes", "eval.bin"), dtype="<u2")
    ends = np.flatnonzero(raw == 256)
    docs, start = [], 0
    for e in ends:
        docs.append(raw[start:e].astype(np.uint8).tobytes().decode("utf-8"))
        start = e + 1
    ids = []
    for d in docs:
        ids += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ours = np.fromfile(os.path.join(a.corpus, "eval.bin"), dtype="<u2").astype(np.int64)
    same = len(ids) == ours.size and np.array_equal(np.asarray(ids), ours)
    check(same, "AutoTokenizer encodes the %d eval documents (%d bytes of text) into the %d ids of eval.bin%s"
          % (len(docs), int(raw.size - ends.size), ours.size,
             "" if same else " (got %d ids; first difference at %d)" % (
                 len(ids), next((i for i, (x, y) in enumerate(zip(ids, ours)) if x != y), min(len(ids), ours.size)))))
    back = tok.decode(ours[:20000].tolist(), skip_special_tokens=False)
    want = (tok.eos_token.join(docs) + tok.eos_token)[:len(back)]
    check(back == want, "decoding the first 20000 ids gives the eval text back (%d characters)" % len(back))

    # 3. the loss moecore's eval computed, by transformers
    T, n = a.seq_len, a.instances
    if ours.size < n * T:
        sys.exit("eval.bin holds %d tokens, fewer than %d instances of %d" % (ours.size, n, T))
    x = torch.from_numpy(ours[:n * T].reshape(n, T))
    model = AutoModelForCausalLM.from_pretrained(a.export, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(x, labels=x)
        logp = torch.log_softmax(out.logits.double(), dim=-1)
        nll = -logp[:, :-1].gather(-1, x[:, 1:, None]).squeeze(-1)
    hf_loss, hf_ce = float(out.loss), float(nll.mean())
    for name, v in (("labels= loss", hf_loss), ("float64 CE of its logits", hf_ce)):
        rel = abs(v - a.moecore_ce) / abs(a.moecore_ce)
        check(rel <= a.tol, "%s: transformers %s %.7f vs moecore eval ce %.7f on %d x %d tokens: relative "
              "difference %.2e (tolerance %g)" % (type(model).__name__, name, v, a.moecore_ce, n, T, rel, a.tol))
    print("bpe_hf_check: %s" % ("all checks passed" if not fails else "%d check(s) failed" % len(fails)))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
