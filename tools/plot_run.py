#!/usr/bin/python3
"""Plots a run from its metrics log (RUN_DIR/metrics.jsonl, docs/METRICS.md) with gnuplot:
loss (left axis) and learning rate (right axis) against step; the evaluations in a second panel: test
accuracy, or, for a language model (eval records with "perplexity") and for float targets, the test loss
(a language model's perplexity, exp(loss), on the right axis); with --grad-clip (train records with
"grad_norm") a third panel: the gradient norm and the steps skipped for a non-finite norm; and a vertical
mark at every restart labelled with the world size before and after. With the records of issue 60 (start and
resume records carrying process_start) also PREFIX-goodput.png and .svg: a stacked bar per segment (one process
lifetime) of its seconds: training kept, lost (redone after a kill), saves that blocked, start-up and load,
evaluation, other (the account of `h5ddp-ckpt goodput RUN_DIR`, docs/GOODPUT.md).

  tools/plot_run.py RUN_DIR [--out PREFIX]      writes PREFIX.png and PREFIX.svg (default RUN_DIR/run)

Needs gnuplot (Debian: gnuplot-nox). Exit 1 with one line when the log is missing, empty or has no
training records, or gnuplot fails.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print(f"plot_run: error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_log(path):
    if not os.path.isfile(path):
        fail(f"{path}: no metrics log (h5ddp-train writes it unless --no-metrics)")
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not a JSON record ({e.msg})")
    return records


def series(records):
    train = [(r["step"], r["loss"], r["lr"]) for r in records if r.get("event") == "train" and r.get("loss") is not None]
    evals = [r for r in records if r.get("event") == "eval"]
    restarts = [(r["step"], r.get("saved_world_size", 0), r["world_size"]) for r in records
                if r.get("event") == "resume"]
    return train, evals, restarts


def eval_kind(evals):
    """What the evaluation panel shows: "accuracy" (classification; what older logs always get), "lm" (test loss
    and perplexity: a language model's token accuracy says little) or "loss" (float targets: accuracy is -1)."""
    if any("perplexity" in r for r in evals):
        return "lm"
    if evals and all(r.get("accuracy") is not None and r["accuracy"] < 0 for r in evals):
        return "loss"
    return "accuracy"


def grad_series(records):
    """(step, mean gradient norm or None, steps skipped in the interval) of the train records with grad_norm.
    skipped_steps counts from 0 in every process (a start or resume record begins one), so the per-interval
    count is the increase since the process's previous train record."""
    out, before = [], 0
    for r in records:
        if r.get("event") in ("start", "resume"):
            before = 0
        elif r.get("event") == "train" and "grad_norm" in r:
            skipped = r.get("skipped_steps") or 0
            out.append((r["step"], r["grad_norm"], max(0, skipped - before)))
            before = skipped
    return out


def perplexity_tics(losses):
    """Round perplexity values for the right axis of the test-loss panel (gnuplot's own ticks there would sit at
    exp(2), exp(3), ...): the coarsest of powers of ten, 1-2-5 steps, ... that puts 3 or more inside the range;
    none (gnuplot's own) for a perplexity beyond 1e15 (a diverged run)."""
    if max(losses) > math.log(1e15):
        return []
    lo, hi = math.exp(min(losses)), math.exp(max(losses))
    finer = ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), tuple(range(1, 10)), tuple(m / 10 for m in range(10, 100)))
    for mantissas in finer:
        tics = sorted({round(m * 10.0 ** k, 6) for k in range(-1, 16) for m in mantissas})
        inside = [t for t in tics if lo <= t <= hi]
        if len(inside) >= 3:
            break
    # One tick beyond each end, in case gnuplot's autoscaled loss range reaches past the data.
    below = [t for t in tics if t < lo][-1:]
    above = [t for t in tics if t > hi][:1]
    return below + inside + above


def value(v):
    return "?" if v is None else repr(v)  # '?': gnuplot's missing value (null: not finite in the run)


GOODPUT_PARTS = ("train_kept", "train_lost", "blocked", "startup", "eval", "other")


def goodput_segments(records):
    """Per segment (a start or resume record and what follows it), the seconds of GOODPUT_PARTS: the account of
    h5ddp-ckpt goodput (src/train/goodput.cpp), for the bars. [] for a log without process_start."""
    segs = []
    for r in records:
        e, t = r.get("event"), r.get("time") or 0
        if e in ("start", "resume"):
            start = r.get("process_start", t)
            segs.append({"start": start, "last": t, "startup": t - start, "train_kept": 0, "train_lost": 0,
                         "blocked": 0, "eval": 0, "known": "process_start" in r})
            continue
        if not segs:
            continue
        s = segs[-1]
        s["last"] = max(s["last"], t)
        s["train_kept"] += (r.get("seconds") or 0) if e == "train" else 0
        s["blocked"] += (r.get("blocked_seconds") or 0) if e in ("save", "lost") else (r.get("wait_seconds") or 0)
        s["eval"] += (r.get("seconds") or 0) if e == "eval" else (r.get("eval_seconds") or 0)
        s["train_lost"] += (r.get("train_seconds") or 0) if e == "lost" else 0
    for s in segs:
        s["other"] = (s["last"] - s["start"]) - sum(s[k] for k in GOODPUT_PARTS[:-1])
    return segs if segs and all(s["known"] for s in segs) else []


def goodput_script(data, terminal, out):
    colors = ("#2ca02c", "#d62728", "#1f77b4", "#ff7f0e", "#9467bd", "#7f7f7f")
    titles = ("training kept", "training lost (redone)", "saves (blocking)", "start-up + load", "evaluation", "other")
    plots = [f"'{data}' using {i + 2}{':xtic(1)' if i == 0 else ''} title '{t}' lc rgb '{c}'"
             for i, (t, c) in enumerate(zip(titles, colors))]
    return "\n".join([f"set terminal {terminal}", f"set output '{out}'", "set title 'h5ddp run: time per segment'",
                      "set style data histograms", "set style histogram rowstacked", "set style fill solid border -1",
                      "set boxwidth 0.6", "set ylabel 'seconds'", "set xlabel 'segment (process start to last record)'",
                      "set key outside right", "set yrange [0:*]", "plot " + ", ".join(plots)]) + "\n"


def plot_goodput(gnuplot, segs, prefix, tmp):
    data = os.path.join(tmp, "goodput.dat")
    with open(data, "w") as f:
        for i, s in enumerate(segs, 1):
            f.write(f"{i} " + " ".join(repr(max(0.0, s[k])) for k in GOODPUT_PARTS) + "\n")
    for terminal, ext in (("pngcairo size 800,500", "png"), ("svg size 800,500 dynamic", "svg")):
        out = f"{prefix}-goodput.{ext}"
        p = subprocess.run([gnuplot], input=goodput_script(data, terminal, out), text=True, capture_output=True,
                           timeout=60)
        if p.returncode != 0 or not os.path.isfile(out):
            fail(f"gnuplot failed writing {out}: {p.stderr.strip()}")
        print(out)
    kept, wall = sum(s["train_kept"] for s in segs), sum(s["last"] - s["start"] for s in segs)
    print(f"goodput {100 * kept / wall if wall > 0 else 0:.1f}% over {len(segs)} segments")


def gnuplot_script(data_train, data_eval, data_grad, restarts, terminal, out, kind, ppl_tics, norms, skips,
                   max_step, max_lr):
    panels = 1 + (kind is not None) + bool(norms or skips)
    lines = [
        f"set terminal {terminal}",
        f"set output '{out}'",
        "set datafile missing '?'",
        f"set multiplot layout {panels},1 title 'h5ddp run' font ',12'",
        "set lmargin 10",  # the same margins in every panel, so that their step axes line up
        "set rmargin 12",
        "set grid",
        "set xlabel 'step'",
        "set ylabel 'loss'",
        "set y2label 'learning rate'",
        "set ytics nomirror",
        "set y2tics",
        "set key top right",
        f"set xrange [0:{max_step}]",
        f"set y2range [0:{max_lr * 1.15!r}]",
    ]
    marks = []
    for i, (step, before, after) in enumerate(restarts):
        marks.append(f"set arrow {i + 1} from {step}, graph 0 to {step}, graph 1 nohead dt 2 lc rgb '#d62728'")
        marks.append(f"set label {i + 1} 'restart {before}->{after} ranks' at {step}, graph 0.95 "
                     f"rotate by 90 right offset -0.8,0 font ',8' tc rgb '#d62728'")
    lines += marks
    lines.append(f"plot '{data_train}' using 1:2 with lines lw 1.5 title 'loss (train, mean over ranks)', "
                 f"'{data_train}' using 1:3 axes x1y2 with lines lw 1.5 dt 3 title 'learning rate'")
    lines += ["unset y2tics", "unset y2label", "set ytics mirror", "set autoscale y2"]
    # A second panel for the evaluations; without them the loss panel is the whole picture.
    if kind == "accuracy":
        lines += ["set ylabel 'test accuracy'", "set key bottom right",
                  f"plot '{data_eval}' using 1:2 with linespoints pt 7 title 'test accuracy (evaluation)'"]
    elif kind == "lm":  # perplexity = exp(loss): one curve, read on either axis
        lines += ["set ylabel 'test loss (per token)'", "set y2label 'perplexity'", "set ytics nomirror",
                  "set link y2 via exp(y) inverse log(y)",
                  ("set y2tics (" + ", ".join(f"'{t:g}' {t!r}" for t in ppl_tics) + ")") if ppl_tics
                  else "set y2tics", "set key top right",
                  f"plot '{data_eval}' using 1:2 with linespoints pt 7 title 'test loss (evaluation); "
                  "right axis: perplexity = exp(loss)'",
                  "unset link y2", "unset y2tics", "unset y2label", "set ytics mirror"]
    elif kind == "loss":
        lines += ["set ylabel 'test loss'", "set key top right",
                  f"plot '{data_eval}' using 1:2 with linespoints pt 7 title 'test loss (evaluation)'"]
    if norms or skips:  # --grad-clip
        plots = []
        if norms:
            lines += ["set ylabel 'gradient norm'"]
            plots.append(f"'{data_grad}' using 1:2 with lines lw 1.5 lc rgb '#2ca02c' "
                         "title 'gradient norm before clipping (mean over the interval)'")
        if skips:  # on the right axis beside the norm, else alone
            axis = "x1y2" if norms else "x1y1"
            lines += ["set ytics nomirror", "set y2label 'skipped steps'", "set y2tics", "set y2range [0:*]"] if norms \
                else ["set ylabel 'skipped steps'", "set yrange [0:*]"]
            plots.append(f"'{data_grad}' using 1:3 axes {axis} with impulses lw 3 lc rgb '#d62728' "
                         "title 'steps skipped (norm not finite), per interval'")
        lines += ["set key top right", "plot " + ", ".join(plots)]
    lines.append("unset multiplot")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="output prefix (default RUN_DIR/run)")
    args = ap.parse_args()
    records = read_log(os.path.join(args.run_dir, "metrics.jsonl"))
    train, evals, restarts = series(records)
    kind = eval_kind(evals) if evals else None
    if kind and all(r.get("accuracy" if kind == "accuracy" else "loss") is None for r in evals):
        kind = None  # nothing finite to draw (null: not finite in the run)
    grads = grad_series(records)
    norms = any(g is not None for _, g, _ in grads)
    skips = sum(k for _, _, k in grads)
    if not train:
        fail(f"{args.run_dir}/metrics.jsonl has no training records")
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        fail("gnuplot not found (apt-get install gnuplot-nox)")
    prefix = args.out or os.path.join(args.run_dir, "run")
    with tempfile.TemporaryDirectory() as tmp:
        data_train, data_eval = os.path.join(tmp, "train.dat"), os.path.join(tmp, "eval.dat")
        data_grad = os.path.join(tmp, "grad.dat")
        with open(data_train, "w") as f:
            f.writelines(f"{s} {loss!r} {lr!r}\n" for s, loss, lr in sorted(train))
        with open(data_eval, "w") as f:
            column = "accuracy" if kind == "accuracy" else "loss"
            f.writelines(f"{r['step']} {value(r.get(column))}\n" for r in sorted(evals, key=lambda r: r["step"]))
        with open(data_grad, "w") as f:
            f.writelines(f"{s} {value(g)} {k}\n" for s, g, k in sorted(grads, key=lambda t: t[0]))
        height = 1100 if (norms or skips) and kind is not None else 800
        losses = [r["loss"] for r in evals if r.get("loss") is not None]
        ppl_tics = perplexity_tics(losses) if kind == "lm" and losses else []
        for terminal, ext in ((f"pngcairo size 1000,{height}", "png"), (f"svg size 1000,{height} dynamic", "svg")):
            out = f"{prefix}.{ext}"
            script = gnuplot_script(data_train, data_eval, data_grad, restarts, terminal, out, kind, ppl_tics,
                                    norms, skips, max(s for s, _, _ in train),
                                    max(lr for _, _, lr in train) or 1.0)
            p = subprocess.run([gnuplot], input=script, text=True, capture_output=True, timeout=60)
            if p.returncode != 0 or not os.path.isfile(out):
                fail(f"gnuplot failed writing {out}: {p.stderr.strip()}")
            print(out)
        segs = goodput_segments(records)
        if segs:
            plot_goodput(gnuplot, segs, prefix, tmp)
    print(f"{len(train)} training records, {len(evals)} evaluations, {len(restarts)} restarts"
          + (f", {skips} skipped steps" if grads else ""))


if __name__ == "__main__":
    main()
