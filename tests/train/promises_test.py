#!/usr/bin/env python3
"""End-to-end tests, through h5ddp-train and h5ddp-ckpt, of promises of README.md (now in docs/TRAINING.md) that no
other test checks (issue 23, finding 11). Each case is its own ctest (tests/train/CMakeLists.txt):

  promises_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix

Every run is a small MLP (784->32->10), small global batches, --no-eval, --no-fsync; every subprocess is
bounded (a hang fails). No assertion depends on how fast the machine is: timing enters only as bounds that
hold at any speed (a step lasts at least its --step-sleep-ms; two saves by time are at least T apart).

What each case catches when the promise breaks is said in its docstring."""
import gzip
import math
import os
import re
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # h5ddp_torch (its sampler, case 7)

import h5ddp_test as ht  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
LAUNCH = 300  # seconds for one h5ddp-train launch: generous, the machine may run at load 8
DATA_DIR = "/usr/share/datasets/fashion-mnist"
TRAIN_SAMPLES = 60000
# Scratch directories (ht.scratch) are removed at the end of the run (kept with H5DDP_KEEP_SCRATCH=1, to debug).


# SGD without momentum, weight decay or dropout: one step moves the weights by exactly -lr * gradient, so the
# learning rate a step used can be measured from the weights, and a step can be recomputed in numpy.
PLAIN_SGD = ["--optimizer", "sgd", "--momentum", "0", "--dropout", "0", "--lr", "0.1"]


def args(run_dir, *extra, batch=64):
    """h5ddp-train's command line (no mpirun). No --keep-last: the default (3) applies unless a case sets it."""
    return [ht.tool("h5ddp-train"), "--run-dir", run_dir, "--model", "mlp", "--mlp-hidden", "32",
            "--batch-size", str(batch), "--no-eval", "--no-fsync", "--threads", "1", "--log-every", "1"] + \
        [str(a) for a in extra]


def train(run_dir, *extra, batch=64, env=None, expect_rc=0, timeout=LAUNCH):
    r = ht.mpirun(NP, args(run_dir, *extra, batch=batch), timeout, env)
    if expect_rc is not None:
        ht.check(r.rc == expect_rc, f"h5ddp-train {' '.join(map(str, extra))}: exit code {r.rc}, expected "
                                    f"{expect_rc}: {r}")
    return r


def trained_line(r):
    """(step, epochs complete) from 'trained to step N (E of M epochs complete)'."""
    m = re.search(r"trained to step (\d+) \((\d+) of (\d+) epochs? complete\)", r.text)
    ht.check(m, f"no 'trained to step' line: {r}")
    return int(m.group(1)), int(m.group(2))


def scalar(path, name):
    with h5py.File(path, "r") as f:
        return f[name][()]


def weights(path):
    with h5py.File(path, "r") as f:
        return {k: f["model"][k][()].astype(np.float64) for k in f["model"]}


def close(a, b, rel=1e-12):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def doctor_one_element(src, dataset, tag):
    """A copy of checkpoint src with one element of a float dataset changed (its checksum left alone)."""
    d = ht.scratch(tag)
    dst = os.path.join(d, os.path.basename(src))
    shutil.copy2(src, dst)
    with h5py.File(dst, "r+") as f:
        ds = f[dataset]
        v = ds[()]
        flat = v.reshape(-1)
        flat[0] = np.nextafter(flat[0], np.float32(np.inf))
        ds[...] = v
    return dst


# ---- a job driven while it runs (signals to one rank) -------------------------------------------------------
def catches(sig, pid):
    """True while `pid` has a handler installed for `sig` (SigCgt of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


# ---- 1. --checkpoint-every-seconds ---------------------------------------------------------------------------
def test_checkpoint_every_seconds():
    """--checkpoint-every-seconds 1 with 100 ms steps and no step-count trigger: saves happen by time.
    Bounds that hold at any machine speed: a 100 ms sleep follows every step, so 1 s has passed after at
    most 10 of them (the first time save comes by step 11, the next ones at most 10 steps apart: >= 2 saves
    before the final one at 30); two time saves are >= 1 s apart on the triggering rank's clock (at most
    train time / T + 2 of them, and their files' mtimes >= 0.5 s apart).
    Catches: the option ignored (only the final save), a save every step (too many, mtimes too close), the
    timer not restarted after a save (a save every step after the first), a trigger seen by one rank only
    (hang or failed save), a time save that is not a valid checkpoint."""
    T = 1.0
    d = ht.scratch("every-seconds")
    steps, train_s = time_saves_run(d, "--checkpoint-every-seconds", T)
    check_time_saves(d, steps, train_s, T)
    # Control: the same checks see a run without the option (only the final save) as wrong.
    c = ht.scratch("every-seconds-control")
    try:
        check_time_saves(c, *time_saves_run(c), T)
    except ht.Failure:
        pass
    else:
        raise ht.Failure("control: the checks passed a run without --checkpoint-every-seconds")
    for x in (d, c):
        shutil.rmtree(x, ignore_errors=True)
    return f"saves at steps {steps} in {train_s:.1f} s of training"


def time_saves_run(d, *extra):
    r = train(d, "--max-steps", 30, "--step-sleep-ms", 100, "--keep-last", 0, *extra)
    m = re.search(r"trained to step 30 .* in ([0-9.]+) s", r.text)
    ht.check(m, f"no 'trained to step 30 ... in S s': {r}")
    ht.verify_all(d)
    return ht.steps_in(d), float(m.group(1))


def check_time_saves(d, steps, train_s, T):
    ht.check(steps and steps[-1] == 30, f"no final checkpoint at 30: {steps}")
    timed = [s for s in steps if s != 30]
    ht.check(len(timed) >= 2, f"only {len(timed)} saves by time before the final one (>= 2 expected for 30 "
                              f"steps of >= 100 ms with T = {T} s): checkpoints at {steps}")
    # (12 and 11, not 11 and 10: a margin for the clocks' granularity; a slower machine only shortens the gaps.)
    ht.check(steps[0] <= 12, f"no save by time in the first 12 steps (>= 1.1 s): checkpoints at {steps}")
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    ht.check(not gaps or max(gaps) <= 11, f"more than 11 steps (>= 1.1 s) between saves: checkpoints at {steps}")
    ht.check(len(timed) <= train_s / T + 2, f"{len(timed)} saves by time in {train_s:.1f} s of training with "
                                            f"T = {T} s: checkpoints at {steps}")
    mtimes = [os.stat(ht.ckpt(d, s)).st_mtime for s in timed]
    close_pairs = [(timed[i], timed[i + 1], round(mtimes[i + 1] - mtimes[i], 3)) for i in range(len(timed) - 1)
                   if mtimes[i + 1] - mtimes[i] < 0.5 * T]
    ht.check(not close_pairs, f"saves by time written less than {0.5 * T} s apart (step, step, s): {close_pairs}")


# ---- 2. --verify-replicas --------------------------------------------------------------------------------------
def test_verify_replicas():
    """A run with --verify-replicas saves valid files (h5ddp-ckpt verify) bitwise equal, tensor by tensor and
    checksum by checksum, to a run without it.
    Catches: the full-hash path failing or hanging a save, writing other bytes or other checksums (e.g. a
    rank's hash taken for a dataset it did not write), or disturbing training (RNG, optimizer state)."""
    a, b = ht.scratch("replicas-on"), ht.scratch("replicas-off")
    common = ["--max-steps", 9, "--checkpoint-every-steps", 3, "--keep-last", 0, "--seed", 7]
    train(a, *common, "--verify-replicas")
    train(b, *common)
    ht.check(ht.steps_in(a) == [3, 6, 9] and ht.steps_in(b) == [3, 6, 9],
             f"checkpoints {ht.steps_in(a)} / {ht.steps_in(b)}")
    ht.verify_all(a)
    for s in (3, 6, 9):
        ht.check_bitwise(ht.ckpt(a, s), ht.ckpt(b, s), "--verify-replicas changed a checkpoint")
        sums = []
        for path in (ht.ckpt(a, s), ht.ckpt(b, s)):
            with h5py.File(path, "r") as f:
                got = {}
                f.visititems(lambda n, o: got.__setitem__(n, o.attrs.get("xxh3")) if isinstance(o, h5py.Dataset)
                             else None)
                sums.append(got)
        ht.check(sums[0] == sums[1], f"step {s}: checksums differ with --verify-replicas: "
                                     f"{ {k for k in sums[0] if sums[0][k] != sums[1].get(k)} }")
    # The comparison can fail: one float32 ulp in one weight is seen.
    bad = doctor_one_element(ht.ckpt(b, 9), "model/fc2.bias", "replicas-doctored")
    ht.check(ht.compare(ht.ckpt(a, 9), bad).rc != 0, "the checkpoint comparer missed a one-ulp change")
    for x in (a, b, os.path.dirname(bad)):
        shutil.rmtree(x, ignore_errors=True)
    return "3 checkpoints verified and bitwise equal to the run without the option"


# ---- 3. two SIGINTs: the second kills without saving ------------------------------------------------------------
def test_second_sigint_kills_without_saving():
    """SIGINT to one rank while it sleeps (--step-sleep-ms 60000, so the save it asked for is pending), then,
    once the first one was taken (its handler is reset: SA_RESETHAND, seen in /proc/PID/status), a second
    SIGINT: the default action kills that rank at once and mpirun ends the job.
    What the job's exit status is: mpirun reports a rank killed by signal 2 as 128 + 2 = 130, the same code as
    a clean save after SIGINT, so the code does not tell them apart; what does: no stop message, mpirun's
    'exited on signal 2', no new checkpoint, and an end long before the 60 s sleep would have.
    Afterwards every checkpoint verifies, none is partial, and a rerun resumes from the last committed one."""
    d = ht.scratch("sigint-twice")
    job = ht.Job(NP, args(d, "--max-steps", 5, "--checkpoint-every-steps", 1, "--keep-last", 0,
                          "--step-sleep-ms", 60000))
    try:
        job.wait_for(lambda: ht.latest_target(d) == ht.ckpt(d, 1), 120, "the step-1 checkpoint")
        pid = job.rank_pid(1)
        ht.check(catches(signal.SIGINT, pid), "rank 1 has no SIGINT handler after its first step")
        t_first = time.monotonic()
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 60
        while catches(signal.SIGINT, pid):  # the handler ran and reset itself
            ht.check(time.monotonic() < deadline, "the first SIGINT was not taken within 60 s")
            time.sleep(0.02)
        ht.check("stopped by a signal" not in job.text, f"the job stopped before the second SIGINT: {job.text}")
        os.kill(pid, signal.SIGINT)
        r = job.finish(120)
    finally:
        job.kill()
    ended_after = time.monotonic() - t_first
    ht.check(r.rc != 0, f"exit code 0 after a second SIGINT: {r}")
    ht.check("stopped by a signal" not in r.text and "exit code 130 (interrupted)" not in r.text,
             f"the job saved after the second SIGINT: {r}")
    ht.check("signal 2" in r.text or "Interrupt" in r.text, f"mpirun does not report a rank killed by SIGINT: {r}")
    ht.check(ended_after < 50, f"the job ended {ended_after:.0f} s after the first SIGINT: the 60 s sleep ran out, "
                               f"the second SIGINT did not kill")
    ht.check(ht.steps_in(d) == [1], f"checkpoints after the kill: {ht.steps_in(d)} (only step 1 expected)")
    ht.check(ht.latest_target(d) == ht.ckpt(d, 1), f"latest names {ht.latest_target(d)}")
    ht.verify_all(d)
    rerun = train(d, "--max-steps", 3, "--checkpoint-every-steps", 1, "--keep-last", 0)
    ht.check(ht.resumed_from(rerun) == (ht.ckpt(d, 1), 1), f"the rerun did not resume from step 1: {rerun}")
    ht.check(ht.steps_in(d) == [1, 2, 3], f"checkpoints after the rerun: {ht.steps_in(d)}")
    ht.verify_all(d)
    shutil.rmtree(d, ignore_errors=True)
    return f"rank killed, mpirun exit code {r.rc}, job ended {ended_after:.1f} s after the first SIGINT"


# ---- 5. learning-rate schedules ---------------------------------------------------------------------------------
def measured_lr(run_dir, i, tag, batch=64, extra=()):
    """The learning rate step i+1 of the run in run_dir (checkpoints at i and i+1, PLAIN_SGD) really used:
    the same step redone from checkpoint i at lr 1 gives the gradient g; the run moved the weights by -lr * g."""
    d = ht.scratch(tag)
    train(d, *PLAIN_SGD[:-2], "--lr", 1, "--lr-schedule", "constant", "--replan-lr-schedule",
          "--resume", ht.ckpt(run_dir, i), "--max-steps", i + 1, *extra, batch=batch)
    w0, w1, wg = weights(ht.ckpt(run_dir, i)), weights(ht.ckpt(run_dir, i + 1)), weights(ht.ckpt(d, i + 1))
    keys = sorted(w0)
    moved = np.concatenate([(w0[k] - w1[k]).ravel() for k in keys])
    g = np.concatenate([(w0[k] - wg[k]).ravel() for k in keys])
    shutil.rmtree(d, ignore_errors=True)
    return float(moved @ g / (g @ g))


def check_recorded_lrs(run_dir, steps, lr_used, lr_next, what):
    """param_groups/0 lr of checkpoint k = the lr of its last step (k-1 steps done before it); the scheduler's
    lr = the lr of the next step."""
    for k in steps:
        pg = float(ht.attrs(ht.ckpt(run_dir, k), "optimizer/param_groups/0")["lr"])
        sch = ht.attrs(ht.ckpt(run_dir, k), "train/lr_scheduler")
        ht.check(close(pg, lr_used(k - 1)), f"{what}: checkpoint {k}: the optimizer's lr {pg!r}, expected "
                                            f"{lr_used(k - 1)!r} (the lr of step {k})")
        ht.check(close(float(sch["lr"]), lr_next(k)), f"{what}: checkpoint {k}: the scheduler's lr {sch['lr']!r}, "
                                                      f"expected {lr_next(k)!r}")
        ht.check(int(sch["last_epoch"]) == k, f"{what}: checkpoint {k}: scheduler last_epoch {sch['last_epoch']}")


def check_measured(run_dir, points, lr_used, tag, batch=64, extra=()):
    out = []
    for i in points:
        got, want = measured_lr(run_dir, i, f"{tag}-{i}", batch, extra), lr_used(i)
        ht.check(abs(got - want) <= 2e-3 * want, f"step {i + 1} moved the weights by {got:.6g} x the gradient, "
                                                 f"expected lr {want:.6g}")
        out.append(f"step {i + 1}: {got:.5g} (rel. error {abs(got / want - 1):.1e})")
    return out


def test_lr_step():
    """--lr-schedule step --lr-step-size 3 --lr-gamma 0.5: the lr of the step after i completed steps is
    0.1 * 0.5 ** (i // 3), in the checkpoints' optimizer and scheduler state and in the weights themselves
    (measured on both sides of the first decay).
    Catches: the schedule ignored (constant lr), an off-by-one at the decay, gamma applied per step or the
    wrong power, the optimizer not given the scheduled lr (the recorded value would still be right)."""
    d = ht.scratch("lr-step")
    base, gamma, size = 0.1, 0.5, 3
    train(d, *PLAIN_SGD, "--lr-schedule", "step", "--lr-step-size", size, "--lr-gamma", gamma, "--max-steps", 10,
          "--checkpoint-every-steps", 1, "--keep-last", 0)
    lr = lambda i: base * gamma ** (i // size)  # noqa: E731
    check_recorded_lrs(d, range(1, 11), lr, lr, "step schedule")
    # Control: a checkpoint whose step 4 ran at the undecayed lr (an off-by-one) is seen.
    bad = ht.copy_with([ht.ckpt(d, 4)], "lr-step-doctored")
    with h5py.File(ht.ckpt(bad, 4), "r+") as f:
        f["optimizer/param_groups/0"].attrs["lr"] = base
    try:
        check_recorded_lrs(bad, [4], lr, lr, "doctored")
    except ht.Failure:
        pass
    else:
        raise ht.Failure("control: the check passed a step 4 at the undecayed lr")
    shutil.rmtree(bad, ignore_errors=True)
    sch = ht.attrs(ht.ckpt(d, 10), "train/lr_scheduler")
    ht.check(sch["type"] == "step" and int(sch["step_size"]) == size and close(float(sch["gamma"]), gamma),
             f"scheduler state {sch}")
    got = check_measured(d, [2, 3, 7], lr, "lr-step-measure")
    shutil.rmtree(d, ignore_errors=True)
    return "; ".join(got)


def test_lr_step_per_epoch():
    """--lr-step-size 0: one decay per epoch. Global batch 2000: 30 steps an epoch (60000 / 2000); the lr of
    the step after i completed steps is 0.1 * 0.5 ** (i // 30), recorded and measured at the epoch boundary.
    Catches: step size 0 taken literally (division by zero, or decay every step), an epoch length other than
    60000 // batch, a decay one step early or late."""
    d = ht.scratch("lr-epoch")
    base, gamma, batch = 0.1, 0.5, 2000
    spe = TRAIN_SAMPLES // batch
    train(d, *PLAIN_SGD, "--lr-schedule", "step", "--lr-step-size", 0, "--lr-gamma", gamma, "--epochs", 2,
          "--max-steps", spe + 2, "--checkpoint-every-steps", 1, "--keep-last", 0, batch=batch)
    lr = lambda i: base * gamma ** (i // spe)  # noqa: E731
    check_recorded_lrs(d, range(spe - 2, spe + 3), lr, lr, "per-epoch step schedule")
    ht.check(int(ht.attrs(ht.ckpt(d, spe), "train/lr_scheduler")["step_size"]) == spe, "scheduler step_size")
    ht.check(int(scalar(ht.ckpt(d, spe), "data/epoch")) == 1, "the epoch did not end after 30 steps")
    got = check_measured(d, [spe - 1, spe], lr, "lr-epoch-measure", batch, ("--epochs", 2))
    shutil.rmtree(d, ignore_errors=True)
    return "; ".join(got)


def cosine(base, total):
    """The documented schedule, 'cosine: to 0 over the run': lr after i completed steps of `total`."""
    return lambda i: 0.5 * base * (1.0 + math.cos(math.pi * min(i, total) / total))


def test_lr_cosine():
    """--lr-schedule cosine over --max-steps 12: the lr of the step after i completed steps is
    0.05 * (1 + cos(pi * i / 12)) (computed here in Python), recorded in every checkpoint and measured in the
    weights at two steps; the scheduler reaches 0 at the end.
    Catches: the schedule ignored, a wrong period (e.g. the epoch's 937 steps instead of the run's 12),
    an off-by-one in i, the optimizer not given the scheduled lr."""
    d = ht.scratch("lr-cosine")
    base, total = 0.1, 12
    train(d, *PLAIN_SGD, "--lr-schedule", "cosine", "--max-steps", total, "--checkpoint-every-steps", 1,
          "--keep-last", 0)
    lr = cosine(base, total)
    check_recorded_lrs(d, range(1, total + 1), lr, lr, "cosine schedule")
    sch = ht.attrs(ht.ckpt(d, total), "train/lr_scheduler")
    ht.check(sch["type"] == "cosine" and int(sch["total_steps"]) == total and float(sch["lr"]) == 0.0,
             f"scheduler state at the end: {sch}")
    got = check_measured(d, [3, 9], lr, "lr-cosine-measure")
    shutil.rmtree(d, ignore_errors=True)
    return "; ".join(got)


def test_lr_cosine_resume():
    """A cosine run (Adam, dropout) resumed at step 5 of 12 ends bitwise equal to the uninterrupted run: the
    resumed steps use the lrs of steps 6..12 of the whole run. Control: the same resume with
    --lr-schedule constant does not match (so the comparison sees the lrs).
    Catches: the schedule restarted on resume (lr from the steps since the resume) or stretched over the
    remaining steps only."""
    a, c = ht.scratch("cos-a"), ht.scratch("cos-c")
    common = ["--lr-schedule", "cosine", "--max-steps", 12, "--keep-last", 0, "--seed", 5]
    train(a, *common)
    train(c, *common, "--checkpoint-every-steps", 5)
    ht.check(ht.steps_in(c) == [5, 10, 12], f"checkpoints {ht.steps_in(c)}")
    b = ht.copy_with([ht.ckpt(c, 5)], "cos-b")
    r = train(b, *common)
    ht.check(ht.resumed_from(r) == (ht.ckpt(b, 5), 5), f"did not resume from step 5: {r}")
    ht.check_bitwise(ht.ckpt(a, 12), ht.ckpt(b, 12), "cosine run resumed at step 5")
    ctl = ht.copy_with([ht.ckpt(c, 5)], "cos-ctl")
    train(ctl, "--lr-schedule", "constant", "--replan-lr-schedule", "--max-steps", 12, "--keep-last", 0, "--seed", 5)
    ht.check(ht.compare(ht.ckpt(a, 12), ht.ckpt(ctl, 12)).rc != 0,
             "control: a constant-lr resume matched the cosine run")
    for x in (a, b, c, ctl):
        shutil.rmtree(x, ignore_errors=True)
    return "resumed run bitwise equal; constant-lr control differs"


# ---- 6. retention with the default --keep-last 3 ------------------------------------------------------------------
def test_retention_default_keep_last():
    """10 saves (--checkpoint-every-steps 1) without --keep-last: exactly ckpt 8, 9, 10 remain and `latest`
    names 10; with --keep-every 3 also 3 and 6 (9 is both). Every remaining file verifies.
    Catches: another default (0 keeps all, 1, ...), an off-by-one in the count, --keep-every ignored or
    applied to the index instead of the step, `latest` not the newest, the newest removed."""
    d, e = ht.scratch("keep-default"), ht.scratch("keep-every")
    train(d, "--max-steps", 10, "--checkpoint-every-steps", 1)
    ht.check(ht.steps_in(d) == [8, 9, 10], f"default retention left {ht.steps_in(d)}, expected [8, 9, 10]")
    ht.check(ht.latest_target(d) == ht.ckpt(d, 10), f"latest names {ht.latest_target(d)}")
    ht.check(not ht.partials(d), f"partial files left: {ht.partials(d)}")
    ht.verify_all(d)
    train(e, "--max-steps", 10, "--checkpoint-every-steps", 1, "--keep-every", 3)
    ht.check(ht.steps_in(e) == [3, 6, 8, 9, 10], f"--keep-every 3 left {ht.steps_in(e)}, expected [3, 6, 8, 9, 10]")
    ht.check(ht.latest_target(e) == ht.ckpt(e, 10), f"latest names {ht.latest_target(e)}")
    ht.verify_all(e)
    for x in (d, e):
        shutil.rmtree(x, ignore_errors=True)
    return "kept [8, 9, 10] and [3, 6, 8, 9, 10]"


# ---- 7. resume with another global batch -------------------------------------------------------------------------
def permutation(n, seed, epoch):
    """Epoch `epoch`'s order of the n samples as h5ddp-train visits them (src/torch/sampler.cpp's
    shuffled_indices, include/h5ddp/splitmix.hpp's generator), from the package's Python sampler: the one
    implementation outside C++, python/h5ddp_torch/sampler.py, equal to it bit for bit (tests/python/test_sampler.py,
    test_cross_resume.py). Imported here, not at the top: the package imports torch, which only this case needs."""
    from h5ddp_torch.sampler import shuffled_indices
    return shuffled_indices(n, seed, epoch)


_DATA = {}


def train_data():
    if not _DATA:
        with gzip.open(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")) as f:
            raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
        with gzip.open(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz")) as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
        scale, shift = np.float32(1.0) / (np.float32(255.0) * np.float32(0.3530)), np.float32(0.2860) / np.float32(0.3530)
        _DATA["x"] = raw.astype(np.float32) * scale - shift
        _DATA["y"] = labels
    return _DATA["x"], _DATA["y"]


def sgd_step_delta(w, indices, lr):
    """One SGD step of the MLP 784->32->10 (ReLU, mean cross-entropy over the global batch) on `indices`,
    in float64: the change of every weight."""
    x_all, y_all = train_data()
    x, y = x_all[indices].astype(np.float64), y_all[indices]
    a = x @ w["fc1.weight"].T + w["fc1.bias"]
    h = np.maximum(a, 0)
    z = h @ w["fc2.weight"].T + w["fc2.bias"]
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    dz = p / len(y)
    dh = (dz @ w["fc2.weight"]) * (a > 0)
    grads = {"fc2.weight": dz.T @ h, "fc2.bias": dz.sum(0), "fc1.weight": dh.T @ x, "fc1.bias": dh.sum(0)}
    return {k: -lr * g for k, g in grads.items()}


def step_error(before, after, indices, lr=0.1):
    """Relative L2 distance between the step the trainer took and the numpy step on `indices`."""
    ref = sgd_step_delta(before, indices, lr)
    keys = sorted(ref)
    got = np.concatenate([(after[k] - before[k]).ravel() for k in keys])
    want = np.concatenate([ref[k].ravel() for k in keys])
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def resume_with_other_batch(saved_steps, new_batch, tag):
    """Save after `saved_steps` steps of global batch 64, resume with --batch-size new_batch (the position is
    not a multiple of it):
      - the warning and 'resumed from ... sample P' are printed;
      - the first resumed step trains on exactly samples perm[P, P + new_batch) of epoch 0 (recomputed in
        numpy from the checkpoint's weights with h5ddp_torch's sampler; positions one sample
        off, rounded to a multiple of the new batch, or the old batch size, must not match);
      - the epoch is completed: floor((60000 - P) / new_batch) more steps, '1 of 1 epochs complete', epoch 1
        and position 0 in the final checkpoint, samples_consumed = P + steps * new_batch;
      - a second identical resume ends bitwise equal.
    Catches: a replayed or skipped sample, a position rounded to the new batch, a batch of the old size, a
    stop before the end of the epoch (or after it), nondeterminism."""
    seed, old = 42, 64
    pos = saved_steps * old
    ht.check(pos % new_batch != 0, "test setup: the position must not be a multiple of the new batch")
    base = ht.scratch(f"{tag}-base")
    train(base, *PLAIN_SGD, "--max-steps", saved_steps, "--seed", seed, batch=old)
    saved = ht.ckpt(base, saved_steps)
    perm = permutation(TRAIN_SAMPLES, seed, 0)
    notes = []

    one = ht.copy_with([saved], f"{tag}-one")
    r = train(one, *PLAIN_SGD, "--max-steps", saved_steps + 1, "--seed", seed, batch=new_batch)
    warn = (f"warning: --batch-size {new_batch} differs from the {old} of the checkpoint; continuing with "
            f"{new_batch} from sample {pos}")
    ht.check(warn in r.text, f"no warning '{warn}': {r}")
    ht.check(re.search(rf"resumed from \S+ckpt-{saved_steps:08d}\.h5 at step {saved_steps}, epoch 1, sample {pos} ",
                       r.text), f"no 'resumed from ... sample {pos}': {r}")
    before, after = weights(saved), weights(ht.ckpt(one, saved_steps + 1))
    err = step_error(before, after, perm[pos:pos + new_batch])
    ht.check(err < 1e-3, f"the first resumed step did not train on samples [{pos}, {pos + new_batch}) of the "
                         f"epoch's order: relative difference {err:.3g} from the recomputed step")
    wrong = {"one sample later": pos + 1, "rounded down": pos // new_batch * new_batch,
             "rounded up": -(-pos // new_batch) * new_batch}
    for what, p in wrong.items():
        e = step_error(before, after, perm[p:p + new_batch])
        ht.check(e > 0.05, f"the recomputed step cannot tell position {p} ({what}) from {pos}: {e:.3g}")
    e = step_error(before, after, perm[pos:pos + old])
    ht.check(e > 0.05, f"the recomputed step cannot tell a batch of {old} from {new_batch}: {e:.3g}")
    notes.append(f"first step matches samples [{pos}, {pos + new_batch}) to {err:.1e}")

    remaining = (TRAIN_SAMPLES - pos) // new_batch
    final = saved_steps + remaining
    runs = []
    for n in (1, 2):
        d = ht.copy_with([saved], f"{tag}-full{n}")
        runs.append((d, train(d, *PLAIN_SGD, "--seed", seed, batch=new_batch)))
    (d1, r1), (d2, r2) = runs
    ht.check(ht.steps_in(d1) == ht.steps_in(d2),
             f"the two resumes saved different steps: {ht.steps_in(d1)} / {ht.steps_in(d2)}")
    last1, last2 = ht.checkpoints(d1)[-1], ht.checkpoints(d2)[-1]
    ht.check_bitwise(last1, last2, "two identical resumes with --batch-size")
    notes.append("two resumes bitwise equal")
    step, complete = trained_line(r1)
    ht.check(step == final and complete == 1,
             f"resumed at sample {pos} with a global batch of {new_batch}: the epoch's remaining "
             f"{TRAIN_SAMPLES - pos} samples make {remaining} steps, so training should end at step {final} with "
             f"'1 of 1 epochs complete'; it ended at step {step} with {complete} of 1 complete "
             f"(position {int(scalar(last1, 'data/position'))} of epoch {int(scalar(last1, 'data/epoch'))})")
    ht.check(int(scalar(last1, "data/epoch")) == 1 and int(scalar(last1, "data/position")) == 0,
             "the final checkpoint is not at the start of epoch 1")
    consumed = int(scalar(last1, "train/samples_consumed"))
    ht.check(consumed == pos + remaining * new_batch, f"samples_consumed {consumed}, expected "
                                                      f"{pos + remaining * new_batch}")
    notes.append(f"epoch completed at step {final}")
    for x in (base, one, d1, d2):
        shutil.rmtree(x, ignore_errors=True)
    return "; ".join(notes)


def test_resume_smaller_batch():
    """Saved at position 320 (5 steps of 64), resumed with a global batch of 48 (320 = 6.67 x 48)."""
    return resume_with_other_batch(5, 48, "batch48")


def test_resume_larger_batch():
    """Saved at position 320 (5 steps of 64), resumed with a global batch of 96 (320 = 3.33 x 96): 621 more
    steps complete the epoch at step 626, one more than 60000 // 96 = 625 steps of a fresh epoch."""
    return resume_with_other_batch(5, 96, "batch96")


# ---- 8. watchdog: exit code 70 -----------------------------------------------------------------------------------
def test_watchdog_explicit_exit_70():
    """--watchdog-seconds 2 and a 60 s step sleep: the job ends with exit code 70 and the watchdog's message.
    Catches: another exit code (1, 134 from abort(), mpirun's own), no message, no abort (a 3 minute run)."""
    d = ht.scratch("watchdog-explicit")
    r = train(d, "--max-steps", 3, "--no-final-checkpoint", "--watchdog-seconds", 2, "--step-sleep-ms", 60000,
              expect_rc=None, timeout=170)
    ht.check(r.rc == 70, f"exit code {r.rc}, expected 70: {r}")
    ht.check("h5ddp: watchdog:" in r.text and "has not completed after" in r.text and "exit code 70" in r.text,
             f"no watchdog message: {r}")
    shutil.rmtree(d, ignore_errors=True)
    return f"exit 70 after {r.seconds:.1f} s"


def test_watchdog_default_fires():
    """No --watchdog-seconds (auto), H5DDP_WATCHDOG_FLOOR_SECONDS=3 in the ranks' environment, a 60 s step
    sleep: exit code 70 and a message naming the step sleep.
    Catches: the automatic watchdog off by default, the floor variable ignored, the sleep not watched."""
    d = ht.scratch("watchdog-default")
    r = train(d, "--max-steps", 3, "--no-final-checkpoint", "--step-sleep-ms", 60000,
              env={"H5DDP_WATCHDOG_FLOOR_SECONDS": "3", "H5DDP_TEST_HOOKS": "1"}, expect_rc=None, timeout=170)
    ht.check(r.rc == 70, f"exit code {r.rc}, expected 70: {r}")
    ht.check("h5ddp: watchdog:" in r.text and "step sleep" in r.text, f"no watchdog message naming the step sleep: {r}")
    shutil.rmtree(d, ignore_errors=True)
    return f"exit 70 after {r.seconds:.1f} s"


def test_watchdog_default_healthy():
    """The automatic watchdog with a low floor (10 s) lets a healthy run of 20 steps with 10 ms sleeps and
    periodic saves finish: exit 0, no watchdog message.
    Catches: a limit from the fastest instead of the slowest step, a sleep or save watched with the wrong
    limit, a guard left armed across steps."""
    d = ht.scratch("watchdog-healthy")
    # Floor 10 s (saves 30 s): a first step or save at a load of 8 may take several seconds, never ten.
    r = train(d, "--max-steps", 20, "--step-sleep-ms", 10, "--checkpoint-every-steps", 5,
              env={"H5DDP_WATCHDOG_FLOOR_SECONDS": "10", "H5DDP_TEST_HOOKS": "1"})
    ht.check("h5ddp: watchdog:" not in r.text, f"watchdog message in a healthy run: {r}")
    shutil.rmtree(d, ignore_errors=True)
    return f"{r.seconds:.1f} s"


TESTS = [test_checkpoint_every_seconds, test_verify_replicas, test_second_sigint_kills_without_saving,
         test_lr_step, test_lr_step_per_epoch, test_lr_cosine, test_lr_cosine_resume,
         test_retention_default_keep_last, test_resume_smaller_batch, test_resume_larger_batch,
         test_watchdog_explicit_exit_70, test_watchdog_default_fires, test_watchdog_default_healthy]

if __name__ == "__main__":
    ht.cli(TESTS)
