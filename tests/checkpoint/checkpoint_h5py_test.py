"""A checkpoint written by 2 ranks, read with h5py: every tensor equals the bytes the writer held, the
layout and root attributes are those of docs/FORMAT.md, and every xxh3 attribute is present.
usage: checkpoint_h5py_test.py CHECKPOINT EXPECTED_DIR"""
import sys

import h5py
import numpy as np

NUMPY = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
         "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8,
         "uint64": np.uint64, "bool": np.uint8}


def main(path, expected_dir):
    failures = []
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "h5ddp-checkpoint", f.attrs["format"]
        assert int(f.attrs["format_version"]) == 1
        assert int(f.attrs["world_size"]) == 2, f.attrs["world_size"]
        assert int(f.attrs["step"]) == int(f["/train/step"][()])
        assert f.attrs["torch_version"] == "1.13.1"
        assert [n.decode() for n in f["/optimizer/param_groups/0/params"][()]] == \
            ["conv1.weight", "conv1.bias", "fc.weight"]
        assert abs(f["/optimizer/param_groups/1"].attrs["lr"] - 0.01) < 1e-15
        assert f["/optimizer"].attrs["type"] == "adam"
        assert f["/rng/cpu"].shape == (2, 24)
        assert list(f["/rng/cpu"][1][:3]) == [31, 32, 33]
        count = 0
        with open(f"{expected_dir}/index.txt") as index:
            for line in index:
                n, dpath, dtype, shape = (line.split() + [""])[:4]
                shape = tuple(int(s) for s in shape.split(",")) if shape else ()
                ds = f[dpath]
                arr = ds[()]
                want = np.fromfile(f"{expected_dir}/{n}.bin", dtype=NUMPY[dtype]).reshape(shape)
                if ds.attrs["dtype"] != dtype:
                    failures.append(f"{dpath}: dtype attribute {ds.attrs['dtype']} != {dtype}")
                if arr.dtype != want.dtype or arr.shape != want.shape or arr.tobytes() != want.tobytes():
                    failures.append(f"{dpath}: h5py read {arr.dtype} {arr.shape}, expected {want.dtype} {want.shape}"
                                    " or different bytes")
                count += 1

        def check(name, obj):
            if isinstance(obj, h5py.Dataset) and "xxh3" not in obj.attrs:
                failures.append(f"/{name}: no xxh3 attribute")
        f.visititems(check)
    if failures:
        print("\n".join(failures))
        return 1
    print(f"h5py read {count} tensors of {path}: all equal to the writer's bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
