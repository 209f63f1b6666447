"""A PyTorch DDP training loop that continues h5ddp-train's runs and that h5ddp-train continues: the CNN of
docs/MODELS.md, Adam, Fashion-MNIST in h5ddp's sample order (h5ddp_torch.DistributedSampler), checkpoints
with h5ddp_torch. Run under mpirun (gloo process group over MPI's ranks):

  mpirun -np 2 /usr/bin/python3 pt_loop.py --run-dir D --max-steps 6 --save-every 1 --losses L.json

or, with --launch env, as torchrun starts it (init_process_group from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
no MPI: h5ddp_torch then writes through torch.distributed, tests/python/torchrun_launch.py).

Also a library for the tests: step_loss() recomputes, in one process, the loss an h5ddp job of any world size
computes for its next step from a checkpoint (every rank's dropout stream restored from its RNG row)."""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "python"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "interop"))

import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402

SEED, LR, DROPOUT = 42, 2e-3, 0.25


def train_set():
    """All 60000 training images, normalised as docs/MODELS.md says, and their labels."""
    return ic.fashion_mnist("train", 0, 60000)


def cnn():
    return ic.model_classes(SOURCE)[0](DROPOUT)


def step_loss(path, images, labels):
    """The mean over the saved ranks of the local training loss of the step that follows checkpoint `path`:
    rank r's slice of the next global batch, rank r's dropout stream (RNG row r), the saved weights."""
    model = cnn()
    r0 = h5ddp_torch.load(path, model, rng=False)
    import h5py
    with h5py.File(path, "r") as f:
        rows = f["rng/cpu"][()]
    world = r0.world_size
    losses = []
    for r in range(world):
        s = h5ddp_torch.DistributedSampler(len(labels), r0.data.global_batch, r0.data.seed, world, r)
        idx = torch.tensor(s.local_indices(r0.data.epoch, r0.data.position))
        torch.set_rng_state(torch.from_numpy(rows[r].copy()))
        model.train()
        with torch.no_grad():
            losses.append(F.cross_entropy(model(images[idx]), labels[idx]).item())
    return sum(losses) / world


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=16, help="global batch")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--losses", help="rank 0 writes {step: loss} (mean over ranks, full precision) here")
    p.add_argument("--zero", action="store_true", help="Adam inside torch's ZeroRedundancyOptimizer (ZeRO-1)")
    p.add_argument("--launch", choices=("mpi", "env"), default="mpi", help="mpirun, or torchrun's environment")
    p.add_argument("--pause-after-step", type=int, default=0, help="sleep after this step (to be SIGKILLed)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.launch == "env":
        torch.distributed.init_process_group("gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = h5ddp_torch.init_from_mpi("gloo")
    images, labels = train_set()

    torch.manual_seed(SEED)
    model = torch.nn.parallel.DistributedDataParallel(cnn())
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=LR)
    torch.manual_seed(SEED + rank)  # rank r's dropout stream, as h5ddp-train seeds it
    os.makedirs(a.run_dir, exist_ok=True)
    r = h5ddp_torch.resume(a.run_dir, model, opt)
    step, data = (r.step, r.data) if r else (0, h5ddp_torch.DataState(SEED, 0, 0, a.batch_size))
    if rank == 0:
        print(f"resumed from {r.path} at step {step}" if r else "fresh start", flush=True)
    if a.zero and r:  # what this rank holds after the resume: its partition's state only
        local = opt.optim
        held = sum(1 for g in local.param_groups for p in g["params"] if local.state.get(p))
        owned = sum(len(g["params"]) for g in local.param_groups)
        lines = [None] * world
        torch.distributed.all_gather_object(lines, f"state of {held} params, owns {owned}, "
                                                   f"lr {local.param_groups[0]['lr']}")
        if rank == 0:
            print("".join(f"zero rank {r}: {ln}\n" for r, ln in enumerate(lines)), end="", flush=True)
    sampler = h5ddp_torch.DistributedSampler(len(labels), data.global_batch, data.seed, world, rank)
    losses = {}
    model.train()
    while step < a.max_steps:
        idx = torch.tensor(sampler.local_indices(data.epoch, data.position))
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        sampler.advance(data)
        step += 1
        mean = loss.detach().double().clone()
        torch.distributed.all_reduce(mean)
        losses[step] = mean.item() / world
        if rank == 0:
            print(f"step {step} loss {losses[step]:.9f}", flush=True)
        if a.save_every and step % a.save_every == 0 or step == a.max_steps:
            h5ddp_torch.save(a.run_dir, model, opt, step=step, data=data, keep_last=0, fsync=False,
                             scheduler={"type": "constant", "base_lr": LR, "last_epoch": step, "lr": LR},
                             meta={"model": "cnn", "dropout": f"{DROPOUT:f}"})
        if step == a.pause_after_step:
            print(f"rank {rank}: paused after step {step}", flush=True)
            time.sleep(600)
    if rank == 0 and a.losses:
        with open(a.losses, "w") as f:
            json.dump(losses, f)
    if a.launch != "env":  # see h5ddp_torch.exit_without_teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if "--launch" in sys.argv and sys.argv[sys.argv.index("--launch") + 1:][:1] == ["env"]:
        h5ddp_torch.exit_without_teardown(main)
    else:
        main()
