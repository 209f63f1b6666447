"""The "## Inspecting checkpoints" section of docs/CHECKPOINTS.md (moved there from the README) keeps working: its
h5py snippet and its torch.load snippet run against a real checkpoint (paths substituted), and h5dump -A reads
the file."""
import os
import re
import subprocess
import sys

import interop_common as ic

DOC_CKPT = "runs/default/ckpt-00000500.h5"
DOC_PT = "ckpt.pt"


def section(source_dir):
    with open(os.path.join(source_dir, "docs", "CHECKPOINTS.md")) as f:
        text = f.read()
    m = re.search(r"^## Inspecting checkpoints\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "docs/CHECKPOINTS.md has no '## Inspecting checkpoints' section"
    return m.group(1)


def snippet(text, marker):
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one python block with {marker!r}, found {len(blocks)}"
    return blocks[0]


def run_python(code, cwd):
    print("--- running docs/CHECKPOINTS.md snippet ---\n" + code, flush=True)
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    print(p.stdout + p.stderr)
    assert p.returncode == 0, "docs/CHECKPOINTS.md snippet failed"
    return p.stdout


def main():
    args = ic.parse_args(__doc__)
    text = section(args.source_dir)
    with ic.Scratch(args, "readme") as w:
        ic.train(args, 1, w("run"), "--max-steps", "3", "--batch-size", "60")
        ckpt = ic.latest_checkpoint(w("run"))

        h5 = snippet(text, "h5py.File(")
        assert DOC_CKPT in h5, f"the h5py snippet no longer reads {DOC_CKPT}; update this test"
        out = run_python(h5.replace(DOC_CKPT, ckpt), w())
        assert "h5ddp-checkpoint 1 step 3 ranks 1" in out, out
        assert "fc2.weight (10, 128) float32" in out and "optimizer adam" in out, out

        ic.run([args.ckpt, "export", ckpt, "--to", w(DOC_PT)])
        tl = snippet(text, "torch.load(")
        assert DOC_PT in tl
        # The Cnn the snippet uses is docs/MODELS.md's.
        with open(os.path.join(args.source_dir, "docs", "MODELS.md")) as f:
            cnn = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "class Cnn(" in b][0]
        out = run_python(cnn + "\n" + tl, w())
        assert "step 3 epoch 0 cnn" in out, out

        assert f"h5dump -A {DOC_CKPT}" in text
        p = ic.run(["h5dump", "-A", ckpt], echo_stdout=False)
        assert 'DATASET "fc2.weight"' in p.stdout and 'ATTRIBUTE "xxh3"' in p.stdout
        assert re.search(r'ATTRIBUTE "step".*?\(0\): \d+', p.stdout, re.S), "h5dump -A shows no attribute values"
    print("PASS")


if __name__ == "__main__":
    main()
