"""Shared helpers of the interop tests (run with the real PyTorch: /usr/bin/python3, i.e. $H5DDP_PYTHON).

The built-in models come from docs/MODELS.md itself (its ```python blocks are executed), so the tests
also prove that the documentation rebuilds h5ddp's models exactly.
"""
import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--train", required=True, help="h5ddp-train executable")
    p.add_argument("--ckpt", required=True, help="h5ddp-ckpt executable")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--source-dir", default=os.environ.get("H5DDP_SOURCE_DIR", "."))
    p.add_argument("--work-dir", default=None, help="scratch directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args()


class Scratch:
    """A scratch directory removed at exit unless the test failed or --keep was given."""

    def __init__(self, args, tag):
        base = args.work_dir or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix=tag + "-", dir=base)
        self.keep = args.keep

    def __call__(self, *parts):
        return os.path.join(self.path, *parts)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            print(f"scratch directory kept: {self.path}")
        return False


def run(cmd, timeout=120, expect=0, echo_stdout=True):
    """Runs cmd, echoes it and its output, checks the exit code; returns the CompletedProcess."""
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.stdout and echo_stdout:
        print(p.stdout, end="" if p.stdout.endswith("\n") else "\n")
    if p.stderr:
        print(p.stderr, end="" if p.stderr.endswith("\n") else "\n", file=sys.stderr)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"exit code {p.returncode}, expected {expect}: {' '.join(cmd)}")
    return p


def mpi(args, n, *cmd):
    return [args.mpiexec, "-n", str(n), "--oversubscribe", *cmd]


def train(args, n, run_dir, *extra, timeout=120):
    """A short h5ddp-train run on n ranks; returns its stdout."""
    cmd = mpi(args, n, args.train, "--run-dir", run_dir, "--threads", "1", "--no-eval", *extra)
    return run(cmd, timeout=timeout).stdout


def latest_checkpoint(run_dir):
    with open(os.path.join(run_dir, "latest")) as f:
        return os.path.join(run_dir, f.read().strip())


def step_losses(stdout):
    """{step: loss} from h5ddp-train's progress lines ("step 3/20  epoch 1/1  loss 2.2810 ...")."""
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"step (\d+)/\d+\s+epoch \S+\s+loss ([0-9.eE+-]+|nan|inf)", stdout)}


def ckpt_eval(args, path, count, extra=()):
    """(loss, accuracy) that h5ddp (C++) computes for the checkpoint's model on test images [0, count)."""
    out = run([args.ckpt, "eval", path, "--count", str(count), "--data-dir", DATA_DIR, *extra]).stdout
    m = re.search(r"images (\d+)\s+loss ([0-9.eE+-]+)\s+accuracy ([0-9.]+)", out)
    assert m, f"no eval result in {out!r}"
    assert int(m.group(1)) == count, out
    return float(m.group(2)), float(m.group(3))


def docs_python(source_dir, doc, marker):
    """Executes the ```python block of docs/<doc> that contains `marker`; returns its namespace."""
    with open(os.path.join(source_dir, "docs", doc)) as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b]
    assert blocks, f"docs/{doc} has no python block with {marker!r}"
    ns = {}
    # The MLP block relies on the CNN block's imports.
    exec("import torch, torch.nn as nn, torch.nn.functional as F\n" + blocks[0], ns)
    return ns


def model_classes(source_dir):
    return docs_python(source_dir, "MODELS.md", "class Cnn(")["Cnn"], \
        docs_python(source_dir, "MODELS.md", "class Mlp(")["Mlp"]


def _read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got = int.from_bytes(raw[0:4], "big")
    assert got == magic, f"{path}: magic {got:#x}"
    n = int.from_bytes(raw[4:8], "big")
    if magic == 0x803:
        rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
        return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows, cols)
    return np.frombuffer(raw, dtype=np.uint8, offset=8)


def fashion_mnist(split, first, count):
    """Images [count, 1, 28, 28] normalised as docs/MODELS.md says, and int64 labels."""
    imgs = _read_idx(os.path.join(DATA_DIR, f"{split}-images-idx3-ubyte.gz"), 0x803)[first:first + count]
    labels = _read_idx(os.path.join(DATA_DIR, f"{split}-labels-idx1-ubyte.gz"), 0x801)[first:first + count]
    mean, std = np.float32(0.2860), np.float32(0.3530)
    scale = np.float32(1.0) / (np.float32(255.0) * std)
    shift = mean / std
    x = imgs.astype(np.float32) * scale - shift
    return torch.from_numpy(x.reshape(-1, 1, 28, 28).copy()), torch.from_numpy(labels.astype(np.int64))


def eval_loss(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).double().mean().item()


def markdown_python_block(path, heading):
    """The one ```python block of the section `## <heading>` of the markdown file `path` (docs snippets that tests
    execute)."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"^## " + re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{path} has no '## {heading}' section"
    blocks = re.findall(r"```python\n(.*?)```", m.group(1), re.S)
    assert len(blocks) == 1, f"expected one python block in '## {heading}' of {path}, found {len(blocks)}"
    return blocks[0]
