"""The peers of h5ddp-bench-checkpoint, on the same state: what a PyTorch user runs, and the disk's limit.

  mpirun -np N /usr/bin/python3 tools/bench/torch_ckpt_peer.py --gib G --dir D [--tensors 48] [--fsync 1]
                                                               [--methods torch,dd] [--reps 1]

State: the --tensors float32 tensors of h5ddp-bench-checkpoint (same names, shapes and total bytes), arranged as a
PyTorch user's checkpoint: {"model": state_dict, "optimizer": Adam.state_dict()} (exp_avg, exp_avg_sq and step per
parameter, param_groups), every rank a replica. Methods (times: barrier to barrier, the slowest rank counts):
  torch_save  rank 0 torch.save()s the dict to D/folk.pt (then fsync of the file and of D with --fsync 1), the
              other ranks wait at the barrier: the folk answer;
  torch_load  after the file is evicted from the page cache: every rank torch.load(map_location="cpu")s it and
              copies the tensors into its own state (what load_state_dict does);
  dd_write    rank 0 runs dd of the same number of bytes from /dev/zero (conv=fsync with --fsync 1): one
              sequential writer, the disk's limit for a save;
  dd_read     after eviction, rank 0 runs dd of that file to /dev/null: a cold sequential read, the disk's limit
              for a load.
Prints "RESULT key=value ..." lines on rank 0 in h5ddp-bench-checkpoint's format (tools/bench/checkpoint_bench.sh
interleaves both programs and tools/bench/checkpoint_bench_table.py tabulates them). Needs python3-torch and
python3-mpi4py (/usr/bin/python3)."""
import argparse
import os
import resource
import subprocess
import time

import torch
from mpi4py import MPI


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    os.fsync(fd)
    os.close(fd)


def rss_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


class Peer:
    def __init__(self, comm, a):
        self.comm, self.a = comm, a
        per = int(a.gib * (1 << 30)) // a.tensors // 4096 * 4096
        self.bytes = per * a.tensors
        layers = a.tensors // 3
        g = torch.Generator().manual_seed(1)
        t = [torch.rand(per // 4096, 1024, generator=g) for _ in range(a.tensors)]
        self.model = {f"layers.{i}.weight": t[i] for i in range(layers)}
        self.optim = {
            "state": {i: {"step": torch.tensor(1000.0), "exp_avg": t[layers + i], "exp_avg_sq": t[2 * layers + i]}
                      for i in range(layers)},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0, "amsgrad": False,
                              "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                              "params": list(range(layers))}],
        }
        os.makedirs(a.dir, exist_ok=True)
        self.pt = os.path.join(a.dir, "folk.pt")
        self.raw = os.path.join(a.dir, "dd.bin")

    def measure(self, op, method, fn):
        self.comm.Barrier()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = rss_kib("VmRSS:")
        t0 = time.perf_counter()
        fn()
        self.comm.Barrier()
        s = time.perf_counter() - t0
        extra = self.comm.allreduce(rss_kib("VmHWM:") - base, op=MPI.MAX)
        if self.comm.rank == 0:
            print(f"RESULT gib={self.bytes / (1 << 30):.2f} ranks={self.comm.size} fsync={int(self.a.fsync)} op={op} "
                  f"method={method} seconds={s:.3f} gbps={self.bytes / s / 1e9:.3f} extra_rss_mib={extra / 1024:.1f} "
                  f"extra_rss_pct={100.0 * extra * 1024 / self.bytes:.1f}", flush=True)

    def cold(self, path):
        if self.comm.rank == 0:
            evict(path)
        self.comm.Barrier()

    def remove(self, path):
        if self.comm.rank == 0 and os.path.exists(path):
            os.remove(path)
        self.comm.Barrier()

    def fingerprint(self):
        ts = list(self.model.values()) + [s[k] for s in self.optim["state"].values() for k in ("exp_avg", "exp_avg_sq")]
        return [float(t.double().sum()) for t in ts]

    def torch_save(self):
        if self.comm.rank == 0:
            torch.save({"model": self.model, "optimizer": self.optim}, self.pt)
            if self.a.fsync:
                fsync_path(self.pt)
                fsync_path(self.a.dir, directory=True)

    def torch_load(self):
        ck = torch.load(self.pt, map_location="cpu")
        for k, v in ck["model"].items():
            self.model[k].copy_(v)
        for i, s in ck["optimizer"]["state"].items():
            for k in ("exp_avg", "exp_avg_sq"):
                self.optim["state"][i][k].copy_(s[k])
        del ck

    def dd(self, write):
        if self.comm.rank != 0:
            return
        if write:
            cmd = ["dd", "if=/dev/zero", f"of={self.raw}", "bs=16M", f"count={self.bytes}", "iflag=count_bytes"]
            if self.a.fsync:
                cmd.append("conv=fsync")
        else:
            cmd = ["dd", f"if={self.raw}", "of=/dev/null", "bs=16M"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if write and self.a.fsync:
            fsync_path(self.a.dir, directory=True)

    def run(self):
        # Untimed warm-ups of the same size, as h5ddp-bench-checkpoint does: each method's steady state is timed.
        if "torch" in self.a.methods:
            self.torch_save()
            self.remove(self.pt)
        if "dd" in self.a.methods:
            self.dd(True)
            self.remove(self.raw)
        for _ in range(self.a.reps):
            if "torch" in self.a.methods:
                self.measure("save", "torch_save", self.torch_save)
                self.cold(self.pt)
                before = self.fingerprint()
                for t in self.model.values():  # the load must bring the values back, not find them there
                    t.zero_()
                self.measure("load", "torch_load", self.torch_load)
                if self.fingerprint() != before:
                    raise SystemExit(f"rank {self.comm.rank}: torch.load of {self.pt} did not restore the state")
                self.remove(self.pt)
            if "dd" in self.a.methods:
                self.measure("save", "dd", lambda: self.dd(True))
                self.cold(self.raw)
                self.measure("load", "dd_cold_read", lambda: self.dd(False))
                self.remove(self.raw)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--dir", default="/tmp/h5ddp-bench")
    p.add_argument("--tensors", type=int, default=48)
    p.add_argument("--fsync", type=int, default=1)
    p.add_argument("--methods", default="torch,dd")
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args()
    a.tensors = max(3, a.tensors // 3 * 3)
    torch.set_num_threads(1)
    Peer(MPI.COMM_WORLD, a).run()


if __name__ == "__main__":
    main()
