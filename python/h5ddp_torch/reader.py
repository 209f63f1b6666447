"""Reading checkpoints: the manifest (what a valid file holds; validity is rules.py's) and datasets read whole or
streamed, each checked against its dtype attribute and its XXH3-64 checksum (R13). Local: every caller reads on
its own rank; load and resume agree on the outcome."""
from dataclasses import dataclass, field

import h5py
import numpy as np
import xxhash

from . import format as fmt
from .errors import CheckpointError

VERIFY_CHUNK_BYTES = 64 << 20


@dataclass
class Manifest:
    path: str
    step: int = 0
    world_size: int = 0
    h5ddp_version: str = ""
    torch_version: str = ""
    created: str = ""
    model: list = field(default_factory=list)            # state-dict keys
    optimizer_type: str = ""
    groups: list = field(default_factory=list)           # [(hyper dict, has params dataset)]
    state: dict = field(default_factory=dict)            # {param name: [state keys]}
    user: list = field(default_factory=list)
    scheduler: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    rng_cuda: bool = False
    datasets: list = field(default_factory=list)         # every dataset this reader knows (rules.check)


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def read_manifest(f, path, datasets):
    """What a file holds, as far as this reader knows it: `datasets` are the ones rules.check listed (objects of a
    newer revision that this reader does not know are left out). Meant for a file rules.check found valid."""
    m = Manifest(path, datasets=list(datasets))
    a = f.attrs
    m.step, m.world_size = int(a[fmt.ATTR_STEP]), int(a[fmt.ATTR_WORLD_SIZE])
    m.h5ddp_version, m.torch_version = _text(a[fmt.ATTR_H5DDP_VERSION]), _text(a[fmt.ATTR_TORCH_VERSION])
    m.created = _text(a[fmt.ATTR_CREATED])
    m.optimizer_type = _text(f[fmt.OPTIMIZER_GROUP].attrs[fmt.ATTR_OPTIMIZER_TYPE])
    for d in m.datasets:
        parent, _, name = d.rpartition("/")
        if parent == fmt.MODEL_GROUP:
            m.model.append(name)
        elif parent == fmt.USER_GROUP:
            m.user.append(name)
        elif parent.rpartition("/")[0] == fmt.OPTIMIZER_STATE_GROUP:
            m.state.setdefault(parent.rpartition("/")[2], []).append(name)
    while fmt.param_group_path(len(m.groups)) in f:
        gpath = fmt.param_group_path(len(m.groups))
        g = f[gpath]
        hyper = {k: float(g.attrs[k]) for k in fmt.HYPER_KEYS.get(m.optimizer_type, ()) if k in g.attrs}
        m.groups.append((hyper, f"{gpath}/{fmt.PARAM_NAMES_DATASET}" in m.datasets))
    s = f[fmt.SCHEDULER_GROUP].attrs
    m.scheduler = {k: _text(v) if k == fmt.ATTR_SCHEDULER_TYPE else float(v) for k, v in s.items()}
    m.meta = {k: _text(v) for k, v in f[fmt.META_GROUP].attrs.items()}
    m.rng_cuda = fmt.RNG_CUDA in m.datasets
    return m


def dataset_dtype(f, path, dspath):
    """The h5ddp dtype of a dataset, checked against its HDF5 type; raises CheckpointError."""
    ds = f[dspath]
    for a in (fmt.ATTR_DTYPE, fmt.ATTR_CHECKSUM):
        if a not in ds.attrs:
            raise CheckpointError(f"{path}: missing required attribute {dspath}@{a}")
    name = _text(ds.attrs[fmt.ATTR_DTYPE])
    if name not in fmt.DTYPE_NAMES:
        raise CheckpointError(f"{path}: R13: {dspath}@dtype is {name!r}, not a dtype of FORMAT.md's table Dtypes")
    stored = ds.dtype
    ok = h5py.check_string_dtype(stored) is not None if name == "string" else stored == fmt.NUMPY_DTYPES[name]
    if not ok:
        raise CheckpointError(f"{path}: R13: {dspath} has HDF5 type {stored}, its dtype is {name}")
    return name


def _contiguous(a):
    """A C-contiguous array of the same shape (np.ascontiguousarray would turn a 0-d array into shape [1])."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy()


def _checksum_attr(ds):
    """The stored XXH3-64, or None when the attribute is missing or not a uint64 scalar (rules report that)."""
    if fmt.ATTR_CHECKSUM not in ds.attrs:
        return None
    aid = ds.attrs.get_id(fmt.ATTR_CHECKSUM)
    if aid.shape != () or aid.dtype != np.dtype("<u8"):
        return None
    return int(np.uint64(ds.attrs[fmt.ATTR_CHECKSUM]))


def _mismatch(path, dspath, stored, computed):
    return CheckpointError(f"{path}: R13: checksum mismatch in dataset {dspath} (stored {stored:#018x}, computed "
                           f"{computed:#018x})")


def read_dataset(f, path, dspath):
    """(dtype name, numpy array) of a whole dataset, its checksum verified."""
    name = dataset_dtype(f, path, dspath)
    ds = f[dspath]
    try:
        a = _contiguous(ds[()])
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read dataset {dspath}, damaged or truncated ({e})") from None
    computed = xxhash.xxh3_64_intdigest(a.reshape(-1).view(np.uint8))
    if computed != _checksum_attr(ds):
        raise _mismatch(path, dspath, _checksum_attr(ds), computed)
    if name == "bool" and not bools_ok(a):
        raise _not_bool(path, dspath)
    return name, a


def bools_ok(a):
    """R22: every byte of a bool tensor is 0 or 1."""
    return not (np.asarray(a).reshape(-1).view(np.uint8) > 1).any()


def _not_bool(path, dspath):
    return CheckpointError(f"{path}: R22: bool dataset {dspath} holds a value other than 0 and 1")


def verify_dataset(f, path, dspath, is_bool=False):
    """Streams a dataset through XXH3 in bounded chunks; raises CheckpointError on a mismatch. A dataset without
    a well-typed checksum attribute is not hashed (rules.check reports it)."""
    ds = f[dspath]
    if _checksum_attr(ds) is None or ds.shape is None or ds.dtype.kind == "O":  # no hash, or not fixed-size bytes
        return
    h = xxhash.xxh3_64()
    bools = True
    try:
        if ds.ndim == 0 or ds.shape[0] == 0:
            pieces = [_contiguous(ds[()])]
        else:
            row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
            per = max(1, VERIFY_CHUNK_BYTES // row_bytes)
            pieces = (_contiguous(ds[r:r + per]) for r in range(0, ds.shape[0], per))
        for piece in pieces:
            h.update(piece.reshape(-1).view(np.uint8))
            bools = bools and (not is_bool or bools_ok(piece))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read dataset {dspath}, damaged or truncated ({e})") from None
    if h.intdigest() != _checksum_attr(ds):
        raise _mismatch(path, dspath, _checksum_attr(ds), h.intdigest())
    if not bools:
        raise _not_bool(path, dspath)
