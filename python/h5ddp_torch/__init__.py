"""h5ddp_torch: h5ddp checkpoints (docs/FORMAT.md) from PyTorch.

    save(run_dir, model, optimizer, step=..., data=...)   collective: one file written by all ranks (MPI-IO under
                                                           mpirun; positional writes under torchrun, no MPI)
                                                           optimizer may be a ZeroRedundancyOptimizer (zero.py)
    resume(run_dir, model, optimizer)                      the newest valid checkpoint, or None
    load(path, model, optimizer)                           one checkpoint
    verify(path)                                           [] or the list of problems
    DistributedSampler, DataState                          h5ddp's data order, bit for bit
"""
from ._version import __version__  # noqa: F401 - exported: h5ddp_torch.__version__
from .comm import exit_without_teardown, get_comm, init_from_mpi
from .errors import CheckpointError, CheckpointMismatchError, DisagreementError
from .loader import LoadResult, load, read_model, resume
from .sampler import DataState, DistributedSampler
from .verify import verify
from .writer import SaveResult, save

__all__ = ["save", "load", "read_model", "resume", "verify", "init_from_mpi", "get_comm", "exit_without_teardown", "DataState",
           "DistributedSampler", "LoadResult", "SaveResult", "CheckpointError", "CheckpointMismatchError", "DisagreementError"]
