"""h5ddp_torch without MPI (issue 41): a PyTorch DDP (gloo) loop started the way torchrun starts it (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT; init_process_group from the environment; no mpirun, no OMPI_* variables)
writes docs/FORMAT.md's one file through torch.distributed and positional writes:
  - 2 and 4 processes save, /user tensors of every dtype too (tests/python/py_writer.py); every file passes h5ddp-ckpt verify and h5ddp_torch.verify (world_size as launched);
  - a run SIGKILLed mid-run (after step 5, last checkpoint step 4) resumes and its step-6 checkpoint equals the
    uninterrupted run's bit for bit (/model, /optimizer, /rng, /data, /train);
  - a rank that dies mid-save (H5DDP_TEST_HOOKS: rank 1 exits after a positional write of its share) makes the
    other rank raise one line, leaves the previous checkpoint valid and named by `latest`, no step-4 file and no
    partial; the run then resumes from step 2 and ends bitwise equal too;
  - h5dump reads a file whole;
  - cross-resume with h5ddp-train (mpirun) both ways, as tests/python/test_cross_resume.py: the losses after the
    switch within 1e-5 of the other side's, the final states within 1e-5."""
import json
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402  (puts python/ and tests/interop on sys.path)
import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402
import test_cross_resume as xr  # noqa: E402
import torchrun_launch as tl  # noqa: E402

LOOP = os.path.join(HERE, "pt_loop.py")
STEPS = xr.STEPS
EXACT = ("model", "optimizer", "rng", "data", "train")


def tr_run(run_dir, n=2, steps=STEPS, save_every=1, losses=None, expect=0, extra_env=None):
    argv = [LOOP, "--launch", "env", "--run-dir", run_dir, "--max-steps", str(steps), "--save-every", str(save_every)]
    outs = tl.run(n, argv + (["--losses", losses] if losses else []), timeout=150, expect=expect, extra_env=extra_env)
    if losses:
        with open(losses) as f:
            return outs, {int(k): v for k, v in json.load(f).items()}
    return outs, None


def bitwise(a, b):
    c = xr.ht.compare_checkpoints(a, b, groups=EXACT)
    assert c.ok, f"{a} vs {b} not bitwise equal: {c}"
    print(f"bitwise equal: {a} {b}")


def killed_run(w, reference):
    """SIGKILL every rank after step 5 (checkpoint of step 4 written, step 5 lost), resume, compare at step 6."""
    run_dir, logs = w("killed"), w("killed-logs")
    os.makedirs(logs)
    argv = [LOOP, "--launch", "env", "--run-dir", run_dir, "--max-steps", str(STEPS), "--save-every", "2",
            "--pause-after-step", "5"]
    procs = tl.start(2, argv, log_dir=logs)
    deadline = time.time() + 150
    while not all("paused after step 5" in open(os.path.join(logs, f"rank{r}.log")).read() for r in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "the run did not reach step 5"
        time.sleep(0.5)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    print(f"SIGKILLed both ranks after step 5; {run_dir}: {sorted(os.listdir(run_dir))}")
    assert h5ddp_torch.commit.read_latest(run_dir) == "ckpt-00000004.h5"
    outs, _ = tr_run(run_dir, save_every=2)
    assert f"resumed from {xr.ckpt(run_dir, 4)} at step 4" in outs[0], outs[0]
    bitwise(xr.ckpt(run_dir, STEPS), reference)


def died_in_save(w, reference):
    """Rank 1 exits after its first positional write of the step-4 save."""
    run_dir = w("died")
    hooks = {"H5DDP_TEST_HOOKS": "1", "H5DDP_TEST_DIE_RANK": "1", "H5DDP_TEST_DIE_STEP": "4"}
    results = tl.wait(tl.start(2, [LOOP, "--launch", "env", "--run-dir", run_dir, "--max-steps", str(STEPS),
                                   "--save-every", "2"], hooks), 150)
    (rc0, out0), (rc1, _) = results
    print(out0)
    assert rc1 == 86 and rc0 != 0, f"exit codes {rc0}, {rc1}"
    errors = [line for line in out0.splitlines() if line.startswith("h5ddp_torch.errors.CheckpointError: ")]
    assert errors and errors[-1].split(": ", 1)[1].startswith("rank 0: "), out0
    assert sorted(os.listdir(run_dir)) == ["ckpt-00000002.h5", "latest"], os.listdir(run_dir)
    assert h5ddp_torch.commit.read_latest(run_dir) == "ckpt-00000002.h5"
    assert h5ddp_torch.verify(xr.ckpt(run_dir, 2)) == []
    outs, _ = tr_run(run_dir, save_every=2)
    assert f"resumed from {xr.ckpt(run_dir, 2)} at step 2" in outs[0], outs[0]
    bitwise(xr.ckpt(run_dir, STEPS), reference)


def same_losses(what, name, got, ref_name, ref):
    """The resumed steps 4..STEPS of `got` within xr.TOL of `ref` (both {step: loss})."""
    assert sorted(got) == list(range(4, STEPS + 1)), got
    for k, v in got.items():
        print(f"{what} step {k}: {name} {v:.9f}, {ref_name} {ref[k]:.9f}")
        assert abs(v - ref[k]) <= xr.TOL, f"step {k}: {v} vs {ref[k]}"


def cross(args, w, tr_losses):
    """torchrun-written step 3 -> h5ddp-train; h5ddp-train's step 3 -> the torchrun loop."""
    os.makedirs(w("to-cpp"))
    shutil.copy(xr.ckpt(w("tr"), 3), w("to-cpp"))
    out = xr.cpp_run(args, w("to-cpp"))
    assert f"resumed from {xr.ckpt(w('to-cpp'), 3)} at step 3" in out, out
    same_losses("torchrun->h5ddp", "h5ddp-train", xr.logged_losses(w("to-cpp")), "torchrun loop", tr_losses)
    xr.compare_states(xr.ckpt(w("to-cpp"), STEPS), xr.ckpt(w("tr"), STEPS))

    xr.cpp_run(args, w("cpp"))
    os.makedirs(w("from-cpp"))
    shutil.copy(xr.ckpt(w("cpp"), 3), w("from-cpp"))
    outs, losses = tr_run(w("from-cpp"), losses=w("from-cpp.json"))
    assert f"resumed from {xr.ckpt(w('from-cpp'), 3)} at step 3" in outs[0], outs[0]
    same_losses("h5ddp->torchrun", "torchrun loop", losses, "h5ddp-train", xr.logged_losses(w("cpp")))
    xr.compare_states(xr.ckpt(w("from-cpp"), STEPS), xr.ckpt(w("cpp"), STEPS))


def every_dtype(w):
    """tests/python/py_writer.py without MPI: /user tensors of every dtype (0-d, empty, bool, bfloat16), SGD and
    AdamW files; replicas that differ and a bad run directory fail on every rank, nothing committed."""
    outs = tl.run(2, [os.path.join(HERE, "py_writer.py"), w("dtypes"), "env"], timeout=150)
    assert all(f"rank {r}: collective failures agreed" in outs[r] for r in range(2)), outs
    return [w("dtypes", "sgd"), w("dtypes", "adam")]


def verify_all(args, dirs):
    paths = sorted(os.path.join(d, n) for d in dirs for n in os.listdir(d) if n.endswith(".h5"))
    for p in paths:
        assert h5ddp_torch.verify(p) == [], h5ddp_torch.verify(p)
    out = ic.run([args.ckpt, "verify", *paths], echo_stdout=False).stdout
    assert f"{len(paths)} of {len(paths)} valid" in out, out
    print(f"{len(paths)} files of these runs: h5ddp_torch.verify and h5ddp-ckpt verify accept every one")
    if shutil.which("h5dump"):
        ic.run(["h5dump", paths[-1]], echo_stdout=False)  # the HDF5 tools read every byte of a torchrun-written file
        print(f"h5dump reads {paths[-1]}")


def main():
    args = ic.parse_args(__doc__)
    with ic.Scratch(args, "torchrun") as w:
        _, tr_losses = tr_run(w("tr"), losses=w("tr.json"))
        reference = xr.ckpt(w("tr"), STEPS)
        tr_run(w("tr4"), n=4, steps=2, save_every=2)
        with h5ddp_torch.h5.open_file(xr.ckpt(w("tr4"), 2)) as f:
            assert int(f.attrs["world_size"]) == 4 and int(f.attrs["format_minor_version"]) == 2
        killed_run(w, reference)
        died_in_save(w, reference)
        cross(args, w, tr_losses)
        verify_all(args, [w(d) for d in ("tr", "tr4", "killed", "died", "from-cpp")] + every_dtype(w))
    print("PASS")


if __name__ == "__main__":
    main()
