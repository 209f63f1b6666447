"""Writes the Python side's files for the conformance suite, under mpirun (2 ranks), or with a second argument
"env" as torchrun starts it (no MPI; the torch.distributed transport):
  <out>/sgd/ckpt-00000001.h5   the CNN with SGD (momentum) and /user tensors of every dtype, 0-d and empty ones
  <out>/adam/ckpt-00000002.h5  the CNN with AdamW over two param groups
and checks the collective failures: replicas that differ (nothing written on any rank, no .partial left) and a
run directory that does not exist (the same error on every rank)."""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402
import h5ddp_torch  # noqa: E402


def step(model, opt, images, labels, rank):
    idx = torch.arange(8 * rank, 8 * rank + 8)
    F.cross_entropy(model(images[idx]), labels[idx]).backward()
    opt.step()
    opt.zero_grad()


def main():
    out = sys.argv[1]
    torch.set_num_threads(1)
    if sys.argv[2:] == ["env"]:
        torch.distributed.init_process_group("gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world = h5ddp_torch.init_from_mpi("gloo")
    transport = h5ddp_torch.get_comm().transport  # chosen from the launch
    assert transport == ("torch" if sys.argv[2:] == ["env"] else "mpi"), transport
    images, labels = pt_loop.fashion = pt_loop.ic.fashion_mnist("train", 0, 16)
    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(pt_loop.cnn())
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    step(model, sgd, images, labels, rank)
    user = {"f16": torch.linspace(-2, 2, 7, dtype=torch.float16), "bf16": torch.linspace(-3, 3, 5).bfloat16(),
            "flags": torch.tensor([True, False, True]), "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
            "i32": torch.arange(12, dtype=torch.int32).reshape(3, 4), "f64": torch.tensor(3.25, dtype=torch.float64),
            "u8": torch.arange(256, dtype=torch.uint8), "empty": torch.zeros(0, 5), "count": 17}
    for d in ("sgd", "adam", "bad"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    h5ddp_torch.save(os.path.join(out, "sgd"), model, sgd, step=1, user=user, fsync=True,
                     data=h5ddp_torch.DataState(seed=7, epoch=0, position=16, global_batch=16))

    torch.manual_seed(2)
    model = torch.nn.parallel.DistributedDataParallel(pt_loop.cnn())
    m = model.module
    adamw = torch.optim.AdamW([{"params": [m.conv1.weight, m.conv1.bias, m.conv2.weight, m.conv2.bias]},
                               {"params": [m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias], "lr": 1e-4}],
                              lr=1e-3, weight_decay=0.05, amsgrad=True)
    for _ in range(2):
        step(model, adamw, images, labels, rank)
    h5ddp_torch.save(os.path.join(out, "adam"), model, adamw, step=2)

    # Replicas that differ: every rank raises, nothing is committed, no partial file is left.
    kept = m.fc2.bias.detach().clone()
    with torch.no_grad():
        if rank == 1:
            m.fc2.bias[0] += 1
    try:
        h5ddp_torch.save(os.path.join(out, "bad"), model, adamw, step=3)
        raise AssertionError("a save of differing replicas succeeded")
    except h5ddp_torch.DisagreementError as e:
        assert "/model/fc2.bias" in str(e) and "\n" not in str(e), e
    assert os.listdir(os.path.join(out, "bad")) == [], os.listdir(os.path.join(out, "bad"))
    with torch.no_grad():
        if rank == 1:
            m.fc2.bias.copy_(kept)
    try:
        h5ddp_torch.save(os.path.join(out, "sgd", "latest", "sub"), model, adamw, step=3)
        raise AssertionError("a save into a run directory below a file succeeded")
    except h5ddp_torch.CheckpointError as e:
        assert str(e).startswith("rank 0: cannot create the run directory") and "latest/sub" in str(e), e
    if sys.argv[2:] == ["env"]:
        import h5py
        assert "mpi4py" not in sys.modules and not h5py.get_config().mpi, "MPI loaded in a job without MPI"
    print(f"rank {rank}: collective failures agreed", flush=True)
    if sys.argv[2:] != ["env"]:  # h5ddp_torch.exit_without_teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[2:] == ["env"]:
        h5ddp_torch.exit_without_teardown(main)
    else:
        main()
