"""Medians of tools/bench/template_bench.sh's RESULT lines: save seconds per method and tensor count, and each
method's speed relative to torch.save (torch.save seconds / method seconds; > 1 is faster).
  /usr/bin/python3 tools/bench/template_bench_table.py RESULTS_FILE"""
import collections
import statistics
import sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if not line.startswith("RESULT "):
        continue
    kv = dict(x.split("=", 1) for x in line.split()[1:])
    if kv.get("op") == "save":
        runs[(int(kv["tensors"]), kv["method"])].append(float(kv["seconds"]))
methods = [m for m in ["torch_save", "h5ddp", "template", "template_2threads", "template_2ranks"]
           if any(k[1] == m for k in runs)]
print("| tensors | " + " | ".join(methods) + " | " + " | ".join(f"torch.save / {m}" for m in methods[1:]) + " |")
print("|---|" + "---|" * (2 * len(methods) - 1))
for t in sorted({k[0] for k in runs}):
    med = {m: statistics.median(runs[(t, m)]) for m in methods if runs[(t, m)]}
    cells = [f"{med[m]:.3f} s ({', '.join(f'{x:.2f}' for x in runs[(t, m)])})" if m in med else "-" for m in methods]
    ratio = [f"**{med['torch_save'] / med[m]:.2f}x**" if m in med and "torch_save" in med else "-" for m in methods[1:]]
    print(f"| {t:,} | " + " | ".join(cells) + " | " + " | ".join(ratio) + " |")
