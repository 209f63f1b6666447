"""The verifier: a file's layout against docs/FORMAT.md and every dataset's checksum (as h5ddp-ckpt verify)."""
import numpy as np

from . import format as fmt
from .errors import CheckpointError
from .h5 import open_file
from .reader import read_manifest, unexpected_objects, verify_dataset


def _semantics(f, m):
    """What the layout implies beyond names: scalar shapes and dtypes, the RNG matrix, step, param names."""
    problems = []
    for p, dtype in fmt.SCALARS.items():
        ds = f[p]
        if ds.shape != () or ds.dtype != fmt.NUMPY_DTYPES[dtype]:
            problems.append(f"{m.path}: dataset {p} must be a {dtype} scalar, is {ds.dtype} {list(ds.shape)}")
    for p in (fmt.RNG_CPU, fmt.RNG_CUDA) if m.rng_cuda else (fmt.RNG_CPU,):
        ds = f[p]
        if ds.ndim != 2 or ds.dtype != np.uint8 or ds.shape[0] != m.world_size:
            problems.append(f"{m.path}: dataset {p} must be uint8 [world_size={m.world_size}, nbytes], is "
                            f"{ds.dtype} {list(ds.shape)}")
    if not problems and int(f[fmt.TRAIN_STEP][()]) != m.step:
        problems.append(f"{m.path}: root attribute step {m.step} differs from {fmt.TRAIN_STEP} "
                        f"{int(f[fmt.TRAIN_STEP][()])}")
    model = set(m.model)
    for param, keys in m.state.items():
        if param not in model:
            problems.append(f"{m.path}: optimizer state for {param}, which is not in {fmt.MODEL_GROUP}")
        for k in keys:
            if m.optimizer_type and k not in fmt.STATE_KEYS[m.optimizer_type]:
                problems.append(f"{m.path}: {fmt.optimizer_state_dataset(param, k)}: not a state key of "
                                f"{m.optimizer_type}")
    for i, (_, has_params) in enumerate(m.groups):
        if has_params:
            names = [n.decode("utf-8", "replace") for n in f[f"{fmt.param_group_path(i)}/params"][()]]
            missing = [n for n in names if n not in model]
            if missing:
                problems.append(f"{m.path}: param group {i} names {', '.join(missing)}, not in {fmt.MODEL_GROUP}")
    return problems


def verify(path):
    """Every problem of the checkpoint at `path` (layout, dtypes, checksums) as one-line messages; [] = valid."""
    try:
        f = open_file(path)
    except CheckpointError as e:
        return [str(e)]
    with f:
        try:
            m = read_manifest(f, path)
        except CheckpointError as e:
            return [str(e)]
        except (OSError, KeyError, ValueError) as e:
            return [f"{path}: damaged or truncated ({e})"]
        problems = unexpected_objects(f, m)
        for d in m.datasets:
            try:
                verify_dataset(f, path, d)
            except CheckpointError as e:
                problems.append(str(e))
            except (OSError, KeyError, ValueError) as e:
                problems.append(f"{path}: dataset {d}: damaged ({e})")
        if not problems:
            try:
                problems += _semantics(f, m)
            except (OSError, KeyError, ValueError) as e:
                problems.append(f"{path}: damaged ({e})")
        return problems
