"""tools/h5ddp-data.py against the layout of docs/DATA.md: Fashion-MNIST converted row for row (checked against the
IDX files decoded here independently), its attributes exact, every dataset contiguous; an .npz round trip with
--channels-last and --compute-stats (statistics equal NumPy's); float regression targets; bad inputs refused with
exit 2, one line naming what is wrong, and no output file left behind; `check` refusing a missing /train/y and a
chunked /train/x. Token data (format 2): `text` from a directory and from files (bytes and chars round trip, the
train/test split point exact), `tokens` from raw uint16/uint32 .bin files and llm.c's (header checked), ids >= the
vocabulary size and streams shorter than one window refused, and `check` on good and hand-made bad T1/T2 files.

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


# ---- token data (docs/DATA.md, "Token data (language models)") --------------------------------------------------

TEXT_BLOCK = 4 << 20  # the tool reads text in blocks of 4 MiB: the corpus below cuts a character at the first seam


def token_file(path):
    """(root attributes, {split: (tokens, their attributes)}) of a token stream file, checked contiguous."""
    with h5py.File(path, "r") as f:
        splits = {}
        for split in ("train", "test"):
            if split in f:
                ds = f[f"{split}/tokens"]
                assert contiguous(ds) and ds.ndim == 1, f"{split}/tokens"
                splits[split] = (ds[()], dict(ds.attrs))
        return dict(f.attrs), splits


def make_corpus(work):
    """A directory of text files and the text `text DIR` must read from it: a, b, z joined (a newline after a, which
    lacks one; b ends with one; the empty c adds nothing; z's missing final newline stays missing); c.dat (not
    UTF-8), the symlink e and the subdirectory f are not read."""
    d = os.path.join(work, "corpus")
    os.makedirs(os.path.join(d, "f"))
    rng = np.random.default_rng(40)
    alphabet = np.array(list("abcdefgh \n,.") + ["é", "ж", "€", "😀"])
    a = "x" * (TEXT_BLOCK - 1) + "€" + "".join(rng.choice(alphabet, 300000)).rstrip("\n") + "ñ"
    texts = {"a": a, "b": "zweite Datei: Grüße\n", "c": "", "z": "the end, no newline"}
    for name, text in texts.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(d, "c.dat"), "wb") as f:
        f.write(b"\x00\x02\xff\xfe binary")
    with open(os.path.join(d, "f", "inner"), "w") as f:
        f.write("not read")
    os.symlink("b", os.path.join(d, "e"))
    return d, a + "\n" + texts["b"] + texts["z"]


def test_text(work):
    d, text = make_corpus(work)
    data = text.encode("utf-8")
    out = os.path.join(work, "text-bytes.h5")
    r = tool("text", d, "-o", out)
    attrs, splits = token_file(out)
    assert attrs["h5ddp_data_format"] == 2 and attrs["h5ddp_data_format"].dtype == np.int64, attrs
    assert attrs["vocab_size"] == 256 and attrs["tokenizer"] == "bytes" and "vocab" not in attrs, attrs
    (train, train_attrs), (test, test_attrs) = splits["train"], splits["test"]
    n_test = len(data) // 10  # floor(0.1 * L), exactly
    assert len(test) == n_test and len(train) == len(data) - n_test, (len(train), len(test), len(data))
    assert train.dtype == np.uint16 and test.dtype == np.uint16
    assert bytes(np.concatenate([train, test]).astype(np.uint8)).decode("utf-8") == text, "bytes do not round trip"
    assert bytes(test.astype(np.uint8)) == data[len(data) - n_test:], "the test split is not the last tenth"
    for a in (train_attrs, test_attrs):
        assert a["context"] == 128 and a["context"].dtype == np.int64, a
    assert f"train {len(train)} tokens" in r.stdout, r.stdout
    r = tool("check", out)
    for s in ("h5ddp data format 2", "vocab_size 256", "tokenizer bytes", "layout T2", f"{len(train)} uint16 tokens",
              f"{(len(train) - 1) // 128} windows", f"{(n_test - 1) // 128} windows", "language model"):
        assert s in r.stdout, (s, r.stdout)

    # Files named one by one, a fraction that is not a binary fraction (exact split), another context.
    out = os.path.join(work, "text-files.h5")
    names = [os.path.join(d, n) for n in ("b", "z")]
    tool("text", *names, "-o", out, "--test-fraction", "0.3", "--context", 4)
    small = ("zweite Datei: Grüße\n" + "the end, no newline").encode("utf-8")
    _, splits = token_file(out)
    cut = len(small) - len(small) * 3 // 10
    assert bytes(splits["train"][0].astype(np.uint8)) == small[:cut], splits["train"][0]
    assert bytes(splits["test"][0].astype(np.uint8)) == small[cut:], splits["test"][0]
    assert splits["test"][1]["context"] == 4
    hundred = os.path.join(work, "hundred.txt")  # 0.29 * 100 is 28.999999999999996 in floating point; exactly 29
    with open(hundred, "w") as f:
        f.write("0123456789" * 10)
    tool("text", hundred, "-o", out, "--test-fraction", "0.29", "--context", 4)
    _, splits = token_file(out)
    assert len(splits["train"][0]) == 71 and len(splits["test"][0]) == 29, {k: len(v[0]) for k, v in splits.items()}
    tool("text", *names, "-o", out, "--test-fraction", 0, "--context", 4)
    _, splits = token_file(out)
    assert list(splits) == ["train"] and bytes(splits["train"][0].astype(np.uint8)) == small
    assert "no test split" in tool("check", out).stdout

    # chars: the vocabulary is the sorted distinct code points; ids index it.
    out = os.path.join(work, "text-chars.h5")
    tool("text", d, "-o", out, "--tokenizer", "chars", "--context", 64)
    attrs, splits = token_file(out)
    vocab = attrs["vocab"]
    assert vocab.dtype == np.int32 and list(vocab) == sorted(set(map(ord, text))), vocab
    assert attrs["vocab_size"] == len(vocab) and attrs["tokenizer"] == "chars", attrs
    ids = np.concatenate([splits["train"][0], splits["test"][0]])
    assert len(splits["test"][0]) == len(text) // 10, (len(splits["test"][0]), len(text))
    assert "".join(map(chr, vocab[ids])) == text, "chars do not round trip"
    r = tool("check", out)
    assert f"vocab_size {len(vocab)}, tokenizer chars, context T = 64" in r.stdout, r.stdout
    cjk = os.path.join(work, "cjk.txt")  # 20000 code points: a vocab attribute of 80000 bytes, over HDF5's 64 KiB
    with open(cjk, "w", encoding="utf-8") as f:
        f.write("".join(map(chr, range(0x4E00, 0x4E00 + 20000))) * 2)
    tool("text", cjk, "-o", out, "--tokenizer", "chars")
    attrs, _ = token_file(out)
    assert attrs["vocab_size"] == 20000 and list(attrs["vocab"]) == list(range(0x4E00, 0x4E00 + 20000))
    tool("check", out)

    # Not UTF-8 (named with the byte), a directory without text files, too short for one window.
    bad = os.path.join(d, "c.dat")
    refused(work, out + "x", "text", os.path.join(d, "b"), bad, "-o", out + "x", says=[bad, "not UTF-8", "byte 2"])
    refused(work, out + "x", "text", os.path.join(d, "f", "inner"), "-o", out + "x",
            says=["inner", "/train/tokens", "shorter than one window (129 tokens at --context 128)"])
    refused(work, out + "x", "text", *names, "--context", 20, "-o", out + "x",
            says=["/test/tokens", ": 4 tokens", "shorter than one window (21 tokens"])
    os.makedirs(os.path.join(work, "empty"))
    refused(work, out + "x", "text", os.path.join(work, "empty"), "-o", out + "x", says=["empty", "no regular file"])


def llmc_bin(path, tokens, count=None):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, len(tokens) if count is None else count)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, "<u2").tobytes())


def test_tokens(work):
    rng = np.random.default_rng(41)
    # 4.5 M ids: more than one of the tool's blocks (4 Mi ids), so a bad id's index must count across blocks.
    train = rng.integers(0, 50257, 4_500_000).astype("<u2")
    test = rng.integers(0, 50257, 1000).astype("<u2")
    train_bin, test_bin = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
    train.tofile(train_bin)
    test.tofile(test_bin)
    out = os.path.join(work, "tokens.h5")
    tool("tokens", train_bin, "--test", test_bin, "--vocab-size", 50257, "--tokenizer", "gpt2", "--context", 64,
         "-o", out)
    attrs, splits = token_file(out)
    assert attrs["vocab_size"] == 50257 and attrs["tokenizer"] == "gpt2" and attrs["h5ddp_data_format"] == 2, attrs
    assert splits["train"][0].dtype == np.uint16 and np.array_equal(splits["train"][0], train)
    assert np.array_equal(splits["test"][0], test) and splits["test"][1]["context"] == 64
    r = tool("check", out)
    assert f"{len(train)} uint16 tokens, {(len(train) - 1) // 64} windows" in r.stdout, r.stdout
    assert "tokenizer gpt2" in r.stdout and "15 windows" in r.stdout, r.stdout

    small = rng.integers(0, 100000, 5000).astype("<u4")
    raw32 = os.path.join(work, "u32.bin")
    small.tofile(raw32)
    tool("tokens", raw32, "--dtype", "uint32", "--vocab-size", 100000, "-o", out)
    _, splits = token_file(out)
    assert splits["train"][0].dtype == np.uint32 and np.array_equal(splits["train"][0], small)

    llmc = os.path.join(work, "llmc.bin")
    llmc_bin(llmc, test)
    tool("tokens", llmc, "--vocab-size", 50257, "-o", out)
    attrs, splits = token_file(out)
    assert np.array_equal(splits["train"][0], test), "llm.c tokens differ (header taken for tokens?)"
    assert "llm.c" in attrs["source"] and "test" not in splits, attrs

    bad = os.path.join(work, "bad")
    llmc_bin(bad + "-count.bin", test, count=len(test) + 1)
    refused(work, bad + ".h5", "tokens", bad + "-count.bin", "--vocab-size", 50257, "-o", bad + ".h5",
            says=[bad + "-count.bin", "header says 1001 tokens", "2000 bytes"])
    refused(work, bad + ".h5", "tokens", llmc, "--dtype", "uint32", "--vocab-size", 50257, "-o", bad + ".h5",
            says=[llmc, "uint16"])
    high = train.copy()
    high[4_400_000] = 50257
    high.tofile(bad + "-id.bin")
    refused(work, bad + ".h5", "tokens", bad + "-id.bin", "--vocab-size", 50257, "-o", bad + ".h5",
            says=[bad + "-id.bin", "token id 50257 at index 4400000", "[0, 50257)"])
    train[:64].tofile(bad + "-short.bin")
    refused(work, bad + ".h5", "tokens", bad + "-short.bin", "--vocab-size", 50257, "--context", 64, "-o", bad + ".h5",
            says=[bad + "-short.bin", "64 tokens", "shorter than one window (65 tokens"])
    with open(bad + "-odd.bin", "wb") as f:
        f.write(b"\1\0\2")
    refused(work, bad + ".h5", "tokens", bad + "-odd.bin", "--vocab-size", 50257, "-o", bad + ".h5",
            says=[bad + "-odd.bin", "3 bytes", "uint16"])


def test_check_tokens(work):
    """check on hand-made token files: T1 with per-position labels (-100 ignored) and with class labels pass; each
    defect is one line naming its dataset."""
    rng = np.random.default_rng(42)
    x = rng.integers(0, 5, (30, 8)).astype(np.uint8)
    y = np.roll(x, -1, axis=1).astype(np.int64)
    y[:, -1] = -100
    classes = rng.integers(0, 3, 30)

    def write(name, make, vocab_size=5):
        path = os.path.join(work, name)
        with h5py.File(path, "w") as f:
            if vocab_size is not None:
                f.attrs["vocab_size"] = vocab_size
            make(f)
        return path

    def pair(xs, ys):
        return lambda f: (f.create_dataset("train/x", data=xs), f.create_dataset("train/y", data=ys))

    r = tool("check", write("t1.h5", pair(x, y)))
    assert "30 token samples (layout T1) of 8 uint8 ids" in r.stdout and "30 ignored (-100)" in r.stdout, r.stdout
    assert "labels in [0, 4]" in r.stdout and "language model" in r.stdout, r.stdout
    path = write("t1c.h5", lambda f: (pair(x, classes)(f), f.attrs.create("num_classes", 3)))
    r = tool("check", path)
    assert "class labels in [0, 2], 3 classes" in r.stdout and "T = 8: sequence classification" in r.stdout, r.stdout

    y_label7 = y.copy()
    y_label7[11, 3] = 7
    stream = rng.integers(0, 5, 100).astype(np.uint16)
    hi = stream.copy()
    hi[77] = 5
    for name, make, says, vocab_size in (
            ("t1-wide-y.h5", pair(x, np.zeros((30, 9), np.int64)), ["/train/y", "label shape does not match"], 5),
            ("t1-label7.h5", pair(x, y_label7), ["/train/y", "label 7 at row 11, position 3", "[0, 5)"], 5),
            ("t1-mean.h5", lambda f: (pair(x, y)(f), f["train/x"].attrs.create("mean", np.float32(0.5))),
             ["/train/x", "attribute mean"], 5),
            ("t1-id.h5", pair(np.where(x == 4, 5, x).astype(np.int32), y), ["/train/x", "token id 5 at row"], 5),
            ("t1-no-vocab.h5", pair(x.astype(np.int16), y), ["/train/x", "vocab_size"], None),
            ("both.h5", lambda f: (pair(x, y)(f), f.create_dataset("train/tokens", data=stream)),
             ["/train", "both tokens and x/y"], 5),
            ("t2-no-context.h5", lambda f: f.create_dataset("train/tokens", data=stream),
             ["/train/tokens", "no attribute context"], 5),
            ("t2-id.h5", lambda f: f.create_dataset("train/tokens", data=hi).attrs.create("context", 8),
             ["/train/tokens", "token id 5 at index 77"], 5),
            ("t2-short.h5", lambda f: f.create_dataset("train/tokens", data=stream).attrs.create("context", 100),
             ["/train/tokens", "100 tokens", "shorter than one window"], 5),
            ("t2-int16.h5", lambda f: f.create_dataset("train/tokens", data=stream.astype(np.int16)),
             ["/train/tokens", "dtype <i2"], 5)):
        path = write(name, make, vocab_size)
        refused(work, None, "check", path, says=[path] + says)
    # A stream without a context attribute is read with --context, as h5ddp-train --context reads it.
    r = tool("check", os.path.join(work, "t2-no-context.h5"), "--context", 9)
    assert "100 uint16 tokens, 11 windows of 9 + 1" in r.stdout, r.stdout


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
    for case in (test_fashion_mnist, test_npz_channels_last, test_npz_regression, test_bad_inputs, test_text,
                 test_tokens, test_check_tokens):
        t = time.time()
        case(work)
        print(f"ok {case.__name__} ({time.time() - t:.1f} s)", flush=True)
    if not args.work_dir:
        shutil.rmtree(work)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
