"""Cross-resume between a real PyTorch DDP job (gloo, 2 processes, h5ddp_torch) and h5ddp-train, both ways.

A PyTorch run saves at step 3 and h5ddp-train resumes it; h5ddp-train saves at step 3 and the PyTorch loop resumes
it. The losses of the 3 steps after each resume must match what PyTorch computes from the same state within 1e-5:
  - h5ddp-train prints its losses with 4 decimals only, so its exact loss of step k is recomputed by PyTorch from
    h5ddp-train's own checkpoint of step k-1 (weights, every rank's RNG row, data position: pt_loop.step_loss);
    the printed value must agree with that to its 4 decimals;
  - h5ddp-train's metrics log (RUN_DIR/metrics.jsonl, --log-every 1) has its losses at full precision: they must
    match PyTorch's directly too;
  - the PyTorch job reports its losses at full precision.
The final states (step 6) of the resumed run and of the uninterrupted run of the other side must agree too (weights
and optimizer state within 1e-5, data position and RNG rows exactly)."""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402  (puts python/ and tests/interop on sys.path)
import interop_common as ic  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "support"))
import h5ddp_test as ht  # noqa: E402

TOL = 1e-5
STEPS, RESUME_AT = 6, 3


def pt_run(args, run_dir, losses):
    cmd = ic.mpi(args, 2, sys.executable, os.path.join(HERE, "pt_loop.py"), "--run-dir", run_dir,
                 "--max-steps", str(STEPS), "--save-every", "1", "--losses", losses)
    out = ic.run(cmd, timeout=180).stdout
    with open(losses) as f:
        return out, {int(k): v for k, v in json.load(f).items()}


def cpp_run(args, run_dir):
    """stdout and stderr (the "resumed from" line is a log line) of h5ddp-train run to STEPS, saving every step."""
    p = ic.run(ic.mpi(args, 2, args.train, "--run-dir", run_dir, "--threads", "1", "--no-eval", "--max-steps",
                      str(STEPS), "--batch-size", "16", "--no-fsync", "--keep-last", "0", "--log-every", "1",
                      "--checkpoint-every-steps", "1"), timeout=180)
    return p.stdout + p.stderr


def logged_losses(run_dir):
    """h5ddp-train's own losses at full precision, {step: mean over ranks}, from RUN_DIR/metrics.jsonl
    (--log-every 1: one "train" record per step)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in recs if r["event"] == "train"}


def ckpt(run_dir, step):
    return os.path.join(run_dir, f"ckpt-{step:08d}.h5")


def compare_states(a, b):
    """Tensors within TOL, data position and RNG rows exactly (h5ddp_test.compare_checkpoints)."""
    c = ht.compare_checkpoints(a, b, atol=TOL, groups=("model", "optimizer/state"))
    assert c.ok, f"{a} vs {b}: {c}"
    c = ht.compare_checkpoints(a, b, groups=("data/epoch", "data/position", "data/seed", "data/global_batch",
                                             "train/step", "rng/cpu"))
    assert c.ok, f"{a} vs {b}: {c}"


def main():
    args = ic.parse_args(__doc__)
    images, labels = pt_loop.train_set()
    with ic.Scratch(args, "cross-resume") as w:
        # The two uninterrupted runs, each saving every step.
        _, pt_losses = pt_run(args, w("pt"), w("pt.json"))
        cpp_out = cpp_run(args, w("cpp"))
        cpp_printed = ic.step_losses(cpp_out)
        cpp_exact = {k: pt_loop.step_loss(ckpt(w("cpp"), k - 1), images, labels) for k in range(RESUME_AT + 1, STEPS + 1)}
        for k, v in cpp_exact.items():
            assert abs(v - cpp_printed[k]) <= 0.5e-4 + 1e-9, f"h5ddp-train printed {cpp_printed[k]} at step {k}, " \
                                                             f"PyTorch computes {v} from its step-{k - 1} checkpoint"

        # PyTorch -> h5ddp-train: resume the PyTorch run's step-3 checkpoint.
        os.makedirs(w("a"))
        shutil.copy(ckpt(w("pt"), RESUME_AT), w("a"))
        out = cpp_run(args, w("a"))
        assert f"resumed from {ckpt(w('a'), RESUME_AT)} at step {RESUME_AT}" in out, out
        printed = ic.step_losses(out)
        assert sorted(printed) == list(range(RESUME_AT + 1, STEPS + 1)), printed
        for k in printed:
            exact = pt_loop.step_loss(ckpt(w("a"), k - 1), images, labels)  # h5ddp-train's state before step k
            print(f"pytorch->h5ddp step {k}: h5ddp-train {exact:.9f} (printed {printed[k]}), pytorch {pt_losses[k]:.9f}")
            assert abs(exact - pt_losses[k]) <= TOL, f"step {k}: {exact} vs {pt_losses[k]}"
            assert abs(printed[k] - pt_losses[k]) <= 0.5e-4 + TOL, f"step {k}: printed {printed[k]} vs {pt_losses[k]}"
        logged = logged_losses(w("a"))  # h5ddp-train's own full-precision losses of the resumed steps
        assert sorted(logged) == list(range(RESUME_AT + 1, STEPS + 1)), logged
        for k, v in logged.items():
            assert abs(v - pt_losses[k]) <= TOL, f"step {k}: h5ddp-train logged {v}, PyTorch computed {pt_losses[k]}"
        compare_states(ckpt(w("a"), STEPS), ckpt(w("pt"), STEPS))

        # h5ddp-train -> PyTorch: resume h5ddp-train's step-3 checkpoint.
        os.makedirs(w("b"))
        shutil.copy(ckpt(w("cpp"), RESUME_AT), w("b"))
        out, losses = pt_run(args, w("b"), w("b.json"))
        assert f"resumed from {ckpt(w('b'), RESUME_AT)} at step {RESUME_AT}" in out, out
        assert sorted(losses) == list(range(RESUME_AT + 1, STEPS + 1)), losses
        cpp_logged = logged_losses(w("cpp"))
        for k, v in losses.items():
            print(f"h5ddp->pytorch step {k}: pytorch {v:.9f}, h5ddp-train {cpp_exact[k]:.9f} (printed {cpp_printed[k]})")
            assert abs(v - cpp_exact[k]) <= TOL, f"step {k}: {v} vs {cpp_exact[k]}"
            assert abs(v - cpp_logged[k]) <= TOL, f"step {k}: PyTorch {v}, h5ddp-train logged {cpp_logged[k]}"
        compare_states(ckpt(w("b"), STEPS), ckpt(w("cpp"), STEPS))
    print("PASS")


if __name__ == "__main__":
    main()
