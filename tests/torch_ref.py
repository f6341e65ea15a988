#!/usr/bin/env python3
"""Independent PyTorch reference for the moecore model (docs/model.md).

Reads a dump written by build/tests/tool_model_dump (config, initial weights,
a batch and the C outputs), rebuilds the model in float64 from the config,
recomputes logits, losses, gradients and a few AdamW steps, and compares.

Usage: /usr/bin/python3 tests/torch_ref.py [-v] DUMP.safetensors [DUMP2 ...]
  -v  print the error of every gradient / final parameter, not only the worst
Exit status 0 only if every file passes every check.

Dump format (safetensors: u64 LE header length, JSON header, data):
  __metadata__ config   model config JSON (model_config_to_json)
  __metadata__ optim    {lr, beta1, beta2, eps, weight_decay, decay_norms,
                         decay_embeddings, steps}
  __metadata__ doc_mask {eos_id}, when the dump masks attention to documents
                         (each ends with an eos_id token; docs/model.md)
  tokens, targets       I32 [B, T]; target -1 = masked
  param.NAME            F32 initial parameters (names: docs/model.md)
  logits                F32 [B*T, padded_vocab], first forward
  loss_ce, loss_total   F32 [1];  lb, z: F32 [n_moe_layers] raw, if any MoE
  grad.NAME             F32 d loss_total / d param at the initial weights
  step_loss             F32 [steps] loss_total at the forward of each step
  final.NAME            F32 parameters after `steps` AdamW updates
Checks: logits (max abs), losses (rel), grads and final params (norm-wise
rel, per tensor), step losses (rel); tolerances below.
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DT = torch.float64

# Tolerances (fixed requirements, see the brief of this file).
TOL_LOGITS_ABS = 1e-5
TOL_LOSS_REL = 1e-6
TOL_GRAD_REL = 1e-4
TOL_GRAD_ZERO = 1e-12
TOL_STEP_LOSS_REL = 1e-5
TOL_FINAL_REL = 1e-4
# A k-th/(k+1)-th prob gap below this is within reach of FP32 rounding in the
# C router: a flipped expert choice there explains a mismatch.
NEAR_TIE_GAP = 1e-5


# ---------------------------------------------------------------- file I/O

_NP_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def load_safetensors(path):
    """Returns ({name: np.ndarray}, {metadata key: str})."""
    with open(path, "rb") as fh:
        blob = fh.read()
    if len(blob) < 8:
        raise ValueError("file too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"header length {n} runs past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in _NP_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {info['dtype']}")
        dt = np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * dt.itemsize or end > len(data):
            raise ValueError(f"{name}: data_offsets {begin}..{end} do not fit shape {list(shape)}")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(shape).copy()
    return tensors, meta


# ---------------------------------------------------------------- config

# Enum names, should a dump write the C enum values instead of the strings.
_ENUMS = {"norm": ("pre", "post", "peri"), "qk_norm": ("none", "full", "head"),
          "gating": ("softmax", "sigmoid"), "routing": ("learned", "random", "uniform")}


class Config:
    """The model config as attributes (keys as in model_config_to_json)."""

    def __init__(self, d):
        self.__dict__.update(d)
        for key, names in _ENUMS.items():
            if isinstance(getattr(self, key), int):
                setattr(self, key, names[getattr(self, key)])
        self.moe_layers = [l for l in range(self.n_layers) if self.is_moe(l)]
        self.n_moe = len(self.moe_layers)

    def is_moe(self, l):
        return self.n_experts > 0 and l >= self.dense_layers


def param_shapes(c):
    """[(name, shape)] in the order of the parameter table of docs/model.md."""
    D, hd = c.d_model, c.head_dim
    qd, kvd = c.n_heads * hd, c.n_kv_heads * hd
    has_pre = c.norm in ("pre", "peri")
    has_post = c.norm in ("post", "peri")
    out = [("embed", [c.padded_vocab, D])]
    for l in range(c.n_layers):
        p = f"layers.{l}."
        if has_pre:
            out.append((p + "attn_norm", [D]))
        out += [(p + "attn.wq", [qd, D]), (p + "attn.wk", [kvd, D]),
                (p + "attn.wv", [kvd, D]), (p + "attn.wo", [D, qd])]
        if c.qk_norm == "full":
            out += [(p + "attn.q_norm", [qd]), (p + "attn.k_norm", [kvd])]
        elif c.qk_norm == "head":
            out += [(p + "attn.q_norm", [hd]), (p + "attn.k_norm", [hd])]
        if has_post:
            out.append((p + "attn_post_norm", [D]))
        if has_pre:
            out.append((p + "ffn_norm", [D]))
        if not c.is_moe(l):
            Fd = c.dense_hidden
            out += [(p + "mlp.w_gate", [Fd, D]), (p + "mlp.w_up", [Fd, D]),
                    (p + "mlp.w_down", [D, Fd])]
        else:
            E, Fe = c.n_experts, c.expert_hidden
            out += [(p + "moe.router", [E, D]),
                    (p + "moe.experts.w_gate", [E, Fe, D]),
                    (p + "moe.experts.w_up", [E, Fe, D]),
                    (p + "moe.experts.w_down", [E, D, Fe])]
            if c.n_shared > 0:
                Fs = c.n_shared * c.shared_hidden
                out += [(p + "moe.shared.w_gate", [Fs, D]), (p + "moe.shared.w_up", [Fs, D]),
                        (p + "moe.shared.w_down", [D, Fs])]
        if has_post:
            out.append((p + "ffn_post_norm", [D]))
    out += [("final_norm", [D]), ("lm_head", [c.padded_vocab, D])]
    return out


# ---------------------------------------------------------------- model

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Rotate-half RoPE on x [B, T, nh, hd]; position = index in the sequence."""
    T, hd = x.shape[1], x.shape[3]
    half = hd // 2
    f = theta ** (-2.0 * torch.arange(half, dtype=DT) / hd)
    ang = torch.arange(T, dtype=DT)[:, None] * f[None, :]          # [T, hd/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def document_ids(tokens, eos):
    """[B, T] index of each position's document: a document ends with its EOS."""
    ends = (tokens == eos).long().cumsum(-1)
    return F.pad(ends[:, :-1], (1, 0))


def attention(c, P, pre, u, docs=None):
    """Causal GQA attention on u [B, T, D]; docs [B, T] (document_ids) or None:
    the block-diagonal causal mask, a query sees the keys of its own document."""
    B, T, _ = u.shape
    H, KV, hd = c.n_heads, c.n_kv_heads, c.head_dim
    q = u @ P[pre + "wq"].T
    k = u @ P[pre + "wk"].T
    v = u @ P[pre + "wv"].T
    if c.qk_norm == "full":
        q = rmsnorm(q, P[pre + "q_norm"], c.norm_eps)
        k = rmsnorm(k, P[pre + "k_norm"], c.norm_eps)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, KV, hd), v.view(B, T, KV, hd)
    if c.qk_norm == "head":
        q = rmsnorm(q, P[pre + "q_norm"], c.norm_eps)
        k = rmsnorm(k, P[pre + "k_norm"], c.norm_eps)
    q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
    # head h reads kv head h // (H/KV)
    k = k.repeat_interleave(H // KV, dim=2)
    v = v.repeat_interleave(H // KV, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    masked = torch.ones(T, T, dtype=torch.bool).triu(1)                 # [T, T]: s > t
    if docs is not None:
        masked = masked | (docs[:, :, None] != docs[:, None, :])       # [B, T, T]: other documents
        masked = masked[:, None]                                        # [B, 1, T, T]
    s = s.masked_fill(masked, float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, H * hd)
    return o @ P[pre + "wo"].T


def swiglu(u, wg, wu, wd):
    return (F.silu(u @ wg.T) * (u @ wu.T)) @ wd.T


def topk_lower_index(p, k):
    """Top-k indices per row, ties to the lower index; also the sorted values."""
    vals, idx = torch.sort(p, dim=-1, descending=True, stable=True)
    return idx[:, :k], vals


def moe(c, P, pre, u, stats=None):
    """MoE feed-forward on u [N, D]. Returns (y, lb, z)."""
    N = u.shape[0]
    E, k = c.n_experts, c.top_k
    logits = u @ P[pre + "router"].T                               # [N, E]
    probs = logits.softmax(-1) if c.gating == "softmax" else logits.sigmoid()
    choice, sorted_p = topk_lower_index(probs.detach(), k)         # [N, k]
    if stats is not None:
        gap = (sorted_p[:, k - 1] - sorted_p[:, k]).min().item() if k < E else math.inf
        stats.append(gap)
    w = probs.gather(1, choice)
    if c.renorm_topk:
        w = w / w.sum(-1, keepdim=True)
    y = torch.zeros_like(u)
    wg, wu, wd = (P[pre + "experts." + n] for n in ("w_gate", "w_up", "w_down"))
    for e in range(E):
        tok, slot = (choice == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        ye = swiglu(u[tok], wg[e], wu[e], wd[e])
        y = y.index_add(0, tok, w[tok, slot, None] * ye)
    if c.n_shared > 0:
        y = y + swiglu(u, P[pre + "shared.w_gate"], P[pre + "shared.w_up"],
                       P[pre + "shared.w_down"])
    # auxiliary losses; f carries no gradient
    f = torch.bincount(choice.flatten(), minlength=E).to(DT) / N
    p_hat = probs if c.gating == "softmax" else probs / probs.sum(-1, keepdim=True)
    lb = (E / k) * (f * p_hat.mean(0)).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    return y, lb, z


def block(c, P, l, x, docs=None, stats=None):
    """One transformer block on x [B, T, D]. Returns (y, lb, z) (None if dense)."""
    B, T, D = x.shape
    p = f"layers.{l}."
    has_pre = c.norm in ("pre", "peri")
    has_post = c.norm in ("post", "peri")

    u = rmsnorm(x, P[p + "attn_norm"], c.norm_eps) if has_pre else x
    a = attention(c, P, p + "attn.", u, docs)
    if has_post:
        a = rmsnorm(a, P[p + "attn_post_norm"], c.norm_eps)
    h = x + a

    u = rmsnorm(h, P[p + "ffn_norm"], c.norm_eps) if has_pre else h
    lb = z = None
    if c.is_moe(l):
        f, lb, z = moe(c, P, p + "moe.", u.reshape(B * T, D), stats)
        f = f.view(B, T, D)
    else:
        f = swiglu(u, P[p + "mlp.w_gate"], P[p + "mlp.w_up"], P[p + "mlp.w_down"])
    if has_post:
        f = rmsnorm(f, P[p + "ffn_post_norm"], c.norm_eps)
    return h + f, lb, z


def forward(c, P, tokens, targets, docs=None, stats=None):
    """Returns (logits [N, Vp], ce, [lb per MoE layer], [z per MoE layer]).
    docs: document ids [B, T] for intra-document masking, or None.
    stats, if a list, receives the min top-k prob gap of each MoE layer."""
    x = P["embed"][tokens.long()]
    lbs, zs = [], []
    for l in range(c.n_layers):
        x, lb, z = block(c, P, l, x, docs, stats)
        if lb is not None:
            lbs.append(lb)
            zs.append(z)
    logits = (rmsnorm(x, P["final_norm"], c.norm_eps) @ P["lm_head"].T)
    logits = logits.reshape(-1, c.padded_vocab)
    ce = F.cross_entropy(logits, targets.reshape(-1).long(), ignore_index=-1)
    return logits, ce, lbs, zs


def total_loss(c, ce, lbs, zs):
    return ce + c.lb_coef * sum(lbs, torch.zeros((), dtype=DT)) \
              + c.z_coef * sum(zs, torch.zeros((), dtype=DT))


def make_optimizer(opt, P):
    """torch.optim.AdamW with norms / embedding excluded from weight decay."""
    decay, no_decay = [], []
    for name, t in P.items():
        is_norm = name.endswith("norm")
        skip = (is_norm and not opt["decay_norms"]) or \
               (name == "embed" and not opt["decay_embeddings"])
        (no_decay if skip else decay).append(t)
    groups = [{"params": decay, "weight_decay": opt["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]),
                             eps=opt["eps"])


# ---------------------------------------------------------------- checking

def rel_err(c_val, ref):
    return abs(c_val - ref) / abs(ref) if ref != 0 else abs(c_val)


def norm_rel_err(c_t, ref_t):
    """(||c - ref|| / ||ref||, False), or (||c||, True) when ||ref|| == 0."""
    rn = ref_t.norm().item()
    if rn == 0:
        return c_t.norm().item(), True
    return (c_t - ref_t).norm().item() / rn, False


def near_tie_hint(gaps):
    """Failure hint when the smallest k-th/(k+1)-th prob gap seen is tiny."""
    gap = min(gaps, default=math.inf)
    if gap >= NEAR_TIE_GAP:
        return ""
    return (f"min top-k prob gap {gap:.2e} < {NEAR_TIE_GAP:.0e}: likely a near-tie expert "
            f"choice that flipped between C (FP32) and the reference")


class Report:
    """Prints one line per check and collects the failures."""

    def __init__(self, verbose):
        self.verbose = verbose
        self.failures = []

    @staticmethod
    def line(ok, text):
        print(f"  {'[ok]' if ok else '[FAIL]':<6} {text}")

    def check(self, what, err, bound, hint="", quiet=False):
        ok = err <= bound      # NaN fails
        if not (quiet and ok and not self.verbose):
            self.line(ok, f"{what:<40} {err:.3e}  (<= {bound:.0e})")
        if not ok:
            self.failures.append(what + (f": {hint}" if hint else ""))
        return ok

    def fail(self, what):
        self.line(False, what)
        self.failures.append(what)


def check_layout(r, c, dump, names_shapes):
    """Parameter / grad / final names and shapes, batch range. False stops the file."""
    names = {n for n, _ in names_shapes}
    for prefix in ("param.", "grad.", "final."):
        have = {k[len(prefix):] for k in dump if k.startswith(prefix)}
        missing, extra = sorted(names - have), sorted(have - names)
        if missing or extra:
            r.fail(f"{prefix}* names differ from the parameter table: "
                   f"missing {missing[:6]}, unexpected {extra[:6]}")
            return False
        for n, shape in names_shapes:
            if list(dump[prefix + n].shape) != shape:
                r.fail(f"{prefix}{n} has shape {list(dump[prefix + n].shape)}, expected {shape}")
                return False
    tok, tgt = dump["tokens"], dump["targets"]
    if tok.shape != tgt.shape or tok.ndim != 2:
        r.fail(f"tokens {list(tok.shape)} / targets {list(tgt.shape)} are not both [B, T]")
        return False
    if tok.min() < 0 or tok.max() >= c.padded_vocab or tgt.min() < -1 \
            or tgt.max() >= c.padded_vocab:
        r.fail("tokens / targets out of range")
        return False
    r.line(True, f"{len(names)} params; grad.* and final.* names and shapes match")
    return True


def check_first_step(r, c, dump, init, batch):
    """Checks 1-3: logits, losses and gradients at the initial weights."""
    P = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    gaps = []
    logits, ce, lbs, zs = forward(c, P, *batch, stats=gaps)
    loss = total_loss(c, ce, lbs, zs)
    loss.backward()
    for l, g in zip(c.moe_layers, gaps):
        print(f"  routing: layer {l}: min p(k) - p(k+1) over tokens = {g:.3e}")
    hint = near_tie_hint(gaps)

    # 1. logits
    lc = torch.from_numpy(dump["logits"]).to(DT)
    if lc.shape != logits.shape:
        r.fail(f"logits has shape {list(lc.shape)}, expected {list(logits.shape)}")
    else:
        r.check("logits max abs err", (lc - logits.detach()).abs().max().item(),
                TOL_LOGITS_ABS, hint)

    # 2. losses
    r.check("loss_ce rel err", rel_err(float(dump["loss_ce"][0]), ce.item()), TOL_LOSS_REL, hint)
    r.check("loss_total rel err", rel_err(float(dump["loss_total"][0]), loss.item()),
            TOL_LOSS_REL, hint)
    for key, ref in (("lb", lbs), ("z", zs)):
        if not ref:
            continue
        if key not in dump or dump[key].shape != (c.n_moe,):
            r.fail(f"'{key}' missing or not of shape [{c.n_moe}]")
            continue
        for i, (l, v) in enumerate(zip(c.moe_layers, ref)):
            r.check(f"{key}[{i}] (layer {l}) rel err", rel_err(float(dump[key][i]), v.item()),
                    TOL_LOSS_REL, hint)

    # 3. gradients (None: the parameter took no part, its gradient is 0)
    worst, ok = (-1.0, ""), True
    for n, p in P.items():
        g_ref = p.grad if p.grad is not None else torch.zeros_like(p)
        err, zero_ref = norm_rel_err(torch.from_numpy(dump["grad." + n]).to(DT), g_ref)
        if zero_ref:
            ok &= r.check(f"grad {n} (ref 0: ||g_c||)", err, TOL_GRAD_ZERO, hint, quiet=True)
        else:
            ok &= r.check(f"grad {n}", err, TOL_GRAD_REL, hint, quiet=True)
            worst = max(worst, (err, n))
    r.line(ok, f"grads: worst rel err {worst[0]:.3e} ({worst[1]})  (<= {TOL_GRAD_REL:.0e})")


def check_training(r, c, dump, init, batch, opt):
    """Check 4: the loss of each AdamW step and the final parameters."""
    steps = int(opt["steps"])
    step_c = dump.get("step_loss", np.zeros(0))
    if step_c.shape != (steps,):
        r.fail(f"step_loss has shape {list(step_c.shape)}, expected [{steps}]")
        return
    P = {n: t.clone().requires_grad_(True) for n, t in init.items()}
    optim = make_optimizer(opt, P)
    gaps = []
    for s in range(steps):
        optim.zero_grad(set_to_none=False)
        loss = total_loss(c, *forward(c, P, *batch, stats=gaps)[1:])
        loss.backward()
        for p in P.values():               # a parameter without a gradient still decays
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        optim.step()
        r.check(f"step_loss[{s}] rel err (ref {loss.item():.6f})",
                rel_err(float(step_c[s]), loss.item()), TOL_STEP_LOSS_REL, near_tie_hint(gaps))
    if gaps:
        print(f"  routing: min top-k gap over all step forwards = {min(gaps):.3e}")

    hint = near_tie_hint(gaps)
    worst, ok = (-1.0, "", 0.0), True
    for n, p in P.items():
        fc, fr = torch.from_numpy(dump["final." + n]).to(DT), p.detach()
        err, _ = norm_rel_err(fc, fr)
        ok &= r.check(f"final {n}", err, TOL_FINAL_REL, hint, quiet=True)
        upd = (fr - init[n]).norm().item()          # error relative to the update: diagnosis only
        worst = max(worst, (err, n, (fc - fr).norm().item() / upd if upd else 0.0))
    r.line(ok, f"final params: worst rel err {worst[0]:.3e} ({worst[1]}; "
               f"{worst[2]:.1e} of its update)  (<= {TOL_FINAL_REL:.0e})")


def check_file(path, verbose):
    """Runs every check on one dump; returns the list of failures."""
    print(f"== {path}")
    dump, meta = load_safetensors(path)
    c = Config(json.loads(meta["config"]))
    opt = json.loads(meta["optim"])
    r = Report(verbose)

    gqa = f"GQA {c.n_heads}/{c.n_kv_heads}" if c.n_kv_heads != c.n_heads else f"MHA {c.n_heads}"
    moe_s = (f"E={c.n_experts} k={c.top_k} gating={c.gating} renorm={bool(c.renorm_topk)} "
             f"shared={c.n_shared}x{c.shared_hidden}") if c.n_moe else "no MoE"
    print(f"  config: norm={c.norm} qk_norm={c.qk_norm} {gqa} hd={c.head_dim} "
          f"L={c.n_layers} (dense {c.n_layers - c.n_moe}) D={c.d_model} "
          f"V={c.vocab_size}/{c.padded_vocab} {moe_s}")
    print(f"  batch {list(dump['tokens'].shape)}; lb_coef={c.lb_coef:g} z_coef={c.z_coef:g}; "
          f"AdamW lr={opt['lr']:g} wd={opt['weight_decay']:g} steps={opt['steps']}")

    # Only what the reference models: learned routing, no aux-free bias, local LB.
    if c.routing != "learned" or c.aux_free_rate != 0 or c.lb_global:
        r.fail(f"dump uses routing={c.routing} aux_free_rate={c.aux_free_rate} "
               f"lb_global={c.lb_global}; the reference handles learned/0/false only")
        return r.failures
    if c.n_heads % c.n_kv_heads or c.head_dim % 2:
        r.fail(f"n_heads {c.n_heads} not a multiple of n_kv_heads {c.n_kv_heads}, "
               f"or head_dim {c.head_dim} odd")
        return r.failures
    names_shapes = param_shapes(c)
    if not check_layout(r, c, dump, names_shapes):
        return r.failures

    init = {n: torch.from_numpy(dump["param." + n]).to(DT) for n, _ in names_shapes}
    tokens = torch.from_numpy(dump["tokens"]).long()
    docs = None
    if "doc_mask" in meta:
        docs = document_ids(tokens, int(json.loads(meta["doc_mask"])["eos_id"]))
        lens = [int(n) for row in docs for n in torch.bincount(row)]
        print(f"  doc_mask: {len(lens)} documents of {min(lens)}..{max(lens)} tokens "
              f"({sum(1 for n in lens if n == 1)} of length 1)")
    batch = (tokens, torch.from_numpy(dump["targets"]).long(), docs)
    check_first_step(r, c, dump, init, batch)
    check_training(r, c, dump, init, batch, opt)
    return r.failures


def main(argv):
    verbose = "-v" in argv
    paths = [a for a in argv if a != "-v"]
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = []
    for path in paths:
        try:
            failures = check_file(path, verbose)
        except Exception as e:  # a malformed dump is a failure, not a crash
            failures = [f"error: {type(e).__name__}: {e}"]
            Report.line(False, failures[0])
        print(f"  result: {'PASS' if not failures else 'FAIL'}")
        for f in failures:
            print(f"    - {f}")
        if failures:
            bad.append(path)
    print(f"{len(paths) - len(bad)}/{len(paths)} dumps passed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
