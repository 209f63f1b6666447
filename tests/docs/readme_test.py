"""Every shell command of README.md and of the docs pages its commands moved to (DOCS), run as a new user would:
file after file, in order, from a directory laid out like a fresh clone that has been built (build/, jobs/, tools/,
python/), as the user this test runs as (root in CI), on this machine's cores. Issue 44: a newcomer following the
README (and the pages it leads to) literally must meet no command that fails as written and no result that
silently differs from what the docs say.

What is adapted, and only this (so the suite stays minutes, not hours):
  - the trainings run fewer steps: H5DDP_TRAIN_ARGS (read by jobs/train-local.sh, as a user may set it) adds
    --max-steps, and later commands name the checkpoint that run wrote instead of the README's ckpt-00000500.h5;
  - the user's own files the README assumes (mymodel.py, cifar.npz) are made here, small;
  - commands that cannot run here are listed in SKIP with the reason and the test that covers them instead.
Every ```sh line of the DOCS files must be in RUN or SKIP: a new or changed command there fails this test until it
is classified (and so run). Usage: readme_test.py SOURCE_DIR BUILD_DIR"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC, BUILD = (os.path.abspath(a) for a in sys.argv[1:3])
PY = "/usr/bin/python3"
DEFAULT_STEPS = 20  # the default job's length here (the README's run is 500 steps: ckpt-00000500.h5)
LIMIT = 600  # seconds per command, a load of 8 included
# The files whose ```sh commands run, in this order: the README's two commands first (the default job writes
# runs/default, which later pages read), then the pages that hold what used to be the README's other commands
# (TRAINING.md writes runs/exp1, runs/cifar and runs/metrics; CHECKPOINTS.md reads runs/default and runs/exp1).
DOCS = ["README.md", "docs/TRAINING.md", "docs/CHECKPOINTS.md", "docs/GPU.md"]

# command -> extra environment (H5DDP_TRAIN_ARGS shortens a training).
GPT_ARGS = ("--model-file gpt.pt --data fortunes.h5 --batch-size 32 --lr 3e-3 --lr-schedule cosine "
            "--lr-warmup-steps 50 --grad-clip 1 --eval-every-steps 250 --checkpoint-every-steps 250")
RUN = {
    "tools/setup.sh && jobs/train-local.sh": {"H5DDP_TRAIN_ARGS": f"--max-steps {DEFAULT_STEPS}"},
    "H5DDP_NP=4 H5DDP_RUN_DIR=runs/exp1 jobs/train-local.sh --epochs 3 --checkpoint-every-steps 200":
        {"H5DDP_TRAIN_ARGS": "--max-steps 6 --batch-size 16 --no-eval"},
    "build/tools/h5ddp-train --help": {},
    "jobs/train-local.sh --resume none --run-dir runs/fresh": {"H5DDP_TRAIN_ARGS": "--max-steps 3 --no-eval"},
    "printf 'run-dir = runs/cfg\\nmodel = mlp\\n' > my.cfg && jobs/train-local.sh --config my.cfg":
        {"H5DDP_TRAIN_ARGS": "--max-steps 3 --no-eval"},
    "(cd runs && ../jobs/train-local.sh --run-dir from-runs)": {"H5DDP_TRAIN_ARGS": "--max-steps 3 --no-eval"},
    # Stopping: run with Ctrl-C (the process group's SIGINT) by ctrl_c(); each step sleeps so that a signal lands
    # well inside a step and a second one 3.5 s later comes before the save.
    "jobs/train-local.sh --run-dir runs/stop": {"H5DDP_TRAIN_ARGS": "--model mlp --mlp-hidden 16 --max-steps 1000 "
                                                "--step-sleep-ms 8000 --progress lines --log-every 1 --no-eval"},
    "/usr/bin/python3 -c 'import torch, mymodel; torch.jit.script(mymodel.Net()).save(\"net.pt\")'": {},
    "/usr/bin/python3 tools/h5ddp-data.py npz cifar.npz --channels-last --compute-stats -o cifar.h5": {},
    "H5DDP_NP=4 H5DDP_RUN_DIR=runs/cifar jobs/train-local.sh --model-file net.pt --data cifar.h5 --epochs 10": {},
    "build/tools/h5ddp-ckpt export runs/cifar/$(cat runs/cifar/latest) --to net-state.pt": {},
    "H5DDP_RUN_DIR=runs/metrics jobs/train-local.sh --eval-every-steps 100 --keep-best --checkpoint-every-steps 100":
        {"H5DDP_TRAIN_ARGS": "--max-steps 100"},
    "tools/plot_run.py runs/metrics": {},
    "build/tools/h5ddp-ckpt goodput runs/metrics": {},
    "h5dump -A runs/default/ckpt-00000500.h5": {},
    "build/tools/h5ddp-ckpt info runs/default/ckpt-00000500.h5": {},
    "build/tools/h5ddp-ckpt verify runs/default/*.h5": {},
    "build/tools/h5ddp-ckpt diff runs/default/ckpt-00000500.h5 runs/exp1/$(cat runs/exp1/latest)": {},
    "build/tools/h5ddp-ckpt goodput runs/default": {},
    "build/tools/h5ddp-ckpt export runs/default/ckpt-00000500.h5 --to ckpt.pt": {},
    "/usr/bin/python3 -c 'import torch; torch.save(torch.load(\"ckpt.pt\")[\"model\"], \"model.pt\")'": {},
    "build/tools/h5ddp-ckpt import model.pt --to init.h5 --model cnn": {},
    "H5DDP_RUN_DIR=runs/finetune jobs/train-local.sh --init-from init.h5": {"H5DDP_TRAIN_ARGS": "--max-steps 3 --no-eval"},
    "build/tools/h5ddp-ckpt eval runs/default/ckpt-00000500.h5": {},
    "build/tools/h5ddp-ckpt eval runs/gpt/latest": {},
    # "Train a small GPT": both trainings shortened (the second resumes the first at 4 ranks, as after a preemption)
    "/usr/bin/python3 tools/h5ddp-data.py text /usr/share/games/fortunes --context 64 -o fortunes.h5": {},
    "/usr/bin/python3 tools/examples/gpt.py script -o gpt.pt --context 64 --layers 2 --heads 4 --dim 64": {},
    "H5DDP_RUN_DIR=runs/gpt jobs/train-local.sh " + GPT_ARGS: {"H5DDP_TRAIN_ARGS": "--max-steps 6 --no-eval"},
    "H5DDP_NP=4 H5DDP_RUN_DIR=runs/gpt jobs/train-local.sh " + GPT_ARGS: {"H5DDP_TRAIN_ARGS": "--max-steps 8 --no-eval"},
    "build/tools/h5ddp-ckpt export runs/gpt/$(cat runs/gpt/latest) --format safetensors --to gpt.safetensors": {},
    "/usr/bin/python3 tools/examples/gpt.py generate --weights gpt.safetensors --config gpt.pt --data fortunes.h5 "
    "--prompt \"The \" --tokens 200": {},
    "tools/plot_run.py runs/gpt": {},
    "/usr/bin/python3 tools/examples/gpt.py script -o gpt-tied.pt --context 64 --layers 2 --heads 4 --dim 64 "
    "--tie-weights": {},
    "H5DDP_NP=4 H5DDP_RUN_DIR=runs/gpt-tied jobs/train-local.sh --model-file gpt-tied.pt --data fortunes.h5 "
    "--batch-size 32 --lr 3e-3 --grad-clip 1 --shard parameters": {"H5DDP_TRAIN_ARGS": "--max-steps 4 --no-eval"},
}
# Commands whose documented exit code is not 0.
EXIT = {"build/tools/h5ddp-ckpt diff runs/default/ckpt-00000500.h5 runs/exp1/$(cat runs/exp1/latest)": 1}
SKIP = {
    "tools/run-tests.sh": "the test command itself (this test is part of it)",
    "cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DH5DDP_WITH_CUDA=ON -DH5DDP_BUILD_BENCHMARKS=OFF "
    "-DTorch_DIR=\"$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch\" && "
    "cmake --build build-gpu -j": "needs a LibTorch with CUDA (tools/gpu-check.sh, on a GPU machine)",
    "tools/gpu-check.sh": "needs a GPU (tools/gpu-check.sh on a lent GPU machine)",
    "tools/gpu-bundle.sh": "downloads 52 MB; ctest gpu_bundle (tests/bundle) runs it and builds against it",
    "tools/gpu-check.sh --bundle gpu-bundle --jobs 16": "needs a GPU; its unpacking and build setup are ctest gpu_bundle's",
}


def sh_commands(text):
    """The commands of every ```sh block: continuation lines joined, trailing comments dropped; a comment line
    '# in Python: CODE' yields ('python', CODE)."""
    out = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        block = re.sub(r"\\\n\s*", "", block)
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("# in Python:"):
                out.append(("python", line[len("# in Python:"):].strip()))
            elif line and not line.startswith("#"):
                out.append(("sh", re.sub(r"\s+#\s.*$", "", line).strip()))
    return out


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, cwd, env, limit=LIMIT):
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=limit)
    return r.returncode, r.stdout


def make_user_files(d):
    with open(os.path.join(d, "mymodel.py"), "w") as f:
        f.write("import torch, torch.nn as nn\n"
                "class Net(nn.Module):\n"
                "    def __init__(self):\n"
                "        super().__init__()\n"
                "        self.conv = nn.Conv2d(3, 8, 3)\n"
                "        self.fc = nn.Linear(8, 10)\n"
                "    def forward(self, x):\n"
                "        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))\n")
    subprocess.run([PY, "-c", "import numpy as np; r = np.random.default_rng(0); "
                    "np.savez('cifar.npz', x_train=r.integers(0, 256, (480, 32, 32, 3), dtype=np.uint8), "
                    "y_train=r.integers(0, 10, 480).astype(np.int64), "
                    "x_test=r.integers(0, 256, (120, 32, 32, 3), dtype=np.uint8), "
                    "y_test=r.integers(0, 10, 120).astype(np.int64))"], cwd=d, check=True)


def main():
    commands = []
    for doc in DOCS:
        with open(os.path.join(SRC, doc)) as f:
            commands += sh_commands(f.read())
    listed = [c for kind, c in commands if kind == "sh"]
    unknown = [c for c in listed if c not in RUN and c not in SKIP]
    if unknown:
        fail(f"commands of {', '.join(DOCS)} neither run nor skipped by this test (add them to RUN or SKIP):\n  " +
             "\n  ".join(unknown))
    stale = [c for c in list(RUN) + list(SKIP) if c not in listed]
    if stale:
        fail(f"commands this test runs that {', '.join(DOCS)} no longer have:\n  " + "\n  ".join(stale))

    user = tempfile.mkdtemp(prefix="h5ddp-readme-")
    ok = False
    try:
        for name in ("jobs", "tools", "python", "docs"):
            os.symlink(os.path.join(SRC, name), os.path.join(user, name))
        os.symlink(BUILD, os.path.join(user, "build"))
        make_user_files(user)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(SRC, "python"))
        for var in ("H5DDP_NP", "H5DDP_RUN_DIR", "H5DDP_TRAIN", "H5DDP_TRAIN_ARGS", "H5DDP_MPIRUN_ARGS"):
            env.pop(var, None)
        default_ckpt = f"ckpt-{DEFAULT_STEPS:08d}.h5"
        for kind, cmd in commands:
            if kind == "python":
                code = "import torch, mymodel; " + cmd
                rc, out = run(f"{PY} -c {shlex_quote(code)}", user, env)
                print(f"$ # in Python: {cmd}  -> {rc}")
                if rc != 0:
                    fail(f"the docs' Python line failed: {cmd}\n{out}")
                continue
            if cmd in SKIP:
                print(f"skipped: {cmd} ({SKIP[cmd]})")
                continue
            actual = cmd.replace("tools/setup.sh && ", "").replace("ckpt-00000500.h5", default_ckpt)
            if cmd in CTRL_C:
                ctrl_c(actual, user, dict(env, **RUN[cmd]))
                continue
            rc, out = run(actual, user, dict(env, **RUN[cmd]))
            print(f"$ {actual}  -> {rc}\n" + "\n".join("    " + ln for ln in out.splitlines()[-6:]))
            if rc != EXIT.get(cmd, 0):
                fail(f"documented command failed (exit {rc}, expected {EXIT.get(cmd, 0)}): {cmd}\n{out}")
            check(cmd, out, user, env)
        ok = True
        print(f"PASS: every shell command of {', '.join(DOCS)} ran as written (run lengths shortened)")
    finally:
        if ok:
            shutil.rmtree(user, ignore_errors=True)
        else:
            print(f"files kept in {user}")


CTRL_C = {"jobs/train-local.sh --run-dir runs/stop"}


def ctrl_c(cmd, user, env):
    """TRAINING.md "Stopping", as a user at a terminal does it: Ctrl-C (SIGINT to the foreground process group)
    once: every rank saves, exit 75; the same command again resumes; Ctrl-C twice 3.5 s apart: stops without
    saving, exit 130 (TRAINING.md "Exit codes")."""
    import signal
    import time

    def attempt(second_signal):
        p = subprocess.Popen(["bash", "-c", cmd], cwd=user, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        out = []
        try:
            deadline = time.time() + LIMIT
            for line in p.stdout:  # the step lines come at step boundaries: signal just after one
                out.append(line)
                if line.startswith("step ") or "step 1/" in line:
                    break
                if time.time() > deadline:
                    fail("no step line from " + cmd + ":\n" + "".join(out))
            time.sleep(0.5)
            os.killpg(p.pid, signal.SIGINT)
            if second_signal:
                time.sleep(3.5)
                os.killpg(p.pid, signal.SIGINT)
            rest, _ = p.communicate(timeout=LIMIT)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        return p.returncode, "".join(out) + rest

    stop_dir = os.path.join(user, "runs", "stop")
    rc, out = attempt(False)
    print(f"$ {cmd}  + Ctrl-C -> {rc}")
    if rc != 75 or "checkpoint saved in runs/stop" not in out:
        fail(f"Ctrl-C once: expected a save and exit 75 (TRAINING.md), got {rc}:\n{out}")
    if "the job has been aborted" in out:  # jobs/train-local.sh runs mpirun --quiet: a save is not a crash
        fail(f"Open MPI's abort block follows a clean save:\n{out}")
    saved = sorted(f for f in os.listdir(stop_dir) if f.endswith(".h5"))
    rc, out = attempt(True)
    print(f"$ {cmd}  + Ctrl-C, Ctrl-C -> {rc}")
    if "resumed from" not in out:
        fail(f"the same command did not resume the run:\n{out}")
    if rc != 130 or "stopping without saving" not in out:
        fail(f"Ctrl-C twice: expected a stop without saving, exit 130 (TRAINING.md), got {rc}:\n{out}")
    if sorted(f for f in os.listdir(stop_dir) if f.endswith(".h5")) != saved:
        fail("Ctrl-C twice saved a checkpoint")


def shlex_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


def check(cmd, out, user, env):
    """What the docs say each command shows, where they say something checkable."""
    if cmd.startswith("tools/setup.sh"):
        default = os.path.join(user, "runs", "default", f"ckpt-{DEFAULT_STEPS:08d}.h5")
        if not os.path.isfile(default):
            fail(f"the first command did not write {default}, which every later example reads")
        if not re.search(r"test accuracy: [\d.]+% on 10000 images", out):
            fail("no test accuracy line after the default job")
        lines = out.splitlines()
        hint = next((lines[i + 1].strip() for i, ln in enumerate(lines[:-1]) if ln.startswith("resume (")), "")
        # The command as run, with the settings it was given (here the shortening H5DDP_TRAIN_ARGS).
        if not hint.endswith(" jobs/train-local.sh") or "--resume" in hint:
            fail(f"the resume hint is not the command that was run: '{hint}'")
        rc, again = run(hint, user, env)
        if rc != 0 or "nothing to train" not in again:
            fail(f"the printed resume command did not continue the run (exit {rc}):\n{again}")
    elif cmd.startswith("jobs/train-local.sh --resume none") or "--config my.cfg" in cmd or "from-runs" in cmd:
        run_dir = {"--config": "runs/cfg", "from-runs": "runs/from-runs"}
        run_dir = next((d for k, d in run_dir.items() if k in cmd), "runs/fresh")
        if not os.path.isfile(os.path.join(user, run_dir, "ckpt-00000003.h5")):
            fail(f"'{cmd}' did not train into {run_dir}:\n{out}")
        if "--config" in cmd and ("--config my.cfg" not in out or "model: mlp" not in out):
            fail(f"the config file was not used, or the resume line lacks it:\n{out}")
    elif "--eval-every-steps 100" in cmd:
        if not re.search(r"eval at step 100: test accuracy [\d.]+%", out):
            fail(f"--eval-every-steps printed nothing on the console:\n{out}")
    elif cmd.startswith("tools/plot_run.py"):
        png = os.path.join(user, cmd.split()[1], "run.png")
        if not os.path.isfile(png):
            fail(f"plot_run.py wrote no {png}")
    elif "--init-from init.h5" in cmd:
        if "initialised the weights from init.h5" not in out:
            fail(f"--init-from did not start from init.h5:\n{out}")
    elif cmd == "build/tools/h5ddp-ckpt eval runs/gpt/latest":
        if "pointer file" not in out or "fortunes.h5 /test (the run's --data" not in out or "perplexity" not in out:
            fail(f"eval of runs/gpt/latest did not follow the pointer to the file and score the run's --data:\n{out}")
    elif cmd.startswith("build/tools/h5ddp-ckpt eval"):
        if not re.search(r"images 10000 ", out):
            fail(f"eval did not score the 10k test images it says:\n{out}")
    elif cmd.startswith("build/tools/h5ddp-ckpt info"):
        if "step" not in out:
            fail(f"info printed no step:\n{out}")


if __name__ == "__main__":
    main()
