#!/usr/bin/env python3
"""Issue 24 through h5ddp-train: the metrics log across restarts and its plot, evaluation during training
with --keep-best, the lr schedule's horizon kept on resume, warmup, and --grad-accum. One ctest per case:
  metrics_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix
Runs are the small MLP of promises_test.py (784->32->10, --no-fsync); every subprocess is bounded."""
import json
import os
import re
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
import h5ddp_test as ht  # noqa: E402
import promises_test as pt  # noqa: E402

NP = pt.NP
PLOT = os.path.join(HERE, "..", "..", "tools", "plot_run.py")


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def events(run_dir, kind):
    return [r for r in records(run_dir) if r["event"] == kind]


def test_restarts_logged_once_and_plotted():
    """A run resumed at step 6 dies while saving step 9 (SIGKILL, test hook), then restarts at 1 rank from
    step 6 again: the log holds every step 1..12 exactly once, in order (the killed run's steps 7-9 are gone),
    two 'resume' records (2 -> 2 and 2 -> 1 ranks), and plot_run.py draws PNG and SVG with the restarts marked.
    Catches: records of redone steps kept (duplicates or contradictions), a restart not logged, the plot
    missing its marks."""
    d = ht.scratch("metrics-restarts")
    common = ["--max-steps", 6, "--checkpoint-every-steps", 3, "--keep-last", 0]
    pt.train(d, *common)
    r = ht.mpirun(NP, pt.args(d, "--max-steps", 12, "--checkpoint-every-steps", 3, "--keep-last", 0), pt.LAUNCH,
                  {"H5DDP_FAULT_INJECT": "mid_data:all", "H5DDP_TEST_HOOKS": "1"})
    ht.check(r.rc != 0, f"the run with a fault injected at its save of step 9 succeeded: {r}")
    killed = [x["step"] for x in events(d, "train")]
    ht.check(9 in killed, f"the killed run logged no step 9 before its save: {killed}")
    r = ht.mpirun(1, pt.args(d, "--max-steps", 12, "--keep-last", 0), pt.LAUNCH)
    ht.check(r.rc == 0, f"restart at 1 rank failed: {r}")
    steps = [x["step"] for x in events(d, "train")]
    ht.check(steps == list(range(1, 13)), f"train records by step {steps}, expected 1..12 once each")
    resumes = [(x["step"], x["saved_world_size"], x["world_size"]) for x in events(d, "resume")]
    ht.check(resumes == [(6, NP, NP), (6, NP, 1)], f"resume records {resumes}")
    saves = [x["step"] for x in events(d, "save")]
    ht.check(saves == [3, 6, 12], f"save records by step {saves}, expected 3, 6, 12 (the killed save never logged)")
    p = subprocess.run([sys.executable, PLOT, d, "--out", os.path.join(d, "plot")], capture_output=True, text=True,
                       timeout=120)
    ht.check(p.returncode == 0, f"plot_run.py failed: {p.stdout}{p.stderr}")
    with open(os.path.join(d, "plot.png"), "rb") as f:
        ht.check(f.read(8) == b"\x89PNG\r\n\x1a\n", "plot.png is not a PNG")
    with open(os.path.join(d, "plot.svg")) as f:
        svg = f.read().replace("&gt;", ">")
    ht.check(f"restart {NP}->1 ranks" in svg and f"restart {NP}->{NP} ranks" in svg, "the SVG lacks a restart mark")
    ht.check("12 training records, 0 evaluations, 2 restarts" in p.stdout, p.stdout)
    return f"steps 1..12 once, {len(resumes)} restarts marked"


def test_stop_signal_logged():
    """SIGUSR1 to every rank mid-run: exit 75, and the log ends with the signal's save and a 'stop' record
    (exit code 75, the checkpoint) at the step it stopped. Catches: a stop not logged, a save not logged."""
    d = ht.scratch("metrics-stop")
    fired = threading.Event()

    def on_line(stream, line):
        if stream == "out" and re.match(r"step 3/", line) and not fired.is_set():
            fired.set()
            subprocess.run(["pkill", "-USR1", "-f", f"h5ddp-train --run-dir {d} "], timeout=10)

    r = ht.mpirun_watch(NP, pt.args(d, "--max-steps", 40, "--step-sleep-ms", 150), pt.LAUNCH, on_line)
    ht.check(fired.is_set() and r.rc == 75, f"exit code {r.rc} after SIGUSR1, expected 75: {r}")
    recs = records(d)
    stop = recs[-1]
    ht.check(stop["event"] == "stop" and stop["exit_code"] == 75, f"last record {stop}")
    saves = [x for x in recs if x["event"] == "save"]
    ht.check(saves and saves[-1]["step"] == stop["step"] and stop["checkpoint"].endswith(
        f"ckpt-{stop['step']:08d}.h5"), f"save records {saves}, stop {stop}")
    ht.check(os.path.isfile(stop["checkpoint"]), f"{stop['checkpoint']} missing")
    return f"stopped at step {stop['step']}"


def test_eval_and_keep_best():
    """--eval-every-steps 4 --keep-best --keep-last 1 over 18 steps: an 'eval' record every 4 steps; RUN_DIR/best
    names a checkpoint that still exists whose meta says the best accuracy of the log; retention kept it beside
    the newest (step 18, after the last evaluation, so the best is never the newest).
    Catches: evaluations missing or per-rank, best not kept by retention, best not the maximum."""
    d = ht.scratch("metrics-best")
    pt.train(d, "--max-steps", 18, "--eval-every-steps", 4, "--keep-best", "--keep-last", 1,
             "--checkpoint-every-steps", 2, "--lr", "0.01")
    evals = events(d, "eval")
    ht.check([e["step"] for e in evals] == [4, 8, 12, 16], f"eval steps {[e['step'] for e in evals]}")
    best_acc = max(e["accuracy"] for e in evals)
    with open(os.path.join(d, "best")) as f:
        name, acc = f.read().split()
    ht.check(abs(float(acc) - best_acc) < 1e-6, f"best says {acc}, the log's best is {best_acc}")
    best_step = [e["step"] for e in evals if e["accuracy"] == best_acc][0]
    ht.check(name == f"ckpt-{best_step:08d}.h5", f"best names {name}, the best evaluation was at {best_step}")
    ht.check(os.path.isfile(os.path.join(d, name)), f"retention removed the best checkpoint {name}")
    meta = ht.attrs(os.path.join(d, name), "meta")
    ht.check(abs(float(meta["eval_accuracy"]) - best_acc) < 1e-6 and int(meta["eval_step"]) == best_step,
             f"meta of {name}: {meta}")
    left = sorted(f for f in os.listdir(d) if f.startswith("ckpt-"))
    ht.check(set(left) == {name, "ckpt-00000018.h5"}, f"files left {left}")
    return f"best {best_acc:.4f} at step {best_step}"


def test_schedule_horizon_kept_on_resume():
    """A cosine run of 12 steps saved at 6. Resumed with --max-steps 20: steps 7..12 get the uninterrupted run's
    lrs exactly and steps past the horizon lr 0, with a note; with --replan-lr-schedule they differ; asking for
    another schedule without it is an error naming the option. Catches: raising --max-steps stretching the
    planned lrs silently."""
    a = ht.scratch("horizon-a")
    common = ["--lr-schedule", "cosine", "--keep-last", 0]
    pt.train(a, *common, "--max-steps", 12, "--checkpoint-every-steps", 6)
    lr_a = {x["step"]: x["lr"] for x in events(a, "train")}
    b = ht.copy_with([ht.ckpt(a, 6)], "horizon-b")
    r = pt.train(b, *common, "--max-steps", 20)
    ht.check("keeps the checkpoint's horizon of 12 steps" in r.text, f"no horizon note: {r}")
    lr_b = {x["step"]: x["lr"] for x in events(b, "train")}
    ht.check(all(lr_b[s] == lr_a[s] for s in range(7, 13)), f"lrs 7..12 changed: {lr_a} vs {lr_b}")
    ht.check(all(lr_b[s] == 0 for s in range(14, 21)), f"lrs past the horizon: {lr_b}")
    c = ht.copy_with([ht.ckpt(a, 6)], "horizon-c")
    pt.train(c, *common, "--max-steps", 20, "--replan-lr-schedule")
    lr_c = {x["step"]: x["lr"] for x in events(c, "train")}
    ht.check(lr_c[7] > lr_a[7], f"--replan-lr-schedule did not stretch the schedule: {lr_c[7]} vs {lr_a[7]}")
    e = ht.copy_with([ht.ckpt(a, 6)], "horizon-e")
    r = pt.train(e, "--lr-schedule", "constant", "--keep-last", 0, "--max-steps", 12, expect_rc=1)
    ht.check("--replan-lr-schedule" in r.text and "cosine" in r.text, f"no clear error: {r}")
    return "planned lrs kept; re-plan and a changed schedule behave"


def test_warmup():
    """--lr-warmup-steps 4 --lr 0.01: the lrs of steps 1..6 are 0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01 in the log
    and the checkpoint at step 2 records the warmup and the lr of its next step. Catches: no warmup, off by one."""
    d = ht.scratch("warmup")
    pt.train(d, "--lr", "0.01", "--lr-warmup-steps", 4, "--max-steps", 6, "--checkpoint-every-steps", 2,
             "--keep-last", 0)
    lrs = [x["lr"] for x in events(d, "train")]
    want = [0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01]
    ht.check(all(pt.close(a, b) for a, b in zip(lrs, want)) and len(lrs) == 6, f"lrs {lrs}, expected {want}")
    sched = ht.attrs(ht.ckpt(d, 2), "train/lr_scheduler")
    ht.check(sched["warmup_steps"] == 4 and pt.close(sched["lr"], 0.0075), f"scheduler attributes {sched}")
    return "warmup lrs as planned"


def test_grad_accum():
    """--grad-accum 2 (gradients of two micro-batches accumulated under no_sync, reduced once) trains like
    --grad-accum 1 up to summation order (plain SGD, no dropout: weights within 1e-6 relative); a K that does not
    divide the per-rank batch is a clear error. Catches: a micro-batch lost, the loss not scaled by 1/K,
    gradients reduced K times."""
    one, two = ht.scratch("accum-1"), ht.scratch("accum-2")
    pt.train(one, *pt.PLAIN_SGD, "--max-steps", 4, "--keep-last", 0)
    pt.train(two, *pt.PLAIN_SGD, "--max-steps", 4, "--keep-last", 0, "--grad-accum", 2)
    r = ht.compare(ht.ckpt(one, 4), ht.ckpt(two, 4), "--rtol", "1e-6", "--atol", "1e-9")
    ht.check(r.rc == 0, f"--grad-accum 2 differs from 1: {r}")
    bad = ht.scratch("accum-bad")
    r = pt.train(bad, "--max-steps", 2, "--grad-accum", 3, expect_rc=1)
    ht.check("--grad-accum 3 does not divide" in r.text, f"no clear error: {r}")
    return "accumulated == plain within 1e-6; bad K refused"


TESTS = [test_restarts_logged_once_and_plotted, test_stop_signal_logged, test_eval_and_keep_best,
         test_schedule_horizon_kept_on_resume, test_warmup, test_grad_accum]

if __name__ == "__main__":
    ht.cli(TESTS)
