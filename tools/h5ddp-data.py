#!/usr/bin/python3
"""Writes and checks HDF5 data sets in the layout h5ddp-train --data FILE.h5 reads (docs/DATA.md):
/train/x [N, *S] uint8 or float32, /train/y [N] integer labels or float32 [N] / [N, K] targets, optional
/test/x and /test/y alike, every dataset contiguous; mean/std attributes on x, num_classes on the root.
Token data (language models, format 2) has a root vocab_size and, per split, either token samples x [N, T] (integer
ids) with y [N] class labels or [N, T] per-position labels (-100: ignored), or a token stream tokens [L] whose
attribute context T cuts it into floor((L - 1) / T) windows of T + 1 tokens.

  h5ddp-data.py fashion-mnist [DIR] -o OUT.h5
  h5ddp-data.py idx --train-images F --train-labels F [--test-images F --test-labels F] -o OUT.h5
                    [--mean M --std S] [--num-classes K]
  h5ddp-data.py npz IN.npz -o OUT.h5 [--x-train KEY --y-train KEY --x-test KEY --y-test KEY] [--channels-last]
                    [--mean a,b,c --std a,b,c | --compute-stats] [--num-classes K]
  h5ddp-data.py text FILE|DIR... -o OUT.h5 [--tokenizer bytes|chars] [--test-fraction F] [--context T]
  h5ddp-data.py tokens TRAIN.bin [--test TEST.bin] --vocab-size V -o OUT.h5 [--dtype uint16|uint32] [--context T]
                    [--tokenizer NAME]
  h5ddp-data.py check FILE.h5 [--context T]

Outputs are written to OUT.h5.tmp-<pid>, fsynced and renamed, so OUT.h5 is either the old file or the whole new
one. Inputs are streamed in blocks of rows or tokens (IDX files, the .npy members of an .npz, text and .bin files
alike), so memory does not grow with N (text --tokenizer chars reads its files twice: the vocabulary first).
Bad input: one line on stderr naming the file (and dataset), exit 2.
Needs numpy and h5py (Debian: python3-numpy, python3-h5py).
"""
import argparse
import codecs
import fractions
import gzip
import math
import os
import sys
import zipfile
import zlib

try:
    import h5py
    import numpy as np
except ImportError as e:  # e.g. a python3 on PATH other than the system's
    print(f"h5ddp-data: error: {e.name} is missing from {sys.executable}; install it (Debian: python3-h5py, "
          f"python3-numpy) or run the tool with /usr/bin/python3", file=sys.stderr)
    sys.exit(2)

FORMAT_VERSION = 1  # h5ddp_data_format of image/feature files
TOKEN_FORMAT_VERSION = 2  # ... and of files with token data
KNOWN_FORMATS = (FORMAT_VERSION, TOKEN_FORMAT_VERSION)
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = 0.2860  # h5ddp's built-in normalisation (src/train/data.hpp), stored as float32
FASHION_MNIST_STD = 0.3530
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
BLOCK_BYTES = 64 << 20  # rows are streamed in blocks of about this many bytes (as float64 for statistics)
IDX_BLOCK_ROWS = 10000
TOKEN_BLOCK = 1 << 22  # token ids per block (.bin files, check)
TEXT_BLOCK_BYTES = 4 << 20  # text files are read in blocks of this many bytes
DEFAULT_CONTEXT = 128
IGNORE_INDEX = -100  # a per-position label that is not trained on (PyTorch's default ignore_index)
TOKEN_DTYPES = ("<u2", "<u4", "<i4", "<i8")  # a token stream's types (docs/DATA.md, layout T2)
LLMC_MAGIC = 20240520  # llm.c's .bin: 256 int32 (magic, version 1, token count), then uint16 tokens
LLMC_VERSION = 1
LLMC_HEADER_BYTES = 256 * 4
MAX_CODE_POINT = 0x10FFFF


class DataError(Exception):
    """Bad input; main prints it as one line and exits 2."""


def shape_text(shape):
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def block_rows(row_bytes):
    return max(1, BLOCK_BYTES // max(1, row_bytes))


# ---- the output file --------------------------------------------------------------------------------------------


class Split:
    """One split to write: its name, x and y shapes and dtypes, a generator of (x_block, y_block) in row order,
    and the attributes of x (filled in by the time the generator ends, so statistics can be taken on the way)."""

    def __init__(self, name, x_shape, x_dtype, y_shape, y_dtype, blocks, x_attrs=None):
        self.name, self.blocks = name, blocks
        self.x_shape, self.x_dtype = tuple(int(d) for d in x_shape), np.dtype(x_dtype)
        self.y_shape, self.y_dtype = tuple(int(d) for d in y_shape), np.dtype(y_dtype)
        self.x_attrs = x_attrs if x_attrs is not None else {}

    def write(self, f):
        g = f.create_group(self.name)
        # No chunks, compression, filters or maxshape: contiguous, which h5ddp reads by file offset.
        x = g.create_dataset("x", shape=self.x_shape, dtype=self.x_dtype)
        y = g.create_dataset("y", shape=self.y_shape, dtype=self.y_dtype)
        at = 0
        for xb, yb in self.blocks:
            n = len(xb)
            if len(yb) != n or at + n > self.x_shape[0]:
                raise AssertionError("internal error: block sizes disagree")
            x[at:at + n] = xb
            y[at:at + n] = yb
            at += n
        if at != self.x_shape[0]:
            raise AssertionError(f"internal error: {self.name} got {at} of {self.x_shape[0]} rows")
        for key, value in self.x_attrs.items():
            x.attrs[key] = value


class TokenSplit:
    """One token stream to write (layout T2): /name/tokens [length] of dtype, filled from `blocks`, 1-D arrays of ids
    in order, with its attribute context."""

    def __init__(self, name, length, dtype, blocks, context):
        self.name, self.length, self.dtype = name, int(length), np.dtype(dtype)
        self.blocks, self.context = blocks, context

    def write(self, f):
        ds = f.create_group(self.name).create_dataset("tokens", shape=(self.length,), dtype=self.dtype)  # contiguous
        at = 0
        for b in self.blocks:
            if at + len(b) > self.length:
                raise AssertionError(f"internal error: {self.name} got more than {self.length} tokens")
            ds[at:at + len(b)] = b
            at += len(b)
        if at != self.length:
            raise AssertionError(f"internal error: {self.name} got {at} of {self.length} tokens")
        ds.attrs["context"] = np.int64(self.context)


def write_file(out, splits, root_attrs, version=FORMAT_VERSION, libver=None):
    """Writes `splits` (each with write(f)) to out atomically: OUT.tmp-<pid>, fsync, rename, fsync of the
    directory. libver: h5py's lower bound of the file format (None: the oldest that holds the data)."""
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise DataError(f"-o {out}: directory {out_dir} does not exist")
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w", libver=libver) as f:
            f.attrs["h5ddp_data_format"] = np.int64(version)
            for key, value in root_attrs.items():
                if value is not None:
                    f.attrs[key] = value
            for s in splits:
                s.write(f)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(out_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def norm_attrs(values, channels, what):
    """--mean/--std values as the attribute: a float32 scalar for one value, a float32 [C] array for C."""
    if values is None:
        return None
    if len(values) not in (1, channels):
        raise DataError(f"{what}: {len(values)} values; expected 1 or one per channel ({channels})")
    for v in values:
        if not math.isfinite(v):
            raise DataError(f"{what}: {v} is not a finite number")
    if what == "--std" and not all(v > 0 for v in values):
        raise DataError(f"{what}: every value must be > 0")
    return np.float32(values[0]) if len(values) == 1 else np.asarray(values, dtype=np.float32)


def parse_floats(text, what):
    try:
        return [float(t) for t in text.split(",")]
    except ValueError:
        raise DataError(f"{what} {text!r}: expected a number or comma-separated numbers (a,b,c)") from None


def summary_line(out, splits):
    parts = [f"{s.name} {s.x_shape[0]} x {shape_text(s.x_shape[1:])} {s.x_dtype.name}" for s in splits]
    return f"wrote {out}: " + ", ".join(parts)


# ---- IDX files (MNIST, Fashion-MNIST) ---------------------------------------------------------------------------


class IdxFile:
    """An IDX file of unsigned bytes, gzip or plain, read as a stream: header, rows in blocks, then the end."""

    def __init__(self, path, magic, ndims):
        self.path = path
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        self.f = gzip.open(path, "rb") if gz else open(path, "rb")
        header = self.read(4 + 4 * ndims, "header bytes")
        got = int.from_bytes(header[:4], "big")
        if got != magic:
            raise DataError(f"{path}: bad magic number {got} (0x{got:08x}); expected {magic} (0x{magic:08x}) "
                            f"for an IDX {'image' if magic == IDX_IMAGES_MAGIC else 'label'} file")
        self.dims = [int.from_bytes(header[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
        self.row_bytes = int(np.prod(self.dims[1:], dtype=np.int64)) if ndims > 1 else 1
        if self.dims[0] == 0 or self.row_bytes == 0 or self.row_bytes > (1 << 28):
            raise DataError(f"{path}: implausible dimensions {' x '.join(map(str, self.dims))}")

    def read(self, n, what):
        try:
            data = self.f.read(n)
        except (EOFError, OSError, zlib.error) as e:
            raise DataError(f"{self.path}: truncated or corrupt ({e}) while reading {what}") from None
        if len(data) != n:
            raise DataError(f"{self.path}: truncated: {what} need {n} bytes, got {len(data)}")
        return data

    def rows(self, at, m):
        """Rows at..at+m-1 (the next ones in the file) as a uint8 array [m, *dims[1:]]."""
        data = self.read(m * self.row_bytes, f"rows {at}..{at + m - 1} (of {self.dims[0]})")
        return np.frombuffer(data, dtype=np.uint8).reshape([m] + self.dims[1:])

    def finish(self):
        """After the last row: the file must end there (and a gzip stream pass its CRC check, done at its end)."""
        more = 0
        try:
            while True:
                chunk = self.f.read(1 << 20)
                if not chunk:
                    break
                more += len(chunk)
        except (EOFError, OSError, zlib.error) as e:  # a gzip stream without its trailer, or a bad CRC
            raise DataError(f"{self.path}: truncated or corrupt ({e})") from None
        self.f.close()
        if more:
            raise DataError(f"{self.path}: {more} bytes follow the {self.dims[0]} rows its header accounts for")


def idx_split(name, images_path, labels_path, num_classes, mean, std):
    images = IdxFile(images_path, IDX_IMAGES_MAGIC, 3)
    labels = IdxFile(labels_path, IDX_LABELS_MAGIC, 1)
    n = images.dims[0]
    if labels.dims[0] != n:
        raise DataError(f"{labels_path}: {labels.dims[0]} labels but {images_path} has {n} images")
    shape = (n, 1, images.dims[1], images.dims[2])
    attrs = {}
    if mean is not None:
        attrs["mean"] = mean
    if std is not None:
        attrs["std"] = std

    def blocks():
        for at in range(0, n, IDX_BLOCK_ROWS):
            m = min(IDX_BLOCK_ROWS, n - at)
            xb, yb = images.rows(at, m), labels.rows(at, m)
            check_labels(yb, at, num_classes, labels_path)
            yield xb.reshape((m,) + shape[1:]), yb
        images.finish()
        labels.finish()

    return Split(name, shape, np.uint8, (n,), np.uint8, blocks(), attrs)


def check_labels(y, first_row, num_classes, where):
    """Integer labels of rows first_row.. must be >= 0 and < num_classes (when given)."""
    bad = np.flatnonzero(y < 0)
    if y.dtype.kind == "u" and y.dtype.itemsize == 8:  # beyond int64 (h5ddp's label type): out of any range
        bad = np.union1d(bad, np.flatnonzero(y > np.iinfo(np.int64).max))
    if num_classes is not None:
        bad = np.union1d(bad, np.flatnonzero(y >= num_classes))
    if bad.size:
        i = int(bad[0])
        bound = f"[0, {num_classes})" if num_classes is not None else ">= 0"
        raise DataError(f"{where}: label {y[i]} at row {first_row + i} is outside {bound}")


def cmd_fashion_mnist(args):
    d = args.dir
    if not os.path.isdir(d):
        raise DataError(f"{d}: no such directory (Fashion-MNIST's four IDX .gz files; Debian: dataset-fashion-mnist)")
    mean, std = np.float32(FASHION_MNIST_MEAN), np.float32(FASHION_MNIST_STD)
    splits = [idx_split(split, os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"),
                        os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz"), 10, mean, std)
              for split, prefix in (("train", "train"), ("test", "t10k"))]
    write_file(args.output, splits, {"num_classes": np.int64(10), "source": f"Fashion-MNIST IDX files in {d}"})
    print(summary_line(args.output, splits) + ", 10 classes")


def cmd_idx(args):
    if (args.test_images is None) != (args.test_labels is None):
        raise DataError("--test-images and --test-labels go together")
    mean = norm_attrs(parse_floats(args.mean, "--mean"), 1, "--mean") if args.mean is not None else None
    std = norm_attrs(parse_floats(args.std, "--std"), 1, "--std") if args.std is not None else None
    k = check_num_classes(args.num_classes)
    splits = [idx_split("train", args.train_images, args.train_labels, k, mean, std)]
    if args.test_images is not None:
        splits.append(idx_split("test", args.test_images, args.test_labels, k, mean, std))
        if splits[1].x_shape[1:] != splits[0].x_shape[1:]:
            raise DataError(f"{args.test_images}: test images are {shape_text(splits[1].x_shape[1:])}, "
                            f"train images {shape_text(splits[0].x_shape[1:])}")
    source = f"IDX files {args.train_images}, {args.train_labels}"
    write_file(args.output, splits, {"num_classes": None if k is None else np.int64(k), "source": source})
    print(summary_line(args.output, splits))


def check_num_classes(k):
    if k is not None and k < 1:
        raise DataError(f"--num-classes {k}: must be >= 1")
    return k


# ---- .npz archives ------------------------------------------------------------------------------------------------


def read_npy_header(f, where):
    """The shape, Fortran flag and dtype of the .npy stream f, which is left at the first data byte."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(f)
        return np.lib.format._read_array_header(f, version)  # 3.0: the 2.0 header with UTF-8 field names
    except ValueError as e:
        raise DataError(f"{where}: not a .npy array ({e})") from None


class NpyMember:
    """One array of an .npz, read block of rows by block of rows straight from the zip member (stored or
    deflated), so an array larger than memory converts too. A Fortran-ordered array is loaded whole."""

    def __init__(self, npz_path, zf, key):
        self.where = f"{npz_path} {key}"
        self.zf, self.name = zf, key + ".npy"
        if self.name not in zf.namelist():
            keys = sorted(n[:-4] for n in zf.namelist() if n.endswith(".npy"))
            raise DataError(f"{npz_path}: no array {key!r} (it has {', '.join(keys) or 'none'})")
        with zf.open(self.name) as f:
            self.shape, self.fortran, self.dtype = read_npy_header(f, self.where)
        self.shape = tuple(int(d) for d in self.shape)
        if self.dtype.hasobject:
            raise DataError(f"{self.where}: an object array; expected numbers")
        if len(self.shape) == 0:
            raise DataError(f"{self.where}: a scalar; expected one row per sample")

    def blocks(self, rows):
        """Yields arrays of up to `rows` rows each, in order."""
        n, row_shape = self.shape[0], self.shape[1:]
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        with self.zf.open(self.name) as f:
            read_npy_header(f, self.where)
            if self.fortran:
                data = f.read(n * row_bytes)
                if len(data) != n * row_bytes:
                    raise DataError(f"{self.where}: truncated ({len(data)} of {n * row_bytes} bytes)")
                whole = np.frombuffer(data, dtype=self.dtype).reshape(self.shape[::-1]).transpose()
                for at in range(0, n, rows):
                    yield whole[at:at + rows]
                return
            for at in range(0, n, rows):
                m = min(rows, n - at)
                data = f.read(m * row_bytes)
                if len(data) != m * row_bytes:
                    raise DataError(f"{self.where}: truncated (rows {at}..{at + m - 1} incomplete)")
                yield np.frombuffer(data, dtype=self.dtype).reshape((m,) + row_shape)


def npz_x_dtype(member):
    dt = member.dtype
    if dt == np.dtype(np.uint8) or dt == np.dtype("<f4"):
        return dt
    if dt.kind not in "biuf":
        raise DataError(f"{member.where}: dtype {dt} is not numeric")
    return None  # converted to float32


def npz_y_dtype(member):
    dt = member.dtype
    if dt.kind in "iub":
        if len(member.shape) != 1:
            raise DataError(f"{member.where}: integer labels must be [N], got {shape_text(member.shape)}")
        return np.dtype("<i8")
    if dt.kind == "f":
        if len(member.shape) not in (1, 2):
            raise DataError(f"{member.where}: float targets must be [N] or [N, K], got {shape_text(member.shape)}")
        return np.dtype("<f4")
    raise DataError(f"{member.where}: dtype {dt}: expected integer labels or float targets")


class Stats:
    """Per-channel mean and (population) standard deviation in float64, merged block by block (Chan et al.)."""

    def __init__(self, channels):
        self.n = 0
        self.mean = np.zeros(channels)
        self.m2 = np.zeros(channels)

    def add(self, x):  # x: float64 [m, C, ...]
        c = x.shape[1]
        v = np.moveaxis(x, 1, 0).reshape(c, -1)
        nb = v.shape[1]
        if nb == 0:
            return
        mb = v.mean(axis=1)
        m2b = ((v - mb[:, None]) ** 2).sum(axis=1)
        n = self.n + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self.m2 = self.m2 + m2b + delta ** 2 * (self.n * nb / n)
        self.n = n

    def std(self):
        return np.sqrt(self.m2 / self.n)


def npz_split(name, path, zf, xkey, ykey, args, num_classes, attrs, train=None):
    """The Split of arrays xkey, ykey; for the test split, train = (the train Split, its x key)."""
    xm, ym = NpyMember(path, zf, xkey), NpyMember(path, zf, ykey)
    if len(xm.shape) < 2:
        raise DataError(f"{xm.where}: shape {shape_text(xm.shape)} has no sample dimension (expected [N, ...])")
    if xm.shape[0] != ym.shape[0]:
        raise DataError(f"{path}: {xkey} has {xm.shape[0]} rows but {ykey} has {ym.shape[0]}")
    if xm.shape[0] == 0:
        raise DataError(f"{xm.where}: no samples")
    x_dtype = npz_x_dtype(xm)
    if x_dtype is None:
        print(f"{xm.where}: converting {xm.dtype} to float32")
        x_dtype = np.dtype("<f4")
    y_dtype = npz_y_dtype(ym)
    shape = tuple(xm.shape)
    if args.channels_last:
        if len(shape) < 3:
            raise DataError(f"{xm.where}: --channels-last needs [N, ..., C], got {shape_text(shape)}")
        shape = (shape[0], shape[-1]) + shape[1:-1]
    if train is not None and shape[1:] != train[0].x_shape[1:]:
        raise DataError(f"{xm.where}: samples are {shape_text(shape[1:])} but {train[1]}'s are "
                        f"{shape_text(train[0].x_shape[1:])}")
    if train is not None and x_dtype != train[0].x_dtype:  # one normalisation (x/255 or x) for both splits
        raise DataError(f"{xm.where}: stored as {x_dtype.name} but {train[1]} as {train[0].x_dtype.name}; "
                        f"give both the same dtype")
    row_bytes = int(np.prod(xm.shape[1:], dtype=np.int64)) * 8
    rows = block_rows(row_bytes)
    stats = Stats(shape[1]) if args.compute_stats and name == "train" else None

    def blocks():
        at = 0
        for xb, yb in zip(xm.blocks(rows), ym.blocks(rows)):
            if args.channels_last:
                xb = np.moveaxis(xb, -1, 1)
            if stats is not None:
                xs = xb.astype(np.float64)
                if xb.dtype == np.uint8:
                    xs /= 255.0
                stats.add(xs)
            if yb.dtype.kind in "iub":
                check_labels(yb, at, num_classes, ym.where)
            elif not np.isfinite(yb).all():
                raise DataError(f"{ym.where}: a target at row {at + int(np.flatnonzero(~np.isfinite(yb))[0])} "
                                f"is not finite")
            yield np.ascontiguousarray(xb, dtype=x_dtype), yb.astype(y_dtype)
            at += len(xb)
        if stats is not None:
            std = stats.std()
            if not (std > 0).all():
                c = int(np.flatnonzero(~(std > 0))[0])
                raise DataError(f"{xm.where}: channel {c} is constant (std 0); pass --mean and --std instead")
            attrs["mean"] = stats.mean.astype(np.float32)
            attrs["std"] = std.astype(np.float32)
            print(f"{xm.where}: per-channel mean {np.array2string(stats.mean, precision=6, separator=',')} "
                  f"std {np.array2string(std, precision=6, separator=',')}")

    return Split(name, shape, x_dtype, ym.shape, y_dtype, blocks(), attrs), ym.dtype.kind


def cmd_npz(args):
    if args.compute_stats and (args.mean is not None or args.std is not None):
        raise DataError("--compute-stats takes no --mean/--std")
    k = check_num_classes(args.num_classes)
    if not os.path.isfile(args.input):
        raise DataError(f"{args.input}: no such file")
    try:
        zf = zipfile.ZipFile(args.input)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{args.input}: not an .npz archive ({e})") from None
    with zf:
        names = {n[:-4] for n in zf.namelist() if n.endswith(".npy")}
        has_test = args.x_test in names or args.y_test in names
        # One attribute dict for both x: --mean/--std, or the train set's statistics (taken while train is
        # written, before test is), normalise both splits alike.
        attrs = {}
        train, train_kind = npz_split("train", args.input, zf, args.x_train, args.y_train, args, k, attrs)
        splits = [train]
        if has_test:
            test, test_kind = npz_split("test", args.input, zf, args.x_test, args.y_test, args, k, attrs,
                                        (train, args.x_train))
            if (test_kind == "f") != (train_kind == "f") or test.y_shape[1:] != train.y_shape[1:]:
                raise DataError(f"{args.input}: {args.y_test} ({test.y_dtype.name} {shape_text(test.y_shape)}) is not "
                                f"the kind of {args.y_train} ({train.y_dtype.name} {shape_text(train.y_shape)})")
            splits.append(test)
        channels = train.x_shape[1]
        for key, text in (("mean", args.mean), ("std", args.std)):
            if text is not None:
                attrs[key] = norm_attrs(parse_floats(text, "--" + key), channels, "--" + key)
        if train.y_dtype.kind == "f" and k is not None:
            raise DataError(f"--num-classes {k}: {args.input} {args.y_train} holds float targets (regression)")
        write_file(args.output, splits, {"num_classes": None if k is None else np.int64(k),
                                         "source": os.path.basename(args.input)})
    note = "" if len(splits) > 1 else f" (no {args.x_test}/{args.y_test}: train only, h5ddp-train needs --no-eval)"
    print(summary_line(args.output, splits) + note)


# ---- token data: text files and .bin token arrays ------------------------------------------------------------------


def check_context(t):
    if t < 1:
        raise DataError(f"--context {t}: must be >= 1")
    return t


def exact_fraction(text):
    """--test-fraction as an exact fraction (0.1 is 1/10), so the split point floor(F * L) has no rounding error."""
    try:
        f = fractions.Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= f < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0 and < 1")
    return f


def short_window(where, n, context):
    return DataError(f"{where}: {n} tokens; the stream is shorter than one window ({context + 1} tokens at "
                     f"--context {context})")


def check_ids(b, first, vocab_size, where, labels=False):
    """The token ids of b (1-D: from index `first`; 2-D: from row `first`) must lie in [0, vocab_size); labels=True:
    per-position labels, which may also be -100. Else DataError naming the first bad one and where it is."""
    bad = b >= vocab_size
    if b.dtype.kind == "i":
        bad |= b < 0
        if labels:
            bad &= b != IGNORE_INDEX
    if not bad.any():
        return
    i = tuple(int(v) for v in np.argwhere(bad)[0])
    at = f"index {first + i[0]}" if b.ndim == 1 else f"row {first + i[0]}, position {i[1]}"
    what, extra = ("label", f" and is not {IGNORE_INDEX}") if labels else ("token id", "")
    raise DataError(f"{where}: {what} {b[i]} at {at} is outside [0, {vocab_size}){extra}")


class Cut:
    """The blocks of one stream of ids handed out as consecutive runs of given lengths (train's, then test's)."""

    def __init__(self, blocks, where):
        self.blocks, self.where, self.rest = iter(blocks), where, None

    def take(self, n, last):
        while n > 0:
            if self.rest is None or not len(self.rest):
                self.rest = next(self.blocks, None)
                if self.rest is None:
                    raise DataError(f"{self.where}: changed while being read (shorter than at the first pass)")
                continue
            b, self.rest = self.rest[:n], self.rest[n:]
            n -= len(b)
            yield b
        if last and ((self.rest is not None and len(self.rest)) or any(len(b) for b in self.blocks)):
            raise DataError(f"{self.where}: changed while being read (longer than at the first pass)")


def text_files(paths):
    """The files `text` reads, in order: each FILE as given, each DIR as its regular files (not symlinks) whose
    names have no '.', sorted by name."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            names = sorted(n for n in os.listdir(p) if "." not in n and os.path.isfile(os.path.join(p, n))
                           and not os.path.islink(os.path.join(p, n)))
            if not names:
                raise DataError(f"{p}: no regular file whose name has no '.' in this directory")
            files += [os.path.join(p, n) for n in names]
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise DataError(f"{p}: no such file or directory")
    return files


def text_blocks(files):
    """Yields (bytes, str) blocks of the files' concatenation: each file's bytes as is, and a newline after a file
    that does not end with one when another (non-empty) file follows. Every file must be UTF-8 (else DataError
    naming the file and the byte)."""
    newline_due = False
    for path in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        at, last = 0, b""
        with open(path, "rb") as f:
            while True:
                data = f.read(TEXT_BLOCK_BYTES)
                held = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
                try:
                    text = decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}: not UTF-8 text (byte {at - held + e.start}: {e.reason}); to take the "
                                    f"text files of a directory, give the directory") from None
                if not data:
                    break
                if newline_due:
                    yield b"\n", "\n"
                    newline_due = False
                yield data, text
                at, last = at + len(data), data[-1:]
        if at:
            newline_due = last != b"\n"


def cmd_text(args):
    context = check_context(args.context)
    files = text_files(args.inputs)
    where = files[0] if len(files) == 1 else f"{len(files)} files of {', '.join(args.inputs)}"[:300]
    length, chars = 0, set()
    for data, text in text_blocks(files):  # pass 1: UTF-8 checked before any output; the length; the characters
        if args.tokenizer == "bytes":
            length += len(data)
        else:
            length += len(text)
            chars.update(text)
    n_test = length * args.test_fraction.numerator // args.test_fraction.denominator
    n_train = length - n_test
    if n_train < context + 1:
        raise short_window(f"{where} (/train/tokens)", n_train, context)
    if args.test_fraction and n_test < context + 1:
        raise short_window(f"{where} (/test/tokens, --test-fraction {args.test_fraction})", n_test, context)
    if args.tokenizer == "bytes":
        vocab, vocab_size = None, 256
        ids = (np.frombuffer(data, np.uint8) for data, _ in text_blocks(files))
    else:
        vocab = np.array(sorted(map(ord, chars)), dtype=np.int32)
        vocab_size = len(vocab)
        table = np.zeros(int(vocab[-1]) + 1, np.uint32)  # code point -> id
        table[vocab] = np.arange(vocab_size, dtype=np.uint32)
        ids = (table[np.frombuffer(text.encode("utf-32-le"), "<u4")] for _, text in text_blocks(files))
    dtype = np.uint16 if vocab_size <= 65536 else np.uint32
    cut = Cut(ids, where)
    splits = [TokenSplit("train", n_train, dtype, cut.take(n_train, last=not n_test), context)]
    if n_test:
        splits.append(TokenSplit("test", n_test, dtype, cut.take(n_test, last=True), context))
    source = f"text ({len(files)} file{'s' if len(files) > 1 else ''}): {', '.join(args.inputs)}"
    # h5py's default file format keeps attributes under 64 KiB; chars files may need a larger vocab (> ~16000 code
    # points): HDF5 1.8's format stores it densely, and every HDF5 since 1.8 reads it.
    write_file(args.output, splits, {"vocab_size": np.int64(vocab_size), "tokenizer": args.tokenizer, "vocab": vocab,
                                     "source": source if len(source) <= 1000 else source[:997] + "..."},
               TOKEN_FORMAT_VERSION, libver=None if vocab is None else ("v108", "latest"))
    print(token_summary(args.output, splits, vocab_size, args.tokenizer))


def windows(n):
    return f"{n} window{'' if n == 1 else 's'}"


def token_summary(out, splits, vocab_size, tokenizer):
    parts = [f"{s.name} {s.length} tokens ({windows((s.length - 1) // s.context)})" for s in splits]
    return (f"wrote {out}: " + ", ".join(parts) + f"; {splits[0].dtype.name}, vocab_size {vocab_size}, "
            f"tokenizer {tokenizer or '(none)'}, context {splits[0].context}")


class TokenBin:
    """A .bin of token ids: raw little-endian uint16 or uint32 (as nanoGPT writes np.uint16 arrays), or llm.c's,
    detected by its magic: a header of 256 int32 (magic 20240520, version 1, token count), then uint16 ids."""

    def __init__(self, path, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(LLMC_HEADER_BYTES)
        self.offset, self.kind = 0, "raw"
        if len(head) >= 4 and int.from_bytes(head[:4], "little") == LLMC_MAGIC:
            if len(head) < LLMC_HEADER_BYTES:
                raise DataError(f"{path}: starts with llm.c's magic {LLMC_MAGIC} but has {size} bytes, fewer than its "
                                f"{LLMC_HEADER_BYTES}-byte header")
            version, count = (int(v) for v in np.frombuffer(head, "<i4")[1:3])
            if version != LLMC_VERSION:
                raise DataError(f"{path}: llm.c header version {version}; expected {LLMC_VERSION} (uint16 tokens)")
            if self.dtype != np.dtype("<u2"):
                raise DataError(f"{path}: an llm.c .bin (magic {LLMC_MAGIC}) holds uint16 tokens, not --dtype "
                                f"{self.dtype.name}")
            body = size - LLMC_HEADER_BYTES
            if count < 0 or 2 * count != body:
                raise DataError(f"{path}: the llm.c header says {count} tokens but {body} bytes follow it "
                                f"({body / 2:g} uint16 tokens)")
            self.offset, self.kind = LLMC_HEADER_BYTES, "llm.c"
        elif size % self.dtype.itemsize:
            raise DataError(f"{path}: {size} bytes is not a whole number of {self.dtype.name} tokens")
        self.length = (size - self.offset) // self.dtype.itemsize

    def blocks(self, vocab_size):
        """The ids in blocks, each checked < vocab_size."""
        item = self.dtype.itemsize
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for at in range(0, self.length, TOKEN_BLOCK):
                m = min(TOKEN_BLOCK, self.length - at)
                data = f.read(m * item)
                if len(data) != m * item:
                    raise DataError(f"{self.path}: changed while being read (it ends at token "
                                    f"{at + len(data) // item})")
                ids = np.frombuffer(data, self.dtype)
                check_ids(ids, at, vocab_size, self.path)
                yield ids


def cmd_tokens(args):
    context = check_context(args.context)
    if args.vocab_size < 1:
        raise DataError(f"--vocab-size {args.vocab_size}: must be >= 1")
    dtype = np.dtype({"uint16": "<u2", "uint32": "<u4"}[args.dtype])
    bins = [("train", TokenBin(args.input, dtype))]
    if args.test is not None:
        bins.append(("test", TokenBin(args.test, dtype)))
    for _, b in bins:
        if b.length < context + 1:
            raise short_window(b.path, b.length, context)
    splits = [TokenSplit(name, b.length, dtype, b.blocks(args.vocab_size), context) for name, b in bins]
    source = ", ".join(f"{b.kind} .bin {b.path}" for _, b in bins)
    write_file(args.output, splits, {"vocab_size": np.int64(args.vocab_size), "tokenizer": args.tokenizer,
                                     "source": source}, TOKEN_FORMAT_VERSION)
    print(token_summary(args.output, splits, args.vocab_size, args.tokenizer))


# ---- check ----------------------------------------------------------------------------------------------------------


def check_column(path, f, name, size):
    if name not in f:
        raise DataError(f"{path} {name}: missing (docs/DATA.md)")
    ds = f[name]
    if not isinstance(ds, h5py.Dataset):
        raise DataError(f"{path} {name}: not a dataset")
    if ds.ndim == 0:
        raise DataError(f"{path} {name}: a scalar; expected one row per sample")
    dcpl = ds.id.get_create_plist()
    if dcpl.get_layout() != h5py.h5d.CONTIGUOUS or dcpl.get_external_count() > 0 or dcpl.get_nfilters() > 0:
        raise DataError(f"{path} {name}: stored chunked or compressed; h5ddp reads contiguous datasets by file offset "
                        f"(rewrite it: h5repack -l CONTI {path} OUT.h5)")
    if ds.size > 0:
        offset = ds.id.get_offset()
        if offset is None:
            raise DataError(f"{path} {name}: has no data written")
        end = offset + ds.size * ds.dtype.itemsize
        if end > size:
            raise DataError(f"{path} {name}: the file is cut short ({size} bytes, the dataset ends at {end})")
    return ds


def check_channel_attr(path, x, key, channels):
    if key not in x.attrs:
        return None
    a = np.asarray(x.attrs[key])
    if a.dtype.kind not in "iuf":
        raise DataError(f"{path} {x.name}: attribute {key} is not a number")
    if not (a.ndim == 0 or (a.ndim == 1 and a.size in (1, channels))):
        raise DataError(f"{path} {x.name}: attribute {key} has shape {shape_text(a.shape)}; expected a scalar, "
                        f"[1] or one per channel [{channels}]")
    v = a.astype(np.float64).reshape(-1)
    if not np.isfinite(v).all():
        raise DataError(f"{path} {x.name}: attribute {key} is not finite")
    if key == "std" and not (v > 0).all():
        raise DataError(f"{path} {x.name}: attribute std must be > 0")
    return v


def check_split(path, f, split, size, num_classes):
    x = check_column(path, f, f"/{split}/x", size)
    y = check_column(path, f, f"/{split}/y", size)
    if x.dtype.str not in ("|u1", "<f4"):
        hint = ", or token ids with the root attribute vocab_size" if is_int(x.dtype) else ""
        raise DataError(f"{path} {x.name}: dtype {x.dtype.str}; expected uint8 or float32 (little-endian){hint}")
    if x.ndim < 2:
        raise DataError(f"{path} {x.name}: shape {shape_text(x.shape)} has no sample dimension (expected [N, ...])")
    if x.shape[0] == 0:
        raise DataError(f"{path} {x.name}: no samples")
    if y.shape[0] != x.shape[0]:
        raise DataError(f"{path}: {x.name} has {x.shape[0]} rows but {y.name} has {y.shape[0]}")
    dt = y.dtype
    if dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8) and dt.byteorder in ("<", "|", "="):
        if y.ndim != 1:
            raise DataError(f"{path} {y.name}: integer labels must be [N], got {shape_text(y.shape)}")
        lo, hi = None, None
        step = 1 << 20
        for at in range(0, y.shape[0], step):
            b = y[at:at + step]
            check_labels(b, at, num_classes, f"{path} {y.name}")
            lo = int(b.min()) if lo is None else min(lo, int(b.min()))
            hi = int(b.max()) if hi is None else max(hi, int(b.max()))
        kind = ("labels", dt.name, lo, hi)
    elif dt.str == "<f4":
        if y.ndim not in (1, 2):
            raise DataError(f"{path} {y.name}: float targets must be [N] or [N, K], got {shape_text(y.shape)}")
        step = max(1, (1 << 22) // max(1, int(np.prod(y.shape[1:], dtype=np.int64))))
        for at in range(0, y.shape[0], step):
            b = y[at:at + step]
            if not np.isfinite(b).all():
                raise DataError(f"{path} {y.name}: a target at row {at + int(np.argwhere(~np.isfinite(b))[0][0])} "
                                f"is not finite")
        kind = ("targets", dt.name, y.shape[1:])
    else:
        raise DataError(f"{path} {y.name}: dtype {dt.str}; expected an integer type (labels) or float32 (targets), "
                        f"little-endian")
    mean = check_channel_attr(path, x, "mean", x.shape[1])
    std = check_channel_attr(path, x, "std", x.shape[1])
    return x, y, kind, mean, std


def is_int(dt):
    """An integer type h5ddp reads: 1, 2, 4 or 8 bytes, little-endian."""
    return dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8) and dt.byteorder in ("<", "|", "=")


def int_attr(where, obj, key, minimum):
    """Attribute `key` of obj, which must be one integer >= minimum; None when absent."""
    if key not in obj.attrs:
        return None
    a = np.asarray(obj.attrs[key])
    if a.dtype.kind not in "iu" or a.size != 1 or int(a.reshape(-1)[0]) < minimum:
        raise DataError(f"{where}: attribute {key} must be one integer >= {minimum}, got {a!r}")
    return int(a.reshape(-1)[0])


def check_vocab(path, f, vocab_size):
    """The root attributes tokenizer and vocab beside vocab_size; returns the tokenizer (None when absent)."""
    tok = f.attrs.get("tokenizer")
    if isinstance(tok, bytes):
        tok = tok.decode("utf-8", "replace")
    if tok is not None and not isinstance(tok, str):
        raise DataError(f"{path}: attribute tokenizer is not a string")
    if tok == "bytes" and vocab_size != 256:
        raise DataError(f"{path}: tokenizer bytes with vocab_size {vocab_size}; byte ids need vocab_size 256")
    if "vocab" in f.attrs:
        v = np.asarray(f.attrs["vocab"])
        if v.dtype.str != "<i4" or v.shape != (vocab_size,):
            raise DataError(f"{path}: attribute vocab is {v.dtype.str} {shape_text(v.shape)}; expected int32 "
                            f"[{vocab_size}] (vocab_size code points)")
        bad = np.flatnonzero((v < 0) | (v > MAX_CODE_POINT) | ((v >= 0xD800) & (v <= 0xDFFF)))
        if bad.size:
            raise DataError(f"{path}: attribute vocab: {v[bad[0]]} (id {bad[0]}) is not a Unicode code point")
        if np.unique(v).size != v.size:
            raise DataError(f"{path}: attribute vocab holds a code point twice")
    elif tok == "chars":
        raise DataError(f"{path}: tokenizer chars without the root attribute vocab (the code point of each id)")
    return tok


def check_stream(path, f, split, size, vocab_size, context):
    """Layout T2 of one split: /split/tokens [L], context T from its attribute or `context` (--context)."""
    t = check_column(path, f, f"/{split}/tokens", size)
    where = f"{path} {t.name}"
    if t.dtype.str not in TOKEN_DTYPES:
        raise DataError(f"{where}: dtype {t.dtype.str}; expected uint16 or uint32 (also int32, int64), little-endian")
    if t.ndim != 1:
        raise DataError(f"{where}: shape {shape_text(t.shape)}; a token stream is 1-D [L]")
    own = int_attr(where, t, "context", 1)
    T = context if context is not None else own
    if T is None:
        raise DataError(f"{where}: no attribute context; write it, or give --context T (as to h5ddp-train)")
    n = t.shape[0]
    if n < T + 1:
        raise DataError(f"{where}: {n} tokens; the stream is shorter than one window ({T + 1} tokens at context {T})")
    for at in range(0, n, TOKEN_BLOCK):
        check_ids(t[at:at + TOKEN_BLOCK], at, vocab_size, where)
    return {"layout": "T2", "T": T, "tokens": n, "windows": (n - 1) // T, "dtype": t.dtype.name}


def check_samples(path, f, split, size, vocab_size, num_classes):
    """Layout T1 of one split: /split/x [N, T] token ids, /split/y [N] class labels or [N, T] per-position labels."""
    x = check_column(path, f, f"/{split}/x", size)
    y = check_column(path, f, f"/{split}/y", size)
    if not is_int(x.dtype):
        raise DataError(f"{path} {x.name}: dtype {x.dtype.str}; token ids (the root has vocab_size) are an integer "
                        f"type, little-endian")
    if x.ndim != 2 or 0 in x.shape:
        raise DataError(f"{path} {x.name}: shape {shape_text(x.shape)}; token samples are [N, T] with N, T >= 1")
    n, T = x.shape
    for key in ("mean", "std"):
        if key in x.attrs:
            raise DataError(f"{path} {x.name}: attribute {key} on token ids, which are not normalised; remove it")
    if y.shape[0] != n:
        raise DataError(f"{path}: {x.name} has {n} rows but {y.name} has {y.shape[0]}")
    if not is_int(y.dtype):
        raise DataError(f"{path} {y.name}: dtype {y.dtype.str}; labels of token samples are an integer type, "
                        f"little-endian")
    if not (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == T)):
        raise DataError(f"{path} {y.name}: label shape does not match: {shape_text(y.shape)} for x "
                        f"{shape_text(x.shape)} (expected [{n}] or [{n}, {T}])")
    rows = max(1, TOKEN_BLOCK // T)
    lo, hi, ignored = None, None, 0
    for at in range(0, n, rows):
        check_ids(x[at:at + rows], at, vocab_size, f"{path} {x.name}")
        b = y[at:at + rows]
        if y.ndim == 1:
            check_labels(b, at, num_classes, f"{path} {y.name}")
        else:
            check_ids(b, at, vocab_size, f"{path} {y.name}", labels=True)
            ignored += int(np.count_nonzero(b == IGNORE_INDEX)) if b.dtype.kind == "i" else 0
            b = b[b != IGNORE_INDEX] if b.dtype.kind == "i" else b
        if b.size:
            lo = int(b.min()) if lo is None else min(lo, int(b.min()))
            hi = int(b.max()) if hi is None else max(hi, int(b.max()))
    return {"layout": "T1", "T": T, "samples": n, "dtype": x.dtype.name, "per_position": y.ndim == 2,
            "y_dtype": y.dtype.name, "lo": lo, "hi": hi, "ignored": ignored}


def check_token_split(path, f, split, size, vocab_size, num_classes, context):
    g = f[f"/{split}"]
    if "tokens" in g and ("x" in g or "y" in g):
        raise DataError(f"{path} /{split}: holds both tokens and x/y; a split holds one or the other (docs/DATA.md)")
    if "tokens" in g:
        return check_stream(path, f, split, size, vocab_size, context)
    return check_samples(path, f, split, size, vocab_size, num_classes)


def describe_token_split(name, s, num_classes):
    if s["layout"] == "T2":
        return (f"{name}: token stream (layout T2) of {s['tokens']} {s['dtype']} tokens, {windows(s['windows'])} of "
                f"{s['T']} + 1")
    text = f"{name}: {s['samples']} token samples (layout T1) of {s['T']} {s['dtype']} ids, "
    bounds = f"in [{s['lo']}, {s['hi']}]" if s["lo"] is not None else "none in range"
    if s["per_position"]:
        return text + f"per-position {s['y_dtype']} labels {bounds}, {s['ignored']} ignored (-100)"
    classes = f", {num_classes} classes" if num_classes is not None else ""
    return text + f"{s['y_dtype']} class labels {bounds}{classes}"


def token_report(path, f, size, vocab_size, num_classes, context, names):
    """Checks the token data of every split; the part of check's summary after the file's own description."""
    tokenizer = check_vocab(path, f, vocab_size)
    splits = {name: check_token_split(path, f, name, size, vocab_size, num_classes, context) for name in names}
    train, test = splits["train"], splits.get("test")
    if test is not None:
        if (test["layout"], test["T"], test.get("per_position")) != (train["layout"], train["T"],
                                                                      train.get("per_position")):
            what = "tokens" if test["layout"] == "T2" else "y"
            raise DataError(f"{path} /test/{what}: layout {test['layout']} with T = {test['T']} is not the train "
                            f"split's ({train['layout']}, T = {train['T']}, the same kind of labels)")
    if train["layout"] == "T2" or train["per_position"]:
        task = "a language model (next-token cross-entropy over [B, T, V] logits)"
    else:
        task = "sequence classification (cross-entropy, accuracy)"
    text = f"Token data: vocab_size {vocab_size}, tokenizer {tokenizer or '(none)'}, context T = {train['T']}: {task}. "
    text += "; ".join(describe_token_split(n, s, num_classes) for n, s in splits.items())
    if test is None:
        text += "; no test split (h5ddp-train needs --no-eval)"
    if train["layout"] == "T2":
        text += ". Window i is tokens[i*T : i*T + T + 1]: x its first T, y its last T (next-token labels)"
    return text + f". Ids in [0, {vocab_size})"


def fmt_values(v):
    if v is None:
        return None
    return ", ".join(f"{float(np.float32(e)):.4g}" for e in v)


def feature_report(path, f, size, num_classes, names):
    """Checks x/y image or feature data (format 1); the part of check's summary after the file's description."""
    tx, ty, tkind, mean, std = check_split(path, f, "train", size, num_classes)
    test = None
    if "test" in names:
        test = check_split(path, f, "test", size, num_classes)
        if test[0].shape[1:] != tx.shape[1:]:
            raise DataError(f"{path} /test/x: samples are {shape_text(test[0].shape[1:])} but /train/x's are "
                            f"{shape_text(tx.shape[1:])}")
        if test[2][0] != tkind[0] or (tkind[0] == "targets" and test[2][2] != tkind[2]):
            raise DataError(f"{path} /test/y: {test[1].dtype.name} {shape_text(test[1].shape)} is not the kind of "
                            f"/train/y ({ty.dtype.name} {shape_text(ty.shape)})")
    text = f"train: {tx.shape[0]} samples"
    text += f", test: {test[0].shape[0]} samples" if test else ", no test split (h5ddp-train needs --no-eval)"
    text += f"; each sample {shape_text(tx.shape[1:])} {tx.dtype.name}"
    scale = "x/255" if tx.dtype == np.uint8 else "x"
    text += f", fed as ({scale} - mean) / std with mean {fmt_values(mean) or '0 (default)'}, " \
            f"std {fmt_values(std) or '1 (default)'}"
    if tkind[0] == "labels":
        lo, hi = tkind[2], tkind[3]
        if test:
            lo, hi = min(lo, test[2][2]), max(hi, test[2][3])
        classes = f"{num_classes} classes" if num_classes is not None else \
            "no num_classes attribute (the model's output width bounds the labels)"
        text += f"; {tkind[1]} labels in [{lo}, {hi}], {classes}: classification (cross-entropy, accuracy)"
    else:
        width = f"[N, {tkind[2][0]}]" if tkind[2] else "[N]"
        text += f"; float32 targets {width}: regression (MSE loss)"
    return text


def cmd_check(args):
    path = args.file
    if args.context is not None:
        check_context(args.context)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if not h5py.is_hdf5(path):
        raise DataError(f"{path}: not an HDF5 file")
    size = os.path.getsize(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"{path}: HDF5 cannot open it ({e})") from None
    with f:
        version = None
        if "h5ddp_data_format" in f.attrs:
            version = np.asarray(f.attrs["h5ddp_data_format"])
            if version.dtype.kind not in "iu" or version.size != 1 or int(version.reshape(-1)[0]) not in KNOWN_FORMATS:
                raise DataError(f"{path}: attribute h5ddp_data_format is {version!r}; this tool knows formats "
                                f"{', '.join(map(str, KNOWN_FORMATS))}")
            version = int(version.reshape(-1)[0])
        num_classes = int_attr(path, f, "num_classes", 1)
        vocab_size = int_attr(path, f, "vocab_size", 1)
        if "/train" not in f:
            raise DataError(f"{path} /train: missing (docs/DATA.md)")
        names = [n for n in ("train", "test") if n in f]
        for n in names:
            if not isinstance(f[n], h5py.Group):
                raise DataError(f"{path} /{n}: not a group")
            if vocab_size is None and "tokens" in f[n]:
                raise DataError(f"{path} /{n}/tokens: token data needs the root attribute vocab_size")
        if vocab_size is None:
            report = feature_report(path, f, size, num_classes, names)
        else:
            report = token_report(path, f, size, vocab_size, num_classes, args.context, names)
        source = f.attrs.get("source")
        if isinstance(source, bytes):
            source = source.decode("utf-8", "replace")

    text = f"{path}: h5ddp data format {version if version is not None else '(unmarked)'}"
    if source:
        text += f", from {source}"
    print(text + ". " + report + ". All datasets contiguous: h5ddp-train --data can read it.")


# ---- command line -----------------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 2 too, in one line after the usage
        self.print_usage(sys.stderr)
        print(f"h5ddp-data: error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    p = Parser(prog="h5ddp-data.py", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    fm = sub.add_parser("fashion-mnist", help="convert Fashion-MNIST's four IDX .gz files")
    fm.add_argument("dir", nargs="?", default=FASHION_MNIST_DIR, help=f"their directory (default {FASHION_MNIST_DIR})")
    fm.add_argument("-o", "--output", required=True, help="the HDF5 file to write")

    idx = sub.add_parser("idx", help="convert IDX image and label files (MNIST-like; gzip or plain)")
    idx.add_argument("--train-images", required=True)
    idx.add_argument("--train-labels", required=True)
    idx.add_argument("--test-images")
    idx.add_argument("--test-labels")
    idx.add_argument("-o", "--output", required=True)
    idx.add_argument("--mean", help="normalisation mean on the x/255 scale (attribute mean of x)")
    idx.add_argument("--std", help="normalisation std on the x/255 scale (attribute std of x)")
    idx.add_argument("--num-classes", type=int, help="labels must be < K; written as attribute num_classes")

    npz = sub.add_parser("npz", help="convert arrays of a NumPy .npz archive")
    npz.add_argument("input", help="the .npz file")
    npz.add_argument("-o", "--output", required=True)
    npz.add_argument("--x-train", default="x_train")
    npz.add_argument("--y-train", default="y_train")
    npz.add_argument("--x-test", default="x_test")
    npz.add_argument("--y-test", default="y_test")
    npz.add_argument("--channels-last", action="store_true", help="x is [N, H, W, C]: store it as [N, C, H, W]")
    npz.add_argument("--mean", help="a or a,b,c (one per channel; on the x/255 scale for uint8 x)")
    npz.add_argument("--std", help="a or a,b,c (one per channel; on the x/255 scale for uint8 x)")
    npz.add_argument("--compute-stats", action="store_true",
                     help="store the train set's per-channel mean and std (population) as the normalisation")
    npz.add_argument("--num-classes", type=int, help="labels must be < K; written as attribute num_classes")

    tx = sub.add_parser("text", help="tokenise UTF-8 text files into a token stream (layout T2)")
    tx.add_argument("inputs", nargs="+", metavar="FILE|DIR",
                    help="text files, joined in order; a directory: its regular files without '.' in the name, sorted")
    tx.add_argument("-o", "--output", required=True)
    tx.add_argument("--tokenizer", choices=("bytes", "chars"), default="bytes",
                    help="bytes: id = UTF-8 byte (vocab_size 256); chars: id = index of the code point among the "
                         "text's distinct ones, sorted (default bytes)")
    tx.add_argument("--test-fraction", type=exact_fraction, default="0.1", metavar="F",
                    help="the last floor(F * L) tokens are /test/tokens; 0: no test split (default 0.1)")
    tx.add_argument("--context", type=int, default=DEFAULT_CONTEXT, metavar="T",
                    help=f"attribute context of the streams; each split needs T + 1 tokens (default {DEFAULT_CONTEXT})")

    tk = sub.add_parser("tokens", help="convert .bin token arrays (nanoGPT raw, llm.c with header) to a token stream")
    tk.add_argument("input", metavar="TRAIN.bin")
    tk.add_argument("--test", metavar="TEST.bin")
    tk.add_argument("--vocab-size", type=int, required=True, metavar="V", help="every id must be < V")
    tk.add_argument("-o", "--output", required=True)
    tk.add_argument("--dtype", choices=("uint16", "uint32"), default="uint16",
                    help="type of a raw .bin's ids, kept in the output (default uint16; llm.c's are uint16)")
    tk.add_argument("--context", type=int, default=DEFAULT_CONTEXT, metavar="T",
                    help=f"attribute context of the streams; each needs T + 1 tokens (default {DEFAULT_CONTEXT})")
    tk.add_argument("--tokenizer", metavar="NAME", help="written as the root attribute tokenizer (e.g. gpt2)")

    ck = sub.add_parser("check", help="validate a file against the layout of docs/DATA.md and summarise it")
    ck.add_argument("file")
    ck.add_argument("--context", type=int, metavar="T",
                    help="the context of token streams, instead of their attribute context (as h5ddp-train --context)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    commands = {"fashion-mnist": cmd_fashion_mnist, "idx": cmd_idx, "npz": cmd_npz, "text": cmd_text,
                "tokens": cmd_tokens, "check": cmd_check}
    try:
        commands[args.command](args)
    except (DataError, OSError) as e:  # OSError: a file that cannot be read or written (HDF5's too)
        print(f"h5ddp-data: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
