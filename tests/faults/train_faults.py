"""Helpers for fault tests that drive h5ddp-train and h5ddp-ckpt: a tiny, fast configuration (MLP with one
small hidden layer, no evaluation), and checks every test repeats: each committed file verifies, no
.partial file is ever taken as a checkpoint, and a restart resumes from a valid checkpoint."""
import os
import re
import shutil

import faultlib as fl

STEP_TIMEOUT = 90  # one h5ddp-train launch (seconds); a hang fails the test


def train_args(run_dir, max_steps, every=2, extra=(), hidden=32, keep_last=0):
    return [fl.tool("h5ddp-train"), "--run-dir", run_dir, "--model", "mlp", "--mlp-hidden", str(hidden),
            "--dropout", "0.1", "--batch-size", "64", "--max-steps", str(max_steps),
            "--checkpoint-every-steps", str(every), "--keep-last", str(keep_last), "--no-eval", "--threads", "1",
            "--log-every", "1"] + list(extra)


def train(np, run_dir, max_steps, every=2, extra=(), env=None, timeout=STEP_TIMEOUT, keep_last=0):
    return fl.mpirun(np, train_args(run_dir, max_steps, every, extra, keep_last=keep_last), timeout, env)


def resumed_from(result):
    """The checkpoint path a run says it resumed from, or None for a fresh start."""
    m = re.search(r"resumed from (\S+) at step (\d+)", result.text)
    return (m.group(1), int(m.group(2))) if m else None


def trained_steps(result):
    m = re.search(r"trained (?:to step )?(\d+)", result.text)
    return int(m.group(1)) if m else None


def verify(path, expect_ok=True, timeout=60):
    r = fl.run([fl.tool("h5ddp-ckpt"), "verify", path], timeout)
    if expect_ok:
        fl.check(r.rc == 0, f"h5ddp-ckpt verify {path} failed: {r}")
    else:
        fl.check(r.rc != 0, f"h5ddp-ckpt verify {path} passed a bad file: {r}")
    return r


def verify_all(run_dir):
    files = fl.checkpoints(run_dir)
    for f in files:
        verify(f)
    target = fl.latest_target(run_dir)
    if target is not None:
        fl.check(not target.endswith(".partial"), f"latest points at a partial file: {target}")
        fl.check(os.path.isfile(target), f"latest points at a missing file: {target}")
    return files


def step_of(path):
    m = re.search(r"ckpt-(\d+)\.h5$", path)
    return int(m.group(1)) if m else None


def copy_run(src, tag):
    dst = fl.scratch(tag)
    shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    return dst
