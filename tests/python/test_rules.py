"""h5ddp_torch's one definition of validity (python/h5ddp_torch/rules.py, docs/FORMAT.md 1.1), in one process
without MPI: small files written by h5ddp_torch.save are valid; each rule R1..R17 broken in a copy (the checksum
rewritten where the bytes change, so that only the rule is broken) gives a one-line problem naming the file, the
object or attribute and the rule id, and a load refuses it as damaged (CheckpointError, never
CheckpointMismatchError) even into a model it fits; a resume falls back past it. A file of a newer revision with
objects this reader does not know is valid with notes and loads; the same objects in a revision-1 file are
damage. Only a valid file is another model. The writer refuses state that would break a rule."""
import contextlib
import io
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np
import torch
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import h5ddp_torch  # noqa: E402
from h5ddp_torch import rules  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, hidden=3):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, hidden)
        self.fc2 = torch.nn.Linear(hidden, 2)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def adam_for(net):
    return torch.optim.Adam([{"params": [net.fc1.weight, net.fc1.bias]},
                             {"params": [net.fc2.weight, net.fc2.bias], "lr": 1e-2}], lr=1e-3, amsgrad=True)


def write_files(d):
    """(adam file at step 2, sgd file at step 1), written by h5ddp_torch.save in this one process."""
    torch.manual_seed(0)
    net = Net()
    opt = adam_for(net)
    for _ in range(2):
        net(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    data = h5ddp_torch.DataState(seed=3, epoch=0, position=10, global_batch=5)
    sched = {"type": "constant", "base_lr": 1e-3, "warmup_steps": 0}
    adam = h5ddp_torch.save(os.path.join(d, "adam"), net, opt, step=2, data=data, scheduler=sched, fsync=False,
                            user={"ema": torch.ones(2, 2), "n": 7}, meta={"model": "net"}).path
    sgd_net = Net()
    sgd = torch.optim.SGD(sgd_net.parameters(), lr=0.1, momentum=0.9)
    sgd_net(torch.randn(5, 4)).sum().backward()
    sgd.step()
    sgd_path = h5ddp_torch.save(os.path.join(d, "sgd"), sgd_net, sgd, step=1, fsync=False,
                                data=h5ddp_torch.DataState(3, 0, 5, 5)).path
    return adam, sgd_path


def put(f, dpath, array, name=None, **kwargs):
    """(Re)creates a dataset with its dtype attribute `name` (default: the old one) and a matching checksum, so
    that only what a test means breaks."""
    if dpath in f:
        name = name or f[dpath].attrs["dtype"]
        del f[dpath]
    ds = f.create_dataset(dpath, data=array, **kwargs)
    ds.attrs["dtype"] = name
    raw = np.ascontiguousarray(ds[()]) if ds.dtype.kind != "O" else np.zeros(0, np.uint8)
    ds.attrs["xxh3"] = np.uint64(xxhash.xxh3_64_intdigest(raw.tobytes()))


def names(*items):
    return np.array([n.encode() for n in items], dtype=f"S{max(len(n) for n in items)}")


S = "/optimizer/state"
G0 = "/optimizer/param_groups/0"

# (what, which file, mutation of the open copy, the rule id or None, a needle the problem must contain)
CASES = [
    ("missing dataset", "adam", lambda f: f.__delitem__("train/step"), None, "missing required dataset /train/step"),
    ("missing attribute", "adam", lambda f: f.attrs.__delitem__("world_size"), None,
     "missing required attribute /@world_size"),
    ("wrong type", "adam", lambda f: f.attrs.__setitem__("step", np.int32(2)), None,
     "/@step has type int32, FORMAT.md requires int64"),
    ("R2", "adam", lambda f: None, 2, "/@step"),  # the copy is named ckpt-00000009.h5
    ("R1", "adam-r1", lambda f: f.attrs.__setitem__("step", np.int64(5)), 1, "/train/step"),
    ("R3 world size", "adam", lambda f: f.attrs.__setitem__("world_size", np.int64(2)), 3, "/rng/cpu"),
    ("R3 cuda", "adam", lambda f: put(f, "/rng/cuda", np.zeros((1, 0), np.uint8), "uint8"), 3, "/rng/cuda"),
    ("R4", "adam", lambda f: put(f, G0 + "/params", names("fc1.weight", "nope")), 4, G0 + "/params"),
    ("R4 twice", "adam", lambda f: put(f, G0 + "/params", names("fc1.weight", "fc1.bias", "fc2.bias")), 4,
     "fc2.bias"),
    ("R5", "adam", lambda f: put(f, G0 + "/params", names("fc1.weight")), 5, S + "/fc1.bias"),
    ("R6 missing", "adam", lambda f: f.__delitem__(S + "/fc1.weight/exp_avg_sq"), 6, S + "/fc1.weight/exp_avg_sq"),
    ("R6 amsgrad", "adam", lambda f: f[G0].attrs.__setitem__("amsgrad", 0.0), 6, S + "/fc1.weight/max_exp_avg_sq"),
    ("R6 sgd key", "adam", lambda f: put(f, S + "/fc1.bias/momentum_buffer", np.zeros(3, np.float32), "float32"),
     6, S + "/fc1.bias/momentum_buffer"),
    ("R6 no optimizer", "adam", lambda f: f["optimizer"].attrs.__setitem__("type", ""), 6, G0),
    ("R7", "adam", lambda f: put(f, S + "/fc1.weight/exp_avg", np.zeros(3, np.float32)), 7,
     f"{S}/fc1.weight/exp_avg has shape [3], /model/fc1.weight has [3, 4]"),
    ("R7 dtype", "adam", lambda f: put(f, S + "/fc1.bias/exp_avg", np.zeros(3, np.float64), "float64"), 7,
     S + "/fc1.bias/exp_avg"),
    ("R8 value", "adam", lambda f: put(f, S + "/fc2.bias/step", np.int64(3)), 8, S + "/fc2.bias/step"),
    ("R8 type", "adam", lambda f: put(f, S + "/fc2.bias/step", np.float32(2), "float32"), 8, S + "/fc2.bias/step"),
    ("R9 nan", "adam", lambda f: f[G0].attrs.__setitem__("lr", np.nan), 9, G0 + "@lr"),
    ("R9 missing", "adam", lambda f: f[G0].attrs.__delitem__("eps"), 9, "missing required attribute " + G0 + "@eps"),
    ("R9 other type's", "adam", lambda f: f[G0].attrs.__setitem__("momentum", 0.9), 9, G0 + "@momentum"),
    ("R9 float32", "adam", lambda f: f[G0].attrs.__setitem__("eps", np.float32(1e-8)), 9, G0 + "@eps"),
    ("R9 nesterov", "sgd", lambda f: f[G0].attrs.__setitem__("nesterov", 0.5), 9, G0 + "@nesterov"),
    ("R10 position", "adam", lambda f: put(f, "/data/position", np.int64(11)), 10, "/data/position"),
    ("R10 negative", "adam", lambda f: put(f, "/data/global_batch", np.int64(-1)), 10, "/data/global_batch"),
    ("R11", "adam", lambda f: put(f, "/train/epoch", np.int64(1)), 11, "/data/epoch"),
    ("R12 required", "adam", lambda f: f["train/lr_scheduler"].attrs.__delitem__("base_lr"), 12,
     "/train/lr_scheduler@base_lr"),
    ("R12 type", "adam", lambda f: f["train/lr_scheduler"].attrs.__setitem__("warmup_steps", "0"), 12,
     "/train/lr_scheduler@warmup_steps"),
    ("R13 type", "adam", lambda f: f["model/fc2.bias"].attrs.__setitem__("dtype", "float64"), 13, "/model/fc2.bias"),
    ("R13 checksum", "adam", lambda f: f["model/fc2.bias"].attrs.__setitem__("xxh3", np.uint64(1)), 13,
     "checksum mismatch in dataset /model/fc2.bias"),
    ("R14 object", "adam", lambda f: put(f, "/train/extra", np.int64(0), "int64"), 14, "/train/extra"),
    ("R14 attribute", "adam", lambda f: f["model/fc1.bias"].attrs.__setitem__("unit", "m"), 14,
     "/model/fc1.bias@unit"),
    ("R14 group attribute", "adam", lambda f: f["data"].attrs.__setitem__("x", 1.0), 14, "/data@x"),
    ("R15", "adam", lambda f: f["meta"].attrs.__setitem__("hidden", np.int64(3)), 15, "/meta@hidden"),
    ("R16", "adam", lambda f: f.move("model/fc1.bias", "model/module.fc1.bias"), 16, "/model/module.fc1.bias"),
    ("R17", "adam", lambda f: put(f, G0 + "/params", ["fc1.weight", "fc1.bias"], "string",
                                  dtype=h5py.string_dtype()), 17, G0 + "/params"),
]


def broken_copy(src, d, tag, mutate):
    name = "ckpt-00000009.h5" if tag == "R2" else f"{tag.replace(' ', '_')}.h5"
    path = os.path.join(d, "cases", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shutil.copy(src, path)
    with h5py.File(path, "r+") as f:
        mutate(f)
    return path


def expect_damaged(path, rule, needle, make):
    problems = h5ddp_torch.verify(path)
    assert problems, f"{path}: no problem found"
    for p in problems:
        assert "\n" not in p and p.startswith(path + ": "), p
    hits = [p for p in problems if needle in p and (rule is None or f"R{rule}: " in p)]
    assert hits, f"{path}: no problem with R{rule} and {needle!r}: {problems}"
    net, opt = make()
    try:
        h5ddp_torch.load(path, net, opt, rng=False)
    except h5ddp_torch.CheckpointMismatchError as e:
        raise AssertionError(f"{path}: damage refused as another model: {e}") from None
    except h5ddp_torch.CheckpointError as e:
        assert path in str(e) and "\n" not in str(e), e
    else:
        raise AssertionError(f"{path}: loaded")
    return hits[0]


def adam_pair():
    net = Net()
    return net, adam_for(net)


def sgd_pair():
    net = Net()
    return net, torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)


def check_cases(adam, sgd, d):
    sources = {"adam": adam, "adam-r1": adam, "sgd": sgd}
    for tag, which, mutate, rule, needle in CASES:
        path = broken_copy(sources[which], d, tag, mutate)
        line = expect_damaged(path, rule, needle, sgd_pair if which == "sgd" else adam_pair)
        print(f"{tag:<20} {line[len(path) + 2:][:150]}")


def check_revisions(adam, d):
    """Unknown objects: notes in a file of a newer revision (which loads), problems in a revision-1 or -0 file."""
    newer = os.path.join(d, "newer.h5")
    shutil.copy(adam, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["format_minor_version"] = np.int64(rules.READER_MINOR_VERSION + 1)
        put(f, "/train/tokens_seen", np.int64(0), "int64")
        f["model/fc1.bias"].attrs["unit"] = "m"
        f[G0].attrs["foreach"] = 0.0
        put(f, S + "/fc1.bias/ema", np.zeros(3, np.float32), "float32")
    notes = []
    assert h5ddp_torch.verify(newer, notes=notes) == [], h5ddp_torch.verify(newer)
    assert len(notes) == 4 and all("ignored" in n and n.startswith(newer) for n in notes), notes
    net, opt = adam_pair()
    r = h5ddp_torch.load(newer, net, opt, rng=False)
    assert r.step == 2 and set(opt.state[net.fc1.bias]) == {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}
    for minor in (1, 0):
        same = os.path.join(d, f"rev{minor}.h5")
        shutil.copy(newer, same)
        with h5py.File(same, "r+") as f:
            if minor:
                f.attrs["format_minor_version"] = np.int64(minor)
            else:
                del f.attrs["format_minor_version"]
        problems = h5ddp_torch.verify(same)
        ids = sorted(p.split(": ")[1] for p in problems)
        assert ids == ["R14", "R14", "R14", "R6"], problems  # R6 where "exactly" covers a state group
    rev0 = os.path.join(d, "rev0-clean.h5")
    shutil.copy(adam, rev0)
    with h5py.File(rev0, "r+") as f:
        del f.attrs["format_minor_version"]  # as files written before revision 1: valid
    assert h5ddp_torch.verify(rev0) == []
    print(f"revisions: newer file valid with notes ({notes[0][len(newer) + 2:]}); revision 1 and 0: problems")


def check_loading(adam, d):
    """Only a valid file is another model; a resume falls back past damage, not past another model."""
    other = Net(hidden=5)
    try:
        h5ddp_torch.load(adam, other, adam_for(other))
        raise AssertionError("another model loaded")
    except h5ddp_torch.CheckpointMismatchError as e:
        assert "/model/fc1.weight" in str(e), e
    damaged = os.path.join(d, "cases", "R11.h5")
    try:
        h5ddp_torch.load(damaged, other, adam_for(other))
        raise AssertionError("damaged file of another model loaded")
    except h5ddp_torch.CheckpointMismatchError as e:
        raise AssertionError(f"a damaged file refused as another model: {e}") from None
    except h5ddp_torch.CheckpointError as e:
        assert "R11: " in str(e), e
    run = os.path.join(d, "resume")
    os.makedirs(run)
    shutil.copy(os.path.join(d, "sgd", "ckpt-00000001.h5"), run)
    shutil.copy(damaged, os.path.join(run, "ckpt-00000002.h5"))
    err = io.StringIO()
    net = Net()
    with contextlib.redirect_stderr(err):
        r = h5ddp_torch.resume(run, net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), rng=False)
    assert r is not None and r.step == 1 and "R11: " in err.getvalue(), (r, err.getvalue())
    net, opt = adam_pair()
    try:
        h5ddp_torch.load(adam, net, opt, user={"ema": torch.zeros(3)})
        raise AssertionError("a user tensor of another shape loaded")
    except h5ddp_torch.CheckpointMismatchError as e:
        assert "/user/ema" in str(e), e
    ema = torch.zeros(2, 2)
    h5ddp_torch.load(adam, net, opt, user={"ema": ema, "n": 0}, rng=False)
    assert torch.equal(ema, torch.ones(2, 2))
    print("loading: another model only when valid; resume skips damage")


def check_writer(d):
    net, opt = adam_pair()
    bad = [dict(data=h5ddp_torch.DataState(1, 1, 0, 5), epoch=0),           # R11
           dict(data=h5ddp_torch.DataState(1, 0, 20, 5), samples_consumed=5),  # R10
           dict(data=h5ddp_torch.DataState(1, 0, 0, -5)),                     # R10
           dict(scheduler={"type": "step", "base_lr": 0.1}),                  # R12
           dict(name="ckpt-00000004.h5")]                                     # R2
    for i, kwargs in enumerate(bad):
        run = os.path.join(d, f"refused{i}")
        try:
            h5ddp_torch.save(run, net, opt, step=3, fsync=False, **kwargs)
            raise AssertionError(f"saved {kwargs}")
        except h5ddp_torch.CheckpointError as e:
            assert "refusing to save" in str(e) and " R" in str(e), e
        assert not os.path.exists(run) or os.listdir(run) == [], os.listdir(run)
    with h5py.File(h5ddp_torch.save(os.path.join(d, "ok"), net, opt, step=0, fsync=False).path, "r") as f:
        assert f.attrs["format_minor_version"] == rules.READER_MINOR_VERSION
    print(f"writer: {len(bad)} rule-breaking states refused, nothing written")


def main():
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="h5ddp-rules-")
    try:
        adam, sgd = write_files(d)
        for path in (adam, sgd):
            notes = []
            assert h5ddp_torch.verify(path, notes=notes) == [] and notes == [], h5ddp_torch.verify(path)
        check_cases(adam, sgd, d)
        check_revisions(adam, d)
        check_loading(adam, d)
        check_writer(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
