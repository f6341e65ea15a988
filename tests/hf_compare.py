#!/usr/bin/env python3
"""moecore's forward vs Hugging Face transformers on exported models.

Export: for each case (olmoe and flex_olmo, with GQA, top-k renormalisation
on and off, a head_dim that is not d_model / n_heads for flex_olmo) a random
model is written by build/tests/tool_hf_logits, exported with `moecore
export-hf` (FP32), and its logits on random tokens computed by moecore. Then
each export is loaded with transformers.AutoModelForCausalLM.from_pretrained(
dir, torch_dtype=torch.float32) and run on the same tokens; the max abs logit
error must be <= 1e-4.

Import: random transformers models (a vocabulary that is not a multiple of
128, tied embeddings, flex_olmo) are saved with save_pretrained in 100 KB
shards, read with `moecore import-hf`, and moecore's logits over the HF
vocabulary compared the same way (the padding rows must give logit 0).

    python3 tests/hf_compare.py [all]        both directions in a temp dir
    python3 tests/hf_compare.py prepare DIR  export direction, moecore side only (no torch)
    python3 tests/hf_compare.py check DIR    export direction, transformers side only
                                             (e.g. on a machine without the C toolchain)
Options: --strict (a case that this transformers cannot load fails instead
of being skipped), --json FILE (results as JSON), --moecore BIN, --tool BIN.
Exit status 0 when every checked case is within tolerance.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-4
B, T = 2, 24
CASES = [
    # name, format, model keys
    ("olmoe", "olmoe", dict(norm="pre", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8, top_k=2,
                            expert_hidden=48, vocab_size=300, renorm_topk="false", init_std=0.05)),
    ("olmoe_renorm", "olmoe", dict(norm="pre", d_model=64, n_layers=3, n_heads=8, n_experts=4, top_k=3,
                                   expert_hidden=32, vocab_size=257, renorm_topk="true", rope_theta=500000,
                                   norm_eps=1e-6, init_std=0.05)),
    ("flex_olmo", "flex_olmo", dict(norm="post", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, n_experts=8,
                                    top_k=2, expert_hidden=48, vocab_size=300, renorm_topk="false", init_std=0.05)),
    ("flex_olmo_headdim", "flex_olmo", dict(norm="post", d_model=64, n_layers=2, n_heads=4, n_kv_heads=1,
                                            head_dim=24, n_experts=4, top_k=2, expert_hidden=32, vocab_size=256,
                                            renorm_topk="true", init_std=0.05)),
]


IMPORT_CASES = [
    # name, model_type, config fields
    ("import_olmoe", "olmoe", dict(vocab_size=300, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                   num_experts_per_tok=2, norm_topk_prob=False)),
    ("import_olmoe_tied", "olmoe", dict(vocab_size=200, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=8, num_experts=4, num_experts_per_tok=2,
                                        norm_topk_prob=True, tie_word_embeddings=True, rope_theta=50000.0)),
    ("import_flex_olmo", "flex_olmo", dict(vocab_size=300, hidden_size=64, intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)),
]


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("command failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout))
    return r.stdout


def prepare(work, moecore, tool):
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(7)
    for i, (name, fmt, keys) in enumerate(CASES):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        args = ["--model.%s=%s" % kv for kv in keys.items()] + ["--model.seq_len=%d" % T]
        run([tool, "init", os.path.join(d, "ckpt")] + args + ["--seed=%d" % (i + 1)])
        ckpt = os.path.join(d, "ckpt", "step-00000000")
        tokens = rng.integers(0, keys["vocab_size"], size=(B, T), dtype=np.int32)
        tokens.tofile(os.path.join(d, "tokens.i32"))
        run([tool, "logits", ckpt, os.path.join(d, "tokens.i32"), str(B), str(T), os.path.join(d, "moecore.f32")])
        run([moecore, "export-hf", ckpt, os.path.join(d, "hf"), "--format=" + fmt, "--force"])
        json.dump({"format": fmt, "B": B, "T": T, "keys": keys}, open(os.path.join(d, "case.json"), "w"))
        print("prepared %s (%s)" % (name, fmt))


def check(work, strict, json_out, importing=None):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                "python": sys.version.split()[0]}
    print("transformers %(transformers)s, torch %(torch)s, python %(python)s" % versions)
    results, ok = [], True
    for name, _, _ in CASES:
        d = os.path.join(work, name)
        meta = json.load(open(os.path.join(d, "case.json")))
        b, t = meta["B"], meta["T"]
        tokens = np.fromfile(os.path.join(d, "tokens.i32"), dtype=np.int32).reshape(b, t)
        ref = np.fromfile(os.path.join(d, "moecore.f32"), dtype=np.float32)
        try:
            model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "hf"), torch_dtype=torch.float32,
                                                         attn_implementation="eager")
        except (ValueError, KeyError) as e:  # a model_type this transformers does not know
            msg = str(e).splitlines()[0][:200]
            print("SKIP  %-18s %s: %s" % (name, meta["format"], msg))
            results.append({"case": name, "format": meta["format"], "skipped": msg})
            ok = ok and not strict
            continue
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
        ref = ref.reshape(b, t, -1)
        if logits.shape != ref.shape:
            print("FAIL  %-18s logits shape %s, moecore %s" % (name, logits.shape, ref.shape))
            results.append({"case": name, "format": meta["format"], "error": "shape"})
            ok = False
            continue
        err = float(np.abs(logits - ref).max())
        ok = report(results, name, meta["format"], "moecore -> " + type(model).__name__, err,
                    float(np.abs(ref).max()), (b, t)) and ok
    if importing:
        ok = check_import(work, *importing, strict, results) and ok
    if json_out:
        json.dump({"versions": versions, "tolerance": TOL, "results": results}, open(json_out, "w"), indent=1)
    print("all cases within %g" % TOL if ok else "FAILED")
    return ok


def report(results, name, fmt, cls, err, scale, shape):
    good = err <= TOL
    print("%s  %-18s %-9s max abs error %.3g (max |logit| %.3g, %s, tolerance %g)" %
          ("ok  " if good else "FAIL", name, fmt, err, scale, cls, TOL))
    results.append({"case": name, "format": fmt, "class": cls, "max_abs_error": err, "max_abs_logit": scale,
                    "tokens": list(shape), "pass": good})
    return good


def check_import(work, moecore, tool, strict, results):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    ok = True
    rng = np.random.default_rng(11)
    for i, (name, mt, fields) in enumerate(IMPORT_CASES):
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        try:
            cfg = AutoConfig.for_model(mt, pad_token_id=None, bos_token_id=None, eos_token_id=None, **fields)
        except (ValueError, KeyError) as e:
            msg = str(e).splitlines()[0][:200]
            print("SKIP  %-18s %s: %s" % (name, mt, msg))
            results.append({"case": name, "format": mt, "skipped": msg})
            ok = ok and not strict
            continue
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.uniform_(0.5, 1.5)
                else:
                    p.normal_(0.0, 0.05)
        model.save_pretrained(os.path.join(d, "hf"), max_shard_size="100KB")
        run([moecore, "import-hf", os.path.join(d, "hf"), os.path.join(d, "ckpt", "step-00000000"), "--force"])
        V = fields["vocab_size"]
        tokens = rng.integers(0, V, size=(B, T), dtype=np.int32)
        tokens.tofile(os.path.join(d, "tokens.i32"))
        run([tool, "logits", os.path.join(d, "ckpt", "step-00000000"), os.path.join(d, "tokens.i32"), str(B), str(T),
             os.path.join(d, "moecore.f32")])
        ours = np.fromfile(os.path.join(d, "moecore.f32"), dtype=np.float32).reshape(B, T, -1)
        with torch.no_grad():
            theirs = model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()
        pad = float(np.abs(ours[..., V:]).max()) if ours.shape[-1] > V else 0.0
        err = max(float(np.abs(ours[..., :V] - theirs).max()), pad)
        ok = report(results, name, mt, type(model).__name__ + " -> moecore", err, float(np.abs(theirs).max()),
                    (B, T)) and ok
    return ok


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="all", choices=["all", "prepare", "check"])
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--moecore", default=os.path.join(root, "build", "moecore"))
    ap.add_argument("--tool", default=os.path.join(root, "build", "tests", "tool_hf_logits"))
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.mode != "all" and not a.dir:
        ap.error("%s needs DIR" % a.mode)
    if a.mode == "all":
        with tempfile.TemporaryDirectory() as work:
            prepare(work, a.moecore, a.tool)
            sys.exit(0 if check(work, a.strict, a.json, (a.moecore, a.tool)) else 1)
    if a.mode == "prepare":
        prepare(a.dir, a.moecore, a.tool)
    else:
        sys.exit(0 if check(a.dir, a.strict, a.json) else 1)


if __name__ == "__main__":
    main()
