"""The checkpoint format (docs/FORMAT.md) on the Python side: every path, attribute and dtype name in one
place, mirroring include/h5ddp/format.hpp. No other module of the package spells a path by hand."""
import re

import numpy as np

FORMAT_NAME = "h5ddp-checkpoint"
FORMAT_VERSION = 1
# The revision of version 1 this package implements (docs/FORMAT.md "Versioning"): written by the writer as
# format_minor_version; a file of a newer revision may hold objects this reader does not know (ignored, noted).
FORMAT_MINOR_VERSION = 2

# root attributes
ATTR_FORMAT = "format"
ATTR_FORMAT_VERSION = "format_version"
ATTR_FORMAT_MINOR_VERSION = "format_minor_version"
ATTR_H5DDP_VERSION = "h5ddp_version"
ATTR_TORCH_VERSION = "torch_version"
ATTR_CREATED = "created"
ATTR_WORLD_SIZE = "world_size"
ATTR_STEP = "step"
# Table "Root attributes": name -> (type, required).
ROOT_ATTR_TYPES = {ATTR_FORMAT: ("string", True), ATTR_FORMAT_VERSION: ("int64", True),
                   ATTR_FORMAT_MINOR_VERSION: ("int64", False), ATTR_H5DDP_VERSION: ("string", True),
                   ATTR_TORCH_VERSION: ("string", True), ATTR_CREATED: ("string", True),
                   ATTR_WORLD_SIZE: ("int64", True), ATTR_STEP: ("int64", True)}

# attributes of every dataset (exactly these two, R14)
ATTR_DTYPE = "dtype"
ATTR_CHECKSUM = "xxh3"
DATASET_ATTR_TYPES = {ATTR_DTYPE: "string", ATTR_CHECKSUM: "uint64"}

# groups and datasets
MODEL_GROUP = "/model"
OPTIMIZER_GROUP = "/optimizer"
ATTR_OPTIMIZER_TYPE = "type"
PARAM_GROUPS_GROUP = "/optimizer/param_groups"
PARAM_NAMES_DATASET = "params"
OPTIMIZER_STATE_GROUP = "/optimizer/state"
TRAIN_GROUP = "/train"
TRAIN_STEP = "/train/step"
TRAIN_EPOCH = "/train/epoch"
TRAIN_SAMPLES_CONSUMED = "/train/samples_consumed"
SCHEDULER_GROUP = "/train/lr_scheduler"
ATTR_SCHEDULER_TYPE = "type"
DATA_GROUP = "/data"
DATA_SEED = "/data/seed"
DATA_EPOCH = "/data/epoch"
DATA_POSITION = "/data/position"
DATA_GLOBAL_BATCH = "/data/global_batch"
RNG_GROUP = "/rng"
RNG_CPU = "/rng/cpu"
RNG_CUDA = "/rng/cuda"
META_GROUP = "/meta"
USER_GROUP = "/user"

# The counters of R10 (each >= 0; /data/position <= /train/samples_consumed).
COUNTERS = (TRAIN_STEP, TRAIN_EPOCH, TRAIN_SAMPLES_CONSUMED, DATA_EPOCH, DATA_POSITION, DATA_GLOBAL_BATCH)

# Table "Optimizers".
OPTIMIZER_TYPES = ("", "sgd", "adam", "adamw")
# Per-parameter state keys of each optimizer type (PyTorch's names), in the order the writers list them.
STATE_KEYS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"),
              "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")}
AMSGRAD_STATE_KEY = "max_exp_avg_sq"   # present exactly when the group's amsgrad is 1
STEP_STATE_KEY = "step"                # Adam's per-parameter step: an int64 scalar (R8)
# State datasets with the dtype and shape of their parameter (R7).
FLOAT_STATE_KEYS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
ALL_STATE_KEYS = frozenset(k for keys in STATE_KEYS.values() for k in keys)
# Hyperparameters each type stores per param group (float64 attributes, all required, R9).
HYPER_KEYS = {"sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
              "adam": ("lr", "betas0", "betas1", "eps", "weight_decay", "amsgrad"),
              "adamw": ("lr", "betas0", "betas1", "eps", "weight_decay", "amsgrad")}
BOOL_HYPER_KEYS = ("nesterov", "amsgrad")  # float64 0.0 or 1.0
ALL_HYPER_KEYS = frozenset(k for keys in HYPER_KEYS.values() for k in keys)


def required_state_keys(kind, amsgrad):
    """The state datasets a parameter of optimizer type `kind` has (R6), `amsgrad` its group's flag."""
    return tuple(k for k in STATE_KEYS.get(kind, ()) if k != AMSGRAD_STATE_KEY or amsgrad)


# Table "Schedules": the types h5ddp-train writes and the float64 attributes each requires (R12).
SCHEDULE_REQUIRED = {"none": (), "": (), "constant": ("base_lr",), "step": ("base_lr", "step_size", "gamma"),
                     "cosine": ("base_lr", "total_steps")}

# files in a run directory
CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_SUFFIX = ".h5"
PARTIAL_SUFFIX = ".partial"
LATEST_FILE = "latest"
LATEST_TMP_FILE = "latest.tmp"

# h5ddp dtype name -> numpy dtype of the stored bytes (little endian; bfloat16 as its raw uint16 bits, bool as
# uint8 0/1).
NUMPY_DTYPES = {
    "float32": np.dtype("<f4"), "float64": np.dtype("<f8"), "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"), "int64": np.dtype("<i8"), "int32": np.dtype("<i4"), "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"), "uint8": np.dtype("u1"), "uint64": np.dtype("<u8"), "bool": np.dtype("u1"),
}
DTYPE_NAMES = tuple(NUMPY_DTYPES) + ("string",)

_STEP_NAME = re.compile(r"^ckpt-(\d+)\.h5$")


def model_dataset(key):
    """"/model/<key>"; the key must be non-empty, carry no '/' and no "module." prefix."""
    if not key or "/" in key or key.startswith("module."):
        raise ValueError(f"model key {key!r} cannot name a dataset (empty, contains '/', or starts with 'module.')")
    return f"{MODEL_GROUP}/{key}"


def user_dataset(key):
    if not key or "/" in key:
        raise ValueError(f"user key {key!r} cannot name a dataset (empty or contains '/')")
    return f"{USER_GROUP}/{key}"


def optimizer_state_dataset(param, key):
    if not param or "/" in param:
        raise ValueError(f"parameter name {param!r} cannot name an optimizer state group")
    return f"{OPTIMIZER_STATE_GROUP}/{param}/{key}"


def param_group_path(index):
    return f"{PARAM_GROUPS_GROUP}/{index}"


def checkpoint_file_name(step):
    return f"{CHECKPOINT_PREFIX}{step:08d}{CHECKPOINT_SUFFIX}"


def checkpoint_step_from_name(name):
    """The step of a file named ckpt-<digits>.h5, or -1 for any other name (a *.partial included)."""
    m = _STEP_NAME.match(name)
    return int(m.group(1)) if m else -1
