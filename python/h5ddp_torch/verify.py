"""The verifier (as h5ddp-ckpt verify): rules.py's verdict on a file plus every dataset's checksum (R13) and the
values of R8 and R10."""
import numpy as np

from . import rules
from .errors import CheckpointError, first_line
from .h5 import open_file
from .reader import verify_dataset

_READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def _checksums(f, path, datasets, bools):
    problems = []
    for d in datasets:
        try:
            verify_dataset(f, path, d, d in bools)
        except CheckpointError as e:
            problems.append(str(e))
        except _READ_ERRORS as e:
            problems.append(f"{path}: {d}: damaged, cannot be read ({first_line(e)})")
    return problems


def _values(f, datasets):
    """{path: array} of the scalar datasets whose values R8 and R10 constrain."""
    return {d: np.asarray(f[d][()]) for d in rules.value_datasets(datasets) if f[d].shape == ()}


def verify(path, notes=None, reader_minor=rules.READER_MINOR_VERSION):
    """Every problem of the checkpoint at `path` as one-line messages, [] when it is valid (docs/FORMAT.md: every
    rule, every checksum). `notes`, a list, receives the notes: objects and attributes of a newer revision of
    the format than this reader's, which it ignores (no problem)."""
    try:
        f = open_file(path)
    except CheckpointError as e:
        return [str(e)]
    with f:
        verdict = rules.check(f, path, reader_minor)
        problems = list(verdict.problems)
        if notes is not None:
            notes.extend(verdict.notes)
        problems += _checksums(f, path, verdict.datasets, verdict.bools)
        try:
            problems += rules.value_problems(path, _values(f, verdict.datasets))
        except _READ_ERRORS as e:
            problems.append(f"{path}: damaged, cannot be read ({first_line(e)})")
    return problems
