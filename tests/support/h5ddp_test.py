"""The one support module of h5ddp's Python tests (issue 38): every test driver under tests/ imports it.

  processes   run / mpirun (hard time bound: a hang is a failure), run_watch / mpirun_watch (act on output as it
              comes), Job (an mpirun driven while it runs: wait for a condition, signal or kill ranks), tool()
  run dirs    scratch dirs (removed at the end of main()/cli() unless H5DDP_KEEP_SCRATCH=1), checkpoints,
              partials, latest_target, ckpt, step_of, steps_in, copy_run, copy_with, attrs
  h5ddp-train the fault tests' tiny configuration (train_args / train), resumed_from, trained_steps,
              verify / verify_all through h5ddp-ckpt, small_fashion_mnist() (a small copy of the data set)
  comparing   compare_checkpoints(a, b, ...): the one checkpoint comparer (bitwise, absolute/relative or
              relative-L2 tolerances, a subset of groups); also a command for the shell tests:
                h5ddp_test.py compare A.h5 B.h5 [--rtol R --atol T | --norm-rtol R] [--skip-rng]
                                                [--groups model,optimizer] [--datasets-only]
              (h5ddp_test.py small-data prints small_fashion_mnist()'s directory, for the shell tests)
  cases       Failure / Skip / check, main(tests) (runs test_* functions, prints timings, exit 0 / 1 / 77),
              cli(tests) (NP CASE... on the command line)
Import it with sys.path.insert(0, <tests>/support) (see any driver)."""
import argparse
import glob
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("H5DDP_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BIN = os.environ.get("H5DDP_BINARY_DIR", os.path.join(HERE, "..", "..", "build"))
MPIRUN = os.environ.get("H5DDP_MPIEXEC", "mpirun")
PY = os.environ.get("H5DDP_PYTHON", "/usr/bin/python3")
FASHION_MNIST = os.environ.get("H5DDP_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")  # gpu-check --bundle


# ---- cases ---------------------------------------------------------------------------------------------------------
class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def main(tests):
    """Runs the test functions (only those named in $H5DDP_FAULTS_ONLY, comma-separated, when set);
    exit 0 iff all pass, 77 (ctest SKIP_RETURN_CODE) when every one skipped. Prints timings. Removes the scratch
    directories made through scratch() (kept with H5DDP_KEEP_SCRATCH=1)."""
    only = [n for n in os.environ.get("H5DDP_FAULTS_ONLY", "").split(",") if n]
    selected = [t for t in tests if not only or t.__name__ in only]
    if not selected:
        print("no test selected", flush=True)
        return 1
    failed, skipped = [], 0
    try:
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
    finally:
        remove_scratch()
    print(f"{len(selected) - len(failed)}/{len(selected)} passed", flush=True)
    if failed:
        return 1
    return 77 if skipped == len(selected) else 0


def cli(tests):
    """DRIVER.py NP CASE...: runs the named cases (all without names; a name with or without the test_ prefix) and
    exits with main()'s code."""
    names = [a if a.startswith("test_") else "test_" + a for a in sys.argv[2:]]
    unknown = [n for n in names if n not in {t.__name__ for t in tests}]
    if unknown:
        print(f"unknown case(s): {unknown}", file=sys.stderr)
        sys.exit(2)
    if names:
        os.environ["H5DDP_FAULTS_ONLY"] = ",".join(names)
    sys.exit(main(tests))


# ---- processes -----------------------------------------------------------------------------------------------------
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
    e.setdefault("OMPI_MCA_btl", "^openib,ofi")  # as ctest sets it (tests/CMakeLists.txt says why)
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
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(extra_env), cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise Failure(f"HANG: {' '.join(map(str, cmd))} did not finish within {timeout}s\n{out[-3000:]}\n{err[-3000:]}")
    return Result(p.returncode, out, err, time.monotonic() - t0)


def mpirun_cmd(np, extra_env=None):
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
    for k, v in (extra_env or {}).items():
        cmd += ["-x", f"{k}={v}"]
    return cmd


def mpirun(np, args, timeout, extra_env=None, cwd=None):
    return run(mpirun_cmd(np, extra_env) + list(args), timeout, extra_env, cwd)


def run_watch(cmd, timeout, on_line, extra_env=None):
    """Like run(), but calls on_line(stream, line) for every output line as it arrives (stream is 'out' or
    'err'), so a test can act while the job runs (e.g. free disk space after the first failed save)."""
    t0 = time.monotonic()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(extra_env), start_new_session=True, bufsize=1)
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
        raise Failure(f"HANG: {' '.join(map(str, cmd))} did not finish within {timeout}s\n"
                      f"{''.join(chunks['out'])[-3000:]}\n{''.join(chunks['err'])[-3000:]}")
    for t in threads:
        t.join(10)
    return Result(p.returncode, "".join(chunks["out"]), "".join(chunks["err"]), time.monotonic() - t0)


def mpirun_watch(np, args, timeout, on_line, extra_env=None):
    return run_watch(mpirun_cmd(np, extra_env) + list(args), timeout, on_line, extra_env)


class Job:
    """mpirun of NP ranks in its own session, stdout and stderr read line by line as they come (one stream). A test
    waits for a condition (wait_for), finds a rank's pid (rank_pid), waits for the end (finish); kill() SIGKILLs
    every rank (mpirun's children, by pid) and then mpirun's process group."""

    def __init__(self, np_, argv, extra_env=None):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(mpirun_cmd(np_, extra_env) + [str(a) for a in argv], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env(extra_env), start_new_session=True,
                                  bufsize=1)
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.p.stdout.readline, "")),
                                       daemon=True)
        self.reader.start()

    @property
    def text(self):
        return "".join(self.lines)

    def wait_for(self, pred, timeout, what):
        """Returns once pred() holds; fails (and kills the job) when the job ends first or after timeout s."""
        deadline = time.monotonic() + timeout
        while not pred():
            if self.p.poll() is not None:
                time.sleep(0.2)
                if pred():
                    return
                raise Failure(f"the job ended (rc {self.p.returncode}) before {what}:\n{self.text[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise Failure(f"timed out after {timeout}s waiting for {what}:\n{self.text[-3000:]}")
            time.sleep(0.02)

    def rank_pid(self, rank, program="h5ddp-train"):
        """The pid of `program` rank `rank` (a child of mpirun; its environment names its rank)."""
        for _ in range(200):
            for pid in subprocess.run(["pgrep", "-P", str(self.p.pid), "-f", program], capture_output=True,
                                      text=True).stdout.split():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        e = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
                except OSError:
                    continue
                if e.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode():
                    return int(pid)
            time.sleep(0.05)
        raise Failure(f"no rank {rank} process under mpirun {self.p.pid}")

    def finish(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Failure(f"HANG: the job did not end within {timeout}s:\n{self.text[-3000:]}")
        self.reader.join(10)
        return Result(self.p.returncode, self.text, "", time.monotonic() - self.t0)

    def kill(self):
        if self.p.poll() is not None:
            return
        ranks = subprocess.run(["pgrep", "-P", str(self.p.pid)], capture_output=True, text=True,
                               timeout=10).stdout.split()
        for pid in ranks:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=30)
        self.reader.join(10)


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


# ---- run directories -----------------------------------------------------------------------------------------------
_SCRATCH = []


def scratch(tag):
    """A new empty directory under $TMPDIR (or /tmp), removed by main()/cli() at the end of the run."""
    d = tempfile.mkdtemp(prefix=f"h5ddp-faults-{tag}-", dir=os.environ.get("TMPDIR", "/tmp"))
    _SCRATCH.append(d)
    return d


def remove_scratch():
    if os.environ.get("H5DDP_KEEP_SCRATCH") == "1":
        return
    for d in _SCRATCH:
        shutil.rmtree(d, ignore_errors=True)
    _SCRATCH.clear()


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


def ckpt(run_dir, step):
    return os.path.join(run_dir, f"ckpt-{step:08d}.h5")


def step_of(path):
    m = re.search(r"ckpt-(\d+)\.h5$", path)
    return int(m.group(1)) if m else None


def steps_in(run_dir):
    return [step_of(f) for f in checkpoints(run_dir)]


def copy_run(src, tag):
    """A copy of run directory src (symlinks kept) in a new scratch directory."""
    dst = scratch(tag)
    shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def copy_with(src_files, tag):
    """A fresh run directory holding copies of src_files (and no `latest`): a run there resumes from them."""
    d = scratch(tag)
    for f in src_files:
        shutil.copy2(f, d)
    return d


def attrs(path, group):
    import h5py
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f[group].attrs.items()}


# ---- h5ddp-train and h5ddp-ckpt --------------------------------------------------------------------------------------
STEP_TIMEOUT = 90  # one h5ddp-train launch of the tiny configuration (seconds); a hang fails the test
SMALL_TRAIN, SMALL_TEST = 4096, 1024


def small_fashion_mnist():
    """A directory with the first 4096 training and 1024 test images of Fashion-MNIST in its own format
    (*-ubyte.gz, the counts in the headers): the same reader, without the second of every start-up that
    decompressing the whole 26 MB set takes. Made once per build tree ($H5DDP_BINARY_DIR/tests/fmnist-small,
    created under another name and renamed: concurrent tests never see half of it), else once per process."""
    base = os.path.join(BIN, "tests")
    final = os.path.join(base, "fmnist-small")
    if os.path.isfile(os.path.join(final, "t10k-labels-idx1-ubyte.gz")):
        return final
    if os.path.isdir(BIN):
        os.makedirs(base, exist_ok=True)
    if not os.access(base, os.W_OK):
        base = final = scratch("fmnist-small")
    d = tempfile.mkdtemp(prefix="fmnist-small-", dir=base) if final != base else final
    for split, n in (("train", SMALL_TRAIN), ("t10k", SMALL_TEST)):
        for kind, header, item in (("images", 16, 784), ("labels", 8, 1)):
            name = f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz"
            with gzip.open(os.path.join(FASHION_MNIST, name), "rb") as f:
                head, body = f.read(header), f.read(n * item)
            head = head[:4] + n.to_bytes(4, "big") + head[8:]
            with gzip.open(os.path.join(d, name), "wb", compresslevel=1) as g:
                g.write(head + body)
    if d != final:
        try:
            os.rename(d, final)
        except OSError:  # made by a test running beside this one meanwhile
            shutil.rmtree(d, ignore_errors=True)
    return final


def train_args(run_dir, max_steps, every=2, extra=(), hidden=32, keep_last=0):
    """The fault tests' tiny configuration: MLP with one small hidden layer, no evaluation, a small data set."""
    return [tool("h5ddp-train"), "--run-dir", run_dir, "--data-dir", small_fashion_mnist(), "--model", "mlp",
            "--mlp-hidden", str(hidden), "--dropout", "0.1", "--batch-size", "64", "--max-steps", str(max_steps),
            "--checkpoint-every-steps", str(every), "--keep-last", str(keep_last), "--no-eval", "--threads", "1",
            "--log-every", "1"] + list(extra)


def train(np, run_dir, max_steps, every=2, extra=(), env=None, timeout=STEP_TIMEOUT, keep_last=0, hidden=32):
    return mpirun(np, train_args(run_dir, max_steps, every, extra, hidden, keep_last), timeout, env)


def resumed_from(result):
    """The checkpoint path a run says it resumed from, or None for a fresh start."""
    m = re.search(r"resumed from (\S+) at step (\d+)", result.text)
    return (m.group(1), int(m.group(2))) if m else None


def trained_steps(result):
    m = re.search(r"trained (?:to step )?(\d+)", result.text)
    return int(m.group(1)) if m else None


def verify(path, expect_ok=True, timeout=60):
    r = run([tool("h5ddp-ckpt"), "verify", path], timeout)
    if expect_ok:
        check(r.rc == 0, f"h5ddp-ckpt verify {path} failed: {r}")
    else:
        check(r.rc != 0, f"h5ddp-ckpt verify {path} passed a bad file: {r}")
    return r


def verify_all(run_dir):
    """Every committed checkpoint verifies; `latest` names an existing, committed file. Returns the files."""
    files = checkpoints(run_dir)
    for f in files:
        verify(f)
    target = latest_target(run_dir)
    if target is not None:
        check(not target.endswith(".partial"), f"latest points at a partial file: {target}")
        check(os.path.isfile(target), f"latest points at a missing file: {target}")
    return files


# ---- the checkpoint comparer -------------------------------------------------------------------------------------------
class Comparison:
    """What compare_checkpoints found: `compared` datasets, `problems` (one line each), `worst` difference."""

    def __init__(self, a, b, compared, problems, worst, exact):
        self.a, self.b, self.compared, self.problems, self.worst, self.exact = a, b, compared, problems, worst, exact

    @property
    def ok(self):
        return self.compared > 0 and not self.problems

    def summary(self):
        how = "bitwise" if self.exact else \
            f"worst difference {self.worst:.3g} (relative L2 norm with --norm-rtol, else absolute)"
        return f"compare: {self.compared} datasets, {how}, {len(self.problems)} problems"

    def __repr__(self):
        return self.summary() + "".join(f"\n  {p}" for p in self.problems[:20])


def compare_checkpoints(a, b, rtol=0.0, atol=0.0, norm_rtol=0.0, skip_rng=False, groups=None, attributes=True):
    """Compares checkpoint files a and b dataset by dataset: the same names, dtypes and shapes, and
      - bitwise (no tolerance given): the same bytes;
      - rtol/atol: floats within |a-b| <= atol + rtol*|b|, everything else exact;
      - norm_rtol: floats within ||a-b|| <= norm_rtol*||b|| (L2 over each tensor), everything else exact. It suits
        Adam: an element whose gradient is at rounding-noise level gets an update of up to lr whatever its sign, so
        a change of summation order moves a few elements by ~lr while the tensor as a whole stays within ~1e-6
        relative; a wrong sample order or a lost optimizer state moves every element.
    groups: only the datasets under these paths (a group or a dataset; each must hold at least one dataset);
    default every dataset of the file (/rng too unless skip_rng). attributes: also the attributes of
    /optimizer/param_groups/0 and /train/lr_scheduler (on whole-file comparisons). Returns a Comparison."""
    import h5py
    import numpy as np

    def collect(f, where):
        out = {}

        def visit(name, obj):
            full = f"{where}/{name}" if where else name
            if isinstance(obj, h5py.Dataset) and not (skip_rng and full.startswith("rng/")):
                out[full] = obj[()]

        if where is None:
            f.visititems(visit)
        elif where in f:
            if isinstance(f[where], h5py.Dataset):
                out[where] = f[where][()]
            else:
                f[where].visititems(visit)
        return out

    exact = rtol == 0 and atol == 0 and norm_rtol == 0
    problems, worst, compared = [], 0.0, 0
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        da, db = {}, {}
        for g in (groups or [None]):
            ga, gb = collect(fa, g), collect(fb, g)
            if g is not None and not ga:
                problems.append(f"/{g}: no datasets in {a}")
            da.update(ga)
            db.update(gb)
        for k in sorted(set(da) ^ set(db)):
            problems.append(f"{k}: only in {'A' if k in da else 'B'}")
        for k in sorted(set(da) & set(db)):
            x, y = np.asarray(da[k]), np.asarray(db[k])
            compared += 1
            if x.shape != y.shape or x.dtype != y.dtype:
                problems.append(f"{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
                continue
            if exact or not np.issubdtype(x.dtype, np.floating):
                if x.tobytes() != y.tobytes():
                    n = int(np.sum(x != y)) if x.shape else 1
                    problems.append(f"{k}: {n} elements differ" + ("" if exact else " (integers must match)"))
                continue
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
            if norm_rtol > 0:
                rel = float(np.linalg.norm(diff)) / max(float(np.linalg.norm(y.astype(np.float64))), 1e-30)
                worst = max(worst, rel)
                if rel > norm_rtol:
                    problems.append(f"{k}: ||a-b||/||b|| = {rel:.3g} exceeds {norm_rtol}")
                continue
            bound = atol + rtol * np.abs(y.astype(np.float64))
            excess = float(np.max(diff - bound)) if diff.size else 0.0
            worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
            if excess > 0:
                problems.append(f"{k}: max |a-b| {float(np.max(diff)):.3g} exceeds the tolerance")
        if attributes and groups is None:
            for path in ["optimizer/param_groups/0", "train/lr_scheduler"]:
                aa = {k: v for k, v in fa[path].attrs.items()} if path in fa else {}
                ab = {k: v for k, v in fb[path].attrs.items()} if path in fb else {}
                if aa.keys() != ab.keys() or any(not np.array_equal(aa[x], ab[x]) for x in aa):
                    problems.append(f"/{path} attributes differ: {aa} vs {ab}")
    if compared == 0:
        problems.append("nothing compared")
    return Comparison(a, b, compared, problems, worst, exact)


def _compare_parser():
    ap = argparse.ArgumentParser(prog="h5ddp_test.py compare", description=compare_checkpoints.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--atol", type=float, default=0.0)
    ap.add_argument("--norm-rtol", type=float, default=0.0)
    ap.add_argument("--skip-rng", action="store_true")
    ap.add_argument("--groups", default="", help="comma-separated groups or datasets (default: the whole file)")
    ap.add_argument("--datasets-only", action="store_true", help="no attribute is compared")
    return ap


def _compare(o):
    t0 = time.monotonic()
    c = compare_checkpoints(o.a, o.b, o.rtol, o.atol, o.norm_rtol, o.skip_rng,
                            [g for g in o.groups.split(",") if g] or None, not o.datasets_only)
    err = "".join(f"compare: {o.a} vs {o.b}: {p}\n" for p in c.problems)
    return Result(0 if c.ok else 1, c.summary() + "\n", err, time.monotonic() - t0)


def compare(a, b, *opts):
    """compare_checkpoints with the command's options (e.g. "--norm-rtol", "1e-5"), as a Result: rc 0 iff no
    problem, out the summary line, err one line per problem."""
    return _compare(_compare_parser().parse_args([str(a), str(b)] + [str(x) for x in opts]))


def check_bitwise(a, b, what):
    """Checkpoints a and b hold the same datasets bit for bit (and the same optimizer/scheduler attributes)."""
    r = compare(a, b)
    check(r.rc == 0, f"{what}: {a} and {b} differ: {r}")


def compare_command(argv):
    """h5ddp_test.py compare [options] A B: exit 0 iff compare_checkpoints finds no problem."""
    r = _compare(_compare_parser().parse_args(argv))
    sys.stderr.write(r.err)
    sys.stdout.write(r.out)
    return r.rc


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        sys.exit(compare_command(sys.argv[2:]))
    if sys.argv[1:] == ["small-data"]:  # for the shell tests: prints the directory of small_fashion_mnist()
        print(small_fashion_mnist())
        sys.exit(0)
    print(__doc__)
    sys.exit(2)
