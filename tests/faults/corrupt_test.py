"""Damaged checkpoint files (issue 9): bytes flipped inside a dataset, a truncated file, an empty file, an
HDF5 file that is not h5ddp's. For each, damage the NEWEST checkpoint (the one `latest` names), then:
h5ddp-ckpt verify fails naming the file (and the dataset for flipped bytes); an explicit --resume of it fails
on every rank with that message and no hang; auto-resume falls back to the previous valid checkpoint with a
warning naming the damaged file. Argument: rank count."""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
PY = os.environ.get("H5DDP_PYTHON", "/usr/bin/python3")
_base = None
FLIPPED = "model/fc1.weight"


def base_run():
    """ckpt-2 and ckpt-4 committed, latest -> ckpt-4."""
    global _base
    if _base is None:
        _base = ht.scratch("corrupt-base")
        r = ht.train(NP, _base, 4)
        ht.check(r.rc == 0, f"base run failed: {r}")
        ht.check([ht.step_of(f) for f in ht.checkpoints(_base)] == [2, 4], f"base: {ht.checkpoints(_base)}")
    return _base


def h5py(code, *args):
    r = ht.run([PY, "-c", code] + list(args), 60)
    ht.check(r.rc == 0, f"h5py helper failed: {r}")
    return r.out.strip()


def flip_bytes(path):
    """Flips 8 bytes in the middle of a tensor's data, found through h5py (contiguous layout: file offset)."""
    code = ("import h5py,sys\n"
            "f=h5py.File(sys.argv[1],'r')\n"
            "names=[]\n"
            "f['model'].visit(lambda n: names.append(n) if isinstance(f['model'][n], h5py.Dataset) else None)\n"
            "d=f['model'][sorted(names, key=lambda n: -f['model'][n].nbytes)[0]]\n"
            "print(d.name, d.id.get_offset(), d.nbytes)\n")
    name, offset, nbytes = h5py(code, path).split()
    pos = int(offset) + int(nbytes) // 2
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(8)
        f.seek(pos)
        f.write(bytes(x ^ 0xFF for x in b))
    return name.lstrip("/")


def truncate(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    return None


def empty(path):
    open(path, "w").close()
    return None


def foreign_hdf5(path):
    h5py("import h5py,numpy,sys\nf=h5py.File(sys.argv[1],'w')\nf['x']=numpy.arange(10)\nf.attrs['a']=1\n", path)
    return None


def scenario(damage):
    run_dir = ht.copy_run(base_run(), "corrupt-" + damage.__name__)
    try:
        bad = os.path.join(run_dir, "ckpt-00000004.h5")
        dataset = damage(bad)
        v = ht.verify(bad, expect_ok=False)
        ht.check(bad in v.text or os.path.basename(bad) in v.text, f"verify does not name the file: {v}")
        if dataset:
            ht.check(dataset in v.text, f"verify does not name the damaged dataset {dataset}: {v}")
        # Explicit resume of the damaged file: an error on every rank, naming the file; no hang.
        r = ht.train(NP, run_dir, 6, extra=["--resume", bad])
        ht.check(r.rc != 0, f"--resume of a damaged file succeeded: {r}")
        ht.check(os.path.basename(bad) in r.text, f"the error does not name the file: {r}")
        if dataset:
            ht.check(dataset in r.text, f"the error does not name the dataset {dataset}: {r}")
        ht.check(ht.trained_steps(r) is None, f"training ran from a damaged file: {r}")
        # Auto-resume: falls back to ckpt-2 with a warning naming the damaged file, then trains to the end.
        r = ht.train(NP, run_dir, 6)
        ht.check(r.rc == 0, f"auto-resume with a damaged newest checkpoint failed: {r}")
        src = ht.resumed_from(r)
        ht.check(src is not None and src[1] == 2 and src[0].endswith("ckpt-00000002.h5"),
                 f"auto-resume did not fall back to step 2: {src}\n{r}")
        ht.check(os.path.basename(bad) in r.err and "warn" in r.err.lower(),
                 f"no warning naming the damaged file: {r}")
        ht.check(ht.trained_steps(r) == 6, f"did not train to step 6: {r}")
        ht.verify_all(run_dir)  # the damaged file was rewritten by the resumed run's save at step 4
        return f"verify named {dataset or os.path.basename(bad)}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_every_checkpoint_damaged():
    """Every candidate damaged: auto-resume warns, names each file, and starts from scratch exactly as a run
    in an empty directory does (the failed loads had overwritten part of the weights and optimizer state)."""
    run_dir = ht.copy_run(base_run(), "corrupt-all")
    fresh_dir = ht.scratch("corrupt-fresh")
    try:
        for c in ht.checkpoints(run_dir):
            flip_bytes(c)
        r = ht.train(NP, run_dir, 2)
        ht.check(r.rc == 0, f"auto-resume with every checkpoint damaged failed: {r}")
        ht.check(ht.resumed_from(r) is None, f"resumed from a damaged file: {r}")
        ht.check("no valid checkpoint" in r.err and "ckpt-00000002.h5" in r.err and "ckpt-00000004.h5" in r.err,
                 f"no warning naming both damaged files: {r}")
        ht.check(ht.trained_steps(r) == 2, f"did not train to step 2: {r}")
        f = ht.train(NP, fresh_dir, 2)
        ht.check(f.rc == 0, f"fresh run failed: {f}")
        same = ht.compare_checkpoints(os.path.join(run_dir, "ckpt-00000002.h5"),
                                      os.path.join(fresh_dir, "ckpt-00000002.h5"), groups=("model", "optimizer/state"))
        ht.check(same.ok, f"the run that found only damaged checkpoints did not start as a fresh run: {same}")
        return f"step 2 equals a fresh run's ({same.compared} tensors)"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(fresh_dir, ignore_errors=True)


def test_other_model_fails_without_fallback():
    """A valid checkpoint of another model is not damage: auto-resume fails on every rank naming the
    difference, and neither falls back to an older file nor starts from scratch over the run directory."""
    run_dir = ht.copy_run(base_run(), "corrupt-model")
    try:
        before = ht.checkpoints(run_dir)
        r = ht.mpirun(NP, ht.train_args(run_dir, 6, hidden=48), ht.STEP_TIMEOUT)
        ht.check(r.rc != 0, f"auto-resume with another model succeeded: {r}")
        ht.check("ckpt-00000004.h5" in r.text and "[48]" in r.text, f"the error does not name the file and shape: {r}")
        ht.check(ht.resumed_from(r) is None and ht.trained_steps(r) is None, f"training ran: {r}")
        ht.check(ht.checkpoints(run_dir) == before, f"the run directory changed: {ht.checkpoints(run_dir)}")
        ht.verify_all(run_dir)
        return "failed naming ckpt-00000004.h5"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def make_test(damage):
    def t():
        return scenario(damage)
    t.__name__ = "test_" + damage.__name__
    return t


if __name__ == "__main__":
    try:
        sys.exit(ht.main([make_test(d) for d in (flip_bytes, truncate, empty, foreign_hdf5)] +
                         [test_every_checkpoint_damaged, test_other_model_fails_without_fallback]))
    finally:
        if _base:
            shutil.rmtree(_base, ignore_errors=True)
