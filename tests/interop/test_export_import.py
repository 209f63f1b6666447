"""export -> import -> verify -> --init-from round-trips, bitwise on the model tensors, for three writers: the default
job (the built-in CNN), a TorchScript GPT with GPT-2's two-name tie (lm_head.weight = wte.weight) trained under
--shard parameters at 2 ranks (its weights written as row pieces), and a ZeRO-2 run (--shard gradients).
`h5ddp-ckpt export` writes a TorchScript pickle (container types ride along as torch.jit._pickle.restore_type_tag);
`h5ddp-ckpt import` must read it back: every /model dataset of the imported file equals the original checkpoint's
(dtype, shape, bytes), the file verifies, and h5ddp-train --init-from starts from exactly those weights (its step-0
run starts from them). Import carries the model only (a fine-tuning start), not the optimizer state: a resume that needs
the optimizer resumes from the .h5 itself."""
import os

import h5py
import numpy as np

import interop_common as ic

GPT = ("tools", "examples", "gpt.py")
TEXT = "/usr/share/common-licenses/GPL-3"


def model_datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["model"].visititems(lambda n, o: out.__setitem__(n, (o.dtype, o.shape, o[()].tobytes()))
                              if isinstance(o, h5py.Dataset) else None)
    return out


def round_trip(args, w, tag, run_dir, train_extra):
    """Export the run's latest checkpoint, import it, verify it, start a run from it; returns the tensor count."""
    ckpt = ic.latest_checkpoint(run_dir)
    pt, imported = w(f"{tag}-export.pt"), w(f"{tag}-imported.h5")
    ic.run([args.ckpt, "export", ckpt, "--to", pt])
    ic.run([args.ckpt, "import", pt, "--to", imported])
    ic.run([args.ckpt, "verify", imported])
    want, got = model_datasets(ckpt), model_datasets(imported)
    assert sorted(got) == sorted(want), (tag, sorted(set(got) ^ set(want)))
    for name, (dtype, shape, data) in want.items():
        assert got[name][0] == dtype and got[name][1] == shape, (tag, name, got[name][:2], (dtype, shape))
        assert got[name][2] == data, f"{tag}: {name} differs after export -> import"
    # --init-from: a fresh run starts from those weights. One step at lr 1e-30 moves no weight that is not (near)
    # zero by even one float32 unit, so its step-1 checkpoint holds the imported weights within that.
    fresh = w(f"{tag}-finetune")
    ic.train(args, 1, fresh, "--init-from", imported, "--max-steps", "1", "--lr", "1e-30", *train_extra)
    with h5py.File(os.path.join(fresh, "ckpt-00000001.h5"), "r") as f:
        for name, (dtype, shape, data) in want.items():
            a, b = f["model"][name][()], np.frombuffer(data, dtype=dtype).reshape(shape)
            assert np.allclose(a, b, rtol=1e-6, atol=1e-20), f"{tag}: --init-from did not start from {name}"
    return len(want)


def main():
    args = ic.parse_args(__doc__)
    if not os.path.exists(TEXT):
        print(f"SKIP: {TEXT} is missing")
        return 77
    with ic.Scratch(args, "export-import") as w:
        counts = {}
        ic.train(args, 2, w("cnn"), "--max-steps", "3")
        counts["cnn"] = round_trip(args, w, "cnn", w("cnn"), ())

        data, model = w("gpl.h5"), w("gpt.pt")
        ic.run(["/usr/bin/python3", os.path.join(args.source_dir, "tools", "h5ddp-data.py"), "text", TEXT,
                "--context", "16", "-o", data])
        ic.run(["/usr/bin/python3", os.path.join(args.source_dir, *GPT), "script", "-o", model, "--context", "16",
                "--layers", "2", "--heads", "2", "--dim", "16", "--tie-weights"])
        gpt = ("--model-file", model, "--data", data, "--batch-size", "8")
        ic.train(args, 2, w("gpt"), *gpt, "--max-steps", "3", "--shard", "parameters")
        counts["gpt, --shard parameters"] = round_trip(args, w, "gpt", w("gpt"), gpt)
        with h5py.File(w("gpt-imported.h5"), "r") as f:
            assert np.array_equal(f["model/wte.weight"][()], f["model/lm_head.weight"][()]), "the tie is lost"

        ic.train(args, 2, w("zero2"), "--model", "mlp", "--max-steps", "3", "--shard", "gradients")
        counts["mlp, --shard gradients"] = round_trip(args, w, "zero2", w("zero2"), ("--model", "mlp"))
        print("export -> import -> verify -> --init-from bitwise: " +
              ", ".join(f"{k} ({n} tensors)" for k, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
