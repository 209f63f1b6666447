"""The layer map of docs/ARCHITECTURE.md, checked on the sources: every #include "..." in src/<layer>/ and in the
public headers must point at the same layer or one it may use. Each folder is its own shared library, so an
upward include would also be a link error, but only for code that calls across it; this catches the include
itself (a header-only use too). Usage: layers_check.py SOURCE_DIR"""
import os
import re
import sys

# layer -> the layers it may include (itself included).
ALLOWED = {
    "core": {"core"},
    "comm": {"core", "comm"},
    "h5": {"core", "h5"},
    "checkpoint": {"core", "comm", "h5", "checkpoint"},
    "ddp": {"core", "comm", "ddp"},
    "torch": {"core", "comm", "h5", "checkpoint", "ddp", "torch"},
    "train": {"core", "comm", "h5", "checkpoint", "ddp", "torch", "train"},
}
# include/h5ddp/<name>.hpp -> the layer (library) that implements it.
PUBLIC = {
    "error": "core", "dtype": "core", "device": "core", "mpi_env": "core", "splitmix": "core", "log": "core",
    "watchdog": "core", "clock": "core", "format": "checkpoint", "torch_state": "torch",
    "comm": "comm", "mpi_comm": "comm", "nccl_comm": "comm",
    "h5_layout": "h5",
    "checkpoint": "checkpoint", "train_state": "checkpoint", "policy": "checkpoint", "run_dir": "checkpoint",
    "bucketing": "ddp", "ddp": "ddp", "data_parallel": "ddp", "sharded_ddp": "ddp", "fsdp": "ddp",
    "checkpointer": "torch", "sampler": "torch", "script_module": "torch", "stop_signal": "torch",
    "sharded_optimizer": "torch", "h5ddp": "torch",
}


def layer_of_include(path):
    """The layer an include names, or None for one outside the project (a system or library header)."""
    if path.startswith("h5ddp/"):
        name = os.path.splitext(path[len("h5ddp/"):])[0]
        return PUBLIC.get(name, "unknown public header " + path)
    head = path.split("/")[0]
    return head if head in ALLOWED else None


# Benchmarks that measure a layer's internals (not its API) include its private headers; nothing else outside the
# layer's own folder may.
INTERNALS_MEASURED = {
    "tools/bench/hash_bench.cpp": "times the checksum kernels themselves (XXH3 scalar vs AVX2, the hash buffer)",
    "tools/bench/async_bench.cpp": "times AsyncCheckpointer's phases (copy to host buffers, background write)",
    "tools/bench/manifest_bench.cpp": "times the manifest read with and without docs/FORMAT.md's rules",
    "tools/bench/load_bench.cpp": "counts a load's HDF5 opens and coalesced reads per rank (the library's test counters)",
    "tools/bench/template_save.cpp": "hashes the data of a prototype template save with the library's XXH3",
}


def private_includes(src):
    """src/train and tools/ use lower layers through include/h5ddp only (a private header is src/<layer>/x.hpp)."""
    problems = []
    roots = [os.path.join(src, "src", "train"), os.path.join(src, "tools")]
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for f in sorted(names):
                if not f.endswith((".cpp", ".hpp", ".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, src)
                if rel in INTERNALS_MEASURED:
                    continue
                with open(path) as fh:
                    for n, line in enumerate(fh, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if m and m.group(1).split("/")[0] in ALLOWED and m.group(1).split("/")[0] != "train":
                            problems.append(f"{rel}:{n}: includes the private header {m.group(1)} of layer "
                                            f"'{m.group(1).split('/')[0]}'; use a public one (include/h5ddp/)")
    return problems


def main(src):
    problems = []
    files = []
    for layer in ALLOWED:
        d = os.path.join(src, "src", layer)
        files += [(layer, os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith((".cpp", ".hpp", ".c"))]
    inc = os.path.join(src, "include", "h5ddp")
    for f in sorted(os.listdir(inc)):
        name = os.path.splitext(f)[0]
        if name not in PUBLIC:
            problems.append(f"include/h5ddp/{f}: not in this check's map of public headers to layers")
            continue
        files.append((PUBLIC[name], os.path.join(inc, f)))
    for layer, path in files:
        with open(path) as fh:
            for n, line in enumerate(fh, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                target = layer_of_include(m.group(1))
                if target is None or target in ALLOWED[layer]:
                    continue
                problems.append(f"{os.path.relpath(path, src)}:{n}: layer '{layer}' includes {m.group(1)} "
                                f"(layer '{target}'); '{layer}' may use {', '.join(sorted(ALLOWED[layer]))}")
    problems += private_includes(src)
    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print(f"PASS: {len(files)} files, every include within the layer map")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1])))
