"""One conformance suite run against both writers: files written by h5ddp-train (C++) and by h5ddp_torch
(Python, 2 ranks under mpirun: SGD with /user tensors of every dtype; AdamW over two param groups with amsgrad)
pass both verifiers (h5ddp-ckpt verify and h5ddp_torch.verify); the same damage done to a file of either writer
(a flipped byte in a tensor, a truncation, an object outside the layout) fails both, naming the dataset; h5ddp_torch
refuses damaged files and other models with one-line errors naming file, dataset and rank; a resume skips a damaged
newest file with a warning; the C++ reader loads the Python files (h5ddp-ckpt export)."""
import contextlib
import io
import os
import shutil
import sys

import h5py
import numpy as np
import torch
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pt_loop  # noqa: E402  (puts python/ and tests/interop on sys.path)
import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402


def cpp_verify(args, path):
    p = ic.run([args.ckpt, "verify", path], expect=None)
    return p.returncode, p.stdout + p.stderr


def accept(args, path):
    rc, out = cpp_verify(args, path)
    assert rc == 0, f"h5ddp-ckpt verify rejects {path}: {out}"
    problems = h5ddp_torch.verify(path)
    assert problems == [], f"h5ddp_torch.verify rejects {path}: {problems}"


def reject(args, path, needle):
    rc, out = cpp_verify(args, path)
    assert rc != 0 and needle in out, f"h5ddp-ckpt verify: rc {rc}, {needle!r} not in {out!r}"
    problems = h5ddp_torch.verify(path)
    assert problems and any(needle in p for p in problems), f"h5ddp_torch.verify: {needle!r} not in {problems}"
    print(f"both verifiers reject {os.path.basename(path)}: {problems[0]}")


def expect_error(cls, needles, fn):
    try:
        fn()
    except cls as e:
        msg = str(e)
        assert "\n" not in msg, f"not one line: {msg!r}"
        for n in needles:
            assert n in msg, f"{n!r} not in {msg!r}"
        print(f"{cls.__name__}: {msg[:200]}")
        return
    raise AssertionError(f"no {cls.__name__}")


def flip_byte(path, dataset):
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        offset = ds.id.get_offset() + ds.id.get_storage_size() // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def damaged_copies(args, src, tag, w):
    """Each kind of damage done to a copy of `src`; both verifiers and load must refuse."""
    flipped = w(f"{tag}-flipped.h5")
    shutil.copy(src, flipped)
    flip_byte(flipped, "/model/fc1.weight")
    reject(args, flipped, "/model/fc1.weight")
    expect_error(h5ddp_torch.CheckpointError, ["rank 0:", flipped, "checksum mismatch in dataset /model/fc1.weight"],
                 lambda: h5ddp_torch.load(flipped, pt_loop.cnn()))

    truncated = w(f"{tag}-truncated.h5")
    shutil.copy(src, truncated)
    os.truncate(truncated, os.path.getsize(src) // 2)
    reject(args, truncated, truncated)
    expect_error(h5ddp_torch.CheckpointError, ["rank 0:", truncated], lambda: h5ddp_torch.load(truncated, pt_loop.cnn()))

    extra = w(f"{tag}-extra.h5")
    shutil.copy(src, extra)
    with h5py.File(extra, "r+") as f:
        ds = f.create_dataset("extra", data=np.zeros(3, np.float32))  # with valid attributes: only its place is wrong
        ds.attrs["dtype"] = "float32"
        ds.attrs["xxh3"] = np.uint64(xxhash.xxh3_64_intdigest(np.zeros(3, np.float32).tobytes()))
    reject(args, extra, "/extra")
    return flipped


def main():
    args = ic.parse_args(__doc__)
    with ic.Scratch(args, "conformance") as w:
        ic.train(args, 2, w("cpp"), "--max-steps", "2", "--batch-size", "16", "--no-fsync", "--keep-last", "0",
                 "--checkpoint-every-steps", "1")
        ic.run(ic.mpi(args, 2, sys.executable, os.path.join(HERE, "py_writer.py"), w("py")), timeout=180)
        cpp1, cpp2 = (os.path.join(w("cpp"), f"ckpt-0000000{s}.h5") for s in (1, 2))
        py_sgd, py_adam = os.path.join(w("py"), "sgd", "ckpt-00000001.h5"), os.path.join(w("py"), "adam",
                                                                                        "ckpt-00000002.h5")
        for path in (cpp1, cpp2, py_sgd, py_adam):
            accept(args, path)
        with h5py.File(py_sgd, "r") as f:
            assert f.attrs["world_size"] == 2 and f["rng/cpu"].shape[0] == 2, "not written by 2 ranks"

        # The C++ reader loads the Python files too (export reads every tensor through load_checkpoint; it refuses
        # files with /user tensors, whatever wrote them, so only the AdamW file).
        ic.run([args.ckpt, "export", py_adam, "--to", w("adam.pt")])
        pt = torch.load(w("adam.pt"))
        assert pt["optimizer_type"] == "adamw" and pt["step"] == 2, (pt["optimizer_type"], pt["step"])

        # The Python reader: every dtype back as written, state into a fresh model and optimizer.
        model = pt_loop.cnn()
        sgd = torch.optim.SGD(model.parameters(), lr=0.5)
        r = h5ddp_torch.load(py_sgd, model, sgd)
        assert r.user["f16"].dtype == torch.float16 and torch.equal(r.user["f16"], torch.linspace(-2, 2, 7, dtype=torch.float16))
        assert torch.equal(r.user["bf16"], torch.linspace(-3, 3, 5).bfloat16())
        assert r.user["flags"].tolist() == [True, False, True] and int(r.user["count"]) == 17
        assert r.user["empty"].shape == (0, 5) and r.user["f64"].item() == 3.25
        assert r.data == h5ddp_torch.DataState(seed=7, epoch=0, position=16, global_batch=16), r.data
        g = sgd.param_groups[0]
        assert g["lr"] == 0.01 and g["momentum"] == 0.9 and g["nesterov"] is True, g
        assert all("momentum_buffer" in sgd.state[p] for p in model.parameters())

        for src, tag in ((cpp2, "cpp"), (py_adam, "py")):
            damaged_copies(args, src, tag, w)

        # Another model, another optimizer: one-line mismatch errors naming file and dataset.
        mlp = ic.model_classes(args.source_dir)[1]()
        expect_error(h5ddp_torch.CheckpointMismatchError, ["rank 0:", cpp2, "/model/conv1.weight"],
                     lambda: h5ddp_torch.load(cpp2, mlp))
        cnn = pt_loop.cnn()
        expect_error(h5ddp_torch.CheckpointMismatchError, ["rank 0:", cpp2, "type adam", "type sgd"],
                     lambda: h5ddp_torch.load(cpp2, cnn, torch.optim.SGD(cnn.parameters(), lr=0.1)))

        # Resume: the damaged newest checkpoint is skipped with a warning, the next one loads.
        os.makedirs(w("resume"))
        shutil.copy(cpp1, w("resume"))
        shutil.copy(cpp2, w("resume"))
        flip_byte(os.path.join(w("resume"), "ckpt-00000002.h5"), "/model/fc2.weight")
        with open(os.path.join(w("resume"), "ckpt-00000003.h5.partial"), "wb") as f:
            f.write(b"never read")
        cnn = pt_loop.cnn()
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            r = h5ddp_torch.resume(w("resume"), cnn, torch.optim.Adam(cnn.parameters()))
        print(err.getvalue())
        assert r is not None and r.step == 1 and r.path.endswith("ckpt-00000001.h5"), r
        assert "skipping" in err.getvalue() and "ckpt-00000002.h5" in err.getvalue() and "/model/fc2.weight" in \
            err.getvalue(), err.getvalue()
        skip_line = next(line for line in err.getvalue().splitlines() if "skipping" in line)
        assert skip_line.count("ckpt-00000002.h5") == 1, f"the warning names the file more than once: {skip_line}"
        assert r.rng_exact
        with h5py.File(cpp1, "r") as f:
            assert np.array_equal(torch.get_rng_state().numpy(), f["rng/cpu"][0]), "RNG row 0 not restored"
        assert h5ddp_torch.resume(w("empty-run"), cnn) is None
    print("PASS")


if __name__ == "__main__":
    main()
