"""Which h5py this package uses, and how it opens checkpoint files.

Debian ships h5py twice: python3-h5py-serial (h5py._debian_h5py_serial) and python3-h5py-mpi
(h5py._debian_h5py_mpi). `import h5py` picks the MPI build only when the process looks like part of an MPI
job at import time: OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), MPI_LOCALNRANKS (MPICH) or H5PY_ALWAYS_USE_MPI
is set; otherwise the serial one (h5py/__init__.py). A parallel save needs the MPI build (driver="mpio"), so
under mpirun `import h5py` is already right; `h5py.get_config().mpi` says which one a process has.
"""
import h5py

from .errors import CheckpointError, first_line

# The C++ writer's file layout (src/h5/h5.cpp): objects >= 1 MiB aligned to 1 MiB, library version bounds
# [earliest, v18] so that HDF5 1.8 and later read the files.
ALIGNMENT = 1 << 20
LIBVER = ("earliest", "v108")
# MPI-IO hints the C++ writer passes (docs/SLURM.md "File systems"): large collective buffers, no data sieving.
MPIO_HINTS = {"cb_buffer_size": "16777216", "romio_ds_write": "disable", "romio_cb_write": "automatic",
              "romio_cb_read": "automatic"}


def has_mpi():
    return bool(h5py.get_config().mpi)


def create_file(path, comm):
    """Collective. Creates (truncates) `path` for writing by every rank of `comm` (a Comm)."""
    kwargs = dict(libver=LIBVER, alignment_threshold=ALIGNMENT, alignment_interval=ALIGNMENT)
    if comm.size == 1 and not has_mpi():
        return h5py.File(path, "w", **kwargs)
    if not has_mpi():
        raise CheckpointError(
            f"cannot write {path} from {comm.size} ranks: this process imported Debian's serial h5py "
            "(h5py picks its MPI build only when OMPI_COMM_WORLD_SIZE, MPI_LOCALNRANKS or H5PY_ALWAYS_USE_MPI "
            "is set at import: launch with mpirun, or set H5PY_ALWAYS_USE_MPI=1; needs python3-h5py-mpi)")
    from mpi4py import MPI

    info = MPI.Info.Create()
    for k, v in MPIO_HINTS.items():
        info.Set(k, v)
    try:
        return h5py.File(path, "w", driver="mpio", comm=comm.mpi if comm.mpi is not None else MPI.COMM_SELF,
                         info=info, **kwargs)
    finally:
        info.Free()


def create_serial(path):
    """Local. Creates (truncates) `path` with serial HDF5 (the default driver of either build) and the C++
    writer's properties; the layout of a file whose bytes the ranks then write themselves (pwrite.py)."""
    return h5py.File(path, "w", libver=LIBVER, alignment_threshold=ALIGNMENT, alignment_interval=ALIGNMENT)


def open_for_update(path):
    """Local. Opens a file create_serial made, for rewriting attributes in place."""
    return h5py.File(path, "r+", libver=LIBVER)


def open_file(path):
    """Local. Opens a checkpoint for reading (every rank on its own: reads need no MPI). One-line errors."""
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be opened as an HDF5 file, damaged or truncated ({first_line(e)})") \
            from None

