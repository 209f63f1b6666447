#!/usr/bin/env python3
"""End to end: h5ddp-train --model-file M.pt (a TorchScript module defined HERE, in Python, not built into
h5ddp) with --data D.h5 (an HDF5 data set in the layout of docs/DATA.md, generated here). One ctest per case:

  script_model_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix

The model is a small residual CNN with BatchNorm (conv 3->16 stride 2 + BN + relu, one residual block of two
3x3 convs with BN and a skip add, adaptive average pool, linear to 10; no dropout). The data: 3x32x32 uint8
images, 10 classes told apart by a colour and a stripe pattern under noise (learnable in a few dozen steps),
per-channel mean/std attributes. Every run is small (global batch 64, at most 24 steps, --threads 1,
--no-fsync); every subprocess is bounded (a hang fails). What each case catches is said in its docstring."""
import json
import math
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
import h5ddp_test as ht  # noqa: E402
import promises_test as pt  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

NP = pt.NP
LAUNCH = 180        # seconds for one h5ddp-train launch (a run here takes seconds; the machine may be loaded)
BAD_LAUNCH = 120    # a run that must fail: it must do so within this bound, not hang
BATCH = 64          # global batch
CLASSES = 10
N_TRAIN, N_TEST = 1536, 512   # 24 steps of 64 per epoch; the test set is scored in full


# ---- the model (scripted from Python; h5ddp knows nothing of it) ----------------------------------------------
class ResidualBlock(nn.Module):
    def __init__(self, c: int, norm: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c) if norm else nn.Identity()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c) if norm else nn.Identity()

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


class SmallResNet(nn.Module):
    """[B, 3, 32, 32] -> logits [B, 10]. norm=False: the same network without BatchNorm (see elastic_2_to_1)."""

    def __init__(self, norm: bool = True, width: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width) if norm else nn.Identity()
        self.block = ResidualBlock(width, norm)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, CLASSES)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class TanhResNet(SmallResNet):
    """SmallResNet's parameters and buffers (same names and shapes) with other code: only /meta's model_class
    and model_hash tell it from SmallResNet."""

    def forward(self, x):
        x = torch.tanh(self.bn(self.stem(x)))
        x = self.block(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class OtherNet(nn.Module):
    """Another architecture (for resuming a run directory with another model)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 5, stride=4)
        self.fc = nn.Linear(8 * 7 * 7, CLASSES)

    def forward(self, x):
        return self.fc(torch.flatten(F.relu(self.conv(x)), 1))


class TwoInputs(nn.Module):
    """A forward that does not take one tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, CLASSES)

    def forward(self, x, y):
        return self.fc(torch.flatten(x, 1)) + y


def new_model(norm=True):
    torch.manual_seed(1234)
    return SmallResNet(norm)


def script(module, path):
    torch.jit.script(module).save(path)
    return path


# ---- the data set ------------------------------------------------------------------------------------------------
def make_samples(rng, n, shape=(3, 32, 32), classes=CLASSES):
    """uint8 images [n, *shape] and int64 labels: a class colour, horizontal or vertical stripes of a class
    frequency, and Gaussian noise. Learnable, but not trivially (noise of the size of the signal)."""
    y = rng.integers(0, classes, size=n).astype(np.int64)
    c, h, w = shape
    palette = np.random.default_rng(99).uniform(0.2, 0.8, size=(classes, c))
    rows, cols = np.arange(h)[:, None], np.arange(w)[None, :]
    x = np.empty((n,) + tuple(shape), np.uint8)
    for i in range(n):
        k = int(y[i])
        freq = 1 + k % 5
        stripes = np.sin(2 * np.pi * freq * (rows if k < 5 else cols) / h + np.zeros((h, w)))
        img = palette[k][:, None, None] * 255 + 35 * stripes[None] + rng.normal(0, 45, size=(c, h, w))
        x[i] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return x, y


def write_data(path, train=None, test=None, mean=None, std=None, num_classes=None, drop=(), y_len_delta=0):
    """A data file in docs/DATA.md's layout (h5py defaults: contiguous). train/test: (x, y) pairs. drop: dataset
    paths to leave out (e.g. '/train/y'); y_len_delta: /train/y shorter by that many rows."""
    with h5py.File(path, "w") as f:
        f.attrs["h5ddp_data_format"] = np.int64(1)
        if num_classes is not None:
            f.attrs["num_classes"] = np.int64(num_classes)
        for split, xy in (("train", train), ("test", test)):
            if xy is None:
                continue
            x, y = xy
            if f"/{split}/x" not in drop:
                dx = f.create_dataset(f"{split}/x", data=x)
                if mean is not None:
                    dx.attrs["mean"] = np.asarray(mean, np.float32)
                    dx.attrs["std"] = np.asarray(std, np.float32)
            if f"/{split}/y" not in drop:
                f.create_dataset(f"{split}/y", data=y[:len(y) - y_len_delta] if split == "train" else y)
    return path


def channel_stats(x):
    """Per-channel mean and population std on the x/255 scale, float32 (what tools/h5ddp-data.py computes)."""
    v = x.astype(np.float64) / 255.0
    return v.mean(axis=(0, 2, 3)).astype(np.float32), v.std(axis=(0, 2, 3)).astype(np.float32)


_DATA = {}


def dataset(d):
    """The case's data file (generated once per process, fixed numpy seed) and its arrays."""
    if "arrays" not in _DATA:
        rng = np.random.default_rng(20261204)
        xtr, ytr = make_samples(rng, N_TRAIN)
        xte, yte = make_samples(rng, N_TEST)
        mean, std = channel_stats(xtr)
        _DATA["arrays"] = (xtr, ytr, xte, yte, mean, std)
    xtr, ytr, xte, yte, mean, std = _DATA["arrays"]
    path = write_data(os.path.join(d, "colours.h5"), (xtr, ytr), (xte, yte), mean, std, num_classes=CLASSES)
    return path, _DATA["arrays"]


def normalise(x, mean, std):
    """docs/DATA.md's uint8 normalisation, in float32 exactly as h5ddp computes it:
    x * (1 / (255 * std[c])) - mean[c] / std[c]."""
    std = np.asarray(std, np.float32)
    mean = np.asarray(mean, np.float32)
    scale = (np.float32(1) / (np.float32(255) * std)).astype(np.float32)
    shift = (mean / std).astype(np.float32)
    t = torch.from_numpy(x).to(torch.float32)
    return t * torch.from_numpy(scale)[None, :, None, None] - torch.from_numpy(shift)[None, :, None, None]


def py_eval(model, x, y, mean, std):
    """(mean cross-entropy, accuracy) in eval mode, float64 accumulation of per-sample losses."""
    model.eval()
    with torch.no_grad():
        logits = model(normalise(x, mean, std))
        losses = F.cross_entropy(logits, torch.from_numpy(y), reduction="none").to(torch.float64)
        acc = (logits.argmax(1).numpy() == y).mean()
    return float(losses.mean()), float(acc)


# ---- running h5ddp-train -----------------------------------------------------------------------------------------
def train_args(run_dir, model, data, *extra):
    return [ht.tool("h5ddp-train"), "--run-dir", run_dir, "--model-file", model, "--data", data,
            "--batch-size", str(BATCH), "--no-fsync", "--threads", "1", "--log-every", "1", "--seed", "5",
            "--keep-last", "0"] + [str(a) for a in extra]


def train(np_, run_dir, model, data, *extra, expect_rc=0, timeout=LAUNCH):
    r = ht.mpirun(np_, train_args(run_dir, model, data, *extra), timeout)
    if expect_rc is not None:
        ht.check(r.rc == expect_rc, f"h5ddp-train at {np_} ranks {' '.join(map(str, extra))}: exit code {r.rc}, "
                                    f"expected {expect_rc}: {r}")
    return r


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def events(run_dir, kind):
    return [r for r in records(run_dir) if r["event"] == kind]


def model_datasets(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][()] for k in f["model"]}


def check_state_names(ckpt, model):
    names = set(model_datasets(ckpt))
    want = set(model.state_dict().keys())
    ht.check(names == want, f"{ckpt} /model names differ from the Python state_dict: only in the file "
                            f"{sorted(names - want)}, only in state_dict {sorted(want - names)}")
    return names


def committed(run_dir, step):
    """True once ckpt-<step> is committed: `latest` names it (the commit moves `latest` after the rename)."""
    name = f"ckpt-{step:08d}.h5"
    target = ht.latest_target(run_dir)
    return target is not None and os.path.basename(target) == name and os.path.isfile(os.path.join(run_dir, name))


def max_step_printed(text):
    steps = [int(m) for m in re.findall(r"^step (\d+)/", text, re.M)]
    return max(steps) if steps else 0


# ---- 1 ------------------------------------------------------------------------------------------------------------
def test_kill_resume_bitwise():
    """A: NP ranks, 24 uninterrupted steps (checkpoints every 8). B: the same, SIGKILLed (every rank, no warning)
    after its checkpoint at step 16 is committed and step 17 has run, then resumed (--resume auto) to 24. The
    final checkpoints of A and B are equal bit for bit: every /model and /optimizer dataset (BatchNorm running
    statistics and num_batches_tracked included), and every other dataset (h5ddp_test.compare_checkpoints). The /model
    names are exactly the Python state_dict() keys; /meta says model=torchscript with class, hash and file.
    Catches: BN buffers not saved or not restored (they would restart from init), a buffer saved from a rank
    other than the one evaluated, names that do not load into the Python class, a resume that loses the
    script's state, the sample order or the data position of an HDF5 data set."""
    d = ht.scratch("script-kill")
    data, _ = dataset(d)
    model = new_model()
    m = script(model, os.path.join(d, "resnet.pt"))
    common = ["--max-steps", 24, "--epochs", 2, "--checkpoint-every-steps", 8, "--no-eval"]
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    t0 = time.monotonic()
    train(NP, a, m, data, *common)
    t_a = time.monotonic() - t0

    job = ht.Job(NP, train_args(b, m, data, *common, "--step-sleep-ms", 100))
    try:
        job.wait_for(lambda: committed(b, 16) and max_step_printed(job.text) >= 17, 120,
                     "checkpoint 16 committed and step 17 printed")
        job.kill()
    finally:
        job.kill()
    killed_at = max_step_printed(job.text)
    ht.check(job.p.returncode != 0, f"the killed run exited {job.p.returncode}")
    ht.check(not os.path.exists(ht.ckpt(b, 24)), f"the run finished (step 24) before the kill:\n{job.text[-2000:]}")
    ht.check(killed_at < 24, f"killed after step {killed_at}")
    r = train(NP, b, m, data, *common)
    ht.check(re.search(r"resumed from .*ckpt-00000016\.h5 at step 16", r.text),
             f"the second run did not resume from ckpt-16: {r}")
    res = events(b, "resume")
    ht.check(res and res[-1]["step"] == 16, f"resume records {res}")

    ca, cb = ht.ckpt(a, 24), ht.ckpt(b, 24)
    groups = ht.compare_checkpoints(ca, cb, groups=("model", "optimizer"))
    n, diffs = groups.compared, groups.problems
    ht.check(not diffs, f"/model and /optimizer of A and B differ at step 24 ({len(diffs)} of {n}): {diffs[:10]}")
    ht.check_bitwise(ca, cb, "uninterrupted vs killed + resumed (all datasets)")

    names = check_state_names(ca, model)
    bn = sorted(k for k in names if k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    ht.check(len(bn) == 9, f"BatchNorm buffers in /model: {bn}")
    w = model_datasets(ca)
    init = model.state_dict()
    for k in bn:
        if k.endswith("num_batches_tracked"):
            ht.check(int(w[k]) == 24, f"{k} = {w[k]} after 24 training forwards, expected 24")
        else:
            ht.check(not np.array_equal(w[k], init[k].numpy()), f"{k} never left its initial value")
    meta = ht.attrs(ca, "meta")
    ht.check(meta.get("model") == "torchscript" and str(meta.get("model_class", "")).endswith("SmallResNet")
             and re.fullmatch(r"[0-9a-f]{8,}", str(meta.get("model_hash", "")))
             and os.path.basename(str(meta.get("model_file", ""))) == "resnet.pt", f"/meta of {ca}: {meta}")
    return (f"bitwise at step 24 ({n} /model+/optimizer datasets, {len(bn)} BN buffers) after a kill at step "
            f"{killed_at}; A took {t_a:.1f}s")


# ---- 2 ------------------------------------------------------------------------------------------------------------
def test_export_eval():
    """24 steps at NP ranks with the final evaluation; h5ddp-ckpt export of the final checkpoint loads strictly
    into a fresh instance of the Python class; PyTorch's mean cross-entropy over /test (eval mode, docs/DATA.md's
    normalisation) equals h5ddp-train's test_loss (metrics.jsonl 'end') and h5ddp-ckpt eval --model-file --data
    --split test within 1e-5 relative, and the accuracies agree. The model learnt (accuracy well above 10%).
    Catches: another normalisation (mean/std per channel, 1/255), BN evaluated with batch statistics or other
    ranks' running statistics, names or layouts that do not load into the class, a test loss over part of the
    set or summed instead of averaged."""
    d = ht.scratch("script-export")
    data, (_, _, xte, yte, mean, std) = dataset(d)
    m = script(new_model(), os.path.join(d, "resnet.pt"))
    run = os.path.join(d, "run")
    train(NP, run, m, data, "--max-steps", 24, "--epochs", 2, "--lr", "0.01")
    ck = ht.ckpt(run, 24)
    out = os.path.join(d, "export.pt")
    r = ht.run([ht.tool("h5ddp-ckpt"), "export", ck, "--to", out], 120)
    ht.check(r.rc == 0, f"export failed: {r}")
    exported = torch.load(out)
    fresh = SmallResNet()
    fresh.load_state_dict(exported["model"], strict=True)
    py_loss, py_acc = py_eval(fresh, xte, yte, mean, std)

    end = events(run, "end")
    ht.check(end and "test_loss" in end[-1] and "test_accuracy" in end[-1], f"no end record with test results: "
                                                                             f"{records(run)[-3:]}")
    tr_loss, tr_acc = float(end[-1]["test_loss"]), float(end[-1]["test_accuracy"])
    r = ht.run([ht.tool("h5ddp-ckpt"), "eval", ck, "--model-file", m, "--data", data, "--split", "test",
                "--count", str(N_TEST)], 120)
    ht.check(r.rc == 0, f"h5ddp-ckpt eval failed: {r}")
    g = re.search(r"(?:images|samples) (\d+)\s+loss ([0-9.eE+-]+)\s+accuracy ([0-9.eE+-]+)", r.out)
    ht.check(g and int(g.group(1)) == N_TEST, f"no eval result over {N_TEST} samples in {r.out!r}")
    ev_loss, ev_acc = float(g.group(2)), float(g.group(3))
    print(f"test loss: PyTorch {py_loss:.9f}  h5ddp-train {tr_loss:.9f}  h5ddp-ckpt eval {ev_loss:.9f}; "
          f"accuracy {py_acc:.4f} / {tr_acc:.4f} / {ev_acc:.4f}", flush=True)

    def rel(x, y):
        return abs(x - y) / max(abs(y), 1e-12)

    ht.check(rel(tr_loss, py_loss) <= 1e-5, f"h5ddp-train's test_loss {tr_loss} vs PyTorch {py_loss}")
    ht.check(rel(ev_loss, py_loss) <= 1e-5, f"h5ddp-ckpt eval's loss {ev_loss} vs PyTorch {py_loss}")
    ht.check(abs(tr_acc - py_acc) <= 1.0 / N_TEST and abs(ev_acc - py_acc) <= 1.0 / N_TEST,
             f"accuracy: PyTorch {py_acc}, h5ddp-train {tr_acc}, h5ddp-ckpt eval {ev_acc}")
    ht.check(py_acc > 0.3, f"the model did not learn: test accuracy {py_acc} after 24 steps (chance 0.1)")
    return f"loss {py_loss:.6f} (diffs {rel(tr_loss, py_loss):.1e}, {rel(ev_loss, py_loss):.1e}), acc {py_acc:.3f}"


# ---- 3 ------------------------------------------------------------------------------------------------------------
def test_elastic_2_to_1():
    """A run of the BN model at 2 ranks to step 12 (checkpoint at 12) resumed at 1 rank to step 20: it runs, the
    'resume' record says saved_world_size 2, world_size 1, every step 1..20 is logged once with a finite loss,
    and the weights end close to an uninterrupted 2-rank run's. Close, not equal within rounding: BatchNorm
    normalises each rank's batch with that rank's own statistics (32 samples at 2 ranks, 64 at 1) and keeps
    rank 0's running statistics, so after the resume the two runs legitimately differ. Measured here: over all
    parameters ||a-b|| = 2.5e-3 ||b|| (per tensor up to 1.5e-2), against 7.0e-2 for the 8 steps 13..20
    themselves (step 12 vs step 20) and 7.1e-2 for a run with another data order (--seed); the bound,
    ||a-b|| <= 1e-2 ||b|| over all parameters (BN running statistics and optimizer moments excluded), sits
    between, about the effect of one of the 8 steps gone wrong.
    Then the same network without BatchNorm (no conv has a bias, as with BN: a conv bias's gradient is a sum
    over batch x pixels with heavy cancellation, and its Adam moments then differ by ~1e-5 from the summation
    order alone), where only the summation order changes: every dataset
    (optimizer state included) within the tolerance tests/train/resume_elastic.sh uses for Adam, per tensor
    ||a-b|| <= 1e-5 ||b|| (h5ddp_test.compare with --norm-rtol 1e-5 --skip-rng).
    Catches: an elastic resume that fails with a script model or an HDF5 data set, a data position or sample
    order that depends on the rank count, optimizer state lost or mis-sharded, a resume not logged."""
    assert NP == 2, "this case is written for 2 -> 1 ranks"
    d = ht.scratch("script-elastic")
    data, _ = dataset(d)
    summary = []
    for norm in (True, False):
        tag = "bn" if norm else "nobn"
        model = new_model(norm)
        m = script(model, os.path.join(d, f"resnet-{tag}.pt"))
        e, ref = os.path.join(d, f"elastic-{tag}"), os.path.join(d, f"ref-{tag}")
        common = ["--epochs", 2, "--no-eval"]
        train(2, e, m, data, *common, "--max-steps", 12, "--checkpoint-every-steps", 12)
        r = train(1, e, m, data, *common, "--max-steps", 20)
        ht.check(re.search(r"resumed from .*ckpt-00000012\.h5 at step 12", r.text), f"no resume from step 12: {r}")
        res = [(x["step"], x["saved_world_size"], x["world_size"]) for x in events(e, "resume")]
        ht.check(res == [(12, 2, 1)], f"resume records {res}, expected [(12, 2, 1)]")
        losses = [(x["step"], x["loss"]) for x in events(e, "train")]
        ht.check([s for s, _ in losses] == list(range(1, 21)), f"train records by step {[s for s, _ in losses]}")
        ht.check(all(isinstance(v, (int, float)) and math.isfinite(v) for _, v in losses), f"losses {losses}")
        train(2, ref, m, data, *common, "--max-steps", 20)
        a, b = ht.ckpt(e, 20), ht.ckpt(ref, 20)
        if norm:
            params = [n for n, _ in model.named_parameters()]
            wa, wb = model_datasets(a), model_datasets(b)
            per = {n: float(np.linalg.norm(wa[n].astype(np.float64) - wb[n]) /
                            max(np.linalg.norm(wb[n].astype(np.float64)), 1e-30)) for n in params}
            va = np.concatenate([wa[n].astype(np.float64).ravel() for n in params])
            vb = np.concatenate([wb[n].astype(np.float64).ravel() for n in params])
            total = float(np.linalg.norm(va - vb) / np.linalg.norm(vb))
            print(f"[bn] elastic 2->1 vs uninterrupted 2 ranks at step 20, parameters ||a-b||/||b||: all {total:.2e}; "
                  + ", ".join(f"{n} {v:.1e}" for n, v in per.items()), flush=True)
            ht.check(total <= 1e-2, f"[bn] parameters of the elastic run differ from the uninterrupted run's by "
                                    f"{total:.3g} (relative L2 over all parameters), more than 1e-2: {per}")
            ht.check(np.array_equal(wa["bn.num_batches_tracked"], wb["bn.num_batches_tracked"]),
                     f"[bn] num_batches_tracked {wa['bn.num_batches_tracked']} vs {wb['bn.num_batches_tracked']}")
            summary.append(f"bn: parameters within {total:.1e}")
        else:
            cmp = ht.compare(b, a, "--skip-rng", "--norm-rtol", "1e-5")
            print(f"[nobn] elastic 2->1 vs uninterrupted 2 ranks at step 20 (--norm-rtol 1e-5): {cmp.out.strip()}",
                  flush=True)
            ht.check(cmp.rc == 0, f"[nobn] elastic 2 -> 1 differs from the uninterrupted 2-rank run beyond "
                                  f"--norm-rtol 1e-5: {cmp}")
            summary.append("nobn: every tensor within 1e-5")
        summary[-1] += f", final loss {losses[-1][1]:.4f}"
    return "; ".join(summary)


def sequential_model():
    """A scripted nn.Sequential with BatchNorm: forward is a chain of its top-level children, which --shard
    parameters (ZeRO-3) runs one at a time ("0", "1", "4", "6" hold parameters; ReLU, pooling, Flatten none)."""
    torch.manual_seed(4321)
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(4), nn.Conv2d(16, 16, 1), nn.Flatten(), nn.Linear(256, CLASSES))


def test_zero3_sequential():
    """--shard parameters with a --model-file: a scripted nn.Sequential (BatchNorm included) trains at 2 ranks
    like the replicated run, bitwise (a sum of two gradients is the same in a reduce-scatter and an allreduce;
    Adam is elementwise), the weights written in row pieces by the two ranks; the test accuracy is scored (every
    rank runs as many forwards, each gathering the units); the file resumes replicated at 1 rank. A model whose
    forward is not a chain of its children (SmallResNet: residual adds, blocks at depth 2) trains under it bitwise
    like its replicated run too (units chosen by size at any depth, its graph rewritten to gather them).
    Catches: a unit gathered from the wrong rows, a regather missing before a backward, model row pieces
    written or read wrong, an evaluation that hangs on a collective, a residual's second use of an input
    reading a freed unit, a unit call missed by the graph rewrite."""
    d = ht.scratch("script-zero3")
    data, _ = dataset(d)
    m = script(sequential_model(), os.path.join(d, "seq.pt"))
    rep, z3 = os.path.join(d, "rep"), os.path.join(d, "z3")
    common = ["--max-steps", 8, "--eval-every-steps", 8]
    train(2, rep, m, data, *common)
    r = train(2, z3, m, data, *common, "--shard", "parameters")
    acc = [x for x in events(z3, "eval")]
    ht.check(acc and acc[-1]["accuracy"] == events(rep, "eval")[-1]["accuracy"],
             f"ZeRO-3 test accuracy {acc} differs from replicated {events(rep, 'eval')}")
    cmp = ht.compare(ht.ckpt(rep, 8), ht.ckpt(z3, 8), "--skip-rng")
    ht.check(cmp.rc == 0, f"--shard parameters at 2 ranks differs from replicated: {cmp}")
    with h5py.File(ht.ckpt(z3, 8), "r") as f:
        shard = f["meta"].attrs["shard"]
        shard = shard.decode() if isinstance(shard, bytes) else shard
    ht.check(shard == "parameters", f"/meta shard is {shard!r}")
    r = train(1, z3, m, data, "--max-steps", 10, "--no-eval")
    ht.check(re.search(r"resumed from .*ckpt-00000008\.h5 at step 8", r.text), f"no resume from step 8: {r}")
    res = os.path.join(d, "resnet.pt")
    script(new_model(), res)
    train(2, os.path.join(d, "res-rep"), res, data, *common)
    r = train(2, os.path.join(d, "res-z3"), res, data, *common, "--shard", "parameters", "--shard-unit-params", 3000)
    units = re.search(r"(\d+) units \(", r.text)
    ht.check(units and int(units.group(1)) >= 4, f"expected the residual model split into units at depth 2: {r.text}")
    cmp = ht.compare(ht.ckpt(os.path.join(d, "res-rep"), 8), ht.ckpt(os.path.join(d, "res-z3"), 8), "--skip-rng")
    ht.check(cmp.rc == 0, f"a residual model under --shard parameters differs from replicated: {cmp}")
    return (f"bitwise with replicated at 2 ranks, test accuracy {acc[-1]['accuracy']:.4f}; a residual model in "
            f"{units.group(1)} units bitwise too")


# ---- 4 ------------------------------------------------------------------------------------------------------------
def test_bad_inputs():
    """Each bad input is one run at NP ranks that exits non-zero within BAD_LAUNCH seconds (no hang) with a
    message naming the file and the problem: /train/y missing; x and y of different lengths; a label (12) outside
    the model's 10 classes; samples [1, 28, 28] for a model of [3, 32, 32]; a --model-file that is a torch.save'd
    state dict, or text; a forward taking two tensors; a run directory resumed with another model (another
    architecture: the message names the checkpoint and this run's model; the same parameters with other code:
    the message names both model classes). The run directory is left as it was. The messages are printed for a
    reviewer."""
    d = ht.scratch("script-bad")
    rng = np.random.default_rng(7)
    x, y = make_samples(rng, 128)
    mean, std = channel_stats(x)
    good = write_data(os.path.join(d, "good.h5"), (x, y), (x[:64], y[:64]), mean, std)
    model = new_model()
    m = script(model, os.path.join(d, "resnet.pt"))
    small = ["--max-steps", 2, "--no-eval"]
    report = []

    def bad(what, run_dir, model_file, data_file, needles, any_of=(), opts=small):
        """needles: all must occur in the error message; any_of: at least one must (case-insensitive). The error
        message is the output from the first line that says 'error' on (so the run's own 'data: FILE ...' and
        'model: ...' lines, which name the file and the shape anyway, do not count)."""
        r = train(NP, os.path.join(d, run_dir), model_file, data_file, *opts, expect_rc=None, timeout=BAD_LAUNCH)
        ht.check(r.rc != 0, f"{what}: exit code 0, expected a failure: {r}")
        m_err = re.search(r"^.*\berror\b.*$", r.text, re.M | re.I)
        ht.check(m_err, f"{what}: exit code {r.rc} but no line says 'error': {r}")
        err = r.text[m_err.start():]
        banner = re.search(r"^-{20,}$", err, re.M)  # mpirun's report of the exit code follows
        err = err[:banner.start()] if banner else err
        lines = [ln[:400] for ln in err.splitlines() if ln.strip()]
        shown = lines if len(lines) <= 6 else lines[:3] + ["..."] + lines[-2:]
        print(f"--- {what}: exit {r.rc} after {r.seconds:.1f}s; message:\n    " + "\n    ".join(shown), flush=True)
        missing = [n for n in needles if n.lower() not in err.lower()]
        ht.check(not missing, f"{what}: the error message does not contain {missing}: {r}")
        if any_of:
            ht.check(any(n.lower() in err.lower() for n in any_of),
                     f"{what}: the error message names none of {list(any_of)}: {r}")
        report.append(f"{what}: rc {r.rc}")
        return err

    # Data files.
    no_y = write_data(os.path.join(d, "no-train-y.h5"), (x, y), (x[:64], y[:64]), mean, std, drop=("/train/y",))
    bad("missing /train/y", "no-y", m, no_y, ["no-train-y.h5", "/train/y"])
    short_y = write_data(os.path.join(d, "short-y.h5"), (x, y), (x[:64], y[:64]), mean, std, y_len_delta=1)
    bad("x and y of different lengths", "short-y", m, short_y, ["short-y.h5", "128", "127"])
    y12 = y.copy()
    y12[37] = 12
    label = write_data(os.path.join(d, "label-12.h5"), (x, y12), (x[:64], y[:64]), mean, std)
    bad("label 12 with a 10-class model", "label", m, label, ["label-12.h5", "12"], any_of=["label", "class"])
    xg, yg = make_samples(rng, 128, shape=(1, 28, 28))
    gray = write_data(os.path.join(d, "gray-28.h5"), (xg, yg), (xg[:64], yg[:64]), 0.5, 0.25)
    bad("samples [1, 28, 28] for a [3, 32, 32] model", "shape", m, gray, ["gray-28.h5", "[1, 28, 28]"],
        any_of=["3, 32, 32", "shape"])

    # Model files.
    state = os.path.join(d, "state-dict.pt")
    torch.save(model.state_dict(), state)
    bad("a torch.save'd state dict as --model-file", "state", state, good, ["state-dict.pt"],
        any_of=["torchscript", "script"])
    text = os.path.join(d, "notes.pt")
    with open(text, "w") as f:
        f.write("this is not a TorchScript archive\n")
    bad("a text file as --model-file", "text", text, good, ["notes.pt"], any_of=["torchscript", "script"])
    two = script(TwoInputs(), os.path.join(d, "two-inputs.pt"))
    bad("forward(self, x, y)", "two", two, good, ["two-inputs.pt"], any_of=["forward", "argument", "input"])

    # Resuming a run directory with another model.
    run = os.path.join(d, "resume-other")
    train(NP, run, m, good, *small, timeout=BAD_LAUNCH)
    other = script(OtherNet(), os.path.join(d, "other-net.pt"))
    err = bad("resume with another model", "resume-other", other, good, ["model", "ckpt-00000002.h5"],
              any_of=["OtherNet", "other-net.pt"], opts=["--max-steps", 4, "--no-eval"])
    ht.check(committed(run, 2) and not os.path.exists(ht.ckpt(run, 4)),
             f"the refused resume changed the run directory: {sorted(os.listdir(run))}")
    # docs/TRAINING.md ("Your own model and data"): the error names both models.
    ht.check("SmallResNet" in err and "OtherNet" in err, f"the error does not name both models: {err}")
    # The same names and shapes with other code: only the checkpoint's model_class/model_hash can tell.
    tanh = script(TanhResNet(), os.path.join(d, "tanh-resnet.pt"))
    bad("resume with the same parameters but other code", "resume-other", tanh, good,
        ["model", "ckpt-00000002.h5", "TanhResNet", "SmallResNet"], opts=["--max-steps", 4, "--no-eval"])
    ht.check(committed(run, 2) and not os.path.exists(ht.ckpt(run, 4)),
             f"the refused resume changed the run directory: {sorted(os.listdir(run))}")
    return "; ".join(report)


TESTS = [test_kill_resume_bitwise, test_export_eval, test_elastic_2_to_1, test_zero3_sequential, test_bad_inputs]

if __name__ == "__main__":
    ht.cli(TESTS)
