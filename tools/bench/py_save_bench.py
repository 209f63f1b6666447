"""h5ddp_torch.save at N ranks against the folk way, rank 0's torch.save of the same state, side by side.

  mpirun -np 2 /usr/bin/python3 tools/bench/py_save_bench.py --dir /tmp/bench --hidden 4096,4096,4096 --repeat 3

The state: docs/MODELS.md's Mlp with --hidden widths, Adam after one step (weights + exp_avg + exp_avg_sq). Both
ways are durable: h5ddp_torch.save with fsync (every rank fsyncs the file, rank 0 the directory and `latest`, as
docs/FORMAT.md's protocol); torch.save to <dir>/folk.pt, then fsync of the file and of the directory. Both are timed
from the first rank's entry to the last rank's exit (a barrier, then the max over ranks). The page cache is dropped
before each save when the process may (root): echo 3 > /proc/sys/vm/drop_caches after a sync. A third way is the
disk's limit for the same bytes: rank 0 runs dd if=/dev/zero bs=16M conv=fsync of the same size (one stream, durable).
The ways' order rotates from one repetition to the next. Rank 0 prints one RESULT line per way with the median seconds
and GB/s, and the ratios. --transports mpi,torch also times h5ddp_torch's writer without MPI (issue 41: rank 0's serial
layout, then every rank's positional writes, the ranks agreeing over torch.distributed) on the same state in the same
run: way "h5ddp_torch" is the MPI writer (parallel HDF5), way "h5ddp_torch/torch" the torchrun writer."""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE, "python"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "interop"))
import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def folk_save(path, model, opt, rank):
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)


def dd_save(path, nbytes, rank):
    if rank == 0:
        count = (nbytes + (16 << 20) - 1) >> 24
        subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=16M", f"count={count}", "conv=fsync"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(fn):
    torch.distributed.barrier()
    t = time.perf_counter()
    fn()
    torch.distributed.barrier()
    return time.perf_counter() - t


def report(times, ways, nbytes, world):
    """Rank 0's RESULT lines: each way's median, then the ratios."""
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"RESULT way={k} ranks={world} bytes={nbytes} median_s={med[k]:.3f} GBps={nbytes / med[k] / 1e9:.2f} "
              f"runs={','.join(f'{x:.3f}' for x in v)}")
    for w in ways[1:-1]:
        print(f"RESULT {w}: speedup={med['torch.save'] / med[w]:.2f} (torch.save time / its time) "
              f"of_dd={med['dd'] / med[w]:.2f} (dd time / its time)")
    if "h5ddp_torch" in med and "h5ddp_torch/torch" in med:
        print(f"RESULT torch_vs_mpi={med['h5ddp_torch'] / med['h5ddp_torch/torch']:.2f} "
              "(MPI writer time / torchrun writer time)")
    print(f"RESULT torch.save_of_dd={med['dd'] / med['torch.save']:.2f} (dd time / torch.save time)")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--hidden", default="4096,4096,4096")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--transports", default="mpi", help="h5ddp_torch writers to time: mpi, torch or mpi,torch")
    p.add_argument("--launch", choices=("mpi", "env"), default="mpi",
                   help="env: started as torchrun starts it (no MPI; --transports torch only)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.launch == "env":
        torch.distributed.init_process_group("gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = h5ddp_torch.init_from_mpi("gloo")
    Mlp = ic.model_classes(SOURCE)[1]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Mlp(tuple(int(h) for h in a.hidden.split(","))))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    F.cross_entropy(model(torch.randn(8, 784)), torch.randint(0, 10, (8,))).backward()
    opt.step()
    nbytes = sum(t.numel() * t.element_size() for t in model.module.state_dict().values()) + \
        sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    run_dir = os.path.join(a.dir, "h5ddp")
    os.makedirs(run_dir, exist_ok=True)
    writers = {"mpi": "h5ddp_torch", "torch": "h5ddp_torch/torch"}
    ways = ["torch.save"] + [writers[t] for t in a.transports.split(",")] + ["dd"]
    times = {w: [] for w in ways}
    saves = 0
    for i in range(a.repeat):
        k = i % len(ways)
        for way in ways[k:] + ways[:k]:  # rotate, so drift in the machine's load hits every way
            if rank == 0:
                drop_caches()
            if way == "torch.save":
                s = timed(lambda: folk_save(os.path.join(a.dir, "folk.pt"), model, opt, rank))
            elif way == "dd":
                s = timed(lambda: dd_save(os.path.join(a.dir, "dd.out"), nbytes, rank))
            else:
                comm = "torch" if way.endswith("/torch") else None
                saves += 1  # a new step (file name) for every save
                s = timed(lambda: h5ddp_torch.save(run_dir, model, opt, step=saves, keep_last=1, fsync=True,
                                                   comm=comm))
            times[way].append(s)
    if rank == 0:
        report(times, ways, nbytes, world)
    if a.launch != "env":  # env: torch 1.13's gloo teardown can deadlock (h5ddp_torch.exit_without_teardown)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if "--launch" in sys.argv and sys.argv[sys.argv.index("--launch") + 1:][:1] == ["env"]:
        h5ddp_torch.exit_without_teardown(main)
    else:
        main()
