#!/usr/bin/python3
"""Does --checkpoint-every-steps auto --mtbf M reach the goodput of the best fixed interval? (issue 60)

A SIMULATION driven by costs measured from a real run, not a sweep of real killed runs:
 1. measure (skipped with --from-run RUN_DIR): one real h5ddp-train run (mpirun -np NP, --model mlp, the default
    1024x1024 MLP, batch 120, --checkpoint-every-steps auto --mtbf M, --log-every 1, fsync on) SIGKILLed at about
    half of its steps and resumed to the end. From its metrics log: the step times (train records: seconds / steps),
    every save's blocking time (save records' blocked_seconds), the restart cost (start-up + load of the resumed
    segment, `h5ddp-ckpt goodput --json`), and the intervals the real trainer chose.
 2. simulate: a job of --job-mtbfs x M seconds of fault-free training, failures drawn from an exponential
    distribution of mean M on the segments' clock (queue waits between segments are not counted: goodput's
    denominator is the segments' time), --trials jobs per policy with fixed seeds (trial i draws the same failure
    sequence under every policy). A failure loses the steps since the last completed save; each segment first pays a
    restart cost drawn from the measured ones (the first segment too); each interval's steps take n x mean step
    +- sqrt(n) x its standard deviation; each save blocks for a cost drawn from the measured ones (sync saves: a
    save is durable when it returns). Policies: every fixed interval of a geometric grid around Young's, and auto as
    src/train/auto_interval.cpp does it (the first interval 10 steps, then round(sqrt(2 x C x M) / t) after every
    save, C the measured save costs smoothed half and half, t the mean step time since the last save; a resume
    starts from the interval that scheduled its checkpoint, with no save measured).
Prints a markdown table (interval, goodput mean and its 95% interval over the trials) and auto against the best
fixed; writes PREFIX.dat and PREFIX.png (gnuplot) of the curve.

  tools/bench/goodput_sweep.py BUILD_DIR [--np 2] [--mtbf 60] [--trials 200] [--seed 1] [--out PREFIX]
  tools/bench/goodput_sweep.py BUILD_DIR --from-run RUN_DIR ...     costs from an earlier measurement's run dir
"""
import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def env():
    e = dict(os.environ)
    for k, v in (("OMP_NUM_THREADS", "1"), ("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                 ("OMPI_MCA_rmaps_base_oversubscribe", "1"), ("HDF5_USE_FILE_LOCKING", "FALSE")):
        e.setdefault(k, v)
    return e


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def measure(build, np_, mtbf, steps, run_dir):
    """The real run: started, SIGKILLed (its process group) once its log holds step steps/2, resumed to the end."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_),
           os.path.join(build, "tools", "h5ddp-train"), "--run-dir", run_dir, "--model", "mlp", "--no-eval",
           "--max-steps", str(steps), "--checkpoint-every-steps", "auto", "--mtbf", str(mtbf), "--log-every", "1",
           "--keep-last", "2", "--threads", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if any(r["event"] == "train" and r["step"] >= steps // 2 for r in records(run_dir)):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600)
    if r.returncode != 0:
        sys.exit(f"goodput_sweep: the resumed run failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    print("real run, end of its output:\n    " + "\n    ".join(r.stdout.strip().splitlines()[-2:]))


def costs(build, run_dir):
    """Step times, save costs and restart costs of a run dir's log, and the intervals its trainer chose."""
    recs = records(run_dir)
    per_step = [r["seconds"] / r["steps"] for r in recs if r["event"] == "train" and r.get("steps")]
    saves = [r["blocked_seconds"] for r in recs if r["event"] == "save"]
    g = subprocess.run([os.path.join(build, "tools", "h5ddp-ckpt"), "goodput", run_dir, "--json"], capture_output=True,
                       text=True, timeout=60)
    if g.returncode != 0:
        sys.exit(f"goodput_sweep: h5ddp-ckpt goodput failed: {g.stderr}")
    account = json.loads(g.stdout)
    restarts = [s["startup"] for s in account["segments"] if s["resumed"]] or \
        [s["startup"] for s in account["segments"]]
    chosen = [(r["step"], r["every_steps"]) for r in recs if r["event"] == "interval"]
    if not per_step or not saves:
        sys.exit(f"goodput_sweep: {run_dir} has no train or save records to measure")
    return {"step_mean": statistics.mean(per_step), "step_sd": statistics.pstdev(per_step), "saves": saves,
            "restarts": restarts, "chosen": chosen, "account": account}


class Fixed:
    def __init__(self, n):
        self.n = n

    def segment(self, resumed_step):
        pass

    def interval(self, step):  # h5ddp's fixed trigger: step % n == 0
        return self.n - step % self.n

    def observe(self, steps, seconds, save):
        pass


class Auto:
    """src/train/auto_interval.cpp and the trainer's use of it (start_auto_interval, replan_interval)."""

    def __init__(self, mtbf):
        self.mtbf, self.steps, self.meta = mtbf, 10, {}
        self.save = 0.0
        self.measured = False

    def segment(self, resumed_step):
        self.steps = self.meta.get(resumed_step, 10)  # the interval that scheduled the checkpoint resumed from
        self.measured = False

    def interval(self, step):
        return self.steps

    def observe(self, steps, seconds, save):
        """After a save at the end of `steps` steps taking `seconds`; the save blocked for `save`."""
        self.save = 0.5 * save + 0.5 * self.save if self.measured else save
        self.measured = True
        self.steps = max(1, round(math.sqrt(2 * self.save * self.mtbf) / max(seconds / steps, 1e-6)))


def job(policy, c, mtbf, work_steps, rng):
    """One job to work_steps steps under `policy`; returns (fault-free training seconds) / (segments' seconds)."""
    clock, done = 0.0, 0
    next_fail = rng.expovariate(1 / mtbf)
    meta_at = {}
    while done < work_steps:
        clock += rng.choice(c["restarts"])
        if clock > next_fail:  # killed during start-up
            clock, next_fail = next_fail, next_fail + rng.expovariate(1 / mtbf)
            continue
        if isinstance(policy, Auto):
            policy.meta = meta_at
        policy.segment(done)
        step = done
        while True:
            n = min(policy.interval(step), work_steps - step)
            compute = max(0.0, n * c["step_mean"] + math.sqrt(n) * c["step_sd"] * rng.gauss(0, 1))
            if clock + compute > next_fail:  # killed mid-interval: the steps since `done` are lost
                clock, next_fail = next_fail, next_fail + rng.expovariate(1 / mtbf)
                break
            clock += compute
            step += n
            if step >= work_steps:  # the job is complete (its final save is not counted)
                done = step
                break
            save = rng.choice(c["saves"])
            if clock + save > next_fail:  # killed while saving: that checkpoint never commits
                clock, next_fail = next_fail, next_fail + rng.expovariate(1 / mtbf)
                break
            clock += save
            done = step
            meta_at[done] = policy.interval(step - n) if isinstance(policy, Auto) else 0
            policy.observe(n, compute, save)
    return work_steps * c["step_mean"] / clock


def sweep(c, mtbf, trials, seed, job_mtbfs):
    work = max(1, round(job_mtbfs * mtbf / c["step_mean"]))
    young = max(1, round(math.sqrt(2 * statistics.mean(c["saves"]) * mtbf) / c["step_mean"]))
    grid = sorted({max(1, round(young * 2 ** (k / 2))) for k in range(-8, 9)})
    rows = []
    for name, make in [(n, lambda n=n: Fixed(n)) for n in grid] + [("auto", lambda: Auto(mtbf))]:
        g = [job(make(), c, mtbf, work, random.Random(seed * 100003 + i)) for i in range(trials)]
        half = 1.96 * statistics.stdev(g) / math.sqrt(trials) if trials > 1 else 0
        rows.append((name, statistics.mean(g), half))
    return young, work, rows


def plot(rows, young, mtbf, prefix):
    fixed = [r for r in rows if r[0] != "auto"]
    auto = [r for r in rows if r[0] == "auto"][0]
    with open(prefix + ".dat", "w") as f:
        f.write("# interval_steps goodput ci95\n")
        f.writelines(f"{n} {g!r} {h!r}\n" for n, g, h in fixed)
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("gnuplot not found: no plot")
        return
    script = "\n".join([
        "set terminal pngcairo size 800,480", f"set output '{prefix}.png'", "set logscale x 2", "set grid",
        f"set title 'simulated goodput against the checkpoint interval (MTBF {mtbf:g} s)'",
        "set xlabel 'checkpoint interval (steps)'", "set ylabel 'goodput'", "set key bottom center",
        "set offsets graph 0.02, graph 0.02, graph 0.05, graph 0.02",
        f"set arrow from {young}, graph 0 to {young}, graph 1 nohead dt 2 lc rgb '#7f7f7f'",
        f"plot '{prefix}.dat' using 1:2:3 with yerrorlines pt 7 title 'fixed interval (mean, 95% interval)', "
        f"{auto[1]!r} with lines lw 2 lc rgb '#d62728' title 'auto (Young/Daly from measured costs)'"])
    subprocess.run([gnuplot], input=script + "\n", text=True, check=True, timeout=60)
    print(f"wrote {prefix}.png")


def report(c, mtbf, trials, young, work, rows):
    print(f"\ncosts: step {c['step_mean'] * 1e3:.2f} ms (sd {c['step_sd'] * 1e3:.2f}), save blocked "
          f"{statistics.mean(c['saves']):.3f} s mean of {len(c['saves'])} ({min(c['saves']):.3f}-"
          f"{max(c['saves']):.3f}), restart {statistics.mean(c['restarts']):.2f} s; real trainer's intervals "
          f"{[n for _, n in c['chosen']]}")
    print(f"MTBF {mtbf:g} s, job {work} steps ({work * c['step_mean']:.0f} s fault-free), {trials} trials; "
          f"Young's interval from the mean costs: {young} steps\n")
    print("| interval (steps) | interval (s) | goodput | 95% interval |\n|---:|---:|---:|---:|")
    for n, g, h in rows:
        secs = f"{n * c['step_mean']:.2f}" if n != "auto" else "-"
        print(f"| {n} | {secs} | {g:.4f} | +-{h:.4f} |")
    best = max((r for r in rows if r[0] != "auto"), key=lambda r: r[1])
    auto = [r for r in rows if r[0] == "auto"][0]
    print(f"\nbest fixed: {best[0]} steps, goodput {best[1]:.4f}; auto {auto[1]:.4f} = "
          f"{100 * auto[1] / best[1]:.1f}% of it (within 5%: {'yes' if auto[1] >= 0.95 * best[1] else 'NO'})")
    return auto[1] >= 0.95 * best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--mtbf", type=float, default=60.0, help="mean time between failures, seconds (real run and "
                    "simulation)")
    ap.add_argument("--measure-steps", type=int, default=400)
    ap.add_argument("--from-run", help="take the costs from this run dir instead of measuring")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--job-mtbfs", type=float, default=20.0, help="fault-free job length in MTBFs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="goodput_sweep")
    a = ap.parse_args()
    run_dir = a.from_run
    if not run_dir:
        run_dir = tempfile.mkdtemp(prefix="goodput-sweep-")
        measure(a.build, a.np, a.mtbf, a.measure_steps, run_dir)
        print(f"measured in {run_dir}")
    c = costs(a.build, run_dir)
    young, work, rows = sweep(c, a.mtbf, a.trials, a.seed, a.job_mtbfs)
    ok = report(c, a.mtbf, a.trials, young, work, rows)
    plot(rows, young, a.mtbf, a.out)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
