"""The ranks of a job, for the collective operations of save, load and resume: the transport.

Two transports. "mpi": checkpoint I/O over MPI (parallel HDF5 through Debian's python3-h5py-mpi and
python3-mpi4py); the processes of the torch.distributed job are one MPI job in the same rank order (mpirun or
srun). "torch": no MPI at all (a torchrun / env:// job): the ranks agree over torch.distributed's object
collectives and write the file with positional writes (pwrite.py). get_comm picks it from how the job was
launched. A job of one process needs neither.
"""
import os

from .errors import CheckpointError, CheckpointMismatchError, DisagreementError, first_line


def _torch_world():
    """(rank, size) of torch.distributed, or None when no process group is initialised."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _launched_by_mpi():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))


class Comm:
    """A communicator: mpi4py's, or a single process. Collective calls must be made by every rank."""

    def __init__(self, mpi_comm=None):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1
        self.transport = "mpi" if mpi_comm is not None else "single"

    def allgather(self, obj):
        return self.mpi.allgather(obj) if self.mpi is not None else [obj]

    def bcast(self, obj, root=0):
        return self.mpi.bcast(obj, root=root) if self.mpi is not None else obj

    def barrier(self):
        if self.mpi is not None:
            self.mpi.Barrier()

    def raise_if_any(self, error, kind=CheckpointError):
        """Collective. Every rank passes its error message or None; if any rank has one, every rank raises
        `kind` (the class of the lowest failing rank's error when `error` is an exception) with the message
        of the lowest failing rank, prefixed by its rank."""
        if isinstance(error, BaseException):
            kind, error = type(error) if isinstance(error, CheckpointError) else kind, str(error)
        verdicts = self.allgather((error, kind.__name__) if error else None)
        for r, v in enumerate(verdicts):
            if v is None:
                continue
            message, kind_name = v
            cls = {c.__name__: c for c in (CheckpointError, CheckpointMismatchError, DisagreementError)}.get(
                kind_name, CheckpointError)
            raise cls(message if message.startswith(f"rank {r}: ") else f"rank {r}: {message}")


class TorchComm(Comm):
    """The ranks of torch.distributed's default process group (gloo, NCCL, ...), no MPI: objects travel through
    all_gather_object / broadcast_object_list. A failed collective (a rank died, a timeout) raises
    CheckpointError on this rank instead of the backend's multi-line error."""

    def __init__(self):
        import torch.distributed as dist

        super().__init__(None)
        self.dist = dist
        self.rank, self.size, self.transport = dist.get_rank(), dist.get_world_size(), "torch"

    def _collective(self, what, fn):
        try:
            return fn()
        except RuntimeError as e:
            raise CheckpointError(f"rank {self.rank}: torch.distributed {what} failed (did a rank die?): "
                                  f"{first_line(e)}") from None

    def allgather(self, obj):
        out = [None] * self.size
        self._collective("all_gather_object", lambda: self.dist.all_gather_object(out, obj))
        return out

    def bcast(self, obj, root=0):
        box = [obj if self.rank == root else None]
        self._collective("broadcast_object_list", lambda: self.dist.broadcast_object_list(box, src=root))
        return box[0]

    def barrier(self):
        self._collective("barrier", self.dist.barrier)


def get_comm(comm=None):
    """The communicator of checkpoint I/O: `comm` when given (a Comm, an mpi4py communicator, or a transport's
    name: "torch" or "mpi"); else MPI's COMM_WORLD when the job was launched by mpirun/srun's MPI (as today);
    else torch.distributed's ranks when its process group spans more than one (torchrun, env://: no MPI);
    else a single process. Raises CheckpointError when MPI's world and torch.distributed's differ."""
    if isinstance(comm, Comm):
        return comm
    torch_world = _torch_world()
    if comm == "torch" or (comm is None and not _launched_by_mpi() and torch_world and torch_world[1] > 1):
        if torch_world is None:
            raise CheckpointError("transport 'torch' needs an initialised torch.distributed process group "
                                  "(torch.distributed.init_process_group)")
        return TorchComm()
    if comm not in (None, "mpi"):
        return Comm(comm)
    if comm is None and not _launched_by_mpi() and (torch_world is None or torch_world[1] == 1):
        return Comm(None)
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise CheckpointError("h5ddp_torch needs mpi4py for an MPI job of several processes "
                              "(apt-get install python3-mpi4py python3-h5py-mpi; or launch with torchrun, no MPI): "
                              + str(e)) from None
    c = Comm(MPI.COMM_WORLD)
    if torch_world is not None and torch_world != (c.rank, c.size):
        raise CheckpointError(
            f"torch.distributed rank {torch_world[0]} of {torch_world[1]} is MPI rank {c.rank} of {c.size}: "
            "h5ddp_torch writes one file with MPI-IO, so launch the job with mpirun/srun and give "
            "init_process_group the MPI rank and size (h5ddp_torch.init_from_mpi does)")
    return c


def init_from_mpi(backend="gloo", master_addr=None, master_port=None, **kwargs):
    """Initialises torch.distributed from the MPI job this process belongs to (rank and size from mpi4py;
    rank 0's host name and a port broadcast as the rendezvous), so that torch's ranks are MPI's.
    Returns (rank, world_size)."""
    import socket

    import torch.distributed as dist
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if rank == 0 and master_port is None:
        with socket.socket() as s:  # a free port on rank 0's host
            s.bind(("", 0))
            master_port = s.getsockname()[1]
    addr = master_addr or os.environ.get("MASTER_ADDR") or socket.gethostname()
    addr, port = world.bcast((addr, master_port))
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size, **kwargs)
    return rank, size


def exit_without_teardown(main_fn):
    """Runs main_fn() (its return value, None meaning 0, is the exit status; an exception prints its traceback
    and gives 1), then ends the process with os._exit, without the interpreter's teardown. For torch 1.13 (Debian)
    jobs on gloo: its ProcessGroupGloo destructor, run from the DDP Reducer's once destroy_process_group has dropped
    the group, sometimes deadlocks with a gloo worker thread that releases a tensor and waits for the GIL (seen in
    ~1 of 4 torchrun-style runs; gdb: ~ProcessGroupGloo <- ~Reducer). So main_fn leaves the group alive (no
    destroy_process_group) and the process ends here."""
    import sys
    import traceback

    try:
        status = main_fn() or 0
    except BaseException:  # noqa: BLE001 - reported, then the status says it
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
