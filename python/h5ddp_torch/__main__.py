"""python3 -m h5ddp_torch verify FILE...   every rule, every checksum; exit 0 = all valid (notes allowed), 1 = a problem
python3 -m h5ddp_torch info FILE            step, world size, writer, optimizer, datasets"""
import argparse
import sys

from . import rules, verify
from .errors import CheckpointError
from .h5 import open_file
from .reader import read_manifest


def _info(path):
    with open_file(path) as f:
        verdict = rules.check(f, path)
        for line in verdict.problems:
            print(f"warning: {line}", file=sys.stderr)
        try:
            m = read_manifest(f, path, verdict.datasets)
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: not a valid checkpoint, no summary ({e})") from None
        print(f"file        {path}\nstep        {m.step}\nworld size  {m.world_size} (at save)\n"
              f"written by  h5ddp {m.h5ddp_version}, torch {m.torch_version}, at {m.created}\n"
              f"format      version 1, revision {verdict.minor}\n"
              f"optimizer   {m.optimizer_type or 'none'}, {len(m.groups)} param group(s)")
        for k, v in sorted(m.meta.items()):
            print(f"meta        {k} = {v}")
        for d in m.datasets:
            ds = f[d]
            print(f"  {d:<56} {str(ds.attrs.get('dtype', '?')):<9} {list(ds.shape)}")


def _verify(files):
    bad = 0
    for path in files:
        notes = []
        problems = verify(path, notes=notes)
        for line in notes:
            print(f"note    {line}")
        if problems:
            bad += 1
            for line in problems:
                print(f"INVALID {line}")
        else:
            print(f"ok      {path}")
    return 1 if bad else 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m h5ddp_torch", description="Inspect and verify h5ddp checkpoints.")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every rule of docs/FORMAT.md and every checksum; exit 0 when all files "
                                      "are valid (notes about objects of a newer format revision allowed)")
    v.add_argument("files", nargs="+")
    i = sub.add_parser("info", help="step, world size, writer, optimizer, datasets")
    i.add_argument("file")
    args = p.parse_args(argv)
    if args.command == "verify":
        return _verify(args.files)
    try:
        _info(args.file)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
