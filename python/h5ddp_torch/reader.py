"""Reading checkpoints: the manifest (what a file holds, checked against docs/FORMAT.md's layout) and datasets
read whole or streamed, each checked against its dtype attribute and its XXH3-64 checksum. Local: every caller
reads on its own rank; load and resume agree on the outcome."""
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
    datasets: list = field(default_factory=list)         # every dataset path the layout expects


def _attr(obj, name, path, where):
    if name not in obj.attrs:
        raise CheckpointError(f"{path}: {where} lacks the attribute '{name}'")
    v = obj.attrs[name]
    return v.decode() if isinstance(v, bytes) else v


def check_format(f, path):
    if fmt.ATTR_FORMAT not in f.attrs:
        raise CheckpointError(f"{path}: an HDF5 file but not an h5ddp checkpoint (no root attribute 'format')")
    name = _attr(f, fmt.ATTR_FORMAT, path, "the root group")
    if name != fmt.FORMAT_NAME:
        raise CheckpointError(f"{path}: an HDF5 file but not an h5ddp checkpoint (format is '{name}')")
    version = int(_attr(f, fmt.ATTR_FORMAT_VERSION, path, "the root group"))
    if version != fmt.FORMAT_VERSION:
        raise CheckpointError(f"{path}: unsupported checkpoint format version {version} "
                              f"(h5ddp_torch reads version {fmt.FORMAT_VERSION})")


def _children(f, group, path):
    if group not in f:
        raise CheckpointError(f"{path}: required group {group} is missing")
    g = f[group]
    if not isinstance(g, h5py.Group):
        raise CheckpointError(f"{path}: {group} is not a group")
    return list(g.keys())


def read_manifest(f, path):
    """The manifest of an open file; raises CheckpointError at the first structural problem."""
    check_format(f, path)
    m = Manifest(path)
    m.step = int(_attr(f, fmt.ATTR_STEP, path, "the root group"))
    m.world_size = int(_attr(f, fmt.ATTR_WORLD_SIZE, path, "the root group"))
    m.h5ddp_version = str(_attr(f, fmt.ATTR_H5DDP_VERSION, path, "the root group"))
    m.torch_version = str(_attr(f, fmt.ATTR_TORCH_VERSION, path, "the root group"))
    m.created = str(_attr(f, fmt.ATTR_CREATED, path, "the root group"))
    m.model = _children(f, fmt.MODEL_GROUP, path)
    m.datasets += [f"{fmt.MODEL_GROUP}/{k}" for k in m.model]
    m.optimizer_type = str(_attr(f[fmt.OPTIMIZER_GROUP], fmt.ATTR_OPTIMIZER_TYPE, path, fmt.OPTIMIZER_GROUP)) \
        if fmt.OPTIMIZER_GROUP in f else ""
    if fmt.OPTIMIZER_GROUP not in f:
        raise CheckpointError(f"{path}: required group {fmt.OPTIMIZER_GROUP} is missing")
    if m.optimizer_type not in fmt.OPTIMIZER_TYPES:
        raise CheckpointError(f"{path}: unknown optimizer type '{m.optimizer_type}' in {fmt.OPTIMIZER_GROUP}")
    indices = _children(f, fmt.PARAM_GROUPS_GROUP, path)
    for name in indices:
        if not name.isdigit():
            raise CheckpointError(f"{path}: unexpected object {fmt.PARAM_GROUPS_GROUP}/{name}")
    for i in range(len(indices)):
        gpath = fmt.param_group_path(i)
        if gpath not in f:
            raise CheckpointError(f"{path}: param groups are not numbered 0..{len(indices) - 1} ({gpath} missing)")
        g = f[gpath]
        hyper = {k: float(v) for k, v in g.attrs.items()}
        has_params = fmt.PARAM_NAMES_DATASET in g
        if has_params:
            m.datasets.append(f"{gpath}/{fmt.PARAM_NAMES_DATASET}")
        m.groups.append((hyper, has_params))
    for param in _children(f, fmt.OPTIMIZER_STATE_GROUP, path):
        keys = _children(f, f"{fmt.OPTIMIZER_STATE_GROUP}/{param}", path)
        m.state[param] = keys
        m.datasets += [f"{fmt.OPTIMIZER_STATE_GROUP}/{param}/{k}" for k in keys]
    if fmt.USER_GROUP in f:
        m.user = _children(f, fmt.USER_GROUP, path)
        m.datasets += [f"{fmt.USER_GROUP}/{k}" for k in m.user]
    if fmt.SCHEDULER_GROUP in f:
        s = f[fmt.SCHEDULER_GROUP]
        m.scheduler = {k: (v.decode() if isinstance(v, bytes) else (v if isinstance(v, str) else float(v)))
                       for k, v in s.attrs.items()}
    if fmt.META_GROUP in f:
        m.meta = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f[fmt.META_GROUP].attrs.items()}
    m.datasets += list(fmt.SCALARS) + [fmt.RNG_CPU]
    m.rng_cuda = fmt.RNG_CUDA in f
    if m.rng_cuda:
        m.datasets.append(fmt.RNG_CUDA)
    for d in m.datasets:
        if d not in f:
            raise CheckpointError(f"{path}: required dataset {d} is missing")
        if not isinstance(f[d], h5py.Dataset):
            raise CheckpointError(f"{path}: {d} is not a dataset")
    return m


def unexpected_objects(f, m):
    """Objects the layout does not allow (docs/FORMAT.md: a file is exactly what the writer wrote)."""
    expected = set(m.datasets)
    problems = []

    def visit(name, obj):
        p = "/" + name
        if isinstance(obj, h5py.Dataset):
            ok = p in expected
        else:
            parent = p.rsplit("/", 1)[0]
            ok = p in fmt.FIXED_GROUPS or parent in (fmt.PARAM_GROUPS_GROUP, fmt.OPTIMIZER_STATE_GROUP)
        if not ok:
            problems.append(f"{m.path}: unexpected object {p} (not in docs/FORMAT.md's layout)")
    f.visititems(visit)
    return problems


def dataset_dtype(f, path, dspath):
    """The h5ddp dtype of a dataset, checked against its HDF5 type; raises CheckpointError."""
    ds = f[dspath]
    for a in (fmt.ATTR_DTYPE, fmt.ATTR_CHECKSUM):
        if a not in ds.attrs:
            raise CheckpointError(f"{path}: dataset {dspath} lacks its {a} attribute")
    name = ds.attrs[fmt.ATTR_DTYPE]
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name not in fmt.DTYPE_NAMES:
        raise CheckpointError(f"{path}: dataset {dspath} has unknown dtype '{name}'")
    stored = ds.dtype
    ok = stored.kind == "S" if name == "string" else stored == fmt.NUMPY_DTYPES[name]
    if not ok:
        raise CheckpointError(f"{path}: dataset {dspath} has an HDF5 type ({stored}) that does not match its "
                              f"dtype {name}")
    return name


def _contiguous(a):
    """A C-contiguous array of the same shape (np.ascontiguousarray would turn a 0-d array into shape [1])."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy()


def _checksum_attr(ds):
    return int(np.uint64(ds.attrs[fmt.ATTR_CHECKSUM]))


def _mismatch(path, dspath, stored, computed):
    return CheckpointError(f"{path}: checksum mismatch in dataset {dspath} (stored {stored:#018x}, computed "
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
    return name, a


def verify_dataset(f, path, dspath):
    """Streams a dataset through XXH3 in bounded chunks; raises CheckpointError."""
    dataset_dtype(f, path, dspath)
    ds = f[dspath]
    h = xxhash.xxh3_64()
    try:
        if ds.ndim == 0 or ds.shape[0] == 0:
            h.update(_contiguous(ds[()]).reshape(-1).view(np.uint8))
        else:
            row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
            per = max(1, VERIFY_CHUNK_BYTES // row_bytes)
            for r in range(0, ds.shape[0], per):
                h.update(_contiguous(ds[r:r + per]).reshape(-1).view(np.uint8))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read dataset {dspath}, damaged or truncated ({e})") from None
    if h.intdigest() != _checksum_attr(ds):
        raise _mismatch(path, dspath, _checksum_attr(ds), h.intdigest())
