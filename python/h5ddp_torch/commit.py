"""The file-system side of the commit protocol (docs/FORMAT.md): fsync, `latest`, retention, and the list of
checkpoints a resume tries. Everything here is local: callers decide which rank does what."""
import os

from . import format as fmt
from .errors import CheckpointError


def fsync_path(path, directory=False):
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError as e:
        raise CheckpointError(f"cannot open {path} to fsync it: {e.strerror}") from None
    try:
        os.fsync(fd)
    except OSError as e:
        raise CheckpointError(f"fsync of {path} failed: {e.strerror}") from None
    finally:
        os.close(fd)


def write_latest(run_dir, file_name, fsync=True):
    """latest.tmp, fsync, rename to latest, fsync the directory."""
    tmp = os.path.join(run_dir, fmt.LATEST_TMP_FILE)
    try:
        with open(tmp, "w") as f:
            f.write(file_name + "\n")
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, os.path.join(run_dir, fmt.LATEST_FILE))
    except OSError as e:
        raise CheckpointError(f"cannot write {os.path.join(run_dir, fmt.LATEST_FILE)}: {e.strerror}") from None
    if fsync:
        fsync_path(run_dir, directory=True)


def read_latest(run_dir):
    """The file name `latest` holds, or "" when it is missing or unreadable."""
    try:
        with open(os.path.join(run_dir, fmt.LATEST_FILE)) as f:
            return f.readline().rstrip("\r\n ")
    except OSError:
        return ""


def apply_retention(run_dir, keep_last, keep_every, newest, warn):
    """Removes stale *.h5.partial files, then the ckpt-<step>.h5 files that are neither among the keep_last
    newest, nor a multiple of keep_every, nor `newest`, nor named by `latest`. Logs problems, never raises."""
    try:
        names = os.listdir(run_dir)
    except OSError as e:
        warn(f"retention: cannot list {run_dir}: {e.strerror}")
        return
    for n in names:
        if n.endswith(fmt.CHECKPOINT_SUFFIX + fmt.PARTIAL_SUFFIX) and len(n) > len(fmt.CHECKPOINT_SUFFIX + fmt.PARTIAL_SUFFIX):
            try:
                os.remove(os.path.join(run_dir, n))  # saves are collective and sequential: a leftover one died
            except OSError:
                pass
    if keep_last <= 0:
        return
    ckpts = sorted(((fmt.checkpoint_step_from_name(n), n) for n in names if fmt.checkpoint_step_from_name(n) >= 0),
                   reverse=True)
    latest = read_latest(run_dir)
    for i, (step, n) in enumerate(ckpts):
        if i < keep_last or n == newest or n == latest or (keep_every > 0 and step % keep_every == 0):
            continue
        try:
            os.remove(os.path.join(run_dir, n))
        except OSError as e:
            warn(f"retention: cannot remove {os.path.join(run_dir, n)}: {e.strerror}")


def resume_candidates(run_dir, warn):
    """Paths a resume tries, in order: a file `latest` names whose name carries no step first, then the
    ckpt-<step>.h5 files from the highest step down (never a *.partial)."""
    found = {}
    try:
        for n in os.listdir(run_dir):
            step = fmt.checkpoint_step_from_name(n)
            if step >= 0:
                found[n] = step
    except OSError:
        return []
    latest = read_latest(run_dir)
    if latest.endswith(fmt.CHECKPOINT_SUFFIX + fmt.PARTIAL_SUFFIX):
        warn(f"ignoring {os.path.join(run_dir, fmt.LATEST_FILE)}: it names {latest}, a partial file "
             "(never a checkpoint)")
        latest = ""
    if latest and fmt.checkpoint_step_from_name(latest) >= 0:
        found.setdefault(latest, fmt.checkpoint_step_from_name(latest))  # a missing target: its load says so
    ordered = [n for n, _ in sorted(found.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]
    if latest and fmt.checkpoint_step_from_name(latest) < 0 and os.path.basename(latest) == latest:
        ordered.insert(0, latest)
    return [os.path.join(run_dir, n) for n in ordered]
