#!/usr/bin/env python3
"""h5ddp-train --data FILE.h5 (docs/DATA.md, issue 20) beside the built-in Fashion-MNIST path. One ctest per case:
  data_file_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix
Every subprocess is bounded; no assertion depends on the machine's speed."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
import h5ddp_test as ht  # noqa: E402
import promises_test as pt  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

NP = pt.NP
CONVERT = os.path.join(HERE, "..", "..", "tools", "h5ddp-data.py")


def train(run_dir, *extra, expect_rc=0, resume="none"):
    """h5ddp-train at NP ranks (one log record per step); fails the test unless it exits with expect_rc."""
    r = ht.mpirun(NP, [ht.tool("h5ddp-train"), "--run-dir", run_dir, "--no-fsync", "--threads", "1",
                       "--log-every", "1", "--resume", resume] + [str(a) for a in extra], pt.LAUNCH)
    ht.check(r.rc == expect_rc, f"exit {r.rc}, expected {expect_rc}: {r}")
    return r


def end_record(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["event"] == "end"][-1]


def fashion_h5():
    d = ht.scratch("data-fm")
    path = os.path.join(d, "fashion-mnist.h5")
    r = ht.run([ht.PY, CONVERT, "fashion-mnist", pt.DATA_DIR, "-o", path], 300)
    ht.check(r.rc == 0, f"converter failed: {r}")
    return path


def test_fashion_bitwise():
    """Fashion-MNIST converted to HDF5 (tools/h5ddp-data.py) and read row by row from the file trains bit for bit
    like the built-in in-memory path: same CNN (dropout on), 30 steps at NP ranks, every dataset of the final
    checkpoint identical and the same test accuracy and loss. Catches: a wrong row offset, another normalisation,
    labels of another row, a sample order that depends on the data source."""
    fm = fashion_h5()
    mem, h5 = ht.scratch("data-mem"), ht.scratch("data-h5")
    common = ["--model", "cnn", "--batch-size", 120, "--max-steps", 30]
    train(mem, *common)
    r = train(h5, *common, "--data", fm)
    ht.check("60000 samples [1, 28, 28] uint8" in r.text, f"no data line: {r}")
    ht.check_bitwise(ht.ckpt(mem, 30), ht.ckpt(h5, 30), "HDF5 data vs in-memory Fashion-MNIST")
    a, b = end_record(mem), end_record(h5)
    ht.check(a["test_accuracy"] == b["test_accuracy"] and abs(a["test_loss"] - b["test_loss"]) < 1e-6,
             f"evaluation differs: {a} vs {b}")
    return f"bitwise; test accuracy {a['test_accuracy']:.4f} both"


def test_async_save_beside_reads():
    """--async-checkpoint with --data: the background writer (HDF5) runs while the training loop reads rows (plain
    positional reads); every 5 steps, 40 steps: the final checkpoint equals a synchronous run's bit for bit.
    Catches: the data reads going through the non-thread-safe HDF5 library beside the writer (crash or corrupt
    rows), a save that sees a half-read batch."""
    fm = fashion_h5()
    sync, asy = ht.scratch("data-sync"), ht.scratch("data-async")
    common = ["--model", "mlp", "--mlp-hidden", "256", "--batch-size", 64, "--max-steps", 40, "--data", fm,
              "--checkpoint-every-steps", 5, "--keep-last", 0, "--no-eval"]
    train(sync, *common)
    train(asy, *common, "--async-checkpoint")
    for step in (20, 40):
        ht.check_bitwise(ht.ckpt(sync, step), ht.ckpt(asy, step), f"async vs sync at step {step}")
    return "async == sync at steps 20 and 40"


class Linear8(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc(x).squeeze(1)


def test_regression_targets():
    """Float targets (y float32 [N]) with a TorchScript linear model: the loss is the mean squared error, training
    fits y = x.w + 0.5 (test MSE below 1% of the targets' variance after 300 SGD steps), the end record carries
    test_loss and no accuracy, h5ddp-ckpt eval reports the same loss, and --keep-best (which keeps the best
    accuracy) is refused. Catches: cross-entropy on float targets, an accuracy invented for regression."""
    d = ht.scratch("data-regression")
    rng = np.random.default_rng(3)
    w = rng.normal(size=8).astype(np.float32)
    path = os.path.join(d, "reg.h5")
    with h5py.File(path, "w") as f:
        for split, n in (("train", 2048), ("test", 512)):
            x = rng.normal(size=(n, 8)).astype(np.float32)
            f[f"{split}/x"] = x
            f[f"{split}/y"] = (x @ w + 0.5).astype(np.float32)
    torch.manual_seed(0)
    model = os.path.join(d, "linear.pt")
    torch.jit.script(Linear8()).save(model)
    run = os.path.join(d, "run")
    train(run, "--model-file", model, "--data", path, "--batch-size", 64, "--epochs", 10, "--max-steps", 300,
          "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0")
    end = end_record(run)
    var = float(np.var(w)) * 8
    ht.check("test_accuracy" not in end and end["test_loss"] < 0.01 * var, f"end record {end} (variance {var:.3f})")
    r = ht.run([ht.tool("h5ddp-ckpt"), "eval", ht.ckpt(run, 300), "--data", path, "--count", "512"], 120)
    ht.check(r.rc == 0 and "accuracy -1" in r.out, f"eval: {r}")
    loss = float(r.out.split("loss ")[1].split()[0])
    ht.check(abs(loss - end["test_loss"]) <= 1e-5 * max(1.0, end["test_loss"]), f"eval {loss} vs {end['test_loss']}")
    r = train(os.path.join(d, "best"), "--model-file", model, "--data", path, "--batch-size", 64, "--max-steps", 4,
              "--keep-best", "--eval-every-steps", 2, expect_rc=1)
    ht.check("--keep-best" in r.text and "regression" in r.text, f"no clear error: {r}")
    return f"test MSE {end['test_loss']:.2e}, eval agrees, --keep-best refused"


def test_bf16_resume_bitwise():
    """--precision bf16 (autocast on the CPU here; the same scope on CUDA): it changes the numbers (the final weights
    differ from an fp32 run's), it learns (mean loss of the last 10 steps below the first 10's), and a run stopped
    at its step-12 checkpoint and resumed is bit for bit the uninterrupted one. Catches: autocast not applied,
    autocast state leaking past the forward (the next step or the save computing in bf16), a resume that loses
    bitwise exactness in bf16."""
    a, b, f = ht.scratch("bf16-a"), ht.scratch("bf16-b"), ht.scratch("bf16-fp32")
    common = ["--model", "cnn", "--batch-size", 64, "--checkpoint-every-steps", 12, "--keep-last", 0, "--no-eval"]
    train(a, *common, "--max-steps", 24, "--precision", "bf16")
    train(f, *common, "--max-steps", 24)
    train(b, *common, "--max-steps", 12, "--precision", "bf16")
    ht.check(ht.compare(ht.ckpt(a, 24), ht.ckpt(f, 24)).rc != 0, "bf16 and fp32 runs are identical: no autocast")
    r = train(b, *common, "--max-steps", 24, "--precision", "bf16", resume="auto")
    ht.check("resumed from" in r.text, f"did not resume: {r}")
    ht.check_bitwise(ht.ckpt(a, 24), ht.ckpt(b, 24), "bf16 resumed vs uninterrupted")
    with open(os.path.join(a, "metrics.jsonl")) as fh:
        losses = [x["loss"] for x in map(json.loads, fh) if x["event"] == "train"]
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    ht.check(len(losses) == 24 and last < first, f"bf16 losses {losses}")
    return f"bf16 != fp32, resume bitwise, loss {first:.3f} -> {last:.3f}"


TESTS = [test_fashion_bitwise, test_async_save_beside_reads, test_regression_targets, test_bf16_resume_bitwise]

if __name__ == "__main__":
    ht.cli(TESTS)
