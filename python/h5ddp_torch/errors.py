"""Exceptions: one line each, naming the file, the dataset and the rank where there is one."""


def first_line(e):
    """The first line of an exception's message (its type's name when the message is empty): what goes into a
    one-line error."""
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


class CheckpointError(Exception):
    """A checkpoint could not be written, or a file is not a valid checkpoint (damaged, truncated, not h5ddp's).
    A resume skips such a file and tries the next older one."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint that does not fit the model or optimizer it is loaded into (another model, another
    optimizer type). A resume stops here: an older file of the same run would not fit either."""


class DisagreementError(CheckpointError):
    """Ranks hold different state or call a collective operation differently; nothing was written."""


def capture(fn):
    """Runs fn; returns (result, error or None): a CheckpointError as it is, any other exception as a one-line
    message. The error then goes to comm.raise_if_any, which raises it on every rank."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - every error is agreed between ranks, then raised on all of them
        return None, e if isinstance(e, CheckpointError) else f"{type(e).__name__}: {first_line(e)}"
