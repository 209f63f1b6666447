"""Disk full during a save (issue 9), on a small tmpfs mounted by the test (root; skipped otherwise).
The run dir holds room for one checkpoint plus a filler file, so the save at step 2 commits and the one at
step 4 hits ENOSPC. Then: the save fails cleanly on all ranks, the .partial is removed, ckpt-2 and `latest`
are untouched; with --on-save-error stop training ends with an error naming the file; with
--on-save-error continue it goes on, and once space is freed the next trigger's save commits.
Argument: rank count."""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
HIDDEN = 256  # MLP 784-256-10 with Adam: ~0.8 MB of parameters, ~2.4 MB per checkpoint
SIZE = "16m"  # the filler leaves room for 1.5 checkpoints; removing it leaves room for several


def args(run_dir, max_steps, mode, sleep_ms=0):
    return ht.train_args(run_dir, max_steps, 2, ["--on-save-error", mode, "--step-sleep-ms", str(sleep_ms)],
                         hidden=HIDDEN)


def fill(mnt, leave_bytes):
    """Fills the tmpfs until `leave_bytes` remain free (one file, removable to make room)."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = os.path.join(mnt, "filler")
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
    return filler


def ckpt_size():
    """Size of one checkpoint of this model (measured, not guessed)."""
    d = ht.scratch("diskfull-size")
    r = ht.mpirun(NP, args(d, 2, "stop"), ht.STEP_TIMEOUT)
    ht.check(r.rc == 0, f"sizing run failed: {r}")
    files = ht.checkpoints(d)
    ht.check(len(files) == 1, f"sizing run left {files}")
    size = os.path.getsize(files[0])
    shutil.rmtree(d, ignore_errors=True)
    return size


_size = None


def common_checks(run_dir, r):
    ht.check(not ht.partials(run_dir), f"partial files left after a failed save: {ht.partials(run_dir)}")
    files = ht.verify_all(run_dir)
    ht.check(files and ht.step_of(files[0]) == 2, f"ckpt-2 missing after disk full: {files}")
    ht.check(ht.latest_target(run_dir).endswith("ckpt-00000002.h5") or len(files) > 1,
             f"latest moved to {ht.latest_target(run_dir)}")
    text = r.text
    ht.check("ckpt-00000004.h5" in text, f"the error does not name the file being saved: {r}")


def disk_full_stop(tag, env):
    global _size
    _size = _size or ckpt_size()
    with ht.Mount(tag, SIZE) as m:
        run_dir = os.path.join(m.path, "run")
        os.mkdir(run_dir)
        fill(m.path, int(_size * 1.5))  # room for ckpt-2, not for ckpt-4 next to it
        r = ht.mpirun(NP, args(run_dir, 6, "stop"), ht.STEP_TIMEOUT, env)
        ht.check(r.rc != 0, f"training did not stop on a failed save: {r}")
        ht.check(ht.trained_steps(r) is None, f"training reported success: {r}")
        common_checks(run_dir, r)
        ht.check(ht.latest_target(run_dir).endswith("ckpt-00000002.h5"), "latest moved")
        first = [l for l in r.err.splitlines() if "ckpt-00000004" in l][:1]
        return f"stopped: {first[0][:160] if first else ''}"


def test_disk_full_stop():
    """The save's space check sees the disk is full: an agreed error before any HDF5 call."""
    return disk_full_stop("diskfull-stop", None)


def test_disk_full_inside_hdf5_stop():
    """The space check is skipped (test-only H5DDP_SKIP_SPACE_CHECK): ENOSPC hits inside HDF5's MPI-IO
    writes, the case of space taken by another writer during the save. No hang, partial removed."""
    return disk_full_stop("diskfull-hdf5", {"H5DDP_SKIP_SPACE_CHECK": "1", "H5DDP_TEST_HOOKS": "1"})


def test_disk_full_continue_then_retry():
    global _size
    _size = _size or ckpt_size()
    with ht.Mount("diskfull-continue", SIZE) as m:
        run_dir = os.path.join(m.path, "run")
        os.mkdir(run_dir)
        filler = fill(m.path, int(_size * 1.5))
        state = {"freed_after_failure": False}

        def on_line(stream, line):
            # The first failed save: free the filler while training goes on (steps sleep 400 ms).
            if "ckpt-00000004.h5" in line and not state["freed_after_failure"] and os.path.exists(filler):
                os.remove(filler)
                state["freed_after_failure"] = True

        r = ht.mpirun_watch(NP, args(run_dir, 8, "continue", 400), ht.STEP_TIMEOUT, on_line)
        ht.check(r.rc == 0, f"--on-save-error continue did not finish: {r}")
        ht.check(state["freed_after_failure"], f"no failed save at step 4 was reported: {r}")
        ht.check(ht.trained_steps(r) == 8, f"did not train to step 8: {r}")
        common_checks(run_dir, r)
        steps = [ht.step_of(f) for f in ht.checkpoints(run_dir)]
        ht.check(steps == [2, 6, 8], f"expected ckpt 2, 6 (retry at the next trigger) and 8, got {steps}")
        ht.check(ht.latest_target(run_dir).endswith("ckpt-00000008.h5"), "latest does not name step 8")
        return f"checkpoints {steps}"


if __name__ == "__main__":
    sys.exit(ht.main([test_disk_full_stop, test_disk_full_inside_hdf5_stop, test_disk_full_continue_then_retry]))
