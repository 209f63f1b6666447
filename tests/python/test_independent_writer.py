"""Issue 45: a checkpoint written by tests/python/independent_writer.py (written from docs/FORMAT.md alone) is
accepted by both verifiers and resumed by h5ddp-train exactly as the h5ddp file it copies.

For each optimizer (Adam; SGD with momentum): h5ddp-train runs 4 steps on 2 ranks saving every step; its step-2
checkpoint is read back with independent_writer.from_file and written again with independent_writer.write into
a fresh run directory. `h5ddp-ckpt verify` and h5ddp_torch.verify must accept that file. h5ddp-train then resumes
to step 4 once from it and once from a copy of the original step-2 file: the two step-4 checkpoints must be
bitwise equal in every /model and /optimizer dataset, and equal to the uninterrupted run's step-4 checkpoint,
and the losses of steps 3-4 in metrics.jsonl must be identical in all three runs."""
import json
import os
import shutil
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import independent_writer as iw  # noqa: E402
import interop_common as ic  # noqa: E402

STEPS, RESUME_AT = 4, 2
VARIANTS = {"adam": ("--optimizer", "adam"), "sgd": ("--optimizer", "sgd", "--momentum", "0.9")}


def ckpt(run_dir, step):
    return os.path.join(run_dir, f"ckpt-{step:08d}.h5")


def train(args, run_dir, optimizer_args):
    """h5ddp-train on 2 ranks up to step STEPS, saving every step; returns stdout + stderr."""
    cmd = ic.mpi(args, 2, args.train, "--run-dir", run_dir, "--threads", "1", "--no-eval", "--batch-size", "16",
                 "--no-fsync", "--keep-last", "0", "--checkpoint-every-steps", "1", "--max-steps", str(STEPS),
                 "--log-every", "1", *optimizer_args)
    p = ic.run(cmd, timeout=180)
    return p.stdout + p.stderr


def logged_losses(run_dir):
    """{step: loss} of the "train" records of RUN_DIR/metrics.jsonl (full precision)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in recs if r["event"] == "train"}


def datasets(path, groups=("model", "optimizer")):
    """{name: (HDF5 dtype, shape, raw bytes)} of every dataset under `groups`."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                data = np.empty(obj.shape, obj.dtype) if obj.size == 0 else np.asarray(obj[()])
                out[name] = (obj.dtype.str, obj.shape, data.tobytes())
        for g in groups:
            f[g].visititems(lambda name, obj, g=g: visit(f"{g}/{name}", obj))
    return out


def assert_bitwise_equal(a, b):
    da, db = datasets(a), datasets(b)
    assert sorted(da) == sorted(db), f"{a} vs {b}: datasets {sorted(set(da) ^ set(db))} differ"
    differ = [k for k in da if da[k] != db[k]]
    assert not differ, f"{a} vs {b}: not bitwise equal: {differ}"
    print(f"bitwise equal ({len(da)} datasets under /model and /optimizer): {a} == {b}")


def verify_both(args, path):
    """h5ddp-ckpt verify (exit 0) and h5ddp_torch.verify ([]) accept `path`."""
    ic.run([args.ckpt, "verify", path])
    import h5ddp_torch  # only here: the package imports torch
    problems = h5ddp_torch.verify(path)
    assert problems == [], f"h5ddp_torch.verify({path}): {problems}"
    print(f"h5ddp_torch.verify: [] for {path}")


def resume(args, run_dir, optimizer_args):
    out = train(args, run_dir, optimizer_args)
    assert f"resumed from {ckpt(run_dir, RESUME_AT)} at step {RESUME_AT}" in out, out
    return logged_losses(run_dir)


def check_variant(args, w, name, optimizer_args):
    full, indep, orig = w(name, "full"), w(name, "indep"), w(name, "orig")
    train(args, full, optimizer_args)
    state = iw.from_file(ckpt(full, RESUME_AT))
    assert state["optimizer_type"] == name, state["optimizer_type"]
    os.makedirs(indep)
    iw.write(ckpt(indep, RESUME_AT), state, latest=True)
    with h5py.File(ckpt(indep, RESUME_AT), "r") as f:
        assert f.attrs["format_minor_version"] == iw.REVISION and f.attrs["h5ddp_version"] == iw.WRITER
    verify_both(args, ckpt(indep, RESUME_AT))
    os.makedirs(orig)
    shutil.copy(ckpt(full, RESUME_AT), orig)
    losses = {d: resume(args, d, optimizer_args) for d in (indep, orig)}
    losses[full] = logged_losses(full)
    assert_bitwise_equal(ckpt(indep, STEPS), ckpt(orig, STEPS))
    assert_bitwise_equal(ckpt(indep, STEPS), ckpt(full, STEPS))
    for d, got in losses.items():
        tail = {k: got[k] for k in range(RESUME_AT + 1, STEPS + 1)}
        print(f"{name} {os.path.basename(d)}: losses of steps 3-4 {tail}")
        assert tail == {k: losses[full][k] for k in tail}, f"{d}: {tail} vs {losses[full]}"


def main():
    args = ic.parse_args(__doc__)
    if os.geteuid() == 0:  # as ctest's environment does (tests/CMakeLists.txt), for a direct run as root
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    with ic.Scratch(args, "independent-writer") as w:
        for name, optimizer_args in VARIANTS.items():
            check_variant(args, w, name, optimizer_args)
    print("PASS")


if __name__ == "__main__":
    main()
