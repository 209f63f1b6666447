"""import -> export keeps every tensor bit for bit (dtypes, 0-d, non-contiguous views, shared storages,
pickle protocol 4), and the tools fail clearly, naming the file, on inputs they cannot take."""
import collections
import os
import shutil

import h5py
import torch

import interop_common as ic


def state_dict():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, generator=g)
    shared = torch.randn(2, 3, generator=g)
    bn = torch.nn.BatchNorm1d(3)
    return collections.OrderedDict([
        ("layer.weight", torch.randn(3, 4, generator=g)),
        ("half", torch.randn(5, generator=g).half()),
        ("bf16", torch.randn(2, 2, generator=g).bfloat16()),
        ("f64", torch.randn(3, generator=g, dtype=torch.float64)),
        ("i32", torch.arange(-3, 3, dtype=torch.int32)),
        ("i8", torch.arange(-4, 4, dtype=torch.int8)),
        ("u8", torch.arange(250, 256, dtype=torch.uint8)),
        ("flags", torch.tensor([True, False, True])),
        ("view", base[1:3, ::2]),            # non-contiguous, offset into a larger storage
        ("shared0", shared[0]),              # two tensors over one storage
        ("shared1", shared[1]),
        ("bn.running_mean", bn.running_mean + 0.5),
        ("bn.num_batches_tracked", torch.tensor(7)),  # int64, 0-d
    ])


def expect_failure(cmd, *needles, code=1):
    p = ic.run(cmd, expect=None)
    assert p.returncode == code, f"exit code {p.returncode}, expected {code}"
    for n in needles:
        assert n in p.stderr, f"{n!r} not in the message: {p.stderr!r}"


def main():
    args = ic.parse_args(__doc__)
    with ic.Scratch(args, "roundtrip") as w:
        sd = state_dict()
        for proto in (2, 4):
            src, h5, pt = w(f"sd{proto}.pt"), w(f"sd{proto}.h5"), w(f"sd{proto}-back.pt")
            torch.save(sd, src, pickle_protocol=proto)
            ic.run([args.ckpt, "import", src, "--to", h5])
            ic.run([args.ckpt, "verify", h5])
            ic.run([args.ckpt, "export", h5, "--to", pt])
            back = torch.load(pt)["model"]
            assert set(back) == set(sd), sorted(back)
            for k, v in sd.items():
                assert back[k].dtype == v.dtype and torch.equal(back[k], v), (k, v, back[k])
            with h5py.File(h5, "r") as f:
                assert f["model/bf16"].attrs["dtype"] == "bfloat16"
                assert f["model/bn.num_batches_tracked"].shape == ()

        # Under mpiexec: every rank reads, the writes are collective (import) or rank 0's (export).
        ic.run(ic.mpi(args, 2, args.ckpt, "import", w("sd4.pt"), "--to", w("np2.h5")))
        with h5py.File(w("sd4.h5"), "r") as a, h5py.File(w("np2.h5"), "r") as b:
            assert int(b.attrs["world_size"]) == 2 and set(a["model"].keys()) == set(b["model"].keys())
            for k in a["model"]:
                assert a["model"][k].attrs["xxh3"] == b["model"][k].attrs["xxh3"], k
        ic.run(ic.mpi(args, 2, args.ckpt, "export", w("np2.h5"), "--to", w("np2.pt")))
        back = torch.load(w("np2.pt"))["model"]
        assert all(torch.equal(back[k], v) for k, v in sd.items())

        # ---- clear errors, each naming the file ----
        text = w("notes.txt")
        with open(text, "w") as f:
            f.write("not a checkpoint\n")
        expect_failure([args.ckpt, "export", text, "--to", w("x.pt")], text)
        other = w("other.h5")
        with h5py.File(other, "w") as f:
            f["x"] = [1, 2, 3]
        expect_failure([args.ckpt, "export", other, "--to", w("x.pt")], other)
        future = w("future.h5")
        shutil.copy(w("sd2.h5"), future)
        with h5py.File(future, "r+") as f:
            f.attrs["format_version"] = 99
        expect_failure([args.ckpt, "export", future, "--to", w("x.pt")], future, "99")
        assert not os.path.exists(w("x.pt"))

        legacy = w("legacy.pt")
        torch.save(sd, legacy, _use_new_zipfile_serialization=False)
        expect_failure([args.ckpt, "import", legacy, "--to", w("y.h5")], legacy, "legacy")
        expect_failure([args.ckpt, "import", text, "--to", w("y.h5")], text, "not a torch.save file")
        a_list = w("list.pt")
        torch.save([torch.ones(2)], a_list)
        expect_failure([args.ckpt, "import", a_list, "--to", w("y.h5")], a_list, "not a state dict")
        mixed = w("mixed.pt")
        torch.save({"w": torch.ones(2), "n": 3}, mixed)
        expect_failure([args.ckpt, "import", mixed, "--to", w("y.h5")], mixed, "'n' is a int")
        cplx = w("complex.pt")
        torch.save({"w": torch.ones(2, dtype=torch.complex64)}, cplx)
        expect_failure([args.ckpt, "import", cplx, "--to", w("y.h5")], cplx, "ComplexFloatStorage")
        obj = w("object.pt")
        torch.save({"w": torch.ones(2), "opt": torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1)}, obj)
        expect_failure([args.ckpt, "import", obj, "--to", w("y.h5")], obj, "torch.optim.sgd.SGD")
        expect_failure([args.ckpt, "import", w("sd2.pt"), "--to", w("y.h5"), "--model", "cnn"],
                       w("sd2.pt"), "missing key 'conv1.weight'", "unexpected key 'half'")
        expect_failure([args.ckpt, "import", w("sd2.pt"), "--to", w("sd2.h5")], "exists", "--force")
        expect_failure([args.ckpt, "import", w("sd2.pt"), "--to", w("y.pt")], ".h5")
        assert not os.path.exists(w("y.h5"))
        expect_failure([args.ckpt, "export", w("sd2.h5")], "--to", code=2)
    print("PASS")


if __name__ == "__main__":
    main()
