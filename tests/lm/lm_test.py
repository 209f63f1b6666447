"""h5ddp-train on token data (issue 40): next-token loss, --grad-clip, bad token files, with a tiny TorchScript
language model scripted here (an embedding, tanh, a linear head: logits [B, T, V]).

  lm_test.py [NP CASE...]        (ht.cli: the default runs every case at 2 ranks)

- loss_equals_pytorch: the first step's logged loss and h5ddp-ckpt eval's test loss equal torch's cross_entropy
  (ignore_index -100) over the same windows, computed here with the sampler's indices (h5ddp_torch.sampler).
- bad_token_data: an id >= vocab_size, a label shape unlike the samples', a stream shorter than one window, a
  per-position label >= vocab_size: exit != 0 before the first step, one message naming the file and the dataset.
- grad_clip_sharded: --grad-clip with --shard-optimizer trains like the replicated run (1e-5 relative L2 per tensor),
  metrics carry grad_norm > the clip.
- tied_weights: a head tied to the embedding under two names (GPT-2's tie): losses equal PyTorch's, the optimizer
  state once, both verifiers, SIGKILL + resume bitwise, export loads strictly with the tie.
- nonfinite_skipped: a model whose loss overflows: every step skipped on every rank (counted in metrics), the
  weights of the final checkpoint are the initial ones.
"""
import json
import os
import re
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import h5ddp_test as ht  # noqa: E402
from h5ddp_torch.sampler import DistributedSampler  # noqa: E402

LAUNCH = 300  # one h5ddp-train launch; generous, the machine may run at load 8
V, T = 64, 16


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, scale: float = 1.0):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.scale = torch.nn.Parameter(torch.full([1], scale))

    def forward(self, x):
        return self.head(torch.tanh(self.emb(x))) * self.scale * self.scale


class TiedLM(torch.nn.Module):
    """GPT-2's tie: the head's weight IS the token embedding's, under two state-dict names."""

    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.mid = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.emb(x))))


def script(d, scale=1.0):
    torch.manual_seed(3)
    path = os.path.join(d, f"tiny-{scale:g}.pt")
    torch.jit.script(TinyLM(V, 24, scale)).save(path)
    return path


def stream_file(path, tokens, context=T, vocab=V, test=None):
    with h5py.File(path, "w") as f:
        f.attrs["vocab_size"] = vocab
        for split, data in (("train", tokens), ("test", test)):
            if data is not None:
                f.create_dataset(f"{split}/tokens", data=np.asarray(data, np.uint16)).attrs["context"] = context
    return path


def samples_file(path, x, y, vocab=V):
    with h5py.File(path, "w") as f:
        f.attrs["vocab_size"] = vocab
        for split in ("train", "test"):
            f.create_dataset(f"{split}/x", data=x)
            f.create_dataset(f"{split}/y", data=y)
    return path


def train(np_, run_dir, model, data, *extra, expect_rc=0):
    r = ht.mpirun(np_, [ht.tool("h5ddp-train"), "--run-dir", run_dir, "--model-file", model, "--data", data,
                        "--no-fsync", "--threads", "1", "--log-every", "1", "--resume", "none", "--no-eval",
                        *map(str, extra)], LAUNCH)
    ok = r.rc != 0 if expect_rc is None else r.rc == expect_rc
    ht.check(ok, f"exit {r.rc}, expected {'non-zero' if expect_rc is None else expect_rc}: {r}")
    return r


def records(run_dir, event):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["event"] == event]


def model_tensors(path):
    with h5py.File(path, "r") as f:
        out = {}
        f["model"].visititems(lambda n, o: out.__setitem__(n, np.array(o)) if isinstance(o, h5py.Dataset) else None)
        return out


def rng_tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, V, n)


def test_loss_equals_pytorch():
    d = ht.scratch("lm-loss")
    model = script(d)
    n = 96
    x = rng_tokens(n * T, 1).reshape(n, T).astype(np.int32)
    y = np.roll(x, -1, axis=1).astype(np.int64)
    y[::3, :5] = -100  # ignored positions, uneven per window
    data = samples_file(os.path.join(d, "lm.h5"), x, y)
    run = os.path.join(d, "run")
    np_, batch = 2, 16
    train(np_, run, model, data, "--batch-size", batch, "--max-steps", 1, "--optimizer", "sgd", "--lr", "0.1")
    logged = records(run, "train")[0]["loss"]
    m = torch.jit.load(model).train()
    per_rank = []
    for rank in range(np_):
        idx = DistributedSampler(n, batch, 42, np_, rank).local_indices(0, 0)
        logits = m(torch.from_numpy(x[idx].astype(np.int64)))
        per_rank.append(F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y[idx]).reshape(-1),
                                        ignore_index=-100).item())
    want = sum(per_rank) / np_
    ht.check(abs(logged - want) <= 1e-6 * abs(want), f"step-1 loss {logged!r}, PyTorch {want!r}")
    # h5ddp-ckpt eval of the step-1 checkpoint over the test split, against PyTorch with the same weights
    ck = ht.ckpt(run, 1)
    r = ht.run([ht.tool("h5ddp-ckpt"), "eval", ck, "--data", data, "--model-file", model], 120)
    ht.check(r.rc == 0, f"eval failed: {r}")
    m_ = re.search(r"tokens (\d+)\s+loss (\S+)\s+perplexity (\S+)", r.out)
    ht.check(m_ is not None, f"eval printed no tokens/loss/perplexity: {r}")
    fields = dict(zip(("tokens", "loss", "perplexity"), m_.groups()))
    weights = model_tensors(ck)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    m.eval()
    with torch.no_grad():
        logits = m(torch.from_numpy(x.astype(np.int64))).reshape(-1, V)
    labels = torch.from_numpy(y).reshape(-1)
    want_loss = F.cross_entropy(logits, labels, ignore_index=-100).item()
    scored = int((labels != -100).sum())
    ht.check(int(fields["tokens"]) == scored, f"eval scored {fields['tokens']} tokens, {scored} are labelled")
    ht.check(abs(float(fields["loss"]) - want_loss) <= 1e-6 * want_loss, f"eval loss {fields['loss']}, PyTorch "
                                                                           f"{want_loss}")
    ht.check(abs(float(fields["perplexity"]) - np.exp(want_loss)) <= 1e-5 * np.exp(want_loss),
             f"perplexity {fields['perplexity']}, exp(loss) {np.exp(want_loss)}")
    print(f"step-1 loss {logged:.7f} = PyTorch {want:.7f}; eval loss {fields['loss']} = {want_loss:.7f} "
          f"over {scored} tokens")


def test_tied_weights():
    """A weight tied under two names (head.weight = emb.weight), replicated at 2 ranks: every step's loss equals
    PyTorch's DDP-equivalent step (one Adam update of the one tensor), the file holds both names with equal bytes
    and the optimizer state once, both verifiers accept it, SIGKILL + resume is bitwise, and the export loads
    strictly into the Python class with the tie intact."""
    d = ht.scratch("lm-tied")
    torch.manual_seed(5)
    ref = TiedLM(V, 24)
    model = os.path.join(d, "tied.pt")
    torch.jit.script(ref).save(model)
    tokens = rng_tokens(4000, 2)
    data = stream_file(os.path.join(d, "stream.h5"), tokens)
    n = (len(tokens) - 1) // T
    np_, batch, steps, at, lr = 2, 16, 6, 3, 0.01
    full = os.path.join(d, "full")
    train(np_, full, model, data, "--batch-size", batch, "--max-steps", steps, "--lr", lr, "--checkpoint-every-steps", at)
    logged = [r["loss"] for r in records(full, "train")]
    windows = torch.from_numpy(np.stack([tokens[i * T:i * T + T + 1] for i in range(n)]).astype(np.int64))
    opt = torch.optim.Adam(ref.parameters(), lr=lr)  # Python's parameters(): the tied tensor once
    want = []
    for step in range(steps):
        opt.zero_grad()
        loss = 0
        for rank in range(np_):
            w = windows[DistributedSampler(n, batch, 42, np_, rank).local_indices(0, step * batch)]
            loss = loss + F.cross_entropy(ref(w[:, :-1]).reshape(-1, V), w[:, 1:].reshape(-1)) / np_
        loss.backward()
        opt.step()
        want.append(loss.item())
    worst = max(abs(a - b) / abs(b) for a, b in zip(logged, want))
    ht.check(len(logged) == steps and worst <= 1e-5, f"losses {logged} vs PyTorch {want} ({worst:.1e} apart)")
    last = ht.ckpt(full, steps)
    with h5py.File(last, "r") as f:
        ht.check(np.array_equal(f["model/emb.weight"][()], f["model/head.weight"][()]), "the two names differ")
        ht.check("emb.weight" in f["optimizer/state"] and "head.weight" not in f["optimizer/state"],
                 f"optimizer state not once: {list(f['optimizer/state'])}")
        trained = f["model/emb.weight"][()]
        exp = ref.emb.weight.detach().numpy()
        ht.check(np.abs(trained - exp).max() <= 1e-5 * np.abs(exp).max(),
                 f"the trained weight is {np.abs(trained - exp).max()} from PyTorch's")
    for verify in ([ht.tool("h5ddp-ckpt"), "verify", last], [sys.executable, "-m", "h5ddp_torch", "verify", last]):
        r = ht.run(verify, 120, extra_env={"PYTHONPATH": os.path.join(HERE, "..", "..", "python")})
        ht.check(r.rc == 0, f"{verify[:2]} refused the tied file: {r}")
    killed = os.path.join(d, "killed")
    argv = [ht.tool("h5ddp-train"), "--run-dir", killed, "--model-file", model, "--data", data, "--no-fsync",
            "--threads", "1", "--no-eval", "--batch-size", batch, "--max-steps", steps, "--lr", lr,
            "--checkpoint-every-steps", at]
    job = ht.Job(np_, argv + ["--step-sleep-ms", "700"])
    job.wait_for(lambda: ht.latest_target(killed) == ht.ckpt(killed, at), 150, f"the step-{at} checkpoint")
    job.kill()
    ht.check(ht.steps_in(killed)[-1] < steps, f"the run finished before the kill: {ht.steps_in(killed)}")
    r = ht.mpirun(np_, argv, LAUNCH)
    ht.check(r.rc == 0 and ht.resumed_from(r) is not None, f"the resume failed: {r}")
    ht.check_bitwise(ht.ckpt(killed, steps), last, "tied: killed + resumed vs uninterrupted")
    pt = os.path.join(d, "tied-state.pt")
    r = ht.run([ht.tool("h5ddp-ckpt"), "export", last, "--to", pt], 120)
    ht.check(r.rc == 0, f"export failed: {r}")
    back = TiedLM(V, 24)
    back.load_state_dict(torch.load(pt)["model"], strict=True)
    ht.check(back.head.weight is back.emb.weight and torch.equal(back.emb.weight.detach(), torch.from_numpy(trained)),
             "the exported state dict did not load with the tie intact")
    print(f"tied weights: {steps} losses within {worst:.1e} of PyTorch, state once, verified, SIGKILL + resume "
          f"bitwise, export loads strictly with the tie")


def refused(d, tag, data, *needles, extra=()):
    model = script(d)
    run = os.path.join(d, f"run-{tag}")
    r = train(2, run, model, data, "--batch-size", 4, "--max-steps", 2, *extra, expect_rc=None)
    for needle in needles:
        ht.check(needle in r.text, f"{tag}: the error does not say '{needle}': {r}")
    trained = os.path.exists(os.path.join(run, "metrics.jsonl")) and records(run, "train")
    ht.check(not trained, f"{tag}: a step ran before the error: {r}")
    print(f"{tag}: refused before training:", [ln for ln in r.text.splitlines() if "error" in ln.lower()][:1])


def test_bad_token_data():
    d = ht.scratch("lm-bad")
    toks = rng_tokens(40 * T + 1, 2)
    toks[7 * T + 3] = V + 5
    path = stream_file(os.path.join(d, "big-id.h5"), toks)
    refused(d, "id", path, path, "/train/tokens", f"token id {V + 5}", f"outside [0, {V})")
    x = rng_tokens(12 * T, 3).reshape(12, T)
    path = samples_file(os.path.join(d, "shape.h5"), x.astype(np.int32), np.zeros((12, T + 1), np.int64))
    refused(d, "shape", path, path, "/train/y", "does not match")
    path = stream_file(os.path.join(d, "short.h5"), rng_tokens(T, 4))
    refused(d, "short", path, path, "/train/tokens", "shorter than one window")
    y = np.roll(x, -1, axis=1)
    y[5, 2] = V
    path = samples_file(os.path.join(d, "label.h5"), x.astype(np.int32), y.astype(np.int64))
    refused(d, "label", path, path, "/train/y", f"label {V}", "vocab_size")
    path = samples_file(os.path.join(d, "good.h5"), x.astype(np.int32), np.roll(x, -1, axis=1).astype(np.int64))
    refused(d, "context", path, "--context", "not a token stream", extra=("--context", 8))


def test_grad_clip_sharded():
    d = ht.scratch("lm-clip")
    model = script(d)
    data = stream_file(os.path.join(d, "s.h5"), rng_tokens(64 * T + 1, 6))
    runs = {}
    for tag, extra in (("rep", ()), ("zero", ("--shard-optimizer",))):
        runs[tag] = os.path.join(d, tag)
        train(2, runs[tag], model, data, "--batch-size", 8, "--max-steps", 4, "--grad-clip", "0.05", *extra)
    norms = [r["grad_norm"] for r in records(runs["rep"], "train")]
    ht.check(all(n > 0.05 for n in norms), f"the clip must engage in this test: norms {norms}")
    zn = [r["grad_norm"] for r in records(runs["zero"], "train")]
    for a, b in zip(norms, zn):
        ht.check(abs(a - b) <= 1e-5 * a, f"grad_norm replicated {norms} vs sharded {zn}")
    a, b = model_tensors(ht.ckpt(runs["rep"], 4)), model_tensors(ht.ckpt(runs["zero"], 4))
    for k in a:
        rel = np.linalg.norm(a[k] - b[k]) / max(np.linalg.norm(a[k]), 1e-30)
        ht.check(rel <= 1e-5, f"{k}: sharded differs from replicated by {rel:.2e} relative L2")
    print(f"grad_norm per step {['%.4f' % n for n in norms]} (clip 0.05), sharded equal within 1e-5")


def test_nonfinite_skipped():
    d = ht.scratch("lm-inf")
    model = script(d, scale=1e30)  # logits * 1e60: overflow to inf, a NaN loss and NaN gradients
    data = stream_file(os.path.join(d, "s.h5"), rng_tokens(64 * T + 1, 7))
    run = os.path.join(d, "run")
    r = train(2, run, model, data, "--batch-size", 8, "--max-steps", 3, "--grad-clip", "1")
    last = records(run, "train")[-1]
    ht.check(last["skipped_steps"] == 3 and last["grad_norm"] is None, f"metrics: {last}")
    ht.check("skipped on every rank" in r.text, f"no console note of the skipped steps: {r}")
    got = model_tensors(ht.ckpt(run, 3))
    want = torch.jit.load(model).state_dict()
    for k, v in want.items():
        ht.check(np.array_equal(got[k], v.numpy()), f"{k} changed although every step was skipped")
    print("3 non-finite steps skipped on both ranks; weights unchanged")


if __name__ == "__main__":
    sys.exit(ht.cli([test_loss_equals_pytorch, test_tied_weights, test_bad_token_data, test_grad_clip_sharded,
                     test_nonfinite_skipped]))
