"""The write phase without MPI (the "torch" transport: torchrun, env://): the same file as the MPI path, its
bytes written in parallel by positional writes.

  layout    rank 0 creates <name>.partial with serial HDF5: root attributes, groups, every dataset contiguous
            with its storage allocated at creation (fill never) and a checksum attribute of 0; closes it
  offsets   each dataset's byte offset in the file (H5Dget_offset), broadcast to every rank
  write     each rank os.pwrite()s the rows of its byte share (writer.compute_segments) at offset + row * row
            bytes, fsyncs, closes; the ranks agree on the outcome
  hashes    gathered and agreed as on the MPI path (partial.agree_checksums)
  finish    rank 0 reopens the file with HDF5 and rewrites the checksum attributes in place, closes, fsyncs
Any failure raises on every rank (a rank that died makes the others' collectives fail) and rank 0 removes the
partial file; the commit (rename, latest) comes after, in writer.py. A dataset written whole by one rank fits
a later "each rank writes the datasets it owns" plan unchanged: shares are only (item, rank, rows)."""
import os
import time

from . import h5
from .commit import fsync_path
from .errors import CheckpointError, capture
from .partial import MAX_TRANSFER_BYTES, agree_checksums, as_bytes, create_structure, set_checksums


def _layout(partial_path, items, structure):
    """Rank 0. Creates the file's structure, returns [file offset of each dataset's bytes, or None if empty]."""
    with h5.create_serial(partial_path) as f:
        dsets = create_structure(f, items, *structure, early=True)
        offsets = []
        for ds, d in zip(dsets, items):
            off = ds.id.get_offset() if d.nbytes else None
            if d.nbytes and off is None:
                raise CheckpointError(f"{partial_path}: dataset {d.path} has no storage after creation")
            offsets.append(off)
    return offsets


def _test_hook(rank, step):
    """H5DDP_TEST_HOOKS=1 and H5DDP_TEST_DIE_RANK=r (H5DDP_TEST_DIE_STEP=s): rank r exits at once after its
    first positional write of the save of step s (a rank that dies mid-save, for the tests)."""
    if os.environ.get("H5DDP_TEST_HOOKS") != "1" or os.environ.get("H5DDP_TEST_DIE_RANK") != str(rank):
        return
    if os.environ.get("H5DDP_TEST_DIE_STEP", str(step)) == str(step):
        os._exit(86)


def _pwrite_all(fd, view, offset):
    while len(view):
        n = os.pwrite(fd, view[:MAX_TRANSFER_BYTES], offset)
        if n <= 0:
            raise OSError(5, "short write")
        view, offset = view[n:], offset + n


def _write_share(comm, partial_path, items, segments, offsets, fsync, step):
    """Local. Writes this rank's rows; returns the bytes written. Raises CheckpointError naming file, dataset."""
    try:
        fd = os.open(partial_path, os.O_WRONLY)
    except OSError as e:
        raise CheckpointError(f"cannot open {partial_path} for writing: {e.strerror}") from None
    written = 0
    try:
        for i, r, begin, end in segments:
            if r != comm.rank:
                continue
            d = items[i]
            rb = d.row_bytes
            try:
                _pwrite_all(fd, memoryview(as_bytes(d.array))[begin * rb:end * rb], offsets[i] + begin * rb)
            except OSError as e:
                raise CheckpointError(f"writing rows [{begin}, {end}) of dataset {d.path} to {partial_path}: "
                                      f"{e.strerror}") from None
            written += (end - begin) * rb
            _test_hook(comm.rank, step)
        if fsync:
            os.fsync(fd)
    except OSError as e:
        raise CheckpointError(f"fsync of {partial_path} failed: {e.strerror}") from None
    finally:
        os.close(fd)
    return written


def _finish(partial_path, items, fsync):
    """Rank 0. The agreed checksums into the attributes (rewritten in place), close, fsync."""
    with h5.open_for_update(partial_path) as f:
        set_checksums([f[d.path] for d in items], items)
    if fsync:
        fsync_path(partial_path)


def write_partial_positional(comm, partial_path, plan, structure, fsync, result, phases):
    """Collective. Writes, hashes, closes and fsyncs <name>.partial; removes it on any failure.
    plan: (items, segments, pieces); structure: the arguments of create_structure after f and items."""
    items, segments, pieces = plan
    step = structure[5]
    try:
        t = time.perf_counter()
        offsets, err = capture(lambda: _layout(partial_path, items, structure)) if comm.rank == 0 else (None, None)
        comm.raise_if_any(err if err is None else f"creating {partial_path}: {err}")
        offsets = comm.bcast(offsets)
        phases["create"] = time.perf_counter() - t
        t = time.perf_counter()
        written, err = capture(lambda: _write_share(comm, partial_path, items, segments, offsets, fsync, step))
        comm.raise_if_any(err)
        result.bytes_this_rank += written
        phases["write"] = time.perf_counter() - t
        t = time.perf_counter()
        agree_checksums(comm, items, segments, pieces)
        phases["checksums"] = time.perf_counter() - t
        t = time.perf_counter()
        _, err = capture(lambda: _finish(partial_path, items, fsync)) if comm.rank == 0 else (None, None)
        comm.raise_if_any(err if err is None else f"finishing {partial_path}: {err}")
        phases["close+fsync"] = time.perf_counter() - t
    except BaseException:
        if comm.rank == 0:
            capture(lambda: os.remove(partial_path))
        raise
