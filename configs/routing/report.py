#!/usr/bin/python3
"""The routing-health table and plots of issue 22 from the runs' metrics.

    configs/routing/report.py [RUNS_DIR] [-o OUT_DIR]

RUNS_DIR (default runs/routing) holds one directory per run, named
MODEL-SETTING as configs/routing/run.sh names them, each with the
metrics.jsonl the trainer writes (one record per step). Prints a Markdown
table (one row per run) and writes into OUT_DIR (default RUNS_DIR):

  routing-MODEL.png   per setting: the worst layer's max/mean and min/mean
                      load, the LB and z-losses (raw, summed over layers),
                      dead experts (all layers) and eval CE, against the step
  summary-RUN.csv     every 10th step (and every flagged step): CE, LB, and
                      per layer max/mean, min/mean, dead experts and the
                      gerrymandering flag, small enough to commit

"Late" columns are medians over the last 100 steps. Flags count the
(step, layer) pairs the trainer flagged (src/train/metrics.c: LB falling
while max/mean load rises over logging.gerrymander_window steps).
Needs matplotlib (Debian's python3-matplotlib; scripts/install-deps.sh).
"""
import argparse
import csv
import glob
import json
import os
import statistics
import sys


def load(path):
    recs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                print(f"report: {path}:{n}: not a JSON record, skipped", file=sys.stderr)
                continue
            recs[r["step"]] = r  # a resumed run's repeated step keeps its last record
    return [recs[s] for s in sorted(recs)]


def layer_series(recs, key):
    return [[r["moe_layers"][l][key] for l in range(len(r["moe_layers"]))] for r in recs]


def summarise(name, recs):
    last = recs[-100:]
    nl = len(recs[0]["moe_layers"])
    med = lambda key, l: statistics.median(r["moe_layers"][l][key] for r in last)
    evals = [(r["step"], r["eval_ce"]) for r in recs if r.get("eval_ce") is not None]
    best = min(evals, key=lambda e: e[1]) if evals else (None, None)
    flags = [(r["step"], l) for r in recs for l in range(nl) if r["moe_layers"][l]["gerrymander_flag"]]
    return {
        "run": name,
        "steps": recs[-1]["step"],
        "late_max_worst": max(med("load_max_over_mean", l) for l in range(nl)),
        "late_max_median": statistics.median(med("load_max_over_mean", l) for l in range(nl)),
        "late_min_worst": min(med("load_min_over_mean", l) for l in range(nl)),
        "late_dead": sum(max(r["moe_layers"][l]["dead_experts"] for r in last) for l in range(nl)),
        "peak_dead": max(sum(x["dead_experts"] for x in r["moe_layers"]) for r in recs),
        "late_lb": statistics.median(r["lb_raw"] for r in last),
        "late_ce": statistics.median(r["ce"] for r in last),
        "best_eval": best,
        "final_eval": evals[-1] if evals else (None, None),
        "flags": flags,
        "tok_s": statistics.median(r["tokens_per_s"] for r in (recs[10:] if len(recs) > 10 else recs)),
    }


def table(rows):
    out = ["| run | steps | late max/mean (worst layer / median layer) | late min/mean (worst) | dead experts late / peak "
           "| LB raw late (sum of layers) | train CE late | eval CE best (step) | eval CE final | flagged (step, layer) | tokens/s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for s in rows:
        f = s["flags"]
        fl = "none" if not f else f"{len(f)}: steps {f[0][0]}-{f[-1][0]}, layers {sorted({l for _, l in f})}"
        ev = lambda e: "-" if e[1] is None else f"{e[1]:.3f}"
        be, fe = s["best_eval"], s["final_eval"]
        out.append(f"| {s['run']} | {s['steps']} | {s['late_max_worst']:.2f} / {s['late_max_median']:.2f} | "
                   f"{s['late_min_worst']:.3f} | {s['late_dead']} / {s['peak_dead']} | {s['late_lb']:.3f} | "
                   f"{s['late_ce']:.4f} | {ev(be)} ({be[0]}) | {ev(fe)} | {fl} | {s['tok_s']:,.0f} |")
    return "\n".join(out)


def write_csv(path, recs):
    nl = len(recs[0]["moe_layers"])
    head = ["step", "ce", "eval_ce", "lb_raw", "z_loss_raw", "gerrymander_flag"]
    for l in range(nl):
        head += [f"l{l}_max_over_mean", f"l{l}_min_over_mean", f"l{l}_dead", f"l{l}_lb_raw", f"l{l}_flag"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in recs:
            if r["step"] % 10 and not r["gerrymander_flag"] and r.get("eval_ce") is None and r["step"] != 1:
                continue
            row = [r["step"], f"{r['ce']:.5f}", "" if r.get("eval_ce") is None else f"{r['eval_ce']:.5f}",
                   f"{r['lb_raw']:.5f}", f"{r['z_loss_raw']:.4f}", int(r["gerrymander_flag"])]
            for x in r["moe_layers"]:
                row += [f"{x['load_max_over_mean']:.4f}", f"{x['load_min_over_mean']:.4f}", x["dead_experts"],
                        f"{x['lb_raw']:.5f}", int(x["gerrymander_flag"])]
            w.writerow(row)


def plot(path, model, runs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(3, 2, figsize=(13, 12))
    for name, recs in runs:
        label = name[len(model) + 1:]
        st = [r["step"] for r in recs]
        ax[0][0].plot(st, [max(x) for x in layer_series(recs, "load_max_over_mean")], label=label, lw=0.8)
        ax[0][1].plot(st, [r["lb_raw"] for r in recs], label=label, lw=0.8)
        ax[1][0].plot(st, [sum(x) for x in layer_series(recs, "dead_experts")], label=label, lw=0.8)
        ev = [(r["step"], r["eval_ce"]) for r in recs if r.get("eval_ce") is not None]
        ax[1][1].plot([e[0] for e in ev], [e[1] for e in ev], marker="o", label=label, lw=0.8)
        ax[2][0].plot(st, [min(x) for x in layer_series(recs, "load_min_over_mean")], label=label, lw=0.8)
        ax[2][1].plot(st, [r["z_loss_raw"] for r in recs], label=label, lw=0.8)
        fl = [r["step"] for r in recs if r["gerrymander_flag"]]
        if fl:
            ax[0][0].plot(fl, [max(r["moe_layers"][l]["load_max_over_mean"] for l in range(len(r["moe_layers"])))
                               for r in recs if r["gerrymander_flag"]], "kx", ms=6)
    ax[0][0].set(title=f"{model}: worst layer's max/mean expert load (x: flagged steps)", yscale="log")
    ax[0][1].set(title="LB loss, raw, summed over layers (balanced = n_layers)", yscale="log")
    ax[1][0].set(title="dead experts in the step, all layers")
    ax[1][1].set(title="eval CE")
    ax[2][0].set(title="worst layer's min/mean expert load")
    ax[2][1].set(title="router z-loss, raw, summed over layers", yscale="log")
    for a in ax.flat:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    ax[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="?", default="runs/routing")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()
    out = a.out or a.runs
    dirs = sorted(d for d in glob.glob(os.path.join(a.runs, "*")) if os.path.isfile(os.path.join(d, "metrics.jsonl")))
    if not dirs:
        sys.exit(f"report: no RUN/metrics.jsonl under {a.runs}")
    os.makedirs(out, exist_ok=True)
    runs = [(os.path.basename(d), load(os.path.join(d, "metrics.jsonl"))) for d in dirs]
    runs = [(n, r) for n, r in runs if r]
    print(table([summarise(n, r) for n, r in runs]))
    for n, r in runs:
        write_csv(os.path.join(out, f"summary-{n}.csv"), r)
    for model in sorted({n.split("-")[0] + "-" + n.split("-")[1] for n, _ in runs}):
        plot(os.path.join(out, f"routing-{model}.png"), model, [(n, r) for n, r in runs if n.startswith(model + "-")])


if __name__ == "__main__":
    main()
