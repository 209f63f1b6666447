"""A run directory that cannot hold checkpoints (issue 9): read-only (a tmpfs mounted read-only; root
bypasses permission bits, so chmod proves nothing), missing under a read-only parent, or a regular file.
Each time h5ddp-train must fail on every rank with a clear message naming the directory BEFORE the first
training step, quickly and without a hang. Argument: rank count."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2


def expect_early_error(run_dir, words):
    r = ht.train(NP, run_dir, 4)
    ht.check(r.rc != 0, f"training started with an unusable run dir {run_dir}: {r}")
    ht.check(run_dir in r.text, f"the error does not name {run_dir}: {r}")
    ht.check(any(w in r.text for w in words), f"the error does not say why ({words}): {r}")
    ht.check("step 1/" not in r.text and ht.trained_steps(r) is None, f"a training step ran first: {r}")
    return r


def test_read_only_run_dir():
    with ht.Mount("rundir-ro", "1m", readonly=True) as m:
        r = expect_early_error(m.path, ["not writable", "Read-only", "read-only"])
        return f"{r.seconds:.1f}s"


def test_missing_run_dir_under_read_only_parent():
    with ht.Mount("rundir-ro-parent", "1m", readonly=True) as m:
        r = expect_early_error(os.path.join(m.path, "run"), ["cannot create", "Read-only", "read-only"])
        return f"{r.seconds:.1f}s"


def test_run_dir_is_a_file():
    d = ht.scratch("rundir-file")
    path = os.path.join(d, "not-a-dir")
    open(path, "w").close()
    try:
        r = expect_early_error(path, ["not a directory", "Not a directory", "cannot create"])
        return f"{r.seconds:.1f}s"
    finally:
        os.remove(path)
        os.rmdir(d)


def test_missing_run_dir_is_created():
    """A missing run dir whose parent is writable is created (the first run of a requeueable job)."""
    d = ht.scratch("rundir-new")
    run_dir = os.path.join(d, "a", "b")
    r = ht.train(NP, run_dir, 2)
    ht.check(r.rc == 0 and ht.step_of(ht.checkpoints(run_dir)[-1]) == 2, f"fresh run dir not created: {r}")
    import shutil
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(ht.main([test_read_only_run_dir, test_missing_run_dir_under_read_only_parent, test_run_dir_is_a_file,
                      test_missing_run_dir_is_created]))
