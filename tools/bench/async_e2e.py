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
more), and the CPU time (user +
system, all ranks) the run took beyond the run without saves, its system part in parentheses. No final checkpoint;
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
           "--run-dir", run_dir, "--checkpoint-every-steps", "0" if mode == "none" else str(c["every"])]
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
    saves = [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if r["event"] == "save"]
    shutil.rmtree(run_dir)
    return dict(wall=wall, cpu=cpu, sys=sys_cpu, blocked=sum(s["blocked_seconds"] for s in saves),
                bytes=sum(s["bytes"] for s in saves), saves=len(saves))


def table(results, config, ranks):
    c = CONFIGS[config]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu", "sys", "blocked", "bytes", "saves")}
           for m, rs in results.items()}
    none, none_cpu = med["none"]["wall"], med["none"]["cpu"]
    print(f"\n{config}, {ranks} rank(s): MLP {c['hidden']}, batch {c['batch']}, {c['steps']} steps, "
          f"{int(med['sync/mpiio']['saves'])} saves of {med['sync/mpiio']['bytes'] / max(1, med['sync/mpiio']['saves']) / 1e6:.0f} MB"
          f" ({len(results['none'])} rounds, medians; walls per round: "
          + "; ".join(f"{m} " + " ".join(f"{r['wall']:.1f}" for r in rs) for m, rs in results.items()) + ")")
    print("| mode | wall (s) | samples/s | blocked in saves (s) | GB written | cost vs none (s) | cost / same method's "
          "sync | CPU s vs none (system) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m, v in med.items():
        cost = v["wall"] - none
        sync = med.get("sync/" + m.split("/")[-1]) if m != "none" else None
        # A share of a sync cost inside the noise (under 1 s) would mean nothing: "-".
        share = f"{100 * cost / (sync['wall'] - none):.0f}%" if sync and sync["wall"] - none >= 1.0 else "-"
        print(f"| {m} | {v['wall']:.2f} | {c['steps'] * c['batch'] / v['wall']:.1f} | {v['blocked']:.2f} | "
              f"{v['bytes'] / 1e9:.2f} | {cost:+.2f} | {share} | {v['cpu'] - none_cpu:+.1f} ({v['sys'] - med['none']['sys']:+.1f}) |")
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
