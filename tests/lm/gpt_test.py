"""The example GPT (tools/examples/gpt.py) trained by h5ddp-train on a byte-level token stream of a text every
Debian system ships (/usr/share/common-licenses/GPL-3, converted by tools/h5ddp-data.py text), issue 40:

- kill_resume_bitwise: 2 ranks SIGKILLed after the step-4 checkpoint and resumed to step 8 give a step-8 file
  bitwise equal to the uninterrupted run's (every dataset, h5ddp_test.compare_checkpoints), with --grad-clip
  engaged at every step (the logged norm above the clip).
- resume_2_to_4: the step-4 file of the 2-rank run resumed at 4 ranks reaches step 8 within 1e-5 relative L2 of the
  2-rank run per model tensor (the same samples per step; only the order of the gradient sums differs), losses
  within 1e-4.
- stage3: the tied GPT (lm_head.weight = wte.weight, two names) under --shard parameters at 2 ranks: units chosen by
  size at depth 2, the tied weight in the root; its step-8 file within 1e-5 relative L2 of the replicated run per
  model tensor and losses within 1e-5 (not bitwise: the sharded gradient norm for --grad-clip sums the ranks'
  squares, PyTorch's takes the norm of the whole tensors); SIGKILLed after step 4 and resumed under stage 3, both
  with --shard-prefetch off: bitwise equal to the uninterrupted stage-3 run (prefetch on); its step-4 file resumed
  replicated at 3 ranks and under stage 3 at 4 (global batch 24) stays within 1e-5 of it.
- export_safetensors: h5ddp-ckpt export --format safetensors, read back by a parser written here from the format's
  description (not gpt.py's reader): every tensor bitwise equal to the checkpoint's /model dataset, names as the
  Python state_dict, the data packed with no gap; gpt.py generate samples text from it.

  gpt_test.py [NP CASE...]
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import h5ddp_test as ht  # noqa: E402

TEXT = "/usr/share/common-licenses/GPL-3"
GPT = os.path.join(ROOT, "tools", "examples", "gpt.py")
CONVERT = os.path.join(ROOT, "tools", "h5ddp-data.py")
LAUNCH = 300
STEPS, AT = 8, 4
CLIP = 0.05  # below every step's gradient norm: clipping changes every step
_shared = {}


def setup():
    """The data file, the scripted GPT and the uninterrupted 2-rank run (made once, shared by the cases)."""
    if _shared:
        return _shared
    if not os.path.exists(TEXT):
        raise ht.Skip(f"{TEXT} is missing")
    d = ht.scratch("gpt")
    data, model = os.path.join(d, "gpl.h5"), os.path.join(d, "gpt.pt")
    r = ht.run([ht.PY, CONVERT, "text", TEXT, "--context", "32", "-o", data], 120)
    ht.check(r.rc == 0, f"h5ddp-data.py text failed: {r}")
    r = ht.run([ht.PY, GPT, "script", "-o", model, "--context", "32", "--layers", "2", "--heads", "2", "--dim", "32",
                "--tie-weights"], 120)
    ht.check(r.rc == 0, f"gpt.py script failed: {r}")
    _shared.update(d=d, data=data, model=model)
    _shared["full"] = os.path.join(d, "full")
    r = ht.mpirun(2, argv(_shared["full"]), LAUNCH)
    ht.check(r.rc == 0, f"the uninterrupted run failed: {r}")
    norms = list(records(_shared["full"], "grad_norm").values())
    ht.check(len(norms) == STEPS and all(n > CLIP for n in norms), f"clipping must engage at every step: {norms}")
    return _shared


def argv(run_dir, resume="auto"):
    s = _shared
    return [ht.tool("h5ddp-train"), "--model-file", s["model"], "--data", s["data"], "--run-dir", run_dir,
            "--batch-size", "24", "--max-steps", str(STEPS), "--checkpoint-every-steps", "2", "--keep-last", "0",
            "--lr", "1e-3", "--grad-clip", str(CLIP), "--no-fsync", "--threads", "1", "--log-every", "1",
            "--resume", resume, "--no-eval"]


def records(run_dir, key):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r[key] for r in map(json.loads, f) if r["event"] == "train"}


def losses(run_dir):
    return records(run_dir, "loss")


def test_kill_resume_bitwise():
    s = setup()
    run = os.path.join(s["d"], "killed")
    job = ht.Job(2, argv(run) + ["--step-sleep-ms", "500"])
    job.wait_for(lambda: ht.latest_target(run) == ht.ckpt(run, AT), 150, f"the step-{AT} checkpoint")
    job.kill()
    ht.check(ht.steps_in(run)[-1] < STEPS, f"the run finished before the kill: {ht.steps_in(run)}")
    r = ht.mpirun(2, argv(run), LAUNCH)
    ht.check(r.rc == 0 and ht.resumed_from(r) is not None, f"the resume failed: {r}")
    ht.check_bitwise(ht.ckpt(run, STEPS), ht.ckpt(s["full"], STEPS), "killed + resumed vs uninterrupted")
    got, want = losses(run), losses(s["full"])
    ht.check(all(got[k] == want[k] for k in want), f"losses differ: {got} vs {want}")
    print(f"SIGKILL after step {ht.resumed_from(r)[1]}, resumed: step-{STEPS} file bitwise equal, losses equal")


def test_resume_2_to_4():
    s = setup()
    run = ht.copy_with([ht.ckpt(s["full"], AT)], "gpt4")
    r = ht.mpirun(4, argv(run, resume=ht.ckpt(run, AT)), LAUNCH)
    ht.check(r.rc == 0, f"the 4-rank resume failed: {r}")
    c = ht.compare_checkpoints(ht.ckpt(run, STEPS), ht.ckpt(s["full"], STEPS), norm_rtol=1e-5, skip_rng=True,
                               groups=["model"])
    ht.check(c.ok, f"4-rank continuation vs 2-rank run: {c}")
    got, want = losses(run), losses(s["full"])
    worst = max(abs(got[k] - want[k]) / abs(want[k]) for k in range(AT + 1, STEPS + 1))
    ht.check(worst <= 1e-4, f"losses after the resume differ by {worst:.2e} relative: {got} vs {want}")
    print(f"2 -> 4 ranks at step {AT}: {c.summary()}; losses within {worst:.1e}")


def read_safetensors_here(path):
    """The format as its README describes it: u64 LE header size, JSON header, packed little-endian data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "BF16": np.uint16, "F16": np.float16}
    spans, out = [], {}
    for name, e in header.items():
        b, e_ = e["data_offsets"]
        arr = np.frombuffer(data[b:e_], dtype=types[e["dtype"]]).reshape(e["shape"])
        out[name] = arr
        spans.append((b, e_))
    spans.sort()
    ht.check(spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[-1][1] == len(data),
             f"{path}: the tensors do not pack the data buffer exactly: {spans[:3]}... of {len(data)} bytes")
    ht.check((8 + n) % 8 == 0, f"{path}: the data does not start 8-byte aligned")
    return out, meta


def test_stage3():
    s = setup()
    z3_args = ["--shard", "parameters"]
    z3 = os.path.join(s["d"], "z3")
    r = ht.mpirun(2, argv(z3) + z3_args, LAUNCH)
    ht.check(r.rc == 0, f"the stage-3 run failed: {r}")
    ht.check("units (" in r.out + r.err and "root" in r.out + r.err, f"no unit line in the log: {r}")
    c = ht.compare_checkpoints(ht.ckpt(z3, STEPS), ht.ckpt(s["full"], STEPS), norm_rtol=1e-5, skip_rng=True,
                               groups=["model"])
    ht.check(c.ok, f"stage 3 vs replicated at 2 ranks: {c}")
    got, want = losses(z3), losses(s["full"])
    worst = max(abs(got[k] - want[k]) / abs(want[k]) for k in want)
    ht.check(worst <= 1e-5, f"stage-3 losses differ from replicated by {worst:.2e} relative: {got} vs {want}")
    with h5py.File(ht.ckpt(z3, STEPS), "r") as f:
        ht.check(np.array_equal(f["model/wte.weight"][()], f["model/lm_head.weight"][()]), "the tie is broken")

    # Killed and resumed with blocking gathers (--shard-prefetch off): bitwise the uninterrupted run's (prefetched).
    killed = os.path.join(s["d"], "z3-killed")
    off = ["--shard-prefetch", "off"]
    job = ht.Job(2, argv(killed) + z3_args + off + ["--step-sleep-ms", "500"])
    job.wait_for(lambda: ht.latest_target(killed) == ht.ckpt(killed, AT), 150, f"the step-{AT} checkpoint")
    job.kill()
    r = ht.mpirun(2, argv(killed) + z3_args + off, LAUNCH)
    ht.check(r.rc == 0 and ht.resumed_from(r) is not None, f"the stage-3 resume failed: {r}")
    ht.check_bitwise(ht.ckpt(killed, STEPS), ht.ckpt(z3, STEPS),
                     "stage 3: killed + resumed without prefetch vs uninterrupted with it")

    worst_reshard = 0.0
    for np_, extra in ((3, []), (4, z3_args)):
        run = ht.copy_with([ht.ckpt(z3, AT)], f"gpt-z3-{np_}")
        r = ht.mpirun(np_, argv(run, resume=ht.ckpt(run, AT)) + extra, LAUNCH)
        ht.check(r.rc == 0, f"the stage-3 file resumed at {np_} ranks {extra} failed: {r}")
        c = ht.compare_checkpoints(ht.ckpt(run, STEPS), ht.ckpt(z3, STEPS), norm_rtol=1e-5, skip_rng=True,
                                   groups=["model"])
        ht.check(c.ok, f"the stage-3 file resumed at {np_} ranks {extra} vs the 2-rank stage-3 run: {c}")
        got = losses(run)
        worst_reshard = max([worst_reshard] + [abs(got[k] - losses(z3)[k]) / abs(losses(z3)[k])
                                               for k in range(AT + 1, STEPS + 1)])
    ht.check(worst_reshard <= 1e-4, f"losses after the reshard differ by {worst_reshard:.2e} relative")
    print(f"stage 3 at 2 ranks: losses within {worst:.1e} of replicated; SIGKILL + resume (prefetch off) bitwise; "
          f"resumed replicated at 3 and stage 3 at 4 ranks, losses within {worst_reshard:.1e}")


def test_export_safetensors():
    s = setup()
    ck = ht.ckpt(s["full"], STEPS)
    out = os.path.join(s["d"], "gpt.safetensors")
    r = ht.run([ht.tool("h5ddp-ckpt"), "export", ck, "--format", "safetensors", "--to", out], 120)
    ht.check(r.rc == 0, f"export failed: {r}")
    tensors, meta = read_safetensors_here(out)
    with h5py.File(ck, "r") as f:
        names = []
        f["model"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        ht.check(sorted(names) == sorted(tensors), f"names {sorted(tensors)} vs checkpoint {sorted(names)}")
        for n in names:
            ht.check(np.array_equal(tensors[n], f["model"][n][()]), f"{n}: exported bytes differ from the checkpoint")
    ht.check(meta.get("step") == str(STEPS) and meta.get("format") == "pt", f"metadata {meta}")
    ht.check("lm_head.weight" in tensors and np.array_equal(tensors["lm_head.weight"], tensors["wte.weight"]),
             "tied weights: lm_head.weight and wte.weight, equal")
    r = ht.run([ht.PY, GPT, "generate", "--weights", out, "--config", s["model"], "--data", s["data"],
                "--prompt", "The GNU General", "--tokens", "40", "--seed", "1"], 120)
    ht.check(r.rc == 0 and r.out.startswith("The GNU General") and len(r.out) >= 40, f"generate failed: {r}")
    print(f"exported {len(tensors)} tensors, bitwise equal; generate: {r.out.strip()[:60]!r}")


if __name__ == "__main__":
    sys.exit(ht.cli([test_kill_resume_bitwise, test_resume_2_to_4, test_stage3, test_export_safetensors]))
