"""load and resume: a checkpoint into a model and optimizer on every rank (each rank's tensors stay on their own
device), checked whole before anything is touched, so a damaged file never leaves a model half-loaded."""
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from . import format as fmt
from .comm import get_comm
from .commit import resume_candidates
from .errors import CheckpointError, CheckpointMismatchError, DisagreementError
from .h5 import open_file
from .reader import read_dataset, read_manifest, unexpected_objects
from .sampler import DataState
from .state import from_numpy, model_tensors, optimizer_type, param_names, restore_rng, torch_dtype


@dataclass
class LoadResult:
    path: str
    step: int
    epoch: int
    samples_consumed: int
    data: DataState
    world_size: int                                   # ranks that wrote the file
    optimizer_type: str = ""
    scheduler: dict = field(default_factory=dict)     # /train/lr_scheduler: {"type": ..., name: float}
    meta: dict = field(default_factory=dict)
    user: dict = field(default_factory=dict)          # /user/<name>: CPU tensors
    rng_exact: bool = False                           # this rank's generator row was in the file


def _read_file(path):
    """(manifest, {dataset path: (dtype, array)}) with every dataset read and its checksum verified."""
    with open_file(path) as f:
        try:
            m = read_manifest(f, path)
            problems = unexpected_objects(f, m)
            if problems:
                raise CheckpointError(problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
            arrays = {d: read_dataset(f, path, d) for d in m.datasets}
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: damaged or truncated ({str(e).splitlines()[0] if str(e) else e})") \
                from None
    return m, arrays


def _user_tensor(entry):
    dtype, a = entry
    return from_numpy(a, dtype).clone()


def _scalar(arrays, p):
    return int(arrays[p][1][()])


def _one_line(path, what, issues):
    shown = "; ".join(issues[:6]) + (f"; (+{len(issues) - 6} more)" if len(issues) > 6 else "")
    return CheckpointMismatchError(f"{path} does not fit {what}: {shown}")


def _plan_model(path, m, arrays, model):
    targets = dict(model_tensors(model))
    issues = []
    for k in m.model:
        if k not in targets:
            issues.append(f"{fmt.MODEL_GROUP}/{k} is not in the model")
    for k, t in targets.items():
        d = f"{fmt.MODEL_GROUP}/{k}"
        if k not in m.model:
            issues.append(f"the model's {k} is missing ({d})")
            continue
        dtype, a = arrays[d]
        if list(a.shape) != list(t.shape):
            issues.append(f"dataset {d} has shape {list(a.shape)}, the model {list(t.shape)}")
        elif torch_dtype(dtype, d) != t.dtype:
            issues.append(f"dataset {d} is {dtype}, the model's tensor {t.dtype}")
    if issues:
        raise _one_line(path, "the model", issues)
    return [(t, arrays[f"{fmt.MODEL_GROUP}/{k}"]) for k, t in targets.items()]


def _plan_optimizer(path, m, arrays, model, optimizer):
    """The optimizer state dict to load, built from the file (state keyed by name -> PyTorch's indices)."""
    kind = optimizer_type(optimizer)
    if m.optimizer_type != kind:
        held = m.optimizer_type or "none (a weights-only file)"
        raise CheckpointMismatchError(f"{path} holds optimizer state of type {held}; this optimizer is of type {kind} "
                                      f"(dataset group {fmt.OPTIMIZER_GROUP})")
    names = param_names(model)
    sd = optimizer.state_dict()
    index_of, shape_of, issues = {}, {}, []
    if len(m.groups) != len(optimizer.param_groups):
        issues.append(f"{len(m.groups)} param groups in the file, {len(optimizer.param_groups)} in the optimizer")
    for gi, (g, sg) in enumerate(zip(optimizer.param_groups, sd["param_groups"])):
        mine = [names.get(id(p), "?") for p in g["params"]]
        for n, i, p in zip(mine, sg["params"], g["params"]):
            index_of[n], shape_of[n] = i, list(p.shape)
        d = f"{fmt.param_group_path(gi)}/{fmt.PARAM_NAMES_DATASET}"
        if gi < len(m.groups):
            theirs = [b.decode("utf-8") for b in arrays[d][1]] if d in arrays else []
            if theirs != mine:
                issues.append(f"dataset {d} names {theirs[:4]}{'...' if len(theirs) > 4 else ''}, the optimizer's "
                              f"group {gi} holds {mine[:4]}{'...' if len(mine) > 4 else ''}")
    state = {}
    for pname, keys in m.state.items():
        if pname not in index_of:
            issues.append(f"{fmt.OPTIMIZER_STATE_GROUP}/{pname}: not a parameter of this optimizer")
            continue
        s = {}
        for k in keys:
            d = fmt.optimizer_state_dataset(pname, k)
            dtype, a = arrays[d]
            if k not in fmt.STATE_KEYS[kind]:
                issues.append(f"dataset {d}: not a state key of {kind}")
            elif k == "step":
                if a.shape != ():
                    issues.append(f"dataset {d} must be a scalar")
                s["step"] = torch.tensor(float(a[()]))  # PyTorch keeps Adam's step as a float32 tensor
            elif list(a.shape) != shape_of[pname]:
                issues.append(f"dataset {d} has shape {list(a.shape)}, the parameter {shape_of[pname]}")
            else:
                s[k] = from_numpy(a, dtype).clone()
        need = ("momentum_buffer",) if kind == "sgd" else ("exp_avg", "exp_avg_sq", "step")
        if s and any(k not in s for k in need):
            issues.append(f"optimizer state of {pname} is incomplete ({', '.join(need)} are required)")
        state[index_of[pname]] = s
    if issues:
        raise _one_line(path, "the optimizer", issues)
    groups = []
    for (hyper, _), sg in zip(m.groups, sd["param_groups"]):
        g = dict(sg)
        for k, v in hyper.items():
            if k in ("betas0", "betas1"):
                continue
            if k in g:
                g[k] = bool(v) if isinstance(sg[k], bool) else v
        if "betas0" in hyper and "betas" in g:
            g["betas"] = (hyper["betas0"], hyper.get("betas1", g["betas"][1]))
        groups.append(g)
    return {"state": state, "param_groups": groups}


def load(path, model, optimizer=None, *, comm=None, rng=True, weights_only=False):
    """Collective. Loads checkpoint `path` into `model` (a DistributedDataParallel wrapper or the module inside;
    "module." prefixes are handled) and `optimizer` (torch.optim.Adam, AdamW or SGD; its hyperparameters come
    from the file too), restores this rank's RNG row (rng=True) and returns a LoadResult with the counters,
    the data position, scheduler values, meta and user tensors. weights_only=True loads only the model.
    Every rank reads and verifies the whole file before touching anything; any problem raises on every rank:
    CheckpointMismatchError when the file does not fit the model or optimizer, CheckpointError when it is
    damaged or not a checkpoint (messages name the file, the dataset and the rank)."""
    comm = get_comm(comm)
    planned = None
    try:
        m, arrays = _read_file(path)
        copies = _plan_model(path, m, arrays, model)
        opt_sd = _plan_optimizer(path, m, arrays, model, optimizer) if optimizer is not None and not weights_only \
            else None
        planned = (m, arrays, copies, opt_sd)
        error = None
    except CheckpointError as e:
        error = e
    comm.raise_if_any(error)
    m, arrays, copies, opt_sd = planned

    with torch.no_grad():
        for t, (dtype, a) in copies:
            t.copy_(from_numpy(a, dtype).to(t.device))
    if opt_sd is not None:
        optimizer.load_state_dict(opt_sd)
    data = DataState(seed=int(np.uint64(arrays[fmt.DATA_SEED][1][()])), epoch=_scalar(arrays, fmt.DATA_EPOCH),
                     position=_scalar(arrays, fmt.DATA_POSITION), global_batch=_scalar(arrays, fmt.DATA_GLOBAL_BATCH))
    result = LoadResult(path=path, step=_scalar(arrays, fmt.TRAIN_STEP), epoch=_scalar(arrays, fmt.TRAIN_EPOCH),
                        samples_consumed=_scalar(arrays, fmt.TRAIN_SAMPLES_CONSUMED), data=data,
                        world_size=m.world_size, optimizer_type=m.optimizer_type, scheduler=m.scheduler,
                        meta=m.meta,
                        user={k: _user_tensor(arrays[f"{fmt.USER_GROUP}/{k}"]) for k in m.user})
    if rng and not weights_only:
        cpu = arrays[fmt.RNG_CPU][1]
        cuda = arrays[fmt.RNG_CUDA][1] if m.rng_cuda else None
        r = comm.rank
        result.rng_exact = restore_rng(cpu[r] if r < cpu.shape[0] else None,
                                       cuda[r] if cuda is not None and r < cuda.shape[0] else None,
                                       data.seed, r, result.step)
    return result


def resume(run_dir, model, optimizer=None, *, comm=None, rng=True):
    """Collective. Loads the newest valid checkpoint of `run_dir` (the highest step that loads; a file `latest`
    names without a step first): a damaged one is skipped with a warning naming what was wrong and the next older
    one is tried. Returns its LoadResult, or None (nothing touched) when there is none. A checkpoint of another
    model or optimizer raises CheckpointMismatchError: an older file of the same run would not fit either."""
    comm = get_comm(comm)
    candidates = comm.bcast(resume_candidates(run_dir, _warn) if comm.rank == 0 else None)
    skipped = []
    for path in candidates:
        try:
            result = load(path, model, optimizer, comm=comm, rng=rng)
        except (CheckpointMismatchError, DisagreementError):
            raise
        except CheckpointError as e:
            skipped.append(str(e))
            if comm.rank == 0:
                _warn(f"skipping: {e}" if path in str(e) else f"skipping {path}: {e}")  # the file named once
            continue
        if skipped and comm.rank == 0:
            _warn(f"resuming from {path} instead ({len(skipped)} newer file(s) skipped)")
        return result
    if skipped and comm.rank == 0:
        _warn(f"no valid checkpoint in {run_dir}, starting from scratch")
    return None


def _warn(msg):
    print(f"h5ddp_torch: warning: {msg}", file=sys.stderr, flush=True)
