"""tools/examples/gpt.py, the example GPT for token data (issue 40), in one process without MPI: the scripted
module computes bitwise what the eager one does (eval and, with dropout, training) and is causal; a tied model
holds one tensor under two names, wte.weight and lm_head.weight (GPT-2's tie), its gradient reaching wte through
the head, and loads older tied weights that name it once; the weights come back from a .safetensors file written HERE from the format's description (F32, F16,
BF16, I64; malformed files refused), from an h5ddp checkpoint written by h5ddp_torch, and from an h5ddp-ckpt
export style dict, giving the in-memory model's first-token logits; `gpt.py generate` prints what sample() does
with the in-memory model, the same text for a seed and other text for another seed.

  /usr/bin/python3 tests/python/test_gpt_example.py"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
GPT_PY = os.path.join(SOURCE, "tools", "examples", "gpt.py")
sys.path.insert(0, os.path.join(SOURCE, "tools", "examples"))
sys.path.insert(0, os.path.join(SOURCE, "python"))
import gpt  # noqa: E402
import h5ddp_torch  # noqa: E402

CONFIG = {"vocab_size": 256, "context": 16, "layers": 2, "heads": 4, "dim": 32}


def tiny(tie, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return gpt.GPT(**CONFIG, dropout=dropout, tie_weights=tie)


def expect_error(fn, needle):
    """fn() must raise an exception whose message contains needle."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        assert needle in str(e), f"expected {needle!r} in: {e}"
        return
    raise AssertionError(f"no error (expected one with {needle!r})")


def shared_names(named_tensors):
    """Groups of names whose tensors share memory (same storage and offset): what a by-name mirror would
    reduce and save twice."""
    by_address = {}
    for name, t in named_tensors:
        by_address.setdefault((t.storage().data_ptr(), t.storage_offset()), []).append(name)
    return [names for names in by_address.values() if len(names) > 1]


def check_script(tie):
    model = tiny(tie).eval()
    scripted = torch.jit.script(model)
    x = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))
    eager = model(x)
    assert eager.shape == (3, 16, 256) and eager.dtype == torch.float32, eager.shape
    for _ in range(4):  # the profiling executor specialises the graph after the first calls
        assert torch.equal(scripted(x), eager), f"tie={tie}: scripted forward differs from eager"
    assert torch.equal(scripted(x[:, :5]), model(x[:, :5])), "a window shorter than the context"
    expect_error(lambda: scripted(torch.zeros(1, 17, dtype=torch.long)), "exceeds the context 16")

    # Causal: changing token 9 changes no logit before position 9, and changes position 9's.
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % 256
    changed = scripted(y)
    assert torch.equal(changed[:, :9], eager[:, :9]), "a position sees a later token"
    assert not torch.equal(changed[:, 9], eager[:, 9]), "position 9 ignores its own token"

    # Saved and loaded, it computes the same and carries its configuration.
    d = tempfile.mkdtemp(prefix="h5ddp-gpt-script-")
    try:
        path = os.path.join(d, "gpt.pt")
        scripted.save(path)
        back = torch.jit.load(path)
        assert torch.equal(back(x), eager), "the saved module computes otherwise"
        assert gpt.load_config(path) == {**CONFIG, "dropout": 0.0, "tie_weights": tie}, gpt.load_config(path)
    finally:
        shutil.rmtree(d, ignore_errors=True)

    # With dropout, in training mode: the same random stream gives the same output, and dropout is active.
    model = tiny(tie, dropout=0.2).train()
    scripted = torch.jit.script(model)
    torch.manual_seed(5)
    eager = model(x)
    for _ in range(3):
        torch.manual_seed(5)
        assert torch.equal(scripted(x), eager), f"tie={tie}: scripted training forward differs from eager"
    assert not torch.equal(eager, model.eval()(x)), "dropout 0.2 changes nothing in training mode"


def check_tying(d):
    untied, tied = tiny(False), tiny(True)
    n = {m: sum(p.numel() for p in m.parameters()) for m in (untied, tied)}
    assert n[untied] - n[tied] == 256 * 32, n
    assert tied.lm_head.weight is tied.wte.weight and untied.lm_head.weight is not untied.wte.weight
    # Tied: one tensor under both names, in the eager and the scripted state dict; untied: no shared tensor.
    for m, want in ((untied, []), (tied, [["wte.weight", "lm_head.weight"]])):
        s = torch.jit.script(m)
        for what, named in (("state_dict", m.state_dict().items()), ("scripted state_dict", s.state_dict().items())):
            assert shared_names(named) == want, f"tied={m is tied}: {what}: shared tensors {shared_names(named)}"
    # Tied, the head is wte: a token absent from the input still gets a gradient in its wte row.
    x = torch.full((2, 16), 7, dtype=torch.long)
    for m, expect in ((tied, True), (untied, False)):
        m.zero_grad()
        m(x).logsumexp(-1).sum().backward()
        assert bool(m.wte.weight.grad[8].abs().sum() > 0) == expect, f"tied={m is tied}: wte row 8 grad"

    # Older tied weights name the tensor once (wte.weight): load_model fills lm_head.weight from it.
    tied.eval()
    old = {k: v for k, v in tied.state_dict().items() if k != "lm_head.weight"}
    path = os.path.join(d, "tied-one-name.pt")
    torch.save(old, path)
    back = gpt.load_model(path, {**CONFIG, "tie_weights": True})
    assert back.lm_head.weight is back.wte.weight and torch.equal(back(x), tied(x)), "one-name tied weights"
    both = os.path.join(d, "tied-two-names.pt")
    torch.save(tied.state_dict(), both)
    assert torch.equal(gpt.load_model(both, {**CONFIG, "tie_weights": True})(x), tied(x)), "two-name tied weights"
    expect_error(lambda: gpt.load_model(path, CONFIG), "lm_head.weight")  # untied needs its own head


SAFETENSORS_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata=None, mutate=None):
    """A .safetensors file from the format's description: u64 little-endian header length, JSON header
    {name: {dtype, shape, data_offsets}} (padded with spaces to 8 bytes, as the safetensors library does), the
    tensors' bytes in header order. mutate(header) may break the header before it is written."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    if mutate:
        mutate(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def check_safetensors(d):
    model = tiny(False).eval()
    state = model.state_dict()
    path = os.path.join(d, "gpt.safetensors")
    write_safetensors(path, state, metadata={"format": "pt"})
    loaded = gpt.load_weights(path)
    assert list(loaded) == list(state) and all(torch.equal(loaded[k], state[k]) for k in state)

    # generate's model (rebuilt from the configuration, loaded from the file) gives the in-memory logits.
    config = os.path.join(d, "gpt.json")
    with open(config, "w") as f:
        json.dump(CONFIG, f)
    prompt = torch.tensor([list(b"Hello")])
    rebuilt = gpt.load_model(path, config)
    first = gpt.next_logits(rebuilt, prompt)
    assert first.shape == (1, 256) and torch.equal(first, model(prompt)[:, -1, :]), "first-token logits differ"
    other = tiny(False, seed=1).eval()
    assert not torch.equal(first, other(prompt)[:, -1, :]), "the logits do not depend on the weights"
    expect_error(lambda: gpt.load_model(path, {**CONFIG, "tie_weights": True}), "lm_head.weight")

    # F16, BF16, I64 come back with their dtypes and values; F16 weights load into the float32 model.
    small = {"a": torch.randn(3, 4).half(), "b": torch.randn(5).bfloat16(), "c": torch.arange(-3, 3),
             "empty": torch.zeros(0, 2), "scalar": torch.tensor(2.5)}
    mixed = os.path.join(d, "mixed.safetensors")
    write_safetensors(mixed, small)
    back = gpt.read_safetensors(mixed)
    for k, t in small.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape and torch.equal(back[k], t), k
    half = os.path.join(d, "half.safetensors")
    write_safetensors(half, {k: v.half() for k, v in state.items()})
    m16 = gpt.load_model(half, CONFIG)
    assert torch.equal(m16.wte.weight, state["wte.weight"].half().float())

    # Malformed files are refused, each with its reason.
    def shift(name, by):
        return lambda h: h[name].__setitem__("data_offsets", [o + by for o in h[name]["data_offsets"]])
    cases = [
        ("gap", dict(mutate=shift("c", 8)), "a gap"),
        ("overlap", dict(mutate=shift("c", -8)), "an overlap"),
        ("bounds", dict(mutate=lambda h: h["scalar"].__setitem__("data_offsets", [h["scalar"]["data_offsets"][0],
                                                                                  10 ** 6])), "outside the"),
        ("size", dict(mutate=lambda h: h["a"].__setitem__("shape", [3, 5])), "bytes for F16 [3, 5]"),
        ("dtype", dict(mutate=lambda h: h["a"].__setitem__("dtype", "F8_E4M3")), "dtype 'F8_E4M3'"),
        ("keys", dict(mutate=lambda h: h["a"].pop("shape")), "needs exactly dtype, shape, data_offsets"),
        ("metadata", dict(metadata={"n": 1}), "__metadata__ is not an object of strings"),
    ]
    for what, kw, needle in cases:
        bad = os.path.join(d, f"bad-{what}.safetensors")
        write_safetensors(bad, small, **kw)
        expect_error(lambda: gpt.read_safetensors(bad), needle)
    with open(mixed, "rb") as f:
        good = f.read()
    for what, raw, needle in (("trailing", good + b"\0" * 4, "data bytes after the last tensor"),
                              ("truncated", good[:-4], "outside the"),
                              ("header", struct.pack("<Q", len(good)) + good[8:], "exceeds the"),
                              ("short", b"\1\0\0", "shorter than the 8-byte header length")):
        bad = os.path.join(d, f"bad-{what}.safetensors")
        with open(bad, "wb") as f:
            f.write(raw)
        expect_error(lambda: gpt.read_safetensors(bad), needle)
    return path, config, model


def check_checkpoints(d):
    """The two other weight files: an h5ddp checkpoint (written by h5ddp_torch, bfloat16 entry included) and
    h5ddp-ckpt export's dict, both naming the model file generate then takes the configuration from."""
    model = tiny(True, seed=3).eval()
    scripted = os.path.join(d, "tied.pt")
    torch.jit.script(model).save(scripted)
    extra = torch.nn.Module()  # one bfloat16 buffer beside the model: the reader's bfloat16 path
    extra.register_buffer("b", torch.randn(4).bfloat16())
    holder = torch.nn.ModuleDict({"gpt": model, "extra": extra})
    run = os.path.join(d, "run")
    res = h5ddp_torch.save(run, holder, None, step=0, fsync=False, meta={"model_file": scripted})
    loaded = gpt.load_weights(res.path)
    state = holder.state_dict()
    assert sorted(loaded) == sorted(state) and all(
        loaded[k].dtype == state[k].dtype and torch.equal(loaded[k], state[k]) for k in state), "h5 weights differ"
    assert gpt.config_source(res.path) == scripted
    with h5py.File(res.path, "r+") as f:  # one flipped value: the checksum sees it
        ds = f["model/gpt.wte.weight"]
        v = ds[()]
        v[0, 0] += 1
        ds[...] = v
    expect_error(lambda: gpt.load_weights(res.path), "checksum mismatch")

    export = os.path.join(d, "export.pt")
    torch.save({"model": {"module." + k: v for k, v in model.state_dict().items()}, "step": 0,
                "meta": {"model_file": scripted}}, export)
    assert gpt.config_source(export) == scripted
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(gpt.next_logits(gpt.load_model(export, scripted), prompt), model(prompt)[:, -1, :])
    # The scripted file itself holds weights and configuration.
    assert gpt.config_source(scripted) == scripted
    assert torch.equal(gpt.next_logits(gpt.load_model(scripted, scripted), prompt), model(prompt)[:, -1, :])


def run_generate(*args):
    r = subprocess.run([sys.executable, GPT_PY, "generate", *map(str, args)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode("utf-8")


def check_generate(d, weights, config, model):
    ref = bytes(gpt.sample(model, list(b"Hi"), 40, 1.0, 7)).decode("utf-8", errors="replace") + "\n"
    out = run_generate("--weights", weights, "--config", config, "--prompt", "Hi", "--tokens", 40,
                       "--temperature", 1.0, "--seed", 7)
    assert out == ref, f"generate printed {out!r}, the in-memory model samples {ref!r}"
    assert out.startswith("Hi") and out == run_generate("--weights", weights, "--config", config, "--prompt", "Hi",
                                                        "--tokens", 40, "--temperature", 1.0, "--seed", 7)
    assert out != run_generate("--weights", weights, "--config", config, "--prompt", "Hi", "--tokens", 40,
                               "--temperature", 1.0, "--seed", 8), "another seed, the same text"
    greedy = gpt.sample(model, list(b"Hi"), 10, 0.0, 1)
    assert greedy == gpt.sample(model, list(b"Hi"), 10, 0.0, 2), "greedy sampling depends on the seed"

    # The chars tokenizer of a token data file: ids index the root vocab.
    vocab = [ord(c) for c in "\n abcdefghijklmnopqrstuvwxyz"] + list(range(0x4e00, 0x4e00 + 228))
    data = os.path.join(d, "chars.h5")
    with h5py.File(data, "w") as f:
        f.attrs["vocab_size"], f.attrs["tokenizer"], f.attrs["vocab"] = 256, "chars", np.array(vocab, np.int32)
    encode, decode = gpt.read_tokenizer(data, 256)
    assert encode("hi a") == [9, 10, 1, 2] and decode([9, 10, 0, 28]) == "hi\n\u4e00"
    expect_error(lambda: encode("Hi!"), "'!H'")
    ids = gpt.sample(model, encode("hi"), 30, 1.0, 3)
    out = run_generate("--weights", weights, "--config", config, "--data", data, "--prompt", "hi", "--tokens", 30,
                       "--temperature", 1.0, "--seed", 3)
    assert out == decode(ids) + "\n", (out, decode(ids))
    expect_error(lambda: gpt.read_tokenizer(data, 300), "vocab_size 256, the model's is 300")


def main():
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="h5ddp-gpt-")
    try:
        for tie in (False, True):
            check_script(tie)
        check_tying(d)
        weights, config, model = check_safetensors(d)
        check_checkpoints(d)
        check_generate(d, weights, config, model)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
