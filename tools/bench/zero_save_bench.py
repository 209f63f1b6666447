"""Peak resident memory of each rank during ONE checkpoint save of torch's ZeroRedundancyOptimizer (issue 41):

  h5ddp        h5ddp_torch.save(run_dir, model, zero, ...): each rank writes its own partition's state
  consolidate  zero.consolidate_state_dict(to=0) + torch.save of model and optimizer state dicts on rank 0
  plain        h5ddp_torch.save with a replicated torch.optim.Adam (every rank holds all state; a reference)

An MLP of --layers Linear(--width, --width) layers with Adam, one optimizer step taken (state exists), then the
save. Peak RSS is the kernel's VmHWM after resetting it (echo 5 > /proc/self/clear_refs) just before the save;
"extra" is that peak minus VmRSS before the save. Run under mpirun:

  mpirun -np 2 /usr/bin/python3 tools/bench/zero_save_bench.py --mode h5ddp --dir /tmp/zb
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import h5ddp_torch  # noqa: E402


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def build(width, layers, mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    if mode == "plain":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    for p in model.parameters():  # the same gradients on every rank, as after DDP's all-reduce
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    for p in model.parameters():
        p.grad = None
    return model, opt


def save(mode, model, opt, run_dir, rank):
    if mode == "consolidate":
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(run_dir, "ckpt.pt"))
        torch.distributed.barrier()
    else:
        h5ddp_torch.save(run_dir, model, opt, step=1, fsync=False, keep_last=1)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("h5ddp", "consolidate", "plain"), required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    rank, world = h5ddp_torch.init_from_mpi("gloo")
    run_dir = os.path.join(a.dir, a.mode)
    os.makedirs(run_dir, exist_ok=True)
    model, opt = build(a.width, a.layers, a.mode)
    torch.distributed.barrier()
    before = status_kib("VmRSS")
    reset_peak()
    t = time.perf_counter()
    save(a.mode, model, opt, run_dir, rank)
    seconds = time.perf_counter() - t
    peak = status_kib("VmHWM")
    rows = [None] * world
    torch.distributed.all_gather_object(rows, (before, peak, seconds))
    if rank == 0:
        params = sum(p.numel() for p in model.parameters()) * 4 / 2**20
        for r, (b, pk, s) in enumerate(rows):
            print(f"{a.mode} rank {r}: params {params:.0f} MiB, RSS before {b / 1024:.0f} MiB, peak {pk / 1024:.0f} "
                  f"MiB, extra {(pk - b) / 1024:.0f} MiB, save {s:.2f} s", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
