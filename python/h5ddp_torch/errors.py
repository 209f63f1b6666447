"""Exceptions: one line each, naming the file, the dataset and the rank where there is one."""


class CheckpointError(Exception):
    """A checkpoint could not be written, or a file is not a valid checkpoint (damaged, truncated, not h5ddp's).
    A resume skips such a file and tries the next older one."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint that does not fit the model or optimizer it is loaded into (another model, another
    optimizer type). A resume stops here: an older file of the same run would not fit either."""


class DisagreementError(CheckpointError):
    """Ranks hold different state or call a collective operation differently; nothing was written."""
