"""The README's "## PyTorch without MPI" snippet runs as torchrun runs it (2 processes with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and no MPI; tests/python/torchrun_launch.py), with a small Net and data supplied: it
saves steps 50 and 100; a second run with the step limit raised resumes at step 100 and saves 150; both verifiers
accept every file and h5ddp-ckpt info reads them."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "interop"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import h5ddp_torch  # noqa: E402
import interop_common as ic  # noqa: E402
import torchrun_launch as tl  # noqa: E402

def _prelude():
    """The small Net and data of docs/PYTHON.md's snippet test (tests/python/test_readme.py's PRELUDE)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("python_readme", os.path.join(HERE, "test_readme.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PRELUDE


PRELUDE = _prelude()

# torch 1.13's gloo teardown can deadlock at interpreter exit (h5ddp_torch.exit_without_teardown): the snippet never destroys its
# process group, and the processes end at once.
EPILOGUE = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_os._exit(0)\n"


def snippet(source_dir):
    return ic.markdown_python_block(os.path.join(source_dir, "README.md"), "PyTorch without MPI")


def main():
    args = ic.parse_args(__doc__)
    code = snippet(args.source_dir)
    assert "while step < 100:" in code and '"runs/tr"' in code and "mpi" not in code.lower(), \
        "update this test to the snippet"
    with ic.Scratch(args, "readme-torchrun") as w:
        script = w("train.py")
        header = f"import sys; sys.path.insert(0, {os.path.join(args.source_dir, 'python')!r})\n"
        body = header + PRELUDE + code.replace('"runs/tr"', repr(w("run"))) + EPILOGUE
        for limit, resumed in ((100, None), (150, os.path.join(w("run"), "ckpt-00000100.h5"))):
            with open(script, "w") as f:
                f.write(body.replace("while step < 100:", f"while step < {limit}:"))
            out = "".join(tl.run(2, [script], timeout=120))
            for r in range(2):
                assert f"rank {r}: step {limit}, resumed from {resumed}" in out, out
        files = sorted(os.listdir(w("run")))
        assert files == ["ckpt-00000050.h5", "ckpt-00000100.h5", "ckpt-00000150.h5", "latest"], files
        paths = [os.path.join(w("run"), n) for n in files[:-1]]
        for path in paths:
            assert h5ddp_torch.verify(path) == [], h5ddp_torch.verify(path)
        ic.run([args.ckpt, "verify", *paths])
        info = ic.run([args.ckpt, "info", paths[-1]]).stdout
        assert "world size      2" in info and "optimizer       adam" in info, info
    print("PASS")


if __name__ == "__main__":
    main()
