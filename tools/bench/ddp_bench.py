#!/usr/bin/env python3
"""PyTorch DDP (gloo) counterpart of h5ddp-bench-ddp: same models, batch, optimizer and timing.

Run under mpirun (rank and size come from Open MPI's environment), with /usr/bin/python3:
  mpirun -np 2 /usr/bin/python3 tools/bench/ddp_bench.py --model mlp --hidden 4096 --layers 4 --batch 16
Prints one RESULT line on rank 0 (parsed by tools/bench/ddp_bench.sh).
--device cuda (tools/gpu-check.sh's benchmark line): the same on each rank's GPU, DDP over NCCL, timed with
torch.cuda.synchronize() around the steps.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class BenchCnn(nn.Module):  # same layers as ddp_bench.cpp's BenchCnn (the trainer's default CNN)
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 5 * 5, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.dropout(x, 0.25, self.training).flatten(1)
        x = F.dropout(F.relu(self.fc1(x)), 0.5, self.training)
        return self.fc2(x)


class BenchMlp(nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        sizes = [784] + [hidden] * layers
        self.fcs = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])] + [nn.Linear(sizes[-1], 10)])

    def forward(self, x):
        x = x.flatten(1)
        for fc in self.fcs[:-1]:
            x = F.relu(fc(x))
        return self.fcs[-1](x)


def time_steps(warmup, steps, step, cuda=False):
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-cap-mb", type=int, default=25)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()
    cuda = a.device == "cuda"

    torch.set_num_threads(1)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    torch.manual_seed(1)
    model = (BenchCnn() if a.model == "cnn" else BenchMlp(a.hidden, a.layers)).to(dev)
    nparams = sum(t.numel() for t in model.parameters())
    x = torch.randn(a.batch, 1, 28, 28).to(dev)
    y = torch.randint(0, 10, (a.batch,)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def local_step():
        F.nll_loss(F.log_softmax(model(x), 1), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    t_local = time_steps(a.warmup, a.steps, local_step, cuda)

    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb,
                                              device_ids=[dev.index] if cuda else None)

    def ddp_step():
        F.nll_loss(F.log_softmax(ddp(x), 1), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    t_ddp = time_steps(a.warmup, a.steps, ddp_step, cuda)
    if rank == 0:
        # Run with glibc's malloc tuned the way h5ddp's MpiEnv tunes it (ddp_bench.sh PY_MALLOC=1): its own row.
        impl = "pytorch+malloc" if os.environ.get("MALLOC_TRIM_THRESHOLD_") else "pytorch"
        print(f"RESULT impl={impl} device={a.device} model={a.model} ranks={size} params={nparams} batch={a.batch} "
              f"local_ms={1e3 * t_local:.3f} ddp_ms={1e3 * t_ddp:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
