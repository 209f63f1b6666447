#!/usr/bin/python3
"""Writes and checks HDF5 data sets in the layout h5ddp-train --data FILE.h5 reads (docs/DATA.md):
/train/x [N, *S] uint8 or float32, /train/y [N] integer labels or float32 [N] / [N, K] targets, optional
/test/x and /test/y alike, every dataset contiguous; mean/std attributes on x, num_classes on the root.

  h5ddp-data.py fashion-mnist [DIR] -o OUT.h5
  h5ddp-data.py idx --train-images F --train-labels F [--test-images F --test-labels F] -o OUT.h5
                    [--mean M --std S] [--num-classes K]
  h5ddp-data.py npz IN.npz -o OUT.h5 [--x-train KEY --y-train KEY --x-test KEY --y-test KEY] [--channels-last]
                    [--mean a,b,c --std a,b,c | --compute-stats] [--num-classes K]
  h5ddp-data.py check FILE.h5

Outputs are written to OUT.h5.tmp-<pid>, fsynced and renamed, so OUT.h5 is either the old file or the whole new
one. Inputs are streamed in blocks of rows (IDX files and the .npy members of an .npz alike), so memory does not
grow with N. Bad input: one line on stderr naming the file (and dataset), exit 2.
Needs numpy and h5py (Debian: python3-numpy, python3-h5py).
"""
import argparse
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

FORMAT_VERSION = 1
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = 0.2860  # h5ddp's built-in normalisation (src/train/data.hpp), stored as float32
FASHION_MNIST_STD = 0.3530
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
BLOCK_BYTES = 64 << 20  # rows are streamed in blocks of about this many bytes (as float64 for statistics)
IDX_BLOCK_ROWS = 10000


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


def write_file(out, splits, root_attrs):
    """Writes `splits` to out atomically: OUT.tmp-<pid>, fsync, rename, fsync of the directory."""
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise DataError(f"-o {out}: directory {out_dir} does not exist")
    tmp = f"{out}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["h5ddp_data_format"] = np.int64(FORMAT_VERSION)
            for key, value in root_attrs.items():
                if value is not None:
                    f.attrs[key] = value
            for s in splits:
                g = f.create_group(s.name)
                # No chunks, compression, filters or maxshape: contiguous, which h5ddp reads by file offset.
                x = g.create_dataset("x", shape=s.x_shape, dtype=s.x_dtype)
                y = g.create_dataset("y", shape=s.y_shape, dtype=s.y_dtype)
                at = 0
                for xb, yb in s.blocks:
                    n = len(xb)
                    if len(yb) != n or at + n > s.x_shape[0]:
                        raise AssertionError("internal error: block sizes disagree")
                    x[at:at + n] = xb
                    y[at:at + n] = yb
                    at += n
                if at != s.x_shape[0]:
                    raise AssertionError(f"internal error: {s.name} got {at} of {s.x_shape[0]} rows")
                for key, value in s.x_attrs.items():
                    x.attrs[key] = value
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
        raise DataError(f"{path} {x.name}: dtype {x.dtype.str}; expected uint8 or float32 (little-endian)")
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


def fmt_values(v):
    if v is None:
        return None
    return ", ".join(f"{float(np.float32(e)):.4g}" for e in v)


def cmd_check(args):
    path = args.file
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
            if version.dtype.kind not in "iu" or version.size != 1 or int(version.reshape(-1)[0]) != FORMAT_VERSION:
                raise DataError(f"{path}: attribute h5ddp_data_format is {version!r}; this tool knows format "
                                f"{FORMAT_VERSION}")
            version = int(version.reshape(-1)[0])
        num_classes = None
        if "num_classes" in f.attrs:
            k = np.asarray(f.attrs["num_classes"])
            if k.dtype.kind not in "iu" or k.size != 1 or int(k.reshape(-1)[0]) < 1:
                raise DataError(f"{path}: attribute num_classes must be one integer >= 1, got {k!r}")
            num_classes = int(k.reshape(-1)[0])
        if "/train" not in f:
            raise DataError(f"{path} /train: missing (docs/DATA.md)")
        tx, ty, tkind, mean, std = check_split(path, f, "train", size, num_classes)
        test = None
        if "/test" in f:
            test = check_split(path, f, "test", size, num_classes)
            if test[0].shape[1:] != tx.shape[1:]:
                raise DataError(f"{path} /test/x: samples are {shape_text(test[0].shape[1:])} but /train/x's are "
                                f"{shape_text(tx.shape[1:])}")
            if test[2][0] != tkind[0] or (tkind[0] == "targets" and test[2][2] != tkind[2]):
                raise DataError(f"{path} /test/y: {test[1].dtype.name} {shape_text(test[1].shape)} is not the kind of "
                                f"/train/y ({ty.dtype.name} {shape_text(ty.shape)})")
        source = f.attrs.get("source")
        if isinstance(source, bytes):
            source = source.decode("utf-8", "replace")

    text = f"{path}: h5ddp data format {version if version is not None else '(unmarked)'}"
    if source:
        text += f", from {source}"
    text += f". train: {tx.shape[0]} samples"
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
    text += ". All datasets contiguous: h5ddp-train --data can read it."
    print(text)


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

    ck = sub.add_parser("check", help="validate a file against the layout of docs/DATA.md and summarise it")
    ck.add_argument("file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    commands = {"fashion-mnist": cmd_fashion_mnist, "idx": cmd_idx, "npz": cmd_npz, "check": cmd_check}
    try:
        commands[args.command](args)
    except (DataError, OSError) as e:  # OSError: a file that cannot be read or written (HDF5's too)
        print(f"h5ddp-data: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
