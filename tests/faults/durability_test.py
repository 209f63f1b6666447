"""Durability of a save (issue 23, finding 7): the order of the system calls that make a checkpoint survive a
power loss, recorded with strace around every rank of h5ddp-train. A rename is durable only once its
directory is fsynced, and a file's bytes only once the file is fsynced, so for each save of ckpt-N.h5:
  1. every rank that wrote bytes to ckpt-N.h5.partial fsyncs it after its last write to it and before the
     rename (other ranks' fsyncs end before the rename starts: compared by strace's time stamps, which are
     taken while the traced call is stopped, so they follow the causal order through the allreduce);
  2. the rename ckpt-N.h5.partial -> ckpt-N.h5 is followed by an fsync of the run directory before `latest`
     moves (otherwise `latest` could durably name a file whose directory entry is lost);
  3. latest.tmp is written (with the new file's name), fsynced, renamed to `latest`, and the directory is
     fsynced again before anything else happens to the directory (retention's removals, the next save).
With --no-fsync no fsync-family call is made at all (documented: "do not fsync checkpoint files").

Why strace rather than an LD_PRELOAD shim: strace sees the system calls themselves, whichever library makes
them (libstdc++'s std::filesystem::rename, ROMIO's writes, a future syscall() or io_uring-free rewrite), needs
no code of ours in the process, and with -y names the file behind every descriptor. The cost: it needs
ptrace (the test SKIPs, exit 77, when strace is missing or not permitted) and slows the traced calls a
little, which the time bounds allow for. Arguments: rank count."""
import glob
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
SYNC_CALLS = ("fsync", "fdatasync", "syncfs", "sync", "sync_file_range")
WRITE_CALLS = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
RENAME_CALLS = ("rename", "renameat", "renameat2")
# "?": not an error where the architecture lacks a call (aarch64 has no open, rename or unlink).
TRACED = ",".join("?" + c for c in SYNC_CALLS + WRITE_CALLS + RENAME_CALLS + ("open", "openat", "creat", "unlink",
                                                                             "unlinkat"))


class Call:
    def __init__(self, proc, tid, name, args, ret, start, seconds):
        self.proc, self.tid, self.name, self.args, self.ret = proc, tid, name, args, ret
        self.start, self.end = start, start + seconds

    def fd_path(self):
        """The file behind the first argument (strace -y prints `fd</path>`)."""
        m = re.match(r"\s*\d+<(.*?)>", self.args)
        return m.group(1) if m else None

    def strings(self):
        return [bytes(s, "utf-8").decode("unicode_escape") for s in re.findall(r'"((?:[^"\\]|\\.)*)"', self.args)]

    def ok(self):
        return not self.ret.lstrip().startswith("-1")

    def __repr__(self):
        return f"[rank {self.proc} tid {self.tid} @{self.start:.6f}] {self.name}({self.args[:120]}) = {self.ret}"


LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
DONE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(.*?)(?:\s+<(\d+\.\d+)>)?$")
UNFINISHED = re.compile(r"^(\w+)\((.*?)\s*<unfinished \.\.\.>$")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>\s*(.*)\)\s+=\s+(.*?)(?:\s+<(\d+\.\d+)>)?$")


def parse(path, proc):
    """One rank's strace output (-f -ttt -T -y) as a list of completed calls, by start time."""
    calls, pending = [], {}
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            tid, ts, rest = int(m.group(1)), float(m.group(2)), m.group(3)
            if (d := DONE.match(rest)):
                calls.append(Call(proc, tid, d.group(1), d.group(2), d.group(3), ts, float(d.group(4) or 0)))
            elif (u := UNFINISHED.match(rest)):
                pending[tid] = (u.group(1), u.group(2), ts)
            elif (r := RESUMED.match(rest)) and tid in pending:
                name, args, start = pending.pop(tid)
                # -T on the resumed line is the whole call's duration, measured from its entry.
                dur = float(r.group(4)) if r.group(4) else ts - start
                calls.append(Call(proc, tid, name, args + r.group(2), r.group(3), start, dur))
    return sorted(calls, key=lambda c: c.start)


def traced_train(run_dir, trace_dir, max_steps, extra=()):
    """h5ddp-train under mpirun, each rank under its own strace writing trace_dir/trace.<rank> (the rank as
    Open MPI or PMIx tells it, else the process id)."""
    wrapper = ('exec strace -f -qq -ttt -T -y -s 64 %s -e trace=%s '
               '-o "%s/trace.${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-$$}}" "$@"'
               % ("--seccomp-bpf" if seccomp_ok() else "", TRACED, trace_dir))
    args = ["/bin/sh", "-c", wrapper, "sh"] + ht.train_args(run_dir, max_steps, every=2, extra=extra,
                                                            keep_last=1)
    return ht.mpirun(NP, args, ht.STEP_TIMEOUT * 3)


_seccomp = None


def seccomp_ok():
    """--seccomp-bpf stops only at the traced calls (much less overhead); older strace lacks it."""
    global _seccomp
    if _seccomp is None:
        _seccomp = ht.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=fsync", "-o", "/dev/null",
                           "true"], 30).rc == 0
    return _seccomp


def require_strace():
    if shutil.which("strace") is None:
        raise ht.Skip("strace is not installed (apt-get install strace; tools/setup.sh installs it)")
    r = ht.run(["strace", "-f", "-qq", "-e", "trace=fsync", "-o", "/dev/null", "true"], 30)
    if r.rc != 0:
        raise ht.Skip(f"strace cannot trace here (ptrace not permitted?): {r.err.strip()[-300:]}")


def load_traces(trace_dir):
    files = sorted(glob.glob(os.path.join(trace_dir, "trace.*")))
    ht.check(len(files) == NP, f"expected {NP} strace outputs (one per rank), found {files}")
    return [parse(f, f.rsplit(".", 1)[1]) for f in files]


def describe(calls, limit=60):
    return "\n    ".join(repr(c) for c in calls[-limit:])


def check_save(traces, run_dir, name):
    """The order of one save's durability calls (module docstring, 1-3). Returns a one-line summary."""
    d = run_dir
    final, partial = os.path.join(d, name), os.path.join(d, name) + ".partial"
    tmp, latest = os.path.join(d, "latest.tmp"), os.path.join(d, "latest")

    def renames(calls, src, dst):
        return [c for c in calls if c.name in RENAME_CALLS and c.ok() and c.strings()[:2] == [src, dst]]

    committers = [(t, c) for t in traces for c in renames(t, partial, final)]
    ht.check(len(committers) == 1, f"{name}: expected one rename {partial} -> {final}, found {committers}")
    rank0, rename = committers[0]
    relevant = [c for t in traces for c in t if partial in (c.fd_path() or "") + " ".join(c.strings())]

    # 1. Every rank that wrote to the partial file fsyncs it after its last write and before the rename.
    writers = 0
    for t in traces:
        writes = [c for c in t if c.name in WRITE_CALLS and c.fd_path() == partial]
        if not writes:
            continue
        writers += 1
        last_write = max(c.end for c in writes)
        syncs = [c for c in t if c.name in SYNC_CALLS and c.fd_path() == partial and c.start >= last_write]
        ht.check(syncs, f"{name}: rank {t[0].proc} wrote {partial} but never fsynced it after its last "
                 f"write:\n    {describe(relevant)}")
        ht.check(min(c.end for c in syncs) <= rename.start,
                 f"{name}: rank {t[0].proc} fsynced {partial} only after the rename:\n    {describe(relevant)}")
    ht.check(writers >= 1, f"{name}: no rank wrote {partial}? (trace not understood)")

    # 2. The directory is fsynced after the rename and before `latest` moves.
    mine = rank0
    latest_moves = [c for c in renames(mine, tmp, latest) if c.start >= rename.end]
    ht.check(latest_moves, f"{name}: `latest` was not moved after the rename")
    move = latest_moves[0]
    dir_syncs = [c for c in mine if c.name in SYNC_CALLS and c.fd_path() == d]
    ht.check(any(rename.end <= c.start and c.end <= move.start for c in dir_syncs),
             f"{name}: no fsync of {d} between the rename of {partial} and the move of `latest`:\n    "
             f"{describe([c for c in mine if rename.start <= c.start <= move.end])}")

    # 3. latest.tmp: written with the new name, fsynced, renamed, directory fsynced before anything else.
    tmp_writes = [c for c in mine if c.name in WRITE_CALLS and c.fd_path() == tmp and rename.end <= c.start < move.start]
    ht.check(tmp_writes and name in tmp_writes[-1].args,
             f"{name}: latest.tmp was not written with {name} before its rename: {tmp_writes}")
    ht.check(any(c.name in SYNC_CALLS and c.fd_path() == tmp and c.start >= tmp_writes[-1].end and c.end <= move.start
                 for c in mine),
             f"{name}: latest.tmp not fsynced between its write and its rename:\n    "
             f"{describe([c for c in mine if rename.start <= c.start <= move.end])}")
    # The next thing the directory sees after the move: a removal of a checkpoint (retention) or the next
    # save's rename.
    ckpt_name = re.compile(re.escape(d) + r"/ckpt-\d+\.h5$")
    after = [c for c in mine if c.start >= move.end and c.ok() and (
        c.name in RENAME_CALLS or (c.name in ("unlink", "unlinkat") and any(ckpt_name.match(s) for s in c.strings())))]
    bound = after[0].start if after else float("inf")
    ht.check(any(move.end <= c.start and c.end <= bound for c in dir_syncs),
             f"{name}: no fsync of {d} after `latest` moved (before {after[0] if after else 'the end'}):\n    "
             f"{describe([c for c in mine if move.start <= c.start <= bound])}")
    return f"{name}: {writers} writer(s) fsynced before the rename; dir fsync; latest.tmp write+fsync+rename; dir fsync"


def test_save_fsyncs_in_order():
    require_strace()
    run_dir, trace_dir = ht.scratch("durable"), ht.scratch("durable-trace")
    run_dir = os.path.realpath(run_dir)  # strace -y prints resolved paths
    try:
        r = traced_train(run_dir, trace_dir, 4)
        ht.check(r.rc == 0, f"traced run failed: {r}")
        ht.check([ht.step_of(f) for f in ht.checkpoints(run_dir)] == [4], f"{ht.checkpoints(run_dir)}")
        traces = load_traces(trace_dir)
        notes = [check_save(traces, run_dir, n) for n in ("ckpt-00000002.h5", "ckpt-00000004.h5")]
        # Retention removed ckpt-2 only after `latest` named ckpt-4 durably (checked in check_save).
        removed = [c for t in traces for c in t if c.name in ("unlink", "unlinkat") and c.ok()
                   and os.path.join(run_dir, "ckpt-00000002.h5") in c.strings()]
        ht.check(len(removed) == 1, f"retention did not remove ckpt-2 exactly once: {removed}")
        return "; ".join(notes)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(trace_dir, ignore_errors=True)


def test_no_fsync_means_none():
    require_strace()
    run_dir, trace_dir = ht.scratch("nofsync"), ht.scratch("nofsync-trace")
    run_dir = os.path.realpath(run_dir)
    try:
        r = traced_train(run_dir, trace_dir, 4, extra=["--no-fsync"])
        ht.check(r.rc == 0, f"traced run failed: {r}")
        ht.check([ht.step_of(f) for f in ht.checkpoints(run_dir)] == [4], f"{ht.checkpoints(run_dir)}")
        traces = load_traces(trace_dir)
        syncs = [c for t in traces for c in t if c.name in SYNC_CALLS]
        ht.check(not syncs, f"--no-fsync still made fsync-family calls:\n    {describe(syncs)}")
        renamed = [c for t in traces for c in t if c.name in RENAME_CALLS and c.ok()
                   and all(s.startswith(run_dir + "/") for s in c.strings())]
        ht.check(len(renamed) == 4, f"expected 2 checkpoint and 2 `latest` renames, traced {renamed}")
        return f"no fsync-family call in {sum(len(t) for t in traces)} traced calls of {NP} rank(s)"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(trace_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(ht.main([test_save_fsyncs_in_order, test_no_fsync_means_none]))
