"""h5ddp-ckpt export: a checkpoint from a short h5ddp-train run becomes a torch.load-able dict whose model
loads into docs/MODELS.md's Cnn and gives the same loss as h5ddp's own C++ evaluation (h5ddp-ckpt eval)
on a fixed batch of Fashion-MNIST test images; its optimizer entry loads into torch.optim.Adam; the tensors
are bit-identical to the datasets h5py reads from the file."""
import h5py
import numpy as np
import torch
import torch.nn.functional as F

import interop_common as ic

STEPS = 20
EVAL_IMAGES = 500
TOLERANCE = 1e-5


def main():
    args = ic.parse_args(__doc__)
    Cnn, _ = ic.model_classes(args.source_dir)
    with ic.Scratch(args, "export") as w:
        ic.train(args, 2, w("run"), "--max-steps", str(STEPS), "--batch-size", "60", "--seed", "7")
        ckpt = ic.latest_checkpoint(w("run"))
        ic.run([args.ckpt, "export", ckpt, "--to", w("ckpt.pt")])

        d = torch.load(w("ckpt.pt"))
        assert type(d) is dict, type(d)
        assert d["step"] == STEPS and d["optimizer_type"] == "adam", (d["step"], d["optimizer_type"])
        assert d["meta"]["model"] == "cnn" and d["h5ddp"]["world_size"] == 2, (d["meta"], d["h5ddp"])

        # The model loads strictly (same keys and shapes) into the documented module.
        model = Cnn()
        fresh = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(d["model"])
        assert any(not torch.equal(fresh[k], v) for k, v in model.state_dict().items())

        # Same loss as h5ddp's C++ forward pass, eval mode, same images.
        x, y = ic.fashion_mnist("t10k", 0, EVAL_IMAGES)
        py_loss, py_acc = ic.eval_loss(model, x, y)
        cpp_loss, cpp_acc = ic.ckpt_eval(args, ckpt, EVAL_IMAGES)
        print(f"loss: PyTorch {py_loss:.9f}  h5ddp {cpp_loss:.9f}  |diff| {abs(py_loss - cpp_loss):.2e}")
        print(f"accuracy: PyTorch {py_acc:.6f}  h5ddp {cpp_acc:.6f}")
        assert abs(py_loss - cpp_loss) <= TOLERANCE, (py_loss, cpp_loss)
        assert abs(py_acc - cpp_acc) <= 1.0 / EVAL_IMAGES, (py_acc, cpp_acc)
        assert py_loss < 2.0, f"20 steps of Adam should have left chance level (ln 10 = 2.303), got {py_loss}"

        # Every tensor equals the dataset h5py reads, bit for bit.
        with h5py.File(ckpt, "r") as f:
            for k, v in d["model"].items():
                assert torch.equal(v, torch.from_numpy(f["model"][k][()])), k
            for p, st in d["optimizer"]["state"].items():
                for key, v in st.items():
                    ref = torch.from_numpy(np.asarray(f["optimizer/state"][p][key][()]))
                    assert torch.equal(v, ref.to(v.dtype)), (p, key)
            assert set(d["model"]) == set(f["model"].keys())

        # The optimizer entry is a torch.optim state dict (parameter names as ids) that Adam accepts.
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        opt.load_state_dict(d["optimizer"])
        names = [n for n, _ in model.named_parameters()]
        assert d["optimizer"]["param_groups"][0]["params"] == names
        for n, p in model.named_parameters():
            s = opt.state[p]
            assert torch.equal(s["exp_avg"], d["optimizer"]["state"][n]["exp_avg"]), n
            assert float(s["step"]) == STEPS, (n, s["step"])
        model.train()
        F.cross_entropy(model(x[:60]), y[:60]).backward()
        opt.step()  # a step from the loaded state works (state layout and hyperparameters are right)

        # --add-prefix module. gives keys for code that holds the model wrapped (DataParallel / DDP).
        ic.run([args.ckpt, "export", ckpt, "--to", w("ddp.pt"), "--add-prefix", "module."])
        dp = torch.load(w("ddp.pt"))
        assert all(k.startswith("module.") for k in dp["model"]), list(dp["model"])
        wrapped = torch.nn.DataParallel(Cnn())
        wrapped.load_state_dict(dp["model"])
        assert torch.equal(wrapped.module.fc2.weight, d["model"]["fc2.weight"])
    print("PASS")


if __name__ == "__main__":
    main()
