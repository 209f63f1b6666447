"""tools/h5ddp-data.py against the layout of docs/DATA.md: Fashion-MNIST converted row for row (checked against the
IDX files decoded here independently), its attributes exact, every dataset contiguous; an .npz round trip with
--channels-last and --compute-stats (statistics equal NumPy's); float regression targets; bad inputs refused with
exit 2, one line naming what is wrong, and no output file left behind; `check` refusing a missing /train/y and a
chunked /train/x.

  /usr/bin/python3 tests/data/test_convert.py [--work-dir DIR]
"""
import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "h5ddp-data.py")
FASHION = "/usr/share/datasets/fashion-mnist"


def tool(*args, expect=0):
    r = subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True, text=True, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"h5ddp-data.py {' '.join(map(str, args))}: exit {r.returncode}, expected {expect}\n"
                             f"stdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def refused(work, out, *args, says):
    """The tool exits 2 with one line on stderr containing every string of `says`, and writes no output."""
    r = tool(*args, expect=2)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("h5ddp-data: error: "), f"not one error line: {r.stderr!r}"
    for s in says:
        assert s in lines[0], f"{s!r} not in {lines[0]!r}"
    if out is not None:
        assert not os.path.exists(out), f"{out} written despite the error"
    leftovers = [n for n in os.listdir(work) if ".tmp-" in n]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    return lines[0]


def contiguous(ds):
    return ds.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS


def idx_decode(path):
    """An IDX file's array, decoded independently of the tool."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[:4], "big")
    ndims = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def test_fashion_mnist(work):
    out = os.path.join(work, "fm.h5")
    tool("fashion-mnist", FASHION, "-o", out)
    assert not [n for n in os.listdir(work) if ".tmp-" in n], "temporary file left behind"
    with h5py.File(out, "r") as f:
        assert f.attrs["h5ddp_data_format"] == 1 and f.attrs["h5ddp_data_format"].dtype == np.int64
        assert f.attrs["num_classes"] == 10 and f.attrs["num_classes"].dtype == np.int64
        assert "fashion" in f.attrs["source"].lower()
        for split, prefix, n in (("train", "train", 60000), ("test", "t10k", 10000)):
            x, y = f[f"{split}/x"], f[f"{split}/y"]
            images = idx_decode(os.path.join(FASHION, f"{prefix}-images-idx3-ubyte.gz"))
            labels = idx_decode(os.path.join(FASHION, f"{prefix}-labels-idx1-ubyte.gz"))
            assert x.shape == (n, 1, 28, 28) and x.dtype == np.uint8, (x.shape, x.dtype)
            assert y.shape == (n,) and y.dtype == np.uint8, (y.shape, y.dtype)
            assert np.array_equal(x[()][:, 0], images), f"{split}/x differs from the IDX images"
            assert np.array_equal(y[()], labels), f"{split}/y differs from the IDX labels"
            assert contiguous(x) and contiguous(y), f"{split} not contiguous"
            assert x.compression is None and x.chunks is None
            for key, value in (("mean", 0.2860), ("std", 0.3530)):
                a = x.attrs[key]
                assert a.dtype == np.float32 and np.shape(a) == () and a == np.float32(value), (key, a, a.dtype)
    r = tool("check", out)
    assert "train: 60000 samples, test: 10000 samples" in r.stdout and "[1, 28, 28] uint8" in r.stdout, r.stdout
    assert "10 classes" in r.stdout and "[0, 9]" in r.stdout, r.stdout
    return out


def test_npz_channels_last(work):
    rng = np.random.default_rng(20)
    # 6000 rows of 32x32x3 span three of the tool's row blocks (64 MiB as float64): statistics merge across them.
    x_train = rng.integers(0, 256, (6000, 32, 32, 3), dtype=np.uint8)
    x_train[..., 1] //= 3  # channels with different statistics
    x_train[..., 2] = 255 - x_train[..., 2] // 7
    x_train[:2500, ..., 0] //= 4  # blocks with different means: the merge of block statistics matters
    y_train = rng.integers(0, 10, 6000).astype(np.int32)
    x_test = rng.integers(0, 256, (777, 32, 32, 3), dtype=np.uint8)
    y_test = rng.integers(0, 10, 777).astype(np.uint16)
    npz = os.path.join(work, "cifar_like.npz")
    np.savez_compressed(npz, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    out = os.path.join(work, "cifar_like.h5")
    tool("npz", npz, "-o", out, "--channels-last", "--compute-stats", "--num-classes", 10)
    scaled = x_train.astype(np.float64) / 255.0
    mean, std = scaled.mean(axis=(0, 1, 2)), scaled.std(axis=(0, 1, 2))
    with h5py.File(out, "r") as f:
        assert f.attrs["num_classes"] == 10 and f.attrs["h5ddp_data_format"] == 1
        for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            hx, hy = f[f"{split}/x"], f[f"{split}/y"]
            assert hx.shape == (len(x), 3, 32, 32) and hx.dtype == np.uint8, (hx.shape, hx.dtype)
            assert np.array_equal(hx[()], x.transpose(0, 3, 1, 2)), f"{split}/x is not x transposed to NCHW"
            assert hy.dtype == np.int64 and np.array_equal(hy[()], y), f"{split}/y"
            assert contiguous(hx) and contiguous(hy)
            m, s = hx.attrs["mean"], hx.attrs["std"]  # the test split is normalised with train's statistics
            assert m.dtype == np.float32 and m.shape == (3,) and s.dtype == np.float32 and s.shape == (3,)
            assert np.abs(m - mean).max() < 1e-6 and np.abs(s - std).max() < 1e-6, (m, mean, s, std)
    r = tool("check", out)
    assert "train: 6000 samples, test: 777 samples" in r.stdout and "[3, 32, 32] uint8" in r.stdout, r.stdout


def test_npz_regression(work):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((500, 7))  # float64: converted to float32
    y = rng.standard_normal((500, 2)).astype(np.float32)
    npz = os.path.join(work, "reg.npz")
    np.savez(npz, features=x, targets=y)
    out = os.path.join(work, "reg.h5")
    r = tool("npz", npz, "-o", out, "--x-train", "features", "--y-train", "targets", "--mean", "0.5", "--std", "2")
    assert "float64 to float32" in r.stdout, r.stdout
    with h5py.File(out, "r") as f:
        assert "test" not in f and "num_classes" not in f.attrs
        assert f["train/x"].dtype == np.float32 and np.array_equal(f["train/x"][()], x.astype(np.float32))
        assert f["train/y"].dtype == np.float32 and np.array_equal(f["train/y"][()], y)
        assert f["train/x"].attrs["mean"] == np.float32(0.5) and f["train/x"].attrs["std"] == np.float32(2)
    r = tool("check", out)
    assert "regression" in r.stdout and "[N, 2]" in r.stdout and "no test split" in r.stdout, r.stdout


def test_bad_inputs(work):
    out = os.path.join(work, "bad.h5")
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (100, 8, 8, 3), dtype=np.uint8)
    y = rng.integers(0, 5, 100)

    npz = os.path.join(work, "mismatch.npz")
    np.savez(npz, x_train=x, y_train=y[:99])
    refused(work, out, "npz", npz, "-o", out, says=["x_train has 100 rows", "y_train has 99"])

    npz = os.path.join(work, "labels.npz")
    y_bad = y.copy()
    y_bad[42] = 7
    np.savez(npz, x_train=x, y_train=y_bad)
    refused(work, out, "npz", npz, "-o", out, "--num-classes", 5, says=["y_train", "label 7 at row 42", "[0, 5)"])

    npz = os.path.join(work, "shapes.npz")
    np.savez(npz, x_train=x, y_train=y, x_test=x[:10, :7], y_test=y[:10])
    refused(work, out, "npz", npz, "-o", out, "--channels-last", says=["x_test", "[3, 7, 8]", "[3, 8, 8]"])

    # IDX: a plain file cut short, a gzip stream cut short, a label file given as the image file.
    images = os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")
    labels = os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")
    with gzip.open(labels, "rb") as f:
        raw_labels = f.read()
    short = os.path.join(work, "short-labels-idx1-ubyte")
    with open(short, "wb") as f:
        f.write(raw_labels[:-10])
    refused(work, out, "idx", "--train-images", images, "--train-labels", short, "-o", out,
            says=[short, "truncated"])
    with open(images, "rb") as f:
        gz = f.read()
    cut = os.path.join(work, "cut-images-idx3-ubyte.gz")
    with open(cut, "wb") as f:
        f.write(gz[:len(gz) // 2])
    refused(work, out, "idx", "--train-images", cut, "--train-labels", labels, "-o", out, says=[cut, "truncated"])
    longer = os.path.join(work, "long-labels-idx1-ubyte")
    with open(longer, "wb") as f:
        f.write(raw_labels + b"\0" * 3)
    refused(work, out, "idx", "--train-images", images, "--train-labels", longer, "-o", out,
            says=[longer, "3 bytes follow"])
    refused(work, out, "idx", "--train-images", labels, "--train-labels", labels, "-o", out,
            says=[labels, "bad magic number 2049", "expected 2051"])
    refused(work, out, "idx", "--train-images", images, "--train-labels", labels, "--num-classes", 9, "-o", out,
            says=[labels, "label 9 at row", "[0, 9)"])

    # check: a missing /train/y, a chunked /train/x, a label beyond num_classes.
    for name, make, says in (
            ("no_y.h5", lambda f: f.create_dataset("train/x", data=x.transpose(0, 3, 1, 2)), ["/train/y", "missing"]),
            ("chunked.h5", lambda f: (f.create_dataset("train/x", data=x, chunks=(10, 8, 8, 3), compression="gzip"),
                                      f.create_dataset("train/y", data=y)), ["/train/x", "chunked", "h5repack"]),
            ("range.h5", lambda f: (f.create_dataset("train/x", data=x), f.create_dataset("train/y", data=y_bad),
                                    f.attrs.create("num_classes", 5)), ["/train/y", "label 7 at row 42"])):
        path = os.path.join(work, name)
        with h5py.File(path, "w") as f:
            make(f)
        refused(work, None, "check", path, says=[path] + says)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work-dir", help="scratch directory (emptied first; default a temporary one)")
    args = p.parse_args()
    if not os.path.isdir(FASHION):
        print(f"SKIP: {FASHION} missing (Debian: dataset-fashion-mnist)")
        return 77
    work = args.work_dir or tempfile.mkdtemp(prefix="h5ddp-data-test-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for case in (test_fashion_mnist, test_npz_channels_last, test_npz_regression, test_bad_inputs):
        t = time.time()
        case(work)
        print(f"ok {case.__name__} ({time.time() - t:.1f} s)", flush=True)
    if not args.work_dir:
        shutil.rmtree(work)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
