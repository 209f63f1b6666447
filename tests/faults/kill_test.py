"""SIGKILL of one rank and of all ranks at each phase of a save (issues 9, 23), through the test-only hook
H5DDP_FAULT_INJECT=<phase>:<rank|all> (armed by H5DDP_TEST_HOOKS=1). A run with a committed checkpoint at
step 2 is killed while saving step 4; then: every ckpt-*.h5 left verifies with h5ddp-ckpt, `latest` holds
exactly the name of a committed checkpoint (the old or the new one: never a partial, never empty or
garbage), and a restart resumes from the NEWEST complete checkpoint (step 2, or step 4 once the rename, the
commit point, happened) and finishes. Phases inside the `latest` update (latest_written, latest_renamed)
and retention (mid_retention: killed between two removals of old checkpoints) run on rank 0 only.
Arguments: rank count, [--async-checkpoint], [--checkpoint-write auto|direct|mpiio], [--cases phase:who,...] (CI runs the full matrix at 2 ranks
and a few cases at 1 and 4, to keep the suite short on a 2-core machine)."""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("np", type=int)
ap.add_argument("--async-checkpoint", action="store_true", help="the killed save is an asynchronous one")
ap.add_argument("--checkpoint-write", default="auto", help="h5ddp-train --checkpoint-write of every save "
                "(auto = direct: O_DIRECT writes; mpiio: through MPI-IO and the page cache)")
ap.add_argument("--cases", default="", help="phase:who,... (who = rank or all); default: every phase, "
                "the last rank and all ranks")
ARGS = ap.parse_args()
NP, ASYNC = ARGS.np, ARGS.async_checkpoint
PHASES = ["before_data", "mid_data", "before_rename", "before_latest", "latest_written", "latest_renamed"]
RANK0_PHASES = ["latest_written", "latest_renamed", "mid_retention"]  # only rank 0 moves `latest`, retains
# Kills during the resume's load (issue 59: rank 0 reads the metadata and broadcasts it, every rank reads bytes at
# the shared offsets): a load writes nothing, so the checkpoint stays valid and the next restart resumes from it.
LOAD_PHASES = ["load_after_manifest", "load_mid_data"]
EXTRA = (["--async-checkpoint"] if ASYNC else []) + ["--checkpoint-write", ARGS.checkpoint_write]
# A hidden layer of 128: the first layer's weight and Adam moments (401 KB each) are large enough for O_DIRECT
# writes (docs/DESIGN.md, "Writes around the page cache"), so the kills land in that path too.
HIDDEN = 128


def train(run_dir, steps, env=None, keep_last=0):
    return ht.train(NP, run_dir, steps, extra=EXTRA, env=env, keep_last=keep_last, hidden=HIDDEN)
_base = None


def base_run():
    """A run directory holding ckpt-2 (committed, latest): shared by every scenario, copied per test."""
    global _base
    if _base is None:
        _base = ht.scratch("kill-base")
        r = train(_base, 2, env={"H5DDP_LOG_LEVEL": "debug"})
        ht.check(r.rc == 0, f"base run failed: {r}")
        # The saves went the way --checkpoint-write says: some O_DIRECT bytes, or none with mpiio.
        direct = [int(n) for n in re.findall(r"direct_bytes=(\d+)", r.text)]
        ht.check(len(direct) >= NP, f"base run: no save timeline in the debug log: {r}")
        if ARGS.checkpoint_write == "mpiio":
            ht.check(sum(direct) == 0, f"base run: O_DIRECT bytes written in mpiio mode: {direct}")
        else:
            ht.check(sum(direct) > 0, f"base run: no O_DIRECT bytes written (direct_bytes {direct})")
        ht.check([ht.step_of(f) for f in ht.checkpoints(_base)] == [2], f"base run: {ht.checkpoints(_base)}")
    return _base


def hook_env(phase, who):
    return {"H5DDP_FAULT_INJECT": f"{phase}:{who}", "H5DDP_TEST_HOOKS": "1"}


def check_latest(run_dir, allowed_steps, what):
    """`latest` holds exactly "<name>\\n" of a committed checkpoint whose step is allowed."""
    with open(os.path.join(run_dir, "latest"), "rb") as f:
        text = f.read()
    names = {f"ckpt-{s:08d}.h5\n".encode(): s for s in allowed_steps}
    ht.check(text in names, f"{what}: latest holds {text!r}, expected one of {sorted(names)}")
    ht.check(os.path.isfile(os.path.join(run_dir, text.decode().strip())), f"{what}: latest names a missing file")
    return names[text]


def kill_scenario(phase, who):
    run_dir = ht.copy_run(base_run(), f"kill-{phase}-{who}")
    try:
        r = train(run_dir, 6, env=hook_env(phase, who))
        ht.check(r.rc != 0, f"run with {phase}:{who} was not killed: {r}")
        ht.check("killing this rank at " + phase in r.text, f"fault hook did not fire: {r}")
        files = ht.verify_all(run_dir)
        steps = [ht.step_of(f) for f in files]
        partial_left = len(ht.partials(run_dir))
        # Rank 0 renames and moves `latest` once every rank's data is durable (agreed by allreduce). When
        # another rank dies just before the rename, rank 0 may still commit the complete file before mpirun
        # kills it: both outcomes are valid, the file verifies either way. From the rename on (the commit
        # point), step 4 is there whatever `latest` says.
        allowed = {"before_data": [[2]], "mid_data": [[2]],
                   "before_rename": [[2]] if who in ("all", "0") else [[2], [2, 4]]}.get(phase, [[2, 4]])
        ht.check(steps in allowed, f"{phase}:{who}: checkpoints left {steps}, expected one of {allowed}")
        # latest: the old name until latest.tmp is renamed, the new one after. When another rank than 0 was
        # killed, rank 0 may have moved it before mpirun killed rank 0 too: either committed file.
        if who not in ("all", "0"):
            latest_allowed = steps
        else:
            latest_allowed = [4] if phase == "latest_renamed" else [2]
        latest_step = check_latest(run_dir, latest_allowed, f"{phase}:{who}")
        # The restart: resumes from the newest complete checkpoint (never a .partial, never an older file
        # because `latest` still names it) and finishes.
        r2 = train(run_dir, 6)
        ht.check(r2.rc == 0, f"restart after {phase}:{who} failed: {r2}")
        src = ht.resumed_from(r2)
        ht.check(src is not None, f"restart after {phase}:{who} did not resume: {r2}")
        ht.check(not src[0].endswith(".partial") and src[1] == max(steps),
                 f"restart after {phase}:{who} resumed from {src}, expected step {max(steps)} (checkpoints {steps})")
        ht.check(ht.trained_steps(r2) == 6, f"restart did not reach step 6: {r2}")
        ht.verify_all(run_dir)
        check_latest(run_dir, [6], f"after the restart from {phase}:{who}")
        return (f"after the kill: checkpoints {steps}, {partial_left} partial, latest -> step {latest_step}; "
                f"resumed from step {src[1]}")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def retention_scenario():
    """Killed between two removals of retention: ckpt-2,4,6 committed (keep everything), then a run with
    --keep-last 1 saves step 8, moves `latest` to it and is killed after removing the first old file."""
    run_dir = ht.copy_run(base_run(), "kill-mid_retention")
    try:
        r = train(run_dir, 6)
        ht.check(r.rc == 0 and [ht.step_of(f) for f in ht.checkpoints(run_dir)] == [2, 4, 6], f"setup: {r}")
        r = train(run_dir, 10, env=hook_env("mid_retention", "all"), keep_last=1)
        ht.check(r.rc != 0, f"run with mid_retention:all was not killed: {r}")
        ht.check("killing this rank at mid_retention" in r.text, f"fault hook did not fire: {r}")
        steps = [ht.step_of(f) for f in ht.verify_all(run_dir)]
        ht.check(8 in steps and len(steps) == 3 and set(steps) < {2, 4, 6, 8},
                 f"expected step 8 and two of 2, 4, 6 left (one removed), found {steps}")
        check_latest(run_dir, [8], "mid_retention")
        r2 = train(run_dir, 10, keep_last=1)
        ht.check(r2.rc == 0, f"restart after mid_retention failed: {r2}")
        src = ht.resumed_from(r2)
        ht.check(src is not None and src[1] == 8, f"restart after mid_retention resumed from {src}, expected 8")
        ht.check(ht.trained_steps(r2) == 10, f"restart did not reach step 10: {r2}")
        left = [ht.step_of(f) for f in ht.verify_all(run_dir)]
        ht.check(left == [10], f"retention after the restart left {left}, expected [10]")
        check_latest(run_dir, [10], "after the restart from mid_retention")
        return f"after the kill: checkpoints {steps}, latest -> step 8; resumed from step 8, retention left {left}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_hook_not_armed_without_test_hooks():
    """H5DDP_FAULT_INJECT alone (a stray variable in a production environment) kills nothing: the hook is
    armed only with H5DDP_TEST_HOOKS=1 too, and says that it ignored the variable."""
    run_dir = ht.copy_run(base_run(), "kill-unarmed")
    try:
        r = train(run_dir, 4, env={"H5DDP_FAULT_INJECT": "before_data:all"})
        ht.check(r.rc == 0, f"run with an unarmed H5DDP_FAULT_INJECT failed: {r}")
        ht.check("killing this rank" not in r.text and "ignoring H5DDP_FAULT_INJECT" in r.text,
                 f"expected the unarmed hook to be ignored with a warning: {r}")
        ht.check([ht.step_of(f) for f in ht.verify_all(run_dir)] == [2, 4], f"{ht.checkpoints(run_dir)}")
        return "ignored with a warning; the run saved step 4"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def load_kill_scenario(phase, who):
    run_dir = ht.copy_run(base_run(), f"kill-{phase}-{who}")
    try:
        r = train(run_dir, 6, env=hook_env(phase, who))
        ht.check(r.rc != 0, f"run with {phase}:{who} was not killed: {r}")
        ht.check("killing this rank at " + phase in r.text, f"fault hook did not fire: {r}")
        steps = [ht.step_of(f) for f in ht.verify_all(run_dir)]
        ht.check(steps == [2], f"{phase}:{who}: checkpoints left {steps}, expected [2]")
        check_latest(run_dir, [2], f"{phase}:{who}")
        r2 = train(run_dir, 6)
        ht.check(r2.rc == 0, f"restart after {phase}:{who} failed: {r2}")
        src = ht.resumed_from(r2)
        ht.check(src is not None and src[1] == 2, f"restart after {phase}:{who} resumed from {src}, expected step 2")
        ht.check(ht.trained_steps(r2) == 6, f"restart did not reach step 6: {r2}")
        return f"killed in the load; the checkpoint verifies, resumed from step {src[1]}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def make_test(phase, who):
    def t():
        if phase in LOAD_PHASES:
            return load_kill_scenario(phase, who)
        return retention_scenario() if phase == "mid_retention" else kill_scenario(phase, who)
    t.__name__ = f"test_kill_{phase}_{who}"
    return t


def tests():
    if ARGS.cases:
        return [make_test(*c.split(":")) for c in ARGS.cases.split(",")]
    whos = ["all"] if NP == 1 else [str(NP - 1), "all"]
    return [make_test(p, w) for p in PHASES for w in (["all"] if p in RANK0_PHASES else whos)] + \
        [make_test("mid_retention", "all"), test_hook_not_armed_without_test_hooks] + \
        [make_test(p, w) for p in LOAD_PHASES for w in whos]


if __name__ == "__main__":
    try:
        sys.exit(ht.main(tests()))
    finally:
        if _base:
            shutil.rmtree(_base, ignore_errors=True)
