"""torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1) in h5ddp checkpoints, without consolidation.

Saving: every rank plans the state datasets of the parameters IT owns (its local optimizer `zero.optim`); the
ranks exchange (path, dtype, shape) of those, so that all of them create the same datasets, and each owner writes
its datasets whole and hashes them (partial.py: Item.owner). The file is the one a replicated optimizer of the
wrapped class writes: param groups list every parameter by name, /optimizer/state/<p>/... for every parameter
with state (docs/FORMAT.md).

Loading: each rank reads, verifies and loads only the state of the parameters it owns under the CURRENT partition
(any world size; the file may come from a plain optimizer, a ZeRO job of another size or h5ddp-train
--shard-optimizer), and the file's hyperparameters go into the local optimizer's groups and the wrapper's."""
import numpy as np

from . import format as fmt
from .errors import CheckpointError, CheckpointMismatchError, DisagreementError
from .partial import Item
from .rules import decode_names
from .state import file_groups, file_state, optimizer_type, param_names


def is_zero(optimizer):
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_optimizer(zero):
    """The wrapped optimizer holding this rank's partition; refuses configurations h5ddp cannot describe."""
    if getattr(zero, "_overlap_with_ddp", False):
        raise CheckpointError("a ZeroRedundancyOptimizer with overlap_with_ddp=True keeps a functional optimizer; "
                              "h5ddp_torch saves and loads only overlap_with_ddp=False")
    return zero.optim


def zero_type(zero):
    return optimizer_type(local_optimizer(zero))


def owned_names(model, zero):
    """Names of the parameters whose optimizer state this rank holds (the current partition)."""
    names = param_names(model)
    return {names[id(p)] for g in local_optimizer(zero).param_groups for p in g["params"] if id(p) in names}


def global_groups(model, zero):
    """[(group index, [parameter names])] of the wrapper's groups: every parameter, on every rank."""
    names = param_names(model)
    out = []
    for gi, g in enumerate(zero.param_groups):
        try:
            out.append((gi, [names[id(p)] for p in g["params"]]))
        except KeyError:
            raise CheckpointError("the ZeroRedundancyOptimizer holds a tensor that is not a parameter of the "
                                  "model") from None
    return out


def _order(model):
    """Sort key of an optimizer state dataset path: (parameter index in the model, state key index)."""
    index = {n: i for i, n in enumerate(param_names(model).values())}
    keys = {k: i for i, k in enumerate(sorted(fmt.ALL_STATE_KEYS))}

    def key(path):
        pname, _, k = path[len(fmt.OPTIMIZER_STATE_GROUP) + 1:].rpartition("/")
        return index.get(pname, len(index)), keys.get(k, len(keys)), path
    return key


def shard_items(comm, model, items):
    """Collective. `items` (this rank's plan) with its optimizer state datasets marked as owned by this rank and
    every other rank's owned datasets added as placeholders (dtype and shape only, no memory) in model parameter
    order, right after the /model datasets: the same list on every rank (partial.Item)."""
    prefix = fmt.OPTIMIZER_STATE_GROUP + "/"
    mine = [d for d in items if d.path.startswith(prefix)]
    rest = [d for d in items if not d.path.startswith(prefix)]
    for d in mine:
        d.owner = comm.rank
    described = comm.allgather([(d.path, d.dtype, d.array.dtype.str, tuple(d.array.shape)) for d in mine])
    owner_of, doubled = {}, []
    for r, lst in enumerate(described):
        for path, _, _, _ in lst:
            if path in owner_of:
                doubled.append(f"{path} (ranks {owner_of[path]} and {r})")
            owner_of[path] = r
    if doubled:  # every rank sees the same lists: every rank raises
        raise DisagreementError("two ranks hold the optimizer state of the same parameter; no file written: " +
                                ", ".join(doubled[:4]))
    sharded = list(mine)
    for r, lst in enumerate(described):
        if r != comm.rank:
            sharded += [Item(path, np.broadcast_to(np.zeros((), dtype=np.dtype(npd)), shape), dtype, True, owner=r)
                        for path, dtype, npd, shape in lst]
    order = _order(model)
    sharded.sort(key=lambda d: order(d.path))
    cut = max([i + 1 for i, d in enumerate(rest) if d.path.startswith(fmt.MODEL_GROUP + "/")] + [0])
    return rest[:cut] + sharded + rest[cut:]


def wanted(model, zero):
    """Predicate on dataset paths: what this rank reads of a file (all but other ranks' optimizer state)."""
    owned = owned_names(model, zero)
    prefix = fmt.OPTIMIZER_STATE_GROUP + "/"

    def keep(path):
        if not path.startswith(prefix):
            return True
        return path[len(prefix):].split("/", 1)[0] in owned
    return keep


def _compare_groups(path, m, arrays, model, zero):
    """FORMAT.md "Loading" 2 and 3 against the wrapper (every parameter): type, group count, names per group."""
    kind = zero_type(zero)
    if m.optimizer_type != kind:
        held = m.optimizer_type or "none (a weights-only file)"
        raise CheckpointMismatchError(f"{path} holds optimizer state of type {held}; this ZeroRedundancyOptimizer "
                                      f"wraps type {kind} (group {fmt.OPTIMIZER_GROUP})")
    groups, issues = global_groups(model, zero), []
    if len(m.groups) != len(groups):
        issues.append(f"{len(m.groups)} param groups in the file, {len(groups)} in the optimizer")
    for gi, mine in groups[:len(m.groups)]:
        d = f"{fmt.param_group_path(gi)}/{fmt.PARAM_NAMES_DATASET}"
        theirs = decode_names(arrays[d][1]) if d in arrays else []
        if theirs != mine:
            issues.append(f"dataset {d} names {theirs[:4]}{'...' if len(theirs) > 4 else ''}, the optimizer's "
                          f"group {gi} holds {mine[:4]}{'...' if len(mine) > 4 else ''}")
    if issues:
        shown = "; ".join(issues[:6]) + (f"; (+{len(issues) - 6} more)" if len(issues) > 6 else "")
        raise CheckpointMismatchError(f"{path} does not fit the optimizer: {shown}")


def plan_load(path, m, arrays, model, zero):
    """The state dict of this rank's local optimizer, built from the file: the state of the parameters it owns
    (state keyed by name -> the local optimizer's indices) and the file's hyperparameters."""
    _compare_groups(path, m, arrays, model, zero)
    local = local_optimizer(zero)
    names = param_names(model)
    sd_groups = local.state_dict()["param_groups"]
    index_of = {names[id(p)]: i for g, sg in zip(local.param_groups, sd_groups) for p, i in zip(g["params"],
                                                                                              sg["params"])}
    state = {index_of[p]: file_state(arrays, p, keys) for p, keys in m.state.items() if p in index_of}
    return {"state": state, "param_groups": file_groups(m.groups, sd_groups)}


def apply_load(zero, sd):
    """Loads the local optimizer's state dict and copies its hyperparameters into the wrapper's groups."""
    local = local_optimizer(zero)
    local.load_state_dict(sd)
    for src, dst in zip(local.param_groups, zero.param_groups):
        for k, v in src.items():
            if k != "params":
                dst[k] = v
