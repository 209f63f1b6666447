"""A sweep of bad inputs through the public commands (issue 23): damaged data files, damaged and foreign
checkpoints, another model's checkpoint, bad options, through h5ddp-train at 2 ranks and h5ddp-ckpt. Each case
is checked the same way:
  - it ends within a time limit (a hang fails) and not by a signal;
  - its exit code is the documented one (1 error, 2 bad options);
  - ONE line names the file (or option) and the problem, and it is printed exactly once;
  - no Open MPI abort report (MPI_ABORT box), no C++ terminate, no HDF5 error stack, no sanitizer report;
  - every file that was in the run directory before is byte-identical after (nothing lost).
Argument: rank count of the h5ddp-train cases."""
import gzip
import hashlib
import os
import re
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import h5ddp_test as ht  # noqa: E402

NP = int(sys.argv[1]) if len(sys.argv) > 1 else 2
FMNIST = "/usr/share/datasets/fashion-mnist"
LIMIT = 120  # seconds per command, start-up under a load of 8 included
NOISE = ["MPI_ABORT", "terminate called", "HDF5-DIAG", "Segmentation", "Aborted", "core dumped", "Signal:",
         "ORTE_ERROR_LOG", "show_help", "Traceback", "AddressSanitizer", "HDF5 #"]
_work = None


def work():
    """A scratch tree shared by the cases: a run dir with two committed checkpoints of the small MLP (steps 2
    and 4), another model's checkpoint, and copies of Fashion-MNIST to damage."""
    global _work
    if _work is None:
        _work = ht.scratch("bad-input")
        run = os.path.join(_work, "run")
        r = ht.train(NP, run, 4)
        ht.check(r.rc == 0 and len(ht.checkpoints(run)) == 2, f"base run failed: {r}")
        other = os.path.join(_work, "other")
        r = ht.mpirun(1, ht.train_args(other, 1, hidden="64,64"), LIMIT)
        ht.check(r.rc == 0, f"other-model run failed: {r}")
    return _work


def snapshot(dirs):
    out = {}
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in files:
                p = os.path.join(root, f)
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out


def expect_error(cmd, np, rc, names, phrase, protect=(), extra_env=None):
    """Runs cmd (under mpirun when np, else alone) and applies every check of the module docstring. `names`: the
    file or option the error line must contain; `phrase`: what it must say. Returns the Result, its error line as
    `.line`."""
    before = snapshot(protect)
    r = ht.mpirun(np, cmd, LIMIT, extra_env) if np else ht.run(cmd, LIMIT, extra_env)
    ht.check(r.rc == rc, f"exit code {r.rc}, expected {rc}: {r}")
    for noise in NOISE:
        ht.check(noise not in r.text, f"the output has '{noise}': {r}")
    lines = [ln for ln in r.text.splitlines() if names in ln and phrase in ln]
    ht.check(len(lines) == 1, f"expected one line naming '{names}' and saying '{phrase}', found {len(lines)}: {r}")
    ht.check(r.text.count(phrase) == 1, f"'{phrase}' printed {r.text.count(phrase)} times: {r}")
    tags = re.findall(r"\[[^\]\s]+ rank \d+/\d+\]", lines[0])
    ht.check(len(tags) <= 1, f"the error line names its host and rank {len(tags)} times: {lines[0]}")
    ht.check(snapshot(protect) == before, f"files changed in {protect}")
    ht.check("step 1/" not in r.text, f"training started: {r}")
    r.line = lines[0].strip()[:160]
    return r


def train_cmd(run_dir, *extra):
    """ht.train_args of a 6-step run; options in `extra` replace the same options there."""
    args = ht.train_args(run_dir, 6)
    extra = list(extra)
    for i in range(0, len(extra) - 1):
        if extra[i].startswith("--") and extra[i] in args and not extra[i + 1].startswith("--"):
            j = args.index(extra[i])
            del args[j:j + 2]
    return args + extra


def data_copy(tag):
    d = os.path.join(work(), "data-" + tag)
    shutil.copytree(FMNIST, d)
    return d


def rewrite_gz(path, payload):
    with gzip.open(path, "wb") as f:
        f.write(payload)


# ---- data files -----------------------------------------------------------------------------------------------
def test_data_longer_than_header():
    """The inflated labels stream holds more than the header's count: gzip -t passes, the reader must refuse."""
    d = data_copy("long")
    p = os.path.join(d, "train-labels-idx1-ubyte.gz")
    with gzip.open(p, "rb") as f:
        raw = f.read()
    rewrite_gz(p, raw + bytes(100))
    run = os.path.join(work(), "run-long")
    return expect_error(train_cmd(run, "--data-dir", d), NP, 1, p, "100 bytes follow the 60000 labels").line


def test_data_crc_mismatch():
    """The issue's case: a .gz whose CRC-32 does not match its (longer-than-needed) stream."""
    d = data_copy("crc")
    p = os.path.join(d, "train-labels-idx1-ubyte.gz")
    with gzip.open(p, "rb") as f:
        raw = f.read()
    rewrite_gz(p, raw + bytes(8))
    with open(p, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        crc = struct.unpack("<I", f.read(4))[0]
        f.seek(-8, os.SEEK_END)
        f.write(struct.pack("<I", crc ^ 1))
    run = os.path.join(work(), "run-crc")
    return expect_error(train_cmd(run, "--data-dir", d), NP, 1, p, "CRC-32").line


def test_data_truncated():
    d = data_copy("cut")
    p = os.path.join(d, "train-images-idx3-ubyte.gz")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size // 2)
    run = os.path.join(work(), "run-cut")
    return expect_error(train_cmd(run, "--data-dir", d), NP, 1, p, "truncated data file").line


def test_data_dir_missing():
    run = os.path.join(work(), "run-nodata")
    return expect_error(train_cmd(run, "--data-dir", "/nonexistent-fmnist"), NP, 1, "/nonexistent-fmnist",
                        "data directory not found").line


# ---- checkpoints -----------------------------------------------------------------------------------------------
def damaged_copy(tag, how):
    run = os.path.join(work(), "run")
    src = ht.checkpoints(run)[-1]
    dst = os.path.join(work(), f"{tag}.h5")
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(how(data))
    return dst


def test_truncated_checkpoint_resume():
    """The issue's case: head -c 1000000 ckpt.h5 > cut.h5; --resume cut.h5 (the MLP's file is smaller: cut it in
    half, past the superblock)."""
    cut = damaged_copy("cut", lambda b: b[:len(b) // 2])
    run = os.path.join(work(), "run")
    return expect_error(train_cmd(os.path.join(work(), "run-resume-cut"), "--resume", cut), NP, 1, cut,
                        "file truncated", protect=[run]).line


def test_truncated_checkpoint_verify():
    cut = damaged_copy("cut-verify", lambda b: b[:len(b) // 2])
    return expect_error([ht.tool("h5ddp-ckpt"), "verify", cut], 0, 1, cut, "file truncated").line


def test_not_hdf5_resume():
    junk = damaged_copy("junk", lambda b: b"this is not a checkpoint\n" * 40)
    return expect_error(train_cmd(os.path.join(work(), "run-junk"), "--resume", junk), NP, 1, junk,
                        "not an HDF5 file").line


def test_empty_checkpoint_info():
    empty = damaged_copy("empty", lambda b: b"")
    return expect_error([ht.tool("h5ddp-ckpt"), "info", empty], 0, 1, empty, "not an HDF5 file").line


def test_flipped_bytes_resume():
    def flip(b):
        b = bytearray(b)
        for i in range(len(b) // 2, len(b) // 2 + 64):
            b[i] ^= 0xFF
        return bytes(b)
    bad = damaged_copy("flip", flip)
    run = os.path.join(work(), "run")
    r = expect_error(train_cmd(os.path.join(work(), "run-flip"), "--resume", bad), NP, 1, bad, "corrupt data",
                     protect=[run])
    ht.check("checksum mismatch in dataset /" in r.text, f"the dataset is not named: {r}")
    return r.line


def test_other_model_resume_lists_differences():
    """The issue's case: an MLP 64,64 checkpoint resumed as the MLP 32: one error naming every difference."""
    other = ht.checkpoints(os.path.join(work(), "other"))[-1]
    run = os.path.join(work(), "run-other")
    r = expect_error(train_cmd(run, "--resume", other), NP, 1, other, "does not match")
    for what in ["/model/fc3.weight", "/model/fc1.weight: expected", "/model/fc2.weight: expected",
                 "/optimizer/state/fc1.bias/exp_avg: expected", "/optimizer/state/fc3.bias/exp_avg"]:
        ht.check(what in r.text, f"difference {what} not listed: {r}")
    return r.line


def test_other_model_init_from_lists_differences():
    other = ht.checkpoints(os.path.join(work(), "other"))[-1]
    run = os.path.join(work(), "run-init")
    r = expect_error(train_cmd(run, "--init-from", other), NP, 1, other, "does not match")
    for what in ["/model/fc3.weight", "/model/fc1.weight: expected"]:
        ht.check(what in r.text, f"difference {what} not listed: {r}")
    return r.line


def test_other_optimizer_resume():
    run = os.path.join(work(), "run")
    ckpt = ht.checkpoints(run)[-1]
    return expect_error(train_cmd(os.path.join(work(), "run-sgd"), "--resume", ckpt, "--optimizer", "sgd"), NP, 1,
                        ckpt, "optimizer state of type adam", protect=[run]).line


def test_missing_checkpoint_resume():
    missing = os.path.join(work(), "no-such.h5")
    return expect_error(train_cmd(os.path.join(work(), "run-missing"), "--resume", missing), NP, 1, missing,
                        "no such checkpoint").line


def test_bad_batch_refused_before_loading():
    """--batch-size not divisible by the rank count is refused before the checkpoint is read (the run dir's
    checkpoints untouched, no 'resumed from')."""
    if NP < 2:
        raise ht.Skip("needs 2 ranks")
    run = os.path.join(work(), "run")
    bad = str(60 * NP + 1)
    r = expect_error(train_cmd(run, "--batch-size", bad), NP, 1, "--batch-size " + bad, "not divisible",
                     protect=[run])
    ht.check("resumed from" not in r.text, f"the checkpoint was loaded first: {r}")
    return r.line


# ---- options -------------------------------------------------------------------------------------------------
def test_unknown_model_option():
    return expect_error(train_cmd(os.path.join(work(), "run-opt"), "--model", "resnet"), NP, 2, "--model resnet",
                        "unknown model").line


def test_bad_option_reported_when_rank0_starts_last():
    """Finding 5: whichever rank exits first, the error reaches the terminal. Rank 0 starts 3 s after rank 1
    (MPMD: a shell sleeps, then execs the trainer); before the fix rank 1 exited 2 at once and mpirun killed rank
    0 before it printed."""
    args = train_cmd(os.path.join(work(), "run-opt"), "--model", "resnet")
    quoted = " ".join("'" + a + "'" for a in args)
    cmd = [ht.MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "1", "sh", "-c", f"sleep 3; exec {quoted}",
           ":", "-np", "1"] + args
    r = ht.run(cmd, LIMIT)
    ht.check(r.rc == 2, f"exit code {r.rc}, expected 2: {r}")
    ht.check(r.text.count("unknown model") == 1, f"'unknown model' printed {r.text.count('unknown model')} times: {r}")
    return f"{r.seconds:.1f}s"


def test_unknown_option():
    return expect_error(train_cmd(os.path.join(work(), "run-opt"), "--lerning-rate", "1"), NP, 2, "lerning-rate",
                        "unrecognised option").line


def test_missing_config_file():
    missing = os.path.join(work(), "none.cfg")
    return expect_error(train_cmd(os.path.join(work(), "run-opt"), "--config", missing), NP, 2, missing,
                        "cannot read --config file").line


def test_run_dir_is_a_file():
    path = os.path.join(work(), "a-file")
    open(path, "w").close()
    return expect_error(train_cmd(path), NP, 1, path, "cannot create run directory").line


def test_ckpt_tool_missing_file():
    missing = os.path.join(work(), "missing.h5")
    return expect_error([ht.tool("h5ddp-ckpt"), "info", missing], 0, 1, missing, "no such file").line


def test_ckpt_import_garbage():
    junk = os.path.join(work(), "junk.pt")
    with open(junk, "wb") as f:
        f.write(b"PK\x03\x04" + os.urandom(300))
    out = os.path.join(work(), "junk-imported.h5")
    return expect_error([ht.tool("h5ddp-ckpt"), "import", junk, "--to", out], 0, 1, junk,
                        "damaged or truncated zip").line


TESTS = [test_data_longer_than_header, test_data_crc_mismatch, test_data_truncated, test_data_dir_missing,
         test_truncated_checkpoint_resume, test_truncated_checkpoint_verify, test_not_hdf5_resume,
         test_empty_checkpoint_info, test_flipped_bytes_resume, test_other_model_resume_lists_differences,
         test_other_model_init_from_lists_differences, test_other_optimizer_resume, test_missing_checkpoint_resume,
         test_bad_batch_refused_before_loading, test_unknown_model_option,
         test_bad_option_reported_when_rank0_starts_last, test_unknown_option,
         test_missing_config_file, test_run_dir_is_a_file, test_ckpt_tool_missing_file, test_ckpt_import_garbage]

if __name__ == "__main__":
    try:
        sys.exit(ht.main(TESTS))
    finally:
        if _work:
            shutil.rmtree(_work, ignore_errors=True)
