#!/usr/bin/env python3
"""An example GPT for h5ddp-train's token data (docs/DATA.md token layouts, issue 40): a GPT-2 style decoder
written for TorchScript, a command that scripts it, and a sampler that reads the weights back from training.

  gpt.py script -o gpt.pt [--vocab-size 256] [--context 128] [--layers 4] [--heads 4] [--dim 128]
                [--dropout 0] [--tie-weights] [--seed 0]
      builds GPT (weights drawn after torch.manual_seed(--seed)), scripts it with torch.jit.script, saves it and
      prints its parameter count. Train it with: h5ddp-train --model-file gpt.pt --data tokens.h5
  gpt.py generate --weights W [--config C] [--data tokens.h5] --prompt TEXT [--tokens 200]
                  [--temperature 0.8] [--seed 0]
      rebuilds the Python class from the recorded configuration, loads W strictly and prints the prompt and
      --tokens sampled tokens (--temperature 0: greedy). W is one of
        a .safetensors file (read by read_safetensors below, no safetensors package needed),
        an h5ddp checkpoint .h5 (its /model datasets, checked by the package h5ddp_torch: rules, checksums),
        a .pt: the dict of `h5ddp-ckpt export CKPT --to OUT.pt` (its "model" entry), a plain state dict, or a
        scripted gpt.pt itself (its untrained weights).
      The tokenizer is the data file's (root attributes `tokenizer`, `vocab`): "bytes" (id = UTF-8 byte,
      decoded with errors="replace") or "chars" (id = index into `vocab`, the code points); bytes without --data.

Configuration record: the constructor arguments are a JSON object in the module's string attribute
`config_json` (GPT(**json.loads(config_json)) rebuilds the class). It is saved inside gpt.pt, so the file
h5ddp-train was given is the configuration: --config takes that .pt or a .json file holding the same object.
Without --config, generate takes it from --weights when that is a scripted gpt.pt, else from the .pt named by
the checkpoint's /meta model_file (recorded by h5ddp-train --model-file; kept by h5ddp-ckpt export). An
attribute, unlike torch.jit.save's _extra_files, survives a torch.jit.load + save round trip, and it is neither
a parameter nor a buffer, so h5ddp-train's checkpoints do not see it.

Library use (tests/lm/test_gpt_example.py): GPT, load_config, load_weights(path) -> state dict,
load_model(weights, config), read_safetensors, next_logits, sample.
"""
import argparse
import json
import math
import os
import struct
import sys
import zipfile
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG_DEFAULTS = {"dropout": 0.0, "tie_weights": False}
CONFIG_REQUIRED = ("vocab_size", "context", "layers", "heads", "dim")


class GptError(Exception):
    """Bad input to this tool (a file, an option): printed as one line, exit status 2."""


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.dropout = dropout
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size(0), x.size(1), x.size(2)
        qkv = self.c_attn(x).split(c, dim=2)
        q = qkv[0].view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = qkv[1].view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = qkv[2].view(b, t, self.heads, self.head_dim).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        att = F.dropout(att, self.dropout, self.training)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2's GELU is the tanh approximation (its "gelu_new").
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, dropout)

    def forward(self, x: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), future)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 style decoder: token + learned position embeddings, `layers` pre-LayerNorm blocks (causal multi-head
    self-attention, GELU MLP 4x), final LayerNorm, output head. forward(idx int64 [B, T <= context]) -> logits
    float32 [B, T, vocab_size]. State-dict keys: wte, wpe, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
    mlp.c_proj}, ln_f, lm_head.weight.

    tie_weights: GPT-2's tie, lm_head.weight IS wte.weight (`self.lm_head.weight = self.wte.weight`), one tensor
    under two state-dict names; parameters() lists it once. h5ddp's C++ side sees both names and treats them as
    one parameter (h5ddp::unique_parameters: one gradient reduction, one optimizer entry). load_model also takes
    older tied weights that hold only wte.weight.

    Weights: GPT-2's init (normal, std 0.02; zero biases; residual projections c_proj std 0.02 / sqrt(2 layers)),
    drawn from torch's default generator in a fixed order, so torch.manual_seed(s) before GPT(...) fixes them."""

    def __init__(self, vocab_size: int, context: int, layers: int, heads: int, dim: int, dropout: float = 0.0,
                 tie_weights: bool = False):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("context", context), ("layers", layers), ("heads", heads),
                        ("dim", dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), not {dropout}")
        self.vocab_size = vocab_size
        self.context = context
        self.dropout = float(dropout)
        # The constructor arguments, saved with the scripted module (see the module docstring).
        self.config_json = json.dumps({"vocab_size": vocab_size, "context": context, "layers": layers,
                                       "heads": heads, "dim": dim, "dropout": float(dropout),
                                       "tie_weights": bool(tie_weights)}, sort_keys=True)
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(context, dim)
        self.h = nn.ModuleList([Block(dim, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        if tie_weights:  # built on the meta device, its own weight never drawn: a seed gives the weights it gave
            self.lm_head = nn.Linear(dim, vocab_size, bias=False, device="meta")  # when the tie had one name
            self.lm_head.weight = self.wte.weight
        else:
            self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        self._init_weights(layers)

    def _init_weights(self, layers: int):
        residual_std = 0.02 / math.sqrt(2 * layers)
        drawn = set()  # a tied weight is drawn once, as wte's
        with torch.no_grad():
            for name, m in self.named_modules():
                if isinstance(m, (nn.Linear, nn.Embedding)) and id(m.weight) not in drawn:
                    drawn.add(id(m.weight))
                    m.weight.normal_(0.0, residual_std if name.endswith("c_proj") else 0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    m.bias.zero_()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError("GPT takes token ids [B, T], got " + str(idx.dim()) + " dimensions")
        t = idx.size(1)
        if t > self.context:
            raise ValueError("sequence length " + str(t) + " exceeds the context " + str(self.context))
        # The causal mask is made here, not kept as a buffer: a scripted module in torch 1.13 puts even a
        # persistent=False buffer into its state_dict (and h5ddp would checkpoint it), while the eager class's
        # state_dict leaves it out, so checkpoint keys would stop matching the Python class.
        future = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
        for block in self.h:
            x = block(x, future)
        return self.lm_head(self.ln_f(x))


# ---- configuration ----------------------------------------------------------------------------------------------

def check_config(config, where):
    """The GPT constructor arguments of a JSON object, defaults filled in; GptError naming `where` otherwise."""
    if not isinstance(config, dict):
        raise GptError(f"{where}: the configuration is not a JSON object")
    unknown = sorted(set(config) - set(CONFIG_REQUIRED) - set(CONFIG_DEFAULTS))
    missing = [k for k in CONFIG_REQUIRED if k not in config]
    if unknown or missing:
        raise GptError(f"{where}: configuration " + "; ".join(
            (["unknown keys " + ", ".join(unknown)] if unknown else []) +
            (["missing keys " + ", ".join(missing)] if missing else [])))
    return {**CONFIG_DEFAULTS, **config}


def load_config(path):
    """GPT constructor arguments from a scripted gpt.pt (its config_json attribute) or a .json file."""
    if not os.path.isfile(path):
        raise GptError(f"--config {path}: no such file")
    with open(path, "rb") as f:
        head = f.read(1)
    if head == b"{":
        with open(path, encoding="utf-8") as f:
            try:
                return check_config(json.load(f), path)
            except json.JSONDecodeError as e:
                raise GptError(f"{path}: not JSON: {e}") from None
    try:
        module = torch.jit.load(path, map_location="cpu")
    except RuntimeError as e:
        raise GptError(f"{path}: neither a JSON configuration nor a TorchScript module: "
                       f"{str(e).strip().splitlines()[-1]}") from None
    if not hasattr(module, "config_json"):
        raise GptError(f"{path}: a TorchScript module without a config_json attribute (not made by gpt.py script)")
    return check_config(json.loads(module.config_json), path)


# ---- weights ----------------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}
H5_MAGIC = b"\x89HDF\r\n\x1a\n"


def read_safetensors(path):
    """{name: tensor} of a .safetensors file: an 8-byte little-endian header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets: [begin, end]}, optional __metadata__: {str: str}}, then the data, the
    offsets relative to its start. The tensors must cover the data exactly, in order, with no gap or overlap."""
    if sys.byteorder != "little":
        raise GptError("read_safetensors assumes a little-endian host")
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise GptError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise GptError(f"{path}: header length {n} exceeds the {len(raw) - 8} bytes after it")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GptError(f"{path}: the header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise GptError(f"{path}: the header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise GptError(f"{path}: __metadata__ is not an object of strings")
    data = memoryview(raw)[8 + n:]

    def entry(name, e):
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise GptError(f"{path}: tensor {name}: needs exactly dtype, shape, data_offsets")
        if e["dtype"] not in SAFETENSORS_DTYPES:
            raise GptError(f"{path}: tensor {name}: dtype {e['dtype']!r} is not one of "
                           + ", ".join(SAFETENSORS_DTYPES))
        shape, offsets = e["shape"], e["data_offsets"]
        ints = (lambda v, k: isinstance(v, list) and len(v) in k and
                all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v))
        if not ints(shape, range(0, 64)) or not ints(offsets, (2,)):
            raise GptError(f"{path}: tensor {name}: shape {shape} / data_offsets {offsets} are not "
                           "lists of non-negative integers ([begin, end] for the offsets)")
        return e["dtype"], shape, offsets[0], offsets[1]

    entries = sorted(((name,) + entry(name, e) for name, e in header.items()), key=lambda r: (r[3], r[4]))
    tensors, expected = {}, 0
    for name, dtype_name, shape, begin, end in entries:
        dtype = SAFETENSORS_DTYPES[dtype_name]
        if begin != expected:
            raise GptError(f"{path}: tensor {name} starts at byte {begin} of the data, not {expected}: "
                           f"{'a gap' if begin > expected else 'an overlap'} between tensors")
        if end < begin or end > len(data):
            raise GptError(f"{path}: tensor {name}: data_offsets [{begin}, {end}] outside the {len(data)} data bytes")
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != numel * itemsize:
            raise GptError(f"{path}: tensor {name}: {end - begin} bytes for {dtype_name} {shape} "
                           f"({numel * itemsize} expected)")
        expected = end
        tensors[name] = (torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape) if numel
                         else torch.empty(shape, dtype=dtype))
    if expected != len(data):
        raise GptError(f"{path}: {len(data) - expected} data bytes after the last tensor")
    return tensors


def read_h5ddp_model(path):
    """{key: tensor} of an h5ddp checkpoint's /model (docs/FORMAT.md), read and checked (rules, checksums) by the
    repository's Python package h5ddp_torch (python/, found beside this script when not installed)."""
    try:
        import h5ddp_torch
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        import h5ddp_torch
    try:
        return h5ddp_torch.read_model(path)
    except h5ddp_torch.CheckpointError as e:
        raise GptError(str(e)) from None


def is_torchscript(path):
    """A zip archive with code records: torch.jit.save's format (torch.save's zip has none)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.startswith("code/") or "/code/" in n for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def read_torch_file(path):
    """The state dict in a .pt: h5ddp-ckpt export's dict ("model"), a dict with "state_dict", a plain state
    dict, or a TorchScript module."""
    try:
        obj = torch.jit.load(path, map_location="cpu") if is_torchscript(path) else torch.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure to unpickle means "not a .pt"
        raise GptError(f"{path}: neither safetensors, an HDF5 checkpoint nor a torch .pt file: "
                       + (str(e).strip().splitlines() or [""])[-1]) from None
    if isinstance(obj, torch.jit.ScriptModule):
        return dict(obj.state_dict())
    if isinstance(obj, dict):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return dict(obj)
    raise GptError(f"{path}: no state dict in it (expected h5ddp-ckpt export's dict, a state dict or a "
                   "TorchScript module)")


def load_weights(path):
    """The state dict in a .safetensors, h5ddp checkpoint (.h5) or .pt file (told apart by content, not by
    name); a "module." prefix on every key (h5ddp-ckpt export --add-prefix module.) is dropped."""
    if not os.path.isfile(path):
        raise GptError(f"--weights {path}: no such file")
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(H5_MAGIC):
        state = read_h5ddp_model(path)
    elif len(head) == 9 and head[8:9] == b"{" and not head.startswith(b"PK"):
        state = read_safetensors(path)
    else:
        state = read_torch_file(path)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def config_source(weights):
    """Where generate finds the configuration without --config: the weights file itself when it is a scripted
    gpt.pt, else the TorchScript file a checkpoint was trained from (/meta model_file, which h5ddp-train
    --model-file records; also in h5ddp-ckpt export's "meta"). None when neither."""
    if is_torchscript(weights):
        return weights
    v = None
    try:
        with open(weights, "rb") as f:
            head = f.read(8)
        if head == H5_MAGIC:
            import h5py
            with h5py.File(weights, "r") as f:
                v = f["meta"].attrs.get("model_file") if "meta" in f else None
        elif head.startswith(b"PK"):
            obj = torch.load(weights, map_location="cpu")
            v = obj.get("meta", {}).get("model_file") if isinstance(obj, dict) else None
    except (OSError, RuntimeError, AttributeError):
        return None
    return v.decode() if isinstance(v, bytes) else v


def load_model(weights, config):
    """GPT(**config) with the weights of file `weights`, loaded strictly, in eval mode. config: a dict or the
    path of a gpt.pt / .json. Tied (tie_weights), lm_head.weight may be missing (older files name the tensor
    once, wte.weight); present, it must equal wte.weight."""
    if not isinstance(config, dict):
        config = load_config(config)
    model = GPT(**check_config(config, "config"))
    state = load_weights(weights)
    if model.lm_head.weight is model.wte.weight and "wte.weight" in state:
        if "lm_head.weight" not in state:  # tied weights saved under one name (before the tie had two)
            state["lm_head.weight"] = state["wte.weight"]
        elif not torch.equal(state["lm_head.weight"], state["wte.weight"]):
            raise GptError(f"{weights}: lm_head.weight differs from wte.weight, but the configuration ties them "
                           "(tie_weights)")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise GptError(f"{weights} does not fit GPT({json.dumps(config, sort_keys=True)}): "
                       + " ".join(str(e).split())) from None
    return model.eval()


# ---- sampling -----------------------------------------------------------------------------------------------------

def read_tokenizer(data_path, vocab_size):
    """(encode, decode) of the data file's tokenizer (bytes without a file). Refuses a file whose vocab_size is
    not the model's and tokenizers other than bytes and chars."""
    kind, vocab = "bytes", None
    if data_path:
        import h5py
        with h5py.File(data_path, "r") as f:
            text = (lambda v: v.decode() if isinstance(v, bytes) else v)
            if "vocab_size" not in f.attrs:
                raise GptError(f"--data {data_path}: no root attribute vocab_size (not a token data file)")
            if int(f.attrs["vocab_size"]) != vocab_size:
                raise GptError(f"--data {data_path}: vocab_size {int(f.attrs['vocab_size'])}, the model's is "
                               f"{vocab_size}")
            vocab = [int(c) for c in f.attrs["vocab"]] if "vocab" in f.attrs else None
            kind = text(f.attrs.get("tokenizer", "chars" if vocab is not None else "bytes"))
    if kind == "chars":
        if vocab is None or len(vocab) != vocab_size:
            raise GptError(f"--data {data_path}: tokenizer chars needs a root vocab of {vocab_size} code points")
        index = {c: i for i, c in enumerate(vocab)}

        def encode(s):
            missing = sorted({ch for ch in s if ord(ch) not in index})
            if missing:
                raise GptError(f"the prompt has characters the vocabulary lacks: {''.join(missing)!r}")
            return [index[ord(ch)] for ch in s]
        return encode, lambda ids: "".join(chr(vocab[i]) for i in ids)
    if kind == "bytes":
        if vocab_size != 256:
            raise GptError(f"tokenizer bytes needs vocab_size 256, the model has {vocab_size} (pass --data)")
        return (lambda s: list(s.encode("utf-8"))), (lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    raise GptError(f"--data {data_path}: tokenizer {kind!r}: generate decodes bytes and chars only")


@torch.no_grad()
def next_logits(model, ids):
    """float32 logits [B, vocab] of the token after ids [B, L] (the last `context` ids are what the model sees)."""
    return model(ids[:, -model.context:])[:, -1, :].float()


@torch.no_grad()
def sample(model, prompt_ids: List[int], tokens: int, temperature: float = 0.8, seed: int = 0) -> List[int]:
    """prompt_ids followed by `tokens` sampled ids; temperature 0 is greedy. Fixed by seed (its own generator)."""
    if not prompt_ids:
        raise GptError("the prompt is empty: give at least one token")
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    for _ in range(tokens):
        logits = next_logits(model, ids)
        if temperature <= 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=g)
        ids = torch.cat([ids, nxt], dim=1)
    return ids[0].tolist()


# ---- commands -----------------------------------------------------------------------------------------------------

def cmd_script(a):
    torch.manual_seed(a.seed)
    try:
        model = GPT(a.vocab_size, a.context, a.layers, a.heads, a.dim, a.dropout, a.tie_weights)
    except ValueError as e:
        raise GptError(str(e)) from None
    scripted = torch.jit.script(model)
    scripted.save(a.output)
    # What h5ddp-train will do first: load it and run a batch of full windows.
    back = torch.jit.load(a.output)
    out = back(torch.zeros(2, a.context, dtype=torch.long))
    assert out.shape == (2, a.context, a.vocab_size), out.shape
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.output}: GPT {model.config_json}: {n:,} parameters ({4 * n / 2**20:.2f} MiB float32)")


def cmd_generate(a):
    config = a.config or config_source(a.weights)
    if not config:
        raise GptError(f"--config is needed: {a.weights} names no model file (/meta model_file)")
    if not a.config and not os.path.isfile(config):
        raise GptError(f"--config is needed: {a.weights} was trained from {config}, which is not there")
    model = load_model(a.weights, config)
    encode, decode = read_tokenizer(a.data, model.vocab_size)
    ids = sample(model, encode(a.prompt), a.tokens, a.temperature, a.seed)
    sys.stdout.write(decode(ids) + "\n")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("script", help="build, script and save a GPT")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--vocab-size", type=int, default=256)
    s.add_argument("--context", type=int, default=128)
    s.add_argument("--layers", type=int, default=4)
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--dim", type=int, default=128)
    s.add_argument("--dropout", type=float, default=0.0)
    s.add_argument("--tie-weights", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("generate", help="sample text from trained weights")
    g.add_argument("--weights", required=True, help=".safetensors, h5ddp checkpoint .h5, or .pt")
    g.add_argument("--config", help="the scripted gpt.pt or a .json (default: --weights itself when it is a "
                   "scripted gpt.pt, else the checkpoint's /meta model_file)")
    g.add_argument("--data", help="token data file whose tokenizer to use (default: bytes)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--tokens", type=int, default=200)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    try:
        {"script": cmd_script, "generate": cmd_generate}[a.command](a)
    except GptError as e:
        print(f"gpt.py {a.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
