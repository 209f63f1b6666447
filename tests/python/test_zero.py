"""torch's ZeroRedundancyOptimizer (ZeRO-1) checkpointed with h5ddp_torch, no consolidation (issue 41): the CNN/Adam
loop of pt_loop.py with --zero (gloo, under mpirun), global batch 24 so that 2 and 3 ranks both divide it.

  1  2 ZeRO ranks SIGKILLed after step 3 (torchrun-style launch), resumed under mpirun to step 6: the step-6 file equals the uninterrupted run's, every /model and /optimizer dataset byte for byte
     (and every other dataset);
  2  the ZeRO files equal, every dataset byte for byte, the files a plain torch.optim.Adam job of the same steps
     writes;
  3  the 2-rank ZeRO step-3 file resumed by 3 ZeRO ranks: each rank holds only its partition, the losses match
     a plain-Adam 3-rank resume of the same file within 1e-5 and so do the step-6 files;
  4  h5ddp-train --shard-optimizer's step-3 file resumed by the ZeRO job (losses within 1e-5 of h5ddp-train's own
     logged ones, step-6 states within 1e-5), and the ZeRO job's step-3 file resumed by h5ddp-train
     --shard-optimizer (the same against the ZeRO run);
  5  h5ddp-ckpt verify and h5ddp_torch.verify accept the ZeRO files; a flipped value in one parameter's state
     (read by its owner only) makes the ZeRO load fail on every rank, naming the dataset, nothing touched;
  6  without MPI (torchrun-style launch, the torch transport): 2 ZeRO ranks write the same step-3 file as under
     mpirun and 3 ZeRO ranks resume it to the same step-6 file as the mpirun 3-rank resume (every dataset bitwise)."""
import json
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402  (puts python/ and tests/interop on sys.path)
import interop_common as ic  # noqa: E402
import h5ddp_torch  # noqa: E402
import torchrun_launch as tl  # noqa: E402
import test_cross_resume as xr  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "support"))
import h5ddp_test as ht  # noqa: E402

TOL = 1e-5
STEPS, AT, BATCH = 6, 3, 24
N_PARAMS = 8  # the CNN's parameter tensors


def pt_run(args, n, run_dir, steps, zero=True):
    """(stdout, {step: loss}) of the PyTorch loop on n ranks run (or resumed) to `steps`, saving every step."""
    losses = run_dir + ".json"
    cmd = ic.mpi(args, n, sys.executable, os.path.join(HERE, "pt_loop.py"), "--run-dir", run_dir, "--max-steps",
                 str(steps), "--save-every", "1", "--batch-size", str(BATCH), "--losses", losses,
                 *(["--zero"] if zero else []))
    p = ic.run(cmd, timeout=120)
    with open(losses) as f:
        return p.stdout, {int(k): v for k, v in json.load(f).items()}


def cpp_run(args, run_dir):
    p = ic.run(ic.mpi(args, 2, args.train, "--run-dir", run_dir, "--threads", "1", "--no-eval", "--max-steps",
                      str(STEPS), "--batch-size", str(BATCH), "--no-fsync", "--keep-last", "0", "--log-every", "1",
                      "--checkpoint-every-steps", "1", "--shard-optimizer"), timeout=120)
    return p.stdout + p.stderr


logged_losses, ckpt = xr.logged_losses, xr.ckpt  # h5ddp-train's metrics log; a run dir's checkpoint of a step


def resumed_copy(src_dir, dst_dir):
    os.makedirs(dst_dir)
    shutil.copy(ckpt(src_dir, AT), dst_dir)


def same_bytes(a, b, groups=None):
    c = ht.compare_checkpoints(a, b, groups=groups)
    assert c.ok, f"{a} vs {b}: {c}"


def close_states(a, b):
    c = ht.compare_checkpoints(a, b, atol=TOL, groups=("model", "optimizer/state"))
    assert c.ok, f"{a} vs {b}: {c}"
    c = ht.compare_checkpoints(a, b, groups=("data", "train/step", "rng/cpu"))
    assert c.ok, f"{a} vs {b}: {c}"


def held_params(out, n):
    """The 'zero rank r: state of k params, owns m' lines of a resumed ZeRO run: each rank holds exactly its own
    partition, and the partitions cover the model once."""
    lines = [ln for ln in out.splitlines() if ln.startswith("zero rank ")]
    assert len(lines) == n, out
    held = [int(ln.split("state of ")[1].split()[0]) for ln in lines]
    owns = [int(ln.split("owns ")[1].split(",")[0]) for ln in lines]
    assert held == owns and sum(owns) == N_PARAMS, lines
    return held


def close_losses(what, got, want):
    assert sorted(got) == sorted(want), (got, want)
    worst = max(abs(got[k] - want[k]) for k in got)
    print(f"{what}: steps {sorted(got)}, max |loss difference| {worst:.3g}")
    assert worst <= TOL, f"{what}: {got} vs {want}"


def killed_after(w, run_dir, step):
    """2 ZeRO ranks (torchrun-style launch) saving every step, SIGKILLed while paused after `step` (its checkpoint
    committed, the run's remaining steps lost)."""
    logs = run_dir + "-logs"
    os.makedirs(logs)
    argv = [os.path.join(HERE, "pt_loop.py"), "--launch", "env", "--run-dir", run_dir, "--max-steps", str(STEPS),
            "--save-every", "1", "--batch-size", str(BATCH), "--zero", "--pause-after-step", str(step)]
    procs = tl.start(2, argv, log_dir=logs)
    deadline = time.time() + 150
    marker = f"paused after step {step}"
    while not all(marker in open(os.path.join(logs, f"rank{r}.log")).read() for r in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "the run did not reach the pause"
        time.sleep(0.5)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert h5ddp_torch.commit.read_latest(run_dir) == os.path.basename(ckpt(run_dir, step))
    print(f"SIGKILLed both ZeRO ranks after step {step}; {run_dir}: {sorted(os.listdir(run_dir))}")


def kill_resume(args, w):
    """1 and 2."""
    _, z = pt_run(args, 2, w("z"), STEPS)
    killed_after(w, w("k"), AT)
    out, k = pt_run(args, 2, w("k"), STEPS)
    assert f"resumed from {ckpt(w('k'), AT)} at step {AT}" in out, out
    print(f"1: 2-rank ZeRO resume holds {held_params(out, 2)} parameters' state per rank")
    same_bytes(ckpt(w("k"), STEPS), ckpt(w("z"), STEPS), groups=("model", "optimizer"))
    same_bytes(ckpt(w("k"), STEPS), ckpt(w("z"), STEPS))
    assert all(k[s] == z[s] for s in k), (k, z)
    print("1: SIGKILL + resume from step 3 == uninterrupted, step-6 file bitwise (/model, /optimizer, all datasets)")
    _, p = pt_run(args, 2, w("p"), STEPS, zero=False)
    for s in range(1, STEPS + 1):
        same_bytes(ckpt(w("z"), s), ckpt(w("p"), s))
    assert p == z, (p, z)
    print("2: ZeRO files == plain Adam files, steps 1-6, every dataset bitwise; losses identical")
    return z


def world_change(args, w):
    """3."""
    resumed_copy(w("z"), w("z3"))
    resumed_copy(w("z"), w("p3"))
    out, z3 = pt_run(args, 3, w("z3"), STEPS)
    print(f"3: 3-rank ZeRO resume of the 2-rank file holds {held_params(out, 3)} parameters' state per rank")
    _, p3 = pt_run(args, 3, w("p3"), STEPS, zero=False)
    close_losses("3: 2->3 ranks, ZeRO vs plain Adam", z3, p3)
    close_states(ckpt(w("z3"), STEPS), ckpt(w("p3"), STEPS))


def with_h5ddp_train(args, w, z):
    """4."""
    cpp_run(args, w("c"))
    cpp = logged_losses(w("c"))
    resumed_copy(w("c"), w("cz"))
    out, cz = pt_run(args, 2, w("cz"), STEPS)
    assert f"resumed from {ckpt(w('cz'), AT)} at step {AT}" in out, out
    held_params(out, 2)
    close_losses("4: h5ddp-train --shard-optimizer -> ZeRO", cz, {s: cpp[s] for s in cz})
    close_states(ckpt(w("cz"), STEPS), ckpt(w("c"), STEPS))
    resumed_copy(w("z"), w("zc"))
    out = cpp_run(args, w("zc"))
    assert f"resumed from {ckpt(w('zc'), AT)} at step {AT}" in out, out
    zc = logged_losses(w("zc"))
    close_losses("4: ZeRO -> h5ddp-train --shard-optimizer", zc, {s: z[s] for s in zc})
    close_states(ckpt(w("zc"), STEPS), ckpt(w("z"), STEPS))


def verify_all(args, paths):
    """5."""
    for path in paths:
        out = ic.run([args.ckpt, "verify", path], timeout=60).stdout
        assert out.startswith("OK"), out
        problems = h5ddp_torch.verify(path)
        assert problems == [], f"h5ddp_torch.verify rejects {path}: {problems}"
    print(f"5: h5ddp-ckpt verify and h5ddp_torch.verify accept {len(paths)} ZeRO files")


def damaged_refused(args, w, src):
    """5: the state of one parameter altered (its checksum left as it was)."""
    import h5py
    bad = w("damaged.h5")
    shutil.copy(src, bad)
    dataset = "/optimizer/state/conv1.bias/exp_avg"
    with h5py.File(bad, "r+") as f:
        f[dataset][0] += 1.0
    out = ic.run(ic.mpi(args, 2, sys.executable, os.path.join(HERE, "zero_load_check.py"), "--file", bad,
                        "--expect", f"checksum mismatch in dataset {dataset}"), timeout=120).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith(("REFUSED", "WRONG"))]
    assert len(lines) == 2 and all(ln.startswith("REFUSED") for ln in lines), out
    print(f"5: a damaged {dataset} is refused by both ZeRO ranks, model and optimizer untouched")


def without_mpi(w):
    """6."""
    loop = os.path.join(HERE, "pt_loop.py")
    for n, steps in ((2, AT), (3, STEPS)):
        out = tl.run(n, [loop, "--launch", "env", "--zero", "--run-dir", w("t"), "--max-steps", str(steps),
                         "--save-every", "1", "--batch-size", str(BATCH)], timeout=120)[0]
    assert f"resumed from {ckpt(w('t'), AT)} at step {AT}" in out, out
    held_params(out, 3)
    for s in range(1, AT + 1):
        same_bytes(ckpt(w("t"), s), ckpt(w("z"), s))
    for s in range(AT + 1, STEPS + 1):
        same_bytes(ckpt(w("t"), s), ckpt(w("z3"), s))
    print("6: torchrun-style ZeRO (no MPI): 2-rank steps 1-3 and 3-rank resumed steps 4-6 == the mpirun files, bitwise")


def main():
    args = ic.parse_args(__doc__)
    with ic.Scratch(args, "zero") as w:
        z = kill_resume(args, w)
        world_change(args, w)
        with_h5ddp_train(args, w, z)
        verify_all(args, [ckpt(w(d), s) for d in ("z", "k", "z3", "cz") for s in (AT, STEPS)])
        damaged_refused(args, w, ckpt(w("z"), STEPS))
        without_mpi(w)
    print("PASS")


if __name__ == "__main__":
    main()
