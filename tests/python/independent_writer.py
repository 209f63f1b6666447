"""An independent minimal writer (and plain reader) of h5ddp checkpoints, written from docs/FORMAT.md ALONE.

Issue 45: the point of this module is to prove that docs/FORMAT.md (revision 1.1) is enough to write a file that
`h5ddp-ckpt verify`, `h5ddp_torch.verify` and `h5ddp-train --resume` accept. It was written from that document
only: none of python/h5ddp_torch/, src/, include/ or tools/ was read, no code was copied from anywhere, and it
uses only h5py, numpy and xxhash (serial h5py, one process). Where the text is ambiguous or silent, the gap is
listed here with the choice made, instead of being settled by reading the sources.

Spec gaps found (section of docs/FORMAT.md: the gap -> the choice made here):
 1. Terms: "contiguous layout, no filters, no fill values required" and the version bounds `[earliest, v18]`
    are stated without MUST and no rule R1..R17 covers them: is a chunked or compressed dataset, or a file
    needing HDF5 1.10, damage? "no fill values required" does not say whether a fill value may be set.
    -> h5py defaults (contiguous, no filter, default fill); libver=("earliest", "v108") (h5py's name for v18).
 2. Dtypes / "tensor": a tensor is "a dataset of any dtype of table Dtypes", and that table includes `string`:
    may a /model or /user dataset have dtype `string`? -> strings are written only as `params`.
 3. Dtypes: `float16` gives bit positions and bias but not the normalisation (implied leading bit) nor the
    padding of the custom HDF5 float type. -> h5py's mapping of numpy float16.
 4. Dtypes: bfloat16 "shares" its HDF5 type "with uint16-like bits", but there is no uint16 dtype; the sentence
    "Two dtypes share an HDF5 type with another" is hard to parse. -> bfloat16 as H5T_STD_U16LE, as the row says.
 5. Optimizers: is a param group's `lr` the base lr or the lr of the next step when a schedule is present
    (the schedule has `base_lr`, and `lr` "informative")? A writer building a file from its own state cannot
    tell which to store. -> the caller's value, copied unchanged.
 6. Random generators: `/rng/cpu` "n MAY be 0 (no state saved)", but the section does not say what a rank
    r < W does on resume when its row is empty (seed as a rank r >= W does?). -> the caller's rows, unchanged.
 7. Schedules: `last_epoch`, `lr` and `warmup_steps` are optional; whether h5ddp-train continues a schedule at
    the same lr when `last_epoch` is absent (from /train/step?) is not said; `none` and `` both mean no
    schedule, with no preferred spelling. -> the caller's attributes; type "none" when the caller gives none.
 8. Groups and datasets: `/user` is "absent when there are none", but no rule says whether an empty `/user`
    group is valid or damage. -> never written empty.
 9. Meta: `optimizer` and `torch_version` are "written by all writers" yet "no entry is required": is a writer
    without them conforming? -> written only when the caller's meta has them (from_file copies them).
10. Files and the commit protocol: the steps are those of h5ddp's MPI-IO save; which of them (`latest`,
    retention, stale .partial removal) a single-process third-party writer must perform is not said.
    -> <path>.partial, close, fsync, rename, fsync the directory; `latest` only when asked (latest=True).

State (the plain dict write() takes and from_file() returns; a tensor is (h5ddp dtype name, numpy array)):
  model {key: tensor}; optimizer_type str; param_groups [(hyper {name: float}, [param names])];
  optimizer_state {param: {name: tensor}} (Adam's "step" is ("int64", 0-d array));
  counters {step, epoch, samples_consumed}; data {seed, epoch, position, global_batch};
  rng {"cpu": uint8 [world, n], "cuda": uint8 [world, n] (optional)}; scheduler {"type": str, name: float};
  meta {str: str}; user {name: tensor}; torch_version str (optional, default "unknown").
"""
import os
import time

import h5py
import numpy as np
import xxhash

REVISION = 2  # the format_minor_version this writer implements
WRITER = "independent_writer 1.0 (h5ddp tests/python, from docs/FORMAT.md)"
LIBVER = ("earliest", "v108")
# h5ddp dtype name -> numpy dtype whose h5py mapping is the HDF5 file type of table "Dtypes".
DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2", "int64": "<i8",
          "int32": "<i4", "int16": "<i2", "int8": "i1", "uint8": "u1", "uint64": "<u8", "bool": "u1"}
ADAM = ("lr", "betas0", "betas1", "eps", "weight_decay", "amsgrad")
HYPERS = {"sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov"), "adam": ADAM, "adamw": ADAM, "": ()}
VLEN_UTF8 = h5py.string_dtype("utf-8")


def _str_attr(obj, name, value):
    obj.attrs.create(name, str(value), dtype=VLEN_UTF8)


def _int_attr(obj, name, value):
    obj.attrs.create(name, np.int64(value), dtype="<i8")


def _fixed_strings(names):
    """1-D fixed-length, NUL-padded elements of the names' UTF-8 bytes, width = the longest one (at least 1);
    character set ASCII when every name is ASCII, else UTF-8 (section "Strings" allows either)."""
    raw = [str(n).encode("utf-8") for n in names]
    if any(b"\0" in r for r in raw):
        raise ValueError(f"a name holds a NUL byte: {names}")
    width = max([1] + [len(r) for r in raw])
    charset = "ascii" if all(r.isascii() for r in raw) else "utf-8"
    return np.array(raw, dtype=h5py.string_dtype(charset, width))


def _dataset(parent, name, dtype, array):
    """One dataset of h5ddp dtype `dtype`, with exactly its `dtype` and `xxh3` attributes (section "Every
    dataset"); the hash covers the C-order little-endian bytes of the HDF5 type."""
    if dtype == "string":
        data = _fixed_strings(array)
    elif dtype in DTYPES:
        data = np.asarray(array)
        if dtype == "bool" and not np.isin(data, (0, 1)).all():
            raise ValueError(f"{name}: a bool tensor holds values other than 0 and 1")
        data = data.astype(DTYPES[dtype], order="C")  # keeps shape [] (np.ascontiguousarray would not)
    else:
        raise ValueError(f"{name}: unknown h5ddp dtype {dtype!r}")
    ds = parent.create_dataset(name, data=data)  # contiguous, no filters
    _str_attr(ds, "dtype", dtype)
    ds.attrs.create("xxh3", np.uint64(xxhash.xxh3_64_intdigest(data.tobytes())), dtype="<u8")


def _tensors(group, tensors):
    for key, (dtype, array) in tensors.items():
        _dataset(group, key, dtype, array)


def _root(f, state):
    """Root attributes (section "Root attributes"); world_size is the number of /rng/cpu rows."""
    _str_attr(f, "format", "h5ddp-checkpoint")
    _int_attr(f, "format_version", 1)
    _int_attr(f, "format_minor_version", REVISION)
    _str_attr(f, "h5ddp_version", WRITER)
    _str_attr(f, "torch_version", state.get("torch_version", "unknown"))
    _str_attr(f, "created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    _int_attr(f, "world_size", np.asarray(state["rng"]["cpu"]).shape[0])
    _int_attr(f, "step", state["counters"]["step"])


def _optimizer(f, state):
    """/optimizer: type, param groups 0..n-1 (float64 hyperparameters, `params` names), state by name."""
    kind = state["optimizer_type"]
    if kind not in HYPERS:
        raise ValueError(f"unknown optimizer type {kind!r}")
    opt = f.create_group("optimizer")
    _str_attr(opt, "type", kind)
    groups = opt.create_group("param_groups")
    for i, (hyper, names) in enumerate(state["param_groups"]):
        if set(hyper) != set(HYPERS[kind]):
            raise ValueError(f"param group {i}: hyperparameters {sorted(hyper)}, {kind!r} has {HYPERS[kind]}")
        g = groups.create_group(str(i))
        for k in HYPERS[kind]:
            g.attrs.create(k, np.float64(hyper[k]), dtype="<f8")
        if names:
            _dataset(g, "params", "string", names)
    per_param = opt.create_group("state")
    for p, tensors in state["optimizer_state"].items():
        _tensors(per_param.create_group(p), tensors)


def _counters(f, state):
    """/train (counters, schedule) and /data (sampler position)."""
    train = f.create_group("train")
    for k in ("step", "epoch", "samples_consumed"):
        _dataset(train, k, "int64", state["counters"][k])
    sched = train.create_group("lr_scheduler")
    _str_attr(sched, "type", state["scheduler"].get("type", "none"))
    for k, v in state["scheduler"].items():
        if k != "type":
            sched.attrs.create(k, np.float64(v), dtype="<f8")
    data = f.create_group("data")
    _dataset(data, "seed", "uint64", state["data"]["seed"])
    for k in ("epoch", "position", "global_batch"):
        _dataset(data, k, "int64", state["data"][k])


def _rest(f, state):
    """/model, /rng, /meta, and /user when the caller has tensors of its own."""
    _tensors(f.create_group("model"), state["model"])
    rng = f.create_group("rng")
    for k in ("cpu", "cuda"):
        if state["rng"].get(k) is not None:
            _dataset(rng, k, "uint8", state["rng"][k])
    meta = f.create_group("meta")
    for k, v in state.get("meta", {}).items():
        _str_attr(meta, k, v)
    if state.get("user"):
        _tensors(f.create_group("user"), state["user"])


def _fsync(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path, state, latest=False):
    """Writes `state` as the checkpoint `path`: `<path>.partial`, closed, fsynced, renamed to `path` (the commit
    point), directory fsynced; with latest=True the directory's `latest` then names it (tmp, fsync, rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    partial = path + ".partial"
    with h5py.File(partial, "w", libver=LIBVER) as f:
        _root(f, state)
        _rest(f, state)
        _optimizer(f, state)
        _counters(f, state)
    _fsync(partial)
    os.rename(partial, path)
    _fsync(directory, directory=True)
    if latest:
        tmp = os.path.join(directory, "latest.tmp")
        with open(tmp, "w") as out:
            out.write(os.path.basename(path) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp, os.path.join(directory, "latest"))
        _fsync(directory, directory=True)


def _text(value):
    """A string attribute's value, variable- or fixed-length, ASCII or UTF-8."""
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8")
    if isinstance(value, np.ndarray):
        return _text(value[()])
    return str(value)


def _read_tensors(group):
    out = {}
    for name, ds in group.items():
        array = np.empty(ds.shape, ds.dtype) if ds.size == 0 else np.asarray(ds[()])
        out[name] = (_text(ds.attrs["dtype"]), array)
    return out


def _read_groups(groups):
    out = []
    for i in range(len(groups)):
        g = groups[str(i)]
        names = [_text(b) for b in g["params"][()]] if "params" in g else []
        out.append(({k: float(v) for k, v in g.attrs.items()}, names))
    return out


def from_file(path):
    """The state dict (values only, no checks) of any h5ddp checkpoint, read with plain h5py."""
    with h5py.File(path, "r") as f:
        sched = f["train/lr_scheduler"].attrs
        rng = {k: np.asarray(f["rng"][k][()]) for k in ("cpu", "cuda") if k in f["rng"]}
        return {
            "model": _read_tensors(f["model"]),
            "optimizer_type": _text(f["optimizer"].attrs["type"]),
            "param_groups": _read_groups(f["optimizer/param_groups"]),
            "optimizer_state": {p: _read_tensors(g) for p, g in f["optimizer/state"].items()},
            "counters": {k: int(f["train"][k][()]) for k in ("step", "epoch", "samples_consumed")},
            "data": {k: int(f["data"][k][()]) for k in ("seed", "epoch", "position", "global_batch")},
            "rng": rng,
            "scheduler": {k: (_text(v) if k == "type" else float(v)) for k, v in sched.items()},
            "meta": {k: _text(v) for k, v in f["meta"].attrs.items()},
            "user": _read_tensors(f["user"]) if "user" in f else {},
            "torch_version": _text(f.attrs["torch_version"]),
        }
