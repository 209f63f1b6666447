"""h5ddp-ckpt import: a state dict that Python saved from a DistributedDataParallel-wrapped model (gloo group
of one; "module." keys, an OrderedDict with _metadata) becomes an h5ddp checkpoint; h5ddp-train starts
from it with --init-from, and its first-step loss is the trained model's, not a fresh model's."""
import os

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import interop_common as ic

PY_STEPS = 40
EVAL_IMAGES = 500


def train_in_pytorch(Cnn, store_file):
    """A DDP-wrapped Cnn trained briefly in PyTorch; returns the DDP module."""
    dist.init_process_group("gloo", init_method="file://" + store_file, rank=0, world_size=1)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Cnn())
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    x, y = ic.fashion_mnist("train", 0, PY_STEPS * 60)
    ddp.train()
    for i in range(PY_STEPS):
        opt.zero_grad()
        F.cross_entropy(ddp(x[i * 60:(i + 1) * 60]), y[i * 60:(i + 1) * 60]).backward()
        opt.step()
    return ddp


def main():
    args = ic.parse_args(__doc__)
    Cnn, _ = ic.model_classes(args.source_dir)
    with ic.Scratch(args, "import") as w:
        ddp = train_in_pytorch(Cnn, w("gloo-store"))
        sd = ddp.state_dict()
        assert all(k.startswith("module.") for k in sd) and hasattr(sd, "_metadata"), list(sd)
        torch.save(sd, w("ddp.pt"))
        # The other shapes a user's file takes: a checkpoint dict with a "model" or "state_dict" entry,
        # pickle protocol 4.
        torch.save({"model": sd, "epoch": 3, "optimizer": {"lr": 1e-3}}, w("nested_model.pt"))
        torch.save({"state_dict": sd, "note": "x"}, w("nested_state_dict.pt"), pickle_protocol=4)
        dist.destroy_process_group()

        ic.run([args.ckpt, "import", w("ddp.pt"), "--to", w("imported.h5"), "--model", "cnn"])
        ic.run([args.ckpt, "verify", w("imported.h5")])
        plain = {k[len("module."):]: v for k, v in sd.items()}
        with h5py.File(w("imported.h5"), "r") as f:
            assert f.attrs["format"] == "h5ddp-checkpoint" and int(f.attrs["step"]) == 0
            assert set(f["model"].keys()) == set(plain), sorted(f["model"].keys())
            for k, v in plain.items():
                assert torch.equal(torch.from_numpy(np.asarray(f["model"][k][()])), v), k
        for name in ("nested_model", "nested_state_dict"):
            ic.run([args.ckpt, "import", w(name + ".pt"), "--to", w(name + ".h5")])
            ic.run([args.ckpt, "diff", w("imported.h5"), w(name + ".h5")])  # exit 0: identical tensors

        # h5ddp's C++ forward pass of the imported weights equals PyTorch's.
        x, y = ic.fashion_mnist("t10k", 0, EVAL_IMAGES)
        py_loss, _ = ic.eval_loss(ddp.module, x, y)
        cpp_loss, _ = ic.ckpt_eval(args, w("imported.h5"), EVAL_IMAGES)
        print(f"eval loss: PyTorch {py_loss:.9f}  h5ddp {cpp_loss:.9f}")
        assert abs(py_loss - cpp_loss) <= 1e-5, (py_loss, cpp_loss)

        # h5ddp-train starts from the imported weights: its first-step loss (dropout off) is near the
        # trained model's loss on training images, far below a fresh model's (about ln 10 = 2.30).
        xt, yt = ic.fashion_mnist("train", 10000, 2000)
        expected, _ = ic.eval_loss(ddp.module, xt, yt)
        common = ["--max-steps", "2", "--log-every", "1", "--dropout", "0", "--batch-size", "120", "--seed", "3"]
        init = ic.step_losses(ic.train(args, 2, w("run-init"), "--init-from", w("imported.h5"), *common))
        fresh = ic.step_losses(ic.train(args, 2, w("run-fresh"), *common))
        print(f"first-step loss: from the import {init[1]:.4f}, fresh {fresh[1]:.4f}, "
              f"PyTorch model on 2000 training images {expected:.4f}")
        assert fresh[1] > 2.0, fresh
        assert abs(init[1] - expected) < 0.3, (init, expected)
        assert init[1] < fresh[1] - 0.5, (init, fresh)
    print("PASS")


if __name__ == "__main__":
    main()
