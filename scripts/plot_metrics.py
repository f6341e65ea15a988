#!/usr/bin/python3
"""Plots a moecore run's metrics.jsonl (one JSON object per optimizer step,
written by `moecore train`, keys in src/train/train_report.c) as one PNG:

  loss and CE (eval CE as points)     | LB and z-loss, raw (before their coefs)
  expert load max/mean, per MoE layer | lr and global grad norm
  (gerrymandering-flagged steps marked) (skipped steps marked)

    scripts/plot_metrics.py RUN_DIR/metrics.jsonl [-o OUT.png]

The shebang names /usr/bin/python3, Debian's, where scripts/install-deps.sh
puts numpy and matplotlib (python3-numpy, python3-matplotlib): a python3
found first on PATH (pyenv, conda, a venv) need not have them. Any other
Python that has them runs it too: `that-python scripts/plot_metrics.py ...`.

RUN_DIR alone works too. The default output is metrics.png beside the jsonl.
Lines that are not JSON objects (a run killed mid-write leaves a truncated
last line) are skipped with a warning; missing keys leave gaps. A resumed run
appends to the same file, so a step logged twice keeps its last record.
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(f"plot_metrics: {sys.executable} has no matplotlib: run this script with the Python that has "
             "numpy and matplotlib (/usr/bin/python3 after scripts/install-deps.sh, or pip install matplotlib numpy)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def warn(msg):
    print(f"plot_metrics: warning: {msg}", file=sys.stderr)


def read_records(path):
    """The records of path by step (last one wins), in step order."""
    by_step = {}
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = "last line" if i == len(lines) else "line"
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            warn(f"{path}:{i}: skipping {where}, not JSON ({e}; truncated?)")
            continue
        if not isinstance(rec, dict):
            warn(f"{path}:{i}: skipping {where}, not a JSON object")
            continue
        step = number(rec.get("step"))
        if step is None:
            warn(f"{path}:{i}: skipping {where}, no numeric \"step\"")
            continue
        rec["step"] = step
        by_step[step] = rec
    return [by_step[s] for s in sorted(by_step)]


def number(v):
    """v as a float, or None when it is missing, not a number or a bool."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def series(records, get):
    """(steps, values) of the records where get(record) is a number."""
    xs, ys = [], []
    for r in records:
        try:
            y = number(get(r))
        except (KeyError, IndexError, TypeError, AttributeError):
            y = None
        if y is not None:
            xs.append(r["step"])
            ys.append(y)
    return xs, ys


def plot_line(ax, records, get, **kw):
    xs, ys = series(records, get)
    if xs:
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, **kw)
    return bool(xs)


def wide_positive(records, key):
    """Whether key's values are all > 0 and span more than 20x (a log axis then)."""
    ys = series(records, lambda r: r[key])[1]
    return bool(ys) and min(ys) > 0 and max(ys) > 20 * min(ys)


def moe_layers(r):
    layers = r.get("moe_layers")
    return layers if isinstance(layers, list) else []


def plot(records, title, out):
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), sharex=True)
    (ax_loss, ax_aux), (ax_load, ax_lr) = axes

    # loss, CE and eval CE
    plot_line(ax_loss, records, lambda r: r["loss"], label="loss (CE + aux)")
    plot_line(ax_loss, records, lambda r: r["ce"], label="CE")
    ex, ey = series(records, lambda r: r["eval_ce"])
    if ex:
        ax_loss.plot(ex, ey, "o", color="C3", label="eval CE")
    sx = [r["step"] for r in records if r.get("skipped") is True]
    if sx:
        for s in sx:
            ax_loss.axvline(s, color="red", alpha=0.25, lw=1)
        ax_loss.plot([], [], color="red", alpha=0.4, label=f"skipped step ({len(sx)})")
    ax_loss.set_title("loss")
    ax_loss.set_ylabel("nats / token")
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend(loc="upper right", fontsize="small")

    # LB and z-loss, raw, on their own scales
    ax_z = ax_aux.twinx()
    has_lb = plot_line(ax_aux, records, lambda r: r["lb_raw"], color="C0", label="LB raw (sum over layers)")
    has_z = plot_line(ax_z, records, lambda r: r["z_loss_raw"], color="C1", label="z-loss raw (sum over layers)")
    ax_aux.set_title("auxiliary losses, raw (LB = 1 per layer when balanced)")
    ax_aux.set_ylabel("LB raw", color="C0")
    ax_z.set_ylabel("z-loss raw (logit^2)", color="C1")
    handles = ax_aux.get_legend_handles_labels()[0] + ax_z.get_legend_handles_labels()[0]
    if has_lb or has_z:
        ax_aux.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize="small")

    # expert load max/mean per MoE layer
    n_layers = max((len(moe_layers(r)) for r in records), default=0)
    flagged_any = False
    for l in range(n_layers):
        color = f"C{l % 10}"
        plot_line(ax_load, records, lambda r: moe_layers(r)[l]["load_max_over_mean"],
                  color=color, lw=1.2, label=f"layer {l}")
        fx, fy = series([r for r in records if len(moe_layers(r)) > l
                         and isinstance(moe_layers(r)[l], dict)
                         and moe_layers(r)[l].get("gerrymander_flag") is True],
                        lambda r: moe_layers(r)[l]["load_max_over_mean"])
        if fx:
            ax_load.plot(fx, fy, "x", color="red", ms=7, mew=2)
            flagged_any = True
    # a step flagged as a whole but without per-layer flags: a band
    for r in records:
        if r.get("gerrymander_flag") is True and not any(
                isinstance(x, dict) and x.get("gerrymander_flag") is True for x in moe_layers(r)):
            ax_load.axvline(r["step"], color="red", alpha=0.3, lw=1)
            flagged_any = True
    if flagged_any:
        ax_load.plot([], [], "x", color="red", mew=2, label="gerrymander flag")
    ax_load.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax_load.set_title("expert load, max / mean per MoE layer (1 = balanced)")
    ax_load.set_ylabel("max / mean load")
    ax_load.set_xlabel("step")
    if ax_load.get_legend_handles_labels()[0]:
        ax_load.legend(loc="upper right", fontsize="small", ncol=2 if n_layers > 6 else 1)
    if not n_layers:
        ax_load.text(0.5, 0.5, "no MoE layer data", ha="center", va="center", transform=ax_load.transAxes)

    # lr and grad norm
    ax_g = ax_lr.twinx()
    has_lr = plot_line(ax_lr, records, lambda r: r["lr"], color="C2", label="lr")
    has_g = plot_line(ax_g, records, lambda r: r["grad_norm"], color="C4", label="grad norm (before clipping)")
    if has_g and wide_positive(records, "grad_norm"):
        ax_g.set_yscale("log")
    ax_lr.set_title("learning rate and global grad L2 norm")
    ax_lr.set_ylabel("lr", color="C2")
    ax_g.set_ylabel("grad norm", color="C4")
    ax_lr.set_xlabel("step")
    handles = ax_lr.get_legend_handles_labels()[0] + ax_g.get_legend_handles_labels()[0]
    if has_lr or has_g:
        ax_lr.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize="small")

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", help="RUN_DIR/metrics.jsonl (or RUN_DIR)")
    ap.add_argument("-o", "--out", help="output PNG (default: metrics.png beside the jsonl)")
    a = ap.parse_args()
    path = a.metrics
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    try:
        records = read_records(path)
    except OSError as e:
        print(f"plot_metrics: error: {e}", file=sys.stderr)
        return 2
    if not records:
        print(f"plot_metrics: error: {path}: no metrics records", file=sys.stderr)
        return 2
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(path)), "metrics.png")
    run = os.path.basename(os.path.dirname(os.path.abspath(path)))
    steps = [r["step"] for r in records]
    title = f"{run}: {len(records)} steps logged, step {steps[0]:g} to {steps[-1]:g}"
    plot(records, title, out)
    print(f"plot_metrics: wrote {out} ({os.path.getsize(out)} bytes, {len(records)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
