"""The one definition of a valid checkpoint (docs/FORMAT.md, version 1 revision 1): the required objects and
attributes with their types, the rules R1..R17, and unknown objects by revision. The verifier and the loader
both ask this module and check nothing of their own beyond what needs the bytes of every dataset: the checksums
(R13) as they read them, and R8/R10 on the values read (value_problems).

    check(f, path)                 -> Verdict: problems, notes, the datasets this reader knows, the revision
    value_problems(path, values)   -> problems of R8 and R10, values = {dataset path: numpy array}

Every problem is one line: the file's path, then "R<n>: " when a rule is broken, naming the object or attribute
involved (`/train/step`, `/@world_size`, `/optimizer/param_groups/0@lr`). Notes (objects a newer revision added,
which this reader ignores) have the same shape without a rule id."""
import math
import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from . import format as fmt
from .errors import first_line

READER_MINOR_VERSION = fmt.FORMAT_MINOR_VERSION

# Table "Groups and datasets": the children of each fixed group, name -> (kind, required). A kind is "group" or
# the type a dataset must have ("int64 scalar", "uint64 scalar", "uint8 matrix", "strings").
ROOT_LAYOUT = {"model": ("group", True), "optimizer": ("group", True), "train": ("group", True),
               "data": ("group", True), "rng": ("group", True), "meta": ("group", True), "user": ("group", False)}
OPTIMIZER_LAYOUT = {"param_groups": ("group", True), "state": ("group", True)}
PARAM_GROUP_LAYOUT = {fmt.PARAM_NAMES_DATASET: ("strings", False)}
TRAIN_LAYOUT = {"step": ("int64 scalar", True), "epoch": ("int64 scalar", True),
                "samples_consumed": ("int64 scalar", True), "lr_scheduler": ("group", True)}
DATA_LAYOUT = {"seed": ("uint64 scalar", True), "epoch": ("int64 scalar", True), "position": ("int64 scalar", True),
               "global_batch": ("int64 scalar", True)}
RNG_LAYOUT = {"cpu": ("uint8 matrix", True), "cuda": ("uint8 matrix", False)}

_NUMPY = {"int64": np.dtype("<i8"), "uint64": np.dtype("<u8"), "float64": np.dtype("<f8"), "uint8": np.dtype("u1")}
_TYPE_NAMES = {np.dtype(t): n for t, n in (
    ("<f4", "float32"), ("<f8", "float64"), ("<f2", "float16"), ("<i8", "int64"), ("<i4", "int32"),
    ("<i2", "int16"), ("i1", "int8"), ("u1", "uint8"), ("<u8", "uint64"), ("<u4", "uint32"), ("<u2", "uint16"))}


@dataclass
class Verdict:
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    datasets: list = field(default_factory=list)  # every dataset this reader knows (unknown ones excluded)
    bools: set = field(default_factory=set)       # those of dtype bool (R22 needs their bytes)
    minor: int = 0                                 # the file's format_minor_version (0 when absent)


def type_name(dtype, shape=()):
    """An HDF5 type (as h5py sees it) and a shape in FORMAT.md's words: 'int64', 'string', 'float32 [4, 3]'."""
    if h5py.check_string_dtype(dtype) is not None:
        base = "string"
    elif dtype.names is not None:
        base = "compound"
    else:
        base = _TYPE_NAMES.get(dtype, dtype.str)
    if shape is None:
        return f"{base} (empty dataspace)"
    return base if shape == () else f"{base} {list(shape)}"


def attr_path(obj_path, name):
    """`/@step`, `/optimizer@type`, `/optimizer/param_groups/0@lr`."""
    return f"/@{name}" if obj_path == "/" else f"{obj_path}@{name}"


def _has_type(dtype, shape, want):
    """Whether an attribute or dataset of `dtype` and `shape` is a `want` of FORMAT.md."""
    if want in ("string", "int64", "uint64", "float64"):
        want = want + " scalar"
    base, _, form = want.partition(" ")
    if base in ("string", "strings"):
        ok = h5py.check_string_dtype(dtype) is not None
    else:
        ok = dtype == _NUMPY[base]
    if form == "scalar":
        return ok and shape == ()
    if form == "matrix":
        return ok and shape is not None and len(shape) == 2
    return ok and shape is not None and len(shape) == 1  # strings: 1-D


def _utf8(value):
    """R19: whether an attribute's string value (bytes from a fixed-length string, str from a variable-length one,
    h5py keeping undecodable bytes as surrogates) is valid UTF-8."""
    try:
        if isinstance(value, (bytes, np.bytes_)):
            bytes(value).split(b"\0", 1)[0].decode("utf-8")
        else:
            str(value).encode("utf-8")
        return True
    except UnicodeError:
        return False


def _text(value):
    """An attribute's string value (h5py: str for variable-length, bytes for fixed-length strings)."""
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def decode_names(array):
    """The elements of a strings dataset: each element's bytes up to its first NUL, as UTF-8."""
    return [b if isinstance(b, str) else bytes(b).split(b"\0", 1)[0].decode("utf-8", "replace")
            for b in np.asarray(array).reshape(-1)]


def _kind_name(obj):
    if isinstance(obj, h5py.Group):
        return "group"
    if isinstance(obj, h5py.Dataset):
        return "dataset"
    return "named datatype"


def step_type_problem(dspath, dtype, shape):
    """R8's type half: Adam's `step` is an int64 scalar (the text of the problem, or None)."""
    if dtype == _NUMPY["int64"] and shape == ():
        return None
    return f"{dspath} has type {type_name(dtype, shape)}, FORMAT.md requires int64 scalar"


class _Check:
    """One walk over a file, collecting problems, notes and the datasets this reader knows."""

    def __init__(self, f, path, reader_minor):
        self.f, self.path, self.reader_minor = f, path, reader_minor
        self.v = Verdict()

    # ---- reporting
    def problem(self, text, rule=None):
        self.v.problems.append(f"{self.path}: R{rule}: {text}" if rule else f"{self.path}: {text}")

    def unknown(self, what, rule=14):
        """An object or attribute FORMAT.md does not list: damage (`rule`) unless the file's revision is newer."""
        if self.v.minor > self.reader_minor:
            self.v.notes.append(f"{self.path}: {what} is not in FORMAT.md revision {self.reader_minor} (the file is "
                                f"revision {self.v.minor}): ignored")
        else:
            self.problem(f"unknown {what}: FORMAT.md does not list it", rule)

    # ---- attributes
    def attr(self, obj, opath, name, want, rule=None, required=True):
        """The value of attribute `name` when it is a scalar of type `want` (string, int64, uint64, float64);
        None when it is missing or of another type (reported)."""
        where = attr_path(opath, name)
        if name not in obj.attrs:
            if required:
                self.problem(f"missing required attribute {where}", rule)
            return None
        aid = obj.attrs.get_id(name)
        if aid.shape not in ((), None) and _has_type(aid.dtype, (), want) and int(np.prod(aid.shape)) == 1:
            self.problem(f"{where} is a one-element array, FORMAT.md requires a scalar attribute", 18)
            return None
        if not _has_type(aid.dtype, aid.shape, want):
            self.problem(f"{where} has type {type_name(aid.dtype, aid.shape)}, FORMAT.md requires {want}", rule)
            return None
        value = obj.attrs[name]
        if want == "string" and not _utf8(value):
            self.problem(f"{where} is not valid UTF-8", 19)
            return None
        return _text(value) if want == "string" else (float(value) if want == "float64" else int(value))

    def extra_attrs(self, obj, opath, allowed, rule=14):
        for name in obj.attrs:
            if name not in allowed:
                self.unknown(f"attribute {attr_path(opath, name)}", rule)

    # ---- objects
    def children(self, group, gpath):
        """{name: object} of the objects linked from `group`; a soft or external link is a problem."""
        out = {}
        for name in group:
            p = f"{gpath.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):
                self.problem(f"{p} is a {'soft' if isinstance(link, h5py.SoftLink) else 'external'} link, "
                             "FORMAT.md requires a group or a dataset", 20)
                continue
            out[name] = group[name]
        return out

    def expect(self, group, gpath, layout, attrs=()):
        """The children of a fixed group against its layout: missing required ones, wrong kinds and types,
        unknown ones reported. Returns {name: object} of those present with the kind and type required."""
        found = {}
        self.extra_attrs(group, gpath, attrs)
        present = self.children(group, gpath)
        for name, obj in present.items():
            if name not in layout:
                self.unknown(f"object {gpath.rstrip('/')}/{name}")
        for name, (kind, required) in layout.items():
            p = f"{gpath.rstrip('/')}/{name}"
            obj = present.get(name)
            if obj is None:
                if required:
                    self.problem(f"missing required {'group' if kind == 'group' else 'dataset'} {p}")
                continue
            is_group = isinstance(obj, h5py.Group)
            if (kind == "group") != is_group or not isinstance(obj, (h5py.Group, h5py.Dataset)):
                self.problem(f"{p} has type {_kind_name(obj)}, FORMAT.md requires {kind}")
                continue
            if not is_group:
                self.dataset(obj, p)
                if not _has_type(obj.dtype, obj.shape, kind):
                    self.problem(f"{p} has type {type_name(obj.dtype, obj.shape)}, FORMAT.md requires {kind}")
                    continue
            found[name] = obj
        return found

    def dataset(self, ds, dpath):
        """Every dataset: exactly the attributes dtype and xxh3 (R14), its HDF5 type the one its dtype names (R13),
        a strings dataset as section "Strings" says (R17). Returns the dtype name, or None when it names none."""
        if ds.shape is None:
            self.problem(f"{dpath} has an empty (H5S_NULL) dataspace", 21)
            return None
        self.v.datasets.append(dpath)
        self.extra_attrs(ds, dpath, fmt.DATASET_ATTR_TYPES)
        self.attr(ds, dpath, fmt.ATTR_CHECKSUM, "uint64")
        name = self.attr(ds, dpath, fmt.ATTR_DTYPE, "string")
        if name is None:
            return None
        if name == "bool":
            self.v.bools.add(dpath)
        if name not in fmt.DTYPE_NAMES:
            self.problem(f"{attr_path(dpath, fmt.ATTR_DTYPE)} is {name!r}, not a dtype of FORMAT.md's table Dtypes", 13)
            return None
        if name == "string":
            if h5py.check_string_dtype(ds.dtype) is None:
                self.problem(f"{dpath} has HDF5 type {type_name(ds.dtype)}, its dtype string requires a string", 13)
            else:
                self.strings(ds, dpath)
        elif ds.dtype != fmt.NUMPY_DTYPES[name]:
            self.problem(f"{dpath} has HDF5 type {type_name(ds.dtype)}, but its dtype {name} is stored as "
                         f"{type_name(fmt.NUMPY_DTYPES[name])}", 13)
        return name

    def strings(self, ds, dpath):
        """R17: 1-D, fixed-length, NUL-padded, ASCII or UTF-8, width >= 1."""
        tid = ds.id.get_type()
        issues = []
        if ds.shape is None or len(ds.shape) != 1:
            issues.append(f"has shape {ds.shape if ds.shape is None else list(ds.shape)}")
        if tid.is_variable_str():
            issues.append("is variable-length")
        elif tid.get_strpad() != h5py.h5t.STR_NULLPAD:
            issues.append("is not NUL-padded")
        if tid.get_cset() not in (h5py.h5t.CSET_ASCII, h5py.h5t.CSET_UTF8):
            issues.append("has a character set other than ASCII or UTF-8")
        if not tid.is_variable_str() and tid.get_size() < 1:
            issues.append("has width 0")
        if issues:
            self.problem(f"strings dataset {dpath} {', '.join(issues)}: FORMAT.md requires 1-D, fixed-length, "
                         "NUL-padded, ASCII or UTF-8, width >= 1", 17)

    def tensors(self, group, gpath):
        """{name: (dtype name or None, shape)} of a group of tensors (/model, /user): datasets of any name."""
        self.extra_attrs(group, gpath, ())
        out = {}
        for name, obj in self.children(group, gpath).items():
            p = f"{gpath}/{name}"
            if not isinstance(obj, h5py.Dataset):
                self.problem(f"{p} has type {_kind_name(obj)}, FORMAT.md requires tensor")
                continue
            dtype = self.dataset(obj, p)
            if dtype == "string":
                self.problem(f"{p} is a strings dataset, FORMAT.md requires a tensor (any dtype but string)", 13)
            out[name] = (dtype, obj.shape)
        return out

    # ---- the file, part by part
    def header(self):
        """The format and version; False when the file is not one this reader can judge (nothing else checked)."""
        f = self.f
        aid = f.attrs.get_id(fmt.ATTR_FORMAT) if fmt.ATTR_FORMAT in f.attrs else None
        string = aid is not None and _has_type(aid.dtype, aid.shape, "string")
        name = _text(f.attrs[fmt.ATTR_FORMAT]) if string else None
        if name != fmt.FORMAT_NAME:
            what = "no attribute /@format" if aid is None else f"/@format {name!r}" if string else \
                f"a /@format of type {type_name(aid.dtype, aid.shape)}"
            self.problem(f"an HDF5 file but not an h5ddp checkpoint: it has {what} (FORMAT.md requires /@format "
                         f"{fmt.FORMAT_NAME!r})")
            return False
        version = self.attr(f, "/", fmt.ATTR_FORMAT_VERSION, "int64")
        if version is not None and version != fmt.FORMAT_VERSION:
            self.problem(f"/@{fmt.ATTR_FORMAT_VERSION} is {version}: this reader implements version "
                         f"{fmt.FORMAT_VERSION} only")
            return False
        minor = self.attr(f, "/", fmt.ATTR_FORMAT_MINOR_VERSION, "int64", required=False)
        if minor is not None and minor < 0:
            self.problem(f"/@{fmt.ATTR_FORMAT_MINOR_VERSION} is {minor}, FORMAT.md requires >= 0", 23)
        self.v.minor = minor if minor is not None and minor > 0 else 0
        return True

    def root(self):
        """The root attributes; returns {name: value} of those present with the right type."""
        values = {}
        for name, (want, required) in fmt.ROOT_ATTR_TYPES.items():
            if name not in (fmt.ATTR_FORMAT, fmt.ATTR_FORMAT_VERSION, fmt.ATTR_FORMAT_MINOR_VERSION):
                values[name] = self.attr(self.f, "/", name, want, required=required)
        return values

    def optimizer(self, g, model):
        kind = self.attr(g, fmt.OPTIMIZER_GROUP, fmt.ATTR_OPTIMIZER_TYPE, "string")
        if kind is not None and kind not in fmt.OPTIMIZER_TYPES:
            self.problem(f"R6: {attr_path(fmt.OPTIMIZER_GROUP, fmt.ATTR_OPTIMIZER_TYPE)} is {kind!r}: FORMAT.md "
                         "allows sgd, adam, adamw or '' (no optimizer)")
            kind = None
        kids = self.expect(g, fmt.OPTIMIZER_GROUP, OPTIMIZER_LAYOUT, attrs=(fmt.ATTR_OPTIMIZER_TYPE,))
        groups = self.param_groups(kids["param_groups"], kind) if "param_groups" in kids else []
        if model is not None:
            self.param_names(groups, model)
        if "state" in kids:
            self.state(kids["state"], kind, groups, model)

    def param_groups(self, g, kind):
        """[(index, amsgrad or None, [names] or None)] of /optimizer/param_groups/<i>, numbered 0, 1, ..."""
        self.extra_attrs(g, fmt.PARAM_GROUPS_GROUP, ())
        found = {}
        for name, obj in self.children(g, fmt.PARAM_GROUPS_GROUP).items():
            p = f"{fmt.PARAM_GROUPS_GROUP}/{name}"
            if not (name.isdigit() and str(int(name)) == name):
                self.unknown(f"object {p}")
            elif not isinstance(obj, h5py.Group):
                self.problem(f"{p} has type {_kind_name(obj)}, FORMAT.md requires group")
            else:
                found[int(name)] = obj
        if sorted(found) != list(range(len(found))):
            self.problem(f"{fmt.PARAM_GROUPS_GROUP} holds groups {sorted(found)}: FORMAT.md requires 0, 1, ... "
                         "with no gap")
        if kind == "" and found:
            self.problem(f"{fmt.param_group_path(min(found))} exists: an optimizer of type '' has no param groups", 6)
        return [(i, *self.param_group(found[i], fmt.param_group_path(i), kind)) for i in sorted(found)]

    def param_group(self, g, gpath, kind):
        """(amsgrad or None, [names] or None) of one param group; its hyperparameters (R9)."""
        hyper = self.hyperparameters(g, gpath, kind)
        kids = self.expect(g, gpath, PARAM_GROUP_LAYOUT, attrs=g.attrs.keys())
        ds = kids.get(fmt.PARAM_NAMES_DATASET)
        names = decode_names(ds[()]) if ds is not None else None
        if ds is not None and not all(_utf8(n) for n in np.asarray(ds[()]).reshape(-1)):
            self.problem(f"{gpath}/{fmt.PARAM_NAMES_DATASET} holds a name that is not valid UTF-8", 19)
        return (hyper["amsgrad"] == 1.0 if "amsgrad" in hyper else None), names

    def hyperparameters(self, g, gpath, kind):
        """R9: exactly the type's hyperparameters, each float64 and finite, nesterov/amsgrad 0.0 or 1.0 (another
        type's hyperparameter breaks R9 in any revision). Returns {name: value} of the valid ones."""
        want = fmt.HYPER_KEYS.get(kind, ()) if kind else ()
        for name in g.attrs:
            if name not in fmt.ALL_HYPER_KEYS:  # a name no type has: unknown (R14), ignored in a newer revision
                self.unknown(f"attribute {attr_path(gpath, name)}")
            elif kind and name not in want:
                self.problem(f"{attr_path(gpath, name)} is not a hyperparameter of {kind} "
                             f"({', '.join(want)})", 9)
        valid = {}
        for name in want:
            v = self.attr(g, gpath, name, "float64", rule=9)
            if v is None:
                continue
            if not math.isfinite(v):
                self.problem(f"{attr_path(gpath, name)} is {v}, FORMAT.md requires a finite float64", 9)
            elif name in fmt.BOOL_HYPER_KEYS and v not in (0.0, 1.0):
                self.problem(f"{attr_path(gpath, name)} is {v}, FORMAT.md requires 0.0 or 1.0", 9)
            else:
                valid[name] = v
        return valid

    def param_names(self, groups, model):
        """R4: every name of a params dataset is a /model key, none twice in all groups together."""
        seen = {}
        for i, _, names in groups:
            d = f"{fmt.param_group_path(i)}/{fmt.PARAM_NAMES_DATASET}"
            for n in names or ():
                if n not in model:
                    self.problem(f"{d} names {n!r}, which is not a key of {fmt.MODEL_GROUP}", 4)
                if n in seen:
                    self.problem(f"{d} names {n!r}, which {seen[n]} names too", 4)
                seen.setdefault(n, d)

    def state(self, g, kind, groups, model):
        """/optimizer/state/<p>: R5, R6, R7 and R8's type."""
        self.extra_attrs(g, fmt.OPTIMIZER_STATE_GROUP, ())
        amsgrad_of = {}
        for _, amsgrad, names in groups:
            for n in names or ():
                amsgrad_of.setdefault(n, amsgrad)
        for pname, obj in self.children(g, fmt.OPTIMIZER_STATE_GROUP).items():
            p = f"{fmt.OPTIMIZER_STATE_GROUP}/{pname}"
            if not isinstance(obj, h5py.Group):
                self.problem(f"{p} has type {_kind_name(obj)}, FORMAT.md requires group")
                continue
            if kind == "":
                self.problem(f"{p} exists: an optimizer of type '' has no state", 6)
                continue
            if pname not in amsgrad_of:
                self.problem(f"{p} is the state of a parameter that no param group's params names", 5)
            self.param_state(obj, p, kind, amsgrad_of.get(pname), (model or {}).get(pname))

    def param_state(self, g, gpath, kind, amsgrad, param):
        """The datasets of one parameter's state: exactly the type's (R6), dtype and shape of the parameter (R7),
        Adam's step an int64 scalar (R8). amsgrad None: the group's flag is unknown; param: (dtype, shape)."""
        self.extra_attrs(g, gpath, ())
        have = {}
        for key, obj in self.children(g, gpath).items():
            d = f"{gpath}/{key}"
            if key not in fmt.ALL_STATE_KEYS:  # a name no type has: R6, ignored in a newer revision
                self.unknown(f"object {d}", 6)
            elif not isinstance(obj, h5py.Dataset):
                self.problem(f"{d} has type {_kind_name(obj)}, FORMAT.md requires dataset")
            else:
                have[key] = (self.dataset(obj, d), obj)
        if kind is None:
            return
        need = fmt.required_state_keys(kind, bool(amsgrad))
        undecided = fmt.AMSGRAD_STATE_KEY if amsgrad is None and kind != "sgd" else None
        for key in need:
            if key not in have:
                self.problem(f"missing required dataset {gpath}/{key} (state of {kind}"
                             f"{', amsgrad 0' if kind != 'sgd' and amsgrad is False else ''})", 6)
        for key in have:
            if key not in need and key != undecided:
                amsgrad_note = " with amsgrad 0" if key == fmt.AMSGRAD_STATE_KEY else ""
                self.problem(f"{gpath}/{key} is not a state dataset of {kind}{amsgrad_note}", 6)
        for key, (dtype, ds) in have.items():
            d = f"{gpath}/{key}"
            if key == fmt.STEP_STATE_KEY:
                problem = step_type_problem(d, ds.dtype, ds.shape)
                if problem:
                    self.problem(problem, 8)
            elif key in fmt.FLOAT_STATE_KEYS and param is not None:
                self.like_param(d, dtype, ds.shape, gpath.rsplit("/", 1)[1], param)

    def like_param(self, d, dtype, shape, pname, param):
        """R7: a float state dataset has the dtype and shape of /model/<p>."""
        mpath = f"{fmt.MODEL_GROUP}/{pname}"
        pdtype, pshape = param
        if shape != pshape:
            self.problem(f"{d} has shape {_shape(shape)}, {mpath} has {_shape(pshape)}", 7)
        elif dtype is not None and pdtype is not None and dtype != pdtype:
            self.problem(f"{d} has dtype {dtype}, {mpath} has {pdtype}", 7)

    def scheduler(self, g):
        """R12: a string type; the required attributes of a type of table Schedules; every other one float64."""
        gpath = fmt.SCHEDULER_GROUP
        self.expect(g, gpath, {}, attrs=g.attrs.keys())
        kind = self.attr(g, gpath, fmt.ATTR_SCHEDULER_TYPE, "string", rule=12)
        for name in fmt.SCHEDULE_REQUIRED.get(kind, ()):
            if name not in g.attrs:
                self.problem(f"missing required attribute {attr_path(gpath, name)} (schedule {kind})", 12)
        for name in g.attrs:
            if name != fmt.ATTR_SCHEDULER_TYPE:
                value = self.attr(g, gpath, name, "float64", rule=12)
                if value is not None and kind in fmt.SCHEDULE_REQUIRED:
                    self.schedule_value(attr_path(gpath, name), name, value)

    def schedule_value(self, where, name, v):
        """R24: finite base_lr, gamma, step_size, total_steps, warmup_steps; step_size and total_steps >= 1,
        warmup_steps >= 0 (the types of table Schedules; another type's attributes are its writer's)."""
        if name in ("base_lr", "gamma", "step_size", "total_steps", "warmup_steps") and not math.isfinite(v):
            self.problem(f"{where} is {v}, FORMAT.md requires a finite value", 24)
        elif name in ("step_size", "total_steps") and v < 1:
            self.problem(f"{where} is {v}, FORMAT.md requires >= 1", 24)
        elif name == "warmup_steps" and v < 0:
            self.problem(f"{where} is {v}, FORMAT.md requires >= 0", 24)

    def meta(self, g):
        """R15: every /meta attribute is a string."""
        self.expect(g, fmt.META_GROUP, {}, attrs=g.attrs.keys())
        for name in g.attrs:
            self.attr(g, fmt.META_GROUP, name, "string", rule=15)

    def rng(self, g, world_size):
        """R3: world_size rows in /rng/cpu and /rng/cuda, a row of /rng/cuda not empty."""
        kids = self.expect(g, fmt.RNG_GROUP, RNG_LAYOUT)
        for name, ds in kids.items():
            p = f"{fmt.RNG_GROUP}/{name}"
            if world_size is not None and ds.shape[0] != world_size:
                self.problem(f"{p} has {ds.shape[0]} rows, /@{fmt.ATTR_WORLD_SIZE} is {world_size}", 3)
            if name == "cuda" and ds.shape[1] == 0:
                self.problem(f"{p} has rows of 0 bytes: FORMAT.md requires n > 0 (or no {p})", 3)

    def run(self):
        if not self.header():
            return
        f = self.f
        root = self.root()
        attrs = tuple(fmt.ROOT_ATTR_TYPES)
        kids = self.expect(f, "/", ROOT_LAYOUT, attrs=attrs)
        model = self.tensors(kids["model"], fmt.MODEL_GROUP) if "model" in kids else None
        for key in model or ():
            if key.startswith("module."):
                self.problem(f"{fmt.MODEL_GROUP}/{key}: a /model key starts with 'module.'", 16)
        if "optimizer" in kids:
            self.optimizer(kids["optimizer"], model)
        train = self.expect(kids["train"], fmt.TRAIN_GROUP, TRAIN_LAYOUT) if "train" in kids else {}
        if "lr_scheduler" in train:
            self.scheduler(train["lr_scheduler"])
        data = self.expect(kids["data"], fmt.DATA_GROUP, DATA_LAYOUT) if "data" in kids else {}
        world_size = root.get(fmt.ATTR_WORLD_SIZE)
        if world_size is not None and world_size < 1:
            self.problem(f"/@{fmt.ATTR_WORLD_SIZE} is {world_size}, FORMAT.md requires >= 1", 3)
        if "rng" in kids:
            self.rng(kids["rng"], world_size)
        if "meta" in kids:
            self.meta(kids["meta"])
        if "user" in kids:
            self.tensors(kids["user"], fmt.USER_GROUP)
        self.counters(root.get(fmt.ATTR_STEP), train, data)

    def counters(self, step, train, data):
        """R1 (/@step = /train/step), R2 (the step of a file named ckpt-<digits>.h5), R11 (the two epochs)."""
        train_step = int(train["step"][()]) if "step" in train else None
        if step is not None and train_step is not None and step != train_step:
            self.problem(f"/@{fmt.ATTR_STEP} is {step}, {fmt.TRAIN_STEP} is {train_step}", 1)
        named = fmt.checkpoint_step_from_name(os.path.basename(self.path))
        if step is not None and named >= 0 and step != named:
            self.problem(f"/@{fmt.ATTR_STEP} is {step}, the file name says step {named}", 2)
        if "epoch" in train and "epoch" in data:
            a, b = int(train["epoch"][()]), int(data["epoch"][()])
            if a != b:
                self.problem(f"{fmt.TRAIN_EPOCH} is {a}, {fmt.DATA_EPOCH} is {b}", 11)


def _shape(shape):
    return "an empty dataspace" if shape is None else str(list(shape))


def check(f, path, reader_minor=READER_MINOR_VERSION):
    """The Verdict on an open file: everything checkable without reading the tensors (the required objects and
    attributes and their types, R1-R7, R9, R11-R17 and R8's type; not the checksums, nor R8/R10's values)."""
    c = _Check(f, path, reader_minor)
    try:
        c.run()
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        c.problem(f"damaged or truncated: cannot be read ({first_line(e)})")
    return c.v


def is_adam_step(dspath):
    """Whether a dataset path is /optimizer/state/<p>/step."""
    head, _, key = dspath.rpartition("/")
    return key == fmt.STEP_STATE_KEY and head.rpartition("/")[0] == fmt.OPTIMIZER_STATE_GROUP


def value_datasets(datasets):
    """The datasets whose values value_problems needs, of a list of dataset paths."""
    return [d for d in datasets if d in fmt.COUNTERS or is_adam_step(d)]


def value_problems(path, values):
    """R8 and R10 on the values read: `values` maps dataset paths to numpy arrays (those absent are not judged;
    counters and Adam steps of a type other than int64 scalar neither: check() reports those)."""
    out = []

    def counter(p):
        a = values.get(p)
        return int(a[()]) if a is not None and a.dtype == _NUMPY["int64"] and a.shape == () else None

    for p in fmt.COUNTERS:
        v = counter(p)
        if v is not None and v < 0:
            out.append(f"{path}: R10: {p} is {v}, FORMAT.md requires >= 0")
    position, consumed = counter(fmt.DATA_POSITION), counter(fmt.TRAIN_SAMPLES_CONSUMED)
    if position is not None and consumed is not None and position > consumed:
        out.append(f"{path}: R10: {fmt.DATA_POSITION} is {position}, more than {fmt.TRAIN_SAMPLES_CONSUMED} "
                   f"{consumed}")
    step = counter(fmt.TRAIN_STEP)
    for p, a in values.items():
        if not is_adam_step(p):
            continue
        if step_type_problem(p, a.dtype, a.shape):
            continue
        if int(a[()]) < 0 or (step is not None and int(a[()]) > step):
            out.append(f"{path}: R8: {p} is {int(a[()])}, FORMAT.md requires 0 <= step <= {fmt.TRAIN_STEP} "
                       f"({step})")
    return out
