"""Tensor-by-tensor comparison of two checkpoint files with h5py, for when h5ddp-ckpt is not built.

usage: ckpt_same.py A.h5 B.h5 -> exit 0 when both hold the same datasets with equal dtype, shape and
bytes; 1 (and the differing names) otherwise. Attributes (e.g. the writer's host and time) are ignored.
"""
import sys

import h5py


def datasets(path):
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = (obj.dtype.str, obj.shape, obj[()].tobytes())

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def main():
    a, b = datasets(sys.argv[1]), datasets(sys.argv[2])
    bad = sorted(set(a) ^ set(b)) + sorted(n for n in set(a) & set(b) if a[n] != b[n])
    for n in bad[:20]:
        print("differs:", n)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
