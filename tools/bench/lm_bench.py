#!/usr/bin/env python3
"""PyTorch DDP (gloo, CPU) counterpart of h5ddp-train on a token stream (issue 40): the GPT of
tools/examples/gpt.py trained on the windows of /S/tokens (docs/DATA.md layout T2: window i = tokens[i*T :
i*T + T + 1], x = its first T, y = its last T), next-token cross-entropy (mean over the local batch's positions),
Adam or AdamW. The global batch --batch is split over the ranks in h5ddp's sample order (h5ddp_torch's
DistributedSampler, seeded with --seed), each rank reading its windows from the file every step, as h5ddp-train
does. Times --steps steps after --warmup untimed ones and prints one line on rank 0:

  RESULT framework=pytorch ranks=N tokens_per_s=... step_ms=... params=... batch=... context=... loss=...

(tokens_per_s = batch * context / step time; loss = the mean over ranks of the last step's local loss).

Launch: env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) as torchrun sets them; under mpirun,
OMPI_COMM_WORLD_RANK/SIZE give RANK/WORLD_SIZE (MASTER_ADDR defaults to 127.0.0.1, MASTER_PORT to 29534):
  OMP_NUM_THREADS=1 mpirun -np 2 /usr/bin/python3 tools/bench/lm_bench.py --data tokens.h5 --batch 16
  torchrun --nproc-per-node 2 tools/bench/lm_bench.py --data tokens.h5 --batch 16
Weights: torch.manual_seed(--seed) then GPT(...), the weights of `gpt.py script --seed` with the same options.
"""
import argparse
import os
import sys
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tools", "examples"))
sys.path.insert(0, os.path.join(SOURCE, "python"))
from gpt import GPT  # noqa: E402
from h5ddp_torch import exit_without_teardown  # noqa: E402
from h5ddp_torch.sampler import DataState, DistributedSampler  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="token data file (docs/DATA.md layout T2)")
    p.add_argument("--split", default="train")
    p.add_argument("--context", type=int, default=0, help="T (default: the dataset's context attribute)")
    p.add_argument("--batch", type=int, default=16, help="global batch (windows per step over all ranks)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--tie-weights", action="store_true")
    p.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw")
    # Not h5ddp-train's default (2e-3): with no warmup, 2e-3 makes the loss of the 4-layer, dim-128 GPT jump
    # (3.5 -> 6.8 at step 12 on a bytes file); pass the same --lr to h5ddp-train when comparing.
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0, help="h5ddp-train's default (torch's AdamW: 0.01)")
    p.add_argument("--script", action="store_true", help="train the torch.jit.script module, as h5ddp-train does")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--bucket-cap-mb", type=int, default=25)
    return p.parse_args()


def init_distributed():
    """(rank, size) of an env:// process group; mpirun's OMPI_COMM_WORLD_* stand in for RANK/WORLD_SIZE."""
    for ompi, env in (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")):
        if env not in os.environ:
            os.environ[env] = os.environ.get(ompi, "0" if env == "RANK" else "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


class Windows:
    """The windows of a token stream, read from the file on demand."""

    def __init__(self, path, split, context):
        self.file = h5py.File(path, "r")
        if "vocab_size" not in self.file.attrs:
            raise ValueError(f"{path}: no root attribute vocab_size (not token data)")
        self.vocab_size = int(self.file.attrs["vocab_size"])
        if f"{split}/tokens" not in self.file:
            raise ValueError(f"{path}: no /{split}/tokens (a token stream, docs/DATA.md layout T2)")
        self.tokens = self.file[f"{split}/tokens"]
        self.context = context or int(self.tokens.attrs.get("context", 0))
        if self.context <= 0:
            raise ValueError(f"{path}: /{split}/tokens has no context attribute: pass --context")
        self.count = (self.tokens.shape[0] - 1) // self.context
        if self.count < 1:
            raise ValueError(f"{path}: /{split}/tokens: the stream is shorter than one window")

    def batch(self, indices):
        t = self.context
        w = np.stack([self.tokens[i * t:i * t + t + 1] for i in indices]).astype(np.int64)
        w = torch.from_numpy(w)
        return w[:, :-1], w[:, 1:]


def run(a, rank, size):
    torch.set_num_threads(a.threads)
    data = Windows(a.data, a.split, a.context)
    torch.manual_seed(a.seed)
    model = GPT(data.vocab_size, data.context, a.layers, a.heads, a.dim, a.dropout, a.tie_weights)
    params = sum(p.numel() for p in model.parameters())
    if a.script:
        model = torch.jit.script(model)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
    kind = torch.optim.AdamW if a.optimizer == "adamw" else torch.optim.Adam
    opt = kind(ddp.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sampler = DistributedSampler(data.count, a.batch, a.seed, size, rank)
    state = DataState(a.seed, 0, 0, a.batch)

    def step():
        x, y = data.batch(sampler.local_indices(state.epoch, state.position))
        loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sampler.advance(state)
        return loss.detach()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dist.barrier()
    seconds = (time.perf_counter() - t0) / max(a.steps, 1)
    dist.all_reduce(loss)
    if rank == 0:
        print(f"RESULT framework=pytorch ranks={size} tokens_per_s={a.batch * data.context / seconds:.1f} "
              f"step_ms={1e3 * seconds:.3f} params={params} batch={a.batch} context={data.context} "
              f"loss={loss.item() / size:.4f}", flush=True)


def main():
    """The exit status: 2 for bad options or a bad data file (one line), else 0. Other errors propagate."""
    try:
        a = parse()
        if a.steps < 1:
            raise ValueError("--steps must be at least 1")
        rank, size = init_distributed()
        run(a, rank, size)
    except SystemExit as e:  # argparse
        return e.code if isinstance(e.code, int) else 2
    except (ValueError, OSError, KeyError) as e:  # bad options or data file: one line
        print(f"lm_bench: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Without destroy_process_group or the interpreter's teardown (torch 1.13's gloo destructor can deadlock).
    exit_without_teardown(main)
