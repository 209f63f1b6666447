"""load and resume: a checkpoint into a model and optimizer on every rank (each rank's tensors stay on their own
device), checked whole before anything is touched, so a damaged file never leaves a model half-loaded."""
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from . import format as fmt
from . import rules
from .comm import get_comm
from .commit import resume_candidates
from .errors import CheckpointError, CheckpointMismatchError, DisagreementError, first_line
from .h5 import open_file
from .reader import read_dataset, read_manifest
from .rules import decode_names
from .sampler import DataState
from . import zero
from .state import (file_groups, file_state, from_numpy, model_tensors, optimizer_type, param_names, restore_rng,
                    torch_dtype, user_tensor)


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


def _summary(problems):
    """One line for a damaged file: its first problem and how many more there are."""
    return problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")


def _read_file(path, keep=None):
    """(manifest, {dataset path: (dtype, array)}) of a valid file, every dataset (those keep(path) accepts, when
    given) read and its checksum verified.
    Any problem (rules.py: every rule, checked before reading a tensor; then the checksums and R8/R10 on the
    values read) raises CheckpointError: the file is damaged, whatever model it holds."""
    with open_file(path) as f:
        try:
            verdict = rules.check(f, path)
            if verdict.problems:
                raise CheckpointError(_summary(verdict.problems))
            m = read_manifest(f, path, verdict.datasets)
            arrays = {d: read_dataset(f, path, d) for d in m.datasets if keep is None or keep(d)}
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: damaged or truncated ({first_line(e)})") \
                from None
    problems = rules.value_problems(path, {d: a for d, (_, a) in arrays.items()})
    if problems:
        raise CheckpointError(_summary(problems))
    return m, arrays


def _scalar(arrays, p):
    return int(arrays[p][1][()])


def _one_line(path, what, issues):
    shown = "; ".join(issues[:6]) + (f"; (+{len(issues) - 6} more)" if len(issues) > 6 else "")
    return CheckpointMismatchError(f"{path} does not fit {what}: {shown}")


def _compare_tensors(group, held, arrays, targets):
    """FORMAT.md "Loading" 1 and 4: the names, dtypes and shapes of a group's tensors against {name: tensor}."""
    issues = [f"{group}/{k} is not in {'the model' if group == fmt.MODEL_GROUP else 'what the caller tracks'}"
              for k in held if k not in targets]
    for k, t in targets.items():
        d = f"{group}/{k}"
        if k not in held:
            issues.append(f"{d} is missing (the {'model' if group == fmt.MODEL_GROUP else 'caller'} has {k})")
            continue
        dtype, a = arrays[d]
        if list(a.shape) != list(t.shape):
            issues.append(f"dataset {d} has shape {list(a.shape)}, the tensor {list(t.shape)}")
        elif torch_dtype(dtype, d) != t.dtype:
            issues.append(f"dataset {d} is {dtype}, the tensor {t.dtype}")
    return issues


def _plan_model(path, m, arrays, model):
    targets = dict(model_tensors(model))
    issues = _compare_tensors(fmt.MODEL_GROUP, m.model, arrays, targets)
    if issues:
        raise _one_line(path, "the model", issues)
    return [(t, arrays[f"{fmt.MODEL_GROUP}/{k}"]) for k, t in targets.items()]


def _plan_user(path, m, arrays, user):
    """The caller's tracked tensors against /user (None: not compared, the file's /user is only returned)."""
    if user is None:
        return []
    targets = {k: user_tensor(v) for k, v in user.items()}
    issues = _compare_tensors(fmt.USER_GROUP, m.user, arrays, targets)
    if issues:
        raise _one_line(path, "the tracked user state", issues)
    return [(t, arrays[f"{fmt.USER_GROUP}/{k}"]) for k, t in targets.items() if torch.is_tensor(user[k])]


def _compare_groups(path, m, arrays, model, optimizer):
    """FORMAT.md "Loading" 2 and 3: the optimizer type, the number of param groups and each group's names.
    Returns {parameter name: its index in the optimizer's state dict}."""
    kind = optimizer_type(optimizer)
    if m.optimizer_type != kind:
        held = m.optimizer_type or "none (a weights-only file)"
        raise CheckpointMismatchError(f"{path} holds optimizer state of type {held}; this optimizer is of type {kind} "
                                      f"(group {fmt.OPTIMIZER_GROUP})")
    names = param_names(model)
    index_of, issues = {}, []
    if len(m.groups) != len(optimizer.param_groups):
        issues.append(f"{len(m.groups)} param groups in the file, {len(optimizer.param_groups)} in the optimizer")
    for gi, (g, sg) in enumerate(zip(optimizer.param_groups, optimizer.state_dict()["param_groups"])):
        mine = [names.get(id(p), "?") for p in g["params"]]
        index_of.update(zip(mine, sg["params"]))
        d = f"{fmt.param_group_path(gi)}/{fmt.PARAM_NAMES_DATASET}"
        if gi < len(m.groups):
            theirs = decode_names(arrays[d][1]) if d in arrays else []
            if theirs != mine:
                issues.append(f"dataset {d} names {theirs[:4]}{'...' if len(theirs) > 4 else ''}, the optimizer's "
                              f"group {gi} holds {mine[:4]}{'...' if len(mine) > 4 else ''}")
    if issues:
        raise _one_line(path, "the optimizer", issues)
    return index_of


def _plan_optimizer(path, m, arrays, model, optimizer):
    """The optimizer state dict to load, built from the file (state keyed by name -> PyTorch's indices)."""
    if zero.is_zero(optimizer):
        return zero.plan_load(path, m, arrays, model, optimizer)
    index_of = _compare_groups(path, m, arrays, model, optimizer)
    state = {index_of[pname]: file_state(arrays, pname, keys) for pname, keys in m.state.items()}
    return {"state": state, "param_groups": file_groups(m.groups, optimizer.state_dict()["param_groups"])}


def _plan(path, model, optimizer, user, weights_only):
    """(manifest, arrays, tensor copies, optimizer state dict or None) of a valid file that fits; raises."""
    with_optimizer = optimizer is not None and not weights_only
    # a ZeRO rank reads (and verifies) only its own partition's optimizer state
    m, arrays = _read_file(path, zero.wanted(model, optimizer) if with_optimizer and zero.is_zero(optimizer)
                           else None)
    copies = _plan_model(path, m, arrays, model)
    opt_sd = _plan_optimizer(path, m, arrays, model, optimizer) if with_optimizer else None
    copies += _plan_user(path, m, arrays, user)
    return m, arrays, copies, opt_sd


def _result(path, m, arrays):
    data = DataState(seed=int(np.uint64(arrays[fmt.DATA_SEED][1][()])), epoch=_scalar(arrays, fmt.DATA_EPOCH),
                     position=_scalar(arrays, fmt.DATA_POSITION), global_batch=_scalar(arrays, fmt.DATA_GLOBAL_BATCH))
    user = {}
    for k in m.user:
        dtype, a = arrays[f"{fmt.USER_GROUP}/{k}"]
        user[k] = from_numpy(a, dtype).clone()
    return LoadResult(path=path, step=_scalar(arrays, fmt.TRAIN_STEP), epoch=_scalar(arrays, fmt.TRAIN_EPOCH),
                      samples_consumed=_scalar(arrays, fmt.TRAIN_SAMPLES_CONSUMED), data=data,
                      world_size=m.world_size, optimizer_type=m.optimizer_type, scheduler=m.scheduler,
                      meta=m.meta, user=user)


def _check_rng_rows(path, cpu_rows):
    """Rows of another generator's state length cannot be restored: the file is another model's for this process
    (docs/FORMAT.md "Decisions of revision 2"), refused before anything is touched."""
    mine = torch.get_rng_state().numel()
    if cpu_rows.shape[1] not in (0, mine):
        raise CheckpointMismatchError(f"{path}: {fmt.RNG_CPU} rows are {cpu_rows.shape[1]} bytes; this process's CPU "
                                      f"generator state is {mine} bytes (another generator): it cannot be restored")


def load(path, model, optimizer=None, *, comm=None, rng=True, weights_only=False, user=None):
    """Collective. Loads checkpoint `path` into `model` (a DistributedDataParallel wrapper or the module inside;
    "module." prefixes are handled) and `optimizer` (torch.optim.Adam, AdamW or SGD; its hyperparameters come
    from the file too; a ZeroRedundancyOptimizer wrapping one: each rank reads and loads its partition's state),
    restores this rank's RNG row (rng=True) and returns a LoadResult with the counters, the data position,
    scheduler values, meta and user tensors. weights_only=True loads only the model.
    user: {name: tensor or number} the caller tracks (as save's `user`): the file's /user must hold exactly
    these names with these dtypes and shapes, and the tensors are filled in place (None: not compared).
    Every rank reads and verifies the whole file (a ZeRO rank: all but other ranks' optimizer state) before
    touching anything; any problem raises on every rank:
    CheckpointError when the file is damaged or not a checkpoint (docs/FORMAT.md: any broken rule or checksum),
    CheckpointMismatchError when a valid file does not fit the model, optimizer or user state (docs/FORMAT.md
    "Loading"). Messages name the file, the dataset and the rank."""
    comm = get_comm(comm)
    planned = None
    try:
        planned = _plan(path, model, optimizer, user, weights_only)
        if rng and not weights_only:
            _check_rng_rows(path, planned[1][fmt.RNG_CPU][1])
        error = None
    except CheckpointError as e:
        error = e
    comm.raise_if_any(error)
    m, arrays, copies, opt_sd = planned

    with torch.no_grad():
        for t, (dtype, a) in copies:
            t.copy_(from_numpy(a, dtype).to(t.device))
    if opt_sd is not None and zero.is_zero(optimizer):
        zero.apply_load(optimizer, opt_sd)  # this rank's partition only
    elif opt_sd is not None:
        optimizer.load_state_dict(opt_sd)
    result = _result(path, m, arrays)
    if rng and not weights_only:
        cpu = arrays[fmt.RNG_CPU][1]
        cuda = arrays[fmt.RNG_CUDA][1] if m.rng_cuda else None
        r = comm.rank
        result.rng_exact = restore_rng(cpu[r] if r < cpu.shape[0] else None,
                                       cuda[r] if cuda is not None and r < cuda.shape[0] else None,
                                       result.data.seed, r, result.step)
    return result


def read_model(path):
    """Local (no collective, no model needed). {state-dict key: CPU tensor} of checkpoint `path`'s /model, in file
    order, the file checked as load checks it (every rule; the model datasets' checksums). Raises CheckpointError
    naming the file and the dataset. For tools that rebuild a model from the weights (tools/examples/gpt.py)."""
    m, arrays = _read_file(path, keep=lambda d: d.startswith(fmt.MODEL_GROUP + "/"))
    out = {}
    for k in m.model:
        dtype, a = arrays[f"{fmt.MODEL_GROUP}/{k}"]
        out[k] = from_numpy(a, dtype)
    return out


def resume(run_dir, model, optimizer=None, *, comm=None, rng=True, user=None):
    """Collective. Loads the newest valid checkpoint of `run_dir` (the highest step that loads; a file `latest`
    names without a step first): a damaged one (any problem docs/FORMAT.md's rules or the checksums find) is
    skipped with a warning naming what was wrong and the next older one is tried. `user` as for load. Returns
    its LoadResult, or None (nothing touched) when there is none. A checkpoint of another model or optimizer
    raises CheckpointMismatchError: an older file of the same run would not fit either."""
    comm = get_comm(comm)
    candidates = comm.bcast(resume_candidates(run_dir, _warn) if comm.rank == 0 else None)
    skipped = []
    for path in candidates:
        try:
            result = load(path, model, optimizer, comm=comm, rng=rng, user=user)
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
