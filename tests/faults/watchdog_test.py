"""Watchdog end to end: one rank stalls instead of entering a collective; the job must end by MPI_Abort
within a bounded time with a message naming host, rank and the stalled operation. Argument: rank count."""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
WATCHDOG = 2.0  # a stall is detected after this long
HEALTHY = 20.0  # the limit given to healthy runs: no spurious abort even at a load of 8


def test_stalled_rank_aborts_job():
    r = ht.mpirun(NP, [ht.tool("h5ddp_watchdog_stall"), "--watchdog-seconds", str(WATCHDOG),
                       "--stall-seconds", "300", "--stall-step", "2"], timeout=240)
    ht.check(r.rc != 0, f"job with a stalled rank exited 0: {r}")
    ht.check("has not completed after" in r.err and "watchdog" in r.err, f"no watchdog message: {r}")
    ht.check("rank " in r.err and "step 2" in r.err, f"message does not name rank and stalled operation: {r}")
    # The stall is 300 s: ending well before that means the watchdog, not the sleep, ended the job.
    ht.check(r.seconds < WATCHDOG + 120, f"abort took {r.seconds:.1f}s")
    return f"aborted after {r.seconds:.1f}s"


def test_healthy_job_completes():
    r = ht.mpirun(NP, [ht.tool("h5ddp_watchdog_stall"), "--watchdog-seconds", str(HEALTHY),
                       "--stall-step", "-1", "--steps", "50"], timeout=120)
    ht.check(r.rc == 0 and "completed 50 steps" in r.out, f"healthy job failed: {r}")
    ht.check("watchdog" not in r.err, f"watchdog fired on a healthy job: {r}")


def test_trainer_option_aborts_stalled_step():
    """h5ddp-train --watchdog-seconds: a step that outlives T (here the test's --step-sleep-ms stands for a
    stuck step) ends the job with the watchdog's message; a healthy run with the option is unaffected."""
    try:
        train = ht.tool("h5ddp-train")
    except ht.Failure:
        raise ht.Skip("h5ddp-train is not built")
    d = ht.scratch("watchdog-train")
    common = [train, "--run-dir", d, "--data-dir", ht.small_fashion_mnist(), "--model", "mlp", "--mlp-hidden", "16",
              "--batch-size", "32", "--no-eval", "--max-steps", "3", "--no-final-checkpoint"]
    r = ht.mpirun(NP, common + ["--watchdog-seconds", str(WATCHDOG), "--step-sleep-ms", "120000"], timeout=120)
    ht.check(r.rc != 0 and "watchdog" in r.err and "step sleep" in r.err, f"no watchdog abort: {r}")
    ok = ht.mpirun(NP, common + ["--watchdog-seconds", str(HEALTHY), "--step-sleep-ms", "10"], timeout=120)
    ht.check(ok.rc == 0 and "watchdog" not in ok.err, f"watchdog fired on a healthy run: {ok}")
    shutil.rmtree(d, ignore_errors=True)
    return f"aborted after {r.seconds:.1f}s (including start-up)"


if __name__ == "__main__":
    sys.exit(ht.main([test_stalled_rank_aborts_job, test_healthy_job_completes,
                      test_trainer_option_aborts_stalled_step]))
