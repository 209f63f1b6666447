"""The cases of the conformance suite (test_format_rules.py): copies of a base checkpoint changed with h5py, each
with the verdict docs/FORMAT.md expects. Generated from the spec's tables (remove each required row, retype each
typed row, remove each optional row present) plus one or more hand-made changes per rule R1..R17 (RULE_CASES,
which must cover every rule the spec lists), valid changes and changes that make another model.

A change that rewrites data also rewrites the dataset's xxh3, so that only the rule under test can catch it."""
import os
import re
import shutil
import subprocess

import h5py
import numpy as np
import xxhash


class Case:
    """One changed copy and its expected verdict: valid, damaged (`needle` in both verifiers' output) or mismatch
    (another model; `loads` overrides the loaders' expected verdicts, e.g. only h5ddp-train compares /meta)."""

    def __init__(self, name, path, expect, needle="", loads=None):
        self.name, self.path, self.expect, self.needle = name, path, expect, needle
        default = {"valid": "OK", "damaged": "DAMAGED", "mismatch": "MISMATCH"}[expect]
        self.loads = dict({"cpp load": default, "py load": default}, **(loads or {}))

    def disagreements(self, got):
        out = []
        for judge in ("cpp verify", "py verify"):
            ok, text = got[judge]
            if ok != (self.expect != "damaged"):
                out.append(f"{self.name}: {judge} says {'valid' if ok else 'damaged'}: {text.strip()[:300]}")
            elif not ok and self.needle not in text:
                out.append(f"{self.name}: {judge} does not name {self.needle!r}: {text.strip()[:300]}")
        for judge, want in self.loads.items():
            verdict, text = got[judge]
            if verdict != want:
                out.append(f"{self.name}: {judge} says {verdict}, expected {want}: {text.strip()[:300]}")
        return out


def rehash(ds):
    a = np.ascontiguousarray(ds[()]) if ds.shape != () else np.array(ds[()])
    ds.attrs["xxh3"] = np.uint64(xxhash.xxh3_64_intdigest(a.reshape(-1).view(np.uint8).tobytes()))


def rewrite(f, path, data, dtype_name):
    """Replaces dataset `path` by `data` with dtype attribute `dtype_name` and a matching xxh3."""
    del f[path]
    ds = f.create_dataset(path, data=data)
    ds.attrs["dtype"] = dtype_name
    rehash(ds)
    return ds


def split(path):
    """(object path, attribute name or None) of a spec path like "/optimizer@type"."""
    obj, _, attr = path.partition("@")
    return obj or "/", attr or None


def first_model_key(f):
    return sorted(f["model"].keys())[0]


def first_state_param(f):
    return sorted(f["optimizer/state"].keys())[0]


def concrete(f, path):
    """The spec path with its placeholders filled from the file (None when the file has no such object)."""
    if path.startswith("<dataset>"):
        return "/model/" + first_model_key(f) + path[len("<dataset>"):]
    if "<" in path:
        return None
    obj, _ = split(path)
    return path if obj in f else None


# ---- table-generated changes -------------------------------------------------------------------------------

def remove(path):
    def change(f):
        obj, attr = split(path)
        if attr:
            del f[obj].attrs[attr]
        else:
            del f[obj]
    return change


WRONG_ATTR = {"string": np.int64(7), "int64": np.float64(1.5), "uint64": np.int64(3), "float64": "text"}


def retype(path, spec_type):
    """A change of the object's or attribute's type that keeps it self-consistent; None when the type has none."""
    obj, attr = split(path)
    if attr:
        return (lambda f: f[obj].attrs.__setitem__(attr, WRONG_ATTR[spec_type])) if spec_type in WRONG_ATTR else None
    if spec_type == "int64 scalar":
        return lambda f: rewrite(f, obj, np.int32(f[obj][()]), "int32")
    if spec_type == "uint64 scalar":
        return lambda f: rewrite(f, obj, np.int64(f[obj][()]), "int64")
    if spec_type == "uint8 matrix":
        return lambda f: rewrite(f, obj, f[obj][()].astype(np.int8), "int8")
    if spec_type == "strings":
        return lambda f: rewrite(f, obj, np.arange(len(f[obj])), "int64")
    if spec_type == "group":
        def group_to_dataset(f):
            del f[obj]
            rewrite_new = f.create_dataset(obj, data=np.zeros(2, np.float32))
            rewrite_new.attrs["dtype"] = "float32"
            rehash(rewrite_new)
        return group_to_dataset
    return None


def table_cases(rows, probe):
    """(name, change, expect, needle) for every row of the layout tables that applies to the file `probe`."""
    out = []
    for path, cells in rows:
        if not (path.startswith("/") or path.startswith("<dataset>")) or len(cells) < 4:
            continue
        spec_type, required = cells[1].strip("`"), cells[2]
        real = concrete(probe, path)
        if real is None:
            continue
        obj, attr = split(real)
        needle = attr if attr else obj
        if required == "yes":
            out.append((f"remove {real}", remove(real), "damaged", needle))
        elif required == "no":
            out.append((f"remove optional {real}", remove(real), "valid", ""))
        change = retype(real, spec_type)
        if change:
            out.append((f"retype {real} ({spec_type})", change, "damaged", needle))
    return out


# ---- one or more changes per rule ---------------------------------------------------------------------------

def _rename_param(f, old, new):
    """Renames parameter `old` to `new` in /model, every params list and /optimizer/state (consistently)."""
    f.move(f"model/{old}", f"model/{new}")
    for g in f["optimizer/param_groups"].values():
        if "params" in g:
            names = [n.decode() for n in g["params"][()]]
            if old in names:
                names = [new if n == old else n for n in names]
                width = max(len(n.encode()) for n in names)
                rewrite(f, g["params"].name, np.array([n.encode() for n in names], dtype=f"S{width}"), "string")
    if old in f["optimizer/state"]:
        f.move(f"optimizer/state/{old}", f"optimizer/state/{new}")


def _set_scalar(path, fn):
    def change(f):
        ds = f[path]
        ds[()] = fn(ds[()], f)
        rehash(ds)
    return change


def _add_name_to_params(f):
    ds = f["optimizer/param_groups/0/params"]
    names = list(ds[()]) + [b"ghost.weight"]
    rewrite(f, ds.name, np.array(names, dtype=f"S{max(len(n) for n in names)}"), "string")


def _r8_float_step(f):
    p = f"optimizer/state/{first_state_param(f)}/step"
    rewrite(f, p, np.float32(f[p][()]), "float32")


def _r7(f):
    p = f"optimizer/state/{first_state_param(f)}/exp_avg"
    flat = f[p][()].reshape(-1)
    rewrite(f, p, np.concatenate([flat, flat[:1]]), "float32")  # one element more than the parameter


def _r12(f):
    s = f["train/lr_scheduler"]
    s.attrs["type"] = "step"
    if "step_size" in s.attrs:
        del s.attrs["step_size"]


def _r17(f):
    path = "optimizer/param_groups/0/params"
    names = [n.decode() for n in f[path][()]]
    del f[path]
    new = f.create_dataset(path, data=names, dtype=h5py.string_dtype())
    new.attrs["dtype"] = "string"
    rehash_strings = np.array([n.encode() for n in names], dtype=object)
    new.attrs["xxh3"] = np.uint64(xxhash.xxh3_64_intdigest(b"".join(rehash_strings)))


def _r2(f):
    pass  # the change is the file's name (see make_cases)


def _one_element(path):
    """Attribute `path` ("/group@name") rewritten as a one-element array of the same type and value (R18)."""
    obj, attr = split(path)

    def change(f):
        if obj.startswith("<dataset>"):
            target = f[f"model/{first_model_key(f)}"]
        elif obj == "<group>":
            target = f["optimizer/param_groups/0"]
        else:
            target = f[obj]
        aid = target.attrs.get_id(attr)
        value = target.attrs[attr]
        del target.attrs[attr]
        target.attrs.create(attr, data=np.array([value]), dtype=aid.dtype)
    return change


def _bad_utf8_meta(f):
    f["meta"].attrs.create("note", data=np.bytes_(b"a\xffb"), dtype=h5py.string_dtype("utf-8", 3))


def _bad_utf8_meta_vlen(f):
    f["meta"].attrs.create("note", data=np.array(b"ab\xfe", dtype=object), dtype=h5py.string_dtype("utf-8"))


def _bad_utf8_name(f):
    ds = f["optimizer/param_groups/0/params"]
    names = list(ds[()])
    names[0] = names[0] + b"\xff"
    rewrite(f, ds.name, np.array(names, dtype=f"S{max(len(n) for n in names)}"), "string")


def _user_tensor(name, data, dtype_name):
    def change(f):
        ds = f.require_group("user").create_dataset(name, data=data)
        ds.attrs["dtype"] = dtype_name
        rehash(ds)
    return change


def _null_user(f):
    ds = f.require_group("user").create_dataset("nothing", data=h5py.Empty("<f4"))
    ds.attrs["dtype"] = "float32"
    ds.attrs["xxh3"] = np.uint64(xxhash.xxh3_64_intdigest(b""))


def _schedule(kind, **values):
    def change(f):
        s = f["train/lr_scheduler"]
        s.attrs["type"] = kind
        s.attrs["base_lr"] = 0.1
        for k, v in values.items():
            s.attrs[k] = float(v)
    return change


def _committed_type(f):
    f["named_float"] = np.dtype("<f4")


RULE_CASES = {
    "R1": [("/train/step one more than /@step", _set_scalar("train/step", lambda v, f: v + 1))],
    "R2": [("the file named for another step", _r2)],
    "R3": [("/rng/cpu with a row less", lambda f: rewrite(f, "rng/cpu", f["rng/cpu"][()][:-1], "uint8"))],
    "R4": [("a params list naming no /model key", _add_name_to_params)],
    "R5": [("state of a parameter no group lists",
            lambda f: f.move(f"optimizer/state/{first_state_param(f)}", "optimizer/state/ghost.weight"))],
    "R6": [("an Adam state without exp_avg_sq",
            lambda f: f.__delitem__(f"optimizer/state/{first_state_param(f)}/exp_avg_sq")),
           ("optimizer type rmsprop", lambda f: f["optimizer"].attrs.__setitem__("type", "rmsprop"))],
    "R7": [("exp_avg of another shape than its parameter", _r7)],
    "R8": [("an Adam step above /train/step",
            lambda f: _set_scalar(f"optimizer/state/{first_state_param(f)}/step", lambda v, g: v + 5)(f)),
           ("an Adam step stored as PyTorch's float32", _r8_float_step)],
    "R9": [("amsgrad 0.5", lambda f: f["optimizer/param_groups/0"].attrs.__setitem__("amsgrad", 0.5)),
           ("a param group without lr", lambda f: f["optimizer/param_groups/0"].attrs.__delitem__("lr"))],
    "R10": [("/data/position beyond /train/samples_consumed",
             _set_scalar("data/position", lambda v, f: f["train/samples_consumed"][()] + 1))],
    "R11": [("/train/epoch differs from /data/epoch", _set_scalar("train/epoch", lambda v, f: v + 1))],
    "R12": [("a step schedule without step_size", _r12)],
    "R13": [("a dtype attribute naming another dtype",
             lambda f: f[f"model/{first_model_key(f)}"].attrs.__setitem__("dtype", "float64"))],
    "R14": [("an unknown root attribute", lambda f: f.attrs.__setitem__("colour", "blue")),
            ("an unknown group", lambda f: f.create_group("extras"))],
    "R15": [("a /meta attribute that is not a string", lambda f: f["meta"].attrs.__setitem__("answer", np.int64(42)))],
    "R16": [("a module. prefix", lambda f: _rename_param(f, first_state_param(f), "module." + first_state_param(f)))],
    "R17": [("a params list of variable-length strings", _r17)],
    "R18": [(f"{p} as a one-element array", _one_element(p)) for p in
            ("/@world_size", "/@created", "<dataset>@dtype", "<dataset>@xxh3", "/optimizer@type", "<group>@lr")],
    "R19": [("a /meta string of invalid UTF-8 (fixed-length)", _bad_utf8_meta),
            ("a /meta string of invalid UTF-8 (variable-length)", _bad_utf8_meta_vlen),
            ("a params name of invalid UTF-8", _bad_utf8_name)],
    "R20": [("a soft link in /model", lambda f: f["model"].__setitem__("alias", h5py.SoftLink(
                f"/model/{first_model_key(f)}"))),
            ("an external link at the root", lambda f: f.__setitem__("elsewhere", h5py.ExternalLink("x.h5", "/")))],
    "R21": [("an H5S_NULL dataset in /user", _null_user)],
    "R22": [("a bool tensor holding 2", _user_tensor("flags", np.array([0, 2, 1], np.uint8), "bool"))],
    "R23": [("format_minor_version -1", lambda f: f.attrs.__setitem__("format_minor_version", np.int64(-1)))],
    "R24": [("a cosine schedule of total_steps 0", _schedule("cosine", total_steps=0)),
            ("a step schedule of step_size 0", _schedule("step", step_size=0, gamma=0.5)),
            ("warmup_steps -1", _schedule("constant", warmup_steps=-1)),
            ("base_lr inf", _schedule("constant", base_lr=float("inf")))],
}
RULE_CASES["R13"].append(("a strings dataset in /user", _user_tensor("names", np.array([b"ab"], "S2"), "string")))
RULE_CASES["R14"].append(("a committed datatype at the root", _committed_type))
# Byte damage (R22) in a /user tensor the C++ loading state does not track: the C++ loader compares first and calls
# the file another model; h5ddp_torch (no user= given) reads and returns every /user tensor, so it finds the damage
# (FORMAT.md "Loading").
LOADS = {"R22": {"cpp load": "MISMATCH"}}


def _newer_revision(f):
    f.attrs["format_minor_version"] = np.int64(99)
    f.attrs["colour"] = "blue"
    f.create_group("extras")


def _newer_revision_objects(f):
    """Unknown objects of a newer revision are ignored whole: no dtype or xxh3 needed, any dataspace, any link."""
    f.attrs["format_minor_version"] = np.int64(99)
    f.create_dataset(f"optimizer/state/{first_state_param(f)}/fisher", data=h5py.Empty("<f4"))
    f["extras/table"] = np.arange(3)
    f["model"][first_model_key(f)].attrs.create("origin", data=np.array(["a", "b"], dtype=h5py.string_dtype()))


def _rng_rows(f):
    """/rng/cpu rows of 100 bytes: valid (a row is its generator's bytes), but no PyTorch generator restores them."""
    rewrite(f, "rng/cpu", np.zeros((f["rng/cpu"].shape[0], 100), np.uint8), "uint8")


OTHER_CASES = [
    # h5ddp-load-verdict restores the generator (as a resume does); the suite's h5ddp_torch.load passes rng=False.
    ("/rng/cpu rows of another generator's length", _rng_rows, "mismatch", "", {"py load": "OK"}),
    ("a newer revision's unknown attribute and group", _newer_revision, "valid", "", None),
    ("a newer revision's unknown datasets, without attributes", _newer_revision_objects, "valid", "", None),
    ("an explicit format_minor_version 0", lambda f: f.attrs.__setitem__("format_minor_version", np.int64(0)),
     "valid", "", None),
    ("/@world_size big-endian (R18: little endian, 8 bytes)",
     lambda f: f.attrs.create("world_size", data=np.array(f.attrs["world_size"], dtype=">i8")), "damaged",
     "world_size", None),
    ("/@step as int32 (R18)", lambda f: f.attrs.create("step", data=np.int32(f.attrs["step"])), "damaged", "step",
     None),
    ("/@world_size with an H5S_NULL dataspace", lambda f: f.attrs.create("world_size", h5py.Empty("<i8")), "damaged",
     "world_size", None),
    ("a parameter renamed everywhere (another model)",
     lambda f: _rename_param(f, first_state_param(f), "renamed." + first_state_param(f)), "mismatch", "", None),
    ("/meta names another model (h5ddp-train compares it)",
     lambda f: f["meta"].attrs.__setitem__("model", "mlp"), "mismatch", "", {"py load": "OK"}),
]


def make_cases(rows, writer, base, out_dir):
    """Every case for one base file, written under out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    spec_rules = {path for path, _ in rows if re.fullmatch(r"R\d+", path)}
    missing = spec_rules - set(RULE_CASES)
    assert not missing, f"docs/FORMAT.md has rules without a conformance case: {sorted(missing)}"
    with h5py.File(base, "r") as probe:
        specs = table_cases(rows, probe)
        step = int(probe.attrs["step"])
    for rule, changes in sorted(RULE_CASES.items()):
        specs += [(f"{rule}: {name}", change, "damaged", rule, LOADS.get(rule)) for name, change in changes]
    cases = [Case(f"{writer}: unchanged", base, "valid")]
    for i, (name, change, expect, needle, *loads) in enumerate(specs + OTHER_CASES):
        file_name = f"ckpt-{step + 7:08d}.h5" if name.startswith("R2:") else f"case{i:03d}.h5"
        path = os.path.join(out_dir, f"{i:03d}", file_name)
        os.makedirs(os.path.dirname(path))
        shutil.copy(base, path)
        with h5py.File(path, "r+") as f:
            change(f)
        cases.append(Case(f"{writer}: {name}", path, expect, needle, loads[0] if loads else None))
    # Copies by h5repack stay valid: readers accept any layout and any superblock HDF5 reads (-L: the newest file
    # format, superblock 3; a chunked, deflated copy).
    for i, (name, flags) in enumerate((("h5repack copy", []), ("h5repack -L (superblock 3)", ["-L"]),
                                        ("h5repack chunked + deflate", ["-l", "CHUNK=4", "-f", "GZIP=1"]))):
        path = os.path.join(out_dir, f"repack{i}", f"repack{i}.h5")
        os.makedirs(os.path.dirname(path))
        subprocess.run(["h5repack", *flags, base, path], check=True, capture_output=True)
        cases.append(Case(f"{writer}: {name}", path, "valid"))
    return cases
