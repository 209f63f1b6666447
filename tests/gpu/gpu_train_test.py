#!/usr/bin/env python3
"""Issue 21: h5ddp-train on GPUs, end to end (label `gpu`; tools/gpu-check.sh runs them). One ctest per case:
  gpu_train_test.py NP CASE [CASE...]      CASE: a test_* name below, without the prefix

Every run is a small MLP (784->64->10), plain SGD, no dropout, --no-eval, --no-fsync, at NP ranks, one GPU per
rank (NCCL refuses two ranks on one GPU). A case exits 77 (SKIP) where `nvidia-smi -L` lists fewer than NP GPUs
(CUDA_VISIBLE_DEVICES honoured), so on a machine without a GPU every case shows as skipped.

What the tests read from h5ddp-train's output (rank 0, stdout or stderr): one line starting `device: `, the
device first: `device: cuda...` (e.g. `device: cuda:0 (NVIDIA H200), gradients over nccl, precision fp32`) and
`device: cpu...`; with --precision bf16 the line names `bf16`. Besides: `resumed from <path> at step <N>`, the
metrics log (docs/METRICS.md), the checkpoint files. Every subprocess is bounded (a hang fails)."""
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import h5ddp_test as ht  # noqa: E402
import promises_test as pt  # noqa: E402

import h5py  # noqa: E402

NP = pt.NP
LAUNCH = 300  # seconds for one launch: CUDA and NCCL initialisation included
# Deterministic cuBLAS (the workspace config cuBLAS documents for reproducible results) in every rank.
CUDA_ENV = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")}
TOL = ["--rtol", "1e-4", "--atol", "1e-6", "--skip-rng"]  # CUDA vs CPU: same math, other kernels


def visible_gpus():
    """(count, why): GPUs `nvidia-smi -L` lists, limited by CUDA_VISIBLE_DEVICES."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return 0, "no GPU: nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 0, "no GPU: nvidia-smi -L did not answer within 60 s"
    n = len([line for line in r.stdout.splitlines() if re.match(r"GPU \d+:", line)])
    if r.returncode != 0 or n == 0:
        first = (r.stdout + r.stderr).strip().splitlines()[:1]
        return 0, f"no GPU: nvidia-smi -L lists none (exit {r.returncode}{': ' + first[0] if first else ''})"
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        visible = 0
        for x in cvd.split(","):
            if x.strip() in ("", "-1"):
                break
            visible += 1
        n = min(n, visible)
    return n, f"{n} GPU(s) visible"


def need_gpus():
    n, why = visible_gpus()
    if n == 0:
        raise ht.Skip(why)
    if n < NP:
        raise ht.Skip(f"needs {NP} GPUs (one per rank: NCCL refuses two ranks on one GPU), {why}")


def args(run_dir, device, *extra):
    return [ht.tool("h5ddp-train"), "--run-dir", run_dir, "--device", device, "--model", "mlp", "--mlp-hidden", "64",
            "--dropout", "0", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.1", "--batch-size", "64",
            "--no-fsync", "--no-eval", "--threads", "1", "--log-every", "1", "--keep-last", "0"] + \
        [str(a) for a in extra]


def train(run_dir, device, *extra, expect_rc=0):
    r = ht.mpirun(NP, args(run_dir, device, *extra), LAUNCH, CUDA_ENV)
    if expect_rc is not None:
        ht.check(r.rc == expect_rc, f"h5ddp-train --device {device} {' '.join(map(str, extra))}: exit code {r.rc}, "
                                    f"expected {expect_rc}: {r}")
    return r


def device_line(r, want):
    """The text after `device: ` in a run's output; it must start with `want` (cuda or cpu)."""
    lines = re.findall(r"^\s*device:\s*(.*?)\s*$", r.text, re.MULTILINE | re.IGNORECASE)
    ht.check(lines, f"no 'device: ...' line in h5ddp-train's output: {r}")
    ht.check(all(x.lower().startswith(want) for x in lines), f"device line(s) {lines}, expected '{want}...': {r}")
    return lines[0]


def losses(run_dir):
    """{step: loss} of the metrics log's train records."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if rec.get("event") == "train":
                    out[rec["step"]] = rec["loss"]
    return out


def check_resumed(r, step):
    got = ht.resumed_from(r)
    ht.check(got is not None and got[0].endswith(f"ckpt-{step:08d}.h5") and got[1] == step,
             f"expected 'resumed from ...ckpt-{step:08d}.h5 at step {step}', got {got}: {r}")


def worst(r):
    m = re.search(r"worst difference (\S+)", r.out)
    return m.group(1) if m else "0 (bitwise)"


# ---- cases --------------------------------------------------------------------------------------------------
def test_ddp_cuda_equals_cpu():
    """10 steps on CUDA (gradients over NCCL) and on the CPU (over MPI) from the same seed: the final checkpoints
    agree within rtol 1e-4, atol 1e-6 (RNG rows aside: a CUDA run has CUDA generators too), and so do the losses
    of every step. Catches: a rank on the wrong GPU or all on one, gradients not averaged over NCCL, a CUDA
    checkpoint saving other tensors than the CPU one, --device cuda silently training on the CPU."""
    need_gpus()
    g, c = ht.scratch("gpu-cuda"), ht.scratch("gpu-cpu")
    rg = train(g, "cuda", "--max-steps", 10)
    rc = train(c, "cpu", "--max-steps", 10)
    line = device_line(rg, "cuda")
    device_line(rc, "cpu")
    for d in (g, c):
        ht.check(os.path.isfile(ht.ckpt(d, 10)), f"no final checkpoint in {d}")
    ht.verify(ht.ckpt(g, 10))
    r = ht.compare(ht.ckpt(g, 10), ht.ckpt(c, 10), *TOL)
    ht.check(r.rc == 0, f"CUDA and CPU checkpoints differ beyond rtol 1e-4, atol 1e-6: {r}")
    lg, lc = losses(g), losses(c)
    ht.check(sorted(lg) == list(range(1, 11)) and sorted(lc) == list(range(1, 11)),
             f"train records by step: cuda {sorted(lg)}, cpu {sorted(lc)}")
    bad = [(s, lg[s], lc[s]) for s in lg if abs(lg[s] - lc[s]) > 1e-4 * abs(lc[s]) + 1e-6]
    ht.check(not bad, f"losses differ (step, cuda, cpu): {bad}")
    nccl = "nccl" in rg.text.lower()
    return f"worst difference {worst(r)}; device: {line}{'' if nccl else ' (output does not mention nccl)'}"


def test_save_gpu_load_cpu():
    """A CUDA checkpoint (step 10) resumed on the CPU to step 20, and a CPU checkpoint resumed on CUDA: both
    resume from step 10 and finish; the two step-20 checkpoints agree within the CUDA-vs-CPU tolerance; the
    CUDA checkpoint exported with `h5ddp-ckpt export` loads with torch.load(map_location="cpu"), every tensor on
    the CPU and the model equal to the file's /model. Catches: device-bound tensors or CUDA-only state in the
    file, a resume that cannot place the state on another device, an export that needs a GPU."""
    need_gpus()
    g10, c10 = ht.scratch("gpu-g10"), ht.scratch("gpu-c10")
    train(g10, "cuda", "--max-steps", 10)
    train(c10, "cpu", "--max-steps", 10)
    g2c = ht.copy_with([ht.ckpt(g10, 10)], "gpu-g10-cpu20")
    r = train(g2c, "cpu", "--max-steps", 20)
    check_resumed(r, 10)
    device_line(r, "cpu")
    c2g = ht.copy_with([ht.ckpt(c10, 10)], "gpu-c10-cuda20")
    r = train(c2g, "cuda", "--max-steps", 20)
    check_resumed(r, 10)
    device_line(r, "cuda")
    for d in (g2c, c2g):
        ht.check(os.path.isfile(ht.ckpt(d, 20)), f"no step-20 checkpoint in {d}")
        ht.verify(ht.ckpt(d, 20))
    mixed = ht.compare(ht.ckpt(g2c, 20), ht.ckpt(c2g, 20), *TOL)
    ht.check(mixed.rc == 0, f"GPU->CPU and CPU->GPU runs differ at step 20: {mixed}")
    exported = os.path.join(g10, "ckpt-10.pt")
    r = ht.run([ht.tool("h5ddp-ckpt"), "export", ht.ckpt(g10, 10), "--to", exported], 180)
    ht.check(r.rc == 0 and os.path.isfile(exported), f"h5ddp-ckpt export of the CUDA checkpoint failed: {r}")
    check = r"""
import sys, h5py, numpy as np, torch
d = torch.load(sys.argv[1], map_location="cpu")
tensors = []
def walk(x):
    if isinstance(x, torch.Tensor): tensors.append(x)
    elif isinstance(x, dict): [walk(v) for v in x.values()]
    elif isinstance(x, (list, tuple)): [walk(v) for v in x]
walk(d)
off = [str(t.device) for t in tensors if t.device.type != "cpu"]
assert not off, f"tensors not on the CPU: {off}"
assert int(d["step"]) == 10, d["step"]
with h5py.File(sys.argv[2], "r") as f:
    keys = sorted(f["model"])
    assert sorted(d["model"]) == keys, (sorted(d["model"]), keys)
    for k in keys:
        assert np.array_equal(d["model"][k].numpy(), f["model"][k][()]), k
print(f"{len(tensors)} tensors on the CPU, {len(keys)} model tensors equal to the file's")
"""
    r = ht.run([sys.executable, "-c", check, exported, ht.ckpt(g10, 10)], 180)
    ht.check(r.rc == 0, f"torch.load(map_location='cpu') of the exported CUDA checkpoint: {r}")
    return f"both directions resume from step 10 (worst difference {worst(mixed)}); export: {r.out.strip()}"


def test_kill_resume_cuda_bitwise():
    """On CUDA: 16 steps uninterrupted, against a run saving every 8 steps that is SIGKILLed (every rank, then
    mpirun) after its step-8 checkpoint and resumed to step 16: the step-16 checkpoints are equal bit for bit,
    RNG rows included (--dropout 0, --threads 1, CUBLAS_WORKSPACE_CONFIG=:4096:8). On a mismatch a second
    uninterrupted run tells CUDA nondeterminism (two uninterrupted runs differ) from a resume bug (they agree).
    Catches: CUDA state (weights, optimizer, CUDA RNG) not restored exactly, device copies that round."""
    need_gpus()
    a, b = ht.scratch("gpu-kill-a"), ht.scratch("gpu-kill-b")
    common = ["--max-steps", 16, "--checkpoint-every-steps", 8]
    train(a, "cuda", *common)
    job = ht.Job(pt.NP, args(b, "cuda", *common, "--step-sleep-ms", 300), CUDA_ENV)
    ranks = []
    try:
        job.wait_for(lambda: ht.latest_target(b) == ht.ckpt(b, 8), LAUNCH, "the step-8 checkpoint")
        ranks = subprocess.run(["pgrep", "-P", str(job.p.pid), "-f", "h5ddp-train"], capture_output=True,
                               text=True, timeout=30).stdout.split()
        for pid in ranks:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
    finally:
        job.kill()
    for pid in ranks:  # the ranks are gone before the resume starts (a dying rank may still hold its GPU)
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
    ht.check(not os.path.exists(ht.ckpt(b, 16)), "the run finished before it was killed")
    ht.check(os.path.isfile(ht.ckpt(b, 8)), "no step-8 checkpoint after the kill")
    r = train(b, "cuda", *common)
    check_resumed(r, 8)
    device_line(r, "cuda")
    r = ht.compare(ht.ckpt(a, 16), ht.ckpt(b, 16))
    if r.rc != 0:
        a2 = ht.scratch("gpu-kill-a2")
        train(a2, "cuda", *common)
        r2 = ht.compare(ht.ckpt(a, 16), ht.ckpt(a2, 16))
        verdict = ("two uninterrupted CUDA runs differ too: CUDA kernels are not deterministic here"
                   if r2.rc != 0 else "two uninterrupted CUDA runs are equal: the resume lost or changed state")
        raise ht.Failure(f"resumed CUDA run differs from the uninterrupted one ({verdict}): {r}\n{r2}")
    return f"killed after step 8 ({len(ranks)} ranks), resumed, step 16 bitwise equal"


def test_bf16_trains():
    """--precision bf16 (autocast) on CUDA, 20 steps: the device line names bf16; every step's loss is finite and
    the last five average below 90% of step 1's; the checkpoint's weights stay float32 (autocast keeps fp32 master
    weights) and finite, close to an fp32 run's (relative L2 within 5%) but not equal to it.
    Catches: bf16 ignored (equal to fp32), weights saved in bf16, a diverging or NaN loss."""
    need_gpus()
    d, f32 = ht.scratch("gpu-bf16"), ht.scratch("gpu-fp32")
    r = train(d, "cuda", "--precision", "bf16", "--max-steps", 20)
    line = device_line(r, "cuda")
    ht.check("bf16" in line.lower(), f"the device line does not name bf16: {line!r}")
    ls = losses(d)
    ht.check(sorted(ls) == list(range(1, 21)), f"train records by step {sorted(ls)}, expected 1..20")
    ht.check(all(math.isfinite(x) for x in ls.values()), f"losses not finite: {ls}")
    tail = sum(ls[s] for s in range(16, 21)) / 5
    ht.check(tail < 0.9 * ls[1], f"loss did not decrease: step 1 {ls[1]:.4f}, steps 16-20 average {tail:.4f}")
    w = pt.weights(ht.ckpt(d, 20))
    with h5py.File(ht.ckpt(d, 20), "r") as f:
        dtypes = {k: str(f["model"][k].dtype) for k in f["model"]}
    ht.check(all(t == "float32" for t in dtypes.values()), f"model tensors not float32: {dtypes}")
    ht.check(all(math.isfinite(float(abs(v).max())) for v in w.values()), "weights not finite")
    ht.verify(ht.ckpt(d, 20))
    train(f32, "cuda", "--precision", "fp32", "--max-steps", 20)
    r = ht.compare(ht.ckpt(d, 20), ht.ckpt(f32, 20), "--norm-rtol", "0.05", "--skip-rng")
    ht.check(r.rc == 0, f"bf16 and fp32 runs differ by more than 5% (relative L2): {r}")
    same = ht.compare(ht.ckpt(d, 20), ht.ckpt(f32, 20), "--skip-rng")
    ht.check(same.rc != 0, "the bf16 run is bitwise equal to the fp32 run: --precision bf16 had no effect")
    return f"loss {ls[1]:.4f} -> {ls[20]:.4f}; vs fp32: {worst(r)} relative; device: {line}"


TESTS = [test_ddp_cuda_equals_cpu, test_save_gpu_load_cpu, test_kill_resume_cuda_bitwise, test_bf16_trains]

if __name__ == "__main__":
    ht.cli(TESTS)
