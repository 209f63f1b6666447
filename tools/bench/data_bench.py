#!/usr/bin/env python3
"""Input throughput and memory of h5ddp-train's two data paths, side by side in one run (issue 20):

  mem    Fashion-MNIST from the IDX files, every rank holding the whole set as floats (the default)
  h5     the same Fashion-MNIST converted to HDF5 (tools/h5ddp-data.py), each rank reading only its batches' rows
  big    a synthetic HDF5 set of the same sample shape, BIG_GB on disk (far larger than one rank's share),
         read the same way, from the page cache
  cold   the same file evicted from the page cache before the launch (posix_fadvise DONTNEED): every row
         read comes from the disk

Same model (cnn), global batch, steps and ranks for all three; the order rotates each repetition so all see the
same machine. Reports samples/s of the training loop (metrics.jsonl "end": train_seconds), the wall time of the
whole launch (startup included) and the peak RSS of each rank (/usr/bin/time -f %M).

  /usr/bin/python3 tools/bench/data_bench.py [--build build] [--ranks 2] [--steps 300] [--reps 3] [--big-gb 2]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def make_big(path, gb):
    """uint8 [N, 1, 28, 28] with learnable labels (a class-dependent bright patch), written in slabs."""
    n = int(gb * (1 << 30) // 784)
    rng = np.random.default_rng(1)
    with h5py.File(path + ".tmp", "w") as f:
        x = f.create_dataset("train/x", (n, 1, 28, 28), dtype=np.uint8)
        y = f.create_dataset("train/y", (n,), dtype=np.uint8)
        x.attrs["mean"] = np.float32(0.2860)
        x.attrs["std"] = np.float32(0.3530)
        f.attrs["num_classes"] = 10
        f.attrs["h5ddp_data_format"] = 1
        slab = 65536
        for b in range(0, n, slab):
            m = min(slab, n - b)
            labels = rng.integers(0, 10, m)
            img = rng.integers(0, 64, (m, 1, 28, 28), dtype=np.uint8)
            for c in range(10):
                img[labels == c, 0, 2 * c + 2:2 * c + 6, 4:24] = 255
            x[b:b + m] = img
            y[b:b + m] = labels
    os.replace(path + ".tmp", path)
    return n


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(args, mode, data, work):
    if mode == "cold":
        evict(data)
    run_dir = os.path.join(work, f"run-{mode}")
    shutil.rmtree(run_dir, ignore_errors=True)
    rss_dir = os.path.join(work, f"rss-{mode}")
    shutil.rmtree(rss_dir, ignore_errors=True)
    os.makedirs(rss_dir)
    # Each rank's peak RSS into its own file (mpirun's forwarding of the ranks' last lines is not reliable).
    timed = f'exec /usr/bin/time -f %M -o {rss_dir}/rank$OMPI_COMM_WORLD_RANK "$@"'
    cmd = ["mpirun", "-np", str(args.ranks), "--oversubscribe", "sh", "-c", timed, "sh",
           os.path.join(args.build, "tools", "h5ddp-train"), "--model", "cnn", "--run-dir", run_dir,
           "--batch-size", str(args.batch), "--max-steps", str(args.steps), "--no-eval", "--no-final-checkpoint",
           "--resume", "none", "--threads", "1", "--log-every", str(args.steps)]
    if data:
        cmd += ["--data", data]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{mode}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    rss = []
    for name in sorted(os.listdir(rss_dir)):
        with open(os.path.join(rss_dir, name)) as f:
            rss.append(int(f.read().split()[-1]) / 1024)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        end = [r for r in map(json.loads, f) if r["event"] == "end"][-1]
    sps = args.steps * args.batch / end["train_seconds"]
    return sps, wall, rss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=120)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-gb", type=float, default=2.0)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    work = args.work or tempfile.mkdtemp(prefix="h5ddp-data-bench-")
    os.makedirs(work, exist_ok=True)
    fm = os.path.join(work, "fashion-mnist.h5")
    if not os.path.exists(fm):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "h5ddp-data.py"), "fashion-mnist", "-o", fm],
                       check=True, timeout=600)
    big = os.path.join(work, f"big-{args.big_gb:g}GB.h5")
    if not os.path.exists(big):
        n = make_big(big, args.big_gb)
        print(f"wrote {big}: {n} samples, {os.path.getsize(big) / 2**30:.2f} GiB")
    modes = [("mem", None), ("h5", fm), ("big", big), ("cold", big)]
    results = {m: [] for m, _ in modes}
    for rep in range(args.reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for mode, data in order:
            sps, wall, rss = run(args, mode, data, work)
            results[mode].append((sps, wall, rss))
            print(f"RESULT rep={rep} mode={mode} samples_per_s={sps:.0f} wall_s={wall:.2f} "
                  f"peak_rss_mib={','.join(f'{r:.0f}' for r in rss)}", flush=True)
    print(f"\n{args.ranks} ranks, cnn, global batch {args.batch}, {args.steps} steps, median of {args.reps}")
    print("| data | samples/s | vs in-memory | launch wall s | peak RSS per rank (MiB) |")
    print("|---|---|---|---|---|")
    base = statistics.median(r[0] for r in results["mem"])
    for mode, data in modes:
        sps = statistics.median(r[0] for r in results[mode])
        wall = statistics.median(r[1] for r in results[mode])
        rss = max(max(r[2]) for r in results[mode])
        label = {"mem": "Fashion-MNIST in memory (default)", "h5": "Fashion-MNIST HDF5 (--data)",
                 "big": f"synthetic HDF5, {os.path.getsize(big) / 2**30:.1f} GiB (--data), page cache",
                 "cold": f"synthetic HDF5, {os.path.getsize(big) / 2**30:.1f} GiB (--data), evicted"}[mode]
        print(f"| {label} | {sps:.0f} | {sps / base:.2f}x | {wall:.1f} | {rss:.0f} |")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
