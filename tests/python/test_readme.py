"""The "## PyTorch: write and read h5ddp checkpoints from Python" section of docs/PYTHON.md (moved there from the
README) keeps working: its snippet runs
under mpirun -np 2 (with a small Net and data supplied), saves steps 50 and 100, and a second run with the step limit
raised resumes at step 100 and saves 150; both verifiers accept every file, and h5ddp-ckpt info reads them."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "interop"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402

PRELUDE = '''import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(20, 32), nn.Linear(32, 4)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
torch.manual_seed(0)
x, y = torch.randn(1000, 20), torch.randint(0, 4, (1000,))
'''


def snippet(source_dir):
    return ic.markdown_python_block(os.path.join(source_dir, "docs", "PYTHON.md"),
                                    "PyTorch: write and read h5ddp checkpoints from Python")


def main():
    args = ic.parse_args(__doc__)
    code = snippet(args.source_dir)
    assert "while step < 100:" in code and '"runs/mine"' in code, "update this test to the snippet"
    with ic.Scratch(args, "readme-py") as w:
        script = w("train.py")
        env_path = os.path.join(args.source_dir, "python")
        with open(script, "w") as f:
            f.write(f"import sys; sys.path.insert(0, {env_path!r})\n" + PRELUDE + code.replace('"runs/mine"', repr(w("run"))))
        out = ic.run(ic.mpi(args, 2, sys.executable, script), timeout=120).stdout
        assert "rank 0: step 100, resumed from None" in out and "rank 1: step 100, resumed from None" in out, out
        with open(script) as f:
            again = f.read().replace("while step < 100:", "while step < 150:")
        with open(script, "w") as f:
            f.write(again)
        out = ic.run(ic.mpi(args, 2, sys.executable, script), timeout=120).stdout
        resumed = os.path.join(w("run"), "ckpt-00000100.h5")
        assert f"rank 0: step 150, resumed from {resumed}" in out and f"rank 1: step 150, resumed from {resumed}" in out, out
        files = sorted(os.listdir(w("run")))
        assert files == ["ckpt-00000050.h5", "ckpt-00000100.h5", "ckpt-00000150.h5", "latest"], files
        with open(os.path.join(w("run"), "latest")) as f:
            assert f.read() == "ckpt-00000150.h5\n"
        for n in files[:-1]:
            path = os.path.join(w("run"), n)
            assert h5ddp_torch.verify(path) == [], h5ddp_torch.verify(path)
            ic.run([args.ckpt, "verify", path])
        info = ic.run([args.ckpt, "info", os.path.join(w("run"), "ckpt-00000150.h5")]).stdout
        assert "world size      2" in info and "optimizer       adam" in info, info
    print("PASS")


if __name__ == "__main__":
    main()
