"""Starts N Python processes the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT a free port; each calls init_process_group from the environment) and with
no MPI in their environment: no mpirun, no OMPI_*/PMI*/PMIX_* variables inherited, so Debian's `import h5py`
picks its serial build. (Debian's torch 1.13 `torchrun` itself fails under Python 3.11, issue 41.)"""
import os
import socket
import subprocess
import sys
import time

_MPI_PREFIXES = ("OMPI_", "PMI", "PMIX_", "HYDRA_", "MPI_LOCAL", "I_MPI_")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(rank, world, port, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_MPI_PREFIXES)}
    env.pop("H5PY_ALWAYS_USE_MPI", None)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env.update(extra or {})
    return env


def start(n, argv, extra_env=None, log_dir=None):
    """[Popen] of n ranks of `argv` (a Python script and its arguments, run by this interpreter); rank r's
    stdout and stderr go to <log_dir>/rank<r>.log when log_dir is given, else to pipes."""
    port = free_port()
    print(f"$ [torchrun-style x{n}, port {port}] {sys.executable} " + " ".join(argv), flush=True)
    procs = []
    for r in range(n):
        out = open(os.path.join(log_dir, f"rank{r}.log"), "w") if log_dir else subprocess.PIPE
        procs.append(subprocess.Popen([sys.executable, *argv], env=env_for(r, n, port, extra_env), stdout=out,
                                      stderr=subprocess.STDOUT if log_dir else subprocess.PIPE, text=True))
    return procs


def wait(procs, timeout):
    """[(returncode, output)] of every rank; kills them all on a timeout and raises."""
    deadline = time.time() + timeout
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.time()))
            results.append((p.returncode, (out or "") + (err or "")))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"a torchrun-style job ran past {timeout} s: {procs[0].args}") from None
    return results


def run(n, argv, timeout=180, expect=0, extra_env=None):
    """Runs n ranks to the end; checks every exit code (expect=None: no check); returns [output]."""
    results = wait(start(n, argv, extra_env), timeout)
    for r, (rc, out) in enumerate(results):
        print(f"--- rank {r} (exit {rc})\n{out}", end="" if out.endswith("\n") else "\n", flush=True)
        if expect is not None:
            assert rc == expect, f"rank {r} exited with {rc}, expected {expect}: {' '.join(map(str, argv))}"
    return [out for _, out in results]
