#!/usr/bin/python3
"""What periodic checkpoints cost a training run end to end (issue 46), through h5ddp-train as a user runs it.

One configuration at a time, the same run in several save modes, in rotated order for --rounds rounds (so every
mode sees the same machine load), medians reported:
  none          --checkpoint-every-steps 0
  sync/mpiio    synchronous saves, tensor bytes through MPI-IO and the page cache (--checkpoint-write mpiio)
  sync/direct   synchronous saves, O_DIRECT writes (--checkpoint-write direct)
  async/mpiio   --async-checkpoint, MPI-IO writes
  async/direct  --async-checkpoint, O_DIRECT writes
Per mode: process wall time, end-to-end samples/s (steps x global batch / wall), the time training was blocked in
saves (rank 0's `save` records: for async the copy into the arena and any wait for the previous save), the bytes
written, the save cost (wall - wall of none) as a share of the same write mode's sync cost (when that is 1 s or
more), the CPU time (user +
system, all ranks) the run took beyond the run without saves (its system part in parentheses), and the **step
excess**: from rank 0's per-step records (`--log-every 1`), the loop's time minus its step count times its own median
step time, i.e. what the steps that were slower than usual cost. Measured within each run, it does not see the drift
of this VM's speed between runs (the wall time does), so its difference to none's is the save cost with the least
noise; saves after the last step's record (the last one) fall outside it in every mode alike. No final checkpoint;
saves fsync (the default); every run starts in a fresh run directory, removed afterwards.

  tools/bench/async_e2e.py BUILD_DIR [--ranks 1 2] [--configs heavy compute] [--rounds 3] [--dir /tmp/...]
Configurations (Fashion-MNIST, MLP, Adam):
  heavy    MLP 4096x4096x4096, ~0.45 GB of state, batch 8, 30 steps, a save every 6 (5 saves)
  compute  MLP 2048x2048, ~75 MB of state, batch 64, 100 steps, a save every 10 (10 saves)
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {
    "heavy": dict(hidden="4096,4096,4096", batch=8, steps=30, every=6),
    "compute": dict(hidden="2048,2048", batch=64, steps=100, every=10),
}
MODES = {
    "none": [],
    "sync/mpiio": ["--checkpoint-write", "mpiio"],
    "sync/direct": ["--checkpoint-write", "direct"],
    "async/mpiio": ["--async-checkpoint", "--checkpoint-write", "mpiio"],
    "async/direct": ["--async-checkpoint", "--checkpoint-write", "direct"],
}


def run_once(build, work, config, ranks, mode, tag):
    c = CONFIGS[config]
    run_dir = os.path.join(work, f"{config}-{ranks}-{mode.replace('/', '-')}-{tag}")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
           os.path.join(build, "tools", "h5ddp-train"), "--model", "mlp", "--mlp-hidden", c["hidden"],
           "--dropout", "0", "--batch-size", str(c["batch"]), "--max-steps", str(c["steps"]), "--no-eval",
           "--no-final-checkpoint", "--resume", "none", "--keep-last", "2", "--threads", "1",
           "--log-every", "1", "--run-dir", run_dir,
           "--checkpoint-every-steps", "0" if mode == "none" else str(c["every"])]
    cmd += MODES[mode]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
    sys_cpu = u1.ru_stime - u0.ru_stime
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    records = list(map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))))
    saves = [r for r in records if r["event"] == "save"]
    times = [r["time"] for r in records if r["event"] == "train"]
    dts = [b - a for a, b in zip(times, times[1:])]
    excess = sum(dts) - len(dts) * statistics.median(dts)
    shutil.rmtree(run_dir)
    return dict(wall=wall, excess=excess, cpu=cpu, sys=sys_cpu, blocked=sum(s["blocked_seconds"] for s in saves),
                bytes=sum(s["bytes"] for s in saves), saves=len(saves))


KEYS = ("wall", "excess", "cpu", "sys", "blocked", "bytes", "saves")


def table(results, config, ranks):
    c = CONFIGS[config]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in KEYS} for m, rs in results.items()}
    base = med["none"]
    saving = next(v for m, v in med.items() if m != "none")
    per_round = "; ".join(f"{m} " + " ".join(f"{r['wall']:.1f}/{r['excess']:.1f}" for r in rs)
                          for m, rs in results.items())
    print(f"\n{config}, {ranks} rank(s): MLP {c['hidden']}, batch {c['batch']}, {c['steps']} steps, "
          f"{int(saving['saves'])} saves of {saving['bytes'] / max(1, saving['saves']) / 1e6:.0f} MB "
          f"({len(results['none'])} rounds, medians; wall/step excess per round: {per_round})")
    print("| mode | wall (s) | samples/s | blocked in saves (s) | GB written | cost vs none (s) | cost / same "
          "method's sync | step excess (s) | excess beyond none (s) | excess / same method's sync | CPU s vs none "
          "(system) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m, v in med.items():
        cost = v["wall"] - base["wall"]
        sync = med.get("sync/" + m.split("/")[-1]) if m != "none" else None
        # A share of a sync cost inside the noise (under 1 s) would mean nothing: "-".
        share = share_x = "-"
        if sync and sync["wall"] - base["wall"] >= 1.0:
            share = f"{100 * cost / (sync['wall'] - base['wall']):.0f}%"
        if sync and sync["excess"] - base["excess"] >= 0.5:
            share_x = f"{100 * (v['excess'] - base['excess']) / (sync['excess'] - base['excess']):.0f}%"
        print(f"| {m} | {v['wall']:.2f} | {c['steps'] * c['batch'] / v['wall']:.1f} | {v['blocked']:.2f} | "
              f"{v['bytes'] / 1e9:.2f} | {cost:+.2f} | {share} | {v['excess']:.2f} | "
              f"{v['excess'] - base['excess']:+.2f} | {share_x} | {v['cpu'] - base['cpu']:+.1f} "
              f"({v['sys'] - base['sys']:+.1f}) |")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--configs", nargs="+", default=["heavy", "compute"], choices=sorted(CONFIGS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where run directories go (default: a temporary dir in /tmp)")
    a = ap.parse_args()
    if "none" not in a.modes:
        a.modes.insert(0, "none")
    work = tempfile.mkdtemp(prefix="h5ddp-async-e2e-", dir=a.dir)
    try:
        for config in a.configs:
            for ranks in a.ranks:
                results = {m: [] for m in a.modes}
                for rnd in range(a.rounds):
                    order = a.modes[rnd % len(a.modes):] + a.modes[:rnd % len(a.modes)]
                    for m in order:
                        results[m].append(run_once(a.build, work, config, ranks, m, rnd))
                        print(f"# {config} np={ranks} round {rnd + 1} {m}: {results[m][-1]}", flush=True)
                table(results, config, ranks)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
