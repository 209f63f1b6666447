"""PyTorch objects <-> the format's named arrays: model state dicts, optimizer state keyed by parameter NAME,
random generator states, tensors <-> numpy arrays of the stored dtype."""
import numpy as np
import torch

from . import format as fmt
from .errors import CheckpointError, CheckpointMismatchError
from .sampler import mix_seed

_TORCH_TO_NAME = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
    torch.bool: "bool",
}
_NAME_TO_TORCH = {v: k for k, v in _TORCH_TO_NAME.items()}


def dtype_name(t, what):
    try:
        return _TORCH_TO_NAME[t.dtype]
    except KeyError:
        raise CheckpointError(f"tensor {what} has dtype {t.dtype}, which an h5ddp checkpoint cannot hold") from None


def torch_dtype(name, what):
    if name not in _NAME_TO_TORCH:
        raise CheckpointMismatchError(f"{what}: dtype {name} has no PyTorch equivalent")
    return _NAME_TO_TORCH[name]


def to_numpy(t, what):
    """The stored bytes of tensor `t` as a C-contiguous numpy array (a view when t is a contiguous CPU tensor)."""
    name = dtype_name(t, what)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(np.uint16)
    if name == "bool":
        return t.view(torch.uint8).numpy()
    return t.numpy()


def from_numpy(a, name):
    """A CPU tensor of h5ddp dtype `name` sharing the memory of the stored array `a`."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()
    if name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if name == "bool":
        return torch.from_numpy(a.view(np.bool_))
    if name == "uint64":
        return torch.from_numpy(a.view(np.int64))
    return torch.from_numpy(a)


def user_tensor(value):
    """A /user entry as a tensor: a tensor as it is, a number as torch.tensor makes it (int -> int64,
    float -> float32, bool -> bool)."""
    return value if torch.is_tensor(value) else torch.tensor(value)


def unwrap(model):
    """The module inside DistributedDataParallel / DataParallel wrappers."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def strip_module_prefix(key):
    while key.startswith("module."):
        key = key[len("module."):]
    return key


def model_tensors(model):
    """[(key, tensor)] of the model's state dict, keys without any "module." prefix."""
    out, seen = [], set()
    for k, v in unwrap(model).state_dict(keep_vars=False).items():
        key = strip_module_prefix(k)
        if key in seen:
            raise CheckpointError(f"two state-dict entries map to the same key {key}")
        seen.add(key)
        out.append((key, v))
    return out


def param_names(model):
    """{id(parameter): name} of the model's parameters."""
    return {id(p): strip_module_prefix(n) for n, p in unwrap(model).named_parameters()}


def optimizer_type(optimizer):
    if optimizer is None:
        return ""
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    raise CheckpointError(f"h5ddp checkpoints hold the state of torch.optim.Adam, AdamW and SGD; "
                          f"this optimizer is a {type(optimizer).__name__}")


def _hyper(kind, group):
    if group.get("maximize", False):
        raise CheckpointError("maximize=True has no place in an h5ddp checkpoint (LibTorch's optimizers lack it)")
    if kind == "sgd":
        return {"lr": group["lr"], "momentum": group["momentum"], "dampening": group["dampening"],
                "weight_decay": group["weight_decay"], "nesterov": 1.0 if group["nesterov"] else 0.0}
    b0, b1 = group["betas"]
    return {"lr": group["lr"], "betas0": b0, "betas1": b1, "eps": group["eps"],
            "weight_decay": group["weight_decay"], "amsgrad": 1.0 if group["amsgrad"] else 0.0}


def optimizer_entries(model, optimizer, local=None):
    """(type, groups, state) of `optimizer` over `model`'s parameters: groups is [(hyper dict, [names])],
    state is [(param name, key, tensor)] in the model's parameter order (Adam's step as an int64 scalar).
    local: the optimizer that holds the state and gives the type, when it is not `optimizer` itself (a
    ZeroRedundancyOptimizer: groups of the wrapper, every parameter; state of its local optimizer, this rank's
    partition, zero.local_optimizer; the writer marks those datasets as this rank's, zero.shard_items)."""
    local = optimizer if local is None else local
    kind = optimizer_type(local)
    if not kind:
        return "", [], []
    names = param_names(model)
    groups = []
    for g in optimizer.param_groups:
        try:
            group_names = [names[id(p)] for p in g["params"]]
        except KeyError:
            raise CheckpointError("the optimizer holds a tensor that is not a parameter of the model") from None
        groups.append(({k: float(v) for k, v in _hyper(kind, g).items()}, group_names))
    state = []
    by_name = {names[id(p)]: p for g in local.param_groups for p in g["params"]}
    order = [n for n, _ in unwrap(model).named_parameters()]
    for n in (strip_module_prefix(n) for n in order):
        p = by_name.get(n)
        if p is None or p not in local.state or not local.state[p]:
            continue
        s = local.state[p]
        for key in fmt.STATE_KEYS[kind]:
            v = s.get(key)
            if v is None:
                continue
            if key == "step":
                v = torch.tensor(int(v.item() if torch.is_tensor(v) else v), dtype=torch.int64)
            state.append((n, key, v))
    return kind, groups, state


def file_state(arrays, pname, keys):
    """One parameter's optimizer state from the arrays read: {key: tensor} (Adam's step: the file's int64 scalar
    as the float32 tensor PyTorch keeps)."""
    s = {}
    for k in keys:
        dtype, a = arrays[fmt.optimizer_state_dataset(pname, k)]
        s[k] = torch.tensor(float(a[()])) if k == fmt.STEP_STATE_KEY else from_numpy(a, dtype).clone()
    return s


def file_groups(file_groups_, sd_groups):
    """The param groups of an optimizer state dict (`sd_groups`, PyTorch's) with the file's hyperparameters
    (`file_groups_`: [(hyper dict, ...)] of the manifest)."""
    groups = []
    for (hyper, _), sg in zip(file_groups_, sd_groups):
        g = dict(sg)
        for k, v in hyper.items():
            if k in g:
                g[k] = bool(v) if isinstance(sg[k], bool) else v
        if "betas0" in hyper and "betas" in g:
            g["betas"] = (hyper["betas0"], hyper["betas1"])
        groups.append(g)
    return groups


def rng_states():
    """(cpu bytes, cuda bytes or b"") of this process's default generators: the same bytes LibTorch's
    Generator::get_state gives (PyTorch's torch.get_rng_state is that call)."""
    cpu = torch.get_rng_state().numpy().tobytes()
    cuda = b""
    if torch.cuda.is_available():
        cuda = torch.cuda.get_rng_state().numpy().tobytes()
    return cpu, cuda


def restore_rng(cpu_row, cuda_row, seed, rank, step):
    """Restores this rank's generators from its rows (None when the file has no row for this rank: the stream is
    derived from (seed, rank, step) as h5ddp does). Returns True when the row was restored exactly."""
    if cpu_row is not None:
        torch.set_rng_state(torch.from_numpy(np.array(cpu_row, dtype=np.uint8)))
        if cuda_row is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(torch.from_numpy(np.array(cuda_row, dtype=np.uint8)))
        return True
    derived = mix_seed(mix_seed(seed, rank), step)
    torch.manual_seed(derived)
    return False
