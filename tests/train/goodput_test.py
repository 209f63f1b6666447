#!/usr/bin/env python3
"""Issue 60 through h5ddp-train and h5ddp-ckpt goodput: a run SIGKILLed twice and resumed, accounted; bad input;
--checkpoint-every-steps auto end to end. One ctest per case:
  goodput_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix
Runs are the fault tests' tiny MLP on a 4096-image Fashion-MNIST (tests/support/h5ddp_test.py); every subprocess
is bounded. No assertion depends on how fast the machine is."""
import json
import math
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
PLOT = os.path.join(HERE, "..", "..", "tools", "plot_run.py")
LAUNCH = 300  # seconds for one launch: generous, the machine may run at load 8


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def last_train_step(run_dir):
    try:
        steps = [r["step"] for r in records(os.path.join(run_dir, "metrics.jsonl")) if r["event"] == "train"]
    except (OSError, ValueError):  # not written yet, or a line half-written as we read
        return 0
    return max(steps, default=0)


def goodput(path, *extra):
    return ht.run([ht.tool("h5ddp-ckpt"), "goodput", path, *extra], 60)


def kill_at(run_dir, step, steps):
    """Starts a run of `steps` steps (saves every 4, 100 ms steps), SIGKILLs every rank once its log holds a train
    record at `step` or later, and returns (last train step logged, a copy of the log before the restart)."""
    job = ht.Job(NP, ht.train_args(run_dir, steps, every=4, extra=["--step-sleep-ms", "100"]))
    job.wait_for(lambda: last_train_step(run_dir) >= step, LAUNCH, f"a train record at step {step}")
    job.kill()
    copy = os.path.join(run_dir, f"metrics-before-restart-{step}.json")
    shutil.copy(os.path.join(run_dir, "metrics.jsonl"), copy)
    return last_train_step(run_dir), copy


def dropped_train_seconds(log_copy, resumed_step):
    return sum(r["seconds"] for r in records(log_copy) if r["event"] == "train" and r["step"] > resumed_step)


def test_killed_twice_accounted():
    """A run of 24 steps (saves every 4) SIGKILLed after step 5 and after step 13, resumed each time: the report has 3 segments that
    begin at step 0 and at the two resume steps; each killed segment's lost steps are the steps it trained past the
    checkpoint it resumed from (last train step logged before the kill - resume step), its lost seconds the training
    seconds of exactly those records; kept + lost + blocked saves + start-up + eval add up to the wall time within 2%
    (h5ddp-train's own end-of-run line and plot_run.py's bars say the same run goodput). Catches: a resume that drops the redone steps'
    time, segments merged or missed, a process start or a killed segment's end not recorded, time counted twice."""
    d = ht.scratch("goodput-killed")
    kills = [kill_at(d, 5, 24)]  # a step after a save: the kill would have to come 3 steps late to lose nothing
    kills.append(kill_at(d, 13, 24))
    r = ht.mpirun(NP, ht.train_args(d, 24, every=4), LAUNCH)
    ht.check(r.rc == 0, f"the last restart failed: {r}")
    resumes = [x["step"] for x in records(os.path.join(d, "metrics.jsonl")) if x["event"] == "resume"]
    ht.check(len(resumes) == 2 and all(s % 4 == 0 for s in resumes), f"resume steps {resumes}")
    p = goodput(d, "--json")
    ht.check(p.rc == 0, f"h5ddp-ckpt goodput failed: {p}")
    a = json.loads(p.out)
    segs = a["segments"]
    ht.check([s["first_step"] for s in segs] == [0] + resumes, f"segments {[s['first_step'] for s in segs]}")
    ht.check([s["ended"] for s in segs] == ["killed", "killed", "end"], f"{[s['ended'] for s in segs]}")
    for seg, (last, copy), resumed in zip(segs, kills, resumes):
        redone = last - resumed
        ht.check(seg["lost_steps"] == redone and (redone == 0 or seg["lost_first"] == resumed + 1),
                 f"segment {seg['index']}: lost {seg['lost_steps']} steps, the run redid {redone} ({resumed + 1}.."
                 f"{last})")
        want = dropped_train_seconds(copy, resumed)
        ht.check(math.isclose(seg["train_lost"], want, abs_tol=1e-5),  # the report has 6 decimals
                 f"segment {seg['index']}: lost {seg['train_lost']} s, the dropped records held {want} s")
        ht.check(seg["process_start"] < seg["last_time"], f"segment {seg['index']}: {seg}")
    ht.check(a["total"]["lost_steps"] == sum(k[0] for k in kills) - sum(resumes), f"{a['total']}")
    t = a["total"]
    named = t["train_kept"] + t["train_lost"] + t["blocked"] + t["startup"] + t["eval"]
    walls = sum(s["last_time"] - s["process_start"] for s in segs)
    ht.check(math.isclose(t["wall"], walls, abs_tol=1e-4), f"total wall {t['wall']} != {walls}")
    ht.check(abs(named - t["wall"]) <= 0.02 * t["wall"], f"the parts add up to {named} s of {t['wall']} s: {t}")
    ht.check(all(g > 0 for g in a["gaps"]) and len(a["gaps"]) == 2, f"gaps {a['gaps']}")
    ht.check(f"the run {100 * t['goodput']:.1f}% over 3 segments" in r.text, f"no goodput line: {r}")
    ht.check(t["lost_steps"] > 0, f"no step lost to two kills: {a}")
    text = goodput(d)
    lost = [f"lost: steps {s + 1}-{k[0]} ({k[0] - s})" for k, s in zip(kills, resumes) if k[0] > s]
    ht.check(text.rc == 0 and all(x in text.out for x in lost), f"the report lacks {lost}: {text}")
    plot = ht.run([sys.executable, PLOT, d, "--out", os.path.join(d, "plot")], 120)
    ht.check(plot.rc == 0 and f"goodput {100 * t['goodput']:.1f}% over 3 segments" in plot.out, f"plot: {plot}")
    with open(os.path.join(d, "plot-goodput.png"), "rb") as f:
        ht.check(f.read(8) == b"\x89PNG\r\n\x1a\n", "plot-goodput.png is not a PNG")
    return (f"lost {[s['lost_steps'] for s in segs]} steps; parts {named:.2f} of {t['wall']:.2f} s; "
            f"goodput {t['goodput']:.3f}")


def test_bad_input():
    """--mtbf 0, -5, abc and --checkpoint-every-steps auto without --mtbf are one clear error naming the option
    (exit 2, nothing trained); h5ddp-ckpt goodput on a run dir without a metrics log (--no-metrics) says so, exit 1.
    Catches: a zero or negative MTBF accepted (an interval of 1 step or a division by zero), auto silently off."""
    d = ht.scratch("goodput-bad")
    base = [ht.tool("h5ddp-train"), "--run-dir", d, "--checkpoint-every-steps", "auto"]
    for mtbf, say in (("0", "--mtbf 0: must be a duration > 0"), ("-5", "--mtbf -5: must be a duration > 0"),
                      ("abc", "--mtbf abc: must be a duration > 0"), (None, "auto: needs --mtbf DURATION")):
        r = ht.run(base + (["--mtbf", mtbf] if mtbf else []), 60)
        ht.check(r.rc == 2 and say in r.err and r.err.count("h5ddp-train:") == 1, f"--mtbf {mtbf}: {r}")
    ht.check(not os.listdir(d), f"a refused run wrote into its run dir: {os.listdir(d)}")
    r = ht.mpirun(NP, ht.train_args(d, 2, extra=["--no-metrics"]), LAUNCH)
    ht.check(r.rc == 0, f"--no-metrics run failed: {r}")
    p = goodput(d)
    ht.check(p.rc == 1 and "no metrics log" in p.err and not p.out, f"goodput of a run without metrics: {p}")
    return "refused with one message each; no metrics said"


def test_auto_interval():
    """--checkpoint-every-steps auto --mtbf 2s: the first save at step 10, each later one the interval the
    'interval' record before it chose, that interval = round(sqrt(2 x save x MTBF) / step) of the record's own
    save and step seconds, printed on the console and recorded in the checkpoint's /meta checkpoint_every_steps;
    a resume starts from the checkpoint's interval. Catches: the interval not applied, not recorded, not
    re-estimated, the formula wrong, ranks saving at different steps (a hang or a failed save)."""
    d = ht.scratch("goodput-auto")
    r = ht.mpirun(NP, ht.train_args(d, 60, every="auto", extra=["--mtbf", "2s", "--step-sleep-ms", "20"]), LAUNCH)
    ht.check(r.rc == 0, f"auto run failed: {r}")
    log = records(os.path.join(d, "metrics.jsonl"))
    chosen = [x for x in log if x["event"] == "interval"]
    ht.check(chosen and chosen[0]["step"] == 0 and chosen[0]["every_steps"] == 10, f"first interval {chosen[:1]}")
    ht.check("checkpoint interval: 10 steps (auto, MTBF 2 s; until the first save is measured)" in r.text, f"{r}")
    saves = [x["step"] for x in log if x["event"] == "save"]
    want, at = [], 0
    for c in chosen:  # each interval record follows a save (the first: the start) and plans the next one
        ht.check(c["step"] == at, f"interval record at step {c['step']}, the last save was at {at}: {chosen}")
        if c["save_seconds"] > 0:
            n = max(1, round(math.sqrt(2 * c["save_seconds"] * c["mtbf_seconds"]) / c["step_seconds"]))
            ht.check(c["every_steps"] == n and c["mtbf_seconds"] == 2, f"{c}: Young/Daly says {n}")
        at += c["every_steps"]
        if at < 60:
            want.append(at)
    ht.check(saves == want + [60], f"saves at {saves}, the intervals planned {want} and the final 60")
    ht.check(len(chosen) >= 2, f"no re-estimate after the first save: {chosen}")
    for c in chosen:
        if c["step"] + c["every_steps"] < 60:
            meta = ht.attrs(ht.ckpt(d, c["step"] + c["every_steps"]), "meta")
            ht.check(meta.get("checkpoint_every_steps") == str(c["every_steps"]), f"/meta {meta}, record {c}")
    for before, c in zip(chosen, chosen[1:]):  # a changed interval is said on the console
        ht.check(c["every_steps"] == before["every_steps"] or
                 f"checkpoint interval: {c['every_steps']} steps (auto: save blocks" in r.text, f"{c} not said: {r}")
    last = ht.attrs(ht.ckpt(d, 60), "meta")["checkpoint_every_steps"]
    r = ht.mpirun(NP, ht.train_args(d, 62, every="auto", extra=["--mtbf", "2s"]), LAUNCH)
    ht.check(r.rc == 0 and f"checkpoint interval: {last} steps (auto, MTBF 2 s; the resumed checkpoint's" in r.text,
             f"the resume did not start from /meta's {last}: {r}")
    return f"intervals {[c['every_steps'] for c in chosen]}, saves {saves}"


TESTS = [test_killed_twice_accounted, test_bad_input, test_auto_interval]

if __name__ == "__main__":
    ht.cli(TESTS)
