#!/usr/bin/env python3
"""Compares two h5ddp checkpoints tensor by tensor (every dataset under /model, /optimizer/state, /train,
/data, and /rng unless --skip-rng), plus param-group and scheduler attributes.

  compare_checkpoints.py A.h5 B.h5                      bitwise (exit 0 iff identical)
  compare_checkpoints.py A.h5 B.h5 --rtol R --atol T    floats within |a-b| <= T + R*|b|, integers exact
  compare_checkpoints.py A.h5 B.h5 --norm-rtol R        floats within ||a-b|| <= R*||b|| (L2 over the tensor)

The norm form suits Adam: an element whose gradient is at rounding-noise level gets an update of up to
lr whatever its sign, so a change of summation order moves a few elements by ~lr while the tensor as a
whole stays within ~1e-6 relative; a wrong sample order or a lost optimizer state moves every element.
"""
import argparse
import sys

import h5py
import numpy as np


def datasets(f, skip_rng):
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            if skip_rng and name.startswith("rng/"):
                return
            out[name] = obj[()]

    f.visititems(visit)
    return out


def group_attrs(f, path):
    return {k: v for k, v in f[path].attrs.items()} if path in f else {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--atol", type=float, default=0.0)
    ap.add_argument("--norm-rtol", type=float, default=0.0)
    ap.add_argument("--skip-rng", action="store_true")
    args = ap.parse_args()
    exact = args.rtol == 0 and args.atol == 0 and args.norm_rtol == 0
    problems = []
    worst = 0.0
    with h5py.File(args.a, "r") as fa, h5py.File(args.b, "r") as fb:
        da, db = datasets(fa, args.skip_rng), datasets(fb, args.skip_rng)
        for k in sorted(set(da) ^ set(db)):
            problems.append(f"{k}: only in {'A' if k in da else 'B'}")
        compared = 0
        for k in sorted(set(da) & set(db)):
            a, b = np.asarray(da[k]), np.asarray(db[k])
            compared += 1
            if a.shape != b.shape or a.dtype != b.dtype:
                problems.append(f"{k}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
                continue
            if exact or not np.issubdtype(a.dtype, np.floating):
                if a.tobytes() != b.tobytes():
                    n = int(np.sum(a != b)) if a.shape else 1
                    problems.append(f"{k}: {n} elements differ" + ("" if exact else " (integers must match)"))
                continue
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            if args.norm_rtol > 0:
                rel = float(np.linalg.norm(diff)) / max(float(np.linalg.norm(b.astype(np.float64))), 1e-30)
                worst = max(worst, rel)
                if rel > args.norm_rtol:
                    problems.append(f"{k}: ||a-b||/||b|| = {rel:.3g} exceeds {args.norm_rtol}")
                continue
            bound = args.atol + args.rtol * np.abs(b.astype(np.float64))
            excess = float(np.max(diff - bound)) if diff.size else 0.0
            worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
            if excess > 0:
                problems.append(f"{k}: max |a-b| {float(np.max(diff)):.3g} exceeds the tolerance")
        for path in ["optimizer/param_groups/0", "train/lr_scheduler"]:
            ga, gb = group_attrs(fa, path), group_attrs(fb, path)
            if ga.keys() != gb.keys() or any(not np.array_equal(ga[x], gb[x]) for x in ga):
                problems.append(f"/{path} attributes differ: {ga} vs {gb}")
    for p in problems:
        print(f"compare: {args.a} vs {args.b}: {p}", file=sys.stderr)
    print(f"compare: {compared} datasets, {'bitwise' if exact else f'worst difference {worst:.3g} (relative L2 norm with --norm-rtol, else absolute)'}, "
          f"{len(problems)} problems")
    if compared == 0:
        print("compare: nothing compared", file=sys.stderr)
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
