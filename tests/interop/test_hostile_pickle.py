"""`h5ddp-ckpt import` on damaged and hostile .pt files (issue 23): each ends with exit code 1 and one line
on stderr naming the file and what is wrong, never a signal, a stack trace or a LibTorch-internal message,
within a time limit; a 1,000,000-entry dict imports in seconds (dict building is linear). Each --case is
its own ctest (interop.hostile.<case>)."""
import argparse
import os
import re
import subprocess
import sys
import time

import torch

import hostile_pt as h
import interop_common as ic

# What a clear message must not contain: crash output, C++/Python traces, LibTorch's internal asserts.
FORBIDDEN = ["Segmentation fault", "core dumped", "terminate called", "Traceback", "Exception raised from",
             "frame #", "enforce fail", "INTERNAL ASSERT", "stoull", "stoll", "std::"]


def run_import(args, w, name, data, timeout=60):
    """Writes `data` to <name>.pt, imports it; returns (path, CompletedProcess, seconds)."""
    path = w(name + ".pt")
    with open(path, "wb") as f:
        f.write(data)
    out = w(name + ".h5")
    cmd = [args.ckpt, "import", path, "--to", out, "--force"]
    print("$ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name}: h5ddp-ckpt import still running after {timeout} s")
    seconds = time.monotonic() - start
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    print(f"  exit {p.returncode} after {seconds:.1f} s", flush=True)
    return path, p, seconds


def expect_clear_failure(args, w, name, data, *needles, timeout=60):
    path, p, _ = run_import(args, w, name, data, timeout)
    assert p.returncode >= 0, f"{name}: killed by signal {-p.returncode}"
    assert p.returncode == 1, f"{name}: exit code {p.returncode}, expected 1"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"{name}: expected one line on stderr, got {len(lines)}: {p.stderr[:2000]!r}"
    line = lines[0]
    assert path in line, f"{name}: the message does not name {path}: {line!r}"
    for n in needles:
        assert re.search(n, line), f"{name}: {n!r} not in the message: {line!r}"
    for bad in FORBIDDEN:
        assert bad not in line, f"{name}: {bad!r} in the message: {line!r}"
    assert len(line) < 600, f"{name}: message of {len(line)} characters"
    assert not os.path.exists(w(name + ".h5")), f"{name}: an output file was written"


def case_deep_nesting(args, w):
    base = h.small_state_dict_pt()
    # 200,000 nested tuples, as MARK...TUPLE (a 400 KB data.pkl) and as TUPLE1 chains; lists through the memo.
    expect_clear_failure(args, w, "deep_marks", h.with_data_pkl(base, h.deep_marks(200_000)),
                         "data.pkl nests deeper than 1000 levels")
    expect_clear_failure(args, w, "deep_tuple1", h.with_data_pkl(base, h.deep_tuple1(200_000)),
                         "data.pkl nests deeper than 1000 levels")
    expect_clear_failure(args, w, "deep_memo_lists", h.with_data_pkl(base, h.deep_memo_lists(200_000)),
                         "data.pkl nests deeper than 1000 levels")


def case_huge_dict(args, w):
    # A valid checkpoint dict: the model and two 1,000,000-entry dicts (str and int keys), 34 MB. Building
    # a dict used to scan it for every key (hours at this size); the bound is generous, not a benchmark.
    n = 1_000_000
    obj = {"model": {"w": torch.arange(4.0)}, "vocab": {f"tok{i}": i for i in range(n)},
           "ids": {i: 2 * i for i in range(n)}}
    _, p, seconds = run_import(args, w, "huge_dict", h.torch_save_bytes(obj), timeout=90)
    assert p.returncode == 0, f"huge_dict: exit code {p.returncode}"
    assert "imported 1 tensors" in p.stdout, p.stdout
    # The same dict as the state dict itself: refused for its first non-tensor entry, as quickly.
    expect_clear_failure(args, w, "huge_dict_not_tensors", h.torch_save_bytes(obj["vocab"]),
                         "state dict entry 'tok0' is a int, not a tensor", timeout=90)


def case_truncated_zip(args, w):
    pt = h.torch_save_bytes(h_state_dict())
    for fraction in (0.2, 0.6, 0.95):
        expect_clear_failure(args, w, f"truncated_zip_{int(fraction * 100)}", h.truncated(pt, fraction),
                             "truncated zip archive", "cut short")


def case_truncated_pickle(args, w):
    pt = h.torch_save_bytes(h_state_dict())
    pkl = h.data_pkl(pt)
    for cut in (3, len(pkl) // 3, len(pkl) // 2, len(pkl) - 1):
        expect_clear_failure(args, w, f"truncated_pickle_{cut}", h.with_data_pkl(pt, pkl[:cut]), "truncated")


def case_bad_memo(args, w):
    base = h.small_state_dict_pt()
    expect_clear_failure(args, w, "bad_memo", h.with_data_pkl(base, h.bad_memo()), "memo key 7")
    expect_clear_failure(args, w, "bad_memo_text", h.with_data_pkl(base, h.PROTO2 + b"}X\x01\x00\x00\x00wgabc\ns."),
                         "data.pkl is malformed", "'abc' is not a number")
    expect_clear_failure(args, w, "self_dict", h.with_data_pkl(base, h.PROTO2 + b"}q\x00X\x01\x00\x00\x00wh\x00s."),
                         "puts a dict inside itself|is a dict")


def case_oversized_sizes(args, w):
    base = h.small_state_dict_pt()
    expect_clear_failure(args, w, "huge_string", h.with_data_pkl(base, h.huge_string()), "truncated")
    expect_clear_failure(args, w, "huge_storage", h.with_data_pkl(base, h.huge_storage()), "4611686018427387904")
    expect_clear_failure(args, w, "wrapping_view", h.with_data_pkl(base, h.wrapping_view()),
                         "too large for int64|overflow")
    expect_clear_failure(args, w, "repeated_view", h.with_data_pkl(base, h.repeated_view()),
                         "has 1099511627776 elements", "views that repeat")
    expect_clear_failure(args, w, "short_record", h.with_data_pkl(base, h._tensor_pkl(1000, [2], [1])),
                         "record data/0 holds 24 bytes, its storage needs 4000")
    expect_clear_failure(args, w, "oversized_record", h.oversized_record_pt(),
                         "reaches past the end of the file|archive is corrupted")


def case_valid_variants(args, w):
    # Not hostile: the guards must not refuse what torch.save (or a ZIP64 rewrite of it) writes.
    sd = h_state_dict()
    # Without the empty tensor in ZIP64 form: miniz (LibTorch's reader, before and after this change)
    # refuses a 0-byte record whose ZIP64 field holds only the offset, as Python's zipfile writes it.
    nonempty = {k: v for k, v in sd.items() if v.numel()}
    for name, data in (("p2", h.torch_save_bytes(sd, 2)), ("p4", h.torch_save_bytes(sd, 4)),
                       ("zip64", h.zip64_pt(nonempty))):
        _, p, _ = run_import(args, w, "valid_" + name, data)
        assert p.returncode == 0, f"valid_{name}: exit code {p.returncode}: {p.stderr}"


def h_state_dict():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, generator=g)
    return {"w": torch.randn(3, 4, generator=g), "view": base[1:3, ::2], "n": torch.tensor(7),
            "expanded": torch.ones(1).expand(5), "empty": torch.zeros(0, 2)}


CASES = {name[len("case_"):]: f for name, f in globals().items() if name.startswith("case_")}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--case", required=True, choices=sorted(CASES))
    p.add_argument("--ckpt", required=True, help="h5ddp-ckpt executable")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--keep", action="store_true")
    args, _ = p.parse_known_args()  # the interop tests' other options (--train, --mpiexec, ...) are not needed
    with ic.Scratch(args, "hostile-" + args.case) as w:
        CASES[args.case](args, w)
    print("PASS")


if __name__ == "__main__":
    main()
