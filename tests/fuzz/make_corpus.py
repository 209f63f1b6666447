"""Writes the fuzz seed corpus: corpus/pickle/*.pkl (data.pkl records) and corpus/zip/*.zip (whole .pt files),
from real torch.save output (torch 1.13, /usr/bin/python3) and from the hostile files of
tests/interop/hostile_pt.py, shrunk to a few KB. Run from anywhere: /usr/bin/python3 tests/fuzz/make_corpus.py
The outputs are committed; rerun only to change the seeds. corpus/*/found-* are inputs that once made a
fuzzer fail (kept as regression seeds; this script leaves them alone)."""
import collections
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import hostile_pt as h  # noqa: E402


def state_dict():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, generator=g)
    shared = torch.randn(2, 3, generator=g)
    return collections.OrderedDict([
        ("w", torch.randn(3, 4, generator=g)),
        ("half", torch.randn(5, generator=g).half()),
        ("bf16", torch.randn(2, 2, generator=g).bfloat16()),
        ("i64", torch.tensor(7)),
        ("flags", torch.tensor([True, False])),
        ("view", base[1:3, ::2]),
        ("shared0", shared[0]),
        ("shared1", shared[1]),
        ("expanded", torch.ones(1).expand(4)),
        ("empty", torch.zeros(0, 3)),
    ])


def module_state_dict():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    return m.state_dict()  # an OrderedDict with _metadata (BUILD)


def checkpoint():
    torch.manual_seed(0)
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "lr": 0.1, "name": "run",
            "flags": [True, None, False], "pair": (1, 2.5), "blob": b"\x00\x01", "big": 2 ** 40, "neg": -5,
            "ids": {1: "a", 2: "b"}, "param": torch.nn.Parameter(torch.ones(2))}


def main():
    pkl_dir = os.path.join(HERE, "corpus", "pickle")
    zip_dir = os.path.join(HERE, "corpus", "zip")
    os.makedirs(pkl_dir, exist_ok=True)
    os.makedirs(zip_dir, exist_ok=True)

    real = {
        "state_dict_p2": h.torch_save_bytes(state_dict(), 2),
        "state_dict_p4": h.torch_save_bytes(state_dict(), 4),
        "module_p2": h.torch_save_bytes(module_state_dict(), 2),
        "checkpoint_p2": h.torch_save_bytes(checkpoint(), 2),
        "checkpoint_p5": h.torch_save_bytes(checkpoint(), 5),
    }
    pickles = {name: h.data_pkl(pt) for name, pt in real.items()}
    # Protocol 0/1 opcodes (text INT, PUT, GET): [1, True, (2, 3), (2, 3)] and {'k': 6}
    pickles["protocol0_list"] = b"(lp0\nI1\naI01\na(I2\nI3\ntp1\nag1\na."
    pickles["protocol0_dict"] = b"(dp0\nX\x01\x00\x00\x00kp1\nI5\nsg1\nI6\ns."
    pickles.update({
        "deep_marks": h.deep_marks(1500),
        "deep_tuple1": h.deep_tuple1(1500),
        "deep_memo_lists": h.deep_memo_lists(1100),
        "bad_memo": h.bad_memo(),
        "bad_memo_text": h.PROTO2 + b"gabc\n.",
        "self_list": h.self_list(),
        "changed_after_nesting": h.PROTO2 + b"]q\x00(h\x00t0h\x00Na.",
        "huge_string": h.huge_string(),
        "wrapping_view": h.wrapping_view(),
        "huge_storage": h.huge_storage(),
        "repeated_view": h.repeated_view(),
        "negative_storage": h._tensor_pkl(-5, [2], [1]),
        "truncated": pickles["state_dict_p2"][: len(pickles["state_dict_p2"]) // 2],
        "stack_global_int": b"\x80\x04K\x01K\x02\x93.",
        "unknown_opcode": h.PROTO2 + b"\xff.",
        "long_line": h.PROTO2 + b"c" + b"m" * 2000 + b"\nx\n.",
        "dup_flood": h.PROTO2 + b"](N" + b"2" * 2000 + b"e.",
    })
    for name, data in pickles.items():
        with open(os.path.join(pkl_dir, name + ".pkl"), "wb") as f:
            f.write(data)

    zips = dict(real)
    zips.update({
        "zip64": h.zip64_pt(state_dict()),
        "truncated_zip": h.truncated(real["state_dict_p2"]),
        "truncated_pickle": h.truncated_pickle_pt(),
        "oversized_record": h.oversized_record_pt(),
        "deep_marks": h.with_data_pkl(h.small_state_dict_pt(), h.deep_marks(1500)),
        "short_record": h.with_data_pkl(h.small_state_dict_pt(), h._tensor_pkl(1000, [2], [1])),
    })
    for name, data in zips.items():
        with open(os.path.join(zip_dir, name + ".zip"), "wb") as f:  # *.pt is in .gitignore
            f.write(data)
    print(f"{len(pickles)} pickles in {pkl_dir}, {len(zips)} archives in {zip_dir}")


if __name__ == "__main__":
    main()
