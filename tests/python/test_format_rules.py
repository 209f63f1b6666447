"""The conformance suite of docs/FORMAT.md (issue 45), generated from the spec's own tables.

Base files come from every writer: h5ddp-train (C++, 2 ranks), h5ddp-train --shard-optimizer (each optimizer
dataset written by its owner), h5ddp_torch (a PyTorch DDP loop, 2 ranks under mpirun), h5ddp_torch without MPI
(the same loop launched as torchrun launches it: torch.distributed and positional writes) and the independent
writer (tests/python/independent_writer.py, written from FORMAT.md alone), all the CNN with Adam. From FORMAT.md the
suite reads its tables: every required row is removed, every typed row is retyped (with its dtype and checksum
kept consistent, so that only the type rule can catch it), every rule R1..R17 is broken (the suite fails when
the spec has a rule without a case here), plus cases that stay valid (a newer revision's unknown additions) and
cases of another model. Each case is judged four ways, and all four must give the expected verdict:
  h5ddp-ckpt verify (C++), h5ddp_torch.verify (Python)      -> valid / damaged (naming the object or rule)
  h5ddp-load-verdict (C++ Checkpointer, as h5ddp-train),
  h5ddp_torch.load (Python)                                 -> OK / MISMATCH (another model) / DAMAGED
A file that verifies loads or is another model; a file a loader calls damaged never verifies."""
import argparse
import os
import re
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402  (puts python/ and tests/interop on sys.path)
import h5ddp_torch  # noqa: E402
import independent_writer  # noqa: E402
import interop_common as ic  # noqa: E402
import format_cases  # noqa: E402
import torchrun_launch  # noqa: E402

TRAIN_ARGS = ["--batch-size", "16", "--no-fsync", "--keep-last", "0", "--checkpoint-every-steps", "1",
              "--max-steps", "2", "--optimizer", "adam"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    for a in ("--train", "--ckpt", "--verdict"):
        p.add_argument(a, required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--source-dir", default=".")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--keep", action="store_true")
    return p.parse_args()


def spec_tables(source_dir):
    """[(first cell, row cells)] of every table row of docs/FORMAT.md whose first cell is `code`."""
    rows = []
    with open(os.path.join(source_dir, "docs", "FORMAT.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and cells and re.fullmatch(r"`[^`]*`|R\d+", cells[0]):
                rows.append((cells[0].strip("`"), cells))
    return rows


def base_files(args, w):
    """{writer: path} of the base checkpoints, all at step 2."""
    ic.train(args, 2, w("cpp"), *TRAIN_ARGS)
    ic.train(args, 2, w("cpp-sharded"), *TRAIN_ARGS, "--shard-optimizer")
    ic.run(ic.mpi(args, 2, sys.executable, os.path.join(HERE, "pt_loop.py"), "--run-dir", w("py"), "--max-steps",
                  "2", "--save-every", "2", "--losses", w("py-losses.json")), timeout=180)
    torchrun_launch.run(2, [os.path.join(HERE, "pt_loop.py"), "--launch", "env", "--run-dir", w("torchrun"),
                            "--max-steps", "2", "--save-every", "2"], timeout=180)
    os.makedirs(w("indep"))
    name = "ckpt-00000002.h5"
    independent_writer.write(w("indep", name), independent_writer.from_file(w("cpp", name)))
    return {k: w(k, name) for k in ("cpp", "cpp-sharded", "py", "torchrun", "indep")}


def cpp_verify(args, paths):
    """{path: (ok, text)} from one h5ddp-ckpt verify run over all paths."""
    p = subprocess.run([args.ckpt, "verify", *paths], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="backslashreplace")  # a name of invalid UTF-8 (R19) is printed as it is
    out, current = {}, None
    for line in p.stdout.splitlines():
        m = re.match(r"^(OK|FAILED)\s+(\S+)$", line)
        if m:
            current = m.group(2)
            out[current] = [m.group(1) == "OK", ""]
        elif current and line.startswith("  "):
            out[current][1] += line.strip() + "\n"
        elif line.startswith("note"):
            pass
    for path in paths:
        assert path in out, f"h5ddp-ckpt verify said nothing about {path}: {p.stdout}"
    return {k: tuple(v) for k, v in out.items()}


def cpp_load(args, paths):
    """{path: (verdict, text)} from one h5ddp-load-verdict run (the Checkpointer as h5ddp-train uses it)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([args.verdict, "--run-dir", os.path.join(args.work_dir, "verdict-run"), "--optimizer", "adam",
                        "--", *paths], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       errors="backslashreplace")
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        verdict, rest = line.split(" ", 1)
        path = rest.split(": ", 1)[0]
        out[path] = (verdict, rest)
    return out


def py_verify(path):
    problems = h5ddp_torch.verify(path)
    return not problems, "\n".join(problems)


def py_load(path):
    model = pt_loop.cnn()
    try:
        h5ddp_torch.load(path, model, torch.optim.Adam(model.parameters(), lr=pt_loop.LR), rng=False)
        return "OK", ""
    except h5ddp_torch.CheckpointMismatchError as e:
        return "MISMATCH", str(e)
    except h5ddp_torch.CheckpointError as e:
        return "DAMAGED", str(e)


def judge(args, cases):
    """Runs the four judges over every case file; returns the list of disagreements with the expectation."""
    paths = [c.path for c in cases]
    cv, cl = cpp_verify(args, paths), cpp_load(args, paths)
    failures = []
    for c in cases:
        got = {"cpp verify": cv[c.path], "py verify": py_verify(c.path), "cpp load": cl[c.path],
               "py load": py_load(c.path)}
        failures += c.disagreements(got)
    return failures


def rng_rows(cases):
    """h5ddp_torch.load restoring the generator (rng=True) refuses rows of another length as another model, and
    leaves the model as it was."""
    case = next(c for c in cases if c.name == "cpp: /rng/cpu rows of another generator's length")
    model = pt_loop.cnn()
    before = [p.detach().clone() for p in model.parameters()]
    try:
        h5ddp_torch.load(case.path, model, torch.optim.Adam(model.parameters(), lr=pt_loop.LR), rng=True)
        raise AssertionError("rows of 100 bytes restored")
    except h5ddp_torch.CheckpointMismatchError as e:
        assert "/rng/cpu rows are 100 bytes" in str(e), e
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    print("h5ddp_torch.load(rng=True) refused rows of 100 bytes, model untouched")


def train_resume(args, w, cases):
    """One case through h5ddp-train's own resume (the loader every run uses): a run directory holding a valid step-1
    file and, at step 2, a file both verifiers reject for R18. The run skips the damaged file naming the same rule,
    resumes from step 1 and trains on."""
    bad = next(c for c in cases if c.name == "cpp: R18: /@world_size as a one-element array")
    assert bad.expect == "damaged"
    run_dir = w("train-resume")
    os.makedirs(run_dir)
    shutil.copy(w("cpp", "ckpt-00000001.h5"), run_dir)
    shutil.copy(bad.path, os.path.join(run_dir, "ckpt-00000002.h5"))
    extra = [a if a != "2" else "3" for a in TRAIN_ARGS]  # --max-steps 3
    p = ic.run(ic.mpi(args, 2, args.train, "--run-dir", run_dir, "--threads", "1", "--no-eval", "--resume", "auto",
                      *extra), timeout=180)
    text = p.stdout + p.stderr
    assert "R18" in text and "resuming from " + os.path.join(run_dir, "ckpt-00000001.h5") in text, text[-2000:]
    assert "resumed from " + os.path.join(run_dir, "ckpt-00000001.h5") + " at step 1" in text, text[-2000:]
    print("h5ddp-train skipped the R18 file and resumed from step 1")


def main():
    args = parse_args()
    with ic.Scratch(args, "format-rules") as w:
        args.work_dir = w.path
        rows = spec_tables(args.source_dir)
        bases = base_files(args, w)
        cases = []
        for writer, base in bases.items():
            cases += format_cases.make_cases(rows, writer, base, w(f"cases-{writer}"))
        print(f"{len(cases)} cases from {len(bases)} writers")
        failures = judge(args, cases)
        for f in failures:
            print("FAIL " + f)
        kinds = {}
        for c in cases:
            kinds[c.expect] = kinds.get(c.expect, 0) + 1
        print("expected verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        assert not failures, f"{len(failures)} disagreements"
        train_resume(args, w, cases)
        rng_rows(cases)
    print("PASS")


if __name__ == "__main__":
    main()
