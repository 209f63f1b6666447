"""A ZeroRedundancyOptimizer load of FILE under mpirun (test_zero.py): every rank must refuse it with an error
containing --expect (a damaged dataset read by one rank fails the load on all), the model left untouched.

  mpirun -np 2 /usr/bin/python3 zero_load_check.py --file F --expect TEXT"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pt_loop  # noqa: E402
import h5ddp_torch  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--file", required=True)
    p.add_argument("--expect", required=True)
    a = p.parse_args()
    rank, world = h5ddp_torch.init_from_mpi("gloo")
    torch.manual_seed(pt_loop.SEED)
    model = pt_loop.cnn()
    before = [t.clone() for t in model.state_dict().values()]
    from torch.distributed.optim import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=pt_loop.LR)
    try:
        h5ddp_torch.load(a.file, model, opt)
        verdict = "loaded"
    except h5ddp_torch.CheckpointError as e:
        verdict = str(e)
    untouched = all(torch.equal(x, y) for x, y in zip(before, model.state_dict().values()))
    rows = [None] * world
    torch.distributed.all_gather_object(rows, (verdict, untouched, sum(len(s) for s in opt.optim.state.values())))
    if rank == 0:
        for r, (v, u, n) in enumerate(rows):
            ok = a.expect in v and u and n == 0
            print(f"{'REFUSED' if ok else 'WRONG'} rank {r}: {v} (model untouched: {u}, state entries: {n})")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
