"""save: a collective checkpoint of a torch.distributed job, ONE file written by all ranks (with MPI-IO under
an MPI launch; without MPI by positional writes, pwrite.py; what both share, the file's structure and its
checksums, in partial.py), in docs/FORMAT.md's layout and with its commit protocol:

  plan      the datasets (model, optimizer state keyed by parameter name, counters, data position, every
            rank's RNG row), each rank's byte share (rows), agreement on structure and replicas
  write     <name>.partial created by all ranks (parallel HDF5), each rank writes the rows of its share;
            XXH3-64 of each dataset by the rank that wrote it (by every rank when it is split, and compared)
  commit    close, fsync on every rank, rename (the commit point), fsync dir, latest.tmp + fsync + rename
            to latest + fsync dir, retention
"""
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash

from . import format as fmt
from . import h5
from . import zero
from ._version import __version__
from .comm import get_comm
from .commit import apply_retention, fsync_path, write_latest
from .errors import CheckpointError, DisagreementError, capture
from .partial import MAX_TRANSFER_BYTES, Item, agree_checksums, array_hash, as_bytes, create_structure, set_checksums
from .pwrite import write_partial_positional
from .sampler import DataState
from .state import dtype_name, model_tensors, optimizer_entries, rng_states, to_numpy, user_tensor


@dataclass
class SaveResult:
    path: str
    bytes: int = 0             # payload bytes of all datasets
    bytes_this_rank: int = 0   # what this rank wrote
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)


def _sample_hash(a):
    """A cheap fingerprint for comparing replicas before writing: all of a small array, 16 spread 4 KiB pieces
    of a large one (the full comparison comes with the checksums)."""
    b = as_bytes(a)
    if len(b) <= 1 << 16:
        return array_hash(a)
    h = xxhash.xxh3_64()
    for i in range(16):
        start = (len(b) - 4096) * i // 15
        h.update(b[start:start + 4096])
    return h.intdigest()


def _scalar(path, dtype, value):
    return Item(path, np.array(value, dtype=fmt.NUMPY_DTYPES[dtype]), dtype, False)


def _strings(path, names):
    encoded = [n.encode("utf-8") for n in names]
    width = max([1] + [len(e) for e in encoded])
    return Item(path, np.array(encoded, dtype=f"S{width}"), "string", False)


def _counter_breaks(step, epoch, samples_consumed, data, scheduler, name):
    """What in the counters, the data position, the schedule or the file name would break a rule of
    docs/FORMAT.md (R2, R10, R11, R12), as texts."""
    out = []
    counters = {"step": step, "epoch": epoch, "samples_consumed": samples_consumed, "data.epoch": data.epoch,
                "data.position": data.position, "data.global_batch": data.global_batch}
    out += [f"R10: {k} is {v}, must be >= 0" for k, v in counters.items() if v < 0]
    if data.position > samples_consumed:
        out.append(f"R10: data.position {data.position} exceeds samples_consumed {samples_consumed}")
    if epoch != data.epoch:
        out.append(f"R11: epoch {epoch} differs from data.epoch {data.epoch} (/train/epoch must equal /data/epoch)")
    if not 0 <= data.seed < 1 << 64:
        out.append(f"data.seed {data.seed} is not a uint64")
    named = fmt.checkpoint_step_from_name(name)
    if named >= 0 and named != step:
        out.append(f"R2: the file name {name} says step {named}, the step is {step}")
    kind = scheduler.get("type", "none")
    if not isinstance(kind, str):
        out.append(f"R12: the scheduler type {kind!r} is not a string")
    out += [f"R12: schedule {kind} needs {k}" for k in fmt.SCHEDULE_REQUIRED.get(kind, ()) if k not in scheduler]
    for k, v in scheduler.items():
        if k != "type" and (isinstance(v, (str, bytes)) or not _is_number(v)):
            out.append(f"R12: scheduler value {k}={v!r} is not a number (stored as float64)")
    return out


def _is_number(v):
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _optimizer_breaks(model, kind, groups, state, step):
    """What in the optimizer's groups and state would break R6, R7, R8 or R9, as texts."""
    out = [f"R9: param group {i} {k} is {v}, must be finite" for i, (hyper, _) in enumerate(groups)
           for k, v in hyper.items() if not math.isfinite(v)]
    params = dict(model_tensors(model))
    amsgrad = {n: hyper.get("amsgrad") == 1.0 for hyper, names in groups for n in names}
    keys = {}
    for pname, key, t in state:
        keys.setdefault(pname, []).append(key)
        p = params.get(pname)
        if key == fmt.STEP_STATE_KEY and not 0 <= int(t) <= step:
            out.append(f"R8: the optimizer's step of {pname} is {int(t)}, must be in [0, step {step}]")
        elif key in fmt.FLOAT_STATE_KEYS and p is not None and (t.shape != p.shape or t.dtype != p.dtype):
            out.append(f"R7: the optimizer's {key} of {pname} is {t.dtype} {list(t.shape)}, the parameter "
                       f"{p.dtype} {list(p.shape)}")
    for pname, have in keys.items():
        need = fmt.required_state_keys(kind, amsgrad.get(pname, False))
        if sorted(have) != sorted(need):
            out.append(f"R6: the optimizer's state of {pname} holds {', '.join(have)}, {kind} needs {', '.join(need)}")
    return out


def _local_items(model, optimizer, step, epoch, samples_consumed, data, user, scheduler, name):
    """The datasets this rank would write, (optimizer type, groups, items); raises CheckpointError, before
    anything is written, when the state would break a rule of docs/FORMAT.md."""
    local = zero.local_optimizer(optimizer) if zero.is_zero(optimizer) else optimizer
    kind, groups, state = optimizer_entries(model, optimizer, local) if optimizer is not None else ("", [], [])
    breaks = _counter_breaks(step, epoch, samples_consumed, data, scheduler, name)
    breaks += _optimizer_breaks(model, kind, groups, state, step)
    if breaks:
        raise CheckpointError(f"refusing to save step {step}, docs/FORMAT.md forbids it: " + "; ".join(breaks))
    items, seen = [], set()

    def add(item):
        if item.path in seen:
            raise CheckpointError(f"two tensors map to the same dataset {item.path}")
        seen.add(item.path)
        items.append(item)

    for key, t in model_tensors(model):
        add(Item(fmt.model_dataset(key), to_numpy(t, key), dtype_name(t, key), True))
    for pname, key, t in state:
        add(Item(fmt.optimizer_state_dataset(pname, key), to_numpy(t, f"{pname}/{key}"),
                  dtype_name(t, f"{pname}/{key}"), True))
    for key, t in (user or {}).items():
        t = user_tensor(t)
        add(Item(fmt.user_dataset(key), to_numpy(t, key), dtype_name(t, key), True))
    for i, (_, names) in enumerate(groups):
        if names:
            add(_strings(f"{fmt.param_group_path(i)}/{fmt.PARAM_NAMES_DATASET}", names))
    add(_scalar(fmt.TRAIN_STEP, "int64", step))
    add(_scalar(fmt.TRAIN_EPOCH, "int64", epoch))
    add(_scalar(fmt.TRAIN_SAMPLES_CONSUMED, "int64", samples_consumed))
    add(_scalar(fmt.DATA_SEED, "uint64", data.seed))
    add(_scalar(fmt.DATA_EPOCH, "int64", data.epoch))
    add(_scalar(fmt.DATA_POSITION, "int64", data.position))
    add(_scalar(fmt.DATA_GLOBAL_BATCH, "int64", data.global_batch))
    return kind, groups, items


def _rng_items(comm):
    """Every rank's generator rows, gathered so that every rank holds (and can checksum) the whole matrix."""
    cpu, cuda = rng_states()
    rows = comm.allgather((cpu, cuda))
    items = []
    for which, path in ((0, fmt.RNG_CPU), (1, fmt.RNG_CUDA)):
        sizes = [len(r[which]) for r in rows]
        if len(set(sizes)) != 1:
            seen = ", ".join(f"rank {r}={s}" for r, s in enumerate(sizes))
            raise DisagreementError(f"ranks disagree on the size of their {'CUDA' if which else 'CPU'} generator "
                                    f"state: {seen}")
        if which == 1 and sizes[0] == 0:
            continue
        m = np.frombuffer(b"".join(r[which] for r in rows), dtype=np.uint8).reshape(comm.size, sizes[0])
        items.append(Item(path, m, "uint8", False))
    return items


def compute_segments(items, world):
    """[(item index, rank, row_begin, row_end)]: the concatenated bytes of all datasets split into `world`
    contiguous shares at row granularity (a row belongs to the share holding its first byte); the same split as
    the C++ writer's (src/checkpoint/plan.cpp)."""
    total = sum(d.nbytes for d in items if d.owner < 0)
    bound = [total * r // world for r in range(world + 1)]
    out, offset = [], 0
    for i, d in enumerate(items):
        rows, rb, n = d.rows, d.row_bytes, d.nbytes
        if n == 0:
            continue
        if d.owner >= 0:  # held by one rank only: written whole by it, outside the shares
            out.append((i, d.owner, 0, rows))
            continue

        def first_row(r):
            if r >= world:
                return rows
            b = bound[r]
            return 0 if b <= offset else min(rows, (b - offset + rb - 1) // rb)

        for r in range(world):
            begin, end = first_row(r), first_row(r + 1)
            if end > begin:
                out.append((i, r, begin, end))
        offset += n
    return out


def _describe(items, kind, groups, scheduler, meta):
    lines = [f"{d.path}|{d.dtype}|{d.array.dtype.str}|{list(d.array.shape)}" for d in items]
    lines.append(f"optimizer={kind}")
    for hyper, _ in groups:
        lines += [f"hyper {k}={float(v).hex()}" for k, v in sorted(hyper.items())]
    lines.append(f"scheduler={scheduler.get('type', 'none')}")
    lines += [f"sched {k}={float(v).hex()}" for k, v in sorted(scheduler.items()) if k != "type"]
    lines += [f"meta {k}={v}" for k, v in sorted(meta.items())]
    return xxhash.xxh3_64_intdigest("\n".join(lines).encode())


def _agree_on_plan(comm, items, structure):
    all_structures = comm.allgather((structure, len(items)))
    if len({s for s, _ in all_structures}) != 1:
        seen = "; ".join(f"rank {r}: {n} datasets, structure hash {s:#x}" for r, (s, n) in enumerate(all_structures))
        raise DisagreementError("ranks disagree on the checkpoint's datasets (names, dtypes, shapes) or attributes; "
                                f"no file written: {seen}")
    mine = [_sample_hash(d.array) if d.owner < 0 else 0 for d in items]
    differ = [items[i].path for i, col in enumerate(zip(*comm.allgather(mine))) if len(set(col)) != 1]
    if differ:
        raise DisagreementError("replicated state differs between ranks; no file written: " + ", ".join(differ))


def _write_rows(ds, d, begin, end):
    if d.array.ndim == 0:
        ds[()] = d.array
        return
    per = max(1, MAX_TRANSFER_BYTES // d.row_bytes) if d.row_bytes else end - begin
    for b in range(begin, end, per):
        e = min(end, b + per)
        ds[b:e] = d.array[b:e]


def _utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _plan(comm, model, optimizer, step, epoch, samples_consumed, data, user, scheduler, meta, name):
    """Collective. (kind, groups, items, segments, pieces): the datasets, agreed between the ranks, and each
    rank's rows; raises on every rank when a rank's state breaks a rule or the ranks differ."""
    steps = comm.allgather(int(step))
    if len(set(steps)) != 1:
        raise DisagreementError("ranks disagree on the checkpoint step: " +
                                ", ".join(f"rank {r}={s}" for r, s in enumerate(steps)))
    planned, err = capture(lambda: _local_items(model, optimizer, step, epoch, samples_consumed, data, user,
                                                scheduler, name))
    comm.raise_if_any(err)
    kind, groups, items = planned
    if kind:
        meta.setdefault("optimizer", kind)
    items += _rng_items(comm)
    if zero.is_zero(optimizer):
        items = zero.shard_items(comm, model, items)
    _agree_on_plan(comm, items, _describe(items, kind, groups, scheduler, meta))
    segments = compute_segments(items, comm.size)
    pieces = [0] * len(items)
    for i, _, _, _ in segments:
        pieces[i] += 1
    return kind, groups, items, segments, pieces


def _prepare_dir(comm, run_dir, partial_path, nbytes):
    """Collective. Creates the run directory (rank 0) and checks that the file fits on its file system."""
    def make_run_dir():
        try:
            os.makedirs(run_dir, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create the run directory {run_dir}: {e.strerror}") from None
    comm.raise_if_any(capture(make_run_dir)[1] if comm.rank == 0 else None)
    if comm.rank == 0:
        st = os.statvfs(run_dir)
        needed = nbytes + nbytes // 16 + (1 << 20)
        free = st.f_bavail * st.f_frsize
        comm.raise_if_any(f"not enough space for {partial_path}: needs about {needed} bytes, {free} available "
                          "(disk full?)" if free < needed else None)
    else:
        comm.raise_if_any(None)


def _write_share(comm, dsets, items, segments, partial_path, result):
    """Collective. This rank writes the rows of its share."""
    error = None
    for i, r, begin, end in segments:
        if r != comm.rank or error:
            continue
        _, error = capture(lambda: _write_rows(dsets[i], items[i], begin, end))
        if error:
            error = f"{error} (writing rows [{begin}, {end}) of {items[i].path} to {partial_path})"
        result.bytes_this_rank += (end - begin) * items[i].row_bytes
    comm.raise_if_any(error)


def _write_checksums(comm, dsets, items, segments, pieces):
    """Collective. The checksums agreed, then written by every rank (parallel HDF5: attributes collectively)."""
    agree_checksums(comm, items, segments, pieces)
    _, err = capture(lambda: set_checksums(dsets, items))
    comm.raise_if_any(err)


def _write_partial(comm, partial_path, plan, structure, fsync, result, phases):
    """Collective. Writes, hashes, closes and fsyncs <name>.partial; removes it on any failure.
    plan: (items, segments, pieces); structure: the arguments of create_structure after f and items.
    Without MPI (the "torch" transport) the bytes go by positional writes (pwrite.py)."""
    if comm.transport == "torch":
        return write_partial_positional(comm, partial_path, plan, structure, fsync, result, phases)
    items, segments, pieces = plan
    f = None
    try:
        t = time.perf_counter()
        f, err = capture(lambda: h5.create_file(partial_path, comm))
        comm.raise_if_any(err)
        dsets, err = capture(lambda: create_structure(f, items, *structure))
        comm.raise_if_any(err if err is None else f"creating {partial_path}: {err}")
        phases["create"] = time.perf_counter() - t
        t = time.perf_counter()
        _write_share(comm, dsets, items, segments, partial_path, result)
        phases["write"] = time.perf_counter() - t
        t = time.perf_counter()
        _write_checksums(comm, dsets, items, segments, pieces)
        phases["checksums"] = time.perf_counter() - t
        t = time.perf_counter()
        dsets = None
        _, err = capture(f.close)
        f = None
        comm.raise_if_any(err if err is None else f"closing {partial_path}: {err}")
        if fsync:
            _, err = capture(lambda: fsync_path(partial_path))  # every rank flushes what its client wrote
            comm.raise_if_any(err)
        phases["close+fsync"] = time.perf_counter() - t
    except BaseException:
        if f is not None:
            capture(f.close)
        if comm.rank == 0:
            capture(lambda: os.remove(partial_path))
        raise


def _commit(comm, run_dir, name, fsync, keep_last, keep_every):
    """Collective. Rename (the commit point), fsync the directory, move `latest`, retention (rank 0)."""
    final_path = os.path.join(run_dir, name)
    partial_path = final_path + fmt.PARTIAL_SUFFIX
    err = None
    if comm.rank == 0:
        def commit():
            try:
                os.rename(partial_path, final_path)  # the commit point
            except OSError as e:
                raise CheckpointError(f"cannot rename {partial_path} to {final_path}: {e.strerror}") from None
            if fsync:
                fsync_path(run_dir, directory=True)
        _, err = capture(commit)
        if err:
            capture(lambda: os.remove(partial_path))
    comm.raise_if_any(err)
    if comm.rank == 0:
        _, err = capture(lambda: write_latest(run_dir, name, fsync))
    comm.raise_if_any(err)
    if comm.rank == 0:
        apply_retention(run_dir, keep_last, keep_every, name, _warn)
    comm.barrier()  # every rank returns with the directory in its final state


def save(run_dir, model, optimizer=None, *, step, data=None, epoch=None, samples_consumed=None, scheduler=None,
         meta=None, user=None, keep_last=3, keep_every=0, fsync=True, name=None, comm=None):
    """Collective: every rank of the job calls it with its replica of the model and optimizer (DDP keeps them
    equal; a difference is an error and nothing is written); a ZeroRedundancyOptimizer's state is written by the
    ranks that own it (zero.py). Writes <run_dir>/ckpt-<step>.h5 (or `name`) and
    moves `latest`, then keeps the `keep_last` newest checkpoints (0: all) and every step multiple of
    `keep_every`.

    data: a DataState (sampler seed, epoch, position in global samples, global batch); epoch and
    samples_consumed default to data.epoch and step * data.global_batch. scheduler: {"type": str, name: float}.
    meta: {str: str} (stored under /meta). run_dir is created if missing. user: {name: tensor or number} (stored
    under /user). fsync=False skips every fsync (faster, not crash-safe). comm: the transport, chosen from the
    launch when None (comm.get_comm: "mpi" under mpirun, "torch" for a torchrun/env:// job). Returns a SaveResult
    on every rank.
    A state that would break a rule of docs/FORMAT.md (epoch != data.epoch, data.position > samples_consumed, a
    negative counter, a name ckpt-<digits>.h5 of another step, an optimizer step beyond `step`, maximize=True, a
    non-finite hyperparameter, ...) raises CheckpointError on every rank before anything is written."""
    t0 = time.perf_counter()
    phases = {}
    comm = get_comm(comm)
    data = data or DataState()
    epoch = data.epoch if epoch is None else epoch
    samples_consumed = step * data.global_batch if samples_consumed is None else samples_consumed
    scheduler = dict(scheduler or {"type": "none"})
    meta = dict(meta or {})
    meta.setdefault("torch_version", str(torch.__version__))
    meta.setdefault("writer", f"h5ddp_torch {__version__}")
    name = name or fmt.checkpoint_file_name(step)
    if not name.endswith(fmt.CHECKPOINT_SUFFIX):
        name += fmt.CHECKPOINT_SUFFIX

    kind, groups, items, segments, pieces = _plan(comm, model, optimizer, step, epoch, samples_consumed, data, user,
                                                  scheduler, meta, name)
    phases["plan"] = time.perf_counter() - t0
    final_path = os.path.join(run_dir, name)
    partial_path = final_path + fmt.PARTIAL_SUFFIX
    result = SaveResult(final_path, sum(d.nbytes for d in items))
    _prepare_dir(comm, run_dir, partial_path, result.bytes)
    created = comm.bcast(_utc_now())
    _write_partial(comm, partial_path, (items, segments, pieces),
                   (kind, groups, scheduler, meta, comm.size, step, created), fsync, result, phases)
    t = time.perf_counter()
    _commit(comm, run_dir, name, fsync, keep_last, keep_every)
    phases["commit"] = time.perf_counter() - t
    result.seconds = time.perf_counter() - t0
    result.phases = phases
    return result


def _warn(msg):
    print(f"h5ddp_torch: warning: {msg}", file=sys.stderr, flush=True)
