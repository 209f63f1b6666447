#!/usr/bin/python3
"""Plots a run from its metrics log (RUN_DIR/metrics.jsonl, docs/METRICS.md) with gnuplot:
loss (left axis) and learning rate (right axis) against step, test accuracy of the evaluations, and a
vertical mark at every restart labelled with the world size before and after.

  tools/plot_run.py RUN_DIR [--out PREFIX]      writes PREFIX.png and PREFIX.svg (default RUN_DIR/run)

Needs gnuplot (Debian: gnuplot-nox). Exit 1 with one line when the log is missing, empty or has no
training records, or gnuplot fails.
"""
import argparse
import json
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
    evals = [(r["step"], r["accuracy"]) for r in records if r.get("event") == "eval"]
    restarts = [(r["step"], r.get("saved_world_size", 0), r["world_size"]) for r in records
                if r.get("event") == "resume"]
    return train, evals, restarts


def gnuplot_script(data_train, data_eval, restarts, terminal, out, has_eval, max_step, max_lr):
    lines = [
        f"set terminal {terminal}",
        f"set output '{out}'",
        f"set multiplot layout {2 if has_eval else 1},1 title 'h5ddp run' font ',12'",
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
    if has_eval:  # a second panel; without evaluations the loss panel is the whole picture
        lines += ["unset y2tics", "unset y2label", "set ytics mirror", "set ylabel 'test accuracy'",
                  "set key bottom right",
                  f"plot '{data_eval}' using 1:2 with linespoints pt 7 title 'test accuracy (evaluation)'"]
    lines.append("unset multiplot")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="output prefix (default RUN_DIR/run)")
    args = ap.parse_args()
    records = read_log(os.path.join(args.run_dir, "metrics.jsonl"))
    train, evals, restarts = series(records)
    if not train:
        fail(f"{args.run_dir}/metrics.jsonl has no training records")
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        fail("gnuplot not found (apt-get install gnuplot-nox)")
    prefix = args.out or os.path.join(args.run_dir, "run")
    with tempfile.TemporaryDirectory() as tmp:
        data_train, data_eval = os.path.join(tmp, "train.dat"), os.path.join(tmp, "eval.dat")
        with open(data_train, "w") as f:
            f.writelines(f"{s} {loss!r} {lr!r}\n" for s, loss, lr in sorted(train))
        with open(data_eval, "w") as f:
            f.writelines(f"{s} {a!r}\n" for s, a in sorted(evals))
        for terminal, ext in (("pngcairo size 1000,800", "png"), ("svg size 1000,800 dynamic", "svg")):
            out = f"{prefix}.{ext}"
            script = gnuplot_script(data_train, data_eval, restarts, terminal, out, bool(evals),
                                    max(s for s, _, _ in train), max(lr for _, _, lr in train) or 1.0)
            p = subprocess.run([gnuplot], input=script, text=True, capture_output=True, timeout=60)
            if p.returncode != 0 or not os.path.isfile(out):
                fail(f"gnuplot failed writing {out}: {p.stderr.strip()}")
            print(out)
    print(f"{len(train)} training records, {len(evals)} evaluations, {len(restarts)} restarts")


if __name__ == "__main__":
    main()
