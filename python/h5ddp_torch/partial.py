"""The file both write paths make, <name>.partial (writer.py: parallel HDF5 under MPI; pwrite.py: positional
writes without MPI), and what they share: the planned datasets (Item), their bytes and XXH3-64 hashes, the
file's structure (root attributes, groups, datasets; no data), the checksums agreed between the ranks and
written into the attributes. Below writer.py and pwrite.py: it imports neither."""
from dataclasses import dataclass

import h5py
import numpy as np
import xxhash

from . import format as fmt
from ._version import __version__
from .errors import DisagreementError

# Largest single write (as the C++ writer: MPI-IO counts are ints).
MAX_TRANSFER_BYTES = 1 << 30


@dataclass
class Item:
    """One dataset of the file: its path, stored bytes, h5ddp dtype, checksum and owner."""
    path: str
    array: np.ndarray  # the stored bytes, C-contiguous
    dtype: str         # h5ddp dtype name, or "string"
    tensor: bool       # model/optimizer/user tensor: hashed by the rank that writes it
    checksum: int = 0
    owner: int = -1    # >= 0: held by that rank only (ZeRO state), written whole by it, not compared (zero.py)

    @property
    def nbytes(self):
        return self.array.nbytes

    @property
    def rows(self):
        return self.array.shape[0] if self.array.ndim else 1

    @property
    def row_bytes(self):
        return self.nbytes // self.rows if self.rows else 0


def as_bytes(a):
    """The bytes of a C-contiguous array as a flat uint8 view (also for 0-d and empty arrays)."""
    return a.reshape(-1).view(np.uint8)


def array_hash(a):
    """XXH3-64 of the array's bytes: the dataset's checksum attribute."""
    return xxhash.xxh3_64_intdigest(as_bytes(a))


def _scalar_early(f, d, dcpl):
    """A scalar dataset with `dcpl` (h5py's create_dataset replaces the creation properties of a scalar with
    the defaults, which allocate its storage late)."""
    lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    dsid = h5py.h5d.create(f.id, d.path.encode(), h5py.h5t.py_create(d.array.dtype, logical=1),
                           h5py.h5s.create(h5py.h5s.SCALAR), dcpl=dcpl, lcpl=lcpl)
    return h5py.Dataset(dsid)


def create_structure(f, items, kind, groups, scheduler, meta, world, step, created, early=False):
    """The root attributes, groups and every dataset of the file (no data written), [datasets]. early: storage
    allocated at creation (serial HDF5 defers it; parallel HDF5 always allocates early) and a checksum
    attribute of 0 in place, so that the data never moves and the checksums are later rewritten in place."""
    f.attrs[fmt.ATTR_FORMAT] = fmt.FORMAT_NAME
    f.attrs[fmt.ATTR_FORMAT_VERSION] = np.int64(fmt.FORMAT_VERSION)
    f.attrs[fmt.ATTR_FORMAT_MINOR_VERSION] = np.int64(fmt.FORMAT_MINOR_VERSION)
    f.attrs[fmt.ATTR_H5DDP_VERSION] = str(__version__)
    f.attrs[fmt.ATTR_TORCH_VERSION] = str(meta.get("torch_version", "unknown"))
    f.attrs[fmt.ATTR_CREATED] = str(created)
    f.attrs[fmt.ATTR_WORLD_SIZE] = np.int64(world)
    f.attrs[fmt.ATTR_STEP] = np.int64(step)
    for g in (fmt.MODEL_GROUP, fmt.OPTIMIZER_GROUP, fmt.PARAM_GROUPS_GROUP, fmt.OPTIMIZER_STATE_GROUP,
              fmt.TRAIN_GROUP, fmt.DATA_GROUP, fmt.RNG_GROUP):
        f.require_group(g)
    if any(d.path.startswith(fmt.USER_GROUP + "/") for d in items):
        f.require_group(fmt.USER_GROUP)
    f[fmt.OPTIMIZER_GROUP].attrs[fmt.ATTR_OPTIMIZER_TYPE] = str(kind)
    for i, (hyper, _) in enumerate(groups):
        g = f.require_group(fmt.param_group_path(i))
        for k, v in hyper.items():
            g.attrs[k] = np.float64(v)
    sched = f.require_group(fmt.SCHEDULER_GROUP)
    sched.attrs[fmt.ATTR_SCHEDULER_TYPE] = str(scheduler.get("type", "none"))
    for k, v in scheduler.items():
        if k != "type":
            sched.attrs[k] = np.float64(v)
    m = f.require_group(fmt.META_GROUP)
    for k, v in meta.items():
        m.attrs[k] = str(v)
    dsets = []
    for d in items:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # storage is allocated at creation: no pass of fill values
        if early:
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        ds = _scalar_early(f, d, dcpl) if early and d.array.ndim == 0 else \
            f.create_dataset(d.path, shape=d.array.shape, dtype=d.array.dtype, dcpl=dcpl)
        ds.attrs[fmt.ATTR_DTYPE] = d.dtype
        if early:
            ds.attrs[fmt.ATTR_CHECKSUM] = np.uint64(0)
        dsets.append(ds)
    return dsets


def agree_checksums(comm, items, segments, pieces):
    """Collective. Sets every item's checksum: a tensor's comes from the rank that wrote it whole; a split,
    empty or small dataset is hashed by every rank and the hashes must agree (the bytes from different replicas
    must be the same); raises DisagreementError on every rank when they do not."""
    owner = [-1] * len(items)
    for i, r, _, _ in segments:
        if items[i].tensor and pieces[i] == 1:
            owner[i] = r
    mine = [array_hash(d.array) if owner[i] in (-1, comm.rank) else None for i, d in enumerate(items)]
    differ = []
    for i, col in enumerate(zip(*comm.allgather(mine))):
        values = {v for v in col if v is not None}
        if len(values) != 1:
            differ.append(items[i].path)
        items[i].checksum = min(values)
    comm.raise_if_any("replicated state differs between ranks (full checksums disagree); nothing is "
                      "committed: " + ", ".join(differ) if differ else None, DisagreementError)


def set_checksums(dsets, items):
    for ds, d in zip(dsets, items):
        ds.attrs[fmt.ATTR_CHECKSUM] = np.uint64(d.checksum)
