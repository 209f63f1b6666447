"""Shared helpers of the fault tests (tests/faults/*.py): run MPI jobs with a hard time bound,
find the built tools, inspect run directories. Every subprocess has a timeout: a hang is a failure."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("H5DDP_BINARY_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
MPIRUN = os.environ.get("H5DDP_MPIEXEC", "mpirun")


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def tool(name):
    """Path of a built executable (h5ddp-train, h5ddp-ckpt, test programs) under the build tree."""
    for cand in (os.path.join(BIN, "tools", name), os.path.join(BIN, "tests", name), os.path.join(BIN, name)):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    hits = glob.glob(os.path.join(BIN, "**", name), recursive=True)
    hits = [h for h in hits if os.path.isfile(h) and os.access(h, os.X_OK)]
    if not hits:
        raise Failure(f"executable {name} not found under {BIN}: build it first")
    return hits[0]


def env(extra=None):
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    e.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    e.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    e.pop("H5DDP_FAULT_INJECT", None)
    if extra:
        e.update(extra)
    return e


class Result:
    def __init__(self, rc, out, err, seconds):
        self.rc, self.out, self.err, self.seconds = rc, out, err, seconds

    @property
    def text(self):
        return self.out + "\n" + self.err

    def __repr__(self):
        tail = "\n".join(self.text.strip().splitlines()[-25:])
        return f"rc={self.rc} after {self.seconds:.1f}s\n{tail}"


def run(cmd, timeout, extra_env=None, cwd=None):
    """Runs cmd in its own process group; on timeout kills the whole group and raises Failure (a hang)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(extra_env),
                         cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise Failure(f"HANG: {' '.join(cmd)} did not finish within {timeout}s\n{out[-3000:]}\n{err[-3000:]}")
    return Result(p.returncode, out, err, time.monotonic() - t0)


def mpirun(np, args, timeout, extra_env=None, cwd=None):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
    for k, v in (extra_env or {}).items():
        cmd += ["-x", f"{k}={v}"]
    return run(cmd + list(args), timeout, extra_env, cwd)


def scratch(tag):
    return tempfile.mkdtemp(prefix=f"h5ddp-faults-{tag}-", dir=os.environ.get("TMPDIR", "/tmp"))


def checkpoints(run_dir):
    """Committed checkpoint files (never *.partial), oldest first."""
    return sorted(f for f in glob.glob(os.path.join(run_dir, "ckpt-*.h5")) if not f.endswith(".partial"))


def partials(run_dir):
    return sorted(glob.glob(os.path.join(run_dir, "*.partial")))


def latest_target(run_dir):
    p = os.path.join(run_dir, "latest")
    if os.path.islink(p):
        return os.path.join(run_dir, os.readlink(p))
    if os.path.isfile(p):
        with open(p) as f:
            name = f.read().strip()
        return name if os.path.isabs(name) else os.path.join(run_dir, name)
    return None


def main(tests):
    """Runs the test functions (only those named in $H5DDP_FAULTS_ONLY, comma-separated, when set);
    exit 0 iff all pass, 77 (ctest SKIP_RETURN_CODE) when every one skipped. Prints timings."""
    only = [n for n in os.environ.get("H5DDP_FAULTS_ONLY", "").split(",") if n]
    selected = [t for t in tests if not only or t.__name__ in only]
    if not selected:
        print("no test selected", flush=True)
        return 1
    failed, skipped = [], 0
    for t in selected:
        t0 = time.monotonic()
        try:
            msg = t()
            print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f}s){' ' + msg if msg else ''}", flush=True)
        except Skip as s:
            skipped += 1
            print(f"SKIP {t.__name__}: {s}", flush=True)
        except Exception as e:  # noqa: BLE001 -- report and go on with the next test
            failed.append(t.__name__)
            print(f"FAIL {t.__name__} ({time.monotonic() - t0:.1f}s): {e}", flush=True)
    print(f"{len(selected) - len(failed)}/{len(selected)} passed", flush=True)
    if failed:
        return 1
    return 77 if skipped == len(selected) else 0


def run_watch(cmd, timeout, on_line, extra_env=None):
    """Like run(), but calls on_line(stream, line) for every output line as it arrives (stream is 'out' or
    'err'), so a test can act while the job runs (e.g. free disk space after the first failed save)."""
    import threading
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(extra_env),
                         start_new_session=True, bufsize=1)
    chunks = {"out": [], "err": []}

    def pump(stream, name):
        for line in stream:
            chunks[name].append(line)
            try:
                on_line(name, line)
            except Exception as e:  # noqa: BLE001 -- the test sees it in the output
                chunks["err"].append(f"on_line callback failed: {e}\n")

    threads = [threading.Thread(target=pump, args=(p.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, "err"), daemon=True)]
    for t in threads:
        t.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        for t in threads:
            t.join(5)
        raise Failure(f"HANG: {' '.join(cmd)} did not finish within {timeout}s\n"
                      f"{''.join(chunks['out'])[-3000:]}\n{''.join(chunks['err'])[-3000:]}")
    for t in threads:
        t.join(10)
    return Result(p.returncode, "".join(chunks["out"]), "".join(chunks["err"]), time.monotonic() - t0)


def mpirun_watch(np, args, timeout, on_line, extra_env=None):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
    for k, v in (extra_env or {}).items():
        cmd += ["-x", f"{k}={v}"]
    return run_watch(cmd + list(args), timeout, on_line, extra_env)


class Mount:
    """A tmpfs mounted for the duration of a `with` block (root only); raises Skip when mounting is not
    possible here, with the reason."""

    def __init__(self, tag, size, readonly=False):
        self.path = scratch(tag)
        self.size, self.readonly = size, readonly
        self.mounted = False

    def __enter__(self):
        if os.geteuid() != 0:
            raise Skip("needs root to mount a tmpfs")
        opts = f"size={self.size}" + (",ro" if self.readonly else "")
        r = run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", self.path], 30)
        if r.rc != 0:
            raise Skip(f"cannot mount a tmpfs here: {r.err.strip()}")
        self.mounted = True
        return self

    def __exit__(self, *exc):
        if self.mounted:
            run(["umount", "-l", self.path], 30)
        shutil.rmtree(self.path, ignore_errors=True)
        return False
